"""Conformance: every registered backend against reference_moe, within
fusedmoe.tolerances.tolerance(dtype, scheme), on the schemes and activations it declares.

The matrix is cut to fit the CPU budget (the Triton backend runs under TRITON_INTERPRET=1
here, ~0.5 s a call):
  - every (backend, declared scheme) at T=64, in float32 and bfloat16;
  - every activation, routing method, bias and expert_map once per backend (T=33, fp32);
  - the full token sweep T in {0, 1, 7, 64, 300} for 'none' and fp8_block, with one expert
    that gets no token AND has NaN weights (a backend that reads it shows NaN).
Backends that are not registered, or that cannot run on this machine, are skipped with the
reasons their spec gives; the CPU backends (torch_ref, grouped_mm, emulation) must run on a CPU.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate.
"""
from __future__ import annotations

import json
import types

import pytest
import torch

from fusedmoe.backends.registry import registered
from fusedmoe.config import MoEConfig, ParallelConfig, QuantScheme, Routing
from fusedmoe.layer import platform_for, prepare_experts
from fusedmoe.modular.interfaces import ActivationFormat
from fusedmoe.platform import Platform
from fusedmoe.reference.moe import reference_moe
from fusedmoe.reference.routing import route
from fusedmoe.tolerances import rel_error, tolerance

SPECS = registered()
CPU_BACKENDS = ("torch_ref", "grouped_mm", "emulation")   # must run on any machine
# ... except these declared (backend, scheme) pairs, whose kernels exist on CUDA only
# (torch._scaled_grouped_mm: sm90; tests/test_grouped_mm_fp8.py covers them)
CUDA_ONLY = {("grouped_mm", "fp8_channel")}
# registered now, plus the Triton backends named by the design (skipped if absent)
BACKENDS = list(SPECS) + [n for n in ("triton", "triton_batched") if n not in SPECS]

SCHEMES = ["none", "fp8_tensor", "fp8_tensor:static", "fp8_channel", "fp8_block", "int8_channel", "int8_w8a16",
           "int8_w8a16:g128:zp", "int4_w4a16", "int4_w4a16:g64:zp", "fp8_w8a16", "nvfp4", "mxfp4"]


def declared(backend: str, scheme: str) -> bool:
    spec = SPECS.get(backend)
    return spec is None or QuantScheme.parse(scheme).method in spec.quant_methods


def pairs():
    out = []
    for b in BACKENDS:
        schemes = [s for s in SCHEMES if declared(b, s)]
        out += [(b, s) for s in (schemes if b in SPECS else ["none"])]
    return out


def base_scheme(backend: str) -> str:
    """The scheme a backend's activation / routing / feature tests use: 16-bit if it can."""
    spec = SPECS.get(backend)
    if spec is None or QuantScheme().method in spec.quant_methods:
        return "none"
    return "fp8_channel"                                   # emulation: per-token act quant


def build(backend: str, cfg: MoEConfig, weights, max_num_tokens: int = 64):
    """prepare_experts for ``backend`` on this machine, or skip saying why it cannot run."""
    if backend not in SPECS:
        pytest.skip(f"backend {backend!r} is not registered in this build")
    spec = SPECS[backend]
    fmt = ActivationFormat.STANDARD if ActivationFormat.STANDARD in spec.formats else ActivationFormat.BATCHED
    # the platform of the weights' device, as prepare_experts sees it (CPU tensors on a CUDA
    # machine: the CPU, where Triton needs the interpreter)
    plat = platform_for(weights.device)
    reasons = spec.evaluate(cfg, weights.scheme, plat, fmt=fmt)
    if reasons:
        why = "; ".join(str(r) for r in reasons)
        # the CPU backends must run on a CPU; on CUDA their specs may decline (grouped_mm
        # there takes bfloat16 only: torch._grouped_mm), and the reason is the skip message
        if (plat.kind == "cpu" and backend in CPU_BACKENDS
                and (backend, weights.scheme.method.value) not in CUDA_ONLY):
            pytest.fail(f"{backend} must run on this machine but says: {why}")
        pytest.skip(f"{backend} cannot run here ({plat.kind}, {cfg.dtype}): {why}")
    pe = prepare_experts(cfg, weights, backend, fmt=fmt, max_num_tokens=max_num_tokens)
    assert pe.selection.winner == backend
    return pe


def check(pe, cfg, weights, x, logits, bias=None):
    """Route with the reference router, run the backend, compare to reference_moe."""
    res = route(logits, cfg.top_k, cfg.routing, bias)
    tw, ti = res.topk_weights, res.topk_ids
    out = pe(x, tw, ti)
    qa = pe.quantizes_activations(x.shape[0])     # triton's decode keeps W8A8 activations 16-bit
    ref = reference_moe(x, weights, tw, ti, cfg, quantize_activations=qa,
                        h_group=pe.h_group(x.shape[0]))       # triton's fp8_channel h groups
    assert out.shape == x.shape and out.dtype == x.dtype
    tol = tolerance(cfg.dtype, weights.scheme.method if qa else "none")
    err = rel_error(out, ref)
    assert err <= tol, f"rel error {err:.3e} > {tol:.0e}"
    return out, ref


def plan_env(monkeypatch, **forced):
    """FUSEDMOE_PLAN with these keys (fusedmoe/plan.py PlanOverride), read by the next backend built."""
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps(forced))


# ------------------------------------------------------------------------------ schemes
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend,scheme", pairs(), ids=[f"{b}-{s}" for b, s in pairs()])
def test_every_declared_scheme(mk, backend, scheme, dtype):
    # E=8, k=2, H=256 (two 128-blocks), I=128, T=64; DeepSeek-like shapes scaled down
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype=dtype)
    w = mk.weights(cfg, scheme, seed=1)
    pe = build(backend, cfg, w)
    check(pe, cfg, w, mk.x(cfg, 64, seed=2), mk.logits(cfg, 64, seed=3))


def test_cpu_backends_serve_everything_they_declare():
    # the skip in build() never hides a CPU backend: each serves its declared schemes here
    plat = platform_for(torch.device("cpu"))     # (on a CUDA machine too: CPU tensors)
    for name in CPU_BACKENDS:
        spec = SPECS[name]
        for s in SCHEMES:
            if QuantScheme.parse(s).method in spec.quant_methods and (name, s) not in CUDA_ONLY:
                for dt in ("float32", "bfloat16"):
                    assert spec.evaluate(MoEConfig(8, 2, 256, 128, dtype=dt), QuantScheme.parse(s), plat) == [], \
                        (name, s, dt)


# ------------------------------------------------------------------------------ activations
ACTS = [
    ("silu", {}), ("silu", {"swiglu_limit": 0.6}),            # the clamp is active on O(1) data
    ("gelu", {}), ("gelu_tanh", {}),
    ("swigluoai", {}), ("swigluoai", {"swigluoai_limit": 0.6}),   # interleaved rows; limit active
    ("relu2_no_mul", {}), ("silu_no_mul", {}), ("gelu_no_mul", {}),
]


@pytest.mark.parametrize("act,kw", ACTS, ids=[a + ("+limit" if kw else "") for a, kw in ACTS])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_activation(mk, backend, act, kw):
    cfg = mk.config(E=8, k=2, H=128, I=128, dtype="float32", activation=act, **kw)
    spec = SPECS.get(backend)
    if spec is not None and cfg.activation not in spec.activations:
        pytest.skip(f"{backend} does not declare activation {act}")
    w = mk.weights(cfg, base_scheme(backend), seed=4)
    pe = build(backend, cfg, w)
    check(pe, cfg, w, mk.x(cfg, 33, seed=5), mk.logits(cfg, 33, seed=6))


# ------------------------------------------------------------------------------ routing + features
ROUTINGS = {
    "softmax_renorm": (2, Routing()),
    "softmax_no_renorm": (2, Routing(renormalize=False)),
    # DeepSeek-V3: sigmoid + correction bias + 4 groups keep 2 + scaling 2.5
    "sigmoid_bias_groups": (2, Routing(scoring="sigmoid", num_groups=4, topk_groups=2, has_correction_bias=True,
                                       routed_scaling_factor=2.5)),
    # Llama-4: top-1 sigmoid, weight applied on the input
    "top1_on_input": (1, Routing(scoring="sigmoid", renormalize=False, apply_router_weight_on_input=True)),
}


@pytest.mark.parametrize("rname", list(ROUTINGS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_routing_methods(mk, backend, rname):
    k, routing = ROUTINGS[rname]
    cfg = mk.config(E=8, k=k, H=128, I=128, dtype="float32", routing=routing)
    w = mk.weights(cfg, base_scheme(backend), seed=7)
    pe = build(backend, cfg, w)
    bias = torch.randn(8, generator=torch.Generator().manual_seed(8)) * 0.5 if routing.has_correction_bias else None
    check(pe, cfg, w, mk.x(cfg, 33, seed=9), mk.logits(cfg, 33, seed=10), bias)


FEATURES = {
    "bias": dict(has_bias=True),
    "ep_linear": dict(parallel=ParallelConfig(ep_size=2, ep_rank=1)),                   # local 4..7
    "ep_round_robin": dict(parallel=ParallelConfig(ep_size=4, ep_rank=2, placement="round_robin")),  # 2, 6
    "bias_ep": dict(has_bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=0)),
}


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_and_expert_map(mk, backend, feature):
    cfg = mk.config(E=8, k=2, H=128, I=128, dtype="float32", **FEATURES[feature])
    w = mk.weights(cfg, base_scheme(backend), seed=11)
    pe = build(backend, cfg, w)
    out, ref = check(pe, cfg, w, mk.x(cfg, 33, seed=12), mk.logits(cfg, 33, seed=13))
    if cfg.parallel.use_ep:
        # tokens whose k experts all live elsewhere come out as exact zeros
        res = route(mk.logits(cfg, 33, seed=13), 2, cfg.routing)
        remote = (cfg.expert_map()[res.topk_ids.long()] < 0).all(dim=1)
        assert torch.equal(out[remote], torch.zeros_like(out[remote]))


# ------------------------------------------------------------------------------ token sweep
@pytest.mark.parametrize("T", [0, 1, 7, 64, 300])           # empty, decode, < a block, prefill-ish
@pytest.mark.parametrize("scheme", ["none", "fp8_block"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_token_sweep_with_an_idle_poisoned_expert(mk, backend, scheme, T):
    if not declared(backend, scheme):
        pytest.skip(f"{backend} does not declare {scheme}")
    # expert 5 is never routed to and its weights are NaN: reading it would show
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="float32")
    w = mk.weights(cfg, scheme, seed=14, poison_experts=(5,))
    pe = build(backend, cfg, w, max_num_tokens=max(T, 1))
    out, _ = check(pe, cfg, w, mk.x(cfg, T, seed=15), mk.logits(cfg, T, seed=16, unused_experts=(5,)))
    assert out.shape == (T, 256)
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------------------ triton's decode path
TRITON_SCHEMES = ["none", "fp8_tensor", "fp8_tensor:static", "fp8_channel", "fp8_block", "int8_channel"]


@pytest.mark.parametrize("mode", ["a16", "a8", "tc", "auto", "tc_share"])
@pytest.mark.parametrize("feature", ["plain", "bias_ep"])
@pytest.mark.parametrize("scheme", TRITON_SCHEMES)
def test_triton_decode_path_every_scheme(mk, monkeypatch, scheme, feature, mode):
    # the token sweep above reaches the decode kernels only at T=1 (and in none / fp8_block);
    # raise the pair bound so T=7 (14 pairs) takes them for every scheme triton declares,
    # with biases and an expert_map (tokens with no local expert must come out as zeros)
    # (on a CUDA machine it runs there: Triton on CPU needs the interpreter). W8A8 schemes
    # both ways: a16 (default: 16-bit activations, checked against the reference without
    # activation quantization at the 16-bit bound), a8 (x and h quantized as the scheme does)
    # and tc (as a8, the GEMMs on the tensor cores: kernels/decode_tc.py)
    # (tc_share: tc with the expert-shared GEMMs forced on, kernels/decode_tc.py SHARE: the
    # table launch bound into the plan, called twice so the bound fast path runs too)
    if scheme == "none" and mode != "a16":
        pytest.skip("16-bit weights: w8a8_decode does not apply")
    share = mode == "tc_share"
    mode = "tc" if share else mode
    a16 = mode == "a16"
    plan_env(monkeypatch, decode_pairs=16, w8a8_decode=mode, **({"decode_share": True} if share else {}))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(has_bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=1)) if feature == "bias_ep" else {}
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="float32", **kw)
    w = mk.weights(cfg, scheme, seed=21).to(dev)
    pe = build("triton", cfg, w)
    assert pe.kernel.experts.decode_pairs == 16
    ex = pe.kernel.experts
    assert ex.plan(7).tc == (mode in ("tc", "auto") and scheme != "none")
    assert pe.quantizes_activations(7) == (scheme != "none" and not a16)
    assert pe.quantizes_activations(9) == (scheme != "none")               # 18 pairs: grouped path
    # auto: one token in a16 math, fp8_block two, fp8_channel three (the fastest on the H100,
    # plan.DeviceFacts.a16_max_t), more on the tensor cores
    from fusedmoe.plan import DEFAULT_DEVICE, a16_max_t, device_facts
    from fusedmoe.platform import Platform
    assert a16_max_t(w.scheme, DEFAULT_DEVICE) == {"fp8_block": 2, "fp8_channel": 3}.get(scheme, 1)   # unknown GPU
    assert a16_max_t(w.scheme, device_facts(Platform.preset("h100"))) == a16_max_t(w.scheme, DEFAULT_DEVICE)
    h200 = Platform("cuda", "NVIDIA H200", (9, 0), 140.0, 132, True)
    assert a16_max_t(w.scheme, device_facts(h200)) == {"fp8_channel": 2}.get(scheme, 1)
    auto_a16 = a16_max_t(w.scheme, device_facts(ex.platform))           # this machine's
    assert ex.planner.a16_max_t == auto_a16
    for T in (1, 2, 3, 4):
        assert pe.quantizes_activations(T) == (scheme != "none" and (
            mode in ("a8", "tc") or (mode == "auto" and T > auto_a16))), T
    for T in (7, 1) if mode == "auto" else (7,):
        check(pe, cfg, w, mk.x(cfg, T, seed=22).to(dev), mk.logits(cfg, T, seed=23).to(dev))
    if share:
        plan = next(iter(ex._plans.values()))
        assert plan[4] is not None                              # the share table's bound launch
        check(pe, cfg, w, mk.x(cfg, 7, seed=24).to(dev), mk.logits(cfg, 7, seed=25).to(dev))


def test_triton_tc_decode_configs_know_the_device(mk, monkeypatch):
    # the tensor-core decode's tile rules may depend on the GPU: the plan hands tc_config its
    # platform's device facts (plan.DeviceFacts.tc_gemm1_block_groups, GEMM1's)
    from fusedmoe.kernels import decode_tc
    from fusedmoe.plan import DEVICES, Planner, PlanOverride, device_facts
    seen = []
    real = decode_tc.tc_config

    def spy(gemm, *a, **kw):
        if gemm == "gemm1":
            seen.append(kw.get("block_groups"))
        return real(gemm, *a, **kw)
    monkeypatch.setattr(decode_tc, "tc_config", spy)
    plan_env(monkeypatch, decode_pairs=16, w8a8_decode="tc")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="float32")
    w = mk.weights(cfg, "fp8_channel", seed=51).to(dev)
    pe = build("triton", cfg, w)
    check(pe, cfg, w, mk.x(cfg, 3, seed=52).to(dev), mk.logits(cfg, 3, seed=53).to(dev))
    assert seen and set(seen) == {device_facts(pe.kernel.experts.platform).tc_gemm1_block_groups}
    seen.clear()
    Planner(cfg, w.scheme, Platform.preset("h100"), forced=PlanOverride(decode_pairs=16, w8a8_decode="tc")).plan(3)
    assert seen == [DEVICES["H100"].tc_gemm1_block_groups] == [True]


@pytest.mark.parametrize("feature", ["plain", "bias_ep"])
def test_triton_fp8_block_rescale_through_the_layer(mk, feature):
    # fp8_block on the grouped path with RESCALE (block scales applied to the accumulator in
    # place) and with the per-group dot: both within the scheme's tolerance of the reference
    # and within fp32 rounding of each other; the selection report names the variant
    from fusedmoe.plan import _extras
    from fusedmoe.tuned_configs import override
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(has_bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=1)) if feature == "bias_ep" else {}
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="float32", **kw)
    w = mk.weights(cfg, "fp8_block", seed=41).to(dev)
    x, logits = mk.x(cfg, 21, seed=42).to(dev), mk.logits(cfg, 21, seed=43).to(dev)
    c = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=2, num_warps=4, num_stages=2)
    outs = []
    for rescale in (False, True):
        with override((dict(c, RESCALE=rescale), dict(c, RESCALE=rescale))):
            outs.append(check(build("triton", cfg, w), cfg, w, x, logits)[0])
    assert rel_error(outs[1], outs[0]) < 1e-5
    assert _extras(dict(c, RESCALE=True)).endswith(" rescale") and "rescale" not in _extras(c)


@pytest.mark.parametrize("feature", ["plain", "bias_ep"])
def test_triton_gemm2_a_resident_through_the_layer(mk, feature):
    # the A-resident GEMM2 (config A_RESIDENT, the deepseek-v3 tp8 prefill entry's) through
    # the layer: within fp32 rounding of the tiled GEMM2 and of the reference, with bias and
    # expert parallelism (non-local experts dropped); the selection report names the variant
    from fusedmoe.plan import _extras
    from fusedmoe.tuned_configs import override
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(has_bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=1)) if feature == "bias_ep" else {}
    cfg = mk.config(E=8, k=2, H=80, I=48, dtype="float32", **kw)       # K = 48: padded to 64 in the kernel
    w = mk.weights(cfg, "none", seed=44).to(dev)
    x, logits = mk.x(cfg, 37, seed=45).to(dev), mk.logits(cfg, 37, seed=46).to(dev)
    c = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=2)
    outs = []
    for c2 in (c, dict(c, A_RESIDENT=2)):                               # 80 columns: 2 groups of 2 x 32
        with override((c, c2)):
            outs.append(check(build("triton", cfg, w), cfg, w, x, logits)[0])
    assert rel_error(outs[1], outs[0]) < 1e-5
    assert " A-resident x2" in _extras(dict(c, A_RESIDENT=2)) and "resident" not in _extras(c)


def test_selection_report_names_one_dot_and_half_tail():
    # the selection report's config extras name GU_ONE_DOT and HALF_TAIL where a config has them
    from fusedmoe.plan import _extras
    c = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64)
    assert _extras(c) == ""
    assert _extras(dict(c, USE_TMA=True, GU_ONE_DOT=True)) == " tma one-dot"
    assert _extras(dict(c, HALF_TAIL=True)) == " half-tail"
    assert _extras(dict(c, GU_ONE_DOT=False, HALF_TAIL=False)) == ""


@pytest.mark.parametrize("rescale", [False, True])
@pytest.mark.parametrize("scheme", ["fp8_block", "fp8_channel"])
def test_triton_grouped_nan_token_stays_in_its_row(mk, scheme, rescale):
    # grouped path: a NaN in token 3 makes output row 3 NaN (its activation scales are NaN:
    # never a finite garbage row) and leaves the other rows as a clean run gives them
    from fusedmoe.tuned_configs import override
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="float32")
    w = mk.weights(cfg, scheme, seed=51).to(dev)
    x = mk.x(cfg, 21, seed=52).to(dev)
    x[3, 7] = float("nan")
    res = route(mk.logits(cfg, 21, seed=53).to(dev), cfg.top_k, cfg.routing)
    c = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=2, num_warps=4, num_stages=2,
             RESCALE=rescale)
    keep = [i for i in range(21) if i != 3]
    with override((c, c)):
        pe = build("triton", cfg, w)
        out = pe(x, res.topk_weights, res.topk_ids)
        clean = pe(x[keep], res.topk_weights[keep], res.topk_ids[keep])
    assert torch.isnan(out[3]).all()
    assert torch.isfinite(out[keep]).all() and torch.equal(out[keep], clean)


@pytest.mark.parametrize("scheme,I_", [("fp8_block", 128), ("fp8_channel", 192)])
def test_triton_h_quantized_in_gemm1_epilogue(mk, monkeypatch, scheme, I_):
    # FUSEDMOE_PLAN h_quant: 'epilogue' (GEMM1 writes fp8 h in 1 x g groups, no requantization
    # kernel) and 'kernel' (16-bit h, then the scheme's quantizer) both match the reference of
    # the math they do: fp8_block's own 1 x 128 rule either way; fp8_channel per-token with
    # 'kernel', 1 x 128 groups with 'epilogue' (I = 192: a partial second group, wrapped tile
    # columns). A NaN token stays in its row. The report names the epilogue quantization.
    from fusedmoe.backends.triton import _variants
    from fusedmoe.tuned_configs import override
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = mk.config(E=8, k=2, H=256, I=I_, dtype="float32")
    w = mk.weights(cfg, scheme, seed=61).to(dev)
    x, logits = mk.x(cfg, 23, seed=62).to(dev), mk.logits(cfg, 23, seed=63).to(dev)
    c1 = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=2, num_warps=4, num_stages=2)
    c2 = dict(c1, BLOCK_SIZE_N=32)
    outs = {}
    for mode in ("kernel", "epilogue"):
        plan_env(monkeypatch, h_quant=mode)
        with override((c1, c2)):
            pe = build("triton", cfg, w)
            g = pe.kernel.experts.plan(23).h_group
            assert g == (128 if mode == "epilogue" else 0)  # (kernel: the default)
            assert pe.h_group(23) == (128 if mode == "epilogue" and scheme == "fp8_channel" else None)
            outs[mode] = check(pe, cfg, w, x, logits)[0]
            xn = x.clone()
            xn[3, 7] = float("nan")
            res = route(logits, cfg.top_k, cfg.routing)
            out = pe(xn, res.topk_weights, res.topk_ids)
            assert torch.isnan(out[3]).all() and torch.isfinite(out[torch.arange(23) != 3]).all()
    # 'epilogue' quantizes the fp32 tile, 'kernel' its 16-bit store: a few fp8 codes differ
    assert rel_error(outs["epilogue"], outs["kernel"]) < (2e-2 if scheme == "fp8_block" else 6e-2)
    with override((c1, c2)):
        line = _variants(cfg, w.scheme, Platform.current())["T=1024"]
    assert "h quantized in GEMM1's epilogue (fp8, 1 x 128 groups" in line
    assert ("finer than the scheme's per-token rule" in line) == (scheme == "fp8_channel")
    from fusedmoe import plan
    monkeypatch.delenv("FUSEDMOE_PLAN")
    assert plan.override().h_quant == ""                   # unset: the default per scheme
    with override((c1, c2)):
        pe = build("triton", cfg, w)
        assert pe.kernel.experts.plan(23).h_group == (128 if scheme == "fp8_block" else 0)
    plan_env(monkeypatch, h_quant="fast")
    with pytest.raises(ValueError, match=r"FUSEDMOE_PLAN\['h_quant'\]='fast'.*accepted: kernel, epilogue"):
        build("triton", cfg, w)


@pytest.mark.parametrize("scheme", ["none", "fp8_channel"])
def test_triton_reduce_modes(mk, monkeypatch, scheme):
    # FUSEDMOE_PLAN reduce: how the grouped GEMM2 sums a token's k slots when the caller did not ask
    # for determinism ('atomic_out': atomic adds into the output itself, no y, no reduce
    # kernel); deterministic=True keeps the fixed-order reduce whatever it says. Every mode
    # matches the reference (T = 64, k = 2: the grouped path); the report names the mode.
    from fusedmoe.backends.triton import _variants
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="bfloat16" if cuda else "float16")
    w = mk.weights(cfg, scheme, seed=71).to(dev)
    x, logits = mk.x(cfg, 64, seed=72).to(dev), mk.logits(cfg, 64, seed=73).to(dev)
    outs = {}
    for mode in ("deterministic", "atomic_out", "atomic"):
        plan_env(monkeypatch, reduce=mode)
        for det in (False, True):
            pe = prepare_experts(cfg, w, "triton", deterministic=det)
            assert pe.kernel.experts.plan(64).reduce == ("deterministic" if det else mode)
            out = check(pe, cfg, w, x, logits)[0]
            if not det:
                outs[mode] = out
        line = _variants(cfg, w.scheme, Platform.current())["T=1024"]
        assert (f"FUSEDMOE_PLAN reduce={mode}" in line) == (mode != "deterministic")
    # the k-sum rounded once (deterministic, atomic via fp32) or per slot (atomic_out)
    assert rel_error(outs["atomic"], outs["deterministic"]) < 1e-2
    assert rel_error(outs["atomic_out"], outs["deterministic"]) < 1e-2
    plan_env(monkeypatch, reduce="fast")
    with pytest.raises(ValueError, match=r"FUSEDMOE_PLAN\['reduce'\]='fast'.*accepted: deterministic, atomic, "):
        prepare_experts(cfg, w, "triton")


def test_zero_in_gemm1_rule(monkeypatch):
    # who zeroes an atomic k-sum's output (LaunchPlan.zero): GEMM1 on the side above
    # plan.ZERO_IN_GEMM1_MIN elements, else the quantization of x / a fill ahead of the alignment
    from fusedmoe import plan
    from fusedmoe.presets import get_preset
    h100, forced = Platform.preset("h100"), plan.PlanOverride(reduce="atomic_out")

    def zero(cfg, T):
        return plan.Planner(cfg, QuantScheme(), h100, forced=forced).plan(T).zero
    qw, ds = get_preset("qwen3-30b-a3b").to_config(), get_preset("deepseek-v3").to_config(tp=8)
    assert zero(qw, 16384) == "early"                  # qwen3 T=16384: the quantizer / fill zeroes
    assert zero(ds, 16384) == "gemm1"                  # deepseek-v3 T=16384: GEMM1 does
    monkeypatch.setattr(plan, "ZERO_IN_GEMM1_MIN", 1 << 62)
    assert zero(ds, 16384) == "early"


@pytest.mark.parametrize("scheme", ["none", "fp8_tensor", "fp8_tensor:static", "fp8_channel", "fp8_block",
                                    "int8_channel"])
@pytest.mark.parametrize("zero", ["gemm1", "early", "gemm2"])
def test_triton_atomic_out_zeroes_a_dirty_output(mk, monkeypatch, scheme, zero):
    # the atomic k-sum adds into the output, so something must zero it first: GEMM1 on the side
    # (outputs above plan.ZERO_IN_GEMM1_MIN elements), or the quantization of x (W8A8) / a fill
    # ahead of the alignment (16-bit), else GEMM2 itself (an output that is not [T, H] rows of
    # unit stride: here a column-major one). The output buffer here is full of NaN and large
    # values before the call (a reused workspace, or the caller's rows): any row left unzeroed shows.
    from fusedmoe import plan
    plan_env(monkeypatch, reduce="atomic_out")
    monkeypatch.setattr(plan, "ZERO_IN_GEMM1_MIN", 0 if zero == "gemm1" else 1 << 62)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="bfloat16" if cuda else "float16")
    w = mk.weights(cfg, scheme, seed=81).to(dev)
    T = 40                                                       # 80 pairs: the grouped path
    x, logits = mk.x(cfg, T, seed=82).to(dev), mk.logits(cfg, T, seed=83).to(dev)
    pe = prepare_experts(cfg, w, "triton")
    kern = pe.kernel
    assert kern.experts.plan(T).reduce == "atomic_out"
    assert kern.experts.plan(T).zero == ("gemm1" if zero == "gemm1" else "early")
    res = route(logits, cfg.top_k, cfg.routing)
    prep = kern.prepare_finalize.prepare(x, res.topk_weights, res.topk_ids, cfg, kern.experts, None)
    ws = kern.workspace_for(T, cfg.top_k, x.device)
    if zero == "gemm2":
        ws = dict(ws, out=torch.empty(cfg.hidden_size, T, dtype=cfg.torch_dtype, device=dev).t())
    ws["out"].fill_(float("nan"))
    ws["out"][::3] = 1e4
    out = kern.experts.apply(prep, ws, None)
    assert out.data_ptr() == ws["out"].data_ptr()
    ref = reference_moe(x, w, res.topk_weights, res.topk_ids, cfg,
                        quantize_activations=kern.experts.quantizes_activations(T))
    assert not out.isnan().any()
    assert rel_error(out, ref) <= tolerance(cfg.dtype, w.scheme.method)


def _small_triton(mk, scheme, seed):
    """(device, config E 8 k 2 H 256 I 128, weights, prepared triton experts): bf16 on CUDA,
    fp16 under the interpreter."""
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="bfloat16" if cuda else "float16")
    w = mk.weights(cfg, scheme, seed=seed).to(dev)
    return dev, cfg, w, prepare_experts(cfg, w, "triton")


def _set_launch_configs(ex, get):
    """Triton experts ``ex`` take their launch configs from ``get(T) -> (gemm1, gemm2)``."""
    ex.planner._lc = types.SimpleNamespace(get=get, describe=lambda: "test configs")
    ex.planner._plans.clear()


@pytest.mark.parametrize("scheme", ["none", "fp8_channel"])
def test_triton_gemm2_block_m_above_gemm1s(mk, scheme):
    # launch configs with GEMM2 tiling more rows than GEMM1 (BM 32 over 16): the tokens are
    # aligned to the larger (LaunchPlan.block_m), GEMM1 runs sub-blocks of the runs, not GEMM2
    # clamped to GEMM1's BM. Matches the reference; the workspace is sized for the larger block
    dev, cfg, w, pe = _small_triton(mk, scheme, 91)
    ex = pe.kernel.experts
    tiles = dict(BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2, SPLIT_K=1)
    _set_launch_configs(ex, lambda T: (dict(tiles, BLOCK_SIZE_M=16), dict(tiles, BLOCK_SIZE_M=32)))
    c1, c2 = ex.planner.configs(64)
    assert (c1["BLOCK_SIZE_M"], c2["BLOCK_SIZE_M"], ex.plan(64).block_m) == (16, 32, 32)
    ws = pe.kernel.workspace_for(64, cfg.top_k, dev)
    assert ws["expert_ids"].numel() * 32 == ws["sorted_ids"].numel()
    check(pe, cfg, w, mk.x(cfg, 64, seed=92).to(dev), mk.logits(cfg, 64, seed=93).to(dev))


@pytest.mark.parametrize("scheme", ["none", "fp8_channel"])
@pytest.mark.parametrize("tma", [False, True])
def test_triton_sorted_h(mk, scheme, tma):
    # GEMM2 config SORTED_H and GEMM1 config SORTED_X: on a 16-bit scheme the workspace's h has a
    # row per padded position and GEMM1 / GEMM2 write / read it in sorted order, and x is copied
    # to the sorted positions (workspace xs) for GEMM1; a W8A8 scheme ignores both keys (its x
    # and h are quantized per token / slot). Both match the reference; the report names them
    from fusedmoe.plan import _extras
    dev, cfg, w, pe = _small_triton(mk, scheme, 95)
    ex = pe.kernel.experts
    tiles = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
                 SPLIT_K=1, USE_TMA=tma)
    _set_launch_configs(ex, lambda T: (dict(tiles, SORTED_X=True), dict(tiles, SORTED_H=True)))
    ws = pe.kernel.workspace_for(64, cfg.top_k, dev)
    rows = ws["sorted_ids"].numel() if scheme == "none" else 64 * cfg.top_k
    assert tuple(ws["h"].shape) == (rows, cfg.intermediate_size)
    if scheme == "none":
        assert tuple(ws["xs"].shape) == (rows, cfg.hidden_size)
    else:
        assert "xs" not in ws
    assert _extras(dict(tiles, SORTED_H=True)).endswith(" sorted-h")
    assert _extras(dict(tiles, SORTED_X=True)).endswith(" sorted-x")
    check(pe, cfg, w, mk.x(cfg, 64, seed=96).to(dev), mk.logits(cfg, 64, seed=97).to(dev))


def test_triton_reduce_rule():
    # no reduce forced: atomic adds into the output where the H100 measured them faster
    # (CUDA, 16-bit output, >= 64 pairs a local expert, y up to 2^29 elements), else the
    # fixed-order reduce; the report says which, per bucket
    from fusedmoe.backends.triton import _variants
    from fusedmoe.plan import ATOMIC_OUT_MAX_Y, reduce_rule
    from fusedmoe.presets import get_preset
    h100, cpu = Platform.preset("h100"), Platform.preset("cpu")
    ds, qw = get_preset("deepseek-v3").to_config(tp=8), get_preset("qwen3-30b-a3b").to_config()
    assert 4096 * 8 * 7168 <= ATOMIC_OUT_MAX_Y < 16384 * 8 * 7168
    assert [reduce_rule(ds, h100, T) for T in (256, 4096, 16384)] == ["deterministic", "atomic_out", "deterministic"]
    assert [reduce_rule(qw, h100, T) for T in (1024, 16384)] == ["atomic_out", "atomic_out"]
    assert reduce_rule(qw, h100, 1023) == "deterministic"         # < 64 pairs a local expert
    assert reduce_rule(qw, cpu, 16384) == "deterministic"
    assert reduce_rule(get_preset("qwen3-30b-a3b").to_config(dtype="float32"), h100, 16384) == "deterministic"
    # past the y bound only with a GEMM2 config that walks the output in column bands (A-resident
    # BAND_MAJOR), as the shipped H100 deepseek T=4096 / 16384 entries do
    band = dict(A_RESIDENT=16, BAND_MAJOR=True)
    assert reduce_rule(ds, h100, 16384, band) == "atomic_out"
    assert reduce_rule(ds, h100, 16384, dict(band, A_RESIDENT=0)) == "deterministic"
    assert reduce_rule(ds, cpu, 16384, band) == "deterministic"
    for scheme in ("none", "fp8_block"):
        for T in ("T=4096", "T=16384"):
            line = _variants(ds, QuantScheme.parse(scheme), h100)[T]
            assert "column-band-major" in line and "atomic adds into the output" in line, (T, line)
    # the H200 files: banded at T=16384 (both schemes) and fp8_block's T=4096; bf16 T=4096 kept its
    # tiled GEMM2 (the bands lost there), atomic within the y bound all the same
    h200 = Platform.preset("h200")
    for scheme, T, banded in (("none", "T=16384", True), ("fp8_block", "T=16384", True),
                              ("fp8_block", "T=4096", True), ("none", "T=4096", False)):
        line = _variants(ds, QuantScheme.parse(scheme), h200)[T]
        assert ("column-band-major" in line) == banded and "atomic adds into the output" in line, (scheme, T, line)
    rep = _variants(qw, QuantScheme(), h100)
    assert "atomic adds into the output (measured faster here" in rep["T=16384"]
    assert "atomic" not in rep["T=256"] and "GEMM2 and the reduce" in rep["T=256"]
    # MASK_A by rule: padding rows masked up to 4 blocks of pairs an expert (grouped_gemm.mask_a_rule)
    assert "GEMM1 and GEMM2 padding rows load nothing" in rep["T=256"]
    assert "padding rows" not in rep["T=16384"]


def test_triton_decode_pair_bounds(monkeypatch):
    # the measured crossovers (plan.decode_pairs): 16-bit E/4; W8A8 with 16-bit
    # activations min(E/4, 32); W8A8 quantized (a8) E/16; tensor cores (tc, auto) min(E/2, 128)
    # from 64 experts, E/4 below; never below k
    from fusedmoe.plan import Planner, decode_pairs
    for (E, k), want in {(128, 8): (32, 32, 8, 64, 64), (256, 8): (64, 32, 16, 128, 128),
                         (8, 2): (2, 2, 2, 2, 2), (512, 8): (128, 32, 32, 128, 128)}.items():
        cfg = MoEConfig(E, k, 256, 128)
        assert tuple(decode_pairs(cfg, m) for m in ("16bit", "a16", "a8", "tc", "auto")) == want, (E, k)
    assert decode_pairs(MoEConfig(128, 8, 256, 128), "a16", forced=5) == 5
    plan_env(monkeypatch, decode_pairs=5, w8a8_decode="a16")
    fp8 = QuantScheme.parse("fp8_channel")
    assert Planner(MoEConfig(128, 8, 256, 128), fp8, Platform.preset("h100")).decode_pairs == 5


# ------------------------------------------------------------------------------ strided inputs
@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs(mk, backend):
    # x, topk_weights and topk_ids as column slices of wider tensors (row stride != width),
    # as a caller slicing a fused buffer would pass them
    cfg = mk.config(E=8, k=2, H=128, I=128, dtype="float32")
    w = mk.weights(cfg, base_scheme(backend), seed=17)
    pe = build(backend, cfg, w)
    wide = mk.x(cfg.replace(hidden_size=200), 21, seed=18)
    x = wide[:, 10:138]                                               # [21, 128], stride (200, 1)
    tw4, ti4 = mk.topk(21, 8, 4, seed=19)
    tw, ti = tw4[:, 1:3], ti4[:, 1:3]                                 # [21, 2], stride (4, 1)
    assert not (x.is_contiguous() or tw.is_contiguous() or ti.is_contiguous())
    ref = reference_moe(x.contiguous(), w, tw.contiguous(), ti.contiguous(), cfg)
    assert rel_error(pe(x, tw, ti), ref) <= tolerance("float32", w.scheme.method)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("backend,scheme", pairs(), ids=[f"{b}-{s}" for b, s in pairs()])
def test_every_declared_scheme_cuda_bf16(mk, backend, scheme):
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="bfloat16")
    w = mk.weights(cfg, scheme, seed=1).to("cuda")
    if backend not in SPECS:
        pytest.skip(f"backend {backend!r} is not registered in this build")
    reasons = SPECS[backend].evaluate(cfg, w.scheme, Platform.current())
    if reasons:
        pytest.skip("; ".join(map(str, reasons)))
    pe = prepare_experts(cfg, w, backend)
    x = mk.x(cfg, 64, seed=2).cuda()
    res = route(mk.logits(cfg, 64, seed=3).cuda(), 2, cfg.routing)
    out = pe(x, res.topk_weights, res.topk_ids)
    ref = reference_moe(x, w, res.topk_weights, res.topk_ids, cfg)
    assert rel_error(out, ref) <= tolerance("bfloat16", w.scheme.method)
