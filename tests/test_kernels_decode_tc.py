"""Tensor-core decode GEMMs (fusedmoe/kernels/decode_tc.py) against the plain-torch references.

8-bit operands holding small integers and power-of-two scales (as test_kernels_gemm's
quantized tests): every product and partial sum is exact in fp32, so the kernels must
match the dequantizing references to fp32 rounding, whatever the split / group order.
The interpreter runs fp8 and int8 tl.dot correctly (unlike bf16). Odd sizes (I = 40, H =
72: no tile divides them), splits that leave a K slice empty, expert_map drops, a token
with no kept slot, biases, every gated activation and the no_mul ones.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fusedmoe.kernels.decode_tc import scratch, tc_config, tc_decode, tc_gemm1_launch  # noqa: E402
from fusedmoe.kernels.launcher import launch  # noqa: E402
from fusedmoe.reference.kernels import gemm1_act_ref, gemm2_ref  # noqa: E402
from test_kernels_gemm import DEV, E, _int_operands, _pow2, _rel, _routing  # noqa: E402

H_ODD, I_ODD = 72, 40
SCHEMES = [
    # (quant, dtype, a_scale shape fn (rows, K), b_scale shape fn (N, K), block)
    ("channel", torch.float8_e4m3fn, lambda M, K: (M, 1), lambda N, K: (E, N), None),
    ("channel", torch.int8, lambda M, K: (M, 1), lambda N, K: (E, N), None),
    ("tensor", torch.float8_e4m3fn, lambda M, K: (1,), lambda N, K: (E,), None),
    ("block", torch.float8_e4m3fn, lambda M, K: (M, -(-K // 32)), lambda N, K: (E, -(-N // 16), -(-K // 32)),
     (16, 32)),
]
H_BLK, I_BLK = 64, 48          # block scales: H and I multiples of the (16, 32) block's K side where needed


def _case(scheme, T, k, H, I, seed=0, gated=True):
    quant, dt, a_shape, b_shape, block = scheme
    n1 = 2 * I if gated else I
    x = _int_operands((T, H), -4, 5, dt, 7 + seed)
    w13 = _int_operands((E, n1, H), -4, 5, dt, 8 + seed)
    w2 = _int_operands((E, H, I), -4, 5, dt, 9 + seed)
    a1 = _pow2(a_shape(T, H), 10 + seed)
    b1 = _pow2(b_shape(n1, H), 11 + seed)
    b2 = _pow2(b_shape(H, I), 14 + seed)
    return x, w13, w2, a1, b1, b2


def _quant_h(scheme, seed):
    """The 'quantizer' between the GEMMs for exact tests: h replaced by fixed small integers
    and power-of-two scales (the GEMM1 output itself is checked separately)."""
    quant, dt, a_shape, _, _ = scheme

    def q(h):
        n, I = h.shape
        return _int_operands((n, I), -4, 5, dt, 40 + seed), _pow2(a_shape(n, I), 41 + seed)
    return q


CFGS = [  # (gemm1, gemm2): tiles smaller than the shapes, K slices / slot groups of every kind.
    # BLOCK_K >= 32 and GEMM2 BLOCK_N >= 32: an 8-bit tl.dot needs K >= 32 on the GPU, where
    # these tests run too (GEMM1 rows = 2 BN)
    (dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=1), dict(BLOCK_N=32, BLOCK_K=32, GROUPS=1)),
    (dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=2), dict(BLOCK_N=32, BLOCK_K=32, GROUPS=2)),
    (dict(BLOCK_N=32, BLOCK_K=32, SPLIT_K=4), dict(BLOCK_N=32, BLOCK_K=32, GROUPS=4)),   # K=72: 3 tiles, a
    # expert-shared (SHARE): T=3 x k=4 pairs on E=5 experts, so most programs lead several  # split empty;
    (dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=1, SHARE=True), dict(BLOCK_N=32, BLOCK_K=32, GROUPS=1, SHARE=True)),
]                                                                                        # k=4: 1 slot a group
NO_SHARE = [dict(c, SHARE=False) for c in CFGS[0]]


@pytest.mark.parametrize("cfgs", CFGS, ids=["plain", "split2-groups2", "split4-groups4", "share"])
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"{s[0]}-{str(s[1]).replace('torch.', '')}")
def test_tc_decode_exact(scheme, cfgs):
    quant, dt, a_shape, _, block = scheme
    H, I = (H_BLK, I_BLK) if block else (H_ODD, I_ODD)
    T, k = 3, 4
    x, w13, w2, a1, b1, b2 = _case(scheme, T, k, H, I)
    tw, ids = _routing(T, E, k, seed=1)
    qh = _quant_h(scheme, 0)
    h, out = tc_decode(x, w13, w2, tw, ids, "silu", x_scale=a1, w13_scale=b1, w2_scale=b2, quant=quant,
                       block_shape=block, quantize_h=qh, config1=dict(cfgs[0]), config2=dict(cfgs[1]))
    ref1 = gemm1_act_ref(x, w13, ids, "silu", quant=quant, a_scale=a1, b_scale=b1, block=block)
    assert _rel(h, ref1) < 1e-2          # h is stored in bf16
    hq, hs = qh(h)
    ref2 = gemm2_ref(hq, w2, ids, tw, quant=quant, a_scale=hs, b_scale=b2, block=block)
    assert _rel(out, ref2) < 1e-2        # out in bf16
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("act,kw", [("silu", {}), ("silu", {"swiglu_limit": 0.3}), ("gelu", {}),
                                    ("swigluoai", {"alpha": 1.702, "limit": 0.4}), ("gelu_no_mul", {}),
                                    ("relu2_no_mul", {})])
def test_tc_decode_activations_bias_map(act, kw):
    # expert_map drops experts 1 and 3 (token 0 keeps no slot: zeros), biases on both GEMMs,
    # routing weights applied in GEMM2 and not
    scheme = SCHEMES[0]
    quant = scheme[0]
    gated = not act.endswith("_no_mul")
    E_g, k, T = 5, 2, 4
    emap = torch.tensor([0, -1, 1, -1, 2], dtype=torch.int32, device=DEV)
    x, w13, w2, a1, b1, b2 = _case(scheme, T, k, H_ODD, I_ODD, seed=3, gated=gated)
    w13, w2, b1, b2 = w13[:3], w2[:3], b1[:3], b2[:3]
    g = torch.Generator().manual_seed(5)
    bias13 = torch.randn(3, w13.shape[1], generator=g).to(DEV)
    bias2 = torch.randn(3, H_ODD, generator=g).to(DEV)
    tw, ids = _routing(T, E_g, k, seed=6)
    ids[0] = torch.tensor([1, 3], dtype=torch.int32)
    qh = _quant_h(scheme, 1)
    for mul_w, cfgs in ((True, CFGS[1]), (False, CFGS[0]), (True, CFGS[3]), (False, CFGS[3])):
        h, out = tc_decode(x, w13, w2, tw, ids, act, x_scale=a1, w13_scale=b1, w2_scale=b2, quant=quant,
                           expert_map=emap, w13_bias=bias13, w2_bias=bias2, mul_routed_weight=mul_w,
                           quantize_h=qh, config1=dict(cfgs[0]), config2=dict(cfgs[1]), **kw)
        ref1 = gemm1_act_ref(x, w13, ids, act, expert_map=emap, bias=bias13, quant=quant, a_scale=a1,
                             b_scale=b1, **kw)
        kept = ref1.abs().sum(1) > 0
        assert _rel(h[kept], ref1[kept]) < 1e-2
        hq, hs = qh(h)
        ref2 = gemm2_ref(hq, w2, ids, tw, expert_map=emap, bias=bias2, mul_routed_weight=mul_w, quant=quant,
                         a_scale=hs, b_scale=b2)
        assert (out[0] == 0).all()
        assert _rel(out, ref2) < 1e-2


def test_tc_decode_deterministic_and_scratch_left_zero():
    scheme = SCHEMES[0]
    T, k = 2, 4
    x, w13, w2, a1, b1, b2 = _case(scheme, T, k, H_ODD, I_ODD)
    tw, ids = _routing(T, E, k, seed=2)
    c1, c2 = CFGS[2]
    qh = _quant_h(scheme, 2)
    runs = [tc_decode(x, w13, w2, tw, ids, x_scale=a1, w13_scale=b1, w2_scale=b2, quantize_h=qh,
                      config1=dict(c1), config2=dict(c2))[1] for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    # one bound scratch reused: every launch leaves the tickets at zero
    (part, sync), _ = scratch(T, k, I_ODD, H_ODD, c1, c2, True, DEV)
    h = torch.empty(T * k, I_ODD, dtype=torch.bfloat16, device=DEV)
    for _ in range(2):
        launch(*tc_gemm1_launch(x, w13, ids, "silu", h, part, sync, a_scale=a1, b_scale=b1, config=dict(c1)))
        assert not sync.any()
    assert _rel(h, gemm1_act_ref(x, w13, ids, "silu", quant="channel", a_scale=a1, b_scale=b1)) < 1e-2


def _launch_both(x, w13, w2, tw, ids, a1, b1, b2, qh, c1, c2, out_fill=float("nan"), **kw):
    """(h, out) of the launches with ``out`` prefilled (NaN: every row must be written) and the
    scratch checked left zero; SHARE configs get their table (prefilled with junk) first."""
    from fusedmoe.kernels.decode_tc import share_table_launch, tc_gemm2_launch
    T, k = ids.shape
    if c1.get("SHARE") or c2.get("SHARE"):
        table = torch.full((T * k, 16), 7, dtype=torch.int32, device=DEV)
        launch(*share_table_launch(ids, table, w13.shape[0], expert_map=kw.get("expert_map")))
        kw["table"] = table
    I_ = w2.shape[2]
    (p1, s1), (p2, s2) = scratch(T, k, I_, w2.shape[1], c1, c2, True, DEV)
    h = torch.empty(T * k, I_, dtype=torch.bfloat16, device=DEV)
    out = torch.full((T, w2.shape[1]), out_fill, dtype=torch.bfloat16, device=DEV)
    emap = kw.pop("expert_map", None)
    launch(*tc_gemm1_launch(x, w13, ids, "silu", h, p1, s1, a_scale=a1, b_scale=b1, config=dict(c1),
                            expert_map=emap, **kw))
    hq, hs = qh(h)
    launch(*tc_gemm2_launch(hq, w2, ids, tw, out, p2, s2, a_scale=hs, b_scale=b2, config=dict(c2),
                            expert_map=emap, **kw))
    assert not s1.any() and not s2.any()
    return h, out


@pytest.mark.parametrize("T,skew", [(3, None), (20, 0)], ids=["T3", "T20-one-expert"])
def test_tc_share_equals_pair_programs(T, skew):
    # SHARE against one program a pair: exact integer operands make GEMM1 exact in both, so h
    # agrees bitwise; GEMM2's routing weights are not powers of two and the pair programs apply
    # them per K tile (SHARE once), so out agrees to fp32 rounding. T=20 with every token on expert 0: its 20 pairs take two leading programs (16 + 4
    # columns). expert_map drops expert 1 (a token may keep one slot or none: zeros)
    scheme = SCHEMES[0]
    k = 2
    x, w13, w2, a1, b1, b2 = _case(scheme, T, k, H_ODD, I_ODD, seed=4)
    tw, ids = _routing(T, E, k, seed=7, skew=skew)
    qh = _quant_h(scheme, 3)
    emap = torch.tensor([0, -1, 1, 2, 3], dtype=torch.int32, device=DEV)
    w13_l, w2_l, b1_l, b2_l = w13[:4], w2[:4], b1[:4], b2[:4]
    if skew is not None:
        assert (ids == 0).sum() == T                      # more than 16 pairs on one expert
    else:
        ids[1] = torch.tensor([1, 1], dtype=torch.int32)  # (a token with no kept slot)
    share = CFGS[3]
    for emap_ in (None, emap):
        ww = (w13, w2, b1, b2) if emap_ is None else (w13_l, w2_l, b1_l, b2_l)
        h0, o0 = _launch_both(x, ww[0], ww[1], tw, ids, a1, ww[2], ww[3], qh, *NO_SHARE, out_fill=0.0,
                              expert_map=emap_)
        h1, o1 = _launch_both(x, ww[0], ww[1], tw, ids, a1, ww[2], ww[3], qh, *share, expert_map=emap_)
        kept = gemm1_act_ref(x, ww[0], ids, "silu", expert_map=emap_, quant="channel", a_scale=a1,
                             b_scale=ww[2]).abs().sum(1) > 0
        assert torch.equal(h0[kept], h1[kept])
        assert _rel(o1, o0) < 1e-5
        hq, hs = qh(h1)
        ref = gemm2_ref(hq, ww[1], ids, tw, expert_map=emap_, quant="channel", a_scale=hs, b_scale=ww[3])
        assert _rel(o1, ref) < 1e-2
        if emap_ is not None and skew is None:
            assert (o1[1] == 0).all()


def test_tc_share_block_scales_and_determinism():
    # fp8 1 x 32 / 16 x 32 block scales per column under SHARE, two runs bitwise equal
    scheme = SCHEMES[3]
    quant, block = scheme[0], scheme[4]
    T, k = 6, 3
    x, w13, w2, a1, b1, b2 = _case(scheme, T, k, H_BLK, I_BLK, seed=5)
    tw, ids = _routing(T, E, k, seed=8)
    qh = _quant_h(scheme, 4)
    runs = [_launch_both(x, w13, w2, tw, ids, a1, b1, b2, qh, *CFGS[3], quant=quant, block_shape=block)
            for _ in range(2)]
    assert torch.equal(runs[0][1], runs[1][1])
    h, out = runs[0]
    assert _rel(h, gemm1_act_ref(x, w13, ids, "silu", quant=quant, a_scale=a1, b_scale=b1, block=block)) < 1e-2
    hq, hs = qh(h)
    assert _rel(out, gemm2_ref(hq, w2, ids, tw, quant=quant, a_scale=hs, b_scale=b2, block=block)) < 1e-2


def _block_case(H, I, seed):
    """(quant, block, T, k, operands, (tw, ids)) of the (16, 32) block scheme at T = 3, k = 4."""
    quant, _, _, _, block = SCHEMES[3]
    T, k = 3, 4
    return quant, block, T, k, _case(SCHEMES[3], T, k, H, I, seed=seed), _routing(T, E, k, seed=seed + 3)


@pytest.mark.parametrize("H", [64, 96], ids=["K-whole-steps", "K-last-group-past-K"])
def test_tc_gemm1_several_block_groups_a_step(H):
    # GEMM1 with BLOCK_K 64 over (16, 32) block scales: two dots a step, each with its group's
    # scales (SUB_K). H = 96: three groups, so the last step's second group lies past K (its dot
    # is zero and its scale index is clamped in bounds). Exact operands: h equals, bitwise,
    # the one-group-a-step result, unsplit, split and SHARE; and the reference to bf16
    from fusedmoe.kernels.decode_tc import tc_gemm1_launch
    quant, block, T, k, (x, w13, w2, a1, b1, b2), (tw, ids) = _block_case(H, I_BLK, 6)
    ref = gemm1_act_ref(x, w13, ids, "silu", quant=quant, a_scale=a1, b_scale=b1, block=block)
    table = torch.full((T * k, 16), 7, dtype=torch.int32, device=DEV)
    from fusedmoe.kernels.decode_tc import share_table_launch
    launch(*share_table_launch(ids, table, E))

    def h_of(c1):
        (p1, s1), _ = scratch(T, k, I_BLK, H, c1, CFGS[0][1], True, DEV)
        h = torch.full((T * k, I_BLK), float("nan"), dtype=torch.bfloat16, device=DEV)
        launch(*tc_gemm1_launch(x, w13, ids, "silu", h, p1, s1, quant=quant, a_scale=a1, b_scale=b1,
                                block_shape=block, config=dict(c1), table=table if c1.get("SHARE") else None))
        assert not s1.any()
        return h
    one = h_of(dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=1))
    assert _rel(one, ref) < 1e-2
    for c1 in (dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=1), dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2),
               dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=1, SHARE=True)):
        assert torch.equal(h_of(c1), one), c1
    # a BLOCK_K neither a divisor nor a multiple of the group: named
    with pytest.raises(ValueError, match="BLOCK_K 48 must divide or be a multiple of the scale group 32"):
        h_of(dict(BLOCK_N=16, BLOCK_K=48, SPLIT_K=1))


def test_tc_gemm2_block_k_must_divide_the_group():
    # GEMM2 steps one scale group at most (session 36 measured two a step slower and removed it):
    # a BLOCK_K of 64 over (16, 32) block scales is refused, naming the group
    from fusedmoe.kernels.decode_tc import tc_gemm2_launch
    I = 48
    quant, block, T, k, (x, w13, w2, a1, b1, b2), (tw, ids) = _block_case(H_BLK, I, 7)
    hq, hs = _quant_h(SCHEMES[3], 5)(torch.empty(T * k, I))
    out = torch.empty((T, H_BLK), dtype=torch.bfloat16, device=DEV)
    c2 = dict(BLOCK_N=32, BLOCK_K=64, GROUPS=1)
    with pytest.raises(ValueError, match="BLOCK_K 64 must divide the scale group 32"):
        tc_gemm2_launch(hq, w2, ids, tw, out, *scratch(T, k, I, H_BLK, CFGS[0][0], c2, True, DEV)[1],
                        quant=quant, a_scale=hs, b_scale=b2, block_shape=block, config=c2)


def test_tc_decode_empty_and_bad_operands():
    scheme = SCHEMES[0]
    x, w13, w2, a1, b1, b2 = _case(scheme, 1, 2, H_ODD, I_ODD)
    tw, ids = _routing(0, E, 2)
    h, out = tc_decode(x[:0], w13, w2, tw, ids, x_scale=a1[:0], w13_scale=b1, w2_scale=b2,
                       quantize_h=_quant_h(scheme, 0))
    assert out.shape == (0, H_ODD)
    tw, ids = _routing(1, E, 2)
    with pytest.raises(ValueError, match="8-bit activations and weights"):
        tc_decode(x.to(torch.float16), w13, w2, tw, ids, x_scale=a1, w13_scale=b1, w2_scale=b2,
                  quantize_h=_quant_h(scheme, 0))


def test_tc_config_rules():
    from fusedmoe.plan import DEFAULT_DEVICE, DEVICES
    # qwen3 T=1 (8 pairs, I 768, H 2048): 24 tiles x 8 pairs = 192 programs >= 132 SMs: no
    # split; GEMM2 32 tiles -> slot groups while < 4 programs per SM: 8 (one slot each)
    c1 = tc_config("gemm1", 8, 768, 2048, 8)
    assert (c1["BLOCK_N"], c1["BLOCK_K"], c1["SPLIT_K"]) == (32, 256, 1)
    c2 = tc_config("gemm2", 1, 2048, 768, 8)
    assert (c2["BLOCK_N"], c2["GROUPS"]) == (64, 8)
    # deepseek tp8 fp8_block (I 256, H 7168, groups 128): BK = the group; GEMM1 64 tiles -> split 4
    c1 = tc_config("gemm1", 8, 256, 7168, 8, group_k=128)
    assert (c1["BLOCK_K"], c1["SPLIT_K"]) == (128, 4)
    c2 = tc_config("gemm2", 1, 7168, 256, 8, group_k=128)
    assert (c2["BLOCK_K"], c2["GROUPS"]) == (128, 8)
    assert not c1["SHARE"] and not c2["SHARE"]          # no expert count given: never shared
    # at T = 2..4 where it was measured: qwen3's unsplit GEMM1 (K = 2048) takes 3 stages;
    # qwen3's GEMM2 (K = 768) stops doubling its slot groups at 2.5 programs an SM: 8 at T = 1, 2, 4
    # at T = 3, 4; deepseek's (K = 256) at 4: 2 at T = 3. Deepseek's GEMM1
    # (K = 7168) takes 6 stages and its GEMM2 (K = 256) 2. T=1 and T >= 5 keep the general rules
    assert [tc_config("gemm1", 8 * T, 768, 2048, 8)["num_stages"] for T in (1, 2, 3, 4, 5)] == [4, 3, 3, 3, 4]
    assert [tc_config("gemm2", T, 2048, 768, 8)["GROUPS"] for T in (5, 6, 7)] == [4, 4, 4]
    assert tc_config("gemm1", 16, 768, 2048, 8)["num_stages"] == 3
    assert [tc_config("gemm2", T, 2048, 768, 8)["GROUPS"] for T in (1, 2, 3, 4)] == [8, 8, 4, 4]
    assert [tc_config("gemm2", T, 7168, 256, 8, group_k=128)["GROUPS"] for T in (1, 2, 3, 4)] == [8, 4, 2, 2]
    assert [tc_config("gemm1", 8 * T, 256, 7168, 8, group_k=128)["num_stages"] for T in (1, 2, 3, 4, 5)] == [4, 6, 6, 6, 4]
    assert [tc_config("gemm2", T, 7168, 256, 8, group_k=128)["num_stages"] for T in (1, 2, 3, 4, 5)] == [4, 2, 2, 2, 4]
    # ... but not where GEMM1 runs more than 2 programs an SM (qwen3-235b K = 4096: 768 at T=2)
    assert [tc_config("gemm1", 8 * T, 1536, 4096, 8)["num_stages"] for T in (1, 2, 3, 4)] == [4] * 4
    assert tc_config("gemm1", 8, 256, 7168, 8, group_k=128, num_sms=132)["num_stages"] == 4   # T=1
    # deepseek's GEMM1 splits only below one wave of programs: 2 at T=2 (128 tiles), none at T=3
    assert [tc_config("gemm1", 8 * T, 256, 7168, 8, group_k=128)["SPLIT_K"] for T in (1, 2, 3, 4)] == [4, 2, 1, 1]
    # on an H100 and an H200 (plan.DeviceFacts.tc_gemm1_block_groups), where that rule gives GEMM1 its
    # 6 stages with 128-wide block scales, K steps of two groups (BK 256) and 3 stages; the splits
    # unchanged; not at T=1 or T >= 5, not at K <= 2048, not with more than 2 programs an SM, not on
    # other GPUs (unmeasured)
    h100 = dict(block_groups=DEVICES["H100"].tc_gemm1_block_groups)
    got = [tc_config("gemm1", 8 * T, 256, 7168, 8, group_k=128, **h100) for T in (1, 2, 3, 4, 5)]
    assert [(c["BLOCK_K"], c["num_stages"]) for c in got] == [(128, 4)] + [(256, 3)] * 3 + [(128, 4)]
    assert [c["SPLIT_K"] for c in got[:4]] == [4, 2, 1, 1]
    assert [tc_config("gemm1", 8 * T, 256, 7168, 8, group_k=128, block_groups=DEVICES["H200"].tc_gemm1_block_groups)
            ["BLOCK_K"] for T in (2, 3, 4)] == [256] * 3
    assert [tc_config("gemm1", 8 * T, 256, 7168, 8, group_k=128, block_groups=DEFAULT_DEVICE.tc_gemm1_block_groups)
            ["BLOCK_K"] for T in (2, 3, 4)] == [128] * 3
    assert tc_config("gemm1", 16, 256, 2048, 8, group_k=128, **h100)["BLOCK_K"] == 128
    assert tc_config("gemm1", 16, 1536, 7168, 8, group_k=128, **h100)["BLOCK_K"] == 128   # 768 programs
    # GEMM2 keeps one group a step (two: measured slower)
    assert [tc_config("gemm2", T, 7168, 256, 8, group_k=128, **h100)["BLOCK_K"] for T in (1, 2, 3, 4, 5)] == \
        [128] * 5
    assert [tc_config("gemm2", T, 7168, 256, 8, group_k=128, **h100)["GROUPS"] for T in (2, 3, 4)] == [4, 2, 2]
    # the same rules on the H100, the H200 and other GPUs where no block groups apply
    # (the earlier rules kept for GPUs listed in TC_RULES_OLD_ON were removed: they measured slower)
    for facts in (DEVICES["H200"], DEVICES["H100"], DEFAULT_DEVICE):
        bg = dict(block_groups=facts.tc_gemm1_block_groups)
        assert tc_config("gemm1", 16, 768, 2048, 8, **bg)["num_stages"] == 3
        assert [tc_config("gemm2", T, 2048, 768, 8)["GROUPS"] for T in (1, 2, 3, 4)] == [8, 8, 4, 4]
    assert tc_config("gemm1", 16, 256, 7168, 8, group_k=128, block_groups=True)["num_stages"] == 3
    # expert-shared from E / 2 pairs on (qwen3 E=128: T=8), with one K slice and no slot groups;
    # never for one token (k distinct experts), whatever E
    kw = dict(num_experts=128)
    assert not tc_config("gemm1", 32, 768, 2048, 8, **kw)["SHARE"]
    assert not tc_config("gemm2", 4, 2048, 768, 8, **kw)["SHARE"]
    c1 = tc_config("gemm1", 64, 768, 2048, 8, **kw)
    c2 = tc_config("gemm2", 8, 2048, 768, 8, **kw)
    assert c1["SHARE"] and c1["SPLIT_K"] == 1 and c2["SHARE"] and c2["GROUPS"] == 1 and c2["num_stages"] == 2
    assert not tc_config("gemm1", 8, 768, 2048, 8, num_experts=8)["SHARE"]
    # deepseek tp8's I = 256 (GEMM2 programs of one 16 KB tile): never shared
    assert not tc_config("gemm1", 128, 256, 7168, 8, group_k=128, num_experts=256)["SHARE"]
    assert not tc_config("gemm2", 16, 7168, 256, 8, group_k=128, num_experts=256)["SHARE"]
    # SHARE takes one K slice where the split rule would cut K
    assert tc_config("gemm1", 8, 512, 7168, 4, group_k=128, share=False)["SPLIT_K"] == 2    # 128 tiles
    c1 = tc_config("gemm1", 8, 512, 7168, 4, group_k=128, num_experts=16)
    assert c1["SHARE"] and c1["SPLIT_K"] == 1


def test_tc_slots_are_the_decode_kernels():
    # the triton backend binds either kernel pair with decode.py's slot positions
    from fusedmoe.kernels.decode import GEMM1_SLOTS, GEMM2_SLOTS
    from fusedmoe.kernels.decode_tc import TC_GEMM1_SLOTS, TC_GEMM2_SLOTS
    assert TC_GEMM1_SLOTS == GEMM1_SLOTS and TC_GEMM2_SLOTS == GEMM2_SLOTS


@pytest.mark.gpu
@pytest.mark.parametrize("model,tp,scheme", [("qwen3-30b-a3b", 1, "fp8_channel"), ("qwen3-30b-a3b", 1, "int8_channel"),
                                             ("deepseek-v3", 8, "fp8_block"), ("qwen3-30b-a3b", 1, "fp8_tensor")])
@pytest.mark.parametrize("T", [1, 2, 5, 16])
def test_gpu_tc_decode_real_sizes(model, tp, scheme, T):
    # the real shapes with tc_config's own splits (expert-shared from T=2 on; T=16: 128 pairs),
    # random bf16 inputs quantized by the scheme's kernels: against the reference of the same math (activations quantized)
    if not _CUDA or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fp8 / int8 wgmma tiles: sm90")
    from fusedmoe.bench.harness import make_weights
    from fusedmoe.quantize import quantize_activation
    from fusedmoe.presets import get_preset
    from fusedmoe.reference.moe import reference_moe
    from fusedmoe.tolerances import rel_error, tolerance
    cfg = get_preset(model).to_config(tp=tp)
    w = make_weights(cfg, scheme, "cuda", seed=T)
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, cfg.hidden_size, generator=g, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(T, cfg.num_experts, generator=g, device="cuda")
    tw, ids = torch.topk(logits.softmax(-1), cfg.top_k, dim=-1)
    ids = ids.to(torch.int32)
    quant = {"fp8_block": "block", "fp8_tensor": "tensor"}.get(scheme, "channel")
    xq, xs = quantize_activation(x, w.scheme)
    _, out = tc_decode(xq, w.w13, w.w2, tw, ids, "silu", x_scale=xs, w13_scale=w.w13_scale, w2_scale=w.w2_scale,
                       quant=quant, block_shape=w.scheme.block_shape,
                       quantize_h=lambda h: quantize_activation(h, w.scheme))
    ref = reference_moe(x, w, tw, ids, cfg, quantize_activations=True)
    assert rel_error(out, ref) <= tolerance("bfloat16", w.scheme.method)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"{s[0]}-{str(s[1]).replace('torch.', '')}")
def test_tc_gemm2_slot_groups_and_a_dropped_first_slot(scheme):
    # GEMM2 with slot groups of 1, 2 and 4 slots, K in 2 tiles, and a token whose first slot is
    # dropped, against the reference (GEMM2's first weight tile loaded before its wait for h,
    # EARLY_W, was removed: it measured slower)
    quant, dt, a_shape, _, block = scheme
    H, I = (H_BLK, I_BLK) if block else (H_ODD, I_ODD)
    T, k = 3, 4
    x, w13, w2, a1, b1, b2 = _case(scheme, T, k, H, I, seed=4)
    tw, ids = _routing(T, E, k, seed=7)
    emap = torch.arange(E, dtype=torch.int32, device=DEV)
    emap[int(ids[1, 0])] = -1                                   # token 1's first slot: dropped
    qh = _quant_h(scheme, 2)
    for c1, c2 in CFGS[:3]:
        h, out = tc_decode(x, w13, w2, tw, ids, "silu", x_scale=a1, w13_scale=b1, w2_scale=b2,
                           quant=quant, block_shape=block, quantize_h=qh, expert_map=emap,
                           config1=dict(c1), config2=dict(c2))
        hq, hs = qh(h)
        ref2 = gemm2_ref(hq, w2, ids, tw, expert_map=emap, quant=quant, a_scale=hs, b_scale=b2, block=block)
        assert _rel(out, ref2) < 1e-2


def test_tc_l2_pre_switch(monkeypatch):
    # the tc GEMMs' L2 hints (L2_PRE) come from the launch config, which the plan fills where the
    # launches wait for the kernel before them on CUDA: unforced, GEMM1 plan.DeviceFacts.tc_l2_pre_gemm1
    # lines (4 on an H100 and an H200, measured; 0 elsewhere; 0 where GEMM1 shares experts), GEMM2
    # 0; FUSEDMOE_PLAN tc_l2_pre [G1, G2] (or one number for both) overrides, SHARE's GEMM1 too.
    # GEMM1's count is a power of two at the launch (a tl.arange length); bad values name the key
    import json

    from fusedmoe.config import QuantScheme
    from fusedmoe.errors import ConfigError
    from fusedmoe.kernels.decode_tc import _l2_pre
    from fusedmoe.plan import DEVICES, Planner, PlanOverride
    from fusedmoe.platform import Platform
    from fusedmoe.presets import get_preset

    class Cuda:
        is_cuda = True
        device = torch.device("cuda", 0)
    qwen, fp8 = get_preset("qwen3-30b-a3b").to_config(), QuantScheme.parse("fp8_channel")

    def l2(gpu="h100", T=2, **forced):      # (T = 2: 16 pairs, no expert sharing by the rule)
        monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps(dict(w8a8_decode="tc", **forced)))
        p = Planner(qwen, fp8, Platform.preset(gpu)).plan(T)
        assert p.tc
        return p.gemm1["L2_PRE"], p.gemm2["L2_PRE"]
    assert DEVICES["H100"].tc_l2_pre_gemm1 == DEVICES["H200"].tc_l2_pre_gemm1 == 4
    for gpu, want in (("h100", 4), ("h200", 4), ("b200", 0)):
        assert l2(gpu) == (want, 0), gpu
    for v, want in ((None, None), (3, (3, 3)), ([4, 1], (4, 1)), ([0, 2], (0, 2))):
        text = None if v is None else json.dumps({"tc_l2_pre": v})
        assert PlanOverride.parse(text).tc_l2_pre == want, v
    assert l2(tc_l2_pre=[3, 2]) == (3, 2)
    assert _l2_pre({"L2_PRE": 3}, Cuda(), True, 0) == 4 and _l2_pre({"L2_PRE": 2}, Cuda(), True, 1) == 2
    assert _l2_pre({"L2_PRE": 0}, Cuda(), True, 0) == 0 and _l2_pre({"L2_PRE": 1}, Cuda(), True, 1) == 1
    assert _l2_pre({}, Cuda(), True, 0) == 0                        # no key: none
    assert _l2_pre({"L2_PRE": 3}, Cuda(), False, 0) == 0            # no wait: nothing to overlap
    assert l2(tc_l2_pre=[3, 2], decode_pdl=False) == (0, 0)
    assert l2(tc_l2_pre=[3, 2], decode_share=True)[0] == 3          # SHARE's GEMM1 takes the override too
    assert l2(decode_share=True)[0] == 0                            # ... but no hint by default
    assert _l2_pre({"L2_PRE": 3}, torch.empty(1), True, 0) == 0     # CPU / interpreter: no inline PTX
    assert l2("cpu", tc_l2_pre=[3, 2]) == (0, 0)
    for bad in ("x", [1, 2, 3], -1, [1], [1, -2], True):
        with pytest.raises(ConfigError, match=r"FUSEDMOE_PLAN\['tc_l2_pre'\]"):
            PlanOverride.parse(json.dumps({"tc_l2_pre": bad}))


@pytest.mark.gpu
@pytest.mark.parametrize("model,tp,scheme", [("qwen3-30b-a3b", 1, "fp8_channel"), ("qwen3-30b-a3b", 1, "int8_channel"),
                                             ("deepseek-v3", 8, "fp8_block")])
def test_gpu_tc_l2_pre_same_bits(model, tp, scheme, monkeypatch):
    # L2_PRE (the tc GEMMs' L2 hints before their PDL waits) is a hint: the layer's output on the
    # tensor-core chain is bitwise the same with it off and on (two settings) at T = 2, 3, 5 and 8
    # (qwen3: SHARE, whose GEMM1 hints each pair's expert), and within the scheme's tolerance of the
    # reference
    if not _CUDA or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fp8 / int8 wgmma tiles and PDL: sm90")
    from fusedmoe.bench.harness import make_weights
    from fusedmoe.layer import prepare_experts
    from fusedmoe.presets import get_preset
    from fusedmoe.reference.moe import reference_moe
    from fusedmoe.tolerances import rel_error, tolerance
    cfg = get_preset(model).to_config(tp=tp)
    w = make_weights(cfg, scheme, "cuda", seed=3)
    for T in (2, 3, 5, 8):
        g = torch.Generator(device="cuda").manual_seed(T)
        x = torch.randn(T, cfg.hidden_size, generator=g, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(T, cfg.num_experts, generator=g, device="cuda")
        tw, ids = torch.topk(logits.softmax(-1), cfg.top_k, dim=-1)
        ids = ids.to(torch.int32)
        outs = []
        for v in (0, [4, 2], [8, 8]):
            monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"w8a8_decode": "tc", "tc_l2_pre": v}))
            pe = prepare_experts(cfg, w, "triton")
            outs.append(pe(x, tw, ids))
        torch.cuda.synchronize()
        assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0]), T
        ref = reference_moe(x, w, tw, ids, cfg, quantize_activations=True)
        assert rel_error(outs[0], ref) <= tolerance("bfloat16", w.scheme.method), T


@pytest.mark.gpu
def test_gpu_tc_block_groups_same_bits(monkeypatch):
    # TC_GEMM1_BLOCK_GROUPS 2 (deepseek-v3 tp8 fp8_block GEMM1 K steps of two 128-wide scale
    # groups, one dot and one scaling each, where plan.DeviceFacts.tc_gemm1_block_groups: the H100's
    # and the H200's default) adds the same products in the
    # same order as one group a step: the layer's output is
    # bitwise the same at T = 2, 3, 4 (the T = 2..4 rule), and within the scheme's tolerance of the
    # reference
    if not _CUDA or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fp8 wgmma tiles: sm90")
    import dataclasses

    import fusedmoe.kernels.decode_tc as dtc
    from fusedmoe import plan
    from fusedmoe.bench.harness import make_weights
    from fusedmoe.layer import prepare_experts
    from fusedmoe.presets import get_preset
    from fusedmoe.reference.moe import reference_moe
    from fusedmoe.tolerances import rel_error, tolerance
    monkeypatch.setenv("FUSEDMOE_PLAN", json.dumps({"w8a8_decode": "tc"}))
    facts = plan.device_facts
    cfg = get_preset("deepseek-v3").to_config(tp=8)
    w = make_weights(cfg, "fp8_block", "cuda", seed=4)
    for T in (2, 3, 4):
        g = torch.Generator(device="cuda").manual_seed(10 + T)
        x = torch.randn(T, cfg.hidden_size, generator=g, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(T, cfg.num_experts, generator=g, device="cuda")
        tw, ids = torch.topk(logits.softmax(-1), cfg.top_k, dim=-1)
        ids = ids.to(torch.int32)
        outs = []
        assert dtc.TC_GEMM1_BLOCK_GROUPS == 2
        for g1 in (1, 2):                                                   # whatever this GPU's facts say
            monkeypatch.setattr(plan, "device_facts", lambda platform, on=g1 == 2: dataclasses.replace(
                facts(platform), tc_gemm1_block_groups=on))
            assert dtc.tc_config("gemm1", T * cfg.top_k, cfg.intermediate_size, cfg.hidden_size, cfg.top_k,
                                 group_k=128, block_groups=g1 == 2)["BLOCK_K"] == 128 * g1
            pe = prepare_experts(cfg, w, "triton")
            assert pe.kernel.experts.plan(T).gemm1["BLOCK_K"] == 128 * g1
            outs.append(pe(x, tw, ids))
        torch.cuda.synchronize()
        assert torch.equal(outs[1], outs[0]), T
        ref = reference_moe(x, w, tw, ids, cfg, quantize_activations=True)
        assert rel_error(outs[1], ref) <= tolerance("bfloat16", w.scheme.method), T
