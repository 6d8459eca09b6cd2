"""Plain-torch quantize / dequantize / pack for every scheme: the ground truth.

Simple and readable rather than fast; kernels and backends are tested against this.
Weight layouts follow the table in ``fusedmoe.weights`` exactly.

Shape legend:
  T tokens (any leading dims of an activation ``x [..., K]`` count as T), K the
  reduction dim (H for w13, I for w2), E experts, out the GEMM output dim, g a group
  size along K, G = ceil(K / group), bn x bk the fp8_block weight block.

Formats:
  fp8      float8_e4m3fn, max 448; value = q * scale (scale = amax / 448, fp32).
  int8     symmetric, q = clamp(round_half_even(x / scale), -127, 127); -128 is never
           produced; scale = amax / 127.
  e2m1     4-bit float: code = sign (0x8) | index into E2M1_GRID (0, .5, 1, 1.5, 2, 3, 4, 6).
           Round to nearest, ties to the even code, saturate at +-6. The sign bit is copied
           from the input, so -0.1 gives code 0x8 ("-0"). NaN gives code 0x7 (+6), as a
           saturating hardware conversion does; NaN reaches the output through the scales.
  e8m0     uint8 biased exponent: 2**(u - 127); u = 0 is 2**-127, 255 is NaN.
  nvfp4    e2m1 values, float8_e4m3fn scale per 16 along K, fp32 global scale (multiplies):
           value = e2m1 * e4m3 * global_scale; global_scale = amax / (448 * 6).
  mxfp4    e2m1 values, e8m0 scale per 32 along K (OCP MX): shared exponent =
           floor(log2(block_amax)) - 2, so block values above 6 * 2**exp saturate at +-6.
  uint4    packing: element k lives in byte k // 2; even k = LOW nibble, odd k = high nibble.

Zero amax: dynamic scales use max(amax, 1e-12) so an all-zero group quantizes to zeros.

NaN / Inf policy: a non-finite input never turns into a finite result.
  - Dynamic scales come from ``_amax``, which maps an Inf amax to NaN: a group (tensor,
    token, 1 x group, weight row / block / K-group) containing NaN or +-Inf gets a NaN
    scale and dequantizes to all-NaN.
  - Static fp8 scales: a NaN/Inf element quantizes to fp8 NaN itself (torch would
    saturate Inf to 448, so Inf is mapped to NaN before the cast).
  - Integer codes of a NaN group are 0 (deterministic); the NaN lives in its scale.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

from ..config import QuantMethod, QuantScheme
from ..errors import ConfigTypeError, InputError

__all__ = [
    "FP8_MAX", "INT8_MAX", "E2M1_GRID", "E2M1_MAX",
    "float_to_e2m1", "e2m1_to_float", "pack_uint4", "unpack_uint4", "float_to_e8m0", "e8m0_to_float",
    "quant_fp8_tensor", "dequant_fp8_tensor", "quant_fp8_token", "dequant_fp8_token",
    "quant_fp8_group", "dequant_fp8_group", "quant_int8_token", "dequant_int8_token",
    "quant_nvfp4", "dequant_nvfp4", "fake_quant_activation",
    "quantize_weight", "dequantize_weight",
]

FP8_MAX = 448.0          # largest finite float8_e4m3fn
INT8_MAX = 127           # symmetric int8 range [-127, 127]
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)   # magnitude of e2m1 code 0..7
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
_AMAX_FLOOR = 1e-12      # amax used for an all-zero group (any positive scale would do)
_NAN = float("nan")

# Midpoints between consecutive grid values: the rounding boundaries of e2m1.
_E2M1_MIDS = tuple((a + b) / 2 for a, b in zip(E2M1_GRID[:-1], E2M1_GRID[1:]))  # 0.25 .. 5.0


# ----------------------------------------------------------------------------- helpers
def _check_float(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise ConfigTypeError(name, x, "torch.Tensor")
    if not x.is_floating_point():
        raise InputError(f"{name}.dtype", x.dtype, "a floating dtype (bfloat16, float16, float32)",
                         f"pass {name}.to(torch.bfloat16)")


def _amax(x: torch.Tensor, dim, keepdim: bool = True) -> torch.Tensor:
    """abs-max over ``dim`` in fp32 with Inf mapped to NaN (the NaN/Inf policy)."""
    a = x.float().abs()
    if dim is None:                 # the whole tensor, 0-d; an empty tensor (T = 0) has amax 0
        a = a.amax() if a.numel() else a.new_zeros(())
    else:
        a = a.amax(dim=dim, keepdim=keepdim)
    return torch.where(torch.isinf(a), _NAN, a)


def _to_fp8(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, saturating finite values at +-448, Inf -> NaN (torch saturates Inf)."""
    v = torch.where(torch.isinf(v), _NAN, v)
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-x.shape[-1]) % multiple
    return F.pad(x, (0, pad)) if pad else x


def _group_amax(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] -> fp32 [..., ceil(K/group)] abs-max of each group (last one may be partial)."""
    xp = _pad_last(x.float(), group)                                   # [..., G*group]
    return _amax(xp.unflatten(-1, (-1, group)), dim=-1, keepdim=False)  # [..., G]


def _expand_groups(s: torch.Tensor, group: int, K: int) -> torch.Tensor:
    """s [..., G] -> [..., K]: each group's value repeated over its columns."""
    return s.repeat_interleave(group, dim=-1)[..., :K]


def _round_codes(v: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """round half to even, clamp to [lo, hi]; NaN -> 0 (the NaN is kept by the scale)."""
    return torch.nan_to_num(torch.round(v), nan=0.0).clamp(lo, hi)


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """int32 ceil(log2(x)) for finite x > 0, exact (frexp, not log2)."""
    m, e = torch.frexp(x)          # x = m * 2**e, m in [0.5, 1)
    return torch.where(m == 0.5, e - 1, e)


def _floor_log2(x: torch.Tensor) -> torch.Tensor:
    """int32 floor(log2(x)) for finite x > 0, exact."""
    _, e = torch.frexp(x)
    return e - 1


# ----------------------------------------------------------------------------- e2m1, uint4, e8m0
def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """x float [...] -> uint8 e2m1 codes 0..15 [...] (see the module docstring for rounding)."""
    x = x.float()
    mag = x.abs()
    mids = torch.tensor(_E2M1_MIDS, dtype=torch.float32, device=x.device)
    lo = torch.bucketize(mag, mids, right=False)   # ties go to the lower index
    hi = torch.bucketize(mag, mids, right=True)    # ties go to the upper index
    idx = torch.where(lo % 2 == 0, lo, hi)         # differ only on a tie: pick the even code
    idx = torch.where(torch.isnan(x), 7, idx)      # NaN saturates (magnitude 6)
    sign = torch.signbit(x) & ~torch.isnan(x)
    return (idx | (sign.to(idx.dtype) << 3)).to(torch.uint8)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes [...] (0..15) -> fp32 values [...]."""
    if codes.dtype != torch.uint8:
        raise InputError("codes.dtype", codes.dtype, [torch.uint8], "e2m1 codes are uint8 0..15")
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    lut = torch.cat([grid, -grid])                  # [16]: code 8 + i is -GRID[i]
    return lut[codes.long()]


def pack_uint4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K] values 0..15 -> uint8 [..., K/2]; element k in byte k//2, even k = low nibble."""
    if q.dtype != torch.uint8:
        raise InputError("q.dtype", q.dtype, [torch.uint8], "pass 4-bit codes as uint8 0..15")
    if q.shape[-1] % 2:
        raise InputError("q.shape[-1]", q.shape[-1], "an even number", "pad K to an even size before packing")
    if q.numel() and int(q.max()) > 15:
        raise InputError("q", f"max value {int(q.max())}", "values 0..15", "mask or clamp the codes to 4 bits")
    return q[..., 0::2] | (q[..., 1::2] << 4)        # [..., K/2]


def unpack_uint4(p: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 [..., K] values 0..15 (inverse of ``pack_uint4``)."""
    if p.dtype != torch.uint8:
        raise InputError("p.dtype", p.dtype, [torch.uint8], "packed 4-bit data is uint8")
    return torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2)   # [..., K/2, 2] -> [..., K]


def float_to_e8m0(scale: torch.Tensor) -> torch.Tensor:
    """fp32 scale [...] -> uint8 e8m0 [...]: 2**ceil(log2(scale)) (a power of two is exact).

    0 -> 0 (2**-127, the smallest); values below 2**-127 clamp to 0, above 2**127 to 254;
    NaN, +-Inf and negative scales -> 255 (NaN).
    """
    s = scale.float()
    bad = ~torch.isfinite(s) | (s < 0)
    safe = torch.where(bad | (s == 0), 1.0, s)
    u = (_ceil_log2(safe) + 127).clamp(0, 254)
    u = torch.where(s == 0, 0, u)
    u = torch.where(bad, 255, u)
    return u.to(torch.uint8)


def e8m0_to_float(u: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 [...] -> fp32 2**(u - 127) [...], exact (built from the fp32 bit pattern); 255 -> NaN."""
    if u.dtype != torch.uint8:
        raise InputError("u.dtype", u.dtype, [torch.uint8], "e8m0 exponents are uint8")
    ui = u.to(torch.int32)
    bits = ui << 23                                              # exponent field = u: 2**(u-127) for 1..254
    bits = torch.where(ui == 0, 1 << 22, bits)                   # 2**-127 is an fp32 subnormal
    bits = torch.where(ui == 255, 0x7FC00000, bits)              # quiet NaN
    return bits.view(torch.float32)


# ----------------------------------------------------------------------------- activations
def quant_fp8_tensor(x: torch.Tensor, scale=None):
    """x float [T, K] -> (float8_e4m3fn [T, K], fp32 [1]). Dynamic scale = amax(x) / 448 unless given."""
    _check_float("x", x)
    if scale is None:
        s = (_amax(x, dim=None, keepdim=False).clamp(min=_AMAX_FLOOR) / FP8_MAX).reshape(1)   # [1]
    else:
        s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
        if s.numel() != 1:
            raise InputError("scale", tuple(s.shape), "one element (a per-tensor scale)", "pass a float or a [1] tensor")
        s = s.reshape(1)
    return _to_fp8(x.float() / s), s


def dequant_fp8_tensor(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(fp8 [T, K], fp32 [1]) -> fp32 [T, K]."""
    return q.float() * scale


def quant_fp8_token(x: torch.Tensor):
    """x float [T, K] -> (float8_e4m3fn [T, K], fp32 [T, 1]); scale per row = amax / 448."""
    _check_float("x", x)
    s = _amax(x, dim=-1).clamp(min=_AMAX_FLOOR) / FP8_MAX               # [T, 1]
    return _to_fp8(x.float() / s), s


def dequant_fp8_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(fp8 [T, K], fp32 [T, 1]) -> fp32 [T, K]."""
    return q.float() * scale


def quant_fp8_group(x: torch.Tensor, group: int = 128, pow2: bool = False):
    """x float [T, K] -> (float8_e4m3fn [T, K], fp32 [T, ceil(K/group)]): 1 x group blocks.

    DeepSeek-V3 activations. ``pow2`` rounds each scale UP to a power of two (UE8M0-style
    scales; values then use less than the full fp8 range). The last group may be partial.
    """
    _check_float("x", x)
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise InputError("group", group, "a positive int", "use 128 (DeepSeek-V3)")
    K = x.shape[-1]
    s = _group_amax(x, group).clamp(min=_AMAX_FLOOR) / FP8_MAX          # [T, G]
    if pow2:
        s = e8m0_to_float(float_to_e8m0(s))                             # [T, G], 2**ceil(log2 s)
    return _to_fp8(x.float() / _expand_groups(s, group, K)), s


def dequant_fp8_group(q: torch.Tensor, scale: torch.Tensor, group: int = 128) -> torch.Tensor:
    """(fp8 [T, K], fp32 [T, ceil(K/group)]) -> fp32 [T, K]."""
    return q.float() * _expand_groups(scale, group, q.shape[-1])


def quant_int8_token(x: torch.Tensor):
    """x float [T, K] -> (int8 [T, K], fp32 [T, 1]); symmetric, scale = amax / 127, round half to even."""
    _check_float("x", x)
    s = _amax(x, dim=-1).clamp(min=_AMAX_FLOOR) / INT8_MAX              # [T, 1]
    return _round_codes(x.float() / s, -INT8_MAX, INT8_MAX).to(torch.int8), s


def dequant_int8_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(int8 [T, K], fp32 [T, 1]) -> fp32 [T, K]."""
    return q.float() * scale


def _nvfp4_encode(x: torch.Tensor, gs: torch.Tensor):
    """x fp32 [..., K] (K % 16 == 0), gs fp32 broadcastable to [..., 1]
    -> (uint8 packed [..., K/2], float8_e4m3fn [..., K/16])."""
    xb = x.unflatten(-1, (-1, NVFP4_BLOCK))                              # [..., K/16, 16]
    bs = _amax(xb, dim=-1, keepdim=False) / E2M1_MAX / gs               # [..., K/16] fp32
    bs8 = _to_fp8(bs)                                                   # [..., K/16] e4m3
    denom = (bs8.float() * gs).unsqueeze(-1)                            # [..., K/16, 1]
    v = torch.where(denom > 0, xb / denom, 0.0)                         # block scale underflowed to 0 -> 0
    codes = float_to_e2m1(v).flatten(-2)                                # [..., K]
    return pack_uint4(codes), bs8


def _nvfp4_decode(p: torch.Tensor, bs8: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    v = e2m1_to_float(unpack_uint4(p))                                  # [..., K]
    return v * _expand_groups(bs8.float(), NVFP4_BLOCK, v.shape[-1]) * gs


def quant_nvfp4(x: torch.Tensor, global_scale=None):
    """x float [T, K] -> (uint8 packed [T, K/2], float8_e4m3fn [T, K/16], fp32 [1]).

    Dynamic global scale gs = amax(x) / (448 * 6), so each block scale
    (block_amax / 6) / gs fits e4m3; value = e2m1 * e4m3 * gs.
    """
    _check_float("x", x)
    if x.shape[-1] % NVFP4_BLOCK:
        raise InputError("x.shape[-1]", x.shape[-1], f"a multiple of {NVFP4_BLOCK}",
                         "nvfp4 scales blocks of 16 along K; pad K")
    if global_scale is None:
        gs = (_amax(x, dim=None, keepdim=False).clamp(min=_AMAX_FLOOR) / (FP8_MAX * E2M1_MAX)).reshape(1)
    else:
        gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
        if gs.numel() != 1:
            raise InputError("global_scale", tuple(gs.shape), "one element", "pass a float or a [1] tensor")
        gs = gs.reshape(1)
    p, bs8 = _nvfp4_encode(x.float(), gs)
    return p, bs8, gs


def dequant_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """(uint8 [T, K/2], float8_e4m3fn [T, K/16], fp32 [1]) -> fp32 [T, K]."""
    return _nvfp4_decode(packed, block_scale, global_scale)


def fake_quant_activation(x: torch.Tensor, scheme: Union[QuantScheme, str], static_scale=None) -> torch.Tensor:
    """The quantize -> dequantize a scheme applies to a GEMM input. x float [T, K] -> fp32 [T, K].

    fp8_tensor: per-tensor over the whole x (dynamic), or ``static_scale`` (required when
    scheme.static_activation_scale); fp8_channel: per-token fp8; fp8_block: 1 x bk groups
    (scheme.scale_pow2); int8_channel: per-token int8; nvfp4: dynamic ``quant_nvfp4``;
    none and the weight-only schemes: identity (x.float()).
    """
    _check_float("x", x)
    scheme = QuantScheme.parse(scheme)
    m = scheme.method
    if static_scale is not None and m != QuantMethod.FP8_TENSOR:
        raise InputError("static_scale", static_scale, [None], f"{m.value} has no static activation scale")
    if m == QuantMethod.FP8_TENSOR:
        if scheme.static_activation_scale and static_scale is None:
            raise InputError("static_scale", None, "a float or a [1] fp32 tensor",
                             "fp8_tensor:static needs the calibrated input scale (a13_scale / a2_scale)")
        return dequant_fp8_tensor(*quant_fp8_tensor(x, static_scale))
    if m == QuantMethod.FP8_CHANNEL:
        return dequant_fp8_token(*quant_fp8_token(x))
    if m == QuantMethod.FP8_BLOCK:
        bk = scheme.block_shape[1]
        q, s = quant_fp8_group(x, bk, pow2=scheme.scale_pow2)
        return dequant_fp8_group(q, s, bk)
    if m == QuantMethod.INT8_CHANNEL:
        return dequant_int8_token(*quant_int8_token(x))
    if m == QuantMethod.NVFP4:
        return dequant_nvfp4(*quant_nvfp4(x))
    assert not m.quantizes_activations, m
    return x.float()


# ----------------------------------------------------------------------------- weights
def _block_amax(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """w [E, out, K] -> fp32 [E, ceil(out/bn), ceil(K/bk)] abs-max per block (edge blocks partial)."""
    wp = _pad_last(_pad_last(w.float(), bk).transpose(1, 2), bn).transpose(1, 2)   # [E, out', K']
    E, o, k = wp.shape
    return _amax(wp.reshape(E, o // bn, bn, k // bk, bk), dim=(2, 4), keepdim=False)


def _expand_blocks(s: torch.Tensor, bn: int, bk: int, out: int, K: int) -> torch.Tensor:
    """s [E, ceil(out/bn), ceil(K/bk)] -> [E, out, K]."""
    return s.repeat_interleave(bn, dim=1)[:, :out].repeat_interleave(bk, dim=2)[:, :, :K]


def _weight_group(scheme: QuantScheme) -> Optional[int]:
    """K-group of the weight scales (None = one scale per row)."""
    if scheme.method in (QuantMethod.INT4_W4A16, QuantMethod.INT8_W8A16, QuantMethod.NVFP4, QuantMethod.MXFP4):
        return scheme.group_size
    return None


def quantize_weight(w: torch.Tensor, scheme: Union[QuantScheme, str], *, name: str = "w") -> dict:
    """w float [E, out, K] -> dict(w=, scale=, zero=, global_scale=) in ``scheme`` (absent: None).

    Layouts per the table in ``fusedmoe.weights``. ``name`` is used in error messages.
    Asymmetric (has_zero_point) ranges always include 0 (min <= 0 <= max, as GPTQ does):
      int4_w4a16: s = (max - min) / 15, z = clamp(round(-min / s), 0, 15),
                  q = clamp(round(w / s) + z, 0, 15), value = (q - z) * s.
      int8_w8a16: s = (max - min) / 255, z = clamp(round(-min / s), 0, 255),
                  q = clamp(round(w / s) + z, 0, 255), stored w = int8(q - 128), zero = uint8(z),
                  value = (w + 128 - z) * s.
    Symmetric: int4 s = amax / 7, q = clamp(round(w / s) + 8, 0, 15), value = (q - 8) * s;
    int8 s = amax / 127, q = clamp(round(w / s), -127, 127).
    """
    _check_float(name, w)
    scheme = QuantScheme.parse(scheme)
    m = scheme.method
    if w.dim() != 3:
        raise InputError(f"{name}.shape", tuple(w.shape), "3-D [E, out, K]", "stack the experts along dim 0")
    E, out, K = w.shape
    res = dict(w=w, scale=None, zero=None, global_scale=None)
    if m == QuantMethod.NONE:
        return res
    g = _weight_group(scheme)
    if g is not None and K % g:
        raise InputError(f"{name}.shape[2]", K, f"a multiple of group_size={g} ({m.value})",
                         "choose a group size that divides K (hidden_size for w13, intermediate_size for w2)")
    wf = w.float()                                                      # [E, out, K]

    if m in (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_W8A16, QuantMethod.FP8_BLOCK):
        if m == QuantMethod.FP8_BLOCK:
            bn, bk = scheme.block_shape
            s = _block_amax(wf, bn, bk).clamp(min=_AMAX_FLOOR) / FP8_MAX       # [E, ceil(out/bn), ceil(K/bk)]
            full = _expand_blocks(s, bn, bk, out, K)                           # [E, out, K]
        elif m == QuantMethod.FP8_TENSOR:
            s = _amax(wf, dim=(1, 2), keepdim=False).clamp(min=_AMAX_FLOOR) / FP8_MAX   # [E]
            full = s[:, None, None]
        else:
            s = _amax(wf, dim=2, keepdim=False).clamp(min=_AMAX_FLOOR) / FP8_MAX        # [E, out]
            full = s[:, :, None]
        res.update(w=_to_fp8(wf / full), scale=s)
        return res

    if m == QuantMethod.INT8_CHANNEL or (m == QuantMethod.INT8_W8A16 and not scheme.has_zero_point):
        wg = wf.unflatten(-1, (-1, g)) if g else wf.unsqueeze(-2)       # [E, out, K/g or 1, g or K]
        s = _amax(wg, dim=-1).clamp(min=_AMAX_FLOOR) / INT8_MAX         # [E, out, K/g or 1, 1]
        q = _round_codes(wg / s, -INT8_MAX, INT8_MAX).to(torch.int8).flatten(-2)   # [E, out, K]
        res.update(w=q, scale=s.flatten(-2) if g else s.reshape(E, out))
        return res

    if m in (QuantMethod.INT8_W8A16, QuantMethod.INT4_W4A16):
        qmax = 255 if m == QuantMethod.INT8_W8A16 else 15
        wg = wf.unflatten(-1, (-1, g))                                  # [E, out, K/g, g]
        if scheme.has_zero_point:
            # wg.amin/amax propagate NaN; an Inf gives inf - (-inf) or inf - x = inf -> mapped to NaN
            lo = wg.amin(-1, keepdim=True).clamp(max=0.0)               # [E, out, K/g, 1]
            hi = wg.amax(-1, keepdim=True).clamp(min=0.0)
            rng = hi - lo
            rng = torch.where(torch.isinf(rng), _NAN, rng)
            s = rng.clamp(min=_AMAX_FLOOR) / qmax
            z = _round_codes(-lo / s, 0, qmax)                          # [E, out, K/g, 1]
        else:  # int4 symmetric (int8 symmetric handled above)
            s = _amax(wg, dim=-1).clamp(min=_AMAX_FLOOR) / 7
            z = torch.full_like(s, 8.0)
        q = _round_codes(wg / s + z, 0, qmax).flatten(-2)               # [E, out, K] 0..qmax
        if m == QuantMethod.INT8_W8A16:
            qw = (q - 128).to(torch.int8)                               # [E, out, K]
        else:
            qw = pack_uint4(q.to(torch.uint8))                          # [E, out, K/2]
        res.update(w=qw, scale=s.squeeze(-1),
                   zero=z.squeeze(-1).to(torch.uint8) if scheme.has_zero_point else None)
        return res

    if m == QuantMethod.NVFP4:
        gs = _amax(wf, dim=(1, 2), keepdim=False).clamp(min=_AMAX_FLOOR) / (FP8_MAX * E2M1_MAX)   # [E]
        p, bs8 = _nvfp4_encode(wf, gs[:, None, None])                  # [E, out, K/2], [E, out, K/16]
        res.update(w=p, scale=bs8, global_scale=gs)
        return res

    if m == QuantMethod.MXFP4:
        wg = wf.unflatten(-1, (-1, MXFP4_BLOCK))                        # [E, out, K/32, 32]
        a = _amax(wg, dim=-1, keepdim=False)                            # [E, out, K/32]
        safe = torch.where(torch.isnan(a) | (a == 0), 1.0, a)
        u = (_floor_log2(safe) - 2 + 127).clamp(0, 254)                 # OCP: floor(log2 amax) - emax(e2m1)=2
        u = torch.where(a == 0, 0, u)
        u = torch.where(torch.isnan(a), 255, u).to(torch.uint8)        # [E, out, K/32] e8m0
        v = wg / e8m0_to_float(u).unsqueeze(-1)                         # [E, out, K/32, 32], |v| < 8
        res.update(w=pack_uint4(float_to_e2m1(v).flatten(-2)), scale=u)
        return res

    raise AssertionError(f"unhandled scheme {m}")


def dequantize_weight(w: torch.Tensor, scheme: Union[QuantScheme, str], scale=None, zero=None,
                      global_scale=None) -> torch.Tensor:
    """Quantized weight (layout per ``fusedmoe.weights``) -> fp32 [E, out, K], K logical (unpacked)."""
    scheme = QuantScheme.parse(scheme)
    m = scheme.method
    if m == QuantMethod.NONE:
        return w.float()
    if scale is None:
        raise InputError("scale", None, "the weight scale tensor", f"{m.value} weights need their scales")
    if scheme.has_zero_point and zero is None:
        raise InputError("zero", None, "a uint8 [E, out, K/g] tensor", "has_zero_point=True needs zero points")
    if m == QuantMethod.NVFP4 and global_scale is None:
        raise InputError("global_scale", None, "fp32 [E]", "nvfp4 needs the per-expert global scale")
    g = _weight_group(scheme)

    if m == QuantMethod.FP8_TENSOR:
        return w.float() * scale.float().reshape(-1, 1, 1)
    if m in (QuantMethod.FP8_CHANNEL, QuantMethod.FP8_W8A16, QuantMethod.INT8_CHANNEL) \
            or (m == QuantMethod.INT8_W8A16 and g is None):
        return w.float() * scale.float().unsqueeze(-1)
    if m == QuantMethod.FP8_BLOCK:
        bn, bk = scheme.block_shape
        return w.float() * _expand_blocks(scale.float(), bn, bk, w.shape[1], w.shape[2])
    if m == QuantMethod.INT8_W8A16:
        K = w.shape[-1]
        if zero is None:  # grouped symmetric: value = w * s
            return w.float() * _expand_groups(scale.float(), g, K)
        return (w.float() + 128 - _expand_groups(zero.float(), g, K)) * _expand_groups(scale.float(), g, K)
    if m == QuantMethod.INT4_W4A16:
        q = unpack_uint4(w).float()                                     # [E, out, K] 0..15
        K = q.shape[-1]
        z = zero.float() if zero is not None else torch.full_like(scale.float(), 8.0)   # [E, out, K/g]
        return (q - _expand_groups(z, g, K)) * _expand_groups(scale.float(), g, K)
    if m == QuantMethod.NVFP4:
        return _nvfp4_decode(w, scale, global_scale.float().reshape(-1, 1, 1))
    if m == QuantMethod.MXFP4:
        v = e2m1_to_float(unpack_uint4(w))                              # [E, out, K]
        return v * _expand_groups(e8m0_to_float(scale), MXFP4_BLOCK, v.shape[-1])
    raise AssertionError(f"unhandled scheme {m}")

