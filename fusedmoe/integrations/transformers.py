"""Hugging Face transformers integration: ``experts_implementation="fusedmoe"``.

    import fusedmoe.integrations.transformers as fm_hf
    fm_hf.register()                       # once, before from_pretrained
    model = AutoModelForCausalLM.from_pretrained(..., experts_implementation="fusedmoe")

transformers (5.x) routes every ``@use_experts_implementation`` experts module's forward
``(self, hidden_states [T,H], top_k_index [T,k], top_k_weights [T,k]) -> [T,H]`` through its
``ExpertsInterface``; ``register`` adds fusedmoe there. On the first call of each experts
module, fusedmoe selects a backend for its shape (logged once, ``module._fusedmoe.selection``
says which and why) and keeps it; the weights are used in place (a transposed layout is
copied once). What this integration cannot reproduce raises instead of computing something
else: a custom gate (``_apply_gate`` other than transformers' default, e.g. gpt-oss's clamped
interleaved SwiGLU), interleaved gate/up, an activation other than silu/gelu/gelu_tanh, EP
sentinel ids. Inference only.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import MoEConfig
from ..errors import ConfigError
from ..weights import ExpertWeights

__all__ = ["register", "experts_forward", "NAME"]

NAME = "fusedmoe"

# transformers' ACT2FN names -> fusedmoe activations (gated: act(gate) * up)
_ACTS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
         "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def register(name: str = NAME, backend: str = "auto") -> str:
    """Add fusedmoe to transformers' ExpertsInterface under ``name``; returns the name."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as e:  # older transformers have no experts interface
        raise ConfigError("transformers", getattr(e, "name", "transformers"), "transformers >= 5 with "
                          "transformers.integrations.moe.ExpertsInterface", "pip install -U transformers") from None

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return experts_forward(self, hidden_states, top_k_index, top_k_weights, backend=backend)

    forward.__name__ = f"{name}_experts_forward"
    ExpertsInterface.register(name, forward)
    return name


def _hidden_act(module) -> str:
    cfg = getattr(module, "config", None)
    act = getattr(cfg, "hidden_act", None)
    if act not in _ACTS:
        raise ConfigError("hidden_act", act, sorted(_ACTS),
                          "use experts_implementation='grouped_mm' for this model's activation")
    return _ACTS[act]


def _check_module(module) -> None:
    from transformers.integrations.moe import _default_apply_gate
    if getattr(module, "has_gate", True):
        gate = getattr(type(module), "_apply_gate", _default_apply_gate)
        if gate is not _default_apply_gate:
            raise ConfigError(f"{type(module).__name__}._apply_gate", gate.__qualname__,
                              "transformers' default act(gate) * up",
                              "this model's gate (e.g. gpt-oss's clamped SwiGLU) is not mapped yet; use "
                              "experts_implementation='grouped_mm', or fusedmoe.FusedMoE directly")
        if not getattr(module, "is_concatenated", True):
            raise ConfigError("is_concatenated", False, [True], "interleaved gate/up rows are not mapped yet")


def _prepare(module, hidden_states: torch.Tensor, top_k: int, backend: str):
    from ..layer import prepare_experts
    _check_module(module)
    gated = getattr(module, "has_gate", True)
    t = getattr(module, "is_transposed", False)
    w13 = module.gate_up_proj if gated else module.up_proj
    w2 = module.down_proj
    w13 = w13.detach().transpose(1, 2).contiguous() if t else w13.detach()       # [E, N, H]
    w2 = w2.detach().transpose(1, 2).contiguous() if t else w2.detach()          # [E, H, I]
    E, N, H = w13.shape
    I = w2.shape[2]
    act = _hidden_act(module) if gated else {"silu": "silu_no_mul", "gelu": "gelu_no_mul"}.get(
        _hidden_act(module), None)
    if act is None:
        raise ConfigError("hidden_act", module.config.hidden_act, ["silu", "gelu"], "for non-gated experts")
    has_bias = bool(getattr(module, "has_bias", False))
    b13 = b2 = None
    if has_bias:
        b13 = (module.gate_up_proj_bias if gated else module.up_proj_bias).detach()
        b2 = module.down_proj_bias.detach()
    cfg = MoEConfig(E, top_k, H, I, activation=act, dtype=hidden_states.dtype, has_bias=has_bias)
    ew = ExpertWeights(w13, w2, w13_bias=b13, w2_bias=b2)
    return prepare_experts(cfg, ew, backend)


def _key(module, hidden_states, top_k):
    gated = getattr(module, "has_gate", True)
    w = module.gate_up_proj if gated else module.up_proj
    return (w.data_ptr(), module.down_proj.data_ptr(), w.device, hidden_states.dtype, top_k)


def experts_forward(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """transformers experts forward through fusedmoe: [T, H] -> [T, H] in hidden_states' dtype."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in (module.down_proj,)):
        # a silent no-gradient path would be worse than an error
        raise ConfigError("experts_implementation", NAME, "inference (torch.no_grad / inference_mode)",
                          "fusedmoe kernels have no backward; wrap generation in torch.no_grad()")
    k = top_k_index.shape[-1]
    key = _key(module, hidden_states, k)
    cached: Optional[tuple] = getattr(module, "_fusedmoe_cache", None)
    if cached is None or cached[0] != key:
        module._fusedmoe_cache = (key, _prepare(module, hidden_states, k, backend))
    pe = module._fusedmoe_cache[1]
    module._fusedmoe = pe
    return pe(hidden_states, top_k_weights.float(), top_k_index.to(torch.int32))
