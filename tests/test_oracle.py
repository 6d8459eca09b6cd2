"""The oracle (fusedmoe.oracle.select_backend): one generic selection over the registry.

Table-driven over hand-built platforms (Platform.preset: cpu, a100, h100, b200). The
expected winners are what the CURRENT priority table (oracle.PRIORITY) and the built-in
specs imply; the registry is pinned to the built-in backends for those tests, so a
backend registered later (or by another test) cannot change them.

Legend: E experts, k top-k, H hidden, I intermediate.
"""
from __future__ import annotations

import json
import logging

import pytest
import torch

import fusedmoe.layer as layer_mod
import fusedmoe.oracle as oracle
from fusedmoe.backends.registry import BUILTIN_MODULES, BackendSpec, Reason, get_spec, register, registered, unregister
from fusedmoe.backends.torch_ref import TorchRefExperts
from fusedmoe.config import Activation, MoEConfig, QuantMethod, QuantScheme
from fusedmoe.errors import ConfigError, NoBackendError
from fusedmoe.layer import FusedMoE, prepare_experts
from fusedmoe.modular.interfaces import ActivationFormat
from fusedmoe.platform import Platform
from fusedmoe.reference.moe import reference_moe
from fusedmoe.tolerances import rel_error, tolerance

BUILTIN = BUILTIN_MODULES


def cfg_(dtype="bfloat16", **kw) -> MoEConfig:
    # H, I multiples of 128: fp8_block's blocks and grouped_mm's 16-byte rows both fit
    return MoEConfig(8, 2, 256, 128, dtype=dtype, **kw)


# ------------------------------------------------------------------------------ the table
# (scheme, platform, dtype) -> (winner, {backend: reason codes}); backends absent from the
# dict could serve but rank lower ("could serve; lower priority").
TABLE = [
    # 16-bit on CPU: grouped_mm first; the preset 'cpu' has no Triton (no interpreter);
    # triton_batched serves the batched format only (these selections ask for standard)
    ("none", "cpu", "bfloat16", "grouped_mm", {"triton": ["triton"], "emulation": ["quant"],
                                               "triton_batched": ["format", "triton"]}),
    # 16-bit on CUDA: the Triton kernels first, on every sm80+ family
    ("none", "a100", "bfloat16", "triton", {"emulation": ["quant"], "triton_batched": ["format"]}),
    ("none", "h100", "bfloat16", "triton", {"emulation": ["quant"], "triton_batched": ["format"]}),
    ("none", "b200", "bfloat16", "triton", {"emulation": ["quant"], "triton_batched": ["format"]}),
    # fp32 activations: grouped_mm on CUDA takes bf16 only
    ("none", "h100", "float32", "triton", {"grouped_mm": ["dtype"], "emulation": ["quant"],
                                           "triton_batched": ["format"]}),
    # fp8 blocks: no fp8 tensor cores on A100 -> emulation; Hopper / Blackwell -> Triton
    ("fp8_block", "cpu", "bfloat16", "emulation", {"triton": ["triton"], "grouped_mm": ["quant"],
                                                   "triton_batched": ["format", "triton"]}),
    ("fp8_block", "a100", "bfloat16", "emulation", {"triton": ["quant_sm"], "grouped_mm": ["quant"],
                                                    "triton_batched": ["quant_sm", "format"]}),
    ("fp8_block", "h100", "bfloat16", "triton", {"grouped_mm": ["quant"], "triton_batched": ["format"]}),
    ("fp8_block", "b200", "bfloat16", "triton", {"grouped_mm": ["quant"], "triton_batched": ["format"]}),
    ("fp8_tensor", "a100", "bfloat16", "emulation", {"triton": ["quant_sm"], "grouped_mm": ["quant"],
                                                     "triton_batched": ["quant_sm", "format"]}),
    # grouped_mm serves fp8_channel on sm90 through torch._scaled_grouped_mm (when this torch has it)
    ("fp8_channel", "h100", "bfloat16", "triton",
     {"triton_batched": ["format"], **({} if hasattr(torch, "_scaled_grouped_mm") else {"grouped_mm": ["torch"]})}),
    # int8 W8A8 has int8 tensor cores on sm80
    ("int8_channel", "a100", "bfloat16", "triton", {"grouped_mm": ["quant"], "triton_batched": ["format"]}),
    ("int8_channel", "cpu", "bfloat16", "emulation", {"triton": ["triton"], "grouped_mm": ["quant"],
                                                      "triton_batched": ["format", "triton"]}),
    # weight-only and fp4: emulation everywhere (no native kernel registered)
    ("int4_w4a16", "h100", "bfloat16", "emulation", {"triton": ["quant"], "grouped_mm": ["quant"],
                                                     "triton_batched": ["quant", "format"]}),
    ("mxfp4", "h100", "bfloat16", "emulation", {"triton": ["quant"], "grouped_mm": ["quant"],
                                                "triton_batched": ["quant", "format"]}),
    ("nvfp4", "b200", "bfloat16", "emulation", {"triton": ["quant"], "grouped_mm": ["quant"],
                                                "triton_batched": ["quant", "format"]}),
    ("fp8_w8a16", "cpu", "float32", "emulation", {"triton": ["quant", "triton"], "grouped_mm": ["quant"],
                                                  "triton_batched": ["quant", "format", "triton"]}),
]


@pytest.mark.parametrize("scheme,plat,dtype,winner,rejected", TABLE,
                         ids=[f"{s}-{p}-{d}" for s, p, d, *_ in TABLE])
def test_priority_table(builtin_only, scheme, plat, dtype, winner, rejected):
    sel = oracle.select_backend(cfg_(dtype), scheme, Platform.preset(plat))
    assert sel.winner == winner and sel.source == "auto" and sel.requested == "auto"
    assert sorted(c.name for c in sel.candidates) == sorted(BUILTIN)    # every backend is judged
    codes = {c.name: [r.code for r in c.reasons] for c in sel.candidates}
    assert codes[winner] == []
    for name, want in rejected.items():
        assert codes[name] == want, (name, codes[name])
    for name in BUILTIN:
        if name not in rejected:
            assert codes[name] == [], (name, codes[name])                # could serve, lower priority
    # the winner is the first servable candidate in the order tried
    assert [c.name for c in sel.candidates if c.ok][0] == winner
    assert [c.rank for c in sel.candidates] == list(range(len(BUILTIN)))
    text = sel.explain()
    for c in sel.candidates:
        line = next(ln for ln in text.splitlines()
                    if ln.split()[:1] in (["WIN"], ["ok"], ["no"]) and ln.split()[1] == c.name)
        if c.name == winner:
            assert line.strip().startswith("WIN") and "chosen" in line
        elif c.ok:
            assert "could serve; lower priority" in line
        else:
            assert all(f"[{r.code}]" in line for r in c.reasons)


def test_priority_order_is_table_then_the_rest(builtin_only):
    # the table's order for (scheme group, device kind), then registered backends not in it
    assert oracle.priority_order(QuantScheme("none"), Platform.preset("cpu")) == \
        ["grouped_mm", "triton", "torch_ref", "emulation", "triton_batched"]
    assert oracle.priority_order(QuantScheme("fp8_block"), Platform.preset("h100")) == \
        ["triton", "triton_batched", "grouped_mm", "emulation", "torch_ref"]
    assert oracle.priority_order(QuantScheme("mxfp4"), Platform.preset("b200")) == \
        ["emulation", "torch_ref", "grouped_mm", "triton", "triton_batched"]


@pytest.mark.parametrize("scheme,plat,winner", [
    ("fp8_block", "h100", "triton_batched"),      # triton is standard-only: format
    ("none", "h100", "triton_batched"),           # grouped_mm too
    ("none", "cpu", "torch_ref"),                 # no Triton on the cpu preset; grouped_mm standard-only
    ("mxfp4", "h100", "emulation"),               # emulation has batched experts
])
def test_batched_format_selection(builtin_only, scheme, plat, winner):
    sel = oracle.select_backend(cfg_(), scheme, Platform.preset(plat), fmt=ActivationFormat.BATCHED)
    assert sel.winner == winner
    assert "format" in [r.code for r in sel.candidate("grouped_mm").reasons]


def test_every_registered_backend_is_judged():
    # on whatever is registered now (builtins + entry points): each non-winner says why
    sel = oracle.select_backend(cfg_(), "fp8_block", Platform.preset("h100"))
    assert {c.name for c in sel.candidates} == set(registered())
    lines = {ln.split()[1]: ln for ln in sel.explain().splitlines() if ln.split()[:1] in (["WIN"], ["ok"], ["no"])}
    assert set(lines) == set(registered())
    for c in sel.candidates:
        if c.name == sel.winner:
            assert c.ok and "chosen" in lines[c.name]
        elif c.ok:
            assert "could serve; lower priority" in lines[c.name]
        else:
            assert all(r.code and r.text and str(r) in lines[c.name] for r in c.reasons)


def test_notes_say_emulation_is_not_native(builtin_only):
    sel = oracle.select_backend(cfg_(), "mxfp4", Platform.preset("h100"))
    assert sel.winner == "emulation" and any("correctness path" in n for n in sel.notes)
    assert oracle.select_backend(cfg_(), "fp8_block", Platform.preset("h100")).notes == []


# ------------------------------------------------------------------------------ explicit requests
def test_explicit_request_honoured(builtin_only):
    sel = oracle.select_backend(cfg_(), "none", Platform.preset("h100"), "torch_ref")
    assert (sel.winner, sel.source, sel.requested) == ("torch_ref", "argument", "torch_ref")


def test_explicit_request_that_cannot_serve_raises(builtin_only):
    # grouped_mm serves 16-bit weights only; never a silent fallback to emulation
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "fp8_block", Platform.preset("h100"), "grouped_mm")
    e = ei.value
    assert list(e.rejections) == ["grouped_mm"]
    assert any("[quant]" in r and "fp8_block" in r for r in e.rejections["grouped_mm"])
    assert "grouped_mm" in str(e) and "Hint:" in str(e)


def test_explicit_request_lists_every_reason(builtin_only):
    # triton on A100 in fp8 and on a preset without Triton: one line per reason
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "fp8_block", Platform.preset("a100"), "triton")
    assert [r.split("]")[0] + "]" for r in ei.value.rejections["triton"]] == ["[quant_sm]"]
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "int4_w4a16", Platform.preset("cpu"), "triton")
    assert {r.split("]")[0] + "]" for r in ei.value.rejections["triton"]} == {"[quant]", "[triton]"}


def test_unknown_backend_lists_registered_names():
    with pytest.raises(ConfigError) as ei:
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"), "cutlass_magic")
    msg = str(ei.value)
    assert msg.startswith("backend='cutlass_magic'")
    for name in registered():
        assert name in msg
    with pytest.raises(ConfigError, match="backend='nope'"):
        get_spec("nope")


# ------------------------------------------------------------------------------ environment
def test_env_backend_override(builtin_only, monkeypatch):
    monkeypatch.setenv("FUSEDMOE_BACKEND", "torch_ref")
    sel = oracle.select_backend(cfg_(), "none", Platform.preset("h100"))
    assert (sel.winner, sel.source) == ("torch_ref", "env:FUSEDMOE_BACKEND")
    # the argument wins over the environment
    sel = oracle.select_backend(cfg_(), "none", Platform.preset("h100"), "grouped_mm")
    assert (sel.winner, sel.source) == ("grouped_mm", "argument")


def test_env_backend_that_cannot_serve_raises(builtin_only, monkeypatch):
    monkeypatch.setenv("FUSEDMOE_BACKEND", "grouped_mm")
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "mxfp4", Platform.preset("h100"))
    assert "FUSEDMOE_BACKEND" in str(ei.value)


def test_env_backend_unknown_names_the_variable(monkeypatch):
    monkeypatch.setenv("FUSEDMOE_BACKEND", "nope")
    with pytest.raises(ConfigError) as ei:
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"))
    assert str(ei.value).startswith("FUSEDMOE_BACKEND='nope'")


def test_disable_backends_changes_the_winner(builtin_only, monkeypatch):
    plat = Platform.preset("h100")
    assert oracle.select_backend(cfg_(), "fp8_block", plat).winner == "triton"
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", "triton")
    sel = oracle.select_backend(cfg_(), "fp8_block", plat)
    assert sel.winner == "emulation"
    assert [r.code for r in sel.candidate("triton").reasons] == ["disabled"]
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", "triton, emulation")
    assert oracle.select_backend(cfg_(), "fp8_block", plat).winner == "torch_ref"


def test_disable_backends_with_an_unknown_name_raises_naming_it(builtin_only, monkeypatch):
    # a typo must not leave the backend it meant enabled
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", "grouped_mm,nope")
    with pytest.raises(ConfigError) as ei:
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"))
    msg = str(ei.value)
    assert msg.startswith("FUSEDMOE_DISABLE_BACKENDS='grouped_mm,nope' names unknown backend nope;")
    assert all(n in msg for n in BUILTIN)                     # the registered names
    with pytest.raises(ConfigError, match="unknown backends nope, zz"):
        monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", "zz,torch_ref,nope")
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"))


def test_explicit_request_of_disabled_backend_raises(builtin_only, monkeypatch):
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", "torch_ref")
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"), "torch_ref")
    assert any("[disabled]" in r for r in ei.value.rejections["torch_ref"])


def test_nothing_fits_lists_every_candidate_and_a_hint(builtin_only, monkeypatch):
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", ",".join(BUILTIN))
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "fp8_block", Platform.preset("h100"))
    e = ei.value
    assert set(e.rejections) == set(BUILTIN)
    assert all(any("[disabled]" in r for r in rs) for rs in e.rejections.values())
    assert any("[quant]" in r for r in e.rejections["grouped_mm"])       # and the other reasons too
    msg = str(e)
    assert "Hint:" in msg and "FUSEDMOE_DISABLE_BACKENDS" in msg
    assert all(f"  - {n}:" in msg for n in BUILTIN)


# ------------------------------------------------------------------------------ deterministic
def _make_ref(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    return TorchRefExperts(config, weights)


@pytest.fixture
def fake_nondet():
    spec = register(BackendSpec(name="test_fake_nondet", description="non-deterministic test backend",
                                make_experts=_make_ref, deterministic=False))
    yield spec
    unregister("test_fake_nondet")


def test_deterministic_filters_non_deterministic(fake_nondet, monkeypatch):
    monkeypatch.setenv("FUSEDMOE_DISABLE_BACKENDS", ",".join(BUILTIN))
    assert oracle.select_backend(cfg_(), "none", Platform.preset("cpu")).winner == "test_fake_nondet"
    with pytest.raises(NoBackendError) as ei:
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"), deterministic=True)
    assert any("[deterministic]" in r for r in ei.value.rejections["test_fake_nondet"])
    monkeypatch.delenv("FUSEDMOE_DISABLE_BACKENDS")
    with pytest.raises(NoBackendError):                  # explicitly asked and deterministic: refused
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"), "test_fake_nondet", deterministic=True)
    sel = oracle.select_backend(cfg_(), "none", Platform.preset("cpu"), deterministic=True)
    assert sel.deterministic and [r.code for r in sel.candidate("test_fake_nondet").reasons] == ["deterministic"]


# ------------------------------------------------------------------------------ third party
class ScaledRefExperts(TorchRefExperts):
    """A third-party experts kernel: the reference, times 1 (just its own class)."""

    calls = 0

    def apply(self, prep, ws, expert_map):
        ScaledRefExperts.calls += 1
        return super().apply(prep, ws, expert_map)


def _make_third(config, weights, platform, fmt, *, deterministic=False, max_num_tokens=None):
    return ScaledRefExperts(config, weights)


@pytest.fixture
def third_party():
    spec = register(BackendSpec(name="acme_moe", description="third-party test backend",
                                make_experts=_make_third, quant_methods=frozenset({QuantMethod.NONE}),
                                activations=frozenset({Activation.SILU}), devices=frozenset({"cpu"})))
    yield spec
    unregister("acme_moe")
    assert "acme_moe" not in registered()


def test_third_party_backend_selectable_and_explained(third_party, mk):
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=1)
    x = mk.x(cfg, 9, seed=2)
    tw, ti = mk.topk(9, 8, 2, seed=3)
    ScaledRefExperts.calls = 0
    pe = prepare_experts(cfg, w, "acme_moe")
    assert pe.selection.winner == "acme_moe" and isinstance(pe.kernel.experts, ScaledRefExperts)
    assert rel_error(pe(x, tw, ti), reference_moe(x, w, tw, ti, cfg)) <= tolerance("float32", "none")
    assert ScaledRefExperts.calls == 1
    # it shows up in every selection, with reasons where its table says no
    sel = oracle.select_backend(cfg_(), "fp8_block", Platform.preset("h100"))
    assert {r.code for r in sel.candidate("acme_moe").reasons} == {"device", "quant"}
    assert "acme_moe" in sel.explain()
    gelu = oracle.select_backend(cfg_(activation="gelu"), "none", Platform.preset("cpu"))
    assert [r.code for r in gelu.candidate("acme_moe").reasons] == ["activation"]
    # a second registration under the same name is refused
    with pytest.raises(ConfigError, match="already registered"):
        register(third_party)


def test_spec_check_adds_reasons_only_when_the_table_passes():
    calls = []

    def check(config, quant, platform):
        calls.append(quant.name)
        return [Reason("shape", "needs H % 512 == 0")]

    spec = BackendSpec(name="x", description="", make_experts=_make_ref, check=check,
                       quant_methods=frozenset({QuantScheme().method}))
    assert [r.code for r in spec.evaluate(cfg_(), QuantScheme(), Platform.preset("cpu"))] == ["shape"]
    assert [r.code for r in spec.evaluate(cfg_(), QuantScheme("fp8_block"), Platform.preset("cpu"))] == ["quant"]
    assert calls == ["none"]
    assert [r.code for r in spec.evaluate(cfg_(), QuantScheme(), Platform.preset("cpu"),
                                          fmt=ActivationFormat.BATCHED)] == ["format"]


def test_register_rejects_non_specs():
    with pytest.raises(ConfigError, match="spec="):
        register({"name": "dict_backend"})


# ------------------------------------------------------------------------------ Selection
def test_selection_to_dict_is_json(builtin_only):
    sel = oracle.select_backend(cfg_(), "fp8_block", Platform.preset("h100"))
    d = json.loads(json.dumps(sel.to_dict()))                 # no default=str needed
    assert d["winner"] == "triton" and d["quant"] == "fp8_block" and d["family"] == "hopper"
    assert {c["name"] for c in d["candidates"]} == set(BUILTIN)
    for c in d["candidates"]:
        assert c["ok"] == (not c["reasons"])
        assert all(set(r) == {"code", "text"} for r in c["reasons"])
    assert d["config"] == repr(cfg_())


def test_one_info_log_per_selection_not_per_forward(mk, caplog):
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=4)
    x = mk.x(cfg, 5, seed=5)
    logits = mk.logits(cfg, 5, seed=6)
    with caplog.at_level(logging.INFO, logger="fusedmoe"):
        layer = FusedMoE(cfg, w)
        for _ in range(3):
            layer(x, logits)
        FusedMoE(cfg, w)                                       # same selection again: not logged again
    infos = [r for r in caplog.records if r.name == "fusedmoe" and r.levelno == logging.INFO]
    assert len(infos) == 1
    assert f"'{layer.selection.winner}'" in infos[0].getMessage()


def test_a_different_selection_logs_again(caplog):
    with caplog.at_level(logging.INFO, logger="fusedmoe"):
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"))
        oracle.select_backend(cfg_(), "none", Platform.preset("cpu"))
        oracle.select_backend(cfg_(), "none", Platform.preset("h100"))
        oracle.select_backend(cfg_(), "none", Platform.preset("h100"), log_once=False)
    infos = [r for r in caplog.records if r.name == "fusedmoe" and r.levelno == logging.INFO]
    assert len(infos) == 2


def test_auto_emulation_warns_once(builtin_only, caplog):
    # an automatic pick of a correctness path says so at WARNING (once)
    with caplog.at_level(logging.INFO, logger="fusedmoe"):
        oracle.select_backend(cfg_(), "mxfp4", Platform.preset("h100"))
        oracle.select_backend(cfg_(), "mxfp4", Platform.preset("h100"))
    warns = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warns) == 1 and "emulation" in warns[0].getMessage()


def test_layer_selects_on_the_weights_device(mk, monkeypatch):
    # FusedMoE selects once, at construction, for the platform of the weights
    cfg = mk.config(E=8, k=2, H=32, I=16, dtype="float32")
    w = mk.weights(cfg, seed=7)
    seen = []
    orig = layer_mod.select_backend
    monkeypatch.setattr(layer_mod, "select_backend", lambda *a, **kw: seen.append(a[2]) or orig(*a, **kw))
    layer = FusedMoE(cfg, w)
    layer(mk.x(cfg, 3, seed=8), mk.logits(cfg, 3, seed=9))
    assert len(seen) == 1 and seen[0].kind == "cpu"
    assert layer.selection.platform.kind == "cpu"


def test_format_may_be_given_as_a_string(builtin_only):
    sel = oracle.select_backend(cfg_(), "none", Platform.preset("cpu"), fmt="batched")
    assert sel.winner == "torch_ref"
