"""The only module that reads ``FUSEDMOE_*`` environment variables.

Each is read on call (not at import) so tests and users can change them at run time;
callers read them outside the forward pass (at construction / selection time).

| variable                    | meaning                                                      |
|-----------------------------|--------------------------------------------------------------|
| FUSEDMOE_BACKEND            | force a backend by name (same rules as an explicit request)   |
| FUSEDMOE_DISABLE_BACKENDS   | comma-separated backend names the oracle must skip            |
| FUSEDMOE_CHUNK_SIZE         | max tokens per ModularKernel chunk (default 16384)            |
| FUSEDMOE_CONFIG_DIR         | folder of tuned launch-config JSON files, searched first      |
| FUSEDMOE_DEBUG              | 1: run data-dependent input checks (these sync the device)    |
| FUSEDMOE_LOG_LEVEL          | log level of the ``fusedmoe`` logger (default WARNING)        |
| FUSEDMOE_FAST_LAUNCH        | 0: every Triton launch goes through ``kernel[grid](...)``     |
|                             | (no cached launcher, kernels/launcher.py; default 1)          |
| FUSEDMOE_DECODE_PAIRS       | the ``triton`` backend's decode kernels (kernels/decode.py)   |
|                             | serve T*k <= this many pairs; 0 turns them off (default:      |
|                             | max(k, E // 4) for E local experts; W8A8 by                   |
|                             | FUSEDMOE_W8A8_DECODE: auto / tc min(E // 2, 128) for E >= 64, |
|                             | a16 min(E // 4, 32), a8 E // 16; see backends/triton.py)      |
| FUSEDMOE_DECODE_PDL         | 0: the decode GEMM2 is not a programmatic dependent launch of |
|                             | GEMM1 (default 1 on sm90+ with a Triton that has it)           |
| FUSEDMOE_DECODE_TILES       | N tiles a decode GEMM2 program takes (kernels/decode.py       |
|                             | ``TILES``; default: ``decode.gemm2_tiles``'s rule), for A/Bs  |
| FUSEDMOE_DECODE_A3          | 0 / 1: the decode GEMM2 loads its activation rows in the      |
|                             | weight tile's layout (kernels/decode.py ``A3``; default:      |
|                             | ``decode.gemm2_a3``: 16-bit weights, at most 2 slots, triton  |
|                             | >= 3.7), for A/Bs                                             |
| FUSEDMOE_DECODE_SLOTS_FIRST | 0 / 1: the decode GEMM2's weight tile hinted into the layout  |
|                             | triton 3.6 picks (kernels/decode.py ``SLOTS_FIRST``; default: |
|                             | ``decode.gemm2_slots_first``: triton >= 3.7), for A/Bs        |
| FUSEDMOE_DECODE_SHARE       | 0 / 1: the tensor-core W8A8 decode GEMMs read an expert's     |
|                             | weights once for all its pairs (kernels/decode_tc.py          |
|                             | ``SHARE``; default: ``decode_tc.tc_share``: two tokens and    |
|                             | more), for A/Bs                                               |
| FUSEDMOE_PREFILL_PDL        | 0: the grouped (prefill) path's alignment scan / scatter,     |
|                             | GEMM1, requantization, GEMM2 and reduce are ordinary launches,|
|                             | not programmatic dependent launches of the kernel before      |
|                             | (default 1 where PDL exists, <= 64 pairs per local expert)    |
| FUSEDMOE_W8A8_DECODE        | how the ``triton`` decode kernels compute W8A8 schemes:       |
|                             | ``a16`` reads the 8-bit weights and keeps the activations     |
|                             | 16-bit (no quantization launches; more accurate); ``a8``      |
|                             | quantizes x and h as the scheme does (bit-compatible with the |
|                             | grouped path's activation rounding); ``tc`` as a8, with the   |
|                             | GEMMs on the tensor cores (kernels/decode_tc.py); ``auto``    |
|                             | (default): a16 for one token (H100: fp8_block two,            |
|                             | fp8_channel three; H200: fp8_channel two), tc for more (the   |
|                             | fastest each: backends/triton.py auto_a16_max_t)              |
| FUSEDMOE_H_QUANT            | where the ``triton`` grouped path quantizes GEMM2's input h   |
|                             | for fp8_block / fp8_channel: ``kernel``: 16-bit h, then a     |
|                             | quantization kernel applying the scheme's own rule;           |
|                             | ``epilogue``: in GEMM1's epilogue, fp8 in 1 x g groups        |
|                             | (fp8_block: its own 1 x bk, from the fp32 tile; fp8_channel:  |
|                             | 1 x 128, finer than its per-token rule). Unset: epilogue for  |
|                             | fp8_block (H100 0-0.3% faster), kernel for fp8_channel (H100: |
|                             | epilogue 3-19% slower at T >= 4096)                           |
| FUSEDMOE_REDUCE             | how the ``triton`` grouped GEMM2 sums a token's k slots when  |
|                             | the caller did not ask for determinism: ``deterministic``     |
|                             | (y [T*k, H], then a fixed-order reduce kernel; bitwise        |
|                             | reproducible), ``atomic_out`` (atomic adds straight into the  |
|                             | 16-bit output: no y, no reduce; the bits vary run to run),    |
|                             | ``atomic`` (an fp32 buffer, then a cast). Unset: the          |
|                             | backend's rule (``reduce_rule``: atomic_out where the H100    |
|                             | measured it 2-10% faster). Ignored (deterministic) when       |
|                             | ``deterministic=True`` is asked for                           |

FUSEDMOE_FAST_LAUNCH is the exception to "read on call": the launcher reads it at its first
launch and again after ``fusedmoe.kernels.launcher.reset()`` (a per-launch read of os.environ
would cost about as much as the launch it saves).
"""
from __future__ import annotations

import os

from .errors import ConfigError

DEFAULT_CHUNK_SIZE = 16384

VARIABLES = ("FUSEDMOE_BACKEND", "FUSEDMOE_DISABLE_BACKENDS", "FUSEDMOE_CHUNK_SIZE",
             "FUSEDMOE_CONFIG_DIR", "FUSEDMOE_DEBUG", "FUSEDMOE_LOG_LEVEL", "FUSEDMOE_FAST_LAUNCH", "FUSEDMOE_DECODE_PAIRS",
             "FUSEDMOE_DECODE_PDL", "FUSEDMOE_DECODE_TILES", "FUSEDMOE_DECODE_A3", "FUSEDMOE_DECODE_SLOTS_FIRST", "FUSEDMOE_DECODE_SHARE", "FUSEDMOE_PREFILL_PDL", "FUSEDMOE_W8A8_DECODE", "FUSEDMOE_H_QUANT",
             "FUSEDMOE_REDUCE")


def backend() -> str | None:
    v = os.environ.get("FUSEDMOE_BACKEND", "").strip()
    return v or None


def disabled_backends() -> frozenset[str]:
    v = os.environ.get("FUSEDMOE_DISABLE_BACKENDS", "")
    return frozenset(s.strip() for s in v.split(",") if s.strip())


def _int_var(name: str, min_value: int, expected: str, example: str) -> int | None:
    """An integer variable, None when unset; a clear error when it is not an int >= min_value."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        n = int(v)
    except ValueError:
        n = min_value - 1
    if n < min_value:
        raise ConfigError(name, v, expected, f"unset it or set e.g. {name}={example}")
    return n


def chunk_size() -> int:
    n = _int_var("FUSEDMOE_CHUNK_SIZE", 1, "a positive integer", "8192")
    return DEFAULT_CHUNK_SIZE if n is None else n


def config_dir() -> str | None:
    v = os.environ.get("FUSEDMOE_CONFIG_DIR", "").strip()
    return v or None


def debug() -> bool:
    return os.environ.get("FUSEDMOE_DEBUG", "0").strip() not in ("", "0", "false", "False")


def fast_launch() -> bool:
    """False when FUSEDMOE_FAST_LAUNCH is 0/false: no cached Triton launches (on by default)."""
    return os.environ.get("FUSEDMOE_FAST_LAUNCH", "1").strip() not in ("0", "false", "False")


def decode_pairs() -> int | None:
    """FUSEDMOE_DECODE_PAIRS as an int (None when unset: the backend's own rule)."""
    return _int_var("FUSEDMOE_DECODE_PAIRS", 0, "an integer >= 0 (0: no decode kernels)", "16")


def decode_tiles() -> int | None:
    """FUSEDMOE_DECODE_TILES as an int (None when unset: kernels/decode.py's own rule)."""
    return _int_var("FUSEDMOE_DECODE_TILES", 1, "an integer >= 1", "4")


def _switch(name: str) -> bool | None:
    """A 0 / 1 variable as a bool, None when unset; a clear error otherwise."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    if v in ("0", "1"):
        return v == "1"
    raise ConfigError(name, v, "0 or 1", "unset it for the default")


def decode_a3() -> bool | None:
    """FUSEDMOE_DECODE_A3 as a bool (None when unset: kernels/decode.py's own rule)."""
    return _switch("FUSEDMOE_DECODE_A3")


def decode_slots_first() -> bool | None:
    """FUSEDMOE_DECODE_SLOTS_FIRST as a bool (None when unset: kernels/decode.py's own rule)."""
    return _switch("FUSEDMOE_DECODE_SLOTS_FIRST")


def decode_w4() -> bool | None:
    """FUSEDMOE_DECODE_W4 as a bool (None when unset: kernels/decode.py's own rule)."""
    return _switch("FUSEDMOE_DECODE_W4")


def tc_early_w() -> bool:
    """FUSEDMOE_TC_EARLY_W 1: the tensor-core decode GEMM2 loads its first weight tile before it
    waits for h (kernels/decode_tc.py EARLY_W; off by default: on the H100 it gains 1-3% at T=2
    and loses 1-5% at T=3, docs/BENCHMARKS.md thirty-fourth section)."""
    return bool(_switch("FUSEDMOE_TC_EARLY_W"))


def tc_l2_pre() -> tuple | None:
    """FUSEDMOE_TC_L2_PRE "G1,G2" (or one number for both): before its wait for the kernel before
    it, the tensor-core decode GEMM1 asks L2 for the first G1 lines (128 bytes) of each of its
    weight rows, GEMM2 for the rows of its first G2 slots' experts (kernels/decode_tc.py
    L2_PRE). None when unset: the rule there (4 and 0 on an H100 or H200, measured; 0 and 0 elsewhere)."""
    v = os.environ.get("FUSEDMOE_TC_L2_PRE", "").strip()
    if not v:
        return None
    parts = v.split(",")
    try:
        nums = tuple(int(p) for p in parts)
    except ValueError:
        nums = ()
    if len(nums) == 1:
        nums = nums * 2
    if len(nums) != 2 or min(nums) < 0:
        raise ConfigError("FUSEDMOE_TC_L2_PRE", v, "two integers >= 0 as 'G1,G2' (or one for both)",
                          "e.g. FUSEDMOE_TC_L2_PRE=4,1, or unset it for the default")
    return nums


def decode_share() -> bool | None:
    """FUSEDMOE_DECODE_SHARE as a bool (None when unset: kernels/decode_tc.py's own rule)."""
    return _switch("FUSEDMOE_DECODE_SHARE")


def decode_pdl() -> bool:
    """False when FUSEDMOE_DECODE_PDL is 0/false (on by default where the device has it)."""
    return os.environ.get("FUSEDMOE_DECODE_PDL", "1").strip() not in ("0", "false", "False")


def prefill_pdl() -> bool:
    """False when FUSEDMOE_PREFILL_PDL is 0/false: the grouped path's alignment scan / scatter,
    GEMM1, requantization, GEMM2 and reduce then launch plainly (on by default where the
    device has PDL)."""
    return os.environ.get("FUSEDMOE_PREFILL_PDL", "1").strip() not in ("0", "false", "False")


def w8a8_decode() -> str:
    """FUSEDMOE_W8A8_DECODE: 'auto' (default), 'a16', 'a8' or 'tc'; a clear error otherwise."""
    v = os.environ.get("FUSEDMOE_W8A8_DECODE", "").strip().lower()
    if not v:
        return "auto"
    if v not in ("auto", "a16", "a8", "tc"):
        raise ConfigError("FUSEDMOE_W8A8_DECODE", v, "'auto', 'a16', 'a8' or 'tc'",
                          "unset it (auto: a16 for one token, tc above) or set FUSEDMOE_W8A8_DECODE=a16 / a8 / tc")
    return v


def h_quant() -> str:
    """FUSEDMOE_H_QUANT: 'kernel', 'epilogue', or '' when unset (the backend's default per
    scheme, ``backends/triton.py h_epilogue_on``); a clear error otherwise."""
    v = os.environ.get("FUSEDMOE_H_QUANT", "").strip().lower()
    if v not in ("", "epilogue", "kernel"):
        raise ConfigError("FUSEDMOE_H_QUANT", v, "'epilogue' or 'kernel'",
                          "unset it (the default per scheme), or set FUSEDMOE_H_QUANT=kernel (16-bit h, then the "
                          "scheme's own quantization kernel) or =epilogue (GEMM1 writes fp8 h with 1 x g group scales)")
    return v


def reduce() -> str | None:
    """FUSEDMOE_REDUCE: how the triton backend's grouped GEMM2 sums a token's k slots when
    the caller did not ask for determinism: 'deterministic', 'atomic' (fp32 buffer) or
    'atomic_out' (atomic adds into the output); None (unset): the backend's rule
    (backends/triton.py ``reduce_rule``)."""
    v = os.environ.get("FUSEDMOE_REDUCE", "").strip().lower()
    if not v:
        return None
    if v not in ("deterministic", "atomic", "atomic_out"):
        raise ConfigError("FUSEDMOE_REDUCE", v, "'deterministic', 'atomic' or 'atomic_out'",
                          "unset it (the backend's rule) or set FUSEDMOE_REDUCE=deterministic")
    return v


def log_level() -> str:
    return os.environ.get("FUSEDMOE_LOG_LEVEL", "WARNING").strip().upper() or "WARNING"


def snapshot() -> dict[str, str]:
    """Every FUSEDMOE_* variable that is set (for reports)."""
    return {k: v for k, v in os.environ.items() if k.startswith("FUSEDMOE_")}
