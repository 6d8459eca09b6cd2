"""Prepare/finalize implementations for one device.

- ``NoEP``: standard format; quantizes the activations if the experts want it (with the
  experts' own ``quantize_input``), finalize weights and reduces (Contiguous unless the
  experts already did it).
- ``LocalBatched``: scatters the tokens into the expert-major batched buffer
  [E_loc, T_max, H] + counts, entirely with device ops (no host sync), and scatters back.
  It is the single-device stand-in for a low-latency all-to-all.

Legend: T tokens, k top-k, H hidden, E_loc local experts, T_max per-expert capacity.
"""
from __future__ import annotations

import torch

from ..config import MoEConfig
from .interfaces import (ActivationFormat, BatchedSlots, ExpertTokensMetadata, PrepareFinalize,
                         PrepareResult, WeightAndReduce)

__all__ = ["NoEP", "LocalBatched"]


def _finalize(output, fused_out, prep, wr, on_input):
    return wr.apply(output, fused_out, prep.topk_weights, prep.topk_ids, on_input, prep.batched_slots)


class NoEP(PrepareFinalize):
    """One device, standard format."""

    activation_format = ActivationFormat.STANDARD

    @property
    def direct_ok(self) -> bool:
        # prepare only scales / quantizes x and finalize only weights and reduces: nothing
        # to skip beyond that unless a subclass overrides either (then it says for itself)
        cls = type(self)
        return cls.prepare is NoEP.prepare and cls.finalize is NoEP.finalize

    def prepare(self, a1, topk_weights, topk_ids, config: MoEConfig, experts, expert_map):
        if config.routing.apply_router_weight_on_input:
            a1 = (a1.float() * topk_weights[:, :1]).to(a1.dtype)          # top-1: scale x first
        scale = None
        if experts.input_quant:
            a1, scale = experts.quantize_input(a1)
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
            a1b, scale = experts.quantize_input(a1b, counts)
        return PrepareResult(a1b, scale, topk_ids, topk_weights, ExpertTokensMetadata(counts),
                             BatchedSlots(slot_of_row[:-1].view(E_loc, Tm)))

    def finalize(self, output, fused_out, prep, weight_and_reduce, apply_router_weight_on_input):
        return _finalize(output, fused_out, prep, self.resolve(weight_and_reduce), apply_router_weight_on_input)

    def __repr__(self) -> str:
        return f"LocalBatched(max_num_tokens={self.max_num_tokens})"
