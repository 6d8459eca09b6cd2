"""The expert weights of one layer in one quantization scheme, and their checks.

Canonical (checkpoint-facing) layout per scheme; backends may convert once at load.
E = local experts, N = 2I (gated) or I, H hidden, K = the reduction dim of the GEMM
(H for w13, I for w2), "out" = the output dim (N for w13, H for w2).

| scheme        | w (w13 / w2)                   | scale                                  | extra                        |
|---------------|--------------------------------|----------------------------------------|------------------------------|
| none          | [E, out, K] bf16/fp16/fp32     | -                                      |                              |
| fp8_tensor    | [E, out, K] float8_e4m3fn      | [E] fp32 (per expert)                  | a13/a2_scale [1] if static   |
| fp8_channel   | [E, out, K] float8_e4m3fn      | [E, out] fp32                          |                              |
| fp8_block     | [E, out, K] float8_e4m3fn      | [E, ceil(out/bn), ceil(K/bk)] fp32     | (weight_scale_inv)           |
| int8_channel  | [E, out, K] int8               | [E, out] fp32                          |                              |
| int8_w8a16    | [E, out, K] int8               | [E, out] or [E, out, K/g] fp32         | zero [E, out, K/g] uint8     |
| int4_w4a16    | [E, out, K/2] uint8 (2 / byte) | [E, out, K/g] fp32                     | zero [E, out, K/g] uint8     |
| fp8_w8a16     | [E, out, K] float8_e4m3fn      | [E, out] fp32                          |                              |
| nvfp4         | [E, out, K/2] uint8 (e2m1 x2)  | [E, out, K/16] float8_e4m3fn           | global_scale [E] fp32        |
| mxfp4         | [E, out, K/2] uint8 (e2m1 x2)  | [E, out, K/32] uint8 (e8m0 exponents)  |                              |

Packing of 4-bit values: element k is in byte k // 2; even k in the low nibble, odd k in
the high nibble. int4 values are unsigned 0..15, value = (q - zero) * scale with zero = 8
when the scheme has no zero points. nvfp4 dequant = e2m1 * fp8_scale * global_scale
(global_scale multiplies; the checkpoint's ``weight_scale_2``). mxfp4: e2m1 * 2**(e8m0 - 127).
Biases (optional): w13_bias [E, N], w2_bias [E, H] in the activation dtype or fp32.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from .config import MoEConfig, QuantMethod, QuantScheme, _replace
from .errors import ConfigError, ConfigTypeError, InputError

__all__ = ["ExpertWeights"]

_WEIGHT_DTYPES = {
    QuantMethod.FP8_TENSOR: (torch.float8_e4m3fn,), QuantMethod.FP8_CHANNEL: (torch.float8_e4m3fn,),
    QuantMethod.FP8_BLOCK: (torch.float8_e4m3fn,), QuantMethod.FP8_W8A16: (torch.float8_e4m3fn,),
    QuantMethod.INT8_CHANNEL: (torch.int8,), QuantMethod.INT8_W8A16: (torch.int8,),
    QuantMethod.INT4_W4A16: (torch.uint8,), QuantMethod.NVFP4: (torch.uint8,), QuantMethod.MXFP4: (torch.uint8,),
    QuantMethod.NONE: (torch.bfloat16, torch.float16, torch.float32),
}
_PACKED = (QuantMethod.INT4_W4A16, QuantMethod.NVFP4, QuantMethod.MXFP4)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_scale_values(name: str, t: Optional[torch.Tensor], *, nan_ok: bool, zero_ok: bool = False) -> None:
    """Raise InputError when a float scale tensor holds a value <= 0 (< 0 with ``zero_ok``),
    +-Inf, or NaN (unless ``nan_ok``). Integer scales (mxfp4's e8m0 exponents) are all valid."""
    if t is None or not t.is_floating_point() or t.device.type == "meta" or t.numel() == 0:
        return
    v = t.float() if t.element_size() == 1 else t              # e4m3 compares need a wider type
    bad = torch.isinf(v) | ((v < 0) if zero_ok else (v <= 0))
    if not nan_ok:
        bad |= torch.isnan(v)
    if bool(bad.any()):
        i = tuple(int(j) for j in bad.nonzero()[0])
        accepted = "finite values >= 0" if zero_ok else "finite values > 0"
        raise InputError(name, f"{float(v[i])} at index {i}", accepted + ("" if nan_ok else " (no NaN)"),
                         "pass the checkpoint's (calibrated) scales, or quantize with fusedmoe.quantize_experts",
                         problem="holds a bad scale")


@dataclass
class ExpertWeights:
    """Weights (+ scales) of E local experts in ``scheme``. See the module table for layouts."""

    w13: torch.Tensor
    w2: torch.Tensor
    scheme: QuantScheme = dataclasses.field(default_factory=QuantScheme)
    w13_scale: Optional[torch.Tensor] = None
    w2_scale: Optional[torch.Tensor] = None
    w13_zero: Optional[torch.Tensor] = None
    w2_zero: Optional[torch.Tensor] = None
    w13_global_scale: Optional[torch.Tensor] = None   # nvfp4
    w2_global_scale: Optional[torch.Tensor] = None    # nvfp4
    a13_scale: Optional[torch.Tensor] = None          # fp8_tensor static input scale of GEMM1, [1] fp32
    a2_scale: Optional[torch.Tensor] = None           # fp8_tensor static input scale of GEMM2, [1] fp32
    w13_bias: Optional[torch.Tensor] = None           # [E, N]
    w2_bias: Optional[torch.Tensor] = None            # [E, H]

    def __post_init__(self):
        """Types, and the values of the scales: a zero activation scale divides by zero (every
        output NaN) and a zero or negative weight scale zeroes or flips a channel silently, so
        both are refused here, once, at load time (this reads the scales: a device sync, never
        in the forward pass). A NaN weight scale is accepted: it is how ``quantize_experts``
        carries a NaN weight, and it propagates to the output instead of hiding."""
        if isinstance(self.scheme, str):
            self.scheme = QuantScheme.parse(self.scheme)
        elif not isinstance(self.scheme, QuantScheme):
            raise ConfigTypeError("scheme", self.scheme, "fusedmoe.QuantScheme or a scheme name such as 'fp8_block'")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "scheme" or isinstance(v, torch.Tensor):
                continue
            if v is not None or f.name in ("w13", "w2"):
                raise ConfigTypeError(f.name, v, "torch.Tensor" + ("" if f.name in ("w13", "w2") else " or None"),
                                      "build the weights with fusedmoe.quantize_experts or a from_* loader")
        if torch.compiler.is_compiling():
            return
        for name in ("a13_scale", "a2_scale"):
            _check_scale_values(name, getattr(self, name), nan_ok=False)
        for name in ("w13_scale", "w2_scale", "w13_global_scale", "w2_global_scale"):
            # nvfp4's e4m3 block scales may be 0 (a block that underflowed holds zeros)
            zero_ok = self.scheme.method == QuantMethod.NVFP4 and name in ("w13_scale", "w2_scale")
            _check_scale_values(name, getattr(self, name), nan_ok=True, zero_ok=zero_ok)

    # ---------------------------------------------------------------------------------------
    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def device(self) -> torch.device:
        return self.w13.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)}

    def to(self, device) -> "ExpertWeights":
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError):
            raise ConfigError("device", device, "a torch.device or a name such as 'cpu', 'cuda', 'cuda:1'",
                              "e.g. weights.to('cuda')") from None
        return dataclasses.replace(self, **{k: v.to(device) for k, v in self.tensors().items()})

    def replace(self, **changes) -> "ExpertWeights":
        return _replace(self, changes)

    def nbytes_per_expert(self) -> int:
        """Bytes of one expert's weights + scales (for bandwidth accounting)."""
        return sum(t.numel() * t.element_size() for k, t in self.tensors().items()
                   if not k.startswith("a")) // max(1, self.num_experts)

    def logical_k(self, which: str) -> int:
        w = self.w13 if which == "w13" else self.w2
        return w.shape[2] * (2 if self.scheme.method in _PACKED else 1)

    # ---------------------------------------------------------------------------------------
    def validate(self, config: MoEConfig) -> None:
        """Check shapes, dtypes and devices against ``config``; raise InputError naming the tensor."""
        if not isinstance(config, MoEConfig):
            raise ConfigTypeError("config", config, "fusedmoe.MoEConfig")
        s = self.scheme
        m = s.method
        E = config.num_local_experts
        H, I, N = config.hidden_size, config.intermediate_size, config.n13
        dev = self.w13.device
        for name, t in self.tensors().items():
            if t.device != dev:
                raise InputError(name, f"device {t.device}", f"device {dev} (that of w13)",
                                 "move every weight tensor to one device (ExpertWeights.to(device))")
        for name, out, K in (("w13", N, H), ("w2", H, I)):
            w = getattr(self, name)
            Kw = K // 2 if m in _PACKED else K
            if m in _PACKED and K % 2:
                raise InputError("hidden_size" if name == "w13" else "intermediate_size", K, "an even number",
                                 f"{m.value} packs two 4-bit values per byte along K")
            if tuple(w.shape) != (E, out, Kw):
                raise InputError(name, tuple(w.shape), f"shape {(E, out, Kw)} for {m.value} "
                                 f"(E_loc={E}, H={H}, I={I}, gated={config.is_gated})",
                                 "w13 is [E, 2I, H] (gate rows first), w2 is [E, H, I]")
            if w.dtype not in _WEIGHT_DTYPES[m]:
                raise InputError(f"{name}.dtype", w.dtype, _WEIGHT_DTYPES[m],
                                 f"quantize with fusedmoe.quantize_experts(..., scheme='{s.name}')")
            sname = f"{name}_scale"
            scale = getattr(self, sname)
            want = self._scale_shape(m, E, out, K)
            if want is None:
                if scale is not None and m == QuantMethod.NONE:
                    raise InputError(sname, tuple(scale.shape), "None for scheme 'none'", "drop the scale")
            else:
                if scale is None:
                    raise InputError(sname, None, f"a tensor of shape {want}", f"{m.value} needs weight scales")
                if tuple(scale.shape) != want:
                    raise InputError(sname, tuple(scale.shape), f"shape {want} for {s.name}",
                                     "see the layout table in fusedmoe.weights")
                want_dt = {QuantMethod.NVFP4: torch.float8_e4m3fn, QuantMethod.MXFP4: torch.uint8}.get(m, torch.float32)
                if scale.dtype != want_dt:
                    raise InputError(f"{sname}.dtype", scale.dtype, [want_dt], f"convert with .to({want_dt})")
            zero = getattr(self, f"{name}_zero")
            if s.has_zero_point:
                if zero is None or tuple(zero.shape) != want or zero.dtype != torch.uint8:
                    raise InputError(f"{name}_zero", None if zero is None else (tuple(zero.shape), zero.dtype),
                                     f"uint8 tensor of shape {want}", "has_zero_point=True needs zero points")
            elif zero is not None:
                raise InputError(f"{name}_zero", tuple(zero.shape), [None],
                                 "pass QuantScheme(..., has_zero_point=True) to use zero points")
            if m == QuantMethod.NVFP4:
                g = getattr(self, f"{name}_global_scale")
                if g is None or tuple(g.shape) != (E,) or g.dtype != torch.float32:
                    raise InputError(f"{name}_global_scale", None if g is None else tuple(g.shape),
                                     f"fp32 tensor of shape {(E,)}", "nvfp4 needs a per-expert global scale")
            bias = getattr(self, f"{name}_bias")
            if config.has_bias:
                if bias is None or tuple(bias.shape) != (E, out):
                    raise InputError(f"{name}_bias", None if bias is None else tuple(bias.shape),
                                     f"shape {(E, out)}", "has_bias=True needs w13_bias [E, N] and w2_bias [E, H]")
            elif bias is not None:
                raise InputError(f"{name}_bias", tuple(bias.shape), [None], "set MoEConfig(has_bias=True) to use biases")
        if m == QuantMethod.NONE and self.w2.dtype != self.w13.dtype:
            raise InputError("w2.dtype", self.w2.dtype, [self.w13.dtype],
                             f"16/32-bit experts use one dtype: cast with w2.to({self.w13.dtype})")
        for name in ("w13_bias", "w2_bias"):
            b = getattr(self, name)
            if b is not None and not b.is_floating_point():
                raise InputError(f"{name}.dtype", b.dtype, [config.torch_dtype, torch.float32],
                                 f"cast with {name}.to({config.torch_dtype})")
        if s.static_activation_scale:
            for name in ("a13_scale", "a2_scale"):
                a = getattr(self, name)
                if a is None or a.numel() != 1 or a.dtype != torch.float32:
                    raise InputError(name, None if a is None else tuple(a.shape), "fp32 tensor with one element",
                                     "static fp8_tensor needs calibrated input scales")

    def _scale_shape(self, m, E, out, K):
        s = self.scheme
        if m == QuantMethod.NONE:
            return None
        if m == QuantMethod.FP8_TENSOR:
            return (E,)
        if m in (QuantMethod.FP8_CHANNEL, QuantMethod.INT8_CHANNEL, QuantMethod.FP8_W8A16):
            return (E, out)
        if m == QuantMethod.FP8_BLOCK:
            bn, bk = s.block_shape
            return (E, _cdiv(out, bn), _cdiv(K, bk))
        if m == QuantMethod.INT8_W8A16 and s.group_size is None:
            return (E, out)
        if K % s.group_size:
            raise InputError("group_size", s.group_size, f"a divisor of K={K}",
                             "pick a group size that divides hidden_size and intermediate_size")
        return (E, out, K // s.group_size)
