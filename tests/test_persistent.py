"""Persistent launches of the grouped GEMMs (config PERSISTENT / FLATTEN) and their tuner stage.

A persistent launch only changes which program computes which tile, never the arithmetic of
a tile, so its output must be bitwise the output of the one-tile-per-program launch (the
deterministic paths; atomic adds may land in another order). Without CUDA the kernels run
under TRITON_INTERPRET=1 on small fp16/fp32 shapes (bf16 dots are wrong there). The SM count
is patched to 2 so that every program loops over several tiles, on CPU and GPU alike.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate, n = T*k pairs, P = PERSISTENT.
"""
from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:  # must precede the first import of the kernels: @triton.jit reads it then
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fusedmoe import tuner as tuning  # noqa: E402
from fusedmoe.errors import ConfigError  # noqa: E402
from fusedmoe.kernels import grouped_gemm as gg  # noqa: E402
from fusedmoe.kernels.align import align_block_size  # noqa: E402
from fusedmoe.reference.kernels import gemm1_act_ref, gemm2_ref  # noqa: E402
from fusedmoe.reference.moe import moe_ref  # noqa: E402

DEV = "cuda" if _CUDA else "cpu"
if not _CUDA and type(gg._moe_gemm_kernel).__name__ != "InterpretedFunction":
    pytest.skip("fusedmoe.kernels was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

# max |kernel - reference| / max |reference|, as in test_kernels_gemm.py
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}
# H % BK != 0 (GEMM1's K tail), I % BN != 0 (wrapped columns), I % BK != 0 (GEMM2's K tail)
E, H, I, K_TOP, T = 6, 72, 40, 2, 37
EMPTY = (1, 4)                       # experts no token picks
CFG = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=32, GROUP_SIZE_M=2, num_warps=4, num_stages=2)
SMS = 2
_REAL_NUM_SMS = gg._num_sms


@pytest.fixture(autouse=True)
def _two_sms(monkeypatch):
    monkeypatch.setattr(gg, "_num_sms", lambda device: SMS)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _routing(seed=0):
    """(topk_weights fp32 [T, k], topk_ids int32 [T, k]) that never pick the EMPTY experts."""
    logits = torch.randn(T, E, generator=_gen(seed))
    logits[:, list(EMPTY)] = -float("inf")
    w, ids = torch.topk(logits.softmax(-1), K_TOP, dim=-1)
    return w.float().to(DEV), ids.int().to(DEV)


def _rand(*shape, seed, dtype, scale=1.0):
    return (torch.randn(*shape, generator=_gen(seed)) * scale).to(dtype).to(DEV)


def _rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def _variants():
    """(PERSISTENT, FLATTEN) pairs that must reproduce PERSISTENT=0. The interpreter ignores
    tl.range's compiler hints, so FLATTEN changes nothing there: each value once is enough."""
    return [(p, fl) for p in (1, 2) for fl in (False, True)] if _CUDA else [(1, False), (2, True)]


# -------------------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gemm1_persistent_is_bitwise_the_tile_launch(dtype):
    x = _rand(T, H, seed=1, dtype=dtype)
    w13 = _rand(E, 2 * I, H, seed=2, dtype=dtype, scale=H ** -0.5)
    b13 = _rand(E, 2 * I, seed=3, dtype=dtype, scale=0.5)
    _, ids = _routing()
    res = align_block_size(ids, CFG["BLOCK_SIZE_M"], E)
    kw = dict(bias=b13, alpha=1.702, limit=0.4)
    base = gg.gemm1_act(x, w13, res, K_TOP, "swigluoai", config=CFG, **kw)
    assert _rel(base, gemm1_act_ref(x, w13, ids, "swigluoai", **kw)) < TOL[dtype]
    for p, fl in _variants():
        h = gg.gemm1_act(x, w13, res, K_TOP, "swigluoai", config=dict(CFG, PERSISTENT=p, FLATTEN=fl), **kw)
        assert torch.equal(h, base), (p, fl)


@pytest.mark.parametrize("persistent", [0, 1, 2])
@pytest.mark.parametrize("numel", [1, 5000, 3 * 2048 * 40 + 7])
def test_gemm1_zeroes_on_the_side(persistent, numel):
    # gemm1_act(zero=z): the same launch stores zeros over all of z (GEMM2's atomic output), a
    # share a tile, and h is bitwise what it is without. numel: smaller than one share, several
    # shares, more than ZB elements a tile (the share loop runs).
    x = _rand(T, H, seed=11, dtype=torch.float16)
    w13 = _rand(E, 2 * I, H, seed=12, dtype=torch.float16, scale=H ** -0.5)
    _, ids = _routing()
    res = align_block_size(ids, CFG["BLOCK_SIZE_M"], E)
    cfg = dict(CFG, PERSISTENT=persistent)
    base = gg.gemm1_act(x, w13, res, K_TOP, "silu", config=cfg)
    z = torch.full((numel,), float("nan"), dtype=torch.float16, device=DEV)
    z[::3] = 1e4
    h = gg.gemm1_act(x, w13, res, K_TOP, "silu", config=cfg, zero=z)
    assert torch.equal(h, base)
    assert torch.equal(z, torch.zeros_like(z))


@pytest.mark.parametrize("persistent", [0, 1])
def test_gemm1_zeroes_with_no_local_pairs(persistent):
    # every slot goes to a non-local expert: no tile exists on the device, z is zeroed all the same
    emap = torch.tensor([-1] * E + [0, 1], dtype=torch.int32, device=DEV)
    ids = torch.randint(0, E, (T, K_TOP), generator=_gen(13)).int().to(DEV)
    x = _rand(T, H, seed=14, dtype=torch.float16)
    w13 = _rand(2, 2 * I, H, seed=15, dtype=torch.float16)
    res = align_block_size(ids, CFG["BLOCK_SIZE_M"], 2, emap)
    z = torch.full((T, H), float("nan"), dtype=torch.float16, device=DEV)
    gg.gemm1_act(x, w13, res, K_TOP, "silu", config=dict(CFG, PERSISTENT=persistent), zero=z)
    assert torch.equal(z, torch.zeros_like(z))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("split", [1, 2])
def test_gemm2_persistent_is_bitwise_the_tile_launch(dtype, split):
    h = _rand(T * K_TOP, I, seed=4, dtype=dtype)
    w2 = _rand(E, H, I, seed=5, dtype=dtype, scale=I ** -0.5)
    b2 = _rand(E, H, seed=6, dtype=dtype, scale=0.5)
    tw, ids = _routing()
    res = align_block_size(ids, CFG["BLOCK_SIZE_M"], E)
    cfg = dict(CFG, SPLIT_K=split)
    base = gg.gemm2(h, w2, res, tw, bias=b2, config=cfg)
    assert _rel(base, gemm2_ref(h, w2, ids, tw, bias=b2)) < TOL[dtype]
    for p, fl in _variants():
        out = gg.gemm2(h, w2, res, tw, bias=b2, config=dict(cfg, PERSISTENT=p, FLATTEN=fl))
        assert torch.equal(out, base), (p, fl)


def test_gemm2_persistent_atomic_reduce():
    # fp32 atomic adds of a token's k slots land in another order: equal up to rounding
    h = _rand(T * K_TOP, I, seed=4, dtype=torch.float32)
    w2 = _rand(E, H, I, seed=5, dtype=torch.float32, scale=I ** -0.5)
    tw, ids = _routing()
    res = align_block_size(ids, CFG["BLOCK_SIZE_M"], E)
    ref = gemm2_ref(h, w2, ids, tw)
    for p, fl in _variants():
        out = gg.gemm2(h, w2, res, tw, config=dict(CFG, PERSISTENT=p, FLATTEN=fl), reduce="atomic")
        assert _rel(out, ref) < TOL[torch.float32], (p, fl)


@pytest.mark.parametrize("use_tma", [False, True])
def test_moe_forward_persistent_expert_map(use_tma):
    # 8 global experts, 4 local (0, 2, 5, 7): dropped slots, tokens with no local slot, and a
    # local expert (7 -> 3) no token picks; TMA weight tiles where triton has them
    emap = torch.tensor([0, -1, 1, -1, -1, 2, -1, 3], dtype=torch.int32, device=DEV)
    logits = torch.randn(T, 8, generator=_gen(7))
    logits[:, 7] = -float("inf")
    w, ids = torch.topk(logits.softmax(-1), K_TOP, dim=-1)
    tw, ids = w.float().to(DEV), ids.int().to(DEV)
    x = _rand(T, H, seed=8, dtype=torch.float32)
    w13 = _rand(4, 2 * I, H, seed=9, dtype=torch.float32, scale=H ** -0.5)
    w2 = _rand(4, H, I, seed=10, dtype=torch.float32, scale=I ** -0.5)
    cfg = dict(CFG, USE_TMA=use_tma)
    base = gg.moe_forward_triton(x, w13, w2, tw, ids, "silu", config1=cfg, config2=cfg, expert_map=emap)
    assert _rel(base, moe_ref(x, w13, w2, tw, ids, "silu", expert_map=emap)) < 1e-5
    for p, fl in _variants():
        pc = dict(cfg, PERSISTENT=p, FLATTEN=fl)
        out = gg.moe_forward_triton(x, w13, w2, tw, ids, "silu", config1=pc, config2=pc, expert_map=emap)
        assert torch.equal(out, base), (p, fl)


def test_persistent_grid_is_programs_per_sm(monkeypatch):
    grids = []
    real = gg.launch

    def spy(kernel, grid, *a, **kw):
        if kernel is gg._moe_gemm_kernel:
            grids.append(grid)
        return real(kernel, grid, *a, **kw)

    monkeypatch.setattr(gg, "launch", spy)
    h = _rand(T * K_TOP, I, seed=4, dtype=torch.float32)
    w2 = _rand(E, H, I, seed=5, dtype=torch.float32, scale=I ** -0.5)
    tw, ids = _routing()
    res = align_block_size(ids, CFG["BLOCK_SIZE_M"], E)
    tiles = (res.max_padded // CFG["BLOCK_SIZE_M"]) * -(-H // CFG["BLOCK_SIZE_N"])     # host bound
    for p, split, want in [(0, 1, (tiles, 1)), (1, 1, (SMS, 1)), (2, 1, (2 * SMS, 1)),
                           (2, 2, (SMS, 2)),                 # P * SMs programs spread over the splits
                           (10 ** 6, 1, (tiles, 1))]:        # never more programs than tiles
        grids.clear()
        gg.gemm2(h, w2, res, tw, config=dict(CFG, PERSISTENT=p, SPLIT_K=split))
        assert grids == [want], p


def test_num_sms():
    assert _REAL_NUM_SMS(torch.device("cpu")) == 4                 # interpreter: several tiles per program
    if _CUDA:
        dev = torch.device("cuda", torch.cuda.current_device())
        assert _REAL_NUM_SMS(dev) == torch.cuda.get_device_properties(dev).multi_processor_count


# ---------------------------------------------------------------------------------------- tuner
def _full(bm, bn=128, bk=64):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
            "num_warps": 8, "num_stages": 3, "SPLIT_K": 1}


def test_tuner_persistent_stage_only_for_prefill():
    t = _full(128)
    # deepseek-v3 tp8 GEMM2 at T=16384: 512 tokens per expert
    got = tuning.candidate_configs(16384, 256, 8, 7168, 256, gemm="gemm2", stage="persistent", tiles=[t])
    # (and the tile with HALF_TAIL: a tile whose second half is padding at half height)
    assert got == [{**t, "PERSISTENT": p, "FLATTEN": fl} for p in (1, 2) for fl in (False, True)] + \
        [{**t, "HALF_TAIL": True}]
    assert tuning.candidate_configs(16384, 256, 8, 7168, 256, stage="persistent", tiles=got[:-1]) == []
    # 64 tokens per expert or fewer (decode, middle): one wave of tiles or less, nothing to gain
    assert tuning.candidate_configs(2048, 256, 8, 7168, 256, stage="persistent", tiles=[t]) == []
    space = {"PERSISTENT": [3], "FLATTEN": [True], "HALF_TAIL": [False]}
    assert tuning.candidate_configs(16384, 256, 8, 7168, 256, stage="persistent", tiles=[t], space=space) == \
        [{**t, "PERSISTENT": 3, "FLATTEN": True}]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_normalize_rejects_bad_persistent(bad):
    with pytest.raises(ConfigError, match="PERSISTENT"):
        tuning.normalize_launch_config(dict(_full(64), PERSISTENT=bad))
    assert tuning.normalize_launch_config(dict(_full(64), PERSISTENT=2, FLATTEN=True))["PERSISTENT"] == 2


def test_tuner_resident_stage_gemm2_small_k_prefill():
    # deepseek-v3 tp8 GEMM2 at T=16384 (K = I = 256, 512 tokens per expert), GEMM1's BM 128
    got = tuning.candidate_configs(16384, 256, 8, 7168, 256, gemm="gemm2", stage="resident", bm_divides=128)
    assert got and all(c["A_RESIDENT"] * c["BLOCK_SIZE_N"] >= 7168 > (c["A_RESIDENT"] - 1) * c["BLOCK_SIZE_N"]
                       for c in got)                                   # all of N in one program
    assert {c["BLOCK_SIZE_M"] for c in got} == {64, 128}
    # A [BM, 256] plus the weight stages fit shared memory with the epilogue's scratch
    assert all((c["BLOCK_SIZE_M"] + c["num_stages"] * c["BLOCK_SIZE_N"]) * 256 * 2 <= tuning.SMEM_LIMIT - 16384
               for c in got)
    assert {c["BLOCK_SIZE_M"] for c in tuning.candidate_configs(16384, 256, 8, 7168, 256, gemm="gemm2",
                                                                 stage="resident", bm_divides=64)} == {64}
    # W8A8 too: deepseek fp8_block (K = 256 = 2 scale groups of 128), fp8 / int8 per channel
    for scheme in ("fp8_block", "fp8_channel", "int8_channel"):
        got = tuning.candidate_configs(16384, 256, 8, 7168, 256, gemm="gemm2", stage="resident", scheme=scheme,
                                       bm_divides=128)
        assert got and {c["BLOCK_SIZE_M"] for c in got} == {64, 128}, scheme
        assert all((c["BLOCK_SIZE_M"] + c["num_stages"] * c["BLOCK_SIZE_N"]) * 256 <= tuning.SMEM_LIMIT - 16384
                   for c in got), scheme
    # not K > 256: qwen3's K = 768 (3 resident chunks, which the kernel runs) measured slower
    for scheme in ("none", "fp8_channel"):
        assert tuning.candidate_configs(16384, 128, 8, 2048, 768, gemm="gemm2", stage="resident", scheme=scheme,
                                        bm_divides=128) == [], scheme
    # not for GEMM1, weight-only schemes, K past 4 chunks (Mixtral's I = 14336) or 64 tokens
    # per expert or fewer
    assert tuning.candidate_configs(16384, 256, 8, 256, 7168, gemm="gemm1", stage="resident") == []
    assert tuning.candidate_configs(16384, 256, 8, 7168, 256, gemm="gemm2", stage="resident",
                                    scheme="int8_w8a16") == []
    assert tuning.candidate_configs(16384, 8, 2, 4096, 14336, gemm="gemm2", stage="resident") == []
    assert tuning.candidate_configs(2048, 256, 8, 7168, 256, gemm="gemm2", stage="resident") == []
