"""Triton helpers that several kernel modules share: the gated-activation epilogues, the
fp8 / int8 rounding (bit-exact twins of ``fusedmoe.reference.quant``), the programmatic
dependent launch waits, and the host-side arguments every GEMM launcher builds the same way.

Two activation epilogues, on purpose: ``_activation`` (integer ids, ``ACTIVATIONS``) is the
grouped / decode GEMMs' epilogue; ``gated_activation`` / ``plain_activation`` (string ids) are
the batched GEMM's and the fused act-and-quantize kernel's, whose clamps keep a NaN
(``tl.where``, not ``tl.minimum``, like the reference's clamp) and whose sigmoid keeps the
relative precision of tiny results. One calling the other would change one path's results.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

try:  # grid dependency control (programmatic dependent launch, sm90+)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_GDC = True
except ImportError:  # pragma: no cover - traced only with PDL on, which needs them
    HAS_GDC = False
    gdc_launch_dependents = gdc_wait = None


# activation name -> constexpr id of the epilogue
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "swigluoai": 3,
               "relu2_no_mul": 4, "silu_no_mul": 5, "gelu_no_mul": 6}

_RNE_MAGIC = tl.constexpr(12582912.0)   # 1.5 * 2^23: (y + it) - it = y rounded half to even, |y| < 2^22


@triton.jit
def _sigmoid(x):
    # exp(-|x|) never overflows, and e / (1 + e) keeps the relative precision of tiny results
    e = tl.exp(-tl.abs(x))
    r = 1.0 / (1.0 + e)
    return tl.where(x >= 0, r, e * r)


@triton.jit
def _clamp_max(x, hi):
    # where(), not tl.minimum: minimum may drop a NaN on the GPU, the reference's clamp keeps it
    return tl.where(x > hi, hi, x)


@triton.jit
def _clamp_sym(x, lim):
    return tl.where(x > lim, lim, tl.where(x < -lim, -lim, x))


@triton.jit
def gated_activation(g, u, ACTIVATION: tl.constexpr, CLAMP: tl.constexpr, swiglu_limit, alpha, limit):
    """act(gate, up) in fp32, the math of ``fusedmoe.reference.activations``."""
    if ACTIVATION == "silu":
        if CLAMP:
            g = _clamp_max(g, swiglu_limit)
            u = _clamp_sym(u, swiglu_limit)
        out = g * _sigmoid(g) * u
    elif ACTIVATION == "gelu":
        out = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476)) * u
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * g * (1 + tanh(z)) == g * sigmoid(2z): no tanh needed (libdevice is absent
        # under the interpreter)
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        out = g * _sigmoid(2.0 * z) * u
    else:  # swigluoai
        tl.static_assert(ACTIVATION == "swigluoai")
        g = _clamp_max(g, limit)
        u = _clamp_sym(u, limit)
        out = (u + 1.0) * g * _sigmoid(alpha * g)
    return out


@triton.jit
def plain_activation(x, ACTIVATION: tl.constexpr):
    """Non-gated activations (*_no_mul) in fp32; "none" is the identity."""
    if ACTIVATION == "relu2_no_mul":
        r = tl.where(x > 0.0, x, 0.0)
        x = r * r
    elif ACTIVATION == "silu_no_mul":
        x = x * _sigmoid(x)
    elif ACTIVATION == "gelu_no_mul":
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    else:
        tl.static_assert(ACTIVATION == "none")
    return x


@triton.jit
def _abs_bits(x):
    """int32 bits of |x| (fp32): integer order = float order, NaN > Inf > finite."""
    return x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _scale_from_amax_bits(bits, QMAX: tl.constexpr, POW2: tl.constexpr):
    """fp32 scale = max(amax, 1e-12) / QMAX, NaN if amax is NaN or Inf; optionally 2**ceil(log2)."""
    amax = bits.to(tl.float32, bitcast=True)
    amax = tl.where(bits >= 0x7F800000, float("nan"), amax)
    amax = tl.where(amax < 1e-12, 1e-12, amax)          # NaN < x is False: NaN survives
    s = tl.math.div_rn(amax, QMAX)
    if POW2:
        # exact ceil to a power of two: drop the mantissa, bump the exponent if it was not 0.
        # s >= 1e-12 / 448 is a normal fp32, so the exponent never underflows.
        sb = s.to(tl.int32, bitcast=True)
        e = (sb >> 23) + ((sb & 0x7FFFFF) != 0).to(tl.int32)
        s = tl.where(s != s, s, (e << 23).to(tl.float32, bitcast=True))
    return s


@triton.jit
def _fp8_e4m3_bits(y):
    """fp32 -> float8_e4m3fn bit pattern (int32 0..255) with integer math: round to nearest
    even, saturate at +-448, NaN/Inf -> 0x7F | sign. Used under the interpreter, whose
    float->fp8 cast rounds ties up and loses the carry into the exponent."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    bad = a >= 0x7F800000
    a = tl.minimum(a, 0x43E00000)                       # 448.0: the largest finite e4m3
    exp = a >> 23
    # normal e4m3 (|y| >= 2**-6, fp32 exponent >= 121): keep 3 mantissa bits
    m_n = a >> 20
    rem_n = a & 0xFFFFF
    up_n = (rem_n > 0x80000) | ((rem_n == 0x80000) & ((m_n & 1) == 1))
    r_n = m_n + up_n.to(tl.int32) - (120 << 3)          # rebias 127 -> 7; a carry bumps the exponent
    # subnormal e4m3: integer multiple of 2**-9 (shift capped: anything below 2**-11 rounds to 0)
    sig = (a & 0x7FFFFF) | 0x800000
    sh = tl.minimum(tl.maximum(141 - exp, 1), 25)
    m_s = sig >> sh
    rem_s = sig & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    up_s = (rem_s > half) | ((rem_s == half) & ((m_s & 1) == 1))
    r_s = m_s + up_s.to(tl.int32)
    r = tl.where(exp >= 121, r_n, r_s)
    r = tl.where(bad, 0x7F, r)
    return r | sign


@triton.jit
def _quantize(x, scale, QTYPE: tl.constexpr, BITWISE_FP8: tl.constexpr, RCP: tl.constexpr = False):
    """x (any float) / scale -> the value to store: fp8 (or its uint8 bits), or int8.

    RCP: the quotient from the correctly rounded reciprocal of the scale (one division per
    scale, not per element) and one Markstein correction, q = x*r, q += (x - q*s)*r with
    fused multiply-adds: the correctly rounded x / s (Markstein's theorem; quotients here
    are at most 448 in magnitude, so nothing overflows), a zero keeping x's sign. Fewer
    instructions than ``div_rn`` per element, which is what the requantization of h spends
    its issue slots on (ncu)."""
    if RCP:
        xf = x.to(tl.float32)
        inv = tl.math.div_rn(1.0, scale)
        q = xf * inv
        y = tl.math.fma(tl.math.fma(-q, scale, xf), inv, q)
        y = tl.where(q == 0.0, q, y)                    # -0 stays -0 (x / s would keep it)
    else:
        y = tl.math.div_rn(x.to(tl.float32), scale)     # IEEE division, like the reference's x / s
    if QTYPE == "int8":
        y = tl.where(y != y, 0.0, _clamp_sym(y, 127.0))
        # round half to even by the fp32 adder: at 1.5 * 2^23 the spacing of floats is 1, so
        # y + C rounds y to an integer (nearest, ties to even) and - C is exact (|y| <= 127).
        # Two adds where floor + a tie fix-up took ~10 instructions; bitwise the same codes
        # (no fast-math reassociation in triton; numpy's fp32 under the interpreter too)
        r = (y + _RNE_MAGIC) - _RNE_MAGIC
        return r.to(tl.int8)
    else:
        tl.static_assert(QTYPE == "fp8")
        if BITWISE_FP8:
            return _fp8_e4m3_bits(y).to(tl.uint8)
        else:
            y = tl.where(tl.abs(y) == float("inf"), float("nan"), y)
            y = tl.where(y != y, y, _clamp_sym(y, 448.0))
            return y.to(tl.float8e4nv)                  # cvt.rn: round to nearest even


@triton.jit
def _gelu_erf(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def _activation(g, u, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, limit, alpha):
    """Epilogue activation in fp32; ``u`` is ignored for the *_no_mul ids (4..6)."""
    if ACT == 0:                                      # silu(min(g,L)) * clamp(u, -L, L)
        if HAS_LIMIT:
            g = tl.minimum(g, limit)
            u = tl.minimum(tl.maximum(u, -limit), limit)
        h = g * tl.sigmoid(g) * u
    elif ACT == 1:
        h = _gelu_erf(g) * u
    elif ACT == 2:                                    # tanh(z) = 2*sigmoid(2z) - 1: no libdevice needed
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        h = g * tl.sigmoid(2.0 * z) * u               # 0.5*g*(1 + tanh(z)) = g*sigmoid(2z)
    elif ACT == 3:                                    # swigluoai (gpt-oss), halves layout here
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        h = (u + 1.0) * g * tl.sigmoid(alpha * g)
    elif ACT == 4:
        r = tl.maximum(g, 0.0)
        h = r * r
    elif ACT == 5:
        h = g * tl.sigmoid(g)
    else:
        h = _gelu_erf(g)
    return h


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """Output dtype for a quantized (fp8/int8) input: bf16; else the input's own dtype."""
    return t.dtype if t.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.bfloat16


def _scale_args(quant: str, a_scale, b_scale, block_shape, a, b, a_group: Optional[int] = None):
    """(A_SCALE id, B_SCALE id, GROUP_N, GROUP_K, a_scale ptr, b_scale ptr, 5 strides).
    ``a_group``: a_scale [M, K/g] holds 1 x g group scales of A with any ``quant`` of B."""
    if quant == "none" and a_scale is None and b_scale is None:
        return 0, 0, 1, 1, a, a, 0, 0, 0, 0, 0
    if quant == "block":
        gn, gk = block_shape
        a_mode = 3 if a_scale is not None else 0
        b_mode = 3 if b_scale is not None else 0
    else:
        gn, gk = 1, (a_group or 1)
        a_mode = 0 if a_scale is None else (3 if a_group else (1 if a_scale.numel() == 1 else 2))
        b_mode = 0 if b_scale is None else {"tensor": 1, "channel": 2}[quant]
    sa = a_scale if a_scale is not None else a
    sb = b_scale if b_scale is not None else a
    sam = a_scale.stride(0) if a_mode >= 2 else 0
    sak = a_scale.stride(1) if a_mode == 3 else 0
    sbe = b_scale.stride(0) if b_mode >= 1 else 0
    sbn = b_scale.stride(1) if b_mode >= 2 else 0
    sbk = b_scale.stride(2) if b_mode == 3 else 0
    return a_mode, b_mode, gn, gk, sa, sb, sam, sak, sbe, sbn, sbk


_NUM_SMS: dict = {}


def _num_sms(device: torch.device) -> int:
    """SMs of ``device``, cached (a launch must not query the driver). Off CUDA (the
    interpreter) 4, so that small test problems still give each program several tiles."""
    n = _NUM_SMS.get(device)
    if n is None:
        n = _NUM_SMS[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                                if device.type == "cuda" else 4)
    return n
