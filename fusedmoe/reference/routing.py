"""Plain-torch routing: router logits -> (topk_weights, topk_ids). The specification.

Legend: T tokens, E experts, k top-k, G expert groups, Gs = E / G experts per group.

Steps (``route``):
  1. scores = softmax(logits) or sigmoid(logits), in fp32                     [T, E]
  2. selection scores = scores + correction_bias (DeepSeek-V3 "noaux_tc")    [T, E]
  3. grouped top-k (optional): a group's score is the sum of its top-2 selection
     scores when there is a bias, else its max; the ``topk_groups`` best groups
     are kept, the other experts are masked to -inf                          [T, E]
  4. top-k over the selection scores                                         [T, k]
  5. weights = the UNBIASED scores of the chosen experts; divided by their sum
     if ``renormalize``; then multiplied by ``routed_scaling_factor``         [T, k]

Ties (equal selection scores, equal group scores) go to the LOWER index: every
top-k here is a stable descending sort, and the Triton kernel
(``fusedmoe.kernels.routing``) follows the same rule, so ids match exactly.

Custom routing: ``Routing(custom=name)`` calls a function registered with
``register_routing_fn(name, fn)``; ``fn(hidden_states, router_logits, top_k,
renormalize) -> (weights [T, k], ids [T, k])``. Its weights are then multiplied by
``routed_scaling_factor``. A built-in ``"sqrtsoftplus"`` (DeepSeek-V4 style scores
sqrt(softplus(logits))) is registered.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .. import env
from ..config import Routing, ScoringFunc
from ..errors import ConfigError, ConfigTypeError, InputError

__all__ = ["RoutingResult", "route", "register_routing_fn", "get_routing_fn", "registered_routing_fns",
           "stable_topk", "sqrtsoftplus_routing"]

RoutingFn = Callable[[Optional[torch.Tensor], torch.Tensor, int, bool], tuple]


@dataclass
class RoutingResult:
    """The router's decision for T tokens."""

    topk_weights: torch.Tensor  # fp32 [T, k]
    topk_ids: torch.Tensor      # int32 [T, k]


# --------------------------------------------------------------------------------------------
# custom routing functions
# --------------------------------------------------------------------------------------------
_ROUTING_FNS: dict[str, RoutingFn] = {}


def register_routing_fn(name: str, fn: RoutingFn, *, replace: bool = False) -> RoutingFn:
    """Register ``fn(hidden_states, router_logits, top_k, renormalize) -> (weights, ids)`` as ``name``.

    ``hidden_states`` [T, H] may be None; ``router_logits`` [T, E]; the function returns
    weights [T, k] (any float dtype, cast to fp32) and ids [T, k] (any int dtype, cast to int32).
    Registering a different function under a taken name needs ``replace=True``.
    Returns ``fn`` so that it can be used as a decorator body.
    """
    if not isinstance(name, str) or not name:
        raise ConfigTypeError("name", name, "a non-empty str")
    if not callable(fn):
        raise ConfigTypeError("fn", fn, "a callable fn(hidden_states, router_logits, top_k, renormalize)")
    old = _ROUTING_FNS.get(name)
    if old is not None and old is not fn and not replace:
        raise ConfigError("name", name, f"a name not yet registered (taken: {sorted(_ROUTING_FNS)})",
                          "pick another name, or pass replace=True to override it", problem="is already registered")
    _ROUTING_FNS[name] = fn
    return fn


def get_routing_fn(name: str) -> RoutingFn:
    """The function registered as ``name``; ConfigError listing the registered names if unknown."""
    try:
        return _ROUTING_FNS[name]
    except (KeyError, TypeError):
        raise ConfigError("Routing.custom", name, sorted(_ROUTING_FNS),
                          "register it first with fusedmoe.reference.routing.register_routing_fn(name, fn)") from None


def registered_routing_fns() -> list[str]:
    return sorted(_ROUTING_FNS)


# --------------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------------
def stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim; equal values go to the lower index. Returns (values, int64 indices)."""
    values, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], idx[..., :k]


def _scores(logits: torch.Tensor, scoring: ScoringFunc) -> torch.Tensor:
    x = logits.float()                                                       # [T, E]
    if scoring == ScoringFunc.SIGMOID:
        return torch.sigmoid(x)
    return torch.softmax(x, dim=-1)


def _group_mask(sel: torch.Tensor, num_groups: int, topk_groups: int, has_bias: bool) -> torch.Tensor:
    """Bool [T, E]: True for the experts of the ``topk_groups`` best groups of each token."""
    T, E = sel.shape
    grouped = sel.view(T, num_groups, E // num_groups)                       # [T, G, Gs]
    if has_bias:
        n = min(2, grouped.shape[-1])  # a group of one expert: its only score
        group_scores = stable_topk(grouped, n)[0].sum(dim=-1)                # [T, G]
    else:
        group_scores = grouped.max(dim=-1).values                            # [T, G]
    _, kept = stable_topk(group_scores, topk_groups)                         # [T, topk_groups]
    gmask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)  # [T, G]
    return gmask.unsqueeze(-1).expand(T, num_groups, E // num_groups).reshape(T, E)


def sqrtsoftplus_routing(hidden_states: Optional[torch.Tensor], router_logits: torch.Tensor, top_k: int,
                         renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Built-in custom routing "sqrtsoftplus": scores = sqrt(softplus(logits)), top-k, optional renormalize.

    Returns (weights fp32 [T, k], ids int32 [T, k]).
    """
    scores = torch.sqrt(F.softplus(router_logits.float()))                   # [T, E]
    weights, ids = stable_topk(scores, top_k)                                # [T, k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


register_routing_fn("sqrtsoftplus", sqrtsoftplus_routing)


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def _check_inputs(logits, top_k, routing, bias, hidden_states) -> None:
    if not isinstance(routing, Routing):
        raise ConfigTypeError("routing", routing, "fusedmoe.Routing")
    if not isinstance(logits, torch.Tensor):
        raise ConfigTypeError("router_logits", logits, "torch.Tensor [T, E]")
    if logits.dim() != 2:
        raise InputError("router_logits", tuple(logits.shape), "a 2-D tensor [T, E]",
                         "flatten the batch dims: router_logits.view(-1, num_experts)")
    if not logits.dtype.is_floating_point:
        raise InputError("router_logits.dtype", logits.dtype, "float32, bfloat16, float16",
                         "router logits are the float output of the gate")
    T, E = logits.shape
    if E < 1:
        raise InputError("router_logits", tuple(logits.shape), "E >= 1 experts", "the gate has one column per expert")
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ConfigTypeError("top_k", top_k, "int")
    if not 1 <= top_k <= E:
        raise ConfigError("top_k", top_k, f"1..E={E}", "top_k cannot exceed the number of experts (logits columns)",
                          problem="is out of range")
    if hidden_states is not None:
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2 or hidden_states.shape[0] != T:
            raise InputError("hidden_states", getattr(hidden_states, "shape", hidden_states),
                             f"None or a 2-D tensor [T={T}, H]", "pass the tokens the logits were computed from")
    if routing.custom is not None:
        if routing.is_grouped or routing.has_correction_bias or bias is not None:
            raise ConfigError("Routing.custom", routing.custom,
                              "custom routing without num_groups / has_correction_bias / correction_bias",
                              "a custom function does the whole selection; fold groups or bias into it")
        return
    if routing.has_correction_bias:
        if bias is None:
            raise InputError("correction_bias", None, f"a float tensor [E={E}]",
                             "Routing(has_correction_bias=True) needs the layer's e_score_correction_bias",
                             problem="is missing")
        if not isinstance(bias, torch.Tensor):
            raise ConfigTypeError("correction_bias", bias, f"torch.Tensor [E={E}]")
        if tuple(bias.shape) != (E,):
            raise InputError("correction_bias", tuple(bias.shape), f"shape ({E},)", "one bias per expert")
        if not bias.dtype.is_floating_point:
            raise InputError("correction_bias.dtype", bias.dtype, "float32 (any float dtype is cast to fp32)",
                             "convert with .float()")
        if bias.device != logits.device:
            raise InputError("correction_bias.device", bias.device, f"{logits.device} (that of router_logits)",
                             "move the bias to the logits' device")
    elif bias is not None:
        raise ConfigError("correction_bias", f"tensor {tuple(bias.shape)}", [None],
                          "set Routing(has_correction_bias=True) to use a correction bias",
                          problem="is given but routing.has_correction_bias is False")
    if routing.is_grouped:
        G, Gk = routing.num_groups, routing.topk_groups
        if E % G:
            raise ConfigError("num_groups", G, f"a divisor of E={E}", "experts are split into equal groups")
        if top_k > Gk * (E // G):
            raise ConfigError("top_k", top_k, f"<= topk_groups * E / num_groups = {Gk * (E // G)}",
                              "keep more groups (topk_groups) or lower top_k", problem="is more than the kept experts")


def _check_custom_result(weights, ids, T: int, E: int, top_k: int, name: str) -> None:
    for what, t in (("weights", weights), ("ids", ids)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (T, top_k):
            raise InputError(f"custom routing '{name}' {what}", getattr(t, "shape", t), f"a tensor of shape {(T, top_k)}",
                             "the function must return (weights [T, k], ids [T, k])")
    if ids.dtype.is_floating_point:
        raise InputError(f"custom routing '{name}' ids.dtype", ids.dtype, "an integer dtype", "return int32 ids")
    if env.debug() and T > 0 and (int(ids.min()) < 0 or int(ids.max()) >= E):  # syncs: debug only
        raise InputError(f"custom routing '{name}' ids", (int(ids.min()), int(ids.max())), f"values in [0, {E})",
                         "return global expert ids")


# --------------------------------------------------------------------------------------------
# the router
# --------------------------------------------------------------------------------------------
def route(router_logits: torch.Tensor, top_k: int, routing: Routing, correction_bias: Optional[torch.Tensor] = None,
          hidden_states: Optional[torch.Tensor] = None) -> RoutingResult:
    """Route T tokens to ``top_k`` of E experts.

    Args:
      router_logits: [T, E] float (fp32/bf16/fp16); scores are computed in fp32.
      top_k: experts per token, 1..E.
      routing: how (see ``fusedmoe.config.Routing``).
      correction_bias: [E] float, required iff ``routing.has_correction_bias``; selection only.
      hidden_states: [T, H], passed to custom routing functions only.
    Returns:
      RoutingResult(topk_weights fp32 [T, k], topk_ids int32 [T, k]) on the logits' device.
    """
    _check_inputs(router_logits, top_k, routing, correction_bias, hidden_states)
    T, E = router_logits.shape
    dev = router_logits.device
    if T == 0:
        return RoutingResult(torch.empty(0, top_k, dtype=torch.float32, device=dev),
                             torch.empty(0, top_k, dtype=torch.int32, device=dev))
    if routing.custom is not None:
        fn = get_routing_fn(routing.custom)
        weights, ids = fn(hidden_states, router_logits, top_k, routing.renormalize)
        _check_custom_result(weights, ids, T, E, top_k, routing.custom)
        weights = weights.float() * routing.routed_scaling_factor            # [T, k]
        return RoutingResult(weights.contiguous(), ids.to(torch.int32).contiguous())

    scores = _scores(router_logits, routing.scoring)                         # [T, E] fp32
    sel = scores + correction_bias.float() if routing.has_correction_bias else scores  # [T, E]
    if routing.is_grouped:
        keep = _group_mask(sel, routing.num_groups, routing.topk_groups, routing.has_correction_bias)  # [T, E]
        sel = sel.masked_fill(~keep, float("-inf"))                          # [T, E]
    _, ids = stable_topk(sel, top_k)                                         # [T, k] int64
    weights = scores.gather(1, ids)                                          # [T, k] unbiased
    if routing.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routing.routed_scaling_factor != 1.0:
        weights = weights * routing.routed_scaling_factor
    return RoutingResult(weights.contiguous(), ids.to(torch.int32).contiguous())
