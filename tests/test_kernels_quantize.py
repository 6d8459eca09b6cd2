"""fusedmoe.kernels.quantize against fusedmoe.reference.quant (bit-exact where rounding is).

Without a GPU the kernels run under TRITON_INTERPRET=1 on CPU tensors (tiny shapes); with
one, every test runs compiled on CUDA tensors and the ``gpu`` tests add larger shapes.
Legend: T rows, K columns, g group size, I = GEMM1 output columns / 2 (gated).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported

from fusedmoe.config import GateUpLayout  # noqa: E402
from fusedmoe.kernels import quantize as kq  # noqa: E402
from fusedmoe.reference import quant as ref  # noqa: E402
from fusedmoe.reference.activations import apply_activation  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
requires_gpu = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                                  reason="needs a CUDA GPU running compiled Triton")


# ----------------------------------------------------------------------------- helpers
def assert_same(a: torch.Tensor, b: torch.Tensor):
    """Bitwise equal, except that any NaN equals any NaN (the sign of a NaN is not specified)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    fa, fb = a.float().cpu(), b.float().cpu()
    nan_a, nan_b = fa.isnan(), fb.isnan()
    assert torch.equal(nan_a, nan_b), f"NaN positions differ: {int((nan_a ^ nan_b).sum())}"
    if a.dtype == torch.float8_e4m3fn:
        ua, ub = a.view(torch.uint8).cpu()[~nan_a], b.view(torch.uint8).cpu()[~nan_b]
        bad = ua != ub
        assert not bad.any(), f"{int(bad.sum())} bytes differ, e.g. {fa[~nan_a][bad][:5]} vs {fb[~nan_b][bad][:5]}"
    else:
        bad = fa[~nan_a] != fb[~nan_b]
        assert not bad.any(), f"{int(bad.sum())} values differ, e.g. {fa[~nan_a][bad][:5]} vs {fb[~nan_b][bad][:5]}"


def fp8_ordinal(q: torch.Tensor) -> torch.Tensor:
    """Signed position of each fp8 code on the number line: neighbours differ by 1."""
    u = q.view(torch.uint8).cpu().to(torch.int32)
    return torch.where(u >= 128, -(u - 128), u)


def assert_within_one_step(a: torch.Tensor, b: torch.Tensor, max_frac: float = 0.02):
    """a, b quantized (fp8 or int8) from values that differ by ~1 fp32 ulp: at most one code apart,
    and only rarely apart at all."""
    if a.dtype == torch.float8_e4m3fn:
        da, db = fp8_ordinal(a), fp8_ordinal(b)
    else:
        da, db = a.cpu().to(torch.int32), b.cpu().to(torch.int32)
    diff = (da - db).abs()
    assert int(diff.max()) <= 1, int(diff.max())
    assert float((diff > 0).float().mean()) <= max_frac


def rand_rows(T, K, dtype=torch.float32, seed=0):
    """Rows with very different magnitudes (per-row scales matter) in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g) * torch.exp(torch.randn(T, 1, generator=g) * 2)
    return x.to(dtype).to(DEVICE)


QUANTIZERS = [  # (name, positional args after x)
    ("quant_fp8_token", ()),
    ("quant_int8_token", ()),
    ("quant_fp8_tensor", ()),
    ("quant_fp8_group", (128,)),
    ("quant_fp8_group", (128, True)),   # pow2 scales
    ("quant_fp8_group", (64,)),
]


# ----------------------------------------------------------------------------- quantizers
@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("T", [1, 7, 64])
@pytest.mark.parametrize("K", [200, 256])   # 200: a partial last group (128 + 72)
def test_matches_reference_bitwise(name, args, T, K):
    x = rand_rows(T, K, seed=T * 1000 + K)
    q, s = getattr(kq, name)(x, *args)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,args", QUANTIZERS[:4])
def test_16bit_inputs(name, args, dtype):
    x = rand_rows(7, 200, dtype)
    q, s = getattr(kq, name)(x, *args)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)


def test_fp8_rounding_ties_subnormals_saturation():
    # a static scale of 1 makes x / scale == x: every e4m3 midpoint (ties to even), values
    # past 448 (saturate), the subnormal range (multiples of 2**-9), Inf and NaN
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()   # 0 .. 448
    mids = (codes[1:] + codes[:-1]) / 2
    tiny = torch.tensor([2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -11, 1e-30, 0.0, 2.0 ** -7 * 1.0625])
    special = torch.tensor([449.0, 464.0, 465.0, 480.0, 1e6, float("inf"), float("nan")])
    v = torch.cat([codes, mids, mids + 1e-4 * mids, mids - 1e-4 * mids, tiny, special])
    x = torch.cat([v, -v]).reshape(2, -1).to(DEVICE)
    one = torch.ones(1, device=DEVICE)
    q, s = kq.quant_fp8_tensor(x, one)
    q_ref, _ = ref.quant_fp8_tensor(x.cpu(), one.cpu())
    assert_same(q, q_ref)
    assert s.item() == 1.0


def test_static_scale_float_and_tensor():
    x = rand_rows(7, 200)
    for scale in (0.05, torch.tensor([0.05], device=DEVICE)):
        q, s = kq.quant_fp8_tensor(x, scale)
        q_ref, s_ref = ref.quant_fp8_tensor(x.cpu(), 0.05)
        assert_same(q, q_ref)
        assert_same(s, s_ref)


def test_int8_round_half_to_even():
    # amax 127 -> scale exactly 1, so x / scale hits every .5 tie
    x = torch.cat([torch.arange(-126, 127) + 0.5, torch.tensor([127.0, -127.0, 0.49999997, -2.5])])
    x = x.reshape(1, -1).to(DEVICE)
    q, s = kq.quant_int8_token(x)
    q_ref, s_ref = ref.quant_int8_token(x.cpu())
    assert s.item() == 1.0
    assert_same(q, q_ref)


def _divide(monkeypatch, name: str, rcp: bool) -> dict:
    """The quantizer's keyword arguments for the division through the scale's reciprocal (rcp) or
    the IEEE one: ``reciprocal=``; quant_fp8_tensor takes none, so its row launch gets it."""
    if name != "quant_fp8_tensor":
        return {"reciprocal": rcp}
    real = kq._launch_rows
    monkeypatch.setattr(kq, "_launch_rows", lambda *a, **kw: real(*a, **dict(kw, reciprocal=rcp)))
    return {}


@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rcp", [True, False])
def test_reciprocal_division_same_codes(monkeypatch, name, args, dtype, rcp):
    # the division through the scale's reciprocal plus one Markstein correction (``reciprocal=``,
    # the default) and the IEEE division both give bitwise the reference's
    # x / s codes: rows of very different magnitudes (bf16 h-like rows of 768 too), -0.0
    # entries (which keep their sign), a NaN and an Inf row
    kw = _divide(monkeypatch, name, rcp)
    x = torch.cat([rand_rows(61, 200, seed=81), rand_rows(3, 200, seed=82) * 1e-20]).to(dtype)
    x[5, :7] = -0.0
    x[9, 3] = float("nan")
    x[12, 150] = float("inf")
    xh = rand_rows(37, 768, dtype, seed=83)
    for xx in (x, xh):
        q, s = getattr(kq, name)(xx, *args, **kw)
        q_ref, s_ref = getattr(ref, name)(xx.cpu(), *args)
        assert_same(s, s_ref)
        assert_same(q, q_ref)
        if xx is x and name == "quant_fp8_token":
            assert (q.view(torch.uint8).cpu()[5, :7] == 0x80).all()    # -0.0 really came through


@pytest.mark.parametrize("scale", [0.3, 1 / 3, 7.1e-3, 123.456])
@pytest.mark.parametrize("rcp", [True, False])
def test_reciprocal_division_near_ties(monkeypatch, scale, rcp):
    # static scales that are not powers of two, values placed on and around every e4m3
    # midpoint times the scale: quotients within an ulp or two of a tie; int8 rows whose
    # quotients sit on and around the .5 ties. Same codes as the reference's division.
    kw = _divide(monkeypatch, "quant_fp8_tensor", rcp)
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (codes[1:] + codes[:-1]) / 2
    v = torch.cat([mids, mids * (1 + 2 ** -23), mids * (1 - 2 ** -23), mids * (1 + 2 ** -22)]) * scale
    x = torch.cat([v, -v]).reshape(4, -1).to(DEVICE)
    q, _ = kq.quant_fp8_tensor(x, scale, **kw)
    q_ref, _ = ref.quant_fp8_tensor(x.cpu(), scale)
    assert_same(q, q_ref)
    t = torch.arange(-126, 127) + 0.5
    xi = torch.cat([t, t * (1 + 2 ** -23), t * (1 - 2 ** -23), torch.tensor([127.0, -127.0])]) * scale
    xi = xi.reshape(1, -1).to(DEVICE)
    q, s = kq.quant_int8_token(xi, **_divide(monkeypatch, "quant_int8_token", rcp))
    q_ref, s_ref = ref.quant_int8_token(xi.cpu())
    assert_same(s, s_ref)
    assert_same(q, q_ref)


@pytest.mark.parametrize("name,args", QUANTIZERS)
def test_nan_and_inf_rows(name, args):
    # row 1 holds a NaN, row 4 an Inf: their scales (all of them for per-tensor) are NaN, so
    # the dequantized rows are NaN; every other row is untouched
    x = rand_rows(6, 200)
    x[1, 17] = float("nan")
    x[4, 150] = float("inf")
    check_nan_inf_rows(name, args, x, [1, 4])


def check_nan_inf_rows(name, args, x, bad, **kw):
    """Bitwise the reference; NaN scales exactly on the rows ``bad`` (every scale per tensor)."""
    q, s = getattr(kq, name)(x, *args, **kw)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)
    if name == "quant_fp8_tensor":
        assert s.isnan().all()
    else:
        assert all(s[r].isnan().any() for r in bad)
        assert not s[[r for r in range(x.shape[0]) if r not in bad]].isnan().any()


@pytest.mark.parametrize("name,args", QUANTIZERS)
def test_zero_rows(name, args):
    x = rand_rows(3, 200)
    x[1] = 0.0
    q, s = getattr(kq, name)(x, *args)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)
    assert (q[1].float() == 0).all()


def test_pow2_scales_are_powers_of_two():
    _, s = kq.quant_fp8_group(rand_rows(7, 200), 128, pow2=True)
    m, _ = torch.frexp(s.cpu())
    assert (m == 0.5).all()


def test_preallocated_outputs_and_leading_dims():
    x = rand_rows(12, 200).reshape(3, 4, 200)
    q = torch.empty(3, 4, 200, dtype=torch.float8_e4m3fn, device=DEVICE)
    s = torch.empty(3, 4, 2, device=DEVICE)
    q2, s2 = kq.quant_fp8_group(x, 128, out=q, out_scale=s)
    assert q2 is q and s2 is s
    q_ref, s_ref = ref.quant_fp8_group(x.cpu(), 128)
    assert_same(q, q_ref)
    assert_same(s, s_ref)


@pytest.mark.parametrize("name,args", QUANTIZERS)
def test_batched_counts_skip_padding(name, args):
    # x [E, T_max, K]; padding rows hold NaN: they must not reach the valid rows' outputs nor
    # the per-tensor amax, and their outputs stay unwritten
    E, T_max, K = 3, 5, 200
    counts = torch.tensor([0, 5, 2], dtype=torch.int32, device=DEVICE)
    x = rand_rows(E * T_max, K).reshape(E, T_max, K)
    valid = torch.arange(T_max, device=DEVICE)[None, :] < counts[:, None]        # [E, T_max]
    x[~valid] = float("nan")
    q, s = getattr(kq, name)(x, *args, counts=counts)
    q_ref, s_ref = getattr(ref, name)(x[valid].cpu(), *args)
    if name == "quant_fp8_tensor":
        assert_same(s, s_ref)
    else:
        assert_same(s[valid], s_ref)
    assert_same(q[valid], q_ref)


# ----------------------------------------------------------------------------- several rows per program
# T = 37 is no multiple of any ROWS > 1: the last program's tile runs past T
@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("K", [768, 2048])
@pytest.mark.parametrize("rows", [2, 8])
def test_rows_per_program_bitwise(name, args, K, rows):
    x = rand_rows(37, K, torch.bfloat16, seed=K + rows)
    q, s = getattr(kq, name)(x, *args, rows_per_program=rows)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)


@pytest.mark.parametrize("name,args", QUANTIZERS)
def test_rows_per_program_nan_inf_rows(name, args):
    # as test_nan_and_inf_rows, with ROWS = 8: a NaN row and an Inf row share tiles with
    # finite rows, which keep their own scales; -Inf in the last row of the partial last tile
    x = rand_rows(37, 768, seed=11)
    x[9, 17] = float("nan")
    x[12, 700] = float("inf")
    x[36, 0] = -float("inf")
    check_nan_inf_rows(name, args, x, [9, 12, 36], rows_per_program=8)


@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("rows", [4, 16])
def test_rows_per_program_batched_counts(name, args, rows):
    # T_max = 13: tiles straddle experts, mixing valid and (NaN) padding rows of two experts;
    # the padding rows' outputs (sentinels here) stay unwritten
    E, T_max, K = 3, 13, 200
    counts = torch.tensor([5, 0, 13], dtype=torch.int32, device=DEVICE)
    x = rand_rows(E * T_max, K, seed=rows).reshape(E, T_max, K)
    valid = torch.arange(T_max, device=DEVICE)[None, :] < counts[:, None]
    x[~valid] = float("nan")
    q_dtype = torch.int8 if name == "quant_int8_token" else torch.float8_e4m3fn
    out = torch.full((E, T_max, K), 17, dtype=torch.uint8, device=DEVICE).view(q_dtype)
    kw = dict(counts=counts, rows_per_program=rows, out=out)
    if name != "quant_fp8_tensor":
        G = -(-K // args[0]) if name == "quant_fp8_group" else 1
        kw["out_scale"] = torch.full((E, T_max, G), 12345.0, device=DEVICE)
    q, s = getattr(kq, name)(x, *args, **kw)
    q_ref, s_ref = getattr(ref, name)(x[valid].cpu(), *args)
    if name == "quant_fp8_tensor":
        assert_same(s, s_ref)
    else:
        assert_same(s[valid], s_ref)
        assert (s[~valid] == 12345.0).all()
    assert_same(q[valid], q_ref)
    assert (q[~valid].view(torch.uint8) == 17).all()


@pytest.mark.parametrize("name,args", QUANTIZERS[:3])
def test_rows_per_program_multi_chunk_rows(name, args):
    # K = 5000 > 4096: each row is read in two chunks (amax pass, then quantize pass)
    x = rand_rows(7, 5000, seed=4)
    x[3, 4500] = float("nan")
    q, s = getattr(kq, name)(x, *args, rows_per_program=4)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)


@pytest.mark.parametrize("qt", ["fp8", "int8"])
@pytest.mark.parametrize("rows", [1, 4])
def test_token_row_in_chunks_of_block_k(qt, rows):
    # a row of 768 read as 3 chunks of 256 (the amax pass, then the quantize pass: no masked
    # lanes of a 1024 tile): the same codes, the big entry in the last chunk, a NaN row
    x = rand_rows(9, 768, torch.float16, seed=5)
    x[2, 700] = 50.0
    x[6, 300] = float("nan")
    dt = torch.float8_e4m3fn if qt == "fp8" else torch.int8
    q, s = kq._quant_token(x, dt, qt, None, None, None, rows=rows, block_k=256)
    q_ref, s_ref = getattr(ref, f"quant_{qt}_token")(x.cpu())
    assert_same(s, s_ref)
    assert_same(q, q_ref)


@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("K,rows", [(200, None), (768, None), (768, 4), (5000, 2)])
def test_fused_zero(name, args, K, rows):
    # zero=z: the quantizing launch also stores zeros into z's [T, K] rows (the grouped path's
    # output, which an atomic k-sum adds into next). z is a row slice of a wider buffer full of
    # NaN / large values: exactly its [T, K] part becomes 0, the columns past K keep their
    # values, and q / s are the reference's bits
    T = 7
    x = rand_rows(T, K, seed=K + 3)
    wide = torch.full((T, K + 24), float("nan"), dtype=torch.float16, device=DEVICE)
    wide[::2] = 3e4
    keep = wide[:, K:].clone()
    z = wide[:, :K]
    q, s = getattr(kq, name)(x, *args, rows_per_program=rows, zero=z)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)
    assert torch.equal(z, torch.zeros_like(z))
    assert_same(wide[:, K:], keep)


def test_fused_zero_rejects_what_it_cannot_zero():
    x = rand_rows(4, 256)
    with pytest.raises(ValueError, match=r"zero=: a \[4, 256\] tensor"):
        kq.quant_fp8_token(x, zero=torch.zeros(4, 128, device=DEVICE))
    with pytest.raises(ValueError, match=r"zero=: a \[4, 256\] tensor.*unit last stride"):
        kq.quant_fp8_group(x, 128, zero=torch.zeros(256, 4, device=DEVICE).t())
    with pytest.raises(ValueError, match="zero=: a floating tensor"):
        kq.quant_int8_token(x, zero=torch.zeros(4, 256, dtype=torch.int32, device=DEVICE))
    counts = torch.tensor([2, 1], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="only for the standard format"):
        kq.quant_fp8_token(x.view(2, 2, 256), counts=counts, zero=torch.zeros(4, 256, device=DEVICE))


def test_token_chunk_rule():
    # per-token rows whose K is a multiple of 256 but not a power of two are read in chunks
    # of K's largest power-of-two divisor (quantize._token_chunk); the rest as one tile
    assert [kq._token_chunk(K) for K in (768, 1536, 2304, 3072)] == [256, 512, 256, 1024]
    assert [kq._token_chunk(K) for K in (256, 1024, 2048, 1408, 200, 5120, 14336)] == [0] * 7


def test_rows_per_program_rule():
    # the measured rule (quantize._rows_per_program's docstring)
    rule = kq._rows_per_program
    assert rule(1, 2048, 2) == 1                    # decode: one tiny program
    assert rule(131072, 1024, 2) == 1               # per-token h [131072, 768] bf16: one row
    assert rule(16384, 2048, 2) == 2                # per-token x [16384, 2048]: two rows
    assert rule(300, 2048, 2) == 1                  # few rows: keep >= 264 programs
    assert rule(131072, 256, 2, groups=True) == 8   # 1 x 128 groups of h [131072, 256]: 2K elements
    assert rule(16384, 2048, 2, 4, groups=True) == 1   # groups of x [16384, 7168]: 2K already
    assert rule(10 ** 6, 16, 2, groups=True) == 32  # capped
    assert rule(600, 128, 4, groups=True) == 2      # >= 264 programs
    with pytest.raises(ValueError):
        kq.quant_fp8_token(rand_rows(2, 64), rows_per_program=3)


@pytest.mark.parametrize("name,args", QUANTIZERS)
def test_rows_per_program_default_rule_above_one(name, args):
    # 600 rows of 2048 fp32 (per token) / of 128 (groups): the rule itself picks ROWS = 2
    assert kq._rows_per_program(600, 2048, 4) == 2 == kq._rows_per_program(600, 128, 4, groups=True)
    x = rand_rows(600, 2048 if "group" not in name else 128, seed=6)
    x[301, 5] = float("nan")
    q, s = getattr(kq, name)(x, *args)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)


def test_empty_input():
    x = torch.empty(0, 64, device=DEVICE)
    for name, args in QUANTIZERS:
        q, s = getattr(kq, name)(x, *args)
        assert q.shape == (0, 64)


# ----------------------------------------------------------------------------- act_and_quant
ACT_CASES = [  # (activation, swiglu_limit)
    ("silu", None), ("silu", 3.0), ("gelu", None), ("gelu_tanh", None), ("swigluoai", None),
    ("relu2_no_mul", None), ("silu_no_mul", None), ("gelu_no_mul", None),
]


def _act_ref(h, activation, swiglu_limit):
    return apply_activation(h.cpu(), activation, swiglu_limit=swiglu_limit, layout=GateUpLayout.HALVES)


@pytest.mark.parametrize("activation,swiglu_limit", ACT_CASES)
@pytest.mark.parametrize("mode", ["token", "group", "tensor_static"])
def test_act_and_quant(activation, swiglu_limit, mode):
    # I = 100: a partial group of 64 (64 + 36). The kernel's fp32 activation may differ from
    # torch's by an ulp, so codes may differ by one step and scales by an ulp.
    M, I = 7, 100
    gated = not activation.endswith("_no_mul")
    h = rand_rows(M, 2 * I if gated else I, torch.float16, seed=3) * 2      # |g| > 7: clamps engage
    a = _act_ref(h, activation, swiglu_limit)                               # [M, I] fp32
    if mode == "token":
        q, s = kq.act_and_quant(h, activation, "token", swiglu_limit=swiglu_limit)
        q_ref, s_ref = ref.quant_fp8_token(a)
    elif mode == "group":
        q, s = kq.act_and_quant(h, activation, "group", 64, swiglu_limit=swiglu_limit)
        q_ref, s_ref = ref.quant_fp8_group(a, 64)
    else:
        static = torch.tensor([0.02], device=DEVICE)
        q, s = kq.act_and_quant(h, activation, "tensor_static", scale=static, swiglu_limit=swiglu_limit)
        q_ref, s_ref = ref.quant_fp8_tensor(a, static.cpu())
    assert q.shape == (M, I) and s.shape == s_ref.shape
    torch.testing.assert_close(s.cpu(), s_ref, rtol=1e-6, atol=0)
    assert_within_one_step(q, q_ref)


def test_act_and_quant_int8_token_and_pow2_group():
    h = rand_rows(7, 2 * 96, torch.float16, seed=5)
    a = _act_ref(h, "silu", None)
    q, s = kq.act_and_quant(h, "silu", "token", quant_dtype=torch.int8)
    q_ref, s_ref = ref.quant_int8_token(a)
    torch.testing.assert_close(s.cpu(), s_ref, rtol=1e-6, atol=0)
    assert_within_one_step(q, q_ref)
    q, s = kq.act_and_quant(h, "silu", "group", 32, pow2=True)
    q_ref, s_ref = ref.quant_fp8_group(a, 32, pow2=True)
    assert_same(s, s_ref)    # pow2 scales only differ if an amax crossed a power of two
    assert_within_one_step(q, q_ref)


def test_act_and_quant_nan_row_and_counts():
    E, T_max, I = 2, 4, 64
    h = rand_rows(E * T_max, 2 * I, torch.float16, seed=9).reshape(E, T_max, 2 * I)
    counts = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    h[0, 3] = float("nan")          # padding: must not matter
    h[1, 1:] = float("nan")         # padding
    h[0, 1, 5] = float("nan")       # a real NaN in a valid row: its scale is NaN
    q, s = kq.act_and_quant(h, "silu", "token", counts=counts)
    assert s[0, 1].isnan().all() and not s[0, [0, 2]].isnan().any() and not s[1, 0].isnan().any()
    assert q[0, 1].float().isnan().all()
    a = _act_ref(h[0, [0, 2]], "silu", None)
    q_ref, s_ref = ref.quant_fp8_token(a)
    torch.testing.assert_close(s[0, [0, 2]].cpu(), s_ref, rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,K", [(1, 7168), (333, 4096), (4096, 2048), (77, 5000)])
def test_gpu_large_bitwise(name, args, dtype, T, K):
    x = rand_rows(T, K, dtype, seed=T + K)
    x[T // 2, K // 3] = float("nan")
    q, s = getattr(kq, name)(x, *args)
    # the reference runs on the CPU: on CUDA, torch divides by a Python scalar as a multiply by
    # its reciprocal, so amax / 448 there can be an ulp off the IEEE quotient
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("K,rows", [(768, None), (768, 8), (768, 16), (1536, None), (2048, 4), (7168, 2)])
def test_gpu_rows_per_program(name, args, K, rows):
    T = 1037                                   # the rule: ROWS 2 or 4 here; not a multiple of ROWS
    x = rand_rows(T, K, torch.bfloat16, seed=K)
    x[T // 3, K // 2] = float("nan")
    x[T - 1, 0] = float("inf")
    q, s = getattr(kq, name)(x, *args, rows_per_program=rows)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("name,args", QUANTIZERS)
@pytest.mark.parametrize("T,K", [(4096, 2048), (1037, 7168), (333, 768)])
def test_gpu_fused_zero(name, args, T, K):
    # as test_fused_zero at serving sizes, into a bf16 output (the atomic k-sum's)
    x = rand_rows(T, K, torch.bfloat16, seed=T + K)
    z = torch.full((T, K), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    q, s = getattr(kq, name)(x, *args, zero=z)
    q_ref, s_ref = getattr(ref, name)(x.cpu(), *args)
    assert_same(s, s_ref)
    assert_same(q, q_ref)
    assert torch.equal(z, torch.zeros_like(z))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("activation,swiglu_limit", ACT_CASES[:5])
def test_gpu_act_and_quant_large(activation, swiglu_limit):
    h = rand_rows(257, 2 * 2880, torch.bfloat16, seed=1)
    a = _act_ref(h, activation, swiglu_limit)     # CPU reference (see test_gpu_large_bitwise)
    for mode in ("token", "group"):
        q, s = kq.act_and_quant(h, activation, mode, 128, swiglu_limit=swiglu_limit)
        q_ref, s_ref = (ref.quant_fp8_token(a) if mode == "token" else ref.quant_fp8_group(a, 128))
        torch.testing.assert_close(s.cpu(), s_ref, rtol=1e-5, atol=0)
        assert_within_one_step(q, q_ref)


@pytest.mark.parametrize("method,group,pow2", [("fp8_channel", 128, False), ("int8_channel", 128, False),
                                               ("fp8_block", 128, False), ("fp8_block", 64, True)])
def test_quant_launch_spec_is_the_wrappers_launch(method, group, pow2):
    # quant_launch (the triton backend's decode chain binds it: launcher.bind(..., slots=[0]))
    # quantizes into given buffers exactly as the wrappers do, and a bound repeat with another
    # x of the shape writes that x's codes and scales into the same buffers
    from fusedmoe.kernels.launcher import bind
    T, K = 3, 320                      # K: not a power of two, a partial last group of 64
    xs = [(torch.randn(T, K, generator=torch.Generator().manual_seed(s)) * 4).to(torch.bfloat16).to(DEVICE)
          for s in (1, 2)]
    wrap = {"fp8_channel": kq.quant_fp8_token, "int8_channel": kq.quant_int8_token,
            "fp8_block": lambda x: kq.quant_fp8_group(x, group, pow2)}[method]
    want = [wrap(x) for x in xs]
    q, s = torch.empty_like(want[0][0]), torch.empty_like(want[0][1])
    b = bind(*kq.quant_launch(xs[0], q, s, method, group=group, pow2=pow2), slots=[0])
    assert_same(q, want[0][0])
    assert_same(s, want[0][1])
    b.fast(xs[1])
    assert_same(q, want[1][0])
    assert_same(s, want[1][1])
    with pytest.raises(AssertionError):
        kq.quant_launch(xs[0][:0], q, s, method)
