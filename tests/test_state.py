"""Derived state: what a layer derives from its weights and keeps between calls follows the
weights, and its per-call buffers are never shared between threads.

- load_state_dict (copying and ``assign=True``) and in-place updates of the weights reach the
  computation on every backend and scheme (torch_ref and emulation keep dequantized copies;
  fused_experts keeps a prepared kernel per weights);
- ``PreparedExperts.quantizes_activations(T)`` / ``h_group(T)`` answer for the chunks a call of
  T tokens actually runs (FUSEDMOE_CHUNK_SIZE);
- one module called from two threads gives each call its own workspaces;
- a layer survives pickle / torch.save / deepcopy and computes the same outputs;
- deterministic layers give equal bits on repeated calls and across a state-dict copy.

On CPU the Triton backend runs under the interpreter (small shapes, float16 / float32); the
``gpu`` tests run the same checks with the triton backend on CUDA in bfloat16.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate.
"""
from __future__ import annotations

import copy
import io
import json
import pickle
import threading

import pytest
import torch

from fusedmoe.backends.registry import registered
from fusedmoe.config import MoEConfig, QuantScheme
from fusedmoe.errors import ConfigError, InputError
from fusedmoe.layer import FusedMoE, fused_experts, platform_for, prepare_experts
from fusedmoe.quantize import quantize_experts
from fusedmoe.reference.moe import reference_moe
from fusedmoe.reference.routing import route
from fusedmoe.tolerances import rel_error, tolerance

SPECS = registered()

# the schemes of tests/test_backends.py; H = I = 128 fits every group (int4's default is 128)
SCHEMES = ["none", "fp8_tensor", "fp8_tensor:static", "fp8_channel", "fp8_block", "int8_channel", "int8_w8a16",
           "int8_w8a16:g64:zp", "int4_w4a16", "int4_w4a16:g64:zp", "fp8_w8a16", "nvfp4", "mxfp4"]
CPU_BACKENDS = ("torch_ref", "grouped_mm", "emulation")
# the Triton backend under the interpreter: a few schemes, tiny shapes (~0.5 s a call)
TRITON_SCHEMES = ["none", "fp8_channel", "int8_channel", "fp8_block"]


def _cfg(dtype="float32", H=128, I=128, **kw):
    return MoEConfig(8, 2, H, I, dtype=dtype, **kw)


def _weights(cfg, scheme, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    E, N, H, I = cfg.num_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    w13 = (torch.randn(E, N, H, generator=g) / H ** 0.5).to(device, cfg.torch_dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(device, cfg.torch_dtype)
    q = QuantScheme.parse(scheme)
    kw = dict(a13_scale=4.0 / 448, a2_scale=4.0 / 448) if q.static_activation_scale else {}
    return quantize_experts(w13, w2, q, **kw)


def _inputs(cfg, T, seed=7, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, cfg.hidden_size, generator=g).to(device, cfg.torch_dtype)
    return x, torch.randn(T, cfg.num_experts, generator=g).to(device)


def _runs(backend, cfg, scheme, device="cpu"):
    """Skip unless ``backend`` serves (cfg, scheme) on ``device`` here."""
    spec = SPECS.get(backend)
    if spec is None:
        pytest.skip(f"{backend} is not registered")
    reasons = spec.evaluate(cfg, QuantScheme.parse(scheme), platform_for(torch.device(device)))
    if reasons:
        if backend in CPU_BACKENDS and device == "cpu" and not (backend == "grouped_mm" and scheme != "none"):
            pytest.fail(f"{backend} must run {scheme} on a CPU: {'; '.join(map(str, reasons))}")
        pytest.skip(f"{backend} cannot run {scheme} here: {'; '.join(map(str, reasons))}")


def _decode(monkeypatch):
    """The triton backend's decode kernels (bound launches kept per shape) for T*k <= 16,
    also under the interpreter."""
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"decode_pairs": 16}))


def _cases():
    out = []
    for b in CPU_BACKENDS:
        for s in SCHEMES:
            if QuantScheme.parse(s).method in SPECS[b].quant_methods:
                out += [(b, s, dt) for dt in ("float32", "bfloat16")]
    out += [("triton", s, dt) for s in TRITON_SCHEMES for dt in ("float32", "float16")]
    return out


def _pair(backend, scheme, dtype, device="cpu", **kw):
    """Two layers of one config with different weights; (cfg, a, b, T)."""
    small = backend.startswith("triton") and scheme != "fp8_block"     # fp8_block: 128 x 128 weight blocks
    cfg = _cfg(dtype, 64 if small else 128, 64 if small else 128)
    _runs(backend, cfg, scheme, device)
    a = FusedMoE(cfg, _weights(cfg, scheme, 1, device), backend=backend, **kw)
    b = FusedMoE(cfg, _weights(cfg, scheme, 2, device), backend=backend, **kw)
    return cfg, a, b, (5 if backend.startswith("triton") else 33)


# ------------------------------------------------------------------------------ load_state_dict
@pytest.mark.parametrize("backend,scheme,dtype", _cases(), ids=["-".join(c) for c in _cases()])
def test_load_state_dict_reaches_the_kernels(backend, scheme, dtype):
    cfg, a, b, T = _pair(backend, scheme, dtype)
    x, lg = _inputs(cfg, T)
    before = b(x, lg)                          # b's derived state exists (its caches are warm)
    want = a(x, lg)
    assert not torch.equal(before, want)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(x, lg), want)


@pytest.mark.parametrize("backend,scheme,decode", [
    ("torch_ref", "fp8_channel", False), ("emulation", "int4_w4a16", False), ("grouped_mm", "none", False),
    ("triton", "fp8_channel", False), ("triton", "none", True)])
def test_load_state_dict_assign_rebinds(backend, scheme, decode, monkeypatch):
    # assign=True replaces the buffers: the kernels (bound launches, views, copies) follow
    if decode:
        _decode(monkeypatch)
    cfg, a, b, T = _pair(backend, scheme, "float32")
    T = 3 if decode else T
    x, lg = _inputs(cfg, T)
    b(x, lg)
    b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()}, assign=True)
    assert b.prepared.weights.w13 is b.w13
    assert torch.equal(b(x, lg), a(x, lg))


def test_replaced_buffer_and_moved_scale_are_caught():
    cfg, a, b, T = _pair("torch_ref", "int8_channel", "float32")
    x, lg = _inputs(cfg, T)
    b(x, lg)
    b.w13 = a.w13.clone()                          # setattr: a new tensor object
    b._buffers["w13_scale"] = a.w13_scale.clone()  # what loaders that bypass setattr do
    b.w2.copy_(a.w2)
    b.w2_scale.copy_(a.w2_scale)
    assert torch.equal(b(x, lg), a(x, lg))
    b.w2_scale = a.w2_scale.half()                 # a dtype the kernels were not built for
    with pytest.raises(ConfigError, match="w2_scale"):
        b(x, lg)


def test_half_of_int8_weights_with_fp32_scales_is_refused():
    # int8 weights are not floating point: .half() would leave them and convert only the scales
    cfg, a, _, _ = _pair("torch_ref", "int8_channel", "float32")
    with pytest.raises(ConfigError, match="w13_scale"):
        a.half()


# ------------------------------------------------------------------------------ in-place updates
@pytest.mark.parametrize("backend,scheme", [("torch_ref", "fp8_block"), ("torch_ref", "none"),
                                            ("emulation", "nvfp4"), ("emulation", "fp8_channel"),
                                            ("grouped_mm", "none"), ("triton", "int8_w8a16")])
def test_in_place_update_is_picked_up(backend, scheme):
    cfg, a, b, T = _pair(backend, scheme, "bfloat16" if backend != "triton" else "float16")
    x, lg = _inputs(cfg, T)
    b(x, lg)
    with torch.no_grad():
        for name, t in a.prepared.weights.tensors().items():
            getattr(b, name).copy_(t)
    assert torch.equal(b(x, lg), a(x, lg))


@pytest.mark.parametrize("backend,scheme", [("auto", "fp8_channel"), ("auto", "mxfp4"), ("torch_ref", "int4_w4a16"),
                                            ("auto", "none"), ("torch_ref", "none")])
def test_fused_experts_sees_in_place_updates(backend, scheme):
    cfg = _cfg("bfloat16")
    w, other = _weights(cfg, scheme, 1), _weights(cfg, scheme, 2)
    x, lg = _inputs(cfg, 9)
    r = route(lg, cfg.top_k, cfg.routing)
    old = fused_experts(x, w, r.topk_weights, r.topk_ids, cfg, backend=backend)
    want = fused_experts(x, other, r.topk_weights, r.topk_ids, cfg, backend=backend)
    for name, t in other.tensors().items():
        getattr(w, name).copy_(t)
    got = fused_experts(x, w, r.topk_weights, r.topk_ids, cfg, backend=backend)
    assert torch.equal(got, want) and not torch.equal(got, old)


def test_fused_experts_sees_updates_behind_a_converted_copy():
    # swigluoai: the triton backend de-interleaves w13 into a copy at load
    if "triton" not in SPECS:
        pytest.skip("triton is not registered")
    cfg = _cfg("float32", 64, 32, activation="swigluoai")
    _runs("triton", cfg, "none")
    w, other = _weights(cfg, "none", 1), _weights(cfg, "none", 2)
    x, lg = _inputs(cfg, 3)
    r = route(lg, cfg.top_k, cfg.routing)
    old = fused_experts(x, w, r.topk_weights, r.topk_ids, cfg, backend="triton")
    w.w13.copy_(other.w13)
    w.w2.copy_(other.w2)
    got = fused_experts(x, w, r.topk_weights, r.topk_ids, cfg, backend="triton")
    assert not torch.equal(got, old)
    assert torch.equal(got, fused_experts(x, other, r.topk_weights, r.topk_ids, cfg, backend="triton"))


def test_inference_tensors_are_served():
    # inference tensors carry no version counter: their data pointers are still watched
    cfg = _cfg("float32")
    with torch.inference_mode():
        w = _weights(cfg, "fp8_channel", 1)
        layer = FusedMoE(cfg, w, backend="emulation")
        x, lg = _inputs(cfg, 4)
        assert torch.isfinite(layer(x, lg)).all()


# ------------------------------------------------------------------------------ chunks
def _threshold(experts):
    """The largest T whose call keeps W8A8 activations 16-bit while T + 1 quantizes them."""
    for t in range(1, 64):
        if not experts.quantizes_activations(t) and experts.quantizes_activations(t + 1):
            return t
    pytest.skip("no decode / grouped threshold below 64 tokens")


def test_quantizes_activations_answers_for_the_chunks(monkeypatch):
    _decode(monkeypatch)
    cfg = _cfg("float32", 64, 32)
    _runs("triton", cfg, "fp8_channel")
    w = _weights(cfg, "fp8_channel", 1)
    t = _threshold(prepare_experts(cfg, w, "triton").kernel.experts)
    monkeypatch.setenv("FUSEDMOE_CHUNK_SIZE", str(t))
    pe = prepare_experts(cfg, w, "triton")
    T = 2 * t                                     # two decode-size chunks, a grouped-size call
    assert pe.kernel.experts.quantizes_activations(T)
    assert pe.kernel.chunk_sizes(T) == (t,)
    assert not pe.quantizes_activations(T) and pe.h_group(T) is None
    x, lg = _inputs(cfg, T)
    r = route(lg, cfg.top_k, cfg.routing)
    out = pe(x, r.topk_weights, r.topk_ids)
    ref = reference_moe(x, w, r.topk_weights, r.topk_ids, cfg, quantize_activations=False)
    assert rel_error(out, ref) <= tolerance(cfg.dtype, "none")
    # chunks of t + 1 (grouped) and 1 (decode) run different math: no single answer
    monkeypatch.setenv("FUSEDMOE_CHUNK_SIZE", str(t + 1))
    pe = prepare_experts(cfg, w, "triton")
    assert pe.kernel.chunk_sizes(t + 2) == (t + 1, 1)
    with pytest.raises(InputError, match="num_tokens"):
        pe.quantizes_activations(t + 2)
    assert pe.quantizes_activations(t + 1) and not pe.quantizes_activations(1)


def test_chunk_sizes():
    cfg = _cfg("float32", 64, 32)
    pe = prepare_experts(cfg, _weights(cfg, "none", 1), "torch_ref", chunk_size=4)
    assert [pe.kernel.chunk_sizes(T) for T in (0, 1, 4, 8, 9)] == [(), (1,), (4,), (4,), (4, 1)]
    assert pe.quantizes_activations(9) is False
    pe = prepare_experts(cfg, _weights(cfg, "fp8_channel", 1), "emulation", chunk_size=4)
    assert pe.quantizes_activations(9) is True


# ------------------------------------------------------------------------------ threads
def _hammer(layer, inputs, calls):
    """Each input on its own thread, ``calls`` times, all at once: -> wrong calls per thread."""
    want = [layer(x, lg) for x, lg in inputs]
    wrong = [0] * len(inputs)
    start = threading.Barrier(len(inputs))
    errors = []

    def work(i):
        try:
            start.wait()
            x, lg = inputs[i]
            for _ in range(calls):
                wrong[i] += not torch.equal(layer(x, lg), want[i])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return wrong


# (the Triton interpreter keeps its grid in module state: Triton runs threaded on the GPU only)
@pytest.mark.parametrize("backend,scheme,T,calls", [
    ("grouped_mm", "none", 1024, 30), ("emulation", "fp8_channel", 1024, 30), ("torch_ref", "none", 256, 10)])
def test_two_threads_on_one_module(backend, scheme, T, calls):
    cfg = _cfg("float32")
    _runs(backend, cfg, scheme)
    layer = FusedMoE(cfg, _weights(cfg, scheme, 1), backend=backend, deterministic=True)
    inputs = [_inputs(cfg, T, seed=s) for s in (1, 2)]
    assert _hammer(layer, inputs, calls) == [0, 0]


def test_workspaces_are_per_thread():
    cfg = _cfg("float32")
    layer = FusedMoE(cfg, _weights(cfg, "none", 1), backend="grouped_mm")
    kern = layer.prepared.kernel
    x, lg = _inputs(cfg, 4)
    layer(x, lg)
    mine = kern._ws
    theirs = []
    th = threading.Thread(target=lambda: (layer(x, lg), theirs.append(kern._ws)))
    th.start()
    th.join()
    (a,), (b,) = mine.values(), theirs[0].values()
    assert a["out"].data_ptr() != b["out"].data_ptr()


def test_triton_decode_plans_are_per_thread(monkeypatch):
    # the decode path keeps bound launches with their own h buffer per shape: one per thread
    _decode(monkeypatch)
    cfg = _cfg("float32", 64, 32)
    _runs("triton", cfg, "none")
    layer = FusedMoE(cfg, _weights(cfg, "none", 1), backend="triton")
    experts = layer.prepared.kernel.experts
    x, lg = _inputs(cfg, 3)
    want = layer(x, lg)
    got = []
    th = threading.Thread(target=lambda: got.append(layer(x, lg)))
    th.start()
    th.join()
    assert torch.equal(got[0], want)
    plans = list(experts._plans.values())
    assert len(plans) == 2 and plans[0][2].data_ptr() != plans[1][2].data_ptr()


# ------------------------------------------------------------------------------ pickling
def _save_load(layer):
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("backend,scheme", [("torch_ref", "int4_w4a16"), ("grouped_mm", "none"),
                                            ("emulation", "fp8_block"), ("triton", "none"), ("triton", "fp8_channel")])
def test_torch_save_and_load(backend, scheme):
    cfg, a, _, T = _pair(backend, scheme, "float32")
    x, lg = _inputs(cfg, T)
    fresh = _save_load(a)                          # before any call
    want = a(x, lg)                                # caches warm: bound launches, workspaces
    copies = [fresh, _save_load(a), copy.deepcopy(a)]
    if a.w13.dtype != torch.float8_e4m3fn:         # torch's plain pickle of fp8 storages fails (torch 2.13)
        copies.append(pickle.loads(pickle.dumps(a)))
    for b in copies:
        assert b.selection.winner == backend
        assert torch.equal(b(x, lg), want)
        assert b.prepared.weights.w13 is b.w13 and b._handle != a._handle
    assert torch.equal(a(x, lg), want)


def test_launch_configs_pickle():
    from fusedmoe.plan import make_launch_configs
    cfg = _cfg("float32", 64, 32)
    lc = make_launch_configs(cfg, QuantScheme(), platform_for(torch.device("cpu")))
    lc2 = pickle.loads(pickle.dumps(lc))
    assert lc2.default_fn(16, 8, 32, 64, 2, "fp32") == lc.default_fn(16, 8, 32, 64, 2, "fp32")


# ------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("backend,scheme", [("grouped_mm", "none"), ("emulation", "fp8_channel"),
                                            ("torch_ref", "nvfp4"), ("triton", "none")])
def test_deterministic_bitwise(backend, scheme):
    cfg, a, b, T = _pair(backend, scheme, "float32", deterministic=True)
    x, lg = _inputs(cfg, T)
    first = a(x, lg)
    assert torch.equal(a(x, lg), first)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(x, lg), first)


# ------------------------------------------------------------------------------ GPU
GPU_SCHEMES = ["none", "fp8_channel", "fp8_block", "int8_channel"]


def _gpu_pair(scheme, **kw):
    cfg = MoEConfig(16, 4, 1024, 512, dtype="bfloat16")
    _runs("triton", cfg, scheme, "cuda")
    a = FusedMoE(cfg, _weights(cfg, scheme, 1, "cuda"), backend="triton", **kw)
    b = FusedMoE(cfg, _weights(cfg, scheme, 2, "cuda"), backend="triton", **kw)
    return cfg, a, b


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", GPU_SCHEMES)
@pytest.mark.parametrize("T", [2, 1024])
def test_gpu_state_dict_and_in_place(scheme, T):
    # deterministic: the bitwise comparisons must not see an atomic k-sum's order
    cfg, a, b = _gpu_pair(scheme, deterministic=True)
    x, lg = _inputs(cfg, T, device="cuda")
    b(x, lg)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(x, lg), a(x, lg))
    c = _gpu_pair(scheme, deterministic=True)[2]
    c(x, lg)
    c.load_state_dict({k: v.clone() for k, v in a.state_dict().items()}, assign=True)
    assert torch.equal(c(x, lg), a(x, lg))
    w = _weights(cfg, scheme, 3, "cuda")
    old = fused_experts(x, w, *a.route(x, lg), cfg, backend="triton", deterministic=True)
    for name, t in a.prepared.weights.tensors().items():
        getattr(w, name).copy_(t)
    assert not torch.equal(old, a(x, lg))
    assert torch.equal(fused_experts(x, w, *a.route(x, lg), cfg, backend="triton", deterministic=True), a(x, lg))


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["none", "fp8_channel"])
@pytest.mark.parametrize("T", [4, 1024])
def test_gpu_two_threads(scheme, T):
    cfg, a, _ = _gpu_pair(scheme, deterministic=True)
    inputs = [_inputs(cfg, T, seed=s, device="cuda") for s in (1, 2)]
    assert _hammer(a, inputs, 200) == [0, 0]


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["none", "fp8_block"])
def test_gpu_save_load_and_deterministic(scheme):
    cfg, a, b = _gpu_pair(scheme, deterministic=True)
    for T in (3, 2048):
        x, lg = _inputs(cfg, T, device="cuda")
        want = a(x, lg)
        assert torch.equal(a(x, lg), want)
        assert torch.equal(_save_load(a)(x, lg), want)
        b.load_state_dict(a.state_dict())
        assert torch.equal(b(x, lg), want)
