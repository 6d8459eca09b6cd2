"""fusedmoe/plan.py on the CPU: FUSEDMOE_PLAN (``PlanOverride``) parsing, the override reaching
the plans, and the per-device facts (``DEVICES``) choosing plans on the GPU presets (the planner
reads the platform's name and facts only: no GPU needed).

Legend: T tokens, k top-k, E local experts.
"""
from __future__ import annotations

import dataclasses
import json
from types import MappingProxyType

import pytest

from fusedmoe import env, plan
from fusedmoe.config import MoEConfig, QuantScheme
from fusedmoe.errors import ConfigError
from fusedmoe.plan import DEFAULT_DEVICE, DEVICES, PlanOverride, Planner, device_facts
from fusedmoe.platform import Platform
from fusedmoe.presets import get_preset

H100, H200 = Platform.preset("h100"), Platform.preset("h200")
OTHER = Platform("cuda", "NVIDIA H800", (9, 0), 80.0, 132, True, False)     # sm90, not in DEVICES
QWEN = get_preset("qwen3-30b-a3b").to_config()                              # E 128, k 8, I 768
DS = get_preset("deepseek-v3").to_config(tp=8)                              # E 256, k 8, I 256, H 7168
BOOLS = [(False, False), (True, True)]
NOT_BOOLS = [0, 1, "true", None]

# every key: the JSON values it takes (and what they parse to), and values it refuses
GOOD = {
    "decode_pairs": [(0, 0), (16, 16)],
    "w8a8_decode": [("auto", "auto"), ("A16", "a16"), ("a8", "a8"), ("tc", "tc")],
    "decode_pdl": BOOLS,
    "prefill_pdl": BOOLS,
    "decode_tiles": [(1, 1), (4, 4)],
    "decode_a3": BOOLS,
    "decode_slots_first": BOOLS,
    "decode_w4": BOOLS,
    "decode_share": BOOLS,
    "tc_l2_pre": [(3, (3, 3)), ([4, 1], (4, 1)), ([0, 0], (0, 0))],
    "h_quant": [("", ""), ("kernel", "kernel"), ("Epilogue", "epilogue")],
    "reduce": [(None, None), ("deterministic", "deterministic"), ("atomic", "atomic"), ("atomic_out", "atomic_out")],
    "fast_launch": BOOLS,
}
BAD = {
    "decode_pairs": [-1, 1.5, "16", True, None],
    "w8a8_decode": ["fp8", "", 1, None],
    "decode_pdl": NOT_BOOLS,
    "prefill_pdl": NOT_BOOLS,
    "decode_tiles": [0, -2, 2.0, False, None],
    "decode_a3": NOT_BOOLS + ["yes"],
    "decode_slots_first": NOT_BOOLS + [2],
    "decode_w4": NOT_BOOLS,
    "decode_share": NOT_BOOLS,
    "tc_l2_pre": [-1, [1], [1, 2, 3], [1, -1], "4,1", [1.0, 2], True, None],
    "h_quant": ["fast", 0, None],
    "reduce": ["fast", "", 0],
    "fast_launch": NOT_BOOLS,
}


def _planner(config, scheme, platform, **forced):
    return Planner(config, QuantScheme.parse(scheme), platform, forced=PlanOverride(**forced))


# ------------------------------------------------------------------------------ FUSEDMOE_PLAN
def test_every_override_key_has_cases():
    keys = {f.name for f in dataclasses.fields(PlanOverride)}
    assert set(GOOD) == set(BAD) == keys
    assert "FUSEDMOE_PLAN" in env.VARIABLES


@pytest.mark.parametrize("key", sorted(GOOD))
def test_plan_override_parses_each_key(key, monkeypatch):
    default = PlanOverride()
    for value, want in GOOD[key]:
        text = json.dumps({key: value})
        got = PlanOverride.parse(text)
        assert getattr(got, key) == want, (key, value)
        assert dataclasses.replace(got, **{key: getattr(default, key)}) == default    # the others untouched
        monkeypatch.setenv("FUSEDMOE_PLAN", f" {text} ")
        assert plan.override() == got
    for value in BAD[key]:
        with pytest.raises(ConfigError, match=rf"^FUSEDMOE_PLAN\['{key}'\]=.*Fix: unset FUSEDMOE_PLAN"):
            PlanOverride.parse(json.dumps({key: value}))
        monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({key: value}))
        with pytest.raises(ConfigError, match=rf"FUSEDMOE_PLAN\['{key}'\]"):
            plan.override()


def test_plan_override_unset_unknown_keys_and_bad_json(monkeypatch):
    assert PlanOverride.parse(None) == PlanOverride.parse("") == PlanOverride.parse("{}") == PlanOverride()
    for blank in ("", "  "):
        monkeypatch.setenv("FUSEDMOE_PLAN", blank)
        assert env.plan() is None and plan.override() == PlanOverride()
    both = PlanOverride.parse('{"w8a8_decode": "tc", "reduce": "deterministic", "decode_pairs": 4}')
    assert (both.w8a8_decode, both.reduce, both.decode_pairs) == ("tc", "deterministic", 4)
    # an unknown key (a typo, or one of the removed FUSEDMOE_* variables' names) names the keys there are
    for key in ("decode_pair", "W8A8_DECODE", "early_w"):
        with pytest.raises(ConfigError, match=rf"^FUSEDMOE_PLAN='{key}' .*decode_pairs.*w8a8_decode.*Fix"):
            PlanOverride.parse(json.dumps({key: 1}))
    for text in ("{", "w8a8_decode=tc", "[1]", '"tc"', "1", "null"):
        with pytest.raises(ConfigError, match=r"^FUSEDMOE_PLAN=.*a JSON object.*Fix"):
            PlanOverride.parse(text)
        monkeypatch.setenv("FUSEDMOE_PLAN", text)
        with pytest.raises(ConfigError, match="FUSEDMOE_PLAN"):
            Planner(QWEN, QuantScheme(), H100)          # read when a planner is made


def test_plan_override_reaches_the_plans(monkeypatch):
    none, fp8 = QuantScheme(), QuantScheme.parse("fp8_channel")

    def planner(scheme=none, platform=H100, config=QWEN, **forced):
        monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps(forced))
        return Planner(config, scheme, platform)
    # reduce: the grouped k-sum when determinism was not asked for (the rule: atomic_out here)
    assert planner().plan(1024).path == "grouped" and planner().plan(1024).reduce == "atomic_out"
    p = planner(reduce="atomic").plan(1024)
    assert (p.reduce, p.reduce_forced) == ("atomic", True)
    assert "FUSEDMOE_PLAN reduce=atomic" in plan.describe(p, planner(reduce="atomic"))
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"reduce": "atomic"}))
    assert Planner(QWEN, none, H100, deterministic=True).plan(1024).reduce == "deterministic"
    # decode_pairs: 0 takes every T to the grouped path
    assert planner().plan(1).path == "decode" and planner().decode_pairs == 32
    assert planner(decode_pairs=0).plan(1).path == "grouped" and planner(decode_pairs=0).decode_pairs == 0
    assert planner(decode_pairs=64).plan(8).path == "decode"
    # w8a8_decode: the decode math of W8A8 schemes (auto: a16 to T = 3 on an H100, then tc)
    assert [planner(fp8).plan(T).math for T in (1, 3, 4)] == ["a16", "a16", "tc"]
    assert planner(fp8, w8a8_decode="a8").plan(1).math == "a8"
    assert planner(fp8, w8a8_decode="tc").plan(1).math == "tc"
    assert planner(fp8, w8a8_decode="a16").plan(4).math == "a16"
    assert planner(w8a8_decode="tc").plan(1).math == "16bit"                  # 16-bit weights: n/a
    # decode_pdl / prefill_pdl: the PDL chains (on wherever plan.pdl_ok says so)
    ok = plan.pdl_ok(H100)
    assert planner().plan(1).pdl == ok and not planner(decode_pdl=False).plan(1).pdl
    assert planner().plan(64).pdl == ok and not planner(prefill_pdl=False).plan(64).pdl
    assert not planner(platform=Platform.preset("cpu")).plan(1).pdl
    # the decode GEMM2's tiles and layouts, the tc decode's expert sharing and L2 hints, W4
    assert planner(decode_tiles=2).plan(1).gemm2["TILES"] == 2
    assert planner(decode_a3=True).plan(1).gemm2["A3"] and not planner(decode_a3=False).plan(1).gemm2["A3"]
    assert not planner(decode_slots_first=False).plan(1).gemm2["SLOTS_FIRST"]
    assert not planner(fp8).plan(2).share and planner(fp8, decode_share=True).plan(4).share
    assert planner(fp8, decode_share=True).plan(4).tc
    if ok:
        assert planner(fp8, tc_l2_pre=[2, 1]).plan(4).gemm1["L2_PRE"] == 2
    assert planner(fp8).plan(1).gemm1["W4"] and not planner(fp8, decode_w4=False).plan(1).gemm1["W4"]
    # h_quant: GEMM1's epilogue quantizes h (fp8_block by default, fp8_channel when asked)
    blk = QuantScheme.parse("fp8_block")
    assert planner(blk, config=DS).h_epilogue and not planner(blk, config=DS, h_quant="kernel").h_epilogue
    assert not planner(fp8).h_epilogue and planner(fp8, h_quant="epilogue").h_epilogue


def test_fast_launch_reaches_the_launcher(mk, monkeypatch):
    from fusedmoe.backends.triton import TritonExperts
    from fusedmoe.kernels import launcher
    seen = []
    monkeypatch.setattr(launcher, "set_fast", seen.append)
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg)
    for forced, want in (({}, True), ({"fast_launch": False}, False), ({"fast_launch": True}, True)):
        monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps(forced))
        TritonExperts(cfg, w, Platform.preset("cpu"))
        assert seen[-1] is want


# ------------------------------------------------------------------------------ per-device facts
def test_device_facts_by_name():
    assert device_facts(H200) is DEVICES["H200"] and device_facts(H100) is DEVICES["H100"]
    assert device_facts(Platform("cuda", "NVIDIA H200 NVL", (9, 0), 140.0, 132, True)) is DEVICES["H200"]
    for other in (OTHER, Platform.preset("a100"), Platform.preset("b200"), Platform.preset("cpu"), None):
        assert device_facts(other) is DEFAULT_DEVICE, other
    # an unknown GPU takes the rules of the first Hopper measured, without its tuned extras
    assert DEFAULT_DEVICE.a16_max_t == DEVICES["H100"].a16_max_t
    assert not DEFAULT_DEVICE.tc_gemm1_block_groups and DEFAULT_DEVICE.tc_l2_pre_gemm1 == 0


def test_plans_differ_where_the_device_facts_do():
    # W8A8 decode math under 'auto': a16 up to DeviceFacts.a16_max_t tokens, the tensor cores above
    assert plan.a16_max_t(QuantScheme.parse("fp8_channel"), device_facts(H200)) == 2
    assert plan.a16_max_t(QuantScheme.parse("fp8_channel"), device_facts(H100)) == 3
    assert plan.a16_max_t(QuantScheme.parse("fp8_block"), device_facts(H200)) == 1
    assert plan.a16_max_t(QuantScheme.parse("fp8_block"), device_facts(H100)) == 2
    assert plan.a16_max_t(QuantScheme.parse("int8_channel"), device_facts(H100)) == 1
    qh100, qh200, qother = (_planner(QWEN, "fp8_channel", p) for p in (H100, H200, OTHER))
    assert (qh100.a16_max_t, qh200.a16_max_t, qother.a16_max_t) == (3, 2, 3)
    assert qh100.plan(3).math == "a16" and qh200.plan(3).math == "tc" and qother.plan(3).math == "a16"
    # the a16 decode's 8-bit weights as words at T = 1 (DeviceFacts.w4_channel_fp8 / w4_block)
    assert qh100.plan(1).gemm1["W4"] and not qh200.plan(1).gemm1["W4"] and qother.plan(1).gemm1["W4"]
    assert _planner(QWEN, "int8_channel", H200).plan(1).gemm1["W4"]
    dh100, dh200, dother = (_planner(DS, "fp8_block", p) for p in (H100, H200, OTHER))
    assert not dh100.plan(1).gemm1["W4"] and dh200.plan(1).gemm1["W4"] and not dother.plan(1).gemm1["W4"]
    assert not _planner(QWEN, "fp8_channel", Platform.preset("cpu")).plan(1).gemm1["W4"]   # words: CUDA only
    # the tc GEMM1's K steps of two block-scale groups (tc_gemm1_block_groups): deepseek T = 3
    assert dh100.plan(3).tc and dh200.plan(3).tc and dother.plan(3).tc
    assert dh100.plan(3).gemm1["BLOCK_K"] == dh200.plan(3).gemm1["BLOCK_K"] == 256
    assert dother.plan(3).gemm1["BLOCK_K"] == 128
    # the tc GEMM1's L2 hints before its PDL wait (tc_l2_pre_gemm1)
    if plan.pdl_ok(H100):
        assert qh100.plan(4).gemm1["L2_PRE"] == qh200.plan(4).gemm1["L2_PRE"] == 4
        assert qother.plan(4).gemm1["L2_PRE"] == 0
    # the explain rows follow
    assert "16-bit activations" in plan.describe(qh100.plan(3), qh100)
    assert "tensor cores" in plan.describe(qh200.plan(3), qh200)


def test_plans_are_memoized_and_hashable():
    # the backend keys its workspace specs by plan (gemm1 / gemm2 are read-only mappings)
    pl = _planner(QWEN, "none", H100)
    p = pl.plan(64)
    assert pl.plan(64) is p and p.path == "grouped"
    twin = dataclasses.replace(p)
    assert twin == p and hash(twin) == hash(p) and {p: 1}[twin] == 1
    other = dataclasses.replace(p, gemm2=MappingProxyType(dict(p.gemm2, SPLIT_K=7)))
    assert other != p
    with pytest.raises(TypeError):
        p.gemm1["BLOCK_SIZE_M"] = 1                     # read-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.reduce = "atomic"
