"""The inputs of a benchmark point: routing, rotating input sets, random quantized weights.

Input sets rotate so the cycle's working set (x, routing, out of every set + all weights)
exceeds 2x L2; for big shapes the weights alone do that, so only tokens and routing rotate.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import MoEConfig, QuantMethod, QuantScheme
from .roofline import _DTYPE_BYTES

__all__ = ["make_routing", "InputSet", "InputSets", "make_input_sets", "make_weights", "total_weight_bytes"]


def make_routing(T: int, E: int, k: int, *, generator: torch.Generator, device, skew: Optional[float] = None):
    """(topk_weights fp32 [T, k], topk_ids int32 [T, k]): random logits -> softmax -> top-k ->
    renormalize. ``skew`` = alpha draws expert popularity p ~ Dirichlet(alpha) and adds log p to
    the logits, so some experts are hot (smaller alpha = more skew), like real traffic
    (FlashInfer #4106's distribution-aware tuning)."""
    logits = torch.randn(T, E, generator=generator)                                  # [T, E]
    if skew is not None:
        # Dirichlet(alpha) = normalized Gamma(alpha) draws; Python's RNG seeded from ours keeps
        # the run reproducible (torch.distributions ignores generators)
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
        g = torch.tensor([rng.gammavariate(float(skew), 1.0) for _ in range(E)], dtype=torch.float64)
        p = (g / g.sum()).clamp_min(1e-12)                                           # [E] popularity
        logits = logits + p.log().float()
    probs = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)                                           # [T, k]
    w = w / w.sum(dim=-1, keepdim=True)
    return w.float().to(device), ids.to(torch.int32).to(device)


@dataclass
class InputSet:
    x: torch.Tensor                # [T, H] activation dtype
    topk_weights: torch.Tensor     # [T, k] fp32
    topk_ids: torch.Tensor         # [T, k] int32
    topk_ids64: torch.Tensor       # [T, k] int64 (peers that index with it)
    experts_hit: int

    def args(self, ids64: bool = False):
        return self.x, self.topk_weights, (self.topk_ids64 if ids64 else self.topk_ids)


@dataclass
class InputSets:
    sets: list
    cycle_bytes: int
    note: str = ""

    @property
    def experts_hit(self) -> float:
        return sum(s.experts_hit for s in self.sets) / len(self.sets)


def make_input_sets(config: MoEConfig, T: int, device, *, seed: int = 0, skew: Optional[float] = None,
                    l2_bytes: int = 50 * 2**20, weight_bytes: int = 0, min_sets: int = 3, max_sets: int = 64,
                    max_total_bytes: int = 4 * 2**30) -> InputSets:
    """Enough input sets that (sets x (x + out + routing)) + all weights > 2 x L2."""
    H, k, E = config.hidden_size, config.top_k, config.num_local_experts
    eb = _DTYPE_BYTES[config.dtype]
    per_set = T * H * eb * 2 + T * k * (4 + 4 + 8)
    need = max(0, 2 * l2_bytes - weight_bytes)
    n = max(min_sets, need // per_set + 1 if need else min_sets)   # strictly more than 2x L2
    n = min(n, max_sets, max(1, max_total_bytes // per_set))
    g = torch.Generator().manual_seed(seed)
    sets = []
    for _ in range(n):
        x = torch.randn(T, H, generator=g).to(config.torch_dtype).to(device)
        w, ids = make_routing(T, E, k, generator=g, device=device, skew=skew)
        sets.append(InputSet(x, w, ids, ids.long(), int(torch.unique(ids).numel())))
    cycle = n * per_set + weight_bytes
    note = "" if cycle > 2 * l2_bytes else (f"working set {cycle >> 20} MiB < 2x L2 ({(2 * l2_bytes) >> 20} MiB): "
                                           "times may be flattered by L2")
    return InputSets(sets, cycle, note)


def make_weights(config: MoEConfig, scheme="none", device="cpu", *, seed: int = 0, base=None):
    """Random experts (std 1/sqrt(K), so activations stay O(1)) quantized to ``scheme``.

    ``base``: 16-bit ExpertWeights to quantize instead of drawing new ones (so every scheme of a
    shape starts from the same weights)."""
    from ..weights import ExpertWeights  # noqa: PLC0415
    s = QuantScheme.parse(scheme)
    if base is None:
        g = torch.Generator().manual_seed(seed)
        E, N, H, I = config.num_local_experts, config.n13, config.hidden_size, config.intermediate_size
        dt = config.torch_dtype
        w13 = (torch.randn(E, N, H, generator=g) / math.sqrt(H)).to(dt).to(device)
        w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).to(dt).to(device)
        b13 = b2 = None
        if config.has_bias:
            b13 = (0.1 * torch.randn(E, N, generator=g)).to(dt).to(device)
            b2 = (0.1 * torch.randn(E, H, generator=g)).to(dt).to(device)
        base = ExpertWeights(w13, w2, w13_bias=b13, w2_bias=b2)
    if s.method == QuantMethod.NONE:
        return base
    from ..quantize import quantize_experts  # noqa: PLC0415
    return quantize_experts(base.w13, base.w2, s, w13_bias=base.w13_bias, w2_bias=base.w2_bias)


def total_weight_bytes(weights) -> int:
    return sum(t.numel() * t.element_size() for k, t in weights.tensors().items() if not k.startswith("a"))
