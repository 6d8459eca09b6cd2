"""grouped_mm's fp8_channel path (torch._scaled_grouped_mm, CUDA sm90 only) and what the oracle
knows about it.

CPU: the oracle's verdicts on hand-built platforms (Platform.preset cpu / a100 / h100 / b200),
and the whole fp8 pipeline run on CPU tensors against a stand-in for torch._scaled_grouped_mm
that first runs the real op on meta tensors (torch's own layout / dtype / scale-shape checks,
which mirror the CUDA ones) and leaves the rows past offs[-1] NaN, as uninitialised memory may be.
GPU (``gpu`` marker): the real op against reference_moe within fusedmoe.tolerances.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate, N = 2I (gated).
"""
from __future__ import annotations

import pytest
import torch

import fusedmoe.oracle as oracle
from fusedmoe.backends import grouped_mm as gmm
from fusedmoe.backends.registry import get_spec
from fusedmoe.config import MoEConfig, ParallelConfig, QuantScheme, Routing
from fusedmoe.errors import NoBackendError
from fusedmoe.layer import prepare_experts
from fusedmoe.platform import Platform
from fusedmoe.quantize import quantize_experts
from fusedmoe.reference.moe import reference_moe
from fusedmoe.reference.routing import route
from fusedmoe.tolerances import rel_error, tolerance

HAS_OP = getattr(torch, "_scaled_grouped_mm", None) is not None


@pytest.fixture
def with_op(monkeypatch):
    """The oracle sees a torch that has _scaled_grouped_mm (this CPU build has the symbol too)."""
    if not HAS_OP:
        monkeypatch.setattr(gmm, "_scaled_grouped_mm", lambda *a, **k: None)


def cfg_(dtype="bfloat16", H=256, I=128, **kw) -> MoEConfig:
    return MoEConfig(8, 2, H, I, dtype=dtype, **kw)


def reasons(sel, name="grouped_mm"):
    return {r.code: r.text for r in sel.candidate(name).reasons}


# ------------------------------------------------------------------------------ the oracle
def test_fp8_channel_refused_on_cpu(builtin_only, with_op):
    # _scaled_grouped_mm has CUDA kernels only: on CPU the oracle must not pick it (nothing changes there)
    sel = oracle.select_backend(cfg_(), "fp8_channel", Platform.preset("cpu"))
    assert sel.winner == "emulation"
    r = reasons(sel)
    assert list(r) == ["device"] and "_scaled_grouped_mm" in r["device"] and "CUDA" in r["device"]
    assert "[device]" in sel.explain() and "_scaled_grouped_mm" in sel.explain()
    assert oracle.select_backend(cfg_("float32"), "fp8_channel", Platform.preset("cpu")).winner == "emulation"


@pytest.mark.parametrize("plat,code,words", [
    ("a100", "quant_sm", ["sm_90", "sm90 only"]),        # no fp8 tensor cores, and no kernel
    ("b200", "quant_sm", ["sm_100", "sm90 only"]),       # sm100: torch's MXFP8 variant only
])
def test_fp8_channel_refused_off_sm90(builtin_only, with_op, plat, code, words):
    sel = oracle.select_backend(cfg_(), "fp8_channel", Platform.preset(plat))
    r = reasons(sel)
    assert list(r) == [code] and all(w in r[code] for w in words), r


@pytest.mark.parametrize("plat", ["h100", "h200"])
def test_fp8_channel_servable_on_sm90_after_triton(builtin_only, with_op, plat):
    sel = oracle.select_backend(cfg_(), "fp8_channel", Platform.preset(plat))
    assert sel.winner == "triton"                             # not measured yet: Triton stays first
    assert sel.candidate("grouped_mm").ok
    names = [c.name for c in sel.candidates]
    assert names.index("grouped_mm") == names.index("triton_batched") + 1
    assert names.index("grouped_mm") < names.index("emulation")
    # without the Triton backends grouped_mm is next, before emulation
    sel = oracle.select_backend(cfg_(), "fp8_channel", Platform.preset(plat).__class__(
        "cuda", "NVIDIA H100 80GB HBM3", (9, 0), 79.6, 132, False, False))
    assert sel.winner == "grouped_mm" and sel.notes == []


def test_missing_op_is_named(builtin_only, monkeypatch):
    monkeypatch.setattr(gmm, "_scaled_grouped_mm", None)
    sel = oracle.select_backend(cfg_(), "fp8_channel", Platform.preset("h100"))
    r = reasons(sel)
    assert list(r) == ["torch"] and "torch._scaled_grouped_mm" in r["torch"] and torch.__version__ in r["torch"]
    # the 16-bit path does not need it
    assert oracle.select_backend(cfg_(), "none", Platform.preset("h100"), "grouped_mm").winner == "grouped_mm"


@pytest.mark.parametrize("scheme,words", [
    ("fp8_block", ["rowwise", "128x128"]),
    ("fp8_tensor", ["per-tensor", "not wired"]),
    ("fp8_tensor:static", ["per-tensor"]),
    ("int8_channel", ["float8_e4m3fn", "int8"]),
    ("int4_w4a16", ["weight-only"]),
    ("nvfp4", ["fp4"]),
])
@pytest.mark.parametrize("plat", ["cpu", "a100", "h100", "b200"])
def test_other_schemes_refused_everywhere_with_why(builtin_only, with_op, scheme, words, plat):
    q = QuantScheme.parse(scheme)
    rs = get_spec("grouped_mm").evaluate(cfg_(), q, Platform.preset(plat))
    assert [r.code for r in rs][:1] == ["quant"], rs
    assert q.method.value in rs[0].text and all(w in rs[0].text for w in words), rs[0].text


def test_explicit_request_raises_with_the_reason(builtin_only, with_op):
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "fp8_block", Platform.preset("h100"), "grouped_mm")
    assert any("[quant]" in r and "rowwise" in r for r in ei.value.rejections["grouped_mm"])
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "fp8_channel", Platform.preset("cpu"), "grouped_mm")
    assert any("[device]" in r and "_scaled_grouped_mm" in r for r in ei.value.rejections["grouped_mm"])


@pytest.mark.parametrize("kw,code,words", [
    (dict(dtype="float16"), "dtype", ["bfloat16"]),
    (dict(dtype="float32"), "dtype", ["bfloat16"]),
    (dict(H=264), "shape", ["16", "H=264"]),            # 8-aligned (16-bit path fine), not 16
    (dict(I=136), "shape", ["16", "I=136"]),
])
def test_fp8_shape_and_dtype_limits(builtin_only, with_op, kw, code, words):
    cfg = cfg_(**kw)
    rs = get_spec("grouped_mm").evaluate(cfg, QuantScheme("fp8_channel"), Platform.preset("h100"))
    assert [r.code for r in rs] == [code] and all(w in rs[0].text for w in words), rs


def test_capability_table_says_exactly(builtin_only):
    t = get_spec("grouped_mm").capability_table()
    assert t["quant"] == ["fp8_channel", "none"] and t["quant_min_sm"] == {"fp8_channel": 90}
    assert "sm90" in t["description"]


def test_priority_table_w8a8_cuda(builtin_only):
    assert oracle.priority_order(QuantScheme("fp8_channel"), Platform.preset("h100")) == \
        ["triton", "triton_batched", "grouped_mm", "emulation", "torch_ref"]
    # CPU unchanged: grouped_mm is not in the w8a8 CPU row
    assert oracle.priority_order(QuantScheme("fp8_channel"), Platform.preset("cpu")) == \
        ["emulation", "triton", "torch_ref", "grouped_mm", "triton_batched"]


def test_emulation_still_uses_16bit_grouped_mm(builtin_only, mk):
    # emulation asks grouped_mm's 16-bit check about its dequantized weights: unchanged
    from fusedmoe.backends.emulation import EmulationExperts
    cfg = mk.config(E=8, k=2, H=128, I=64, dtype="float32")
    w = mk.weights(cfg, "fp8_channel", seed=3)
    pe = prepare_experts(cfg, w, "emulation")
    assert isinstance(pe.kernel.experts, EmulationExperts)


# ------------------------------------------------------------------------------ pipeline on CPU
def _meta(t):
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


class StandIn:
    """torch._scaled_grouped_mm on CPU: torch's meta checks, then an fp32 loop over groups.
    Rows past offs[-1] come back NaN (the real op leaves them uninitialised)."""

    def __init__(self):
        self.calls = []

    def __call__(self, a, b, sa, sb, offs=None, bias=None, scale_result=None, out_dtype=None,
                 use_fast_accum=False):
        m = torch.ops.aten._scaled_grouped_mm(_meta(a), _meta(b), _meta(sa), _meta(sb), offs=_meta(offs),
                                              bias=bias, scale_result=scale_result, out_dtype=out_dtype,
                                              use_fast_accum=use_fast_accum)
        self.calls.append((a.shape, b.data_ptr(), b.stride(), sa.shape, sb.shape, offs.clone()))
        out = torch.full(m.shape, float("nan"), dtype=m.dtype)
        start = 0
        for g, end in enumerate(offs.tolist()):
            assert start <= end <= a.shape[0]
            out[start:end] = ((a[start:end].float() * sa[start:end, None])
                              @ (b[g].float() * sb[g][None, :])).to(m.dtype)
            start = end
        return out


def _matches_reference(pe, cfg, w, x, tw, ti):
    out = pe(x, tw, ti)
    err = rel_error(out, reference_moe(x, w, tw, ti, cfg))
    assert out.dtype == x.dtype and torch.isfinite(out).all()
    assert err <= tolerance(cfg.dtype, "fp8_channel"), err
    return out


@pytest.fixture
def stand_in(monkeypatch):
    f = StandIn()
    monkeypatch.setattr(gmm, "_scaled_grouped_mm", f)
    return f


def _cpu_check(cfg, w, x, tw, ti, stand_in):
    pe = prepare_experts(cfg, w, "grouped_mm", platform=Platform.preset("h100"))
    assert isinstance(pe.kernel.experts, gmm.GroupedMMFp8Experts)
    return pe, _matches_reference(pe, cfg, w, x, tw, ti)


@pytest.mark.parametrize("T", [1, 7, 64, 300])
def test_pipeline_on_cpu_stand_in(mk, stand_in, T):
    # E=9 (odd); expert 4 gets no token and has NaN weights (reading it would show)
    cfg = mk.config(E=9, k=2, H=256, I=128, dtype="bfloat16")
    w = mk.weights(cfg, "fp8_channel", seed=T, poison_experts=(4,))
    tw, ti = mk.topk(T, 9, 2, seed=T + 1, exclude=(4,))
    pe, _ = _cpu_check(cfg, w, mk.x(cfg, T, seed=T + 2), tw, ti, stand_in)
    assert len(stand_in.calls) == 2
    (a1, p1, st1, sa1, sb1, offs), (a2, p2, st2, sa2, sb2, _) = stand_in.calls
    # no weight copy per call: the column-major operands are views of the loaded weights
    assert p1 == pe.weights.w13.data_ptr() and p2 == pe.weights.w2.data_ptr()
    assert st1 == (256 * 256, 1, 256) and st2 == (256 * 128, 1, 128)      # column-major [E, K, N]
    assert a1 == (T * 2, 256) and a2 == (T * 2, 128) and sa1 == sa2 == (T * 2,)
    assert sb1 == (9, 256) and sb2 == (9, 256) and offs.dtype == torch.int32 and offs.shape == (9,)
    assert offs[4] == offs[3] and offs[-1] == T * 2                  # the empty expert: an empty group


def test_pipeline_on_cpu_expert_map_bias_and_activations(mk, stand_in):
    # EP rank 1 of 2: half the slots are not local (sorted after every group, never computed)
    cfg = MoEConfig(16, 2, 128, 64, dtype="bfloat16", has_bias=True,
                    parallel=ParallelConfig(ep_size=2, ep_rank=1))
    w = mk.weights(cfg, "fp8_channel", seed=5)
    tw, ti = mk.topk(50, 16, 2, seed=6)
    _cpu_check(cfg, w, mk.x(cfg, 50, seed=7), tw, ti, stand_in)
    for act in ("swigluoai", "gelu", "relu2_no_mul"):             # interleaved rows; non-gated N = I
        cfg = MoEConfig(8, 2, 128, 64, dtype="bfloat16", activation=act, has_bias=True)
        w = mk.weights(cfg, "fp8_channel", seed=8)
        tw, ti = mk.topk(33, 8, 2, seed=9)
        _cpu_check(cfg, w, mk.x(cfg, 33, seed=10) * 3, tw, ti, stand_in)


def test_pipeline_on_cpu_t0_and_router_weight_on_input(mk, stand_in):
    cfg = mk.config(E=8, k=2, H=128, I=64, dtype="bfloat16")
    w = mk.weights(cfg, "fp8_channel", seed=11)
    pe = prepare_experts(cfg, w, "grouped_mm", platform=Platform.preset("h100"))
    x = mk.x(cfg, 0)
    out = pe(x, torch.empty(0, 2), torch.empty(0, 2, dtype=torch.int32))
    assert out.shape == (0, 128) and out.dtype == torch.bfloat16
    # top-1, weight on input: prepare rounds x * w to bf16 before quantizing (the reference
    # does not), so every backend sits at ~0.03 here (emulation too); this seed: 0.028
    cfg1 = MoEConfig(8, 1, 256, 128, dtype="bfloat16", routing=Routing(apply_router_weight_on_input=True))
    w1 = mk.weights(cfg1, "fp8_channel", seed=12)
    tw, ti = mk.topk(20, 8, 1, seed=13)
    _cpu_check(cfg1, w1, mk.x(cfg1, 20, seed=14), tw, ti, stand_in)


# ------------------------------------------------------------------------------ GPU
DEV = "cuda"


def _gpu_weights(cfg, seed=0, bias_scale=0.1):
    g = torch.Generator().manual_seed(seed)
    E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    w13 = (torch.randn(E, N, H, generator=g) / H ** 0.5).to(DEV, cfg.torch_dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(DEV, cfg.torch_dtype)
    b13 = b2 = None
    if cfg.has_bias:
        b13 = (torch.randn(E, N, generator=g) * bias_scale).to(DEV, cfg.torch_dtype)
        b2 = (torch.randn(E, H, generator=g) * bias_scale).to(DEV, cfg.torch_dtype)
    return quantize_experts(w13, w2, "fp8_channel", w13_bias=b13, w2_bias=b2)


def _gpu_routed(cfg, T, seed=1, unused=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, cfg.hidden_size, generator=g).to(DEV, cfg.torch_dtype)
    logits = torch.randn(T, cfg.num_experts, generator=g)
    for e in unused:                                 # these experts never get a token
        logits[:, e] = -1e4
    res = route(logits, cfg.top_k, Routing())
    return x, res.topk_weights.to(DEV), res.topk_ids.to(DEV)


def _gpu_check(cfg, w, x, tw, ti):
    spec = get_spec("grouped_mm")
    why = spec.evaluate(cfg, w.scheme, Platform.current())
    if why:
        pytest.skip("grouped_mm fp8_channel cannot run on this GPU: " + "; ".join(map(str, why)))
    pe = prepare_experts(cfg, w, "grouped_mm")
    assert isinstance(pe.kernel.experts, gmm.GroupedMMFp8Experts)
    return pe, _matches_reference(pe, cfg, w, x, tw, ti)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 7, 64, 1000])
def test_gpu_token_sweep(T):
    # E=9 (odd), expert 4 never routed to (an empty group)
    cfg = MoEConfig(9, 2, 512, 256)
    _gpu_check(cfg, _gpu_weights(cfg, seed=T), *_gpu_routed(cfg, T, seed=T + 5, unused=(4,)))


@pytest.mark.gpu
def test_gpu_t0():
    cfg = MoEConfig(9, 2, 512, 256)
    w = _gpu_weights(cfg)
    if get_spec("grouped_mm").evaluate(cfg, w.scheme, Platform.current()):
        pytest.skip("grouped_mm fp8_channel cannot run on this GPU")
    pe = prepare_experts(cfg, w, "grouped_mm")
    out = pe(torch.empty(0, 512, device=DEV, dtype=torch.bfloat16), torch.empty(0, 2, device=DEV),
             torch.empty(0, 2, device=DEV, dtype=torch.int32))
    assert out.shape == (0, 512)


@pytest.mark.gpu
def test_gpu_asymmetric_gate_up_matters():
    cfg = MoEConfig(9, 2, 256, 128)
    w = _gpu_weights(cfg)
    x, tw, ti = _gpu_routed(cfg, 33)
    _, out = _gpu_check(cfg, w, x, tw, ti)
    I = cfg.intermediate_size
    swapped = w.replace(w13=torch.cat([w.w13[:, I:], w.w13[:, :I]], 1).contiguous(),
                        w13_scale=torch.cat([w.w13_scale[:, I:], w.w13_scale[:, :I]], 1).contiguous())
    _, out2 = _gpu_check(cfg, swapped, x, tw, ti)
    assert rel_error(out2, out) > 0.1


@pytest.mark.gpu
def test_gpu_expert_map_bias_swigluoai():
    cfg = MoEConfig(16, 2, 256, 128, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    _gpu_check(cfg, _gpu_weights(cfg), *_gpu_routed(cfg, 50))
    cfg = MoEConfig(8, 2, 512, 256, activation="swigluoai", has_bias=True)
    x, tw, ti = _gpu_routed(cfg, 77)
    _gpu_check(cfg, _gpu_weights(cfg, bias_scale=1.0), x * 4, tw, ti)


@pytest.mark.gpu
def test_gpu_auto_selects_grouped_mm_without_triton(monkeypatch):
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", "triton,triton_batched")
    cfg = MoEConfig(9, 2, 512, 256)
    w = _gpu_weights(cfg)
    if get_spec("grouped_mm").evaluate(cfg, w.scheme, Platform.current()):
        pytest.skip("grouped_mm fp8_channel cannot run on this GPU")
    assert prepare_experts(cfg, w).selection.winner == "grouped_mm"
