"""Where an eager decode call's time goes on a GPU host, as ``fusedmoe bench`` times it.

    python3 benchmarks/eager_diag.py [--model qwen3-30b-a3b[:tp]] [--tokens 1]

Prints, for the ``triton`` backend's PreparedExperts over the bench's rotating input sets:
  loop    host loop of calls, synchronized at the end (wall us per call);
  events  ``harness._time_cuda``: CUDA events around each call (the bench's eager figure);
  bench   ``harness.time_impl`` graph and eager, as ``fusedmoe bench`` runs them;
then a cProfile of the events loop (top functions by internal time).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from fusedmoe.bench import harness as hz
from fusedmoe.layer import prepare_experts
from fusedmoe.presets import get_preset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=1)
    a = ap.parse_args()
    name, _, tp = a.model.partition(":")
    cfg = get_preset(name).to_config(tp=int(tp or 1))
    w = hz.make_weights(cfg, "none", "cuda", seed=0)
    pe = prepare_experts(cfg, w, "triton")
    sets = hz.make_input_sets(cfg, a.tokens, "cuda", seed=1)
    args = [s.args() for s in sets.sets]
    n = len(args)
    for i in range(50):
        pe(*args[i % n])
    torch.cuda.synchronize()
    reps = 2000
    t0 = time.perf_counter()
    for i in range(reps):
        pe(*args[i % n])
    torch.cuda.synchronize()
    print(f"{a.model} T={a.tokens} sets={n}: loop   {(time.perf_counter() - t0) * 1e6 / reps:7.1f} us/call")
    it = iter(range(10 ** 9))
    fn = lambda: pe(*args[next(it) % n])   # noqa: E731
    print(f"  events {hz._time_cuda(fn, 500, warmup=3) * 1e3:7.1f} us/call (median)")
    t = hz.time_impl(pe, sets, graph=True, eager=True)
    print(f"  bench  graph {t.us_graph:7.1f} eager {t.us_eager:7.1f} us")
    print(f"  events again {hz._time_cuda(fn, 500, warmup=3) * 1e3:7.1f} us/call (median)")
    prof = cProfile.Profile()
    prof.enable()
    hz._time_cuda(fn, 500, warmup=0)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print("\n".join(s.getvalue().splitlines()[6:]))


if __name__ == "__main__":
    main()
