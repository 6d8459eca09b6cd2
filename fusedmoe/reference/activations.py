"""Plain-torch activations of GEMM1's output (the specification every kernel follows).

x [M, N] -> [M, N/2] for gated activations (N for *_no_mul). Math in fp32.
Gated layout: halves (gate = x[:, :N/2], up = x[:, N/2:]) except swigluoai, which
interleaves (gate = x[:, 0::2], up = x[:, 1::2]).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..config import Activation, GateUpLayout, MoEConfig

__all__ = ["apply_activation", "activation_from_config"]


def split_gate_up(x: torch.Tensor, layout: GateUpLayout):
    if layout == GateUpLayout.INTERLEAVED:
        return x[..., 0::2], x[..., 1::2]
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


def apply_activation(x: torch.Tensor, activation, *, swiglu_limit: Optional[float] = None,
                     alpha: float = 1.702, limit: float = 7.0,
                     layout: Optional[GateUpLayout] = None) -> torch.Tensor:
    """Activation of GEMM1's output ``x`` [..., N], computed in fp32, returned in fp32."""
    act = Activation(activation)
    x = x.float()
    if not act.is_gated:
        if act == Activation.RELU2_NO_MUL:
            return torch.relu(x).square()
        if act == Activation.SILU_NO_MUL:
            return F.silu(x)
        return F.gelu(x)  # GELU_NO_MUL
    if layout is None:
        layout = GateUpLayout.INTERLEAVED if act == Activation.SWIGLUOAI else GateUpLayout.HALVES
    g, u = split_gate_up(x, layout)                                   # [..., N/2] each
    if act == Activation.SILU:
        if swiglu_limit is not None:
            g = g.clamp(max=swiglu_limit)
            u = u.clamp(-swiglu_limit, swiglu_limit)
        return F.silu(g) * u
    if act == Activation.GELU:
        return F.gelu(g) * u
    if act == Activation.GELU_TANH:
        return F.gelu(g, approximate="tanh") * u
    # SWIGLUOAI (gpt-oss): (clamp(u, ±L) + 1) * g * sigmoid(alpha * g), g = min(g, L)
    g = g.clamp(max=limit)
    u = u.clamp(-limit, limit)
    return (u + 1) * g * torch.sigmoid(alpha * g)


def activation_from_config(x: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    return apply_activation(x, cfg.activation, swiglu_limit=cfg.swiglu_limit, alpha=cfg.swigluoai_alpha,
                            limit=cfg.swigluoai_limit, layout=cfg.gate_up_layout)
