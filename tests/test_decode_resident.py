"""One-token 8-bit decode with GEMM2's weights resident in shared memory (kernels/decode_resident.py)
and the persistent decode GEMM1 it runs beside (kernels/decode.py ``persist``).

CPU: the persistent GEMM1 under the interpreter (bitwise the grid version), the config rule
and the variable. The Gluon kernel does not run under the interpreter: its tests are ``gpu``
(scripts/compile_check.py compiles it for sm_90a on the CPU).
"""
from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fusedmoe.kernels import decode_resident as dr  # noqa: E402
from fusedmoe.kernels.decode import decode_gemm1, decode_gemm2  # noqa: E402
from fusedmoe.reference.kernels import gemm1_act_ref, gemm2_ref  # noqa: E402
from test_kernels_gemm import DEV, E, H, I, K_TOP, _randn, _rel, _routing  # noqa: E402

_SM90 = _CUDA and torch.cuda.get_device_capability()[0] >= 9 and dr.HAS_GLUON
gpu_sm90 = pytest.mark.skipif(not _SM90, reason="needs an sm90+ GPU and Gluon")


def _w8(E_, N, K, dt, seed):
    if dt == torch.int8:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(-127, 128, (E_, N, K), generator=g).to(torch.int8).to(DEV)
    return (_randn(E_, N, K, seed=seed) * 0.5).to(dt)


def _scales(shape, seed):
    """Positive, not powers of two: the scales' rounding is part of what is compared."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 0.02 + 0.001).to(DEV)


# ------------------------------------------------------------------------------ persistent GEMM1 (CPU too)
@pytest.mark.parametrize("persist", [1, 2])
@pytest.mark.parametrize("case", ["bf16-silu-bias", "fp8-block", "int8-channel-map"])
def test_decode_gemm1_persist_bitwise(case, persist):
    # program p of P takes items p, p + P, ...: every (pair, N tile) once, the same sums as
    # one program an item (bitwise), dropped pairs untouched
    T, k = 3, K_TOP
    tw, ids = _routing(T, E, k, seed=5)
    x = _randn(T, H, seed=6).to(torch.bfloat16 if _CUDA else torch.float32)
    kw, w13 = {}, None
    cfg = dict(BLOCK_N=8, BLOCK_K=32, num_warps=4, PREFETCH=True)
    if case == "bf16-silu-bias":
        w13 = (_randn(E, 2 * I, H, seed=7) / H ** 0.5).to(x.dtype)
        kw = dict(bias=_randn(E, 2 * I, seed=8).to(x.dtype))
    elif case == "fp8-block":
        w13 = _w8(E, 2 * I, H, torch.float8_e4m3fn, 9)
        kw = dict(quant="block", block_shape=(16, 32), b_scale=_scales((E, -(-2 * I // 16), -(-H // 32)), 10))
    else:
        w13 = _w8(E, 2 * I, H, torch.int8, 11)
        emap = torch.full((E,), -1, dtype=torch.int32)
        emap[: E // 2] = torch.arange(E // 2, dtype=torch.int32)      # half the experts are not local
        kw = dict(quant="channel", b_scale=_scales((E // 2, 2 * I), 12), expert_map=emap.to(DEV))
        w13 = w13[: E // 2].contiguous()
    plain = torch.full((T * k, I), 7.0, dtype=x.dtype, device=DEV)
    pers = plain.clone()
    decode_gemm1(x, w13, ids, "silu", plain, config=cfg, **kw)
    decode_gemm1(x, w13, ids, "silu", pers, config=cfg, persist=persist, **kw)
    assert torch.equal(plain, pers)
    ref = gemm1_act_ref(x, w13, ids, "silu", quant=kw.get("quant", "none"), b_scale=kw.get("b_scale"),
                        block=kw.get("block_shape"), bias=kw.get("bias"), expert_map=kw.get("expert_map"))
    kept = ref.abs().sum(1) > 0
    assert _rel(pers[kept], ref[kept]) < 2e-2
    if "expert_map" in kw:                       # dropped pairs: rows never written
        assert (~kept).any() and (pers[~kept] == 7.0).all()


def test_decode_gemm1_persist_grid():
    from fusedmoe.kernels.decode import gemm1_launch
    from fusedmoe.kernels.grouped_gemm import _num_sms
    x, w13 = torch.empty(1, 64, device=DEV), torch.empty(4, 64, 64, device=DEV)
    ids, h = torch.zeros(1, 2, dtype=torch.int32, device=DEV), torch.empty(2, 32, device=DEV)
    cfg = dict(BLOCK_N=4, BLOCK_K=32, num_warps=4, PREFETCH=True)
    spec = gemm1_launch(x, w13, ids, "silu", h, config=cfg)
    assert spec[1] == (8, 2) and not spec[3]["PERSIST"]
    spec = gemm1_launch(x, w13, ids, "silu", h, config=cfg, persist=1)
    assert spec[1] == (min(16, _num_sms(x.device)),) and spec[3]["PERSIST"] and spec[2][-1] == 16
    spec = gemm1_launch(x, w13, ids, "silu", h, config=cfg, persist=100)     # never more programs than items
    assert spec[1] == (16,)


# ------------------------------------------------------------------------------ config rule, variable
def test_resident_config_rule(monkeypatch):
    monkeypatch.delenv("FUSEDMOE_DECODE_RESIDENT_WARPS", raising=False)
    # deepseek-v3 tp8 (H 7168, I 256, 128-wide groups): 64 rows a program (112 programs), 128 KB
    c = dr.resident_config(1, 8, 7168, 256, 1, 132, 128, group_n=128)
    assert c == dict(BLOCK_N=64, RB=32, BK=128, TPW_K=8, num_warps=8)
    assert dr.resident_config(1, 8, 7168, 256, 1, 132, 128, group_n=16)["RB"] == 16   # within a scale group
    # qwen3 (H 2048, I 768): 16 rows (128 programs), 8 x 16 x 768 = 96 KB, K in 3 chunks of 256
    c = dr.resident_config(1, 8, 2048, 768, 1, 132)
    assert c == dict(BLOCK_N=16, RB=16, BK=256, TPW_K=16, num_warps=8)
    assert dr.resident_config(1, 8, 2048, 768, 2, 132) is None            # 16-bit weights: not this path
    assert dr.resident_config(1, 8, 7168, 2048, 1, 132) is None           # 8 x 64 x 2048 = 1 MB: too big
    assert dr.resident_config(1, 8, 2048, 770, 1, 132) is None            # no chunk of >= 16 divides K
    assert dr.resident_config(0, 8, 2048, 768, 1, 132) is None
    c = dr.resident_config(1, 2, 4096, 96, 1, 132)                         # K 96: chunks of 32
    assert c["BK"] == 32 and 4096 // c["BLOCK_N"] <= 132


def test_resident_variable(monkeypatch):
    from fusedmoe import env
    monkeypatch.delenv("FUSEDMOE_DECODE_RESIDENT", raising=False)
    assert env.decode_resident() is None
    monkeypatch.setenv("FUSEDMOE_DECODE_RESIDENT", "2")
    assert env.decode_resident() == 2
    monkeypatch.setenv("FUSEDMOE_DECODE_RESIDENT", "two")
    with pytest.raises(Exception, match="FUSEDMOE_DECODE_RESIDENT"):
        env.decode_resident()


# ------------------------------------------------------------------------------ GPU: the Gluon GEMM2
SCHEMES = {"qwen3-fp8-channel": ((128, 2048, 768, 8), torch.float8_e4m3fn, "channel"),
           "qwen3-int8-channel": ((128, 2048, 768, 8), torch.int8, "channel"),
           "deepseek-tp8-fp8-block": ((256, 7168, 256, 8), torch.float8_e4m3fn, "block"),
           "odd-fp8-tensor": ((12, 1000, 96, 3), torch.float8_e4m3fn, "tensor")}


def _gemm2_case(name, T, seed):
    (E_, H_, I_, k), dt, quant = SCHEMES[name]
    w2 = _w8(E_, H_, I_, dt, seed)
    block = (128, 128) if quant == "block" else None
    b2 = {"block": (E_, H_ // 128, I_ // 128), "channel": (E_, H_), "tensor": (E_,)}[quant]
    h = (_randn(T * k, I_, seed=seed + 1) * 3).to(torch.bfloat16)
    tw, ids = _routing(T, E_, k, seed=seed + 2)
    return w2, h, tw, ids, dict(quant=quant, b_scale=_scales(b2, seed + 3), block_shape=block)


@pytest.mark.gpu
@gpu_sm90
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("name", list(SCHEMES))
@pytest.mark.parametrize("extras", ["plain", "bias-map-noweight"])
def test_gpu_resident_gemm2(name, T, extras):
    w2, h, tw, ids, q = _gemm2_case(name, T, 50 + T)
    E_, H_, I_ = w2.shape
    kw = {}
    if extras != "plain":
        emap = torch.full((E_,), -1, dtype=torch.int32, device=DEV)
        emap[::2] = torch.arange((E_ + 1) // 2, dtype=torch.int32, device=DEV)    # odd experts elsewhere
        keep = emap >= 0
        w2 = w2[keep].contiguous()
        bs = q["b_scale"][keep].contiguous()
        q = dict(q, b_scale=bs)
        kw = dict(expert_map=emap, bias=(_randn(w2.shape[0], H_, seed=60) * 0.5).to(torch.bfloat16),
                  mul_routed_weight=False)
    cfg = dr.resident_config(T, ids.shape[1], H_, I_, 1, torch.cuda.get_device_properties(0).multi_processor_count,
                             128 if q["quant"] == "block" else None,
                             group_n=128 if q["quant"] == "block" else None)
    assert cfg is not None
    out = torch.full((T, H_), float("nan"), dtype=torch.bfloat16, device=DEV)
    from fusedmoe.kernels.launcher import launch
    launch(*dr.resident_gemm2_launch(h, w2, ids, tw, out, config=cfg, **kw, **q))
    ref = gemm2_ref(h.float(), w2, ids, tw, quant=q["quant"], b_scale=q["b_scale"], block=q["block_shape"],
                    expert_map=kw.get("expert_map"), bias=kw.get("bias"),
                    mul_routed_weight=kw.get("mul_routed_weight", True))
    assert not out.isnan().any()
    assert _rel(out, ref) < 1e-2                      # bf16 output rounding; fp32 sums
    cuda_core = decode_gemm2(h, w2, ids, tw, **kw, **q)
    assert _rel(out, cuda_core) < 1e-2
    again = torch.empty_like(out)
    launch(*dr.resident_gemm2_launch(h, w2, ids, tw, again, config=cfg, **kw, **q))
    assert torch.equal(out, again)                    # slots summed in a fixed order


@pytest.mark.gpu
@gpu_sm90
@pytest.mark.parametrize("name", ["qwen3-fp8-channel", "deepseek-tp8-fp8-block"])
@pytest.mark.parametrize("persist", [1, 2, 3])
def test_gpu_resident_chain_pdl(name, persist):
    # GEMM1 on P programs an SM, GEMM2 a programmatic dependent launch that copies its weights
    # before griddepcontrol.wait: h must be GEMM1's (compared with the plain launches), every time
    from fusedmoe.kernels.decode import gemm1_launch
    from fusedmoe.kernels.launcher import launch
    (E_, H_, I_, k), dt, quant = SCHEMES[name]
    w2, _, tw, ids, q = _gemm2_case(name, 1, 70)
    w13 = _w8(E_, 2 * I_, H_, dt, 71)
    block = q["block_shape"]
    b1 = _scales((E_, 2 * I_ // 128, H_ // 128) if block else (E_, 2 * I_), 72)
    x = _randn(1, H_, seed=73).to(torch.bfloat16)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = dr.resident_config(1, k, H_, I_, 1, nsm, 128 if block else None, group_n=128 if block else None)
    h0 = decode_gemm1(x, w13, ids, "silu", quant=quant, b_scale=b1, block_shape=block)
    want = torch.empty(1, H_, dtype=torch.bfloat16, device=DEV)
    launch(*dr.resident_gemm2_launch(h0, w2, ids, tw, want, config=cfg, **q))
    for i in range(3):
        h = torch.full_like(h0, float("nan"))
        out = torch.full_like(want, float("nan"))
        launch(*gemm1_launch(x, w13, ids, "silu", h, quant=quant, b_scale=b1, block_shape=block, pdl=True,
                             persist=persist))
        launch(*dr.resident_gemm2_launch(h, w2, ids, tw, out, config=cfg, pdl=True, **q))
        assert torch.equal(h, h0) and torch.equal(out, want), i


@pytest.mark.gpu
@gpu_sm90
@pytest.mark.parametrize("preset,tp,scheme", [("qwen3-30b-a3b", 1, "fp8_channel"), ("qwen3-30b-a3b", 1, "int8_channel"),
                                              ("deepseek-v3", 8, "fp8_block")])
def test_gpu_layer_resident(preset, tp, scheme, monkeypatch):
    # the layer at T=1 with FUSEDMOE_DECODE_RESIDENT=2: its two launches are GEMM1 persistent and the
    # resident GEMM2; the result against the a16 reference, against the default path, and replayed
    # from a CUDA graph
    from fusedmoe.bench import harness as hz
    from fusedmoe.layer import prepare_experts
    from fusedmoe.presets import get_preset
    cfg = get_preset(preset).to_config(tp=tp)
    w = hz.make_weights(cfg, scheme, "cuda", seed=0)
    monkeypatch.setenv("FUSEDMOE_DECODE_RESIDENT", "0")
    base = prepare_experts(cfg, w, "triton")
    monkeypatch.setenv("FUSEDMOE_DECODE_RESIDENT", "2")
    pe = prepare_experts(cfg, w, "triton")
    chk = hz.check_against(pe, hz.make_check_case(cfg, w, 1, "cuda"))
    assert chk.ok, chk
    s = hz.make_input_sets(cfg, 1, "cuda", seed=3).sets[0]
    args = s.args()
    got, ref = pe(*args), base(*args)
    plans = pe.kernel.experts._plans
    assert any(p[1].kernel is dr._resident_gemm2_kernel for p in plans.values())
    assert _rel(got, ref) < 2e-2
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        gout = pe(*args)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(gout, got)
