"""An independent plain loop of the MoE layer, for the differential fuzz test (test_fuzz.py).

Written from the definition in README.md ("The computation", "Weight formats") and the
config docstrings, NOT from ``fusedmoe.reference``: it imports nothing from fusedmoe, so a
mistake shared by the library's reference and its backends still shows. Everything is
float64 (the library computes in fp32: the two differ by rounding only).

Legend: T tokens, E experts (global), E_loc local experts, k top-k, H hidden, I intermediate,
N = 2I (gated) or I, G expert groups.

Routing (``route``), per token:
  scores = softmax(logits), sigmoid(logits) or sqrt(softplus(logits))        [E]
  sel    = scores + correction_bias (selection only)                        [E]
  grouped top-k: a group's score is its best sel (no bias) or the sum of its two best
  (with a bias, DeepSeek-V3 "noaux_tc"); experts outside the topk_groups best groups are out
  ids    = the k best sel; weights = scores[ids] (unbiased), / their sum if renormalize,
           * routed_scaling_factor
The margin (``Routed.margin``) is the smallest gap, over tokens, between the last kept and
the first dropped expert (and group): a tiny perturbation of the logits cannot change a
selection whose margin is clearly positive; the fuzz test skips cases where it is not.

Experts (``moe``), per (token t, slot j) with global expert g and local e (-1: not local):
  h = act(fq1(x[t]) @ w13[e]^T + b13[e])       gate rows [0, I), up rows [I, 2I) (interleaved
                                               rows 0::2 / 1::2 for swigluoai)
  y = fq2(h) @ w2[e]^T + b2[e]
  out[t] = sum_j weight[t, j] * y              (top-1 with the weight on the input: x is
                                               scaled first and y is not weighted)
fq1 / fq2 fake-quantize a GEMM input the way a W8A8 scheme quantizes its activations (the
scheme's granularity: per tensor over every row of the GEMM input, per row, per 1 x bk group;
nvfp4: e2m1 blocks of 16 with an e4m3 block scale and a per-tensor global scale). Weights
are given dequantized (fp32, local experts only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

F64 = torch.float64
FP8_MAX = 448.0
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F64)


# --------------------------------------------------------------------------------------- experts map
def expert_map(E: int, ep_size: int, ep_rank: int, placement: str) -> list[int]:
    """Global expert -> local index on rank ``ep_rank``, -1 where another rank owns it.
    linear: rank r owns [r * E_loc, (r + 1) * E_loc); round_robin: r, r + ep, r + 2 ep, ..."""
    n = E // ep_size
    owned = list(range(ep_rank * n, (ep_rank + 1) * n)) if placement == "linear" else \
        list(range(ep_rank, E, ep_size))
    m = [-1] * E
    for loc, g in enumerate(owned):
        m[g] = loc
    return m


# --------------------------------------------------------------------------------------- routing
@dataclass
class Routed:
    weights: torch.Tensor     # float64 [T, k]
    ids: torch.Tensor         # int64 [T, k], best first
    margin: float             # min over tokens of the selection gaps (inf when nothing is dropped)


def _gap(values: torch.Tensor, kept: int) -> float:
    """values [n] sorted descending: values[kept - 1] - values[kept] (inf if nothing after)."""
    if kept >= values.numel() or not math.isfinite(float(values[kept])):
        return math.inf
    return float(values[kept - 1] - values[kept])


def route(logits: torch.Tensor, k: int, *, scoring: str = "softmax", renormalize: bool = True,
          num_groups: Optional[int] = None, topk_groups: Optional[int] = None,
          correction_bias: Optional[torch.Tensor] = None, routed_scaling_factor: float = 1.0) -> Routed:
    """logits [T, E] (any float dtype) -> Routed (see the module docstring)."""
    T, E = logits.shape
    ids = torch.zeros(T, k, dtype=torch.int64)
    weights = torch.zeros(T, k, dtype=F64)
    margin = math.inf
    for t in range(T):
        z = logits[t].to(F64)                                                   # [E]
        if scoring == "sigmoid":
            scores = torch.sigmoid(z)
        elif scoring == "sqrtsoftplus":                                         # DeepSeek-V4 style
            scores = torch.sqrt(torch.log1p(torch.exp(z)))
        else:
            scores = torch.exp(z - z.max()) / torch.exp(z - z.max()).sum()
        sel = scores + correction_bias.to(F64) if correction_bias is not None else scores.clone()
        if num_groups is not None:
            per = E // num_groups
            gscore = []
            for g in range(num_groups):
                members = sorted(sel[g * per:(g + 1) * per].tolist(), reverse=True)
                gscore.append(sum(members[:2]) if correction_bias is not None else members[0])
            gs = torch.tensor(gscore, dtype=F64)
            order = torch.argsort(gs, descending=True)
            margin = min(margin, _gap(gs[order], topk_groups))
            keep = set(order[:topk_groups].tolist())
            for g in range(num_groups):
                if g not in keep:
                    sel[g * per:(g + 1) * per] = -math.inf
        order = torch.argsort(sel, descending=True)                             # [E]
        margin = min(margin, _gap(sel[order], k))
        chosen = order[:k]
        w = scores[chosen]
        if renormalize:
            w = w / w.sum()
        ids[t] = chosen
        weights[t] = w * routed_scaling_factor
    return Routed(weights, ids, margin)


# --------------------------------------------------------------------------------------- activations
def activation(g13: torch.Tensor, name: str, *, interleaved: bool = False, swiglu_limit: Optional[float] = None,
               alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """GEMM1's output [m, N] float64 -> h [m, I]."""
    silu = lambda v: v * torch.sigmoid(v)                                        # noqa: E731
    gelu = lambda v: 0.5 * v * (1 + torch.erf(v / math.sqrt(2)))                # noqa: E731
    gelu_tanh = lambda v: 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))  # noqa: E731
    if name.endswith("_no_mul"):
        return {"relu2_no_mul": lambda v: torch.clamp(v, min=0) ** 2, "silu_no_mul": silu,
                "gelu_no_mul": gelu}[name](g13)
    if interleaved:
        gate, up = g13[:, 0::2], g13[:, 1::2]
    else:
        n = g13.shape[1] // 2
        gate, up = g13[:, :n], g13[:, n:]
    if name == "silu":
        if swiglu_limit is not None:
            gate = torch.clamp(gate, max=swiglu_limit)
            up = torch.clamp(up, -swiglu_limit, swiglu_limit)
        return silu(gate) * up
    if name == "gelu":
        return gelu(gate) * up
    if name == "gelu_tanh":
        return gelu_tanh(gate) * up
    assert name == "swigluoai", name
    gate = torch.clamp(gate, max=limit)
    up = torch.clamp(up, -limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


# --------------------------------------------------------------------------------------- fake quant
def _fp8(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest float8 e4m3 value (saturating at +-448)."""
    return torch.clamp(v, -FP8_MAX, FP8_MAX).float().to(torch.float8_e4m3fn).to(F64)


def _floor(a: torch.Tensor) -> torch.Tensor:
    return torch.clamp(a, min=1e-12)


def _e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value (+-{0, .5, 1, 1.5, 2, 3, 4, 6}), ties to the even code."""
    d = (v.abs().clamp(max=6.0).unsqueeze(-1) - E2M1).abs()                      # [..., 8]
    best = d == d.min(dim=-1, keepdim=True).values
    pref = best.to(F64) * torch.tensor([2.0, 1.0] * 4, dtype=F64)               # even codes win ties
    return torch.sign(v) * E2M1[pref.argmax(dim=-1)]


def fake_quant(a: torch.Tensor, method: str, *, block_k: Optional[int] = None, pow2: bool = False,
               static_scale: Optional[float] = None) -> torch.Tensor:
    """a [m, K] float64: every row of one GEMM's input -> quantized and dequantized, float64."""
    if a.shape[0] == 0:
        return a
    if method == "fp8_tensor":
        s = static_scale if static_scale is not None else float(_floor(a.abs().max())) / FP8_MAX
        return _fp8(a / s) * s
    if method == "fp8_channel":
        s = _floor(a.abs().amax(dim=1, keepdim=True)) / FP8_MAX                  # [m, 1]
        return _fp8(a / s) * s
    if method == "int8_channel":
        s = _floor(a.abs().amax(dim=1, keepdim=True)) / 127
        return torch.clamp(torch.round(a / s), -127, 127) * s
    if method == "fp8_block":                                                    # 1 x block_k groups
        out = torch.empty_like(a)
        for c0 in range(0, a.shape[1], block_k):
            blk = a[:, c0:c0 + block_k]
            s = _floor(blk.abs().amax(dim=1, keepdim=True)) / FP8_MAX
            if pow2:
                s = torch.exp2(torch.ceil(torch.log2(s)))
            out[:, c0:c0 + block_k] = _fp8(blk / s) * s
        return out
    if method == "nvfp4":                                                        # blocks of 16
        gs = float(_floor(a.abs().max())) / (FP8_MAX * 6)
        out = torch.empty_like(a)
        for c0 in range(0, a.shape[1], 16):
            blk = a[:, c0:c0 + 16]
            bs = _fp8(blk.abs().amax(dim=1, keepdim=True) / 6 / gs) * gs         # [m, 1] e4m3 * global
            q = torch.where(bs > 0, _e2m1(blk / torch.where(bs > 0, bs, 1.0)), 0.0)
            out[:, c0:c0 + 16] = q * bs
        return out
    raise AssertionError(f"no activation quantization for {method}")


# --------------------------------------------------------------------------------------- the layer
@dataclass(frozen=True)
class ActQuant:
    """How a W8A8 scheme quantizes the GEMM inputs (None fields: none)."""

    method: str
    block_k: Optional[int] = None
    pow2: bool = False
    a13_scale: Optional[float] = None     # static fp8_tensor input scales
    a2_scale: Optional[float] = None
    h_group: Optional[int] = None         # GEMM2's input in fp8 1 x h_group groups instead


def moe(x: torch.Tensor, routed: Routed, w13: torch.Tensor, w2: torch.Tensor, *, activation_name: str,
        local: Sequence[int], b13: Optional[torch.Tensor] = None, b2: Optional[torch.Tensor] = None,
        weight_on_input: bool = False, act_quant: Optional[ActQuant] = None,
        round_to: Optional[torch.dtype] = None, round_at: frozenset = frozenset(), **act_kw) -> torch.Tensor:
    """out float64 [T, H] (see the module docstring).

    x [T, H]; w13 [E_loc, N, H], w2 [E_loc, H, I] (dequantized); ``local`` [E]: global ->
    local expert or -1 (a layer that processes T in chunks is this loop on each chunk: its
    per-tensor dynamic activation scales are per chunk); ``round_to`` / ``round_at``: round
    what ``round_at`` names to that dtype, as a kernel that stores it in 16 bits does: 'xw' the
    weighted input, 'g' GEMM1's output, 'h' GEMM2's input (before the activation quantization),
    'w' the weights and 'q' the fake-quantized GEMM inputs (a 16-bit engine running a quantized
    scheme: the emulation backend)."""
    T = x.shape[0]
    rnd = (lambda v, where: v.to(round_to).to(F64) if round_to is not None and where in round_at else v)  # noqa: E731
    H, I = w2.shape[1], w2.shape[2]
    w13, w2 = rnd(w13.to(F64), "w"), rnd(w2.to(F64), "w")
    xs = x.to(F64)                                                               # [T, H]
    if weight_on_input:
        xs = rnd(xs * routed.weights[:, :1], "xw")
    if act_quant is not None:
        xs = rnd(fake_quant(xs, act_quant.method, block_k=act_quant.block_k, pow2=act_quant.pow2,
                            static_scale=act_quant.a13_scale), "q")
    slots = [(t, j, local[int(routed.ids[t, j])]) for t in range(T) for j in range(routed.ids.shape[1])]
    slots = [s for s in slots if s[2] >= 0]                                      # not local: nothing
    hs = []
    for t, j, e in slots:
        g = rnd(xs[t:t + 1] @ w13[e].T, "g")                             # [1, N]
        if b13 is not None:
            g = rnd(g + b13[e].to(F64), "g")
        hs.append(activation(g, activation_name, **act_kw))                      # [1, I]
    h = torch.cat(hs) if hs else torch.zeros(0, I, dtype=F64)                   # [slots, I]
    h = rnd(h, "h")
    if act_quant is not None:
        if act_quant.h_group is not None:
            h = fake_quant(h, "fp8_block", block_k=act_quant.h_group)
        else:
            h = fake_quant(h, act_quant.method, block_k=act_quant.block_k, pow2=act_quant.pow2,
                           static_scale=act_quant.a2_scale)
        h = rnd(h, "q")
    out = torch.zeros(T, H, dtype=F64)
    for (t, j, e), hrow in zip(slots, h):
        y = hrow @ w2[e].T                                                       # [H]
        if b2 is not None:
            y = y + b2[e].to(F64)
        out[t] += y if weight_on_input else routed.weights[t, j] * y
    return out
