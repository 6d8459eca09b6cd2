"""``torch_ref``: the plain-torch reference as a backend (every scheme, activation, device,
both formats). The conformance baseline; slow (a Python loop over experts, host syncs)."""
from __future__ import annotations

from functools import partial

import torch

from ..config import MoEConfig
from ..modular.interfaces import (ActivationFormat, BatchedWeightAndReduce, Experts, NoOpWeightAndReduce,
                                  WorkspaceSpec)
from ..reference.activations import activation_from_config
from ..reference.moe import dequantized_weights, moe_pipeline, reference_moe
from ..reference.quant import fake_quant_activation
from .registry import ALL_QUANT, BackendSpec, register

# the tensors dequantized_weights reads
_DEQUANT_SOURCES = ("w13", "w2", "w13_scale", "w2_scale", "w13_zero", "w2_zero", "w13_global_scale",
                    "w2_global_scale")


class WeightsDerived:
    """A value computed from weight tensors (a dequantized copy), recomputed by the first
    ``get`` after one of them changed: written in place (its version counter moved:
    load_state_dict, copy_) or given new storage (its data pointer moved: ``.data =``,
    ``set_``). The check reads two attributes a tensor on the host, no device sync; a new
    value replaces the old one in one assignment, so a call on another thread keeps the one it
    read. Inference tensors carry no version counter: only their storage is watched."""

    def __init__(self, fn, tensors):
        self._fn = fn
        self._tensors = tuple(tensors)
        self._versioned = tuple(t for t in self._tensors if not t.is_inference())
        self._cur = (self._key(), fn())

    def _key(self):
        return [t._version for t in self._versioned], [t.data_ptr() for t in self._tensors]

    def get(self):
        key = self._key()
        cur = self._cur
        if cur[0] != key:
            cur = self._cur = (key, self._fn())
        return cur[1]


def dequantized(weights, fn=dequantized_weights) -> WeightsDerived:
    """``fn(weights)`` (default: the fp32 dequantized (w13, w2)), kept while the tensors it
    reads are unchanged."""
    tensors = [getattr(weights, n) for n in _DEQUANT_SOURCES if getattr(weights, n) is not None]
    return WeightsDerived(partial(fn, weights), tensors)


class TorchRefExperts(Experts):
    """Standard format: the reference forward, already weighted and reduced -> [T, H]."""

    activation_format = ActivationFormat.STANDARD

    def __init__(self, config: MoEConfig, weights, **kw):
        super().__init__(config, weights, **kw)
        self._deq = dequantized(weights)

    def workspace(self, M, topk):
        # Only the output is a framework buffer; the reference's temporaries are its own
        # (it is a correctness path, not CUDA-graph safe).
        return WorkspaceSpec({"out": ((M, self.config.hidden_size), self.config.torch_dtype)})

    def weight_and_reduce(self):
        return NoOpWeightAndReduce()

    def apply(self, prep, ws, expert_map):
        out = reference_moe(prep.a1q, self.weights, prep.topk_weights, prep.topk_ids, self.config,
                            expert_map=expert_map, dequantized=self._deq.get(), input_prescaled=True)
        ws["out"].copy_(out)
        return ws["out"]


class TorchRefBatchedExperts(Experts):
    """Batched format: per local expert, its first counts[e] rows (the reference pipeline over
    the valid rows, each a one-slot token of its row's expert); output unweighted."""

    activation_format = ActivationFormat.BATCHED

    def __init__(self, config, weights, **kw):
        super().__init__(config, weights, **kw)
        self._deq = dequantized(weights)

    def workspace(self, M, topk):
        c = self.config
        return WorkspaceSpec({"out": ((c.num_local_experts, M, c.hidden_size), c.torch_dtype)})

    def weight_and_reduce(self):
        return BatchedWeightAndReduce()

    def apply(self, prep, ws, expert_map):
        c, w = self.config, self.weights
        x = prep.a1q                                                       # [E_loc, Tm, H]
        E_loc, Tm, _ = x.shape
        counts = prep.expert_tokens_meta.expert_num_tokens                 # [E_loc]
        valid = torch.arange(Tm, device=x.device)[None, :] < counts[:, None].long()   # [E_loc, Tm]
        # each valid row is a token with one slot (k = 1), whose expert is its row's; the
        # output stays unweighted (finalize weights it)
        row_expert = torch.arange(E_loc, device=x.device)[:, None].expand(E_loc, Tm)[valid]
        xq = fake_quant_activation(x[valid].float(), w.scheme, static_scale=w.a13_scale)   # [n, H]
        fq2 = partial(fake_quant_activation, scheme=w.scheme, static_scale=w.a2_scale)
        y = moe_pipeline(xq, *self._deq.get(), row_expert, 1, partial(activation_from_config, cfg=c),
                         b13=w.w13_bias, b2=w.w2_bias, fq2=fq2)            # [n, H]
        out = ws["out"]
        out.zero_()
        out[valid] = y.to(out.dtype)
        return out


def _make(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    if fmt == ActivationFormat.BATCHED:
        return TorchRefBatchedExperts(config, weights, max_num_tokens=max_num_tokens)
    return TorchRefExperts(config, weights)


SPEC = register(BackendSpec(
    name="torch_ref",
    description="plain-torch per-expert loop over dequantized weights; every scheme, any device (conformance baseline)",
    make_experts=_make,
    quant_methods=ALL_QUANT,
    formats=frozenset({ActivationFormat.STANDARD, ActivationFormat.BATCHED}),
    cuda_graph_safe=False,
    native=False,
))
