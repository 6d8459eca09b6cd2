"""Quantize a 16/32-bit checkpoint's experts to any scheme, and load common checkpoint layouts.

Shape legend: E experts, H hidden, I intermediate, N = 2I (gated; gate rows first, or
interleaved for gpt-oss) or I (non-gated). Canonical layouts: w13 [E, N, H], w2 [E, H, I];
the quantized layouts are the table in ``fusedmoe.weights``.

    w = quantize_experts(w13, w2, "fp8_block")           # -> ExpertWeights
    w13_ref, w2_ref = dequantize_experts(w)              # fp32, for checks

Loaders (each returns ``ExpertWeights``; a ``scheme`` other than 'none' quantizes):
  from_deepseek_fp8   DeepSeek-V3 fp8 experts + 128 x 128 ``weight_scale_inv`` (multiplies).
  from_per_expert     lists of per-expert gate [I, H], up [I, H], down [H, I] (nn.Linear layout).
  from_fused_gate_up  fused gate_up [E, N, H] + down [E, H, I], or with transposed=True the
                      Hugging Face fused-experts layout gate_up_proj [E, H, N] + down_proj [E, I, H].
  from_quantized_per_expert
                      per-expert 8-bit weights with their ``weight_scale`` as compressed-tensors,
                      fbgemm-fp8 and per-tensor fp8 checkpoints store them (per channel or per
                      tensor, multiplying), and their ``input_scale`` for static fp8; no
                      requantization except fp8_tensor's gate / up halves (see there).

Activations, at run time (what the backends call on a GEMM input):
  quantize_activation  x -> (q, scale) as the scheme's kernels quantize it: the Triton
                       quantization kernels on CUDA, the plain-torch reference elsewhere.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .config import QuantMethod, QuantScheme
from .errors import ConfigError, ConfigTypeError, InputError
from .reference.quant import dequantize_weight, quantize_weight
from .weights import ExpertWeights, _check_scale_values

__all__ = ["quantize_experts", "dequantize_experts", "from_deepseek_fp8", "from_per_expert", "from_fused_gate_up",
           "from_quantized_per_expert", "quantize_activation"]

_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_weight(name: str, w) -> None:
    if not isinstance(w, torch.Tensor):
        raise ConfigTypeError(name, w, "torch.Tensor")
    if w.dim() != 3:
        raise InputError(f"{name}.shape", tuple(w.shape), "a 3-D tensor [E, out, K]",
                         "stack the experts along dim 0 (see from_per_expert)")


def _check_pair(w13: torch.Tensor, w2: torch.Tensor) -> None:
    """w13 [E, N, H], w2 [E, H, I] with N in (2I, I), same E and device."""
    _check_weight("w13", w13)
    _check_weight("w2", w2)
    E, N, H = w13.shape
    if w2.shape[0] != E:
        raise InputError("w2.shape[0]", w2.shape[0], f"E={E} (w13.shape[0])", "w13 and w2 hold the same experts")
    if w2.shape[1] != H:
        raise InputError("w2.shape[1]", w2.shape[1], f"H={H} (w13.shape[2])",
                         "w13 is [E, N, H] and w2 is [E, H, I]; transpose a [E, I, H] w2 with w2.transpose(1, 2)")
    I = w2.shape[2]
    if N not in (2 * I, I):
        raise InputError("w13.shape[1]", N, f"2*I={2 * I} (gated) or I={I} (non-gated), I = w2.shape[2]",
                         "w13 rows are [gate; up] for gated activations")
    if w2.device != w13.device:
        raise InputError("w2.device", w2.device, f"{w13.device} (that of w13)", "move both to one device")


def _scale_tensor(name: str, v, device) -> torch.Tensor:
    """A static activation scale (float or 1-element tensor) -> fp32 [1] on ``device``."""
    if isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)):
        raise ConfigTypeError(name, v, "a float or a 1-element tensor")
    t = torch.as_tensor(v, dtype=torch.float32).reshape(-1).to(device)
    if t.numel() != 1:
        raise InputError(name, tuple(t.shape), "one element (a per-tensor input scale)", "pass a float")
    if not (float(t) > 0 and float(t) < float("inf")):   # load time, host sync is fine
        raise InputError(name, float(t), "a finite float > 0", "use the checkpoint's input_scale")
    return t


def _check_bias(name: str, b, E: int, out: int) -> None:
    if b is None:
        return
    if not isinstance(b, torch.Tensor):
        raise ConfigTypeError(name, b, "torch.Tensor or None")
    if tuple(b.shape) != (E, out):
        raise InputError(f"{name}.shape", tuple(b.shape), f"{(E, out)}", "w13_bias is [E, N], w2_bias is [E, H]")


def quantize_experts(w13: torch.Tensor, w2: torch.Tensor, scheme: Union[QuantScheme, str], *,
                     w13_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
                     a13_scale=None, a2_scale=None) -> ExpertWeights:
    """Quantize expert weights to ``scheme``.

    w13 [E, N, H], w2 [E, H, I]: bfloat16 / float16 / float32. ``scheme``: a QuantScheme or a
    string for ``QuantScheme.parse`` ('fp8_block', 'int4_w4a16:g64:zp', 'fp8_tensor:static').
    Static fp8_tensor needs ``a13_scale`` / ``a2_scale`` (floats or 1-element tensors, the
    checkpoint's input scales), stored as fp32 [1]. Scheme 'none' returns the tensors unchanged.
    Biases (w13_bias [E, N], w2_bias [E, H]) are passed through.
    """
    scheme = QuantScheme.parse(scheme)
    _check_pair(w13, w2)
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype not in _FLOAT_DTYPES:
            raise InputError(f"{name}.dtype", w.dtype, _FLOAT_DTYPES,
                             "quantize from a 16/32-bit checkpoint (fp8 DeepSeek checkpoints: from_deepseek_fp8)")
    E, N, H = w13.shape
    _check_bias("w13_bias", w13_bias, E, N)
    _check_bias("w2_bias", w2_bias, E, H)
    if scheme.static_activation_scale:
        for name, v in (("a13_scale", a13_scale), ("a2_scale", a2_scale)):
            if v is None:
                raise InputError(name, None, "a float or a 1-element tensor",
                                 f"'{scheme.name}' uses calibrated input scales: pass a13_scale= and a2_scale=, "
                                 "or use the dynamic scheme 'fp8_tensor'")
        a13 = _scale_tensor("a13_scale", a13_scale, w13.device)
        a2 = _scale_tensor("a2_scale", a2_scale, w13.device)
    else:
        for name, v in (("a13_scale", a13_scale), ("a2_scale", a2_scale)):
            if v is not None:
                raise ConfigError(name, v, [None], f"'{scheme.name}' has no static input scale; "
                                  "for fp8 with calibrated input scales use scheme 'fp8_tensor:static'")
        a13 = a2 = None
    if scheme.method == QuantMethod.NONE:
        return ExpertWeights(w13=w13, w2=w2, scheme=scheme, w13_bias=w13_bias, w2_bias=w2_bias)
    q13 = quantize_weight(w13, scheme, name="w13")
    q2 = quantize_weight(w2, scheme, name="w2")
    return ExpertWeights(w13=q13["w"], w2=q2["w"], scheme=scheme,
                         w13_scale=q13["scale"], w2_scale=q2["scale"],
                         w13_zero=q13["zero"], w2_zero=q2["zero"],
                         w13_global_scale=q13["global_scale"], w2_global_scale=q2["global_scale"],
                         a13_scale=a13, a2_scale=a2, w13_bias=w13_bias, w2_bias=w2_bias)


def dequantize_experts(weights: ExpertWeights):
    """ExpertWeights -> (w13 fp32 [E, N, H], w2 fp32 [E, H, I]), K unpacked."""
    if not isinstance(weights, ExpertWeights):
        raise ConfigTypeError("weights", weights, "fusedmoe.ExpertWeights")
    s = weights.scheme
    w13 = dequantize_weight(weights.w13, s, weights.w13_scale, weights.w13_zero, weights.w13_global_scale)
    w2 = dequantize_weight(weights.w2, s, weights.w2_scale, weights.w2_zero, weights.w2_global_scale)
    return w13, w2


# ----------------------------------------------------------------------------- checkpoint loaders
def from_deepseek_fp8(w13_fp8: torch.Tensor, w2_fp8: torch.Tensor, w13_scale_inv: torch.Tensor,
                      w2_scale_inv: torch.Tensor, *, block_shape=(128, 128)) -> ExpertWeights:
    """DeepSeek-V3 style fp8 experts -> ExpertWeights('fp8_block').

    w13_fp8 [E, N, H] float8_e4m3fn ([gate_proj; up_proj] stacked per expert), w2_fp8 [E, H, I];
    w13_scale_inv [E, ceil(N/128), ceil(H/128)], w2_scale_inv [E, ceil(H/128), ceil(I/128)]:
    ``weight_scale_inv``, which MULTIPLIES (value = fp8 * scale_inv); converted to fp32.
    Stacking per-expert gate/up scale_inv along dim 0 is exact only when I % 128 == 0
    (true for DeepSeek-V3, I = 2048).
    """
    scheme = QuantScheme("fp8_block", block_shape=tuple(block_shape) if isinstance(block_shape, list) else block_shape)
    _check_pair(w13_fp8, w2_fp8)
    for name, w in (("w13_fp8", w13_fp8), ("w2_fp8", w2_fp8)):
        if w.dtype != torch.float8_e4m3fn:
            raise InputError(f"{name}.dtype", w.dtype, [torch.float8_e4m3fn],
                             "for 16/32-bit weights use quantize_experts(w13, w2, 'fp8_block')")
    bn, bk = scheme.block_shape
    scales = []
    for name, w, s in (("w13_scale_inv", w13_fp8, w13_scale_inv), ("w2_scale_inv", w2_fp8, w2_scale_inv)):
        if not isinstance(s, torch.Tensor):
            raise ConfigTypeError(name, s, "torch.Tensor")
        E, out, K = w.shape
        want = (E, -(-out // bn), -(-K // bk))
        if tuple(s.shape) != want:
            raise InputError(f"{name}.shape", tuple(s.shape), f"{want} (blocks {bn}x{bk} of {tuple(w.shape)})",
                             "pass the checkpoint's weight_scale_inv stacked over experts")
        if not s.is_floating_point():
            raise InputError(f"{name}.dtype", s.dtype, "a float dtype (float32, bfloat16, ...)",
                             "pass the checkpoint's weight_scale_inv as stored")
        s = s.to(device=w.device, dtype=torch.float32)
        _check_scale_values(name, s, nan_ok=False)     # load time: the host sync is fine
        scales.append(s)
    return ExpertWeights(w13=w13_fp8, w2=w2_fp8, scheme=scheme, w13_scale=scales[0], w2_scale=scales[1])


def _stack(name: str, ts: Sequence[torch.Tensor]) -> torch.Tensor:
    if isinstance(ts, torch.Tensor):
        raise InputError(name, f"a tensor of shape {tuple(ts.shape)}", "a list of 2-D tensors, one per expert",
                         "for stacked [E, ...] tensors use from_fused_gate_up or quantize_experts")
    if not isinstance(ts, (list, tuple)) or not ts:
        raise ConfigTypeError(name, ts, "a non-empty list of tensors (one per expert)")
    for e, t in enumerate(ts):
        if not isinstance(t, torch.Tensor):
            raise ConfigTypeError(f"{name}[{e}]", t, "torch.Tensor")
    shapes = {tuple(t.shape) for t in ts}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise InputError(name, sorted(shapes), "2-D tensors of one shape", "every expert has the same shape")
    for what in ("dtype", "device"):
        seen = {getattr(t, what) for t in ts}
        if len(seen) != 1:
            raise InputError(f"{name}[*].{what}", sorted(map(str, seen)), f"one {what} for every expert",
                             f"convert every expert's tensor with .to(...) to one {what}")
    return torch.stack(list(ts))


def from_per_expert(gate: Sequence[torch.Tensor], up: Optional[Sequence[torch.Tensor]],
                    down: Sequence[torch.Tensor], scheme: Union[QuantScheme, str, None] = None,
                    **kwargs) -> ExpertWeights:
    """Per-expert nn.Linear weights (Mixtral/Qwen/DeepSeek checkpoints) -> ExpertWeights.

    gate[e] [I, H] (``gate_proj`` / ``w1``), up[e] [I, H] (``up_proj`` / ``w3``), down[e] [H, I]
    (``down_proj`` / ``w2``). w13 = [gate; up] -> [E, 2I, H], w2 -> [E, H, I]. ``up=None`` for
    non-gated activations (w13 = gate, [E, I, H]). ``scheme`` None or 'none' keeps the dtype;
    otherwise quantizes; ``kwargs`` go to ``quantize_experts`` (biases, static scales).
    """
    g = _stack("gate", gate)                                            # [E, I, H]
    d = _stack("down", down)                                            # [E, H, I]
    u = _stack("up", up) if up is not None else None                    # [E, I, H]
    for name, t in (("up", u), ("down", d)):
        if t is not None and t.shape[0] != g.shape[0]:
            raise InputError(f"len({name})", t.shape[0], f"{g.shape[0]} (len(gate))", "pass one tensor per expert")
    if u is not None:
        if u.shape != g.shape:
            raise InputError("up", tuple(u.shape[1:]), f"the shape of gate {tuple(g.shape[1:])}",
                             "gate and up projections have the same shape [I, H]")
        w13 = torch.cat([g, u], dim=1)                                  # [E, 2I, H]
    else:
        w13 = g                                                         # [E, I, H]
    return quantize_experts(w13, d, scheme, **kwargs)


def from_fused_gate_up(gate_up: torch.Tensor, down: torch.Tensor, scheme: Union[QuantScheme, str, None] = None,
                       *, transposed: bool = False, **kwargs) -> ExpertWeights:
    """Fused gate/up experts -> ExpertWeights.

    transposed=False: gate_up [E, N, H], down [E, H, I] (nn.Linear [out, in] layout).
    transposed=True:  gate_up [E, H, N], down [E, I, H] (Hugging Face fused experts, e.g.
    Llama-4 / gpt-oss ``gate_up_proj`` and ``down_proj``, used as x @ W).
    Row order along N is kept: [gate; up] halves for most models, interleaved for gpt-oss
    (MoEConfig(activation='swigluoai') expects interleaved). ``scheme`` None or 'none' keeps
    the dtype; ``kwargs`` go to ``quantize_experts`` (e.g. gpt-oss biases w13_bias=, w2_bias=).
    """
    if not isinstance(transposed, bool):
        raise ConfigTypeError("transposed", transposed, "bool")
    _check_weight("gate_up", gate_up)
    _check_weight("down", down)
    w13 = gate_up.transpose(1, 2).contiguous() if transposed else gate_up     # [E, N, H]
    w2 = down.transpose(1, 2).contiguous() if transposed else down             # [E, H, I]
    if w13.shape[2] != w2.shape[1] or w13.shape[1] not in (w2.shape[2], 2 * w2.shape[2]):
        raise InputError("transposed", transposed,
                         f"a value matching gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)}",
                         "transposed=False expects gate_up [E, N, H], down [E, H, I]; "
                         "transposed=True expects gate_up [E, H, N], down [E, I, H]")
    return quantize_experts(w13, w2, scheme, **kwargs)


# the schemes whose checkpoints store 8-bit weights with per-channel or per-tensor scales that multiply
_PREQUANTIZED = {QuantMethod.FP8_CHANNEL: (torch.float8_e4m3fn, "channel"),
                 QuantMethod.FP8_W8A16: (torch.float8_e4m3fn, "channel"),
                 QuantMethod.FP8_TENSOR: (torch.float8_e4m3fn, "tensor"),
                 QuantMethod.INT8_CHANNEL: (torch.int8, "channel"),
                 QuantMethod.INT8_W8A16: (torch.int8, "channel")}


def _stack_scales(name: str, scales, weights: torch.Tensor, per: str) -> torch.Tensor:
    """The checkpoint's per-expert weight_scale tensors -> fp32 [E, out] (per channel) or [E]
    (per tensor), checked finite and > 0 (load time: the host sync is fine)."""
    E, out = weights.shape[0], weights.shape[1]
    if isinstance(scales, torch.Tensor) or not isinstance(scales, (list, tuple)):
        raise ConfigTypeError(name, scales, "a list of tensors, one per expert (the checkpoint's weight_scale)")
    if len(scales) != E:
        raise InputError(f"len({name})", len(scales), f"{E} (one per expert)", "pass one weight_scale per expert")
    want = out if per == "channel" else 1
    rows = []
    for e, t in enumerate(scales):
        if not isinstance(t, torch.Tensor):
            raise ConfigTypeError(f"{name}[{e}]", t, "torch.Tensor")
        if not t.is_floating_point() or t.numel() != want or (per == "channel" and t.dim() not in (1, 2)):
            shapes = f"[{out}, 1] or [{out}]" if per == "channel" else "[] or [1]"
            raise InputError(f"{name}[{e}]", f"{t.dtype} {tuple(t.shape)}", f"a float tensor of shape {shapes}",
                             f"a per-{per} weight_scale of a [{out}, {weights.shape[2]}] weight "
                             f"(per-{'tensor' if per == 'channel' else 'channel'} scales belong to another scheme)")
        rows.append(t.reshape(want).to(device=weights.device, dtype=torch.float32))
    s = torch.stack(rows)
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        raise InputError(name, "a scale that is <= 0, Inf or NaN", "finite scales > 0",
                         "pass the checkpoint's weight_scale (it multiplies: value = q * scale)")
    return s if per == "channel" else s.reshape(E)


def _input_scale(name: str, scales, E: int, device) -> torch.Tensor:
    """The largest of the experts' static input scales, fp32 [1] (one scale per GEMM serves every
    expert; the largest clips no expert's calibrated range)."""
    if isinstance(scales, torch.Tensor) or not isinstance(scales, (list, tuple)) or len(scales) != E:
        raise InputError(name, type(scales).__name__, f"a list of {E} input scales (floats or 1-element tensors)",
                         "pass each expert's input_scale")
    return torch.stack([_scale_tensor(f"{name}[{e}]", v, device) for e, v in enumerate(scales)]).amax().reshape(1)


def from_quantized_per_expert(gate: Sequence[torch.Tensor], up: Optional[Sequence[torch.Tensor]],
                              down: Sequence[torch.Tensor], gate_scale: Sequence[torch.Tensor],
                              up_scale: Optional[Sequence[torch.Tensor]], down_scale: Sequence[torch.Tensor],
                              scheme: Union[QuantScheme, str], *, gate_input_scale=None, up_input_scale=None,
                              down_input_scale=None, w13_bias: Optional[torch.Tensor] = None,
                              w2_bias: Optional[torch.Tensor] = None) -> ExpertWeights:
    """Per-expert 8-bit nn.Linear weights with their scales -> ExpertWeights in ``scheme``.

    The layout of compressed-tensors (``weight`` + ``weight_scale``, also ``input_scale`` for
    static activation scales), fbgemm-fp8 (``weight`` + ``weight_scale``) and per-tensor fp8
    (``weight`` + ``weight_scale``) checkpoints, one tensor per expert and projection:
      gate[e], up[e] [I, H] (``gate_proj`` / ``w1``, ``up_proj`` / ``w3``), down[e] [H, I]
      (``down_proj`` / ``w2``): float8_e4m3fn for the fp8 schemes, int8 for the int8 ones;
      *_scale[e]: the weight_scale, which MULTIPLIES (value = q * scale), any float dtype:
        [out, 1] or [out] per channel (fp8_channel, int8_channel, fp8_w8a16, int8_w8a16),
        [] or [1] per tensor (fp8_tensor, fp8_tensor:static);
      *_input_scale[e] (fp8_tensor:static only): the checkpoint's input_scale of each expert.
        The layer has one input scale per GEMM for all experts: the largest of the experts'
        (gate and up for GEMM1, down for GEMM2), so no expert's calibrated range is clipped.
    ``up=None`` / ``up_scale=None``: a non-gated activation (w13 = gate).

    Per-channel scales need no requantization: w13's rows are gate's then up's, each with its
    own scale. Per tensor, w13 = [gate; up] has one scale an expert: where an expert's gate and
    up scales differ, the half with the smaller scale is requantized to the larger one (one more
    fp8 rounding of that half, relative error <= 2^-4; equal scales are kept bit for bit).
    fp8_block checkpoints (``weight_scale_inv``): ``from_deepseek_fp8``; 16/32-bit weights:
    ``from_per_expert(..., scheme=...)``.
    """
    scheme = QuantScheme.parse(scheme)
    if scheme.method not in _PREQUANTIZED or scheme.has_zero_point or getattr(scheme, "group_size", None):
        raise ConfigError("scheme", scheme.name, sorted(f"{m.value}" for m in _PREQUANTIZED) + ["fp8_tensor:static"],
                          "8-bit checkpoints with per-channel or per-tensor scales; fp8 128x128 blocks "
                          "(weight_scale_inv): from_deepseek_fp8; 16/32-bit weights: from_per_expert(..., scheme=)")
    dtype, per = _PREQUANTIZED[scheme.method]
    if (up is None) != (up_scale is None):
        raise InputError("up_scale", "None" if up_scale is None else "given", "None exactly when up is None",
                         "pass up's weight_scale with up (or neither, for a non-gated activation)")
    g = _stack("gate", gate)                                            # [E, I, H]
    d = _stack("down", down)                                            # [E, H, I]
    u = _stack("up", up) if up is not None else None
    E = g.shape[0]
    for name, ts in (("up", u), ("down", d)):
        if ts is not None and ts.shape[0] != E:
            raise InputError(f"len({name})", ts.shape[0], f"{E} (len(gate))", "pass one tensor per expert")
    if u is not None and u.shape != g.shape:
        raise InputError("up", tuple(u.shape[1:]), f"the shape of gate {tuple(g.shape[1:])}",
                         "gate and up projections have the same shape [I, H]")
    for name, w in (("gate", g), ("up", u), ("down", d)):
        if w is not None and w.dtype != dtype:
            raise InputError(f"{name}.dtype", w.dtype, [dtype],
                             f"'{scheme.name}' checkpoints hold {dtype} weights; for 16/32-bit weights use "
                             "from_per_expert(..., scheme=...)")
    sg = _stack_scales("gate_scale", gate_scale, g, per)
    sd = _stack_scales("down_scale", down_scale, d, per)
    su = _stack_scales("up_scale", up_scale, u, per) if u is not None else None
    if u is None:
        w13, s13 = g, sg
    elif per == "channel":
        w13, s13 = torch.cat([g, u], dim=1), torch.cat([sg, su], dim=1)    # [E, 2I, H], [E, 2I]
    else:
        s13 = torch.maximum(sg, su)                                     # [E]
        w13 = torch.cat([_requantize_fp8(g, sg / s13), _requantize_fp8(u, su / s13)], dim=1)
    static = scheme.static_activation_scale
    given = [v is not None for v in (gate_input_scale, up_input_scale, down_input_scale)]
    a13 = a2 = None
    if static:
        if not given[0] or not given[2] or (u is not None and not given[1]):
            raise InputError("gate_input_scale / up_input_scale / down_input_scale", "missing",
                             "each expert's input_scale", f"'{scheme.name}' uses calibrated input scales; or use "
                             "the dynamic scheme 'fp8_tensor'")
        a13 = _input_scale("gate_input_scale", gate_input_scale, E, g.device)
        if u is not None:
            a13 = torch.maximum(a13, _input_scale("up_input_scale", up_input_scale, E, g.device))
        a2 = _input_scale("down_input_scale", down_input_scale, E, g.device)
    elif any(given):
        raise ConfigError("input_scale", "given", [None], f"'{scheme.name}' has no static input scale; "
                          "for fp8 with calibrated input scales use scheme 'fp8_tensor:static'")
    _check_bias("w13_bias", w13_bias, E, w13.shape[1])
    _check_bias("w2_bias", w2_bias, E, d.shape[1])
    return ExpertWeights(w13=w13, w2=d, scheme=scheme, w13_scale=s13, w2_scale=sd, a13_scale=a13, a2_scale=a2,
                         w13_bias=w13_bias, w2_bias=w2_bias)


def _requantize_fp8(q: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """fp8 [E, out, K] with per-expert scale s_e -> the same values on the scale s_e / ratio_e
    (ratio [E] in (0, 1]); an expert whose ratio is 1 keeps its finite values bit for bit (an
    fp8 value times 1 rounds to itself)."""
    from .reference.quant import _to_fp8
    return q if bool((ratio == 1).all()) else _to_fp8(q.float() * ratio[:, None, None])


# ----------------------------------------------------------------------------- activations
def quantize_activation(x: torch.Tensor, scheme, static_scale: Optional[torch.Tensor] = None,
                        counts: Optional[torch.Tensor] = None, pdl: bool = False,
                        zero: Optional[torch.Tensor] = None):
    """Quantize a GEMM input the way ``scheme`` does -> (q, scale).

    x [M, K], or batched [E_loc, T_max, K] with ``counts`` [E_loc] (rows past a count are
    padding: ignored by the per-tensor amax, never read later). Triton kernels on CUDA, the
    plain-torch reference elsewhere (same numerics). ``pdl`` (CUDA sm90+, per-token and group
    schemes; ignored by the per-tensor ones): the kernel is a link of a programmatic
    dependent launch chain (kernels/quantize.py ``quant_fp8_token``). ``zero``: a float
    tensor of x's shape [M, K] (standard format) to fill with zeros, on CUDA by the quantizing
    launch itself (the output a later atomic k-sum adds into), elsewhere by ``zero_()``."""
    m = scheme.method
    kw = {}
    if x.is_cuda:
        from .kernels import quantize as qk   # here, not at module level: importing fusedmoe must not import Triton
        if counts is not None:
            kw["counts"] = counts
        if pdl and m != QuantMethod.FP8_TENSOR:
            kw["pdl"] = True
        if zero is not None:
            kw["zero"] = zero
    else:
        from .reference import quant as qk
        if counts is not None:   # zero the padding rows: zeros never raise an amax
            rows = torch.arange(x.shape[1], device=x.device)
            x = torch.where((rows[None, :] < counts[:, None]).unsqueeze(-1), x, torch.zeros((), dtype=x.dtype))
        shape = x.shape
        x = x.reshape(-1, shape[-1])
    if m == QuantMethod.FP8_TENSOR:
        q, s = qk.quant_fp8_tensor(x, static_scale, **kw)
    elif m == QuantMethod.FP8_CHANNEL:
        q, s = qk.quant_fp8_token(x, **kw)
    elif m == QuantMethod.FP8_BLOCK:
        q, s = qk.quant_fp8_group(x, scheme.block_shape[1], scheme.scale_pow2, **kw)
    elif m == QuantMethod.INT8_CHANNEL:
        q, s = qk.quant_int8_token(x, **kw)
    else:
        raise AssertionError(f"no native activation quantization for {m.value}")
    if zero is not None and not x.is_cuda:
        zero.zero_()
    if not x.is_cuda and counts is not None:     # back to the batched shape
        q = q.view(shape)
        s = s.view(*shape[:-1], -1) if s.numel() > 1 else s
    return q, s
