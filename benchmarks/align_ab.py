"""A/B of the chunked alignment's scan on one program vs several (on the GPU).

    python3 benchmarks/align_ab.py [--rounds 3] [--pdl] [--skew 0.3] [--sweep | --chunks 512,1024,2048]
                                   [--out align_ab.json]

For n = T*k pairs past SMALL_MAX (the 3-launch path: count, scan, scatter): CUDA-graph µs of
one align_block_size call (all three launches) with the scan forced onto one program
(scan_programs=1, the old kernel's grid) and with the default grid (align._scan_launch's P),
alternating rounds over rotating routings (3 sets, each its own buffers). Before timing, both
variants' outputs (sorted_ids, expert_ids, num_tokens_post_padded) must be identical, and
equal to the plain-torch reference's meaningful prefix. ``--sweep`` adds forced grids of
2, 4, 8, 16, 32 programs (data for the rule in _scan_launch). ``--chunks`` times the default
grid at each chunk size instead (data for ``_chunk_for``), after the same bitwise check.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, n, E, BM): qwen3-30b-a3b (E 128, k 8) at T = 16384 / 4096 / 1024, deepseek-v3 (E 256)
CASES = [("qwen3 T=16384 BM=128", 131072, 128, 128),
         ("qwen3 T=16384 BM=64", 131072, 128, 64),
         ("deepseek E=256 T=16384 BM=128", 131072, 256, 128),
         ("qwen3 T=4096 BM=64", 32768, 128, 64),
         ("qwen3 T=1024 BM=64", 8192, 128, 64)]
K = 8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pdl", action="store_true", help="scan and scatter as programmatic dependent launches")
    ap.add_argument("--skew", type=float, default=None, help="Dirichlet alpha of expert popularity (hot experts)")
    ap.add_argument("--sweep", action="store_true", help="also time the scan forced on 2, 4, 8, 16, 32 programs")
    ap.add_argument("--chunks", default=None, help="comma list of chunk sizes to time (default grid each)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    from fusedmoe.bench.harness import make_routing, time_graph
    from fusedmoe.kernels import align as al
    from fusedmoe.reference.kernels import align_ref
    print(torch.cuda.get_device_name(), flush=True)
    rows = []
    for label, n, E, bm in CASES:
        T = n // K
        g = torch.Generator().manual_seed(n + E + bm)
        ids = [make_routing(T, E, K, generator=g, device="cuda", skew=a.skew)[1] for _ in range(3)]
        chunk = al._chunk_for(n)
        mp = al.max_padded_size(n, bm, E)
        p_dflt, _ = al._scan_launch(-(-n // chunk), bm, E, mp // bm, None, a.pdl)
        variants = [1, None] + ([2, 4, 8, 16, 32] if a.sweep else [])
        name = {v: f"default P={p_dflt}" if v is None else f"P={v}" for v in variants}
        if a.chunks:    # (P=1 stays: the bitwise reference of every chunk size)
            variants = [1] + [("chunk", int(c)) for c in a.chunks.split(",")]
            name = {v: "P=1" if v == 1 else f"chunk {v[1]}" + (" (rule)" if v[1] == chunk else "") for v in variants}

        def kw(v):
            return dict(chunk=v[1]) if isinstance(v, tuple) else dict(scan_programs=v)
        # the same bits on every grid, and the reference's layout
        for x in ids:
            one = al.align_block_size(x, bm, E, pdl=a.pdl, scan_programs=1)
            srt, eid, total = align_ref(x, bm, E)
            if not (one.num_tokens_post_padded.item() == total and torch.equal(one.sorted_ids[:total].cpu(), srt)
                    and torch.equal(one.expert_ids[: total // bm].cpu(), eid)):
                print(f"MISMATCH {label}: P=1 vs the reference", flush=True)
                return 1
            for v in variants[1:]:
                o = al.align_block_size(x, bm, E, pdl=a.pdl, **kw(v))
                if not (torch.equal(one.sorted_ids, o.sorted_ids) and torch.equal(one.expert_ids, o.expert_ids)
                        and torch.equal(one.num_tokens_post_padded, o.num_tokens_post_padded)):
                    print(f"MISMATCH {label}: P=1 vs {name[v]}", flush=True)
                    return 1
        outs = {v: [al.AlignResult(torch.empty(mp, dtype=torch.int32, device="cuda"),
                                   torch.empty(mp // bm, dtype=torch.int32, device="cuda"),
                                   torch.empty(1, dtype=torch.int32, device="cuda")) for _ in ids] for v in variants}
        res = {v: [] for v in variants}
        for _ in range(a.rounds):
            for v in variants:
                calls = [lambda x=x, o=o, v=v: al.align_block_size(x, bm, E, out=o, pdl=a.pdl, **kw(v))
                         for x, o in zip(ids, outs[v])]
                res[v].append(time_graph(calls, reps=200))
        r = dict(case=label, n=n, E=E, BM=bm, chunk=chunk, pdl=a.pdl, skew=a.skew, default_P=p_dflt,
                 us={name[v]: min(u) for v, u in res.items()}, rounds={name[v]: u for v, u in res.items()})
        rows.append(r)
        print(f"{label:30s} n={n:6d} E={E:3d} BM={bm:3d} chunk={chunk:4d}  (min of {a.rounds} rounds, us per call)",
              flush=True)
        for v in variants:
            rounds = " ".join(f"{u:.1f}" for u in res[v])
            print(f"    {name[v]:13s} {min(res[v]):7.1f} us   rounds {rounds}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
