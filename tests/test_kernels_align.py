"""The chunked alignment's scan on several programs (align_block_size(scan_programs=P)).

The scan (kernels/align.py ``_align_scan_kernel``) runs on a grid of P programs that split
the base rows (by CB-chunk blocks, each program computing its own carry), expert_ids and
the tail (FILL_B steps) and the experts' padding (EP-expert slices). Every P must give the
same bits: sorted_ids, expert_ids, num_tokens_post_padded and the base table the scatter
reads. Outputs are preallocated and poisoned, so a slice no program writes shows.

Without CUDA the kernels run under TRITON_INTERPRET=1 (tiny shapes; E around 255 and 600
make E_BINS 256 / 1024, so a CB block is 16 / 4 chunks and a few dozen chunks give several
blocks).

Legend: T tokens, k top-k, n = T*k pairs, E local experts, E_g global experts, BM block_m.
"""
from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:  # must precede the first import of the kernels: @triton.jit reads it then
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fusedmoe.kernels import align as al  # noqa: E402
from fusedmoe.reference.kernels import align_ref, local_ids  # noqa: E402

DEV = "cuda" if _CUDA else "cpu"
if not _CUDA and type(al._align_scan_kernel).__name__ != "InterpretedFunction":
    pytest.skip("fusedmoe.kernels was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

POISON = -7     # never a valid base / sorted id / expert id / total


def _ids(T, k, E_g, *, seed, empty=()):
    """topk_ids int32 [T, k] uniform over E_g global experts (repeats allowed), none in ``empty``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E_g, (T, k), generator=g, dtype=torch.int32)
    for e in empty:
        ids[ids == e] = (e + 1) % E_g
    return ids.to(DEV)


def _run(ids, bm, E_, emap, chunk, P, monkeypatch, scatter=True):
    """align_block_size on the chunked path with the scan on P programs (None: the default),
    into poisoned buffers; (result, base table the scan wrote, the scan's grid). Without
    ``scatter`` the real pairs are not written (the scan's own writes only; the interpreter
    spends most of its time sorting in the scatter)."""
    n = ids.numel()
    mp = al.max_padded_size(n, bm, E_)
    out = al.AlignResult(torch.full((mp,), POISON, dtype=torch.int32, device=DEV),
                         torch.full((mp // bm,), POISON, dtype=torch.int32, device=DEV),
                         torch.full((1,), POISON, dtype=torch.int32, device=DEV))
    seen = {}
    real = al.launch

    def spy(kernel, grid, args, constexprs, **kw):
        if kernel is al._align_scatter_kernel and not scatter:
            return
        if kernel is al._align_scan_kernel:
            args[1].fill_(POISON)                 # base: every entry must be (re)written
            seen["grid"] = grid
        real(kernel, grid, args, constexprs, **kw)
        if kernel is al._align_scan_kernel:
            seen["base"] = args[1].clone()
            # a base entry left unwritten: fail here, before the scatter stores through it
            assert not (seen["base"] == POISON).any(), "base entries the scan did not write"

    monkeypatch.setattr(al, "launch", spy)
    res = al.align_block_size(ids, bm, E_, emap, out=out, small_max=16, chunk=chunk, scan_programs=P)
    monkeypatch.setattr(al, "launch", real)
    assert "base" in seen, "the chunked path did not run"
    return res, seen["base"], seen["grid"]


@pytest.fixture
def fill_b(monkeypatch):
    """fill_b(v): the layout's fill step (_FILL_B, 1024) set to v, so that expert_ids and the
    tail span several steps at interpreter sizes; the launch caches are cleared around it."""
    def set_(v):
        monkeypatch.setattr(al, "_FILL_B", v)
        al._scan_launch.cache_clear()
        al._small_launch.cache_clear()
    yield set_
    al._scan_launch.cache_clear()
    al._small_launch.cache_clear()


def _check_gemm_invariants(res, ids, bm, E_, emap):
    """What the grouped GEMMs rely on, independently of the reference's exact layout."""
    n = ids.numel()
    total = res.num_tokens_post_padded.item()
    srt, eid = res.sorted_ids.cpu(), res.expert_ids.cpu()
    assert total % bm == 0 and 0 <= total <= srt.numel()
    nb = total // bm
    assert ((eid[:nb] >= 0) & (eid[:nb] < E_)).all() and (eid[nb:] == -1).all()
    assert (eid[1:nb] >= eid[: nb - 1]).all()                                   # runs ascending
    loc = local_ids(ids, E_, emap).cpu()                                        # [n], -1 dropped
    blocks = srt[:total].view(nb, bm)
    real = blocks < n
    assert (srt[total:] == n).all() and ((blocks >= 0) & (blocks <= n)).all()
    # each real slot sits in a block of its own expert, each kept pair exactly once
    owner = eid[:nb, None].expand(nb, bm)
    assert torch.equal(loc[blocks[real].long()], owner[real].long())
    kept = torch.nonzero(loc >= 0).flatten()
    assert torch.equal(torch.sort(blocks[real]).values.long(), kept)


# (T, k, E_g, E, BM, chunk, local experts of the map or None, empty global experts, FILL_B)
CASES = {
    # E_BINS 256, CB 16: 41 chunks = 3 base blocks (the last partial); expert 7 has no pairs
    "e255": (161, 4, 255, 255, 16, 16, None, (7,), 1024),
    # E_BINS 1024, CB 4, CT 8: n = 481 (30 full chunks + 1 pair), an expert map over 700
    # global experts with 100 not local and an id out of range; expert 0 empty. FILL_B 64:
    # 8 steps of expert_ids, 23 of the tail
    "e600 map": (37, 13, 700, 600, 8, 16, 600, (0, 5), 64),
    # E 37: E_BINS 64, CB 64 (one base block); BM 1: 1100 blocks, two FILL_B steps of expert_ids;
    # n = 1100 = 17 chunks of 64 + 12
    "e37 bm1": (275, 4, 37, 37, 1, 64, None, (36,), 1024),
    # 3 local of 16 global: total 128 of max_padded 624; FILL_B 32: 3 steps of expert_ids, 16 of the tail
    "tail": (150, 4, 16, 3, 8, 32, 3, (), 32),
}


def _case(name, fill_b=None):
    T, k, E_g, E_, bm, chunk, n_local, empty, fb = CASES[name]
    if fill_b is not None:
        fill_b(fb)
    ids = _ids(T, k, E_g, seed=len(name) * 7 + T, empty=empty)
    emap = None
    if n_local is not None:
        g = torch.Generator().manual_seed(T)
        perm = torch.randperm(E_g, generator=g)
        emap = torch.full((E_g,), -1, dtype=torch.int32)
        emap[perm[:n_local]] = torch.arange(n_local, dtype=torch.int32)
        emap = emap.to(DEV)
        ids[0, 0] = E_g + 3                       # out of range: dropped too
    return ids, bm, E_, emap, chunk


@pytest.mark.parametrize("name", list(CASES))
def test_scan_programs_same_bits(name, monkeypatch, fill_b):
    ids, bm, E_, emap, chunk = _case(name, fill_b)
    n = ids.numel()
    assert n % chunk != 0
    one, base1, grid1 = _run(ids, bm, E_, emap, chunk, 1, monkeypatch)
    assert grid1 == (1,)
    # against the reference (exact layout) and the GEMMs' invariants
    srt, eid, total = align_ref(ids, bm, E_, emap)
    assert one.num_tokens_post_padded.item() == total
    assert torch.equal(one.sorted_ids[:total].cpu(), srt) and (one.sorted_ids[total:] == n).all()
    assert torch.equal(one.expert_ids[: total // bm].cpu(), eid) and (one.expert_ids[total // bm:] == -1).all()
    _check_gemm_invariants(one, ids, bm, E_, emap)
    assert (base1 >= 0).all()
    # the default P, end to end
    dflt, base, grid = _run(ids, bm, E_, emap, chunk, None, monkeypatch)
    assert grid[0] > 1
    assert torch.equal(dflt.sorted_ids, one.sorted_ids) and torch.equal(dflt.expert_ids, one.expert_ids)
    assert torch.equal(dflt.num_tokens_post_padded, one.num_tokens_post_padded) and torch.equal(base, base1)
    # the scan alone on 1, 2, 3 (not a power of 2) and 64 (more than the work) programs:
    # exactly the sentinel slots of sorted_ids, all of expert_ids, the total, the base table
    scan_only = torch.where(one.sorted_ids == n, n, POISON)
    for P in (1, 2, 3, 64):
        res, base, grid = _run(ids, bm, E_, emap, chunk, P, monkeypatch, scatter=False)
        assert grid == (P,)
        assert torch.equal(res.sorted_ids, scan_only), P
        assert torch.equal(res.expert_ids, one.expert_ids), P
        assert torch.equal(res.num_tokens_post_padded, one.num_tokens_post_padded), P
        assert torch.equal(base, base1), P


def test_cases_exercise_the_splits(fill_b):
    """The cases above reach what they are meant to (else the test above proves little)."""
    def launch_of(name, P=None):
        ids, bm, E_, emap, chunk = _case(name, fill_b)
        n = ids.numel()
        nc = -(-n // chunk)
        mp = al.max_padded_size(n, bm, E_)
        total = align_ref(ids, bm, E_, emap)[2]
        return al._scan_launch(nc, bm, E_, mp // bm, P, False), nc, mp, bm, total

    (p, cx), nc, *_ = launch_of("e255")
    assert p > 1 and -(-nc // cx["CB"]) == 3                   # default P splits 3 base blocks
    (p, cx), nc, mp, bm, total = launch_of("e600 map", 3)
    assert cx["CB"] == 4 and cx["CT"] == 8 and nc == 31        # carry sums several CT tiles
    assert cx["E_BINS"] // cx["EP"] == 4                       # 4 padding slices on 3 programs
    assert mp // bm > 4 * cx["FILL_B"] and mp - total > 4 * cx["FILL_B"]
    (p, cx), nc, mp, bm, total = launch_of("e37 bm1")
    assert cx["FILL_B"] == 1024 and mp // bm > cx["FILL_B"]    # two expert_ids steps
    (p, cx), nc, mp, bm, total = launch_of("tail", 2)
    assert mp // bm > 2 * cx["FILL_B"] and mp - total > 4 * cx["FILL_B"]
    assert any(align_ref(*_case(nm)[:4])[1].unique().numel() < CASES[nm][3] for nm in CASES)   # an empty expert


def test_scan_programs_default_and_bad():
    # qwen3 at T=16384 (n = 131072, chunk 1024, E 128, BM 64): several programs, capped
    mp = al.max_padded_size(131072, 64, 128)
    p, cx = al._scan_launch(128, 64, 128, mp // 64, None, False)
    assert 4 <= p <= al.SCAN_MAX_PROGRAMS and cx["E_BINS"] % cx["EP"] == 0
    assert cx["E_BINS"] // cx["EP"] >= p                       # every program gets a padding slice
    mp = al.max_padded_size(131072, 128, 256)                  # deepseek E=256
    p2, _ = al._scan_launch(128, 128, 256, mp // 128, None, False)
    assert p2 >= p
    # at least 8 programs where there are 8 chunks, one a chunk below that; P is capped
    assert al._scan_launch(5, 16, 8, 64, None, False)[0] == 5
    assert al._scan_launch(16, 64, 128, 160, None, False)[0] == 8
    assert al._scan_launch(1 << 20, 16, 8, 1 << 18, None, False)[0] == al.SCAN_MAX_PROGRAMS
    with pytest.raises(ValueError):
        al.align_block_size(_ids(100, 2, 5, seed=0), 16, 5, small_max=16, chunk=32, scan_programs=0)
