"""ModularKernel: runs prepare -> experts -> finalize, owns workspaces and chunking.

- Workspaces are allocated once per (chunk size) from what the Experts declare
  (``Experts.workspace``) and reused: no allocation in steady state, so CUDA-graph replay
  sees stable addresses.
- T is processed in chunks of at most ``chunk_size`` tokens (``FUSEDMOE_CHUNK_SIZE``,
  default 16384) so workspace stays bounded; each chunk is independent, so chunked and
  unchunked results agree to rounding, except for schemes with a dynamic per-TENSOR
  activation scale (fp8_tensor dynamic, nvfp4), whose scale is then computed per chunk.
- Shared experts (any callable [T, H] -> [T, H]) are added after finalize; with an
  asynchronous prepare/finalize they would run while the combine is in flight.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import env
from ..errors import ConfigError, InputError
from .interfaces import ActivationFormat, Experts, NoOpWeightAndReduce, PrepareFinalize

__all__ = ["ModularKernel"]


class ModularKernel:
    def __init__(self, prepare_finalize: PrepareFinalize, experts: Experts,
                 shared_experts: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 chunk_size: Optional[int] = None):
        if prepare_finalize.is_monolithic != experts.is_monolithic:
            raise ConfigError("experts", repr(experts),
                              "a monolithic prepare/finalize with monolithic experts, or modular with modular",
                              f"{prepare_finalize!r} is {'monolithic' if prepare_finalize.is_monolithic else 'modular'}; "
                              "pick the matching pair", problem="cannot be mixed with this prepare/finalize")
        if prepare_finalize.activation_format != experts.activation_format:
            raise ConfigError("experts", repr(experts),
                              f"experts of the {prepare_finalize.activation_format.value} format",
                              f"{prepare_finalize!r} produces the {prepare_finalize.activation_format.value} format; "
                              f"use {'LocalBatched' if experts.activation_format == ActivationFormat.BATCHED else 'NoEP'} "
                              "or experts of the other format", problem="has a different activation format")
        self.prepare_finalize = prepare_finalize
        self.experts = experts
        self.shared_experts = shared_experts
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise ConfigError("chunk_size", chunk_size, "a positive int or None (FUSEDMOE_CHUNK_SIZE / 16384)",
                              "pass e.g. chunk_size=8192")
        self.chunk_size = chunk_size or env.chunk_size()
        if experts.activation_format == ActivationFormat.BATCHED:
            # The batched buffer holds at most max_num_tokens rows per expert; a chunk never
            # exceeds it so no token is ever dropped.
            self.chunk_size = min(self.chunk_size, experts.max_num_tokens)
        self.config = experts.config
        self._ws: dict = {}          # declared buffers -> {name: tensor}; at most a few shapes
        self._last_ws = None         # (spec object, device, buffers) of the last call: host fast path
        self._wr = experts.weight_and_reduce()

    # -------------------------------------------------------------------------------------
    def workspace_for(self, M: int, topk: int, device) -> dict:
        """The workspace tensors for a chunk of M tokens (allocated once per shape)."""
        if self.experts.activation_format == ActivationFormat.BATCHED:
            M = self.experts.max_num_tokens
        # keyed by the declared buffers themselves: their sizes depend on the launch config
        # (block size, split-K), not only on M, so a config override gets fitting buffers
        spec = self.experts.workspace(M, topk)
        last = self._last_ws
        if last is not None and last[0] is spec and last[1] == device:
            return last[2]          # the experts memoize their spec per shape: the common case
        key = (tuple((n, tuple(shape), dt) for n, (shape, dt) in spec.buffers.items()), str(device))
        ws = self._ws.get(key)
        if ws is None:
            if len(self._ws) >= 4:      # bound the cache: a serving loop sees few distinct T
                self._ws.pop(next(iter(self._ws)))
            ws = self._ws[key] = {name: torch.empty(shape, dtype=dtype, device=device)
                                  for name, (shape, dtype) in spec.buffers.items()}
        self._last_ws = (spec, device, ws)
        return ws

    def reset_workspaces(self) -> None:
        """Free the cached workspaces (they are rebuilt on the next call)."""
        self._ws.clear()
        self._last_ws = None

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 expert_map: Optional[torch.Tensor] = None) -> torch.Tensor:
        T, H = x.shape
        if T == 0:
            return x.new_empty((0, H))
        if self.experts.is_monolithic:
            raise InputError("topk_ids", "given", "router logits for a monolithic kernel",
                             "call the monolithic kernel with router_logits")
        k = topk_ids.shape[1]
        out = torch.empty_like(x)                                            # [T, H]
        wr = self._wr
        alias_out = isinstance(wr, NoOpWeightAndReduce)
        on_input = self.config.routing.apply_router_weight_on_input
        C = self.chunk_size
        for s in range(0, T, C):
            e = min(s + C, T)
            if T <= C:      # one chunk (decode, most prefill): no views to build
                xs, tw, ti, out_s = x, topk_weights, topk_ids, out
            else:
                xs, tw, ti, out_s = x[s:e], topk_weights[s:e], topk_ids[s:e], out[s:e]
            prep = self.prepare_finalize.prepare(xs, tw, ti, self.config, self.experts, expert_map)
            ws = self.workspace_for(e - s, k, x.device)
            if alias_out and ws["out"].shape == out_s.shape and ws["out"].dtype == out.dtype:
                # experts that already weight and reduce write straight into the caller's
                # output rows: no [T, H] copy in finalize (NoOp sees the same storage)
                ws = dict(ws, out=out_s)
            fused = self.experts.apply(prep, ws, expert_map)
            self.prepare_finalize.finalize(out_s, fused, prep, wr, on_input)
        if self.shared_experts is not None:
            out.add_(self.shared_experts(x))
        return out

    def __repr__(self) -> str:
        return f"ModularKernel({self.prepare_finalize!r}, {self.experts!r}, chunk_size={self.chunk_size})"
