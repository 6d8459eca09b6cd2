"""The benchmark harness on CPU: roofline arithmetic on hand-computed numbers, inputs, the
peers' correctness, a run with fake implementations and fake timings, the JSON schema, the
table and summary, the plot fallback, and the CLI on a tiny shape. No timing asserts."""
import argparse
import io
import json
import math
import sys

import pytest
import torch

from fusedmoe.bench import harness, peers, plot
from fusedmoe.bench.harness import Ceilings, Impl, Measurement, Timing
from fusedmoe.config import MoEConfig
from fusedmoe.reference.moe import reference_moe
from fusedmoe.tolerances import rel_error

CEIL = Ceilings("fake", copy_gbps=1000.0, matmul_tflops=100.0, fp8_tflops=None, l2_bytes=1 << 20)


# ------------------------------------------------------------------------------------------- arithmetic
def test_flops_hand_computed():
    # Mixtral, T=1: GEMM1 2*1*2*4096*28672 + GEMM2 2*1*2*14336*4096 = 6*2*4096*14336
    assert harness.flops(1, 2, 4096, 14336) == 704_643_072
    assert harness.flops(3, 1, 10, 5, gated=False) == 2 * 3 * 10 * 5 * 2  # 4*T*k*H*I
    assert harness.flops(16, 8, 7168, 256) == 6 * 16 * 8 * 7168 * 256


@pytest.mark.parametrize("scheme,out,K,want", [
    ("none", 4, 8, 64),                        # 32 bf16
    ("fp8_tensor", 4, 8, 32 + 4),              # + one fp32 scale
    ("fp8_channel", 4, 8, 32 + 16),            # + 4 fp32 scales
    ("fp8_block", 256, 384, 98_304 + 4 * 2 * 3),   # 2 x 3 blocks of 128x128
    ("int4_w4a16", 2, 256, 256 + 4 * 2 * 2),       # packed + fp32 scale per 128 group
    ("int4_w4a16:g128:zp", 2, 256, 256 + 16 + 4),  # + one uint8 zero per group
    ("int8_w8a16:g64", 2, 128, 256 + 4 * 4),
    ("nvfp4", 2, 32, 32 + 4 + 4),              # e2m1 + e4m3 per 16 + fp32 global
    ("mxfp4", 2, 32, 32 + 2),                  # e2m1 + e8m0 per 32
])
def test_weight_bytes_hand_computed(scheme, out, K, want):
    assert harness.weight_bytes(out, K, scheme) == want


def test_float32_weights_count_four_bytes():
    assert harness.weight_bytes(4, 8, "none", "float32") == 128


@pytest.mark.parametrize("scheme", ["none", "fp8_tensor", "fp8_block", "int8_channel", "int8_w8a16:g64:zp",
                                    "int4_w4a16:g32:zp", "nvfp4", "mxfp4"])
def test_expert_bytes_match_real_quantized_tensors(scheme):
    c = MoEConfig(4, 2, 256, 128)
    w = harness.make_weights(c, scheme, "cpu")
    assert harness.total_weight_bytes(w) == 4 * harness.expert_bytes(256, 128, scheme)


def test_moe_bytes_and_roofline():
    # 3 experts of 100 B + x and out of 2 x 4 bf16 each
    assert harness.moe_bytes(2, 4, 3, 100) == 300 + 16 + 16
    # 1e12 FLOP at 100 TFLOP/s = 10 ms; 1e9 B at 1000 GB/s = 1 ms -> compute bound
    assert harness.roofline_us(1e12, 1e9, 100.0, 1000.0) == pytest.approx(10_000.0)
    assert harness.roofline_us(1e9, 1e10, 100.0, 1000.0) == pytest.approx(10_000.0)  # memory bound
    assert harness.pct_of_roofline(200.0, 100.0) == pytest.approx(50.0)
    assert harness.pct_of_roofline(None, 100.0) is None


def test_peak_for_scheme():
    assert harness.peak_for_scheme("none", CEIL) == (100.0, "16-bit matmul")
    assert harness.peak_for_scheme("fp8_block", CEIL)[0] == 200.0   # 2x bf16 when fp8 not measured
    assert harness.peak_for_scheme("int4_w4a16", CEIL)[0] == 100.0
    c8 = Ceilings("fake", 1.0, 100.0, 150.0, 1)
    assert harness.peak_for_scheme("fp8_channel", c8)[0] == 150.0


# ------------------------------------------------------------------------------------------- inputs
def test_routing_shapes_and_determinism():
    w, ids = harness.make_routing(33, 16, 4, generator=torch.Generator().manual_seed(3), device="cpu")
    w2, ids2 = harness.make_routing(33, 16, 4, generator=torch.Generator().manual_seed(3), device="cpu")
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == ids.shape == (33, 4)
    assert torch.equal(ids, ids2) and torch.allclose(w.sum(-1), torch.ones(33))
    assert all(len(set(r.tolist())) == 4 for r in ids)  # distinct experts per token
    assert ids.min() >= 0 and ids.max() < 16


def test_dirichlet_skew_concentrates_traffic():
    g = torch.Generator().manual_seed(0)
    _, u = harness.make_routing(4096, 64, 2, generator=g, device="cpu")
    _, s = harness.make_routing(4096, 64, 2, generator=g, device="cpu", skew=0.05)
    share = lambda ids: torch.bincount(ids.flatten().long(), minlength=64).max().item() / ids.numel()  # noqa: E731
    assert share(s) > 2 * share(u)
    _, s2 = harness.make_routing(64, 64, 2, generator=torch.Generator().manual_seed(5), device="cpu", skew=0.3)
    _, s3 = harness.make_routing(64, 64, 2, generator=torch.Generator().manual_seed(5), device="cpu", skew=0.3)
    assert torch.equal(s2, s3)


def test_input_sets_rotate_past_twice_l2():
    c = MoEConfig(8, 2, 64, 32, dtype="float32")
    per_set = 4 * 64 * 4 * 2 + 4 * 2 * 16                       # x + out + routing at T=4
    sets = harness.make_input_sets(c, 4, "cpu", l2_bytes=100 * per_set, min_sets=2, max_sets=1000)
    assert len(sets.sets) == 201 and sets.cycle_bytes > 2 * 100 * per_set and not sets.note
    # weights already larger than 2x L2: only the minimum number of sets
    big = harness.make_input_sets(c, 4, "cpu", l2_bytes=1000, weight_bytes=10_000, min_sets=3)
    assert len(big.sets) == 3 and not big.note
    capped = harness.make_input_sets(c, 4, "cpu", l2_bytes=1 << 30, max_sets=4)
    assert len(capped.sets) == 4 and "L2" in capped.note
    s = capped.sets[0]
    assert s.topk_ids64.dtype == torch.int64 and s.args(True)[2] is s.topk_ids64
    assert s.experts_hit == torch.unique(s.topk_ids).numel()


def test_time_impl_on_cpu_reports_eager_only():
    c = MoEConfig(4, 2, 16, 8, dtype="float32")
    sets = harness.make_input_sets(c, 3, "cpu", min_sets=2, max_sets=2)
    calls = []
    t = harness.time_impl(lambda x, w, i: calls.append(x.shape) or x, sets, reps=4)
    assert t.us_graph is None and t.us_eager is not None and t.us_eager >= 0 and "CUDA" in t.graph_note
    assert len(calls) >= 4 and t.best_us == t.us_eager


def test_timing_best_us():
    assert Timing(5.0, 7.0).best_us == 5.0 and Timing(None, 7.0).best_us == 7.0 and Timing(None, None).best_us is None


# ------------------------------------------------------------------------------------------- peers
@pytest.mark.parametrize("config", [
    MoEConfig(6, 2, 64, 32, dtype="float32"),                                     # silu
    MoEConfig(5, 3, 48, 40, activation="gelu", dtype="float32"),                  # E not a power of two
    MoEConfig(4, 2, 32, 16, activation="swigluoai", has_bias=True, dtype="float32"),  # interleaved + bias
    MoEConfig(4, 1, 32, 16, activation="relu2_no_mul", dtype="float32"),          # not gated
])
@pytest.mark.parametrize("name", ["torch_loop", "torch_grouped_mm"])
def test_torch_peers_match_reference(config, name):
    if name == "torch_grouped_mm" and peers.grouped_mm_fn() is None:
        pytest.skip("this torch has no grouped_mm")
    w = harness.make_weights(config, "none", "cpu", seed=1)
    impl = next(p for p in peers.build_peers(config, [name]))
    fn = impl.build(config, w)
    for T in (1, 7, 40):   # 7 tokens x k over E experts: some experts get none
        s = harness.make_input_sets(config, T, "cpu", seed=T, min_sets=1, max_sets=1).sets[0]
        out = fn(*s.args(impl.ids64))
        ref = reference_moe(s.x, w, s.topk_weights, s.topk_ids, config)
        assert rel_error(out, ref) < 1e-5


def test_peer_registry_reports_reasons():
    c = MoEConfig(4, 2, 32, 16, activation="swigluoai", has_bias=True)
    by = {p.name: p for p in peers.build_peers(c, list(peers.PEER_NAMES) + ["nope"])}
    assert by["nope"].unavailable and "known" in by["nope"].unavailable
    assert by["torch_loop"].graph_safe is False and by["torch_grouped_mm"].graph_safe is True
    assert by["hf_eager"].ids64
    with pytest.raises(peers.PeerUnavailable) as e:
        by["hf_grouped_mm"].build(c, harness.make_weights(c, "none", "cpu"))
    assert "transformers" in str(e.value)


# ------------------------------------------------------------------------------------------- a run with fakes
class FakeFn:
    """An implementation that computes with the reference (times ``scale``) and carries its fake time."""

    def __init__(self, config, w, us, scale=1.0, crash=False):
        self.config, self.w, self.fake_us, self.scale, self.crash = config, w, us, scale, crash

    def __call__(self, x, tw, ids):
        if self.crash:
            raise RuntimeError("kernel exploded")
        return reference_moe(x, self.w, tw, ids, self.config) * self.scale


def fake_impls(config, scheme, platform, weights16):
    """A correct fast fusedmoe backend (the auto choice), a slow one, a wrong one, a crashing one,
    an unsupported one, and two peers, with fixed fake times in µs."""
    def mk(us, **kw):
        return lambda cfg, w: FakeFn(cfg, w, us, **kw)
    return [Impl("fast", "fusedmoe", build=mk(100.0)), Impl("slowpoke", "fusedmoe", build=mk(400.0)),
            Impl("buggy", "fusedmoe", build=mk(1.0, scale=1.5)), Impl("crashy", "fusedmoe", build=mk(1.0, crash=True)),
            Impl("absent", "fusedmoe", unavailable="[quant] no"),
            Impl("peer_a", "peer", build=mk(200.0)), Impl("peer_b", "peer", build=mk(300.0))], "fast"


@pytest.fixture
def fake_run(monkeypatch):
    """run_bench on a tiny CPU shape with fake implementations and fake timings."""
    monkeypatch.setattr(harness, "time_impl", lambda fn, sets, **kw: Timing(None, fn.fake_us, "graphs need CUDA"))

    def run(**spec_kw):
        c = MoEConfig(6, 2, 32, 16, dtype="float32")
        spec = harness.BenchSpec(shapes=[("tiny", c, 1)], tokens=[1, 8], ceilings=CEIL, platform="cpu",
                                 device="cpu", **spec_kw)
        return harness.run_bench(spec, progress=False, impls_fn=fake_impls)
    return run


def test_run_bench_statuses_and_arithmetic(fake_run):
    rep = fake_run()
    by = {(r.impl, r.T): r for r in rep.results}
    assert by[("buggy", 1)].status == "wrong" and by[("buggy", 1)].rel_err > 0.1
    assert by[("crashy", 8)].status == "failed" and "exploded" in by[("crashy", 8)].reason
    assert by[("absent", 1)].status == "unsupported" and by[("absent", 1)].reason == "[quant] no"
    r = by[("fast", 8)]
    assert r.status == "ok" and r.auto_selected and r.us_eager == 100.0 and r.us_graph is None
    fl = harness.flops(8, 2, 32, 16)
    assert r.flops == fl and r.tflops == pytest.approx(fl / 100e-6 / 1e12)
    assert r.gbps == pytest.approx(r.bytes / 100e-6 / 1e9)
    assert r.bytes == harness.moe_bytes(8, 32, r.experts_hit, harness.expert_bytes(32, 16, "none", "float32"),
                                        "float32")
    roof = harness.roofline_us(fl, r.bytes, CEIL.matmul_tflops, CEIL.copy_gbps)
    assert r.roofline_us == pytest.approx(roof) and r.pct_roofline == pytest.approx(100 * roof / 100.0)
    assert r.speedup_vs_best_peer == pytest.approx(2.0)                 # peer_a 200 / fast 100
    assert by[("slowpoke", 1)].speedup_vs_best_peer == pytest.approx(0.5)
    assert by[("peer_b", 1)].speedup_vs_best_peer == pytest.approx(200 / 300)
    assert r.rel_err is not None and r.rel_err < 1e-5


def test_summary(fake_run):
    s = fake_run().summary
    assert s["per_scheme"]["none"]["geomean_speedup"] == pytest.approx(2.0)
    assert s["per_scheme"]["none"]["wins"] == 2 and s["per_scheme"]["none"]["points"] == 2
    p = s["points"][0]
    assert p["best_fusedmoe"] == "fast" and p["best_peer"] == "peer_a" and p["fusedmoe_ge_peer"] is True
    assert s["wrong_fusedmoe"] == 2
    probs = {(p["impl"], p["status"]): p for p in s["problems"]}
    assert probs[("buggy", "wrong")]["T"] == [1, 8] and ("crashy", "failed") in probs


def test_json_schema(fake_run, tmp_path):
    rep = fake_run()
    path = tmp_path / "b.json"
    rep.to_json(str(path))
    d = json.loads(path.read_text())
    assert d["schema"] == harness.SCHEMA
    assert set(d) == {"schema", "meta", "ceilings", "shapes", "results", "summary"}
    assert d["ceilings"]["copy_gbps"] == 1000.0 and d["shapes"][0]["name"] == "tiny"
    assert eval(d["shapes"][0]["config"], vars(__import__("fusedmoe.config", fromlist=["*"]))) == \
        MoEConfig(6, 2, 32, 16, dtype="float32")
    fields = {f for f in Measurement.__dataclass_fields__}
    assert all(set(r) == fields for r in d["results"])
    assert len(d["results"]) == 7 * 2
    assert {"tokens", "torch", "routing", "peers_note"} <= set(d["meta"])


def test_table_and_summary_text(fake_run):
    rep = fake_run()
    t = harness.format_table(rep)
    assert "== tiny  scheme=none ==" in t and "us graph" in t and "%roof" in t
    assert "fast*" in t and "2.00x" in t and "WRONG" in t and "FAILED" in t
    assert "not run: absent: [quant] no" in t
    s = harness.format_summary(rep)
    assert "geomean 2.00x" in s and "2/2 points" in s and "WRONG: buggy" in s


def test_quantized_rows_compare_with_16bit_peers(fake_run):
    rep = fake_run(schemes=["none", "fp8_channel"])
    assert {r.scheme for r in rep.results} == {"none", "fp8_channel"}
    q = [r for r in rep.results if r.scheme == "fp8_channel" and r.impl == "fast" and r.status == "ok"]
    assert q and all(r.speedup_vs_best_peer == pytest.approx(2.0) for r in q)
    assert "fp8_channel (vs 16-bit peers)" in harness.format_summary(rep)


# ------------------------------------------------------------------------------------------- plot
def test_plot_without_matplotlib(fake_run, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import raises ImportError
    msgs = []
    assert plot.plot_report(fake_run(), str(tmp_path / "p.png"), warn=msgs.append) is None
    assert msgs and "matplotlib" in msgs[0] and not (tmp_path / "p.png").exists()


def test_plot_with_matplotlib(fake_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = plot.plot_report(fake_run(), str(tmp_path / "p.png"))
    assert out and (tmp_path / "p.png").stat().st_size > 0


def test_plot_series_labels(fake_run):
    rep = fake_run(schemes=["none", "fp8_channel"])
    labels = [lab for (_, lab) in plot._series(rep, "tiny", "pct_roofline")]
    assert "fusedmoe:fast [fp8_channel]" in labels and "peer_a" in labels


# ------------------------------------------------------------------------------------------- progress
def test_progress_fallback_writes_lines(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    buf = io.StringIO()
    p = harness.Progress(2, "bench", stream=buf)
    p.update(1, "a")
    p.update(1, "b")
    p.close()
    assert "bench: 2/2" in buf.getvalue()
    quiet = io.StringIO()
    q = harness.Progress(2, "x", enabled=False, stream=quiet)
    q.update(2)
    q.close()
    assert quiet.getvalue() == ""


# ------------------------------------------------------------------------------------------- CLI
def _args(argv):
    from fusedmoe.cli import bench as cli
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    return cli, ap.parse_args(argv)


def test_cli_parses_shapes_and_schemes():
    cli, a = _args(["--shape", "8,2,64,32", "--shape", "4,1,32,16,gelu", "--tp", "2", "--quant", "none,fp8_block"])
    shapes = cli.parse_shapes(a)
    assert [s[0] for s in shapes] == ["E8k2H64I16", "E4k1H32I8-gelu"]
    assert shapes[0][1].intermediate_size == 16
    assert cli._schemes(a, shapes) == ["none", "fp8_block"]
    cli, a = _args(["--model", "deepseek-v3", "--tp", "8", "--quant", "native"])
    shapes = cli.parse_shapes(a)
    assert shapes[0][0] == "deepseek-v3/tp8" and shapes[0][1].intermediate_size == 256
    assert cli._schemes(a, shapes) == ["fp8_block"]


def test_cli_rejects_bad_input():
    from fusedmoe.errors import ConfigError
    cli, a = _args([])
    with pytest.raises(ConfigError):
        cli.parse_shapes(a)
    cli, a = _args(["--shape", "8,2,x,32"])
    with pytest.raises(ConfigError):
        cli.parse_shapes(a)


def test_cli_runs_on_cpu(tmp_path, capsys):
    cli, a = _args(["--shape", "6,2,32,16", "--tokens", "1,5", "--dtype", "float32", "--device", "cpu",
                    "--backend", "torch_ref,grouped_mm,no_such_backend", "--peers", "torch_loop,torch_grouped_mm",
                    "--repeat", "2", "--json", str(tmp_path / "o.json"), "--plot", str(tmp_path / "o.png"),
                    "--no-progress"])
    rc = cli.main(a)
    out = capsys.readouterr()
    assert rc == 0
    d = json.loads((tmp_path / "o.json").read_text())
    got = {(r["impl"], r["status"]) for r in d["results"]}
    assert ("torch_ref", "ok") in got and ("torch_loop", "ok") in got and ("torch_grouped_mm", "ok") in got
    assert ("no_such_backend", "unsupported") in got
    assert all(r["us_graph"] is None for r in d["results"])         # no graphs on CPU
    assert "summary" in out.out and "E6k2H32I16" in out.out
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "o.png").exists()
    except ImportError:
        assert "matplotlib is not installed" in out.err


def test_cli_json_to_stdout(capsys):
    cli, a = _args(["--shape", "4,2,16,8", "--tokens", "2", "--dtype", "float32", "--device", "cpu",
                    "--backend", "torch_ref", "--peers", "none", "--repeat", "1", "--json", "--no-progress"])
    assert cli.main(a) == 0
    out = capsys.readouterr()
    d = json.loads(out.out)
    assert d["schema"] == harness.SCHEMA and "summary" in out.err


def test_run_bench_report_is_finite_json(fake_run):
    text = fake_run().to_json()
    d = json.loads(text)
    for r in d["results"]:
        for k in ("tflops", "gbps", "pct_roofline"):
            assert r[k] is None or math.isfinite(r[k])


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_bench_times_graphs_and_checks_everything():
    """On CUDA: graph replay is timed for capturable implementations, the declared non-capturable
    ones fall back to eager with a note, and every implementation passes its check."""
    c = MoEConfig(16, 4, 256, 128)
    spec = harness.BenchSpec(shapes=[("small", c, 1)], tokens=[1, 64], backends="all",
                             peers=["torch_loop", "torch_grouped_mm"], repeat=5, device="cuda")
    rep = harness.run_bench(spec, progress=False)
    assert rep.ceilings.copy_gbps > 100 and rep.ceilings.matmul_tflops > 10
    ok = [r for r in rep.results if r.status == "ok"]
    assert not [r for r in rep.results if r.status == "wrong"]
    assert any(r.us_graph is not None for r in ok)
    loop = [r for r in ok if r.impl == "torch_loop"]
    assert loop and all(r.us_graph is None and "not capturable" in r.graph_note for r in loop)
    assert rep.summary["per_scheme"]["none"]["points"] == 2


def test_check_case_matches_an_implementations_activation_math():
    # an implementation that says a call keeps W8A8 activations 16-bit (fusedmoe's triton
    # decode path) is checked against the reference without activation quantization at the
    # 16-bit bound; one that quantizes, against the W8A8 reference at the scheme's bound
    from fusedmoe.tolerances import tolerance
    config = MoEConfig(6, 2, 256, 128, dtype="float32")
    w = harness.make_weights(config, "fp8_channel", "cpu", seed=3)
    case = harness.make_check_case(config, w, 5, "cpu")
    s = case.inputs
    ref16 = reference_moe(s.x, w, s.topk_weights, s.topk_ids, config, quantize_activations=False)

    class Impl16:
        def __call__(self, x, tw, ids):
            return reference_moe(x, w, tw, ids, config, quantize_activations=False)

        def quantizes_activations(self, T):
            return False

    r = harness.check_against(Impl16(), case)
    assert r.ok and r.rel_err <= 1e-6 and r.tol == tolerance("float32", "none")
    ref, tol = case.for_impl(Impl16())
    assert torch.equal(ref, ref16)
    # the W8A8 reference is >= 1e-3 away: the 16-bit impl fails the check made for a W8A8 one
    plain = lambda x, tw, ids: reference_moe(x, w, tw, ids, config, quantize_activations=False)  # noqa: E731
    r = harness.check_against(plain, case)
    assert r.tol == tolerance("float32", "fp8_channel") and r.rel_err > 1e-3


def test_warm_up_runs_for_its_wall_time(monkeypatch):
    # graph timings start after WARM_MS of replays (bench/harness.py _warm_up): the calls go in
    # doubling batches between synchronizations until that much wall time has passed
    import time
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(time.perf_counter()))
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.001)
    t0 = time.perf_counter()
    n = harness._warm_up(fn, ms=20)
    elapsed = (time.perf_counter() - t0) * 1e3
    assert n == len(calls) and elapsed >= 20
    assert 2 <= n < 200 and len(syncs) >= 3            # batches 1, 2, 4, ... with a sync after each
    assert harness._warm_up(fn, ms=0) == 0
    assert harness.WARM_MS >= 25                        # the window measured was ~22 ms of replays


# ------------------------------------------------------------------------------------------- vLLM / SGLang
# Fake engines in plain torch with the engines' own argument layouts: w1 [E, 2I, H] gate rows first,
# fp8 scales [E] (per tensor), [E, N, 1] (per channel) or [E, N/bn, K/bk] (block_shape), activations
# quantized as the flags say. A wiring that passed up rows first, or scales in another layout, fails.
def _engine_math(hidden_states, w1, w2, topk_weights, topk_ids, activation="silu", use_fp8_w8a8=False,
                 per_channel_quant=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None,
                 block_shape=None, calls=None):
    if calls is not None:
        calls.append(dict(activation=activation, use_fp8_w8a8=use_fp8_w8a8, per_channel=per_channel_quant,
                          block_shape=block_shape, a1_scale=a1_scale, a2_scale=a2_scale))

    def deq(w, s):
        if not use_fp8_w8a8:
            return w.float()
        E, N, K = w.shape
        if block_shape is not None:
            bn, bk = block_shape
            assert tuple(s.shape) == (E, -(-N // bn), -(-K // bk))
            s = s.repeat_interleave(bn, 1)[:, :N].repeat_interleave(bk, 2)[:, :, :K]
        elif per_channel_quant:
            assert tuple(s.shape) == (E, N, 1)
        else:
            assert tuple(s.shape) == (E,)
            s = s[:, None, None]
        return w.float() * s
    def q8(x, static):        # the GEMM input's fp8 round trip: per tensor, per token, or 1 x bk groups
        if not use_fp8_w8a8:
            return x
        g = x.reshape(*x.shape[:-1], -1, block_shape[1]) if block_shape else x
        amax = g.abs().amax(-1, keepdim=True) if block_shape or per_channel_quant else g.abs().amax()
        sc = static if static is not None else (amax / 448.0).clamp_min(1e-12)
        return ((g / sc).clamp(-448, 448).to(torch.float8_e4m3fn).float() * sc).reshape(x.shape)
    W1, W2 = deq(w1, w1_scale), deq(w2, w2_scale)
    ids = topk_ids.long()
    h = torch.einsum("tknh,th->tkn", W1[ids], q8(hidden_states.float(), a1_scale))   # [T, k, 2I]
    g, u = h.chunk(2, dim=-1)                                                        # gate first
    a = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[activation](g) * u
    y = torch.einsum("tkhi,tki->tkh", W2[ids], q8(a, a2_scale))                      # [T, k, H]
    return (y * topk_weights[..., None]).sum(1).to(hidden_states.dtype)


def _install(monkeypatch, modules: dict):
    import types
    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            if parts[0] not in sys.modules or sys.modules.get(".".join(parts[:i])) is None:
                monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        mod = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(mod, k, v)
        monkeypatch.setitem(sys.modules, name, mod)


def fake_vllm(monkeypatch, api: str, calls: list):
    """vLLM >= 0.11 ('new': quant_config) or before ('flat': use_fp8_w8a8 and scales as arguments)."""
    if api == "new":
        def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, activation="silu",
                          apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None,
                          quant_config=None, allow_deep_gemm=False):
            assert not inplace
            return _engine_math(hidden_states, w1, w2, topk_weights, topk_ids, activation, calls=calls,
                                **(quant_config or {}))

        def fp8_w8a8_moe_quant_config(w1_scale, w2_scale, a1_scale=None, a2_scale=None, w1_bias=None, w2_bias=None,
                                      per_act_token_quant=False, per_out_ch_quant=False, block_shape=None):
            assert per_act_token_quant == per_out_ch_quant
            return dict(use_fp8_w8a8=True, w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale,
                        a2_scale=a2_scale, per_channel_quant=per_out_ch_quant, block_shape=block_shape)
        _install(monkeypatch, {"vllm.model_executor.layers.fused_moe": {"fused_experts": fused_experts},
                               "vllm.model_executor.layers.fused_moe.config":
                                   {"fp8_w8a8_moe_quant_config": fp8_w8a8_moe_quant_config}})
    else:
        def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, activation="silu",
                          apply_router_weight_on_input=False, use_fp8_w8a8=False, use_int8_w8a8=False,
                          use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                          global_num_experts=-1, expert_map=None, w1_scale=None, w2_scale=None, w1_zp=None,
                          w2_zp=None, a1_scale=None, a2_scale=None, block_shape=None):
            assert not inplace
            return _engine_math(hidden_states, w1, w2, topk_weights, topk_ids, activation, use_fp8_w8a8,
                                per_channel_quant, w1_scale, w2_scale, a1_scale, a2_scale, block_shape, calls)
        _install(monkeypatch, {"vllm.model_executor.layers.fused_moe": {"fused_experts": fused_experts}})


def fake_sglang(monkeypatch, api: str, calls: list):
    """SGLang >= 0.5 ('new': topk_output + moe_runner_config) or before ('flat', vLLM's arguments)."""
    from dataclasses import dataclass
    from typing import NamedTuple, Optional

    class StandardTopKOutput(NamedTuple):
        topk_weights: torch.Tensor
        topk_ids: torch.Tensor
        router_logits: Optional[torch.Tensor]

    @dataclass
    class MoeRunnerConfig:
        num_experts: Optional[int] = None
        num_local_experts: Optional[int] = None
        activation: str = "silu"
        is_gated: bool = True
        inplace: bool = True
        no_combine: bool = False

    def fused_experts(hidden_states, w1, w2, topk_output, moe_runner_config, b1=None, b2=None, use_fp8_w8a8=False,
                      use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                      w1_scale=None, w2_scale=None, w1_zp=None, w2_zp=None, a1_scale=None, a2_scale=None,
                      block_shape=None):
        assert not moe_runner_config.inplace and moe_runner_config.num_experts == moe_runner_config.num_local_experts
        tw, ids, _ = topk_output
        return _engine_math(hidden_states, w1, w2, tw, ids, moe_runner_config.activation, use_fp8_w8a8,
                            per_channel_quant, w1_scale, w2_scale, a1_scale, a2_scale, block_shape, calls)

    if api == "new":
        _install(monkeypatch, {"sglang.srt.layers.moe.fused_moe_triton": {"fused_experts": fused_experts},
                               "sglang.srt.layers.moe.topk": {"StandardTopKOutput": StandardTopKOutput},
                               "sglang.srt.layers.moe.moe_runner": {"MoeRunnerConfig": MoeRunnerConfig}})
    else:
        fake_vllm(monkeypatch, "flat", calls)
        flat = sys.modules["vllm.model_executor.layers.fused_moe"].fused_experts
        _install(monkeypatch, {"sglang.srt.layers.moe.fused_moe_triton": {"fused_experts": flat}})


ENGINES = [("vllm", "new"), ("vllm", "flat"), ("sglang", "new"), ("sglang", "flat")]


@pytest.fixture
def engine(monkeypatch):
    """Install a fake engine; the fakes run on CPU, so the peers may too."""
    monkeypatch.setattr(peers, "ENGINE_DEVICES", ("cpu", "cuda"))

    def install(name, api):
        calls = []
        (fake_vllm if name == "vllm" else fake_sglang)(monkeypatch, api, calls)
        return calls
    return install


@pytest.mark.parametrize("name,api", ENGINES)
@pytest.mark.parametrize("scheme,act", [("none", "silu"), ("none", "gelu"), ("fp8_tensor", "silu"),
                                        ("fp8_channel", "silu"), ("fp8_block", "gelu")])
def test_engine_peers_get_gate_first_weights_and_their_scale_layouts(engine, name, api, scheme, act):
    calls = engine(name, api)
    config = MoEConfig(4, 2, 256, 128, activation=act, dtype="float32")
    w = harness.make_weights(config, scheme, "cpu", seed=2)
    impl = peers.build_peers(config, [name])[0]
    assert scheme in impl.schemes and impl.graph_safe and not impl.ids64
    fn = impl.build(config, w)
    s = harness.make_input_sets(config, 5, "cpu", seed=4, min_sets=1, max_sets=1).sets[0]
    out = fn(*s.args())
    ref = reference_moe(s.x, w, s.topk_weights, s.topk_ids, config)
    assert rel_error(out, ref) < 1e-5
    c = calls[-1]
    assert c["activation"] == act and c["use_fp8_w8a8"] == (scheme != "none")
    assert c["per_channel"] == (scheme == "fp8_channel") and c["block_shape"] == ([128, 128] if scheme == "fp8_block" else None)
    # the same call with the up rows first is far off: the order reaches the engine as given
    up_first = w.replace(w13=torch.cat(w.w13.chunk(2, dim=1)[::-1], dim=1))
    assert rel_error(impl.build(config, up_first)(*s.args()), ref) > 0.1


def test_engine_peer_passes_static_input_scales(engine):
    calls = engine("vllm", "new")
    config = MoEConfig(4, 2, 64, 32, dtype="float32")
    w = harness.make_weights(config, "fp8_tensor", "cpu", seed=2)
    a13, a2 = torch.tensor([0.05]), torch.tensor([0.02])
    peers.build_peers(config, ["vllm"])[0].build(config, w.replace(a13_scale=a13, a2_scale=a2))(
        *harness.make_input_sets(config, 3, "cpu", min_sets=1, max_sets=1).sets[0].args())
    assert calls[-1]["a1_scale"] is a13 and calls[-1]["a2_scale"] is a2


def test_engine_peers_refuse_what_they_are_not_wired_for(engine, monkeypatch):
    engine("vllm", "new")
    for config, scheme, why in [(MoEConfig(4, 2, 64, 32, activation="swigluoai", dtype="float32"), "none", "swigluoai"),
                                (MoEConfig(4, 2, 64, 32, dtype="float32"), "int4_w4a16:g32", "int4_w4a16")]:
        with pytest.raises(peers.PeerUnavailable, match=why):
            peers.build_peers(config, ["vllm"])[0].build(config, harness.make_weights(config, scheme, "cpu"))
    monkeypatch.setattr(peers, "ENGINE_DEVICES", ("cuda",))
    c = MoEConfig(4, 2, 64, 32, dtype="float32")
    with pytest.raises(peers.PeerUnavailable, match="CUDA"):
        peers.build_peers(c, ["vllm"])[0].build(c, harness.make_weights(c, "none", "cpu"))


def test_engine_peer_runs_at_its_fp8_schemes_in_a_bench(engine, monkeypatch):
    # vllm runs with the 16-bit and the fp8_block weights; torch_loop with the 16-bit ones only; the
    # fp8_block rows compare with both, the 16-bit rows with the 16-bit peers only
    engine("vllm", "new")
    monkeypatch.setattr(harness, "time_impl", lambda fn, sets, **kw: Timing(None, 100.0, "graphs need CUDA"))
    c = MoEConfig(4, 2, 256, 128, dtype="float32")
    notes = []
    spec = harness.BenchSpec(shapes=[("tiny", c, 1)], tokens=[3], schemes=["none", "fp8_block"], backends=["torch_ref"],
                             peers=["vllm", "torch_loop"], ceilings=CEIL, platform="cpu", device="cpu")
    rep = harness.run_bench(spec, progress=False, log=notes.append)
    by = {(r.impl, r.scheme): r for r in rep.results}
    assert by[("vllm", "none")].status == "ok" and by[("vllm", "fp8_block")].status == "ok"
    assert ("torch_loop", "fp8_block") not in by and by[("torch_loop", "none")].status == "ok"
    assert any("peers torch_loop run for 16-bit weights only" in n for n in notes)
    assert "fp8_block (vs 16-bit and fp8_block peers)" in harness.format_summary(rep)
    assert rep.summary["points"][0]["best_peer"] in ("vllm", "torch_loop")
    labels = [lab for (_, lab) in plot._series(rep, "tiny", "us_best")]
    assert "vllm" in labels and "vllm [fp8_block]" in labels


def test_engine_peers_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)        # import raises ImportError: not installed
    monkeypatch.setitem(sys.modules, "sglang", None)
    names, notes = peers.default_peer_names()
    assert "vllm" not in names and "sglang" not in names and "torch_loop" in names
    assert any(n.startswith("peer vllm skipped: vllm is not installed (pip install vllm") for n in notes)
    c = MoEConfig(4, 2, 32, 16)
    with pytest.raises(peers.PeerUnavailable, match="vllm is not installed"):
        peers.build_peers(c, ["vllm"])[0].build(c, harness.make_weights(c, "none", "cpu"))
    from fusedmoe.errors import ConfigError
    with pytest.raises(ConfigError, match="pip install sglang"):
        peers.check_installed(["torch_loop", "sglang"])
    # 'all' leaves them out with one note each; the run is what it is without them
    notes = []
    spec = harness.BenchSpec(shapes=[("tiny", MoEConfig(4, 2, 32, 16, dtype="float32"), 1)], tokens=[2],
                             backends=["torch_ref"], ceilings=CEIL, platform="cpu", device="cpu", repeat=1)
    rep = harness.run_bench(spec, progress=False, log=notes.append)
    assert {r.impl for r in rep.results if r.kind == "peer"}.isdisjoint({"vllm", "sglang"})
    assert sum(n.startswith("peer ") and "skipped" in n for n in notes) == 2
