"""Tests of fusedmoe.reference.quant (the ground truth) and fusedmoe.quantize (public helpers).

Legend: E experts, out GEMM output rows, K reduction dim, T tokens, H hidden, I intermediate.
Round-trip errors are relative Frobenius errors ||dq(q(w)) - w|| / ||w|| on N(0, 1) data.
"""
from __future__ import annotations

import math

import pytest
import torch

from fusedmoe.config import MoEConfig, QuantScheme
from fusedmoe.errors import ConfigError, ConfigTypeError, FusedMoEError, InputError
from fusedmoe.quantize import (dequantize_experts, from_deepseek_fp8, from_fused_gate_up, from_per_expert,
                               from_quantized_per_expert, quantize_experts)
from fusedmoe.reference import quant as Q
from fusedmoe.weights import ExpertWeights

NAN, INF = float("nan"), float("inf")

ALL_SCHEMES = ["none", "fp8_tensor", "fp8_tensor:static", "fp8_channel", "fp8_block", "int8_channel",
               "int8_w8a16", "int8_w8a16:g64", "int8_w8a16:g128:zp", "int4_w4a16", "int4_w4a16:g32",
               "int4_w4a16:g64:zp", "fp8_w8a16", "nvfp4", "mxfp4"]
WEIGHT_SCHEMES = [s for s in ALL_SCHEMES if s not in ("none", "fp8_tensor:static")]

# Bound on the relative Frobenius round-trip error of N(0,1) weights [2, 256, 512], and why.
WEIGHT_BOUNDS = {
    # e4m3 keeps 3 mantissa bits: rounding error is uniform in +-half an ulp (<= 2^-4 of the
    # value), rms ~ 2^-3 / sqrt(12) / 1.4 (mean mantissa) ~ 2.6%; the scale granularity hardly matters.
    "fp8_tensor": 0.035, "fp8_channel": 0.035, "fp8_block": 0.035, "fp8_w8a16": 0.035,
    # int8 per row of K=512: step amax/127 with amax ~ 3.3 sigma -> rms error 3.3/127/sqrt(12) ~ 0.75%.
    "int8_channel": 0.012, "int8_w8a16": 0.012,
    # int8 groups of 64: amax ~ 2.4 sigma -> ~0.55%; asym g128: step (max-min)/255 ~ 5.6/255/sqrt(12) ~ 0.63%.
    "int8_w8a16:g64": 0.01, "int8_w8a16:g128:zp": 0.01,
    # int4 sym g128: step amax/7 with amax(128 gaussians) ~ 2.9 sigma -> 2.9/7/sqrt(12) ~ 12%.
    "int4_w4a16": 0.135,
    # int4 g32: amax(32 gaussians) ~ 2.2 sigma -> 2.2/7/sqrt(12) ~ 9%.
    "int4_w4a16:g32": 0.11,
    # int4 asym g64: step (max-min)/15 with range ~ 4.8 sigma -> 4.8/15/sqrt(12) ~ 9.2%.
    "int4_w4a16:g64:zp": 0.11,
    # nvfp4: e2m1 has one mantissa bit (spacing 1/4..1/3 of the value near the top of the
    # grid), 16-element blocks scaled to amax -> 6 through an e4m3 scale: ~9.5% measured.
    "nvfp4": 0.11,
    # mxfp4: same grid, but a power-of-two scale puts the block amax anywhere in [4, 8) of the
    # grid (values above 6 clip), losing up to one bit of range versus nvfp4: ~11.5% measured.
    "mxfp4": 0.135,
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _scale_shapes(scheme: str, E: int, out: int, K: int) -> dict:
    """Expected (shape, dtype) of scale / zero / global_scale, straight from the fusedmoe.weights table."""
    s = QuantScheme.parse(scheme)
    m = s.method.value
    f32 = torch.float32
    if m in ("fp8_tensor",):
        return {"scale": ((E,), f32)}
    if m in ("fp8_channel", "int8_channel", "fp8_w8a16") or (m == "int8_w8a16" and s.group_size is None):
        return {"scale": ((E, out), f32)}
    if m == "fp8_block":
        bn, bk = s.block_shape
        return {"scale": ((E, math.ceil(out / bn), math.ceil(K / bk)), f32)}
    if m == "nvfp4":
        return {"scale": ((E, out, K // 16), torch.float8_e4m3fn), "global_scale": ((E,), f32)}
    if m == "mxfp4":
        return {"scale": ((E, out, K // 32), torch.uint8)}
    d = {"scale": ((E, out, K // s.group_size), f32)}
    if s.has_zero_point:
        d["zero"] = ((E, out, K // s.group_size), torch.uint8)
    return d


# ============================================================================ bit-level formats
def test_e2m1_grid_codes_exact():
    grid = torch.tensor(Q.E2M1_GRID)
    assert Q.float_to_e2m1(grid).tolist() == list(range(8))
    assert Q.float_to_e2m1(-grid[1:]).tolist() == [8 + i for i in range(1, 8)]
    # every code decodes and re-encodes to itself (code 8 is -0.0)
    codes = torch.arange(16, dtype=torch.uint8)
    vals = Q.e2m1_to_float(codes)
    assert vals.tolist() == list(Q.E2M1_GRID) + [-v for v in Q.E2M1_GRID]
    assert torch.equal(Q.float_to_e2m1(vals), codes)


def test_e2m1_rounding_ties_to_even_code_and_saturation():
    # midpoint -> even code: 0.25->0 (code 0), 0.75->1.0 (2), 1.25->1.0 (2), 1.75->2.0 (4),
    # 2.5->2.0 (4), 3.5->4.0 (6), 5.0->4.0 (6)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert Q.float_to_e2m1(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert Q.float_to_e2m1(-ties).tolist() == [8, 10, 10, 12, 12, 14, 14]
    # off-midpoint: nearest
    assert Q.float_to_e2m1(torch.tensor([0.26, 0.74, 2.6, 4.9, 5.1])).tolist() == [1, 1, 5, 6, 7]
    # saturation at +-6, Inf included; NaN -> 0x7 (documented); sign copied (-0.1 -> "-0")
    assert Q.float_to_e2m1(torch.tensor([6.5, 100.0, INF, -7.0, -INF, NAN, -0.1])).tolist() == [7, 7, 7, 15, 15, 7, 8]


def test_pack_uint4_nibble_order():
    assert Q.pack_uint4(torch.tensor([1, 2], dtype=torch.uint8)).tolist() == [0x21]   # even k = low nibble
    assert Q.pack_uint4(torch.tensor([[15, 0, 3, 12]], dtype=torch.uint8)).tolist() == [[0x0F, 0xC3]]
    q = torch.randint(0, 16, (3, 5, 64), generator=_gen(1), dtype=torch.uint8)
    p = Q.pack_uint4(q)
    assert p.shape == (3, 5, 32) and p.dtype == torch.uint8
    assert torch.equal(Q.unpack_uint4(p), q)


def test_pack_uint4_errors_name_parameter():
    with pytest.raises(InputError, match=r"q\.shape\[-1\]"):
        Q.pack_uint4(torch.tensor([1, 2, 3], dtype=torch.uint8))   # odd K
    with pytest.raises(InputError, match="q"):
        Q.pack_uint4(torch.tensor([1, 16], dtype=torch.uint8))     # not 4-bit
    with pytest.raises(InputError, match=r"q\.dtype"):
        Q.pack_uint4(torch.tensor([1, 2], dtype=torch.int32))


def test_e8m0_known_values():
    s = torch.tensor([1.0, 2.0, 0.5, 2.0 ** -127, 3.0, 0.75, 2.0 ** 127, 0.0, 2.0 ** -140, NAN, INF, -1.0])
    assert Q.float_to_e8m0(s).tolist() == [127, 128, 126, 0, 129, 127, 254, 0, 0, 255, 255, 255]
    u = torch.arange(255, dtype=torch.uint8)
    f = Q.e8m0_to_float(u)
    assert f.tolist() == [2.0 ** (i - 127) for i in range(255)]      # exact, 2**-127 is subnormal
    assert torch.equal(Q.float_to_e8m0(f), u)
    assert math.isnan(Q.e8m0_to_float(torch.tensor([255], dtype=torch.uint8)).item())


# ============================================================================ activations
def test_activation_quant_shapes_dtypes_and_error():
    x = _randn(37, 300, seed=2, dtype=torch.bfloat16) * 3
    q, s = Q.quant_fp8_tensor(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and s.shape == (1,) and s.dtype == torch.float32
    assert _rel(Q.dequant_fp8_tensor(q, s), x) < 0.035     # e4m3 rounding (see WEIGHT_BOUNDS)
    q, s = Q.quant_fp8_token(x)
    assert s.shape == (37, 1) and _rel(Q.dequant_fp8_token(q, s), x) < 0.035
    q, s = Q.quant_fp8_group(x, 128)                        # K=300: groups 128, 128, 44 (partial)
    assert s.shape == (37, 3) and _rel(Q.dequant_fp8_group(q, s, 128), x) < 0.035
    torch.testing.assert_close(s[:, 2], x.float()[:, 256:].abs().amax(-1) / 448)
    q, s = Q.quant_int8_token(x)
    assert q.dtype == torch.int8 and s.shape == (37, 1)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert _rel(Q.dequant_int8_token(q, s), x) < 0.012     # int8 per row (see WEIGHT_BOUNDS)


def test_fp8_group_pow2_scales_are_powers_of_two_and_cover_amax():
    x = _randn(8, 256, seed=3) * 5
    q, s = Q.quant_fp8_group(x, 128, pow2=True)
    m, _ = torch.frexp(s)
    assert torch.all(m == 0.5)                                            # powers of two
    amax = x.abs().unflatten(-1, (2, 128)).amax(-1)
    assert torch.all(s >= amax / 448) and torch.all(s < 2 * amax / 448)  # rounded UP, by < 2x
    # pow2 uses less of the fp8 range: error stays at the e4m3 level, bound as above
    assert _rel(Q.dequant_fp8_group(q, s, 128), x) < 0.035


def test_int8_rounds_half_to_even():
    # amax 127 -> scale 1: x/scale = 0.5, 1.5, 2.5, -0.5, -2.5 round to 0, 2, 2, -0, -2
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -2.5, 127.0]])
    q, s = Q.quant_int8_token(x)
    assert s.item() == 1.0 and q.tolist() == [[0, 2, 2, 0, -2, 127]]


def test_fp8_static_scale_and_zero_input():
    x = _randn(4, 64, seed=4)
    q, s = Q.quant_fp8_tensor(x, scale=0.01)                # saturates |x| > 4.48 at 448
    assert s.shape == (1,) and s.item() == pytest.approx(0.01)
    torch.testing.assert_close(Q.dequant_fp8_tensor(q, s), x.clamp(-4.48, 4.48), rtol=0.07, atol=1e-3)
    z = torch.zeros(3, 32)                                  # all-zero input: floored scale, zero output
    for fn in (Q.quant_fp8_tensor, Q.quant_fp8_token, Q.quant_int8_token):
        q, s = fn(z)
        assert torch.all(s > 0) and torch.all(q.float() == 0)
    p, bs, gs = Q.quant_nvfp4(torch.zeros(2, 32))
    assert torch.all(Q.dequant_nvfp4(p, bs, gs) == 0)


def test_nvfp4_activation():
    x = _randn(16, 256, seed=5) * 2
    p, bs, gs = Q.quant_nvfp4(x)
    assert p.shape == (16, 128) and p.dtype == torch.uint8
    assert bs.shape == (16, 16) and bs.dtype == torch.float8_e4m3fn and gs.shape == (1,)
    torch.testing.assert_close(gs, x.abs().max().reshape(1) / (448 * 6))
    assert bs.float().max().item() == 448.0                 # the block holding amax uses the full e4m3 range
    assert _rel(Q.dequant_nvfp4(p, bs, gs), x) < 0.11       # see WEIGHT_BOUNDS["nvfp4"]
    with pytest.raises(InputError, match=r"x\.shape\[-1\]"):
        Q.quant_nvfp4(_randn(2, 24, seed=5))


@pytest.mark.parametrize("scheme", ALL_SCHEMES + ["fp8_block:pow2"])
def test_fake_quant_activation(scheme):
    x = _randn(9, 256, seed=6, dtype=torch.bfloat16)
    s = QuantScheme.parse(scheme)
    static = 0.02 if s.static_activation_scale else None
    y = Q.fake_quant_activation(x, scheme, static_scale=static)
    assert y.dtype == torch.float32 and y.shape == x.shape
    if not s.method.quantizes_activations:
        assert torch.equal(y, x.float())                    # weight-only and 'none': identity
    else:
        bound = 0.11 if s.method.value == "nvfp4" else 0.035
        assert 0 < _rel(y, x) < bound


@pytest.mark.parametrize("scheme", ["fp8_tensor", "fp8_channel", "fp8_block", "int8_channel", "nvfp4"])
def test_fake_quant_activation_no_tokens(scheme):
    # an expert that receives no token quantizes an empty [0, K] input
    y = Q.fake_quant_activation(torch.empty(0, 256), scheme)
    assert y.shape == (0, 256) and y.dtype == torch.float32


def test_fake_quant_activation_matches_quantizers():
    x = _randn(5, 256, seed=7)
    torch.testing.assert_close(Q.fake_quant_activation(x, "fp8_tensor"), Q.dequant_fp8_tensor(*Q.quant_fp8_tensor(x)))
    q, s = Q.quant_fp8_group(x, 64, pow2=True)
    scheme = QuantScheme("fp8_block", block_shape=(128, 64), scale_pow2=True)
    torch.testing.assert_close(Q.fake_quant_activation(x, scheme), Q.dequant_fp8_group(q, s, 64))
    with pytest.raises(InputError, match="static_scale"):
        Q.fake_quant_activation(x, "fp8_tensor:static")
    with pytest.raises(InputError, match="static_scale"):
        Q.fake_quant_activation(x, "fp8_channel", static_scale=0.1)


# ============================================================================ NaN / Inf policy
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_activation_nonfinite_propagates(bad):
    x = _randn(4, 256, seed=8)
    x[1, 130] = bad
    # per-token: row 1 all NaN, other rows finite
    for scheme in ("fp8_channel", "int8_channel"):
        y = Q.fake_quant_activation(x, scheme)
        assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2, 3]]).all(), scheme
    # 1 x 128 groups: only (row 1, group 1) is NaN
    y = Q.fake_quant_activation(x, "fp8_block")
    assert torch.isnan(y[1, 128:]).all() and torch.isfinite(y[1, :128]).all() and torch.isfinite(y[[0, 2, 3]]).all()
    # per-tensor / global scale: everything NaN
    for scheme in ("fp8_tensor", "nvfp4"):
        assert torch.isnan(Q.fake_quant_activation(x, scheme)).all(), scheme
    # static scale: the bad element itself becomes NaN (torch alone would saturate Inf to 448)
    y = Q.fake_quant_activation(x, "fp8_tensor:static", static_scale=0.01)
    assert torch.isnan(y[1, 130]) and torch.isnan(y).sum() == 1
    # nvfp4 with a given global scale: the 16-block holding it is NaN
    y = Q.dequant_nvfp4(*Q.quant_nvfp4(x, global_scale=0.002))
    assert torch.isnan(y[1, 128:144]).all() and torch.isnan(y).sum() == 16


@pytest.mark.parametrize("scheme", WEIGHT_SCHEMES)
@pytest.mark.parametrize("bad", [NAN, INF])
def test_weight_nonfinite_propagates(scheme, bad):
    w = _randn(2, 64, 256, seed=9)
    w[1, 3, 70] = bad
    r = Q.quantize_weight(w, scheme)
    d = Q.dequantize_weight(r["w"], scheme, r["scale"], r["zero"], r["global_scale"])
    assert torch.isnan(d[1, 3, 70]), scheme
    assert torch.isfinite(d[0]).all(), scheme                # other experts untouched


# ============================================================================ weights
@pytest.mark.parametrize("scheme", WEIGHT_SCHEMES)
def test_weight_round_trip_and_layout(scheme):
    E, out, K = 2, 256, 512
    w = _randn(E, out, K, seed=10, dtype=torch.bfloat16)
    r = Q.quantize_weight(w, scheme)
    s = QuantScheme.parse(scheme)
    packed = s.method.weight_bits == 4
    assert tuple(r["w"].shape) == (E, out, K // 2 if packed else K)
    for key, (shape, dtype) in _scale_shapes(scheme, E, out, K).items():
        assert tuple(r[key].shape) == shape and r[key].dtype == dtype, key
    for key in {"scale", "zero", "global_scale"} - set(_scale_shapes(scheme, E, out, K)):
        assert r[key] is None, key
    d = Q.dequantize_weight(r["w"], scheme, r["scale"], r["zero"], r["global_scale"])
    assert d.shape == (E, out, K) and d.dtype == torch.float32
    err = _rel(d, w)
    assert 0 < err < WEIGHT_BOUNDS[scheme], err


def test_fp8_block_partial_edge_blocks():
    w = _randn(2, 200, 300, seed=11)                       # 200 = 128 + 72 rows, 300 = 2*128 + 44 cols
    r = Q.quantize_weight(w, "fp8_block")
    assert r["scale"].shape == (2, 2, 3)
    torch.testing.assert_close(r["scale"][:, 1, 2], w[:, 128:, 256:].abs().amax((1, 2)) / 448)
    assert _rel(Q.dequantize_weight(r["w"], "fp8_block", r["scale"]), w) < 0.035


def test_int4_exact_values():
    # symmetric: a group with amax 7 -> scale 1, q = w + 8, dequant exact
    g = torch.arange(-7.0, 9.0)[:16].repeat(2)             # [-7..8]: 8 clamps to q=15 -> 7
    w = torch.cat([g.clamp(max=7), _randn(96, seed=12)]).reshape(1, 1, 128)
    r = Q.quantize_weight(w, "int4_w4a16:g32")
    assert r["scale"][0, 0, 0].item() == 1.0
    q = Q.unpack_uint4(r["w"])[0, 0, :32]
    assert q.tolist() == [int(v) + 8 for v in g.clamp(max=7).tolist()]
    # zero point: group with min -1, max 14 -> scale 1, zero 1, q = w + 1
    v = torch.tensor([-1.0, 14.0] + [float(i % 15) - 1 for i in range(30)])
    w = torch.cat([v, _randn(96, seed=13)]).reshape(1, 1, 128)
    r = Q.quantize_weight(w, "int4_w4a16:g32:zp")
    assert r["scale"][0, 0, 0].item() == 1.0 and r["zero"][0, 0, 0].item() == 1
    assert Q.unpack_uint4(r["w"])[0, 0, :32].tolist() == [int(x) + 1 for x in v.tolist()]
    d = Q.dequantize_weight(r["w"], "int4_w4a16:g32:zp", r["scale"], r["zero"])
    assert torch.equal(d[0, 0, :32], v)


def test_int8_w8a16_zero_point_storage():
    # group [-1, 254]: scale (254 + 1)/255 = 1, zero 1, q = w + 1 in 0..255, stored int8 q - 128
    v = torch.tensor([-1.0, 254.0] + [float(i) for i in range(62)])
    w = torch.cat([v, _randn(64, seed=14)]).reshape(1, 1, 128)
    r = Q.quantize_weight(w, "int8_w8a16:g64:zp")
    assert r["w"].dtype == torch.int8 and r["zero"].dtype == torch.uint8
    assert r["scale"][0, 0, 0].item() == 1.0 and r["zero"][0, 0, 0].item() == 1
    assert r["w"][0, 0, :64].tolist() == [int(x) + 1 - 128 for x in v.tolist()]
    d = Q.dequantize_weight(r["w"], "int8_w8a16:g64:zp", r["scale"], r["zero"])
    assert torch.equal(d[0, 0, :64], v)


def test_mxfp4_shared_exponent():
    # block amax 6 -> floor(log2 6) - 2 = 0 -> e8m0 127, grid values exact;
    # block amax 7 -> same exponent, 7 clips to 6 (OCP rule); amax 8 -> exponent 1 (scale 2)
    grid = torch.tensor(Q.E2M1_GRID)
    b0 = torch.cat([grid, -grid]).repeat(2)                                   # amax 6
    b1 = b0.clone()
    b1[0] = 7.0                                                               # amax 7
    b2 = b0 * 4 / 3                                                           # amax 8
    w = torch.cat([b0, b1, b2]).reshape(1, 1, 96)
    r = Q.quantize_weight(w, "mxfp4")
    assert r["scale"].tolist() == [[[127, 127, 128]]]
    d = Q.dequantize_weight(r["w"], "mxfp4", r["scale"])
    assert torch.equal(d[0, 0, :32], b0) and d[0, 0, 32].item() == 6.0


def test_nvfp4_weight_global_scale():
    w = _randn(3, 32, 64, seed=15) * torch.tensor([1.0, 10.0, 0.01]).reshape(3, 1, 1)
    r = Q.quantize_weight(w, "nvfp4")
    torch.testing.assert_close(r["global_scale"], w.abs().amax((1, 2)) / (448 * 6))
    d = Q.dequantize_weight(r["w"], "nvfp4", r["scale"], global_scale=r["global_scale"])
    for e in range(3):                                     # scale-invariant per expert
        assert _rel(d[e], w[e]) < 0.11


def test_quantize_weight_errors_name_parameter():
    with pytest.raises(InputError, match=r"w\.shape\[2\]"):
        Q.quantize_weight(_randn(1, 4, 96, seed=16), "int4_w4a16")          # 96 % 128
    with pytest.raises(InputError, match=r"w\.shape\[2\]"):
        Q.quantize_weight(_randn(1, 4, 40, seed=16), "mxfp4")               # 40 % 32
    with pytest.raises(InputError, match=r"w\.shape"):
        Q.quantize_weight(_randn(4, 64, seed=16), "fp8_channel")            # 2-D
    with pytest.raises(InputError, match=r"w\.dtype"):
        Q.quantize_weight(torch.ones(1, 4, 64, dtype=torch.int32), "fp8_channel")
    with pytest.raises(InputError, match="zero"):
        Q.dequantize_weight(torch.zeros(1, 4, 32, dtype=torch.uint8), "int4_w4a16:g64:zp", torch.ones(1, 4, 1))


# ============================================================================ quantize_experts
def _moe(E=4, H=256, I=128, gated=True, seed=20, dtype=torch.bfloat16):
    N = 2 * I if gated else I
    return _randn(E, N, H, seed=seed, dtype=dtype) * 0.05, _randn(E, H, I, seed=seed + 1, dtype=dtype) * 0.05


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_quantize_experts_validates(scheme):
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128)
    w13, w2 = _moe()
    s = QuantScheme.parse(scheme)
    kw = dict(a13_scale=0.01, a2_scale=torch.tensor([0.02])) if s.static_activation_scale else {}
    ew = quantize_experts(w13, w2, scheme, **kw)
    assert isinstance(ew, ExpertWeights) and ew.scheme == s
    ew.validate(cfg)
    d13, d2 = dequantize_experts(ew)
    assert d13.shape == w13.shape and d2.shape == w2.shape and d13.dtype == torch.float32
    if s.method.value == "none":
        assert ew.w13 is w13 and ew.w2 is w2
    else:
        bound = WEIGHT_BOUNDS.get(scheme, 0.035)          # fp8_tensor:static: fp8 bound
        assert _rel(d13, w13) < bound and _rel(d2, w2) < bound


@pytest.mark.parametrize("scheme", ["fp8_block", "int4_w4a16:g64:zp", "nvfp4"])
def test_quantize_experts_non_gated_with_bias(scheme):
    cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=256, intermediate_size=128,
                    activation="relu2_no_mul", has_bias=True)
    w13, w2 = _moe(E=2, gated=False)
    b13, b2 = _randn(2, 128, seed=21), _randn(2, 256, seed=22)
    ew = quantize_experts(w13, w2, scheme, w13_bias=b13, w2_bias=b2)
    ew.validate(cfg)
    assert ew.w13_bias is b13 and ew.w2_bias is b2


def test_quantize_experts_errors_name_parameter():
    w13, w2 = _moe()
    cases = [
        (dict(w13=w13[0]), "w13"),                                   # 2-D
        (dict(w2=w2[:3]), r"w2\.shape\[0\]"),                         # E mismatch
        (dict(w2=w2[:, :128]), r"w2\.shape\[1\]"),                    # H mismatch
        (dict(w13=w13[:, :100]), r"w13\.shape\[1\]"),                 # N neither 2I nor I
        (dict(w13=w13.to(torch.float8_e4m3fn)), r"w13\.dtype"),
        (dict(scheme="fp8_tensor:static"), "a13_scale"),              # static needs input scales
        (dict(scheme="fp8_tensor:static", a13_scale=0.1, a2_scale=-1.0), "a2_scale"),
        (dict(scheme="fp8_channel", a13_scale=0.1), "a13_scale"),     # dynamic scheme takes none
        (dict(w13_bias=_randn(4, 256, seed=23)[:, :10]), "w13_bias"),
        (dict(scheme="int4_w4a16:g128", w2=_randn(4, 256, 64, seed=24), w13=_randn(4, 128, 256, seed=25)),
         r"w2\.shape\[2\]"),                                          # I=64 % g128
        (dict(scheme="int3"), "quant|method"),
    ]
    for changes, pattern in cases:
        kw = dict(w13=w13, w2=w2, scheme="fp8_block")
        kw.update(changes)
        with pytest.raises(FusedMoEError, match=pattern):
            quantize_experts(kw.pop("w13"), kw.pop("w2"), kw.pop("scheme"), **kw)
    with pytest.raises(ConfigTypeError, match="w13"):
        quantize_experts([1, 2], w2, "fp8_block")
    with pytest.raises(ConfigError):                                  # InputError is a ConfigError
        quantize_experts(w13, w2, "mxfp4", a2_scale=1.0)


# ============================================================================ loaders
def test_from_deepseek_fp8_matches_quantize():
    w13, w2 = _moe(E=2, H=256, I=256)
    ref = quantize_experts(w13, w2, "fp8_block")
    ew = from_deepseek_fp8(ref.w13, ref.w2, ref.w13_scale.bfloat16(), ref.w2_scale)
    ew.validate(MoEConfig(num_experts=2, top_k=1, hidden_size=256, intermediate_size=256))
    assert ew.w13_scale.dtype == torch.float32
    d13, _ = dequantize_experts(ew)
    assert _rel(d13, w13) < 0.035                        # fp8 bound + bf16 scale rounding (2^-9)
    with pytest.raises(InputError, match=r"w13_scale_inv\.shape"):
        from_deepseek_fp8(ref.w13, ref.w2, ref.w13_scale[:, :1], ref.w2_scale)
    with pytest.raises(InputError, match=r"w13_fp8\.dtype"):
        from_deepseek_fp8(w13, ref.w2, ref.w13_scale, ref.w2_scale)


def test_from_per_expert_and_fused_gate_up():
    E, H, I = 3, 128, 64
    gate = [_randn(I, H, seed=30 + e) for e in range(E)]
    up = [_randn(I, H, seed=40 + e) for e in range(E)]
    down = [_randn(H, I, seed=50 + e) for e in range(E)]
    ew = from_per_expert(gate, up, down)
    assert ew.scheme.method.value == "none" and ew.w13.shape == (E, 2 * I, H) and ew.w2.shape == (E, H, I)
    assert torch.equal(ew.w13[1, :I], gate[1]) and torch.equal(ew.w13[1, I:], up[1])
    assert torch.equal(ew.w2[2], down[2])
    # fused, both layouts, same result
    fused = from_fused_gate_up(ew.w13, ew.w2)
    hf = from_fused_gate_up(ew.w13.transpose(1, 2), ew.w2.transpose(1, 2), transposed=True)
    assert torch.equal(fused.w13, ew.w13) and torch.equal(hf.w13, ew.w13) and torch.equal(hf.w2, ew.w2)
    q = from_per_expert(gate, up, down, scheme="int4_w4a16:g64")
    q.validate(MoEConfig(num_experts=E, top_k=2, hidden_size=H, intermediate_size=I))
    q2 = from_fused_gate_up(ew.w13.transpose(1, 2), ew.w2.transpose(1, 2), "int4_w4a16:g64", transposed=True)
    assert torch.equal(q.w13, q2.w13) and torch.equal(q.w2_scale, q2.w2_scale)
    # non-gated
    assert from_per_expert(gate, None, down).w13.shape == (E, I, H)
    # errors
    with pytest.raises(InputError, match="transposed"):
        from_fused_gate_up(ew.w13.transpose(1, 2), ew.w2.transpose(1, 2))
    with pytest.raises(InputError, match=r"len\(up\)"):
        from_per_expert(gate, up[:2], down)
    with pytest.raises(InputError, match="gate"):
        from_per_expert(torch.stack(gate), up, down)             # stacked tensor, not a list
    with pytest.raises(ConfigTypeError, match="down"):
        from_per_expert(gate, up, [])


# ------------------------------------------------------------- 8-bit checkpoints with weight_scale
def _per_expert_8bit(scheme: str, E=3, H=256, I=128, seed=60):
    """Per-expert bf16 gate / up / down, and each projection quantized on its own the way a
    compressed-tensors / fbgemm-fp8 checkpoint stores it: (gate, up, down) weights as lists, their
    weight_scale lists ([out, 1] fp32 per channel, [] per tensor), and the 16-bit originals."""
    gate, up, down = (_randn(E, I, H, seed=seed) * 0.05, _randn(E, I, H, seed=seed + 1) * 0.07,
                      _randn(E, H, I, seed=seed + 2) * 0.05)
    gate[1] *= 3                  # expert 1: gate's range above up's (expert 2: below), per tensor
    qs, ss = [], []
    for w in (gate, up, down):
        q = Q.quantize_weight(w, scheme)
        per_tensor = q["scale"].dim() == 1
        qs.append(list(q["w"]))
        ss.append([sc.reshape(()) if per_tensor else sc[:, None] for sc in q["scale"]])
    return qs, ss, (gate, up, down)


@pytest.mark.parametrize("scheme", ["fp8_channel", "int8_channel", "fp8_w8a16", "int8_w8a16"])
def test_from_quantized_per_expert_channel_is_exact(scheme):
    """Per-channel scales need no requantization: the loaded layer is bit for bit what quantizing
    the fused 16-bit weights gives (a row's scale depends on that row alone)."""
    (g, u, d), (sg, su, sd), (g16, u16, d16) = _per_expert_8bit(scheme)
    ew = from_quantized_per_expert(g, u, d, sg, su, sd, scheme)
    ref = quantize_experts(torch.cat([g16, u16], dim=1), d16, scheme)
    ew.validate(MoEConfig(num_experts=3, top_k=2, hidden_size=256, intermediate_size=128))
    for name in ("w13", "w2", "w13_scale", "w2_scale"):
        a, b = getattr(ew, name), getattr(ref, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                           b.view(torch.uint8) if b.element_size() == 1 else b), name
    # scales as [out] and in bf16 (some checkpoints): converted to fp32, within bf16's rounding
    ew16 = from_quantized_per_expert(g, u, d, [x.reshape(-1).bfloat16() for x in sg],
                                     [x.reshape(-1).bfloat16() for x in su], [x.bfloat16() for x in sd], scheme)
    assert ew16.w13_scale.dtype == torch.float32
    assert _rel(ew16.w13_scale, ref.w13_scale) < 2 ** -8
    # non-gated: w13 = gate
    ng = from_quantized_per_expert(g, None, d, sg, None, sd, scheme)
    assert ng.w13.shape == (3, 128, 256) and torch.equal(ng.w13_scale, ew.w13_scale[:, :128])


def test_from_quantized_per_expert_tensor_scales():
    """fp8 per-tensor: w13 has one scale an expert, the larger of gate's and up's; the other half is
    requantized (one more fp8 rounding), an expert whose two scales agree is kept bit for bit.
    Static input scales: the largest over the experts (and over gate / up for GEMM1)."""
    (g, u, d), (sg, su, sd), (g16, u16, d16) = _per_expert_8bit("fp8_tensor")
    su[0] = sg[0].clone()                                   # expert 0: same scale for gate and up
    u[0] = Q._to_fp8(u16[0].float() / sg[0])
    ew = from_quantized_per_expert(g, u, d, sg, su, sd, "fp8_tensor")
    ew.validate(MoEConfig(num_experts=3, top_k=2, hidden_size=256, intermediate_size=128))
    assert ew.w13_scale.shape == (3,)
    assert torch.equal(ew.w13_scale, torch.maximum(torch.stack(sg), torch.stack(su)).float())
    assert torch.equal(ew.w13[0, :128].view(torch.uint8), g[0].view(torch.uint8))
    assert torch.equal(ew.w13[0, 128:].view(torch.uint8), u[0].view(torch.uint8))
    assert sg[1] > su[1] and sg[2] < su[2]                  # both halves get requantized somewhere
    assert torch.equal(ew.w13[1, :128].view(torch.uint8), g[1].view(torch.uint8))    # the larger scale's half
    assert torch.equal(ew.w13[2, 128:].view(torch.uint8), u[2].view(torch.uint8))
    d13, d2 = dequantize_experts(ew)
    loaded = torch.cat([torch.stack([q.float() * s for q, s in zip(g, sg)]),
                        torch.stack([q.float() * s for q, s in zip(u, su)])], dim=1)
    assert (d13 - loaded).abs().max() <= (loaded.abs() * 2 ** -4 + ew.w13_scale.max() * 2 ** -9).max()
    assert _rel(d13, torch.cat([g16, u16], dim=1)) < 0.05   # two fp8 roundings at most
    assert _rel(d2, d16) < 0.035
    # static input scales
    ins = dict(gate_input_scale=[0.1, 0.3, 0.2], up_input_scale=[0.25, torch.tensor([0.05]), 0.1],
               down_input_scale=[torch.tensor(0.5), 0.7, 0.6])
    st = from_quantized_per_expert(g, u, d, sg, su, sd, "fp8_tensor:static", **ins)
    assert st.a13_scale.tolist() == [pytest.approx(0.3)] and st.a2_scale.tolist() == [pytest.approx(0.7)]
    st.validate(MoEConfig(num_experts=3, top_k=2, hidden_size=256, intermediate_size=128))


def test_from_quantized_per_expert_errors():
    (g, u, d), (sg, su, sd), (g16, u16, d16) = _per_expert_8bit("fp8_channel")
    (ti, _, _), (tsg, tsu, tsd), _ = _per_expert_8bit("fp8_tensor")
    ok = dict(gate=g, up=u, down=d, gate_scale=sg, up_scale=su, down_scale=sd, scheme="fp8_channel")
    cases = [
        (dict(scheme="fp8_block"), ConfigError, "from_deepseek_fp8"),
        (dict(scheme="int4_w4a16"), ConfigError, "scheme"),
        (dict(scheme="int8_w8a16:g64"), ConfigError, "scheme"),
        (dict(scheme="int8_channel"), InputError, r"gate\.dtype"),                # fp8 weights, int8 scheme
        (dict(gate=list(g16)), InputError, r"gate\.dtype"),                       # bf16: from_per_expert
        (dict(gate_scale=tsg), InputError, r"gate_scale\[0\]"),                   # per-tensor scale, channel scheme
        (dict(scheme="fp8_tensor", gate=ti), InputError, r"gate_scale\[0\]"),    # per-channel scale, tensor scheme
        (dict(down_scale=sd[:2]), InputError, r"len\(down_scale\)"),
        (dict(down_scale=torch.stack(sd)), ConfigTypeError, "down_scale"),
        (dict(up_scale=None), InputError, "up_scale"),
        (dict(gate_scale=[-sg[0]] + sg[1:]), InputError, "gate_scale"),
        (dict(gate_scale=[sg[0] * NAN] + sg[1:]), InputError, "gate_scale"),
        (dict(down=d[:2]), InputError, r"len\(down\)"),
        (dict(gate_input_scale=[0.1] * 3), ConfigError, "input_scale"),            # dynamic scheme: none
    ]
    for changes, err, pattern in cases:
        kw = dict(ok, **changes)
        with pytest.raises(err, match=pattern):
            from_quantized_per_expert(kw.pop("gate"), kw.pop("up"), kw.pop("down"), kw.pop("gate_scale"),
                                      kw.pop("up_scale"), kw.pop("down_scale"), kw.pop("scheme"), **kw)
    (tg, tu, td), (tsg, tsu, tsd), _ = _per_expert_8bit("fp8_tensor")
    with pytest.raises(InputError, match="input_scale"):                       # static: scales needed
        from_quantized_per_expert(tg, tu, td, tsg, tsu, tsd, "fp8_tensor:static", gate_input_scale=[0.1] * 3)
    with pytest.raises(InputError, match=r"down_input_scale\[1\]"):
        from_quantized_per_expert(tg, tu, td, tsg, tsu, tsd, "fp8_tensor:static", gate_input_scale=[0.1] * 3,
                                  up_input_scale=[0.1] * 3, down_input_scale=[0.1, -1.0, 0.1])
