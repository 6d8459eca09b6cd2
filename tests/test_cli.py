"""The ``fusedmoe`` command line, in process (``fusedmoe.cli.main.main([...])``) and once as
``python -m fusedmoe``. Every command's --json output must parse and carry its fields; a
user error prints one line on stderr and returns 2, never a traceback.

Small layers come from tiny Hugging Face config.json files written to tmp_path (the preset
reader takes a path), so ``demo`` runs in well under a second per case.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fusedmoe.oracle as oracle
from fusedmoe.backends.registry import registered
from fusedmoe.cli.main import main
from fusedmoe.config import QuantMethod
from fusedmoe.presets import PRESETS

TINY = {
    # Mixtral layout: softmax top-2 of 8, renormalized; H=256, I=256 (tp 2 -> 128)
    "mixtral": {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 256,
                "intermediate_size": 256, "hidden_act": "silu"},
    # DeepSeek-V3 layout: sigmoid + correction bias, 4 groups keep 2, x2.5, fp8 128x128 checkpoint
    "deepseek": {"model_type": "deepseek_v3", "n_routed_experts": 16, "num_experts_per_tok": 4, "hidden_size": 256,
                 "moe_intermediate_size": 128, "n_group": 4, "topk_group": 2, "hidden_act": "silu",
                 "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
}


@pytest.fixture(autouse=True)
def _fresh_log_dedup(monkeypatch):
    monkeypatch.setattr(oracle, "_logged", set())


@pytest.fixture
def tiny(tmp_path):
    paths = {}
    for name, cfg in TINY.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        paths[name] = str(d)
    return paths


def run_json(capsys, *argv):
    rc = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def run_error(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and out == ""
    return err


# ------------------------------------------------------------------------------ demo
@pytest.mark.parametrize("model,extra,quant", [
    ("mixtral", ["--tp", "2", "--dtype", "float32"], "none"),          # 16-bit, grouped_mm on CPU
    ("mixtral", ["--tp", "2", "--quant", "int4_w4a16:g64"], "int4_w4a16:g64"),   # weight-only, emulation
    ("deepseek", [], "fp8_block"),                                    # native fp8_block + correction bias
], ids=["mixtral-none", "mixtral-int4", "deepseek-fp8_block"])
def test_demo_json(capsys, tiny, model, extra, quant):
    rc, d, _ = run_json(capsys, "demo", "--model", tiny[model], "--tokens", "5", "--repeat", "1",
                        "--device", "cpu", *extra)
    assert rc == 0
    for key in ("model", "config", "quant", "device", "tokens", "selection", "backend", "rel_error_vs_torch_ref",
                "tolerance", "within_tolerance", "median_time_us", "tflops", "wall_s"):
        assert key in d, key
    assert d["quant"] == quant and d["device"] == "cpu" and d["tokens"] == 5
    assert d["within_tolerance"] is True and 0 <= d["rel_error_vs_torch_ref"] <= d["tolerance"]
    assert d["backend"] == d["selection"]["winner"] in registered()
    assert d["median_time_us"] > 0
    assert {c["name"] for c in d["selection"]["candidates"]} == set(registered())


def test_demo_preset(capsys):
    # a real preset, sharded small: Qwen3-30B-A3B over tp 8 (E=128, H=2048, I=96)
    rc, d, _ = run_json(capsys, "demo", "--model", "qwen3-30b-a3b", "--tp", "8", "--tokens", "5", "--repeat", "1",
                        "--device", "cpu")
    assert rc == 0 and d["model"] == "qwen3-30b-a3b" and d["within_tolerance"] is True
    assert "intermediate_size=96" in d["config"]


def test_demo_text(capsys, tiny):
    rc = main(["demo", "--model", tiny["mixtral"], "--tp", "2", "--tokens", "3", "--repeat", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "winner:" in out and "rel. error vs torch_ref" in out and "OK" in out


# ------------------------------------------------------------------------------ explain
def test_explain_deepseek_h100_json(capsys):
    rc, d, _ = run_json(capsys, "explain", "--model", "deepseek-v3", "--quant", "fp8_block", "--platform", "h100")
    assert rc == 0
    assert d["quant"] == "fp8_block" and d["family"] == "hopper" and d["source"] == "auto"
    names = [c["name"] for c in d["candidates"]]
    assert d["winner"] in names and set(names) == set(registered())
    win = next(c for c in d["candidates"] if c["name"] == d["winner"])
    assert win["ok"] and win["reasons"] == []
    for c in d["candidates"]:
        if c["name"] != d["winner"]:
            # a reason for each rejected backend, or it could serve (lower priority)
            assert c["ok"] or (c["reasons"] and all(r["code"] and r["text"] for r in c["reasons"])), c
    assert any(not c["ok"] for c in d["candidates"])          # grouped_mm cannot do fp8_block


def test_explain_text_names_every_candidate(capsys):
    rc = main(["explain", "--model", "deepseek-v3", "--quant", "fp8_block", "--platform", "h100"])
    out = capsys.readouterr().out
    assert rc == 0 and "winner:" in out
    for name in registered():
        line = next(ln for ln in out.splitlines() if ln.split()[:1] in (["WIN"], ["ok"], ["no"])
                    and ln.split()[1] == name)
        assert "chosen" in line or "could serve; lower priority" in line or "[" in line


def test_explain_explicit_backend_and_deterministic(capsys):
    rc, d, _ = run_json(capsys, "explain", "--model", "mixtral-8x7b", "--platform", "cpu", "--backend", "torch_ref",
                        "--deterministic")
    assert rc == 0 and d["winner"] == "torch_ref" and d["source"] == "argument" and d["deterministic"] is True


# ------------------------------------------------------------------------------ backends / models
def test_backends_json(capsys):
    rc, d, _ = run_json(capsys, "backends")
    assert rc == 0
    tables = {t["name"]: t for t in d["backends"]}
    assert set(tables) == set(registered()) >= {"torch_ref", "grouped_mm", "emulation"}
    for t in tables.values():
        for key in ("description", "quant", "activations", "routing", "formats", "devices", "min_sm",
                    "deterministic", "cuda_graph_safe", "native"):
            assert key in t, (t["name"], key)
    assert set(tables["torch_ref"]["quant"]) == {m.value for m in QuantMethod}
    assert tables["grouped_mm"]["quant"] == ["fp8_channel", "none"]      # fp8_channel: CUDA sm90 only
    assert "none" not in tables["emulation"]["quant"]


def test_models_json(capsys):
    rc, d, _ = run_json(capsys, "models")
    assert rc == 0
    rows = {r["name"]: r for r in d["models"]}
    assert set(rows) == set(PRESETS) >= {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b"}
    ds = rows["deepseek-v3"]
    assert (ds["num_experts"], ds["top_k"], ds["hidden_size"], ds["quant"]) == (256, 8, 7168, "fp8_block")
    assert rows["gpt-oss-20b"]["activation"] == "swigluoai" and rows["gpt-oss-20b"]["has_bias"] is True


# ------------------------------------------------------------------------------ check
def test_check_json_cpu_backends(capsys, monkeypatch):
    # restricted to the CPU backends (~4 s): the Triton ones under the interpreter add ~30 s
    # (see the slow test below)
    from fusedmoe.backends import registry
    specs = registered()
    monkeypatch.setattr(registry, "_REGISTRY", {n: specs[n] for n in ("torch_ref", "grouped_mm", "emulation")})
    rc, d, _ = run_json(capsys, "check", "--device", "cpu")
    assert rc == 0 and d["failures"] == 0 and d["device"] == "cpu"
    seen = {(r["backend"], r["quant"], r["format"]) for r in d["results"]}
    for m in QuantMethod:                                     # torch_ref: every scheme, both formats
        assert ("torch_ref", m.value, "standard") in seen and ("torch_ref", m.value, "batched") in seen
    assert ("emulation", "mxfp4", "standard") in seen and ("grouped_mm", "none", "standard") in seen
    assert ("grouped_mm", "none", "batched") not in seen     # grouped_mm is standard-only: not run
    for r in d["results"]:
        assert r["ok"] and r["rel_error"] <= r["tolerance"]


@pytest.mark.slow
def test_check_json_all_backends(capsys):
    rc, d, _ = run_json(capsys, "check", "--device", "cpu")
    assert rc == 0 and d["failures"] == 0


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("argv,needle", [
    (["explain", "--backend", "nope"], "backend='nope' is not a registered backend"),
    (["explain", "--model", "nope-7b"], "model='nope-7b'"),
    (["explain", "--quant", "int3"], "'int3'"),
    (["explain", "--platform", "tpu"], "platform='tpu'"),
    (["demo", "--quant", "fp9"], "'fp9'"),                          # fails before any weight is built
    (["demo", "--model", "qwen3-30b-a3b", "--tp", "7"], "tp=7"),    # tp must divide I
])
def test_user_error_is_one_line_and_status_2(capsys, argv, needle):
    err = run_error(capsys, *argv)
    assert err.endswith("\n") and err.count("\n") == 1, err        # exactly one line
    assert err.startswith(f"fusedmoe {argv[0]}: error: ") and needle in err


@pytest.mark.parametrize("peer,pkg", [("vllm", "vllm"), ("sglang", "sglang")])
def test_bench_peer_not_installed_is_one_line(capsys, monkeypatch, peer, pkg):
    monkeypatch.setitem(sys.modules, pkg, None)          # import raises ImportError: not installed
    err = run_error(capsys, "bench", "--shape", "4,2,16,8", "--tokens", "1", "--device", "cpu",
                    "--peers", f"torch_loop,{peer}", "--no-progress")
    assert err.count("\n") == 1 and f"peers='{peer}'" in err
    assert f"the {pkg} package, which is not installed" in err and f"pip install {pkg}" in err


def test_demo_unknown_backend(capsys, tiny):
    err = run_error(capsys, "demo", "--model", tiny["mixtral"], "--tp", "2", "--backend", "nope", "--device", "cpu")
    assert err.count("\n") == 1 and "backend='nope'" in err


def test_backend_that_cannot_serve_is_status_2(capsys):
    # NoBackendError lists one reason per line; still status 2 and no traceback
    err = run_error(capsys, "explain", "--backend", "grouped_mm", "--quant", "fp8_block", "--platform", "cpu")
    assert err.startswith("fusedmoe explain: error: backend 'grouped_mm'") and "[quant]" in err


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "demo" in capsys.readouterr().out


@pytest.mark.parametrize("cmd", ["demo", "explain", "backends", "models", "check"])
def test_every_command_takes_json(capsys, cmd):
    with pytest.raises(SystemExit) as ei:
        main([cmd, "--help"])
    assert ei.value.code == 0 and "--json" in capsys.readouterr().out


def test_python_m_help_lists_commands():
    p = subprocess.run([sys.executable, "-m", "fusedmoe", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for cmd in ("demo", "explain", "backends", "models", "check", "bench", "tune"):
        assert cmd in p.stdout, cmd


def test_explain_auto_w8a8_decode_per_bucket(monkeypatch):
    # the default w8a8_decode 'auto': deepseek-v3 tp8 fp8_block (E 256: up to 128
    # pairs) runs T=1 with 16-bit activations, T=16 on the tensor-core GEMMs in the PDL chain,
    # T=64 on the grouped path
    from fusedmoe.backends.triton import _variants
    from fusedmoe.config import QuantScheme
    from fusedmoe.platform import Platform
    from fusedmoe.presets import get_preset
    monkeypatch.delenv("FUSEDMOE_PLAN", raising=False)
    cfg = get_preset("deepseek-v3").to_config(tp=8)
    rows = _variants(cfg, QuantScheme.parse("fp8_block"), Platform.resolve("h100"))
    assert "16-bit activations" in rows["T=1"] and "tensor cores" not in rows["T=1"]
    assert "tensor cores" in rows["T=16"] and "launch chain" in rows["T=16"]
    assert rows["T=64"].startswith("gemm1 BM")
    # the CUDA-core decode tiles as a launch picks them: GEMM2 of 8-bit weights in two 128-wide
    # K steps, one N tile a program (decode.gemm2_tiles: TILES only for one-step tiles), 16-bit
    # weights one 256-wide step; the tensor-core row names none
    assert "GEMM1 BN4xBK1024, GEMM2 BN8xBK128" in rows["T=1"] and "N tiles a program" not in rows["T=1"]
    assert "GEMM2 BN" not in rows["T=16"]
    from fusedmoe.kernels import decode as dk
    for ver in ("3.6.0", "3.9.0"):      # (gemm2_slots_first; gemm2_a3: k = 8 slots, never)
        monkeypatch.setattr(dk.triton, "__version__", ver)
        bf16 = _variants(cfg, QuantScheme.parse("none"), Platform.resolve("h100"))["T=1"]
        assert "GEMM2 BN4xBK256" in bf16 and "N tiles a program" not in bf16
        assert "A3" not in bf16 and "A3" not in rows["T=1"]
        assert ("slots first" in bf16) == (ver == "3.9.0")
    mix = _variants(get_preset("mixtral-8x7b").to_config(), QuantScheme.parse("none"), Platform.resolve("h100"))["T=1"]
    assert "A3" in mix and "slots first" in mix            # (3.9 still patched: k = 2 slots)


def test_explain_w8a8_decode_rows_per_platform(monkeypatch):
    # the small-T rows where the W8A8 decode math changes: qwen3 fp8_channel on the H100 keeps
    # 16-bit activations to T=3 (tc at T=4) and reads shared experts once at T=8 (64 pairs = E / 2); the
    # H200 switches to the tensor cores at T=3; deepseek tp8 (I = 256) never shares; 16-bit
    # weights list no extra rows
    from fusedmoe.backends.triton import _variants
    from fusedmoe.config import QuantScheme
    from fusedmoe.platform import Platform
    from fusedmoe.presets import get_preset
    monkeypatch.delenv("FUSEDMOE_PLAN", raising=False)
    qwen = get_preset("qwen3-30b-a3b").to_config()
    h100 = _variants(qwen, QuantScheme.parse("fp8_channel"), Platform.resolve("h100"))
    assert [k for k in h100 if k.startswith("T=")][:6] == ["T=1", "T=2", "T=3", "T=4", "T=8", "T=16"]
    assert "16-bit activations" in h100["T=3"] and "tensor cores" not in h100["T=3"]
    assert "tensor cores" in h100["T=4"] and "16-bit activations" not in h100["T=4"]
    # one token reads the 8-bit weights as words (kernels/decode.py w4_mode); two tokens do not
    assert "int32 words" in h100["T=1"] and "int32 words" not in h100["T=2"]
    assert "tensor cores" in h100["T=8"] and "read once for all its pairs" in h100["T=8"]
    h200 = _variants(qwen, QuantScheme.parse("fp8_channel"), Platform.resolve("h200"))
    assert "16-bit activations" in h200["T=2"] and "tensor cores" in h200["T=3"]
    assert "read once" not in h200["T=4"]                          # 32 pairs < E / 2
    assert "int32 words" not in h200["T=1"]                        # fp8 words: slower on the H200
    h200i = _variants(qwen, QuantScheme.parse("int8_channel"), Platform.resolve("h200"))
    assert "int32 words" in h200i["T=1"] and "int32 words" not in h200i["T=2"]
    ds = _variants(get_preset("deepseek-v3").to_config(tp=8), QuantScheme.parse("fp8_block"),
                   Platform.resolve("h100"))
    assert "16-bit activations" in ds["T=2"] and "tensor cores" in ds["T=3"]
    assert "int32 words" not in ds["T=1"]                          # block scales: element loads
    assert not any("read once" in v for k, v in ds.items() if k.startswith("T="))
    # deepseek tp8's tc GEMM1 at T = 3, 4 on the H100 and the H200 steps two 128-wide scale groups at
    # a time (plan.DeviceFacts.tc_gemm1_block_groups, measured on both); not at T = 8
    assert "K steps read 2 scale groups of 128 each (3 stages" in ds["T=3"] and "scale groups" in ds["T=4"]
    assert "scale groups" not in ds["T=8"] and "scale groups" not in ds["T=2"]
    ds2 = _variants(get_preset("deepseek-v3").to_config(tp=8), QuantScheme.parse("fp8_block"), Platform.resolve("h200"))
    assert "tensor cores" in ds2["T=3"] and "K steps read 2 scale groups of 128" in ds2["T=3"]
    # block scales read as words on the H200 only (faster there, slower on the H100)
    assert "int32 words" in ds2["T=1"] and "int32 words" not in ds2["T=2"]
    # the tc chain's L2 hints (kernels/decode_tc.py L2_PRE): GEMM1's, on the H100 and the H200 (measured
    # there), not where GEMM1 shares experts or the math is a16; FUSEDMOE_PLAN tc_l2_pre overrides
    from fusedmoe.plan import pdl_ok
    if pdl_ok(Platform.resolve("h100")):
        assert "first 4 lines of its weight rows" in ds["T=3"] and "L2" not in ds["T=2"]
        assert "L2" not in h100["T=8"] and "first 4 lines of its weight rows" in h200["T=3"]
        monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"tc_l2_pre": [2, 1]}))
        ds = _variants(get_preset("deepseek-v3").to_config(tp=8), QuantScheme.parse("fp8_block"),
                       Platform.resolve("h200"))
        assert "first 2 lines of its weight rows and GEMM2 for its first 1 slots' rows" in ds["T=3"]
    assert "T=2" not in _variants(qwen, QuantScheme.parse("none"), Platform.resolve("h100"))


@pytest.mark.parametrize("quant,mode,want", [
    ("none", "a16", "GEMM2 a programmatic dependent launch"),
    ("fp8_channel", "a16", "GEMM2 a programmatic dependent launch"),
    ("fp8_tensor", "a16", "GEMM2 a programmatic dependent launch"),
    ("fp8_channel", "a8", "one programmatic dependent launch chain"),
    ("fp8_block", "a8", "one programmatic dependent launch chain"),
    ("fp8_tensor", "a8", None),
    ("fp8_channel", "auto", "GEMM2 a programmatic dependent launch")])     # auto: T=1 is a16
def test_explain_says_how_decode_launches_are_chained(quant, mode, want, monkeypatch):
    # the selection report's decode row names the PDL chaining the backend will use on an
    # H100 (W8A8 with w8a8_decode 'a8': the quantization launches join the chain, none
    # for fp8_tensor: its dynamic scale takes two kernels), none with decode_pdl false or
    # on a CPU platform; a16 (the default) says the activations stay 16-bit
    from fusedmoe.backends.triton import _variants
    from fusedmoe.config import QuantScheme
    from fusedmoe.platform import Platform
    from fusedmoe.presets import get_preset
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"w8a8_decode": mode}))
    cfg = get_preset("qwen3-30b-a3b").to_config()
    row = _variants(cfg, QuantScheme.parse(quant), Platform.resolve("h100"))["T=1"]
    assert ("16-bit activations" in row) == (quant != "none" and mode in ("a16", "auto"))
    row = _variants(cfg, QuantScheme.parse(quant), Platform.resolve("h100"))["T=1"]
    assert row.startswith("decode kernels")
    assert (want in row) if want else ("programmatic" not in row)
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"w8a8_decode": mode, "decode_pdl": False}))
    assert "programmatic" not in _variants(cfg, QuantScheme.parse(quant), Platform.resolve("h100"))["T=1"]
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"w8a8_decode": mode}))
    cpu = Platform("cpu", "cpu", None, 0.0, 2, True, True)
    assert "programmatic" not in _variants(cfg, QuantScheme.parse(quant), cpu)["T=1"]


# ------------------------------------------------------------------------------ issue 45: demo / explain / check
def _no_build(monkeypatch):
    """Make building weights fail loudly: a check that must come first must not reach it."""
    import fusedmoe.cli.main as cli
    monkeypatch.setattr(cli, "random_layer", lambda *a, **k: pytest.fail("the demo built weights before checking"))


@pytest.mark.parametrize("argv,needle", [
    (["--tokens", "-5"], "--tokens=-5 is too small; accepted: an integer >= 1"),    # was a RuntimeError after 19 s
    (["--tokens", "0"], "--tokens=0"),
    (["--repeat", "0"], "--repeat=0 is too small"),          # was "no median for empty data" after 40 s
    (["--tp", "0"], "--tp=0"),
    (["--seed", "-1"], "--seed=-1"),
    (["--quant", "int4_w4a16:g64:zp:zp"], "repeats an option"),
])
def test_demo_arguments_checked_before_any_work(capsys, monkeypatch, argv, needle):
    _no_build(monkeypatch)
    err = run_error(capsys, "demo", "--device", "cpu", *argv)
    assert err.count("\n") == 1 and needle in err and "Fix: " in err, err


def _args(*argv):
    from fusedmoe.cli.main import build_parser
    return build_parser().parse_args(["demo", "--device", "cpu", *argv])


def test_demo_gpt_oss_default_tp_fits_mxfp4(monkeypatch):
    # gpt-oss's I = 2880 at the demo's usual tp 4 is 720, not a multiple of mxfp4's 32: the
    # default becomes tp 2 with a note, instead of failing after 71 s of building
    import torch
    from fusedmoe.cli.main import demo_plan
    monkeypatch.setattr("fusedmoe.cli.main.available_bytes", lambda dev: None)
    preset, cfg, quant, notes, _ = demo_plan(_args("--model", "gpt-oss-20b"), torch.device("cpu"))
    assert quant.name == "mxfp4" and cfg.intermediate_size == 1440
    assert any(n.startswith("--tp 2: at tp 4 the intermediate size 720 is not a multiple of 32") for n in notes)
    _, cfg, _, notes, _ = demo_plan(_args("--model", "olmoe-1b-7b"), torch.device("cpu"))
    assert cfg.intermediate_size == 256 and notes == []                    # tp 4 where it fits


def test_demo_explicit_tp_that_cannot_hold_the_scheme_names_one_that_can(capsys, monkeypatch):
    _no_build(monkeypatch)
    err = run_error(capsys, "demo", "--model", "gpt-oss-20b", "--tp", "4", "--device", "cpu")
    assert err.count("\n") == 1 and "--tp=4" in err and "720, not a multiple of 32 (mxfp4)" in err
    assert "accepted: 1, 2" in err and "Fix: use --tp 2" in err
    err = run_error(capsys, "explain", "--model", "qwen3-30b-a3b", "--quant", "int4_w4a16", "--tp", "8")
    assert "--tp=8" in err and "Fix: use --tp 2" in err


def test_demo_refuses_what_does_not_fit_in_memory(capsys, monkeypatch):
    # deepseek-v3 fp8_block at tp 4 needs ~30 GiB: with 12 GiB available the demo says so and
    # names a --tp that fits, before allocating (it was OOM-killed without a message)
    import torch
    from fusedmoe.cli.main import demo_bytes, demo_plan
    _no_build(monkeypatch)
    monkeypatch.setattr("fusedmoe.cli.main.available_bytes", lambda dev: 12 * 2 ** 30)
    err = run_error(capsys, "demo", "--model", "deepseek-v3", "--quant", "fp8_block", "--tp", "4", "--device", "cpu")
    assert err.count("\n") == 1 and "--tp=4 needs ~" in err and "GiB for deepseek-v3" in err
    assert "12.0 GiB are available" in err and "Fix: use --tp 16" in err, err     # tp 16: ~8 GiB
    # --tp unset: the demo sizes itself down, with a note
    preset, cfg, quant, notes, need = demo_plan(_args("--model", "deepseek-v3"), torch.device("cpu"))
    assert cfg.intermediate_size == 2048 // 16 and need <= 12 * 2 ** 30 < demo_bytes(preset.to_config(tp=8), quant,
                                                                                    "emulation")
    assert any("--tp 16: at tp 4 the demo would allocate" in n for n in notes), notes
    # nothing fits: the error says how much is needed
    monkeypatch.setattr("fusedmoe.cli.main.available_bytes", lambda dev: 2 ** 20)
    err = run_error(capsys, "demo", "--model", "gpt-oss-120b", "--device", "cpu")
    assert "no --tp of this model fits" in err and "GiB free" in err


def test_demo_memory_estimate_counts_the_copies():
    from fusedmoe.cli.main import demo_bytes
    from fusedmoe.config import MoEConfig, QuantScheme
    cfg = MoEConfig(8, 2, 1024, 512, dtype="bfloat16")             # w13 8M, w2 4M elements
    p13, p2 = 8 * 1024 * 1024, 8 * 1024 * 512
    base = 2 ** 29                                                  # the process itself
    assert demo_bytes(cfg, QuantScheme("none"), "torch_ref") == (p13 + p2) * (2 + 4) + p13 * 4 + base
    assert demo_bytes(cfg, QuantScheme("fp8_block"), "triton") == (p13 + p2) * (2 + 1 + 4) + p13 * 4 + base
    assert demo_bytes(cfg, QuantScheme("mxfp4"), "emulation") == int((p13 + p2) * (2 + 0.5 + 4 + 2)) + p13 * 4 + base


def test_available_bytes_reads_meminfo():
    import torch
    from fusedmoe.cli.main import available_bytes
    n = available_bytes(torch.device("cpu"))
    assert n is None or n > 2 ** 20


def test_demo_prints_progress_on_stderr_unless_json(capsys, tiny):
    rc = main(["demo", "--model", tiny["mixtral"], "--tp", "2", "--tokens", "3", "--repeat", "1", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 0
    for step in ("building ", "selecting a backend", "running 3 tokens", "checking against", "timing"):
        assert any(ln.startswith("fusedmoe demo: ") and step in ln for ln in err.splitlines()), (step, err)
    rc, _, err = run_json(capsys, "demo", "--model", tiny["mixtral"], "--tp", "2", "--tokens", "3", "--repeat", "1",
                          "--device", "cpu")
    assert rc == 0 and "fusedmoe demo:" not in err


def test_unmapped_checkpoint_quant_note_is_shown(capsys, tmp_path):
    # a bitsandbytes config.json becomes quant 'none'; demo and explain say so
    d = tmp_path / "bnb"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(TINY["mixtral"], quantization_config={
        "quant_method": "bitsandbytes", "load_in_4bit": True})))
    rc = main(["explain", "--model", str(d), "--platform", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "note: quantization_config 'bitsandbytes' not recognized, quant treated as 'none'" in out
    rc, data, _ = run_json(capsys, "explain", "--model", str(d), "--platform", "cpu")
    assert rc == 0 and "bitsandbytes" in data["notes"][0]
    rc, data, _ = run_json(capsys, "demo", "--model", str(d), "--tp", "2", "--tokens", "2", "--repeat", "1",
                           "--device", "cpu", "--dtype", "float32")
    assert rc == 0 and data["quant"] == "none" and "bitsandbytes" in data["notes"][0]
    rc = main(["demo", "--model", str(d), "--tp", "2", "--tokens", "2", "--repeat", "1", "--device", "cpu",
               "--dtype", "float32"])
    assert rc == 0 and "fusedmoe demo: note: quantization_config 'bitsandbytes'" in capsys.readouterr().err


def test_quant_and_platform_names_are_case_insensitive_alike(capsys):
    rc, d, _ = run_json(capsys, "explain", "--model", "deepseek-v3", "--quant", "FP8_BLOCK", "--platform", "H100")
    assert rc == 0 and d["quant"] == "fp8_block" and d["family"] == "hopper"


def test_check_says_what_it_compared(capsys, monkeypatch):
    # on CPU torch_ref and emulation run the reference's own math (error exactly 0): the
    # output says so, and names the independent implementations it ran
    from fusedmoe.backends import registry
    specs = registered()
    monkeypatch.setattr(registry, "_REGISTRY", {n: specs[n] for n in ("torch_ref", "grouped_mm", "emulation")})
    rc, d, _ = run_json(capsys, "check", "--device", "cpu")
    assert rc == 0 and "reference_moe (plain torch)" in d["compared"]
    assert "torch_ref runs the reference itself" in d["compared"] and d["independent_backends"] == ["grouped_mm"]
    assert all(r["independent"] == (r["backend"] == "grouped_mm") for r in d["results"])
    rc = main(["check", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.startswith("compared: ") and "(same math as the reference)" in out
    assert "fusedmoe check: fp8_block: emulation (standard)" in err                # progress lines


@pytest.mark.slow
def test_check_on_cpu_runs_the_triton_kernels_as_an_independent_path(capsys):
    rc, d, _ = run_json(capsys, "check", "--device", "cpu")
    assert rc == 0 and d["failures"] == 0
    assert {"triton", "triton_batched"} <= set(d["independent_backends"])
    assert "Triton kernels ran under TRITON_INTERPRET=1" in d["compared"]
    tri = [r for r in d["results"] if r["backend"] == "triton"]
    assert {r["quant"] for r in tri} >= {"none", "fp8_block"} and all(r["rel_error"] > 0 for r in tri)
