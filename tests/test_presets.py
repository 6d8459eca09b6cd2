"""Model presets and the Hugging Face config.json reader (fusedmoe.presets)."""
import json
import pathlib

import pytest

from fusedmoe.config import *  # noqa: F401,F403  (eval(repr(cfg)) needs the names)
from fusedmoe.config import Activation, MoEConfig, Routing, ScoringFunc
from fusedmoe.errors import ConfigError, ConfigTypeError
from fusedmoe.presets import PRESETS, ModelPreset, get_preset, load_hf_config, preset_from_hf_dict


# ----------------------------------------------------------------------------------------- #
# presets
# ----------------------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_a_config(name):
    p = PRESETS[name]
    cfg = p.to_config()
    assert isinstance(cfg, MoEConfig)
    assert (cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size) == \
        (p.num_experts, p.top_k, p.hidden_size, p.intermediate_size)
    assert cfg.routing == p.routing and cfg.activation == p.activation and cfg.has_bias == p.has_bias
    assert eval(repr(cfg)) == cfg
    assert p.quant_scheme.name == p.quant
    assert p.to_config(dtype="float16").dtype == "float16"
    assert get_preset(p.hf_name) is p


def test_preset_facts():
    ds = PRESETS["deepseek-v3"]
    assert ds.routing == Routing(scoring="sigmoid", renormalize=True, num_groups=8, topk_groups=4,
                                 has_correction_bias=True, routed_scaling_factor=2.5)
    assert (ds.quant, ds.num_shared_experts) == ("fp8_block", 1)
    oss = PRESETS["gpt-oss-20b"].to_config()
    assert oss.activation == Activation.SWIGLUOAI and oss.has_bias and oss.swigluoai_limit == 7.0
    assert PRESETS["gpt-oss-120b"].quant == "mxfp4"
    llama = PRESETS["llama-4-scout"].to_config()
    assert llama.top_k == 1 and llama.routing.apply_router_weight_on_input
    assert llama.routing.scoring == ScoringFunc.SIGMOID and not llama.routing.renormalize
    assert not PRESETS["olmoe-1b-7b"].routing.renormalize
    assert PRESETS["mixtral-8x7b"].routing.renormalize and PRESETS["qwen3-30b-a3b"].routing.renormalize


def test_tp_divides_intermediate_size():
    assert PRESETS["deepseek-v3"].to_config(tp=8).intermediate_size == 256
    assert PRESETS["gpt-oss-120b"].to_config(tp=4).intermediate_size == 720
    assert PRESETS["qwen3-30b-a3b"].to_config(tp=16).intermediate_size == 48
    with pytest.raises(ConfigError) as e:
        PRESETS["mixtral-8x7b"].to_config(tp=3)  # 14336 = 2^11 * 7
    assert e.value.param == "tp" and e.value.value == 3 and "14336" in str(e.value)
    with pytest.raises(ConfigError):
        PRESETS["mixtral-8x7b"].to_config(tp=0)
    with pytest.raises(ConfigTypeError):
        PRESETS["mixtral-8x7b"].to_config(tp="2")


def test_to_config_overrides():
    cfg = PRESETS["deepseek-v3"].to_config(tp=2, parallel=ParallelConfig(ep_size=8, ep_rank=3))  # noqa: F405
    assert cfg.num_local_experts == 32 and cfg.intermediate_size == 1024


def test_get_preset_lookup():
    assert get_preset("DeepSeek_V3") is PRESETS["deepseek-v3"]
    assert get_preset("deepseek-ai/DeepSeek-V3") is PRESETS["deepseek-v3"]
    assert get_preset(PRESETS["olmoe-1b-7b"]) is PRESETS["olmoe-1b-7b"]
    with pytest.raises(ConfigError) as e:
        get_preset("mixtral-8x22b")
    assert e.value.param == "model" and "mixtral-8x7b" in str(e.value) and "llama-4-scout" in str(e.value)
    with pytest.raises(ConfigTypeError):
        get_preset(8)


def test_invalid_preset_fields():
    with pytest.raises(ConfigError):
        ModelPreset("x", "x", 8, 9, 64, 64)  # top_k > E
    with pytest.raises(ConfigError):
        ModelPreset("x", "x", 8, 2, 64, 64, quant="fp7")
    with pytest.raises(ConfigError):
        ModelPreset("x", "x", 8, 2, 64, 64, activation="tanh")


# ----------------------------------------------------------------------------------------- #
# Hugging Face config.json (abridged copies of the real files; values as published)
# ----------------------------------------------------------------------------------------- #
HF = {
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
                     "hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8,
                     "num_experts_per_tok": 2, "num_hidden_layers": 32, "torch_dtype": "bfloat16"},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 2048,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1},
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168,
                    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                    "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
                    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
                    "norm_topk_prob": True, "first_k_dense_replace": 3,
                    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                            "weight_block_size": [128, 128]}},
    "gpt-oss-20b": {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
                    "num_local_experts": 32, "experts_per_token": 4, "num_experts_per_tok": 4,
                    "swiglu_limit": 7.0, "quantization_config": {"quant_method": "mxfp4",
                                                                 "modules_to_not_convert": ["model.layers.*.self_attn"]}},
    "olmoe-1b-7b": {"model_type": "olmoe", "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 1024,
                    "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False},
    "llama-4-scout": {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
                      "text_config": {"model_type": "llama4_text", "hidden_act": "silu", "hidden_size": 5120,
                                      "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                                      "num_local_experts": 16, "num_experts_per_tok": 1,
                                      "interleave_moe_layer_step": 1},
                      "vision_config": {"hidden_size": 1408}},
}


def write(tmp_path: pathlib.Path, cfg: dict, folder="model") -> pathlib.Path:
    d = tmp_path / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def same_layer(a: ModelPreset, b: ModelPreset):
    fields = ("num_experts", "top_k", "hidden_size", "intermediate_size", "activation", "routing", "quant",
              "has_bias", "num_shared_experts")
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}
    assert a.to_config() == b.to_config()


@pytest.mark.parametrize("name", sorted(HF))
def test_hf_config_matches_preset(tmp_path, name):
    folder = write(tmp_path, HF[name], folder=name)
    p = get_preset(str(folder))                          # a folder
    same_layer(p, PRESETS[name])
    assert p.name == name and str(folder / "config.json") in p.notes
    same_layer(get_preset(folder / "config.json"), PRESETS[name])  # a file, as a PathLike


def test_qwen2_moe_shared_expert(tmp_path):
    cfg = {"model_type": "qwen2_moe", "hidden_size": 2048, "moe_intermediate_size": 1408, "num_experts": 60,
           "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632, "hidden_act": "silu"}
    p = load_hf_config(write(tmp_path, cfg))
    assert (p.num_experts, p.top_k, p.intermediate_size, p.num_shared_experts) == (60, 4, 1408, 1)
    assert p.routing == Routing(renormalize=False)  # norm_topk_prob defaults to false
    assert "5632" in p.notes


def test_deepseek_v2_group_limited_greedy():
    cfg = {"model_type": "deepseek_v2", "hidden_size": 5120, "moe_intermediate_size": 1536, "n_routed_experts": 160,
           "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 8, "topk_group": 3,
           "topk_method": "group_limited_greedy", "scoring_func": "softmax", "norm_topk_prob": False,
           "routed_scaling_factor": 16.0}
    p = preset_from_hf_dict(cfg, name="deepseek-v2")
    assert p.routing == Routing(scoring="softmax", renormalize=False, num_groups=8, topk_groups=3,
                                routed_scaling_factor=16.0)
    assert p.num_shared_experts == 2 and p.to_config(tp=8).intermediate_size == 192
    lite = dict(cfg, n_routed_experts=64, topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0)
    assert preset_from_hf_dict(lite).routing == Routing(renormalize=False)


def test_gpt_oss_experts_per_token_only():
    cfg = dict(HF["gpt-oss-20b"])
    del cfg["num_experts_per_tok"]
    assert preset_from_hf_dict(cfg).top_k == 4


def _ct(weights: dict, activations, fmt: str = "float-quantized") -> dict:
    """A compressed-tensors quantization_config with one config group (the layout of llm-compressor
    checkpoints: config_groups.group_0.{weights, input_activations, targets}, format, ignore)."""
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(weights, dynamic=False),
                                          "input_activations": activations, "output_activations": None}}}


@pytest.mark.parametrize("qc, scheme", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8_block"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_tensor"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8_tensor:static"),
    ({"quant_method": "fbgemm_fp8"}, "fp8_channel"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, "int4_w4a16:g128"),
    ({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True}, "int4_w4a16:g64:zp"),
    ({"quant_method": "bitsandbytes"}, "none"),
    (_ct({"num_bits": 8, "type": "float", "strategy": "channel"},
         {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}), "fp8_channel"),
    (_ct({"num_bits": 8, "type": "float", "strategy": "tensor"},
         {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}), "fp8_tensor:static"),
    (_ct({"num_bits": 8, "type": "float", "strategy": "tensor"},
         {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": True}), "fp8_tensor"),
    (_ct({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
         {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True}), "fp8_block"),
    (_ct({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
         {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}), "int8_channel"),
    (_ct({"num_bits": 8, "type": "float", "strategy": "channel"}, None), "fp8_w8a16"),
    (_ct({"num_bits": 8, "type": "int", "strategy": "channel"}, None), "int8_w8a16"),
    (_ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}, None),
     "int4_w4a16:g128"),
    (_ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64, "symmetric": False}, None),
     "int4_w4a16:g64:zp"),
    # per-tensor weights with per-token activations: no fusedmoe scheme computes exactly that
    (_ct({"num_bits": 8, "type": "float", "strategy": "tensor"},
         {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}), "none"),
    # two groups with different schemes (e.g. attention and experts): not one scheme
    (dict(_ct({"num_bits": 8, "type": "float", "strategy": "channel"},
              {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}),
          config_groups={"group_0": _ct({"num_bits": 8, "type": "float", "strategy": "channel"}, None)
                         ["config_groups"]["group_0"],
                         "group_1": _ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
                                        None)["config_groups"]["group_0"]}), "none"),
])
def test_quantization_config(qc, scheme):
    p = preset_from_hf_dict(dict(HF["mixtral-8x7b"], quantization_config=qc))
    assert p.quant == scheme
    if qc["quant_method"] == "bitsandbytes":
        assert "not recognized" in p.notes
    if qc["quant_method"] == "compressed-tensors":
        assert ("not mapped" in p.notes) == (scheme == "none")


def test_unmapped_quantization_config_note_is_logged(tmp_path, caplog):
    # a bitsandbytes checkpoint becomes quant 'none': the note saying so used to sit unread in
    # .notes; it is .quant_note too, and loading the file logs it (the CLI prints it)
    folder = write(tmp_path, dict(HF["mixtral-8x7b"], quantization_config={"quant_method": "bitsandbytes"}))
    with caplog.at_level("WARNING", logger="fusedmoe"):
        p = get_preset(str(folder))
    assert p.quant == "none" and "'bitsandbytes' not recognized" in p.quant_note and p.quant_note in p.notes
    assert any("bitsandbytes" in r.getMessage() and "config.json" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="fusedmoe"):
        q = get_preset(str(write(tmp_path / "fp8", dict(HF["mixtral-8x7b"], quantization_config={
            "quant_method": "fp8", "weight_block_size": [128, 128]}))))
    assert q.quant == "fp8_block" and q.quant_note == "" and not caplog.records


@pytest.mark.parametrize("block,scheme", [([64, 64], "fp8_block:b64x64"), ([128, 64], "fp8_block:b128x64")])
def test_fp8_weight_blocks_other_than_128(block, scheme):
    # the blocks are part of the scheme (they were a note beside 'fp8_block', i.e. 128 x 128)
    p = preset_from_hf_dict(dict(HF["mixtral-8x7b"], quantization_config={"quant_method": "fp8",
                                                                          "weight_block_size": block}))
    assert p.quant == scheme and p.quant_scheme.block_shape == tuple(block)


@pytest.mark.parametrize("block", [[128], [0, 128], "128x128", [128.0, 128]])
def test_bad_fp8_weight_blocks(block):
    with pytest.raises(ConfigError) as e:
        preset_from_hf_dict(dict(HF["mixtral-8x7b"], quantization_config={"quant_method": "fp8",
                                                                          "weight_block_size": block}))
    assert e.value.param == "weight_block_size" and "two positive ints" in str(e.value)


@pytest.mark.parametrize("name,quant,tps", [
    ("gpt-oss-20b", None, [1, 2]),                  # I = 2880: 720 at tp 4 is not a multiple of mxfp4's 32
    ("gpt-oss-20b", "none", [1, 2, 4, 8, 16, 32, 64]),
    ("qwen3-30b-a3b", "int4_w4a16", [1, 2]),        # I = 768: g128 needs I / tp % 128 == 0
    ("deepseek-v3", None, [1, 2, 4, 8, 16, 32, 64]),  # fp8_block: blocks are rounded up, any divisor
    ("mixtral-8x7b", "nvfp4", [1, 2, 4, 8, 16, 32, 64]),
])
def test_fitting_tps(name, quant, tps):
    p = PRESETS[name]
    assert p.fitting_tps(quant) == tps
    for tp in tps:   # each one quantizes: its K dims are multiples of the scheme's group
        cfg = p.to_config(tp=tp)
        m = p.quant_scheme.k_multiple if quant is None else QuantScheme.parse(quant).k_multiple
        assert cfg.hidden_size % m == 0 and cfg.intermediate_size % m == 0


# ----------------------------------------------------------------------------------------- #
# errors
# ----------------------------------------------------------------------------------------- #
def test_missing_key_names_key_and_file(tmp_path):
    cfg = dict(HF["deepseek-v3"])
    del cfg["n_routed_experts"]
    folder = write(tmp_path, cfg)
    with pytest.raises(ConfigError) as e:
        get_preset(str(folder))
    assert e.value.param == "n_routed_experts" and str(folder / "config.json") in str(e.value)
    llama = {"model_type": "llama4", "text_config": dict(HF["llama-4-scout"]["text_config"])}
    del llama["text_config"]["num_local_experts"]
    with pytest.raises(ConfigError) as e:
        preset_from_hf_dict(llama)
    assert e.value.param == "num_local_experts"
    with pytest.raises(ConfigError) as e:
        preset_from_hf_dict({"model_type": "llama4"})
    assert e.value.param == "text_config"
    oss = {k: v for k, v in HF["gpt-oss-20b"].items() if k not in ("num_experts_per_tok", "experts_per_token")}
    with pytest.raises(ConfigError, match="experts_per_token"):
        preset_from_hf_dict(oss)


@pytest.mark.parametrize("cfg, param", [
    ({"model_type": "llama", "hidden_size": 4096}, "model_type"),                   # dense model
    ({"hidden_size": 4096}, "model_type"),                                          # no model_type
    (dict(HF["mixtral-8x7b"], num_local_experts="8"), "num_local_experts"),         # wrong type
    (dict(HF["mixtral-8x7b"], hidden_act="tanh"), "hidden_act"),
    (dict(HF["deepseek-v3"], topk_method="aux_free"), "topk_method"),
    (dict(HF["deepseek-v3"], scoring_func="sqrt"), "scoring_func"),
    (dict(HF["mixtral-8x7b"], num_experts_per_tok=9), "top_k"),                     # k > E
    ({"model_type": "llama4", "text_config": dict(HF["llama-4-scout"]["text_config"], num_experts_per_tok=2)},
     "num_experts_per_tok"),
])
def test_bad_hf_configs(cfg, param):
    with pytest.raises((ConfigError, ConfigTypeError)) as e:
        preset_from_hf_dict(cfg, source="test.json")
    assert e.value.param == param


def test_bad_paths(tmp_path):
    with pytest.raises(ConfigError) as e:
        get_preset(str(tmp_path / "nope" / "config.json"))  # not a preset, not a file
    assert e.value.param == "model"
    with pytest.raises(ConfigError) as e:
        load_hf_config(tmp_path / "nope.json")
    assert e.value.param == "path"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        get_preset(str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        get_preset(str(tmp_path / "bad"))


@pytest.mark.parametrize("platform", ["h100", "h200"])
@pytest.mark.parametrize("model,tp,scheme", [("mixtral-8x7b", 1, "none"), ("qwen3-30b-a3b", 1, "none"),
                                             ("deepseek-v3", 8, "none"), ("qwen3-30b-a3b", 1, "fp8_channel"),
                                             ("qwen3-30b-a3b", 1, "int8_channel"), ("deepseek-v3", 8, "fp8_block")])
def test_shipped_tuned_configs_cover_the_presets(platform, model, tp, scheme, monkeypatch):
    # the package ships a tuned file for every benchmarked (preset, scheme) on both Hopper
    # parts, with entries for every prefill bucket; it is that device's own file, not a sibling's
    from fusedmoe.plan import make_launch_configs as launch_configs
    from fusedmoe.config import QuantScheme
    from fusedmoe.platform import Platform
    monkeypatch.delenv("FUSEDMOE_CONFIG_DIR", raising=False)
    plat = Platform.preset(platform)
    lc = launch_configs(get_preset(model).to_config(tp=tp), QuantScheme.parse(scheme), plat)
    # the device's own file: a sibling's would show in file_name, source ("sibling:...") and notes
    assert lc.is_tuned and lc.source.startswith("tuned:") and f"device_name={plat.device_name}," in lc.file_name, \
        lc.describe()
    assert {16, 64, 256, 1024, 4096, 16384} <= set(lc.table), sorted(lc.table)
    for T in (16, 64, 256, 1024, 4096, 16384):
        c1, c2 = lc.get(T)
        # one alignment serves both: at the larger BM, which the smaller divides (align_bm)
        b1, b2 = c1["BLOCK_SIZE_M"], c2["BLOCK_SIZE_M"]
        assert max(b1, b2) % min(b1, b2) == 0, (T, c1, c2)
