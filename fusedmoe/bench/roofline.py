"""Roofline arithmetic and the device's measured ceilings.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate size (per partition).

TFLOP/s counts 6*T*k*H*I for gated activations (4*T*k*H*I otherwise); bytes are the weights of
the experts actually hit (scales included) + x + out; the roofline is max(FLOPs / peak, bytes /
bandwidth) with peak and bandwidth MEASURED on this device (a device-to-device copy counting
read + write; an 8192^3 bf16 matmul on random data).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..config import QuantMethod, QuantScheme
from .timing import _time_cpu, _time_cuda

__all__ = ["flops", "weight_bytes", "expert_bytes", "moe_bytes", "roofline_us", "pct_of_roofline",
           "peak_for_scheme", "Ceilings", "measure_ceilings", "l2_bytes"]

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
