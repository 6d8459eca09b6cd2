"""Shared test plumbing for the fusedmoe test-suite.

- ``gpu`` marker: such tests are skipped cleanly on a machine without CUDA.
- ``slow`` marker: skipped unless RUN_SLOW=1 (a few compile-heavy checks).
- hypothesis profiles (tests/test_fuzz.py): ``ci``, the default (few examples, derandomized:
  every CI run draws the same cases), and ``long`` (many examples, random). Pick one with
  hypothesis' own option: ``pytest tests/test_fuzz.py --hypothesis-profile long``.
- Every test runs with no ``FUSEDMOE_*`` variable set (hermetic; set them with monkeypatch)
  and with the oracle's log-once memory empty. ``builtin_only``: the registry holds exactly
  the built-in backends.
- The ``mk`` fixture builds random layers: configs, weights in any scheme (through
  ``fusedmoe.quantize.quantize_experts``), tokens, router logits and top-k choices. Helpers
  are reached through a fixture (not ``from conftest import ...``) because the repository
  root has a conftest.py of its own and both would be the module ``conftest``.

Legend: T tokens, E experts (global), E_loc local experts, k top-k, H hidden, I intermediate,
N = 2I (gated) or I.
"""
from __future__ import annotations

import os
import types

import pytest
import torch

from fusedmoe.config import MoEConfig, QuantScheme
from fusedmoe.quantize import quantize_experts

HAS_CUDA = torch.cuda.is_available()

try:
    from hypothesis import settings as _hyp_settings
except ImportError:  # the `test` extra brings it; without it tests/test_fuzz.py skips
    _hyp_settings = None
else:
    # deadline=None: a call under the Triton interpreter takes ~0.3-1 s, and more on a loaded
    # machine; a test must not depend on the machine's speed
    _hyp_settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, print_blob=True)
    _hyp_settings.register_profile("long", max_examples=2000, deadline=None, print_blob=True)
    # the default; hypothesis' --hypothesis-profile (loaded at pytest_configure) overrides it
    _hyp_settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = pytest.mark.skip(reason="slow (inductor compile or the Triton interpreter); set RUN_SLOW=1 to run")
    run_slow = os.environ.get("RUN_SLOW", "") not in ("", "0")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch):
    """No FUSEDMOE_* variable leaks into a test (a developer's shell may set some)."""
    for name in list(os.environ):
        if name.startswith("FUSEDMOE_"):
            monkeypatch.delenv(name, raising=False)
    yield


# --------------------------------------------------------------------------------------- helpers
def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def make_config(E: int = 8, k: int = 2, H: int = 64, I: int = 32, **kw) -> MoEConfig:
    return MoEConfig(num_experts=E, top_k=k, hidden_size=H, intermediate_size=I, **kw)


def make_float_weights(cfg: MoEConfig, seed: int = 0, poison_experts=()):
    """fp32 (w13 [E_loc, N, H], w2 [E_loc, H, I], b13 [E_loc, N] | None, b2 [E_loc, H] | None).

    std 1/sqrt(fan_in), like a trained layer, so activations stay O(1). Experts listed in
    ``poison_experts`` (local ids) are filled with NaN: a backend that reads them where it
    must not (an expert without tokens) turns the output into NaN.
    """
    g = _gen(seed)
    E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    w13 = torch.randn(E, N, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    b13 = b2 = None
    if cfg.has_bias:
        b13 = torch.randn(E, N, generator=g) * 0.1
        b2 = torch.randn(E, H, generator=g) * 0.1
    for e in poison_experts:
        w13[e] = float("nan")
        w2[e] = float("nan")
    return w13, w2, b13, b2


def make_weights(cfg: MoEConfig, scheme="none", seed: int = 0, poison_experts=()):
    """Random ExpertWeights of ``cfg`` in ``scheme`` (quantized with quantize_experts)."""
    scheme = QuantScheme.parse(scheme)
    w13, w2, b13, b2 = make_float_weights(cfg, seed, poison_experts)
    dt = cfg.torch_dtype
    if scheme.method.value == "none":
        w13, w2 = w13.to(dt), w2.to(dt)
    kw = {}
    if scheme.static_activation_scale:
        # calibrated input scales: x and h are O(1) with |max| ~ 4, fp8 e4m3 max is 448
        kw = dict(a13_scale=4.0 / 448, a2_scale=4.0 / 448)
    return quantize_experts(w13, w2, scheme, w13_bias=None if b13 is None else b13.to(dt),
                            w2_bias=None if b2 is None else b2.to(dt), **kw)


def make_x(cfg: MoEConfig, T: int, seed: int = 1, dtype=None) -> torch.Tensor:
    """Tokens [T, H] ~ N(0, 1) in the config's dtype."""
    return torch.randn(T, cfg.hidden_size, generator=_gen(seed)).to(dtype or cfg.torch_dtype)


def make_logits(cfg: MoEConfig, T: int, seed: int = 2, unused_experts=()) -> torch.Tensor:
    """Router logits fp32 [T, E]; experts in ``unused_experts`` get -1e4 (never chosen)."""
    logits = torch.randn(T, cfg.num_experts, generator=_gen(seed)) * 2
    for e in unused_experts:
        logits[:, e] = -1e4
    return logits


def make_topk(T: int, E: int, k: int, seed: int = 3, exclude=()):
    """(topk_weights fp32 [T, k] in [0.2, 1.2), topk_ids int32 [T, k], distinct per token).

    Experts in ``exclude`` are never chosen. Weights are NOT normalized on purpose: a
    finalize that forgets them (or applies them twice) shows."""
    g = _gen(seed)
    scores = torch.rand(T, E, generator=g)
    for e in exclude:
        scores[:, e] = -1.0
    ids = scores.topk(k, dim=1).indices.to(torch.int32)
    w = torch.rand(T, k, generator=g) + 0.2
    return w, ids


@pytest.fixture(autouse=True)
def _fresh_oracle_log(monkeypatch):
    """Selections are logged once per key process-wide; start each test with none logged."""
    from fusedmoe import oracle
    monkeypatch.setattr(oracle, "_logged", set())


@pytest.fixture
def builtin_only(monkeypatch):
    """The registry holds exactly the built-in backends during the test."""
    from fusedmoe.backends import registry
    specs = registry.registered()
    missing = [n for n in registry.BUILTIN_MODULES if n not in specs]
    if missing:
        pytest.skip(f"built-in backends not registered in this build: {missing}")
    monkeypatch.setattr(registry, "_REGISTRY", {n: specs[n] for n in registry.BUILTIN_MODULES})


@pytest.fixture
def mk():
    """Namespace of the builders above: mk.config, mk.weights, mk.float_weights, mk.x,
    mk.logits, mk.topk."""
    return types.SimpleNamespace(config=make_config, weights=make_weights, float_weights=make_float_weights,
                                 x=make_x, logits=make_logits, topk=make_topk)
