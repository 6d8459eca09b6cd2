"""The reference MoE forward: plain torch, every scheme, the ground truth.

Legend: T tokens, E global experts, E_loc local experts, k top-k, H hidden, I intermediate,
N = 2I (gated) or I.

For every (token t, slot j) with global expert g = topk_ids[t, j] and local e = map(g):
    h      = act(fq1(x[t]) @ W13[e]^T + b13[e])          [N] -> [I]
    y      = fq2(h) @ W2[e]^T + b2[e]                     [H]
    out[t] = sum_j topk_weights[t, j] * y                 (or x pre-scaled when on-input)
W = the dequantized weights (fp32); fq1 / fq2 = the scheme's activation fake-quantization
(quantize then dequantize, exactly as the scheme's kernels quantize the GEMM inputs: per
tensor over all of GEMM1's input / all of GEMM2's input, per token, or per 1 x 128 group).
Slots whose expert is not local (expert_map -1) contribute nothing. Math in fp32, output
in x's dtype.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import MoEConfig
from ..weights import ExpertWeights
from .activations import activation_from_config
from ..errors import InputError
from .quant import dequant_fp8_group, dequantize_weight, fake_quant_activation, quant_fp8_group

__all__ = ["reference_moe", "dequantized_weights"]


def dequantized_weights(weights: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 fp32 [E_loc, N, H], w2 fp32 [E_loc, H, I]) of any scheme."""
    s = weights.scheme
    w13 = dequantize_weight(weights.w13, s, scale=weights.w13_scale, zero=weights.w13_zero,
                            global_scale=weights.w13_global_scale)
    w2 = dequantize_weight(weights.w2, s, scale=weights.w2_scale, zero=weights.w2_zero,
                           global_scale=weights.w2_global_scale)
    return w13, w2


def reference_moe(x: torch.Tensor, weights: ExpertWeights, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, config: MoEConfig,
                  expert_map: Optional[torch.Tensor] = None,
                  dequantized: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                  input_prescaled: bool = False, quantize_activations: bool = True,
                  h_group: Optional[int] = None) -> torch.Tensor:
    """out [T, H] in x.dtype. ``expert_map`` defaults to ``config.expert_map()``.

    ``quantize_activations`` False: W8A8 schemes with their activations kept in full
    precision (fq1 / fq2 the identity): what the ``triton`` decode kernels compute by default
    (``TritonExperts.quantizes_activations``; FUSEDMOE_W8A8_DECODE).
    ``h_group`` g: GEMM2's input h quantized to fp8 in 1 x g groups instead of by the scheme's
    rule (the ``triton`` backend's fp8_channel prefill with FUSEDMOE_H_QUANT=epilogue:
    ``TritonExperts.h_group``); only with quantize_activations and an fp8 scheme.
    ``dequantized`` may pass precomputed ``dequantized_weights(weights)`` (the emulation
    backend does, to dequantize once at load). ``input_prescaled``: with
    apply_router_weight_on_input, x was already multiplied by the weights (a prepare step did it).
    """
    T, H = x.shape
    k = topk_ids.shape[1]
    if T == 0:
        return x.new_empty((0, H))
    scheme = weights.scheme
    w13, w2 = dequantized if dequantized is not None else dequantized_weights(weights)
    if expert_map is None:
        expert_map = config.expert_map(x.device)
    ids = topk_ids.long()                                              # [T, k] global ids
    local = expert_map.long()[ids] if expert_map is not None else ids  # [T, k] local ids or -1
    xf = x.float()                                                     # [T, H]
    tw = topk_weights.float()                                          # [T, k]
    on_input = config.routing.apply_router_weight_on_input
    if on_input and not input_prescaled:                               # top-1: scale x first
        xf = xf * tw[:, :1]
    fq = fake_quant_activation if quantize_activations else (lambda a, s, static_scale=None: a)
    xq = fq(xf, scheme, static_scale=weights.a13_scale)                # [T, H]

    flat_e = local.reshape(-1)                                         # [T*k]
    flat_t = torch.arange(T, device=x.device).repeat_interleave(k)     # [T*k] token of each slot
    I = w2.shape[2]
    h = torch.zeros(T * k, I, dtype=torch.float32, device=x.device)    # [T*k, I]
    active = torch.unique(flat_e[flat_e >= 0]).tolist()
    for e in active:
        sel = (flat_e == e).nonzero(as_tuple=True)[0]                  # slots of expert e
        g = xq[flat_t[sel]] @ w13[e].T                                 # [n, N]
        if weights.w13_bias is not None:
            g = g + weights.w13_bias[e].float()
        h[sel] = activation_from_config(g, config)                     # [n, I]
    # GEMM2's input is quantized over all (valid) slots at once, like the kernels do.
    valid = flat_e >= 0
    hq = torch.zeros_like(h)
    if h_group is not None:
        if not (quantize_activations and scheme.method.value.startswith("fp8")):
            raise InputError("h_group", h_group, "None here", "h_group applies to fp8 schemes with quantized activations")
        fq2 = lambda a, s, static_scale=None: dequant_fp8_group(*quant_fp8_group(a, h_group), h_group)  # noqa: E731
    else:
        fq2 = fq
    if valid.any():
        hq[valid] = fq2(h[valid], scheme, static_scale=weights.a2_scale)
    y = torch.zeros(T * k, H, dtype=torch.float32, device=x.device)    # [T*k, H]
    for e in active:
        sel = (flat_e == e).nonzero(as_tuple=True)[0]
        ye = hq[sel] @ w2[e].T                                         # [n, H]
        if weights.w2_bias is not None:
            ye = ye + weights.w2_bias[e].float()
        y[sel] = ye
    y = y.view(T, k, H)
    if not on_input:
        y = y * tw.unsqueeze(-1)
    y = y * valid.view(T, k, 1)                                        # non-local slots: nothing
    return y.sum(dim=1).to(x.dtype)
