"""``emulation``: any scheme through a 16-bit engine.

Weights are dequantized once into the activation dtype (again only after they change:
loaded, updated in place; ``torch_ref.WeightsDerived``); activations are
fake-quantized exactly as the scheme quantizes them (GEMM1's input and GEMM2's input), so
the numerics match the scheme's reference while the GEMMs run on a fast 16-bit engine:
PyTorch's grouped GEMM where it can run (CPU; bf16 on sm80+), else the reference loop.
The fast correct path for formats this chip cannot run natively (nvfp4/mxfp4 on Hopper,
fp8 on Ampere); it costs 16-bit weight memory and bandwidth (a one-time WARNING says so).
"""
from __future__ import annotations

from functools import partial

import torch

from ..config import QuantMethod
from ..modular.interfaces import ActivationFormat
from ..reference.moe import dequantized_weights
from ..reference.quant import fake_quant_activation
from ..weights import ExpertWeights
from .grouped_mm import GroupedMMExperts, _check as _grouped_check
from .registry import ALL_QUANT, BackendSpec, register
from .torch_ref import TorchRefBatchedExperts, TorchRefExperts, dequantized


def _dequant16(config, weights: ExpertWeights) -> ExpertWeights:
    w13, w2 = dequantized_weights(weights)
    dt = config.torch_dtype
    return ExpertWeights(w13.to(dt), w2.to(dt), w13_bias=weights.w13_bias, w2_bias=weights.w2_bias)


class EmulationExperts(GroupedMMExperts):
    """grouped_mm over dequantized weights, with the scheme's activation fake-quantization."""

    def __init__(self, config, weights: ExpertWeights, **kw):
        self._w16 = dequantized(weights, partial(_dequant16, config))
        super().__init__(config, self._w16.get(), **kw)
        self.orig = weights                      # scheme + static activation scales

    def apply(self, prep, ws, expert_map):
        w16 = self._w16.get()
        if w16 is not self.weights:              # the weights changed: view the new copy
            self.w13_t, self.w2_t = w16.w13.transpose(1, 2), w16.w2.transpose(1, 2)
            self.weights = w16
        return super().apply(prep, ws, expert_map)

    def gemm_input(self, x):
        return fake_quant_activation(x.float(), self.orig.scheme, static_scale=self.orig.a13_scale)

    def between_gemms(self, h, valid):
        h = torch.where(valid, h, torch.zeros((), dtype=h.dtype, device=h.device))
        if not self.orig.scheme.method.quantizes_activations:
            return h
        # per-tensor scales see only the local slots' rows (as the reference does); zero rows
        # do not change an amax, so quantizing the masked tensor is the same.
        return fake_quant_activation(h, self.orig.scheme, static_scale=self.orig.a2_scale)


def _make(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    if fmt == ActivationFormat.BATCHED:
        return TorchRefBatchedExperts(config, weights, max_num_tokens=max_num_tokens)
    if not _grouped_check(config, weights.scheme, platform):
        return EmulationExperts(config, weights)
    return TorchRefExperts(config, weights)   # reference loop over once-dequantized weights


SPEC = register(BackendSpec(
    name="emulation",
    description="dequantize weights once, fake-quantize activations like the scheme, run a 16-bit engine "
                "(grouped_mm where it runs, else the reference loop)",
    make_experts=_make,
    quant_methods=ALL_QUANT - {QuantMethod.NONE},
    formats=frozenset({ActivationFormat.STANDARD, ActivationFormat.BATCHED}),
    native=False,
))
