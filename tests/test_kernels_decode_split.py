"""The split-I decode (fusedmoe/kernels/decode_split.py: the layer in one launch, GEMM2 by
chunks of I with atomic adds into a self-cleaning fp32 workspace) against the references.

No tl.dot, so the interpreter runs it; without CUDA the tests below run under
TRITON_INTERPRET=1 on tiny shapes (programs run one after another there, so the ticket's
last-program hand-off is exercised for its logic only); the ``gpu`` tests add real model
sizes, many programs racing for the ticket, CUDA graphs, and the backend switch.
Tolerances: fp32 operands 1e-5 (only the fp32 order of the atomic sums differs), fp16 4e-3 and
bf16 2e-2 (h rounded to the activation dtype, as the two-kernel path stores it; TOL of
test_kernels_gemm), 8-bit weights with exact small-integer / power-of-two operands 1e-4.
"""
from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fusedmoe.kernels import decode_split as ds  # noqa: E402
from fusedmoe.kernels.decode_split import split_config, split_forward  # noqa: E402
from fusedmoe.reference.kernels import gemm1_act_ref, gemm2_ref, moe_naive_loop, moe_ref  # noqa: E402
from test_kernels_gemm import (DEV, E, H, I, K_TOP, QUANT_CASES, TOL, _pow2, _randn, _rel, _routing,  # noqa: E402
                               _weights, _x)

H_ODD, I_ODD = 72, 40                       # no tile divides them
CFG = dict(BLOCK_I=8, BLOCK_K=32, BLOCK_H=32, num_warps=4)   # several chunks, K steps and H steps


def _workspaces_zero():
    return all(ws.abs().max().item() == 0 and int(tk.item()) == 0 for ws, tk in ds._WORKSPACES.values())


@pytest.mark.parametrize("act,kw", [("silu", {}), ("silu", {"swiglu_limit": 0.3}), ("gelu", {}),
                                    ("swigluoai", {"alpha": 1.702, "limit": 0.4}), ("relu2_no_mul", {})])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_split_activations_bias(act, kw, dtype):
    gated = not act.endswith("_no_mul")
    w13, w2, b13, b2 = _weights(E, H_ODD, I_ODD, dtype, gated=gated, bias=True)
    x = _x(3, H_ODD, dtype)
    tw, ids = _routing(3, E, K_TOP)
    out = split_forward(x, w13, w2, tw, ids, act, w13_bias=b13, w2_bias=b2, config=CFG, **kw)
    ref = moe_ref(x, w13, w2, tw, ids, act, w13_bias=b13, w2_bias=b2, round_h_to=dtype, **kw)
    assert out.shape == (3, H_ODD) and out.dtype == dtype
    assert _rel(out, ref) < TOL[dtype]
    assert _workspaces_zero()


@pytest.mark.parametrize("T", [0, 1, 2, 7])
def test_split_forward_repeats_and_naive_loop(T):
    # repeated calls (each program's walk over H staggered or not): the workspace and the ticket
    # come back zero, so a call never sees the last one's sums
    w13, w2, _, _ = _weights(E, H_ODD, I_ODD, torch.float32)
    x = _x(T, H_ODD, torch.float32)
    tw, ids = _routing(T, E, K_TOP, seed=T)
    outs = [split_forward(x, w13, w2, tw, ids, "silu", config=dict(CFG, STAGGER=st)) for st in (True, False, True)]
    assert outs[0].shape == (T, H_ODD)
    if T:
        ref = moe_naive_loop(x, w13, w2, tw, ids, "silu")
        for o in outs:
            assert _rel(o, ref) < 1e-5
    assert _workspaces_zero()


def test_split_gate_up_not_interchangeable_and_empty_experts():
    # asymmetric halves: swapping gate and up rows changes the result; E=5, k=2, one token:
    # three experts get no pair
    w13, w2, _, _ = _weights(E, H_ODD, I_ODD, torch.float32)
    x = _x(1, H_ODD, torch.float32)
    tw, ids = _routing(1, E, K_TOP)
    swapped = torch.cat([w13[:, I_ODD:], w13[:, :I_ODD]], dim=1)
    a = split_forward(x, w13, w2, tw, ids, "silu", config=CFG)
    b = split_forward(x, swapped, w2, tw, ids, "silu", config=CFG)
    assert _rel(a, moe_ref(x, w13, w2, tw, ids, "silu")) < 1e-5
    assert _rel(a, b) > 0.1


def test_split_expert_map_drops_pairs_and_no_router_weight():
    # expert_map keeps global experts 0, 2 (locals 0, 1): a token with no kept slot gets zeros;
    # every program still takes the ticket, so the output is written
    w13, w2, b13, b2 = _weights(2, H_ODD, I_ODD, torch.float32, bias=True)
    emap = torch.tensor([0, -1, 1, -1, -1], dtype=torch.int32, device=DEV)
    ids = torch.tensor([[0, 2], [1, 3], [2, 4]], dtype=torch.int32, device=DEV)
    tw = torch.rand(3, 2, generator=torch.Generator().manual_seed(5)).to(DEV)
    x = _x(3, H_ODD, torch.float32)
    for mul_w in (True, False):
        out = split_forward(x, w13, w2, tw, ids, "silu", expert_map=emap, w13_bias=b13, w2_bias=b2,
                            mul_routed_weight=mul_w, config=CFG)
        h = gemm1_act_ref(x, w13, ids, "silu", expert_map=emap, bias=b13)
        ref = gemm2_ref(h, w2, ids, tw, expert_map=emap, bias=b2, mul_routed_weight=mul_w)
        assert _rel(out, ref) < 1e-5
        assert out[1].abs().max().item() == 0
    assert _workspaces_zero()


@pytest.mark.parametrize("case", [c for c in QUANT_CASES if c[1] != "w8a16"],
                         ids=lambda c: f"{c[0]}-{str(c[1]).replace('torch.', '')}")
def test_split_8bit_weights(case):
    # 8-bit weights against 16-bit (here fp32) activations: random int8 over the whole range,
    # fp8 with subnormals and both signs, power-of-two scales: exact products in fp32
    quant, dt, _, b_shape = case
    T, k = 3, K_TOP
    block = (16, 32) if quant == "block" else None
    g = torch.Generator().manual_seed(31)
    if dt == torch.int8:
        w13 = torch.randint(-128, 128, (E, 2 * I, H), generator=g).to(torch.int8).to(DEV)
        w2 = torch.randint(-128, 128, (E, H, I), generator=g).to(torch.int8).to(DEV)
    else:
        w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).to(dt).to(DEV)
        w2 = (torch.randn(E, H, I, generator=g) * 0.05).to(dt).to(DEV)
    x = _randn(T, H, seed=32)
    b1, b2 = _pow2(b_shape(2 * I, H), 11), _pow2(b_shape(H, I), 14)
    tw, ids = _routing(T, E, k)
    out = split_forward(x, w13, w2, tw, ids, "silu", quant=quant, w13_scale=b1, w2_scale=b2, block_shape=block,
                        config=dict(BLOCK_I=8, BLOCK_K=32, BLOCK_H=16))
    h = gemm1_act_ref(x, w13, ids, "silu", quant=quant, b_scale=b1, block=block)
    assert _rel(out, gemm2_ref(h, w2, ids, tw, quant=quant, b_scale=b2, block=block)) < 1e-4


def test_split_rejects_a_chunk_across_scale_groups():
    w13 = torch.zeros(E, 2 * I, H, dtype=torch.float8_e4m3fn, device=DEV)
    w2 = torch.zeros(E, H, I, dtype=torch.float8_e4m3fn, device=DEV)
    s13, s2 = torch.ones(E, 2 * I // 16, H // 32, device=DEV), torch.ones(E, H // 16, I // 32, device=DEV)
    tw, ids = _routing(1, E, K_TOP)
    with pytest.raises(AssertionError, match="BLOCK_I 64 must divide the scale group 32"):
        split_forward(_x(1, H, torch.float32), w13, w2, tw, ids, "silu", quant="block", w13_scale=s13,
                      w2_scale=s2, block_shape=(16, 32), config=dict(BLOCK_I=64, BLOCK_K=32, BLOCK_H=16))


def test_split_config_rule(monkeypatch):
    monkeypatch.delenv("FUSEDMOE_SPLIT_CONFIG", raising=False)
    assert split_config(8, 256, 7168, 1, 132) == dict(BLOCK_I=16, BLOCK_K=512, BLOCK_H=256, num_warps=4,
                                                      PREFETCH=True)
    assert split_config(8, 768, 2048, 2, 132)["BLOCK_I"] == 8
    monkeypatch.setenv("FUSEDMOE_SPLIT_CONFIG", "8,1024,256,8")
    assert split_config(8, 256, 7168, 1, 132) == dict(BLOCK_I=8, BLOCK_K=1024, BLOCK_H=256, num_warps=8,
                                                      PREFETCH=True, STAGGER=True)
    monkeypatch.setenv("FUSEDMOE_SPLIT_CONFIG", "8,1024,256,8,0")
    assert split_config(8, 256, 7168, 1, 132)["STAGGER"] is False
    monkeypatch.setenv("FUSEDMOE_SPLIT_CONFIG", "8,1000,256,8")
    with pytest.raises(Exception, match="FUSEDMOE_SPLIT_CONFIG"):
        split_config(8, 256, 7168, 1, 132)


@pytest.mark.parametrize("scheme", ["none", "fp8_block", "int8_channel", "fp8_channel"])
def test_backend_split_switch(mk, scheme, monkeypatch):
    # FUSEDMOE_DECODE_SPLIT=1 sends the backend's a16 decode calls through the split launch
    # (bound once per shape); a layer built with deterministic=True never takes it
    from fusedmoe.layer import prepare_experts
    from test_backends import build, check
    monkeypatch.setenv("FUSEDMOE_DECODE_SPLIT", "1")
    monkeypatch.setenv("FUSEDMOE_W8A8_DECODE", "a16")
    monkeypatch.setenv("FUSEDMOE_DECODE_PAIRS", "16")
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="float32", has_bias=True)
    w = mk.weights(cfg, scheme, seed=21).to(DEV)
    pe = build("triton", cfg, w)
    ex = pe.kernel.experts
    for T, seed in ((3, 22), (3, 24), (1, 26)):
        check(pe, cfg, w, mk.x(cfg, T, seed=seed).to(DEV), mk.logits(cfg, T, seed=seed + 1).to(DEV))
    assert len(ex._splits) == 2 and not ex._plans
    det = prepare_experts(cfg, w, "triton", deterministic=True)
    check(det, cfg, w, mk.x(cfg, 3, seed=30).to(DEV), mk.logits(cfg, 3, seed=31).to(DEV))
    assert not det.kernel.experts._splits and det.kernel.experts._plans
    assert _workspaces_zero()


# ------------------------------------------------------------------------------ GPU
_REAL = {"deepseek-tp8-fp8-block": (256, 7168, 256, 8, torch.float8_e4m3fn, "block"),
         "qwen3-fp8": (128, 2048, 768, 8, torch.float8_e4m3fn, "channel"),
         "qwen3-int8": (128, 2048, 768, 8, torch.int8, "channel"),
         "qwen3-bf16": (128, 2048, 768, 8, torch.bfloat16, "none")}


def _real(case, seed=71):
    E_, H_, I_, k, wd, quant = _REAL[case]
    g = torch.Generator().manual_seed(seed)
    if wd == torch.int8:
        w13 = torch.randint(-128, 128, (E_, 2 * I_, H_), generator=g).to(torch.int8)
        w2 = torch.randint(-128, 128, (E_, H_, I_), generator=g).to(torch.int8)
    else:
        w13 = (torch.randn(E_, 2 * I_, H_, generator=g) / H_ ** 0.5 * (8 if wd != torch.bfloat16 else 1)).to(wd)
        w2 = (torch.randn(E_, H_, I_, generator=g) / I_ ** 0.5 * (8 if wd != torch.bfloat16 else 1)).to(wd)
    if quant == "block":
        s13 = torch.rand(E_, 2 * I_ // 128, H_ // 128, generator=g) / 8 + 1 / 16
        s2 = torch.rand(E_, H_ // 128, I_ // 128, generator=g) / 8 + 1 / 16
    elif quant == "channel":
        s13 = torch.rand(E_, 2 * I_, generator=g) / (8 if wd != torch.int8 else 800) + 1e-3
        s2 = torch.rand(E_, H_, generator=g) / (8 if wd != torch.int8 else 800) + 1e-3
    else:
        s13 = s2 = None
    dev = lambda t: t.to(DEV) if t is not None else None  # noqa: E731
    q = dict(quant=quant, block_shape=(128, 128) if quant == "block" else None)
    return dev(w13), dev(w2), dev(s13), dev(s2), q, k


def _ref(x, w13, w2, tw, ids, s13, s2, q):
    blk = q["block_shape"]
    h = gemm1_act_ref(x, w13, ids, "silu", quant=q["quant"], b_scale=s13, block=blk).to(x.dtype).float()
    return gemm2_ref(h, w2, ids, tw, quant=q["quant"], b_scale=s2, block=blk)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", list(_REAL))
@pytest.mark.parametrize("T", [1, 2, 4])
def test_gpu_split_real_size(case, T):
    w13, w2, s13, s2, q, k = _real(case)
    x = _x(T, w13.shape[2], torch.bfloat16)
    tw, ids = _routing(T, w13.shape[0], k, seed=T + 70)
    ref = _ref(x, w13, w2, tw, ids, s13, s2, q)
    for cfg in (None, dict(BLOCK_I=8, BLOCK_K=1024, BLOCK_H=1024, num_warps=8),
                dict(BLOCK_I=32, BLOCK_K=256, BLOCK_H=256, num_warps=8, STAGGER=False),
                dict(BLOCK_I=4, BLOCK_K=1024, BLOCK_H=512, num_warps=4)):
        out = split_forward(x, w13, w2, tw, ids, "silu", w13_scale=s13, w2_scale=s2, config=cfg, **q)
        assert _rel(out, ref) < TOL[torch.bfloat16], cfg
    assert _workspaces_zero()


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
def test_gpu_split_ticket_stress_and_graph():
    # 300 launches back to back, each with its own routing (T = 1..4 in turn), every result
    # against the two-kernel decode on the same inputs: a program that read the workspace
    # before another's adds landed, or a ticket not reset, shows as a wrong row. Then a CUDA
    # graph of the launch replayed on new inputs equals the eager launch up to the atomic order
    from fusedmoe.kernels.decode import decode_gemm1, decode_gemm2
    w13, w2, s13, s2, q, k = _real("deepseek-tp8-fp8-block")
    H_ = w13.shape[2]
    xs = [_x(T, H_, torch.bfloat16, seed=100 + T) for T in (1, 2, 3, 4)]
    routes = [_routing(T, w13.shape[0], k, seed=200 + i) for i, T in enumerate((1, 2, 3, 4))]
    want = [decode_gemm2(decode_gemm1(x, w13, ids, "silu", b_scale=s13, **q), w2, ids, tw, b_scale=s2, **q)
            for x, (tw, ids) in zip(xs, routes)]
    outs = []
    for i in range(300):
        j = i % 4
        outs.append((j, split_forward(xs[j], w13, w2, *routes[j], "silu", w13_scale=s13, w2_scale=s2, **q)))
    torch.cuda.synchronize()
    bad = [i for i, (j, o) in enumerate(outs) if _rel(o, want[j]) > 1e-2]
    assert not bad, f"{len(bad)} of 300 launches differ from the two-kernel decode, first {bad[:5]}"
    assert _workspaces_zero()
    x, (tw, ids) = xs[1].clone(), tuple(t.clone() for t in routes[1])
    out = torch.empty_like(x)
    split_forward(x, w13, w2, tw, ids, "silu", out=out, w13_scale=s13, w2_scale=s2, **q)    # binds, warms
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        split_forward(x, w13, w2, tw, ids, "silu", out=out, w13_scale=s13, w2_scale=s2, **q)
    x.copy_(_x(2, H_, torch.bfloat16, seed=300))
    tw2, ids2 = _routing(2, w13.shape[0], k, seed=301)
    tw.copy_(tw2)
    ids.copy_(ids2)
    g.replay()
    eager = split_forward(x, w13, w2, tw, ids, "silu", w13_scale=s13, w2_scale=s2, **q)
    assert _rel(out, eager) < 1e-2
    assert _rel(out, _ref(x, w13, w2, tw, ids, s13, s2, q)) < TOL[torch.bfloat16]
    assert _workspaces_zero()
