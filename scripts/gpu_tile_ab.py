"""A/B of single launch-config entries of the shipped files of this GPU, through `fusedmoe bench`.

    python3 scripts/gpu_tile_ab.py [ROUND ...]     (on the GPU, from the repo root)

ROUND: names of ROUNDS below (default: the last one).

For each (preset, tp, T): the shipped file, then each variant (the entry's gemm1/gemm2 dict
updated with the overrides) in a FUSEDMOE_CONFIG_DIR copy. Prints the triton graph µs and the
% of roofline per variant. Why: the session-2 tuner's picks for a few prefill points were
beaten by hand-picked neighbours (Mixtral T=16384 GEMM1, docs/BENCHMARKS.md).
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

_R = dict(RESCALE=True, PERSISTENT=0, FLATTEN=False)   # block scales applied to the accumulator
def _res(bm, bn, nt, w, st):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, num_warps=w, num_stages=st, A_RESIDENT=nt, USE_TMA=True)


def _g1(bm, bn, w, st):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=128, num_warps=w, num_stages=st, RESCALE=True,
                USE_TMA=True, PERSISTENT=0, FLATTEN=False, GROUP_SIZE_M=1)


ROUNDS = {}
ROUNDS["s11r4"] = [   # session 11, round 4 (H100): deepseek-v3 tp8 fp8_block GEMM1 at T=16384 with tiles small
    # enough for two CTAs an SM (<= ~113 KB shared memory), so one CTA's per-K-group rescale of
    # its accumulator can overlap the other's wgmma; GEMM2 A-resident under BM 64
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g1 64x128 w4 s2 R", [("gemm1", _g1(64, 128, 4, 2)), ("gemm2", _res(64, 128, 56, 4, 4))]),
        ("g1 64x128 w4 s3 R", [("gemm1", _g1(64, 128, 4, 3)), ("gemm2", _res(64, 128, 56, 4, 4))]),
        ("g1 64x64 w4 s3 R", [("gemm1", _g1(64, 64, 4, 3)), ("gemm2", _res(64, 128, 56, 4, 4))]),
        ("g1 128x64 w8 s3 R", [("gemm1", _g1(128, 64, 8, 3)), ("gemm2", _res(128, 128, 56, 8, 3))]),
    ], "fp8_block"),
]


def _t(bm, bn, bk, w, st, **kw):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, num_warps=w, num_stages=st, **kw)


ROUNDS["s12mix256"] = [   # session 12 (H100): Mixtral T=256 (64 pairs an expert, weight-bound: 87.1% of
    # the roofline where T=64 reaches 99.8%). Shipped: GEMM1 128x128x64 w8 s4 TMA; GEMM2 128x256x64
    # w8 s4 TMA = 8 x 16 = 128 programs, one per SM, 7.3 MB of w2 each
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [
        ("g2 split2", "gemm2", dict(SPLIT_K=2)),
        ("g2 bn128", "gemm2", dict(BLOCK_SIZE_N=128)),
        ("g2 bn128 s2", "gemm2", dict(BLOCK_SIZE_N=128, SPLIT_K=2)),
        ("g2 bn128 bk128 s3", "gemm2", dict(BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=3)),
        ("bm64", [("gemm1", _t(64, 128, 64, 4, 4, GROUP_SIZE_M=8, USE_TMA=True)),
                  ("gemm2", _t(64, 256, 64, 8, 4, GROUP_SIZE_M=8, USE_TMA=True))]),
        ("bm64 g2 bn128", [("gemm1", _t(64, 128, 64, 4, 4, GROUP_SIZE_M=8, USE_TMA=True)),
                           ("gemm2", _t(64, 128, 64, 4, 4, GROUP_SIZE_M=8, USE_TMA=True))]),
        ("g1 bk128 s2", "gemm1", dict(BLOCK_SIZE_K=128, num_stages=2)),
    ]),
]


def bench(model, tp, T, cfg_dir=None, quant="none"):
    env = dict(os.environ)
    env.pop("FUSEDMOE_CONFIG_DIR", None)
    if cfg_dir:
        env["FUSEDMOE_CONFIG_DIR"] = cfg_dir
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        try:
            subprocess.run([sys.executable, "-m", "fusedmoe", "bench", "--tokens", str(T), "--model", model, "--tp",
                            str(tp), "--peers", "none", "--backend", "triton", "--quant", quant, "--json", f.name],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=150)
            r = [x for x in json.load(open(f.name))["results"] if x["impl"] == "triton"
                 and x.get("scheme", quant) == quant][0]
        except Exception:                      # the variant failed (compile, shared memory): say so
            return float("nan"), float("nan")
    return r["us_graph"] or float("nan"), r["pct_roofline"] or float("nan")


import torch  # noqa: E402

DEVICE = torch.cuda.get_device_name().replace(" ", "_")   # the shipped file of this GPU
ROUNDS["s12bm256"] = [   # session 12 (H100): GEMM1 with 256-row tiles and 64 gate + 64 up columns (the same
    # accumulator registers as 128 x (128 + 128), 255 regs, no spills under triton 3.6): each expert's weight
    # tiles are read by half as many M blocks, the gathered A rows twice as wide a step. T=16384 only (the
    # alignment pads each expert to 256 rows)
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g1 256x64 s3", "gemm1", dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_stages=3)),
        ("g1 256x64 s4", "gemm1", dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_stages=4)),
    ], "fp8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g1 256x64 s4", "gemm1", dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_stages=4)),
    ]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [
        ("g1 256x64 s3", "gemm1", dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_stages=3)),
        ("g1 256x64 s4", "gemm1", dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_stages=4)),
    ]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g1 256x64 s4", "gemm1", dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_stages=4)),
    ]),
]


ROUNDS["s14band"] = [   # session 14 (H100), run with FUSEDMOE_REDUCE=atomic_out: deepseek-v3 tp8 T=16384's GEMM2
    # adds into out [16384, 7168] (235 MB, past L2) atomically and lost to the fixed-order reduce; with the
    # A-resident programs walking every m-block of a column band first (BAND_MAJOR), the band of out being
    # added to (16 tiles of 64: 1024 columns, 34 MB; 8: 17 MB) can stay in L2
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g2 x16 band", "gemm2", dict(A_RESIDENT=16, BAND_MAJOR=True)),
        ("g2 x8 band", "gemm2", dict(A_RESIDENT=8, BAND_MAJOR=True)),
        ("g2 x16", "gemm2", dict(A_RESIDENT=16)),
    ]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g2 x16 band", "gemm2", dict(A_RESIDENT=16, BAND_MAJOR=True)),
        ("g2 x8 band", "gemm2", dict(A_RESIDENT=8, BAND_MAJOR=True)),
    ], "fp8_block"),
]


ROUNDS["s15band"] = [   # prepared in session 14, not run yet (H100): the tiled GEMM2 in column bands
    # (config BAND_N) under the default atomic k-sum (reduce_rule: atomic_out at these T). out [T, H] of
    # qwen3 T=16384 is 67 MB and of Mixtral 134 MB, past the 50 MB L2; bands of 1024 / 512 columns
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 band 4", "gemm2", dict(BAND_N=4)),
        ("g2 band 2", "gemm2", dict(BAND_N=2)),
    ]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 band 4", "gemm2", dict(BAND_N=4)),
        ("g2 band 2", "gemm2", dict(BAND_N=2)),
    ], "fp8_channel"),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [
        ("g2 band 4", "gemm2", dict(BAND_N=4)),
        ("g2 band 8", "gemm2", dict(BAND_N=8)),
    ]),
]

ROUNDS["s15int8"] = [   # session 15 (H100): qwen3 int8_channel GEMMs run ~10% slower than fp8_channel's at the same
    # T (profile: 1613 vs 1457 us at T=16384) and their entries differ from fp8's: try fp8's
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g1 tma", "gemm1", dict(USE_TMA=True)),
        ("g1 tma grp32", "gemm1", dict(USE_TMA=True, GROUP_SIZE_M=32)),
        ("g2 bk128 s2 flat", "gemm2", dict(BLOCK_SIZE_K=128, num_stages=2, GROUP_SIZE_M=16, FLATTEN=True)),
        ("g2 bk128 s2", "gemm2", dict(BLOCK_SIZE_K=128, num_stages=2)),
    ], "int8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g1 not persistent grp32", "gemm1", dict(PERSISTENT=0, GROUP_SIZE_M=32)),
        ("g1 not persistent", "gemm1", dict(PERSISTENT=0)),
        ("g2 flat", "gemm2", dict(FLATTEN=True)),
    ], "int8_channel"),
]

_FP8_4096 = [("gemm1", dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=32, num_warps=8, num_stages=3,
                            USE_TMA=True, PERSISTENT=1, FLATTEN=False)),
             ("gemm2", dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=16, num_warps=4, num_stages=2,
                            USE_TMA=True, PERSISTENT=2, FLATTEN=True))]
_FP8_16384 = [("gemm1", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=32, num_warps=8,
                             num_stages=4, USE_TMA=True, PERSISTENT=0, FLATTEN=False)),
              ("gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=8, num_warps=8,
                             num_stages=4, USE_TMA=True, PERSISTENT=1, FLATTEN=True))]
ROUNDS["s15int8b"] = [   # session 15 (H100), after s15int8: qwen3 int8_channel with the two best T=4096 changes
    # together, and with fp8_channel's whole entries (the same tiles on the int8 tensor cores)
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g1 tma + g2 bk128 s2 flat", [("gemm1", dict(USE_TMA=True)),
                                       ("gemm2", dict(BLOCK_SIZE_K=128, num_stages=2, GROUP_SIZE_M=16, FLATTEN=True))]),
        ("g2 bk128 s2 flat", "gemm2", dict(BLOCK_SIZE_K=128, num_stages=2, GROUP_SIZE_M=16, FLATTEN=True)),
        ("fp8's entry", _FP8_4096),
    ], "int8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("fp8's entry", _FP8_16384),
    ], "int8_channel"),
]

_MASK = dict(MASK_A=True)
ROUNDS["s15mask"] = [   # session 15 (H100): MASK_A (an m-block's padding rows load nothing instead of row 0)
    # where blocks are mostly padding: Mixtral T=256 (64 rows an expert in 128-row blocks; GEMM1 at
    # 84% of DRAM, L2 83%, ninth session), deepseek tp8 T=256 / 1024 (8 / 32 rows an expert), qwen3 T=256
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [
        ("mask g1+g2", [("gemm1", _MASK), ("gemm2", _MASK)]),
        ("mask g1", "gemm1", _MASK),
    ]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("mask g1+g2", [("gemm1", _MASK), ("gemm2", _MASK)])]),
    ("qwen3-30b-a3b", 1, 256, "E=128,N=768,", [("mask g1+g2", [("gemm1", _MASK), ("gemm2", _MASK)])]),
    ("deepseek-v3", 8, 256, "E=256,N=256,", [("mask g1+g2", [("gemm1", _MASK), ("gemm2", _MASK)])]),
    ("deepseek-v3", 8, 1024, "E=256,N=256,", [("mask g1+g2", [("gemm1", _MASK), ("gemm2", _MASK)])]),
]

_ON, _OFF = dict(MASK_A=True), dict(MASK_A=False)
ROUNDS["s15mask2"] = [   # session 15 (H100): MASK_A at the edges of grouped_gemm.mask_a_rule (on up to 4 blocks
    # of pairs an expert): each point's rule (shipped) against the other setting on both GEMMs
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("mask on", [("gemm1", _ON), ("gemm2", _ON)])]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("mask on", [("gemm1", _ON), ("gemm2", _ON)])]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("mask on", [("gemm1", _ON), ("gemm2", _ON)])]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("mask on", [("gemm1", _ON), ("gemm2", _ON)])], "fp8_channel"),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("mask off", [("gemm1", _OFF), ("gemm2", _OFF)])]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("mask off", [("gemm1", _OFF), ("gemm2", _OFF)])], "int8_channel"),
]

ROUNDS["s15mix256"] = [   # session 15 (H100): Mixtral T=256 under MASK_A (90.9%; 92% wanted): the session-12
    # neighbours that lost with unmasked padding rows
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [
        ("g2 split2", "gemm2", dict(SPLIT_K=2)),
        ("bm64", [("gemm1", _t(64, 128, 64, 4, 4, GROUP_SIZE_M=8, USE_TMA=True)),
                  ("gemm2", _t(64, 256, 64, 8, 4, GROUP_SIZE_M=8, USE_TMA=True))]),
    ]),
]

ROUNDS["s16int8bn128"] = [   # session 16 (H100): triton gives int8 tiles 256 wide two
    # IGMMA 64x128 a K step (its int8 instruction N list tops at 224), fp8 one QGMMA 64x256; int8 at BN 128
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 bn128", "gemm2", dict(BLOCK_SIZE_N=128)),
        ("g2 bn128 s3", "gemm2", dict(BLOCK_SIZE_N=128, num_stages=3)),
        ("g1 bn128", "gemm1", dict(BLOCK_SIZE_N=128)),
        ("g1 bn128 s4", "gemm1", dict(BLOCK_SIZE_N=128, num_stages=4)),
        ("g1 128x128", "gemm1", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_stages=4)),
    ], "int8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 bn128", "gemm2", dict(BLOCK_SIZE_N=128)),
        ("g2 bn128 w4", "gemm2", dict(BLOCK_SIZE_N=128, num_warps=4)),
        ("g2 bn128 g16", "gemm2", dict(BLOCK_SIZE_N=128, GROUP_SIZE_M=16)),
    ], "int8_channel"),
]


ROUNDS["s16bk256"] = [   # session 16 (H100): 8-bit operands at BK 256 (256 bytes a row a stage, as bf16
    # BK 128): half the K iterations; the tuner's prefill space stops at BK 128
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 bk256 s2", "gemm2", dict(BLOCK_SIZE_K=256, num_stages=2)),
        ("g1 bk256 s2 bn128", "gemm1", dict(BLOCK_SIZE_K=256, num_stages=2, BLOCK_SIZE_N=128)),
    ], "fp8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 bk256 s2", "gemm2", dict(BLOCK_SIZE_K=256, num_stages=2)),
        ("g1 bk256 s2", "gemm1", dict(BLOCK_SIZE_K=256, num_stages=2)),
    ], "fp8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 bk256 s2", "gemm2", dict(BLOCK_SIZE_K=256, num_stages=2)),
    ], "int8_channel"),
]

ROUNDS["s16group"] = [   # session 16 (H100): GROUP_SIZE_M of the qwen3 W8A8 T=4096 entries (L2 reuse of a
    # weight tile by the m-blocks walking it together), and int8 GEMM2 BN 128 s3 again (557.3 vs
    # 561-564 in s16int8bn128)
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g1 g16", "gemm1", dict(GROUP_SIZE_M=16)),
        ("g1 g32", "gemm1", dict(GROUP_SIZE_M=32)),
        ("g2 bn128 s3", "gemm2", dict(BLOCK_SIZE_N=128, num_stages=3)),
    ], "int8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g1 g16", "gemm1", dict(GROUP_SIZE_M=16)),
        ("g1 g64", "gemm1", dict(GROUP_SIZE_M=64)),
        ("g2 g8", "gemm2", dict(GROUP_SIZE_M=8)),
        ("g2 g32", "gemm2", dict(GROUP_SIZE_M=32)),
    ], "fp8_channel"),
]

ROUNDS["s17l2"] = [   # session 17 (H100): GEMM2 asking L2 for its first tile's weights before its PDL
    # wait (config L2_PREFETCH, lines of 128 B per weight row), at the points where the atomic
    # GEMM2 is now back in the PDL chain (64 pairs an expert): GEMM1's last wave leaves SMs idle.
    # Result: slower at every size (docs/bench_h100_s17_l2_prefetch_ab.txt); the key was reverted,
    # commit 967b0fe has it
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [
        ("g2 l2 16", "gemm2", dict(L2_PREFETCH=16)),
        ("g2 l2 32", "gemm2", dict(L2_PREFETCH=32)),
        ("g2 l2 64", "gemm2", dict(L2_PREFETCH=64)),
        ("g2 l2 128", "gemm2", dict(L2_PREFETCH=128)),
    ]),
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [
        ("g2 l2 8", "gemm2", dict(L2_PREFETCH=8)),
        ("g2 l2 32", "gemm2", dict(L2_PREFETCH=32)),
    ]),
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [
        ("g2 l2 8", "gemm2", dict(L2_PREFETCH=8)),
        ("g2 l2 16", "gemm2", dict(L2_PREFETCH=16)),
    ], "fp8_channel"),
]

ROUNDS["s17bm"] = [   # session 17 (H100): GEMM2 with more rows a tile than GEMM1 (the alignment now takes the
    # larger BM, backends/triton.py align_bm; the tuner only ever searched GEMM2 BM <= GEMM1's).
    # qwen3 T=4096 runs GEMM1 at BM 64; GEMM2 at K = 768 reads its weight tile once per 64 rows
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 128x256 w8 s2", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=2, PERSISTENT=1)),
        ("g2 128x256 w8 s3", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=3, PERSISTENT=1)),
        ("g2 128x256 w8 s4", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4, PERSISTENT=1)),
        ("g2 128x128 w8 s3", "gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_warps=8, num_stages=3,
                                           PERSISTENT=0, FLATTEN=False)),
    ], "fp8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 128x256 w8 s3", "gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, num_warps=8, num_stages=3,
                                           PERSISTENT=1)),
        ("g2 128x256 w8 s4", "gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, num_warps=8, num_stages=4,
                                           PERSISTENT=1)),
        ("g2 128x128 w8 s3", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=3, PERSISTENT=1)),
    ], "int8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 128x256 w8 s3", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=3)),
        ("g2 128x256 w8 s4", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4)),
    ]),
]

ROUNDS["s17bm2"] = [   # session 17 (H100): s17bm's one gain (qwen3 bf16 T=4096 GEMM2 128x256 w8 s4, 835.8 vs
    # 845.4 / 850.2 us) again, and GEMM2 at BM 128 over GEMM1's 64 on deepseek tp8 T=4096 (128 pairs an expert)
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 128x256 w8 s4", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4)),
        ("g2 128x256 w8 s4 P1", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4, FLATTEN=False)),
        ("g2 128x256 w8 s4 g8", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4, GROUP_SIZE_M=8)),
    ]),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 128x256 w8 s4", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4, PERSISTENT=0, FLATTEN=False)),
        ("g2 128x256 w8 s3 P1", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=3, PERSISTENT=1)),
    ]),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 res 128x128 x56 w8 s3", "gemm2", _res(128, 128, 56, 8, 3)),
        ("g2 res 128x64 x112 w8 s4", "gemm2", _res(128, 64, 112, 8, 4)),
    ], "fp8_block"),
]

ROUNDS["s17mix"] = [   # session 17 (H100): Mixtral T=256 (91.0%, 92% wanted), GEMM1's tail: 896 tiles of 128 x
    # (2 x 128) for 132 SMs leave 28 idle for the last ~95 us wave; narrower tiles shorten the wave
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [
        ("g1 bn64 w8 s4", "gemm1", dict(BLOCK_SIZE_N=64)),
        ("g1 bn64 w4 s4", "gemm1", dict(BLOCK_SIZE_N=64, num_warps=4)),
        ("g1 bn64 bk128 w4 s3", "gemm1", dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=3)),
        ("g1 persistent", "gemm1", dict(PERSISTENT=1)),
    ]),
]

ROUNDS["s17mix2"] = [   # session 17 (H100): s17mix's win (GEMM1 128 x (2 x 64) x 128 w4 s3: 1012.9 vs 1026.0 us,
    # 92.3%) again, and its neighbours; the same tile at T=1024
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [
        ("g1 bn64 bk128 w4 s3", "gemm1", dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=3)),
        ("g1 bn64 bk128 w8 s3", "gemm1", dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=8, num_stages=3)),
        ("g1 bn32 bk256 w4 s2", "gemm1", dict(BLOCK_SIZE_N=32, BLOCK_SIZE_K=256, num_warps=4, num_stages=2)),
        ("g1 bn64 bk128 w4 s3 x2", "gemm1", dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=3)),
    ]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [
        ("g1 bn64 bk128 w4 s3", "gemm1", dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=3)),
    ]),
]

ROUNDS["s17h200"] = [   # session 17, on an H200 (the script takes this GPU's files): the three H100 wins of the
    # session against the H200 entries (Mixtral T=256 GEMM1 128 x (2 x 64) x 128; GEMM2 at BM 128 over GEMM1's
    # 64 for qwen3 bf16 and deepseek tp8 fp8_block at T=4096)
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [
        ("g1 bn64 bk128 w8 s3", "gemm1", dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=8, num_stages=3,
                                              USE_TMA=True)),
        ("g1 bn64 bk128 w4 s3", "gemm1", dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=3,
                                              USE_TMA=True)),
    ]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g2 128x256 w8 s4", "gemm2", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4)),
    ]),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 res 128x128 x56 w8 s3", "gemm2", dict(_res(128, 128, 56, 8, 3), BLOCK_SIZE_K=128)),
    ], "fp8_block"),
]

ROUNDS["s18mix16k"] = [   # session 18 (H100): Mixtral T=16384 at 78% of the roofline (80% wanted), neighbours
    # of the shipped GEMM1 128x128x64 w8 s3 GM16 TMA / GEMM2 128x256x64 w8 s4 GM32 TMA not measured before
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
        ("g1 P1 flat", "gemm1", dict(PERSISTENT=1, FLATTEN=True)),
        ("g1 bk128 s2", "gemm1", dict(BLOCK_SIZE_K=128, num_stages=2)),
        ("g1 gm64", "gemm1", dict(GROUP_SIZE_M=64)),
        ("g2 bk128 s2", "gemm2", dict(BLOCK_SIZE_K=128, num_stages=2)),
    ]),
]

ROUNDS["s18mix16k2"] = [   # session 18 (H100): s18mix16k's win (GEMM1 PERSISTENT 1: 18042 vs 18593 / 18839 us,
    # 80.3%) shipped; against the old entry again and its persistent neighbours
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [
        ("g1 old (P0)", "gemm1", dict(PERSISTENT=0)),
        ("g1 P1 gm8", "gemm1", dict(GROUP_SIZE_M=8)),
        ("g1 P1 gm32", "gemm1", dict(GROUP_SIZE_M=32)),
        ("g1 old (P0) 2", "gemm1", dict(PERSISTENT=0)),
    ]),
    # the same switch at other large-T 16-bit GEMM1s that run one tile a program
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
]

ROUNDS["h200p1"] = [   # prepared in session 18, not run: the H100's persistent-GEMM1 wins (Mixtral T=1024 /
    # 16384, s18mix16k2) on whatever this GPU's files hold (the script takes this GPU's files: run it on an H200)
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
]

ROUNDS["s19blk"] = [   # session 19 (H100): with RESCALE's block scales loaded a K group ahead (SCALE_PREFETCH),
    # the deepseek-v3 tp8 fp8_block GEMM1 neighbours of the shipped tiles (more stages, persistent)
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g1 s3", "gemm1", dict(num_stages=3)),
        ("g1 s5", "gemm1", dict(num_stages=5)),
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
        ("g1 gm8", "gemm1", dict(GROUP_SIZE_M=8)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g1 128x128 w8 s4", "gemm1", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4)),
        ("g1 s4", "gemm1", dict(num_stages=4)),
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
    ], "fp8_block"),
    # qwen3 fp8_channel T=16384: GEMM1 one tile a program (int8's entry is persistent)
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))],
     "fp8_channel"),
]

ROUNDS["s19blk2"] = [   # session 19 (H100): s19blk's T=4096 win (GEMM1 128x128 w8 s4: 944.3 vs 990.6 us) shipped;
    # its neighbours, and the T=1024 GEMM1 (32x128 w4 s3, pointer loads) against the larger tiles
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g1 s3", "gemm1", dict(num_stages=3)),
        ("g1 s5", "gemm1", dict(num_stages=5)),
        ("g1 old 64x128 w4 s5", "gemm1", dict(BLOCK_SIZE_M=64, num_warps=4, num_stages=5)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 1024, "E=256,N=256,", [
        ("g1 32x128 tma", "gemm1", dict(USE_TMA=True)),
        ("g1 64x128 w4 s5 tma", "gemm1", dict(BLOCK_SIZE_M=64, num_stages=5, USE_TMA=True)),
        ("g1 128x128 w8 s4 tma", "gemm1", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4, USE_TMA=True)),
    ], "fp8_block"),
]

ROUNDS["s19next"] = [   # prepared in session 19, not run (H100): deepseek-v3 tp8 fp8_block T=1024 GEMM2 (32x256,
    # per-group dot) spills 56 bytes (python scripts/ptxas_advice.py); RESCALE keeps no second fp32 tile
    ("deepseek-v3", 8, 1024, "E=256,N=256,", [
        ("g2 rescale", "gemm2", dict(RESCALE=True)),
        ("g2 rescale 64x256 w4", "gemm2", dict(RESCALE=True, BLOCK_SIZE_M=64)),
    ], "fp8_block"),
]

ROUNDS["h200blk"] = [   # prepared in session 19, not run: run it on an H200 (the script takes this GPU's files).
    # The H100's T=4096 fp8_block GEMM1 win under the scale prefetch (128x128 w8 s4: 990 -> 944 us)
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g1 128x128 w8 s4 P0", "gemm1", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4, PERSISTENT=0)),
        ("g1 128x128 w8 s4 P1", "gemm1", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=4, PERSISTENT=1)),
    ], "fp8_block"),
]

ROUNDS["s20pp"] = [   # session 20 (H100): session 11's two-CTAs-an-SM GEMM1 tiles (s11r4: one CTA's per-group
    # rescale overlapping the other's wgmma; lost then) again now that the block scales are prefetched.
    # GEMM2 stays the shipped one (the alignment takes the larger BM since session 17)
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g1 64x128 w4 s2", "gemm1", _g1(64, 128, 4, 2)),
        ("g1 64x128 w4 s3", "gemm1", _g1(64, 128, 4, 3)),
        ("g1 64x64 w4 s3", "gemm1", _g1(64, 64, 4, 3)),
        ("g1 64x64 w4 s4", "gemm1", _g1(64, 64, 4, 4)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g1 64x128 w4 s2", "gemm1", _g1(64, 128, 4, 2)),
        ("g1 64x64 w4 s3", "gemm1", _g1(64, 64, 4, 3)),
    ], "fp8_block"),
]


ROUNDS["s20tok"] = [   # session 20 (H100), LOST and reverted: TOKEN_ORDER exists only in commit 19294d8 (at HEAD the
    # key is ignored). deepseek-v3 tp8 T=16384's GEMM2 is its largest kernel (fp8_block
    # 1313 us: 1.88 GB of bf16 atomic adds into the 235 MB output). TOKEN_ORDER takes its m-blocks in
    # token order (align.block_order), so the blocks in flight add into ~1/4.5 of the tokens: with the
    # 1024-column bands a ~7.5 MB window of the output (34 MB in expert order); without bands ~52 MB,
    # and h read once instead of once a band
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g2 token+band", "gemm2", dict(TOKEN_ORDER=True)),
        ("g2 token m-major", "gemm2", dict(TOKEN_ORDER=True, BAND_MAJOR=False)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g2 token+band", "gemm2", dict(TOKEN_ORDER=True)),
        ("g2 token m-major", "gemm2", dict(TOKEN_ORDER=True, BAND_MAJOR=False)),
    ]),
]


ROUNDS["s21p"] = [   # session 21 (H100): GEMM2 one program an SM (PERSISTENT 1), never tried on the 16-bit
    # tiled GEMM2s (GEMM1's won 3% at Mixtral T=16384 in session 18). Mixtral T=16384 sits at 79-80%.
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [
        ("g2 P1", "gemm2", dict(PERSISTENT=1, FLATTEN=False)),
        ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True)),
    ]),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g2 P1", "gemm2", dict(PERSISTENT=1, FLATTEN=False))]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g2 P1", "gemm2", dict(PERSISTENT=1, FLATTEN=False))]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 P1", "gemm2", dict(PERSISTENT=1, FLATTEN=False)),
        ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True)),
    ]),
]

ROUNDS["s21q"] = ROUNDS["s21p"][-1:]   # the qwen3 part, which the first call's time limit cut

ROUNDS["s21r"] = [   # session 21 (H100): s21q's one sample (qwen3 bf16 T=16384 GEMM2 P1 flat 2485.8 us against
    # 2528.1 / 2587.2 shipped) alternated with the shipped entry
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True)),
        ("g2 P0 (shipped)", "gemm2", dict(PERSISTENT=0)),
        ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True)),
        ("g2 P0 (shipped)", "gemm2", dict(PERSISTENT=0)),
        ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True)),
    ]),
]

ROUNDS["s21s"] = [   # session 21 (H100): persistent / flattened neighbours never measured, alternated with
    # the shipped entry: qwen3 int8_channel T=16384 GEMM2 flattened (fp8_channel's entry is), deepseek-v3
    # tp8 bf16 T=4096 GEMM1 one program an SM
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 P1 flat", "gemm2", dict(FLATTEN=True)),
        ("g2 P1 (shipped)", "gemm2", dict(FLATTEN=False)),
        ("g2 P1 flat", "gemm2", dict(FLATTEN=True)),
    ], "int8_channel"),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
        ("g1 P0 (shipped)", "gemm1", dict(PERSISTENT=0)),
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
    ]),
]

ROUNDS["s21t"] = [   # session 21 (H100): s21s's win (deepseek bf16 T=4096 GEMM1 P1, 1528 -> 1495 us) on the
    # fp8_block GEMM1s of the same shape
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
        ("g1 P0 (shipped)", "gemm1", dict(PERSISTENT=0)),
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
    ], "fp8_block"),
]

ROUNDS["s22next"] = [   # prepared in session 21, not run (H100): the 16-bit entries at T >= 1024 that still run
    # one tile a program and whose persistent launch was never measured (sessions 18-21 covered the rest)
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
        ("g2 P1", "gemm2", dict(PERSISTENT=1, FLATTEN=False)),
        ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True)),
    ]),
    ("deepseek-v3", 8, 1024, "E=256,N=256,", [
        ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
        ("g2 P1", "gemm2", dict(PERSISTENT=1, FLATTEN=False)),
    ]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [
        ("g2 P1 again", "gemm2", dict(PERSISTENT=1, FLATTEN=False)),   # s21p: one sample, 1632.2 -> 1624.3
    ]),
]


_RES = dict(PERSISTENT=0, FLATTEN=False, BAND_MAJOR=True)
ROUNDS["s22band"] = [   # session 22 (H100): the A-resident GEMM2 in column bands (BAND_MAJOR, shipped at T=16384
    # since session 14) at deepseek tp8 T=4096, whose output (58 MB) is also past the 50 MB L2
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 x8 band", "gemm2", dict(A_RESIDENT=8, **_RES)),
        ("g2 x16 band", "gemm2", dict(A_RESIDENT=16, **_RES)),
        ("g2 x4 band", "gemm2", dict(A_RESIDENT=4, **_RES)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 x16 BN64 band", "gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
                                           num_warps=8, num_stages=4, A_RESIDENT=16, **_RES)),
        ("g2 x8 BN128 band", "gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
                                           num_warps=8, num_stages=3, A_RESIDENT=8, **_RES)),
    ]),
]
ROUNDS["s22band2"] = [   # session 22 (H100), after s22band shipped the banded GEMM2s at deepseek tp8 T=4096: their neighbours
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 BN64 x16", "gemm2", dict(BLOCK_SIZE_N=64, A_RESIDENT=16)),
        ("g2 s4", "gemm2", dict(num_stages=4)),
        ("g2 s2", "gemm2", dict(num_stages=2)),
        ("g2 BM64", "gemm2", dict(BLOCK_SIZE_M=64)),
        ("g2 w4", "gemm2", dict(num_warps=4)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 x8", "gemm2", dict(A_RESIDENT=8)),
        ("g2 x32", "gemm2", dict(A_RESIDENT=32)),
        ("g2 s3", "gemm2", dict(num_stages=3)),
        ("g2 BM64", "gemm2", dict(BLOCK_SIZE_M=64)),
        ("g2 BK128 s3", "gemm2", dict(BLOCK_SIZE_K=128, num_stages=3)),
    ]),
]
ROUNDS["s22band3"] = [   # session 22 (H100), after s22band2 shipped fp8_block T=4096 GEMM2 x16 of BN 64 banded
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 x8", "gemm2", dict(A_RESIDENT=8)),
        ("g2 x32", "gemm2", dict(A_RESIDENT=32)),
        ("g2 s4", "gemm2", dict(num_stages=4)),
        ("g2 BK64 s4", "gemm2", dict(BLOCK_SIZE_K=64, num_stages=4)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g2 BN64 x16", "gemm2", dict(BLOCK_SIZE_N=64, A_RESIDENT=16)),
        ("g2 BN64 x16 s4", "gemm2", dict(BLOCK_SIZE_N=64, A_RESIDENT=16, num_stages=4)),
    ], "fp8_block"),
]
_G2_BF16 = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=8, num_stages=4,
                A_RESIDENT=16, **_RES)
ROUNDS["s22h200"] = [   # session 22 (H200): the banded A-resident GEMM2 (H100: T=16384 since session 14, T=4096 since
    # s22band*) on the H200, whose deepseek tp8 files never had it (so its T=16384 ran the fixed-order reduce)
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [
        ("g2 H100 x16 BN64 band", "gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=8,
                                                num_stages=3, A_RESIDENT=16, **_RES)),
        ("g2 x8 BN128 band", "gemm2", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_warps=8,
                                           num_stages=3, A_RESIDENT=8, **_RES)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [("g2 H100 x16 BN64 band", "gemm2", _G2_BF16)]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g2 x16 BN64 band", "gemm2", dict(A_RESIDENT=16, BAND_MAJOR=True)),
        ("g2 H100 x8 BN128 band", "gemm2", dict(BLOCK_SIZE_N=128, num_stages=3, A_RESIDENT=8, BAND_MAJOR=True)),
    ], "fp8_block"),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g2 H100 x16 BN64 band", "gemm2", dict(A_RESIDENT=16, BAND_MAJOR=True))]),
]
ROUNDS["s22h200p"] = [   # session 22 (H200): the H100's persistent wins of sessions 18-21 on the H200's files (h200p1 plus
    # the two session-21 entries)
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True))]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
]
def _rs(bm, bn, w, st, n):   # an A-resident banded GEMM2 entry (_res in bands)
    return dict(_res(bm, bn, n, w, st), **_RES)


ROUNDS["s22qres"] = [   # session 22 (H100): the A-resident GEMM2 in 1024-column bands at qwen3 (K = 768: 3 chunks of
    # 256), whose T=16384 output (67 MB) is past the L2 as deepseek's is; last tried m-major, before the atomic k-sum
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 res 128x128 s2 x8", "gemm2", _rs(128, 128, 8, 2, 8)),
        ("g2 res 128x64 s3 x16", "gemm2", _rs(128, 64, 8, 3, 16)),
        ("g2 res 64x128 w4 s3 x8", "gemm2", _rs(64, 128, 4, 3, 8)),
    ], "fp8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g2 res 128x64 s3 x16", "gemm2", _rs(128, 64, 8, 3, 16))],
     "int8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 res 64x64 w4 s3 x16", "gemm2", _rs(64, 64, 4, 3, 16)),
        ("g2 res 64x64 w8 s2 x16", "gemm2", _rs(64, 64, 8, 2, 16)),
    ]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g2 res 128x64 s3 x16", "gemm2", _rs(128, 64, 8, 3, 16))],
     "fp8_channel"),
]
ROUNDS["s22qres2"] = [   # session 22 (H100): s22qres's entries all failed (shared memory: a stage holds B for all 3 chunks
    # of K = 768; scripts/compile_check.py). The ones that fit (<= 227 KB under triton 3.6), in 1024-column bands
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g2 res 128x64 s2 x16", "gemm2", _rs(128, 64, 8, 2, 16))],
     "fp8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g2 res 64x64 w4 s2 x16", "gemm2", _rs(64, 64, 4, 2, 16))],
     "int8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g2 res 64x32 w4 s2 x32", "gemm2", _rs(64, 32, 4, 2, 32))]),
]
ROUNDS["s22ds16k"] = [   # session 22 (H100): the banded GEMM2 of deepseek tp8 T=16384 at 64-row tiles (T=4096 bf16: equal)
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g2 BM64", "gemm2", dict(BLOCK_SIZE_M=64))]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g2 BM64", "gemm2", dict(BLOCK_SIZE_M=64))], "fp8_block"),
]
ROUNDS["s23h200"] = [   # session 23 (H200): the persistent GEMM2 neighbours of the H200's T=4096 entries never
    # tried (qwen3 bf16 / int8, whose GEMM1s are persistent already; fp8_channel's GEMM2 is P2 flat) and
    # Mixtral's GEMM1 (slower on the H100)
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g2 P2 flat", "gemm2", dict(PERSISTENT=2, FLATTEN=True)),
                                                ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True))]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g2 P2 flat", "gemm2", dict(PERSISTENT=2, FLATTEN=True))],
     "int8_channel"),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False)),
                                              ("g2 P1 flat", "gemm2", dict(PERSISTENT=1, FLATTEN=True))]),
]
def _c2(bm, bn, w, st, p=2):   # an 8-bit tile of two CTAs an SM (PERSISTENT p, TMA, BK 128)
    return _t(bm, bn, 128, w, st, USE_TMA=True, PERSISTENT=p, FLATTEN=False)


ROUNDS["s23int8"] = [   # session 23 (H100): int8's epilogue converts every int32 accumulator to fp32 with
    # I2FP.F32.S32 (128 a thread a tile; fp8 has none), ~500 M conversions at qwen3 T=16384, ~135 us at 16 a
    # clock an SM: the int8 - fp8 GEMM gap (1589 vs 1445 us). Tiles of two CTAs an SM (4 warps, <= 113 KB)
    # let one CTA's epilogue overlap the other's MMAs (compile_check: 255 / 215 registers, 82-98 KB)
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g2 128x128 w4 s3 P2", "gemm2", _c2(128, 128, 4, 3)),
        ("g2 64x256 w4 s2 P2", "gemm2", _c2(64, 256, 4, 2)),
        ("g1 128x64 w4 s3 P2", "gemm1", _c2(128, 64, 4, 3)),
        ("g1 64x128 w4 s2 P2", "gemm1", _c2(64, 128, 4, 2)),
        ("g1+g2 2 CTAs", [("gemm1", _c2(128, 64, 4, 3)), ("gemm2", _c2(128, 128, 4, 3))]),
    ], "int8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g1 64x128 w4 s2 P2", "gemm1", _c2(64, 128, 4, 2)),
        ("g1 128x64 w4 s3 P2", "gemm1", _c2(128, 64, 4, 3)),
    ], "int8_channel"),
]
ROUNDS["s23int8b"] = [   # session 23 (H100): int8 T=16384 is ~2% short of 1.5x; its GEMM1 runs persistent where
    # fp8_channel's same tile does not (P0, GROUP_SIZE_M 32), and its GEMM2's grouping was never varied
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [
        ("g1 P0", "gemm1", dict(PERSISTENT=0)),
        ("g1 P0 G32 (fp8's)", "gemm1", dict(PERSISTENT=0, GROUP_SIZE_M=32)),
        ("g2 G16", "gemm2", dict(GROUP_SIZE_M=16)),
        ("g2 G4", "gemm2", dict(GROUP_SIZE_M=4)),
    ], "int8_channel"),
]
ROUNDS["s24t39"] = [   # session 24, run under triton 3.9 (T39=1 / scripts/t39_env.sh): the 3.6-tuned entries
    # ran 9% slower at Mixtral T=16384 (20081 vs 18471 us) and 2.5% at qwen3 int8 T=4096 under 3.9
    # (docs/bench_h100_s24_t39_vs_t36.txt): is it the persistent GEMM1 or the pipelining depth?
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [
        ("g1 P0", "gemm1", dict(PERSISTENT=0)),
        ("g1 s4", "gemm1", dict(num_stages=4)),
        ("g1 P0 s4", "gemm1", dict(PERSISTENT=0, num_stages=4)),
        ("g2 s3", "gemm2", dict(num_stages=3)),
    ]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g1 P0", "gemm1", dict(PERSISTENT=0)),
        ("g2 s3", "gemm2", dict(num_stages=3)),
    ], "int8_channel"),
]
_ONE = dict(GU_ONE_DOT=True)
ROUNDS["s24onedot"] = [   # session 24 (H100): GEMM1's gate and up tiles in ONE dot of width 2 BN (GU_ONE_DOT):
    # one wgmma m64n256 a K step where two m64n128 read the A tile from shared memory twice (sm_90
    # compile: bf16 GEMM1 128x(2x128) 255 -> 173 registers). The dense Mixtral T=16384 GEMM1 with
    # one 128x256 dot ran 11.1 ms (multicast_probe tl) where the library's GEMM1 takes 12.6
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g1 one", "gemm1", _ONE)]),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g1 one", "gemm1", _ONE)]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 tma", "gemm1", dict(USE_TMA=True)),
                                              ("g1 tma one", "gemm1", dict(_ONE, USE_TMA=True))]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 one", "gemm1", _ONE)]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g1 one", "gemm1", _ONE)]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 one", "gemm1", _ONE)], "fp8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g1 one", "gemm1", _ONE)], "fp8_channel"),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g1 one", "gemm1", _ONE)]),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [("g1 one", "gemm1", _ONE)]),
]
ROUNDS["s24ds4k"] = [("deepseek-v3", 8, 4096, "E=256,N=256,", [("g1 one", "gemm1", _ONE)])]   # s24onedot's cut
ROUNDS["s24q8"] = [   # session 24 (H100): with GU_ONE_DOT the bf16 layers got faster, so the 8-bit / bf16 ratios
    # of issue 5 fell (qwen3 fp8_channel T=4096 1.49x, int8_channel 1.45x): the one-dot GEMM1 at the 8-bit
    # T=4096 points (fp8's 64 x 256 entry lost with it in s24onedot: here at BN 128, where one dot is n 256)
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [
        ("g1 64x128 one", "gemm1", dict(_ONE, BLOCK_SIZE_N=128)),
        ("g1 128x128 s4 one", "gemm1", dict(_ONE, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_stages=4)),
    ], "fp8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g1 64x128 one", "gemm1", dict(_ONE, BLOCK_SIZE_N=128))],
     "int8_channel"),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 one", "gemm1", _ONE)], "int8_channel"),
]
ROUNDS["s25next"] = [   # prepared in session 24, not run (H100; on an H200 it takes that GPU's files): GU_ONE_DOT
    # where it was not tried, and the room its 173 registers (from 255) leave the bf16 GEMM1 tile
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [("g1 one", "gemm1", _ONE)]),
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [("g1 tma one", "gemm1", dict(_ONE, USE_TMA=True))]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g1 s4", "gemm1", dict(num_stages=4)),
                                               ("g1 bk128 s2", "gemm1", dict(BLOCK_SIZE_K=128, num_stages=2))]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 s3", "gemm1", dict(num_stages=3)),
                                              ("g1 P0", "gemm1", dict(PERSISTENT=0))]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 s3", "gemm1", dict(num_stages=3)),
                                                ("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g1 P1", "gemm1", dict(PERSISTENT=1, FLATTEN=False))]),
]
_HT = dict(HALF_TAIL=True)
ROUNDS["s25half"] = [   # session 25 (H100): HALF_TAIL, a tile whose second half of rows is padding at half height
    # (Mixtral T=1024: ~256 +- 16 rows an expert, so about half the experts pay a third 128-row tile for a few rows)
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 half", "gemm1", _HT), ("g2 half", "gemm2", _HT),
                                              ("both half", [("gemm1", _HT), ("gemm2", _HT)])]),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("both half", [("gemm1", _HT), ("gemm2", _HT)])]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 half", "gemm1", _HT),
                                                ("g2 half noflat", "gemm2", dict(_HT, FLATTEN=False))]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g1 half", "gemm1", _HT)]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("both half", [("gemm1", _HT), ("gemm2", _HT)])]),
]
ROUNDS["s25half2"] = [   # session 25 (H100): s25half's one gain (Mixtral T=4096, both GEMMs non-persistent) again,
    # each GEMM alone; persistent GEMM1s lost 6-20% with HALF_TAIL (Mixtral T=1024 / 16384)
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("both half", [("gemm1", _HT), ("gemm2", _HT)]),
                                              ("g1 half", "gemm1", _HT), ("g2 half", "gemm2", _HT),
                                              ("both half again", [("gemm1", _HT), ("gemm2", _HT)])]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g2 half", "gemm2", _HT)]),
]
_ONE_T = dict(GU_ONE_DOT=True, USE_TMA=True)
ROUNDS["s25h200one"] = [   # session 25 (H200, its own files): GU_ONE_DOT at the 128-row GEMM1 tiles, where it won
    # on the H100 (session 24); USE_TMA with it, which one dot needs
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g1 one", "gemm1", _ONE_T)]),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g1 one", "gemm1", _ONE_T)]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 one", "gemm1", _ONE_T)]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 one", "gemm1", _ONE_T)]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g1 one", "gemm1", _ONE_T)]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 one", "gemm1", _ONE_T)], "fp8_channel"),
]
ROUNDS["s25h200one2"] = [   # session 25 (H200): the one dot at the other points H100 took it; HALF_TAIL beside it
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [("g1 one", "gemm1", _ONE_T)]),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g1 one half", "gemm1", dict(_ONE_T, HALF_TAIL=True))]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g2 half", "gemm2", _HT)]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 one", "gemm1", _ONE_T)], "int8_channel"),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g1 128x128 s4 one", "gemm1", dict(
        _ONE_T, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_stages=4))], "fp8_channel"),
]
_ONE_128 = dict(_ONE_T, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_stages=4)
ROUNDS["s25h200one3"] = [   # session 25 (H200): one dot at 128 x 128 where the shipped GEMM1 is 64 x 256 (the one
    # dot lost at 64 x 256 on the H100); Mixtral T=1024 with the H100's GROUP_SIZE_M 32
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g1 128x128 s4 one", "gemm1", _ONE_128)]),
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [("g1 128x128 s4 one", "gemm1", _ONE_128)]),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [("g1 128x128 s4 one", "gemm1", _ONE_128)]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 group 32", "gemm1", dict(GROUP_SIZE_M=32))]),
]
ROUNDS["s25one128"] = [   # session 25 (H100): the 128 x 128 one-dot GEMM1 that won at qwen3 T=1024 on the H200 (-3%)
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [("g1 128x128 s4 one", "gemm1", _ONE_128)]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g1 128x128 s4 one", "gemm1", _ONE_128)]),
]
ROUNDS["s25one128w8"] = [   # session 25 (H100): s25one128's T=1024 variant kept the H100 entry's 4 warps (a 128 x 256
    # accumulator in 128 threads: GEMM1 954 us against ~300); with 8 warps, as the H200's entry has
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [("g1 128x128 w8 s4 one", "gemm1", dict(_ONE_128, num_warps=8))]),
]
_SH = dict(SORTED_H=True)
ROUNDS["s26sorted"] = [   # session 26 (H100): GEMM2 reading h in sorted order (SORTED_H: GEMM1 writes it at the
    # sorted positions, GEMM2 loads its [BM, BK] boxes by TMA instead of gathering rows by slot with cp.async)
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g2 sorted", "gemm2", _SH),
                                              ("g2 sorted no half", "gemm2", dict(_SH, HALF_TAIL=False))]),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g2 sorted", "gemm2", _SH)]),
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [("g2 sorted", "gemm2", _SH)]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g2 sorted", "gemm2", _SH)]),
]
ROUNDS["s26sorted2"] = [   # session 26 (H100): s26sorted's other points
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g2 sorted", "gemm2", _SH)]),
    ("deepseek-v3", 8, 1024, "E=256,N=256,", [("g2 sorted tma", "gemm2", dict(_SH, USE_TMA=True))]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g2 sorted", "gemm2", _SH)]),
]
_SX = dict(SORTED_X=True)
ROUNDS["s26sortx"] = [   # session 26 (H100): GEMM1 reading x copied to sorted order (SORTED_X: one gather launch,
    # then GEMM1's A boxes by TMA instead of rows gathered by token with cp.async); Mixtral with SORTED_H shipped
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 sorted x", "gemm1", _SX)]),
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g1 sorted x", "gemm1", _SX)]),
    ("qwen3-30b-a3b", 1, 4096, "E=128,N=768,", [("g1 sorted x", "gemm1", _SX)]),
    ("qwen3-30b-a3b", 1, 16384, "E=128,N=768,", [("g1 sorted x", "gemm1", _SX),
                                                ("g1 sorted x + g2 sorted h", [("gemm1", _SX), ("gemm2", _SH)])]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g1 sorted x", "gemm1", _SX)]),
]
ROUNDS["s26sortx2"] = [   # session 26 (H100): s26sortx's largest point
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g1 sorted x", "gemm1", _SX)]),
]
ROUNDS["s26sortx3"] = [   # session 26 (H100): SORTED_X's one gain (Mixtral T=4096, -5.5 / -7.6%) again, with a
    # persistent GEMM1; T=1024 (persistent GEMM1: +2% with it) with GEMM1 one tile a program; T=256
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g1 sorted x", "gemm1", _SX),
                                              ("g1 sorted x persistent", "gemm1", dict(_SX, PERSISTENT=1))]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g1 sorted x one tile", "gemm1", dict(_SX, PERSISTENT=0))]),
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [("g2 sorted h", "gemm2", _SH), ("g1 sorted x", "gemm1", _SX),
                                             ("both", [("gemm1", _SX), ("gemm2", _SH)])]),
]
ROUNDS["s26h200"] = [   # session 26 (H200, its own files): what won on the H100's Mixtral (GEMM2 SORTED_H at
    # T=1024 / 4096 / 16384, GEMM1 SORTED_X with it at T=4096)
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("g2 sorted h", "gemm2", _SH),
                                              ("both", [("gemm1", _SX), ("gemm2", _SH)])]),
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g2 sorted h", "gemm2", _SH)]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("g2 sorted h", "gemm2", _SH)]),
]
ROUNDS["s26t39"] = [   # session 26 (H100, under triton 3.9: T39=1): the sorted entries against the same entries
    # without them (3.9 puts a fence.proxy.async in every K step of a gathered-A loop)
    ("mixtral-8x7b", 1, 4096, "E=8,N=14336,", [("unsorted", [("gemm1", dict(SORTED_X=False)),
                                                            ("gemm2", dict(SORTED_H=False))])]),
    ("mixtral-8x7b", 1, 16384, "E=8,N=14336,", [("unsorted", "gemm2", dict(SORTED_H=False))]),
]
_B = dict(BAND_MAJOR=True)
ROUNDS["s28bm256"] = [   # session 28: the A-resident GEMM2 at 256 rows. Each program reads its expert's whole w2
    # band once per m-block, so at 128 rows deepseek tp8 T=16384 moves ~4.2 GB of weights from L2 (H100: GEMM2 1203 us
    # with its atomic adds masked off, 901 us for the adds alone, 1684 us both); 256 rows halve that traffic
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [
        ("g2 256x64 x16 w8 s2", "gemm2", dict(_res(256, 64, 16, 8, 2), **_B)),
        ("g2 256x64 x16 w16 s2", "gemm2", dict(_res(256, 64, 16, 16, 2), **_B))]),
    ("deepseek-v3", 8, 16384, "E=256,N=256,", [("g2 256x64 x16 w8 s3", "gemm2", dict(_res(256, 64, 16, 8, 3), **_B)),
                                               ("g2 256x64 x16 w8 s2", "gemm2", dict(_res(256, 64, 16, 8, 2), **_B))],
     "fp8_block"),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [("g2 256x64 x16 w8 s2", "gemm2", dict(_res(256, 64, 16, 8, 2), **_B))]),
    ("deepseek-v3", 8, 4096, "E=256,N=256,", [("g2 256x64 x16 w8 s3", "gemm2", dict(_res(256, 64, 16, 8, 3), **_B))],
     "fp8_block"),
]

names = sys.argv[1:] or [list(ROUNDS)[-1]]
CASES = [c for n in names for c in ROUNDS[n]]
for model, tp, T, prefix, variants, *rest in CASES:
    quant = rest[0] if rest else "none"
    dt = "bfloat16" if quant == "none" else quant
    src = glob.glob(f"fusedmoe/kernels/configs/{prefix}device_name={DEVICE},dtype={dt}*.json")[0]
    us, pct = bench(model, tp, T, quant=quant)
    print(f"{model} tp{tp} T={T} shipped: {us:9.1f} us {pct:5.1f}%", flush=True)
    for label, gemm, over in [v if len(v) == 3 else (v[0], v[1], None) for v in variants]:
        d = json.load(open(src))
        for g, o in ([(gemm, over)] if over is not None else gemm):
            d[str(T)][g].update(o)
        over = over if over is not None else gemm
        with tempfile.TemporaryDirectory() as td:
            json.dump(d, open(os.path.join(td, os.path.basename(src)), "w"))
            us, pct = bench(model, tp, T, td, quant)
        print(f"{model} tp{tp} T={T} {label:16s}: {us:9.1f} us {pct:5.1f}%  {over}", flush=True)
    us, pct = bench(model, tp, T, quant=quant)      # the shipped entry again: the spread of the run
    print(f"{model} tp{tp} T={T} shipped again: {us:9.1f} us {pct:5.1f}%", flush=True)
