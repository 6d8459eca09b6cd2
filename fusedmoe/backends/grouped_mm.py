"""``grouped_mm``: PyTorch's grouped GEMMs. 16-bit weights through
``torch.nn.functional.grouped_mm`` (CUTLASS on sm90, a reference loop on CPU); fp8_channel
through ``torch._scaled_grouped_mm`` (fp8 rowwise, CUDA sm90 only).

Pipeline (standard format, no per-expert Python loop, no host sync):
  slots s = t*k + j sorted by local expert (stable) -> offsets = cumsum(counts) [E_loc]
  xs  = x[order // k]                                  [T*k, H]
  h   = act(grouped_mm(xs, w13^T, offs) + b13)         [T*k, N] -> [T*k, I]
  y   = grouped_mm(h, w2^T, offs) + b2                 [T*k, H]
  out = y unsorted to [T, k, H]; finalize weights and sums over k (Contiguous).
Non-local slots sort after every local expert and are zeroed before finalize.
fp8_channel: prepare quantizes x per token (e4m3, fp32 scale [T, 1]); the sorted rows and
their scales are gathered (xq[order // k], sx[order // k]); GEMM1 = _scaled_grouped_mm with
the per-channel weight scales w13_scale [E, N] as scale_b; h = act(g) in fp32 is requantized
per token (the scheme's GEMM2 input, exactly as reference_moe fake-quantizes it); GEMM2 the
same with w2_scale [E, H]. Weights stay [E, N, H] / [E, H, I] contiguous: the GEMMs read the
transposed views [E, H, N] / [E, I, H], which are the column-major operands the op wants.
use_fast_accum stays False (Hopper's fp8 accumulator promoted regularly: accurate); True is a
speed knob for the benchmark to try.

Which schemes, on which devices, why (read from torch 2.13's installed sources):
  none          CPU (any float dtype) and CUDA sm80+ in bfloat16 (``_grouped_mm`` has a
                CompositeExplicitAutograd fallback, ATen/ops/_grouped_mm_compositeexplicit
                autograd_dispatch.h, and a CUDA kernel that takes bf16 only); on both, rows of
                H and I elements must be multiples of 16 bytes (the CPU fallback raises
                "strides should be multiple of 16 bytes" too), else torch_ref serves.
  fp8_channel   CUDA sm90 (Hopper) only, bfloat16 models, H and I multiples of 16, and only
                when this torch has ``torch._scaled_grouped_mm`` (feature-detected, never
                assumed: the GPU machine runs torch 2.11).
  every other   refused with the why (``_QUANT_WHY``): fp8_block's 1x128 / 128x128 scales are
                not rowwise; int8 is not an fp8 operand; fp8_tensor is not wired (its
                per-tensor scales could be broadcast to rowwise: not implemented, not measured);
                weight-only and fp4 schemes have no scaled grouped GEMM in torch.
Facts about ``torch._scaled_grouped_mm`` (torch 2.13):
  - schema: ``_scaled_grouped_mm(Tensor self, Tensor mat2, Tensor scale_a, Tensor scale_b,
    Tensor? offs=None, Tensor? bias=None, Tensor? scale_result=None, ScalarType? out_dtype=None,
    bool use_fast_accum=False) -> Tensor`` (``torch.ops.aten._scaled_grouped_mm.default._schema``;
    torch/testing/_internal/generated/annotated_fn_args.py:976).
  - CUDA only: ATen/ops/_scaled_grouped_mm_native.h declares just ``_scaled_grouped_mm_cuda``
    and there is a _cuda_dispatch.h but no CPU / composite dispatch header; on CPU it raises
    "Could not run 'aten::_scaled_grouped_mm' with arguments from the 'CPU' backend".
  - devices: torch's own test gate PLATFORM_SUPPORTS_FP8_GROUPED_GEMM is
    ``SM90OrLater and not SM100OrLater`` on CUDA (torch/testing/_internal/common_cuda.py:190-200;
    sm100 gets the MXFP8 variant with e8m0 scales instead, same file :212); on ROCm it needs an
    MSLK build on gfx942/gfx950 and e4m3fnuz operands (_meta_registrations.py:8633-8643).
  - checks (torch/_meta_registrations.py:8611-8825, ``_meta_grouped_mm_common``, which mirrors
    ``_scaled_grouped_mm_cuda`` in Blas.cpp): mat_a and mat_b float8_e4m3fn (:8642); mat_a
    row-major, mat_b column-major in the last two dims (:8666-8680); the leading stride of both
    a multiple of 16 bytes (:8683, i.e. K % 16 == 0 for 1-byte fp8); scales both float32
    (:8717); 2D mat_a: scale_a 1D contiguous with mat_a.shape[0] elements (:8742); 3D mat_b:
    scale_b 2D [G, N] with stride(-1) == 1 (:8777); offs 1D int32 when an operand is 2D
    (:8807); bias and scale_result must be None (:8792, :8817); out_dtype None or bfloat16
    (:8822, default bf16 :8862). The output is allocated uninitialised (torch.empty_strided,
    :8569-8608): rows past offs[-1] are garbage, and this backend zeroes them before finalize.
  - offs: cumulative group ends, int32 (nn/functional.py:7123); an empty group is offs[g] ==
    offs[g-1].
  - torch 2.13 also has torch.nn.functional.scaled_grouped_mm (-> _scaled_grouped_mm_v2, with
    ScalingType recipes incl. BlockWise1x128 / 128x128; nn/functional.py:7225). Which recipes its
    grouped CUDA kernels accept is not readable from the Python sources, and torch 2.11 may
    lack it: not used here.
Verified on an H100 with torch 2.11 (2026-11-22): the op exists there with this signature;
exact per-expert row counts (offsets not multiples of 16: T = 7, 9 experts, an empty expert)
are accepted and match reference_moe (tests/test_grouped_mm_fp8.py, gpu); the forward captures
in a CUDA graph (fusedmoe bench timed it as graph replay). Speed: 3-5x slower than the
``triton`` backend on qwen3-30b-a3b and slower than this backend's own bf16 path at T >= 1024
(docs/BENCHMARKS.md), hence its place in the oracle's fp8 table. Determinism of the fp8
kernel is assumed like the 16-bit CUTLASS one (no split-K), not tested bitwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import MoEConfig, QuantMethod
from ..modular.interfaces import ActivationFormat, ContiguousWeightAndReduce, Experts, WorkspaceSpec
from ..quantize import quantize_activation
from ..reference.activations import activation_from_config
from ..weights import ExpertWeights
from .registry import BackendSpec, Reason, register, row_alignment

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
_scaled_grouped_mm = getattr(torch, "_scaled_grouped_mm", None)   # fp8 rowwise; CUDA sm90 only

# Why each scheme other than none / fp8_channel is refused (appended to the [quant] reason).
_NOT_ROWWISE = ("torch._scaled_grouped_mm scales rowwise only: one fp32 scale per row of A, "
                "one per output column of B")
_WEIGHT_ONLY = "weight-only: no grouped GEMM in torch dequantizes weights in its K loop"
_FP4 = "fp4: torch has no scaled grouped GEMM with e2m1 operands wired here"
_QUANT_WHY = {
    QuantMethod.FP8_BLOCK: f"{_NOT_ROWWISE}; fp8_block's 1x128 activation groups and 128x128 weight "
                           "blocks are not rowwise",
    QuantMethod.FP8_TENSOR: "not wired: its per-tensor scales would have to be broadcast to rowwise "
                            "scales (not implemented, not measured)",
    QuantMethod.INT8_CHANNEL: "torch._scaled_grouped_mm takes float8_e4m3fn operands only, "
                              "torch has no int8 grouped GEMM",
    QuantMethod.INT8_W8A16: _WEIGHT_ONLY, QuantMethod.INT4_W4A16: _WEIGHT_ONLY,
    QuantMethod.FP8_W8A16: _WEIGHT_ONLY,
    QuantMethod.NVFP4: _FP4, QuantMethod.MXFP4: _FP4,
}


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


def _gather_rows(q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """q fp8 [M, K] -> q[rows] [len(rows), K], contiguous (row-major, as mat_a must be).
    Through a uint8 view: byte gathers exist for every device and torch version."""
    return q.view(torch.uint8)[rows].view(q.dtype)


class GroupedMMFp8Experts(GroupedMMExperts):
    """fp8_channel through torch._scaled_grouped_mm (W8A8, per-token activation scales).

    prepare quantizes x per token (``input_quant``): a1q fp8 [T, H], a1q_scale fp32 [T, 1]."""

    input_quant = True

    def __init__(self, config: MoEConfig, weights: ExpertWeights, **kw):
        super().__init__(config, weights, **kw)
        # w13_t / w2_t (base class): column-major [E, K, N] views of the [E, N, K] weights,
        # which convert_weights made contiguous once at load; no copy per call
        self.scheme = weights.scheme
        self.w13_scale = weights.w13_scale                             # fp32 [E, N]: scale_b of GEMM1
        self.w2_scale = weights.w2_scale                               # fp32 [E, H]: scale_b of GEMM2

    def quantize_input(self, a1, counts=None):
        return quantize_activation(a1, self.scheme, self.weights.a13_scale, counts)

    def apply(self, prep, ws, expert_map):
        c, w = self.config, self.weights
        xq, xs, ids = prep.a1q, prep.a1q_scale, prep.topk_ids         # fp8 [T, H], fp32 [T, 1]
        T, k = ids.shape
        E_loc = c.num_local_experts
        order, skey, offs = sort_slots(ids, E_loc, expert_map)
        tok = torch.div(order, k, rounding_mode="floor")               # [T*k] token of each sorted slot
        a = _gather_rows(xq, tok)                                      # fp8 [T*k, H]
        sa = xs.reshape(-1)[tok]                                       # fp32 [T*k]
        g = _scaled_grouped_mm(a, self.w13_t, sa, self.w13_scale, offs=offs,
                               out_dtype=torch.bfloat16)               # bf16 [T*k, N]
        valid = (skey < E_loc).unsqueeze(1)                            # [T*k, 1]
        g = g.float()
        if w.w13_bias is not None:
            g = g + w.w13_bias[skey.clamp(max=E_loc - 1)].float()
        h = activation_from_config(g, c)                               # fp32 [T*k, I]
        # GEMM2's input, per token (rows are independent: the garbage rows past offs[-1]
        # get their own scales and are never read by GEMM2)
        hq, hs = quantize_activation(h, self.scheme)                   # fp8 [T*k, I], fp32 [T*k, 1]
        y = _scaled_grouped_mm(hq, self.w2_t, hs.reshape(-1), self.w2_scale, offs=offs,
                               out_dtype=torch.bfloat16)               # bf16 [T*k, H]
        if w.w2_bias is not None:
            y = y.float() + w.w2_bias[skey.clamp(max=E_loc - 1)].float()
        # rows past the last offset are not computed: select zeros (they may hold garbage)
        y = torch.where(valid, y, torch.zeros((), dtype=y.dtype, device=y.device))
        out = ws["out"].view(T * k, -1)
        out.index_copy_(0, order, y.to(out.dtype))                     # unsort: a permutation
        return ws["out"]


def _check(config: MoEConfig, quant, platform):
    """Whether the 16-bit path runs here (``quant`` is ignored: the emulation backend asks
    this about its dequantized weights, which are in the config's dtype)."""
    r = []
    if _grouped_mm is None:
        r.append(Reason("torch", f"this torch ({torch.__version__}) has no grouped_mm"))
    if platform.kind == "cuda" and config.dtype != "bfloat16":
        r.append(Reason("dtype", f"grouped_mm on CUDA takes bfloat16 only, not {config.dtype}"))
    # on every device: the CPU fallback checks the strides as the CUDA kernel does
    # (x and h rows, and the transposed weights' leading strides, are H and I elements)
    r.extend(row_alignment(config, config.torch_dtype.itemsize, 16, "torch's grouped_mm"))
    return r


def _check_fp8(config: MoEConfig, platform):
    """fp8_channel through torch._scaled_grouped_mm (facts and sources: module docstring)."""
    r = []
    if _scaled_grouped_mm is None:
        r.append(Reason("torch", f"this torch ({torch.__version__}) has no torch._scaled_grouped_mm "
                                 "(fp8 rowwise grouped GEMM)"))
    if platform.kind != "cuda":
        r.append(Reason("device", "fp8_channel runs through torch._scaled_grouped_mm, which has CUDA kernels "
                                  f"only (none for {platform.kind}); the emulation backend serves it here"))
    elif platform.sm >= 100:
        r.append(Reason("quant_sm", f"fp8_channel needs sm_90 exactly here, {platform.name} is sm_{platform.sm} "
                                    "(sm100 has only torch's MXFP8 grouped variant, e8m0 scales)"))
    elif torch.version.hip:
        r.append(Reason("torch", "this torch is a ROCm build: its _scaled_grouped_mm wants float8_e4m3fnuz "
                                 "operands and an MSLK build; not wired"))
    if config.dtype != "bfloat16":
        r.append(Reason("dtype", f"torch._scaled_grouped_mm writes bfloat16 only (out_dtype); the fp8 path "
                                 f"serves bfloat16 models, not {config.dtype}"))
    if config.hidden_size % 16 or config.intermediate_size % 16:
        r.append(Reason("shape", f"torch._scaled_grouped_mm needs 16-byte fp8 rows: H={config.hidden_size} and "
                                 f"I={config.intermediate_size} must be multiples of 16"))
    return r


def _spec_check(config: MoEConfig, quant, platform):
    if quant.method == QuantMethod.FP8_CHANNEL:
        return _check_fp8(config, platform)
    return _check(config, quant, platform)


def convert_weights(config: MoEConfig, weights: ExpertWeights, platform) -> ExpertWeights:
    """Once at load. fp8_channel: contiguous [E, N, H] / [E, H, I] weights (their transposed
    views are then the column-major operands) and contiguous fp32 [E, out] scales. 16-bit:
    unchanged (grouped_mm takes any strides)."""
    w = weights
    if w.scheme.method != QuantMethod.FP8_CHANNEL:
        return w
    return w.replace(w13=w.w13.contiguous(), w2=w.w2.contiguous(),
                     w13_scale=w.w13_scale.float().contiguous(), w2_scale=w.w2_scale.float().contiguous())


def _make(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    if weights.scheme.method == QuantMethod.FP8_CHANNEL:
        return GroupedMMFp8Experts(config, weights)
    return GroupedMMExperts(config, weights)


_SM90_ONLY = "torch._scaled_grouped_mm's fp8 rowwise kernel is built for sm90 only"


class _GroupedMMSpec(BackendSpec):
    """A BackendSpec whose table refusals ([quant], [quant_sm]) also say why, for this backend."""

    def evaluate(self, config, quant, platform, **kw):
        why = {"quant": _QUANT_WHY.get(quant.method),
               "quant_sm": _SM90_ONLY if quant.method == QuantMethod.FP8_CHANNEL else None}
        return [Reason(r.code, f"{r.text}: {why[r.code]}") if why.get(r.code) else r
                for r in super().evaluate(config, quant, platform, **kw)]


SPEC = register(_GroupedMMSpec(
    name="grouped_mm",
    description="PyTorch grouped GEMM (torch.nn.functional.grouped_mm; CUTLASS on sm90) for 16-bit weights; "
                "fp8_channel through torch._scaled_grouped_mm on CUDA sm90 only",
    make_experts=_make,
    quant_methods=frozenset({QuantMethod.NONE, QuantMethod.FP8_CHANNEL}),
    quant_min_sm={QuantMethod.FP8_CHANNEL: 90},
    min_sm=80,
    check=_spec_check,
    convert_weights=convert_weights,
))
