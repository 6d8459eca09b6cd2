"""Decode kernels (fusedmoe/kernels/decode.py) against the plain-torch references.

No tl.dot in these kernels, so the interpreter runs them in bf16 as well. Without CUDA they
run under TRITON_INTERPRET=1 on tiny shapes; with CUDA the same tests run on the GPU and
the ``gpu`` tests add real model sizes and the comparison with the grouped path.
Legend as in test_kernels_gemm.py.
"""
from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fusedmoe.kernels.decode import decode_config, decode_forward, decode_gemm1, decode_gemm2  # noqa: E402
from fusedmoe.kernels.grouped_gemm import moe_forward_triton  # noqa: E402
from fusedmoe.reference.kernels import gemm1_act_ref, gemm2_ref  # noqa: E402
from fusedmoe.reference.moe import moe_ref  # noqa: E402
from test_kernels_gemm import (DEV, E, H, I, K_TOP, QUANT_CASES, TOL, _int_operands, _pow2, _randn,  # noqa: E402
                               _rel, _routing, _weights, _x)

# odd sizes: no tile divides them (BN 4..32, BK up to 512)
H_ODD, I_ODD = 72, 40
CFG = dict(BLOCK_N=8, BLOCK_K=32, num_warps=4, PREFETCH=True)   # several N tiles and K iterations, masked tails
TOL_BF16 = 2e-2


@pytest.mark.parametrize("act,kw", [
    ("silu", {}),
    ("silu", {"swiglu_limit": 0.3}),
    ("gelu", {}),
    ("gelu_tanh", {}),
    ("swigluoai", {"alpha": 1.702, "limit": 0.4}),
    ("relu2_no_mul", {}),
    ("silu_no_mul", {}),
    ("gelu_no_mul", {}),
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_decode_gemm1_activations_bias(act, kw, dtype):
    gated = not act.endswith("_no_mul")
    w13, _, b13, _ = _weights(E, H_ODD, I_ODD, dtype, gated=gated, bias=True)
    x = _x(3, H_ODD, dtype)
    _, ids = _routing(3, E, K_TOP)
    h = decode_gemm1(x, w13, ids, act, bias=b13, config=CFG, **kw)
    ref = gemm1_act_ref(x, w13, ids, act, bias=b13, **kw)
    assert h.shape == (3 * K_TOP, I_ODD) and h.dtype == dtype
    assert _rel(h, ref) < TOL.get(dtype, TOL_BF16)


def test_decode_gate_up_not_interchangeable():
    # asymmetric halves: swapping gate and up rows must change the result
    w13, _, _, _ = _weights(E, H_ODD, I_ODD, torch.float32)
    x = _x(2, H_ODD, torch.float32)
    _, ids = _routing(2, E, K_TOP)
    swapped = torch.cat([w13[:, I_ODD:], w13[:, :I_ODD]], dim=1)
    a = decode_gemm1(x, w13, ids, "silu", config=CFG)
    b = decode_gemm1(x, swapped, ids, "silu", config=CFG)
    assert _rel(a, gemm1_act_ref(x, w13, ids, "silu")) < 1e-5
    assert _rel(a, b) > 0.1


@pytest.mark.parametrize("T", [1, 2, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_decode_forward(T, dtype):
    w13, w2, _, _ = _weights(E, H_ODD, I_ODD, dtype)
    x = _x(T, H_ODD, dtype)
    tw, ids = _routing(T, E, K_TOP, seed=T)
    out = decode_forward(x, w13, w2, tw, ids, "silu")            # decode_config's own choice
    ref = moe_ref(x, w13, w2, tw, ids, "silu", round_h_to=dtype)
    assert out.shape == (T, H_ODD) and out.dtype == dtype
    assert _rel(out, ref) < TOL.get(dtype, TOL_BF16)
    assert _rel(out, moe_ref(x, w13, w2, tw, ids, "silu")) < 2 * TOL.get(dtype, TOL_BF16)


def test_decode_matches_grouped_path_fp32_bias_map_no_weight():
    # expert_map drops experts 1, 3, 4 (token 0 keeps none), biases on, router weight applied
    # on the input (mul_routed_weight False) in GEMM2; the grouped path must agree
    E_g, k, T = 6, 2, 5
    emap = torch.tensor([0, -1, 1, -1, -1, 2], dtype=torch.int32, device=DEV)
    w13, w2, b13, b2 = _weights(3, H_ODD, I_ODD, torch.float32, bias=True)
    x = _x(T, H_ODD, torch.float32)
    tw, ids = _routing(T, E_g, k, seed=6)
    ids[0] = torch.tensor([1, 3], dtype=torch.int32)
    h = decode_gemm1(x, w13, ids, "swigluoai", expert_map=emap, bias=b13, limit=0.5, config=CFG)
    out = torch.full((T, H_ODD), float("nan"), device=DEV)
    decode_gemm2(h, w2, ids, tw, out, expert_map=emap, bias=b2, mul_routed_weight=False, config=CFG)
    href = gemm1_act_ref(x, w13, ids, "swigluoai", expert_map=emap, bias=b13, limit=0.5)
    ref = gemm2_ref(href, w2, ids, tw, expert_map=emap, bias=b2, mul_routed_weight=False)
    assert torch.isfinite(out).all() and (out[0] == 0).all()
    assert _rel(out, ref) < 1e-5
    full = decode_forward(x, w13, w2, tw, ids, "silu", expert_map=emap, w13_bias=b13, w2_bias=b2)
    grouped = moe_forward_triton(x, w13, w2, tw, ids, "silu", expert_map=emap, w13_bias=b13, w2_bias=b2,
                                 config1=dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=32),
                                 config2=dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=32))
    assert _rel(full, grouped) < 1e-5


@pytest.mark.parametrize("tiles,bn,bk", [(2, 8, 32), (3, 8, 8), (4, 8, 64), (16, 4, 16)])
@pytest.mark.parametrize("case", ["fp32-map-bias", "fp8-block-a16", "int8-channel-a8", "fp8-tensor-a8"])
def test_decode_gemm2_tiles_bitwise(case, tiles, bn, bk):
    # TILES N tiles a program (_gemm2_tiles: one stream of weight loads over the tiles' K
    # steps) does each tile's math in the order of the one-tile kernel: bitwise equal to it,
    # and to the reference. H_ODD = 72: 9 or 18 tiles, so the last program holds fewer than
    # TILES (16 x 4: one program past N); I_ODD = 40: 5 steps of BK 8, a masked K tail with BK 16 / 32, one
    # step with BK 64; T = 1 and 4 tokens, a dropped expert, an empty slot row
    T, k, E_g = 4, 2, 6
    emap = torch.tensor([0, -1, 1, 2, -1, 3], dtype=torch.int32, device=DEV)
    tw, ids = _routing(T, E_g, k, seed=21)
    ids[0] = torch.tensor([1, 4], dtype=torch.int32)          # token 0: both slots dropped
    kw = dict(expert_map=emap)
    if case == "fp32-map-bias":
        _, w2, _, b2 = _weights(4, H_ODD, I_ODD, torch.float32, bias=True)
        h = _x(T * k, I_ODD, torch.float32)
        kw.update(bias=b2, mul_routed_weight=False)
        ref = gemm2_ref(h, w2, ids, tw, expert_map=emap, bias=b2, mul_routed_weight=False)
    else:
        g = torch.Generator().manual_seed(22)
        wdt = torch.int8 if case.startswith("int8") else torch.float8_e4m3fn
        w2 = (torch.randint(-128, 128, (4, H_ODD, I_ODD), generator=g).to(torch.int8) if wdt == torch.int8
              else (torch.randn(4, H_ODD, I_ODD, generator=g) * 0.05).to(wdt)).to(DEV)
        quant = case.split("-")[1]
        block = (8, 16) if quant == "block" else None
        b2 = {"block": _pow2((4, H_ODD // 8, -(-I_ODD // 16)), 23), "channel": _pow2((4, H_ODD), 23),
              "tensor": _pow2((4,), 23)}[quant]
        if case.endswith("a16"):
            h, a2 = _x(T * k, I_ODD, torch.float32), None
        else:
            h = _int_operands((T * k, I_ODD), -4, 5, wdt, 24)
            a2 = _pow2((T * k, 1) if quant == "channel" else (1,), 25)
        kw.update(quant=quant, a_scale=a2, b_scale=b2, block_shape=block)
        ref = gemm2_ref(h.float() if h.dtype != torch.int8 else h, w2, ids, tw, expert_map=emap, quant=quant,
                        a_scale=a2, b_scale=b2, block=block)
        if bk == 64 and block:                                 # BK must divide the group or be a multiple
            bk = 32
    for t in (T, 1):                                           # fp32 out: exact against the reference
        ones = {}
        # TILES (with or without A3: h's rows loaded BN times in the weight tile's layout) is bitwise
        # equal to the one-tile kernel without A3 and to the one of its own layout, except A3 with
        # block-scaled 8-bit weights on a GPU (A3's default is off there: decode.py gemm2_a3), which
        # triton 3.9 sums 1 ulp apart (H100 / H200, TILES 2 and 4). SLOTS_FIRST (the weight tile's
        # layout hinted, kernels/decode.py gemm2_slots_first): on a GPU another layout may sum in
        # another order, so only close across it
        for a3, sf in ((False, False), (True, False), (False, True), (True, True)):
            one, one_a3, many = (torch.full((t, H_ODD), float("nan"), device=DEV) for _ in range(3))
            decode_gemm2(h[:t * k], w2, ids[:t], tw[:t], one, config=dict(BLOCK_N=bn, BLOCK_K=bk, A3=False,
                                                                          SLOTS_FIRST=sf), **kw)
            if a3:
                decode_gemm2(h[:t * k], w2, ids[:t], tw[:t], one_a3,
                             config=dict(BLOCK_N=bn, BLOCK_K=bk, A3=True, SLOTS_FIRST=sf), **kw)
            decode_gemm2(h[:t * k], w2, ids[:t], tw[:t], many,
                         config=dict(BLOCK_N=bn, BLOCK_K=bk, TILES=tiles, A3=a3, SLOTS_FIRST=sf), **kw)
            for base in ((one, one_a3) if a3 else (one,)):
                if a3 and case == "fp8-block-a16" and DEV == "cuda":
                    assert _rel(many, base) < 1e-6, (t, a3, sf)
                else:
                    assert torch.equal(base, many), (t, a3, sf, (base - many).abs().max())
            assert (many[0] == 0).all()
            if t == T:
                assert _rel(many, ref) < 1e-5 and many[1:].abs().amin(dim=1).gt(0).any()
            ones[sf] = one
        assert _rel(ones[False], ones[True]) < 1e-6


def test_decode_no_tokens_and_one_expert_for_all():
    w13, w2, _, _ = _weights(E, H_ODD, I_ODD, torch.float32)
    tw, ids = _routing(0, E, K_TOP)
    out = decode_forward(_x(0, H_ODD, torch.float32), w13, w2, tw, ids)
    assert out.shape == (0, H_ODD)
    x = _x(4, H_ODD, torch.float32)
    tw, ids = _routing(4, E, 1, skew=3)                        # k=1, every token on expert 3
    out = decode_forward(x, w13, w2, tw, ids, "gelu")
    assert _rel(out, moe_ref(x, w13, w2, tw, ids, "gelu")) < 1e-5


def test_decode_deterministic():
    w13, w2, _, _ = _weights(E, H_ODD, I_ODD, torch.float16)
    x = _x(3, H_ODD, torch.float16)
    tw, ids = _routing(3, E, K_TOP)
    a = decode_forward(x, w13, w2, tw, ids)
    b = decode_forward(x, w13, w2, tw, ids)
    assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("bk,prefetch", [(32, True), (16, False), (64, True)])
@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: f"{c[0]}-{str(c[1]).replace('torch.', '')}")
def test_decode_quantized(case, bk, prefetch):
    # small-integer operands and power-of-two scales (see test_kernels_gemm): exact in fp32.
    # Block scales (16, 32): BK 16 = half a group, 32 = one, 64 = two groups per K tile
    # (H = 64: the second tile of GEMM2's K = I = 48 holds a partial group)
    quant, dt, a_shape, b_shape = case
    T, k = 3, K_TOP
    w_dt = torch.int8 if dt == "w8a16" else dt
    x_dt = torch.float16 if dt == "w8a16" else dt
    block = (16, 32) if quant == "block" else None
    x = _int_operands((T, H), -4, 5, x_dt, 7)
    w13 = _int_operands((E, 2 * I, H), -4, 5, w_dt, 8)
    w2 = _int_operands((E, H, I), -4, 5, w_dt, 9)
    a1 = _pow2(a_shape(T, H), 10) if a_shape else None
    b1 = _pow2(b_shape(2 * I, H), 11)
    tw, ids = _routing(T, E, k)
    cfg = dict(BLOCK_N=8, BLOCK_K=bk, PREFETCH=prefetch)
    h = torch.empty(T * k, I, device=DEV)
    decode_gemm1(x, w13, ids, "silu", h, quant=quant, a_scale=a1, b_scale=b1, block_shape=block, config=cfg)
    ref1 = gemm1_act_ref(x, w13, ids, "silu", quant=quant, a_scale=a1, b_scale=b1, block=block)
    assert _rel(h, ref1) < 1e-5
    hq = _int_operands((T * k, I), -4, 5, x_dt, 12)
    a2 = _pow2(a_shape(T * k, I), 13) if a_shape else None
    b2 = _pow2(b_shape(H, I), 14)
    out = torch.empty(T, H, device=DEV)
    decode_gemm2(hq, w2, ids, tw, out, quant=quant, a_scale=a2, b_scale=b2, block_shape=block, config=cfg)
    ref2 = gemm2_ref(hq, w2, ids, tw, quant=quant, a_scale=a2, b_scale=b2, block=block)
    assert _rel(out, ref2) < 1e-5


@pytest.mark.parametrize("case", [c for c in QUANT_CASES if c[1] != "w8a16"],
                         ids=lambda c: f"{c[0]}-{str(c[1]).replace('torch.', '')}")
def test_decode_8bit_weights_16bit_activations(case):
    # W8A8 weights with 16-bit activations (the triton backend's decode default at one token,
    # w8a8_decode 'a16'): random operands, fp8 weights with many subnormals
    # (|w| < 2^-6) and sign bits, fp32 x: exact products in fp32, so the kernels match the
    # reference to rounding
    quant, dt, _, b_shape = case
    T, k = 3, K_TOP
    block = (16, 32) if quant == "block" else None
    g = torch.Generator().manual_seed(31)
    if dt == torch.int8:
        w13 = torch.randint(-128, 128, (E, 2 * I, H), generator=g).to(torch.int8).to(DEV)
        w2 = torch.randint(-128, 128, (E, H, I), generator=g).to(torch.int8).to(DEV)
    else:
        w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).to(dt).to(DEV)     # ~1/3 subnormal
        w2 = (torch.randn(E, H, I, generator=g) * 0.05).to(dt).to(DEV)
        assert (w13.float().abs() < 2 ** -6).float().mean() > 0.1
    x = _randn(T, H, seed=32)
    b1, b2 = _pow2(b_shape(2 * I, H), 11), _pow2(b_shape(H, I), 14)
    tw, ids = _routing(T, E, k)
    cfg = dict(BLOCK_N=8, BLOCK_K=32, PREFETCH=True)
    h = decode_gemm1(x, w13, ids, "silu", quant=quant, b_scale=b1, block_shape=block, config=cfg)
    ref1 = gemm1_act_ref(x, w13, ids, "silu", quant=quant, b_scale=b1, block=block)
    assert _rel(h, ref1) < 1e-5
    out = decode_gemm2(ref1.float(), w2, ids, tw, quant=quant, b_scale=b2, block_shape=block, config=cfg)
    assert _rel(out, gemm2_ref(ref1.float(), w2, ids, tw, quant=quant, b_scale=b2, block=block)) < 1e-5


def _decode_plan(monkeypatch, forced: dict, T=1, E_=8, k=2, scheme="none", gpu="h100"):
    """The plan of T tokens (a decode one) on a GPU preset with FUSEDMOE_PLAN = ``forced``."""
    import json

    from fusedmoe.config import MoEConfig, QuantScheme
    from fusedmoe.plan import Planner
    from fusedmoe.platform import Platform
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps(forced))
    p = Planner(MoEConfig(E_, k, 256, 128, dtype="bfloat16"), QuantScheme.parse(scheme), Platform.preset(gpu)).plan(T)
    assert p.path == "decode"
    return p


def test_gemm2_tiles_rule(monkeypatch):
    from fusedmoe.errors import ConfigError
    from fusedmoe.kernels.decode import gemm2_tiles
    assert gemm2_tiles(7168 // 4, 132, 1) == 4           # deepseek-v3 tp8 fp8, T=1: 1792 one-step tiles
    assert gemm2_tiles(7168 // 4 // 2, 132, 1) == 2
    assert gemm2_tiles(2048 // 4, 132, 1) == 1           # qwen3 fp8: 512 tiles, too few to group
    assert gemm2_tiles(7168 // 4, 132, 2) == 1           # 16-bit weights: never (measured slower)
    assert gemm2_tiles(10 ** 6, 132, 1) == 4             # at most 4
    assert gemm2_tiles(7168 // 8, 132, 1, 2) == 1        # tiles of two K steps overlap their own loads
    assert gemm2_tiles(10 ** 6, 132, 1, 2) == 1
    # FUSEDMOE_PLAN decode_tiles overrides the rule in the plan's GEMM2 config (16-bit weights: the rule's 1)
    assert _decode_plan(monkeypatch, {}).gemm2["TILES"] == 1
    assert _decode_plan(monkeypatch, {"decode_tiles": 3}).gemm2["TILES"] == 3
    with pytest.raises(ConfigError, match=r"FUSEDMOE_PLAN\['decode_tiles'\]"):
        _decode_plan(monkeypatch, {"decode_tiles": 0})


def test_gemm2_a3_rule(monkeypatch, request):
    from fusedmoe.kernels import decode as dk
    from fusedmoe.errors import ConfigError
    request.addfinalizer(dk._cached_config.cache_clear)       # (configs made under a patched version)
    assert not dk.gemm2_a3(1, 2)                               # 8-bit weights: never (measured even or slower)
    monkeypatch.setattr(dk.triton, "__version__", "3.6.0")
    assert not dk.gemm2_a3(2, 2)                               # 3.6 lays the tile out with warps over the slots
    for v in ("3.9.0", "3.10.0+git1234"):
        monkeypatch.setattr(dk.triton, "__version__", v)
        assert dk.gemm2_a3(2, 2) and dk.gemm2_a3(4, 1) and not dk.gemm2_a3(2, 4) and not dk.gemm2_a3(2, 8)
    # FUSEDMOE_PLAN decode_a3 overrides the rule in the plan's GEMM2 config: bf16 k = 2 (the rule's
    # A3) and fp8 weights k = 8 (never by the rule)
    assert _decode_plan(monkeypatch, {}).gemm2["A3"]
    assert not _decode_plan(monkeypatch, {"decode_a3": False}).gemm2["A3"]
    fp8_k8 = dict(E_=64, k=8, scheme="fp8_channel")
    assert _decode_plan(monkeypatch, {}, **fp8_k8).math == "a16"
    assert not _decode_plan(monkeypatch, {}, **fp8_k8).gemm2["A3"]
    assert _decode_plan(monkeypatch, {"decode_a3": True}, **fp8_k8).gemm2["A3"]
    with pytest.raises(ConfigError, match=r"FUSEDMOE_PLAN\['decode_a3'\]"):
        _decode_plan(monkeypatch, {"decode_a3": "yes"})
    # SLOTS_FIRST: on under triton >= 3.7 (every weight width), off under 3.6; FUSEDMOE_PLAN
    # decode_slots_first overrides
    assert dk.gemm2_slots_first()                              # (3.10 patched above)
    assert _decode_plan(monkeypatch, {}).gemm2["SLOTS_FIRST"]
    monkeypatch.setattr(dk.triton, "__version__", "3.6.0")
    assert not dk.gemm2_slots_first()
    assert not _decode_plan(monkeypatch, {}).gemm2["SLOTS_FIRST"]
    assert _decode_plan(monkeypatch, {"decode_slots_first": True}).gemm2["SLOTS_FIRST"]
    with pytest.raises(ConfigError, match=r"FUSEDMOE_PLAN\['decode_slots_first'\]"):
        _decode_plan(monkeypatch, {"decode_slots_first": 2})
    monkeypatch.setattr(dk.triton, "__version__", "3.10.0")
    # the launch: an explicit config's key, else the rule (decode_config's tile or not); never with
    # the in-kernel quantization of h (QA)
    h, w2 = torch.empty(4, 32, dtype=torch.bfloat16), torch.empty(E, 24, 32, dtype=torch.bfloat16)
    ids, tw, out = torch.zeros(2, 2, dtype=torch.int32), torch.empty(2, 2), torch.empty(2, 24, dtype=torch.bfloat16)
    spec = dk.gemm2_launch(h, w2, ids, tw, out)
    assert spec[3]["A3"] == spec[3]["BLOCK_N"] and spec[3]["SLOTS_FIRST"]   # 3.10 (patched above), 16-bit
    assert not dk.gemm2_launch(h, w2, ids, tw, out, config=dict(BLOCK_N=8, BLOCK_K=16, SLOTS_FIRST=False))[3][
        "SLOTS_FIRST"]
    assert dk.gemm2_launch(h, w2, ids, tw, out, config=dict(BLOCK_N=8, BLOCK_K=16))[3]["A3"] == 8
    assert dk.gemm2_launch(h, w2, ids, tw, out, config=dict(BLOCK_N=8, BLOCK_K=16, A3=False))[3]["A3"] == 0
    assert dk.gemm2_launch(h, w2, ids, tw, out, config=dict(BLOCK_N=8, BLOCK_K=16, A3=True))[3]["A3"] == 8
    w8 = torch.empty(E, 24, 32, dtype=torch.float8_e4m3fn)
    assert dk.gemm2_launch(h, w8, ids, tw, out, config=dict(BLOCK_N=8, BLOCK_K=16, A3=True), quant="channel",
                           b_scale=torch.ones(E, 24), quantize_a="fp8")[3]["A3"] == 0


def test_decode_config_rules(monkeypatch):
    from fusedmoe.kernels import decode as dk
    monkeypatch.setattr(dk.triton, "__version__", "3.6.0")
    # qwen3 T=1 GEMM1 (gate + up rows): 16 KB steps of 2 KB row segments -> BN 4 x BK 1024
    assert decode_config(2, 8, 768, 2048, 2, 132) == dict(BLOCK_N=4, BLOCK_K=1024, num_warps=4, PREFETCH=True)
    # GEMM2 holds 8 slots; K = 768: BK 512 would leave a third of K masked -> BK 256, BN 4
    assert decode_config(8, 1, 2048, 768, 2, 132, gemm2=True) == dict(BLOCK_N=4, BLOCK_K=256, num_warps=8, PREFETCH=True)
    # a grid under 3 programs per SM narrows BN (deepseek H = 7168 would allow 4; 1 SM-ful)
    assert decode_config(8, 1, 1024, 256, 2, 132, gemm2=True)["BLOCK_N"] == 2
    # 128-wide scale groups allow multiples of 128; a group of 48 needs a divisor
    # 8-bit rows: BK <= K / 8 (>= 128) so the prefetch has steps to overlap; GEMM2 4 warps
    assert decode_config(2, 8, 768, 2048, 1, 132) == dict(BLOCK_N=8, BLOCK_K=256, num_warps=4, PREFETCH=True)
    assert decode_config(2, 8, 256, 7168, 1, 132, group_k=128)["BLOCK_K"] == 1024
    assert decode_config(8, 1, 2048, 768, 1, 132, gemm2=True) == dict(BLOCK_N=4, BLOCK_K=256, num_warps=4, PREFETCH=True)
    # ... >= 128 from two tokens on (at T=1 the PDL prologue's 256-wide first step measured faster)
    assert decode_config(8, 2, 2048, 768, 1, 132, gemm2=True) == dict(BLOCK_N=8, BLOCK_K=128, num_warps=4, PREFETCH=True)
    # 8-bit GEMM1 steps of 256-wide segments hold at most 4K elements: qwen3 T=2 keeps BN 8
    # (8K elements, BN 16, measured slower); deepseek's 1024-wide steps keep 8K (BN 4)
    assert decode_config(2, 16, 768, 2048, 1, 132) == dict(BLOCK_N=8, BLOCK_K=256, num_warps=4, PREFETCH=True)
    assert decode_config(2, 16, 256, 7168, 1, 132, group_k=128) == dict(BLOCK_N=4, BLOCK_K=1024, num_warps=4,
                                                                        PREFETCH=True)
    # deepseek-v3 tp8 GEMM2 (K = 256): two 128-wide steps, BN 8 (8 slots x 8 x 128 = 8K elements)
    assert decode_config(8, 1, 7168, 256, 1, 132, group_k=128, gemm2=True) == dict(BLOCK_N=8, BLOCK_K=128, num_warps=4,
                                                                       PREFETCH=True)
    # a GEMM1 keeps the 256 floor; a GEMM2 of k = 2 (2 slot rows, as a gated GEMM1's 2) is told
    # apart by gemm2=, not by its rows
    assert decode_config(2, 4, 4096, 1024, 1, 132)["BLOCK_K"] == 256
    assert decode_config(2, 2, 4096, 1024, 1, 132, gemm2=True)["BLOCK_K"] == 128
    # 16-bit rows are untouched by the 8-bit rules
    assert decode_config(8, 2, 2048, 768, 2, 132, gemm2=True)["BLOCK_K"] == 256
    assert decode_config(2, 8, 768, 2048, 1, 132, group_k=48)["BLOCK_K"] == 16
    # short or odd K: the masked tail stays under 1/8 of K
    assert decode_config(2, 1, 64, 40, 2, 4)["BLOCK_K"] == 16
    assert decode_config(2, 1, 64, 2880, 2, 4)["BLOCK_K"] == 1024        # 3072: 6.7% masked
    # the same tiles under triton 3.9 (its GEMM2 tile hinted into 3.6's layout: gemm2_slots_first)
    same = [decode_config(8, 1, 2048, 768, e, 132, gemm2=True) for e in (1, 2, 4)] + [decode_config(2, 8, 768, 2048, 2, 132)]
    monkeypatch.setattr(dk.triton, "__version__", "3.9.0")
    assert [decode_config(8, 1, 2048, 768, e, 132, gemm2=True) for e in (1, 2, 4)] + [decode_config(2, 8, 768, 2048, 2, 132)] == same


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(128, 2048, 768, 8), (256, 7168, 256, 8), (8, 4096, 14336, 2)],
                         ids=["qwen3", "deepseek-tp8", "mixtral"])
@pytest.mark.parametrize("T", [1, 3, 16])
def test_gpu_decode_real_sizes(shape, T):
    E_, H_, I_, k = shape
    w13, w2, _, _ = _weights(E_, H_, I_, torch.bfloat16)
    x = _x(T, H_, torch.bfloat16)
    tw, ids = _routing(T, E_, k, seed=T)
    out = decode_forward(x, w13, w2, tw, ids)
    ref = moe_ref(x, w13, w2, tw, ids, round_h_to=torch.bfloat16)
    assert _rel(out, ref) < TOL_BF16
    grouped = moe_forward_triton(x, w13, w2, tw, ids)
    assert _rel(out, grouped) < TOL_BF16
    if torch.cuda.get_device_capability()[0] >= 9:       # GEMM2 a programmatic dependent launch
        for _ in range(3):                               # (it reads h after griddepcontrol.wait)
            assert torch.equal(decode_forward(x, w13, w2, tw, ids, pdl=True), out)
    # GEMM2 with h's rows in the weight tile's layout (A3) and without: bitwise the same
    from fusedmoe.kernels.decode import _cached_config
    from fusedmoe.kernels.launcher import next_power_of_2
    h = decode_gemm1(x, w13, ids, "silu")
    c2 = dict(_cached_config(next_power_of_2(k), T, H_, I_, 2, torch.cuda.get_device_properties(0).multi_processor_count,
                             None, True))
    for sf in (False, True):      # (bitwise across A3; across the layouts of SLOTS_FIRST, close)
        plain = decode_gemm2(h, w2, ids, tw, config=dict(c2, A3=False, SLOTS_FIRST=sf))
        assert torch.equal(decode_gemm2(h, w2, ids, tw, config=dict(c2, A3=True, SLOTS_FIRST=sf)), plain), sf
        assert _rel(plain, out) < 1e-2, sf


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 2, 5])
def test_gpu_gemm2_tiles_real_size(T, monkeypatch):
    # deepseek-v3 tp8 fp8 128x128 blocks with 16-bit h (the a16 decode). decode_config's own
    # tile has two 128-wide K steps, so one N tile a program (gemm2_tiles); the one-step tile
    # TILES was built for (BK = I = 256) with 4 N tiles a program, a PDL launch among them, is
    # bitwise equal to one tile a program; both against the reference
    from fusedmoe.kernels.decode import gemm2_launch
    E_, H_, I_, k = 256, 7168, 256, 8
    w2 = (_randn(E_, H_, I_, seed=41) * 0.05).to(torch.float8_e4m3fn)
    b2 = (torch.rand(E_, H_ // 128, I_ // 128, generator=torch.Generator().manual_seed(42)) + 0.5).to(DEV)
    h = _x(T * k, I_, torch.bfloat16)
    tw, ids = _routing(T, E_, k, seed=T + 40)
    q = dict(quant="block", b_scale=b2, block_shape=(128, 128))
    out = torch.empty(T, H_, dtype=torch.bfloat16, device=DEV)
    spec = gemm2_launch(h, w2, ids, tw, out, **q)
    assert spec[3]["NT"] == 1 and spec[3]["BLOCK_K"] == 128
    got = decode_gemm2(h, w2, ids, tw, **q)
    ref = gemm2_ref(h.float(), w2, ids, tw, quant="block", b_scale=b2, block=(128, 128))
    assert _rel(got, ref) < TOL_BF16
    cfg = dict(_cached_config_of(spec), BLOCK_N=4, BLOCK_K=256, TILES=1)
    one = decode_gemm2(h, w2, ids, tw, config=cfg, **q)
    tiles = decode_gemm2(h, w2, ids, tw, config=dict(cfg, TILES=4), **q)
    assert torch.equal(tiles, one)
    assert _rel(tiles, ref) < TOL_BF16
    for sf in (False, True):      # the weight tile's layout hinted or not (gemm2_slots_first): TILES
        # bitwise as one tile a program within a layout, close across them
        one_sf = decode_gemm2(h, w2, ids, tw, config=dict(cfg, SLOTS_FIRST=sf), **q)
        assert torch.equal(decode_gemm2(h, w2, ids, tw, config=dict(cfg, SLOTS_FIRST=sf, TILES=4), **q),
                           one_sf), sf
        assert _rel(one_sf, one) < 1e-2, sf
    if torch.cuda.get_device_capability()[0] >= 9:
        assert torch.equal(decode_gemm2(h, w2, ids, tw, pdl=True, config=dict(cfg, TILES=4), **q), one)
        assert torch.equal(decode_gemm2(h, w2, ids, tw, pdl=True, **q), got)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["qwen3-int8", "qwen3-fp8", "deepseek-tp8-fp8-block", "odd-int8"])
@pytest.mark.parametrize("T", [1, 3])
def test_gpu_decode_w4_words(case, T, monkeypatch):
    # 8-bit weights read as int32 words of four and converted by PTX (kernels/decode.py W4: the
    # launch config's key, set by the plan where plan.w4_wanted says so; where w4_mode allows)
    # against element loads and Triton's casts (W4 off):
    # both match the reference; they differ only in the fp32 order of each word's four
    # products. Random int8 over the whole range, fp8 with subnormals and both signs
    from fusedmoe.kernels.decode import gemm1_launch, gemm2_launch
    E_, H_, I_, k, wd, quant = {"qwen3-int8": (128, 2048, 768, 8, torch.int8, "channel"),
                                "qwen3-fp8": (128, 2048, 768, 8, torch.float8_e4m3fn, "channel"),
                                "deepseek-tp8-fp8-block": (256, 7168, 256, 8, torch.float8_e4m3fn, "block"),
                                "odd-int8": (6, 272, 48, 3, torch.int8, "channel")}[case]
    g = torch.Generator().manual_seed(61)
    if wd == torch.int8:
        w13 = torch.randint(-128, 128, (E_, 2 * I_, H_), generator=g).to(torch.int8).to(DEV)
        w2 = torch.randint(-128, 128, (E_, H_, I_), generator=g).to(torch.int8).to(DEV)
    else:
        w13 = (torch.randn(E_, 2 * I_, H_, generator=g) * 0.05).to(wd).to(DEV)
        w2 = (torch.randn(E_, H_, I_, generator=g) * 0.05).to(wd).to(DEV)
    if quant == "block":
        block = (128, 128)
        b1 = (torch.rand(E_, 2 * I_ // 128, H_ // 128, generator=g) + 0.5).to(DEV) / 64
        b2 = (torch.rand(E_, H_ // 128, I_ // 128, generator=g) + 0.5).to(DEV) / 64
    else:
        block = None
        b1 = (torch.rand(E_, 2 * I_, generator=g) + 0.5).to(DEV) / 64
        b2 = (torch.rand(E_, H_, generator=g) + 0.5).to(DEV) / 64
    q1 = dict(quant=quant, b_scale=b1, block_shape=block)
    q2 = dict(quant=quant, b_scale=b2, block_shape=block)
    x = _x(T, H_, torch.bfloat16)
    tw, ids = _routing(T, E_, k, seed=T + 60)
    h0 = torch.empty(T * k, I_, dtype=torch.bfloat16, device=DEV)
    o0 = torch.empty(T, H_, dtype=torch.bfloat16, device=DEV)
    # the default: words for one token with per-channel scales (where they were measured faster),
    # except fp8 on an H200 (measured slower there); block scales on an H200 only (plan.w4_wanted
    # with this GPU's plan.DeviceFacts); a launch without a config reads elements
    from fusedmoe.plan import device_facts, w4_wanted
    from fusedmoe.platform import Platform
    facts = device_facts(Platform.current())
    h200 = facts.family == "H200"
    wanted = w4_wanted(T, quant == "block", wd != torch.int8, facts)
    assert wanted == (T == 1 and (h200 if quant == "block" else not (wd != torch.int8 and h200)))
    default = (1 if wd == torch.int8 else 2) if wanted else 0
    c1 = _cached_config_of(gemm1_launch(x, w13, ids, "silu", h0, **q1))
    c2 = _cached_config_of(gemm2_launch(h0, w2, ids, tw, o0, **q2))
    assert gemm1_launch(x, w13, ids, "silu", h0, **q1)[3]["W4"] == 0
    assert gemm1_launch(x, w13, ids, "silu", h0, config=dict(c1, W4=wanted), **q1)[3]["W4"] == default
    assert gemm2_launch(h0, w2, ids, tw, o0, config=dict(c2, W4=wanted), **q2)[3]["W4"] == default
    # forced wherever it can run
    words = 1 if wd == torch.int8 else 2
    assert gemm1_launch(x, w13, ids, "silu", h0, config=dict(c1, W4=True), **q1)[3]["W4"] == words
    assert gemm2_launch(h0, w2, ids, tw, o0, config=dict(c2, W4=True), **q2)[3]["W4"] > 0
    outs = {}
    for on in ("1", "0"):
        h = decode_gemm1(x, w13, ids, "silu", config=dict(c1, W4=on == "1"), **q1)
        out = decode_gemm2(h, w2, ids, tw, config=dict(c2, W4=on == "1"), **q2)
        outs[on] = (h, out)
    ref1 = gemm1_act_ref(x, w13, ids, "silu", quant=quant, b_scale=b1, block=block)
    for on, (h, out) in outs.items():
        assert _rel(h, ref1) < TOL_BF16, on
        ref2 = gemm2_ref(h.float(), w2, ids, tw, quant=quant, b_scale=b2, block=block)
        assert _rel(out, ref2) < TOL_BF16, on
    assert _rel(outs["1"][0], outs["0"][0]) < 1e-2
    assert gemm1_launch(x, w13, ids, "silu", h0, config=dict(c1, W4=False), **q1)[3]["W4"] == 0


def test_w4_mode_rule(monkeypatch):
    # the word path never runs on CPU tensors (the interpreter: Triton's casts) nor with
    # in-kernel quantization, int8 x int8 sums, or rows that are not 16-byte aligned; it runs
    # where the caller wants it (the plan's config key W4: plan.w4_wanted, per GPU, and only with
    # 16-bit activations)
    from fusedmoe.kernels.decode import w4_mode
    from fusedmoe.plan import DEFAULT_DEVICE, DEVICES, w4_wanted
    h100, h200 = DEVICES["H100"], DEVICES["H200"]
    flags = dict(INT_ACC=False, QA=0, A_SCALE=0, B_SCALE=1, GROUP_K=1)
    w = torch.zeros(2, 8, 32, dtype=torch.int8)
    assert w4_mode(w, flags, 32) == 0 and w4_mode(w, flags, 32, want=True) == 0       # CPU
    for facts in (h100, h200, DEFAULT_DEVICE):
        assert w4_wanted(1, False, False, facts) and not w4_wanted(2, False, False, facts)   # one token
        assert not w4_wanted(2, True, False, facts)
    assert not w4_wanted(1, True, False, h100) and w4_wanted(1, True, False, h200)      # block scales: H200
    assert w4_wanted(1, False, True, h100) and not w4_wanted(1, False, True, h200)      # fp8: not on an H200
    # the plans ask as the facts say, and only with 16-bit activations (a8 / tc configs never ask)
    fp8 = dict(E_=64, k=8, scheme="fp8_channel")
    assert _decode_plan(monkeypatch, {}, **fp8).gemm1["W4"] and _decode_plan(monkeypatch, {}, **fp8).gemm2["W4"]
    assert not _decode_plan(monkeypatch, {}, gpu="h200", **fp8).gemm1["W4"]
    assert _decode_plan(monkeypatch, {"decode_w4": True}, gpu="h200", **fp8).gemm1["W4"]
    assert not _decode_plan(monkeypatch, {}, T=2, **fp8).gemm1["W4"]
    assert all(not _decode_plan(monkeypatch, {"w8a8_decode": m, "decode_w4": True}, **fp8).gemm1.get("W4")
               for m in ("a8", "tc"))
    if _CUDA:
        wc = w.cuda()
        assert w4_mode(wc, flags, 32, want=True) == 1
        assert w4_mode(wc, flags, 32) == 0                                       # not wanted
        assert w4_mode(wc, dict(flags, B_SCALE=3, GROUP_K=16), 32, want=True) == 1
        assert w4_mode(wc, dict(flags, INT_ACC=True), 32, want=True) == 0
        assert w4_mode(wc, dict(flags, QA=1), 32, want=True) == 0
        assert w4_mode(wc, flags, 32, want=False) == 0
        assert w4_mode(torch.zeros(2, 8, 36, dtype=torch.int8, device="cuda"), flags, 32, want=True) == 0  # K % 16
        assert w4_mode(wc[:, :, 4:20], flags, 16, want=True) == 0                                       # offset rows
        assert w4_mode(wc.to(torch.bfloat16), flags, 32, want=True) == 0
        if torch.cuda.get_device_capability() >= (8, 9):
            wf = torch.zeros(2, 8, 32, device="cuda").to(torch.float8_e4m3fn)
            assert w4_mode(wf, flags, 32, want=True) == 2


def _cached_config_of(spec) -> dict:
    c = spec[3]
    return dict(BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], num_warps=spec[4], PREFETCH=c["PREFETCH"])


# ---------------------------------------------------------------------------------- in-kernel A quantization
def _fp8_weights(E_, N, K, seed):
    return (_randn(E_, N, K, seed=seed) * 0.5).to(torch.float8_e4m3fn)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("mode", ["fp8_token", "int8_token", "fp8_group", "fp8_group_pow2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_in_kernel_quant_equals_separate_quant(mode, dtype):
    # quantizing x (GEMM1) and h (GEMM2) inside the decode kernels must give exactly what the
    # quantization kernels + the kernels on quantized operands give: same grid, same rounding,
    # same sums. A NaN in token 1 poisons its rows in both (the scale of its row / group is NaN).
    from fusedmoe.config import QuantMethod, QuantScheme
    from fusedmoe.quantize import quantize_activation
    qt, gran = mode.split("_")[:2]
    pow2 = mode.endswith("pow2")
    H_, I_, E_, k, T = 256, 128, 5, 2, 3
    if qt == "int8":
        scheme = QuantScheme(QuantMethod.INT8_CHANNEL)
        w13 = _int_operands((E_, 2 * I_, H_), -100, 101, torch.int8, 30)
        w2 = _int_operands((E_, H_, I_), -100, 101, torch.int8, 31)
    else:
        scheme = (QuantScheme(QuantMethod.FP8_CHANNEL) if gran == "token"
                  else QuantScheme(QuantMethod.FP8_BLOCK, block_shape=(64, 64), scale_pow2=pow2))
        w13, w2 = _fp8_weights(E_, 2 * I_, H_, 30), _fp8_weights(E_, H_, I_, 31)
    quant = "channel" if gran == "token" else "block"
    block = scheme.block_shape if quant == "block" else None
    if quant == "channel":
        b1, b2 = _pow2((E_, 2 * I_), 32), _pow2((E_, H_), 33)
    else:
        b1, b2 = _pow2((E_, 2 * I_ // 64, H_ // 64), 32), _pow2((E_, H_ // 64, I_ // 64), 33)
    x = (_x(T, H_, torch.float32) * 3).to(dtype)
    x[1, 7] = float("nan")
    tw, ids = _routing(T, E_, k)
    cfg = dict(BLOCK_N=32, BLOCK_K=128, PREFETCH=True)         # 2 groups of 64 per K tile
    xq, xs = quantize_activation(x, scheme)
    h_sep = decode_gemm1(xq, w13, ids, "silu", quant=quant, a_scale=xs, b_scale=b1, block_shape=block,
                         config=cfg, out=torch.empty(T * k, I_, dtype=dtype, device=DEV))
    h_fused = decode_gemm1(x, w13, ids, "silu", quant=quant, b_scale=b1, block_shape=block, config=cfg,
                           quantize_a=qt, scale_pow2=pow2)
    assert h_fused.dtype == dtype
    assert torch.equal(h_sep, h_fused) or torch.allclose(h_sep, h_fused, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(h_fused[2:4]).all() and torch.isfinite(h_fused[[0, 1, 4, 5]]).all()
    hq, hs = quantize_activation(h_fused, scheme)
    o_sep = decode_gemm2(hq, w2, ids, tw, quant=quant, a_scale=hs, b_scale=b2, block_shape=block, config=cfg,
                         out=torch.empty(T, H_, dtype=dtype, device=DEV))
    o_fused = decode_gemm2(h_fused, w2, ids, tw, quant=quant, b_scale=b2, block_shape=block, config=cfg,
                           quantize_a=qt, scale_pow2=pow2)
    assert torch.allclose(o_sep, o_fused, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(o_fused[1]).all() and torch.isfinite(o_fused[[0, 2]]).all()
    # and both agree with the dequantizing reference on the finite tokens
    ref = gemm2_ref(hq, w2, ids, tw, quant=quant, a_scale=hs, b_scale=b2, block=block)
    assert _rel(o_fused[[0, 2]], ref[[0, 2]]) < TOL.get(dtype, TOL_BF16)
