"""Token-expert alignment for the grouped GEMMs (moe_align_block_size), on the device.

Legend: T tokens, k top-k, n = T*k (token, slot) pairs, flattened as s = t*k + j,
E_loc local experts (rows of w13), E_g global experts (length of expert_map), BM block_m.

Output (``AlignResult``):
  sorted_ids             int32 [max_padded]   slots s grouped by local expert ascending, each
                                               expert's run padded to a multiple of BM with the
                                               sentinel n; ascending s inside an expert
                                               (deterministic); sentinel past the end too.
  expert_ids             int32 [max_padded/BM] local expert owning block b; -1 past the end.
  num_tokens_post_padded int32 [1]             padded total (a device scalar: no host sync).

Pairs whose expert is not local (expert_map[g] == -1) or out of range are DROPPED: they
never appear, so they cost nothing in the GEMMs and contribute zero.

Algorithm (no atomics, so the result is the same on every run):
  n <= SMALL_MAX: one program does everything (one launch: decode pays 2-4 us on H200).
    histogram of local ids (bin E_loc collects dropped pairs) -> padded run lengths ->
    exclusive scan = run starts; keys e*CHUNK + i sorted in registers give each pair its
    rank inside its expert; position = start[e] + rank.
  n > SMALL_MAX: the same in three launches over CHUNK-sized chunks:
    1. count:   histogram per chunk                      -> counts [C, E_BINS]
    2. scan:    P programs (_scan_launch: ~ one CB-chunk block of base rows and one FILL_B
                step of expert_ids each, capped; scan_programs= forces P). Each sums all of
                counts itself (totals -> run starts; its carry = the chunks before its own),
                then writes a disjoint share: the per-(chunk, expert) base positions of its
                contiguous chunk range, FILL_B steps of expert_ids (binary search over run
                ends) and of the tail's sentinel, its experts' padding sentinel; program 0
                the total                                -> base [C, E_BINS]
    3. scatter: per chunk, sort keys, position = base[c, e] + rank in chunk.
  Every value comes from the same integer sums whatever P is: the bits do not depend on it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .launcher import cdiv, launch, next_power_of_2
from .common import gdc_launch_dependents, gdc_wait

__all__ = ["AlignResult", "align_block_size", "max_padded_size", "SMALL_MAX", "CHUNK"]

# One program handles n <= SMALL_MAX pairs; above, 3 launches over n/chunk programs.
# H200 (CUDA graph, E=128): n=128 one program 4.3 us; n=1024 one program 10.8 us vs
# chunked(128) 8.6 us; n=8192 chunk 512 11.6 us (256: 13.5); n=131072 chunk 1024 37 us
# (256: 100 us, the then single-program scan looping over 512 chunks).
SMALL_MAX = 512
CHUNK = None          # None: chosen by n, see _chunk_for
_FILL_B = 1024        # blocks / slots written per step by _write_layout's fill loops


def _chunk_for(n: int) -> int:
    """Pairs per chunk of the 3-launch path. H100 (CUDA graph,
    E=128): n=32768 chunk 512 12.4 us, 1024 15.7, 256
    13.8; n=131072 1024 19.6 us, 512 20.2, 2048 34.7; n=8192 256 10.5, 512 10.9 (H200: 512
    11.6, 256 13.5)."""
    return 128 if n <= 4096 else (512 if n <= 32768 else 1024)


@dataclass
class AlignResult:
    """Alignment of (token, slot) pairs to BM-row blocks of one expert each."""

    sorted_ids: torch.Tensor              # int32 [max_padded]
    expert_ids: torch.Tensor              # int32 [max_padded // block_m]
    num_tokens_post_padded: torch.Tensor  # int32 [1]
    block_m: int = 16
    num_pairs: int = 0                    # n = T*k, also the sentinel value
    num_experts: int = 0                  # E_loc
    topk_ids: Optional[torch.Tensor] = None    # int [T, k] it was built from (the reduce reads it)
    expert_map: Optional[torch.Tensor] = None  # int32 [E_g] or None

    @property
    def max_padded(self) -> int:
        return self.sorted_ids.numel()

    @property
    def max_blocks(self) -> int:
        return self.expert_ids.numel()


def max_padded_size(num_pairs: int, block_m: int, num_experts: int) -> int:
    """Host bound on the padded length: n + min(n, E_loc) * (BM - 1), rounded up to BM.

    At most min(n, E_loc) experts are non-empty and each wastes < BM rows; the min(n, .)
    keeps decode grids small (T=1, k=8, E=128, BM=16: 128 rows, not 8 + 128*15).
    """
    bound = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    return cdiv(bound, block_m) * block_m


# ----------------------------------------------------------------------------------------
@triton.jit
def _local_expert(ids_ptr, map_ptr, offs, n, num_global, E, HAS_MAP: tl.constexpr):
    """Local expert of each pair in ``offs``; E (the drop bin) when absent, dropped or bad."""
    valid = offs < n
    g = tl.load(ids_ptr + offs, mask=valid, other=-1).to(tl.int32)
    if HAS_MAP:
        ok = valid & (g >= 0) & (g < num_global)
        loc = tl.load(map_ptr + g, mask=ok, other=-1).to(tl.int32)
    else:
        loc = g
    return tl.where((loc >= 0) & (loc < E), loc, E)


@triton.jit
def _runs(counts, E, BM: tl.constexpr, E_BINS: tl.constexpr):
    """Per-expert counts -> (count, padded start, padded end, padded total); bins >= E empty."""
    bins = tl.arange(0, E_BINS)
    cnt = tl.where(bins < E, counts, 0)
    padded = (cnt + BM - 1) // BM * BM
    end = tl.cumsum(padded, 0)
    return cnt, end - padded, end, tl.sum(padded, 0)


@triton.jit
def _write_layout(sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, cnt, start, end, total,
                  n, E, max_padded, max_blocks, pid, nprog,
                  BM: tl.constexpr, E_BINS: tl.constexpr, LOG_E: tl.constexpr, FILL_B: tl.constexpr,
                  EP: tl.constexpr):
    """Everything but the real pairs: expert_ids, sentinel in padding and tail, the total.

    Program ``pid`` of ``nprog`` writes its share (any nprog >= 1; the shares are disjoint):
    expert_ids in FILL_B-block steps pid, pid + nprog, ...; the same for the tail's FILL_B
    steps; the padding of the EP-expert slices pid, pid + nprog, ... (EP divides E_BINS);
    program 0 the total."""
    # expert of block b = number of real experts whose run ends at or before b*BM: a
    # branchless binary search over the nondecreasing run ends (log2(E_BINS) gathers per
    # block; a [blocks, E_BINS] compare cost 100+ us at n = 131072 in one program)
    for b0 in range(pid * FILL_B, max_blocks, nprog * FILL_B):
        b = b0 + tl.arange(0, FILL_B)
        target = b * BM
        eid = tl.zeros([FILL_B], dtype=tl.int32)
        for s in tl.static_range(LOG_E):
            cand = eid + (E_BINS >> (s + 1))
            eid = tl.where(tl.gather(end, cand - 1, 0) <= target, cand, eid)
        eid = tl.where(target < total, eid, -1)
        tl.store(expert_ids_ptr + b, eid, mask=b < max_blocks)
    # each expert's padding: [start + cnt, end), fewer than BM slots
    JB: tl.constexpr = BM if BM < 16 else 16
    if EP == E_BINS:      # one slice: the whole vectors (the one-program kernels)
        if pid == 0:
            for j0 in tl.static_range(0, BM, JB):
                j = j0 + tl.arange(0, JB)
                pos = (start + cnt)[:, None] + j[None, :]                          # [E_BINS, JB]
                tl.store(sorted_ids_ptr + pos, tl.zeros_like(pos) + n, mask=pos < end[:, None])
    else:
        for e0 in range(pid * EP, E_BINS, nprog * EP):
            e = e0 + tl.arange(0, EP)
            pad_lo = tl.gather(start + cnt, e, 0)                                # [EP]
            pad_hi = tl.gather(end, e, 0)
            for j0 in tl.static_range(0, BM, JB):
                j = j0 + tl.arange(0, JB)
                pos = pad_lo[:, None] + j[None, :]                                 # [EP, JB]
                tl.store(sorted_ids_ptr + pos, tl.zeros_like(pos) + n, mask=pos < pad_hi[:, None])
    # the tail [total, max_padded): blocks the GEMMs skip, made harmless anyway
    for p0 in range(total // FILL_B * FILL_B + pid * FILL_B, max_padded, nprog * FILL_B):
        p = p0 + tl.arange(0, FILL_B)
        tl.store(sorted_ids_ptr + p, tl.zeros_like(p) + n, mask=(p >= total) & (p < max_padded))
    if pid == 0:
        tl.store(ntpp_ptr, total)


@triton.jit
def _align_small_kernel(ids_ptr, map_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,
                        n, num_global, E, max_padded, max_blocks,
                        HAS_MAP: tl.constexpr, BM: tl.constexpr, E_BINS: tl.constexpr, LOG_E: tl.constexpr,
                        BLOCK: tl.constexpr, FILL_B: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    loc = _local_expert(ids_ptr, map_ptr, offs, n, num_global, E, HAS_MAP)        # [BLOCK]
    counts = tl.histogram(loc, E_BINS)                                          # [E_BINS]
    cnt, start, end, total = _runs(counts, E, BM, E_BINS)
    _write_layout(sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, cnt, start, end, total,
                  n, E, max_padded, max_blocks, 0, 1, BM, E_BINS, LOG_E, FILL_B, E_BINS)
    # rank inside the expert from a sort of (expert, index) keys; dropped pairs sort last
    keys = tl.sort(loc * BLOCK + offs)                                          # [BLOCK]
    se = keys // BLOCK
    first = tl.cumsum(counts, 0) - counts      # first sorted position of each expert's pairs
    base = tl.gather(start - first, tl.minimum(se, E_BINS - 1), 0)              # [BLOCK]
    tl.store(sorted_ids_ptr + base + offs, keys % BLOCK, mask=se < E)


@triton.jit
def _align_count_kernel(ids_ptr, map_ptr, counts_ptr, n, num_global, E,
                        HAS_MAP: tl.constexpr, E_BINS: tl.constexpr, CHUNK_: tl.constexpr,
                        PDL: tl.constexpr = False):
    if PDL:       # the scan after it is a dependent launch: let it start (it waits for this)
        gdc_launch_dependents()
    c = tl.program_id(0)
    offs = c * CHUNK_ + tl.arange(0, CHUNK_)
    loc = _local_expert(ids_ptr, map_ptr, offs, n, num_global, E, HAS_MAP)
    tl.store(counts_ptr + c * E_BINS + tl.arange(0, E_BINS), tl.histogram(loc, E_BINS))


@triton.jit
def _align_scan_kernel(counts_ptr, base_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,
                       num_chunks, n, E, max_padded, max_blocks,
                       BM: tl.constexpr, E_BINS: tl.constexpr, LOG_E: tl.constexpr, CB: tl.constexpr,
                       CT: tl.constexpr, FILL_B: tl.constexpr, EP: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (P,). Every program sums the counts itself (the totals: run starts); program p
    writes the base rows of its range of CB-chunk blocks and its share of _write_layout."""
    if PDL:       # a programmatic dependent launch: the next may launch, the counts must be done
        gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # this program's chunks [c_lo, c_hi): whole CB blocks, contiguous (its carry is one sum)
    per = tl.cdiv(tl.cdiv(num_chunks, CB), nprog) * CB
    c_lo = tl.minimum(pid * per, num_chunks)
    c_hi = tl.minimum(c_lo + per, num_chunks)
    # one pass over counts: carry = pairs of each expert in chunks before c_lo, then the rest
    bins = tl.arange(0, E_BINS)
    carry = tl.zeros([E_BINS], dtype=tl.int32)
    for c0 in range(0, c_lo, CT):
        c = c0 + tl.arange(0, CT)
        tile = tl.load(counts_ptr + c[:, None] * E_BINS + bins[None, :], mask=c[:, None] < c_lo, other=0)
        carry += tl.sum(tile, 0)
    tot = carry                                   # + the chunks from c_lo on
    for c0 in range(c_lo, num_chunks, CT):
        c = c0 + tl.arange(0, CT)
        tile = tl.load(counts_ptr + c[:, None] * E_BINS + bins[None, :], mask=c[:, None] < num_chunks, other=0)
        tot = tot + tl.sum(tile, 0)
    cnt, start, end, total = _runs(tot, E, BM, E_BINS)
    _write_layout(sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, cnt, start, end, total,
                  n, E, max_padded, max_blocks, pid, nprog, BM, E_BINS, LOG_E, FILL_B, EP)
    # base[c, e] = start[e] + pairs of e in earlier chunks - first sorted position of e in c
    for c0 in range(c_lo, c_hi, CB):
        c = c0 + tl.arange(0, CB)
        m = c[:, None] < c_hi
        tile = tl.load(counts_ptr + c[:, None] * E_BINS + bins[None, :], mask=m, other=0)  # [CB, E_BINS]
        earlier = tl.cumsum(tile, 0) - tile + carry[None, :]
        first = tl.cumsum(tile, 1) - tile
        tl.store(base_ptr + c[:, None] * E_BINS + bins[None, :], start[None, :] + earlier - first, mask=m)
        carry += tl.sum(tile, 0)


@triton.jit
def _align_scatter_kernel(ids_ptr, map_ptr, base_ptr, sorted_ids_ptr, n, num_global, E,
                          HAS_MAP: tl.constexpr, E_BINS: tl.constexpr, CHUNK_: tl.constexpr,
                          PDL: tl.constexpr = False):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    c = tl.program_id(0)
    i = tl.arange(0, CHUNK_)
    loc = _local_expert(ids_ptr, map_ptr, c * CHUNK_ + i, n, num_global, E, HAS_MAP)
    keys = tl.sort(loc * CHUNK_ + i)
    se = keys // CHUNK_
    keep = se < E
    base = tl.load(base_ptr + c * E_BINS + se, mask=keep, other=0)
    tl.store(sorted_ids_ptr + base + i, c * CHUNK_ + keys % CHUNK_, mask=keep)


# ----------------------------------------------------------------------------------------
def _bins(num_experts: int) -> tuple:
    """(E_BINS, LOG_E): histogram bins for E_loc experts plus the drop bin, and log2 of it."""
    e_bins = next_power_of_2(num_experts + 1)
    return e_bins, e_bins.bit_length() - 1


SCAN_MAX_PROGRAMS = 64   # cap on the scan's grid (scan_programs=None)
# at least this many (up to one a chunk): H100 (whole align
# call, CUDA graph) qwen3 n=32768 BM 64: P=1 19.2 us, 2 16.5, 8 15.6; n=8192: 12.7 / 11.8 / 10.8;
# n=131072: P=1 36.6, 8 19.6, 16-32 19.3; deepseek E=256 n=131072: 47.9 / 22.8 (8) / 21.2 (16)
_SCAN_MIN_PROGRAMS = 8
_PAD_LANES = 8192        # padding lanes (experts x BM) one scan program should write at most


@functools.lru_cache(maxsize=256, typed=True)
def _scan_launch(num_chunks: int, block_m: int, num_experts: int, max_blocks: int, scan_programs: Optional[int],
                 pdl: bool) -> tuple:
    """(P, constexprs) of the chunked path's scan, once per shape.

    P (scan_programs, else chosen): enough programs that each writes about one CB-chunk block
    of base rows, one FILL_B step of expert_ids and at most _PAD_LANES padding lanes, at least
    min(_SCAN_MIN_PROGRAMS, chunks), capped at SCAN_MAX_PROGRAMS. Each program first reads all counts (the totals), a fixed cost.
    The tail [total, max_padded) is not in the rule (total is known on the device only): with
    most pairs dropped by an expert map each program fills ~max_padded / (P * FILL_B) steps.
    """
    e_bins, log_e = _bins(num_experts)
    cb = max(1, 4096 // e_bins)               # chunks per base step  (x E_BINS: 4096 values)
    if scan_programs is None:
        p = max(cdiv(num_chunks, cb), cdiv(max_blocks, _FILL_B), cdiv(e_bins * block_m, _PAD_LANES),
                min(_SCAN_MIN_PROGRAMS, num_chunks))
        p = min(p, SCAN_MAX_PROGRAMS)
    else:
        p = int(scan_programs)
        if p < 1:
            raise ValueError(f"scan_programs must be >= 1, got {scan_programs}")
    ep = max(1, e_bins // next_power_of_2(p))  # experts per padding slice (divides E_BINS)
    return p, dict(BM=block_m, E_BINS=e_bins, LOG_E=log_e, CB=cb, CT=max(1, 8192 // e_bins), FILL_B=_FILL_B,
                   EP=ep, PDL=pdl)


@functools.lru_cache(maxsize=256, typed=True)
def _small_launch(n: int, block_m: int, num_experts: int, has_map: bool) -> tuple:
    """(constexprs, num_warps) of the one-program launch, once per shape (a serving loop
    repeats a few): ~0.6 us of host time a call. The dict is shared: launch() only reads it."""
    e_bins, log_e = _bins(num_experts)
    block = max(16, next_power_of_2(n))
    return (dict(HAS_MAP=has_map, BM=block_m, E_BINS=e_bins, LOG_E=log_e, BLOCK=block, FILL_B=_FILL_B),
            4 if block <= 1024 else 8)


def align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int,
                     expert_map: Optional[torch.Tensor] = None, *,
                     out: Optional[AlignResult] = None,
                     small_max: int = SMALL_MAX, chunk: Optional[int] = CHUNK, pdl: bool = False,
                     scan_programs: Optional[int] = None) -> AlignResult:
    """Group the n = T*k pairs of ``topk_ids`` [T, k] by local expert, padded to ``block_m``.

    ``num_experts`` is E_loc (w13.shape[0]); ``expert_map`` int32 [E_g] maps global ids to
    local ones (-1: not local, dropped). ``out`` reuses preallocated buffers (its
    sorted_ids length is taken as max_padded; it must be >= ``max_padded_size``).
    No host sync: safe inside CUDA-graph capture once compiled. ``pdl`` (sm90+, triton with
    griddepcontrol): the chunked path's scan and scatter are programmatic dependent launches
    of the kernel before (each waits for it before any read), as the GEMM after them can be.
    ``scan_programs`` forces the chunked path's scan grid (>= 1; None: chosen from the sizes,
    see _scan_launch); the result is the same for every value (a benchmark / test hook).
    """
    ids = topk_ids.reshape(-1)                                                  # [n]
    if not ids.is_contiguous():
        ids = ids.contiguous()
    n = ids.numel()
    if out is None:
        dev = ids.device
        mp = max_padded_size(n, block_m, num_experts)
        out = AlignResult(torch.empty(mp, dtype=torch.int32, device=dev),
                          torch.empty(mp // block_m, dtype=torch.int32, device=dev),
                          torch.empty(1, dtype=torch.int32, device=dev))
    out.block_m, out.num_pairs, out.num_experts = block_m, n, num_experts
    out.topk_ids, out.expert_map = topk_ids, expert_map
    sorted_ids, expert_ids, ntpp = out.sorted_ids, out.expert_ids, out.num_tokens_post_padded
    mp, mb = sorted_ids.numel(), expert_ids.numel()
    has_map = expert_map is not None
    emap = expert_map if has_map else ids                     # any pointer; never read
    n_global = expert_map.numel() if has_map else num_experts
    if n <= small_max:
        constexprs, num_warps = _small_launch(n, block_m, num_experts, has_map)
        launch(_align_small_kernel, (1,),
               (ids, emap, sorted_ids, expert_ids, ntpp, n, n_global, num_experts, mp, mb),
               constexprs, num_warps=num_warps)
        return out
    e_bins, _ = _bins(num_experts)
    chunk = chunk or _chunk_for(n)
    num_chunks = cdiv(n, chunk)
    scratch = torch.empty((2, num_chunks, e_bins), dtype=torch.int32, device=ids.device)  # counts, base
    counts, base = scratch[0], scratch[1]
    p, constexprs = _scan_launch(num_chunks, block_m, num_experts, mb, scan_programs, pdl)
    launch(_align_count_kernel, (num_chunks,), (ids, emap, counts, n, n_global, num_experts),
           dict(HAS_MAP=has_map, E_BINS=e_bins, CHUNK_=chunk, PDL=pdl), num_warps=4)
    launch(_align_scan_kernel, (p,),
           (counts, base, sorted_ids, expert_ids, ntpp, num_chunks, n, num_experts, mp, mb),
           constexprs, num_warps=8, launch_pdl=pdl)
    launch(_align_scatter_kernel, (num_chunks,), (ids, emap, base, sorted_ids, n, n_global, num_experts),
           dict(HAS_MAP=has_map, E_BINS=e_bins, CHUNK_=chunk, PDL=pdl), num_warps=4, launch_pdl=pdl)
    return out
