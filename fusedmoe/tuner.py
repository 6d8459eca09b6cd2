"""The launch-config tuner behind ``fusedmoe tune``: candidate configs, the search, the file writer.

A tool, not part of the forward pass: only the CLI (and tests) import it. It times candidates
with the bench harness on the GPU and writes the JSON files that ``fusedmoe.tuned_configs``
looks up at construction (format and lookup rules: that module and
``fusedmoe/kernels/configs/README.md``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

from . import env
from . import tuned_configs as tc
from .config import MoEConfig, QuantMethod, QuantScheme, Routing
from .errors import ConfigError, ConfigTypeError
from .tuned_configs import (VERSIONS_KEY, LaunchConfigs, Pair, _major_minor, _mm_str,  # noqa: F401
                            config_file_name, normalize_launch_config, override)

__all__ = [
    "candidate_configs", "search_point", "write_config_file", "tune", "DEFAULT_TUNE_TOKENS", "PointResult",
    "SMEM_LIMIT", "STAGES",
]

log = logging.getLogger("fusedmoe.tuner")

#: Token counts the tuner measures by default (the bench's sweep: decode to prefill).
DEFAULT_TUNE_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
# Warm-up replays (ms) before each candidate's timing after the first (which gets the harness's
# WARM_MS): the slow window follows newly quantized weights, not new graphs.
TUNE_WARM_MS = 5.0


# ----------------------------------------------------------------------------------------------
# the tuner's search space
# ----------------------------------------------------------------------------------------------
#: Shared memory one Triton program may use on Hopper (227 KiB).
SMEM_LIMIT = 232448


def _next_pow2(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, x))))


def _tokens_per_active_expert(T: int, E: int, top_k: int) -> float:
    """Average rows a hit expert sees: T*k slots spread over min(E, T*k) experts."""
    slots = T * top_k
    return slots / max(1, min(E, slots))


def _bytes_per_elem(scheme: QuantScheme, dtype: str) -> tuple:
    """(activation operand bytes, weight operand bytes) as the GEMMs load them."""
    m = scheme.method
    a = 1 if m.quantizes_activations and m != QuantMethod.NVFP4 else (4 if dtype == "float32" else 2)
    w = {16: 4 if dtype == "float32" else 2, 8: 1, 4: 0.5}[scheme.method.weight_bits]
    return a, w


def _smem(bm, bn, bk, stages, a_bytes, w_bytes, b_tiles: int = 1) -> float:
    return stages * (bm * bk * a_bytes + b_tiles * bn * bk * w_bytes)


STAGES = ("tiles", "pipeline", "split", "group", "tma", "persistent", "resident")


def candidate_configs(T: int, E: int, top_k: int, n_out: int, k_in: int, *, gemm: str = "gemm1",
                      gated: bool = True, scheme="none", dtype="bfloat16", stage: str = "tiles",
                      tiles: Iterable = (), space: Optional[dict] = None, bm_divides: Optional[int] = None) -> list:
    """Configs of one GEMM worth timing at T tokens.

    ``n_out``: output columns a program tiles (GEMM1: I per half when gated, the kernel holds
    gate and up accumulators; GEMM2: H); ``k_in``: the reduction dim (H, resp. I).
    Pruned around the shape: BLOCK_SIZE_M tracks the tokens per hit expert (no BM=128 when each
    expert gets one token), BLOCK_SIZE_N/K never exceed the matrix, stages fit shared memory,
    ``bm_divides``: only BMs that divide this one (the search no longer passes it: the backend
    aligns the tokens to the larger of the two GEMMs' BMs).
    ``stage``: 'tiles' (BM x BN x BK, heuristic warps/stages), 'pipeline' (warps x stages of
    ``tiles``), 'split' (GEMM2 only, few tokens per expert: SPLIT_K of ``tiles`` to fill the
    SMs), 'group' (GROUP_SIZE_M of ``tiles``, only when an expert spans several M blocks),
    'tma' (``tiles`` with USE_TMA, prefill tiles only, when triton has TMA descriptors),
    'persistent' (``tiles`` with PERSISTENT programs per SM, without and with FLATTEN, and
    one-tile-a-program ``tiles`` with HALF_TAIL, prefill only: more than 64 tokens per expert),
    'resident' (GEMM2, 16-bit or W8A8, K <= 256, prefill: A_RESIDENT tiles, all of N a program,
    warps x stages that fit).
    ``space`` ({key: [values]}) replaces the generated values of a key.
    """
    s = QuantScheme.parse(scheme)
    space = dict(space or {})
    a_b, w_b = _bytes_per_elem(s, dtype)
    b_tiles = 2 if gemm == "gemm1" and gated else 1
    m = _tokens_per_active_expert(T, E, top_k)
    # routing is uneven: the busiest expert gets ~2x the mean, and a BLOCK_M below its count
    # makes it read its weights twice (Mixtral T=64, 16/expert: BM 32 beat every BM 16)
    cap = min(128, max(16, _next_pow2(2 * m)))
    bms = space.get("BLOCK_SIZE_M") or sorted({max(16, cap // 2), cap})
    if bm_divides:
        bms = [b for b in bms if b <= bm_divides and bm_divides % b == 0] or [bm_divides]
    small = m <= 16
    bns = space.get("BLOCK_SIZE_N") or [b for b in ((32, 64, 128) if small else (64, 128, 256))
                                        if b <= max(32, _next_pow2(n_out))]
    bks = space.get("BLOCK_SIZE_K") or [b for b in ((64, 128, 256) if small else (64, 128))
                                        if b <= max(32, _next_pow2(k_in))]
    if s.method == QuantMethod.FP8_BLOCK:  # block scales are applied per K tile: BK must divide bk
        bk_blk = s.block_shape[1]            # else the largest power of two in bk (bk 96: 32)
        bks = space.get("BLOCK_SIZE_K") or [b for b in (64, 128) if bk_blk % b == 0] or [bk_blk & -bk_blk]
    elif s.group_size and s.method != QuantMethod.NONE:  # K tiles inside one scale group
        bks = space.get("BLOCK_SIZE_K") or [b for b in bks if b <= s.group_size and s.group_size % b == 0] \
            or [s.group_size]
    warps = space.get("num_warps") or [4, 8]
    stages = space.get("num_stages") or [2, 3, 4, 5]
    groups = space.get("GROUP_SIZE_M") or [1, 8, 16, 32]
    splits = space.get("SPLIT_K") or [1, 2, 4, 8, 16]
    persistents = space.get("PERSISTENT") or [1, 2]
    flattens = space.get("FLATTEN") or [False, True]
    half_tails = space.get("HALF_TAIL") or [False, True]
    sorted_key = "SORTED_X" if gemm == "gemm1" else "SORTED_H"
    sorteds = space.get(sorted_key) or [False, True]

    def make(bm, bn, bk, w, st, g=1, sk=1):
        return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
                "num_warps": w, "num_stages": st, "SPLIT_K": sk}

    def fits(bm, bn, bk, st):
        return _smem(bm, bn, bk, st, a_b, w_b, b_tiles) <= SMEM_LIMIT

    # block scales: per K group either a second dot tile scaled into the accumulator, or
    # (RESCALE) the accumulator rescaled in place; which is faster depends on the tile
    # (H100 deepseek-v3 tp8 T=16384: GEMM1 64x128 RESCALE 8.7% faster than the shipped 64x64,
    # RESCALE on that 64x64 21% slower)
    rescales = (space.get("RESCALE") or [False, True]) if s.method == QuantMethod.FP8_BLOCK else [None]
    out = []
    if stage == "tiles":
        for bm in bms:
            for bn in bns:
                for bk in bks:
                    w = 4 if bm * bn <= 64 * 128 else 8
                    fit = [st for st in stages if fits(bm, bn, bk, st)]
                    if fit:
                        c = make(bm, bn, bk, w, 4 if 4 in fit else max(fit))
                        out += [c if r is None else {**c, "RESCALE": r} for r in rescales]
    elif stage == "pipeline":
        for t in tiles:
            bm, bn, bk = t["BLOCK_SIZE_M"], t["BLOCK_SIZE_N"], t["BLOCK_SIZE_K"]
            for w in warps:
                if w == 8 and bm * bn < 64 * 64:  # 8 warps on a tiny tile leave warps idle
                    continue
                for st in stages:
                    if fits(bm, bn, bk, st):
                        out.append({**t, "num_warps": w, "num_stages": st})
    elif stage == "split":
        # GEMM1's activation is not linear: it never splits K. GEMM2 up to 64 tokens per expert
        # is still weight-bound, and with few experts (Mixtral: 8 x H/BN programs) it may not
        # fill the SMs without splitting its long K = I
        if gemm == "gemm2" and m <= 64:
            for t in tiles:
                for sk in splits:
                    if k_in // sk >= 2 * t["BLOCK_SIZE_K"]:
                        out.append({**t, "SPLIT_K": sk})
    elif stage == "group":
        for t in tiles:
            if m <= t["BLOCK_SIZE_M"]:  # one M block per expert: GROUP_SIZE_M changes nothing
                continue
            for g in groups:
                out.append({**t, "GROUP_SIZE_M": g})
    elif stage == "tma":
        # weight tiles through a TMA descriptor (grouped_gemm's USE_TMA; triton >= 3.4, Hopper+):
        # 0.4-3.6% on H100 prefill, mixed at T=1024: worth timing
        # where tiles are tensor-core sized; decode tiles (BM 16) are left alone
        # A gated GEMM1 also tries its gate and up tiles as one dot of width 2 BN (GU_ONE_DOT, needs
        # the descriptor; not with block scales): H100 Mixtral T=16384 18.3 -> 17.6 ms, T=1024 1552
        # -> 1449 us, deepseek-v3 tp8 T=16384 3685 -> 3489; qwen3 fp8_channel T=4096 (64 x 256)
        # 527 -> 543
        # A 16-bit layer also tries its A operand in sorted order, read by TMA: GEMM1's x copied
        # there first (SORTED_X, on the one-dot tile), GEMM2's h written there by GEMM1 (SORTED_H):
        # H100 Mixtral T=4096 4.9 -> 4.6 ms (both), T=1024 GEMM2 -5%; slower at qwen3 / deepseek
        # (k = 8: the copy of x is 8 times x)
        one_dot_ok = gemm == "gemm1" and gated and s.method != QuantMethod.FP8_BLOCK
        sorted_ok = s.method == QuantMethod.NONE and True in sorteds
        if _tma_available():
            for t in tiles:
                if t["BLOCK_SIZE_M"] >= 64 and not t.get("USE_TMA"):
                    out.append({**t, "USE_TMA": True})
                if t["BLOCK_SIZE_M"] >= 64 and one_dot_ok and not t.get("GU_ONE_DOT"):
                    out.append({**t, "USE_TMA": True, "GU_ONE_DOT": True})
                if t["BLOCK_SIZE_M"] >= 64 and sorted_ok and not t.get(sorted_key) and not t.get("A_RESIDENT"):
                    out.append({**t, "USE_TMA": True, **({"GU_ONE_DOT": True} if one_dot_ok else {}), sorted_key: True})
    elif stage == "persistent":
        # a few programs per SM looping over the tiles (grouped_gemm's PERSISTENT; FLATTEN fuses
        # the tile and K loops into one pipeline): prefill tiles with a short K loop leave the
        # pipeline fill and the output stores exposed (deepseek-v3 tp8 GEMM2: K = I = 256, 4
        # iterations of BK 64 per tile); decode grids are a few waves at most, nothing to gain
        # HALF_TAIL (a tile whose second half is padding runs at half height) beside them, one
        # tile a program only: with PERSISTENT it measured 6-20% slower (H100 Mixtral T=1024 /
        # 16384), one tile a program 0.2-1.4% faster (Mixtral T=1024 GEMM2)
        if m > 64:
            for t in tiles:
                if not t.get("PERSISTENT"):
                    base = {key: v for key, v in t.items() if key != "HALF_TAIL"}   # (not both)
                    out += [{**base, "PERSISTENT": p, "FLATTEN": fl} for p in persistents for fl in flattens]
                    if True in half_tails and t["BLOCK_SIZE_M"] >= 64 and not t.get("HALF_TAIL"):
                        out.append({**t, "HALF_TAIL": True})
    elif stage == "resident":
        # GEMM2 with A resident (grouped_gemm's A_RESIDENT), prefill: 16-bit, or W8A8 with
        # per-tensor / per-channel / block scales (deepseek-v3 tp8 fp8_block, K = 2 groups:
        # H100 T=16384 3728 -> 3086 us, T=4096 1252 -> 1088).
        # Each program keeps its BM rows of h (all of K) and loops over column tiles, the
        # weight loads pipelined across them. H100 deepseek-v3 tp8 bf16 T=16384:
        # 4400 -> 3917 us with BN 64, 4 stages, all of N in
        # one program; fewer column tiles a program were slower (x28 4049, x8 4257)
        from .kernels.grouped_gemm import resident_chunks  # noqa: PLC0415
        w8a8 = s.method in (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_BLOCK,
                            QuantMethod.INT8_CHANNEL)
        # K <= 256 only: qwen3's K = 768 (3 chunks) was 20-28% SLOWER than the tiled GEMM2 on
        # the H100 (fp8_channel T=4096 / 16384); the kernel still runs it
        chunks = resident_chunks(k_in, int(a_b), s.block_shape[1] if s.method == QuantMethod.FP8_BLOCK else None)
        if gemm == "gemm2" and (s.method == QuantMethod.NONE or w8a8) and chunks and k_in <= 256 and m > 64:
            kp = chunks[0] * chunks[1]                                      # K as the chunks hold it
            for bm in [b for b in (64, 128) if not bm_divides or (b <= bm_divides and bm_divides % b == 0)]:
                for bn in (32, 64, 128):
                    n_tiles = -(-n_out // bn)
                    for st in (2, 3, 4):
                        if (bm + st * bn) * kp * a_b <= SMEM_LIMIT - 16384:   # + the epilogue's scratch
                            for w in ((4, 8) if bm == 128 else (4,)):
                                out.append({**make(bm, bn, 64, w, st), "A_RESIDENT": n_tiles,
                                            **({"USE_TMA": True} if _tma_available() else {})})
    else:
        raise ConfigError("stage", stage, list(STAGES), "internal use")
    seen, uniq = set(), []
    for c in out:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


# ----------------------------------------------------------------------------------------------
# the tuner
# ----------------------------------------------------------------------------------------------
def check_tunable(config: MoEConfig, scheme: QuantScheme, platform) -> None:
    """A ConfigError unless the ``triton`` backend (the one that reads tuned launch configs)
    runs ``scheme``; it names the backend that serves the scheme instead."""
    from .backends.registry import get_spec  # noqa: PLC0415
    from .errors import FusedMoEError  # noqa: PLC0415
    from .oracle import select_backend  # noqa: PLC0415
    tunable = get_spec("triton").quant_methods
    if scheme.method in tunable:
        return
    try:
        served = f"'{select_backend(config, scheme, platform, log_once=False).winner}' serves it on {platform.name}"
    except FusedMoEError:
        served = f"no backend serves it on {platform.name} (`fusedmoe explain` says why)"
    raise ConfigError("quant", scheme.name, sorted(q.value for q in tunable),
                      f"{served} without tuned launch configs; tune one of the accepted schemes",
                      problem="has no tunable Triton kernel yet")


def _tma_available() -> bool:
    """TMA descriptors in this Triton (>= 3.4) and a Hopper-or-newer current GPU."""
    import torch  # noqa: PLC0415

    from .kernels.grouped_gemm import TensorDescriptor  # noqa: PLC0415  (None when triton lacks it)
    return TensorDescriptor is not None and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _key(c: dict) -> tuple:
    return tuple(sorted(c.items()))


@dataclass
class PointResult:
    """The tuner's answer at one T."""

    T: int
    gemm1: dict
    gemm2: dict
    rel_err: Optional[float]
    timed: int                                   # candidates timed (both GEMMs)
    failures: list = field(default_factory=list)  # "what: why" of candidates that could not run / were wrong


def _best_shapes(ranked: list, n: int) -> list:
    """The fastest config of each of the first ``n`` distinct (BM, BN, BK) tile shapes of
    ``ranked`` ([(µs, config)], fastest first)."""
    out, seen = [], set()
    for _, c in ranked:
        shape = (c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], c["BLOCK_SIZE_K"])
        if shape not in seen:
            seen.add(shape)
            out.append(c)
            if len(out) == n:
                break
    return out


def search_point(T: int, *, E: int, top_k: int, H: int, N13: int, I: int, scheme="none", dtype="bfloat16",
                 default_pair: Pair, measure: Callable, check: Callable, search_space: Optional[dict] = None,
                 on_step: Optional[Callable] = None, on_total: Optional[Callable] = None) -> PointResult:
    """The search at one T, free of devices (tests drive it with fakes).

    ``measure(pair) -> µs`` times the experts forward with launch configs ``pair`` (raise if the
    config cannot launch); ``check(pair) -> (ok, rel_err)`` compares with the reference.
    GEMM1 is searched with GEMM2 at ``default_pair[1]``, then GEMM2 with GEMM1 at its winner
    (GEMM2's BLOCK_SIZE_M free of GEMM1's: the backend aligns the tokens to the larger one,
    backends/triton.py ``align_bm``). Each GEMM: tiles, then warps x stages of the best
    two tiles, then (GEMM2, decode) SPLIT_K of the best two, then GROUP_SIZE_M of the best,
    then the best two tile shapes with TMA weight loads (prefill tiles, triton >= 3.4), then the best as a
    persistent launch (prefill), then (GEMM2, 16-bit or W8A8, K <= 256, prefill) the
    A-resident kernel's tiles.
    The fastest correct pair among the top three of each GEMM wins.
    """
    s = QuantScheme.parse(scheme)
    timed: dict = {}
    failures: list = []

    def search(gemm: str, fixed: dict, n_out: int, k_in: int, bm_divides: Optional[int] = None) -> list:
        def run(cands):
            if on_total:
                on_total(len(cands))
            for c in cands:
                if (gemm, _key(c)) not in timed:
                    pair = (c, fixed) if gemm == "gemm1" else (fixed, c)
                    try:
                        timed[(gemm, _key(c))] = (float(measure(pair)), c)
                    except Exception as e:  # a config the kernel cannot launch (shared memory, ...)
                        failures.append(f"{gemm} {c}: {type(e).__name__}: {str(e)[:120]}")
                        timed[(gemm, _key(c))] = (math.inf, c)
                if on_step:
                    on_step(f"T={T} {gemm}")

        def ranked():
            return [v for v in sorted((v for (g, _), v in timed.items() if g == gemm), key=lambda v: v[0])
                    if v[0] < math.inf]

        kw = dict(gemm=gemm, gated=gated, scheme=s, dtype=dtype, space=search_space, bm_divides=bm_divides)
        run(candidate_configs(T, E, top_k, n_out, k_in, stage="tiles", **kw))
        run(candidate_configs(T, E, top_k, n_out, k_in, stage="pipeline", tiles=[c for _, c in ranked()[:2]], **kw))
        run(candidate_configs(T, E, top_k, n_out, k_in, stage="split", tiles=[c for _, c in ranked()[:2]], **kw))
        run(candidate_configs(T, E, top_k, n_out, k_in, stage="group", tiles=[c for _, c in ranked()[:1]], **kw))
        # TMA on the best two tile shapes (the pipeline stage's variants of the best would
        # crowd the top two): a shape that ranks second without TMA may win with it (H100
        # Mixtral T=256: GEMM1 128 x (2 x 64) x 128 with TMA beat the tuner's pick by 1.8%)
        run(candidate_configs(T, E, top_k, n_out, k_in, stage="tma", tiles=_best_shapes(ranked(), 2), **kw))
        run(candidate_configs(T, E, top_k, n_out, k_in, stage="persistent", tiles=[c for _, c in ranked()[:1]], **kw))
        run(candidate_configs(T, E, top_k, n_out, k_in, stage="resident", **kw))
        return [c for _, c in ranked()]

    gated = N13 == 2 * I
    ranked1 = search("gemm1", default_pair[1], I if gated else N13, H)
    if not ranked1:
        raise ConfigError("tune", f"T={T}", "at least one launchable gemm1 config",
                          "every candidate failed: " + "; ".join(failures[:3]), problem="found no config")
    ranked2 = search("gemm2", ranked1[0], H, I)
    if not ranked2:
        raise ConfigError("tune", f"T={T}", "at least one launchable gemm2 config",
                          "every candidate failed: " + "; ".join(failures[:3]), problem="found no config")
    for c1 in ranked1[:3]:
        for c2 in ranked2[:3]:
            ok, err = check((c1, c2))
            if ok:
                return PointResult(T, c1, c2, err, len(timed), failures)
            failures.append(f"wrong result (rel err {err}) with gemm1={c1} gemm2={c2}")
    raise ConfigError("tune", f"T={T}", "a config whose output matches the reference",
                      "the fastest configs give wrong results (a kernel bug): " + "; ".join(failures[-3:]),
                      problem="found no correct config")


def _reset_workspaces(pe) -> None:
    """Drop the experts' cached workspaces: their sizes depend on the launch config (BLOCK_SIZE_M
    pads the alignment, SPLIT_K multiplies GEMM2's scratch), which override() just changed."""
    reset = getattr(getattr(pe, "kernel", None), "reset_workspaces", None)
    if reset is not None:
        reset()


@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive lock around a read-merge-write of ``path``: fcntl.flock on ``path + '.lock'``
    (the file beside it stays: removing it would race with a waiting writer). Where fcntl is
    missing (Windows) there is no lock."""
    try:
        import fcntl  # noqa: PLC0415
    except ImportError:
        yield
        return
    with open(path + ".lock", "a", encoding="utf-8") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def existing_file(path: str, force: bool = False) -> Optional[dict]:
    """The tuned file at ``path`` to merge into, None when there is none. A file the lookup
    would ignore (unreadable, not JSON, an entry that fails its checks) is a ConfigError
    naming it, unless ``force``: then it is None and the write replaces it."""
    if not os.path.lexists(path):
        return None
    try:
        data = tc.read_config_file(path)
        tc.check_file(data, os.path.basename(path), *tc.name_fields(os.path.basename(path)))
    except (ConfigError, ConfigTypeError) as e:
        if force:
            log.warning("fusedmoe: replacing the malformed tuned config file %s (force): %s", path, e)
            return None
        raise ConfigError("tuned config file", os.path.basename(path),
                          "a tuned config file fusedmoe can read, or none",
                          "fix it or move it away, or overwrite it with force=True (`fusedmoe tune --force`)",
                          problem=f"at {path} is malformed, refusing to overwrite it ({e})") from None
    return data


def _merged(old: Optional[dict], results: dict, meta: Optional[dict], run: Optional[str]) -> dict:
    """The file to write: ``results`` merged into ``old`` (see ``write_config_file``)."""
    entries, old_meta = {}, {}
    mode = "new"                # "same": the file's own Triton; "section": another Triton's file
    if old is not None:
        fv = old.get("triton_version")
        if fv is None or _major_minor(fv) == _major_minor(run) or _mm_str(run) is None:
            mode, src = "same", old
        else:
            mode, src = "section", (old.get(VERSIONS_KEY) or {}).get(_mm_str(run)) or {}
        entries = {int(k): v for k, v in src.items() if str(k).isdigit()}
        old_meta = src.get("meta") if isinstance(src.get("meta"), dict) else {}
    entries.update({int(T): v for T, v in results.items()})
    data = {"triton_version": run}
    for T in sorted(entries):
        data[str(T)] = entries[T]
    if meta is not None or old_meta:
        # the per-T records of earlier runs stay (for the T kept), as do notes added by hand
        meta = meta or {}
        points = {k: v for k, v in (old_meta.get("points") or {}).items() if k.isdigit() and int(k) in entries}
        points.update(meta.get("points") or {})
        data["meta"] = {**{k: v for k, v in old_meta.items() if k not in meta}, **meta, "points": points}
    if mode == "same" and isinstance(old.get(VERSIONS_KEY), dict):
        data[VERSIONS_KEY] = old[VERSIONS_KEY]          # other Tritons' sections stay
    elif mode == "section":
        data.pop("triton_version")
        data = {**old, VERSIONS_KEY: {**(old.get(VERSIONS_KEY) or {}), _mm_str(run): data}}
    return data


def _replace(path: str, data: dict, mode: int) -> None:
    """Write ``data`` to a temporary file of its own beside ``path``, then rename it over
    ``path``: a reader sees the old file or the new one, never a part, and a failed write
    leaves the old one as it was."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)                            # mkstemp makes it private (0600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_config_file(path: str, results: dict, meta: Optional[dict] = None, *, force: bool = False) -> str:
    """Write {T: {"gemm1", "gemm2"}} (+ meta) to ``path`` atomically. Entries of an existing
    file tuned with the same Triton major.minor are kept for the T not re-tuned. An existing
    file tuned under another major.minor is kept whole: the results go to its section for the
    running Triton (``VERSIONS_KEY``), which the lookup prefers under that Triton.

    Concurrent writers of one file (several ``fusedmoe tune`` runs) serialize on a lock beside
    it, so each one's entries survive. An existing file the lookup would ignore is not
    overwritten unless ``force``. Failures to read or write are ConfigErrors naming the path."""
    path = os.path.abspath(path)
    tag, block_k = tc.name_fields(os.path.basename(path))
    for T, v in results.items():        # never write what the lookup would ignore
        pair = tc._split_entry(v, f"results[{T!r}]")
        if tag is not None:
            tc.check_pair(pair, tag, block_k, f"results[{T!r}]")
    try:
        with _file_lock(path):
            old = existing_file(path, force)
            mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o644
            _replace(path, _merged(old, results, meta, tc._running_triton_version()), mode)
    except OSError as e:
        raise ConfigError("tuned config file", os.path.basename(path),
                          "a path in a folder this process can write",
                          "check the folder's permissions and free space, or write elsewhere (--out-dir or "
                          "FUSEDMOE_CONFIG_DIR)", problem=f"cannot be written at {path} ({e})") from None
    tc._WARNED.discard(os.path.basename(path))
    tc._WARNED.discard(path)
    return path


def tune(config: MoEConfig, scheme="none", tokens: Sequence[int] = DEFAULT_TUNE_TOKENS, *, platform=None,
         search_space: Optional[dict] = None, out_dir: Optional[str] = None, progress: bool = True,
         skew: Optional[float] = None, backend: Optional[str] = None, seed: int = 0,
         budget_ms: float = 60.0, force: bool = False) -> str:
    """Measure launch configs for ``config`` x ``scheme`` at each T in ``tokens``; write the JSON; return its path.

    Per T: realistic routing (random logits -> softmax top-k; with ``skew`` = alpha, expert
    popularity is drawn from Dirichlet(alpha), the distribution-aware tuning of FlashInfer #4106,
    so hot experts get many tokens as in real traffic); inputs rotate so L2 does not hold them.
    The Triton backend's whole experts forward runs under ``override(pair)``, captured in a CUDA
    graph (median of replays); ``search_point`` says what is searched. The winner is checked
    against ``reference_moe``. ``search_space``: {key: [values]} replacing the generated values.
    The file also records, per T, the tuned and the default configs' times. ``force``: replace
    an existing file that cannot be read instead of refusing (``write_config_file``).
    Schemes the ``triton`` backend does not run have nothing to tune: a ConfigError says which
    backend serves them.
    """
    from .bench import harness  # noqa: PLC0415
    from .platform import Platform  # noqa: PLC0415
    plat = Platform.resolve(platform)
    s = QuantScheme.parse(scheme)
    check_tunable(config, s, plat)
    if plat.kind != "cuda":
        raise ConfigError("platform", plat.name, "a CUDA GPU", "run `fusedmoe tune` on the GPU the configs are for")
    tokens = sorted({int(t) for t in tokens})
    if not tokens or tokens[0] < 1:
        raise ConfigError("tokens", tokens, "positive token counts", "e.g. --tokens 1,16,64,256,1024,4096")
    cfg = config.replace(routing=Routing())  # the experts stage only; routing is generated here
    out_dir = out_dir or env.config_dir() or tc.package_config_dir()
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError("out_dir", out_dir, "a folder this process can create and write",
                          "pick another folder (--out-dir or FUSEDMOE_CONFIG_DIR)",
                          problem=f"cannot be created ({e})") from None
    E, k, H, N13, I = cfg.num_local_experts, cfg.top_k, cfg.hidden_size, cfg.n13, cfg.intermediate_size
    fname = config_file_name(E, I, plat.device_name, s, cfg.dtype)
    if not force:
        existing_file(os.path.join(out_dir, fname))          # refuse now, not after the measurements
    import torch  # noqa: PLC0415
    from .layer import prepare_experts  # noqa: PLC0415

    device = torch.device("cuda")
    weights = harness.make_weights(cfg, s, device, seed=seed)
    backend = backend or "triton"
    pe = prepare_experts(cfg, weights, backend=backend, platform=plat)
    backend_lc = getattr(getattr(getattr(pe, "kernel", None), "experts", None), "lc", None)
    if isinstance(backend_lc, LaunchConfigs):   # the backend's own defaults (what runs untuned)
        defaults = backend_lc.defaults_only()
    else:
        defaults = LaunchConfigs.for_config(cfg, s, plat).defaults_only()
    wbytes = harness.total_weight_bytes(weights)
    l2 = harness.l2_bytes()
    bar = harness.Progress(total=None, desc=f"tune {fname}", enabled=progress)
    results, points = {}, {}
    warm = [harness.WARM_MS]
    t_start = time.perf_counter()
    with torch.inference_mode():
        for T in tokens:
            sets = harness.make_input_sets(cfg, T, device, seed=seed + T, skew=skew, l2_bytes=l2,
                                           weight_bytes=wbytes, min_sets=2, max_sets=16)

            def measure(pair, sets=sets):
                # the first timing over these weights gets the harness's full warm-up (the slow
                # window after allocation, harness.WARM_MS); the candidates after it a short one
                _reset_workspaces(pe)
                with override(pair):
                    t = harness.time_impl(pe, sets, graph=True, eager=False, budget_ms=budget_ms,
                                          min_reps=3, warm_ms=warm[0])
                warm[0] = TUNE_WARM_MS
                return t.best_us

            def check(pair, T=T):
                _reset_workspaces(pe)
                with override(pair):
                    r = harness.check_impl(pe, cfg, weights, T, device, seed=seed + 7919 * T, skew=skew)
                return r.ok, r.rel_err

            default_pair = defaults._lookup(T)
            pt = search_point(T, E=E, top_k=k, H=H, N13=N13, I=I, scheme=s, dtype=cfg.dtype,
                              default_pair=default_pair, measure=measure, check=check, search_space=search_space,
                              on_step=lambda msg: bar.update(1, msg), on_total=bar.add_total)
            tuned_us = measure((pt.gemm1, pt.gemm2))
            try:
                default_us = measure(default_pair)
            except Exception as e:  # the default itself cannot launch: report, do not fail the tuning
                default_us = None
                pt.failures.append(f"default config failed: {e}")
            kept_default = default_us is not None and default_us < tuned_us
            if kept_default:   # the search space missed the default's tiles: never write a regression
                pt = PointResult(T, default_pair[0], default_pair[1], pt.rel_err, pt.timed, pt.failures)
                tuned_us = default_us
            results[T] = {"gemm1": pt.gemm1, "gemm2": pt.gemm2}
            points[str(T)] = {"tuned_us": round(tuned_us, 3),
                              "default_us": None if default_us is None else round(default_us, 3),
                              "speedup_vs_default": round(default_us / tuned_us, 3) if default_us else None,
                              "rel_err": pt.rel_err, "candidates": pt.timed, "failed": len(pt.failures),
                              "kept_default": kept_default}
            for f_ in pt.failures:
                log.debug("tune T=%d: %s", T, f_)
    bar.close()
    meta = {"device": plat.name, "device_name": plat.device_name, "backend": backend,
            "shape": {"E": E, "N": I, "H": H, "top_k": k, "activation": cfg.activation.value, "dtype": cfg.dtype},
            "scheme": s.name, "routing": "uniform" if skew is None else f"dirichlet(alpha={skew})",
            "torch": torch.__version__, "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "seconds": round(time.perf_counter() - t_start, 1), "points": points}
    return write_config_file(os.path.join(out_dir, fname), results, meta, force=force)
