"""Warp-specialized grouped GEMMs (triton's Hopper autoWS) against the shipped kernels, per GEMM.

    python3 benchmarks/ws_ab.py [--cases qwen3:16384:none,...] [--out FILE]   (on an sm_90 GPU)

Why: triton 3.6 partitions a `tl.range(..., warp_specialize=True)` loop on sm_90 into a TMA
producer warp group and two consumer warp groups (12 warps, setmaxnreg) when the kernel is
launched with num_warps=4 AND both dot operands come from tensor descriptors (a pointer load in
the loop fails the pass; triton 3.9 crashes on num_warps=4 and ignores it on 8). The grouped
GEMMs gather A rows through sorted_ids (pointer loads), so a warp-specialized version needs A
in sorted order: GEMM1 reads x_sorted [max_padded, H] (a gathered copy: the W8A8 x quantizer
could write it), GEMM2 reads h_sorted (GEMM1 writes h in sorted order instead of slot order).
This script measures the GEMMs alone: the shipped kernel and config vs prototype kernels with
and without warp specialization over a few tiles, plus the cost of the gathered copy, and
checks each prototype's output against the shipped kernel's. Every (case, variant) runs in a
child process with a timeout.

Session 14's answer (H100, docs/BENCHMARKS.md fourteenth section): with host-side descriptors
the warp-specialized kernels HANG (dense and grouped alike); with device-side descriptors
(``:dev`` / ``:flat`` variants of the dense case) they run but are no faster than the same tile
without specialization (bf16 128x256: 747 vs 746 TFLOP/s).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402


@triton.jit
def _proto_gemm(a_desc, b_desc, c_ptr, sorted_ptr, eids_ptr, ntpp_ptr, as_ptr, bs_ptr, w_ptr,
                N_OUT, num_pairs, num_m, stride_cm, K: tl.constexpr,
                C_DIV: tl.constexpr, GATED: tl.constexpr, SCALES: tl.constexpr, MUL_W: tl.constexpr,
                SORTED_OUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                GROUP_M: tl.constexpr, WS: tl.constexpr, NO_IF: tl.constexpr = False):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N_OUT, BN)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % rows_in_group
    pid_n = (pid % in_group) // rows_in_group
    e = tl.load(eids_ptr + pid_m)
    live = (pid_m * BM < tl.load(ntpp_ptr)) & (e >= 0)
    if NO_IF:       # no branch around the warp-specialized loop: dead tiles compute expert 0
        e = tl.maximum(e, 0)
        live = True
    if live:
        nb = N_OUT * (2 if GATED else 1)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k in tl.range(0, K, BK, warp_specialize=WS):
            a = a_desc.load([pid_m * BM, k])
            b = b_desc.load([e * nb + pid_n * BN, k])
            acc = tl.dot(a, b.T, acc)
            if GATED:
                bu = b_desc.load([e * nb + N_OUT + pid_n * BN, k])
                acc_u = tl.dot(a, bu.T, acc_u)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        n_ok = offs_n < N_OUT
        if SCALES:      # per-row A scales (sorted order), per-column B scales
            sa = tl.load(as_ptr + offs_m)[:, None]
            acc = acc * sa * tl.load(bs_ptr + e * nb + offs_n, mask=n_ok, other=0.0)[None, :]
            if GATED:
                acc_u = acc_u * sa * tl.load(bs_ptr + e * nb + N_OUT + offs_n, mask=n_ok, other=0.0)[None, :]
        if GATED:
            acc = acc * tl.sigmoid(acc) * acc_u
        slots = tl.load(sorted_ptr + offs_m)
        ok = slots < num_pairs
        if MUL_W:
            acc = acc * tl.load(w_ptr + slots, mask=ok, other=0.0)[:, None]
        if SORTED_OUT:      # every row, padding included (GEMM2 reads them, never stores them)
            tl.store(c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
                     mask=n_ok[None, :])
        else:
            tl.store(c_ptr + (slots // C_DIV).to(tl.int64)[:, None] * stride_cm + offs_n[None, :],
                     acc.to(c_ptr.dtype.element_ty), mask=ok[:, None] & n_ok[None, :])


@triton.jit
def _mm_tile(a_desc, b_desc, c_ptr, pid_m, pid_n, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, WS: tl.constexpr):
    """One [BM, BN] tile of c = a @ b^T from tensor descriptors (the loop WS may specialize)."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        acc = tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([pid_n * BN, k]).T, acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16))


@triton.jit
def _plain_mm(a_desc, b_desc, c_ptr, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              WS: tl.constexpr):
    _mm_tile(a_desc, b_desc, c_ptr, tl.program_id(0), tl.program_id(1), N, K, BM, BN, BK, WS)


@triton.jit
def _plain_mm_dev(a_ptr, b_ptr, c_ptr, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, WS: tl.constexpr, FLAT: tl.constexpr):
    """_plain_mm with device-side tensor descriptors (triton's persistent-matmul tutorial's
    warp-specialized form); FLAT: a persistent tile loop around the K loop."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    if FLAT:
        num_n = N // BN
        for t in range(tl.program_id(0), (M // BM) * num_n, tl.num_programs(0)):
            _mm_tile(a_desc, b_desc, c_ptr, t // num_n, t % num_n, N, K, BM, BN, BK, WS)
    else:
        _mm_tile(a_desc, b_desc, c_ptr, tl.program_id(0), tl.program_id(1), N, K, BM, BN, BK, WS)


def plain_case(dt_name: str, variant: str, log):
    """A dense [8192, 8192] x [8192, 8192]^T GEMM: does warp specialization run, and pay?"""
    dt = torch.float8_e4m3fn if dt_name == "fp8" else torch.bfloat16
    M = N = K = 8192
    a = torch.randn(M, K, device="cuda").to(dt)
    b = torch.randn(N, K, device="cuda").to(dt)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    dev_desc, flat = variant.endswith(":dev"), variant.endswith(":flat")
    ws, bn, st, warps = _parse_variant(variant.rsplit(":", 1)[0] if dev_desc or flat else variant)
    bk = 128 if dt_name == "fp8" else 64
    if dev_desc or flat:        # device-side descriptors need a global scratch allocator
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        grid = (torch.cuda.get_device_properties(0).multi_processor_count,) if flat else (M // 128, N // bn)
        fn = lambda: _plain_mm_dev[grid](a, b, c, M, N, K=K, BM=128, BN=bn, BK=bk, WS=ws, FLAT=flat,  # noqa: E731
                                         num_warps=warps, num_stages=st)
    else:
        ad = TensorDescriptor.from_tensor(a, [128, bk])
        bd = TensorDescriptor.from_tensor(b, [bn, bk])
        fn = lambda: _plain_mm[(M // 128, N // bn)](ad, bd, c, N, K=K, BM=128, BN=bn, BK=bk, WS=ws,  # noqa: E731
                                                     num_warps=warps, num_stages=st)
    fn()
    torch.cuda.synchronize()
    err = rel(c, (a.float() @ b.float().T))
    t = bench_us(fn)
    log(f"  plain {dt_name} {variant:24s}{t:8.1f} us  {2 * M * N * K / t / 1e6:6.0f} TFLOP/s  rel err {err:.2e}")


def _parse_variant(v: str):
    """'ws:bn:stages:warps' -> (bool, int, int, int)."""
    w, bn, st, warps = v.split(":")
    return w == "ws", int(bn), int(st), int(warps)


def proto(a_sorted, w, c, align, *, n_out, gated, c_div, sorted_out, bn, bk, stages, ws, warps,
          a_scale_sorted=None, b_scale=None, topk_w=None, group_m=8, no_if=False):
    BM = align.block_m
    K = a_sorted.shape[1]
    num_m = align.max_padded // BM
    a_desc = TensorDescriptor.from_tensor(a_sorted, [BM, bk])
    b_desc = TensorDescriptor.from_tensor(w.view(-1, K), [bn, bk])
    grid = (num_m * triton.cdiv(n_out, bn),)
    dummy = align.sorted_ids
    _proto_gemm[grid](a_desc, b_desc, c, align.sorted_ids, align.expert_ids, align.num_tokens_post_padded,
                      a_scale_sorted if a_scale_sorted is not None else dummy,
                      b_scale if b_scale is not None else dummy, topk_w if topk_w is not None else dummy,
                      n_out, align.num_pairs, num_m, c.stride(0), K=K, C_DIV=c_div, GATED=gated,
                      SCALES=a_scale_sorted is not None, MUL_W=topk_w is not None, SORTED_OUT=sorted_out,
                      BM=BM, BN=bn, BK=bk, GROUP_M=group_m, WS=ws, NO_IF=no_if, num_warps=warps, num_stages=stages)


def bench_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(preset: str, tp: int, T: int, scheme: str, which: str, variant: str, log):
    from fusedmoe.kernels import grouped_gemm as gg
    from fusedmoe.kernels.align import align_block_size
    from fusedmoe.platform import Platform
    from fusedmoe.presets import get_preset
    from fusedmoe.tuning import LaunchConfigs
    cfg = get_preset(preset).to_config(tp=tp)
    E, H, I, k = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    dev = "cuda"
    fp8 = scheme == "fp8_channel"
    dt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    c1, c2 = LaunchConfigs.for_config(cfg, scheme, Platform.current()).get(T)
    BM = c1["BLOCK_SIZE_M"]
    if variant == "shipped":
        log(f"  shipped configs: gemm1 {c1} gemm2 {c2}")
    ids = torch.rand(T, E, device=dev, generator=g).argsort(dim=1)[:, :k].to(torch.int32).contiguous()
    tw = torch.rand(T, k, device=dev, generator=g)
    align = align_block_size(ids, BM, E)            # the shipped kernels'
    n = T * k
    palign = align_block_size(ids, 128, E)          # the prototypes': BM 128 (two 64-row consumers)
    mp = palign.max_padded
    sorted_ids = palign.sorted_ids
    pos_ok = sorted_ids < n
    q = {}
    if which == "gemm1":
        x = torch.randn(T, H, device=dev, generator=g).to(dt)
        w = (torch.randn(E, 2 * I, H, device=dev, generator=g) / H ** 0.5).to(dt)
        if fp8:
            xs = torch.rand(T, 1, device=dev, generator=g) * 0.01 + 0.005
            ws_ = torch.rand(E, 2 * I, device=dev, generator=g) * 0.01 + 0.005
            q = dict(quant="channel", a_scale=xs, b_scale=ws_)
        h = torch.empty(n, I, device=dev, dtype=torch.bfloat16)
        shipped = lambda: gg.gemm1_act(x, w, align, k, "silu", h, config=c1, **q)  # noqa: E731
        rows = torch.where(pos_ok, sorted_ids // k, 0).long()
        x_sorted = x.view(torch.uint8)[rows].view(dt) if fp8 else x[rows]
        gather_us = bench_us(lambda: torch.index_select(x.view(torch.uint8) if fp8 else x, 0, rows))
        as_sorted = q["a_scale"][rows, 0].contiguous() if fp8 else None
        out = torch.empty(mp, I, device=dev, dtype=torch.bfloat16)
        kw = dict(n_out=I, gated=True, c_div=1, sorted_out=True, a_scale_sorted=as_sorted,
                  b_scale=q.get("b_scale"))
        a_sorted = x_sorted

        def check():
            return rel(out[pos_ok], h[sorted_ids[pos_ok].long()])
    else:
        hq = torch.randn(n, I, device=dev, generator=g).to(dt)
        w = (torch.randn(E, H, I, device=dev, generator=g) / I ** 0.5).to(dt)
        if fp8:
            hs = torch.rand(n, 1, device=dev, generator=g) * 0.01 + 0.005
            ws_ = torch.rand(E, H, device=dev, generator=g) * 0.01 + 0.005
            q = dict(quant="channel", a_scale=hs, b_scale=ws_)
        y = torch.empty(n, H, device=dev, dtype=torch.bfloat16)
        shipped = lambda: gg._launch(hq, w, y, align, n_out=H, a_div=1, c_div=1, act=gg._NO_ACT, config=c2,  # noqa: E731
                                     topk_weights=tw, **q)
        slots = torch.where(pos_ok, sorted_ids, 0).long()
        a_sorted = hq.view(torch.uint8)[slots].view(dt) if fp8 else hq[slots]
        gather_us = float("nan")
        as_sorted = q["a_scale"][slots, 0].contiguous() if fp8 else None
        out = torch.empty(n, H, device=dev, dtype=torch.bfloat16)
        kw = dict(n_out=H, gated=False, c_div=1, sorted_out=False, a_scale_sorted=as_sorted,
                  b_scale=q.get("b_scale"), topk_w=tw)

        def check():
            return rel(out, y)
    flops = 2 * n * H * I * (2 if which == "gemm1" else 1)
    if variant == "shipped":
        shipped()
        torch.cuda.synchronize()
        us = bench_us(shipped)
        log(f"  shipped                     {us:8.1f} us  {flops / us / 1e6:6.0f} TFLOP/s"
            + (f"   (gathered copy of x: {gather_us:.1f} us)" if which == "gemm1" else ""))
        return
    ws, bn, st, warps = _parse_variant(variant[:variant.rindex(":noif")] if variant.endswith(":noif") else variant)
    no_if = variant.endswith(":noif")
    bk = 128 if fp8 else 64
    shipped()                   # the reference output for check()
    out.zero_()
    proto(a_sorted, w, out, palign, bn=bn, bk=bk, stages=st, ws=ws, warps=warps, no_if=no_if, **kw)
    torch.cuda.synchronize()
    err = check()
    t = bench_us(lambda: proto(a_sorted, w, out, palign, bn=bn, bk=bk, stages=st, ws=ws, warps=warps, no_if=no_if,
                               **kw))
    log(f"  {variant:28s}{t:8.1f} us  {flops / t / 1e6:6.0f} TFLOP/s  rel err {err:.2e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="plain:fp8,qwen3-30b-a3b:1:16384:fp8_channel:gemm2")
    ap.add_argument("--variants", default="shipped,ws:128:3:4,ws:128:3:4:noif,nows:128:3:8",
                    help="'shipped' or ws|nows:BN:stages:warps[:noif] (BN of the prototype; plain cases skip "
                         "'shipped' and ':noif')")
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per variant (a child process each)")
    ap.add_argument("--deadline", type=float, default=540.0)
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:                 # one (case, variant) in this process
        case, variant = a.child
        if case.startswith("plain:"):
            plain_case(case.split(":")[1], variant, print)
        else:
            p, tp, T, s_, which = case.split(":")
            run_case(p, int(tp), int(T), s_, which, variant, print)
        return 0
    import subprocess
    t0 = time.time()
    f = open(a.out, "w") if a.out else None

    def log(s):
        print(s, flush=True)
        if f:
            f.write(s + "\n")
            f.flush()
    log(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    for c in a.cases.split(","):
        log(f"\n== {c}")
        for v in a.variants.split(","):
            if c.startswith("plain:") and (v == "shipped" or v.endswith(":noif")) or (
                    not c.startswith("plain:") and (v.endswith(":dev") or v.endswith(":flat"))):
                continue
            if time.time() - t0 > a.deadline:
                log(f"  deadline: skipped {v}")
                continue
            try:
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", c, v], capture_output=True,
                                   text=True, timeout=a.timeout)
                lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
                if r.returncode:
                    err = [ln for ln in r.stderr.splitlines() if ln.strip()][-3:]
                    lines.append(f"  {v:28s} FAILED rc {r.returncode}: {' | '.join(err)[:300]}")
            except subprocess.TimeoutExpired:
                lines = [f"  {v:28s} HUNG (killed after {a.timeout:.0f} s)"]
            for ln in lines:
                log(ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
