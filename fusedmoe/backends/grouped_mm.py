"""``grouped_mm``: PyTorch's grouped GEMM (``torch.nn.functional.grouped_mm``; CUTLASS on
sm90, a reference loop on CPU) for 16-bit weights.

Pipeline (standard format, no per-expert Python loop, no host sync):
  slots s = t*k + j sorted by local expert (stable) -> offsets = cumsum(counts) [E_loc]
  xs  = x[order // k]                                  [T*k, H]
  h   = act(grouped_mm(xs, w13^T, offs) + b13)         [T*k, N] -> [T*k, I]
  y   = grouped_mm(h, w2^T, offs) + b2                 [T*k, H]
  out = y unsorted to [T, k, H]; finalize weights and sums over k (Contiguous).
Non-local slots sort after every local expert and are zeroed before finalize.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import MoEConfig, QuantMethod
from ..modular.interfaces import ActivationFormat, ContiguousWeightAndReduce, Experts, WorkspaceSpec
from ..reference.activations import activation_from_config
from .registry import BackendSpec, Reason, register

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def sort_slots(topk_ids: torch.Tensor, E_loc: int, expert_map):
    """-> (order int64 [T*k], local expert of each sorted slot [T*k], offs int32 [E_loc]).

    Device ops only (scatter_add instead of bincount, which would sync on CUDA)."""
    ids = topk_ids.reshape(-1).long()                                  # [T*k]
    loc = expert_map.long()[ids] if expert_map is not None else ids
    key = torch.where(loc >= 0, loc, torch.full_like(loc, E_loc))      # non-local -> E_loc (last)
    order = torch.sort(key, stable=True).indices                       # [T*k]
    counts = torch.zeros(E_loc + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    offs = torch.cumsum(counts[:E_loc], 0).to(torch.int32)             # [E_loc] cumulative ends
    return order, key[order], offs


class GroupedMMExperts(Experts):
    activation_format = ActivationFormat.STANDARD

    def __init__(self, config: MoEConfig, weights, **kw):
        super().__init__(config, weights, **kw)
        # grouped_mm computes a @ b[g] with b [E, K, N]: transposed views, no copy.
        self.w13_t = weights.w13.transpose(1, 2)                       # [E, H, N]
        self.w2_t = weights.w2.transpose(1, 2)                         # [E, I, H]

    def workspace(self, M, topk):
        c = self.config
        return WorkspaceSpec({"out": ((M, topk, c.hidden_size), c.torch_dtype)})

    def weight_and_reduce(self):
        return ContiguousWeightAndReduce()

    def between_gemms(self, h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Hook on GEMM2's input [T*k, I]; ``valid`` [T*k, 1] marks local slots
        (the emulation backend fake-quantizes here)."""
        return h

    def gemm_input(self, x: torch.Tensor) -> torch.Tensor:
        """Hook on GEMM1's input [T, H]."""
        return x

    def apply(self, prep, ws, expert_map):
        c = self.config
        x, ids = prep.a1q, prep.topk_ids
        T, k = ids.shape
        E_loc = c.num_local_experts
        order, skey, offs = sort_slots(ids, E_loc, expert_map)
        x = self.gemm_input(x)
        dt = self.w13_t.dtype
        xs = x[torch.div(order, k, rounding_mode="floor")].to(dt)      # [T*k, H]
        g = _grouped_mm(xs, self.w13_t, offs=offs)                     # [T*k, N]
        valid = (skey < E_loc).unsqueeze(1)                            # [T*k, 1]
        if self.weights.w13_bias is not None:
            g = g + self.weights.w13_bias[skey.clamp(max=E_loc - 1)].to(g.dtype)
        h = activation_from_config(g, c)                               # fp32 [T*k, I]
        h = self.between_gemms(h, valid).to(dt)
        y = _grouped_mm(h, self.w2_t, offs=offs)                       # [T*k, H]
        if self.weights.w2_bias is not None:
            y = y + self.weights.w2_bias[skey.clamp(max=E_loc - 1)].to(y.dtype)
        # rows past the last offset are not computed: select zeros (they may hold garbage)
        y = torch.where(valid, y, torch.zeros((), dtype=y.dtype, device=y.device))
        out = ws["out"].view(T * k, -1)
        out.index_copy_(0, order, y.to(out.dtype))                     # unsort: a permutation
        return ws["out"]


def _check(config: MoEConfig, quant, platform):
    r = []
    if _grouped_mm is None:
        r.append(Reason("torch", f"this torch ({torch.__version__}) has no grouped_mm"))
    if platform.kind == "cuda":
        if config.dtype != "bfloat16":
            r.append(Reason("dtype", f"grouped_mm on CUDA takes bfloat16 only, not {config.dtype}"))
        if config.hidden_size % 8 or config.intermediate_size % 8:
            r.append(Reason("shape", "grouped_mm on CUDA needs H and I multiples of 8 (16-byte rows)"))
    return r


def _make(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    return GroupedMMExperts(config, weights)


SPEC = register(BackendSpec(
    name="grouped_mm",
    description="PyTorch grouped GEMM (torch.nn.functional.grouped_mm; CUTLASS on sm90) for 16-bit weights",
    make_experts=_make,
    quant_methods=frozenset({QuantMethod.NONE}),
    min_sm=80,
    check=_check,
))
