"""Registers / spills / shared memory of every compiled variant of the grouped GEMM kernel in
this process, after running ``profile_stages`` inside it (a diagnostic for the GPU).

    python benchmarks/kernel_resources.py --model deepseek-v3:8 --quant fp8_block --tokens 16384
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def report(fn) -> list[str]:
    out = []
    caches = getattr(fn, "device_caches", {})
    for dev, entry in caches.items():
        cache = entry[0] if isinstance(entry, tuple) else entry
        for key, k in cache.items():
            md = getattr(k, "metadata", None)
            out.append(f"dev {dev}: regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')} "
                       f"shared {getattr(md, 'shared', '?')} warps {getattr(md, 'num_warps', '?')} "
                       f"stages {getattr(md, 'num_stages', '?')}")
    return out


def main() -> int:
    from benchmarks.profile_stages import main as prof
    prof(sys.argv[1:])
    from fusedmoe.kernels import grouped_gemm as gg
    for line in report(gg._moe_gemm_kernel):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
