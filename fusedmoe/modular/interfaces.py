"""The modular-kernel contracts: PrepareFinalize, Experts, WeightAndReduce, stage results.

Pipeline (data flows top to bottom):

    [routing]  logits -> (topk_weights fp32 [T,k], topk_ids int32 [T,k])   (outside, or monolithic)
    [prepare]  quantize activations + dispatch tokens          PrepareFinalize.prepare
    [experts]  permute, GEMM1, act, GEMM2, unpermute            Experts.apply
    [finalize] apply weights + reduce over k, combine           PrepareFinalize.finalize(WeightAndReduce)

Legend: T tokens, E global experts, E_loc local experts, k top-k, H hidden, I intermediate,
T_max the per-expert capacity of the batched format.

Activation formats:
  STANDARD  a1 [T, H]; experts see every token with its topk ids.
  BATCHED   a1 [E_loc, T_max, H] plus per-expert counts int32 [E_loc] (expert-major; the
            format of low-latency all-to-all and CUDA-graph-captured decode).
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import MoEConfig
from ..weights import ExpertWeights

__all__ = [
    "ActivationFormat", "ExpertTokensMetadata", "PrepareResult", "BatchedSlots", "WorkspaceSpec",
    "WeightAndReduce", "NoOpWeightAndReduce", "ContiguousWeightAndReduce", "BatchedWeightAndReduce",
    "DelegateWeightAndReduce", "PrepareFinalize", "MonolithicPrepareFinalize", "Experts",
    "MonolithicExperts",
]


class ActivationFormat(str, enum.Enum):
    STANDARD = "standard"
    BATCHED = "batched"

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return self.value


@dataclass
class ExpertTokensMetadata:
    """Tokens per local expert: int32 [E_loc] on the device (never copied to the host in forward)."""

    expert_num_tokens: torch.Tensor


@dataclass
class BatchedSlots:
    """Where each row of the batched buffer came from: slot index t*k+j, or -1 for padding.

    slot_of_row int32 [E_loc, T_max]. Finalize uses it to weight and scatter-add rows back.
    """

    slot_of_row: torch.Tensor


@dataclass
class PrepareResult:
    """What prepare hands the experts. ``a1q`` is [T, H] (standard) or [E_loc, T_max, H] (batched),
    quantized when the experts asked for quantized input (then ``a1q_scale`` is set)."""

    a1q: torch.Tensor
    a1q_scale: Optional[torch.Tensor]
    topk_ids: torch.Tensor                   # int32 [T, k] (global ids)
    topk_weights: torch.Tensor               # fp32 [T, k]
    expert_tokens_meta: Optional[ExpertTokensMetadata] = None
    batched_slots: Optional[BatchedSlots] = None


@dataclass(frozen=True)
class WorkspaceSpec:
    """Every buffer an Experts.apply uses, by name: (shape, dtype). The framework allocates
    exactly these (once per shape) and the experts allocate nothing else per call.
    ``"out"`` is the experts' output: [T, H] (already weighted and reduced), [T, k, H]
    (finalize reduces) or [E_loc, T_max, H] (batched)."""

    buffers: dict

    def nbytes(self) -> int:
        total = 0
        for shape, dtype in self.buffers.values():
            n = 1
            for d in shape:
                n *= d
            total += n * torch.empty((), dtype=dtype).element_size()
        return total


# --------------------------------------------------------------------------- weight + reduce
class WeightAndReduce(ABC):
    """How finalize turns the experts' output into [T, H]."""

    @abstractmethod
    def apply(self, output: torch.Tensor, fused_out: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, apply_router_weight_on_input: bool,
              batched_slots: Optional[BatchedSlots] = None) -> torch.Tensor:
        """Write the result into ``output`` [T, H] and return it."""

    def __repr__(self) -> str:
        return type(self).__name__


class NoOpWeightAndReduce(WeightAndReduce):
    """The experts already weighted and summed: fused_out is [T, H]."""

    def apply(self, output, fused_out, topk_weights, topk_ids, apply_router_weight_on_input, batched_slots=None):
        if fused_out.data_ptr() != output.data_ptr():
            output.copy_(fused_out)
        return output


class ContiguousWeightAndReduce(WeightAndReduce):
    """fused_out [T, k, H] unweighted -> multiply by topk_weights (unless applied on input), sum over k."""

    def apply(self, output, fused_out, topk_weights, topk_ids, apply_router_weight_on_input, batched_slots=None):
        T, k, H = fused_out.shape
        acc = fused_out.float()                                              # [T, k, H]
        if not apply_router_weight_on_input:
            acc = acc * topk_weights.view(T, k, 1)
        output.copy_(acc.sum(dim=1))
        return output


class BatchedWeightAndReduce(WeightAndReduce):
    """fused_out [E_loc, T_max, H] unweighted -> weight each row by its slot's weight and
    sum each token's slots into [T, H] (rows of padding carry slot -1 and are dropped).

    Deterministic: rows are first placed at their slot (each slot appears once) in a
    [T*k, H] buffer, then summed over k in a fixed order; no atomics."""

    def apply(self, output, fused_out, topk_weights, topk_ids, apply_router_weight_on_input, batched_slots=None):
        assert batched_slots is not None, "batched finalize needs the slot map from prepare"
        T, k = topk_ids.shape
        H = fused_out.shape[-1]
        slots = batched_slots.slot_of_row.reshape(-1).long()               # [E_loc*T_max]
        rows = fused_out.reshape(-1, H).float()                            # [E_loc*T_max, H]
        valid = slots >= 0
        dest = torch.where(valid, slots, torch.full_like(slots, T * k))    # padding -> trash row
        w = topk_weights.reshape(-1).float()[dest.clamp(max=T * k - 1)]    # [E_loc*T_max]
        if apply_router_weight_on_input:
            w = torch.ones_like(w)
        # padding rows may hold garbage (even NaN): select, don't multiply by zero.
        contrib = torch.where(valid.unsqueeze(1), rows * w.unsqueeze(1), torch.zeros_like(rows))
        per_slot = torch.zeros(T * k + 1, H, dtype=torch.float32, device=fused_out.device)
        per_slot.index_copy_(0, dest, contrib)                             # slots never collide
        output.copy_(per_slot[:-1].view(T, k, H).sum(dim=1))
        return output


class DelegateWeightAndReduce(WeightAndReduce):
    """Let the PrepareFinalize choose (standard -> Contiguous, batched -> Batched)."""

    def apply(self, *a, **kw):  # pragma: no cover - resolved before use
        raise AssertionError("DelegateWeightAndReduce must be resolved by the PrepareFinalize")


# --------------------------------------------------------------------------- prepare/finalize
class PrepareFinalize(ABC):
    """Owns communication and activation quantization (modular form: takes topk ids)."""

    is_monolithic = False
    activation_format: ActivationFormat = ActivationFormat.STANDARD

    @property
    def supports_async(self) -> bool:
        """True when finalize can overlap shared experts with its communication."""
        return False

    @property
    def direct_ok(self) -> bool:
        """True when prepare and finalize do nothing beyond scaling x by the router weight
        (apply_router_weight_on_input), quantizing it for the experts (``Experts.input_quant``)
        and applying the experts' WeightAndReduce: no communication, no format change. Then,
        where none of those applies, ModularKernel may let the experts serve a call whole
        (``Experts.direct``) and skip prepare, workspace and finalize."""
        return False

    @abstractmethod
    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                config: MoEConfig, experts: "Experts", expert_map: Optional[torch.Tensor]) -> PrepareResult:
        ...

    @abstractmethod
    def finalize(self, output: torch.Tensor, fused_out: torch.Tensor, prep: PrepareResult,
                 weight_and_reduce: WeightAndReduce, apply_router_weight_on_input: bool) -> torch.Tensor:
        ...

    def resolve(self, wr: WeightAndReduce) -> WeightAndReduce:
        if isinstance(wr, DelegateWeightAndReduce):
            return BatchedWeightAndReduce() if self.activation_format == ActivationFormat.BATCHED \
                else ContiguousWeightAndReduce()
        return wr

    def __repr__(self) -> str:
        return f"{type(self).__name__}(format={self.activation_format.value})"


class MonolithicPrepareFinalize(PrepareFinalize):
    """Monolithic form: takes router logits; routing is fused into the experts."""

    is_monolithic = True


# --------------------------------------------------------------------------- experts
class Experts(ABC):
    """The expert math of one weight format on one kernel family (modular form).

    Subclasses declare ``activation_format``, whether they want their input quantized by
    prepare (``input_quant``, then they supply the quantizer: ``quantize_input``), their
    workspace and how finalize must weight and reduce.
    """

    is_monolithic = False
    activation_format: ActivationFormat = ActivationFormat.STANDARD
    input_quant: bool = False        # True: prepare quantizes a1 with quantize_input (a1q_scale set)

    def __init__(self, config: MoEConfig, weights: ExpertWeights, *, max_num_tokens: Optional[int] = None):
        if self.activation_format == ActivationFormat.BATCHED and max_num_tokens is None:
            from ..errors import ConfigError
            raise ConfigError("max_num_tokens", None, "a positive int for batched-format experts",
                              "pass max_num_tokens (the per-expert capacity T_max)")
        self.config = config
        self.weights = weights
        self.max_num_tokens = max_num_tokens

    @abstractmethod
    def workspace(self, M: int, topk: int) -> WorkspaceSpec:
        """Buffers for M tokens (standard: M = T of this chunk; batched: M = T_max)."""

    @abstractmethod
    def weight_and_reduce(self) -> WeightAndReduce:
        ...

    @abstractmethod
    def apply(self, prep: PrepareResult, ws: dict, expert_map: Optional[torch.Tensor]) -> torch.Tensor:
        """Compute into ``ws['out']`` and return it."""

    def quantize_input(self, a1: torch.Tensor, counts: Optional[torch.Tensor] = None):
        """a1 -> (a1q, a1q_scale), GEMM1's input as these experts read it; prepare calls it when
        ``input_quant`` (after any router-weight scaling). a1 [T, H], or batched
        [E_loc, T_max, H] with ``counts`` int32 [E_loc] (rows past a count are padding). The
        experts own the quantizer, so prepare/finalize need no quantization kernel."""
        raise NotImplementedError(f"{type(self).__name__} sets input_quant but defines no quantize_input")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(format={self.activation_format.value})"


class MonolithicExperts(Experts):
    """Experts that route internally: apply(a1, router_logits) -> [T, H]."""

    is_monolithic = True
