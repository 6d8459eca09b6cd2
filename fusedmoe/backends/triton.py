"""``triton``: fusedmoe's Triton experts, standard format. It executes launch plans.

What a call of T tokens runs (the decode kernels or the grouped GEMMs, their math, tiles and
flags) is decided by ``fusedmoe/plan.py`` and nowhere else; this module turns a plan into
launches and keeps them bound per shape (``launcher.Bound``), so a repeated eager call only
puts its tensors into the launches' slots.

Weights: swigluoai's interleaved gate/up rows are de-interleaved into halves once at load
(the kernels read gate rows [0, I) and up rows [I, 2I)).
"""
from __future__ import annotations

import threading

import torch

from ..config import GateUpLayout, MoEConfig, QuantMethod
from ..modular.interfaces import ActivationFormat, Experts, NoOpWeightAndReduce, WorkspaceSpec
from ..quantize import quantize_activation
from ..plan import QUANT_MODE, Planner, check as plan_check, make_launch_configs
from ..weights import ExpertWeights
from .registry import BackendSpec, Reason, register

# fp8 tensor cores arrive with sm89 (Ada/Hopper); int8 ones with sm80
QUANT_MIN_SM = {QuantMethod.FP8_TENSOR: 89, QuantMethod.FP8_CHANNEL: 89, QuantMethod.FP8_BLOCK: 89,
                QuantMethod.INT8_CHANNEL: 80}


def deinterleave_rows(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] with rows g0,u0,g1,u1,... -> [E, 2I, ...] with rows g0..gI-1, u0..uI-1."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()


def convert_weights(config: MoEConfig, weights: ExpertWeights, platform) -> ExpertWeights:
    w = weights
    if config.gate_up_layout == GateUpLayout.INTERLEAVED:
        ch = {"w13": deinterleave_rows(w.w13)}
        if w.w13_bias is not None:
            ch["w13_bias"] = deinterleave_rows(w.w13_bias)
        if w.w13_scale is not None and w.w13_scale.dim() >= 2:   # per-channel scales follow their rows
            ch["w13_scale"] = deinterleave_rows(w.w13_scale)
        w = w.replace(**ch)
    return w.replace(w13=w.w13.contiguous(), w2=w.w2.contiguous())


class TritonExperts(Experts):
    activation_format = ActivationFormat.STANDARD

    def __init__(self, config: MoEConfig, weights: ExpertWeights, platform, *, deterministic: bool = True):
        super().__init__(config, weights)
        self.scheme = weights.scheme
        self.quant_mode = QUANT_MODE[self.scheme.method]
        # W8A8: x is quantized here (grouped path: one kernel before GEMM1; decode: per the
        # plan's math), so prepare hands the experts 16-bit x
        self.input_quant = False
        self.quantized = self.scheme.method != QuantMethod.NONE
        self.platform = platform
        self.block_shape = self.scheme.block_shape
        self.planner = Planner(config, self.scheme, platform, deterministic=deterministic)
        self.decode_pairs = self.planner.decode_pairs
        from ..kernels import launcher
        launcher.set_fast(self.planner.forced.fast_launch)
        # keyed by thread too: a bound launch reuses its argument list and buffers (h, scratch,
        # q), so two threads calling one module at once must not share one
        self._plans: dict = {}      # decode: (shape, thread) key -> the bound launches (_decode)
        self._qplans: dict = {}     # decode: (input, thread) key -> (bound quantization launch, q, scale)
        self._specs: dict = {}

    def plan(self, T: int):
        """The LaunchPlan of a call of T tokens (fusedmoe/plan.py)."""
        return self.planner.plan(T)

    @property
    def lc(self):
        return self.planner.launch_configs

    def h_group(self, T: int):
        """1 x g: a call of T tokens quantizes GEMM2's input h in fp8 1 x g groups where the
        scheme's own rule differs (fp8_channel: per token), i.e. matches
        ``reference_moe(..., h_group=g)``; None where it follows the scheme's rule."""
        return self.planner.h_group(T)

    def quantizes_activations(self, T: int) -> bool:
        """Whether a forward of T tokens quantizes x and h as the W8A8 scheme does (False for
        16-bit schemes, and for decode-size calls in a16 math: those match
        ``reference_moe(..., quantize_activations=False)``)."""
        return self.plan(T).quantizes_activations

    def workspace(self, M, topk):
        # called per forward (it keys the framework's buffer cache): memoized per shape (the
        # plan of M tokens is fixed for this module)
        spec = self._specs.get((M, topk))
        if spec is None:
            if len(self._specs) > 64:
                self._specs.clear()
            c = self.config
            p = self.plan(M)
            if p.path == "decode":                            # h and out only
                spec = WorkspaceSpec({"h": ((M * topk, c.intermediate_size), c.torch_dtype),
                                      "out": ((M, c.hidden_size), c.torch_dtype)})
            else:
                spec = self._workspace(M, topk, p)
            self._specs[(M, topk)] = spec
        return spec

    def _workspace(self, M, topk, p):
        from ..kernels.align import max_padded_size
        from ..kernels.grouped_gemm import gemm2_workspace_spec
        c = self.config
        bm = p.block_m
        mp = max_padded_size(M * topk, bm, c.num_local_experts)
        dt = c.torch_dtype
        bufs = {"sorted_ids": ((mp,), torch.int32), "expert_ids": ((mp // bm,), torch.int32),
                "ntpp": ((1,), torch.int32), "h": ((M * topk, c.intermediate_size), dt),
                "out": ((M, c.hidden_size), dt)}
        if p.sorted_h:   # h in sorted order: a row for every padded position
            bufs["h"] = ((mp, c.intermediate_size), dt)
        if p.sorted_x:   # x copied to the sorted positions for GEMM1
            bufs["xs"] = ((mp, c.hidden_size), dt)
        if p.h_group:   # h fp8 with its group scales, written by GEMM1
            bufs["h"] = ((M * topk, c.intermediate_size), torch.float8_e4m3fn)
            bufs["h_scale"] = ((M * topk, -(-c.intermediate_size // p.h_group)), torch.float32)
        y = gemm2_workspace_spec(M, topk, c.hidden_size, p.gemm2, p.reduce, dt)
        if y is not None:
            bufs["y"] = y
        return WorkspaceSpec(bufs)

    def weight_and_reduce(self):
        return NoOpWeightAndReduce()

    def apply(self, prep, ws, expert_map):
        p = self.plan(prep.topk_ids.shape[0])
        if p.path == "decode":
            return self._decode(p, prep.a1q, prep.topk_weights, prep.topk_ids, ws["h"], ws["out"], expert_map)
        return self._grouped(p, prep, ws, expert_map)

    def direct(self, x, topk_weights, topk_ids, expert_map):
        """The whole forward of a decode-size call (ModularKernel's ``direct`` hook: prepare
        and finalize have nothing to do for this backend), None for the grouped path. h is
        kept per shape with the bound launches."""
        p = self.plan(topk_ids.shape[0])
        if p.path != "decode":
            return None
        return self._decode(p, x, topk_weights, topk_ids, None, torch.empty_like(x), expert_map)

    # -- decode ----------------------------------------------------------------------
    def _dquant(self, a, static_scale, p, role="x"):
        """A decode GEMM input: 16-bit as given in a16 math, else quantized as ``_quant``
        does. Per-token and group schemes on CUDA quantize through a launch bound per input
        shape into buffers kept with it: a repeated eager decode call does not allocate or
        build launches (H100, deepseek tp8 fp8_block T=2: the two unbound quantizations were
        ~70% of a 233 µs eager host time). The buffers are reused by the next call of the
        same shape and ``role`` ('x' / 'h': never one buffer for both; stream-ordered)."""
        if p.a16:
            return a, None
        pdl = p.chain
        m = self.scheme.method
        if (static_scale is not None or m not in (QuantMethod.FP8_CHANNEL, QuantMethod.INT8_CHANNEL,
                                                  QuantMethod.FP8_BLOCK)
                or not a.is_cuda or a.dim() != 2 or a.stride(-1) != 1 or a.shape[0] == 0):
            return self._quant(a, static_scale, pdl)
        key = (role, a.shape, a.stride(0), a.dtype, a.device, pdl, threading.get_ident())
        qp = self._qplans.get(key)
        if qp is not None:
            qp[0].fast(a)
            return qp[1], qp[2]
        from ..kernels import quantize as qk
        from ..kernels.launcher import bind
        T, K = a.shape
        if m == QuantMethod.FP8_BLOCK:
            q = torch.empty(T, K, dtype=torch.float8_e4m3fn, device=a.device)
            sc = torch.empty(T, -(-K // self.block_shape[1]), dtype=torch.float32, device=a.device)
        else:
            q = torch.empty(T, K, dtype=torch.int8 if m == QuantMethod.INT8_CHANNEL else torch.float8_e4m3fn,
                            device=a.device)
            sc = torch.empty(T, 1, dtype=torch.float32, device=a.device)
        spec = qk.quant_launch(a, q, sc, m.value, group=self.block_shape[1] if self.block_shape else 128,
                               pow2=self.scheme.scale_pow2, pdl=pdl)
        if len(self._qplans) >= 32:
            self._qplans.clear()
        self._qplans[key] = (bind(*spec, slots=[0]), q, sc)
        return q, sc

    def _quant(self, a, static_scale, pdl=False, zero=None):
        """A GEMM input for W8A8 schemes, quantized by its own kernel: (a, None) for 16-bit.
        ``zero``: a tensor of a's shape the same launch fills with zeros (W8A8 only)."""
        if not self.quantized:
            return a, None
        return quantize_activation(a, self.scheme, static_scale, pdl=pdl, zero=zero)

    def _must_zero_h(self, expert_map) -> bool:
        # dropped slots' rows are never written; a dynamic per-tensor amax must not see garbage
        return (expert_map is not None and self.scheme.method == QuantMethod.FP8_TENSOR
                and self.weights.a2_scale is None)

    def _decode(self, p, x, tw, ids, h, out, expert_map):
        """The decode launches. The first call per shape builds and binds them; later calls
        only put this call's tensors into their slots: a decode forward's host time is mostly
        this Python. ``h`` None: the bound plan's (allocated at its first call)."""
        x, x_scale = self._dquant(x, self.weights.a13_scale, p)
        key = (ids.shape, x.stride(), None if expert_map is None else expert_map.shape, threading.get_ident())
        bound = self._plans.get(key)
        if h is None:
            h = bound[2] if bound is not None else None
            if h is None or h.device != x.device:
                h = torch.empty(ids.numel(), self.config.intermediate_size, dtype=self.config.torch_dtype,
                                device=x.device)
        if not p.a16 and self._must_zero_h(expert_map):
            h.zero_()
        # the kernels take the ids as a flat pointer: the [T, k] tensor itself (contiguous,
        # PreparedExperts.run) fills the slot bound with its view(-1), without a new view
        flat = ids if ids.is_contiguous() else ids.contiguous()
        emap = flat if expert_map is None else expert_map
        if bound is None or out.stride() != bound[3]:
            return self._bind_decode(p, key, x, x_scale, ids, tw, h, out, expert_map)
        b1, b2, b0 = bound[0], bound[1], bound[4]
        if b0 is not None:
            b0.fast(flat, emap)
        if x_scale is None:
            b1.fast(x, h, flat, emap)
        else:
            b1.fast(x, h, flat, emap, x_scale)
        hq, h_scale = self._dquant(h, self.weights.a2_scale, p, role="h")
        if h_scale is None:
            b2.fast(hq, out, tw, flat, emap)
        else:
            b2.fast(hq, out, tw, flat, emap, h_scale)
        return out

    def _tc_launches(self, p, x, h, ids):
        """(gemm1_launch, gemm2_launch, table_launch or None) of kernels/decode_tc.py with the
        plan's configs, this shape's scratch (fp32 partials, int32 tickets: zero now, left zero
        by every launch) and SHARE table bound in; the table's launch runs before GEMM1."""
        from ..kernels import decode_tc as tc
        c = self.config
        T, k = ids.shape
        c1, c2 = p.gemm1, p.gemm2
        s1, s2 = tc.scratch(T, k, h.shape[1], c.hidden_size, c1, c2, c.is_gated, x.device)
        table = tc.share_table(T, k, x.device) if p.share else None

        def g1(*a, **kw):
            return tc.tc_gemm1_launch(*a[:5], *s1, config=c1, table=table, **kw)

        def g2(*a, **kw):
            return tc.tc_gemm2_launch(*a[:5], *s2, config=c2, table=table, **kw)

        def g0(ids, expert_map, pdl):
            return tc.share_table_launch(ids, table, c.num_local_experts, expert_map=expert_map, pdl=pdl)
        return g1, g2, (g0 if table is not None else None)

    def _bind_decode(self, p, key, x, x_scale, ids, tw, h, out, expert_map):
        from ..kernels import decode as dk
        from ..kernels.decode import GEMM1_SLOTS as S1, GEMM2_SLOTS as S2
        from ..kernels.launcher import bind
        c, w = self.config, self.weights
        q = dict(quant=self.quant_mode, block_shape=self.block_shape)
        b0 = None
        if p.tc and x.element_size() == 1:       # (the tc slots are decode.py's: same positions)
            gemm1_launch, gemm2_launch, table_launch = self._tc_launches(p, x, h, ids)
            if table_launch is not None:          # SHARE: the table, a link of the chain before GEMM1
                b0 = bind(*table_launch(ids, expert_map, p.chain), slots=(0, 1))
            c1 = c2 = None
        else:
            gemm1_launch, gemm2_launch = dk.gemm1_launch, dk.gemm2_launch
            c1, c2 = dict(p.gemm1), dict(p.gemm2)
        cfg1 = {} if c1 is None else {"config": c1}
        cfg2 = {} if c2 is None else {"config": c2}
        names = ("out", "ids", "map")
        spec = gemm1_launch(x, w.w13, ids, c.activation.value, h, expert_map=expert_map, bias=w.w13_bias,
                            swiglu_limit=c.swiglu_limit, alpha=c.swigluoai_alpha, limit=c.swigluoai_limit,
                            a_scale=x_scale, b_scale=w.w13_scale, pdl=p.pdl, pdl_wait=p.chain, **q, **cfg1)
        slots = [S1[n] for n in ("x",) + names + (("a_scale",) if x_scale is not None else ())]
        b1 = bind(*spec, slots=slots)
        hq, h_scale = self._dquant(h, w.a2_scale, p, role="h")
        spec = gemm2_launch(hq, w.w2, ids, tw, out, expert_map=expert_map,
                            mul_routed_weight=not c.routing.apply_router_weight_on_input, bias=w.w2_bias,
                            a_scale=h_scale, b_scale=w.w2_scale, pdl=p.pdl, **q, **cfg2)
        slots = [S2[n] for n in ("h", "out", "topk_weights", "ids", "map")
                 + (("a_scale",) if h_scale is not None else ())]
        b2 = bind(*spec, slots=slots)
        if len(self._plans) >= 16:
            self._plans.clear()
        self._plans[key] = (b1, b2, h, out.stride(), b0)
        return out

    # -- grouped ---------------------------------------------------------------------
    def _grouped(self, p, prep, ws, expert_map):
        from ..kernels.align import AlignResult, align_block_size
        from ..kernels.grouped_gemm import gather_sorted, gemm1_act, gemm2
        c, w = self.config, self.weights
        ids = prep.topk_ids
        k = ids.shape[1]
        c1, c2 = dict(p.gemm1), dict(p.gemm2)
        out = ws["out"]
        # an atomic k-sum into the output needs it zeroed: by the quantization of x when
        # there is one (the same [T, H] rows; no launch of its own), else by a fill before
        # the alignment, or by GEMM1 on the side for the largest outputs (plan.zero). Either
        # way GEMM2 may stay a dependent launch in the PDL chain.
        zero_early = bool(p.zero) and out.stride(-1) == 1 and tuple(out.shape) == tuple(prep.a1q.shape)
        zero_g1 = zero_early and p.zero == "gemm1" and out.is_contiguous()
        if zero_early and not zero_g1 and not self.quantized:
            out.zero_()
        x, x_scale = self._quant(prep.a1q, w.a13_scale, zero=out if zero_early and not zero_g1 else None)
        align = align_block_size(ids, p.block_m, c.num_local_experts, expert_map,
                                 out=AlignResult(ws["sorted_ids"], ws["expert_ids"], ws["ntpp"]), pdl=p.pdl)
        q = dict(quant=self.quant_mode, block_shape=self.block_shape)
        if self._must_zero_h(expert_map):
            ws["h"].zero_()
        act = dict(swiglu_limit=c.swiglu_limit, alpha=c.swigluoai_alpha, limit=c.swigluoai_limit,
                   zero=out if zero_g1 else None)
        a_group = None
        if p.h_group:   # h fp8 in 1 x g groups straight from GEMM1's epilogue
            h, h_scale = gemm1_act(x, w.w13, align, k, c.activation.value, ws["h"], bias=w.w13_bias, **act,
                                   config=c1, a_scale=x_scale, b_scale=w.w13_scale, pdl=p.pdl,
                                   out_group=p.h_group, out_scale=ws["h_scale"], out_pow2=self.scheme.scale_pow2,
                                   **q)
            if self.quant_mode == "channel":
                a_group = p.h_group
        else:
            if p.sorted_x:
                x = gather_sorted(x, align, k, ws["xs"], pdl=p.pdl)
            h = gemm1_act(x, w.w13, align, k, c.activation.value, ws["h"], bias=w.w13_bias, **act,
                          config=c1, a_scale=x_scale, b_scale=w.w13_scale, pdl=p.pdl, out_sorted=p.sorted_h,
                          x_sorted=p.sorted_x, **q)
            h, h_scale = self._quant(h, w.a2_scale, pdl=p.pdl)
        return gemm2(h, w.w2, align, prep.topk_weights, out,
                     mul_routed_weight=not c.routing.apply_router_weight_on_input, bias=w.w2_bias,
                     config=c2, reduce=p.reduce, workspace=ws.get("y"),
                     a_scale=h_scale, b_scale=w.w2_scale, pdl=p.pdl, a_group=a_group, out_zeroed=zero_early,
                     h_sorted=p.sorted_h, **q)


def _check(config: MoEConfig, quant, platform):
    return [Reason(code, text) for code, text in plan_check(config, quant, platform)]


def _variants(config, quant, platform):
    """The selection report's rows: the plan of each token bucket, described (fusedmoe/plan.py)."""
    try:
        return Planner(config, quant, platform, launch_configs=make_launch_configs(config, quant, platform)).report()
    except Exception as e:  # Triton missing on a dry-run machine: say so instead of failing explain
        return {"all": f"(launch plans unavailable here: {e})"}


def _make(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    return TritonExperts(config, weights, platform, deterministic=deterministic)


SPEC = register(BackendSpec(
    name="triton",
    description="Triton grouped GEMMs: fused gated activation in GEMM1, routing weight in GEMM2, k-sum "
                "as a fixed-order reduce (deterministic) or atomic adds into the output (large T); decode "
                "(split-K) and prefill tile regimes",
    make_experts=_make,
    quant_methods=frozenset(QUANT_MODE),
    quant_min_sm=QUANT_MIN_SM,
    min_sm=80,
    needs_triton=True,
    check=_check,
    convert_weights=convert_weights,
    variants=_variants,
))
