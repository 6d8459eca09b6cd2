"""One-token 8-bit decode, kernel by kernel: where the resident GEMM2's time goes (GPU).

    python3 benchmarks/resident_ab.py [--cases qwen3-30b-a3b:1:fp8_channel,...] [--persist 0,2,3]
                                      [--warps 4,8,16]

Per case (the layer's own converted weights, T = 1, rotating input sets so that L2 does not
hold the weights, CUDA-graph µs):
  * GEMM1 alone (kernels/decode.py) with the grid of one program an item (persist 0) and with at
    most P programs an SM (``persist`` P), GB/s of its 8-bit weights;
  * GEMM2 alone: the a16 CUDA-core kernel (decode.py, its default tile), and the resident one
    (kernels/decode_resident.py) at each num_warps: its copies and sums with h already there;
  * the layer (prepare_experts, FUSEDMOE_DECODE_RESIDENT 0 / each P).
A diagnostic for the resident path's parts; ``decode_ab.py`` section R is the layer A/B.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fusedmoe.bench import harness as hz  # noqa: E402
from fusedmoe.kernels import decode as dk  # noqa: E402
from fusedmoe.kernels import decode_resident as dr  # noqa: E402
from fusedmoe.kernels.grouped_gemm import _num_sms  # noqa: E402
from fusedmoe.kernels.launcher import launch  # noqa: E402
from fusedmoe.layer import prepare_experts  # noqa: E402
from fusedmoe.presets import get_preset  # noqa: E402


def us(fn, sets):
    return hz.time_impl(fn, sets, graph=True, eager=False).us_graph


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block")
    ap.add_argument("--persist", default="0,1,2,3,4")
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--layer", default="0,2,3")
    a = ap.parse_args()
    bw = hz.measure_ceilings("cuda").copy_gbps
    print(f"copy {bw:.0f} GB/s", flush=True)
    for case in a.cases.split(","):
        name, tp, scheme = case.split(":")
        cfg = get_preset(name).to_config(tp=int(tp))
        w0 = hz.make_weights(cfg, scheme, "cuda", seed=0)
        os.environ["FUSEDMOE_DECODE_RESIDENT"] = "0"
        pe = prepare_experts(cfg, w0, "triton")
        ex = pe.kernel.experts
        w = ex.weights
        q = dict(quant=ex.quant_mode, block_shape=ex.block_shape)
        sets = hz.make_input_sets(cfg, 1, "cuda", seed=1, weight_bytes=0)
        k, H, I = cfg.top_k, cfg.hidden_size, cfg.intermediate_size
        h = torch.randn(k, I, device="cuda").to(cfg.torch_dtype)
        hh = torch.empty_like(h)
        out = torch.empty(1, H, device="cuda", dtype=cfg.torch_dtype)
        b1 = w.w13.numel() // w.w13.shape[0] * k * w.w13.element_size()
        b2 = w.w2.numel() // w.w2.shape[0] * k * w.w2.element_size()
        act = cfg.activation.value
        for p in [int(v) for v in a.persist.split(",")]:
            t = us(lambda x, tw, ids: launch(*dk.gemm1_launch(x, w.w13, ids, act, hh, b_scale=w.w13_scale,
                                                              persist=p, **q)), sets)
            print(f"{case:32s} gemm1 persist={p}: {t:7.2f} us  {b1 / t / 1e3:6.0f} GB/s ({100 * b1 / t / 1e3 / bw:.0f}%)",
                  flush=True)
        t = us(lambda x, tw, ids: dk.decode_gemm2(h, w.w2, ids, tw, out, b_scale=w.w2_scale, **q), sets)
        print(f"{case:32s} gemm2 a16: {t:7.2f} us  {b2 / t / 1e3:6.0f} GB/s ({100 * b2 / t / 1e3 / bw:.0f}%)", flush=True)
        gk = ex.block_shape[1] if ex.quant_mode == "block" else None
        gn = ex.block_shape[0] if ex.quant_mode == "block" else None
        for nw in [int(v) for v in a.warps.split(",")]:
            c = dr.resident_config(1, k, H, I, 1, _num_sms(h.device), gk, group_n=gn, num_warps=nw)
            t = us(lambda x, tw, ids: launch(*dr.resident_gemm2_launch(h, w.w2, ids, tw, out, config=c,
                                                                      b_scale=w.w2_scale, **q)), sets)
            print(f"{case:32s} gemm2 resident w{nw} {c}: {t:7.2f} us  {b2 / t / 1e3:6.0f} GB/s "
                  f"({100 * b2 / t / 1e3 / bw:.0f}%)", flush=True)
        del pe
        for v in a.layer.split(","):
            os.environ["FUSEDMOE_DECODE_RESIDENT"] = v
            pe = prepare_experts(cfg, w0, "triton")
            chk = hz.check_against(pe, hz.make_check_case(cfg, w0, 1, "cuda"))
            t = us(pe, sets)
            print(f"{case:32s} layer resident={v}: {t:7.2f} us ok={chk.ok}", flush=True)
        os.environ.pop("FUSEDMOE_DECODE_RESIDENT", None)
        del w0, pe, ex, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
