"""Tolerances: how far a backend may be from ``torch_ref`` on the same inputs and weights.

Metric: relative Frobenius error ||out - ref|| / ||ref|| (SQNR = -20 log10 of it).
Both sides use the SAME quantized weights and the same activation quantization rules, so
what remains is rounding: the 16-bit storage of intermediates (bf16 has 8 mantissa bits:
~2^-9 = 2e-3 relative per element; a GEMM of length K averages it down, the second GEMM
and the activation add a few times that), different accumulation orders, and - for the
schemes that requantize GEMM2's input - values that sit on a rounding boundary of the
8-bit grid and land on the neighbour (fp8 e4m3 has 3 mantissa bits: one step is 6-12%
of the value, but only a small fraction of elements flip, so the norm moves ~1e-2).
Measured worst cases are in tests; the bounds leave about 3x headroom.
"""
from __future__ import annotations

from .config import QuantMethod

# activation dtype -> bound for 16-bit weights
DTYPE_TOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}

# schemes whose GEMM inputs are re-quantized between the GEMMs (boundary flips): looser
_REQUANT = (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_BLOCK,
            QuantMethod.INT8_CHANNEL, QuantMethod.NVFP4)


def tolerance(dtype: str, method) -> float:
    """Relative Frobenius bound of a backend vs torch_ref for this activation dtype and scheme."""
    base = DTYPE_TOL[dtype]
    m = QuantMethod(method)
    if m in _REQUANT:
        return max(base, 4e-2 if m != QuantMethod.NVFP4 else 8e-2)
    return base


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp64 (NaN if either has a NaN)."""
    o, r = out.double(), ref.double()
    den = r.norm().item()
    return (o - r).norm().item() / den if den > 0 else (o - r).norm().item()
