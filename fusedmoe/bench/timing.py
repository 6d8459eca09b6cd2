"""Timing one implementation: CUDA-graph replay after a warm-up window, eager with events, CPU.

The graph holds one call per input set, rotating through them, and is timed after ``WARM_MS``
of replays; eager timing puts events around each call; on CPU the host clock times eager calls.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["WARM_MS", "Timing", "capture_graph", "time_graph", "time_impl"]

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
    arg_list = [s.args(ids64) for s in getattr(sets, "sets", sets)]   # InputSets or a list of InputSet
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
