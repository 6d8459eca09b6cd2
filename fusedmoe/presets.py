"""Model presets: the MoE layer shapes and routing of well-known checkpoints, and a reader
of Hugging Face ``config.json`` files.

Legend: E routed experts, k experts per token, H hidden size, I intermediate size of one
routed expert (before tensor parallelism).

    get_preset("deepseek-v3").to_config(tp=8)          # MoEConfig, I = 2048 / 8
    get_preset("/models/Qwen3-30B-A3B")                # folder holding a config.json
    get_preset("path/to/config.json")

The reader knows these ``model_type`` values: mixtral, qwen2_moe, qwen3_moe, deepseek_v2,
deepseek_v3 (and kimi_k2, its architecture), gpt_oss, olmoe, llama4 / llama4_text. It reads
the keys that define the layer; keys that only have a Hugging Face default (norm_topk_prob,
n_group, ...) take that default. A missing required key raises a ConfigError naming the key
and the file. ``quantization_config`` becomes the native scheme name:

| quant_method                        | scheme                                     |
|-------------------------------------|--------------------------------------------|
| fp8 + weight_block_size             | fp8_block (DeepSeek-V3)                    |
| fp8 without blocks                  | fp8_tensor (per-tensor scales; `:static` if activation_scheme=static) |
| fbgemm_fp8                          | fp8_channel (per-channel weights, dynamic per-token activations) |
| compressed-tensors, one config group: 8-bit float weights per channel + dynamic per-token activations | fp8_channel |
|   ... per tensor + per-tensor activations (dynamic / static)      | fp8_tensor / fp8_tensor:static |
|   ... 128x128 blocks + dynamic 1x128 activation groups            | fp8_block                  |
|   ... 8-bit int weights per channel + dynamic per-token int activations | int8_channel          |
|   ... 8-bit weights per channel, no activation quantization       | fp8_w8a16 / int8_w8a16     |
|   ... 4-bit int weights in groups of 32/64/128, no activations    | int4_w4a16:gN[:zp]         |
| mxfp4                               | mxfp4 (gpt-oss)                            |
| modelopt NVFP4 / FP8                | nvfp4 / fp8_tensor                         |
| gptq / awq (4-bit, group 32/64/128) | int4_w4a16:gN[:zp]                         |
| anything else                       | none, with a note saying so                |
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from .config import Activation, MoEConfig, QuantScheme, Routing
from .errors import ConfigError, ConfigTypeError, check_choice, check_int

__all__ = ["ModelPreset", "PRESETS", "get_preset", "load_hf_config", "preset_from_hf_dict", "HF_MODEL_TYPES"]

log = logging.getLogger("fusedmoe")


@dataclass(frozen=True)
class ModelPreset:
    """One model's routed-expert layer (shared experts are counted, not modelled).

    ``quant`` is the checkpoint's native scheme (a ``QuantScheme.parse`` string, e.g.
    'fp8_block', 'mxfp4', 'none'). ``swiglu_limit`` is the activation clamp: for swigluoai it
    becomes ``MoEConfig.swigluoai_limit``, for silu ``MoEConfig.swiglu_limit``.
    ``quant_note``: why ``quant`` differs from what the checkpoint holds (a config.json whose
    quantization_config has no fusedmoe scheme); empty otherwise. The CLI prints it.
    """

    name: str
    hf_name: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    activation: Activation = Activation.SILU
    routing: Routing = field(default_factory=Routing)
    quant: str = "none"
    has_bias: bool = False
    num_shared_experts: int = 0
    notes: str = ""
    swiglu_limit: Optional[float] = None
    quant_note: str = ""

    def __post_init__(self):
        for name in ("num_experts", "top_k", "hidden_size", "intermediate_size"):
            check_int(name, getattr(self, name), min_value=1)
        check_int("num_shared_experts", self.num_shared_experts, min_value=0)
        object.__setattr__(self, "activation", check_choice("activation", self.activation, Activation))
        if not isinstance(self.routing, Routing):
            raise ConfigTypeError("routing", self.routing, "fusedmoe.Routing")
        object.__setattr__(self, "quant", QuantScheme.parse(self.quant).name)  # validates, normalizes
        self.to_config()  # every preset must make a valid MoEConfig

    @property
    def quant_scheme(self) -> QuantScheme:
        return QuantScheme.parse(self.quant)

    def fitting_tps(self, quant=None, candidates=(1, 2, 4, 8, 16, 32, 64)) -> list[int]:
        """The tensor-parallel sizes (of ``candidates``) whose shard ``quant`` (default: the
        native scheme) can hold: tp divides intermediate_size, and the scheme's K-group (4-bit
        packing) divides hidden_size and intermediate_size / tp. gpt-oss's I = 2880 at tp 4 is
        720, not a multiple of mxfp4's 32: [1, 2]."""
        m = QuantScheme.parse(self.quant if quant is None else quant).k_multiple
        if self.hidden_size % m:
            return []
        I = self.intermediate_size
        return [tp for tp in candidates if I % tp == 0 and (I // tp) % m == 0]

    def to_config(self, tp: int = 1, dtype="bfloat16", **overrides) -> MoEConfig:
        """The MoEConfig of one tensor-parallel shard: intermediate_size / tp.

        ``overrides`` replace MoEConfig fields (e.g. ``parallel=ParallelConfig(ep_size=8)``).
        """
        check_int("tp", tp, min_value=1)
        if self.intermediate_size % tp:
            ok = [d for d in (1, 2, 4, 8, 16, 32, 64) if self.intermediate_size % d == 0]
            raise ConfigError("tp", tp, ok, f"tp must divide intermediate_size={self.intermediate_size} "
                              f"of {self.name}", problem="does not divide the intermediate size")
        kw: dict[str, Any] = {}
        if self.swiglu_limit is not None:
            kw["swigluoai_limit" if self.activation == Activation.SWIGLUOAI else "swiglu_limit"] = self.swiglu_limit
        kw.update(overrides)
        return MoEConfig(num_experts=self.num_experts, top_k=self.top_k, hidden_size=self.hidden_size,
                         intermediate_size=self.intermediate_size // tp, activation=self.activation, dtype=dtype,
                         has_bias=self.has_bias, routing=self.routing, **kw)


_SOFTMAX_RENORM = Routing(scoring="softmax", renormalize=True)

PRESETS: dict[str, ModelPreset] = {p.name: p for p in [
    ModelPreset("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 8, 2, 4096, 14336, "silu", _SOFTMAX_RENORM,
                notes="softmax over 8 experts, top-2, renormalized"),
    ModelPreset("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 128, 8, 2048, 768, "silu", _SOFTMAX_RENORM,
                notes="softmax, top-8, norm_topk_prob=true; no shared experts"),
    ModelPreset("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", 128, 8, 4096, 1536, "silu", _SOFTMAX_RENORM,
                notes="softmax, top-8, norm_topk_prob=true; no shared experts"),
    ModelPreset("deepseek-v3", "deepseek-ai/DeepSeek-V3", 256, 8, 7168, 2048, "silu",
                Routing(scoring="sigmoid", renormalize=True, num_groups=8, topk_groups=4, has_correction_bias=True,
                        routed_scaling_factor=2.5),
                quant="fp8_block", num_shared_experts=1,
                notes="sigmoid + e_score_correction_bias (noaux_tc), 8 groups keep 4 by top-2 sum, x2.5; "
                      "1 shared expert (I=2048); first 3 layers dense; fp8 128x128 block checkpoint"),
    ModelPreset("gpt-oss-20b", "openai/gpt-oss-20b", 32, 4, 2880, 2880, "swigluoai", _SOFTMAX_RENORM,
                quant="mxfp4", has_bias=True, swiglu_limit=7.0,
                notes="router: top-4 of the logits, softmax over those 4 (= softmax + renormalize); "
                      "expert biases; interleaved gate/up, alpha 1.702, limit 7; mxfp4 checkpoint"),
    ModelPreset("gpt-oss-120b", "openai/gpt-oss-120b", 128, 4, 2880, 2880, "swigluoai", _SOFTMAX_RENORM,
                quant="mxfp4", has_bias=True, swiglu_limit=7.0,
                notes="as gpt-oss-20b with 128 experts"),
    ModelPreset("olmoe-1b-7b", "allenai/OLMoE-1B-7B-0924", 64, 8, 2048, 1024, "silu",
                Routing(scoring="softmax", renormalize=False),
                notes="softmax, top-8, not renormalized (norm_topk_prob=false)"),
    ModelPreset("llama-4-scout", "meta-llama/Llama-4-Scout-17B-16E", 16, 1, 5120, 8192, "silu",
                Routing(scoring="sigmoid", renormalize=False, apply_router_weight_on_input=True),
                num_shared_experts=1,
                notes="top-1, sigmoid of the chosen logit, applied to the input; 1 shared expert (I=8192)"),
]}


# --------------------------------------------------------------------------------------------
# Hugging Face config.json
# --------------------------------------------------------------------------------------------
_REQUIRED = object()

_HIDDEN_ACT = {"silu": Activation.SILU, "swish": Activation.SILU, "gelu": Activation.GELU,
               "gelu_pytorch_tanh": Activation.GELU_TANH, "gelu_new": Activation.GELU_TANH,
               "gelu_fast": Activation.GELU_TANH}


class _Reader:
    """Typed access to one config dict; errors name the key and the file."""

    def __init__(self, cfg: dict, source: str, model_type: str):
        self.cfg, self.source, self.model_type = cfg, source, model_type

    def get(self, key: str, default: Any = _REQUIRED, kind: str = "int"):
        if key not in self.cfg or self.cfg[key] is None:
            if default is _REQUIRED:
                raise ConfigError(key, None, f"a value for '{key}' in {self.source}",
                                  f"model_type '{self.model_type}' needs '{key}'; is this the model's config.json?",
                                  problem=f"is missing from {self.source}")
            return default
        v = self.cfg[key]
        ok = {"int": isinstance(v, int) and not isinstance(v, bool),
              "float": isinstance(v, (int, float)) and not isinstance(v, bool),
              "bool": isinstance(v, bool), "str": isinstance(v, str)}[kind]
        if not ok:
            raise ConfigTypeError(key, v, f"{kind} (in {self.source})")
        return float(v) if kind == "float" else v

    def first(self, keys: tuple, kind: str = "int"):
        for k in keys:
            if self.cfg.get(k) is not None:
                return self.get(k, kind=kind)
        raise ConfigError(keys[0], None, f"one of {list(keys)} in {self.source}",
                          f"model_type '{self.model_type}' needs the number of experts per token",
                          problem=f"is missing from {self.source}")

    def activation(self) -> Activation:
        act = self.get("hidden_act", "silu", kind="str")
        if act not in _HIDDEN_ACT:
            raise ConfigError("hidden_act", act, sorted(_HIDDEN_ACT), f"{self.source}: unsupported expert activation")
        return _HIDDEN_ACT[act]


def _mixtral(r: _Reader) -> dict:
    return dict(num_experts=r.get("num_local_experts"), top_k=r.get("num_experts_per_tok"),
                hidden_size=r.get("hidden_size"), intermediate_size=r.get("intermediate_size"),
                activation=r.activation(), routing=_SOFTMAX_RENORM, notes="softmax, top-k, renormalized")


def _qwen_moe(r: _Reader) -> dict:
    renorm = r.get("norm_topk_prob", False, kind="bool")
    shared = 1 if r.get("shared_expert_intermediate_size", 0) > 0 else 0  # qwen2_moe only
    notes = f"softmax, top-k, norm_topk_prob={str(renorm).lower()}"
    if shared:
        notes += f"; 1 shared expert (I={r.get('shared_expert_intermediate_size')}) gated by sigmoid, not modelled"
    return dict(num_experts=r.get("num_experts"), top_k=r.get("num_experts_per_tok"),
                hidden_size=r.get("hidden_size"), intermediate_size=r.get("moe_intermediate_size"),
                activation=r.activation(), routing=Routing(scoring="softmax", renormalize=renorm),
                num_shared_experts=shared, notes=notes)


def _deepseek(r: _Reader) -> dict:
    v3 = r.model_type != "deepseek_v2"
    scoring = r.get("scoring_func", "sigmoid" if v3 else "softmax", kind="str")
    if scoring not in ("softmax", "sigmoid"):
        raise ConfigError("scoring_func", scoring, ["softmax", "sigmoid"], f"{r.source}: unsupported router scoring")
    method = r.get("topk_method", "noaux_tc" if v3 else "greedy", kind="str")
    methods = ("greedy", "group_limited_greedy", "noaux_tc")
    if method not in methods:
        raise ConfigError("topk_method", method, methods, f"{r.source}: unsupported DeepSeek top-k method")
    groups = topk_groups = None
    if method != "greedy":
        n_group = r.get("n_group", 8 if v3 else _REQUIRED)
        if n_group > 1:
            groups, topk_groups = n_group, r.get("topk_group", 4 if v3 else _REQUIRED)
    routing = Routing(scoring=scoring, renormalize=r.get("norm_topk_prob", v3, kind="bool"),
                      num_groups=groups, topk_groups=topk_groups, has_correction_bias=method == "noaux_tc",
                      routed_scaling_factor=r.get("routed_scaling_factor", 2.5 if v3 else 1.0, kind="float"))
    shared = r.get("n_shared_experts", 1 if v3 else 0)
    dense = r.get("first_k_dense_replace", 0)
    notes = f"{scoring}, topk_method={method}" + (f", {groups} groups keep {topk_groups}" if groups else "") \
        + f", x{routing.routed_scaling_factor:g}; {shared} shared expert(s); first {dense} layer(s) dense"
    return dict(num_experts=r.get("n_routed_experts"), top_k=r.get("num_experts_per_tok"),
                hidden_size=r.get("hidden_size"), intermediate_size=r.get("moe_intermediate_size"),
                activation=r.activation(), routing=routing, num_shared_experts=shared, notes=notes)


def _gpt_oss(r: _Reader) -> dict:
    return dict(num_experts=r.get("num_local_experts"), top_k=r.first(("num_experts_per_tok", "experts_per_token")),
                hidden_size=r.get("hidden_size"), intermediate_size=r.get("intermediate_size"),
                activation=Activation.SWIGLUOAI, routing=_SOFTMAX_RENORM, has_bias=True,
                swiglu_limit=r.get("swiglu_limit", 7.0, kind="float"),
                notes="top-k of the logits, softmax over them (= softmax + renormalize); expert biases")


def _olmoe(r: _Reader) -> dict:
    renorm = r.get("norm_topk_prob", False, kind="bool")
    return dict(num_experts=r.get("num_experts"), top_k=r.get("num_experts_per_tok"),
                hidden_size=r.get("hidden_size"), intermediate_size=r.get("intermediate_size"),
                activation=r.activation(), routing=Routing(scoring="softmax", renormalize=renorm),
                notes=f"softmax, top-k, norm_topk_prob={str(renorm).lower()}")


def _llama4(r: _Reader) -> dict:
    k = r.get("num_experts_per_tok")
    if k != 1:
        raise ConfigError("num_experts_per_tok", k, [1], f"{r.source}: Llama-4 routes each token to one expert "
                          "and scales the input by its weight; other top-k values are not Llama-4 routing")
    step = r.get("interleave_moe_layer_step", 1)
    return dict(num_experts=r.get("num_local_experts"), top_k=k, hidden_size=r.get("hidden_size"),
                intermediate_size=r.get("intermediate_size"), activation=r.activation(),
                routing=Routing(scoring="sigmoid", renormalize=False, apply_router_weight_on_input=True),
                num_shared_experts=1,
                notes="top-1, sigmoid of the chosen logit, applied to the input; 1 shared expert"
                      + (f"; MoE every {step} layers" if step > 1 else ""))


_PARSERS = {"mixtral": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe, "deepseek_v2": _deepseek,
            "deepseek_v3": _deepseek, "kimi_k2": _deepseek, "gpt_oss": _gpt_oss, "olmoe": _olmoe,
            "llama4": _llama4, "llama4_text": _llama4}
HF_MODEL_TYPES = tuple(_PARSERS)


def _quant(qc: Any, source: str) -> tuple[str, str]:
    """(scheme name, note) from a quantization_config dict (or None)."""
    if qc is None:
        return "none", ""
    if not isinstance(qc, dict):
        raise ConfigTypeError("quantization_config", qc, f"a JSON object (in {source})")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block:
            if not (isinstance(block, list) and len(block) == 2
                    and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
                raise ConfigError("weight_block_size", block, "[bn, bk], two positive ints (in quantization_config)",
                                  f"{source}: DeepSeek-V3 checkpoints hold [128, 128]")
            return "fp8_block" if block == [128, 128] else f"fp8_block:b{block[0]}x{block[1]}", ""
        return ("fp8_tensor:static" if qc.get("activation_scheme") == "static" else "fp8_tensor"), ""
    if method == "fbgemm_fp8":
        return "fp8_channel", ""
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "mxfp4":
        return "mxfp4", ""
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        if algo in ("NVFP4", "FP8"):
            return ("nvfp4" if algo == "NVFP4" else "fp8_tensor"), ""
    if method in ("gptq", "awq"):
        bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
        if bits == 4 and group in (32, 64, 128):
            zp = (not qc.get("sym", True)) if method == "gptq" else bool(qc.get("zero_point", True))
            return f"int4_w4a16:g{group}" + (":zp" if zp else ""), ""
    return "none", (f"quantization_config {method or '?'!r} not recognized, quant treated as 'none': the layer "
                    "is modelled with 16-bit weights, not the checkpoint's format; pick a scheme with --quant")


def _ct_scheme(group: Any) -> Optional[str]:
    """The scheme of one compressed-tensors config group, None where fusedmoe has none that
    computes the same thing (the ``_quant`` table)."""
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        return None
    w, a = group["weights"], group.get("input_activations")
    bits, kind, strat = w.get("num_bits"), w.get("type"), w.get("strategy")
    if a is not None and not isinstance(a, dict):
        return None
    dyn = bool(a and a.get("dynamic"))
    a_strat = a.get("strategy") if a else None
    if bits == 8 and kind == "float":
        if a is None:
            return "fp8_w8a16" if strat == "channel" else None
        if a.get("num_bits") != 8 or a.get("type") != "float":
            return None
        if strat == "channel" and dyn and a_strat == "token":
            return "fp8_channel"
        if strat == "tensor" and a_strat == "tensor":
            return "fp8_tensor" if dyn else "fp8_tensor:static"
        if (strat == "block" and list(w.get("block_structure") or []) == [128, 128] and dyn
                and a_strat == "group" and a.get("group_size") == 128):
            return "fp8_block"
        return None
    if bits == 8 and kind == "int" and w.get("symmetric", True) and strat == "channel":
        if a is None:
            return "int8_w8a16"
        if a.get("num_bits") == 8 and a.get("type") == "int" and dyn and a_strat == "token":
            return "int8_channel"
        return None
    if bits == 4 and kind == "int" and a is None and strat == "group" and w.get("group_size") in (32, 64, 128):
        return f"int4_w4a16:g{w['group_size']}" + ("" if w.get("symmetric", True) else ":zp")
    return None


def _compressed_tensors(qc: dict) -> tuple[str, str]:
    """(scheme, note) of a compressed-tensors quantization_config: its config groups must all
    name one scheme of the ``_quant`` table."""
    groups = qc.get("config_groups")
    found = {_ct_scheme(g) for g in groups.values()} if isinstance(groups, dict) and groups else {None}
    if len(found) == 1 and None not in found:
        return found.pop(), ""
    what = ", ".join(sorted(x for x in found if x)) or "none recognized"
    return "none", (f"compressed-tensors config groups not mapped to one fusedmoe scheme ({what}), quant "
                    "treated as 'none': the layer is modelled with 16-bit weights; pick a scheme with --quant")


def preset_from_hf_dict(cfg: dict, source: str = "<dict>", name: Optional[str] = None) -> ModelPreset:
    """A ModelPreset from a parsed Hugging Face config (``source`` names it in errors)."""
    if not isinstance(cfg, dict):
        raise ConfigTypeError("config", cfg, f"a JSON object (in {source})")
    model_type = cfg.get("model_type")
    if model_type not in _PARSERS:
        raise ConfigError("model_type", model_type, sorted(_PARSERS),
                          f"{source} is not a supported MoE model; build a MoEConfig by hand",
                          problem="is missing or not supported" if model_type is None else "is not supported")
    quant_cfg = cfg.get("quantization_config")
    body = cfg
    if model_type == "llama4":  # multimodal wrapper: the language model sits in text_config
        if not isinstance(cfg.get("text_config"), dict):
            raise ConfigError("text_config", None, f"a JSON object in {source}", "model_type 'llama4' nests the "
                              "language model's keys in text_config", problem=f"is missing from {source}")
        body = cfg["text_config"]
        quant_cfg = quant_cfg if quant_cfg is not None else body.get("quantization_config")
    fields = _PARSERS[model_type](_Reader(body, source, model_type))
    quant, qnote = _quant(quant_cfg, source)
    hf_name = cfg.get("_name_or_path") or name or source
    fields["notes"] = f"{model_type} from {source}: {fields['notes']}" + (f"; {qnote}" if qnote else "")
    return ModelPreset(name=name or hf_name, hf_name=str(hf_name), quant=quant, quant_note=qnote, **fields)


def load_hf_config(path: "str | os.PathLike") -> ModelPreset:
    """A ModelPreset from a Hugging Face ``config.json`` file, or a folder that holds one."""
    p = os.fspath(path)
    file = os.path.join(p, "config.json") if os.path.isdir(p) else p
    if not os.path.isfile(file):
        raise ConfigError("path", p, "a config.json file or a folder containing one",
                          "download the model's config.json (huggingface-cli download MODEL config.json)",
                          problem="has no config.json" if os.path.isdir(p) else "does not exist")
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("path", file, "a JSON file", f"the file does not parse: {e}", problem="is not valid JSON") \
            from None
    folder = os.path.basename(os.path.dirname(os.path.abspath(file)))
    name = folder if os.path.basename(file) == "config.json" and folder else os.path.splitext(os.path.basename(file))[0]
    preset = preset_from_hf_dict(cfg, source=file, name=name)
    if preset.quant_note:
        log.warning("%s: %s", file, preset.quant_note)
    return preset


def get_preset(name_or_path: "str | os.PathLike | ModelPreset") -> ModelPreset:
    """A preset by name (case-insensitive, '_' = '-'), by its Hugging Face name, or from a config.json path."""
    if isinstance(name_or_path, ModelPreset):
        return name_or_path
    if isinstance(name_or_path, os.PathLike):
        return load_hf_config(name_or_path)
    if not isinstance(name_or_path, str):
        raise ConfigTypeError("model", name_or_path, "a preset name or a path to a config.json")
    key = name_or_path.strip().lower().replace("_", "-")
    if key in PRESETS:
        return PRESETS[key]
    if os.path.exists(name_or_path):
        return load_hf_config(name_or_path)
    for p in PRESETS.values():
        if p.hf_name.lower() == name_or_path.strip().lower():
            return p
    raise ConfigError("model", name_or_path, sorted(PRESETS),
                      "pass a preset name, the Hugging Face name of one, or the path of a config.json (or its folder)",
                      problem="is neither a preset nor an existing path")

