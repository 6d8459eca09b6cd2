"""``triton_batched``: Triton expert GEMMs in the batched (expert-major) format.

Input [E_loc, T_max, H] + counts int32 [E_loc] (from ``LocalBatched`` or a low-latency
all-to-all). Every expert's GEMM runs over its first counts[e] rows; programs past a count
exit at once (no host sync), so the grid and buffers are fixed for a given T_max: the
format for CUDA-graph-captured decode. GEMM1 fuses the gated activation; the output is
unweighted and finalize weights and scatters it back (BatchedWeightAndReduce).
"""
from __future__ import annotations

from ..config import MoEConfig, QuantMethod
from ..modular.interfaces import ActivationFormat, BatchedWeightAndReduce, Experts, WorkspaceSpec
from ..quantize import quantize_activation
from .registry import BackendSpec, Reason, register
from .triton import QUANT_MIN_SM, QUANT_MODE, _check, convert_weights


class TritonBatchedExperts(Experts):
    activation_format = ActivationFormat.BATCHED

    def __init__(self, config: MoEConfig, weights, *, max_num_tokens: int):
        super().__init__(config, weights, max_num_tokens=max_num_tokens)
        from ..kernels.batched_gemm import default_batched_config
        self.scheme = weights.scheme
        self.input_quant = self.scheme.method != QuantMethod.NONE
        self.mode = QUANT_MODE[self.scheme.method]
        c = config
        wdt = weights.w13.dtype
        self.cfg1 = default_batched_config(max_num_tokens, c.num_local_experts, c.n13, c.hidden_size, wdt,
                                           self.scheme.block_shape)
        self.cfg2 = default_batched_config(max_num_tokens, c.num_local_experts, c.hidden_size,
                                           c.intermediate_size, wdt, self.scheme.block_shape)

    def workspace(self, M, topk):
        c = self.config
        E, dt = c.num_local_experts, c.torch_dtype
        return WorkspaceSpec({"h": ((E, M, c.intermediate_size), dt), "out": ((E, M, c.hidden_size), dt)})

    def weight_and_reduce(self):
        return BatchedWeightAndReduce()

    def quantize_input(self, a1, counts=None):
        return quantize_activation(a1, self.scheme, self.weights.a13_scale, counts)

    def apply(self, prep, ws, expert_map):
        from ..kernels.batched_gemm import batched_gemm1_act, batched_gemm2
        c, w = self.config, self.weights
        counts = prep.expert_tokens_meta.expert_num_tokens
        q = dict(scale_mode=self.mode, block_shape=self.scheme.block_shape)
        h = batched_gemm1_act(prep.a1q, counts, w.w13, c.activation.value, ws["h"], bias=w.w13_bias,
                              swiglu_limit=c.swiglu_limit, alpha=c.swigluoai_alpha, limit=c.swigluoai_limit,
                              a_scale=prep.a1q_scale, b_scale=w.w13_scale, config=self.cfg1, **q)
        h_scale = None
        if self.input_quant:
            h, h_scale = quantize_activation(h, self.scheme, w.a2_scale, counts)
        return batched_gemm2(h, counts, w.w2, ws["out"], bias=w.w2_bias, a_scale=h_scale,
                             b_scale=w.w2_scale, config=self.cfg2, **q)


def _make(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    return TritonBatchedExperts(config, weights, max_num_tokens=max_num_tokens)


def _check_batched(config: MoEConfig, quant, platform):
    """The triton backend's checks, and the batched kernel's own: its 8-bit K tile is at least
    32 on every device (default_batched_config), so fp8_block's K group must be a multiple of 32
    (a smaller group asserted at launch)."""
    r = _check(config, quant, platform)
    if quant.method == QuantMethod.FP8_BLOCK and quant.block_shape[1] % 32:
        r.append(Reason("block_shape", f"the batched kernel's 8-bit K tile is at least 32: fp8_block's K group "
                                       f"{quant.block_shape[1]} must be a multiple of 32"))
    return r


SPEC = register(BackendSpec(
    name="triton_batched",
    description="Triton expert GEMMs over the batched [E_loc, T_max, H] format (+counts): fixed grid, "
                "graph-friendly decode and the EP low-latency layout",
    make_experts=_make,
    quant_methods=frozenset(QUANT_MODE),
    quant_min_sm=QUANT_MIN_SM,
    formats=frozenset({ActivationFormat.BATCHED}),
    min_sm=80,
    needs_triton=True,
    check=_check_batched,
    convert_weights=convert_weights,
))
