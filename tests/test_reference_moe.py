"""The reference MoE (fusedmoe.reference.moe.reference_moe) against a naive loop written here.

The naive loop walks every token t and slot j, uses the weights dequantized by
fusedmoe.quantize.dequantize_experts and spells every activation out inline (it does NOT
import fusedmoe.reference.activations), in float64 unless a scheme's activation
fake-quantization needs the same fp32 inputs the reference sees.

Legend: T tokens, E experts, E_loc local experts, k top-k, H hidden, I intermediate, N = 2I or I.
"""
from __future__ import annotations

import math

import pytest
import torch

from fusedmoe.config import MoEConfig, ParallelConfig, QuantScheme, Routing
from fusedmoe.quantize import dequantize_experts
from fusedmoe.reference.moe import dequantized_weights, moe_ref, reference_moe
from fusedmoe.reference.quant import fake_quant_activation
from fusedmoe.tolerances import rel_error, tolerance

TOL32 = tolerance("float32", "none")          # fp32 reference vs fp64 loop: rounding only


# ------------------------------------------------------------------------------ the naive loop
def act_inline(a: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """GEMM1 output of ONE slot a [N] -> [I], written out from the formulas in DESIGN.md."""
    name = cfg.activation.value
    if name == "relu2_no_mul":
        return torch.clamp(a, min=0) ** 2
    if name == "silu_no_mul":
        return a / (1 + torch.exp(-a))
    if name == "gelu_no_mul":
        return 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))
    if name == "swigluoai":                                   # rows interleaved: g0 u0 g1 u1 ...
        L, alpha = cfg.swigluoai_limit, cfg.swigluoai_alpha
        g = torch.clamp(a[0::2], max=L)
        u = torch.clamp(a[1::2], -L, L)
        return (u + 1) * g / (1 + torch.exp(-alpha * g))
    I = a.numel() // 2
    g, u = a[:I], a[I:]                                       # halves: gate rows first
    if name == "silu":
        if cfg.swiglu_limit is not None:
            L = cfg.swiglu_limit
            g, u = torch.clamp(g, max=L), torch.clamp(u, -L, L)
        return g / (1 + torch.exp(-g)) * u
    if name == "gelu":
        return 0.5 * g * (1 + torch.erf(g / math.sqrt(2))) * u
    if name == "gelu_tanh":
        return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * u
    raise AssertionError(name)


# Independent on purpose: the point of this file is to check the reference itself, so this
# loop shares no code with fusedmoe.reference (every other test computes through it).
def naive_moe(x, w13, w2, tw, ti, cfg: MoEConfig, b13=None, b2=None, fq=None, dtype=torch.float64):
    """out [T, H] in ``dtype``. w13 [E_loc, N, H], w2 [E_loc, H, I] (dequantized, local experts).

    ``fq(t) -> t``: the scheme's activation fake-quant, applied to GEMM1's whole input and
    to GEMM2's input stacked over every computed slot (per-tensor scales see all of it)."""
    T, H = x.shape
    k = ti.shape[1]
    local = {g: i for i, g in enumerate(cfg.parallel.local_experts(cfg.num_experts))}
    on_input = cfg.routing.apply_router_weight_on_input
    xin = x.to(dtype)
    if on_input:
        xin = xin * tw[:, :1].to(dtype)                       # top-1: weight the input
    if fq is not None:
        xin = fq(xin.float()).to(dtype)
    slots, hs = [], []
    for t in range(T):
        for j in range(k):
            gid = int(ti[t, j])
            if gid not in local:                              # non-local expert: nothing
                continue
            e = local[gid]
            a = w13[e].to(dtype) @ xin[t]                     # [N]
            if b13 is not None:
                a = a + b13[e].to(dtype)
            slots.append((t, j, e))
            hs.append(act_inline(a, cfg))                     # [I]
    if fq is not None and hs:
        hs = list(fq(torch.stack(hs).float()).to(dtype))
    out = torch.zeros(T, H, dtype=dtype)
    for (t, j, e), h in zip(slots, hs):
        y = w2[e].to(dtype) @ h                               # [H]
        if b2 is not None:
            y = y + b2[e].to(dtype)
        out[t] += y if on_input else tw[t, j].to(dtype) * y
    return out


def naive_for(weights, x, tw, ti, cfg, fq=None, dtype=torch.float64):
    w13, w2 = dequantize_experts(weights)
    return naive_moe(x, w13, w2, tw, ti, cfg, weights.w13_bias, weights.w2_bias, fq=fq, dtype=dtype)


# ------------------------------------------------------------------------------ activations
ACTIVATIONS = [
    ("silu", {}),
    ("silu", {"swiglu_limit": 0.6}),        # clamp active: O(1) pre-activations exceed 0.6
    ("gelu", {}),
    ("gelu_tanh", {}),
    ("swigluoai", {}),                      # interleaved rows, default alpha / limit 7 (inactive)
    ("swigluoai", {"swigluoai_limit": 0.6, "swigluoai_alpha": 1.2}),   # its limit active too
    ("relu2_no_mul", {}),                   # non-gated: w13 is [E, I, H]
    ("silu_no_mul", {}),
    ("gelu_no_mul", {}),
]


@pytest.mark.parametrize("act,kw", ACTIVATIONS, ids=[a + ("+" + "+".join(kw) if kw else "") for a, kw in ACTIVATIONS])
def test_matches_naive_every_activation(mk, act, kw):
    # E=6 (not a power of 2), H=40, I=24: odd-ish sizes; unnormalized weights
    cfg = mk.config(E=6, k=2, H=40, I=24, activation=act, dtype="float32", **kw)
    w = mk.weights(cfg, seed=11)
    x = mk.x(cfg, 13, seed=12)
    tw, ti = mk.topk(13, 6, 2, seed=13)
    ref = reference_moe(x, w, tw, ti, cfg)
    assert ref.shape == (13, 40) and ref.dtype == torch.float32
    assert rel_error(ref, naive_for(w, x, tw, ti, cfg)) <= TOL32


@pytest.mark.parametrize("act,limit_kw", [("silu", "swiglu_limit"), ("swigluoai", "swigluoai_limit")])
def test_clamp_is_active_on_the_data(mk, act, limit_kw):
    # the clamped case above must really clamp: pre-activations beyond L exist and the
    # output differs from the unclamped one by far more than rounding
    cfg = mk.config(E=6, k=2, H=40, I=24, activation=act, dtype="float32", **{limit_kw: 0.6})
    w = mk.weights(cfg, seed=11)
    x = mk.x(cfg, 13, seed=12)
    tw, ti = mk.topk(13, 6, 2, seed=13)
    pre = torch.einsum("th,nh->tn", x, w.w13[int(ti[0, 0])])   # GEMM1 of token 0's first expert
    gate = pre[:, :24] if act == "silu" else pre[:, 0::2]
    assert (gate > 0.6).any() and (gate.abs() < 0.6).any()
    unclamped = cfg.replace(**{limit_kw: 1e6 if act == "swigluoai" else None})
    assert rel_error(reference_moe(x, w, tw, ti, cfg), reference_moe(x, w, tw, ti, unclamped)) > 0.05


def test_gate_and_up_are_not_interchangeable(mk):
    # asymmetric gate/up: swapping the halves of w13 must change silu(g) * u
    cfg = mk.config(E=4, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=21)
    x = mk.x(cfg, 9, seed=22)
    tw, ti = mk.topk(9, 4, 2, seed=23)
    swapped = w.replace(w13=torch.cat([w.w13[:, 16:], w.w13[:, :16]], dim=1))
    a, b = reference_moe(x, w, tw, ti, cfg), reference_moe(x, swapped, tw, ti, cfg)
    assert rel_error(a, b) > 0.3
    assert rel_error(b, naive_for(swapped, x, tw, ti, cfg)) <= TOL32


def test_swigluoai_reads_interleaved_rows(mk):
    # de-interleaving w13 into halves and calling it silu-style must NOT give the same output
    cfg = mk.config(E=4, k=2, H=32, I=16, activation="swigluoai", dtype="float32", swigluoai_limit=0.7)
    w = mk.weights(cfg, seed=24)
    x = mk.x(cfg, 9, seed=25)
    tw, ti = mk.topk(9, 4, 2, seed=26)
    halves = w.replace(w13=torch.cat([w.w13[:, 0::2], w.w13[:, 1::2]], dim=1))
    assert rel_error(reference_moe(x, w, tw, ti, cfg), reference_moe(x, halves, tw, ti, cfg)) > 0.1


# ------------------------------------------------------------------------------ edges
def test_expert_without_tokens_is_never_read(mk):
    # expert 5 gets no token and its weights are NaN: the output must stay finite
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=31, poison_experts=(5,))
    x = mk.x(cfg, 20, seed=32)
    tw, ti = mk.topk(20, 8, 2, seed=33, exclude=(5,))
    ref = reference_moe(x, w, tw, ti, cfg)
    assert torch.isfinite(ref).all()
    assert rel_error(ref, naive_for(w, x, tw, ti, cfg)) <= TOL32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_tokens(mk, dtype):
    # T = 0: an empty [0, H] in x's dtype, no error
    cfg = mk.config(E=4, k=2, H=32, I=16, dtype=dtype)
    w = mk.weights(cfg, seed=41)
    x = torch.empty(0, 32, dtype=cfg.torch_dtype)
    out = reference_moe(x, w, torch.empty(0, 2), torch.empty(0, 2, dtype=torch.int32), cfg)
    assert out.shape == (0, 32) and out.dtype == cfg.torch_dtype


def test_one_token(mk):
    # T = 1, k = E (every expert used by the single token)
    cfg = mk.config(E=4, k=4, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=42)
    x = mk.x(cfg, 1, seed=43)
    tw, ti = mk.topk(1, 4, 4, seed=44)
    assert rel_error(reference_moe(x, w, tw, ti, cfg), naive_for(w, x, tw, ti, cfg)) <= TOL32


def test_bias(mk):
    cfg = mk.config(E=6, k=2, H=32, I=16, dtype="float32", has_bias=True)
    w = mk.weights(cfg, seed=51)
    x = mk.x(cfg, 10, seed=52)
    tw, ti = mk.topk(10, 6, 2, seed=53)
    ref = reference_moe(x, w, tw, ti, cfg)
    assert rel_error(ref, naive_for(w, x, tw, ti, cfg)) <= TOL32
    nobias = reference_moe(x, w.replace(w13_bias=None, w2_bias=None), tw, ti, cfg.replace(has_bias=False))
    assert rel_error(ref, nobias) > 0.05                  # the biases really were added


def test_bf16_output_dtype_and_accuracy(mk):
    # bf16 in, bf16 out; math in fp32 so the only error is the final bf16 rounding (2^-9)
    cfg = mk.config(E=4, k=2, H=32, I=16, dtype="bfloat16")
    w = mk.weights(cfg, seed=54)
    x = mk.x(cfg, 10, seed=55)
    tw, ti = mk.topk(10, 4, 2, seed=56)
    ref = reference_moe(x, w, tw, ti, cfg)
    assert ref.dtype == torch.bfloat16
    assert rel_error(ref, naive_for(w, x, tw, ti, cfg)) <= tolerance("bfloat16", "none")


@pytest.mark.parametrize("placement", ["linear", "round_robin"])
def test_expert_map_non_local_slots_contribute_nothing(mk, placement):
    # EP rank 1 of 2: linear owns experts 4..7, round robin 1, 3, 5, 7
    par = ParallelConfig(ep_size=2, ep_rank=1, placement=placement)
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32", parallel=par)
    local = par.local_experts(8)
    remote = [e for e in range(8) if e not in local]
    w = mk.weights(cfg, seed=61)                          # E_loc = 4 experts
    assert w.w13.shape[0] == 4
    x = mk.x(cfg, 12, seed=62)
    tw, ti = mk.topk(12, 8, 2, seed=63)
    ti[:3] = torch.tensor(remote[:2], dtype=torch.int32)  # tokens 0..2: both slots non-local
    ti[3] = torch.tensor([remote[0], local[1]], dtype=torch.int32)   # token 3: one of each
    ref = reference_moe(x, w, tw, ti, cfg)
    assert torch.equal(ref[:3], torch.zeros(3, 32))       # all non-local: exactly zero rows
    has_local = torch.isin(ti.long(), torch.tensor(local)).any(dim=1)   # [T]
    assert torch.equal(ref.abs().sum(dim=1) > 0, has_local)            # zero exactly where nothing is local
    assert rel_error(ref, naive_for(w, x, tw, ti, cfg)) <= TOL32
    # token 3 equals its local slot alone
    only_local = naive_for(w, x[3:4], tw[3:4, 1:], ti[3:4, 1:], cfg.replace(top_k=1))
    assert rel_error(ref[3:4], only_local) <= TOL32
    # an explicit map equals the config's
    assert torch.equal(reference_moe(x, w, tw, ti, cfg, expert_map=cfg.expert_map()), ref)


def test_non_finite_router_weight_of_a_non_local_slot_is_never_read(mk):
    # a slot whose expert is not local contributes nothing, whatever its router weight
    par = ParallelConfig(ep_size=2, ep_rank=0)
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32", parallel=par)
    w = mk.weights(cfg, seed=64)
    x = mk.x(cfg, 4, seed=65)
    tw, ti = mk.topk(4, 8, 2, seed=66)
    ti[0] = torch.tensor([6, 1], dtype=torch.int32)       # expert 6 lives on rank 1
    tw[0, 0] = float("nan")
    ref = reference_moe(x, w, tw, ti, cfg)
    assert torch.isfinite(ref).all()
    only_local = reference_moe(x[:1], w, tw[:1, 1:], ti[:1, 1:], cfg.replace(top_k=1))
    assert torch.equal(ref[:1], only_local)


def test_apply_router_weight_on_input(mk):
    # top-1 (Llama-4): x * w goes through the expert; the output is NOT weighted again
    cfg = mk.config(E=4, k=1, H=32, I=16, dtype="float32",
                    routing=Routing(apply_router_weight_on_input=True, renormalize=False))
    w = mk.weights(cfg, seed=71)
    x = mk.x(cfg, 10, seed=72)
    tw, ti = mk.topk(10, 4, 1, seed=73)                   # weights in [0.2, 1.2): not 1
    ref = reference_moe(x, w, tw, ti, cfg)
    assert rel_error(ref, naive_for(w, x, tw, ti, cfg)) <= TOL32
    on_output = reference_moe(x, w, tw, ti, cfg.replace(routing=Routing(renormalize=False)))
    assert rel_error(ref, on_output) > 0.05               # silu is not linear: the place matters
    pre = reference_moe(x * tw, w, tw, ti, cfg, input_prescaled=True)
    assert rel_error(pre, ref) <= TOL32                   # a prepare step may pre-scale x


@pytest.mark.parametrize("scheme", ["none", "fp8_block", "fp8_channel", "int8_channel", "int4_w4a16", "mxfp4"])
def test_nan_token_stays_in_its_row(mk, scheme):
    # a NaN in token 3 makes row 3 NaN (never hidden) and leaves the other rows untouched;
    # per-token / per-group / weight-only schemes keep the NaN inside its token
    cfg = mk.config(E=4, k=2, H=256, I=128, dtype="float32")
    w = mk.weights(cfg, scheme, seed=81)
    x = mk.x(cfg, 8, seed=82)
    x[3, 7] = float("nan")
    tw, ti = mk.topk(8, 4, 2, seed=83)
    out = reference_moe(x, w, tw, ti, cfg)
    assert torch.isnan(out[3]).all()
    keep = [0, 1, 2, 4, 5, 6, 7]
    assert torch.isfinite(out[keep]).all()
    clean = reference_moe(x[keep], w, tw[keep], ti[keep], cfg)
    assert rel_error(out[keep], clean) <= tolerance("float32", QuantScheme.parse(scheme).method)


def test_precomputed_dequantized_weights_are_used(mk):
    cfg = mk.config(E=4, k=2, H=256, I=128, dtype="float32")
    w = mk.weights(cfg, "int4_w4a16", seed=91)
    x = mk.x(cfg, 6, seed=92)
    tw, ti = mk.topk(6, 4, 2, seed=93)
    deq = dequantized_weights(w)
    assert torch.equal(reference_moe(x, w, tw, ti, cfg, dequantized=deq), reference_moe(x, w, tw, ti, cfg))
    # and they are what is used: zeroed weights give a zero output
    z = (torch.zeros_like(deq[0]), deq[1])
    assert torch.equal(reference_moe(x, w, tw, ti, cfg, dequantized=z), torch.zeros(6, 256))


# ------------------------------------------------------------------------------ schemes
SCHEMES = ["fp8_tensor", "fp8_tensor:static", "fp8_channel", "fp8_block", "fp8_block:pow2", "int8_channel",
           "int8_w8a16", "int8_w8a16:g64", "int8_w8a16:g128:zp", "int4_w4a16", "int4_w4a16:g32",
           "int4_w4a16:g64:zp", "fp8_w8a16", "nvfp4", "mxfp4"]

# Both sides fake-quantize the same fp32 GEMM inputs; the GEMM outputs differ only by
# fp32 summation order (~1e-7 relative), so an element rarely lands on the other side of an
# 8-bit / e2m1 rounding boundary (measured: 7e-7 worst, no flip on this data). One flip of
# one element among ~4000 moves the norm by ~1e-3, hence this bound rather than fp32's 1e-4;
# it is still >10x below the error of skipping the activation quantization (>=1.6e-2, int8)
# or of using the unquantized weights (>=1.05e-2, int8_w8a16), both checked below.
SCHEME_BOUND = 1e-3


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_equals_dequantized_with_fake_quant(mk, scheme):
    # E=6, H=256 (two 128-blocks), I=128; bias on; reference(quantized weights) ==
    # naive loop over dequantized weights with the scheme's activation fake-quant
    cfg = mk.config(E=6, k=2, H=256, I=128, dtype="float32", has_bias=True)
    q = QuantScheme.parse(scheme)
    w = mk.weights(cfg, q, seed=101)
    x = mk.x(cfg, 17, seed=102)
    tw, ti = mk.topk(17, 6, 2, seed=103)
    ref = reference_moe(x, w, tw, ti, cfg)

    def fq(t, _s=[w.a13_scale, w.a2_scale]):
        # static fp8_tensor: GEMM1 uses a13_scale, GEMM2 a2_scale (called in that order)
        return fake_quant_activation(t, q, static_scale=_s.pop(0) if q.static_activation_scale else None)

    naive = naive_for(w, x, tw, ti, cfg, fq=fq, dtype=torch.float32)
    assert rel_error(ref, naive) <= SCHEME_BOUND
    plain = naive_for(w, x, tw, ti, cfg, dtype=torch.float32)       # no activation quantization
    if q.method.quantizes_activations:
        assert rel_error(ref, plain) > 10 * SCHEME_BOUND            # the fake-quant is really there
    else:
        assert rel_error(ref, plain) <= SCHEME_BOUND                # weight-only: 16-bit activations
    # and the weights really are quantized: far from the float weights they came from
    w13f, w2f, b13, b2 = mk.float_weights(cfg, seed=101)
    assert rel_error(ref, naive_moe(x, w13f, w2f, tw, ti, cfg, b13, b2)) > 10 * SCHEME_BOUND


@pytest.mark.parametrize("scheme", ["fp8_channel", "fp8_block", "int8_channel", "fp8_tensor"])
def test_quantize_activations_false_is_the_dequantized_weights_in_full_precision(mk, scheme):
    # quantize_activations=False (what the triton decode path computes for W8A8 by default):
    # the scheme's 8-bit weights, dequantized, against unquantized x and h; it must differ
    # from the W8A8 result by about the activation rounding (not be the same computation)
    cfg = mk.config(E=6, k=2, H=256, I=128, dtype="float32")
    w = mk.weights(cfg, scheme, seed=61)
    x = mk.x(cfg, 9, seed=62)
    tw, ti = mk.topk(9, 6, 2, seed=63)
    a16 = reference_moe(x, w, tw, ti, cfg, quantize_activations=False)
    w13, w2 = dequantized_weights(w)
    dense = w.replace(w13=w13, w2=w2, w13_scale=None, w2_scale=None, a13_scale=None, a2_scale=None,
                      scheme=QuantScheme())
    assert rel_error(a16, reference_moe(x, dense, tw, ti, cfg)) <= TOL32
    assert rel_error(a16, reference_moe(x, w, tw, ti, cfg)) > 1e-3


# ------------------------------------------------------------------------------ moe_ref
MOE_REF_ACTS = [("silu", {}), ("silu", {"swiglu_limit": 0.6}), ("gelu_tanh", {}),
                ("swigluoai", {"swigluoai_limit": 0.6, "swigluoai_alpha": 1.2}), ("relu2_no_mul", {})]


@pytest.mark.parametrize("act,kw", MOE_REF_ACTS, ids=[a + ("+" + "+".join(kw) if kw else "") for a, kw in MOE_REF_ACTS])
@pytest.mark.parametrize("ep", [False, True])
def test_moe_ref_matches_naive(mk, act, kw, ep):
    # moe_ref is the kernel tests' entry to the same reference, over raw weight tensors in the
    # kernels' conventions: gate / up halves for every gated activation (swigluoai too, whose
    # checkpoints interleave), ids out of range or not local dropped
    par = {"parallel": ParallelConfig(ep_size=2, ep_rank=1)} if ep else {}
    cfg = mk.config(E=6, k=2, H=40, I=24, activation=act, dtype="float32", **kw, **par)
    w = mk.weights(cfg, seed=71)
    x = mk.x(cfg, 13, seed=72)
    tw, ti = mk.topk(13, 6, 2, seed=73)
    ti[0, 1] = 6                                          # out of range: dropped by moe_ref
    w13, b13 = w.w13, w.w13_bias
    if act == "swigluoai":                                # interleaved rows -> halves
        w13 = torch.cat([w13[:, 0::2], w13[:, 1::2]], dim=1)
        b13 = None if b13 is None else torch.cat([b13[:, 0::2], b13[:, 1::2]], dim=1)
    ref = moe_ref(x, w13, w.w2, tw, ti, act, expert_map=cfg.expert_map(), w13_bias=b13, w2_bias=w.w2_bias,
                  swiglu_limit=cfg.swiglu_limit, alpha=cfg.swigluoai_alpha, limit=cfg.swigluoai_limit)
    assert ref.dtype == torch.float32
    assert rel_error(ref, naive_for(w, x, tw, ti, cfg)) <= TOL32


def test_moe_ref_round_h_to_rounds_the_intermediate(mk):
    cfg = mk.config(E=4, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=74)
    x = mk.x(cfg, 9, seed=75)
    tw, ti = mk.topk(9, 4, 2, seed=76)
    plain = moe_ref(x, w.w13, w.w2, tw, ti)
    assert torch.equal(moe_ref(x, w.w13, w.w2, tw, ti, round_h_to=torch.float32), plain)
    assert 1e-5 < rel_error(moe_ref(x, w.w13, w.w2, tw, ti, round_h_to=torch.bfloat16), plain) < 1e-2
