"""fusedmoe.kernels.batched_gemm against a plain-torch loop over experts and their counts.

Without a GPU the kernels run under TRITON_INTERPRET=1 on tiny fp16/fp32 shapes (the
interpreter's tl.dot on bf16 returns garbage; its fp8 and int8 dots are exact, so those run
here too). With a GPU the same tests run compiled, and the ``gpu`` tests add bf16 and real
fp8 / int8 model-sized shapes.

Legend: E local experts, T_max rows per expert, H hidden, I intermediate, N = 2I gated.
"""
from __future__ import annotations

import os
from typing import Optional

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported

from fusedmoe.config import GateUpLayout, QuantScheme  # noqa: E402
from fusedmoe.kernels.batched_gemm import batched_gemm1_act, batched_gemm2, default_batched_config  # noqa: E402
from fusedmoe.reference import quant as rq  # noqa: E402
from fusedmoe.reference.activations import apply_activation  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
requires_gpu = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                                  reason="needs a CUDA GPU running compiled Triton")

# max |kernel - reference| / max |reference| by output dtype
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}
SMALL = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, num_warps=4, num_stages=2)
E, T_MAX, H, I = 4, 24, 72, 40           # H, I not multiples of any tile: tail masking
COUNTS = [0, 24, 5, 17]                  # empty expert, full expert, < BM, straddles two m-blocks
SENTINEL = -4096.0                      # pre-filled output (exact in every dtype): padding rows keep it


# ----------------------------------------------------------------------------- helpers
def make_inputs(dtype=torch.float16, gated=True, counts=COUNTS, T_max=T_MAX, H_=H, I_=I, E_=E,
                seed=0, x_scale=1.0, bias=False):
    """x [E, T_max, H] with NaN padding rows, counts int32 [E], w13 [E, N, H], w2 [E, H, I]."""
    g = torch.Generator().manual_seed(seed)
    N = 2 * I_ if gated else I_
    x = torch.randn(E_, T_max, H_, generator=g) * x_scale
    cnt = torch.tensor(counts, dtype=torch.int32)
    pad = torch.arange(T_max)[None, :] >= cnt[:, None]
    x[pad] = float("nan")                                   # must never leak into valid rows
    w13 = torch.randn(E_, N, H_, generator=g) / H_ ** 0.5
    w2 = torch.randn(E_, H_, I_, generator=g) / I_ ** 0.5
    b13 = torch.randn(E_, N, generator=g) if bias else None
    b2 = torch.randn(E_, H_, generator=g) if bias else None
    to = lambda t: None if t is None else t.to(dtype).to(DEVICE)  # noqa: E731
    return to(x), cnt.to(DEVICE), to(w13), to(w2), to(b13), to(b2)


def sentinel_out(shape, dtype):
    return torch.full(shape, SENTINEL, dtype=dtype, device=DEVICE)


def check(out, want, counts, dtype):
    """Valid rows close to the reference (relative to its max); padding rows untouched."""
    for e, c in enumerate(counts.tolist()):
        got = out[e, :c].float().cpu()
        ref = want[e, :c]
        assert not got.isnan().any(), f"NaN in valid rows of expert {e}"
        if c:
            err = (got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)
            assert err <= TOL[dtype], f"expert {e}: relative error {err:.2e} > {TOL[dtype]:.0e}"
        assert (out[e, c:].float() == SENTINEL).all(), f"expert {e}: a padding row was written"


# ----------------------------------------------------------------------------- GEMM1 + activation
ACTS = [  # (activation, swiglu_limit)
    ("silu", None), ("silu", 1.5), ("gelu", None), ("gelu_tanh", None), ("swigluoai", None),
    ("relu2_no_mul", None), ("silu_no_mul", None), ("gelu_no_mul", None),
]


@pytest.mark.parametrize("activation,swiglu_limit", ACTS)
@pytest.mark.parametrize("bias", [False, True])
def test_gemm1_activations(activation, swiglu_limit, bias):
    gated = not activation.endswith("_no_mul")
    # x_scale 4: |gate| and |up| well past swiglu_limit 1.5 and swigluoai's limit 7
    x, counts, w13, _, b13, _ = make_inputs(gated=gated, bias=bias, x_scale=4.0)
    out = sentinel_out((E, T_MAX, I), torch.float16)
    batched_gemm1_act(x, counts, w13, activation, out, bias=b13, swiglu_limit=swiglu_limit, config=SMALL)
    want = batched_gemm1_act_ref(x, counts, w13, activation, bias=b13, swiglu_limit=swiglu_limit)
    check(out, want, counts, torch.float16)


def test_gemm1_gate_up_asymmetry():
    # swapping the gate and up halves of w13 changes silu(g) * u: the kernel must tell them apart
    x, counts, w13, *_ = make_inputs(x_scale=2.0)
    swapped = torch.cat([w13[:, I:], w13[:, :I]], dim=1)
    h = batched_gemm1_act(x, counts, w13, "silu", config=SMALL)
    h_sw = batched_gemm1_act(x, counts, swapped, "silu", config=SMALL)
    ref = batched_gemm1_act_ref(x, counts, w13, "silu")
    ref_sw = batched_gemm1_act_ref(x, counts, swapped, "silu")
    for e, c in enumerate(COUNTS):
        torch.testing.assert_close(h[e, :c].float().cpu(), ref[e, :c], rtol=4e-3, atol=4e-3)
        torch.testing.assert_close(h_sw[e, :c].float().cpu(), ref_sw[e, :c], rtol=4e-3, atol=4e-3)
    assert (ref - ref_sw).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("cfg", [
    dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16),    # many tiles, 5 K steps
    dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64),    # one tile covers N, ragged K
])
def test_gemm1_gemm2_configs_and_dtypes(dtype, cfg):
    x, counts, w13, w2, b13, b2 = make_inputs(dtype, bias=True)
    h = sentinel_out((E, T_MAX, I), dtype)
    batched_gemm1_act(x, counts, w13, "silu", h, bias=b13, config=cfg)
    check(h, batched_gemm1_act_ref(x, counts, w13, "silu", bias=b13), counts, dtype)
    y = sentinel_out((E, T_MAX, H), dtype)
    batched_gemm2(h, counts, w2, y, bias=b2, config=cfg)
    check(y, batched_gemm2_ref(h, counts, w2, bias=b2), counts, dtype)


def test_counts_edge_cases():
    # every expert empty: nothing written; every expert full (count == T_max)
    x, counts, w13, w2, *_ = make_inputs(counts=[0, 0, 0, 0])
    h = sentinel_out((E, T_MAX, I), torch.float16)
    batched_gemm1_act(x, counts, w13, "silu", h, config=SMALL)
    assert (h.float() == SENTINEL).all()
    x, counts, w13, w2, *_ = make_inputs(counts=[T_MAX] * E, seed=1)
    h = batched_gemm1_act(x, counts, w13, "gelu", config=SMALL)
    y = batched_gemm2(h, counts, w2, config=SMALL)
    assert h.dtype == torch.float16 and y.shape == (E, T_MAX, H)
    torch.testing.assert_close(y.float().cpu(), batched_gemm2_ref(h, counts, w2), rtol=4e-3, atol=4e-3)


def test_single_row_expert_and_single_expert():
    x, counts, w13, w2, *_ = make_inputs(counts=[1], E_=1, T_max=1, seed=2)
    h = batched_gemm1_act(x, counts, w13, "swigluoai", config=SMALL)
    torch.testing.assert_close(h.float().cpu(), batched_gemm1_act_ref(x, counts, w13, "swigluoai"),
                               rtol=4e-3, atol=4e-3)


# ----------------------------------------------------------------------------- scale modes
def int_valued(shape, lo, hi, dtype, seed):
    """Small integers: exact in fp16 and fp8, exact products and sums in the fp32 accumulator,
    so scale math is tested without rounding noise."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).to(dtype).to(DEVICE)


def pow2_scales(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (2.0 ** torch.randint(-4, 3, shape, generator=g)).float().to(DEVICE)


def scale_case(mode, dtype, gated=True, a_per_expert=False, block=(16, 64), seed=0):
    """Operands of ``dtype`` (integer values) and scales for ``mode``, for GEMM1 (K = H)."""
    N = 2 * I if gated else I
    x = int_valued((E, T_MAX, H), -4, 5, dtype, seed)
    w = int_valued((E, N, H), -3, 4, dtype, seed + 1)
    bn, bk = block
    if mode == "tensor":
        a_s = pow2_scales((E,) if a_per_expert else (1,), seed + 2)
        b_s = pow2_scales((E,), seed + 3)
    elif mode == "channel":
        a_s = pow2_scales((E, T_MAX, 1), seed + 2)
        b_s = pow2_scales((E, N), seed + 3)
    else:
        a_s = pow2_scales((E, T_MAX, -(-H // bk)), seed + 2)
        b_s = pow2_scales((E, -(-N // bn), -(-H // bk)), seed + 3)
    return x, w, a_s, b_s


@pytest.mark.parametrize("mode,a_per_expert", [("tensor", False), ("tensor", True), ("channel", False),
                                               ("block", False)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.int8])
def test_gemm1_scale_modes(mode, a_per_expert, dtype):
    # block (16, 64) with H = 72: a partial last K block, two K steps (BK = 32; tl.dot needs
    # K >= 32 for 1-byte operands) per block; 2I = 80 rows: gate/up straddle row blocks
    block = (16, 64)
    x, w, a_s, b_s = scale_case(mode, dtype, a_per_expert=a_per_expert, block=block)
    counts = torch.tensor(COUNTS, dtype=torch.int32, device=DEVICE)
    mode_block = block if mode == "block" else None
    out = sentinel_out((E, T_MAX, I), torch.float32)
    batched_gemm1_act(x, counts, w, "silu", out, a_scale=a_s, b_scale=b_s, scale_mode=mode,
                      block_shape=mode_block, config=SMALL)
    want = batched_gemm1_act_ref(x, counts, w, "silu", a_scale=a_s, b_scale=b_s, scale_mode=mode,
                                 block_shape=block)
    check(out, want, counts, torch.float32)
    if mode in ("channel", "block"):   # the same scales flattened to [E * T_max, 1 or K/bk]
        flat = batched_gemm1_act(x, counts, w, "silu", a_scale=a_s.reshape(E * T_MAX, -1), b_scale=b_s,
                                 scale_mode=mode, block_shape=mode_block,
                                 config=SMALL, out=sentinel_out((E, T_MAX, I), torch.float32))
        assert torch.equal(flat, out)


@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
def test_gemm2_scale_modes_fp8(mode):
    # GEMM2 (K = I = 40) with real fp8 operands from the reference quantizers, bf16-free output
    counts = torch.tensor(COUNTS, dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(7)
    h = torch.randn(E, T_MAX, I, generator=g)
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    if mode == "tensor":
        hq, hs = rq.quant_fp8_tensor(h.reshape(-1, I))
        wd = rq.quantize_weight(w2, "fp8_tensor")
        block = None
    elif mode == "channel":
        hq, hs = rq.quant_fp8_token(h.reshape(-1, I))
        hs = hs.reshape(E, T_MAX, 1)
        wd = rq.quantize_weight(w2, "fp8_channel")
        block = None
    else:
        hq, hs = rq.quant_fp8_group(h.reshape(-1, I), 32)      # I = 40: groups of 32 + 8
        hs = hs.reshape(E, T_MAX, -1)
        wd = rq.quantize_weight(w2, QuantScheme("fp8_block", block_shape=(16, 32)))
        block = (16, 32)
    hq = hq.reshape(E, T_MAX, I).to(DEVICE)
    out = sentinel_out((E, T_MAX, H), torch.float32)
    batched_gemm2(hq, counts, wd["w"].to(DEVICE), out, a_scale=hs.to(DEVICE), b_scale=wd["scale"].to(DEVICE),
                  scale_mode=mode, block_shape=block, config=SMALL)
    want = batched_gemm2_ref(hq, counts, wd["w"].to(DEVICE), a_scale=hs.to(DEVICE),
                             b_scale=wd["scale"].to(DEVICE), scale_mode=mode, block_shape=block)
    check(out, want, counts, torch.float32)


def test_default_config():
    for T_max in (1, 16, 64, 512):
        for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float32):
            cfg = default_batched_config(T_max, 8, 4096, 7168, dtype)
            assert set(cfg) == {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps", "num_stages"}
    assert 128 % default_batched_config(64, 8, 4096, 7168, torch.float8_e4m3fn, block_shape=(128, 128))[
        "BLOCK_SIZE_K"] == 0
    assert default_batched_config(64, 8, 4096, 7168, torch.float8_e4m3fn, block_shape=(128, 32))[
        "BLOCK_SIZE_K"] == 32


# ----------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("activation", ["silu", "swigluoai", "gelu_tanh", "relu2_no_mul"])
def test_gpu_bf16_model_sized(activation):
    E_, T_max, H_, I_ = 8, 256, 2048, 768              # Qwen3-30B-A3B-like, 8 local experts
    counts = [0, 1, 17, 256, 100, 255, 64, 129]
    gated = not activation.endswith("_no_mul")
    x, cnt, w13, w2, b13, b2 = make_inputs(torch.bfloat16, gated, counts, T_max, H_, I_, E_, bias=True)
    cfg = default_batched_config(T_max, E_, w13.shape[1], H_, torch.bfloat16)
    h = sentinel_out((E_, T_max, I_), torch.bfloat16)
    batched_gemm1_act(x, cnt, w13, activation, h, bias=b13, config=cfg)
    check(h, batched_gemm1_act_ref(x, cnt, w13, activation, bias=b13), cnt, torch.bfloat16)
    y = sentinel_out((E_, T_max, H_), torch.bfloat16)
    batched_gemm2(h, cnt, w2, y, bias=b2, config=default_batched_config(T_max, E_, H_, I_, torch.bfloat16))
    check(y, batched_gemm2_ref(h, cnt, w2, bias=b2), cnt, torch.bfloat16)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("scheme", ["fp8_tensor", "fp8_channel", "fp8_block", "int8_channel"])
@pytest.mark.parametrize("T_max", [8, 192])
def test_gpu_quantized_pipeline(scheme, T_max):
    # quantize (the Triton quantizers) -> GEMM1 + silu -> requantize (act_and_quant-free: the
    # reference quantizer on the bf16 h) -> GEMM2, each GEMM against the reference loop
    from fusedmoe.kernels import quantize as kq
    E_, H_, I_ = 4, 1024, 512
    counts = [T_max, 0, T_max // 2 + 1, 3]
    x, cnt, w13, w2, _, _ = make_inputs(torch.bfloat16, True, counts, T_max, H_, I_, E_, seed=3)
    x = torch.nan_to_num(x, nan=0.0)
    block = (128, 128) if scheme == "fp8_block" else None
    wq13 = rq.quantize_weight(w13.float(), QuantScheme(scheme) if scheme != "fp8_block" else
                              QuantScheme("fp8_block", block_shape=block))
    flat = x.reshape(-1, H_)
    if scheme == "fp8_tensor":
        xq, xs = kq.quant_fp8_tensor(flat)
        mode = "tensor"
    elif scheme == "fp8_channel":
        xq, xs = kq.quant_fp8_token(flat)
        xs, mode = xs.reshape(E_, T_max, 1), "channel"
    elif scheme == "int8_channel":
        xq, xs = kq.quant_int8_token(flat)
        xs, mode = xs.reshape(E_, T_max, 1), "channel"
    else:
        xq, xs = kq.quant_fp8_group(flat, 128)
        xs, mode = xs.reshape(E_, T_max, -1), "block"
    xq = xq.reshape(E_, T_max, H_)
    cfg = default_batched_config(T_max, E_, 2 * I_, H_, xq.dtype, block_shape=block)
    h = sentinel_out((E_, T_max, I_), torch.bfloat16)
    batched_gemm1_act(xq, cnt, wq13["w"], "silu", h, a_scale=xs, b_scale=wq13["scale"], scale_mode=mode,
                      block_shape=block, config=cfg)
    want = batched_gemm1_act_ref(xq, cnt, wq13["w"], "silu", a_scale=xs, b_scale=wq13["scale"],
                                 scale_mode=mode, block_shape=block)
    check(h, want, cnt, torch.bfloat16)


# ----------------------------------------------------------------------------- references
def _dequant_act(x: torch.Tensor, a_scale, mode: str, block_shape) -> torch.Tensor:
    """x [E, T_max, K] -> fp32 with its scale applied (see the batched_gemm docstring)."""
    xf = x.float().cpu()
    if mode == "none" or a_scale is None:
        return xf
    s = a_scale.float().cpu()
    if mode == "tensor":
        return xf * (s.reshape(-1, 1, 1) if s.numel() > 1 else s.reshape(1, 1, 1))
    if mode == "channel":
        return xf * (s if s.dim() == 3 else s.reshape(1, 1, 1))
    bk = block_shape[1]
    return xf * s.repeat_interleave(bk, dim=2)[:, :, : xf.shape[2]]


def _dequant_weight(w: torch.Tensor, b_scale, mode: str, block_shape) -> torch.Tensor:
    """w [E, N, K] -> fp32 with its scale applied."""
    wf = w.float().cpu()
    if mode == "none" or b_scale is None:
        return wf
    s = b_scale.float().cpu()
    if mode == "tensor":
        return wf * s.reshape(-1, 1, 1)
    if mode == "channel":
        return wf * s.unsqueeze(-1)
    bn, bk = block_shape
    full = s.repeat_interleave(bn, dim=1)[:, : wf.shape[1]].repeat_interleave(bk, dim=2)[:, :, : wf.shape[2]]
    return wf * full


def batched_gemm1_act_ref(x, counts, w13, activation, *, bias=None, swiglu_limit: Optional[float] = None,
                          alpha=1.702, limit=7.0, a_scale=None, b_scale=None, scale_mode="none",
                          block_shape=None) -> torch.Tensor:
    """fp32 [E, T_max, I] on the CPU: act(x[e, :c] @ w13[e]^T + b[e]) per expert, zeros past c."""
    xf = _dequant_act(x, a_scale, scale_mode, block_shape)
    wf = _dequant_weight(w13, b_scale, scale_mode, block_shape)
    gated = not str(activation).endswith("_no_mul")
    E_, T_max, _ = xf.shape
    I_ = wf.shape[1] // 2 if gated else wf.shape[1]
    out = torch.zeros(E_, T_max, I_)
    for e, c in enumerate(counts.tolist()):
        if c == 0:
            continue
        g = xf[e, :c] @ wf[e].T                                          # [c, N]
        if bias is not None:
            g = g + bias[e].float().cpu()
        out[e, :c] = apply_activation(g, activation, swiglu_limit=swiglu_limit, alpha=alpha, limit=limit,
                                      layout=GateUpLayout.HALVES)
    return out


def batched_gemm2_ref(h, counts, w2, *, bias=None, a_scale=None, b_scale=None, scale_mode="none",
                      block_shape=None) -> torch.Tensor:
    """fp32 [E, T_max, H] on the CPU: h[e, :c] @ w2[e]^T + b[e] per expert, zeros past c."""
    hf = _dequant_act(h, a_scale, scale_mode, block_shape)
    wf = _dequant_weight(w2, b_scale, scale_mode, block_shape)
    E_, T_max, _ = hf.shape
    out = torch.zeros(E_, T_max, wf.shape[1])
    for e, c in enumerate(counts.tolist()):
        if c:
            out[e, :c] = hf[e, :c] @ wf[e].T + (bias[e].float().cpu() if bias is not None else 0.0)
    return out
