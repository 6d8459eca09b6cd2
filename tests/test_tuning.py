"""Launch-config lookup (files, nearest T, defaults, override) and the tuner's search logic.

No GPU needed: the tuner's search is driven with a fake cost model; ``tune`` itself is GPU-only.
"""
import json
import logging
import multiprocessing
import os
import threading

import pytest

from fusedmoe import tuned_configs, tuner
from fusedmoe.config import MoEConfig, QuantScheme
from fusedmoe.errors import ConfigError
from fusedmoe.platform import Platform
from fusedmoe.tuned_configs import LaunchConfigs, config_file_name, override

H100 = Platform.preset("h100")
DEV = H100.device_name  # NVIDIA_H100_80GB_HBM3


def cfg(bm, bn=64, bk=64, **kw):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, **kw}


def full(bm, bn=64, bk=64, gm=1, w=4, st=3, sk=1):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": gm,
            "num_warps": w, "num_stages": st, "SPLIT_K": sk}


def fake_default(T, E, N, H, top_k, dtype):
    fake_default.calls.append(T)
    return cfg(16 if T <= 16 else 64, 32, 128)


fake_default.calls = []


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Empty user and package config folders, fresh warn-once state, a fixed Triton version."""
    user, pkg = tmp_path / "user", tmp_path / "pkg"
    user.mkdir()
    pkg.mkdir()
    monkeypatch.setenv("FUSEDMOE_CONFIG_DIR", str(user))
    monkeypatch.setattr(tuned_configs, "package_config_dir", lambda: str(pkg))
    monkeypatch.setattr(tuned_configs, "_WARNED", set())
    monkeypatch.setattr(tuned_configs, "_running_triton_version", lambda: "3.6.0")
    fake_default.calls = []
    return user, pkg


def write(folder, name, data):
    path = os.path.join(str(folder), name)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def table(*Ts, version="3.6.0"):
    d = {"triton_version": version}
    for T in Ts:
        d[str(T)] = {"gemm1": cfg(T % 128 or 16), "gemm2": cfg(16, 128)}
    return d


def load(**kw):
    args = dict(E=8, N=14336, H=4096, top_k=2, scheme="none", dtype="bfloat16")
    args.update(kw)
    return LaunchConfigs.load(H100, args["E"], args["N"], args["H"], args["top_k"], args["scheme"], args["dtype"],
                              default_fn=fake_default)


# ------------------------------------------------------------------------------------------- names
def test_file_name_format():
    assert config_file_name(8, 14336, DEV, "none", "bfloat16") == \
        "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=bfloat16.json"
    assert config_file_name(256, 256, "NVIDIA_H200", "fp8_block", "bfloat16") == \
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_block,block_shape=[128,128].json"
    assert config_file_name(64, 1024, DEV, QuantScheme("int4_w4a16", group_size=64), "float16") == \
        f"E=64,N=1024,device_name={DEV},dtype=int4_w4a16.json"
    assert config_file_name(8, 64, DEV, "none", "float16").endswith("dtype=float16.json")


def test_h200_family_shares_one_name():
    assert Platform("cuda", "NVIDIA H200 NVL", (9, 0)).device_name == "NVIDIA_H200"


# ------------------------------------------------------------------------------------------- nearest T
@pytest.mark.parametrize("T,want", [
    (1, 1), (0, 1),          # below the smallest key
    (8, 1),                  # |8-1| = 7 < |8-16| = 8
    (9, 16),                 # 8 > 7
    (40, 64),                # |40-16| = 24 == |40-64| = 24: tie goes to the larger key
    (39, 16),
    (64, 64), (10_000, 64),  # above the largest key
])
def test_nearest_key_ties_go_up(T, want):
    assert tuned_configs._nearest_key([1, 16, 64], T) == want


def test_get_uses_nearest_key(isolated):
    user, _ = isolated
    write(user, config_file_name(8, 14336, DEV), table(1, 16, 64))
    lc = load()
    assert lc.is_tuned and lc.source.startswith("tuned:")
    assert lc.get(40)[0]["BLOCK_SIZE_M"] == 64
    assert lc.get(3)[0]["BLOCK_SIZE_M"] == 1
    g1, g2 = lc.get(16)
    assert g1["BLOCK_SIZE_M"] == 16 and g2["BLOCK_SIZE_N"] == 128
    assert g1["num_stages"] == 3 and g1["GROUP_SIZE_M"] == 1 and g1["SPLIT_K"] == 1  # filled defaults
    assert fake_default.calls == []


def test_far_key_falls_back_to_defaults(isolated):
    # a file tuned at T=4096 alone must not hand its prefill tiles to decode
    user, _ = isolated
    write(user, config_file_name(8, 14336, DEV), table(4096))
    lc = load()
    tuned = lc.table[4096][0]                  # table(4096) gives BM 16; fake_default 64 here
    assert lc.get(1024)[0] is tuned and lc.get(16384)[0] is tuned
    assert lc.get(1023)[0]["BLOCK_SIZE_M"] == 64 and lc.get(16385)[0]["BLOCK_SIZE_M"] == 64
    assert fake_default.calls == [1023, 16385]


# ------------------------------------------------------------------------------------------- search order
def test_config_dir_overrides_package(isolated):
    user, pkg = isolated
    name = config_file_name(8, 14336, DEV)
    write(pkg, name, {"triton_version": "3.6.0", "1": cfg(32)})
    assert load().get(1)[0]["BLOCK_SIZE_M"] == 32  # only the package has it
    write(user, name, {"triton_version": "3.6.0", "1": cfg(128)})
    lc = load()
    assert lc.get(1)[0]["BLOCK_SIZE_M"] == 128
    assert lc.source == "tuned:" + os.path.join(str(user), name)


def test_search_dirs_without_env(isolated, monkeypatch):
    _, pkg = isolated
    monkeypatch.delenv("FUSEDMOE_CONFIG_DIR")
    assert tuned_configs.search_dirs() == [str(pkg)]


def test_flat_vllm_style_entry_serves_both_gemms(isolated):
    user, _ = isolated
    write(user, config_file_name(8, 14336, DEV), {"16": cfg(16, 128, 64, num_warps=8)})
    g1, g2 = load().get(16)
    assert g1 == g2 and g1["num_warps"] == 8


# ------------------------------------------------------------------------------------------- defaults
def test_default_fallback_warns_once_naming_the_file(isolated, caplog):
    user, pkg = isolated
    caplog.set_level(logging.WARNING, logger="fusedmoe.tuned_configs")
    lc = load()
    lc2 = load()
    assert lc.source == "default" and not lc.is_tuned and lc2.source == "default"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert config_file_name(8, 14336, DEV) in msg
    assert str(user) in msg and str(pkg) in msg
    # another key warns again, once
    load(E=16)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_no_warning_on_cpu(isolated, caplog):
    caplog.set_level(logging.WARNING, logger="fusedmoe.tuned_configs")
    lc = LaunchConfigs.load("cpu", 8, 64, 128, 2, default_fn=fake_default)
    assert lc.source == "default"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_default_lookup_is_per_T_and_cached():
    lc = load()
    assert lc.get(1)[0]["BLOCK_SIZE_M"] == 16
    assert lc.get(1000)[0]["BLOCK_SIZE_M"] == 64
    lc.get(1)
    lc.get(1000)
    assert fake_default.calls == [1, 1000]  # one call per distinct T, then cached


def test_default_may_give_separate_gemm_configs(isolated):
    lc = LaunchConfigs.load(H100, 8, 64, 128, 2,
                            default_fn=lambda *a: {"gemm1": cfg(16), "gemm2": cfg(32)})
    g1, g2 = lc.get(5)
    assert (g1["BLOCK_SIZE_M"], g2["BLOCK_SIZE_M"]) == (16, 32)


# ------------------------------------------------------------------------------------------- Triton version
def test_triton_version_mismatch_is_noted_not_refused(isolated):
    user, _ = isolated
    write(user, config_file_name(8, 14336, DEV), table(1, 16, version="3.1.0"))
    lc = load()
    assert lc.is_tuned and lc.triton_version == "3.1.0"
    assert any("3.1.0" in n and "3.6.0" in n for n in lc.notes)
    assert "3.1.0" in lc.describe()


def test_same_major_minor_has_no_note(isolated):
    user, _ = isolated
    write(user, config_file_name(8, 14336, DEV), table(1, version="3.6.1"))
    assert load().notes == ()


# ------------------------------------------------------------------------------------------- bad files
BROKEN = [
    "{not json",
    json.dumps(["a", "list"]),                                              # someone else's JSON
    json.dumps({"triton_version": "3.6.0"}),                                # no entries
    json.dumps({"1": {"BLOCK_SIZE_M": 16}}),
    json.dumps({"1": {"gemm1": cfg(16)}}),
    json.dumps({"1": cfg(0)}),
    json.dumps({"1": cfg(16), "64": cfg(48)}),                              # one entry not a power of two
    json.dumps({"1": cfg(16, 96)}),
    json.dumps({"1": {"gemm1": cfg(16), "gemm2": cfg(16, 64, 80)}}),
    json.dumps({"1": cfg(16, num_warps=6)}),
    json.dumps({"1": cfg(16, 64, 8)}),                                      # K tile below a bf16 dot's 16
]


@pytest.mark.parametrize("content", BROKEN)
def test_malformed_file_is_ignored_with_one_warning_naming_it(isolated, caplog, content):
    user, pkg = isolated
    name = config_file_name(8, 14336, DEV)
    path = os.path.join(str(user), name)
    with open(path, "w") as f:
        f.write(content)
    caplog.set_level(logging.WARNING, logger="fusedmoe")
    lc = load()
    assert lc.source == "default" and lc.get(1) == lc.defaults_only().get(1)
    assert any(n.startswith(f"ignored {path}: ") for n in lc.notes)
    write(pkg, name, table(1))                  # the next file in the search order serves
    lc = load()
    assert lc.source == "tuned:" + os.path.join(str(pkg), name) and any(path in n for n in lc.notes)
    ignored = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(ignored) == 1 and path in ignored[0]                         # once per process


def test_malformed_sibling_file_is_skipped(isolated, caplog):
    _, pkg = isolated
    write(pkg, config_file_name(8, 14336, "NVIDIA_H100_80GB_HBM3"), {"1": cfg(24)})
    caplog.set_level(logging.WARNING, logger="fusedmoe")
    lc = LaunchConfigs.load(Platform.preset("h200"), 8, 14336, 4096, 2, "none", "bfloat16", default_fn=fake_default)
    assert lc.source == "default"
    assert sum("ignoring" in r.getMessage() and "NVIDIA_H100_80GB_HBM3" in r.getMessage()
               for r in caplog.records) == 1


@pytest.mark.parametrize("entry,bad", [(cfg(16, 64, 16), "at least 32"),           # fp8 dots need K >= 32
                                       (cfg(16, 64, 256), "does not divide the fp8 blocks")])
def test_fp8_block_file_entries_must_fit_the_blocks(isolated, caplog, entry, bad):
    user, _ = isolated
    name = config_file_name(8, 14336, DEV, "fp8_block")
    write(user, name, {"1": entry})
    caplog.set_level(logging.WARNING, logger="fusedmoe")
    lc = load(scheme="fp8_block")
    assert lc.source == "default"
    [msg] = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert name in msg and bad in msg and "BLOCK_SIZE_K" in msg
    write(user, name, {"1": cfg(16, 64, 128), "2": {**cfg(16, 64, 256), "A_RESIDENT": 4}})
    assert load(scheme="fp8_block").is_tuned


def test_shipped_files_pass_the_checks():
    folder = os.path.join(os.path.dirname(tuned_configs.__file__), "kernels", "configs")   # the real one
    names = [n for n in os.listdir(folder) if n.endswith(".json")]
    assert names
    for n in names:
        tag = n.split("dtype=")[1].split(",")[0].removesuffix(".json")
        block_k = 128 if "block_shape=[128,128]" in n else None
        assert LaunchConfigs._from_file(os.path.join(folder, n), 0, 0, 0, 1, tag, n, None, block_k).is_tuned


def test_missing_config_dir_warns_once_naming_it(isolated, caplog, monkeypatch, tmp_path):
    gone = str(tmp_path / "nonexistent")
    monkeypatch.setenv("FUSEDMOE_CONFIG_DIR", gone)
    caplog.set_level(logging.WARNING, logger="fusedmoe")
    load()
    load()
    tuned_configs.search_dirs()
    msgs = [r.getMessage() for r in caplog.records if "is not a folder" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].startswith(f"fusedmoe: FUSEDMOE_CONFIG_DIR={gone!r}")
    caplog.clear()
    afile = tmp_path / "a_file"
    afile.write_text("")
    monkeypatch.setenv("FUSEDMOE_CONFIG_DIR", str(afile))                    # a file is not a folder either
    tuned_configs.search_dirs()
    assert any(str(afile) in r.getMessage() and "is not a folder" in r.getMessage() for r in caplog.records)


def test_normalize_fills_and_keeps_extra_keys():
    c = tuned_configs.normalize_launch_config(cfg(16, USE_TMA=1))
    assert c["USE_TMA"] == 1 and c["num_warps"] == 4 and c["num_stages"] == 3
    with pytest.raises(ConfigError):
        tuned_configs.normalize_launch_config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": True})
    with pytest.raises(ConfigError, match=r"BLOCK_SIZE_N=48 is not a power of two"):
        tuned_configs.normalize_launch_config(cfg(16, 48))
    assert tuned_configs.normalize_launch_config(cfg(16, num_stages=5, GROUP_SIZE_M=24))["GROUP_SIZE_M"] == 24


# ------------------------------------------------------------------------------------------- override
def test_override_context(isolated):
    user, _ = isolated
    write(user, config_file_name(8, 14336, DEV), table(16))
    lc = load()
    a, b = full(128, 256), full(64, 32)
    with override((a, b)):
        assert lc.get(1) == (a, b) and lc.get(9999) == (a, b)
        with override({1: {"gemm1": full(16), "gemm2": full(16)}, 512: cfg(32)}):  # nested table
            assert lc.get(2)[0]["BLOCK_SIZE_M"] == 16
            assert lc.get(400)[1]["BLOCK_SIZE_M"] == 32
        assert lc.get(1) == (a, b)
    assert lc.get(1)[0]["BLOCK_SIZE_M"] == 16  # back to the file


def test_override_accepts_launchconfigs_and_callables():
    other = LaunchConfigs.from_table({1: cfg(16), 100: cfg(128)})
    lc = load()
    with override(other):
        assert lc.get(90)[0]["BLOCK_SIZE_M"] == 128
    with override(lambda T: (full(T), full(T))):
        assert lc.get(32)[0]["BLOCK_SIZE_M"] == 32


def test_override_restored_after_exception():
    lc = load()
    with pytest.raises(RuntimeError):
        with override(cfg(128)):
            raise RuntimeError("boom")
    assert lc.get(1)[0]["BLOCK_SIZE_M"] == 16


def test_for_config_uses_local_experts_and_I(isolated):
    user, _ = isolated
    c = MoEConfig(8, 2, 4096, 14336)
    write(user, config_file_name(8, 14336, DEV), table(1))
    assert LaunchConfigs.for_config(c, platform=H100).is_tuned


# ------------------------------------------------------------------------------------------- search space
def test_candidates_decode_never_use_big_blocks():
    # T=1, E=256, k=8 (DeepSeek decode): 8 hit experts with 1 token each
    for stage_cands in [tuner.candidate_configs(1, 256, 8, 512, 7168)]:
        assert stage_cands and all(c["BLOCK_SIZE_M"] == 16 for c in stage_cands)
    big = tuner.candidate_configs(16384, 8, 2, 28672, 4096)
    assert {c["BLOCK_SIZE_M"] for c in big} == {64, 128}


def test_candidates_block_m_covers_the_busiest_expert():
    # Mixtral T=64: 16 tokens per expert on average, the busiest ~2x: BM 32 must be tried
    # (H100: BM 32 beat every BM 16 config, which streams that expert's weights twice)
    bms = {c["BLOCK_SIZE_M"] for c in tuner.candidate_configs(64, 8, 2, 14336, 4096)}
    assert 32 in bms and max(bms) <= 32
    # GEMM2 up to 64 tokens per expert may split its long K to fill the SMs
    tiles = tuner.candidate_configs(256, 8, 2, 4096, 14336, gemm="gemm2")[:2]
    split = tuner.candidate_configs(256, 8, 2, 4096, 14336, gemm="gemm2", stage="split", tiles=tiles)
    assert split and {c["SPLIT_K"] for c in split} >= {2, 4}
    assert tuner.candidate_configs(4096, 8, 2, 4096, 14336, gemm="gemm2", stage="split", tiles=tiles) == []


def test_candidates_tma_stage(monkeypatch):
    t64, t16 = full(64), full(16)
    monkeypatch.setattr(tuner, "_tma_available", lambda: True)
    got = tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="tma", tiles=[t64, t16])
    # decode tiles (BM 16) are not tried; a gated GEMM1 also tries gate and up as one dot, and
    # that with x in sorted order (a 16-bit scheme)
    one = {**t64, "USE_TMA": True, "GU_ONE_DOT": True}
    assert got == [{**t64, "USE_TMA": True}, one, {**one, "SORTED_X": True}]
    assert tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="tma", tiles=got[2:]) == []
    assert tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="tma", tiles=got[1:2]) == got[2:]
    assert tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="tma", tiles=got[:1]) == got[1:]
    # no one dot for GEMM2, an ungated GEMM1 or block scales (their per-group dots stay apart);
    # the sorted A (GEMM2: h) for 16-bit schemes only, not an A-resident GEMM2, not when the
    # search space says no
    tma = {**t64, "USE_TMA": True}
    for kw, want in ((dict(gemm="gemm2"), [tma, {**tma, "SORTED_H": True}]),
                     (dict(gated=False), [tma, {**tma, "SORTED_X": True}]),
                     (dict(scheme="fp8_block"), [tma]), (dict(scheme="fp8_channel", gemm="gemm2"), [tma]),
                     (dict(gemm="gemm2", space={"SORTED_H": [False]}), [tma])):
        got = tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="tma", tiles=[t64], **kw)
        assert got == want, kw
    got = tuner.candidate_configs(4096, 8, 2, 4096, 14336, gemm="gemm2", stage="tma", tiles=[{**t64, "A_RESIDENT": 4}])
    assert got == [{**t64, "A_RESIDENT": 4, "USE_TMA": True}]
    monkeypatch.setattr(tuner, "_tma_available", lambda: False)
    assert tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="tma", tiles=[t64]) == []


def test_candidates_persistent_stage_half_tail():
    # the persistent stage: PERSISTENT x FLATTEN variants of a one-tile-a-program tile, and that
    # tile with HALF_TAIL (one tile a program only: persistent it measured slower); none for a
    # tile that is already persistent, a decode tile (BM 16) gets no HALF_TAIL, decode T none
    t64, t16 = full(64), full(16)
    got = tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="persistent", tiles=[t64, t16])
    halves = [c for c in got if c.get("HALF_TAIL")]
    assert halves == [{**t64, "HALF_TAIL": True}]
    assert all(not c.get("HALF_TAIL") for c in got if c.get("PERSISTENT"))
    assert any(c.get("PERSISTENT") for c in got)
    assert tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="persistent",
                                    tiles=[{**t64, "PERSISTENT": 1}]) == []
    assert tuner.candidate_configs(16, 8, 2, 4096, 14336, stage="persistent", tiles=[t64]) == []
    # a HALF_TAIL tile's persistent variants drop it (the pair measured slower)
    got = tuner.candidate_configs(4096, 8, 2, 4096, 14336, stage="persistent", tiles=[{**t64, "HALF_TAIL": True}])
    assert got and all("HALF_TAIL" not in c and c["PERSISTENT"] for c in got)


def test_candidates_fit_the_matrix_and_shared_memory():
    cands = tuner.candidate_configs(4096, 64, 8, 48, 40)  # tiny N and K
    assert cands
    for c in cands:
        assert c["BLOCK_SIZE_N"] <= 64 and c["BLOCK_SIZE_K"] <= 64
    tiles = tuner.candidate_configs(4096, 8, 2, 4096, 4096, stage="tiles")
    pipe = tuner.candidate_configs(4096, 8, 2, 4096, 4096, stage="pipeline", tiles=tiles)
    for c in pipe:
        smem = c["num_stages"] * (c["BLOCK_SIZE_M"] + c["BLOCK_SIZE_N"]) * c["BLOCK_SIZE_K"] * 2
        assert smem <= tuner.SMEM_LIMIT


def test_candidates_scheme_constraints_and_group_stage():
    fp8 = tuner.candidate_configs(64, 256, 8, 512, 7168, scheme="fp8_block")
    assert fp8 and all(128 % c["BLOCK_SIZE_K"] == 0 for c in fp8)  # block scales per K tile
    # every block tile both ways (per-group dot / RESCALE); other schemes never get the key
    tiles = {tuple(sorted((k, v) for k, v in c.items() if k != "RESCALE")) for c in fp8}
    assert sorted(c["RESCALE"] for c in fp8) == [False] * len(tiles) + [True] * len(tiles)
    assert [c["RESCALE"] for c in tuner.candidate_configs(64, 256, 8, 512, 7168, scheme="fp8_block",
                                                            space={"RESCALE": [True]})] == [True] * len(tiles)
    assert not any("RESCALE" in c for c in tuner.candidate_configs(64, 256, 8, 512, 7168, scheme="fp8_channel"))
    int4 = tuner.candidate_configs(64, 8, 2, 512, 4096, scheme="int4_w4a16:g64")
    assert all(64 % c["BLOCK_SIZE_K"] == 0 for c in int4)
    # one M block per expert: GROUP_SIZE_M cannot matter
    assert tuner.candidate_configs(1, 8, 2, 512, 512, stage="group", tiles=[full(16)]) == []
    assert len(tuner.candidate_configs(8192, 8, 2, 512, 512, stage="group", tiles=[full(64)])) == 4


def test_gemm2_block_m_divides_gemm1_and_split_only_in_decode():
    c = tuner.candidate_configs(4096, 8, 2, 4096, 14336, gemm="gemm2", bm_divides=64)
    assert c and all(64 % x["BLOCK_SIZE_M"] == 0 for x in c)
    t = [full(16, 64, 128)]
    split = tuner.candidate_configs(1, 8, 2, 4096, 14336, gemm="gemm2", stage="split", tiles=t)
    assert sorted(x["SPLIT_K"] for x in split) == [1, 2, 4, 8, 16]
    assert tuner.candidate_configs(1, 8, 2, 4096, 14336, gemm="gemm1", stage="split", tiles=t) == []
    assert tuner.candidate_configs(8192, 8, 2, 4096, 14336, gemm="gemm2", stage="split", tiles=t) == []
    # K too short to split 16 ways into >= 2 K tiles each
    assert max(x["SPLIT_K"] for x in tuner.candidate_configs(1, 8, 2, 64, 1024, gemm="gemm2", stage="split",
                                                               tiles=t)) == 4


def test_gated_gemm1_counts_both_weight_tiles_in_shared_memory():
    # BM 64, BN 128, BK 128 in bf16: 80 KiB per stage with gate + up tiles, 48 KiB for one tile
    t = [full(64, 128, 128)]
    g1 = tuner.candidate_configs(4096, 8, 2, 4096, 4096, gemm="gemm1", stage="pipeline", tiles=t)
    g2 = tuner.candidate_configs(4096, 8, 2, 4096, 4096, gemm="gemm2", stage="pipeline", tiles=t)
    assert {c["num_stages"] for c in g1} == {2} and {c["num_stages"] for c in g2} == {2, 3, 4}


def test_search_space_argument_replaces_values():
    c = tuner.candidate_configs(256, 8, 2, 1024, 1024, space={"BLOCK_SIZE_M": [32], "BLOCK_SIZE_N": [128],
                                                                 "BLOCK_SIZE_K": [64]})
    assert [(x["BLOCK_SIZE_M"], x["BLOCK_SIZE_N"], x["BLOCK_SIZE_K"]) for x in c] == [(32, 128, 64)]


def test_default_space_stays_small():
    # budget: ~7 token counts x 2 GEMMs must stay in a few hundred timings (< 5 min on an H100)
    total = 0
    for T in tuner.DEFAULT_TUNE_TOKENS:
        for n_out, k_in in ((2 * 768, 2048), (2048, 768)):
            tiles = tuner.candidate_configs(T, 128, 8, n_out, k_in)
            pipe = tuner.candidate_configs(T, 128, 8, n_out, k_in, stage="pipeline", tiles=tiles[:2])
            grp = tuner.candidate_configs(T, 128, 8, n_out, k_in, stage="group", tiles=tiles[:1])
            total += len(tiles) + len(pipe) + len(grp)
    assert total < 600


# ------------------------------------------------------------------------------------------- the search
def _cost(pair):
    """Fake µs: gemm1 likes BN=128, BK=128, 2 stages; gemm2 likes BN=64, few stages, SPLIT_K 4;
    BK=256 can't launch."""
    c1, c2 = pair
    if c1["BLOCK_SIZE_K"] == 256:
        raise RuntimeError("out of resource: shared memory")
    return (abs(c1["BLOCK_SIZE_N"] - 128) + abs(c1["BLOCK_SIZE_K"] - 128) + (0 if c1["num_stages"] == 2 else 5)
            + abs(c2["BLOCK_SIZE_N"] - 64) + c2["num_stages"] + abs(c2["SPLIT_K"] - 4) + 100)


def test_search_point_finds_the_fake_optimum():
    steps = []
    pt = tuner.search_point(1, E=8, top_k=2, H=1024, N13=2048, I=1024, default_pair=(full(16), full(16)),
                             measure=_cost, check=lambda pair: (True, 1e-3), on_step=steps.append)
    assert (pt.gemm1["BLOCK_SIZE_N"], pt.gemm1["BLOCK_SIZE_K"], pt.gemm1["num_stages"]) == (128, 128, 2)
    assert pt.gemm1["BLOCK_SIZE_M"] == 16 and pt.gemm1["SPLIT_K"] == 1  # T=1: one token per expert
    assert pt.gemm2["BLOCK_SIZE_N"] == 64 and pt.gemm2["num_stages"] == 2 and pt.gemm2["SPLIT_K"] == 4
    assert pt.rel_err == 1e-3 and 0 < pt.timed <= len(steps)
    assert any("out of resource" in f for f in pt.failures)  # reported, not fatal


def test_search_point_tma_on_the_runner_up(monkeypatch):
    # the TMA stage times the best TWO tiles with USE_TMA: here BN 64 ranks second without TMA
    # and wins with it (as GEMM1 128 x (2 x 64) x 128 did at H100 Mixtral T=256); GEMM2's BM is
    # searched free of GEMM1's (the alignment takes the larger)
    monkeypatch.setattr(tuner, "_tma_available", lambda: True)

    def cost(pair):
        c1, c2 = pair
        t = 100.0 + {128: 0, 64: 1}.get(c1["BLOCK_SIZE_N"], 3) + (0 if c1["BLOCK_SIZE_K"] == 128 else 3)
        t += (0 if c1["BLOCK_SIZE_M"] == 64 else 2) + c1["num_stages"] * 0.01
        if c1.get("USE_TMA") and c1["BLOCK_SIZE_N"] == 64:
            t -= 5
        t += 0 if c2["BLOCK_SIZE_M"] == 128 else 2
        return t
    pt = tuner.search_point(4096, E=128, top_k=8, H=2048, N13=1536, I=768, default_pair=(full(64), full(64)),
                             measure=cost, check=lambda pair: (True, 1e-3))
    assert pt.gemm1["BLOCK_SIZE_N"] == 64 and pt.gemm1.get("USE_TMA")
    assert pt.gemm2["BLOCK_SIZE_M"] == 128


def test_search_point_skips_a_wrong_winner():
    def check(pair):
        wrong = pair[0]["BLOCK_SIZE_N"] == 128 and pair[0]["BLOCK_SIZE_K"] == 128 and pair[0]["num_stages"] == 2
        return (not wrong), (0.5 if wrong else 1e-3)
    pt = tuner.search_point(1, E=8, top_k=2, H=1024, N13=2048, I=1024, default_pair=(full(16), full(16)),
                             measure=_cost, check=check)
    assert not (pt.gemm1["BLOCK_SIZE_N"] == 128 and pt.gemm1["BLOCK_SIZE_K"] == 128 and pt.gemm1["num_stages"] == 2)
    assert any("wrong result" in f for f in pt.failures)


def test_search_point_all_wrong_raises():
    with pytest.raises(ConfigError, match="no correct config"):
        tuner.search_point(1, E=8, top_k=2, H=256, N13=512, I=256, default_pair=(full(16), full(16)),
                            measure=_cost, check=lambda p: (False, 1.0))


def test_search_point_nothing_launches_raises():
    def never(pair):
        raise RuntimeError("no")
    with pytest.raises(ConfigError, match="no config"):
        tuner.search_point(1, E=8, top_k=2, H=256, N13=512, I=256, default_pair=(full(16), full(16)),
                            measure=never, check=lambda p: (True, 0.0))


def test_written_file_round_trips_and_merges(isolated):
    user, _ = isolated
    path = os.path.join(str(user), config_file_name(8, 14336, DEV))
    tuner.write_config_file(path, {16: {"gemm1": full(16), "gemm2": full(32)}},
                             {"seconds": 1, "points": {"16": {"tuned_us": 5.0}}})
    with open(path) as f:                                   # a note added by hand
        d = json.load(f)
    d["meta"]["retune_note"] = "kept"
    with open(path, "w") as f:
        json.dump(d, f)
    tuner.write_config_file(path, {256: {"gemm1": full(64), "gemm2": full(64)}},
                             {"seconds": 2, "points": {"256": {"tuned_us": 50.0}}})
    data = json.load(open(path))
    assert data["triton_version"] == "3.6.0" and set(data) == {"triton_version", "16", "256", "meta"}
    # the earlier run's per-T record and the note survive; the new run's fields win
    assert data["meta"]["points"] == {"16": {"tuned_us": 5.0}, "256": {"tuned_us": 50.0}}
    assert data["meta"]["retune_note"] == "kept" and data["meta"]["seconds"] == 2
    lc = load()
    assert lc.get(20)[1]["BLOCK_SIZE_M"] == 32 and lc.get(200)[0]["BLOCK_SIZE_M"] == 64


def test_triton_version_section_wins_under_its_triton(isolated, monkeypatch):
    # a file tuned under 3.6 with a section of 3.9 entries: under 3.9 the section's T win and the
    # other T come from the file's own entries (the report says which); under 3.6 the section is unused
    user, _ = isolated
    d = table(16, 4096)
    d["triton_versions"] = {"3.9": {"4096": {"gemm1": cfg(64, 32), "gemm2": cfg(64, 64)}, "meta": {"x": 1}}}
    write(user, config_file_name(8, 14336, DEV), d)
    monkeypatch.setattr(tuned_configs, "_running_triton_version", lambda: "3.9.1")
    lc = load()
    assert lc.get(4096)[0]["BLOCK_SIZE_N"] == 32 and lc.get(4096)[1]["BLOCK_SIZE_N"] == 64
    assert lc.get(16) == load_36_entry(d, "16")
    assert any("T=[4096] from its Triton 3.9 entries" in n for n in lc.notes)
    monkeypatch.setattr(tuned_configs, "_running_triton_version", lambda: "3.6.0")
    lc = load()
    assert lc.get(4096) == load_36_entry(d, "4096") and not lc.notes
    # a section with no token-count keys is no section: the version-mismatch note instead
    d["triton_versions"] = {"3.9": {"meta": {}}}
    write(user, config_file_name(8, 14336, DEV), d)
    monkeypatch.setattr(tuned_configs, "_running_triton_version", lambda: "3.9.0")
    assert any("tuned with Triton 3.6.0, running 3.9.0" in n for n in load().notes)


def load_36_entry(d, key):
    return tuned_configs._split_entry(d[key], key)


def test_write_under_another_triton_keeps_the_file_and_adds_its_section(isolated, monkeypatch):
    user, _ = isolated
    path = os.path.join(str(user), config_file_name(8, 14336, DEV))
    tuner.write_config_file(path, {16: {"gemm1": full(16), "gemm2": full(32)}}, {"points": {"16": {"us": 1.0}}})
    monkeypatch.setattr(tuned_configs, "_running_triton_version", lambda: "3.9.0")
    tuner.write_config_file(path, {16: {"gemm1": full(64), "gemm2": full(64)}}, {"points": {"16": {"us": 2.0}}})
    tuner.write_config_file(path, {256: {"gemm1": full(128), "gemm2": full(128)}})     # merges into it
    data = json.load(open(path))
    assert data["triton_version"] == "3.6.0" and data["16"]["gemm1"]["BLOCK_SIZE_M"] == 16   # untouched
    sec = data["triton_versions"]["3.9"]
    assert set(sec) == {"16", "256", "meta"} and sec["16"]["gemm1"]["BLOCK_SIZE_M"] == 64
    assert sec["meta"]["points"] == {"16": {"us": 2.0}}
    assert load().get(200)[0]["BLOCK_SIZE_M"] == 128
    # back under 3.6: its own entries are rewritten, the 3.9 section stays
    monkeypatch.setattr(tuned_configs, "_running_triton_version", lambda: "3.6.2")
    tuner.write_config_file(path, {4096: {"gemm1": full(128), "gemm2": full(128)}})
    data = json.load(open(path))
    assert set(k for k in data if k.isdigit()) == {"16", "4096"} and data["triton_version"] == "3.6.2"
    assert data["triton_versions"]["3.9"]["16"]["gemm1"]["BLOCK_SIZE_M"] == 64


# ------------------------------------------------------------------------------------------- the writer
def _write_many(path, first, n, errors):
    try:
        for T in range(first, first + n):
            tuner.write_config_file(path, {T: {"gemm1": full(16), "gemm2": full(32)}}, {"points": {str(T): {}}})
    except BaseException as e:          # a thread's exception would otherwise vanish
        errors.append(e)
        raise


@pytest.mark.parametrize("how", ["threads", "processes"])
def test_concurrent_writers_lose_no_entry(isolated, how):
    # two `fusedmoe tune` runs on one file: each read-merge-write holds the lock beside it
    user, _ = isolated
    path = os.path.join(str(user), config_file_name(8, 14336, DEV))
    errors = []
    if how == "threads":
        workers = [threading.Thread(target=_write_many, args=(path, first, 200, errors)) for first in (1, 1001)]
    else:
        ctx = multiprocessing.get_context("fork")
        workers = [ctx.Process(target=_write_many, args=(path, first, 200, errors)) for first in (1, 1001)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    assert not errors and all(getattr(w, "exitcode", 0) == 0 for w in workers)
    data = json.load(open(path))
    want = set(range(1, 201)) | set(range(1001, 1201))
    assert {int(k) for k in data if k.isdigit()} == want
    assert {int(k) for k in data["meta"]["points"]} == want
    assert [n for n in os.listdir(str(user)) if not n.endswith((".json", ".lock"))] == []    # no temp files
    assert load().is_tuned


@pytest.mark.parametrize("content", ["{not json", json.dumps({"1": cfg(16, 48)}), json.dumps(["x"])])
def test_writer_refuses_to_overwrite_a_malformed_file_unless_forced(isolated, content):
    user, _ = isolated
    path = os.path.join(str(user), config_file_name(8, 14336, DEV))
    with open(path, "w") as f:
        f.write(content)
    with pytest.raises(ConfigError) as ei:
        tuner.write_config_file(path, {16: {"gemm1": full(16), "gemm2": full(32)}})
    assert path in str(ei.value) and "refusing to overwrite" in str(ei.value) and "--force" in str(ei.value)
    assert open(path).read() == content
    tuner.write_config_file(path, {16: {"gemm1": full(16), "gemm2": full(32)}}, force=True)
    assert set(json.load(open(path))) == {"triton_version", "16"} and load().is_tuned


def test_a_failed_rename_leaves_the_old_file_intact(isolated, monkeypatch):
    # an interrupted write: the new content never replaces the old file, and no temp file stays
    user, _ = isolated
    path = os.path.join(str(user), config_file_name(8, 14336, DEV))
    tuner.write_config_file(path, {16: {"gemm1": full(16), "gemm2": full(32)}})
    before = open(path).read()

    def fail(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ConfigError) as ei:
        tuner.write_config_file(path, {256: {"gemm1": full(64), "gemm2": full(64)}})
    monkeypatch.undo()
    assert f"cannot be written at {path} (" in str(ei.value) and "No space" in str(ei.value)
    assert open(path).read() == before
    assert sorted(os.listdir(str(user))) == sorted([os.path.basename(path), os.path.basename(path) + ".lock"])


def test_an_unwritable_place_is_a_user_error_naming_it(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    path = str(blocker / config_file_name(8, 14336, DEV))          # its folder is a file
    with pytest.raises(ConfigError) as ei:
        tuner.write_config_file(path, {16: {"gemm1": full(16), "gemm2": full(32)}})
    assert path in str(ei.value) and "cannot be written" in str(ei.value)


def test_writer_refuses_entries_the_lookup_would_ignore(isolated):
    user, _ = isolated
    path = os.path.join(str(user), config_file_name(8, 14336, DEV, "fp8_block"))
    with pytest.raises(ConfigError, match="does not divide the fp8 blocks"):
        tuner.write_config_file(path, {16: {"gemm1": full(16, bk=256), "gemm2": full(16)}})
    assert not os.path.exists(path)


def test_fp8_block_candidates_are_powers_of_two_dividing_bk():
    for bk, want in ((128, [64, 128]), (96, [32]), (32, [32])):
        cands = tuner.candidate_configs(4096, 8, 2, 256, 512, scheme=f"fp8_block:b128x{bk}")
        assert sorted({c["BLOCK_SIZE_K"] for c in cands}) == want


# ------------------------------------------------------------------------------------------- tune
@pytest.mark.parametrize("scheme", ["int8_w8a16", "int4_w4a16", "fp8_w8a16", "mxfp4"])
def test_tune_says_a_scheme_has_no_tunable_kernel_and_who_serves_it(builtin_only, scheme):
    with pytest.raises(ConfigError) as ei:
        tuner.tune(MoEConfig(8, 2, 256, 128), scheme, [1], platform=H100)
    msg = str(ei.value)
    assert "has no tunable Triton kernel yet" in msg and "'emulation' serves it on" in msg
    assert "triton_weight_only" not in msg and "fp8_block" in msg       # the tunable schemes are listed


def test_tune_cli_passes_force(monkeypatch, tmp_path):
    import fusedmoe.tuner as tuner_mod
    from fusedmoe.cli.main import main
    seen = {}

    def fake_tune(config, scheme, tokens, **kw):
        seen.update(kw)
        path = os.path.join(str(tmp_path), "x.json")
        tuner.write_config_file(path, {1: {"gemm1": full(16), "gemm2": full(16)}})
        return path
    monkeypatch.setattr(tuner_mod, "tune", fake_tune)
    assert main(["tune", "--shape", "8,2,256,128", "--tokens", "1", "--force", "--no-progress"]) == 0
    assert seen["force"] is True
    assert main(["tune", "--shape", "8,2,256,128", "--tokens", "1", "--no-progress"]) == 0
    assert seen["force"] is False


def test_tune_refuses_cpu():
    with pytest.raises(ConfigError, match="CUDA"):
        tuner.tune(MoEConfig(8, 2, 64, 32), "none", [1], platform="cpu")


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_tune_writes_a_file_the_backend_loads(tmp_path, monkeypatch):
    """A tiny tune end to end: the file is written, named for this device, and loaded back."""
    c = MoEConfig(8, 2, 256, 128)
    space = {"BLOCK_SIZE_N": [64], "BLOCK_SIZE_K": [64], "num_warps": [4], "num_stages": [3],
             "GROUP_SIZE_M": [1], "SPLIT_K": [1, 2]}
    path = tuner.tune(c, "none", [1, 64], platform=Platform.current(), out_dir=str(tmp_path),
                       search_space=space, progress=False, budget_ms=5)
    data = json.load(open(path))
    assert os.path.basename(path) == config_file_name(8, 128, Platform.current().device_name)
    assert {"1", "64", "triton_version", "meta"} <= set(data)
    assert data["meta"]["points"]["1"]["rel_err"] is not None
    monkeypatch.setenv("FUSEDMOE_CONFIG_DIR", str(tmp_path))
    assert LaunchConfigs.for_config(c).is_tuned


# ------------------------------------------------------------------------------------------- sibling devices
def test_h200_uses_the_h100_file_when_it_has_none(isolated, caplog):
    # edge: no file for the H200; the H100's (same SM architecture) is a better start than defaults
    _, pkg = isolated
    write(pkg, config_file_name(8, 14336, "NVIDIA_H100_80GB_HBM3"), table(1, 256))
    h200 = Platform.preset("h200")
    with caplog.at_level(logging.WARNING, logger="fusedmoe"):
        lc = LaunchConfigs.load(h200, 8, 14336, 4096, 2, "none", "bfloat16", default_fn=fake_default)
    assert lc.is_tuned and lc.source.startswith("sibling:")
    assert any("tuned on NVIDIA_H100_80GB_HBM3" in n for n in lc.notes)
    assert "NVIDIA_H100_80GB_HBM3" in lc.describe()
    assert lc.get(200)[0]["BLOCK_SIZE_M"] == 16 and lc.get(2)[0]["BLOCK_SIZE_M"] == 1   # the T=256 / T=1 entries
    assert fake_default.calls == []
    assert sum("tuned on NVIDIA_H100" in r.getMessage() for r in caplog.records) == 1


def test_own_file_beats_the_sibling(isolated):
    _, pkg = isolated
    write(pkg, config_file_name(8, 14336, "NVIDIA_H100_80GB_HBM3"), table(1))
    write(pkg, config_file_name(8, 14336, "NVIDIA_H200"), {"triton_version": "3.6.0", "1": cfg(32)})
    lc = LaunchConfigs.load(Platform.preset("h200"), 8, 14336, 4096, 2, "none", "bfloat16", default_fn=fake_default)
    assert lc.source.startswith("tuned:") and lc.get(1)[0]["BLOCK_SIZE_M"] == 32


def test_unrelated_device_gets_defaults(isolated):
    _, pkg = isolated
    write(pkg, config_file_name(8, 14336, "NVIDIA_H100_80GB_HBM3"), table(1))
    lc = LaunchConfigs.load(Platform.preset("a100"), 8, 14336, 4096, 2, "none", "bfloat16", default_fn=fake_default)
    assert not lc.is_tuned and lc.source == "default"
