"""The implementations a user would pick instead of fusedmoe, run in the same benchmark.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate, N = 2I (gated) or I.
Every peer is ``fn(x [T,H], topk_weights fp32 [T,k], topk_ids [T,k]) -> out [T,H]`` over the
SAME weight tensors fusedmoe gets (w13 [E, N, H], w2 [E, H, I]; no copies), is checked
against ``reference_moe`` before it is timed, and is reported with its reason when it cannot
run. Peers run with the 16-bit weights; those whose ``Impl.schemes`` list a quantized scheme
(vllm, sglang: fp8) also with that scheme's weights.

- ``torch_loop``: the per-expert Python loop people write (find the expert's tokens, two
  matmuls, activation, weighted ``index_add_``). Host-syncs on every expert: not capturable.
- ``torch_grouped_mm``: PyTorch's grouped GEMM pipeline: sort the (token, slot) pairs by
  expert, ``torch.nn.functional.grouped_mm`` (``torch._grouped_mm`` before torch 2.9) with
  cumulative ``offs``, activation, second grouped GEMM, unsort, weighted sum over k.
- ``hf_eager`` / ``hf_batched_mm`` / ``hf_grouped_mm``: Hugging Face transformers' own experts
  implementations (``experts_implementation``), run on a real transformers experts module
  (``Qwen3MoeExperts``, else ``MixtralExperts``) whose parameters are swapped for our tensors.
  Only gated silu / gelu / gelu_tanh without bias or clamp (what those modules compute).
- ``vllm`` / ``sglang``: the installed engine's public fused-MoE function,
  ``vllm.model_executor.layers.fused_moe.fused_experts`` and
  ``sglang.srt.layers.moe.fused_moe_triton.fused_experts``, on the same tensors (their w1 is our
  w13 [E, 2I, H], gate rows first; w2 [E, H, I]), given the router's topk_weights / topk_ids.
  Gated silu / gelu (halves layout) without bias or clamp, on CUDA. They also run with fp8
  weights: ``fp8_tensor`` (per-expert weight scale [E]; the static input scales when the
  weights have them, else dynamic per-tensor), ``fp8_channel`` (scales [E, out, 1], dynamic
  per-token activations), ``fp8_block`` (scales [E, out/bn, K/bk] with block_shape [bn, bk]).
  Both argument generations are wired: vLLM's flags (``use_fp8_w8a8``, ``per_channel_quant``,
  scales) or its ``quant_config`` (``fp8_w8a8_moe_quant_config``); SGLang's flat arguments or
  its ``topk_output`` + ``moe_runner_config``. A peer whose package is not importable is left
  out of 'all' with a note; asked for by name, the CLI says it is not installed.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..config import Activation, GateUpLayout, MoEConfig, QuantMethod
from ..reference.activations import activation_from_config
from .harness import Impl

__all__ = ["PEER_NAMES", "OPTIONAL_PEERS", "build_peers", "default_peer_names", "check_installed",
           "PeerUnavailable", "torch_loop", "torch_grouped_mm", "grouped_mm_fn"]

PEER_NAMES = ("torch_loop", "torch_grouped_mm", "hf_eager", "hf_batched_mm", "hf_grouped_mm", "vllm", "sglang")

#: peers that exist only where a package is installed: {peer: (import name, how to install it)}
OPTIONAL_PEERS = {"vllm": ("vllm", "pip install vllm"), "sglang": ("sglang", "pip install sglang")}

#: the devices vLLM's and SGLang's fused_experts run on (their Triton kernels)
ENGINE_DEVICES = ("cuda",)


class PeerUnavailable(RuntimeError):
    """A peer cannot run here; the message says why (reported, never silently dropped)."""


def _act(config: MoEConfig) -> Callable:
    """GEMM1 output [M, N] -> [M, I] in the activation dtype. Plain silu(g) * u in 16 bit, as a
    user writes it; any other activation through the reference (fp32 math, cast back)."""
    if config.activation == Activation.SILU and config.swiglu_limit is None \
            and config.gate_up_layout == GateUpLayout.HALVES:
        def silu_mul(h):
            g, u = h.chunk(2, dim=-1)
            return F.silu(g) * u
        return silu_mul
    return lambda h: activation_from_config(h, config).to(h.dtype)


# ----------------------------------------------------------------------------------------------
def torch_loop(x, w13, w2, topk_weights, topk_ids, act: Callable, b13=None, b2=None):
    """out [T, H]: for each expert, its tokens through two matmuls (the loop users write)."""
    out = torch.zeros_like(x)                                       # [T, H]
    for e in range(w13.shape[0]):
        tok, slot = torch.where(topk_ids == e)                      # host sync: data-dependent size
        if tok.numel() == 0:
            continue
        h = x[tok] @ w13[e].T                                       # [n, N]
        if b13 is not None:
            h = h + b13[e]
        y = act(h) @ w2[e].T                                        # [n, H]
        if b2 is not None:
            y = y + b2[e]
        out.index_add_(0, tok, (y * topk_weights[tok, slot, None]).to(x.dtype))
    return out


def grouped_mm_fn() -> Optional[Callable]:
    """``torch.nn.functional.grouped_mm`` (torch >= 2.9), else ``torch._grouped_mm``, else None."""
    fn = getattr(F, "grouped_mm", None)
    return fn if fn is not None else getattr(torch, "_grouped_mm", None)


def torch_grouped_mm(x, w13, w2, topk_weights, topk_ids, act: Callable, b13=None, b2=None, gmm=None):
    """out [T, H] through two grouped GEMMs over the expert-sorted (token, slot) pairs.
    No host sync (counts by scatter_add, not bincount)."""
    gmm = gmm or grouped_mm_fn()
    T, k = topk_ids.shape
    E = w13.shape[0]
    flat = topk_ids.reshape(-1).long()                              # [T*k] expert per slot
    order = torch.argsort(flat, stable=True)                        # [T*k] slots sorted by expert
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))          # [E]
    offs = torch.cumsum(counts, 0, dtype=torch.int32)               # [E] cumulative ends
    xs = x[order // k]                                              # [T*k, H] sorted rows
    h = gmm(xs, w13.transpose(1, 2), offs=offs)                     # [T*k, N]
    if b13 is not None:
        h = h + b13[flat[order]]
    y = gmm(act(h), w2.transpose(1, 2), offs=offs)                  # [T*k, H]
    if b2 is not None:
        y = y + b2[flat[order]]
    unsorted = torch.empty_like(y)
    unsorted[order] = y                                             # [T*k, H] slot order
    out = (unsorted.view(T, k, -1).float() * topk_weights[..., None]).sum(dim=1)   # [T, H]
    return out.to(x.dtype)


# ----------------------------------------------------------------------------------------------
def _build_torch_loop(config: MoEConfig, weights):
    act, w13, w2, b13, b2 = _act(config), weights.w13, weights.w2, weights.w13_bias, weights.w2_bias
    return lambda x, tw, ids: torch_loop(x, w13, w2, tw, ids, act, b13, b2)


def _build_grouped_mm(config: MoEConfig, weights):
    gmm = grouped_mm_fn()
    if gmm is None:
        raise PeerUnavailable(f"torch {torch.__version__} has neither torch.nn.functional.grouped_mm nor torch._grouped_mm")
    act, w13, w2, b13, b2 = _act(config), weights.w13, weights.w2, weights.w13_bias, weights.w2_bias
    return lambda x, tw, ids: torch_grouped_mm(x, w13, w2, tw, ids, act, b13, b2, gmm)


_HF_ACT = {Activation.SILU: "silu", Activation.GELU: "gelu", Activation.GELU_TANH: "gelu_pytorch_tanh"}


def _hf_module(config: MoEConfig, weights, impl: str):
    """A transformers experts module computing with our tensors under ``experts_implementation=impl``."""
    if importlib.util.find_spec("transformers") is None:
        raise PeerUnavailable("transformers is not installed")
    if config.activation not in _HF_ACT or config.swiglu_limit is not None or config.has_bias:
        extra = (" with bias" if config.has_bias else "") + (" with a clamp" if config.swiglu_limit else "")
        raise PeerUnavailable("transformers' generic experts modules compute gated silu/gelu without bias or "
                              f"clamp; this shape uses {config.activation.value}{extra}")
    import transformers  # noqa: PLC0415
    E, k, H, I = config.num_experts, config.top_k, config.hidden_size, config.intermediate_size
    errors = []
    for cfg_name, mod_path, cls_name, kw in (
            ("Qwen3MoeConfig", "transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeExperts",
             dict(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k)),
            ("MixtralConfig", "transformers.models.mixtral.modeling_mixtral", "MixtralExperts",
             dict(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k))):
        try:
            cfg = getattr(transformers, cfg_name)(hidden_act=_HF_ACT[config.activation], **kw)
            cfg._experts_implementation = impl
            cls = getattr(importlib.import_module(mod_path), cls_name)
            with torch.device("meta"):                       # no allocation: we swap in our tensors
                mod = cls(cfg)
            w13, w2 = weights.w13, weights.w2
            if tuple(mod.gate_up_proj.shape) == (E, H, 2 * I):   # transposed storage in this version
                w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
            elif tuple(mod.gate_up_proj.shape) != (E, 2 * I, H):
                raise PeerUnavailable(f"{cls_name}.gate_up_proj has shape {tuple(mod.gate_up_proj.shape)}")
            mod.gate_up_proj = torch.nn.Parameter(w13, requires_grad=False)
            mod.down_proj = torch.nn.Parameter(w2, requires_grad=False)
            mod.to(weights.w13.device)                       # the activation module, if any
            return mod, cls_name
        except PeerUnavailable:
            raise
        except Exception as e:  # version drift: try the next module, report all if none works
            errors.append(f"{cls_name}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
    raise PeerUnavailable(f"transformers {transformers.__version__}: no usable experts module ({'; '.join(errors)})")


def _build_hf(impl: str):
    def build(config: MoEConfig, weights):
        mod, _ = _hf_module(config, weights, impl)
        if impl != "eager" and getattr(mod.config, "_experts_implementation", impl) != impl:
            raise PeerUnavailable(f"transformers did not accept experts_implementation={impl!r}")
        return lambda x, tw, ids: mod(x, ids, tw)
    return build


# ----------------------------------------------------------------------------------------------
# vLLM and SGLang: the engines' own fused-MoE function, where the package is installed
# ----------------------------------------------------------------------------------------------
def package_available(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (the engines take seconds to)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _not_installed(peer: str) -> str:
    pkg, how = OPTIONAL_PEERS[peer]
    return f"{pkg} is not installed ({how} to compare with it)"


def default_peer_names() -> tuple:
    """(names, notes): the peers 'all' runs (every peer whose package is importable) and one
    line per peer left out."""
    names, notes = [], []
    for n in PEER_NAMES:
        if n in OPTIONAL_PEERS and not package_available(OPTIONAL_PEERS[n][0]):
            notes.append(f"peer {n} skipped: {_not_installed(n)}")
        else:
            names.append(n)
    return names, notes


def check_installed(names, param: str = "--peers") -> None:
    """Raise ConfigError for a peer asked for by name whose package is not installed."""
    from ..errors import ConfigError  # noqa: PLC0415
    for n in names:
        if n in OPTIONAL_PEERS and not package_available(OPTIONAL_PEERS[n][0]):
            pkg, how = OPTIONAL_PEERS[n]
            raise ConfigError(param, n, default_peer_names()[0], f"{how}, or leave {n} out of {param}",
                              problem=f"needs the {pkg} package, which is not installed")


_ENGINE_ACT = {Activation.SILU: "silu", Activation.GELU: "gelu"}
_ENGINE_SCHEMES = ("none", "fp8_tensor", "fp8_channel", "fp8_block")


def _engine_import(peer: str, modules: tuple, attr: str):
    """``attr`` of the first of ``modules`` that has it, else PeerUnavailable saying why."""
    pkg = OPTIONAL_PEERS[peer][0]
    if not package_available(pkg):
        raise PeerUnavailable(_not_installed(peer))
    errors = []
    for name in modules:
        try:
            obj = getattr(importlib.import_module(name), attr, None)
        except Exception as e:  # installed but not importable here (CUDA libraries, version clash)
            errors.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            continue
        if obj is not None:
            return obj
        errors.append(f"{name} has no {attr}")
    version = getattr(sys.modules.get(pkg), "__version__", "?")
    raise PeerUnavailable(f"{pkg} {version}: no usable {attr} ({'; '.join(errors)})")


def _accepts(fn) -> Optional[set]:
    """The keyword names ``fn`` takes (None: any, it has **kwargs or no readable signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def _kwargs_for(peer: str, fn, optional: dict, required: dict) -> dict:
    """``required`` (raising PeerUnavailable when ``fn`` lacks one) and the ``optional`` that ``fn`` takes."""
    names = _accepts(fn)
    missing = sorted(k for k in required if names is not None and k not in names)
    if missing:
        raise PeerUnavailable(f"{peer}'s {getattr(fn, '__name__', fn)} takes no {', '.join(missing)} "
                              "(another version of its API)")
    return {**{k: v for k, v in optional.items() if names is None or k in names}, **required}


def _engine_quant(peer: str, config: MoEConfig, weights) -> dict:
    """fusedmoe's layer in the engines' flat arguments: the activation, and for fp8 the flags and
    scales in their layouts (names of vLLM's fused_experts before 0.11 and of SGLang's)."""
    if config.activation not in _ENGINE_ACT or config.gate_up_layout != GateUpLayout.HALVES \
            or config.swiglu_limit is not None or config.has_bias:
        extra = (" with bias" if config.has_bias else "") + (" with a clamp" if config.swiglu_limit else "")
        raise PeerUnavailable(f"{peer} is wired for gated silu / gelu without bias or clamp; this shape uses "
                              f"{config.activation.value}{extra}")
    if weights.w13.device.type not in ENGINE_DEVICES:
        raise PeerUnavailable(f"{peer}'s fused_experts runs Triton kernels on CUDA; this run is on "
                              f"{weights.w13.device.type}")
    w, m = weights, weights.scheme.method
    out = {"activation": _ENGINE_ACT[config.activation]}
    if m == QuantMethod.NONE:
        return out
    if m == QuantMethod.FP8_TENSOR:     # scales [E]; static input scales [1] when the weights have them
        return {**out, "use_fp8_w8a8": True, "w1_scale": w.w13_scale, "w2_scale": w.w2_scale,
                "a1_scale": w.a13_scale, "a2_scale": w.a2_scale}
    if m == QuantMethod.FP8_CHANNEL:    # [E, out, 1], as their layers hold them; activations per token
        return {**out, "use_fp8_w8a8": True, "per_channel_quant": True,
                "w1_scale": w.w13_scale.unsqueeze(-1), "w2_scale": w.w2_scale.unsqueeze(-1)}
    if m == QuantMethod.FP8_BLOCK:      # [E, out/bn, K/bk]; activations in 1 x bk groups
        return {**out, "use_fp8_w8a8": True, "w1_scale": w.w13_scale, "w2_scale": w.w2_scale,
                "block_shape": list(w.scheme.block_shape)}
    raise PeerUnavailable(f"{peer} is wired for {', '.join(_ENGINE_SCHEMES)} weights, not {m.value}")


def _flat_call(peer: str, fe, q: dict, act: str, weights):
    """``fe`` called with vLLM's flat argument names (vLLM's fused_experts, SGLang's before 0.5)."""
    kw = _kwargs_for(peer, fe, {"inplace": False, **({"activation": act} if act == "silu" else {})},
                     {**q, **({"activation": act} if act != "silu" else {})})   # silu: their default
    w1, w2 = weights.w13, weights.w2
    return lambda x, tw, ids: fe(hidden_states=x, w1=w1, w2=w2, topk_weights=tw, topk_ids=ids, **kw)


def _build_vllm(config: MoEConfig, weights):
    fe = _engine_import("vllm", ("vllm.model_executor.layers.fused_moe",
                                 "vllm.model_executor.layers.fused_moe.fused_moe"), "fused_experts")
    q = _engine_quant("vllm", config, weights)
    act = q.pop("activation")
    if q and "quant_config" in (_accepts(fe) or ()):
        # vLLM >= 0.11 takes the quantization as one FusedMoEQuantConfig
        make = _engine_import("vllm", ("vllm.model_executor.layers.fused_moe.config",), "fp8_w8a8_moe_quant_config")
        per_channel = q.get("per_channel_quant", False)
        q = {"quant_config": make(**_kwargs_for(
            "vllm", make, {"a1_scale": q.get("a1_scale"), "a2_scale": q.get("a2_scale"),
                           "per_act_token_quant": per_channel, "per_out_ch_quant": per_channel,
                           "block_shape": q.get("block_shape")},
            {"w1_scale": q["w1_scale"], "w2_scale": q["w2_scale"]}))}
    return _flat_call("vllm", fe, q, act, weights)


def _build_sglang(config: MoEConfig, weights):
    fe = _engine_import("sglang", ("sglang.srt.layers.moe.fused_moe_triton",), "fused_experts")
    q = _engine_quant("sglang", config, weights)
    act = q.pop("activation")
    if "topk_output" not in (_accepts(fe) or ()):     # SGLang before 0.5
        return _flat_call("sglang", fe, q, act, weights)
    # the routing as a StandardTopKOutput, the rest as a MoeRunnerConfig (not in place: x is reused)
    topk = _engine_import("sglang", ("sglang.srt.layers.moe.topk",), "StandardTopKOutput")
    runner = _engine_import("sglang", ("sglang.srt.layers.moe.moe_runner", "sglang.srt.layers.moe.moe_runner.base",
                                       "sglang.srt.layers.moe"), "MoeRunnerConfig")
    E = weights.num_experts
    rc = runner(**_kwargs_for("sglang", runner, {"num_experts": E, "num_local_experts": E},
                              {"activation": act, "inplace": False}))
    kw = _kwargs_for("sglang", fe, {}, q)
    w1, w2 = weights.w13, weights.w2
    return lambda x, tw, ids: fe(hidden_states=x, w1=w1, w2=w2, topk_output=topk(tw, ids, None),
                                 moe_runner_config=rc, **kw)


def build_peers(config: MoEConfig, names=None) -> list:
    """The peers as ``harness.Impl`` (built lazily by the harness with the 16-bit weights, or
    with the run's weights for the schemes an Impl lists). ``names`` None: ``default_peer_names``."""
    names = default_peer_names()[0] if names is None else list(names)
    makers = {
        "torch_loop": dict(build=_build_torch_loop, graph_safe=False,
                           description="per-expert Python loop: torch.where + 2 matmuls + index_add_"),
        "torch_grouped_mm": dict(build=_build_grouped_mm, graph_safe=True,
                                 description="sort by expert + torch grouped_mm x2 + unsort + weighted sum"),
        "hf_eager": dict(build=_build_hf("eager"), graph_safe=False, ids64=True,
                         description="transformers experts_implementation='eager' (loop over hit experts)"),
        "hf_batched_mm": dict(build=_build_hf("batched_mm"), graph_safe=True, ids64=True,
                              description="transformers experts_implementation='batched_mm' (gathered weights + bmm)"),
        "hf_grouped_mm": dict(build=_build_hf("grouped_mm"), graph_safe=True, ids64=True,
                              description="transformers experts_implementation='grouped_mm'"),
        "vllm": dict(build=_build_vllm, graph_safe=True, schemes=_ENGINE_SCHEMES,
                     description="vllm.model_executor.layers.fused_moe.fused_experts (Triton)"),
        "sglang": dict(build=_build_sglang, graph_safe=True, schemes=_ENGINE_SCHEMES,
                       description="sglang.srt.layers.moe.fused_moe_triton.fused_experts (Triton)"),
    }
    out = []
    for n in names:
        if n not in makers:
            out.append(Impl(n, "peer", unavailable=f"unknown peer; known: {', '.join(PEER_NAMES)}"))
            continue
        out.append(Impl(n, "peer", **makers[n]))
    return out
