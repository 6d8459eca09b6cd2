"""``triton``: fusedmoe's Triton grouped-GEMM experts, standard format.

Two paths, chosen per call by the pair count T*k (the selection report lists them per T):
  decode  (T*k <= max(k, E // 4); W8A8 by FUSEDMOE_W8A8_DECODE, see decode_pairs: auto
          (default) / tc max(k, min(E // 2, 128)) for E >= 64; FUSEDMOE_DECODE_PAIRS overrides):
          kernels/decode.py, two launches (16-bit on sm90+: GEMM2 a programmatic dependent
          launch of GEMM1, FUSEDMOE_DECODE_PDL; both bound per shape, launcher.Bound, and
          served through ModularKernel's ``direct`` hook: little host time per eager call):
          GEMM1 per (pair, N tile) reading the expert ids itself (no align), and GEMM2 per
          (token, N tile) summing the token's k slots in a fixed order (no reduce kernel,
          deterministic). Below the bound most pairs hit distinct experts, so reading
          weights per pair instead of per expert costs little. H100, bf16, CUDA graphs
          (docs/BENCHMARKS.md): qwen3 (E 128) T=1 39.0 -> 29.9 us, T=4 108 -> 100, T=8
          loses 8%; deepseek tp8 (E 256) T=1 47.1 -> 34.6, T=8 244 -> 229, T=16 loses 11%;
          Mixtral (E 8, k 2) T=1 244 -> 230, T=2 loses 7%: hence max(k, E // 4). W8A8
          (x and h quantized by their own kernels, 4 launches) gains less: qwen3
          fp8_channel T=1 31.5 = 31.5, T=4 loses 27%; deepseek fp8_block T=1 46.2 -> 33.4,
          T=4 loses 10%: max(k, E // 16). (Session 3 figures; since then, as a PDL chain:
          qwen3 fp8_channel T=1 20.5 us, deepseek fp8_block 26.9.) Session 5: W8A8 keeps x
          and h 16-bit at decode by default (FUSEDMOE_W8A8_DECODE=a16; two launches, PDL):
          T=1 graphs qwen3 fp8_channel 20.4 -> 18.1 us, int8 19.9 -> 19.4, fp8_tensor 31.1 ->
          18.2, deepseek fp8_block 26.7 -> 25.0; eager 105-190 -> 31-35 us. Against the
          grouped path: qwen3 T=4 61 vs 72 us, T=8 equal; deepseek T=4 86 vs 88, T=8 165 vs
          154: hence min(E // 4, 32) pairs. Session 7: the tensor-core decode GEMMs
          (kernels/decode_tc.py, x and h quantized, PDL chain) win from T=2 on: deepseek
          fp8_block T=8 122 us vs 153 (grouped) / 165 (a16), T=16 232 vs 252; qwen3
          fp8_channel T=8 104 vs 114 / 113, T=16 loses to the grouped path (192 vs 153): hence
          'auto' = a16 for one token, tc up to min(E // 2, 128) pairs. Session 29: with the
          8-bit a16 tiles retuned, 'auto' takes a16 up to T = 3 for fp8_channel and T = 2 for
          fp8_block: qwen3 fp8_channel T=2 34.9 -> 32.4-33.4 us, T=3 48.9 -> 44.7-45.8
          (auto_a16_max_t). Session 30: fp8_channel up to T = 4 on the H100 (3 from session 34); on the H200
          fp8_channel up to T = 3, fp8_block one token (auto_a16_max_t(quant, platform)). The
          tc GEMMs read an expert's weights once for all its pairs from E / 2 pairs on where
          I >= 512 (kernels/decode_tc.py tc_share: qwen3 fp8 T=8 103.3 -> 97.2 us).
  grouped (otherwise), below.

Grouped, per call (T tokens): [quantize x for W8A8 schemes] -> align (1 launch for T*k <=
512 = align.SMALL_MAX, else 3) -> GEMM1 with the gated activation fused in its epilogue -> [requantize
GEMM2's input for W8A8 schemes] ->
GEMM2 with the routing weight fused -> the sum over k: a reduce kernel in a fixed order
(bitwise reproducible; always with deterministic=True), or, where ``reduce_rule`` says so
(large T on CUDA), GEMM2's epilogue adding into the zeroed output atomically. No host sync;
every buffer comes from the declared workspace (except the align kernel's small count
scratch when T*k > 4096).

Launch configs: tuned JSON for (device, E, N, scheme, dtype) when shipped or in
FUSEDMOE_CONFIG_DIR, looked up by nearest T (loaded once, here); shape-aware defaults
otherwise (decode: BM 16 + split-K on GEMM2; prefill: BM 64/128 tiles). The selection
report lists the kernel variant per token bucket.

Weights: swigluoai's interleaved gate/up rows are de-interleaved into halves once at load
(the kernel reads gate rows [0, I) and up rows [I, 2I)).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import env
from ..config import GateUpLayout, MoEConfig, QuantMethod
from ..modular.interfaces import ActivationFormat, Experts, NoOpWeightAndReduce, WorkspaceSpec
from ..modular.prepare_finalize import quantize_activation
from ..weights import ExpertWeights
from .registry import BackendSpec, Reason, register

QUANT_MODE = {QuantMethod.NONE: "none", QuantMethod.FP8_TENSOR: "tensor", QuantMethod.FP8_CHANNEL: "channel",
              QuantMethod.INT8_CHANNEL: "channel", QuantMethod.FP8_BLOCK: "block"}
_8BIT_DTYPE = {QuantMethod.FP8_TENSOR: torch.float8_e4m3fn, QuantMethod.FP8_CHANNEL: torch.float8_e4m3fn,
               QuantMethod.FP8_BLOCK: torch.float8_e4m3fn, QuantMethod.INT8_CHANNEL: torch.int8}
BUCKETS = (1, 16, 64, 256, 1024, 4096, 16384)
# the selection report's extra rows where the W8A8 decode math changes (a16 / tc / SHARE, per
# platform): listed when the decode kernels serve them
DECODE_BUCKETS = (2, 3, 4, 8)
# FUSEDMOE_H_QUANT=epilogue: fp8_channel's h leaves GEMM1 in 1 x 128 fp8 groups (fp8_block's in
# its own 1 x bk); a finer grid than fp8_channel's per-token rule, so the reference is told
# (TritonExperts.h_group, reference_moe(..., h_group=)). Not the default: H100, fusedmoe bench,
# two rounds (docs/BENCHMARKS.md, ninth session): qwen3 fp8_channel T=4096 616 -> 689 us,
# T=16384 1908 -> 2285; deepseek-v3 tp8 fp8_block T=4096 1265 -> 1324, T=16384 3752 -> 3860;
# T=1024 even. GEMM2 with group-scaled h must scale its accumulator per K group (RESCALE),
# which per-token scales never need; GEMM1's epilogue grows.
H_GROUP_CHANNEL = 128
# fp8 tensor cores arrive with sm89 (Ada/Hopper); int8 ones with sm80
QUANT_MIN_SM = {QuantMethod.FP8_TENSOR: 89, QuantMethod.FP8_CHANNEL: 89, QuantMethod.FP8_BLOCK: 89,
                QuantMethod.INT8_CHANNEL: 80}


class DecodeMode(NamedTuple):
    """How the decode kernels run a call: ``a16`` (x and h stay 16-bit: the weight-only math
    of W8A8 schemes, and 16-bit schemes), ``tc`` (the tensor-core GEMMs of
    kernels/decode_tc.py on quantized x and h), ``pdl`` (GEMM2, and with ``chain`` every
    launch after the first, a programmatic dependent launch)."""
    a16: bool
    tc: bool
    pdl: bool
    chain: bool


def decode_pairs(config: MoEConfig, mode: str = "16bit") -> int:
    """Largest T*k served by the decode kernels: FUSEDMOE_DECODE_PAIRS, else by ``mode``:
    '16bit' max(k, E // 4); 'a16' (W8A8 weights, 16-bit activations) max(k, min(E // 4, 32));
    'a8' (W8A8 with x and h quantized: 4 launches) max(k, E // 16); 'tc' and 'auto' (the
    tensor-core GEMMs) max(k, min(E // 2, 128)) for E >= 64, else max(k, E // 4). One token
    always; more while the pairs mostly hit distinct experts (measurements: the module
    docstring)."""
    v = env.decode_pairs()
    if v is not None:
        return v
    E, k = config.num_local_experts, config.top_k
    tc = min(E // 2, 128) if E >= 64 else E // 4
    return max(k, {"16bit": E // 4, "a16": min(E // 4, 32), "a8": E // 16, "tc": tc, "auto": tc}[mode])


def auto_a16_max_t(quant, platform=None) -> int:
    """Largest T for which FUSEDMOE_W8A8_DECODE=auto (the default) runs a W8A8 decode in a16
    math (x and h 16-bit against the 8-bit weights: two launches, no quantizers, 2.4-2.7e-3
    relative error against the fp32 reference instead of 0.8-2.0e-2); the tensor-core chain
    above it. Layer graph µs, a16 / tc (benchmarks/decode_t2.py, best of 2-4 alternating
    rounds; docs/BENCHMARKS.md twenty-ninth and thirtieth sections):
      * H100, qwen3 fp8_channel: T=2 32.4-33.4 / 34.9-35.0, T=3 44.7-45.8 / 48.9-49.5, T=4
        56.5-57.7 / 58.5-59.5 (two sessions, a16 2.7-3.0% ahead);
      * H100, deepseek-v3 tp8 fp8_block: T=2 39.1-40.5 / 40.5-41.2 (the more accurate wins),
        T=3 56.0-57.4 / 54.8-56.0;
      * H100, qwen3 int8_channel: T=2 35.3-36.4 / 35.0-35.3 (tc), T=3 47.6-49.2 / 48.6-49.4
        (a16 1-2% ahead, within the spread: tc kept); with session 31's tc tile rules (tc
        33.9 / 46.7 / 57.9 at T = 2, 3, 4) tc leads clearly; fp8_channel's tc is then even with
        a16 at T=4 (58.0 / 57.9-58.2) and behind at T = 2, 3 (34.3 / 33.0, 46.8 / 45.4);
      * H200 (session 30): qwen3 fp8_channel T=2 27.6 / 29.1, T=3 39.7 / 41.0, T=4 48.6 / 47.8;
        deepseek fp8_block T=2 37.2 / 33.6 (tc 10% ahead); int8_channel T=2 32.5 / 29.1;
      * H200 (session 32, the tc rules of sessions 31-32): qwen3 fp8_channel T=2 27.23 / 27.01
        (even: the more accurate wins), T=3 39.68 / 38.47, T=4 48.69 / 45.44; deepseek T=2
        37.23 / 32.64;
      * H100 (session 34, `fusedmoe bench` two alternating rounds in one process; tc GEMM1 with its
        L2 hints, kernels/decode_tc.py L2_PRE): qwen3 fp8_channel T=3 47.1 / 46.7 (even: the more
        accurate wins), T=4 59.6 / 58.3 (tc 2.2% ahead): fp8_channel's bound 4 -> 3;
      * H100 (session 35, the same, another machine): qwen3 fp8_channel T=2 33.8 / 34.5, T=3 47.1 /
        46.4 (tc 0.9-1.5% ahead over the four rounds of both sessions, a16 3-8x more accurate: kept);
      * fp8_tensor: not measured, one token.
    ``platform`` (backends' Platform) None: the H100 rule."""
    if platform is not None and "H200" in getattr(platform, "name", ""):
        return {QuantMethod.FP8_CHANNEL: 2}.get(quant.method, 1)
    return {QuantMethod.FP8_CHANNEL: 3, QuantMethod.FP8_BLOCK: 2}.get(quant.method, 1)


def decode_pdl_ok(platform) -> bool:
    """Programmatic dependent launch for the decode GEMM2: CUDA sm90+, a Triton with
    griddepcontrol, FUSEDMOE_DECODE_PDL not 0 (read once, at construction)."""
    if platform.kind != "cuda" or platform.sm < 90 or not env.decode_pdl():
        return False
    from ..kernels.decode import HAS_GDC
    return HAS_GDC


# H100 bf16, fusedmoe bench, two alternating rounds (docs/BENCHMARKS.md, eighth session): the
# PDL chain gains 1.5-3 us at 2-64 pairs per expert (qwen3 T=64 400.2 -> 398.7, deepseek tp8
# T=64 818.8 -> 816.3, Mixtral T=256 1079.5 -> 1078.1), is even at 32-256 (T=1024), and
# LOSES 2-3% at 128-1024 (T=4096: qwen3 901.2 -> 928.4 / 931.2, deepseek tp8 1616.7 -> 1651.4)
PREFILL_PDL_MAX_M = 64


def align_bm(c1: dict, c2: dict) -> int:
    """The block the grouped path pads each expert's run of pairs to: the larger BLOCK_SIZE_M
    of the two GEMMs (``configs`` makes one divide the other). The GEMM with the smaller one
    runs sub-blocks of those runs, skipping the ones that are all padding."""
    return max(c1["BLOCK_SIZE_M"], c2["BLOCK_SIZE_M"])


def prefill_pdl_bound(config: MoEConfig, T: int) -> bool:
    """T tokens give at most PREFILL_PDL_MAX_M (token, slot) pairs per local expert."""
    return T * config.top_k <= PREFILL_PDL_MAX_M * config.num_local_experts


# GEMM2's sum over a token's k slots (session 14; H100, docs/BENCHMARKS.md fourteenth section):
# atomic adds straight into the 16-bit output ('atomic_out': no y [T*k, H] round trip, no reduce
# kernel) measured 2-7% faster than y + the fixed-order reduce on qwen3-30b-a3b (bf16, fp8 and int8
# per channel, T = 1024..16384), Mixtral (T = 4096, 16384) and deepseek-v3 tp8 up to T = 4096
# (y of 235M elements), and 3-6% SLOWER at deepseek-v3 tp8 T = 16384 (y of 940M elements). So
# by default, when the caller did not ask for determinism: atomic_out on CUDA for 16-bit
# outputs from ATOMIC_OUT_MIN_M (token, slot) pairs per local expert on (qwen3 T=1024 has 64 and
# gained 2%; fewer were measured only on deepseek, 8 and 32 pairs, gaining 1-5%: not enough to
# take the untested weight-bound buckets, where the atomic GEMM2 also leaves the PDL chain: it
# follows a zeroing of the output) and up to ATOMIC_OUT_MAX_Y elements of y, or past that when
# GEMM2's launch config walks the output in column bands (A-resident BAND_MAJOR: the band being
# added to stays in L2): deepseek-v3 tp8 T=16384 with 1024-column bands, bf16 3956.4 -> 3625.7 us,
# fp8_block 3092.3 -> 2777.7 (the shipped H100 entries; docs/BENCHMARKS.md, fourteenth section; the
# H200's since the twenty-second: bf16 3744 -> 3506, fp8_block 2795 -> 2472).
ATOMIC_OUT_MIN_M = 64
ATOMIC_OUT_MAX_Y = 1 << 29

# With 'atomic_out', the output is zeroed at the start of the grouped forward: by the W8A8
# quantization of x (its kernel stores zeros into the same [T, H] rows it reads: no launch of
# its own), or by a fill ahead of the alignment for 16-bit x. GEMM2 then stays a dependent
# launch of GEMM1 in the PDL chain. False: GEMM2 zeroes the output itself (the A/B's old side).
FUSED_ZERO = True
# With FUSED_ZERO and outputs of more than ZERO_IN_GEMM1_MIN elements: GEMM1 zeroes the
# output on the side, a share a tile (grouped_gemm.py ``gemm1_act(zero=)``), instead of the
# quantization of x or a fill before the alignment, which move [T, H] of zeros at copy
# bandwidth ahead of the GEMMs. The stores are not free under GEMM1's K loops: H100, two
# alternating rounds each (docs/BENCHMARKS.md twenty-first section, scripts/sessions/gpu_s21a.sh),
# deepseek-v3 tp8 fp8_block T=16384 (117M elements) 2697.6 / 2700.3 -> 2679.9 / 2671.7 us, but
# T=4096 942.9 / 942.9 -> 948.5 / 949.3 and qwen3 int8_channel T=4096 547.0 / 545.7 -> 551.0 /
# 552.7; bf16 and qwen3 T=16384 (34M elements) within noise. So only the largest outputs.
ZERO_IN_GEMM1 = True
ZERO_IN_GEMM1_MIN = 1 << 26


def zero_in_gemm1(numel: int) -> bool:
    """Whether GEMM1 zeroes an atomic k-sum's output of ``numel`` elements (ZERO_IN_GEMM1)."""
    return ZERO_IN_GEMM1 and numel > ZERO_IN_GEMM1_MIN


def reduce_rule(config: MoEConfig, platform, T: int, gemm2_config: dict | None = None) -> str:
    """The grouped GEMM2's k-sum for T tokens when determinism was not asked for and
    FUSEDMOE_REDUCE is unset: 'atomic_out' or 'deterministic' (see ATOMIC_OUT_MAX_Y).
    ``gemm2_config``: GEMM2's launch config at T (BAND_MAJOR lifts the y bound)."""
    banded = bool(gemm2_config and gemm2_config.get("A_RESIDENT") and gemm2_config.get("BAND_MAJOR"))
    if (platform.kind == "cuda" and config.torch_dtype in (torch.bfloat16, torch.float16)
            and T * config.top_k >= ATOMIC_OUT_MIN_M * config.num_local_experts
            and (banded or T * config.top_k * config.hidden_size <= ATOMIC_OUT_MAX_Y)):
        return "atomic_out"
    return "deterministic"


def prefill_pdl_ok(platform) -> bool:
    """Programmatic dependent launches on the grouped path (GEMM1 after the alignment, the
    requantization, GEMM2, the reduce): as ``decode_pdl_ok`` with FUSEDMOE_PREFILL_PDL."""
    if platform.kind != "cuda" or platform.sm < 90 or not env.prefill_pdl():
        return False
    from ..kernels.decode import HAS_GDC
    return HAS_GDC


def h_epilogue_on(scheme, h_quant: str) -> bool:
    """Whether GEMM1's epilogue quantizes h (where the launch configs allow, h_epilogue_group)
    for FUSEDMOE_H_QUANT = ``h_quant``: asked for ('epilogue'), or unset for fp8_block, whose own
    1 x 128 rule it applies (H100, scripts/sessions/gpu_s18c.sh, deepseek-v3 tp8 T=1024 / 4096 / 16384:
    732 -> 729, 1010 -> 1007, 2763 -> 2762 µs). fp8_channel's stays opt-in: 1 x 128 groups,
    finer than its per-token rule, were 3-19% slower at T >= 4096 (docs/BENCHMARKS.md, ninth
    session)."""
    if scheme.method == QuantMethod.FP8_BLOCK:
        return h_quant in ("", "epilogue")
    return scheme.method == QuantMethod.FP8_CHANNEL and h_quant == "epilogue"


def h_epilogue_group(scheme, c1: dict, c2: dict) -> int:
    """1 x g groups GEMM1's epilogue can quantize h in for these launch configs, 0 if none:
    fp8_block g = bk, fp8_channel g = H_GROUP_CHANNEL; GEMM1's BLOCK_SIZE_N a multiple of g
    (whole groups per tile) and GEMM2's BLOCK_SIZE_K a divisor (one scale per K tile)."""
    if scheme.method == QuantMethod.FP8_BLOCK:
        g = scheme.block_shape[1]
    elif scheme.method == QuantMethod.FP8_CHANNEL:
        g = H_GROUP_CHANNEL
    else:
        return 0
    return g if c1["BLOCK_SIZE_N"] % g == 0 and g % c2["BLOCK_SIZE_K"] == 0 else 0


def deinterleave_rows(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] with rows g0,u0,g1,u1,... -> [E, 2I, ...] with rows g0..gI-1, u0..uI-1."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()


def convert_weights(config: MoEConfig, weights: ExpertWeights, platform) -> ExpertWeights:
    w = weights
    if config.gate_up_layout == GateUpLayout.INTERLEAVED:
        ch = {"w13": deinterleave_rows(w.w13)}
        if w.w13_bias is not None:
            ch["w13_bias"] = deinterleave_rows(w.w13_bias)
        if w.w13_scale is not None and w.w13_scale.dim() >= 2:   # per-channel scales follow their rows
            ch["w13_scale"] = deinterleave_rows(w.w13_scale)
        w = w.replace(**ch)
    return w.replace(w13=w.w13.contiguous(), w2=w.w2.contiguous())


def launch_configs(config: MoEConfig, quant, platform):
    from ..kernels.grouped_gemm import default_config
    from ..tuning import LaunchConfigs
    dt = config.torch_dtype
    gated = config.is_gated
    n13 = config.n13

    def defaults(T, E, N, H, top_k, tag):
        return {"gemm1": default_config(T, E, n13, H, top_k, dt, gemm="gemm1", gated=gated,
                                        num_sms=platform.num_sms or 132),
                "gemm2": default_config(T, E, n13, H, top_k, dt, gemm="gemm2", gated=gated,
                                        num_sms=platform.num_sms or 132)}
    lc = LaunchConfigs.for_config(config, quant, platform)
    lc.default_fn = defaults
    return lc


class TritonExperts(Experts):
    activation_format = ActivationFormat.STANDARD

    def __init__(self, config: MoEConfig, weights: ExpertWeights, platform, *, deterministic: bool = True):
        super().__init__(config, weights)
        self.scheme = weights.scheme
        self.quant_mode = QUANT_MODE[self.scheme.method]
        # W8A8: x is quantized here (grouped path: one kernel before GEMM1; decode: not at all
        # by default, see decode_a16), so prepare hands the experts 16-bit x
        self.input_quant = False
        self.quantized = self.scheme.method != QuantMethod.NONE
        # (the decode GEMMs could quantize x and h themselves, kernels/decode.py quantize_a,
        # but that measured slower on the H100: qwen3 fp8_channel T=1 59.9 vs 30.6 us with
        # the quantization kernels, deepseek fp8_block 48.6 vs 32.1; FUSEDMOE_W8A8_DECODE=a8
        # uses the kernels)
        # GEMM2's sum over k (reduce_for): the fixed-order reduce when the caller asks for
        # determinism, else FUSEDMOE_REDUCE's mode, else reduce_rule's per T
        self.platform = platform
        self._reduce = "deterministic" if deterministic else env.reduce()
        self.lc = launch_configs(config, self.scheme, platform)
        self.block_shape = self.scheme.block_shape
        self._plans: dict = {}      # decode: shape key -> the two bound launches (_apply_decode)
        self._qplans: dict = {}     # decode: input key -> (bound quantization launch, q, scale)
        # decode GEMM2 as a programmatic dependent launch of GEMM1 (sm90+): its programs
        # load their first weight tile while GEMM1 finishes (kernels/decode.py gemm2_launch).
        # H100, T=1, graphs: qwen3 29.3 -> 27.5 us, deepseek tp8 34.8 -> 33.1, Mixtral 230.0
        # -> 228.5. W8A8: the four launches (quantize x, GEMM1, requantize h, GEMM2) as one
        # PDL chain, each GEMM loading its first weight tile before waiting for its input
        # (per-token and group schemes; fp8_tensor's dynamic scale takes two kernels, and a
        # GEMM2 behind a quantization kernel that does not let it launch early measured
        # +0.5 us: no PDL there)
        # W8A8 at decode with FUSEDMOE_W8A8_DECODE=a16 keeps x and h 16-bit (session 5): the
        # CUDA-core decode GEMMs gain nothing from quantized activations, only two launches
        # (and their rounding). quantizes_activations(T) says which math a call gets.
        # Session 7: the a8 chain with the GEMMs on the tensor cores (FUSEDMOE_W8A8_DECODE=tc,
        # kernels/decode_tc.py: 8-bit weight tiles as the MMA's M side, no widening) is the
        # fastest W8A8 decode from T=2 on (H100: deepseek fp8_block T=4 85.2 -> 70.9 us, T=8
        # 153.1 (grouped) -> 122.0, T=16 252.4 -> 231.5; qwen3 fp8_channel T=8 113.7 -> 103.8)
        # but not at T=1 (qwen3 23.1 vs a16 18.4 us). The default, 'auto', takes a16 for one
        # token's pairs and tc above, up to the tc bound (decode_pairs 'tc').
        mode = env.w8a8_decode() if self.quantized else "16bit"
        self.w8a8_mode = mode
        pdl_ok = decode_pdl_ok(platform)
        chain = self.quantized and self.scheme.method != QuantMethod.FP8_TENSOR and pdl_ok
        self._mode16 = DecodeMode(a16=True, tc=False, pdl=pdl_ok, chain=False)
        self._mode8 = DecodeMode(a16=False, tc=mode in ("tc", "auto"), pdl=chain, chain=chain)
        self.decode_pairs = decode_pairs(config, mode)  # env read once
        self._auto_a16_t = auto_a16_max_t(self.scheme, platform)
        # (both decode GEMMs in one launch was measured slower than the two with PDL on the
        # H100: T=1 graphs qwen3 36.1 vs 27.5 us, deepseek tp8 46.3 vs 33.1; docs/BENCHMARKS.md.
        # Removed in session 12: wrong on tiny grids on the GPU; commit e6c0681 has it.)
        self._specs: dict = {}
        # the grouped path as one PDL chain (session 8): each kernel's programs may start as
        # the one before drains and wait for it before any load (FUSEDMOE_PREFILL_PDL), up to
        # PREFILL_PDL_MAX_M tokens per local expert (prefill_pdl_for)
        self.prefill_pdl = prefill_pdl_ok(platform)
        # GEMM2's input h quantized in GEMM1's epilogue (FUSEDMOE_H_QUANT, fp8_block /
        # fp8_channel): no 16-bit h round trip, no requantization kernel (_h_epilogue)
        self.h_epilogue = h_epilogue_on(self.scheme, env.h_quant())  # (read, and checked, whatever the scheme)

    def reduce_for(self, T: int, c2: dict | None = None) -> str:
        """How a grouped-path call of T tokens sums each token's k slots after GEMM2:
        'deterministic' (y, then a fixed-order reduce: bitwise reproducible), 'atomic_out' or
        'atomic' (atomic adds: the bits vary run to run). ``c2``: GEMM2's config at T when
        the caller has it (else looked up)."""
        return self._reduce or reduce_rule(self.config, self.platform, T, c2 if c2 is not None else self.configs(T)[1])

    def prefill_pdl_for(self, T: int) -> bool:
        """Whether a grouped-path call of T tokens launches as a PDL chain: on, and at most
        PREFILL_PDL_MAX_M (token, slot) pairs per local expert."""
        return self.prefill_pdl and prefill_pdl_bound(self.config, T)

    # the one place that maps T -> (cfg1, cfg2): the tokens are aligned to the larger of the two
    # BLOCK_SIZE_Ms (align_bm), the other GEMM's m-blocks are sub-blocks of those runs
    def configs(self, T: int):
        c1, c2 = self.lc.get(T)
        b1, b2 = c1["BLOCK_SIZE_M"], c2["BLOCK_SIZE_M"]
        if max(b1, b2) % min(b1, b2):        # (not both powers of two) GEMM1's for both
            c2 = dict(c2, BLOCK_SIZE_M=b1)
        return c1, c2

    def _h_epilogue(self, c1: dict, c2: dict) -> int:
        """The group g GEMM1's epilogue quantizes h with on a grouped-path call with these
        launch configs (0: a kernel after it does): ``h_epilogue_group``."""
        return h_epilogue_group(self.scheme, c1, c2) if self.h_epilogue else 0

    def h_group(self, T: int):
        """1 x g: a call of T tokens quantizes GEMM2's input h in fp8 1 x g groups where the
        scheme's own rule differs (fp8_channel: per token), i.e. matches
        ``reference_moe(..., h_group=g)``; None where it follows the scheme's rule."""
        if self.quant_mode != "channel" or T * self.config.top_k <= self.decode_pairs:
            return None
        return self._h_epilogue(*self.configs(T)) or None

    def workspace(self, M, topk):
        # called per forward (it keys the framework's buffer cache): memoized per launch config
        if M * topk <= self.decode_pairs:
            key = (M, topk)
        else:
            c1, c2 = self.configs(M)
            key = (M, topk, align_bm(c1, c2), c2.get("SPLIT_K", 1), self._h_epilogue(c1, c2),
                   self.reduce_for(M, c2), self._sorted_h(c2), self._sorted_x(c1))    # all it depends on
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) > 64:
                self._specs.clear()
            c = self.config
            if len(key) == 2:                                 # decode: h and out only
                spec = WorkspaceSpec({"h": ((M * topk, c.intermediate_size), c.torch_dtype),
                                      "out": ((M, c.hidden_size), c.torch_dtype)})
            else:
                spec = self._workspace(M, topk, c1, c2)
            self._specs[key] = spec
        return spec

    def _workspace(self, M, topk, c1, c2):
        from ..kernels.align import max_padded_size
        from ..kernels.grouped_gemm import gemm2_workspace_spec
        c = self.config
        bm = align_bm(c1, c2)
        mp = max_padded_size(M * topk, bm, c.num_local_experts)
        dt = c.torch_dtype
        bufs = {"sorted_ids": ((mp,), torch.int32), "expert_ids": ((mp // bm,), torch.int32),
                "ntpp": ((1,), torch.int32), "h": ((M * topk, c.intermediate_size), dt),
                "out": ((M, c.hidden_size), dt)}
        g = self._h_epilogue(c1, c2)
        if self._sorted_h(c2):   # h in sorted order: a row for every padded position
            bufs["h"] = ((mp, c.intermediate_size), dt)
        if self._sorted_x(c1):   # x copied to the sorted positions for GEMM1
            bufs["xs"] = ((mp, c.hidden_size), dt)
        if g:   # h fp8 with its group scales, written by GEMM1
            bufs["h"] = ((M * topk, c.intermediate_size), torch.float8_e4m3fn)
            bufs["h_scale"] = ((M * topk, -(-c.intermediate_size // g)), torch.float32)
        y = gemm2_workspace_spec(M, topk, c.hidden_size, c2, self.reduce_for(M, c2), dt)
        if y is not None:
            bufs["y"] = y
        return WorkspaceSpec(bufs)

    def weight_and_reduce(self):
        return NoOpWeightAndReduce()

    def apply(self, prep, ws, expert_map):
        T, k = prep.topk_ids.shape
        if T * k <= self.decode_pairs:
            return self._apply_decode(prep, ws, expert_map)
        return self._apply_grouped(prep, ws, expert_map)

    def decode_mode(self, T: int) -> "DecodeMode":
        """How a decode-size call of T tokens runs (FUSEDMOE_W8A8_DECODE; 16-bit schemes: a16)."""
        m = self.w8a8_mode
        if m in ("16bit", "a16") or (m == "auto" and T <= self._auto_a16_t):
            return self._mode16
        return self._mode8

    def quantizes_activations(self, T: int) -> bool:
        """Whether a forward of T tokens quantizes x and h as the W8A8 scheme does (False for
        16-bit schemes, and for decode-size calls in a16 math: FUSEDMOE_W8A8_DECODE=a16, or
        up to auto_a16_max_t(scheme) tokens with the default 'auto'; those match
        ``reference_moe(..., quantize_activations=False)``)."""
        if not self.quantized:
            return False
        return not (T * self.config.top_k <= self.decode_pairs and self.decode_mode(T).a16)

    def _dquant(self, a, static_scale, mode, pdl=False, role="x"):
        """A decode GEMM input: 16-bit as given in a16 math, else quantized as ``_quant``
        does. Per-token and group schemes on CUDA quantize through a launch bound per input
        shape (launcher.Bound) into buffers kept with it: a repeated eager decode call does
        not allocate or build launches (H100, deepseek tp8 fp8_block T=2: the two
        ``quantize_activation`` calls were ~70% of a 233 us eager host time). The buffers are
        reused by the next call of the same shape and ``role`` ('x' / 'h': never one buffer for
        both; stream-ordered, as the plan's h)."""
        if mode.a16:
            return a, None
        m = self.scheme.method
        if (static_scale is not None or m not in (QuantMethod.FP8_CHANNEL, QuantMethod.INT8_CHANNEL,
                                                  QuantMethod.FP8_BLOCK)
                or not a.is_cuda or a.dim() != 2 or a.stride(-1) != 1 or a.shape[0] == 0):
            return self._quant(a, static_scale, pdl)
        key = (role, a.shape, a.stride(0), a.dtype, a.device, pdl)
        qp = self._qplans.get(key)
        if qp is not None:
            qp[0].fast(a)
            return qp[1], qp[2]
        from ..kernels import quantize as qk
        from ..kernels.launcher import bind
        T, K = a.shape
        if m == QuantMethod.FP8_BLOCK:
            q = torch.empty(T, K, dtype=torch.float8_e4m3fn, device=a.device)
            sc = torch.empty(T, -(-K // self.block_shape[1]), dtype=torch.float32, device=a.device)
        else:
            q = torch.empty(T, K, dtype=torch.int8 if m == QuantMethod.INT8_CHANNEL else torch.float8_e4m3fn,
                            device=a.device)
            sc = torch.empty(T, 1, dtype=torch.float32, device=a.device)
        spec = qk.quant_launch(a, q, sc, m.value, group=self.block_shape[1] if self.block_shape else 128,
                               pow2=self.scheme.scale_pow2, pdl=pdl)
        if len(self._qplans) >= 32:
            self._qplans.clear()
        self._qplans[key] = (bind(*spec, slots=[0]), q, sc)
        return q, sc

    def _quant(self, a, static_scale, pdl=False, zero=None):
        """A GEMM input for W8A8 schemes, quantized by its own kernel: (a, None) for 16-bit.
        ``zero``: a tensor of a's shape the same launch fills with zeros (W8A8 only)."""
        if not self.quantized:
            return a, None
        return quantize_activation(a, self.scheme, static_scale, pdl=pdl, zero=zero)

    def _sorted_h(self, c2) -> bool:
        """GEMM2 config SORTED_H (kernels/grouped_gemm.py ``sorted_h``) on a 16-bit scheme:
        GEMM1 writes h at the sorted positions, GEMM2 reads it without a gather."""
        from ..kernels.grouped_gemm import sorted_h
        return self.quant_mode == "none" and sorted_h(c2)

    def _sorted_x(self, c1) -> bool:
        """GEMM1 config SORTED_X (kernels/grouped_gemm.py ``sorted_x``) on a 16-bit scheme: x
        copied to the sorted positions (one launch), GEMM1 reads it without a gather."""
        from ..kernels.grouped_gemm import sorted_x
        return self.quant_mode == "none" and sorted_x(c1)

    def _must_zero_h(self, expert_map) -> bool:
        # dropped slots' rows are never written; a dynamic per-tensor amax must not see garbage
        return (expert_map is not None and self.scheme.method == QuantMethod.FP8_TENSOR
                and self.weights.a2_scale is None)

    def _must_zero_decode_h(self, expert_map, mode) -> bool:
        return not mode.a16 and self._must_zero_h(expert_map)

    def _apply_decode(self, prep, ws, expert_map):
        return self._decode(prep.a1q, prep.topk_weights, prep.topk_ids, ws["h"], ws["out"], expert_map)

    def direct(self, x, topk_weights, topk_ids, expert_map):
        """The whole forward of a decode-size call (ModularKernel's ``direct`` hook: prepare
        and finalize have nothing to do for this backend), None for the grouped path. h is
        kept per shape with the bound launches."""
        T, k = topk_ids.shape
        if T * k > self.decode_pairs:
            return None
        return self._decode(x, topk_weights, topk_ids, None, torch.empty_like(x), expert_map)

    def _decode(self, x, tw, ids, h, out, expert_map):
        """The two decode launches. The first call per shape builds them (kernels/decode.py
        gemm1_launch / gemm2_launch) and binds them (launcher.Bound); later calls only put
        this call's tensors into their slots: a decode forward's host time is mostly this
        Python (docs/BENCHMARKS.md, eager). ``h`` None: the plan's (allocated at its first
        call)."""
        mode = self.decode_mode(ids.shape[0])
        chain = mode.chain
        x, x_scale = self._dquant(x, self.weights.a13_scale, mode, chain)
        key = (ids.shape, x.stride(), None if expert_map is None else expert_map.shape)
        plan = self._plans.get(key)
        if h is None:
            h = plan[2] if plan is not None else None
            if h is None or h.device != x.device:
                h = torch.empty(ids.numel(), self.config.intermediate_size, dtype=self.config.torch_dtype,
                                device=x.device)
        if self._must_zero_decode_h(expert_map, mode):
            h.zero_()
        # the kernels take the ids as a flat pointer: the [T, k] tensor itself (contiguous,
        # PreparedExperts.run) fills the slot bound with its view(-1), without a new view
        flat = ids if ids.is_contiguous() else ids.contiguous()
        emap = flat if expert_map is None else expert_map
        if plan is None or out.stride() != plan[3]:
            return self._bind_decode(key, x, x_scale, ids, tw, h, out, expert_map, mode)
        b1, b2, b0 = plan[0], plan[1], plan[4]
        if b0 is not None:
            b0.fast(flat, emap)
        if x_scale is None:
            b1.fast(x, h, flat, emap)
        else:
            b1.fast(x, h, flat, emap, x_scale)
        hq, h_scale = self._dquant(h, self.weights.a2_scale, mode, chain, role="h")
        if h_scale is None:
            b2.fast(hq, out, tw, flat, emap)
        else:
            b2.fast(hq, out, tw, flat, emap, h_scale)
        return out

    def _tc_launches(self, x, h, ids, out, expert_map):
        """(gemm1_launch, gemm2_launch, table_launch or None) of kernels/decode_tc.py with this
        shape's scratch (fp32 partials, int32 tickets: zero now, left zero by every launch) and
        SHARE table bound in; the table's launch runs before GEMM1 (tc_share)."""
        from ..kernels import decode_tc as tc
        from ..kernels.grouped_gemm import _num_sms
        c = self.config
        T, k = ids.shape
        gk = self.block_shape[1] if self.quant_mode == "block" else None
        nsm = _num_sms(x.device)
        E = c.num_local_experts
        dev = getattr(self.platform, "name", "") or ""
        c1 = tc.tc_config("gemm1", T * k, h.shape[1], c.hidden_size, k, c.is_gated, gk, nsm, num_experts=E,
                          device_name=dev)
        c2 = tc.tc_config("gemm2", T, c.hidden_size, h.shape[1], k, group_k=gk, num_sms=nsm, num_experts=E,
                          device_name=dev)
        s1, s2 = tc.scratch(T, k, h.shape[1], c.hidden_size, c1, c2, c.is_gated, x.device)
        table = tc.share_table(T, k, x.device) if c1["SHARE"] or c2["SHARE"] else None

        def g1(*a, **kw):
            return tc.tc_gemm1_launch(*a[:5], *s1, config=c1, table=table, **kw)

        def g2(*a, **kw):
            return tc.tc_gemm2_launch(*a[:5], *s2, config=c2, table=table, **kw)

        def g0(ids, expert_map, pdl):
            return tc.share_table_launch(ids, table, E, expert_map=expert_map, pdl=pdl)
        return g1, g2, (g0 if table is not None else None)

    def _bind_decode(self, key, x, x_scale, ids, tw, h, out, expert_map, mode):
        from ..kernels import decode as dk
        from ..kernels.decode import GEMM1_SLOTS as S1, GEMM2_SLOTS as S2
        from ..kernels.launcher import bind
        c, w = self.config, self.weights
        q = dict(quant=self.quant_mode, block_shape=self.block_shape)
        b0 = None
        if mode.tc and x.element_size() == 1:     # (the tc slots are decode.py's: same positions)
            gemm1_launch, gemm2_launch, table_launch = self._tc_launches(x, h, ids, out, expert_map)
            if table_launch is not None:          # SHARE: the table, a link of the chain before GEMM1
                b0 = bind(*table_launch(ids, expert_map, mode.chain), slots=(0, 1))
        else:
            gemm1_launch, gemm2_launch = dk.gemm1_launch, dk.gemm2_launch
        names = ("out", "ids", "map")
        spec = gemm1_launch(x, w.w13, ids, c.activation.value, h, expert_map=expert_map, bias=w.w13_bias,
                            swiglu_limit=c.swiglu_limit, alpha=c.swigluoai_alpha, limit=c.swigluoai_limit,
                            a_scale=x_scale, b_scale=w.w13_scale, pdl=mode.pdl, pdl_wait=mode.chain, **q)
        slots = [S1[n] for n in ("x",) + names + (("a_scale",) if x_scale is not None else ())]
        b1 = bind(*spec, slots=slots)
        hq, h_scale = self._dquant(h, w.a2_scale, mode, mode.chain, role="h")
        spec = gemm2_launch(hq, w.w2, ids, tw, out, expert_map=expert_map,
                            mul_routed_weight=not c.routing.apply_router_weight_on_input, bias=w.w2_bias,
                            a_scale=h_scale, b_scale=w.w2_scale, pdl=mode.pdl, **q)
        slots = [S2[n] for n in ("h", "out", "topk_weights", "ids", "map")
                 + (("a_scale",) if h_scale is not None else ())]
        b2 = bind(*spec, slots=slots)
        if len(self._plans) >= 16:
            self._plans.clear()
        self._plans[key] = (b1, b2, h, out.stride(), b0)
        return out

    def _apply_grouped(self, prep, ws, expert_map):
        from ..kernels.align import AlignResult, align_block_size
        from ..kernels.grouped_gemm import gather_sorted, gemm1_act, gemm2
        c, w = self.config, self.weights
        ids = prep.topk_ids
        T, k = ids.shape
        c1, c2 = self.configs(T)
        reduce = self.reduce_for(T, c2)
        out = ws["out"]
        # an atomic k-sum into the output needs it zeroed: by the quantization of x when
        # there is one (the same [T, H] rows; no launch of its own), else by a fill before
        # the alignment. Either way GEMM2 may stay a dependent launch in the PDL chain.
        zero_early = (FUSED_ZERO and reduce == "atomic_out" and out.stride(-1) == 1
                      and tuple(out.shape) == tuple(prep.a1q.shape))
        zero_g1 = zero_early and zero_in_gemm1(out.numel()) and out.is_contiguous()
        if zero_early and not zero_g1 and not self.quantized:
            out.zero_()
        x, x_scale = self._quant(prep.a1q, w.a13_scale, zero=out if zero_early and not zero_g1 else None)
        pdl = self.prefill_pdl_for(T)
        align = align_block_size(ids, align_bm(c1, c2), c.num_local_experts, expert_map,
                                 out=AlignResult(ws["sorted_ids"], ws["expert_ids"], ws["ntpp"]), pdl=pdl)
        q = dict(quant=self.quant_mode, block_shape=self.block_shape)
        if self._must_zero_h(expert_map):
            ws["h"].zero_()
        g = self._h_epilogue(c1, c2)
        act = dict(swiglu_limit=c.swiglu_limit, alpha=c.swigluoai_alpha, limit=c.swigluoai_limit,
                   zero=out if zero_g1 else None)
        a_group = None
        srt = not g and self._sorted_h(c2)
        if g:   # h fp8 in 1 x g groups straight from GEMM1's epilogue
            h, h_scale = gemm1_act(x, w.w13, align, k, c.activation.value, ws["h"], bias=w.w13_bias, **act,
                                   config=c1, a_scale=x_scale, b_scale=w.w13_scale, pdl=pdl,
                                   out_group=g, out_scale=ws["h_scale"], out_pow2=self.scheme.scale_pow2, **q)
            if self.quant_mode == "channel":
                # group scales of h with channel scales of w2; RESCALE (scaling the accumulator
                # in place, kernels/grouped_gemm.py) unless the tuned config says otherwise
                a_group = g
                c2 = dict(c2, RESCALE=c2.get("RESCALE", True))
        else:
            sx = self._sorted_x(c1)
            if sx:
                x = gather_sorted(x, align, k, ws["xs"], pdl=pdl)
            h = gemm1_act(x, w.w13, align, k, c.activation.value, ws["h"], bias=w.w13_bias, **act,
                          config=c1, a_scale=x_scale, b_scale=w.w13_scale, pdl=pdl, out_sorted=srt, x_sorted=sx,
                          **q)
            h, h_scale = self._quant(h, w.a2_scale, pdl=pdl)
        return gemm2(h, w.w2, align, prep.topk_weights, out,
                     mul_routed_weight=not c.routing.apply_router_weight_on_input, bias=w.w2_bias,
                     config=c2, reduce=reduce, workspace=ws.get("y"),
                     a_scale=h_scale, b_scale=w.w2_scale, pdl=pdl, a_group=a_group, out_zeroed=zero_early,
                     h_sorted=srt, **q)


def _check(config: MoEConfig, quant, platform):
    r = []
    if platform.kind == "cpu" and config.dtype == "bfloat16":
        r.append(Reason("dtype", "the Triton interpreter computes bf16 dots wrongly; use float16/float32 on CPU"))
    if quant.method == QuantMethod.FP8_BLOCK:
        bn, bk = quant.block_shape
        if config.gate_up_layout == GateUpLayout.INTERLEAVED:
            r.append(Reason("layout", "fp8_block weight blocks cannot be de-interleaved (swigluoai)"))
        if bk % 16 or bn % 16:
            r.append(Reason("block_shape", f"block_shape {quant.block_shape} must be multiples of 16"))
        if config.intermediate_size % bn or config.hidden_size % bk:
            r.append(Reason("block_shape", f"H={config.hidden_size} and I={config.intermediate_size} must be "
                                           f"multiples of the block {quant.block_shape} (gate/up tiles share blocks)"))
    return r


def _extras(c: dict) -> str:
    """The optional config keys a selection report shows: ' tma', ' one-dot' (GEMM1's gate and up
    tiles as one dot), ' persistentP[ flat]', ' rescale', ' half-tail' (a tile whose second half
    is padding at half height), ' A-resident xN' (GEMM2 keeping its rows of h over N column
    tiles), ' column-band-major' (its programs walking every m-block of a band of columns before
    the next band), ' sorted-x' (GEMM1 reading x copied to sorted order), ' sorted-h' (GEMM2
    reading h in sorted order, written so by GEMM1)."""
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


def _decode_tiles(config, quant, platform, T) -> str:
    """'; GEMM1 BNxBK, GEMM2 BNxBK[ xN tiles a program][ (... A3)][ (slots first)]': the CUDA-core decode kernels' tiles
    at T tokens (kernels/decode.py decode_config, gemm2_tiles), as a launch would pick them."""
    from ..kernels import decode as dk
    from ..kernels.launcher import cdiv, next_power_of_2
    esize = 1 if quant.method != QuantMethod.NONE else config.torch_dtype.itemsize
    gk = quant.block_shape[1] if quant.method == QuantMethod.FP8_BLOCK else None
    nsm = (platform.num_sms or 132) if platform.kind == "cuda" else 4     # as grouped_gemm._num_sms
    H, I, k = config.hidden_size, config.intermediate_size, config.top_k
    c1 = dk.decode_config(2 if config.is_gated else 1, T * k, I, H, esize, nsm, gk)
    c2 = dk.decode_config(next_power_of_2(k), T, H, I, esize, nsm, gk, gemm2=True)
    nt = dk.gemm2_tiles(T * cdiv(H, c2["BLOCK_N"]), nsm, esize, cdiv(I, c2["BLOCK_K"]))
    return (f"; GEMM1 BN{c1['BLOCK_N']}xBK{c1['BLOCK_K']}, GEMM2 BN{c2['BLOCK_N']}xBK{c2['BLOCK_K']}"
            + (f" x{nt} N tiles a program" if nt > 1 else "")
            + (" (h rows in the weight tile's layout, A3)" if dk.gemm2_a3(esize, next_power_of_2(k)) else "")
            + (" (slots first)" if dk.gemm2_slots_first() else ""))


def _tc_share(pairs: int, top_k: int, num_experts: int, intermediate: int) -> bool:
    from ..kernels.decode_tc import tc_share
    return tc_share(pairs, top_k, num_experts, intermediate)


def _l2_pre_explained(platform, waits: bool, shared: bool = False) -> str:
    """The tc chain's L2 hints (kernels/decode_tc.py L2_PRE) where GEMM1 waits for the kernel
    before it (a programmatic dependent launch): what ``_l2_pre`` will take (``shared``: the
    SHARE GEMMs, whose GEMM2 has none)."""
    if not waits or platform.kind != "cuda":
        return ""
    from ..kernels.decode_tc import l2_pre_default
    g1, g2 = l2_pre_default(platform.name, 0, shared), 0 if shared else l2_pre_default(platform.name, 1)
    parts = ([f"GEMM1 asks L2 for the first {g1} lines of its weight rows"] if g1 else []) + (
        [f"GEMM2 for its first {g2} slots' rows"] if g2 else [])
    return f"; before their waits, {' and '.join(parts)} (FUSEDMOE_TC_L2_PRE)" if parts else ""


def _tc_groups_explained(config, quant, platform, T) -> str:
    """The tc GEMM1's K step where it spans several block-scale groups (kernels/decode_tc.py
    TC_GEMM1_BLOCK_GROUPS): what ``tc_config`` gives the backend at T."""
    if quant.method != QuantMethod.FP8_BLOCK or not quant.block_shape:
        return ""
    from ..kernels.decode_tc import tc_config
    gk = quant.block_shape[1]
    c1 = tc_config("gemm1", T * config.top_k, config.intermediate_size, config.hidden_size, config.top_k,
                   config.is_gated, gk, platform.num_sms or 132, num_experts=config.num_local_experts,
                   device_name=platform.name)
    n = c1["BLOCK_K"] // gk
    return (f"; GEMM1's K steps read {n} scale groups of {gk} each ({c1['num_stages']} stages, "
            "TC_GEMM1_BLOCK_GROUPS: measured on this GPU)") if n > 1 else ""


def _w4_explained(config, quant, platform, T) -> bool:
    """Whether the a16 decode at T reads its 8-bit weights as words (kernels/decode.py
    ``w4_wanted`` and ``w4_mode``'s conditions, from the config instead of tensors)."""
    from ..kernels.decode import w4_wanted
    block = quant.method == QuantMethod.FP8_BLOCK or quant.group_size is not None
    fp8 = quant.method not in (QuantMethod.INT8_CHANNEL, QuantMethod.INT8_W8A16)
    return (w4_wanted(T, block, fp8=fp8, h200="H200" in platform.name) and platform.kind == "cuda"
            and (not fp8 or platform.sm >= 89)
            and config.hidden_size % 16 == 0 and config.intermediate_size % 16 == 0)


def _variants(config, quant, platform):
    try:
        lc = launch_configs(config, quant, platform)
    except Exception as e:  # Triton missing on a dry-run machine: say so instead of failing explain
        return {"all": f"(launch configs unavailable here: {e})"}
    out = {"source": lc.describe()}
    quantized = quant.method != QuantMethod.NONE
    mode = env.w8a8_decode() if quantized else "16bit"
    dp = decode_pairs(config, mode)
    extra = [T for T in DECODE_BUCKETS if quantized and T * config.top_k <= dp]
    for T in sorted(set(BUCKETS) | set(extra)):
        if T * config.top_k <= dp:
            a16 = quantized and (mode == "a16" or (mode == "auto" and T <= auto_a16_max_t(quant, platform)))
            tc = quantized and not a16 and mode in ("tc", "auto")
            chained = quantized and not a16
            pdl = decode_pdl_ok(platform) and not (chained and quant.method == QuantMethod.FP8_TENSOR)
            chain = ("; quantize x, GEMM1, requantize h, GEMM2 as one programmatic dependent launch chain"
                     if chained else "; GEMM2 a programmatic dependent launch of GEMM1")
            shared = tc and _tc_share(T * config.top_k, config.top_k, config.num_local_experts,
                                      config.intermediate_size)
            out[f"T={T}"] = (f"decode kernels (T*k <= {dp} pairs): "
                             + ("GEMM1 and GEMM2 per (expert, N tile): each expert's weight tiles read once "
                                "for all its pairs (up to 16 a program, FUSEDMOE_DECODE_SHARE), no align; "
                                "GEMM2's k-sum in slot order by each token's last program, no reduce" if shared else
                                "GEMM1 per (pair, N tile), no align; GEMM2 per (token, N tile) with the k-sum "
                                "fused, no reduce")
                             + ("" if tc else _decode_tiles(config, quant, platform, T))
                             + (f"; 8-bit weights, 16-bit activations (FUSEDMOE_W8A8_DECODE={mode}: "
                                "no activation quantization at this T)" if a16 else "")
                             + ("; the weights read as int32 words of four, converted by PTX (FUSEDMOE_DECODE_W4)"
                                if a16 and _w4_explained(config, quant, platform, T) else "")
                             + (f"; 8-bit x 8-bit GEMMs on the tensor cores (FUSEDMOE_W8A8_DECODE={mode}, "
                                "kernels/decode_tc.py)" if tc else "")
                             + _l2_pre_explained(platform, tc and pdl, shared)
                             + (_tc_groups_explained(config, quant, platform, T) if tc and not shared else "")
                             + (chain if pdl else ""))
            continue
        c1, c2 = lc.get(T)
        g = h_epilogue_group(quant, c1, c2) if h_epilogue_on(quant, env.h_quant()) else 0
        hq = (f"; h quantized in GEMM1's epilogue (fp8, 1 x {g} groups"
              + (", finer than the scheme's per-token rule" if quant.method == QuantMethod.FP8_CHANNEL else "")
              + "; FUSEDMOE_H_QUANT)") if g else ""
        from ..kernels.grouped_gemm import mask_a_rule
        masked = [name for name, cg in (("GEMM1", c1), ("GEMM2", c2)) if not cg.get("A_RESIDENT")
                  and mask_a_rule(cg, T * config.top_k, config.num_local_experts, cg["BLOCK_SIZE_M"])]
        hq += (f"; {' and '.join(masked)} padding rows load nothing (MASK_A: <= 4 blocks of pairs an expert)"
               if masked else "")
        red = env.reduce()
        why = f"FUSEDMOE_REDUCE={red}" if red else "measured faster here"
        red = red or reduce_rule(config, platform, T, c2)
        red_txt = ("" if red == "deterministic" else
                   f"; GEMM2's k-sum as atomic adds into {'the output' if red == 'atomic_out' else 'an fp32 buffer'} "
                   f"({why}; not bitwise reproducible: deterministic=True keeps the fixed-order reduce)")
        early = red == "atomic_out" and FUSED_ZERO
        if early:
            red_txt += ("; the output zeroed by GEMM1 on the side (a share a tile; > 2^26 elements)"
                        if zero_in_gemm1(T * config.hidden_size)
                        else "; the output zeroed by the quantization of x (same launch)"
                        if quant.method != QuantMethod.NONE else "; the output zeroed ahead of the alignment")
        out[f"T={T}"] = (f"gemm1 BM{c1['BLOCK_SIZE_M']}xBN{c1['BLOCK_SIZE_N']}xBK{c1['BLOCK_SIZE_K']} "
                         f"w{c1.get('num_warps', 4)}s{c1.get('num_stages', 3)}{_extras(c1)}; gemm2 BM{c2['BLOCK_SIZE_M']}x"
                         f"BN{c2['BLOCK_SIZE_N']}xBK{c2['BLOCK_SIZE_K']} split{c2.get('SPLIT_K', 1)}{_extras(c2)}"
                         + hq + red_txt
                         + (("; the alignment's scan and scatter (> 512 pairs), GEMM1, GEMM2 and the reduce "
                             "(and a requantization between) as programmatic dependent launches" if red == "deterministic"
                             else "; the alignment's scan and scatter (> 512 pairs), GEMM1 (and the requantization "
                             "after it) and GEMM2 as programmatic dependent launches" if early
                             else "; the alignment's scan and scatter (> 512 pairs) and GEMM1 (and the requantization "
                             "after it) as programmatic dependent launches; GEMM2 an ordinary launch after the "
                             "output's zeroing") if prefill_pdl_ok(platform)
                            and prefill_pdl_bound(config, T) else ""))
    return out


def _make(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    return TritonExperts(config, weights, platform, deterministic=deterministic)


SPEC = register(BackendSpec(
    name="triton",
    description="Triton grouped GEMMs: fused gated activation in GEMM1, routing weight in GEMM2, k-sum "
                "as a fixed-order reduce (deterministic) or atomic adds into the output (large T); decode "
                "(split-K) and prefill tile regimes",
    make_experts=_make,
    quant_methods=frozenset(QUANT_MODE),
    quant_min_sm=QUANT_MIN_SM,
    min_sm=80,
    needs_triton=True,
    check=_check,
    convert_weights=convert_weights,
    variants=_variants,
))
