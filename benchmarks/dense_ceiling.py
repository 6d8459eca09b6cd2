"""What the vendor's dense GEMMs reach at the benchmark presets' shapes, with an ideal MoE around them.

    python3 benchmarks/dense_ceiling.py [--points mixtral:1024,qwen3:16384,...] [--json out.json]

Why: fusedmoe's figures are fractions of the roofline (max(FLOPs / dense bf16 rate, bytes / copy
bandwidth), fusedmoe.bench.harness) and 8-bit / 16-bit ratios, and a few prefill points stay well
below 80% of it (docs/BENCHMARKS.md). This script measures how far the same work gets when every
MoE cost is taken away: each expert receives exactly T * k / E rows (no imbalance, no padding),
the rows are already grouped (no gather, no alignment), and the k-sum is a contiguous view sum.
What is left is cuBLAS / CUTLASS doing the expert GEMMs:
  - bf16: torch.bmm on [E, m, K] x [E, K, N] and torch's grouped GEMM with balanced offsets
    (the faster of the two is used), then silu(gate) * up, then GEMM2, then the k-sum;
  - fp8: torch._scaled_grouped_mm (rowwise scales, sm90), GEMM1 and GEMM2 (h quantized per row
    by torch ops, counted separately), a lower bound of what any fp8 scheme costs there.
Times are CUDA-graph replays (fusedmoe.bench.harness.time_graph) over several input sets so
that L2 does not hold them; the ceilings are measured in the same run as `fusedmoe bench` does.

Decode (the yardstick is reading the hit experts' 8-bit weights once): the time
of one Triton kernel that only reads those bytes, and of two such kernels back to back (GEMM1's
weights, then GEMM2's: the shape of any two-GEMM decode), over rotated buffers.

Nothing here is a fusedmoe kernel: it is a yardstick for the targets, not a peer.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from fusedmoe.bench.harness import flops, expert_bytes, measure_ceilings, moe_bytes, roofline_us, time_graph
from fusedmoe.presets import get_preset

PRESETS = {"mixtral": ("mixtral-8x7b", 1), "qwen3": ("qwen3-30b-a3b", 1), "deepseek": ("deepseek-v3", 8)}
DEFAULT_POINTS = ("mixtral:1024,mixtral:4096,mixtral:16384,qwen3:4096,qwen3:16384,"
                  "deepseek:4096,deepseek:16384")


def _cfg(name):
    preset, tp = PRESETS[name]
    c = get_preset(preset).to_config(tp=tp)
    return c.num_experts, c.top_k, c.hidden_size, c.intermediate_size


def _sets(T, E, H, I, k, n):
    """n input sets of balanced grouped rows; m = T * k / E rows an expert."""
    m = T * k // E
    return m, [torch.randn(E, m, H, device="cuda", dtype=torch.bfloat16) for _ in range(n)]


def dense_bf16(name, T, n_sets):
    E, k, H, I = _cfg(name)
    m, xs = _sets(T, E, H, I, k, n_sets)
    w13 = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) * H ** -0.5
    w2 = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) * I ** -0.5
    w13t, w2t = w13.transpose(1, 2), w2.transpose(1, 2)          # [E, H, 2I], [E, I, H] column-major
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * m
    gmm = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)

    def layer(x, mm, ksum=True):
        g = mm(x, w13t)
        h = torch.nn.functional.silu(g[..., :I]) * g[..., I:]
        y = mm(h, w2t)
        return y.reshape(T, k, H).sum(1) if ksum else y

    bmm = torch.bmm
    res = {}
    for label, mm in (("bmm", bmm), ("grouped_mm", None)):
        if mm is None:
            if gmm is None:
                continue
            mm = (lambda a, b: gmm(a.reshape(-1, a.shape[-1]), b, offs=offs))
        res[label] = {
            "gemm1": time_graph([lambda x=x, mm=mm: mm(x, w13t) for x in xs]),
            "gemm1+act+gemm2": time_graph([lambda x=x, mm=mm: layer(x, mm, ksum=False) for x in xs]),
            "layer": time_graph([lambda x=x, mm=mm: layer(x, mm) for x in xs]),
        }
    return res


def dense_fp8(name, T, n_sets):
    E, k, H, I = _cfg(name)
    if not hasattr(torch, "_scaled_grouped_mm"):
        return {"error": "torch._scaled_grouped_mm missing"}
    m = T * k // E
    f8 = torch.float8_e4m3fn
    xs = [torch.randn(E * m, H, device="cuda").to(f8) for _ in range(n_sets)]
    hs = [torch.randn(E * m, I, device="cuda").to(f8) for _ in range(n_sets)]
    sx = torch.rand(E * m, device="cuda") + 0.5
    sh = torch.rand(E * m, device="cuda") + 0.5
    w13 = torch.randn(E, 2 * I, H, device="cuda").to(f8).transpose(1, 2)   # [E, H, 2I] column-major
    w2 = torch.randn(E, H, I, device="cuda").to(f8).transpose(1, 2)        # [E, I, H] column-major
    s13 = torch.rand(E, 2 * I, device="cuda") + 0.5
    s2 = torch.rand(E, H, device="cuda") + 0.5
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * m
    sgm = torch._scaled_grouped_mm

    def g1(x):
        return sgm(x, w13, sx, s13, offs=offs, out_dtype=torch.bfloat16)

    def g2(h):
        return sgm(h, w2, sh, s2, offs=offs, out_dtype=torch.bfloat16)

    def layer(x, h):
        g1(x)
        return g2(h).reshape(T, k, H).sum(1)

    return {"gemm1": time_graph([lambda x=x: g1(x) for x in xs]),
            "gemm2": time_graph([lambda h=h: g2(h) for h in hs]),
            "layer (gemms + k-sum, no quantization)": time_graph([lambda x=x, h=h: layer(x, h)
                                                                 for x, h in zip(xs, hs)])}


def loop_ratio(name, T, n_sets):
    """Per-expert cuBLAS GEMM1 + GEMM2 (balanced rows, no activation, no quantization) in one CUDA
    graph, 16-bit (torch.mm) against fp8 rowwise (torch._scaled_mm) and int8 (torch._int_mm, no
    scales): the same launch structure, so the ratio is the GEMMs' own 8-bit gain at this shape."""
    E, k, H, I = _cfg(name)
    m = T * k // E
    dev = "cuda"
    w13 = [torch.randn(2 * I, H, device=dev, dtype=torch.bfloat16) for _ in range(E)]
    w2 = [torch.randn(H, I, device=dev, dtype=torch.bfloat16) for _ in range(E)]
    res = {}

    def run(xs, hs, mm1, mm2):
        for e in range(E):
            mm1(xs[e], e)
            mm2(hs[e], e)

    xs = [[torch.randn(m, H, device=dev, dtype=torch.bfloat16) for _ in range(E)] for _ in range(n_sets)]
    hs = [[torch.randn(m, I, device=dev, dtype=torch.bfloat16) for _ in range(E)] for _ in range(n_sets)]
    res["bf16"] = time_graph([lambda a=a, b=b: run(a, b, lambda x, e: x @ w13[e].t(), lambda h, e: h @ w2[e].t())
                              for a, b in zip(xs, hs)])
    f8 = torch.float8_e4m3fn
    w13_8 = [w.to(f8) for w in w13]
    w2_8 = [w.to(f8) for w in w2]
    del w13, w2
    xs8 = [[x.to(f8) for x in s] for s in xs]
    hs8 = [[h.to(f8) for h in s] for s in hs]
    sa1 = torch.rand(m, 1, device=dev) + 0.5
    sb1 = torch.rand(1, 2 * I, device=dev) + 0.5
    sb2 = torch.rand(1, H, device=dev) + 0.5
    try:
        res["fp8"] = time_graph([lambda a=a, b=b: run(
            a, b, lambda x, e: torch._scaled_mm(x, w13_8[e].t(), scale_a=sa1, scale_b=sb1, out_dtype=torch.bfloat16),
            lambda h, e: torch._scaled_mm(h, w2_8[e].t(), scale_a=sa1, scale_b=sb2, out_dtype=torch.bfloat16))
            for a, b in zip(xs8, hs8)])
    except Exception as e:
        res["fp8"] = f"{type(e).__name__}: {e}"[:200]
    i8 = [w.view(torch.int8) for w in w13_8], [w.view(torch.int8) for w in w2_8]
    try:
        res["int8 (no scales)"] = time_graph([lambda a=a, b=b: run(
            [x.view(torch.int8) for x in a], [h.view(torch.int8) for h in b],
            lambda x, e: torch._int_mm(x, i8[0][e].t()), lambda h, e: torch._int_mm(h, i8[1][e].t()))
            for a, b in zip(xs8, hs8)])
    except Exception as e:
        res["int8 (no scales)"] = f"{type(e).__name__}: {e}"[:200]
    return res


@triton.jit
def _read_kernel(src, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Sum int32 words of [pid * ITERS * BLOCK, ...): a pure read of ``n`` words."""
    base = tl.program_id(0).to(tl.int64) * ITERS * BLOCK
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0)
    tl.store(out + tl.program_id(0), tl.sum(acc, 0))


def _read(buf, out, block=2048, iters=4):
    n = buf.numel()
    grid = (triton.cdiv(n, block * iters),)
    _read_kernel[grid](buf, out, n, BLOCK=block, ITERS=iters, num_warps=8)


def decode_read(name, T_hit_experts, n_sets, copy_gbps):
    """Bytes of `T_hit_experts` experts' fp8 weights read once: one kernel, then two."""
    E, k, H, I = _cfg(name)
    b1 = 2 * I * H + 4 * 2 * I                   # w13 fp8 + per-channel scales
    b2 = H * I + 4 * H
    n1 = T_hit_experts * b1 // 4
    n2 = T_hit_experts * b2 // 4
    bufs = [(torch.randint(-2 ** 30, 2 ** 30, (n1,), device="cuda", dtype=torch.int32),
             torch.randint(-2 ** 30, 2 ** 30, (n2,), device="cuda", dtype=torch.int32)) for _ in range(n_sets)]
    out = torch.empty(1 << 20, device="cuda", dtype=torch.int32)
    both = [torch.cat([a, b]) for a, b in bufs]
    one = time_graph([lambda c=c: _read(c, out) for c in both])
    two = time_graph([lambda a=a, b=b: (_read(a, out), _read(b, out)) for a, b in bufs])
    nbytes = 4 * (n1 + n2)
    roof = nbytes / (copy_gbps * 1e3)            # µs
    return {"bytes": nbytes, "read roofline us": roof, "one kernel us": one, "two kernels us": two,
            "one / roof": one / roof, "two / roof": two / roof}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--loop-points", default="qwen3:4096,qwen3:16384,deepseek:4096,deepseek:16384,mixtral:4096")
    ap.add_argument("--no-decode", dest="decode", action="store_false", help="skip the weight-read probe")
    ap.add_argument("--sets", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("dense_ceiling.py needs a CUDA GPU")
    ceil = measure_ceilings(fp8=True)
    print(f"{ceil.device}: copy {ceil.copy_gbps:.0f} GB/s, bf16 {ceil.matmul_tflops:.0f} TFLOP/s, "
          f"fp8 {ceil.fp8_tflops or 0:.0f} TFLOP/s", flush=True)
    report = {"ceilings": ceil.__dict__, "points": {}}
    for p in filter(None, a.points.split(",")):
        name, T = p.split(":")
        T = int(T)
        E, k, H, I = _cfg(name)
        fl = flops(T, k, H, I)
        hit = E if T * k >= 4 * E else min(E, T * k)
        roof = roofline_us(fl, moe_bytes(T, H, hit, expert_bytes(H, I)), ceil.matmul_tflops, ceil.copy_gbps)
        r = {"roofline_us": roof, "bf16": dense_bf16(name, T, a.sets)}
        try:
            r["fp8"] = dense_fp8(name, T, a.sets)
        except Exception as e:   # no fp8 grouped GEMM on this torch / GPU: say so
            r["fp8"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        report["points"][p] = r
        best = min(v["layer"] for v in r["bf16"].values())
        bestg = min(v["gemm1+act+gemm2"] for v in r["bf16"].values())
        line = (f"{p:16s} roofline {roof:8.1f} us | bf16 dense layer {best:8.1f} us ({100 * roof / best:5.1f}%)"
                f", without the k-sum {bestg:8.1f} ({100 * roof / bestg:5.1f}%)")
        f8 = r["fp8"]
        if "error" not in f8:
            lay = f8["layer (gemms + k-sum, no quantization)"]
            line += f" | fp8 dense {lay:8.1f} us = {best / lay:4.2f}x bf16 dense"
        print(line, flush=True)
        print("   ", json.dumps(r), flush=True)
        torch.cuda.empty_cache()
    for p in filter(None, a.loop_points.split(",")):
        name, T = p.split(":")
        r = loop_ratio(name, int(T), a.sets)
        report["points"][f"loop:{p}"] = r
        b = r["bf16"]
        print(f"per-expert cuBLAS loop {p:14s}: bf16 {b:8.1f} us" + "".join(
            f", {key} {v:8.1f} us ({b / v:4.2f}x)" if isinstance(v, float) else f", {key}: {v}"
            for key, v in r.items() if key != "bf16"), flush=True)
        torch.cuda.empty_cache()
    for name, hit in (("qwen3", 8), ("deepseek", 8), ("qwen3", 16), ("deepseek", 16)) if a.decode else ():
        d = decode_read(name, hit, 8, ceil.copy_gbps)
        report["points"][f"decode-read:{name}:{hit}experts"] = d
        print(f"decode read {name} {hit} experts: {d['bytes'] / 1e6:.1f} MB, roof {d['read roofline us']:.1f} us, "
              f"one kernel {d['one kernel us']:.1f} us ({d['one / roof']:.2f}x), "
              f"two kernels {d['two kernels us']:.1f} us ({d['two / roof']:.2f}x)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
