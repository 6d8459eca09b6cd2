"""experts_implementation="fusedmoe" inside a real (tiny) transformers MoE model, vs its eager experts."""
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is an optional integration")

from fusedmoe.errors import ConfigError  # noqa: E402
from fusedmoe.integrations import transformers as fm_hf  # noqa: E402
from fusedmoe.tolerances import rel_error  # noqa: E402


def _tiny_qwen3_moe(act="silu"):
    cfg = transformers.Qwen3MoeConfig(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      num_experts=8, num_experts_per_tok=2, hidden_act=act, head_dim=32,
                                      decoder_sparse_step=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "experts" in name:
                p.normal_(0, 0.2)     # asymmetric gate/up, no zero init
    return model


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_model_logits_match_eager(act):
    fm_hf.register()
    model = _tiny_qwen3_moe(act)
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(ids).logits
        model.set_experts_implementation("fusedmoe")
        out = model(ids).logits
    assert model.get_experts_implementation()[""] == "fusedmoe"
    assert rel_error(out, ref) < 1e-4            # fp32 end to end: only summation order differs
    experts = [m for m in model.modules() if hasattr(m, "_fusedmoe")]
    assert len(experts) == 2 and experts[0]._fusedmoe.selection.winner in ("grouped_mm", "torch_ref")


def test_grad_enabled_is_refused():
    fm_hf.register()
    model = _tiny_qwen3_moe()
    model.set_experts_implementation("fusedmoe")
    with pytest.raises(ConfigError, match="no_grad"):
        model(torch.randint(0, 97, (1, 5)))


def test_unmapped_activation_is_refused():
    fm_hf.register()
    model = _tiny_qwen3_moe("relu")
    model.set_experts_implementation("fusedmoe")
    with torch.no_grad(), pytest.raises(ConfigError, match="hidden_act"):
        model(torch.randint(0, 97, (1, 5)))
