"""The implementations a user would pick instead of fusedmoe, run in the same benchmark.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate, N = 2I (gated) or I.
Every peer is ``fn(x [T,H], topk_weights fp32 [T,k], topk_ids [T,k]) -> out [T,H]`` over the
SAME 16-bit weight tensors fusedmoe gets (w13 [E, N, H], w2 [E, H, I]; no copies), is
checked against ``reference_moe`` before it is timed, and is reported with its reason when it
cannot run. Peers run for the 16-bit scheme only.

- ``torch_loop``: the per-expert Python loop people write (find the expert's tokens, two
  matmuls, activation, weighted ``index_add_``). Host-syncs on every expert: not capturable.
- ``torch_grouped_mm``: PyTorch's grouped GEMM pipeline: sort the (token, slot) pairs by
  expert, ``torch.nn.functional.grouped_mm`` (``torch._grouped_mm`` before torch 2.9) with
  cumulative ``offs``, activation, second grouped GEMM, unsort, weighted sum over k.
- ``hf_eager`` / ``hf_batched_mm`` / ``hf_grouped_mm``: Hugging Face transformers' own experts
  implementations (``experts_implementation``), run on a real transformers experts module
  (``Qwen3MoeExperts``, else ``MixtralExperts``) whose parameters are swapped for our tensors.
  Only gated silu / gelu / gelu_tanh without bias or clamp (what those modules compute).
"""
from __future__ import annotations

import importlib.util
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..config import Activation, GateUpLayout, MoEConfig
from ..reference.activations import activation_from_config
from .harness import Impl

__all__ = ["PEER_NAMES", "build_peers", "PeerUnavailable", "torch_loop", "torch_grouped_mm", "grouped_mm_fn"]

PEER_NAMES = ("torch_loop", "torch_grouped_mm", "hf_eager", "hf_batched_mm", "hf_grouped_mm")


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


def build_peers(config: MoEConfig, names=None) -> list:
    """The peers as ``harness.Impl`` (built lazily by the harness with the 16-bit weights)."""
    names = list(PEER_NAMES) if names is None else list(names)
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
    }
    out = []
    for n in names:
        if n not in makers:
            out.append(Impl(n, "peer", unavailable=f"unknown peer; known: {', '.join(PEER_NAMES)}"))
            continue
        out.append(Impl(n, "peer", **makers[n]))
    return out
