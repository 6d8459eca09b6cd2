"""What users touch: FusedMoE (nn.Module), FusedMoE.from_float, .selection, fused_experts
(functional, cached), input validation naming the parameter, torch.compile(fullgraph=True).

Legend: T tokens, E experts, k top-k, H hidden, I intermediate.
"""
from __future__ import annotations

import json
import logging

import pytest
import torch

import fusedmoe.layer as layer_mod
import fusedmoe.oracle as oracle
from fusedmoe.config import ParallelConfig, QuantScheme, Routing
from fusedmoe.errors import ConfigTypeError, InputError
from fusedmoe.layer import FusedMoE, fused_experts, prepare_experts
from fusedmoe.quantize import quantize_experts
from fusedmoe.reference.moe import reference_moe
from fusedmoe.reference.routing import route
from fusedmoe.tolerances import rel_error, tolerance
from fusedmoe.weights import ExpertWeights


@pytest.fixture(autouse=True)
def _fresh_caches(monkeypatch):
    monkeypatch.setattr(layer_mod, "_CACHE", {})
    monkeypatch.setattr(oracle, "_logged", set())


def expect_input_error(param, fn, exc=InputError):
    with pytest.raises(exc) as ei:
        fn()
    assert str(ei.value).startswith(f"{param}="), str(ei.value)
    return ei.value


# ------------------------------------------------------------------------------ forward
LAYERS = {
    # name: (MoEConfig kwargs, scheme, needs correction bias)
    "qwen_softmax_fp32": (dict(E=8, k=2, H=64, I=32, dtype="float32"), "none", False),
    "olmoe_no_renorm_int4": (dict(E=8, k=3, H=128, I=128, dtype="float32",
                                  routing=Routing(renormalize=False)), "int4_w4a16", False),
    "deepseek_fp8_block_bf16": (dict(E=8, k=2, H=256, I=128, dtype="bfloat16",
                                     routing=Routing(scoring="sigmoid", num_groups=4, topk_groups=2,
                                                     has_correction_bias=True, routed_scaling_factor=2.5)),
                                "fp8_block", True),
    "gpt_oss_mxfp4_bias": (dict(E=8, k=2, H=128, I=64, dtype="bfloat16", activation="swigluoai", has_bias=True),
                           "mxfp4", False),
    "llama4_top1_on_input": (dict(E=4, k=1, H=64, I=32, dtype="bfloat16",
                                  routing=Routing(scoring="sigmoid", renormalize=False,
                                                  apply_router_weight_on_input=True)), "none", False),
    "ep_rank1_of2": (dict(E=8, k=2, H=64, I=32, dtype="float32", parallel=ParallelConfig(ep_size=2, ep_rank=1)),
                     "none", False),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_forward_matches_route_plus_reference(mk, name):
    kw, scheme, needs_bias = LAYERS[name]
    cfg = mk.config(**kw)
    w = mk.weights(cfg, scheme, seed=1)
    bias = torch.randn(cfg.num_experts, generator=torch.Generator().manual_seed(2)) * 0.3 if needs_bias else None
    layer = FusedMoE(cfg, w, correction_bias=bias)
    x = mk.x(cfg, 37, seed=3)
    logits = mk.logits(cfg, 37, seed=4)
    out = layer(x, logits)
    res = route(logits, cfg.top_k, cfg.routing, bias)
    ref = reference_moe(x, w, res.topk_weights, res.topk_ids, cfg)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert rel_error(out, ref) <= tolerance(cfg.dtype, w.scheme.method)
    tw, ti = layer.route(x, logits)
    assert torch.equal(ti, res.topk_ids) and torch.equal(tw, res.topk_weights)


def test_forward_zero_and_one_token(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    layer = FusedMoE(cfg, mk.weights(cfg, seed=5))
    out = layer(torch.empty(0, 64), torch.empty(0, 8))
    assert out.shape == (0, 64)
    x, logits = mk.x(cfg, 1, seed=6), mk.logits(cfg, 1, seed=7)
    res = route(logits, 2, cfg.routing)
    ref = reference_moe(x, layer.weights, res.topk_weights, res.topk_ids, cfg)
    assert rel_error(layer(x, logits), ref) <= tolerance("float32", "none")


def test_from_float_quantizes_and_selects(mk):
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="bfloat16", has_bias=True)
    w13, w2, b13, b2 = mk.float_weights(cfg, seed=8)
    layer = FusedMoE.from_float(cfg, w13.bfloat16(), w2.bfloat16(), "fp8_block",
                                w13_bias=b13.bfloat16(), w2_bias=b2.bfloat16())
    assert layer.weights.scheme == QuantScheme("fp8_block")
    assert layer.weights.w13.dtype == torch.float8_e4m3fn and layer.weights.w13_scale.shape == (8, 2, 2)
    sel = layer.selection
    assert sel.winner == "emulation" and sel.quant.name == "fp8_block"      # CPU: w8a8 -> emulation
    assert sel.candidate("grouped_mm").reasons                               # 16-bit only: a reason
    json.dumps(sel.to_dict())
    assert "emulation" in sel.explain() and "backend=emulation" in repr(layer)
    x, logits = mk.x(cfg, 20, seed=9), mk.logits(cfg, 20, seed=10)
    ref_w = quantize_experts(w13.bfloat16(), w2.bfloat16(), "fp8_block", w13_bias=b13.bfloat16(),
                             w2_bias=b2.bfloat16())
    res = route(logits, 2, cfg.routing)
    ref = reference_moe(x, ref_w, res.topk_weights, res.topk_ids, cfg)
    assert rel_error(layer(x, logits), ref) <= tolerance("bfloat16", "fp8_block")


def test_explicit_and_env_backend(mk, monkeypatch):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=11)
    assert FusedMoE(cfg, w).selection.winner == "grouped_mm"
    layer = FusedMoE(cfg, w, backend="torch_ref")
    assert (layer.selection.winner, layer.selection.source) == ("torch_ref", "argument")
    monkeypatch.setenv("FUSEDMOE_BACKEND", "torch_ref")
    assert FusedMoE(cfg, w).selection.source == "env:FUSEDMOE_BACKEND"


def test_shared_experts_module(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=12)
    shared = torch.nn.Linear(64, 64)
    x, logits = mk.x(cfg, 9, seed=13), mk.logits(cfg, 9, seed=14)
    with torch.no_grad():
        base = FusedMoE(cfg, w)(x, logits)
        out = FusedMoE(cfg, w, shared_experts=shared)(x, logits)
        torch.testing.assert_close(out, base + shared(x), rtol=1e-6, atol=1e-6)


def test_batched_layer_equals_standard(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=15)
    x, logits = mk.x(cfg, 30, seed=16), mk.logits(cfg, 30, seed=17)
    bat = FusedMoE(cfg, w, fmt="batched", max_num_tokens=8)
    assert bat.selection.winner == "torch_ref"                # grouped_mm is standard-only
    assert rel_error(bat(x, logits), FusedMoE(cfg, w)(x, logits)) <= tolerance("float32", "none")


# ------------------------------------------------------------------------------ fused_experts
def test_fused_experts_raw_tensors(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=18)
    x = mk.x(cfg, 11, seed=19)
    tw, ti = mk.topk(11, 8, 2, seed=20)
    out = fused_experts(x, w.w13, tw, ti, w2=w.w2)            # config inferred from the shapes
    assert rel_error(out, reference_moe(x, w, tw, ti, cfg)) <= tolerance("float32", "none")
    gcfg = cfg.replace(activation="gelu")
    out = fused_experts(x, w.w13, tw, ti, w2=w.w2, activation="gelu")
    assert rel_error(out, reference_moe(x, w, tw, ti, gcfg)) <= tolerance("float32", "none")
    # non-gated: w13 is [E, I, H]
    ncfg = cfg.replace(activation="relu2_no_mul")
    nw = mk.weights(ncfg, seed=21)
    out = fused_experts(x, nw.w13, tw, ti, w2=nw.w2, activation="relu2_no_mul")
    assert rel_error(out, reference_moe(x, nw, tw, ti, ncfg)) <= tolerance("float32", "none")


@pytest.mark.parametrize("scheme", ["fp8_block", "int4_w4a16",
                                    "mxfp4"])
def test_fused_experts_infers_config(mk, scheme):
    # config=None: inferred from the weights; for 4-bit schemes K is packed two per byte
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="bfloat16")
    w = mk.weights(cfg, scheme, seed=22)
    x = mk.x(cfg, 13, seed=23)
    tw, ti = mk.topk(13, 8, 2, seed=24)
    ref = reference_moe(x, w, tw, ti, cfg)
    assert rel_error(fused_experts(x, w, tw, ti), ref) <= tolerance("bfloat16", w.scheme.method)


@pytest.mark.parametrize("scheme", ["fp8_block", "int4_w4a16", "mxfp4"])
def test_fused_experts_with_expert_weights(mk, scheme):
    # quantized weights with an explicit config
    cfg = mk.config(E=8, k=2, H=256, I=128, dtype="bfloat16")
    w = mk.weights(cfg, scheme, seed=22)
    x = mk.x(cfg, 13, seed=23)
    tw, ti = mk.topk(13, 8, 2, seed=24)
    ref = reference_moe(x, w, tw, ti, cfg)
    tol = tolerance("bfloat16", w.scheme.method)
    assert rel_error(fused_experts(x, w, tw, ti, cfg), ref) <= tol
    assert rel_error(fused_experts(x, w, tw, ti, cfg, backend="torch_ref"), ref) <= tol


def test_fused_experts_selects_once(mk, monkeypatch):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=25)
    x = mk.x(cfg, 7, seed=26)
    tw, ti = mk.topk(7, 8, 2, seed=27)
    calls = []
    orig = layer_mod.select_backend
    monkeypatch.setattr(layer_mod, "select_backend", lambda *a, **kw: calls.append(a[3]) or orig(*a, **kw))
    a = fused_experts(x, w, tw, ti, cfg)
    b = fused_experts(x, w, tw, ti, cfg)
    assert calls == ["auto"] and torch.equal(a, b)
    fused_experts(x, w, tw, ti, cfg, backend="torch_ref")     # another backend: a new selection
    fused_experts(x, w.w13, tw, ti, w2=w.w2)                  # same tensors, same (inferred) config: cached
    assert calls == ["auto", "torch_ref"]


def test_fused_experts_logs_once(mk, caplog):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=28)
    x = mk.x(cfg, 7, seed=29)
    tw, ti = mk.topk(7, 8, 2, seed=30)
    with caplog.at_level(logging.INFO, logger="fusedmoe"):
        for _ in range(3):
            fused_experts(x, w, tw, ti, cfg)
    assert len([r for r in caplog.records if r.levelno == logging.INFO]) == 1


def test_fused_experts_cache_sees_new_biases(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32", has_bias=True)
    w = mk.weights(cfg, seed=31)
    x = mk.x(cfg, 7, seed=32)
    tw, ti = mk.topk(7, 8, 2, seed=33)
    fused_experts(x, w, tw, ti, cfg)
    w_other = w.replace(w13_bias=w.w13_bias * 10, w2_bias=w.w2_bias * 10)
    out = fused_experts(x, w_other, tw, ti, cfg)
    assert rel_error(out, reference_moe(x, w_other, tw, ti, cfg)) <= tolerance("float32", "none")


def test_fused_experts_rejects_bad_weights():
    expect_input_error("weights", lambda: fused_experts(torch.randn(2, 8), "w13", torch.rand(2, 1),
                                                        torch.zeros(2, 1, dtype=torch.int32)), ConfigTypeError)


# ------------------------------------------------------------------------------ bad inputs
@pytest.fixture
def layer32(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    return cfg, FusedMoE(cfg, mk.weights(cfg, seed=34))


def test_bad_forward_inputs_name_the_parameter(layer32, mk):
    cfg, layer = layer32
    x, logits = mk.x(cfg, 5, seed=35), mk.logits(cfg, 5, seed=36)
    tw, ti = layer.route(x, logits)
    expect_input_error("x.shape", lambda: layer(torch.randn(5, 63), logits))          # wrong hidden size
    expect_input_error("x.shape", lambda: layer.experts(torch.randn(64), tw, ti))     # 1-D
    expect_input_error("x.dtype", lambda: layer(x.bfloat16(), logits))                # wrong dtype
    expect_input_error("router_logits.shape", lambda: layer(x, logits[:, :7]))
    expect_input_error("topk_ids", lambda: layer.experts(x, tw, torch.full_like(ti, 8)))   # E is out of range
    bad = ti.clone()
    bad[2, 1] = -1
    expect_input_error("topk_ids", lambda: layer.experts(x, tw, bad))                 # negative id
    twice = ti.clone()
    twice[3, 1] = twice[3, 0]
    expect_input_error("topk_ids", lambda: layer.experts(x, tw, twice))               # an expert twice
    expect_input_error("topk_ids", lambda: layer.experts(x, tw, twice.long()))
    expect_input_error("topk_ids.shape", lambda: layer.experts(x, tw, ti[:, :1]))      # [T, 1] for k=2
    expect_input_error("topk_ids.shape", lambda: layer.experts(x, tw, ti[:4]))         # T mismatch
    expect_input_error("topk_weights.shape", lambda: layer.experts(x, tw[:, :1], ti))
    expect_input_error("topk_ids.dtype", lambda: layer.experts(x, tw, ti.float()))
    expect_input_error("x", lambda: layer.experts(x.tolist(), tw, ti), ConfigTypeError)
    assert torch.isfinite(layer.experts(x, tw.bfloat16(), ti.long())).all()           # int64 ids, bf16 weights ok


def test_data_checks_decided_at_construction(layer32, mk, monkeypatch):
    """The topk-id value checks run for CPU weights, elsewhere only with FUSEDMOE_DEBUG=1 set
    at construction (the variable is not read per call)."""
    cfg, layer = layer32
    pe = layer.prepared
    assert pe.data_checks                                            # CPU weights: always
    meta = pe.weights.to("meta")
    monkeypatch.setenv("FUSEDMOE_DEBUG", "1")
    debug_pe = layer_mod.PreparedExperts(cfg, meta, pe.selection, pe.kernel, None)
    monkeypatch.delenv("FUSEDMOE_DEBUG")
    quiet_pe = layer_mod.PreparedExperts(cfg, meta, pe.selection, pe.kernel, None)
    monkeypatch.setenv("FUSEDMOE_DEBUG", "1")                       # too late for quiet_pe
    assert debug_pe.data_checks and not quiet_pe.data_checks
    x = mk.x(cfg, 3)
    tw, ti = mk.topk(3, 8, 2)
    ti[0, 0] = 99
    layer_mod.check_inputs(cfg, x, tw, ti, x.device, False)           # values not looked at
    expect_input_error("topk_ids", lambda: layer_mod.check_inputs(cfg, x, tw, ti, x.device, True))


def test_prepare_experts_type_errors(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=37)
    expect_input_error("config", lambda: prepare_experts({"E": 8}, w), ConfigTypeError)
    expect_input_error("weights", lambda: prepare_experts(cfg, (w.w13, w.w2)), ConfigTypeError)


def _fp8c(mk, cfg):
    return mk.weights(cfg, "fp8_channel", seed=38)


BAD_WEIGHTS = [
    # (name, param, build(mk, cfg) -> ExpertWeights) for cfg = E=8, k=2, H=128, I=64, fp32
    ("w13_hidden", "w13", lambda mk, c: mk.weights(c.replace(hidden_size=64), seed=39)),   # H 64 vs 128
    ("w2_inter", "w2", lambda mk, c: ExpertWeights(mk.weights(c, seed=40).w13,
                                                   torch.randn(8, 128, 48))),             # I 48 vs 64
    ("w13_experts", "w13", lambda mk, c: mk.weights(c.replace(num_experts=4, top_k=2), seed=41)),
    ("w13_dtype", "w13.dtype", lambda mk, c: _fp8c(mk, c).replace(w13=torch.randn(8, 128, 128))),
    ("scale_shape", "w13_scale", lambda mk, c: _fp8c(mk, c).replace(w13_scale=torch.rand(8, 127))),
    ("scale_dtype", "w13_scale.dtype", lambda mk, c: _fp8c(mk, c).replace(w13_scale=torch.rand(8, 128).half())),
    ("scale_missing", "w2_scale", lambda mk, c: _fp8c(mk, c).replace(w2_scale=None)),
    ("scale_on_none", "w13_scale", lambda mk, c: mk.weights(c, seed=42).replace(w13_scale=torch.rand(8))),
    ("bias_unexpected", "w13_bias", lambda mk, c: mk.weights(c, seed=43).replace(w13_bias=torch.rand(8, 128))),
    ("zero_unexpected", "w13_zero", lambda mk, c: mk.weights(c, "int4_w4a16:g32", seed=44).replace(
        w13_zero=torch.zeros(8, 128, 4, dtype=torch.uint8))),
    ("device", "w2", lambda mk, c: mk.weights(c, seed=45).replace(w2=torch.empty(8, 128, 64, device="meta"))),
]


@pytest.mark.parametrize("name,param,build", BAD_WEIGHTS, ids=[b[0] for b in BAD_WEIGHTS])
def test_bad_weights_name_the_tensor(mk, name, param, build):
    cfg = mk.config(E=8, k=2, H=128, I=64, dtype="float32")
    w = build(mk, cfg)
    expect_input_error(param, lambda: w.validate(cfg))
    expect_input_error(param, lambda: FusedMoE(cfg, w))       # the layer validates at construction


def test_bad_weights_ep_and_bias(mk):
    # EP: weights must hold E_loc = E / ep_size experts, not all of them; has_bias needs both biases
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32", parallel=ParallelConfig(ep_size=2, ep_rank=0))
    full = mk.weights(cfg.replace(parallel=ParallelConfig()), seed=46)
    expect_input_error("w13", lambda: full.validate(cfg))
    bcfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32", has_bias=True)
    w = mk.weights(bcfg, seed=47)
    expect_input_error("w2_bias", lambda: w.replace(w2_bias=None).validate(bcfg))
    expect_input_error("w13_bias", lambda: w.replace(w13_bias=torch.rand(8, 63)).validate(bcfg))


def test_correction_bias_checks(mk):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32",
                    routing=Routing(scoring="sigmoid", has_correction_bias=True))
    w = mk.weights(cfg, seed=48)
    expect_input_error("correction_bias", lambda: FusedMoE(cfg, w))                       # missing
    expect_input_error("correction_bias", lambda: FusedMoE(cfg, w, correction_bias=torch.rand(7)))
    plain = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    expect_input_error("correction_bias", lambda: FusedMoE(plain, mk.weights(plain, seed=49),
                                                           correction_bias=torch.rand(8)))  # not declared
    layer = FusedMoE(cfg, w, correction_bias=torch.rand(8, dtype=torch.float64))
    assert layer.correction_bias.dtype == torch.float32


def test_deepcopy_is_independent(mk):
    import copy
    import gc
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    layer = FusedMoE(cfg, mk.weights(cfg, seed=55))
    x, logits = mk.x(cfg, 5, seed=56), mk.logits(cfg, 5, seed=57)
    ref = layer(x, logits)
    clone = copy.deepcopy(layer)
    del layer
    gc.collect()
    assert torch.equal(clone(x, logits), ref)


# ------------------------------------------------------------------------------ torch.compile
class Block(torch.nn.Module):
    """A gate + FusedMoE, the way a model uses it."""

    def __init__(self, layer: FusedMoE, H: int, E: int):
        super().__init__()
        self.gate = torch.nn.Linear(H, E, bias=False)
        self.moe = layer

    def forward(self, x):
        return self.moe(x, self.gate(x))


def _block(mk, scheme="none"):
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    torch.manual_seed(50)
    return Block(FusedMoE(cfg, mk.weights(cfg, scheme, seed=51)), 64, 8), cfg


def test_compile_fullgraph(mk):
    # backend="aot_eager": dynamo must capture ONE graph (fullgraph) through routing and the
    # fusedmoe::experts custom op (its fake impl is used for tracing). Inductor's C++
    # codegen adds ~45 s on this 2-core box and tests nothing of ours: see the slow test.
    block, cfg = _block(mk)
    x = mk.x(cfg, 6, seed=52)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
        assert rel_error(compiled(x), eager) <= tolerance("float32", "none")
        x2 = mk.x(cfg, 11, seed=53)                             # another T: still one graph each
        assert rel_error(compiled(x2), block(x2)) <= tolerance("float32", "none")


@pytest.mark.slow
def test_compile_fullgraph_inductor(mk):
    block, cfg = _block(mk)
    x = mk.x(cfg, 6, seed=52)
    torch._dynamo.reset()
    with torch.no_grad():
        assert rel_error(torch.compile(block, fullgraph=True)(x), block(x)) <= tolerance("float32", "none")


@pytest.mark.filterwarnings("ignore::UserWarning")    # autograd anomaly report of the failing backward
def test_compile_with_grad_enabled(mk):
    block, cfg = _block(mk)
    x = mk.x(cfg, 6, seed=54)
    torch._dynamo.reset()
    eager = block(x).detach()
    assert rel_error(torch.compile(block, fullgraph=True, backend="aot_eager")(x).detach(), eager) <= 1e-4


def test_state_dict_holds_the_weights_and_moving_is_refused(mk):
    # edge: the selected kernels hold converted weights; .to()/.half() must not silently desync
    from fusedmoe.errors import ConfigError
    cfg = mk.config(E=8, k=2, H=64, I=32, dtype="float32")
    w = mk.weights(cfg, seed=61)
    layer = FusedMoE(cfg, w, backend="torch_ref")
    sd = layer.state_dict()
    assert {"w13", "w2"} <= set(sd) and torch.equal(sd["w13"], w.w13)
    assert layer.to("cpu") is layer                  # a no-op move is fine
    with pytest.raises(ConfigError, match="FusedMoE.to"):
        layer.half()
