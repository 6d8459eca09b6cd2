"""GPU tests of the whole layer (FusedMoE / prepare_experts) on the Triton backends.

Run on the device: ``python -m pytest -m gpu tests/test_gpu_layer.py``. Every case compares
with the plain-torch reference on fresh random inputs, within fusedmoe.tolerances.
"""
from __future__ import annotations

import json

import pytest
import torch

from fusedmoe import FusedMoE, MoEConfig, ParallelConfig, Routing, prepare_experts, quantize_experts
from fusedmoe.reference.moe import reference_moe
from fusedmoe.reference.routing import route
from fusedmoe.tolerances import rel_error, tolerance

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"


def _weights(cfg, quant="none", seed=0, bias_scale=0.1):
    g = torch.Generator().manual_seed(seed)
    E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    w13 = (torch.randn(E, N, H, generator=g) / H ** 0.5).to(DEV, cfg.torch_dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(DEV, cfg.torch_dtype)
    b13 = b2 = None
    if cfg.has_bias:
        b13 = (torch.randn(E, N, generator=g) * bias_scale).to(DEV, cfg.torch_dtype)
        b2 = (torch.randn(E, H, generator=g) * bias_scale).to(DEV, cfg.torch_dtype)
    return quantize_experts(w13, w2, quant, w13_bias=b13, w2_bias=b2)


def _routed(cfg, T, seed=1, skew_to=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, cfg.hidden_size, generator=g).to(DEV, cfg.torch_dtype)
    logits = torch.randn(T, cfg.num_experts, generator=g)
    if skew_to is not None:                       # every token's top expert is `skew_to`
        logits[:, skew_to] += 100.0
    res = route(logits, cfg.top_k, Routing())
    return x, res.topk_weights.to(DEV), res.topk_ids.to(DEV)


def _check(cfg, w, x, tw, ti, backend="triton", fmt="standard", **kw):
    pe = prepare_experts(cfg, w, backend, fmt=fmt, **kw)
    out = pe(x, tw, ti)
    C = pe.kernel.chunk_size
    if w.scheme.method == "fp8_tensor" and w.a13_scale is None and x.shape[0] > C:
        # a dynamic per-TENSOR activation scale is computed per chunk (documented in
        # modular/kernel.py): the reference must quantize the same chunks (two different
        # e4m3 roundings of x and h differ by ~5%, more than the 4% tolerance)
        ref = torch.cat([reference_moe(x[i:i + C], w, tw[i:i + C], ti[i:i + C], cfg)
                         for i in range(0, x.shape[0], C)])
    else:       # (the triton decode path keeps W8A8 activations 16-bit: w8a8_decode, fusedmoe/plan.py)
        ref = reference_moe(x, w, tw, ti, cfg, quantize_activations=pe.quantizes_activations(x.shape[0]),
                            h_group=pe.h_group(x.shape[0]))
    err = rel_error(out, ref)
    tol = tolerance(cfg.dtype, w.scheme.method if pe.quantizes_activations(x.shape[0]) else "none")
    assert err <= tol, (backend, fmt, err)
    assert torch.isfinite(out).all()
    return pe, out


@pytest.mark.parametrize("T", [1, 3, 17, 255, 1000, 4097, 16384])
def test_token_sweep_odd_sizes(T):
    # edge: T not a multiple of any tile; E=60 (not a multiple of 8); H, I multiples of 8 only
    cfg = MoEConfig(60, 4, 1032, 360)
    w = _weights(cfg)
    _check(cfg, w, *_routed(cfg, T, seed=T))


@pytest.mark.parametrize("act,limit", [("silu", None), ("silu", 0.5), ("gelu", None), ("gelu_tanh", None),
                                       ("swigluoai", None), ("relu2_no_mul", None), ("silu_no_mul", None),
                                       ("gelu_no_mul", None)])
def test_activations_bias_clamp(act, limit):
    # edge: swiglu_limit 0.5 is active on most of the data; swigluoai interleaved and clamped
    cfg = MoEConfig(8, 2, 512, 256, activation=act, has_bias=True, swiglu_limit=limit)
    w = _weights(cfg, bias_scale=1.0)
    x, tw, ti = _routed(cfg, 77)
    _check(cfg, w, x * 4, tw, ti)
    _check(cfg, w, x * 4, tw, ti, backend="triton_batched", fmt="batched")


def test_asymmetric_gate_up_matters():
    cfg = MoEConfig(8, 2, 256, 128)
    w = _weights(cfg)
    x, tw, ti = _routed(cfg, 33)
    _, out = _check(cfg, w, x, tw, ti)
    I = cfg.intermediate_size
    swapped = w.replace(w13=torch.cat([w.w13[:, I:], w.w13[:, :I]], 1).contiguous())
    _, out2 = _check(cfg, swapped, x, tw, ti)
    assert rel_error(out2, out) > 0.1


def test_expert_map_and_empty_experts():
    # edge: EP rank 1 of 2 (half the slots are not local), and experts with no tokens
    cfg = MoEConfig(16, 2, 256, 128, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    w = _weights(cfg)
    x, tw, ti = _routed(cfg, 50)
    ti = torch.where(ti == 9, torch.full_like(ti, 3), ti)     # expert 9 (local) gets nothing
    ti[:, 1] = torch.where(ti[:, 0] == 3, torch.full_like(ti[:, 1], 4), ti[:, 1])
    for backend, fmt in (("triton", "standard"), ("triton_batched", "batched")):
        _check(cfg, w, x, tw, ti, backend, fmt)


def test_all_tokens_on_one_expert():
    cfg = MoEConfig(8, 2, 512, 256)
    w = _weights(cfg)
    _check(cfg, w, *_routed(cfg, 3000, skew_to=5))


@pytest.mark.parametrize("quant", ["fp8_tensor", "fp8_channel", "fp8_block", "int8_channel"])
@pytest.mark.parametrize("T", [1, 64, 1000])
def test_w8a8_schemes(quant, T):
    cfg = MoEConfig(9, 2, 512, 256)          # odd number of experts
    w = _weights(cfg, quant)
    x, tw, ti = _routed(cfg, T, seed=T + 5)
    _check(cfg, w, x, tw, ti)
    _check(cfg, w, x, tw, ti, backend="triton_batched", fmt="batched")


def test_fp8_block_rejects_unaligned_sizes():
    # H or I not a multiple of 128: the triton backend refuses with a reason (emulation serves)
    from fusedmoe.errors import NoBackendError
    cfg = MoEConfig(8, 2, 320, 192)
    w = _weights(cfg, "fp8_block")
    with pytest.raises(NoBackendError, match="block"):
        prepare_experts(cfg, w, "triton")
    assert prepare_experts(cfg, w).selection.winner == "emulation"


def test_deterministic_bitwise():
    cfg = MoEConfig(32, 8, 1024, 512)
    w = _weights(cfg)
    x, tw, ti = _routed(cfg, 999)
    pe = prepare_experts(cfg, w, "triton", deterministic=True)
    a, b = pe(x, tw, ti), pe(x, tw, ti)
    assert torch.equal(a, b)


def test_module_forward_graph_capture_and_compile():
    cfg = MoEConfig(64, 8, 1024, 256, routing=Routing(scoring="sigmoid", num_groups=8, topk_groups=4,
                                                      has_correction_bias=True, routed_scaling_factor=2.5))
    w = _weights(cfg)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(3)).to(DEV) * 0.1
    layer = FusedMoE(cfg, w, correction_bias=bias)
    assert layer.selection.winner == "triton"
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 1024, generator=g).to(DEV, cfg.torch_dtype)
    logits = torch.randn(40, 64, generator=g).to(DEV)
    with torch.inference_mode():
        eager = layer(x, logits)
        res = route(logits.cpu(), 8, cfg.routing, bias.cpu())
        ref = reference_moe(x, w, res.topk_weights.to(DEV), res.topk_ids.to(DEV), cfg)
        assert rel_error(eager, ref) <= tolerance(cfg.dtype, "none")
        # CUDA graph: capture once, replay on new data written into the same input buffers
        sx, sl = x.clone(), logits.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            layer(sx, sl)                                   # warm-up (compiles) outside capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gout = layer(sx, sl)
        x2 = torch.randn(40, 1024, generator=g).to(DEV, cfg.torch_dtype)
        l2 = torch.randn(40, 64, generator=g).to(DEV)
        sx.copy_(x2)
        sl.copy_(l2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(gout, layer(x2, l2))
        compiled = torch.compile(layer, fullgraph=True)
        assert rel_error(compiled(x2, l2), gout) <= tolerance(cfg.dtype, "none")


@pytest.mark.parametrize("quant", ["none", "fp8_channel"])
def test_atomic_k_sum_default_eager_graph_and_expert_map(quant):
    # >= 64 pairs a local expert in bf16 on CUDA: GEMM2 adds into the zeroed output atomically
    # by default (plan.reduce_rule). Eager calls and CUDA-graph replays match the reference and each
    # other up to the rounding order (each slot rounded to bf16 as it lands); tokens whose
    # slots are all remote (expert map, EP rank 1 of 2) get exact zeros; deterministic=True
    # gives the fixed-order reduce, bitwise stable
    cfg = MoEConfig(16, 2, 512, 256, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    w = _weights(cfg, quant)
    T = 1024                                                     # 2048 pairs: ~128 a local expert
    x, tw, ti = _routed(cfg, T, seed=21)
    ti[:5] = torch.tensor([1, 3], dtype=ti.dtype, device=DEV)    # global 1 and 3: rank 0's experts
    pe = prepare_experts(cfg, w, "triton")
    assert pe.kernel.experts.plan(T).reduce == "atomic_out"
    outs = _eager_and_replayed(pe, x, tw, ti)
    ref = reference_moe(x, w, tw, ti, cfg, quantize_activations=quant != "none")
    for o in outs:
        assert rel_error(o, ref) <= tolerance(cfg.dtype, quant)
        assert rel_error(o, outs[0]) < 1e-2
        assert torch.equal(o[:5], torch.zeros_like(o[:5]))
    det = prepare_experts(cfg, w, "triton", deterministic=True)
    assert det.kernel.experts.plan(T).reduce == "deterministic"
    d = _eager_and_replayed(det, x, tw, ti)
    assert all(torch.equal(o, d[0]) for o in d)
    assert rel_error(d[0], ref) <= tolerance(cfg.dtype, quant)


@pytest.mark.parametrize("quant", ["none", "fp8_channel", "int8_channel", "fp8_block", "fp8_tensor"])
def test_atomic_k_sum_zeroed_early_in_the_pdl_chain(quant, monkeypatch):
    # 64 pairs a local expert exactly: the atomic k-sum (plan.reduce_rule) AND the prefill PDL
    # chain (plan.PREFILL_PDL_MAX_M). The output is zeroed at the start (by the quantization of x,
    # or a fill ahead of the alignment: LaunchPlan.zero 'early') or by GEMM1 on the side ('gemm1',
    # above plan.ZERO_IN_GEMM1_MIN elements), so GEMM2 stays a dependent launch of GEMM1. Eager
    # calls (into a caller-visible buffer left dirty by the call before) and a graph replay match
    # the reference and each other (GEMM2 zeroing the output itself, the FUSED_ZERO switch's other
    # side, was removed from the layer: slower; tests/test_backends.py still runs it for outputs
    # that are not unit-stride [T, H] rows)
    from fusedmoe import plan
    cfg = MoEConfig(8, 2, 512, 256, dtype="bfloat16")
    w = _weights(cfg, quant, seed=31)
    T = 256
    x, tw, ti = _routed(cfg, T, seed=32)
    outs = {}
    for zero in ("early", "gemm1"):
        monkeypatch.setattr(plan, "ZERO_IN_GEMM1_MIN", 0 if zero == "gemm1" else 1 << 62)
        pe = prepare_experts(cfg, w, "triton")
        ex = pe.kernel.experts
        p = ex.plan(T)
        assert p.reduce == "atomic_out" and p.pdl == ex.planner.prefill_pdl and p.zero == zero
        outs[zero] = _eager_and_replayed(pe, x, tw, ti)
    ref = reference_moe(x, w, tw, ti, cfg, quantize_activations=quant != "none", h_group=pe.h_group(T))
    for o in outs["early"] + outs["gemm1"]:
        assert rel_error(o, ref) <= tolerance(cfg.dtype, quant)
        assert rel_error(o, outs["early"][0]) < 1e-2


def _eager_and_replayed(pe, x, tw, ti):
    """Three eager outputs of ``pe`` and one from the replay of a CUDA graph of it."""
    eager = [pe(x, tw, ti).clone() for _ in range(3)]
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pe(x, tw, ti)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        o = pe(x, tw, ti)
    g.replay()
    torch.cuda.synchronize()
    return eager + [o.clone()]


@pytest.mark.parametrize("quant,mode", [("none", "a16"), ("fp8_channel", "a8"), ("int8_channel", "a8"),
                                        ("fp8_block", "a8"), ("fp8_channel", "a16"), ("fp8_block", "a16"),
                                        ("fp8_tensor", "a16"), ("fp8_channel", "tc"), ("int8_channel", "tc"),
                                        ("fp8_block", "tc"), ("fp8_block", "auto"), ("fp8_channel", "auto"),
                                        ("fp8_channel", "tc_share"), ("fp8_block", "tc_share")])
@pytest.mark.parametrize("T", [1, 3])
def test_decode_pdl_chain_equals_plain_launches(quant, mode, T, monkeypatch):
    # decode: GEMM2 a programmatic dependent launch of GEMM1 (16-bit), or the W8A8 chain
    # quantize x -> GEMM1 -> requantize h -> GEMM2 (each a dependent of the one before, the
    # GEMMs loading weights before they wait): bitwise what ordinary launches give, eager
    # and under CUDA-graph replay, with an expert map (EP rank 1 of 2)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm90+")
    cfg = MoEConfig(32, 4, 256, 256, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    w = _weights(cfg, quant)
    x, tw, ti = _routed(cfg, T, seed=T + 7)
    forced = dict(decode_pairs=64)                             # T = 3 on the decode path too
    if mode == "tc_share":                                     # + the share table, a link of the chain
        forced["decode_share"] = True
        mode = "tc"
    forced["w8a8_decode"] = mode                               # W8A8: 16-bit activations, or quantized
    outs = {}
    for pdl in ("0", "1"):
        monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps(dict(forced, decode_pdl=pdl == "1")))
        pe = prepare_experts(cfg, w, "triton")
        assert pe.kernel.experts.plan(T).pdl == (pdl == "1")
        outs[pdl] = _eager_and_replayed(pe, x, tw, ti)
    for a in outs["0"] + outs["1"]:
        assert torch.equal(a, outs["0"][0])
    from fusedmoe.config import QuantScheme
    from fusedmoe.plan import a16_max_t, device_facts
    from fusedmoe.platform import Platform
    auto_a16 = T <= a16_max_t(QuantScheme.parse(quant), device_facts(Platform.current()))
    qa = quant != "none" and (mode in ("a8", "tc") or (mode == "auto" and not auto_a16))
    assert pe.quantizes_activations(T) == qa
    ref = reference_moe(x, w, tw, ti, cfg, quantize_activations=qa)
    assert rel_error(outs["1"][0], ref) <= tolerance(cfg.dtype, quant if qa else "none")


@pytest.mark.parametrize("quant", ["none", "fp8_channel", "int8_channel", "fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("T", [37, 240])
def test_prefill_pdl_chain_equals_plain_launches(quant, T, monkeypatch):
    # grouped path: GEMM1, the requantization of h, GEMM2 and the reduce as programmatic
    # dependent launches (FUSEDMOE_PLAN prefill_pdl): bitwise what ordinary launches give, eager
    # and under CUDA-graph replay, with an expert map (EP rank 1 of 2)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm90+")
    cfg = MoEConfig(32, 4, 256, 256, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    w = _weights(cfg, quant)
    x, tw, ti = _routed(cfg, T, seed=T + 11)
    outs = {}
    for pdl in ("0", "1"):                                     # decode_pairs 0: every T on the grouped path
        monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"decode_pairs": 0, "prefill_pdl": pdl == "1"}))
        pe = prepare_experts(cfg, w, "triton")
        assert pe.kernel.experts.planner.prefill_pdl == (pdl == "1")
        assert pe.kernel.experts.plan(T).pdl == (pdl == "1")              # <= 64 pairs a local expert
        outs[pdl] = _eager_and_replayed(pe, x, tw, ti)
    for a in outs["0"] + outs["1"]:
        assert torch.equal(a, outs["0"][0])
    qa = pe.quantizes_activations(T)
    assert qa == (quant != "none")
    ref = reference_moe(x, w, tw, ti, cfg, quantize_activations=qa, h_group=pe.h_group(T))
    assert rel_error(outs["1"][0], ref) <= tolerance(cfg.dtype, quant)


@pytest.mark.parametrize("quant", ["fp8_channel", "int8_channel", "fp8_block"])
@pytest.mark.parametrize("mode", ["a8", "tc"])
def test_decode_quantization_launches_reuse_their_buffers(quant, mode, monkeypatch):
    # the W8A8 decode chain quantizes x and h through launches bound per input shape into
    # buffers kept with them (TritonExperts._dquant): calls with new inputs, another T in
    # between, must give what a fresh layer gives, and match the reference; x and h never
    # share a buffer (k = 1 and I = H here: their shapes are the same)
    cfg = MoEConfig(32, 1, 256, 256)
    w = _weights(cfg, quant)
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"decode_pairs": 64, "w8a8_decode": mode}))
    pe = prepare_experts(cfg, w, "triton")
    for seed, T in ((1, 2), (2, 3), (3, 2), (4, 2)):
        x, tw, ti = _routed(cfg, T, seed=seed)
        got = pe(x, tw, ti).clone()
        assert torch.equal(got, prepare_experts(cfg, w, "triton")(x, tw, ti))
        ref = reference_moe(x, w, tw, ti, cfg, quantize_activations=True)
        assert rel_error(got, ref) <= tolerance(cfg.dtype, quant)
    assert {k[0] for k in pe.kernel.experts._qplans} == {"x", "h"} and len(pe.kernel.experts._qplans) == 4
