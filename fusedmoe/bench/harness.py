"""The benchmark harness: roofline arithmetic, device ceilings, timing, results, reports.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate size (per partition).

What is measured, per (shape, scheme, T, implementation):
- correctness first: the output on fresh random inputs vs ``reference_moe`` (relative
  Frobenius error, ``fusedmoe.tolerances``); a wrong implementation is reported, not timed;
- the median time of one call as CUDA-graph replay (the graph holds one call per input set,
  rotating through them; timed after ``WARM_MS`` of replays) and eagerly (events around each call);
- TFLOP/s (6*T*k*H*I for gated activations, 4*T*k*H*I otherwise), GB/s (the weights of the
  experts actually hit, scales included, + x + out), and the percentage of the roofline
  max(FLOPs / peak, bytes / bandwidth) reached, with peak and bandwidth MEASURED on this
  device (a device-to-device copy counting read + write; an 8192^3 bf16 matmul on random data).

Input sets rotate so the cycle's working set (x, routing, out of every set + all weights)
exceeds 2x L2; for big shapes the weights alone do that, so only tokens and routing rotate.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from ..config import MoEConfig, QuantMethod, QuantScheme, Routing

__all__ = [
    "flops", "weight_bytes", "expert_bytes", "moe_bytes", "roofline_us", "pct_of_roofline", "peak_for_scheme",
    "Ceilings", "measure_ceilings", "l2_bytes", "InputSet", "make_routing", "make_input_sets", "make_weights",
    "total_weight_bytes", "Timing", "capture_graph", "time_impl", "CheckResult", "CheckCase", "make_check_case", "check_against",
    "check_impl", "Impl", "ShapeInfo", "Measurement", "BenchReport", "BenchSpec", "Progress", "run_bench",
    "format_table", "format_summary", "summarize", "SCHEMA",
]

SCHEMA = "fusedmoe.bench/1"
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


# ==============================================================================================
# arithmetic (pure; unit-tested on hand-computed numbers)
# ==============================================================================================
def flops(T: int, k: int, H: int, I: int, gated: bool = True) -> int:
    """FLOPs of the experts: GEMM1 2*T*k*H*N (N = 2I gated, I otherwise) + GEMM2 2*T*k*I*H."""
    n = 2 * I if gated else I
    return 2 * T * k * H * n + 2 * T * k * I * H


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def weight_bytes(out: int, K: int, scheme="none", dtype: str = "bfloat16") -> int:
    """Bytes of ONE expert's matrix [out, K] in ``scheme``, scales / zero points included
    (layouts of ``fusedmoe.weights``)."""
    s = QuantScheme.parse(scheme)
    m = s.method
    n = out * K
    if m == QuantMethod.NONE:
        return n * _DTYPE_BYTES[dtype]
    if m == QuantMethod.FP8_TENSOR:
        return n + 4
    if m in (QuantMethod.FP8_CHANNEL, QuantMethod.INT8_CHANNEL, QuantMethod.FP8_W8A16):
        return n + 4 * out
    if m == QuantMethod.FP8_BLOCK:
        bn, bk = s.block_shape
        return n + 4 * _cdiv(out, bn) * _cdiv(K, bk)
    if m == QuantMethod.INT8_W8A16:
        if s.group_size is None:
            return n + 4 * out
        groups = out * (K // s.group_size)
        return n + 4 * groups + (groups if s.has_zero_point else 0)
    if m == QuantMethod.INT4_W4A16:
        groups = out * (K // s.group_size)
        return n // 2 + 4 * groups + (groups if s.has_zero_point else 0)
    if m == QuantMethod.NVFP4:
        return n // 2 + n // 16 + 4          # e2m1 x2 per byte, e4m3 scale per 16, fp32 global
    if m == QuantMethod.MXFP4:
        return n // 2 + n // 32              # e2m1 x2 per byte, e8m0 scale per 32
    raise AssertionError(f"unhandled scheme {m}")


def expert_bytes(H: int, I: int, scheme="none", dtype: str = "bfloat16", gated: bool = True,
                 has_bias: bool = False) -> int:
    """Bytes of one expert: w13 [N, H] + w2 [H, I] (+ biases [N] and [H] in ``dtype``)."""
    n = 2 * I if gated else I
    b = weight_bytes(n, H, scheme, dtype) + weight_bytes(H, I, scheme, dtype)
    if has_bias:
        b += (n + H) * _DTYPE_BYTES[dtype]
    return b


def moe_bytes(T: int, H: int, experts_hit: float, per_expert_bytes: int, dtype: str = "bfloat16") -> float:
    """The fewest bytes one call must move: each hit expert's weights once, x read, out written."""
    return experts_hit * per_expert_bytes + 2 * T * H * _DTYPE_BYTES[dtype]


def roofline_us(flop: float, nbytes: float, peak_tflops: float, bandwidth_gbps: float) -> float:
    """max(FLOPs / peak, bytes / bandwidth) in microseconds."""
    return max(flop / (peak_tflops * 1e12), nbytes / (bandwidth_gbps * 1e9)) * 1e6


def pct_of_roofline(measured_us: Optional[float], roof_us: float) -> Optional[float]:
    """100 * roofline time / measured time (100 = at the roofline)."""
    if not measured_us or measured_us <= 0:
        return None
    return 100.0 * roof_us / measured_us


# ==============================================================================================
# ceilings
# ==============================================================================================
@dataclass(frozen=True)
class Ceilings:
    device: str
    copy_gbps: float              # device-to-device copy, bytes read + written per second / 1e9
    matmul_tflops: float          # dense 16-bit matmul (bf16; fp32 on CPU)
    fp8_tflops: Optional[float]   # dense fp8 matmul (torch._scaled_mm) when measured
    l2_bytes: int
    note: str = ""


def peak_for_scheme(scheme, ceilings: Ceilings) -> tuple:
    """(TFLOP/s, label) a scheme's GEMMs can reach: fp8 rate for W8A8 fp8/int8 (int8 tensor
    cores run at the fp8 rate on Hopper), the 16-bit rate otherwise (weight-only formats
    dequantize to 16 bit; nvfp4 has no tensor cores before Blackwell)."""
    m = QuantScheme.parse(scheme).method
    if m in (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_BLOCK, QuantMethod.INT8_CHANNEL):
        if ceilings.fp8_tflops:
            return ceilings.fp8_tflops, "fp8 matmul"
        return 2 * ceilings.matmul_tflops, "2x bf16 matmul (fp8 not measured)"
    return ceilings.matmul_tflops, "16-bit matmul"


def l2_bytes(device=None) -> int:
    """L2 size of the CUDA device (32 MiB stand-in on CPU)."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(getattr(p, "L2_cache_size", 50 * 2**20))
    return 32 * 2**20


def _median(xs):
    return statistics.median(xs) if xs else None


# Graph timings start after this much wall time of replays. On an H100 a layer reading weights
# allocated moments before ran 60 instead of 53 us a call (deepseek-v3 tp8 fp8_block T=3) for its
# first ~22 ms of replays, then switched for good; a new graph or new inputs over the same weights
# did not bring it back, and idle seconds did not either (docs/BENCHMARKS.md thirty-third section,
# benchmarks/graph_timeline.py --fresh-study). Without this the first T of each shape could be
# timed inside that window.
WARM_MS = 50.0


def _warm_up(fn, ms: float = WARM_MS) -> int:
    """Call ``fn`` (a graph replay) until ``ms`` of wall time has passed on the device, in
    doubling batches between synchronizations; returns the number of calls."""
    torch.cuda.synchronize()
    t0, n, batch = time.perf_counter(), 0, 1
    while (time.perf_counter() - t0) * 1e3 < ms:
        for _ in range(batch):
            fn()
        n += batch
        batch = min(2 * batch, 64)
        torch.cuda.synchronize()
    return n


def _time_cuda(fn, reps: int, warmup: int = 3) -> float:
    """Median ms of ``fn`` with events around each call.

    The events are recorded on the current stream, fetched once: ``Event.record()`` without
    a stream looks it up in Python each time (~5-10 us on an H100 host), and when ``fn`` is
    host bound (eager decode) that lookup would be timed as part of the call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record(stream)
        fn()
        e.record(stream)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def _time_cpu(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def measure_ceilings(device="cuda", *, copy_bytes: Optional[int] = None, matmul_n: Optional[int] = None,
                     fp8: bool = False, reps: int = 20) -> Ceilings:
    """Measure copy bandwidth and matmul rate on random data (never zeros: see METHOD)."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    copy_bytes = copy_bytes or (2 * 2**30 if cuda else 64 * 2**20)
    matmul_n = matmul_n or (8192 if cuda else 512)
    timer = _time_cuda if cuda else _time_cpu
    n_el = copy_bytes // 4
    src = torch.randn(n_el, device=dev)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), reps)
    copy_gbps = 2 * n_el * 4 / (ms * 1e-3) / 1e9
    del src, dst
    mdt = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(matmul_n, matmul_n, device=dev, dtype=mdt)
    b = torch.randn(matmul_n, matmul_n, device=dev, dtype=mdt)
    ms = timer(lambda: a @ b, reps)
    mm = 2 * matmul_n ** 3 / (ms * 1e-3) / 1e12
    fp8_tflops, note = None, ""
    if fp8 and cuda and hasattr(torch, "_scaled_mm"):
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()      # column-major, as _scaled_mm wants
            one = torch.ones((), device=dev)
            ms = timer(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps)
            fp8_tflops = 2 * matmul_n ** 3 / (ms * 1e-3) / 1e12
        except Exception as e:  # older torch / no fp8 tensor cores: say so
            note = f"fp8 matmul not measured: {type(e).__name__}: {e}"[:200]
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    if not cuda:
        note = (note + "; " if note else "") + f"CPU: fp32 {matmul_n}^3 matmul, {copy_bytes >> 20} MiB copy"
    return Ceilings(name, copy_gbps, mm, fp8_tflops, l2_bytes(dev), note)


# ==============================================================================================
# inputs
# ==============================================================================================
def make_routing(T: int, E: int, k: int, *, generator: torch.Generator, device, skew: Optional[float] = None):
    """(topk_weights fp32 [T, k], topk_ids int32 [T, k]): random logits -> softmax -> top-k ->
    renormalize. ``skew`` = alpha draws expert popularity p ~ Dirichlet(alpha) and adds log p to
    the logits, so some experts are hot (smaller alpha = more skew), like real traffic
    (FlashInfer #4106's distribution-aware tuning)."""
    logits = torch.randn(T, E, generator=generator)                                  # [T, E]
    if skew is not None:
        # Dirichlet(alpha) = normalized Gamma(alpha) draws; Python's RNG seeded from ours keeps
        # the run reproducible (torch.distributions ignores generators)
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
        g = torch.tensor([rng.gammavariate(float(skew), 1.0) for _ in range(E)], dtype=torch.float64)
        p = (g / g.sum()).clamp_min(1e-12)                                           # [E] popularity
        logits = logits + p.log().float()
    probs = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)                                           # [T, k]
    w = w / w.sum(dim=-1, keepdim=True)
    return w.float().to(device), ids.to(torch.int32).to(device)


@dataclass
class InputSet:
    x: torch.Tensor                # [T, H] activation dtype
    topk_weights: torch.Tensor     # [T, k] fp32
    topk_ids: torch.Tensor         # [T, k] int32
    topk_ids64: torch.Tensor       # [T, k] int64 (peers that index with it)
    experts_hit: int

    def args(self, ids64: bool = False):
        return self.x, self.topk_weights, (self.topk_ids64 if ids64 else self.topk_ids)


@dataclass
class InputSets:
    sets: list
    cycle_bytes: int
    note: str = ""

    @property
    def experts_hit(self) -> float:
        return sum(s.experts_hit for s in self.sets) / len(self.sets)


def make_input_sets(config: MoEConfig, T: int, device, *, seed: int = 0, skew: Optional[float] = None,
                    l2_bytes: int = 50 * 2**20, weight_bytes: int = 0, min_sets: int = 3, max_sets: int = 64,
                    max_total_bytes: int = 4 * 2**30) -> InputSets:
    """Enough input sets that (sets x (x + out + routing)) + all weights > 2 x L2."""
    H, k, E = config.hidden_size, config.top_k, config.num_local_experts
    eb = _DTYPE_BYTES[config.dtype]
    per_set = T * H * eb * 2 + T * k * (4 + 4 + 8)
    need = max(0, 2 * l2_bytes - weight_bytes)
    n = max(min_sets, need // per_set + 1 if need else min_sets)   # strictly more than 2x L2
    n = min(n, max_sets, max(1, max_total_bytes // per_set))
    g = torch.Generator().manual_seed(seed)
    sets = []
    for _ in range(n):
        x = torch.randn(T, H, generator=g).to(config.torch_dtype).to(device)
        w, ids = make_routing(T, E, k, generator=g, device=device, skew=skew)
        sets.append(InputSet(x, w, ids, ids.long(), int(torch.unique(ids).numel())))
    cycle = n * per_set + weight_bytes
    note = "" if cycle > 2 * l2_bytes else (f"working set {cycle >> 20} MiB < 2x L2 ({(2 * l2_bytes) >> 20} MiB): "
                                           "times may be flattered by L2")
    return InputSets(sets, cycle, note)


def make_weights(config: MoEConfig, scheme="none", device="cpu", *, seed: int = 0, base=None):
    """Random experts (std 1/sqrt(K), so activations stay O(1)) quantized to ``scheme``.

    ``base``: 16-bit ExpertWeights to quantize instead of drawing new ones (so every scheme of a
    shape starts from the same weights)."""
    from ..weights import ExpertWeights  # noqa: PLC0415
    s = QuantScheme.parse(scheme)
    if base is None:
        g = torch.Generator().manual_seed(seed)
        E, N, H, I = config.num_local_experts, config.n13, config.hidden_size, config.intermediate_size
        dt = config.torch_dtype
        w13 = (torch.randn(E, N, H, generator=g) / math.sqrt(H)).to(dt).to(device)
        w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).to(dt).to(device)
        b13 = b2 = None
        if config.has_bias:
            b13 = (0.1 * torch.randn(E, N, generator=g)).to(dt).to(device)
            b2 = (0.1 * torch.randn(E, H, generator=g)).to(dt).to(device)
        base = ExpertWeights(w13, w2, w13_bias=b13, w2_bias=b2)
    if s.method == QuantMethod.NONE:
        return base
    from ..quantize import quantize_experts  # noqa: PLC0415
    return quantize_experts(base.w13, base.w2, s, w13_bias=base.w13_bias, w2_bias=base.w2_bias)


def total_weight_bytes(weights) -> int:
    return sum(t.numel() * t.element_size() for k, t in weights.tensors().items() if not k.startswith("a"))


# ==============================================================================================
# timing
# ==============================================================================================
@dataclass(frozen=True)
class Timing:
    us_graph: Optional[float]
    us_eager: Optional[float]
    graph_note: str = ""
    reps: int = 0

    @property
    def best_us(self) -> Optional[float]:
        ts = [t for t in (self.us_graph, self.us_eager) if t]
        return min(ts) if ts else None


def _reps_for(est_ms: float, budget_ms: float, min_reps: int, max_reps: int) -> int:
    if est_ms <= 0:
        return max_reps
    return int(max(min_reps, min(max_reps, budget_ms / est_ms)))


def capture_graph(calls, side_warmup: int = 2) -> "torch.cuda.CUDAGraph":
    """One CUDA graph of the zero-argument callables ``calls`` in order, after running the first
    ``side_warmup`` of them on a side stream (what capture needs: allocator pools, lazy inits)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:side_warmup]:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return g


def time_graph(calls, reps: int = 30) -> float:
    """Median µs of one call of the list ``calls`` of zero-argument callables, all captured in
    one CUDA graph (give each its own inputs so L2 does not hold them); for kernel-level A/Bs."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    g = capture_graph(calls)
    _warm_up(g.replay)
    return _time_cuda(g.replay, reps, warmup=2) * 1e3 / len(calls)


def time_impl(fn: Callable, sets, *, graph: bool = True, eager: bool = True, ids64: bool = False,
              reps: Optional[int] = None, budget_ms: float = 200.0, min_reps: int = 5, max_reps: int = 200,
              graph_safe: bool = True, warm_ms: float = WARM_MS) -> Timing:
    """Median µs of one call ``fn(x, topk_weights, topk_ids)`` over rotating input sets.

    Graph: one CUDA graph holds one call per set; each replay is timed with events and divided
    by the number of sets. Eager: events around each call. On CPU: eager, host clock.
    ``reps`` fixes the repetitions; otherwise they fill ``budget_ms`` within [min_reps, max_reps].
    ``warm_ms``: wall time of graph replays before timing them (``WARM_MS``: see there).
    """
    arg_list = [s.args(ids64) for s in (sets.sets if isinstance(sets, InputSets) else sets)]
    n = len(arg_list)
    on_cuda = arg_list[0][0].is_cuda
    if not on_cuda:
        est = _time_cpu(lambda: fn(*arg_list[0]), 1, warmup=1)
        r = reps or _reps_for(est, budget_ms, min(min_reps, 3), max_reps)
        i = iter(range(10 ** 9))
        ms = _time_cpu(lambda: fn(*arg_list[next(i) % n]), r, warmup=0)
        return Timing(None, ms * 1e3, "graphs need CUDA", r)
    # warm up (compiles, autotunes, allocator) and estimate the cost of one call
    t0 = time.perf_counter()
    for a in arg_list[: max(2, min(n, 3))]:
        fn(*a)
    torch.cuda.synchronize()
    est = (time.perf_counter() - t0) * 1e3 / max(2, min(n, 3))
    us_graph, note = None, ""
    if graph and graph_safe:
        try:
            g = capture_graph([lambda a=a: fn(*a) for a in arg_list])
            g.replay()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            est_replay = (time.perf_counter() - t0) * 1e3
            r = reps or _reps_for(est_replay, budget_ms, min_reps, max_reps)
            _warm_up(g.replay, warm_ms)
            us_graph = _time_cuda(g.replay, r, warmup=1) * 1e3 / n
            del g
        except Exception as e:  # not capturable (host syncs, allocations the graph cannot hold...)
            note = f"not capturable: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            try:
                torch.cuda.synchronize()
            except Exception:  # the failed capture may leave the stream in error; carry on
                pass
    elif graph:
        note = "not capturable (declared: host syncs / data-dependent shapes)"
    else:
        note = "graphs disabled"
    us_eager = None
    if eager or us_graph is None:
        r = reps or _reps_for(est, budget_ms, min_reps, max_reps)
        i = iter(range(10 ** 9))
        us_eager = _time_cuda(lambda: fn(*arg_list[next(i) % n]), r, warmup=1) * 1e3
    return Timing(us_graph, us_eager, note, reps or 0)


# ==============================================================================================
# correctness
# ==============================================================================================
@dataclass(frozen=True)
class CheckResult:
    ok: bool
    rel_err: Optional[float]
    tol: float
    message: str = ""


@dataclass
class CheckCase:
    inputs: InputSet
    ref: torch.Tensor
    tol: float
    # for implementations that keep W8A8 activations 16-bit on some calls (fusedmoe's triton
    # decode path): the reference without activation quantization, built on first use
    config: Optional[MoEConfig] = None
    weights: object = None
    _ref16: Optional[torch.Tensor] = None
    _ref_group: dict = field(default_factory=dict)

    def for_impl(self, fn) -> tuple[torch.Tensor, float]:
        """(reference, tolerance) matching the math ``fn`` does on these inputs."""
        qa = getattr(fn, "quantizes_activations", None)
        hg = getattr(fn, "h_group", None)
        g = hg(self.inputs.x.shape[0]) if hg is not None and self.config is not None else None
        if g is not None:            # h quantized in 1 x g groups (triton's fp8_channel epilogue)
            ref = self._ref_group.get(g)
            if ref is None:
                from ..reference.moe import reference_moe  # noqa: PLC0415
                s = self.inputs
                ref = self._ref_group[g] = reference_moe(s.x, self.weights, s.topk_weights, s.topk_ids,
                                                         self.config, h_group=g)
            return ref, self.tol
        if qa is None or self.config is None or not self.weights.scheme.method.quantizes_activations \
                or qa(self.inputs.x.shape[0]):
            return self.ref, self.tol
        if self._ref16 is None:
            from ..reference.moe import reference_moe  # noqa: PLC0415
            s = self.inputs
            self._ref16 = reference_moe(s.x, self.weights, s.topk_weights, s.topk_ids, self.config,
                                        quantize_activations=False)
        from ..tolerances import tolerance  # noqa: PLC0415
        return self._ref16, tolerance(self.config.dtype, "none")


def make_check_case(config: MoEConfig, weights, T: int, device, *, seed: int = 1, skew=None) -> CheckCase:
    """Fresh random inputs (not the timing sets) and the reference output on them."""
    from ..reference.moe import reference_moe  # noqa: PLC0415
    from ..tolerances import tolerance  # noqa: PLC0415
    s = make_input_sets(config, T, device, seed=10_000_019 + seed, skew=skew, min_sets=1, max_sets=1).sets[0]
    ref = reference_moe(s.x, weights, s.topk_weights, s.topk_ids, config)
    return CheckCase(s, ref, tolerance(config.dtype, weights.scheme.method), config, weights)


def check_against(fn: Callable, case: CheckCase, *, ids64: bool = False) -> CheckResult:
    from ..tolerances import rel_error  # noqa: PLC0415
    ref, tol = case.for_impl(fn)
    case = CheckCase(case.inputs, ref, tol)
    try:
        out = fn(*case.inputs.args(ids64))
    except Exception as e:  # a crash is a result too: report it
        first = str(e).splitlines()[0][:200] if str(e) else ""
        return CheckResult(False, None, case.tol, f"raised {type(e).__name__}: {first}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(case.ref.shape):
        return CheckResult(False, None, case.tol, f"output shape {getattr(out, 'shape', None)} != {tuple(case.ref.shape)}")
    if not torch.isfinite(out).all():
        return CheckResult(False, None, case.tol, "output has NaN/Inf")
    err = rel_error(out, case.ref)
    if not err <= case.tol:
        return CheckResult(False, err, case.tol, f"rel err {err:.3g} > tol {case.tol:g}")
    return CheckResult(True, err, case.tol)


def check_impl(fn: Callable, config: MoEConfig, weights, T: int, device, *, seed: int = 1, skew=None) -> CheckResult:
    return check_against(fn, make_check_case(config, weights, T, device, seed=seed, skew=skew))


# ==============================================================================================
# implementations and results
# ==============================================================================================
@dataclass
class Impl:
    """One implementation to measure. ``build()`` returns ``fn(x, topk_weights, topk_ids) -> out``
    (or raises with the reason it cannot run); ``unavailable`` is set when known up front."""

    name: str
    kind: str                              # "fusedmoe" or "peer"
    build: Optional[Callable] = None
    graph_safe: bool = True
    ids64: bool = False
    unavailable: Optional[str] = None
    description: str = ""


@dataclass(frozen=True)
class ShapeInfo:
    name: str
    E: int
    k: int
    H: int
    I: int
    activation: str
    dtype: str
    tp: int
    config: str                     # repr(MoEConfig): eval() rebuilds it

    @classmethod
    def of(cls, name: str, config: MoEConfig, tp: int = 1) -> "ShapeInfo":
        return cls(name, config.num_experts, config.top_k, config.hidden_size, config.intermediate_size,
                   config.activation.value, config.dtype, tp, repr(config))


@dataclass(frozen=True)
class Measurement:
    shape: str
    scheme: str
    T: int
    impl: str
    kind: str                        # fusedmoe | peer
    status: str                      # ok | wrong | failed | unsupported
    reason: str = ""
    us_graph: Optional[float] = None
    us_eager: Optional[float] = None
    us_best: Optional[float] = None  # min(graph, eager): what a user of this implementation gets
    graph_note: str = ""
    rel_err: Optional[float] = None
    tol: Optional[float] = None
    flops: float = 0.0
    bytes: float = 0.0
    experts_hit: float = 0.0
    roofline_us: Optional[float] = None
    tflops: Optional[float] = None
    gbps: Optional[float] = None
    pct_roofline: Optional[float] = None
    speedup_vs_best_peer: Optional[float] = None        # best peer's us_best / this us_best
    eager_speedup_vs_best_peer: Optional[float] = None  # the same, eager vs eager
    auto_selected: bool = False
    n_sets: int = 0
    l2_note: str = ""


@dataclass(frozen=True)
class BenchReport:
    schema: str
    meta: dict
    ceilings: Ceilings
    shapes: tuple
    results: tuple
    summary: dict

    def to_dict(self) -> dict:
        return {"schema": self.schema, "meta": self.meta, "ceilings": dataclasses.asdict(self.ceilings),
                "shapes": [dataclasses.asdict(s) for s in self.shapes],
                "results": [dataclasses.asdict(r) for r in self.results], "summary": self.summary}

    def to_json(self, path: Optional[str] = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, default=_json_default)
        if path and path != "-":
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


# ==============================================================================================
# progress
# ==============================================================================================
class Progress:
    """Progress on stderr: a tqdm bar on a terminal (when tqdm is importable; else one line
    rewritten in place), a plain line at most every 5 s otherwise. ``total`` may grow."""

    def __init__(self, total: Optional[int] = None, desc: str = "", enabled: bool = True, stream=None):
        self.enabled, self.desc, self.total, self.n = enabled, desc, total or 0, 0
        self.stream = stream or sys.stderr
        self._bar = None
        self._t0 = time.perf_counter()
        self._last = 0.0
        # tqdm on a terminal; in a log file its redraws would be noise: plain lines every 5 s there
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm  # noqa: PLC0415 (optional)
                self._bar = tqdm(total=self.total or None, desc=desc, file=self.stream, dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def add_total(self, n: int) -> None:
        self.total += n
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def update(self, n: int = 1, postfix: str = "") -> None:
        self.n += n
        if not self.enabled:
            return
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(n)
            return
        now = time.perf_counter()
        tty = getattr(self.stream, "isatty", lambda: False)()
        if not tty and now - self._last < 5.0 and self.n != self.total:
            return
        self._last = now
        tot = f"/{self.total}" if self.total else ""
        line = f"{self.desc}: {self.n}{tot} [{now - self._t0:.0f}s] {postfix}"
        self.stream.write(("\r" + line.ljust(100)) if tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\n")
            self.stream.flush()

    def write(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg)
        else:
            print(msg, file=self.stream, flush=True)


# ==============================================================================================
# the run
# ==============================================================================================
@dataclass
class BenchSpec:
    shapes: list                          # [(name, MoEConfig, tp)]
    tokens: list
    schemes: list = field(default_factory=lambda: ["none"])
    backends: object = "all"              # "all", "auto", or a list of backend names
    peers: object = "all"                 # "all", "none", or a list of peer names
    graph: bool = True
    repeat: Optional[int] = None
    seed: int = 0
    skew: Optional[float] = None
    budget_ms: float = 200.0
    platform: object = None
    ceilings: Optional[Ceilings] = None
    device: Optional[str] = None


def fusedmoe_impls(config: MoEConfig, scheme: QuantScheme, platform, backends="all") -> tuple:
    """(impls, auto_winner, auto_note): every registered backend asked for, each either buildable
    or marked with the oracle's reasons for refusing."""
    from ..backends.registry import registered  # noqa: PLC0415
    from ..errors import FusedMoEError  # noqa: PLC0415
    from ..oracle import select_backend  # noqa: PLC0415
    specs = registered()
    try:
        auto, auto_note = select_backend(config, scheme, platform, "auto", log_once=False).winner, ""
    except FusedMoEError as e:
        auto, auto_note = None, str(e).splitlines()[0]
    if backends in (None, "all"):
        names = list(specs)
    elif backends == "auto":
        names = [auto] if auto else []
    else:
        names = list(backends)
    out = []
    for name in names:
        if name not in specs:
            out.append(Impl(name, "fusedmoe", unavailable=f"not a registered backend (registered: {', '.join(specs)})"))
            continue
        try:
            select_backend(config, scheme, platform, name, log_once=False)
        except FusedMoEError as e:
            reasons = getattr(e, "rejections", {}).get(name) or [str(e).splitlines()[0]]
            out.append(Impl(name, "fusedmoe", unavailable="; ".join(reasons)))
            continue

        def build(cfg, weights, name=name):
            from ..layer import prepare_experts  # noqa: PLC0415
            return prepare_experts(cfg, weights, backend=name, platform=platform)
        out.append(Impl(name, "fusedmoe", build=build, graph_safe=specs[name].cuda_graph_safe,
                        description=specs[name].description))
    return out, auto, auto_note


def _peer_impls(config, spec: BenchSpec):
    from . import peers  # noqa: PLC0415
    if spec.peers in ("none", None, False):
        return []
    return peers.build_peers(config, None if spec.peers == "all" else list(spec.peers))


def _free():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_bench(spec: BenchSpec, *, progress: bool = True, impls_fn: Optional[Callable] = None,
              log: Optional[Callable] = None) -> BenchReport:
    """Measure every (shape, scheme, T, implementation) of ``spec``; return the report.

    ``impls_fn(config, scheme, platform, weights16) -> (impls, auto_winner)`` replaces the
    registry + peers discovery (tests use it to run fakes)."""
    from ..platform import Platform  # noqa: PLC0415
    plat = Platform.resolve(spec.platform)
    device = torch.device(spec.device or ("cuda" if plat.kind == "cuda" and torch.cuda.is_available() else "cpu"))
    schemes = [QuantScheme.parse(s) for s in spec.schemes]
    fp8 = any(s.method in (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_BLOCK) for s in schemes)
    ceil = spec.ceilings or measure_ceilings(device, fp8=fp8)
    l2 = ceil.l2_bytes
    results, shapes = [], []
    bar = Progress(None, "bench", enabled=progress)
    say = log or bar.write
    with torch.inference_mode():
        for shape_name, config0, tp in spec.shapes:
            config = config0.replace(routing=Routing())   # the experts stage; routing is generated here
            shapes.append(ShapeInfo.of(shape_name, config, tp))
            base = make_weights(config, "none", device, seed=spec.seed)
            for scheme in schemes:
                try:
                    weights = make_weights(config, scheme, device, base=base)
                except Exception as e:  # the scheme cannot quantize this shape (group size, ...)
                    for T in spec.tokens:
                        results.append(Measurement(shape_name, scheme.name, T, "*", "fusedmoe", "failed",
                                                   f"quantize_experts: {e}"))
                    continue
                if impls_fn is not None:
                    impls, auto = impls_fn(config, scheme, plat, base)
                else:
                    impls, auto, note = fusedmoe_impls(config, scheme, plat, spec.backends)
                    if auto is None:
                        say(f"[{shape_name} {scheme.name}] oracle: {note}")
                    if scheme.method == QuantMethod.NONE:
                        impls += _peer_impls(config, spec)
                    elif spec.peers not in ("none", None, False):
                        say(f"[{shape_name} {scheme.name}] peers run for 16-bit weights only; "
                            "compare with the 'none' rows of this run")
                wbytes = total_weight_bytes(weights)
                per_exp = expert_bytes(config.hidden_size, config.intermediate_size, scheme, config.dtype,
                                       config.is_gated, config.has_bias)
                peak, _ = peak_for_scheme(scheme, ceil)
                inputs = {T: make_input_sets(config, T, device, seed=spec.seed + T, skew=spec.skew, l2_bytes=l2,
                                             weight_bytes=wbytes) for T in spec.tokens}
                cases = {}
                bar.add_total(len(impls) * len(spec.tokens))
                for impl in impls:
                    fn, why = None, impl.unavailable
                    if why is None:
                        try:
                            fn = impl.build(config, weights if impl.kind == "fusedmoe" else base)
                        except Exception as e:  # reported; PeerUnavailable = cannot run here, not a failure
                            msg = str(e).splitlines()[0][:200] if str(e) else ""
                            if type(e).__name__ == "PeerUnavailable":
                                impl.unavailable = why = msg
                            else:
                                why = f"could not build: {type(e).__name__}: {msg}"
                    for T in spec.tokens:
                        bar.update(1, f"{shape_name} {scheme.name} T={T} {impl.name}")
                        sets = inputs[T]
                        fl = flops(T, config.top_k, config.hidden_size, config.intermediate_size, config.is_gated)
                        nb = moe_bytes(T, config.hidden_size, sets.experts_hit, per_exp, config.dtype)
                        roof = roofline_us(fl, nb, peak, ceil.copy_gbps)
                        common = dict(shape=shape_name, scheme=scheme.name, T=T, impl=impl.name, kind=impl.kind,
                                      flops=fl, bytes=nb, experts_hit=sets.experts_hit, roofline_us=roof,
                                      auto_selected=(impl.kind == "fusedmoe" and impl.name == auto),
                                      n_sets=len(sets.sets), l2_note=sets.note)
                        if fn is None:
                            st = "unsupported" if impl.unavailable else "failed"
                            results.append(Measurement(status=st, reason=why or "", **common))
                            continue
                        if T not in cases:
                            cases[T] = make_check_case(config, weights, T, device, seed=spec.seed + T, skew=spec.skew)
                        chk = check_against(fn, cases[T], ids64=impl.ids64)
                        if not chk.ok:
                            st = "wrong" if chk.rel_err is not None or "NaN" in chk.message else "failed"
                            results.append(Measurement(status=st, reason=chk.message, rel_err=chk.rel_err,
                                                       tol=chk.tol, **common))
                            continue
                        try:
                            tm = time_impl(fn, sets, graph=spec.graph, ids64=impl.ids64, reps=spec.repeat,
                                           budget_ms=spec.budget_ms, graph_safe=impl.graph_safe)
                        except Exception as e:
                            why = f"timing raised {type(e).__name__}: {e}"[:240]
                            results.append(Measurement(status="failed", reason=why,
                                                       rel_err=chk.rel_err, tol=chk.tol, **common))
                            continue
                        best = tm.best_us
                        results.append(Measurement(
                            status="ok", us_graph=tm.us_graph, us_eager=tm.us_eager, us_best=best,
                            graph_note=tm.graph_note, rel_err=chk.rel_err, tol=chk.tol,
                            tflops=fl / (best * 1e-6) / 1e12, gbps=nb / (best * 1e-6) / 1e9,
                            pct_roofline=pct_of_roofline(best, roof), **common))
                    del fn
                    _free()
                del weights, inputs, cases
                _free()
            del base
            _free()
    bar.close()
    results = _with_speedups(results)
    meta = _meta(spec, plat, device)
    return BenchReport(SCHEMA, meta, ceil, tuple(shapes), tuple(results), summarize(results))


def _meta(spec: BenchSpec, plat, device) -> dict:
    try:
        import triton  # noqa: PLC0415
        tv = triton.__version__
    except Exception:
        tv = None
    from .. import __version__  # noqa: PLC0415
    return {"fusedmoe": __version__, "torch": torch.__version__, "triton": tv, "device": str(device),
            "platform": plat.name, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "tokens": list(spec.tokens),
            "schemes": [QuantScheme.parse(s).name for s in spec.schemes], "graph": spec.graph,
            "repeat": spec.repeat, "seed": spec.seed,
            "routing": "uniform softmax top-k" if spec.skew is None else f"dirichlet(alpha={spec.skew})",
            "peers_note": "peers run with 16-bit weights only; quantized rows compare with the 16-bit peers",
            "time_note": "us_best = min(graph, eager): what a user of the implementation gets; "
                         "eager_speedup compares eager with eager"}


def _with_speedups(results: list) -> list:
    """Fill speedup_vs_best_peer: best 16-bit peer of the same (shape, T) over this row's time."""
    best_peer, best_peer_eager = {}, {}
    for r in results:
        if r.kind == "peer" and r.status == "ok":
            key = (r.shape, r.T)
            if r.us_best and (key not in best_peer or r.us_best < best_peer[key]):
                best_peer[key] = r.us_best
            if r.us_eager and (key not in best_peer_eager or r.us_eager < best_peer_eager[key]):
                best_peer_eager[key] = r.us_eager
    out = []
    for r in results:
        key = (r.shape, r.T)
        sp = best_peer[key] / r.us_best if r.status == "ok" and key in best_peer and r.us_best else None
        se = (best_peer_eager[key] / r.us_eager if r.status == "ok" and key in best_peer_eager and r.us_eager
              else None)
        out.append(dataclasses.replace(r, speedup_vs_best_peer=sp, eager_speedup_vs_best_peer=se))
    return out


def _geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(results: Sequence[Measurement]) -> dict:
    """Per (shape, scheme, T): best fusedmoe backend vs best peer; per scheme: geomean speedup
    and how many points fusedmoe matches or beats the best peer (best and auto-selected backend)."""
    ok = [r for r in results if r.status == "ok"]
    points = []
    keys = sorted({(r.shape, r.scheme, r.T) for r in ok if r.kind == "fusedmoe"}, key=lambda k: (k[0], k[1], k[2]))
    for shape, scheme, T in keys:
        fm = [r for r in ok if r.kind == "fusedmoe" and (r.shape, r.scheme, r.T) == (shape, scheme, T)]
        pe = [r for r in ok if r.kind == "peer" and (r.shape, r.T) == (shape, T)]
        bf = min(fm, key=lambda r: r.us_best)
        auto = next((r for r in fm if r.auto_selected), None)
        bp = min(pe, key=lambda r: r.us_best) if pe else None
        points.append({
            "shape": shape, "scheme": scheme, "T": T,
            "best_fusedmoe": bf.impl, "best_fusedmoe_us": bf.us_best,
            "auto": auto.impl if auto else None, "auto_us": auto.us_best if auto else None,
            "best_peer": bp.impl if bp else None, "best_peer_us": bp.us_best if bp else None,
            "speedup": bp.us_best / bf.us_best if bp else None,
            "auto_speedup": bp.us_best / auto.us_best if bp and auto else None,
            "fusedmoe_ge_peer": (bf.us_best <= bp.us_best) if bp else None,
            "pct_roofline": bf.pct_roofline,
        })
    per_scheme = {}
    for scheme in sorted({p["scheme"] for p in points}):
        ps = [p for p in points if p["scheme"] == scheme and p["speedup"] is not None]
        per_scheme[scheme] = {
            "points": len(ps), "wins": sum(1 for p in ps if p["fusedmoe_ge_peer"]),
            "geomean_speedup": _geomean([p["speedup"] for p in ps]),
            "geomean_speedup_auto": _geomean([p["auto_speedup"] for p in ps if p["auto_speedup"]]),
            "min_speedup": min((p["speedup"] for p in ps), default=None),
        }
    problems, seen = [], set()
    for r in results:   # one entry per (shape, scheme, impl, status, reason); T lists where
        if r.status not in ("wrong", "failed"):
            continue
        key = (r.shape, r.scheme, r.impl, r.status, r.reason if r.status == "failed" else "")
        if key in seen:
            next(p for p in problems if p["key"] == key)["T"].append(r.T)
            continue
        seen.add(key)
        problems.append({"key": key, "shape": r.shape, "scheme": r.scheme, "T": [r.T], "impl": r.impl,
                         "status": r.status, "reason": r.reason})
    for p in problems:
        del p["key"]
    return {"per_scheme": per_scheme, "points": points, "problems": problems,
            "wrong_fusedmoe": sum(1 for r in results if r.kind == "fusedmoe" and r.status == "wrong")}


# ==============================================================================================
# text output
# ==============================================================================================
def _f(v, fmt: str, width: int) -> str:
    return (format(v, fmt) if v is not None else "-").rjust(width)


def format_table(report: BenchReport) -> str:
    """One block per (shape, scheme): µs graph / µs eager / TFLOP/s / GB/s / % roofline / vs best peer."""
    c = report.ceilings
    lines = [f"device: {c.device}   ceilings (measured): copy {c.copy_gbps:.4g} GB/s, matmul {c.matmul_tflops:.4g} TFLOP/s"
             + (f", fp8 {c.fp8_tflops:.4g} TFLOP/s" if c.fp8_tflops else "") + (f"   ({c.note})" if c.note else "")]
    groups = {}
    for r in report.results:
        groups.setdefault((r.shape, r.scheme), []).append(r)
    head = (f"{'T':>6} {'implementation':<22} {'us graph':>10} {'us eager':>10} {'TFLOP/s':>8} {'GB/s':>8} "
            f"{'%roof':>6} {'vs peer':>8}  note")
    for (shape, scheme), rows in groups.items():
        lines += ["", f"== {shape}  scheme={scheme} =="]
        never = {}
        for r in rows:
            if r.status == "unsupported":
                never.setdefault((r.impl, r.reason), []).append(r.T)
        for (impl, reason), Ts in never.items():
            lines.append(f"   not run: {impl}: {reason[:140]}")
        lines.append(head)
        for r in sorted(rows, key=lambda r: (r.T, r.kind != "fusedmoe", r.impl)):
            name = r.impl + ("*" if r.auto_selected else "")
            if r.status == "unsupported":
                continue
            if r.status != "ok":
                lines.append(f"{r.T:>6} {name:<22} {r.status.upper():>10}  {r.reason[:110]}")
                continue
            sp = f"{r.speedup_vs_best_peer:.2f}x" if r.speedup_vs_best_peer else "-"
            note = r.graph_note.split(":")[0] if r.us_graph is None and r.graph_note else ""
            lines.append(f"{r.T:>6} {name:<22} {_f(r.us_graph, '.1f', 10)} {_f(r.us_eager, '.1f', 10)} "
                         f"{_f(r.tflops, '.1f', 8)} {_f(r.gbps, '.0f', 8)} {_f(r.pct_roofline, '.1f', 6)} "
                         f"{sp:>8}  {note}")
    lines.append("")
    lines.append("* = the backend fusedmoe selects by default; 'vs peer' = best peer time / this time "
                 "(min of graph and eager for each).")
    return "\n".join(lines)


def format_summary(report: BenchReport) -> str:
    s = report.summary
    lines = ["summary (best fusedmoe backend vs best peer, geomean over token counts):"]
    if not s["per_scheme"]:
        lines.append("  no point with both a fusedmoe backend and a peer measured")
    for scheme, v in s["per_scheme"].items():
        gm = f"{v['geomean_speedup']:.2f}x" if v["geomean_speedup"] else "-"
        ga = f"{v['geomean_speedup_auto']:.2f}x" if v["geomean_speedup_auto"] else "-"
        mn = f"{v['min_speedup']:.2f}x" if v["min_speedup"] else "-"
        peers16 = "" if scheme == "none" else " (vs 16-bit peers)"
        lines.append(f"  {scheme}{peers16}: geomean {gm} (auto-selected: {ga}), worst {mn}, "
                     f"fusedmoe >= best peer at {v['wins']}/{v['points']} points")
    for p in s["points"]:
        if p["fusedmoe_ge_peer"] is False:
            lines.append(f"  slower than {p['best_peer']}: {p['shape']} {p['scheme']} T={p['T']} "
                         f"({p['best_fusedmoe']} {p['best_fusedmoe_us']:.1f} us vs {p['best_peer_us']:.1f} us)")
    for p in s["problems"]:
        Ts = ",".join(str(t) for t in p["T"])
        lines.append(f"  {p['status'].upper()}: {p['impl']} {p['shape']} {p['scheme']} T={Ts}: {p['reason'][:160]}")
    return "\n".join(lines)
