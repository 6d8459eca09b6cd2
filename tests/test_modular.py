"""The modular kernel framework: ModularKernel pairing rules, chunking, workspaces, shared
experts, the batched format (LocalBatched) and the WeightAndReduce variants.

Legend: T tokens, E experts, E_loc local experts, k top-k, H hidden, I intermediate,
T_max the per-expert capacity of the batched format.
"""
from __future__ import annotations

import pytest
import torch

from fusedmoe.backends.grouped_mm import GroupedMMExperts
from fusedmoe.backends.registry import registered
from fusedmoe.backends.torch_ref import TorchRefBatchedExperts, TorchRefExperts
from fusedmoe.config import ParallelConfig
from fusedmoe.errors import ConfigError, InputError
from fusedmoe.layer import prepare_experts
from fusedmoe.modular import LocalBatched, ModularKernel, NoEP
from fusedmoe.modular.interfaces import (ActivationFormat, BatchedSlots, BatchedWeightAndReduce,
                                         ContiguousWeightAndReduce, DelegateWeightAndReduce, Experts,
                                         MonolithicExperts, MonolithicPrepareFinalize, NoOpWeightAndReduce,
                                         PrepareResult, WorkspaceSpec)
from fusedmoe.platform import Platform
from fusedmoe.quantize import quantize_activation
from fusedmoe.reference.moe import reference_moe
from fusedmoe.tolerances import rel_error, tolerance

# Chunked vs unchunked on CPU fp32: each chunk is computed independently, but the BLAS
# picks a different GEMM kernel for a 7-row block than for a 300-row one (a row of A @ B
# is not bitwise the same for M = 7 and M = 300 on this CPU), so the results agree to
# fp32 rounding, not bitwise: measured ~1e-7 relative. 1e-6 is ~100x below any real bug
# (a dropped or doubled chunk row is O(1)).
CHUNK_TOL = 1e-6


# ------------------------------------------------------------------------------ dummies
class PassThroughExperts(Experts):
    """Modular, standard: the 'experts' are the identity (out = a1), already reduced."""

    def workspace(self, M, topk):
        return WorkspaceSpec({"out": ((M, self.config.hidden_size), self.config.torch_dtype)})

    def weight_and_reduce(self):
        return NoOpWeightAndReduce()

    def apply(self, prep, ws, expert_map):
        ws["out"].copy_(prep.a1q)
        return ws["out"]


class PassThroughMonolithic(MonolithicExperts, PassThroughExperts):
    pass


class BatchedPassThrough(PassThroughExperts):
    activation_format = ActivationFormat.BATCHED


class DummyMonolithicPF(MonolithicPrepareFinalize):
    def prepare(self, a1, topk_weights, topk_ids, config, experts, expert_map):
        return PrepareResult(a1, None, topk_ids, topk_weights)

    def finalize(self, output, fused_out, prep, weight_and_reduce, apply_router_weight_on_input):
        output.copy_(fused_out)
        return output


@pytest.fixture
def small(mk):
    """(cfg fp32 E=8 k=2 H=32 I=16, weights 'none')."""
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    return cfg, mk.weights(cfg, seed=5)


# ------------------------------------------------------------------------------ pairing rules
def test_refuses_monolithic_prepare_with_modular_experts(small):
    cfg, w = small
    with pytest.raises(ConfigError) as ei:
        ModularKernel(DummyMonolithicPF(), PassThroughExperts(cfg, w))
    msg = str(ei.value)
    assert msg.startswith("experts=") and "monolithic" in msg and "cannot be mixed" in msg


def test_refuses_modular_prepare_with_monolithic_experts(small):
    cfg, w = small
    with pytest.raises(ConfigError) as ei:
        ModularKernel(NoEP(), PassThroughMonolithic(cfg, w))
    assert "monolithic" in str(ei.value) and "modular" in str(ei.value)


def test_monolithic_pair_is_accepted_but_takes_no_topk_ids(small):
    cfg, w = small
    mk_ = ModularKernel(DummyMonolithicPF(), PassThroughMonolithic(cfg, w))
    x = torch.randn(3, 32)
    with pytest.raises(InputError, match="topk_ids"):
        mk_(x, torch.rand(3, 2), torch.zeros(3, 2, dtype=torch.int32))


@pytest.mark.parametrize("pf,experts_cls,hint", [
    (NoEP(), BatchedPassThrough, "LocalBatched"),           # batched experts behind a standard prepare
    (LocalBatched(8), PassThroughExperts, "NoEP"),          # standard experts behind a batched prepare
], ids=["batched-experts-noep", "standard-experts-localbatched"])
def test_refuses_mismatched_formats(small, pf, experts_cls, hint):
    cfg, w = small
    ex = experts_cls(cfg, w, max_num_tokens=8)
    with pytest.raises(ConfigError) as ei:
        ModularKernel(pf, ex)
    msg = str(ei.value)
    assert msg.startswith("experts=") and "format" in msg and hint in msg


def test_batched_experts_need_max_num_tokens(small):
    cfg, w = small
    with pytest.raises(ConfigError) as ei:
        TorchRefBatchedExperts(cfg, w)
    assert str(ei.value).startswith("max_num_tokens=None")


# ------------------------------------------------------------------------------ T = 0
@pytest.mark.parametrize("pf,make", [
    (NoEP(), lambda c, w: TorchRefExperts(c, w)),
    (NoEP(), lambda c, w: GroupedMMExperts(c, w)),
    (LocalBatched(4), lambda c, w: TorchRefBatchedExperts(c, w, max_num_tokens=4)),
], ids=["torch_ref", "grouped_mm", "batched"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_tokens(mk, pf, make, dtype):
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype=dtype)
    w = mk.weights(cfg, seed=6)
    out = ModularKernel(pf, make(cfg, w))(torch.empty(0, 32, dtype=cfg.torch_dtype), torch.empty(0, 2),
                                         torch.empty(0, 2, dtype=torch.int32))
    assert out.shape == (0, 32) and out.dtype == cfg.torch_dtype


# ------------------------------------------------------------------------------ chunking
class CountingNoEP(NoEP):
    def __init__(self):
        self.calls = []

    def prepare(self, a1, *a, **kw):
        self.calls.append(a1.shape[0])
        return super().prepare(a1, *a, **kw)


EXPERTS = {
    "torch_ref": lambda c, w: TorchRefExperts(c, w),
    "grouped_mm": lambda c, w: GroupedMMExperts(c, w),
}


@pytest.mark.parametrize("name", list(EXPERTS))
def test_chunked_equals_unchunked(mk, name):
    # T=300 in chunks of 7: 42 full chunks + a tail of 6 (T not a multiple of the chunk)
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=7)
    x = mk.x(cfg, 300, seed=8)
    tw, ti = mk.topk(300, 8, 2, seed=9)
    pf = CountingNoEP()
    chunked = ModularKernel(pf, EXPERTS[name](cfg, w), chunk_size=7)(x, tw, ti)
    assert pf.calls == [7] * 42 + [6]
    whole = ModularKernel(NoEP(), EXPERTS[name](cfg, w), chunk_size=None)(x, tw, ti)
    assert rel_error(chunked, whole) <= CHUNK_TOL
    assert rel_error(whole, reference_moe(x, w, tw, ti, cfg)) <= tolerance("float32", "none")


def test_chunk_size_from_env(mk, monkeypatch):
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=7)
    x = mk.x(cfg, 50, seed=8)
    tw, ti = mk.topk(50, 8, 2, seed=9)
    monkeypatch.setenv("FUSEDMOE_CHUNK_SIZE", "7")
    pf = CountingNoEP()
    k = ModularKernel(pf, GroupedMMExperts(cfg, w))
    assert k.chunk_size == 7
    out = k(x, tw, ti)
    assert pf.calls == [7] * 7 + [1]
    assert rel_error(out, ModularKernel(NoEP(), GroupedMMExperts(cfg, w), chunk_size=64)(x, tw, ti)) <= CHUNK_TOL
    assert ModularKernel(NoEP(), GroupedMMExperts(cfg, w), chunk_size=13).chunk_size == 13   # argument wins


def test_chunks_are_independent_per_tensor_scheme(mk):
    # fp8_tensor (dynamic) quantizes GEMM inputs per tensor = per CHUNK, so chunked and
    # unchunked differ by up to the whole fp8 noise (~5% measured): not comparable. What
    # must hold: each chunk's rows equal the reference run on that chunk alone.
    cfg = mk.config(E=8, k=2, H=128, I=64, dtype="float32")
    w = mk.weights(cfg, "fp8_tensor", seed=10)
    x = mk.x(cfg, 60, seed=11)
    x[7:14] *= 5                                          # chunk 1 has a larger amax than the others
    tw, ti = mk.topk(60, 8, 2, seed=12)
    out = ModularKernel(NoEP(), TorchRefExperts(cfg, w), chunk_size=7)(x, tw, ti)
    for s in range(0, 60, 7):
        ref = reference_moe(x[s:s + 7], w, tw[s:s + 7], ti[s:s + 7], cfg)
        assert rel_error(out[s:s + 7], ref) <= CHUNK_TOL, s


@pytest.mark.parametrize("bad", [-1, -7])
def test_bad_chunk_size_raises(small, bad):
    cfg, w = small
    with pytest.raises(ConfigError, match="chunk_size"):
        k = ModularKernel(NoEP(), TorchRefExperts(cfg, w), chunk_size=bad)
        k(torch.randn(4, 32), torch.rand(4, 2), torch.zeros(4, 2, dtype=torch.int32))


# ------------------------------------------------------------------------------ batched format
@pytest.mark.parametrize("backend,scheme,dtype,t_max", [
    ("torch_ref", "none", "float32", 16),        # 40 tokens in 3 chunks of <= T_max = 16
    ("torch_ref", "none", "bfloat16", 16),
    ("torch_ref", "fp8_block", "float32", 16),
    ("emulation", "fp8_block", "bfloat16", 16),  # emulation's batched experts + per-group act quant
    ("emulation", "fp8_tensor", "float32", 64),  # per-tensor act scale: one chunk in both formats, same amax
    ("emulation", "int4_w4a16", "float32", 16),  # weight-only
])
def test_batched_equals_standard(mk, backend, scheme, dtype, t_max):
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype=dtype)
    w = mk.weights(cfg, scheme, seed=13)
    x = mk.x(cfg, 40, seed=14)
    tw, ti = mk.topk(40, 8, 2, seed=15, exclude=(6,))        # expert 6: zero rows in the batch
    std = prepare_experts(cfg, w, backend)
    bat = prepare_experts(cfg, w, backend, fmt="batched", max_num_tokens=t_max)
    assert isinstance(bat.kernel.prepare_finalize, LocalBatched) and bat.kernel.chunk_size == t_max
    a, b = std(x, tw, ti), bat(x, tw, ti)
    assert b.dtype == cfg.torch_dtype
    assert rel_error(b, a) <= tolerance(dtype, std.weights.scheme.method)


def test_batched_with_expert_map(mk):
    # EP rank 1 of 2 (local experts 4..7) through the batched format
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32", parallel=ParallelConfig(ep_size=2, ep_rank=1))
    w = mk.weights(cfg, seed=16)
    x = mk.x(cfg, 20, seed=17)
    tw, ti = mk.topk(20, 8, 2, seed=18)
    out = prepare_experts(cfg, w, "torch_ref", fmt="batched", max_num_tokens=20)(x, tw, ti)
    assert rel_error(out, reference_moe(x, w, tw, ti, cfg)) <= tolerance("float32", "none")


@pytest.mark.parametrize("backend,scheme", [("torch_ref", "none"), ("emulation", "fp8_channel")])
def test_batched_top1_on_input(mk, backend, scheme):
    # Llama-4 routing through the batched format: x is pre-scaled in prepare, finalize must
    # not weight again (BatchedWeightAndReduce with apply_router_weight_on_input)
    from fusedmoe.config import Routing
    cfg = mk.config(E=8, k=1, H=128, I=64, dtype="float32",
                    routing=Routing(scoring="sigmoid", renormalize=False, apply_router_weight_on_input=True))
    w = mk.weights(cfg, scheme, seed=41)
    x = mk.x(cfg, 25, seed=42)
    tw, ti = mk.topk(25, 8, 1, seed=43)
    out = prepare_experts(cfg, w, backend, fmt="batched", max_num_tokens=32)(x, tw, ti)
    assert rel_error(out, reference_moe(x, w, tw, ti, cfg)) <= tolerance("float32", w.scheme.method)


def test_local_batched_prepare_invariants(mk):
    # the batched buffer: per local expert its tokens in order, counts = bincount, every
    # local slot exactly once in slot_of_row, padding rows marked -1
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32", parallel=ParallelConfig(ep_size=2, ep_rank=0))
    w = mk.weights(cfg, seed=19)
    x = mk.x(cfg, 10, seed=20)
    tw, ti = mk.topk(10, 8, 2, seed=21)
    emap = cfg.expert_map()
    ex = TorchRefBatchedExperts(cfg, w, max_num_tokens=10)
    prep = LocalBatched(10).prepare(x, tw, ti, cfg, ex, emap)
    E_loc = 4
    loc = emap.long()[ti.long()].reshape(-1)                               # [T*k] local id or -1
    assert prep.a1q.shape == (E_loc, 10, 32)
    assert prep.expert_tokens_meta.expert_num_tokens.tolist() == \
        [int((loc == e).sum()) for e in range(E_loc)]
    sor = prep.batched_slots.slot_of_row                                   # [E_loc, T_max]
    valid = sor.reshape(-1)[sor.reshape(-1) >= 0]
    assert sorted(valid.tolist()) == [s for s in range(20) if loc[s] >= 0]
    for e in range(E_loc):
        n = int(prep.expert_tokens_meta.expert_num_tokens[e])
        assert (sor[e, n:] == -1).all()
        rows = sor[e, :n].long()
        assert (loc[rows] == e).all() and (rows.diff() > 0).all()          # stable: token order kept
        assert torch.equal(prep.a1q[e, :n], x[rows // 2])


def test_duplicate_topk_ids_are_rejected(small):
    # edge: a custom router repeating an expert within a token ([[0, 0], ...]): routing never
    # does this, and the batched format could not hold k*T_max rows for one expert, so the
    # public entry points reject it (on CPU tensors; on CUDA with FUSEDMOE_DEBUG=1)
    from fusedmoe.layer import prepare_experts
    from fusedmoe.errors import InputError
    cfg, w = small
    x = torch.randn(10, 32, generator=torch.Generator().manual_seed(22))
    tw = torch.rand(10, 2, generator=torch.Generator().manual_seed(23)) + 0.2
    ti = torch.zeros(10, 2, dtype=torch.int32)
    for fmt in ("standard", "batched"):
        with pytest.raises(InputError, match="topk_ids"):
            prepare_experts(cfg, w, "torch_ref", fmt=fmt)(x, tw, ti)


# ------------------------------------------------------------------------------ workspaces
def _kernels(cfg, w):
    yield "torch_ref", ModularKernel(NoEP(), TorchRefExperts(cfg, w))
    yield "grouped_mm", ModularKernel(NoEP(), GroupedMMExperts(cfg, w))
    yield "batched", ModularKernel(LocalBatched(16), TorchRefBatchedExperts(cfg, w, max_num_tokens=16))
    spec = registered().get("triton")
    if spec is not None and not spec.evaluate(cfg, w.scheme, Platform.current()):
        yield "triton", prepare_experts(cfg, w, "triton").kernel


@pytest.mark.parametrize("which", ["torch_ref", "grouped_mm", "batched", "triton"])
def test_workspace_is_declared_and_allocated_once(mk, which, monkeypatch):
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=24)
    kernels = dict(_kernels(cfg, w))
    if which not in kernels:
        pytest.skip(f"{which} is not registered or cannot run here (Triton interpreter unavailable)")
    kern = kernels[which]
    calls = []
    orig = kern.experts.workspace
    monkeypatch.setattr(kern.experts, "workspace", lambda M, k: calls.append(M) or orig(M, k))
    x = mk.x(cfg, 12, seed=25)
    tw, ti = mk.topk(12, 8, 2, seed=26)
    out1 = kern(x, tw, ti).clone()
    ws = dict(kern._ws)
    assert len(ws) == 1 and len(calls) >= 1               # the spec is consulted per call (it keys the cache)
    (key, bufs), = ws.items()
    M = 16 if which == "batched" else 12                  # batched: buffers sized by T_max, not T
    declared = orig(M, 2).buffers
    assert set(bufs) == set(declared)                     # exactly the declared buffers
    for name, (shape, dtype) in declared.items():
        assert tuple(bufs[name].shape) == tuple(shape) and bufs[name].dtype == dtype, name
    ptrs = {n: t.data_ptr() for n, t in bufs.items()}
    out2 = kern(x, tw, ti)                                # same shape: no new allocation
    assert len(kern._ws) == 1 and {n: t.data_ptr() for n, t in kern._ws[key].items()} == ptrs
    assert torch.equal(out1, out2)
    x5, (tw5, ti5) = mk.x(cfg, 5, seed=27), mk.topk(5, 8, 2, seed=28)
    kern(x5, tw5, ti5)
    # a new T is a new shape, except for the batched format whose buffers depend on T_max only
    assert len(kern._ws) == (1 if which == "batched" else 2)
    kern.reset_workspaces()                               # freed; rebuilt on the next call
    assert kern._ws == {} and kern._last_ws is None
    assert torch.equal(kern(x, tw, ti), out1)


def test_chunked_and_single_chunk_paths_agree(small):
    # T <= chunk runs without views; T > chunk slices: both must give the same rows
    cfg, w = small
    one = ModularKernel(NoEP(), GroupedMMExperts(cfg, w))
    many = ModularKernel(NoEP(), GroupedMMExperts(cfg, w), chunk_size=3)
    g = torch.Generator().manual_seed(5)
    x, tw = torch.randn(10, 32, generator=g), torch.rand(10, 2, generator=g)
    ti = torch.randint(0, 8, (10, 2), generator=g, dtype=torch.int32)
    torch.testing.assert_close(one(x, tw, ti), many(x, tw, ti))


def test_workspace_cache_is_bounded(small):
    cfg, w = small
    kern = ModularKernel(NoEP(), GroupedMMExperts(cfg, w))
    for T in range(1, 9):
        kern(torch.randn(T, 32), torch.rand(T, 2), torch.randint(0, 8, (T, 2), dtype=torch.int32))
    assert len(kern._ws) <= 4


def test_workspace_spec_nbytes():
    spec = WorkspaceSpec({"a": ((4, 8), torch.float32), "b": ((3,), torch.int32), "c": ((2, 2), torch.bfloat16)})
    assert spec.nbytes() == 4 * 8 * 4 + 3 * 4 + 4 * 2


# ------------------------------------------------------------------------------ shared experts
def test_shared_experts_added(mk):
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=29)
    x = mk.x(cfg, 30, seed=30)
    tw, ti = mk.topk(30, 8, 2, seed=31)
    seen = []
    shared_lin = torch.nn.Linear(32, 32)

    def shared(t):
        seen.append(t.shape[0])
        return shared_lin(t)

    with torch.no_grad():
        base = ModularKernel(NoEP(), GroupedMMExperts(cfg, w), chunk_size=8)(x, tw, ti)
        out = ModularKernel(NoEP(), GroupedMMExperts(cfg, w), shared_experts=shared, chunk_size=8)(x, tw, ti)
        assert seen == [30]                                # once, on all tokens (not per chunk)
        assert torch.equal(out, base + shared_lin(x))


# ------------------------------------------------------------------------------ weight and reduce
def test_contiguous_weight_and_reduce():
    g = torch.Generator().manual_seed(32)
    fused = torch.randn(5, 3, 8, generator=g)                          # [T, k, H]
    tw = torch.rand(5, 3, generator=g) + 0.2
    ti = torch.randint(0, 4, (5, 3), generator=g, dtype=torch.int32)
    out = torch.full((5, 8), float("nan"))                             # output is fully written
    ContiguousWeightAndReduce().apply(out, fused, tw, ti, False)
    expect = torch.stack([sum(tw[t, j] * fused[t, j] for j in range(3)) for t in range(5)])
    torch.testing.assert_close(out, expect, rtol=1e-6, atol=1e-6)
    ContiguousWeightAndReduce().apply(out, fused, tw, ti, True)        # weights already on the input
    torch.testing.assert_close(out, fused.sum(1), rtol=1e-6, atol=1e-6)


def test_batched_weight_and_reduce_ignores_nan_padding():
    # [E_loc=3, T_max=4, H=8] with 5 valid rows; every padding row is NaN (garbage);
    # token 4 (slots 8, 9) has no row at all: it must come out as zeros
    g = torch.Generator().manual_seed(33)
    T, k, H = 5, 2, 8
    tw = torch.rand(T, k, generator=g) + 0.2
    ti = torch.zeros(T, k, dtype=torch.int32)
    fused = torch.full((3, 4, H), float("nan"))
    slot_of_row = torch.full((3, 4), -1, dtype=torch.int32)
    placement = {(0, 0): 0, (0, 1): 3, (1, 0): 5, (2, 0): 6, (2, 1): 2}   # (e, row) -> slot t*k+j
    for (e, r), s in placement.items():
        fused[e, r] = torch.randn(H, generator=g)
        slot_of_row[e, r] = s
    out = torch.full((T, H), 123.0)
    BatchedWeightAndReduce().apply(out, fused, tw, ti, False, BatchedSlots(slot_of_row))
    expect = torch.zeros(T, H)
    for (e, r), s in placement.items():
        expect[s // k] += tw.reshape(-1)[s] * fused[e, r]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expect, rtol=1e-6, atol=1e-6)
    assert torch.equal(out[4], torch.zeros(H))
    BatchedWeightAndReduce().apply(out, fused, tw, ti, True, BatchedSlots(slot_of_row))
    expect_unweighted = torch.zeros(T, H)
    for (e, r), s in placement.items():
        expect_unweighted[s // k] += fused[e, r]
    torch.testing.assert_close(out, expect_unweighted, rtol=1e-6, atol=1e-6)


def test_noop_weight_and_reduce_copies():
    fused = torch.randn(3, 4)
    out = torch.zeros(3, 4)
    NoOpWeightAndReduce().apply(out, fused, None, None, False)
    assert torch.equal(out, fused)
    assert NoOpWeightAndReduce().apply(out, out, None, None, False) is out


def test_delegate_is_resolved_by_prepare_finalize():
    d = DelegateWeightAndReduce()
    assert isinstance(NoEP().resolve(d), ContiguousWeightAndReduce)
    assert isinstance(LocalBatched(4).resolve(d), BatchedWeightAndReduce)
    c = ContiguousWeightAndReduce()
    assert NoEP().resolve(c) is c


class _QuantizingPassThrough(PassThroughExperts):
    """Asks prepare for quantized input and supplies the scheme's quantizer."""

    input_quant = True

    def quantize_input(self, a1, counts=None):
        return quantize_activation(a1, self.weights.scheme, self.weights.a13_scale, counts)


def test_noep_quantizes_input_when_experts_ask(mk):
    # experts with input_quant=True get fp8 a1q + per-token scales from prepare, made by
    # the experts' own quantize_input
    cfg = mk.config(E=4, k=2, H=128, I=64, dtype="float32")
    w = mk.weights(cfg, "fp8_channel", seed=34)
    ex = _QuantizingPassThrough(cfg, w)
    x = mk.x(cfg, 6, seed=35)
    tw, ti = mk.topk(6, 4, 2, seed=36)
    prep = NoEP().prepare(x, tw, ti, cfg, ex, None)
    assert prep.a1q.dtype == torch.float8_e4m3fn and prep.a1q_scale.shape == (6, 1)
    deq = prep.a1q.float() * prep.a1q_scale
    assert rel_error(deq, x) < 0.05                       # fp8 e4m3: ~2.6% rms rounding
    ex.input_quant = False
    assert NoEP().prepare(x, tw, ti, cfg, ex, None).a1q is x


# ------------------------------------------------------------------------------ direct hook
class _DirectPassThrough(PassThroughExperts):
    """Serves calls of at most 2 tokens whole (``direct``), counting them; others return None."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.direct_calls = 0

    def direct(self, x, topk_weights, topk_ids, expert_map):
        if x.shape[0] > 2:
            return None
        self.direct_calls += 1
        return x.clone() * 1.0


def test_direct_hook_serves_small_calls_and_only_where_prepare_does_nothing(mk):
    from fusedmoe.config import Routing
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=3)
    shared = torch.nn.Linear(32, 32)
    ex = _DirectPassThrough(cfg, w)
    m = ModularKernel(NoEP(), ex, shared_experts=shared, chunk_size=8)
    with torch.no_grad():
        for T, direct in ((1, 1), (2, 2), (5, 2)):            # 5 tokens: None -> the modular path
            x = mk.x(cfg, T, seed=T)
            tw, ti = mk.topk(T, 8, 2, seed=T)
            assert torch.equal(m(x, tw, ti), x + shared(x))  # shared experts added once either way
            assert ex.direct_calls == direct
    # top-1 with the router weight on the input: prepare scales x, so no direct path
    cfg1 = mk.config(E=8, k=1, H=32, I=16, dtype="float32").replace(routing=Routing(apply_router_weight_on_input=True))
    ex1 = _DirectPassThrough(cfg1, w)
    m1 = ModularKernel(NoEP(), ex1)
    assert m1._direct is None
    x = mk.x(cfg1, 2, seed=9)
    tw, ti = mk.topk(2, 8, 1, seed=9)
    assert torch.allclose(m1(x, tw, ti), x * tw[:, :1]) and ex1.direct_calls == 0


def test_direct_needs_a_prepare_finalize_that_says_direct_ok(mk):
    # the kernel asks the prepare/finalize (direct_ok), it knows no class by name: NoEP says
    # yes, LocalBatched and a NoEP subclass that adds work to prepare say no
    class _ScalingNoEP(NoEP):
        def prepare(self, a1, *a, **kw):
            return super().prepare(a1 * 2, *a, **kw)

    class _PlainNoEP(NoEP):
        pass

    assert NoEP().direct_ok and _PlainNoEP().direct_ok
    assert not _ScalingNoEP().direct_ok and not LocalBatched(4).direct_ok
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=3)
    assert ModularKernel(_PlainNoEP(), _DirectPassThrough(cfg, w))._direct is not None
    ex = _DirectPassThrough(cfg, w)
    m = ModularKernel(_ScalingNoEP(), ex)
    assert m._direct is None
    x = mk.x(cfg, 2, seed=4)
    tw, ti = mk.topk(2, 8, 2, seed=4)
    assert torch.equal(m(x, tw, ti), x * 2) and ex.direct_calls == 0


def test_triton_decode_direct_path_matches_modular_path(mk):
    # the triton backend's decode calls go through ``direct`` (no prepare / workspace /
    # finalize); the same experts through the modular path (apply) agree bitwise, with an
    # expert map (EP rank 1 of 2) and T = 1, 3
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32", parallel=ParallelConfig(ep_size=2, ep_rank=1))
    w = mk.weights(cfg, seed=11)
    pe = prepare_experts(cfg, w, "triton")
    m = pe.kernel
    assert m._direct is not None
    for T in (1, 3):
        x = mk.x(cfg, T, seed=T)
        tw, ti = mk.topk(T, 8, 2, seed=T)
        a = pe(x, tw, ti)
        saved, m._direct = m._direct, None
        try:
            b = pe(x, tw, ti)
        finally:
            m._direct = saved
        assert torch.equal(a, b)
        ref = reference_moe(x, w, tw, ti, cfg)
        assert rel_error(a, ref) < tolerance("float32", "none")
