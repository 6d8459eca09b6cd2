"""Bad input at every public entry: a fusedmoe error, never a raw AttributeError / ValueError /
TypeError, never garbage. Each case gives the exception type (exactly), the parameter the
message must name, and a piece of the accepted values the message must hold; every message
also carries the value given and a fix (``name=<value> ...; accepted: ... Fix: ...``).

Tiny CPU layers: E=4, top-2, H=32, I=16, fp32 (every case runs in milliseconds).
"""
from __future__ import annotations

import pytest
import torch

import fusedmoe
from fusedmoe import (ConfigError, ConfigTypeError, ExpertWeights, FusedMoE, InputError, MoEConfig, ParallelConfig,
                      Platform, QuantScheme, Routing, dequantize_experts, from_deepseek_fp8, from_fused_gate_up,
                      from_per_expert, from_quantized_per_expert, fused_experts, prepare_experts, quantize_experts,
                      select_backend)
from fusedmoe import env

E, K, H, I = 4, 2, 32, 16
CFG = MoEConfig(E, K, H, I, dtype="float32")
BIAS_CFG = MoEConfig(E, K, H, I, dtype="float32", routing=Routing(scoring="sigmoid", has_correction_bias=True))
_g = torch.Generator().manual_seed(0)
W13 = torch.randn(E, 2 * I, H, generator=_g) / H ** 0.5          # [E, N, H]
W2 = torch.randn(E, H, I, generator=_g) / I ** 0.5               # [E, H, I]
EW = ExpertWeights(W13, W2)
FP8 = quantize_experts(W13, W2, "fp8_tensor")
X = torch.randn(3, H, generator=_g)                              # [T, H]
TW = torch.full((3, K), 0.5)                                     # [T, k] fp32
TI = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)   # [T, k]
LOGITS = torch.randn(3, E, generator=_g)                         # [T, E]
# DeepSeek-style fp8 experts with 128 x 128 blocks: w13 [E, 256, 128], w2 [E, 128, 128]
DS13 = torch.randn(E, 256, 128, generator=_g).to(torch.float8_e4m3fn)
DS2 = torch.randn(E, 128, 128, generator=_g).to(torch.float8_e4m3fn)
ONES13, ONES2 = torch.ones(E, 2, 1), torch.ones(E, 1, 1)
GATE = [W13[e, :I] for e in range(E)]                            # per-expert [I, H]
UP = [W13[e, I:] for e in range(E)]
DOWN = [W2[e] for e in range(E)]
Q8 = [t.to(torch.float8_e4m3fn) for t in GATE]
QD = [t.to(torch.float8_e4m3fn) for t in DOWN]
S_CH = [torch.ones(I, 1) for _ in range(E)]
S_DN = [torch.ones(H, 1) for _ in range(E)]


def _layer(cfg=CFG, **kw):
    return FusedMoE(cfg, EW, **kw)


def _nan_at(t, idx):
    t = t.clone()
    t[idx] = float("nan")
    return t


def _static_fp8(**scales):
    kw = dict(a13_scale=torch.ones(1), a2_scale=torch.ones(1))
    kw.update(scales)
    return ExpertWeights(FP8.w13, FP8.w2, QuantScheme("fp8_tensor", static_activation_scale=True),
                         FP8.w13_scale, FP8.w2_scale, **kw)


LAYER = None


def _forward(x, logits):
    global LAYER
    LAYER = LAYER or _layer()
    return LAYER(x, logits)


# (id, call, exception type, parameter named, a piece of the accepted values)
CASES = [
    # ---- MoEConfig
    ("cfg-experts-0", lambda: MoEConfig(0, 1, H, I), ConfigError, "num_experts", ">= 1"),
    ("cfg-topk-float", lambda: MoEConfig(E, 1.5, H, I), ConfigTypeError, "top_k", "int"),
    ("cfg-topk>E", lambda: MoEConfig(E, 5, H, I), ConfigError, "top_k", "1..num_experts=4"),
    ("cfg-act", lambda: MoEConfig(E, K, H, I, activation="swish"), ConfigError, "activation", "silu"),
    ("cfg-act-type", lambda: MoEConfig(E, K, H, I, activation=3), ConfigTypeError, "activation", "silu"),
    ("cfg-dtype", lambda: MoEConfig(E, K, H, I, dtype="int8"), ConfigError, "dtype", "bfloat16"),
    ("cfg-dtype-list", lambda: MoEConfig(E, K, H, I, dtype=["bf16"]), ConfigError, "dtype", "float16"),
    ("cfg-bias-str", lambda: MoEConfig(E, K, H, I, has_bias="yes"), ConfigTypeError, "has_bias", "bool"),
    ("cfg-limit-nan", lambda: MoEConfig(E, K, H, I, swiglu_limit=float("nan")), ConfigError, "swiglu_limit", "finite"),
    ("cfg-limit-act", lambda: MoEConfig(E, K, H, I, activation="gelu", swiglu_limit=7.0), ConfigError,
     "swiglu_limit", "None"),
    ("cfg-alpha-inf", lambda: MoEConfig(E, K, H, I, swigluoai_alpha=float("inf")), ConfigError,
     "swigluoai_alpha", "finite"),
    ("cfg-layout", lambda: MoEConfig(E, K, H, I, gate_up_layout="interleaved"), ConfigError, "gate_up_layout",
     "halves"),
    ("cfg-routing-type", lambda: MoEConfig(E, K, H, I, routing="softmax"), ConfigTypeError, "routing", "Routing"),
    ("cfg-parallel-type", lambda: MoEConfig(E, K, H, I, parallel=2), ConfigTypeError, "parallel", "ParallelConfig"),
    ("cfg-ep-divides", lambda: MoEConfig(6, K, H, I, parallel=ParallelConfig(ep_size=4)), ConfigError,
     "num_experts", "multiple of ep_size=4"),
    ("cfg-replace", lambda: CFG.replace(num_expert=8), ConfigError, "num_expert", "num_experts, top_k"),
    # ---- Routing
    ("routing-scoring", lambda: Routing(scoring="tanh"), ConfigError, "scoring", "sigmoid"),
    ("routing-renorm", lambda: Routing(renormalize=1), ConfigTypeError, "renormalize", "bool"),
    ("routing-groups", lambda: Routing(num_groups=4), ConfigError, "topk_groups", "both num_groups and topk_groups"),
    ("routing-topk-groups", lambda: Routing(num_groups=2, topk_groups=3), ConfigError, "topk_groups",
     "1..num_groups=2"),
    ("routing-scale-0", lambda: Routing(routed_scaling_factor=0), ConfigError, "routed_scaling_factor", "> 0"),
    ("routing-scale-nan", lambda: Routing(routed_scaling_factor=float("nan")), ConfigError,
     "routed_scaling_factor", "finite"),
    ("routing-scale-str", lambda: Routing(routed_scaling_factor="2.5"), ConfigTypeError, "routed_scaling_factor",
     "float"),
    ("routing-custom", lambda: Routing(custom=5), ConfigTypeError, "custom", "register_routing_fn"),
    # ---- QuantScheme / parse
    ("quant-method", lambda: QuantScheme("int3"), ConfigError, "method", "fp8_block"),
    ("quant-group", lambda: QuantScheme("int4_w4a16", group_size=48), ConfigError, "group_size", "32, 64, 128"),
    ("quant-group-str", lambda: QuantScheme("int4_w4a16", group_size="64"), ConfigTypeError, "group_size", "int"),
    ("quant-zp-type", lambda: QuantScheme("int4_w4a16", has_zero_point="yes"), ConfigTypeError, "has_zero_point",
     "bool"),
    ("quant-block", lambda: QuantScheme("fp8_block", block_shape=(128,)), ConfigError, "block_shape", "(bn, bk)"),
    ("quant-zp-method", lambda: QuantScheme("fp8_channel", has_zero_point=True), ConfigError, "has_zero_point",
     "False"),
    ("parse-name", lambda: QuantScheme.parse("int3"), ConfigError, "quant", "int4_w4a16"),
    ("parse-type", lambda: QuantScheme.parse(8), ConfigTypeError, "quant", "QuantScheme"),
    ("parse-bNx", lambda: QuantScheme.parse("fp8_block:b128x"), ConfigError, "quant", "bNxK"),
    ("parse-bx", lambda: QuantScheme.parse("fp8_block:bx"), ConfigError, "quant", "bNxK"),
    ("parse-option", lambda: QuantScheme.parse("int4_w4a16:g64:sym"), ConfigError, "quant", "zp"),
    ("parse-repeat-zp", lambda: QuantScheme.parse("int4_w4a16:g64:zp:zp"), ConfigError, "quant", "at most once"),
    ("parse-repeat-g", lambda: QuantScheme.parse("int4_w4a16:g64:g128"), ConfigError, "quant", "at most once"),
    ("parse-empty-option", lambda: QuantScheme.parse("fp8_block:"), ConfigError, "quant", "NAME[:gN]"),
    # ---- ParallelConfig
    ("parallel-ep-0", lambda: ParallelConfig(ep_size=0), ConfigError, "ep_size", ">= 1"),
    ("parallel-rank", lambda: ParallelConfig(ep_size=2, ep_rank=2), ConfigError, "ep_rank", "0..1"),
    ("parallel-placement", lambda: ParallelConfig(placement="random"), ConfigError, "placement", "round_robin"),
    ("parallel-ep-str", lambda: ParallelConfig(ep_size="2"), ConfigTypeError, "ep_size", "int"),
    # ---- ExpertWeights
    ("ew-list", lambda: ExpertWeights([1], [2]), ConfigTypeError, "w13", "torch.Tensor"),
    ("ew-scale-type", lambda: ExpertWeights(W13, W2, w13_scale=1.0), ConfigTypeError, "w13_scale", "or None"),
    ("ew-scheme-type", lambda: ExpertWeights(W13, W2, scheme=3), ConfigTypeError, "scheme", "QuantScheme"),
    ("ew-act-scale-0", lambda: _static_fp8(a13_scale=torch.zeros(1)), InputError, "a13_scale", "finite values > 0"),
    ("ew-act-scale-neg", lambda: _static_fp8(a2_scale=-torch.ones(1)), InputError, "a2_scale", "> 0"),
    ("ew-act-scale-nan", lambda: _static_fp8(a2_scale=torch.full((1,), float("nan"))), InputError, "a2_scale",
     "no NaN"),
    ("ew-act-scale-inf", lambda: _static_fp8(a13_scale=torch.full((1,), float("inf"))), InputError, "a13_scale",
     "finite"),
    ("ew-weight-scale-0", lambda: ExpertWeights(FP8.w13, FP8.w2, FP8.scheme, torch.zeros(E), FP8.w2_scale),
     InputError, "w13_scale", "> 0"),
    ("ew-weight-scale-neg", lambda: ExpertWeights(FP8.w13, FP8.w2, FP8.scheme, FP8.w13_scale, -FP8.w2_scale),
     InputError, "w2_scale", "> 0"),
    ("ew-mixed-dtypes", lambda: prepare_experts(CFG, ExpertWeights(W13.bfloat16(), W2)), InputError, "w2.dtype",
     "torch.bfloat16"),
    ("ew-shape", lambda: prepare_experts(CFG, ExpertWeights(W13[:, :8], W2)), InputError, "w13", "shape (4, 32, 32)"),
    ("ew-validate-config", lambda: EW.validate("cfg"), ConfigTypeError, "config", "MoEConfig"),
    ("ew-replace", lambda: EW.replace(w3=W2), ConfigError, "w3", "w13, w2, scheme"),
    ("ew-to", lambda: EW.to("tpu"), ConfigError, "device", "'cuda:1'"),
    ("ew-bias-int", lambda: prepare_experts(CFG.replace(has_bias=True), ExpertWeights(
        W13, W2, w13_bias=torch.zeros(E, 2 * I, dtype=torch.int32), w2_bias=torch.zeros(E, H, dtype=torch.int32))),
     InputError, "w13_bias.dtype", "torch.float32"),
    # ---- quantize_experts / dequantize_experts
    ("quantize-list", lambda: quantize_experts([1], [2], "fp8_block"), ConfigTypeError, "w13", "torch.Tensor"),
    ("quantize-2d", lambda: quantize_experts(W13[0], W2, "fp8_block"), InputError, "w13.shape", "3-D"),
    ("quantize-E", lambda: quantize_experts(W13, W2[:2], "fp8_block"), InputError, "w2.shape[0]", "E=4"),
    ("quantize-dtype", lambda: quantize_experts(W13.to(torch.int8), W2.to(torch.int8), "fp8_block"), InputError,
     "w13.dtype", "torch.bfloat16"),
    ("quantize-scheme", lambda: quantize_experts(W13, W2, "fp9"), ConfigError, "quant", "fp8_block"),
    ("quantize-group-K", lambda: quantize_experts(W13, W2, "int4_w4a16:g64"), InputError, "w13.shape[2]",
     "multiple of group_size=64"),
    ("quantize-static-missing", lambda: quantize_experts(W13, W2, "fp8_tensor:static"), InputError, "a13_scale",
     "1-element tensor"),
    ("quantize-static-0", lambda: quantize_experts(W13, W2, "fp8_tensor:static", a13_scale=0.0, a2_scale=1.0),
     InputError, "a13_scale", "finite float > 0"),
    ("quantize-static-extra", lambda: quantize_experts(W13, W2, "fp8_tensor", a13_scale=1.0), ConfigError,
     "a13_scale", "None"),
    ("quantize-bias", lambda: quantize_experts(W13, W2, "none", w13_bias=torch.zeros(E, 3)), InputError,
     "w13_bias.shape", "(4, 32)"),
    ("dequantize-type", lambda: dequantize_experts(W13), ConfigTypeError, "weights", "ExpertWeights"),
    # ---- from_deepseek_fp8
    ("ds-scale-0", lambda: from_deepseek_fp8(DS13, DS2, torch.zeros(E, 2, 1), ONES2), InputError, "w13_scale_inv",
     "finite values > 0"),
    ("ds-scale-neg", lambda: from_deepseek_fp8(DS13, DS2, ONES13, -ONES2), InputError, "w2_scale_inv", "> 0"),
    ("ds-scale-nan", lambda: from_deepseek_fp8(DS13, DS2, _nan_at(ONES13, (1, 1, 0)), ONES2), InputError,
     "w13_scale_inv", "no NaN"),
    ("ds-scale-inf", lambda: from_deepseek_fp8(DS13, DS2, ONES13, ONES2 * float("inf")), InputError, "w2_scale_inv",
     "finite"),
    ("ds-scale-shape", lambda: from_deepseek_fp8(DS13, DS2, torch.ones(E, 1, 1), ONES2), InputError,
     "w13_scale_inv.shape", "(4, 2, 1)"),
    ("ds-scale-int", lambda: from_deepseek_fp8(DS13, DS2, torch.ones(E, 2, 1, dtype=torch.int32), ONES2), InputError,
     "w13_scale_inv.dtype", "float"),
    ("ds-scale-list", lambda: from_deepseek_fp8(DS13, DS2, [1.0], ONES2), ConfigTypeError, "w13_scale_inv", "Tensor"),
    ("ds-dtype", lambda: from_deepseek_fp8(DS13.float(), DS2.float(), ONES13, ONES2), InputError, "w13_fp8.dtype",
     "float8_e4m3fn"),
    ("ds-block", lambda: from_deepseek_fp8(DS13, DS2, ONES13, ONES2, block_shape=128), ConfigError, "block_shape",
     "(bn, bk)"),
    # ---- from_per_expert / from_fused_gate_up / from_quantized_per_expert
    ("per-expert-tensor", lambda: from_per_expert(W13[:, :I], UP, DOWN), InputError, "gate", "a list of 2-D"),
    ("per-expert-int", lambda: from_per_expert(GATE, 3, DOWN), ConfigTypeError, "up", "non-empty list"),
    ("per-expert-len", lambda: from_per_expert(GATE, UP[:3], DOWN), InputError, "len(up)", "4 (len(gate))"),
    ("per-expert-item", lambda: from_per_expert(GATE, UP, DOWN[:3] + [None]), ConfigTypeError, "down[3]", "Tensor"),
    ("per-expert-devices-dtypes", lambda: from_per_expert(GATE[:3] + [GATE[3].double()], UP, DOWN), InputError,
     "gate[*].dtype", "one dtype"),
    ("fused-transposed", lambda: from_fused_gate_up(W13, W2, transposed="yes"), ConfigTypeError, "transposed",
     "bool"),
    ("fused-layout", lambda: from_fused_gate_up(W13, W2, transposed=True), InputError, "transposed",
     "a value matching"),
    ("quantized-scheme", lambda: from_quantized_per_expert(Q8, None, QD, S_CH, None, S_DN, "fp8_block"),
     ConfigError, "scheme", "fp8_channel"),
    ("quantized-scale-0", lambda: from_quantized_per_expert(Q8, None, QD, [s * 0 for s in S_CH], None, S_DN,
                                                            "fp8_channel"), InputError, "gate_scale", "finite"),
    ("quantized-scale-type", lambda: from_quantized_per_expert(Q8, None, QD, 1.0, None, S_DN, "fp8_channel"),
     ConfigTypeError, "gate_scale", "list of tensors"),
    ("quantized-dtype", lambda: from_quantized_per_expert(GATE, None, DOWN, S_CH, None, S_DN, "fp8_channel"),
     InputError, "gate.dtype", "float8_e4m3fn"),
    # ---- prepare_experts
    ("prepare-config", lambda: prepare_experts("cfg", EW), ConfigTypeError, "config", "MoEConfig"),
    ("prepare-weights", lambda: prepare_experts(CFG, (W13, W2)), ConfigTypeError, "weights", "ExpertWeights"),
    ("prepare-fmt", lambda: prepare_experts(CFG, EW, fmt="foo"), ConfigError, "fmt", "standard, batched"),
    ("prepare-fmt-type", lambda: prepare_experts(CFG, EW, fmt=1), ConfigTypeError, "fmt", "standard, batched"),
    ("prepare-max-tokens-neg", lambda: prepare_experts(CFG, EW, fmt="batched", max_num_tokens=-4), ConfigError,
     "max_num_tokens", ">= 1"),
    ("prepare-max-tokens-0", lambda: prepare_experts(CFG, EW, fmt="batched", max_num_tokens=0), ConfigError,
     "max_num_tokens", ">= 1"),
    ("prepare-max-tokens-float", lambda: prepare_experts(CFG, EW, fmt="batched", max_num_tokens=2.5),
     ConfigTypeError, "max_num_tokens", "int"),
    ("prepare-chunk", lambda: prepare_experts(CFG, EW, chunk_size=0), ConfigError, "chunk_size", ">= 1"),
    ("prepare-deterministic", lambda: prepare_experts(CFG, EW, deterministic="yes"), ConfigTypeError,
     "deterministic", "bool"),
    ("prepare-backend-type", lambda: prepare_experts(CFG, EW, backend=None), ConfigTypeError, "backend", "auto"),
    ("prepare-backend", lambda: prepare_experts(CFG, EW, backend="nope"), ConfigError, "backend", "torch_ref"),
    ("prepare-shared", lambda: prepare_experts(CFG, EW, shared_experts=3), ConfigTypeError, "shared_experts",
     "callable"),
    ("prepare-platform-gpu-on-cpu", lambda: prepare_experts(CFG, EW, platform="h100"), ConfigError, "platform",
     "'current', 'cpu'"),
    ("prepare-platform-name", lambda: prepare_experts(CFG, EW, platform="tpu"), ConfigError, "platform", "h100"),
    ("prepared-call-x", lambda: prepare_experts(CFG, EW)([1.0], TW, TI), ConfigTypeError, "x", "torch.Tensor"),
    ("prepared-call-ids", lambda: prepare_experts(CFG, EW)(X, TW, [[0, 1]] * 3), ConfigTypeError, "topk_ids",
     "int32"),
    ("prepared-call-range", lambda: prepare_experts(CFG, EW)(X, TW, TI + 2), InputError, "topk_ids", "[0, 4)"),
    # ---- fused_experts
    ("fused-x-list", lambda: fused_experts([[0.0] * H] * 3, EW, TW, TI), ConfigTypeError, "x", "torch.Tensor"),
    ("fused-weights-list", lambda: fused_experts(X, [1], TW, TI), ConfigTypeError, "weights", "ExpertWeights"),
    ("fused-w2-missing", lambda: fused_experts(X, W13, TW, TI), ConfigTypeError, "w2", "torch.Tensor"),
    ("fused-tw-list", lambda: fused_experts(X, EW, [[0.5, 0.5]] * 3, TI), ConfigTypeError, "topk_weights", "fp32"),
    ("fused-ids-list", lambda: fused_experts(X, EW, TW, [[0, 1]] * 3), ConfigTypeError, "topk_ids", "int32"),
    ("fused-config", lambda: fused_experts(X, EW, TW, TI, config="cfg"), ConfigTypeError, "config", "MoEConfig"),
    ("fused-x-shape", lambda: fused_experts(X[:, :8], EW, TW, TI, config=CFG), InputError, "x.shape", "[T, 32]"),
    ("fused-x-int", lambda: fused_experts(X.int(), EW, TW, TI), InputError, "x.dtype", "torch.bfloat16"),
    ("fused-x-dtype", lambda: fused_experts(X.double(), EW, TW, TI, config=CFG), InputError, "x.dtype",
     "torch.float32"),
    ("fused-ids-shape", lambda: fused_experts(X, EW, TW, TI[:, :1], config=CFG), InputError, "topk_ids.shape",
     "[3, 2]"),
    ("fused-ids-dtype", lambda: fused_experts(X, EW, TW, TI.float(), config=CFG), InputError, "topk_ids.dtype",
     "torch.int32"),
    ("fused-tw-dtype", lambda: fused_experts(X, EW, TW.int(), TI, config=CFG), InputError, "topk_weights.dtype",
     "torch.float32"),
    ("fused-activation", lambda: fused_experts(X, EW, TW, TI, activation="swish"), ConfigError, "activation",
     "silu"),
    # ---- FusedMoE
    ("layer-config", lambda: FusedMoE("cfg", EW), ConfigTypeError, "config", "MoEConfig"),
    ("layer-weights", lambda: FusedMoE(CFG, W13), ConfigTypeError, "weights", "ExpertWeights"),
    ("layer-fmt", lambda: _layer(fmt="foo"), ConfigError, "fmt", "standard, batched"),
    ("layer-max-tokens", lambda: _layer(fmt="batched", max_num_tokens=-4), ConfigError, "max_num_tokens", ">= 1"),
    ("layer-platform", lambda: _layer(platform="H100"), ConfigError, "platform", "'current', 'cpu'"),
    ("layer-bias-missing", lambda: _layer(BIAS_CFG), InputError, "correction_bias", "fp32 tensor [4]"),
    ("layer-bias-list", lambda: _layer(BIAS_CFG, correction_bias=[0.0] * E), ConfigTypeError, "correction_bias",
     "float tensor [4]"),
    ("layer-bias-int", lambda: _layer(BIAS_CFG, correction_bias=torch.zeros(E, dtype=torch.int64)), InputError,
     "correction_bias.dtype", "torch.float32"),
    ("layer-bias-nan", lambda: _layer(BIAS_CFG, correction_bias=_nan_at(torch.zeros(E), 1)), InputError,
     "correction_bias", "finite values"),
    ("layer-bias-inf", lambda: _layer(BIAS_CFG, correction_bias=torch.tensor([0.0, float("inf"), 0.0, 0.0])),
     InputError, "correction_bias", "finite values"),
    ("layer-bias-unwanted", lambda: _layer(correction_bias=torch.zeros(E)), InputError, "correction_bias", "None"),
    ("layer-custom-routing", lambda: _layer(CFG.replace(routing=Routing(custom="nope"))), ConfigError,
     "Routing.custom", "sqrtsoftplus"),
    ("forward-x-3d", lambda: _forward(X.reshape(3, 1, H), LOGITS), InputError, "x.shape", "[T, 32]"),
    ("forward-x-3d-flat-logits", lambda: _forward(torch.randn(2, 3, H), torch.randn(6, E)), InputError, "x.shape",
     "[T, 32]"),
    ("forward-x-list", lambda: _forward([1.0, 2.0], LOGITS), ConfigTypeError, "x", "torch.Tensor"),
    ("forward-logits-list", lambda: _forward(X, [[0.0] * E] * 3), ConfigTypeError, "router_logits", "[T, 4]"),
    ("forward-logits-shape", lambda: _forward(X, LOGITS[:, :3]), InputError, "router_logits.shape", "[3, 4]"),
    ("forward-logits-int", lambda: _forward(X, LOGITS.int()), InputError, "router_logits.dtype", "torch.float32"),
    ("forward-x-dtype", lambda: _forward(X.half(), LOGITS), InputError, "x.dtype", "torch.float32"),
    # ---- select_backend
    ("select-backend", lambda: select_backend(CFG, "none", "cpu", "nope"), ConfigError, "backend", "torch_ref"),
    ("select-quant", lambda: select_backend(CFG, "int3", "cpu"), ConfigError, "quant", "fp8_block"),
    ("select-platform", lambda: select_backend(CFG, "none", "tpu"), ConfigError, "platform", "h100"),
    ("select-config", lambda: select_backend("cfg", "none", "cpu"), ConfigTypeError, "config", "MoEConfig"),
    ("select-fmt", lambda: select_backend(CFG, "none", "cpu", fmt="foo"), ConfigError, "fmt", "standard, batched"),
    ("select-requested-list", lambda: select_backend(CFG, "none", "cpu", ["triton"]), ConfigTypeError, "backend",
     "'auto' or a backend name"),
    ("select-deterministic", lambda: select_backend(CFG, "none", "cpu", deterministic="yes"), ConfigTypeError,
     "deterministic", "bool"),
    ("select-max-tokens", lambda: select_backend(CFG, "none", "cpu", max_tokens=-1), ConfigError, "max_tokens",
     ">= 1"),
    # ---- Platform.preset
    ("platform-preset", lambda: Platform.preset("tpu"), ConfigError, "platform", "a100, b200, cpu, h100, h200"),
    ("platform-preset-int", lambda: Platform.preset(100), ConfigTypeError, "platform", "a100, b200, cpu, h100"),
    ("platform-resolve-list", lambda: Platform.resolve(["h100"]), ConfigTypeError, "platform", "h100"),
]


@pytest.mark.parametrize("call,exc,param,accepted", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(call, exc, param, accepted):
    with pytest.raises(exc) as ei:
        call()
    e = ei.value
    assert type(e) is exc, f"{type(e).__name__}: {e}"
    msg = str(e)
    assert msg.startswith(f"{param}="), msg                      # names the parameter and the value given
    assert ("accepted: " in msg or "expected " in msg) and accepted in msg, msg
    assert "Fix: " in msg and msg.split("Fix: ")[1].strip(), msg


def test_case_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


# ------------------------------------------------------------------------------ environment variables
@pytest.mark.parametrize("value", ["nope", "off", "on", "yes", "2", "-1", "truee"])
def test_debug_variable_rejects_other_words(monkeypatch, value):
    # FUSEDMOE_DEBUG=nope used to count as on
    monkeypatch.setenv("FUSEDMOE_DEBUG", value)
    with pytest.raises(ConfigError) as ei:
        env.debug()
    msg = str(ei.value)
    assert msg.startswith(f"FUSEDMOE_DEBUG={value!r}") and "0, 1, true, false" in msg and "Fix: " in msg


@pytest.mark.parametrize("value,on", [("", False), ("0", False), ("false", False), ("FALSE", False), (" 1 ", True),
                                      ("true", True), ("True", True)])
def test_debug_variable_accepts_0_1_true_false(monkeypatch, value, on):
    monkeypatch.setenv("FUSEDMOE_DEBUG", value)
    assert env.debug() is on


def test_debug_variable_is_checked_when_a_layer_is_built(monkeypatch):
    monkeypatch.setenv("FUSEDMOE_DEBUG", "nope")
    with pytest.raises(ConfigError, match="FUSEDMOE_DEBUG='nope'"):
        prepare_experts(CFG, EW)


@pytest.mark.parametrize("name,value,accepted", [
    ("FUSEDMOE_CHUNK_SIZE", "0", "a positive integer"),
    ("FUSEDMOE_CHUNK_SIZE", "lots", "a positive integer"),
    ("FUSEDMOE_LOG_LEVEL", "loud", "DEBUG, INFO"),
    ("FUSEDMOE_BACKEND", "nope", "torch_ref"),
    ("FUSEDMOE_DISABLE_BACKENDS", "tritn", "triton"),
])
def test_bad_variable(monkeypatch, name, value, accepted):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as ei:
        if name == "FUSEDMOE_CHUNK_SIZE":
            env.chunk_size()
        elif name == "FUSEDMOE_LOG_LEVEL":
            env.log_level()
        else:
            select_backend(CFG, "none", "cpu")
    msg = str(ei.value)
    assert msg.startswith(f"{name}=") and accepted in msg and "Fix: " in msg, msg


# ------------------------------------------------------------------------------ no garbage
def test_batched_max_num_tokens_is_never_a_garbage_buffer():
    # max_num_tokens=-4 used to build an [E, -4 ...] buffer and return uninitialized memory
    for bad in (-4, 0):
        with pytest.raises(ConfigError, match="max_num_tokens"):
            prepare_experts(CFG, EW, fmt="batched", max_num_tokens=bad)
    pe = prepare_experts(CFG, EW, fmt="batched", max_num_tokens=2)   # T=3 chunks to 2 rows an expert
    ref = prepare_experts(CFG, EW, "torch_ref")(X, TW, TI)
    torch.testing.assert_close(pe(X, TW, TI), ref)


def test_nan_correction_bias_is_refused_not_a_winner():
    # a NaN bias used to win every token's selection with finite outputs
    bias = _nan_at(torch.zeros(E), 2)
    with pytest.raises(InputError, match=r"correction_bias='nan at expert 2' is not finite"):
        _layer(BIAS_CFG, correction_bias=bias)
    layer = _layer(BIAS_CFG, correction_bias=torch.tensor([0.0, 0.1, -0.1, 0.0]))
    assert torch.isfinite(layer(X, LOGITS)).all()


def test_nan_in_x_still_propagates():
    # README: NaN in the input propagates to the affected tokens (it is not an input error)
    x = _nan_at(X, (1, 0))
    out = _layer()(x, LOGITS)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()


def test_nan_weight_scale_is_accepted_and_propagates():
    # quantize_experts carries a NaN weight as a NaN scale: that stays legal, and shows
    w13 = _nan_at(W13, (1, 0, 0))
    w = quantize_experts(w13, W2, "fp8_channel")
    assert torch.isnan(w.w13_scale[1, 0])
    out = prepare_experts(CFG, w, "torch_ref")(X, TW, torch.tensor([[1, 0], [2, 3], [2, 3]], dtype=torch.int32))
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1:]).all()


def test_zero_activation_scale_is_refused_at_construction():
    # it used to give an all-NaN output
    with pytest.raises(InputError, match="a13_scale"):
        _static_fp8(a13_scale=torch.zeros(1))
    out = prepare_experts(CFG, _static_fp8(a13_scale=torch.full((1,), 0.02), a2_scale=torch.full((1,), 0.02)))(
        X, TW, TI)
    assert torch.isfinite(out).all()


def test_platform_matching_the_weights_is_accepted():
    for name in ("cpu", "CPU", "current"):
        assert prepare_experts(CFG, EW, platform=name).selection.platform.kind == "cpu"


# ------------------------------------------------------------------------------ names, case, exports
@pytest.mark.parametrize("spec,name", [("FP8_BLOCK", "fp8_block"), (" Int4_W4A16:G64:ZP ", "int4_w4a16:g64:zp"),
                                       ("fp8_block:B64X64", "fp8_block:b64x64"), ("NONE", "none")])
def test_scheme_names_are_case_insensitive(spec, name):
    # as platform names are ('H100'): one rule for every name a user types
    assert QuantScheme.parse(spec).name == name
    assert Platform.preset("H100") is Platform.preset("h100")


def test_enum_fields_are_case_insensitive():
    cfg = MoEConfig(E, K, H, I, activation="SiLU", routing=Routing(scoring="Sigmoid"),
                    parallel=ParallelConfig(placement="ROUND_ROBIN"))
    assert (cfg.activation.value, cfg.routing.scoring.value, cfg.parallel.placement.value) == \
        ("silu", "sigmoid", "round_robin")
    assert eval(repr(cfg), vars(fusedmoe)) == cfg


def test_readme_names_are_exported():
    # the README's Python API table names these; each is importable from fusedmoe
    for name in ("ConfigError", "ConfigTypeError", "InputError", "NoBackendError", "from_quantized_per_expert",
                 "from_deepseek_fp8", "from_per_expert", "from_fused_gate_up", "quantize_experts",
                 "dequantize_experts", "FusedMoE", "fused_experts", "prepare_experts", "select_backend", "Platform",
                 "MoEConfig", "Routing", "QuantScheme", "ParallelConfig", "ExpertWeights"):
        assert hasattr(fusedmoe, name), name
    assert fusedmoe.ConfigTypeError is fusedmoe.errors.ConfigTypeError
    assert fusedmoe.from_quantized_per_expert is fusedmoe.quantize.from_quantized_per_expert


def test_long_values_are_cut_in_messages():
    with pytest.raises(ConfigTypeError) as ei:
        fused_experts(X, EW, [[0.5, 0.5]] * 100000, TI)
    assert len(str(ei.value)) < 400
