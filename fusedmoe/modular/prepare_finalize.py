"""Prepare/finalize implementations for one device.

- ``NoEP``: standard format; quantizes the activations if the experts want it, finalize
  weights and reduces (Contiguous unless the experts already did it).
- ``LocalBatched``: scatters the tokens into the expert-major batched buffer
  [E_loc, T_max, H] + counts, entirely with device ops (no host sync), and scatters back.
  It is the single-device stand-in for a low-latency all-to-all.

Legend: T tokens, k top-k, H hidden, E_loc local experts, T_max per-expert capacity.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import MoEConfig, QuantMethod
from .interfaces import (ActivationFormat, BatchedSlots, ExpertTokensMetadata, PrepareFinalize,
                         PrepareResult, WeightAndReduce)

__all__ = ["NoEP", "LocalBatched", "quantize_activation"]


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
        from ..kernels import quantize as qk
        if counts is not None:
            kw["counts"] = counts
        if pdl and m != QuantMethod.FP8_TENSOR:
            kw["pdl"] = True
        if zero is not None:
            kw["zero"] = zero
    else:
        from ..reference import quant as qk
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


def _finalize(output, fused_out, prep, wr, on_input):
    return wr.apply(output, fused_out, prep.topk_weights, prep.topk_ids, on_input, prep.batched_slots)


class NoEP(PrepareFinalize):
    """One device, standard format."""

    activation_format = ActivationFormat.STANDARD

    def prepare(self, a1, topk_weights, topk_ids, config: MoEConfig, experts, expert_map):
        if config.routing.apply_router_weight_on_input:
            a1 = (a1.float() * topk_weights[:, :1]).to(a1.dtype)          # top-1: scale x first
        scale = None
        if experts.input_quant:
            a1, scale = quantize_activation(a1, experts.weights.scheme, experts.weights.a13_scale)
        return PrepareResult(a1, scale, topk_ids, topk_weights)

    def finalize(self, output, fused_out, prep, weight_and_reduce: WeightAndReduce, apply_router_weight_on_input):
        return _finalize(output, fused_out, prep, self.resolve(weight_and_reduce), apply_router_weight_on_input)


class LocalBatched(PrepareFinalize):
    """One device, batched format: [E_loc, T_max, H] + counts; T_max = ``max_num_tokens``."""

    activation_format = ActivationFormat.BATCHED

    def __init__(self, max_num_tokens: int):
        self.max_num_tokens = max_num_tokens

    def prepare(self, a1, topk_weights, topk_ids, config: MoEConfig, experts, expert_map):
        T, H = a1.shape
        k = topk_ids.shape[1]
        E_loc = config.num_local_experts
        Tm = self.max_num_tokens
        if config.routing.apply_router_weight_on_input:
            a1 = (a1.float() * topk_weights[:, :1]).to(a1.dtype)
        ids = topk_ids.reshape(-1).long()                                   # [T*k] global
        loc = expert_map.long()[ids] if expert_map is not None else ids     # [T*k] local or -1
        key = torch.where(loc >= 0, loc, torch.full_like(loc, E_loc))       # non-local sort last
        order = torch.sort(key, stable=True).indices                        # [T*k] slots by expert
        sorted_key = key[order]
        counts_all = torch.bincount(key, minlength=E_loc + 1)               # [E_loc+1]
        starts = torch.cumsum(counts_all, 0) - counts_all                   # [E_loc+1]
        pos = torch.arange(T * k, device=a1.device) - starts[sorted_key]    # rank within expert
        ok = (sorted_key < E_loc) & (pos < Tm)                              # beyond capacity: dropped
        dest = torch.where(ok, sorted_key * Tm + pos, torch.full_like(pos, E_loc * Tm))
        buf = a1.new_zeros(E_loc * Tm + 1, H)                               # +1 trash row
        buf[dest] = a1[torch.div(order, k, rounding_mode="floor")]
        slot_of_row = torch.full((E_loc * Tm + 1,), -1, dtype=torch.int32, device=a1.device)
        slot_of_row[dest] = order.to(torch.int32)
        counts = counts_all[:E_loc].clamp(max=Tm).to(torch.int32)          # [E_loc]
        a1b = buf[:-1].view(E_loc, Tm, H)
        scale = None
        if experts.input_quant:
            a1b, scale = quantize_activation(a1b, experts.weights.scheme, experts.weights.a13_scale, counts)
        return PrepareResult(a1b, scale, topk_ids, topk_weights, ExpertTokensMetadata(counts),
                             BatchedSlots(slot_of_row[:-1].view(E_loc, Tm)))

    def finalize(self, output, fused_out, prep, weight_and_reduce, apply_router_weight_on_input):
        return _finalize(output, fused_out, prep, self.resolve(weight_and_reduce), apply_router_weight_on_input)

    def __repr__(self) -> str:
        return f"LocalBatched(max_num_tokens={self.max_num_tokens})"
