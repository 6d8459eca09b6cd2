"""ModularKernel: runs prepare -> experts -> finalize, owns workspaces and chunking.

- Workspaces are allocated once per (chunk size) from what the Experts declare
  (``Experts.workspace``) and reused: no allocation in steady state, so CUDA-graph replay
  sees stable addresses. Each thread gets its own (two threads calling one module at once
  would otherwise write each other's buffers): a graph captured on a thread replays that
  thread's buffers, which the kernel keeps while it lives (up to ``MAX_THREADS`` threads).
- T is processed in chunks of at most ``chunk_size`` tokens (``FUSEDMOE_CHUNK_SIZE``,
  default 16384) so workspace stays bounded; each chunk is independent, so chunked and
  unchunked results agree to rounding, except for schemes with a dynamic per-TENSOR
  activation scale (fp8_tensor dynamic, nvfp4), whose scale is then computed per chunk.
- Shared experts (any callable [T, H] -> [T, H]) are added after finalize; with an
  asynchronous prepare/finalize they would run while the combine is in flight.
- Host time matters at decode size (eager T=1 is host bound): what does not depend on
  the call (whether the experts' output can alias the caller's, where the router weight
  applies) is decided at construction, and the chunks run in one pinned launch block
  (the ``launch_scope`` the layer passes, ``kernels.launcher.pin_launch_state``: device,
  stream and triton's hook state read once per forward, not per kernel launch).
- Experts may serve a call whole (``direct``, optional: the triton backend's decode path)
  where prepare and finalize would do nothing (a prepare/finalize that says
  ``direct_ok``, no input scaling or quantization, a NoOp weight-and-reduce): ~8 us less
  host time per eager decode forward.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

import torch

from .. import env
from ..errors import ConfigError, InputError
from .interfaces import ActivationFormat, Experts, NoOpWeightAndReduce, PrepareFinalize

__all__ = ["ModularKernel"]

MAX_THREADS = 64        # threads whose workspaces a kernel keeps (then the oldest thread's are freed)


class _Workspaces:
    """One thread's workspaces: declared buffers -> {name: tensor} (at most a few shapes), and
    (spec object, device, buffers) of its last call (the host fast path)."""

    __slots__ = ("ws", "last")

    def __init__(self):
        self.ws: dict = {}
        self.last = None


def _no_pin():
    return None


def _no_unpin(token) -> None:
    return None


class ModularKernel:
    def __init__(self, prepare_finalize: PrepareFinalize, experts: Experts,
                 shared_experts: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 chunk_size: Optional[int] = None, launch_scope: Optional[tuple] = None):
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
        self._threads: dict = {}     # threading.get_ident() -> _Workspaces
        self._lock = threading.Lock()
        self._wr = experts.weight_and_reduce()
        self._alias_out = isinstance(self._wr, NoOpWeightAndReduce)
        self._on_input = self.config.routing.apply_router_weight_on_input
        # ``launch_scope`` (pin, unpin): called around the whole forward (every chunk, whatever
        # the experts launch), so that the kernels' launch state is read once a forward (the
        # layer passes kernels.launcher's pin; the framework itself knows no kernel)
        self._pin, self._unpin = launch_scope if launch_scope is not None else (_no_pin, _no_unpin)
        # experts that can serve some calls whole (``Experts.direct``: the triton backend's
        # decode path) skip prepare / workspace / finalize when those would do nothing:
        # no communication, x not scaled or quantized by prepare, output already weighted
        # and reduced
        self._direct = getattr(experts, "direct", None)
        if not (prepare_finalize.direct_ok and self._alias_out and not self._on_input
                and not experts.input_quant):
            self._direct = None

    # -------------------------------------------------------------------------------------
    def _mine(self) -> _Workspaces:
        """The calling thread's workspaces (a dict lookup on the host)."""
        tid = threading.get_ident()
        mine = self._threads.get(tid)
        if mine is None:
            with self._lock:                 # another thread may be adding or evicting
                if len(self._threads) >= MAX_THREADS:
                    self._threads.pop(next(iter(self._threads)))
                mine = self._threads[tid] = _Workspaces()
        return mine

    @property
    def _ws(self) -> dict:
        """The calling thread's buffers by declared shape."""
        return self._mine().ws

    @property
    def _last_ws(self):
        return self._mine().last

    def workspace_for(self, M: int, topk: int, device) -> dict:
        """The calling thread's workspace tensors for a chunk of M tokens (allocated once per
        shape)."""
        if self.experts.activation_format == ActivationFormat.BATCHED:
            M = self.experts.max_num_tokens
        # keyed by the declared buffers themselves: their sizes depend on the launch config
        # (block size, split-K), not only on M, so a config override gets fitting buffers
        spec = self.experts.workspace(M, topk)
        mine = self._mine()
        last = mine.last
        if last is not None and last[0] is spec and last[1] == device:
            return last[2]          # the experts memoize their spec per shape: the common case
        key = (tuple((n, tuple(shape), dt) for n, (shape, dt) in spec.buffers.items()), str(device))
        cache = mine.ws
        ws = cache.get(key)
        if ws is None:
            if len(cache) >= 4:      # bound the cache: a serving loop sees few distinct T
                cache.pop(next(iter(cache)))
            ws = cache[key] = {name: torch.empty(shape, dtype=dtype, device=device)
                               for name, (shape, dtype) in spec.buffers.items()}
        mine.last = (spec, device, ws)
        return ws

    def reset_workspaces(self) -> None:
        """Free the cached workspaces of every thread (they are rebuilt on the next call; a
        call in flight keeps the buffers it holds)."""
        with self._lock:
            self._threads = {}

    def __getstate__(self):
        # workspaces are per process and thread: a copy allocates its own
        state = dict(self.__dict__)
        state["_threads"], state["_lock"] = {}, None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def chunk_sizes(self, T: int) -> tuple:
        """The distinct token counts of the chunks a call of T tokens runs: (C,) or (C, T % C)
        with C = ``chunk_size`` for T > C, (T,) for 0 < T <= C, () for T = 0."""
        C = self.chunk_size
        if T <= C:
            return (T,) if T > 0 else ()
        return (C, T % C) if T % C else (C,)

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 expert_map: Optional[torch.Tensor] = None) -> torch.Tensor:
        T, H = x.shape
        if T == 0:
            return x.new_empty((0, H))
        if self.experts.is_monolithic:
            raise InputError("topk_ids", "given", "router logits for a monolithic kernel",
                             "call the monolithic kernel with router_logits")
        C = self.chunk_size
        token = self._pin()
        try:
            # the experts may serve the call whole (direct); else prepare -> experts -> finalize
            out = self._direct(x, topk_weights, topk_ids, expert_map) if self._direct and T <= C else None
            if out is None:
                out = torch.empty_like(x)                                    # [T, H]
                k, device = topk_ids.shape[1], x.device
                if T <= C:      # one chunk (decode, most prefill): no views to build
                    self._chunk(x, topk_weights, topk_ids, out, k, device, expert_map)
                else:
                    for s in range(0, T, C):
                        e = min(s + C, T)
                        self._chunk(x[s:e], topk_weights[s:e], topk_ids[s:e], out[s:e], k, device, expert_map)
        finally:
            self._unpin(token)
        if self.shared_experts is not None:
            out.add_(self.shared_experts(x))
        return out

    def _chunk(self, xs, tw, ti, out_s, k, device, expert_map) -> None:
        """prepare -> experts -> finalize for one chunk of tokens, into ``out_s``."""
        pf = self.prepare_finalize
        prep = pf.prepare(xs, tw, ti, self.config, self.experts, expert_map)
        ws = self.workspace_for(xs.shape[0], k, device)
        if self._alias_out:
            ws_out = ws["out"]
            if ws_out.shape == out_s.shape and ws_out.dtype == out_s.dtype:
                # experts that already weight and reduce write straight into the caller's
                # output rows: no [T, H] copy in finalize (NoOp sees the same storage)
                ws = dict(ws, out=out_s)
        fused = self.experts.apply(prep, ws, expert_map)
        pf.finalize(out_s, fused, prep, self._wr, self._on_input)

    def __repr__(self) -> str:
        return f"ModularKernel({self.prepare_finalize!r}, {self.experts!r}, chunk_size={self.chunk_size})"
