"""Launch plans: what the ``triton`` backend runs for one call, decided in one place.

For (config, scheme, platform, T) ``Planner.plan(T)`` returns a frozen ``LaunchPlan``: which
path runs (the decode kernels or the grouped GEMMs), their math, tiles and flags. The backend
(``backends/triton.py``) executes plans and binds their launches; ``fusedmoe explain`` prints
``LaunchPlan.describe()`` for each token bucket. Nothing else decides.

Inputs, and nothing more:
  * the rules below, with the measurement behind each beside it;
  * ``DEVICES``: per-device facts as data, keyed by device family (the GPU's name holds the
    key); an unknown GPU gets ``DEFAULT_DEVICE``;
  * tuned launch configs (``tuned_configs``: JSON per device and shape, FUSEDMOE_CONFIG_DIR);
  * one override for tuning and A/B work, ``FUSEDMOE_PLAN`` (a JSON object whose keys are the
    fields of ``PlanOverride``; docs/DEVELOPING.md lists them).

Kernels take every choice as an argument (a launch config dict and flags): they read no
environment variable and probe no device (``platform.py`` is the only probe).

Paths (T tokens, k slots, E local experts):
  decode   T*k <= ``decode_pairs``: two launches (GEMM1 per (pair, N tile) reading the
           expert ids itself, GEMM2 per (token, N tile) with the k-sum fused: no alignment,
           no reduce). W8A8 schemes keep x and h 16-bit up to ``DeviceFacts.a16_max_t``
           tokens ("a16": fewer launches, more accurate) and above run the tensor-core chain
           (quantize x, GEMM1, requantize h, GEMM2; kernels/decode_tc.py).
  grouped  otherwise: [quantize x] -> align -> GEMM1 (activation fused) -> [requantize h]
           -> GEMM2 (routing weight fused) -> k-sum (fixed-order reduce, or atomic adds into
           the output where measured faster and determinism was not asked for).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from functools import partial
from types import MappingProxyType
from typing import Mapping, Optional

import torch

from . import env
from .config import GateUpLayout, MoEConfig, QuantMethod
from .errors import ConfigError

QUANT_MODE = {QuantMethod.NONE: "none", QuantMethod.FP8_TENSOR: "tensor", QuantMethod.FP8_CHANNEL: "channel",
              QuantMethod.INT8_CHANNEL: "channel", QuantMethod.FP8_BLOCK: "block"}
# the selection report's token buckets, and its extra rows where the W8A8 decode math changes
BUCKETS = (1, 16, 64, 256, 1024, 4096, 16384)
DECODE_BUCKETS = (2, 3, 4, 8)


# ---------------------------------------------------------------------------------------
# Per-device facts. Each was measured on that GPU (fusedmoe bench, CUDA graphs, alternating
# rounds); a GPU not listed takes DEFAULT_DEVICE, the rules of the first Hopper measured.
@dataclass(frozen=True)
class DeviceFacts:
    family: str
    # largest T whose W8A8 decode runs in a16 math (x, h 16-bit against 8-bit weights) under
    # w8a8_decode 'auto'; the tensor-core chain above. H100 layer graph µs, a16 / tc: qwen3
    # fp8_channel T=3 47.1 / 46.7 (even: the more accurate wins), T=4 59.6 / 58.3; deepseek-v3
    # tp8 fp8_block T=2 39.1-40.5 / 40.5-41.2, T=3 56.0-57.4 / 54.8-56.0. H200: qwen3
    # fp8_channel T=2 27.2 / 27.0 (even), T=3 39.7 / 38.5; deepseek T=2 37.2 / 32.6.
    a16_max_t: Mapping = field(default_factory=dict)
    a16_max_t_other: int = 1
    # tc decode GEMM1 K steps of two block-scale groups where it takes its long-K stages
    # (deepseek-v3 tp8 fp8_block T=2..4, layer: H100 39.9 -> 39.4, 54.5 -> 53.8, 67.3 -> 66.4 µs;
    # H200 32.4 -> 31.9, 44.0 -> 43.0, 52.4 -> 51.6)
    tc_gemm1_block_groups: bool = False
    # lines of each weight row the tc GEMM1 hints into L2 before it waits for x (H100 qwen3
    # fp8_channel T=2..4 34.8 -> 34.2, 47.0 -> 46.4, 58.5 -> 58.0 µs; H200 deepseek 33.7 -> 33.4)
    tc_l2_pre_gemm1: int = 0
    # the a16 decode reading 8-bit weights as int32 words of four (W4) at T=1: per-channel
    # scales (H100 qwen3 fp8_channel 19.0 -> 18.5 µs, int8 21.8 -> 20.9; H200 int8 19.2 -> 18.3
    # but fp8 16.9 -> 17.2), block scales (H200 deepseek fp8_block 21.2 -> 20.7; H100 25.0 -> 25.5)
    w4_channel_fp8: bool = True
    w4_block: bool = False


DEVICES = {
    "H200": DeviceFacts("H200", MappingProxyType({QuantMethod.FP8_CHANNEL: 2}), 1,
                        tc_gemm1_block_groups=True, tc_l2_pre_gemm1=4, w4_channel_fp8=False, w4_block=True),
    "H100": DeviceFacts("H100", MappingProxyType({QuantMethod.FP8_CHANNEL: 3, QuantMethod.FP8_BLOCK: 2}), 1,
                        tc_gemm1_block_groups=True, tc_l2_pre_gemm1=4),
}
DEFAULT_DEVICE = DeviceFacts("other", DEVICES["H100"].a16_max_t, 1)


def device_facts(platform) -> DeviceFacts:
    """The DEVICES entry whose key the platform's GPU name holds, else DEFAULT_DEVICE."""
    name = getattr(platform, "name", "") or ""
    for key, facts in DEVICES.items():
        if key in name:
            return facts
    return DEFAULT_DEVICE


# ---------------------------------------------------------------------------------------
# The one override: FUSEDMOE_PLAN='{"w8a8_decode": "tc", "reduce": "deterministic"}'
_CHOICES = {"w8a8_decode": ("auto", "a16", "a8", "tc"), "h_quant": ("", "kernel", "epilogue"),
            "reduce": (None, "deterministic", "atomic", "atomic_out")}


@dataclass(frozen=True)
class PlanOverride:
    """Plan fields forced by FUSEDMOE_PLAN (None: the rule's). For tuning and A/B runs."""
    decode_pairs: Optional[int] = None        # largest T*k on the decode kernels (0: never)
    w8a8_decode: str = "auto"                 # W8A8 decode math: auto / a16 / a8 / tc
    decode_pdl: bool = True                   # decode GEMM2 (W8A8: the chain) as PDL launches
    prefill_pdl: bool = True                  # the grouped path as a PDL chain
    decode_tiles: Optional[int] = None        # N tiles a CUDA-core decode GEMM2 program takes
    decode_a3: Optional[bool] = None          # decode GEMM2 activation rows in the weights' layout
    decode_slots_first: Optional[bool] = None  # decode GEMM2 weight tile in triton 3.6's layout
    decode_w4: Optional[bool] = None          # a16 decode reading 8-bit weights as words
    decode_share: Optional[bool] = None       # tc decode GEMMs reading an expert once for its pairs
    tc_l2_pre: Optional[tuple] = None         # (GEMM1 lines, GEMM2 slots) hinted into L2
    h_quant: str = ""                         # grouped W8A8: h quantized by 'kernel' / GEMM1 'epilogue'
    reduce: Optional[str] = None              # grouped k-sum when determinism is not asked for
    fast_launch: bool = True                  # the cached Triton launcher (kernels/launcher.py)

    @classmethod
    def parse(cls, text: Optional[str]) -> "PlanOverride":
        """From FUSEDMOE_PLAN's JSON text (None / empty: no override); a clear error otherwise."""
        if not text:
            return cls()
        fix = "unset FUSEDMOE_PLAN, or see docs/DEVELOPING.md for its keys"
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise ConfigError("FUSEDMOE_PLAN", text, "a JSON object", f"{fix} ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError("FUSEDMOE_PLAN", text, "a JSON object", fix)
        names = {f.name: f for f in fields(cls)}
        out = {}
        for key, v in raw.items():
            if key not in names:
                raise ConfigError("FUSEDMOE_PLAN", key, sorted(names), fix)
            out[key] = _check_key(key, v, fix)
        return cls(**out)


def _check_key(key: str, v, fix: str):
    where = f"FUSEDMOE_PLAN[{key!r}]"
    if key in _CHOICES:
        v = v.lower() if isinstance(v, str) else v
        if v not in _CHOICES[key]:
            raise ConfigError(where, v, [c for c in _CHOICES[key] if c], fix)
        return v
    if key == "tc_l2_pre":
        v = [v, v] if isinstance(v, int) and not isinstance(v, bool) else v
        if (not isinstance(v, (list, tuple)) or len(v) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v)):
            raise ConfigError(where, v, "two integers >= 0 [G1, G2] (or one for both)", fix)
        return tuple(v)
    if key in ("decode_pairs", "decode_tiles"):
        least = 0 if key == "decode_pairs" else 1
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ConfigError(where, v, f"an integer >= {least}", fix)
        return v
    if not isinstance(v, bool):
        raise ConfigError(where, v, "true or false", fix)
    return v


def override() -> PlanOverride:
    """FUSEDMOE_PLAN, parsed (read at construction, never in the forward pass)."""
    return PlanOverride.parse(env.plan())


# ---------------------------------------------------------------------------------------
# Rules
def decode_pairs(config: MoEConfig, math: str = "16bit", forced: Optional[int] = None) -> int:
    """Largest T*k the decode kernels serve. One token always; more while most pairs hit
    distinct experts, so reading weights per pair instead of per expert costs little. H100
    bf16, graphs: qwen3 (E 128) T=1 39.0 -> 29.9 µs, T=8 loses 8%; deepseek tp8 (E 256) T=8
    244 -> 229, T=16 loses 11%; Mixtral (E 8, k 2) T=2 loses 7%: max(k, E // 4). W8A8 a16
    (16-bit x, h): qwen3 T=4 61 vs 72 µs (grouped), T=8 even: min(E // 4, 32); a8 (x, h
    quantized by their own kernels, 4 launches): E // 16; the tensor-core chain wins up to
    E / 2 pairs (deepseek fp8_block T=16 232 vs 252 µs): min(E // 2, 128) for E >= 64."""
    if forced is not None:
        return forced
    E, k = config.num_local_experts, config.top_k
    tc = min(E // 2, 128) if E >= 64 else E // 4
    return max(k, {"16bit": E // 4, "a16": min(E // 4, 32), "a8": E // 16, "tc": tc, "auto": tc}[math])


def a16_max_t(scheme, facts: DeviceFacts) -> int:
    """Largest T whose W8A8 decode runs in a16 math under 'auto' (DeviceFacts.a16_max_t)."""
    return facts.a16_max_t.get(scheme.method, facts.a16_max_t_other)


def pdl_ok(platform) -> bool:
    """Programmatic dependent launches: CUDA sm90+ and a Triton with griddepcontrol."""
    if platform.kind != "cuda" or platform.sm < 90:
        return False
    from .kernels.common import HAS_GDC
    return HAS_GDC


# The grouped path as one PDL chain gains 1.5-3 µs at 2-64 pairs per expert (H100 bf16: qwen3
# T=64 400.2 -> 398.7, deepseek tp8 818.8 -> 816.3) and loses 2-3% at 128-1024 (T=4096: qwen3
# 901.2 -> 928.4, deepseek tp8 1616.7 -> 1651.4)
PREFILL_PDL_MAX_M = 64

# The k-sum as atomic adds straight into the 16-bit output (no y [T*k, H], no reduce kernel):
# 2-7% faster (H100: qwen3 bf16 / fp8 / int8 T = 1024..16384, Mixtral T >= 4096, deepseek tp8
# up to T = 4096) from 64 pairs per local expert on, and 3-6% slower on y of 940M elements
# (deepseek tp8 T=16384) unless GEMM2 walks the output in column bands that stay in L2
# (A_RESIDENT + BAND_MAJOR: bf16 3956 -> 3626 µs, fp8_block 3092 -> 2778).
ATOMIC_OUT_MIN_M = 64
ATOMIC_OUT_MAX_Y = 1 << 29
# With the atomic k-sum the output must be zeroed first: by the quantization of x (same rows,
# no launch of its own) or a fill before the alignment, so GEMM2 stays in the PDL chain; for
# outputs above this many elements by GEMM1 on the side, a share a tile (H100 deepseek tp8
# fp8_block T=16384 2699 -> 2676 µs; at T=4096 it lost 0.6%, so only the largest outputs).
ZERO_IN_GEMM1_MIN = 1 << 26
# fp8_channel's h quantized in GEMM1's epilogue uses 1 x 128 groups (finer than its
# per-token rule); off unless asked: 3-19% slower at T >= 4096 on the H100
H_GROUP_CHANNEL = 128


def reduce_rule(config: MoEConfig, platform, T: int, gemm2_config: Optional[Mapping] = None) -> str:
    """The grouped k-sum for T tokens when determinism was not asked for: 'atomic_out' or
    'deterministic' (the figures above ATOMIC_OUT_MIN_M)."""
    banded = bool(gemm2_config and gemm2_config.get("A_RESIDENT") and gemm2_config.get("BAND_MAJOR"))
    if (platform.kind == "cuda" and config.torch_dtype in (torch.bfloat16, torch.float16)
            and T * config.top_k >= ATOMIC_OUT_MIN_M * config.num_local_experts
            and (banded or T * config.top_k * config.hidden_size <= ATOMIC_OUT_MAX_Y)):
        return "atomic_out"
    return "deterministic"


def h_epilogue_on(scheme, h_quant: str) -> bool:
    """Whether GEMM1's epilogue quantizes h: asked for ('epilogue'), or by default for
    fp8_block, whose own 1 x 128 rule it applies (H100 deepseek tp8 T=1024 / 4096 / 16384:
    732 -> 729, 1010 -> 1007, 2763 -> 2762 µs)."""
    if scheme.method == QuantMethod.FP8_BLOCK:
        return h_quant in ("", "epilogue")
    return scheme.method == QuantMethod.FP8_CHANNEL and h_quant == "epilogue"


def h_epilogue_group(scheme, c1: Mapping, c2: Mapping) -> int:
    """1 x g groups GEMM1's epilogue can quantize h in with these configs, 0 if none: whole
    groups per GEMM1 tile and one scale per GEMM2 K tile."""
    if scheme.method == QuantMethod.FP8_BLOCK:
        g = scheme.block_shape[1]
    elif scheme.method == QuantMethod.FP8_CHANNEL:
        g = H_GROUP_CHANNEL
    else:
        return 0
    return g if c1["BLOCK_SIZE_N"] % g == 0 and g % c2["BLOCK_SIZE_K"] == 0 else 0


def w4_wanted(T: int, block: bool, fp8: bool, facts: DeviceFacts) -> bool:
    """The a16 decode reads 8-bit weights as words at one token where DeviceFacts says so."""
    return T == 1 and (facts.w4_block if block else (facts.w4_channel_fp8 or not fp8))


# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchPlan:
    """What one call of T tokens runs. ``path`` 'decode': ``math`` ('16bit', 'a16', 'a8' or
    'tc'), ``pdl`` (GEMM2 a programmatic dependent launch of GEMM1) and ``chain`` (W8A8: every
    launch after the first one); 'grouped': ``block_m`` (the alignment's block), ``reduce``,
    ``zero`` (who zeroes an atomic output: 'gemm1', 'early' (the quantization of x or a fill
    before the alignment) or ''), ``pdl`` (the chain), ``h_group`` (GEMM1's epilogue
    quantizes h in 1 x g groups), ``sorted_x`` / ``sorted_h`` and ``mask_a``. ``gemm1`` /
    ``gemm2``: the launch configs the kernels take (read-only)."""
    T: int
    path: str
    gemm1: Mapping
    gemm2: Mapping
    math: str = "16bit"
    pdl: bool = False
    chain: bool = False
    quantizes_activations: bool = False
    block_m: int = 0
    reduce: str = "deterministic"
    reduce_forced: bool = False
    zero: str = ""
    h_group: int = 0
    sorted_x: bool = False
    sorted_h: bool = False
    mask_a: tuple = (False, False)
    decode_pairs: int = 0
    share: bool = False

    def __hash__(self) -> int:
        # the backend keys its workspace specs by plan: gemm1 / gemm2 (read-only mappings, not
        # hashable themselves) by their items; computed once per plan
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(tuple(sorted(v.items())) if isinstance(v, Mapping) else v
                           for v in (getattr(self, f.name) for f in fields(self))))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def a16(self) -> bool:
        return self.math in ("16bit", "a16")

    @property
    def tc(self) -> bool:
        return self.math == "tc"


def _ro(c: Mapping) -> Mapping:
    return MappingProxyType(dict(c))


class Planner:
    """Plans for one (config, scheme, platform): ``plan(T)``, memoized per T."""

    MAX_PLANS = 256

    def __init__(self, config: MoEConfig, scheme, platform, *, deterministic: bool = False,
                 launch_configs=None, forced: Optional[PlanOverride] = None):
        self.config, self.scheme, self.platform = config, scheme, platform
        self.forced = forced if forced is not None else override()
        self.facts = device_facts(platform)
        self.deterministic = deterministic
        self.quantized = scheme.method != QuantMethod.NONE
        self.quant_mode = QUANT_MODE.get(scheme.method, "none")
        self.math = self.forced.w8a8_decode if self.quantized else "16bit"
        self.decode_pairs = decode_pairs(config, self.math, self.forced.decode_pairs)
        self.a16_max_t = a16_max_t(scheme, self.facts)
        pdl = pdl_ok(platform)
        self.decode_pdl = pdl and self.forced.decode_pdl
        self.prefill_pdl = pdl and self.forced.prefill_pdl
        self.h_epilogue = h_epilogue_on(scheme, self.forced.h_quant)
        self.num_sms = (platform.num_sms or 132) if platform.kind == "cuda" else 4
        self._lc = launch_configs
        self._plans: dict = {}

    @property
    def launch_configs(self):
        if self._lc is None:
            self._lc = make_launch_configs(self.config, self.scheme, self.platform)
        return self._lc

    def plan(self, T: int) -> LaunchPlan:
        p = self._plans.get(T)
        if p is None:
            if len(self._plans) >= self.MAX_PLANS:
                self._plans.clear()
            p = self._plans[T] = (self._decode(T) if T * self.config.top_k <= self.decode_pairs
                                  else self._grouped(T))
        return p

    # -- decode ----------------------------------------------------------------------
    def decode_math(self, T: int) -> str:
        m = self.math
        if m in ("16bit", "a16") or (m == "auto" and T <= self.a16_max_t):
            return "16bit" if not self.quantized else "a16"
        return "tc" if m in ("tc", "auto") else "a8"

    def _decode(self, T: int) -> LaunchPlan:
        math = self.decode_math(T)
        a16 = math in ("16bit", "a16")
        chain = (not a16 and self.scheme.method != QuantMethod.FP8_TENSOR and self.decode_pdl)
        pdl = self.decode_pdl if a16 else chain
        if math == "tc":
            c1, c2, share = self._tc_configs(T, waits=chain)
        else:
            c1, c2 = self._cuda_core_configs(T, a16)
            share = False
        return LaunchPlan(T, "decode", _ro(c1), _ro(c2), math=math, pdl=pdl, chain=chain,
                          quantizes_activations=not a16, decode_pairs=self.decode_pairs, share=share)

    def _cuda_core_configs(self, T: int, a16: bool):
        from .kernels import decode as dk
        from .kernels.launcher import cdiv, next_power_of_2
        c, q, f = self.config, self.scheme, self.forced
        esize = 1 if self.quantized else c.torch_dtype.itemsize
        gk = q.block_shape[1] if q.method == QuantMethod.FP8_BLOCK else None
        H, I, k = c.hidden_size, c.intermediate_size, c.top_k
        kp = next_power_of_2(k)
        c1 = dk.decode_config(2 if c.is_gated else 1, T * k, I, H, esize, self.num_sms, gk)
        c2 = dk.decode_config(kp, T, H, I, esize, self.num_sms, gk, gemm2=True)
        c2["TILES"] = (f.decode_tiles if f.decode_tiles is not None
                       else dk.gemm2_tiles(T * cdiv(H, c2["BLOCK_N"]), self.num_sms, esize, cdiv(I, c2["BLOCK_K"])))
        c2["A3"] = f.decode_a3 if f.decode_a3 is not None else dk.gemm2_a3(esize, kp)
        c2["SLOTS_FIRST"] = f.decode_slots_first if f.decode_slots_first is not None else dk.gemm2_slots_first()
        if self.quantized and a16:
            block = q.method == QuantMethod.FP8_BLOCK or q.group_size is not None
            fp8 = q.method not in (QuantMethod.INT8_CHANNEL, QuantMethod.INT8_W8A16)
            want = f.decode_w4 if f.decode_w4 is not None else w4_wanted(T, block, fp8, self.facts)
            # fp8 words convert through e4m3x2 PTX: sm89+
            want = bool(want) and self.platform.kind == "cuda" and (not fp8 or self.platform.sm >= 89)
            c1["W4"] = c2["W4"] = want
        else:
            c1["W4"] = c2["W4"] = False
        return c1, c2

    def _tc_configs(self, T: int, waits: bool):
        from .kernels import decode_tc as tc
        c, q, f = self.config, self.scheme, self.forced
        gk = q.block_shape[1] if q.method == QuantMethod.FP8_BLOCK else None
        k, E, I = c.top_k, c.num_local_experts, c.intermediate_size
        # both GEMMs share experts or neither (one table, written before GEMM1)
        share = f.decode_share if f.decode_share is not None else tc.tc_share(T * k, k, E, I)
        c1 = tc.tc_config("gemm1", T * k, I, c.hidden_size, k, c.is_gated, gk, self.num_sms, share=share,
                          block_groups=self.facts.tc_gemm1_block_groups)
        c2 = tc.tc_config("gemm2", T, c.hidden_size, I, k, group_k=gk, num_sms=self.num_sms, share=share)
        if f.tc_l2_pre is not None:
            l1, l2 = f.tc_l2_pre
        else:
            l1 = 0 if c1["SHARE"] else self.facts.tc_l2_pre_gemm1
            l2 = 0
        # the hints only overlap a wait for the kernel before (PDL)
        c1["L2_PRE"], c2["L2_PRE"] = (l1, l2) if waits and self.platform.kind == "cuda" else (0, 0)
        return c1, c2, bool(c1["SHARE"] or c2["SHARE"])

    # -- grouped ---------------------------------------------------------------------
    def configs(self, T: int):
        """(GEMM1, GEMM2) launch configs at T: the tuned / default pair, GEMM2 taking GEMM1's
        BLOCK_SIZE_M where the two do not divide each other (they share one alignment)."""
        c1, c2 = self.launch_configs.get(T)
        b1, b2 = c1["BLOCK_SIZE_M"], c2["BLOCK_SIZE_M"]
        if max(b1, b2) % min(b1, b2):
            c2 = dict(c2, BLOCK_SIZE_M=b1)
        return c1, c2

    def _grouped(self, T: int) -> LaunchPlan:
        from .kernels.grouped_gemm import mask_a_rule, sorted_h, sorted_x
        c, f = self.config, self.forced
        c1, c2 = self.configs(T)
        bm = max(c1["BLOCK_SIZE_M"], c2["BLOCK_SIZE_M"])
        forced = not self.deterministic and f.reduce is not None
        reduce = ("deterministic" if self.deterministic else f.reduce
                  or reduce_rule(c, self.platform, T, c2))
        zero = ""
        if reduce == "atomic_out":
            zero = "gemm1" if T * c.hidden_size > ZERO_IN_GEMM1_MIN else "early"
        g = h_epilogue_group(self.scheme, c1, c2) if self.h_epilogue else 0
        if g and self.quant_mode == "channel":
            # group scales of h with channel scales of w2: GEMM2 rescales its accumulator per K group
            c2 = dict(c2, RESCALE=c2.get("RESCALE", True))
        pairs = T * c.top_k
        mask = tuple(not cg.get("A_RESIDENT") and mask_a_rule(cg, pairs, c.num_local_experts, cg["BLOCK_SIZE_M"])
                     for cg in (c1, c2))
        return LaunchPlan(T, "grouped", _ro(c1), _ro(c2), math="16bit" if not self.quantized else "a8",
                          pdl=self.prefill_pdl and pairs <= PREFILL_PDL_MAX_M * c.num_local_experts,
                          quantizes_activations=self.quantized, block_m=bm, reduce=reduce, reduce_forced=forced,
                          zero=zero, h_group=g, sorted_x=not g and self.quant_mode == "none" and sorted_x(c1),
                          sorted_h=not g and self.quant_mode == "none" and sorted_h(c2), mask_a=mask,
                          decode_pairs=self.decode_pairs)

    def h_group(self, T: int) -> Optional[int]:
        """1 x g where a call of T tokens quantizes h in groups finer than the scheme's rule
        (fp8_channel with the epilogue quantization; ``reference_moe(..., h_group=)``)."""
        p = self.plan(T)
        return p.h_group or None if p.path == "grouped" and self.quant_mode == "channel" else None

    # -- explain ---------------------------------------------------------------------
    def report(self) -> dict:
        """{'source': where the launch configs come from, 'T=n': the plan, described} for the
        selection report's buckets (and the W8A8 decode rows where the math changes)."""
        out = {"source": self.launch_configs.describe()}
        extra = [T for T in DECODE_BUCKETS if self.quantized and T * self.config.top_k <= self.decode_pairs]
        for T in sorted(set(BUCKETS) | set(extra)):
            out[f"T={T}"] = describe(self.plan(T), self)
        return out


def _default_configs(dt, gated, n13, nsm, block_shape, T, E, N, H, top_k, tag):
    from .kernels.grouped_gemm import default_config
    return {g: default_config(T, E, n13, H, top_k, dt, gemm=g, gated=gated, num_sms=nsm, block_shape=block_shape)
            for g in ("gemm1", "gemm2")}


def make_launch_configs(config: MoEConfig, scheme, platform):
    """The tuned launch configs for this shape and GPU, with the shape-aware defaults behind
    (a partial of a module-level function, so that the configs pickle)."""
    from .tuned_configs import LaunchConfigs
    lc = LaunchConfigs.for_config(config, scheme, platform)
    # fp8_block: the default BLOCK_SIZE_K divides the scale group (the kernels need one scale a K tile)
    bs = tuple(scheme.block_shape) if scheme.method == QuantMethod.FP8_BLOCK else None
    lc.default_fn = partial(_default_configs, config.torch_dtype, config.is_gated, config.n13, platform.num_sms or 132,
                            bs)
    return lc


# ---------------------------------------------------------------------------------------
# The plan in words (fusedmoe explain)
def _extras(c: Mapping) -> str:
    out = " tma" if c.get("USE_TMA") else ""
    if c.get("GU_ONE_DOT"):
        out += " one-dot"
    if c.get("A_RESIDENT"):
        out += f" A-resident x{c['A_RESIDENT']}"
    if c.get("PERSISTENT"):
        out += f" persistent{c['PERSISTENT']}" + (" flat" if c.get("FLATTEN") else "")
    if c.get("RESCALE"):
        out += " rescale"
    if c.get("HALF_TAIL"):
        out += " half-tail"
    if c.get("BAND_MAJOR"):
        out += " column-band-major"
    if c.get("SORTED_X"):
        out += " sorted-x"
    if c.get("SORTED_H") and not c.get("A_RESIDENT"):
        out += " sorted-h"
    return out


def _describe_decode(p: LaunchPlan, pl: Planner) -> str:
    quant, c1, c2 = pl.scheme, p.gemm1, p.gemm2
    mode = pl.math
    if p.share:
        body = ("GEMM1 and GEMM2 per (expert, N tile): each expert's weight tiles read once for all its pairs "
                "(up to 16 a program, decode_share), no align; GEMM2's k-sum in slot order by each token's last "
                "program, no reduce")
    else:
        body = ("GEMM1 per (pair, N tile), no align; GEMM2 per (token, N tile) with the k-sum fused, no reduce")
    s = f"decode kernels (T*k <= {p.decode_pairs} pairs): " + body
    if not p.tc:
        nt = c2.get("TILES", 1)
        s += (f"; GEMM1 BN{c1['BLOCK_N']}xBK{c1['BLOCK_K']}, GEMM2 BN{c2['BLOCK_N']}xBK{c2['BLOCK_K']}"
              + (f" x{nt} N tiles a program" if nt > 1 else "")
              + (" (h rows in the weight tile's layout, A3)" if c2.get("A3") else "")
              + (" (slots first)" if c2.get("SLOTS_FIRST") else ""))
    if p.math == "a16":
        s += f"; 8-bit weights, 16-bit activations (w8a8_decode={mode}: no activation quantization at this T)"
        if c1.get("W4") and pl.config.hidden_size % 16 == 0 and pl.config.intermediate_size % 16 == 0:
            s += "; the weights read as int32 words of four, converted by PTX (decode_w4)"
    if p.tc:
        s += f"; 8-bit x 8-bit GEMMs on the tensor cores (w8a8_decode={mode}, kernels/decode_tc.py)"
        g1, g2 = c1.get("L2_PRE", 0), (0 if p.share else c2.get("L2_PRE", 0))
        parts = ([f"GEMM1 asks L2 for the first {g1} lines of its weight rows"] if g1 else []) + (
            [f"GEMM2 for its first {g2} slots' rows"] if g2 else [])
        if parts:
            s += f"; before their waits, {' and '.join(parts)} (tc_l2_pre)"
        gk = quant.block_shape[1] if quant.method == QuantMethod.FP8_BLOCK and quant.block_shape else 0
        if gk and not p.share and c1["BLOCK_K"] // gk > 1:
            s += (f"; GEMM1's K steps read {c1['BLOCK_K'] // gk} scale groups of {gk} each ({c1['num_stages']} "
                  "stages, tc_gemm1_block_groups: measured on this GPU)")
    if p.pdl:
        s += ("; quantize x, GEMM1, requantize h, GEMM2 as one programmatic dependent launch chain" if p.chain
              or not p.a16 else "; GEMM2 a programmatic dependent launch of GEMM1")
    return s


def _describe_grouped(p: LaunchPlan, pl: Planner) -> str:
    c1, c2, quant = p.gemm1, p.gemm2, pl.scheme
    s = (f"gemm1 BM{c1['BLOCK_SIZE_M']}xBN{c1['BLOCK_SIZE_N']}xBK{c1['BLOCK_SIZE_K']} "
         f"w{c1.get('num_warps', 4)}s{c1.get('num_stages', 3)}{_extras(c1)}; gemm2 BM{c2['BLOCK_SIZE_M']}x"
         f"BN{c2['BLOCK_SIZE_N']}xBK{c2['BLOCK_SIZE_K']} split{c2.get('SPLIT_K', 1)}{_extras(c2)}")
    if p.h_group:
        s += (f"; h quantized in GEMM1's epilogue (fp8, 1 x {p.h_group} groups"
              + (", finer than the scheme's per-token rule" if quant.method == QuantMethod.FP8_CHANNEL else "")
              + "; h_quant)")
    masked = [n for n, m in zip(("GEMM1", "GEMM2"), p.mask_a) if m]
    if masked:
        s += f"; {' and '.join(masked)} padding rows load nothing (MASK_A: <= 4 blocks of pairs an expert)"
    if p.reduce != "deterministic":
        why = f"FUSEDMOE_PLAN reduce={p.reduce}" if p.reduce_forced else "measured faster here"
        s += (f"; GEMM2's k-sum as atomic adds into {'the output' if p.reduce == 'atomic_out' else 'an fp32 buffer'} "
              f"({why}; not bitwise reproducible: deterministic=True keeps the fixed-order reduce)")
    if p.zero == "gemm1":
        s += "; the output zeroed by GEMM1 on the side (a share a tile; > 2^26 elements)"
    elif p.zero == "early":
        s += ("; the output zeroed by the quantization of x (same launch)" if pl.quantized
              else "; the output zeroed ahead of the alignment")
    if p.pdl:
        s += ("; the alignment's scan and scatter (> 512 pairs), GEMM1, GEMM2 and the reduce (and a "
              "requantization between) as programmatic dependent launches" if p.reduce == "deterministic"
              else "; the alignment's scan and scatter (> 512 pairs), GEMM1 (and the requantization after it) "
              "and GEMM2 as programmatic dependent launches" if p.zero
              else "; the alignment's scan and scatter (> 512 pairs) and GEMM1 (and the requantization after "
              "it) as programmatic dependent launches; GEMM2 an ordinary launch after the output's zeroing")
    return s


def describe(p: LaunchPlan, planner: Planner) -> str:
    """One line of ``fusedmoe explain`` for plan ``p``."""
    return _describe_decode(p, planner) if p.path == "decode" else _describe_grouped(p, planner)


def check(config: MoEConfig, quant, platform) -> list:
    """What the plans cannot serve, as (code, text) pairs (the backend's spec check)."""
    r = []
    if platform.kind == "cpu" and config.dtype == "bfloat16":
        r.append(("dtype", "the Triton interpreter computes bf16 dots wrongly; use float16/float32 on CPU"))
    if quant.method == QuantMethod.FP8_BLOCK:
        bn, bk = quant.block_shape
        if config.gate_up_layout == GateUpLayout.INTERLEAVED:
            r.append(("layout", "fp8_block weight blocks cannot be de-interleaved (swigluoai)"))
        if bk % 16 or bn % 16:
            r.append(("block_shape", f"block_shape {quant.block_shape} must be multiples of 16"))
        elif platform.kind == "cuda" and bk % 32:
            # the grouped GEMMs' and the tensor-core decode's BLOCK_K divides bk (one scale a K
            # step), and Triton's 8-bit dots on NVIDIA need K >= 32 (min_dot_size in
            # triton/backends/nvidia/compiler.py): no BLOCK_K fits a bk that 32 does not divide
            r.append(("block_shape", f"block_shape {quant.block_shape}: bk={bk} must be a multiple of 32 on "
                                     "CUDA (BLOCK_K divides bk, and Triton's fp8 dots need K >= 32)"))
        if config.intermediate_size % bn or config.hidden_size % bk:
            r.append(("block_shape", f"H={config.hidden_size} and I={config.intermediate_size} must be "
                                     f"multiples of the block {quant.block_shape} (gate/up tiles share blocks)"))
    return r


__all__ = ["BUCKETS", "DEVICES", "DEFAULT_DEVICE", "DeviceFacts", "LaunchPlan", "PlanOverride", "Planner",
           "describe", "device_facts", "override", "replace"]
