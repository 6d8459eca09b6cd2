"""``torch_ref``: the plain-torch reference as a backend (every scheme, activation, device,
both formats). The conformance baseline; slow (a Python loop over experts, host syncs)."""
from __future__ import annotations

import torch

from ..config import MoEConfig
from ..modular.interfaces import (ActivationFormat, BatchedWeightAndReduce, Experts, NoOpWeightAndReduce,
                                  WorkspaceSpec)
from ..reference.activations import activation_from_config
from ..reference.moe import dequantized_weights, reference_moe
from ..reference.quant import fake_quant_activation
from .registry import ALL_QUANT, BackendSpec, register


class TorchRefExperts(Experts):
    """Standard format: the reference forward, already weighted and reduced -> [T, H]."""

    activation_format = ActivationFormat.STANDARD

    def __init__(self, config: MoEConfig, weights, **kw):
        super().__init__(config, weights, **kw)
        self._deq = dequantized_weights(weights)

    def workspace(self, M, topk):
        # Only the output is a framework buffer; the reference's temporaries are its own
        # (it is a correctness path, not CUDA-graph safe).
        return WorkspaceSpec({"out": ((M, self.config.hidden_size), self.config.torch_dtype)})

    def weight_and_reduce(self):
        return NoOpWeightAndReduce()

    def apply(self, prep, ws, expert_map):
        out = reference_moe(prep.a1q, self.weights, prep.topk_weights, prep.topk_ids, self.config,
                            expert_map=expert_map, dequantized=self._deq, input_prescaled=True)
        ws["out"].copy_(out)
        return ws["out"]


class TorchRefBatchedExperts(Experts):
    """Batched format: per local expert, its first counts[e] rows; output unweighted."""

    activation_format = ActivationFormat.BATCHED

    def __init__(self, config, weights, **kw):
        super().__init__(config, weights, **kw)
        self._deq = dequantized_weights(weights)

    def workspace(self, M, topk):
        c = self.config
        return WorkspaceSpec({"out": ((c.num_local_experts, M, c.hidden_size), c.torch_dtype)})

    def weight_and_reduce(self):
        return BatchedWeightAndReduce()

    def apply(self, prep, ws, expert_map):
        w13, w2 = self._deq
        scheme = self.weights.scheme
        x = prep.a1q                                                       # [E_loc, Tm, H]
        counts = prep.expert_tokens_meta.expert_num_tokens.tolist()
        out = ws["out"]
        out.zero_()
        xs = [x[e, :n].float() for e, n in enumerate(counts)]
        allx = torch.cat(xs) if xs else x.new_zeros(0, x.shape[-1]).float()
        fq = fake_quant_activation(allx, scheme, static_scale=self.weights.a13_scale).split(counts)
        hs = []
        for e, n in enumerate(counts):
            g = fq[e] @ w13[e].T                                           # [n, N]
            if self.weights.w13_bias is not None:
                g = g + self.weights.w13_bias[e].float()
            hs.append(activation_from_config(g, self.config))              # [n, I]
        allh = torch.cat(hs)
        hq = fake_quant_activation(allh, scheme, static_scale=self.weights.a2_scale).split(counts) \
            if allh.numel() else [h for h in hs]
        for e, n in enumerate(counts):
            if n == 0:
                continue
            y = hq[e] @ w2[e].T
            if self.weights.w2_bias is not None:
                y = y + self.weights.w2_bias[e].float()
            out[e, :n] = y.to(out.dtype)
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
