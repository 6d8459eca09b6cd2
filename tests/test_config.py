"""Configuration contracts: frozen dataclasses validated at construction, eval(repr(x)) round
trips, errors that name the parameter; QuantScheme.parse / .name; Platform presets; env.

Legend: E experts, k top-k, H hidden, I intermediate.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys

import pytest
import torch

import fusedmoe.config as config_mod
from fusedmoe import env
from fusedmoe.config import *  # noqa: F401,F403  (eval(repr(x)) needs the names in scope)
from fusedmoe.config import (Activation, ExpertPlacement, GateUpLayout, MoEConfig, ParallelConfig, QuantMethod,
                             QuantScheme, Routing, ScoringFunc)
from fusedmoe.errors import ConfigError, ConfigTypeError, FusedMoEError
from fusedmoe.platform import PRESETS, Platform


def roundtrip(obj):
    """eval(repr(obj)) in a namespace holding exactly `from fusedmoe.config import *`."""
    ns: dict = {}
    exec("from fusedmoe.config import *", ns)
    return eval(repr(obj), ns)


# ------------------------------------------------------------------------------ round trips
ROUTINGS = [
    Routing(),                                                      # defaults
    Routing(scoring="sigmoid", renormalize=False),                  # Llama-4 style scores
    Routing(scoring=ScoringFunc.SIGMOID, num_groups=8, topk_groups=4, has_correction_bias=True,
            routed_scaling_factor=2.5),                             # DeepSeek-V3
    Routing(apply_router_weight_on_input=True, renormalize=False),  # top-1 on input
    Routing(custom="sqrtsoftplus"),                                 # custom routing fn by name
    Routing(routed_scaling_factor=3),                               # int factor normalized to float
]


@pytest.mark.parametrize("r", ROUTINGS, ids=repr)
def test_routing_roundtrip(r):
    back = roundtrip(r)
    assert back == r and repr(back) == repr(r)
    assert isinstance(back.scoring, ScoringFunc)          # strings coerced back into the enum


SCHEMES = [QuantScheme(), QuantScheme("fp8_tensor"), QuantScheme("fp8_tensor", static_activation_scale=True),
           QuantScheme("fp8_channel"), QuantScheme("fp8_block"), QuantScheme("fp8_block", block_shape=(64, 128)),
           QuantScheme("fp8_block", scale_pow2=True), QuantScheme("int8_channel"), QuantScheme("int8_w8a16"),
           QuantScheme("int8_w8a16", group_size=64), QuantScheme("int8_w8a16", group_size=128, has_zero_point=True),
           QuantScheme("int4_w4a16"), QuantScheme("int4_w4a16", group_size=32),
           QuantScheme("int4_w4a16", group_size=64, has_zero_point=True), QuantScheme("fp8_w8a16"),
           QuantScheme("nvfp4"), QuantScheme("mxfp4")]


@pytest.mark.parametrize("q", SCHEMES, ids=repr)
def test_quant_scheme_roundtrip(q):
    back = roundtrip(q)
    assert back == q
    assert isinstance(back.method, QuantMethod)


@pytest.mark.parametrize("q", [q for q in SCHEMES if q.block_shape in (None, (128, 128))], ids=lambda q: q.name)
def test_quant_scheme_name_parse_roundtrip(q):
    # name is documented as the inverse of parse: parse(q.name) == q
    assert QuantScheme.parse(q.name) == q
    assert QuantScheme.parse(q.name).name == q.name


def test_quant_scheme_name_keeps_block_shape():
    # edge: fp8_block with (64, 128) blocks; name says 'fp8_block' and parse gives (128, 128)
    q = QuantScheme("fp8_block", block_shape=(64, 128))
    assert QuantScheme.parse(q.name) == q


@pytest.mark.parametrize("spec,expect", [
    ("fp8_block", QuantScheme("fp8_block", block_shape=(128, 128))),      # default blocks filled in
    ("int4_w4a16", QuantScheme("int4_w4a16", group_size=128)),            # default int4 group 128
    ("int4_w4a16:g64:zp", QuantScheme("int4_w4a16", group_size=64, has_zero_point=True)),
    ("int8_w8a16:g128:zp", QuantScheme("int8_w8a16", group_size=128, has_zero_point=True)),
    ("fp8_tensor:static", QuantScheme("fp8_tensor", static_activation_scale=True)),
    ("fp8_block:pow2", QuantScheme("fp8_block", scale_pow2=True)),
    (None, QuantScheme()),                                                # None -> 'none'
])
def test_quant_scheme_parse(spec, expect):
    assert QuantScheme.parse(spec) == expect


def test_quant_scheme_parse_passes_instances_through():
    q = QuantScheme("nvfp4")
    assert QuantScheme.parse(q) is q
    assert q.group_size == 16 and QuantScheme("mxfp4").group_size == 32   # fixed groups filled in


CONFIGS = [
    MoEConfig(8, 2, 64, 32),                                                        # all defaults
    MoEConfig(8, 2, 64, 32, activation="gelu_tanh", dtype=torch.float16, has_bias=True),   # torch dtype in
    MoEConfig(8, 2, 64, 32, swiglu_limit=7),                                        # silu clamp (int -> float)
    MoEConfig(32, 4, 64, 32, activation="swigluoai", has_bias=True, swigluoai_limit=6.5),   # gpt-oss
    MoEConfig(8, 2, 64, 32, activation="relu2_no_mul", dtype="fp32"),               # dtype alias
    MoEConfig(16, 4, 64, 32, routing=ROUTINGS[2], parallel=ParallelConfig(ep_size=4, ep_rank=3,
                                                                            placement="round_robin")),
    MoEConfig(8, 1, 64, 32, routing=Routing(apply_router_weight_on_input=True)),    # top-1 on input
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
def test_moe_config_roundtrip(cfg):
    back = roundtrip(cfg)
    assert back == cfg and repr(back) == repr(cfg)
    assert isinstance(back.activation, Activation) and isinstance(back.gate_up_layout, GateUpLayout)


@pytest.mark.parametrize("p", [ParallelConfig(), ParallelConfig(2, 1), ParallelConfig(4, 0, "round_robin", 2)],
                         ids=repr)
def test_parallel_roundtrip(p):
    assert roundtrip(p) == p
    assert isinstance(roundtrip(p).placement, ExpertPlacement)


@pytest.mark.parametrize("obj", [Routing(), QuantScheme("fp8_block"), ParallelConfig(), MoEConfig(8, 2, 64, 32)],
                         ids=lambda o: type(o).__name__)
def test_configs_are_frozen_and_hashable(obj):
    f = dataclasses.fields(obj)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, f, getattr(obj, f))
    assert hash(obj) == hash(roundtrip(obj))          # usable as cache keys (fused_experts does)


def test_moe_config_derived():
    c = MoEConfig(8, 2, 64, 32, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    assert (c.n13, c.num_local_experts, c.torch_dtype) == (64, 4, torch.bfloat16)
    assert MoEConfig(8, 2, 64, 32, activation="silu_no_mul").n13 == 32          # non-gated: N = I
    assert c.expert_map().tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]               # linear: rank 1 owns 4..7
    rr = MoEConfig(8, 2, 64, 32, parallel=ParallelConfig(ep_size=2, ep_rank=1, placement="round_robin"))
    assert rr.expert_map().tolist() == [-1, 0, -1, 1, -1, 2, -1, 3]              # round robin: 1, 3, 5, 7
    assert MoEConfig(8, 2, 64, 32).expert_map() is None                          # no EP: no map
    assert MoEConfig(8, 1, 64, 32, activation="swigluoai").gate_up_layout == GateUpLayout.INTERLEAVED
    assert c.replace(top_k=3).top_k == 3 and c.top_k == 2


# ------------------------------------------------------------------------------ bad input
BAD = [
    # (constructor, param named in the message, exception type)
    (lambda: MoEConfig(8, 9, 64, 32), "top_k", ValueError),                       # top_k > E
    (lambda: MoEConfig(8, 0, 64, 32), "top_k", ValueError),                       # top_k < 1
    (lambda: MoEConfig(8, 2.0, 64, 32), "top_k", TypeError),                      # float top_k
    (lambda: MoEConfig(8, True, 64, 32), "top_k", TypeError),                     # bool is not an int here
    (lambda: MoEConfig(0, 1, 64, 32), "num_experts", ValueError),                 # no experts
    (lambda: MoEConfig(8, 2, -64, 32), "hidden_size", ValueError),
    (lambda: MoEConfig(8, 2, 64, "32"), "intermediate_size", TypeError),
    (lambda: MoEConfig(8, 2, 64, 32, activation="swish"), "activation", ValueError),   # unknown activation
    (lambda: MoEConfig(8, 2, 64, 32, dtype="int8"), "dtype", ValueError),
    (lambda: MoEConfig(8, 2, 64, 32, dtype=torch.float64), "dtype", ValueError),
    (lambda: MoEConfig(8, 2, 64, 32, has_bias=1), "has_bias", TypeError),
    (lambda: MoEConfig(8, 1, 64, 32, activation="swigluoai", gate_up_layout="halves"), "gate_up_layout",
     ValueError),                                                                  # swigluoai is interleaved
    (lambda: MoEConfig(8, 2, 64, 32, gate_up_layout="interleaved"), "gate_up_layout", ValueError),
    (lambda: MoEConfig(8, 2, 64, 32, gate_up_layout="diagonal"), "gate_up_layout", ValueError),
    (lambda: MoEConfig(8, 2, 64, 32, routing=Routing(apply_router_weight_on_input=True)),
     "apply_router_weight_on_input", ValueError),                                 # on-input needs top-1
    (lambda: MoEConfig(8, 2, 64, 32, routing=Routing(num_groups=3, topk_groups=1)), "num_groups",
     ValueError),                                                                  # 3 groups do not divide 8
    (lambda: MoEConfig(8, 5, 64, 32, routing=Routing(num_groups=4, topk_groups=2)), "top_k",
     ValueError),                                                                  # 2 groups x 2 experts < 5
    (lambda: MoEConfig(8, 2, 64, 32, activation="gelu", swiglu_limit=7.0), "swiglu_limit", ValueError),
    (lambda: MoEConfig(8, 2, 64, 32, swiglu_limit=-1.0), "swiglu_limit", ValueError),
    (lambda: MoEConfig(8, 2, 64, 32, swigluoai_alpha=0), "swigluoai_alpha", ValueError),
    (lambda: MoEConfig(8, 2, 64, 32, routing="softmax"), "routing", TypeError),
    (lambda: MoEConfig(8, 2, 64, 32, parallel=2), "parallel", TypeError),
    (lambda: MoEConfig(6, 2, 64, 32, parallel=ParallelConfig(ep_size=4)), "num_experts", ValueError),  # 6 % 4
    (lambda: ParallelConfig(ep_size=2, ep_rank=2), "ep_rank", ValueError),       # rank >= size
    (lambda: ParallelConfig(ep_size=0), "ep_size", ValueError),
    (lambda: ParallelConfig(ep_rank=-1), "ep_rank", ValueError),
    (lambda: ParallelConfig(placement="random"), "placement", ValueError),
    (lambda: Routing(scoring="relu"), "scoring", ValueError),
    (lambda: Routing(num_groups=4), "topk_groups", ValueError),                  # groups without topk_groups
    (lambda: Routing(topk_groups=2), "num_groups", ValueError),
    (lambda: Routing(num_groups=2, topk_groups=3), "topk_groups", ValueError),   # keep more than exist
    (lambda: Routing(routed_scaling_factor=0.0), "routed_scaling_factor", ValueError),
    (lambda: Routing(renormalize="yes"), "renormalize", TypeError),
    (lambda: Routing(custom=3), "custom", TypeError),
    (lambda: QuantScheme("int3"), "method", ValueError),                          # unknown scheme
    (lambda: QuantScheme("int4_w4a16", group_size=48), "group_size", ValueError),  # int4 group 48
    (lambda: QuantScheme("int8_w8a16", group_size=16), "group_size", ValueError),
    (lambda: QuantScheme("nvfp4", group_size=32), "group_size", ValueError),     # nvfp4 is fixed at 16
    (lambda: QuantScheme("fp8_channel", group_size=128), "group_size", ValueError),
    (lambda: QuantScheme("fp8_block", block_shape=(128, 0)), "block_shape", ValueError),
    (lambda: QuantScheme("fp8_tensor", block_shape=(128, 128)), "block_shape", ValueError),
    (lambda: QuantScheme("fp8_block", has_zero_point=True), "has_zero_point", ValueError),
    (lambda: QuantScheme("int8_w8a16", has_zero_point=True), "has_zero_point", ValueError),  # needs groups
    (lambda: QuantScheme("fp8_channel", static_activation_scale=True), "static_activation_scale", ValueError),
    (lambda: QuantScheme("fp8_tensor", scale_pow2=True), "scale_pow2", ValueError),
    (lambda: QuantScheme.parse("int4_w4a16:x7"), "quant", ValueError),            # unknown suffix
    (lambda: QuantScheme.parse(4), "quant", TypeError),
]


@pytest.mark.parametrize("ctor,param,exc", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_input_names_the_parameter(ctor, param, exc):
    with pytest.raises(exc) as ei:
        ctor()
    assert isinstance(ei.value, FusedMoEError)            # ours, not a stray Python error
    assert str(ei.value).startswith(f"{param}="), str(ei.value)
    assert getattr(ei.value, "param", param) == param
    if isinstance(ei.value, ConfigError):
        assert "accepted:" in str(ei.value)               # what is accepted, then a fix


@pytest.mark.parametrize("ctor,param", [
    (lambda: QuantScheme("fp8_block", block_shape=128), "block_shape"),    # not a pair at all
    (lambda: MoEConfig(8, 2, 64, 32, swiglu_limit="7"), "swiglu_limit"),   # a string limit
], ids=["block_shape_int", "swiglu_limit_str"])
def test_bad_types_name_the_parameter(ctor, param):
    with pytest.raises((ValueError, TypeError)) as ei:
        ctor()
    assert param in str(ei.value)


def test_config_error_message_shape():
    # '<param>=<value!r> <problem>; accepted: <...>. Fix: <hint>'
    with pytest.raises(ConfigError) as ei:
        QuantScheme("int4_w4a16", group_size=48)
    msg = str(ei.value)
    assert msg.startswith("group_size=48 ") and "accepted: 32, 64, 128" in msg and "Fix:" in msg
    assert ei.value.value == 48


def test_config_type_error_is_type_error():
    with pytest.raises(ConfigTypeError) as ei:
        MoEConfig(8, 2, 64, 32, routing={"scoring": "softmax"})
    assert isinstance(ei.value, TypeError) and "routing=" in str(ei.value)


def test_enums_are_strings():
    assert Activation("silu") == "silu" and str(QuantMethod.FP8_BLOCK) == "fp8_block"
    assert {a.value for a in Activation if not a.is_gated} == {"relu2_no_mul", "silu_no_mul", "gelu_no_mul"}
    assert {m.value for m in QuantMethod if m.quantizes_activations} == \
        {"fp8_tensor", "fp8_channel", "fp8_block", "int8_channel", "nvfp4"}
    assert set(config_mod.__all__) >= {"MoEConfig", "Routing", "QuantScheme", "ParallelConfig"}


# ------------------------------------------------------------------------------ platform
@pytest.mark.parametrize("name,kind,family,sm,fp8,fp4", [
    ("cpu", "cpu", "cpu", 0, False, False),
    ("a100", "cuda", "ampere", 80, False, False),       # no fp8 tensor cores on sm80
    ("h100", "cuda", "hopper", 90, True, False),
    ("h200", "cuda", "hopper", 90, True, False),
    ("b200", "cuda", "blackwell", 100, True, True),
])
def test_platform_presets(name, kind, family, sm, fp8, fp4):
    p = Platform.preset(name)
    assert (p.kind, p.family, p.sm, p.has_fp8, p.has_fp4) == (kind, family, sm, fp8, fp4)
    assert Platform.preset(name.upper()) is p              # case-insensitive
    assert Platform.resolve(name) is p and Platform.resolve(p) is p
    assert p.torch_device == ("cuda" if kind == "cuda" else "cpu")


def test_platform_families_between_presets():
    # sm89 (Ada) has fp8 but is neither ampere nor hopper; sm86 is ampere
    ada = Platform("cuda", "NVIDIA L40S", (8, 9))
    assert (ada.family, ada.has_fp8) == ("ada", True)
    assert Platform("cuda", "NVIDIA A10", (8, 6)).family == "ampere"
    assert Platform.preset("h200").device_name == "NVIDIA_H200"
    assert Platform.preset("h100").device_name == "NVIDIA_H100_80GB_HBM3"


def test_platform_unknown_preset():
    with pytest.raises(ConfigError) as ei:
        Platform.preset("tpu")
    assert str(ei.value).startswith("platform='tpu'") and "h100" in str(ei.value)
    assert set(PRESETS) == {"cpu", "a100", "h100", "h200", "b200"}


def test_platform_current_is_cached():
    p = Platform.current()
    assert Platform.current() is p and Platform.resolve(None) is p and Platform.resolve("current") is p
    assert p.kind == ("cuda" if torch.cuda.is_available() else "cpu")


# ------------------------------------------------------------------------------ env
@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5", " ", "16k"])
def test_chunk_size_bad_values_name_the_variable(monkeypatch, value):
    monkeypatch.setenv("FUSEDMOE_CHUNK_SIZE", value)
    if not value.strip():                               # blank = unset: the default
        assert env.chunk_size() == env.DEFAULT_CHUNK_SIZE
        return
    with pytest.raises(ConfigError) as ei:
        env.chunk_size()
    assert str(ei.value).startswith("FUSEDMOE_CHUNK_SIZE=")


def test_chunk_size_good_and_default(monkeypatch):
    assert env.chunk_size() == env.DEFAULT_CHUNK_SIZE == 16384   # the autouse fixture unset it
    monkeypatch.setenv("FUSEDMOE_CHUNK_SIZE", " 7 ")
    assert env.chunk_size() == 7


def test_env_backend_and_disabled(monkeypatch):
    assert env.backend() is None and env.disabled_backends() == frozenset()
    monkeypatch.setenv("FUSEDMOE_BACKEND", " torch_ref ")
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", " grouped_mm, ,emulation,")
    assert env.backend() == "torch_ref"
    assert env.disabled_backends() == frozenset({"grouped_mm", "emulation"})
    monkeypatch.setenv("FUSEDMOE_DEBUG", "0")
    assert not env.debug()
    monkeypatch.setenv("FUSEDMOE_DEBUG", "1")
    assert env.debug()
    assert set(env.snapshot()) == {"FUSEDMOE_BACKEND", "FUSEDMOE_DISABLE_BACKENDS", "FUSEDMOE_DEBUG"}
    assert set(env.VARIABLES) >= {"FUSEDMOE_BACKEND", "FUSEDMOE_DISABLE_BACKENDS", "FUSEDMOE_CHUNK_SIZE"}


def test_env_plan_w8a8_decode(monkeypatch):
    # the W8A8 decode math through FUSEDMOE_PLAN (fusedmoe/plan.py PlanOverride; case-insensitive)
    from fusedmoe import plan
    assert plan.override().w8a8_decode == "auto"               # the default
    monkeypatch.setenv("FUSEDMOE_PLAN", ' {"w8a8_decode": "A8"} ')
    assert plan.override().w8a8_decode == "a8"
    monkeypatch.setenv("FUSEDMOE_PLAN", '{"w8a8_decode": "tc"}')
    assert plan.override().w8a8_decode == "tc"
    monkeypatch.setenv("FUSEDMOE_PLAN", '{"w8a8_decode": "fp8"}')
    with pytest.raises(ConfigError, match=r"FUSEDMOE_PLAN\['w8a8_decode'\]='fp8'.*a16.*Fix"):
        plan.override()
    assert "FUSEDMOE_PLAN" in env.VARIABLES


def test_env_config_dir(monkeypatch, tmp_path):
    assert env.config_dir() is None
    monkeypatch.setenv("FUSEDMOE_CONFIG_DIR", "  ")
    assert env.config_dir() is None                            # blank = unset
    monkeypatch.setenv("FUSEDMOE_CONFIG_DIR", f" {tmp_path} ")
    assert env.config_dir() == str(tmp_path)


@pytest.fixture
def _fusedmoe_logger_level():
    log = logging.getLogger("fusedmoe")
    level = log.level
    yield log
    log.setLevel(level)


def test_env_log_level(monkeypatch, _fusedmoe_logger_level):
    # FUSEDMOE_LOG_LEVEL: the `fusedmoe` logger's level (WARNING unset), applied by env.apply_log_level
    # (at import, and by callers that changed it); case-insensitive; another value is a ConfigError
    log = _fusedmoe_logger_level
    assert env.log_level() == "WARNING" and "FUSEDMOE_LOG_LEVEL" in env.VARIABLES
    env.apply_log_level()
    assert log.level == logging.WARNING
    for value, level in (("", logging.WARNING), (" info ", logging.INFO), ("DEBUG", logging.DEBUG),
                         ("error", logging.ERROR), ("CRITICAL", logging.CRITICAL)):
        monkeypatch.setenv("FUSEDMOE_LOG_LEVEL", value)
        env.apply_log_level()
        assert log.level == level and env.log_level() == logging.getLevelName(level), value
    monkeypatch.setenv("FUSEDMOE_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError, match="FUSEDMOE_LOG_LEVEL='LOUD'.*DEBUG, INFO, WARNING, ERROR, CRITICAL.*Fix"):
        env.log_level()
    with pytest.raises(ConfigError, match="FUSEDMOE_LOG_LEVEL"):
        env.apply_log_level()
    assert log.level == logging.CRITICAL                       # the last good value stays


def test_env_log_level_at_import():
    # applied when fusedmoe is imported; a bad value does not make the package unimportable (a warning)
    code = "import logging, fusedmoe; print(logging.getLogger('fusedmoe').getEffectiveLevel())"
    for value, want in (("info", "20"), ("loud", "30")):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, FUSEDMOE_LOG_LEVEL=value))
        assert p.returncode == 0, p.stderr
        assert p.stdout.split()[-1] == want, (value, p.stdout)
        assert ("FUSEDMOE_LOG_LEVEL='LOUD'" in p.stderr) == (value == "loud"), p.stderr
