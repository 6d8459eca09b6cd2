"""Per-kernel benchmark: every Triton kernel of fusedmoe/kernels/ against its plain-torch reference.

    python benchmarks/bench_kernels.py [--json out.json] [--only NAME[,NAME]]

On a CUDA GPU each entry is checked against its reference once, then both are timed with
``triton.testing.do_bench`` (median, ms -> µs). Shapes are the DeepSeek-V3 / Qwen3 ones
where the kernel's cost matters. The layer-level comparison with peers is ``fusedmoe bench``.

``KERNELS`` is the registry the meta-test (tests/test_meta.py) checks: every kernel module
has an entry here, a reference and a test file.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Entry:
    module: str          # fusedmoe.kernels.<module>
    reference: str       # where its plain-torch reference lives
    test: str            # its test file
    make: Callable       # (device) -> (kernel_fn, reference_fn, check(out_kernel, out_ref) -> bool)


def _routing(dev):
    from fusedmoe.config import Routing
    from fusedmoe.kernels.routing import fused_topk
    from fusedmoe.reference.routing import route
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4096, 256, generator=g).to(dev)
    bias = (torch.randn(256, generator=g) * 0.1).to(dev)
    r = Routing(scoring="sigmoid", num_groups=8, topk_groups=4, has_correction_bias=True, routed_scaling_factor=2.5)
    k = lambda: fused_topk(logits, 8, sigmoid=True, renormalize=True, correction_bias=bias, num_groups=8,  # noqa: E731
                           topk_groups=4, routed_scaling_factor=2.5)
    ref = lambda: (lambda res: (res.topk_weights, res.topk_ids))(route(logits, 8, r, bias))  # noqa: E731
    return k, ref, lambda a, b: bool((a[1] == b[1]).float().mean() > 0.999)


def _align(dev):
    from fusedmoe.kernels.align import align_block_size
    from fusedmoe.reference.kernels import align_ref
    ids = torch.randint(0, 128, (4096, 8), generator=torch.Generator().manual_seed(1)).int().to(dev)
    k = lambda: align_block_size(ids, 64, 128)                               # noqa: E731
    ref = lambda: align_ref(ids, 64, 128)                                    # noqa: E731

    def check(a, b):
        total = int(b[2])
        return int(a.num_tokens_post_padded) == total and torch.equal(
            a.expert_ids[: total // 64].cpu(), b[1].cpu())
    return k, ref, check


def _gemm(dev):
    from fusedmoe.kernels.grouped_gemm import moe_forward_triton
    from fusedmoe.reference.moe import moe_ref
    g = torch.Generator().manual_seed(2)
    E, H, I, T, k = 128, 2048, 768, 1024, 8
    x = torch.randn(T, H, generator=g).to(dev, torch.bfloat16)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dev, torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dev, torch.bfloat16)
    tw, ti = torch.softmax(torch.randn(T, E, generator=g), -1).topk(k)
    tw, ti = (tw / tw.sum(-1, keepdim=True)).to(dev), ti.int().to(dev)
    kern = lambda: moe_forward_triton(x, w13, w2, tw, ti)                     # noqa: E731
    ref = lambda: moe_ref(x, w13, w2, tw, ti)                                # noqa: E731
    return kern, ref, lambda a, b: bool(((a.float() - b.float()).norm() / b.float().norm()) < 2e-2)


def _decode(dev):
    from fusedmoe.kernels.decode import decode_forward
    from fusedmoe.reference.moe import moe_ref
    g = torch.Generator().manual_seed(5)
    E, H, I, T, k = 128, 2048, 768, 1, 8                                     # qwen3-30b-a3b decode
    x = torch.randn(T, H, generator=g).to(dev, torch.bfloat16)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dev, torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dev, torch.bfloat16)
    tw, ti = torch.softmax(torch.randn(T, E, generator=g), -1).topk(k)
    tw, ti = (tw / tw.sum(-1, keepdim=True)).to(dev), ti.int().to(dev)
    kern = lambda: decode_forward(x, w13, w2, tw, ti)                         # noqa: E731
    ref = lambda: moe_ref(x, w13, w2, tw, ti)                                # noqa: E731
    return kern, ref, lambda a, b: bool(((a.float() - b.float()).norm() / b.float().norm()) < 2e-2)


def _decode_tc(dev):
    # qwen3-30b-a3b fp8_channel at T=4: the W8A8 decode the triton backend runs by default
    # there (w8a8_decode 'auto', fusedmoe/plan.py), x and h quantized per token by the scheme's kernels
    from fusedmoe.bench.harness import make_weights
    from fusedmoe.kernels.decode_tc import tc_decode
    from fusedmoe.quantize import quantize_activation
    from fusedmoe.presets import get_preset
    from fusedmoe.reference.moe import reference_moe
    cfg = get_preset("qwen3-30b-a3b").to_config()
    w = make_weights(cfg, "fp8_channel", dev, seed=6)
    g = torch.Generator().manual_seed(6)
    T = 4
    x = torch.randn(T, cfg.hidden_size, generator=g).to(dev, torch.bfloat16)
    tw, ti = torch.softmax(torch.randn(T, cfg.num_experts, generator=g), -1).topk(cfg.top_k)
    tw, ti = (tw / tw.sum(-1, keepdim=True)).to(dev), ti.int().to(dev)

    def kern():
        xq, xs = quantize_activation(x, w.scheme)
        return tc_decode(xq, w.w13, w.w2, tw, ti, x_scale=xs, w13_scale=w.w13_scale, w2_scale=w.w2_scale,
                         quantize_h=lambda h: quantize_activation(h, w.scheme))[1]
    ref = lambda: reference_moe(x, w, tw, ti, cfg, quantize_activations=True)   # noqa: E731
    return kern, ref, lambda a, b: bool(((a.float() - b.float()).norm() / b.float().norm()) < 3e-2)


def _quantize(dev):
    from fusedmoe.kernels import quantize as kq
    from fusedmoe.reference import quant as rq
    x = torch.randn(4096, 7168, generator=torch.Generator().manual_seed(3)).to(dev, torch.bfloat16)
    k = lambda: kq.quant_fp8_group(x, 128)                                   # noqa: E731
    ref = lambda: rq.quant_fp8_group(x, 128)                                 # noqa: E731
    return k, ref, lambda a, b: bool(torch.allclose(a[1], b[1], rtol=1e-6))


def _batched(dev):
    from fusedmoe.kernels.batched_gemm import batched_gemm1_act, default_batched_config
    g = torch.Generator().manual_seed(4)
    E, Tm, H, I = 32, 128, 7168, 256
    x = torch.randn(E, Tm, H, generator=g).to(dev, torch.bfloat16)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dev, torch.bfloat16)
    counts = torch.randint(0, Tm + 1, (E,), generator=g).int().to(dev)
    cfg = default_batched_config(Tm, E, 2 * I, H, torch.bfloat16)
    kern = lambda: batched_gemm1_act(x, counts, w13, "silu", config=cfg)     # noqa: E731

    def ref():
        h = torch.bmm(x.float(), w13.float().transpose(1, 2))                # [E, Tm, 2I]
        return torch.nn.functional.silu(h[..., :I]) * h[..., I:]

    def check(a, b):
        rows = torch.arange(Tm, device=a.device)[None, :] < counts[:, None]
        return bool(((a.float() - b)[rows].norm() / b[rows].norm()) < 2e-2)
    return kern, ref, check


KERNELS = {
    "routing": Entry("routing", "fusedmoe/reference/routing.py", "tests/test_kernels_routing.py", _routing),
    "align": Entry("align", "fusedmoe/reference/kernels.py", "tests/test_kernels_gemm.py", _align),
    "grouped_gemm": Entry("grouped_gemm", "fusedmoe/reference/kernels.py", "tests/test_kernels_gemm.py", _gemm),
    "decode": Entry("decode", "fusedmoe/reference/kernels.py", "tests/test_kernels_decode.py", _decode),
    "decode_tc": Entry("decode_tc", "fusedmoe/reference/moe.py", "tests/test_kernels_decode_tc.py", _decode_tc),
    "quantize": Entry("quantize", "fusedmoe/reference/quant.py", "tests/test_kernels_quantize.py", _quantize),
    "batched_gemm": Entry("batched_gemm", "tests/test_kernels_batched.py (batched_gemm*_ref)",
                          "tests/test_kernels_batched.py", _batched),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA GPU (the kernels' CPU path is the Triton interpreter)", file=sys.stderr)
        return 2
    from triton.testing import do_bench
    names = args.only.split(",") if args.only else list(KERNELS)
    rows = []
    for name in names:
        kern, ref, check = KERNELS[name].make("cuda")
        ok = check(kern(), ref())
        t_k = do_bench(kern, warmup=25, rep=200, return_mode="median") * 1e3
        t_r = do_bench(ref, warmup=5, rep=100, return_mode="median") * 1e3
        rows.append({"kernel": name, "ok": ok, "us_kernel": t_k, "us_reference": t_r, "speedup": t_r / t_k})
        print(f"{name:14s} {'ok  ' if ok else 'FAIL'} kernel {t_k:9.1f} us   reference {t_r:9.1f} us   "
              f"{t_r / t_k:6.1f}x")
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=2)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
