"""Configuration: frozen dataclasses validated at construction, string enums.

Every config round-trips through ``eval(repr(cfg))`` (with ``from fusedmoe.config import *``),
so a log line is a reproduction recipe.

Legend used across the package:
  T tokens, E experts (global), E_loc local experts, k top-k, H hidden size,
  I intermediate size (per partition), N = 2I for gated activations (I otherwise).
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Optional

import torch

from .errors import ConfigError, ConfigTypeError, check_bool, check_choice, check_float, check_int

__all__ = [
    "Activation", "ScoringFunc", "QuantMethod", "ExpertPlacement", "GateUpLayout",
    "Routing", "QuantScheme", "ParallelConfig", "MoEConfig", "DTYPES",
]


class _StrEnum(str, enum.Enum):
    def __repr__(self) -> str:  # so that eval(repr(cfg)) works with plain strings
        return repr(self.value)

    def __str__(self) -> str:
        return self.value


class Activation(_StrEnum):
    SILU = "silu"              # silu(g) * u  (optional swiglu_limit clamp)
    GELU = "gelu"              # gelu(g) * u  (erf form)
    GELU_TANH = "gelu_tanh"    # gelu(g) * u  (tanh approximation)
    SWIGLUOAI = "swigluoai"    # g, u interleaved; (clamp(u,±L)+1) * min(g,L) * sigmoid(alpha*min(g,L))
    RELU2_NO_MUL = "relu2_no_mul"  # relu(x)^2, not gated
    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"

    @property
    def is_gated(self) -> bool:
        return not self.value.endswith("_no_mul")


class ScoringFunc(_StrEnum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class QuantMethod(_StrEnum):
    NONE = "none"                  # 16/32-bit weights and activations
    FP8_TENSOR = "fp8_tensor"      # fp8 weights, per-expert scale; activations per-tensor (dynamic or static)
    FP8_CHANNEL = "fp8_channel"    # fp8 weights per output channel; activations dynamic per token
    FP8_BLOCK = "fp8_block"        # fp8 weights in 128x128 blocks; activations dynamic 1x128 groups
    INT8_CHANNEL = "int8_channel"  # int8 W8A8: weights per channel, activations dynamic per token
    INT8_W8A16 = "int8_w8a16"      # int8 weights (channel or group scales), 16-bit activations
    INT4_W4A16 = "int4_w4a16"      # int4 weights, group scales, optional zero points (GPTQ/AWQ)
    FP8_W8A16 = "fp8_w8a16"        # fp8 weights per channel, 16-bit activations
    NVFP4 = "nvfp4"                # e2m1 + e4m3 scale per 16 + fp32 global; W4A4
    MXFP4 = "mxfp4"                # e2m1 + e8m0 scale per 32; W4A16 (gpt-oss)

    @property
    def quantizes_activations(self) -> bool:
        return self in (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_BLOCK,
                        QuantMethod.INT8_CHANNEL, QuantMethod.NVFP4)

    @property
    def weight_bits(self) -> int:
        return {QuantMethod.NONE: 16, QuantMethod.INT4_W4A16: 4, QuantMethod.NVFP4: 4,
                QuantMethod.MXFP4: 4}.get(self, 8)


class ExpertPlacement(_StrEnum):
    LINEAR = "linear"            # rank r owns experts [r*E_loc, (r+1)*E_loc)
    ROUND_ROBIN = "round_robin"  # rank r owns experts r, r+ep, r+2ep, ...


class GateUpLayout(_StrEnum):
    HALVES = "halves"            # w13 rows [0, I) are gate, [I, 2I) are up
    INTERLEAVED = "interleaved"  # w13 rows 0,2,4.. gate, 1,3,5.. up (gpt-oss / swigluoai)


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def dtype_name(dtype) -> str:
    """'bfloat16' for torch.bfloat16 or 'bfloat16' or 'bf16'."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    if isinstance(dtype, torch.dtype):
        for k, v in DTYPES.items():
            if v == dtype:
                return k
    elif isinstance(dtype, str):
        d = aliases.get(dtype, dtype)
        if d in DTYPES:
            return d
    raise ConfigError("dtype", dtype, list(DTYPES), "use torch.bfloat16, torch.float16 or torch.float32")


def _frozen_set(obj, name, value):
    object.__setattr__(obj, name, value)


def _replace(obj, changes: dict):
    """dataclasses.replace with an unknown field name as a ConfigError (not a raw TypeError)."""
    names = [f.name for f in dataclasses.fields(obj) if f.init]
    for k in changes:
        if k not in names:
            raise ConfigError(k, changes[k], names, f"{type(obj).__name__}.replace takes its field names",
                              problem=f"is not a field of {type(obj).__name__}")
    return dataclasses.replace(obj, **changes)


@dataclass(frozen=True)
class Routing:
    """How router logits [T, E] become (topk_weights fp32 [T, k], topk_ids int32 [T, k]).

    DeepSeek-V3 rules: the correction bias (a tensor held by the layer, declared here by
    ``has_correction_bias``) affects selection only; weights come from unbiased scores,
    are renormalized if asked, then multiplied by ``routed_scaling_factor``.
    ``custom`` names a function registered with ``fusedmoe.reference.routing.register_routing_fn``.
    """

    scoring: ScoringFunc = ScoringFunc.SOFTMAX
    renormalize: bool = True
    num_groups: Optional[int] = None      # grouped top-k: number of expert groups (n_group)
    topk_groups: Optional[int] = None     # grouped top-k: groups kept per token (topk_group)
    has_correction_bias: bool = False
    routed_scaling_factor: float = 1.0
    apply_router_weight_on_input: bool = False
    custom: Optional[str] = None

    def __post_init__(self):
        _frozen_set(self, "scoring", check_choice("scoring", self.scoring, ScoringFunc))
        for name in ("renormalize", "has_correction_bias", "apply_router_weight_on_input"):
            check_bool(name, getattr(self, name))
        if (self.num_groups is None) != (self.topk_groups is None):
            raise ConfigError("topk_groups" if self.num_groups else "num_groups",
                              self.topk_groups if self.num_groups else self.num_groups,
                              "both num_groups and topk_groups, or neither",
                              "grouped top-k needs both num_groups (n_group) and topk_groups (topk_group)")
        if self.num_groups is not None:
            check_int("num_groups", self.num_groups, min_value=1)
            check_int("topk_groups", self.topk_groups, min_value=1)
            if self.topk_groups > self.num_groups:
                raise ConfigError("topk_groups", self.topk_groups, f"1..num_groups={self.num_groups}",
                                  "keep at most num_groups groups", problem="is larger than num_groups")
        _frozen_set(self, "routed_scaling_factor",
                    check_float("routed_scaling_factor", self.routed_scaling_factor, hint="use 1.0 for no scaling"))
        if self.custom is not None and not isinstance(self.custom, str):
            raise ConfigTypeError("custom", self.custom, "str (a name registered with register_routing_fn)")

    @property
    def is_grouped(self) -> bool:
        return self.num_groups is not None

    @property
    def method(self) -> str:
        """A short name for capability tables: 'custom', 'grouped_topk', 'topk_bias', 'topk'."""
        if self.custom:
            return "custom"
        if self.is_grouped:
            return "grouped_topk"
        if self.has_correction_bias:
            return "topk_bias"
        return "topk"


_DEFAULT_GROUP = {QuantMethod.INT4_W4A16: 128, QuantMethod.NVFP4: 16, QuantMethod.MXFP4: 32}
_FIXED_GROUP = {QuantMethod.NVFP4: 16, QuantMethod.MXFP4: 32}


@dataclass(frozen=True)
class QuantScheme:
    """A weight (and activation) format.

    - ``group_size``: K-group of the weight scales. int4_w4a16: 32/64/128 (default 128);
      int8_w8a16: None = per output channel, or 32/64/128; nvfp4: 16; mxfp4: 32 (fixed).
    - ``block_shape``: fp8_block weight blocks (bn, bk), default (128, 128); activations
      then use dynamic 1 x bk groups.
    - ``has_zero_point``: int4/int8 weight-only with asymmetric zero points (AWQ / GPTQ asym).
    - ``static_activation_scale``: fp8_tensor with a calibrated per-tensor input scale
      (checkpoint ``input_scale``) instead of a dynamic one.
    - ``scale_pow2``: fp8_block activation scales rounded up to powers of two (UE8M0 style).
    """

    method: QuantMethod = QuantMethod.NONE
    group_size: Optional[int] = None
    block_shape: Optional[tuple] = None
    has_zero_point: bool = False
    static_activation_scale: bool = False
    scale_pow2: bool = False

    def __post_init__(self):
        m = check_choice("method", self.method, QuantMethod,
                         "use one of the scheme names, e.g. QuantScheme('fp8_block')")
        _frozen_set(self, "method", m)
        for name in ("has_zero_point", "static_activation_scale", "scale_pow2"):
            check_bool(name, getattr(self, name))
        gs = self.group_size
        if gs is not None and (isinstance(gs, bool) or not isinstance(gs, int)):
            raise ConfigTypeError("group_size", gs, "int or None", "e.g. group_size=128")
        if m in _FIXED_GROUP:
            if gs is not None and gs != _FIXED_GROUP[m]:
                raise ConfigError("group_size", gs, [_FIXED_GROUP[m]], f"{m.value} has a fixed group size; omit group_size")
            _frozen_set(self, "group_size", _FIXED_GROUP[m])
        elif m == QuantMethod.INT4_W4A16:
            gs = 128 if gs is None else gs
            if gs not in (32, 64, 128):
                raise ConfigError("group_size", gs, [32, 64, 128], "GPTQ/AWQ checkpoints use 32, 64 or 128")
            _frozen_set(self, "group_size", gs)
        elif m == QuantMethod.INT8_W8A16:
            if gs is not None and gs not in (32, 64, 128):
                raise ConfigError("group_size", gs, [None, 32, 64, 128], "None means per output channel")
        elif gs is not None:
            raise ConfigError("group_size", gs, [None], f"{m.value} takes no group_size")
        if m == QuantMethod.FP8_BLOCK:
            if self.block_shape is not None and not isinstance(self.block_shape, (tuple, list)):
                raise ConfigError("block_shape", self.block_shape, "a pair of positive ints (bn, bk)", "use (128, 128)")
            bs = tuple(self.block_shape) if self.block_shape is not None else (128, 128)
            if len(bs) != 2 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bs):
                raise ConfigError("block_shape", self.block_shape, "a pair of positive ints (bn, bk)", "use (128, 128)")
            _frozen_set(self, "block_shape", bs)
        elif self.block_shape is not None:
            raise ConfigError("block_shape", self.block_shape, [None], "only fp8_block takes block_shape")
        if self.has_zero_point and m not in (QuantMethod.INT4_W4A16, QuantMethod.INT8_W8A16):
            raise ConfigError("has_zero_point", True, [False], "zero points exist only for int4_w4a16 / int8_w8a16")
        if self.has_zero_point and m == QuantMethod.INT8_W8A16 and self.group_size is None:
            raise ConfigError("has_zero_point", True, "int8_w8a16 zero points need group_size", "set group_size=128")
        if self.static_activation_scale and m != QuantMethod.FP8_TENSOR:
            raise ConfigError("static_activation_scale", True, [False], "only fp8_tensor has a static activation scale")
        if self.scale_pow2 and m != QuantMethod.FP8_BLOCK:
            raise ConfigError("scale_pow2", True, [False], "only fp8_block has power-of-two activation scales")

    @classmethod
    def parse(cls, spec) -> "QuantScheme":
        """'fp8_block', 'int4_w4a16:g64', 'int4_w4a16:g128:zp', QuantScheme or None -> QuantScheme.

        Case-insensitive ('FP8_BLOCK'); each option at most once."""
        if spec is None:
            return cls()
        if isinstance(spec, QuantScheme):
            return spec
        if not isinstance(spec, str):
            raise ConfigTypeError("quant", spec, "str (e.g. 'fp8_block', 'int4_w4a16:g64:zp') or QuantScheme")
        grammar = "NAME[:gN][:zp][:static][:pow2][:bNxK], each option at most once"
        parts = spec.strip().lower().split(":")
        kw: dict = {}
        for p in parts[1:]:
            if p[:1] == "g" and p[1:].isdigit():
                key, val = "group_size", int(p[1:])
            elif p in ("zp", "static", "pow2"):
                key, val = {"zp": "has_zero_point", "static": "static_activation_scale", "pow2": "scale_pow2"}[p], True
            elif p[:1] == "b" and p[1:].count("x") == 1 and all(d.isdigit() for d in p[1:].split("x")):
                key, val = "block_shape", tuple(int(d) for d in p[1:].split("x"))
            else:
                raise ConfigError("quant", spec, grammar, f"option {p!r} is not one of gN, zp, static, pow2, bNxK; "
                                  "e.g. 'int4_w4a16:g64:zp' or 'fp8_block:b128x128'")
            if key in kw:
                raise ConfigError("quant", spec, grammar, f"give {key} once (the option {p!r} repeats it)",
                                  problem="repeats an option")
            kw[key] = val
        if parts[0] not in {m.value for m in QuantMethod}:
            raise ConfigError("quant", spec, [m.value for m in QuantMethod], "e.g. --quant fp8_block")
        return cls(parts[0], **kw)

    @property
    def k_multiple(self) -> int:
        """What both GEMMs' K (hidden_size for w13, intermediate_size for w2) must be a multiple
        of: the weight scales' K-group, else 2 for two 4-bit values a byte, else 1."""
        if self.group_size:
            return self.group_size
        return 2 if self.method.weight_bits == 4 else 1

    @property
    def name(self) -> str:
        """Short string (inverse of ``parse``)."""
        s = self.method.value
        if self.method in (QuantMethod.INT4_W4A16,) or (self.method == QuantMethod.INT8_W8A16 and self.group_size):
            s += f":g{self.group_size}"
        if self.method == QuantMethod.FP8_BLOCK and self.block_shape != (128, 128):
            s += f":b{self.block_shape[0]}x{self.block_shape[1]}"
        if self.has_zero_point:
            s += ":zp"
        if self.static_activation_scale:
            s += ":static"
        if self.scale_pow2:
            s += ":pow2"
        return s

    def __repr__(self) -> str:
        fields = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "method":
                continue
            if v != f.default and not (f.name == "group_size" and self.method in _DEFAULT_GROUP
                                       and v == _DEFAULT_GROUP[self.method]) \
                    and not (f.name == "block_shape" and v == (128, 128)):
                fields.append(f"{f.name}={v!r}")
        return f"QuantScheme({self.method.value!r}{''.join(', ' + x for x in fields)})"


@dataclass(frozen=True)
class ParallelConfig:
    """Expert parallelism over ``ep_size`` ranks (1 = one device owns every expert)."""

    ep_size: int = 1
    ep_rank: int = 0
    placement: ExpertPlacement = ExpertPlacement.LINEAR
    dp_size: int = 1

    def __post_init__(self):
        check_int("ep_size", self.ep_size, min_value=1)
        check_int("dp_size", self.dp_size, min_value=1)
        check_int("ep_rank", self.ep_rank, min_value=0)
        if self.ep_rank >= self.ep_size:
            raise ConfigError("ep_rank", self.ep_rank, f"0..{self.ep_size - 1}", "ep_rank must be < ep_size")
        _frozen_set(self, "placement", check_choice("placement", self.placement, ExpertPlacement))

    @property
    def use_ep(self) -> bool:
        return self.ep_size > 1

    def local_experts(self, num_experts: int) -> list[int]:
        """Global ids of the experts this rank owns, in local order."""
        if num_experts % self.ep_size:
            raise ConfigError("num_experts", num_experts, f"a multiple of ep_size={self.ep_size}",
                              "choose an ep_size that divides the number of experts")
        n = num_experts // self.ep_size
        if self.placement == ExpertPlacement.LINEAR:
            return list(range(self.ep_rank * n, (self.ep_rank + 1) * n))
        return list(range(self.ep_rank, num_experts, self.ep_size))

    def expert_map(self, num_experts: int, device=None) -> Optional[torch.Tensor]:
        """int32 [E]: global id -> local id, -1 where not local. None when ep_size == 1."""
        if not self.use_ep:
            return None
        m = torch.full((num_experts,), -1, dtype=torch.int32)
        loc = self.local_experts(num_experts)
        m[torch.tensor(loc, dtype=torch.long)] = torch.arange(len(loc), dtype=torch.int32)
        return m.to(device) if device is not None else m


@dataclass(frozen=True)
class MoEConfig:
    """The shape and math of one MoE layer.

    w13 [E_loc, N, H] with N = 2I (gated) or I; w2 [E_loc, H, I]. ``dtype`` is the
    activation / output dtype (and the weight dtype for the 'none' scheme).
    """

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    activation: Activation = Activation.SILU
    dtype: str = "bfloat16"
    has_bias: bool = False
    swiglu_limit: Optional[float] = None       # silu only: silu(min(g,L)) * clamp(u,-L,L)
    swigluoai_alpha: float = 1.702
    swigluoai_limit: float = 7.0
    gate_up_layout: Optional[GateUpLayout] = None  # default: interleaved for swigluoai, halves otherwise
    routing: Routing = field(default_factory=Routing)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        check_int("num_experts", self.num_experts, min_value=1)
        check_int("top_k", self.top_k, min_value=1)
        check_int("hidden_size", self.hidden_size, min_value=1)
        check_int("intermediate_size", self.intermediate_size, min_value=1)
        if self.top_k > self.num_experts:
            raise ConfigError("top_k", self.top_k, f"1..num_experts={self.num_experts}",
                              "top_k cannot exceed the number of experts", problem="is larger than num_experts")
        act = check_choice("activation", self.activation, Activation)
        _frozen_set(self, "activation", act)
        _frozen_set(self, "dtype", dtype_name(self.dtype))
        check_bool("has_bias", self.has_bias)
        if self.swiglu_limit is not None:
            if act != Activation.SILU:
                raise ConfigError("swiglu_limit", self.swiglu_limit, [None],
                                  f"swiglu_limit clamps silu only (activation={act.value}); for swigluoai use swigluoai_limit")
            _frozen_set(self, "swiglu_limit", check_float("swiglu_limit", self.swiglu_limit,
                                                          hint="e.g. 7.0, or None for no clamp"))
        for name in ("swigluoai_alpha", "swigluoai_limit"):
            _frozen_set(self, name, check_float(name, getattr(self, name),
                                                hint="use the defaults 1.702 / 7.0 for gpt-oss"))
        default_layout = GateUpLayout.INTERLEAVED if act == Activation.SWIGLUOAI else GateUpLayout.HALVES
        layout = default_layout if self.gate_up_layout is None else check_choice("gate_up_layout", self.gate_up_layout, GateUpLayout)
        if act == Activation.SWIGLUOAI and layout != GateUpLayout.INTERLEAVED:
            raise ConfigError("gate_up_layout", layout.value, ["interleaved"],
                              "swigluoai weights interleave gate and up rows; de-interleave into halves and use activation='silu'-style layout, or pass gate_up_layout='interleaved'")
        if act != Activation.SWIGLUOAI and layout != GateUpLayout.HALVES:
            raise ConfigError("gate_up_layout", layout.value, ["halves"],
                              f"only swigluoai uses interleaved gate/up rows; reorder w13 to [gate; up] for {act.value}")
        _frozen_set(self, "gate_up_layout", layout)
        if not isinstance(self.routing, Routing):
            raise ConfigTypeError("routing", self.routing, "fusedmoe.Routing")
        if not isinstance(self.parallel, ParallelConfig):
            raise ConfigTypeError("parallel", self.parallel, "fusedmoe.ParallelConfig")
        r = self.routing
        if r.apply_router_weight_on_input and self.top_k != 1:
            raise ConfigError("apply_router_weight_on_input", True, "only with top_k == 1",
                              f"top_k={self.top_k}: set apply_router_weight_on_input=False (Llama-4 uses top_k=1)")
        if r.is_grouped:
            if self.num_experts % r.num_groups:
                raise ConfigError("num_groups", r.num_groups, f"a divisor of num_experts={self.num_experts}",
                                  "experts are split into equal groups")
            if self.top_k > r.topk_groups * (self.num_experts // r.num_groups):
                raise ConfigError("top_k", self.top_k, "<= topk_groups * experts per group",
                                  "keep more groups (topk_groups)")
        self.parallel.local_experts(self.num_experts)  # validates divisibility

    # -- derived ---------------------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def is_gated(self) -> bool:
        return self.activation.is_gated

    @property
    def n13(self) -> int:
        """Rows of w13: 2I for gated activations, I otherwise."""
        return 2 * self.intermediate_size if self.is_gated else self.intermediate_size

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.parallel.ep_size

    def expert_map(self, device=None) -> Optional[torch.Tensor]:
        return self.parallel.expert_map(self.num_experts, device)

    def replace(self, **changes) -> "MoEConfig":
        return _replace(self, changes)

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("num_experts", "top_k", "hidden_size", "intermediate_size"):
                parts.append(f"{f.name}={v!r}")
                continue
            if f.name == "gate_up_layout":
                default = GateUpLayout.INTERLEAVED if self.activation == Activation.SWIGLUOAI else GateUpLayout.HALVES
                if v == default:
                    continue
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                if v == f.default_factory():
                    continue
            elif v == f.default:
                continue
            parts.append(f"{f.name}={v!r}")
        return f"MoEConfig({', '.join(parts)})"
