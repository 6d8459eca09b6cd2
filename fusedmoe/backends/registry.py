"""The backend registry: one declarative ``BackendSpec`` per backend module.

A backend module ends with ``register(BackendSpec(...))``. Third parties register the same
way from their own package, exposed through the entry-point group ``fusedmoe.backends``
(the entry point is imported; importing it must call ``register``).

``BackendSpec.evaluate(config, quant, platform, ...)`` returns the list of ``Reason`` s why
the backend cannot serve a configuration (empty = it can). The table fields cover most
cases; ``check`` adds what a table cannot say.
"""
from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..config import Activation, MoEConfig, QuantMethod, QuantScheme
from ..errors import ConfigError
from ..modular.interfaces import ActivationFormat
from ..platform import Platform

__all__ = ["BackendSpec", "Reason", "register", "unregister", "registered", "get_spec", "row_alignment",
           "BUILTIN_MODULES"]

log = logging.getLogger("fusedmoe")

ALL_ACTIVATIONS = frozenset(Activation)
ALL_QUANT = frozenset(QuantMethod)
ALL_ROUTING = frozenset({"topk", "topk_bias", "grouped_topk", "custom"})

BUILTIN_MODULES = ("torch_ref", "grouped_mm", "emulation", "triton", "triton_batched")


@dataclass(frozen=True)
class Reason:
    """Why a backend was not chosen: a stable ``code`` for machines, ``text`` for people."""

    code: str
    text: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.text}"


def row_alignment(config: MoEConfig, element_size: int, align_bytes: int, engine: str) -> list[Reason]:
    """``[Reason("shape", ...)]`` when a row of H or I elements of ``element_size`` bytes is not a
    multiple of ``align_bytes`` bytes, else ``[]``. For engines whose operands need aligned row
    strides on every device (torch's grouped_mm raises "strides should be multiple of 16 bytes"
    on CPU as on CUDA): a spec's ``check`` returns it, so the oracle moves on to the next backend
    and ``fusedmoe explain`` says why."""
    bad = [f"{n}={v}" for n, v in (("H", config.hidden_size), ("I", config.intermediate_size))
           if (v * element_size) % align_bytes]
    if not bad:
        return []
    step = align_bytes // math.gcd(align_bytes, element_size)
    return [Reason("shape", f"{engine} needs {align_bytes}-byte rows: {' and '.join(bad)} must be multiples of "
                            f"{step} for {element_size}-byte elements")]


@dataclass(frozen=True)
class BackendSpec:
    name: str
    description: str
    make_experts: Callable                    # (config, weights, platform, fmt, *, deterministic, max_num_tokens) -> Experts
    quant_methods: frozenset = ALL_QUANT
    activations: frozenset = ALL_ACTIVATIONS
    routing_methods: frozenset = ALL_ROUTING  # routing happens before the experts: modular backends take all
    formats: frozenset = frozenset({ActivationFormat.STANDARD})
    devices: frozenset = frozenset({"cpu", "cuda"})
    min_sm: int = 0                           # minimum CUDA compute capability (e.g. 89 for fp8)
    quant_min_sm: dict = field(default_factory=dict)   # per-scheme minimum sm, e.g. {fp8_block: 89}
    parallel: frozenset = frozenset({"single", "ep"})
    deterministic: bool = True                # can run bitwise-reproducibly
    cuda_graph_safe: bool = True
    max_tokens: Optional[int] = None
    supports_bias: bool = True
    supports_clamp: bool = True               # swiglu_limit / swigluoai limits honoured
    needs_triton: bool = False
    native: bool = True                       # False: emulates the scheme (perf warning once)
    check: Optional[Callable] = None          # (config, quant, platform) -> list[Reason]
    convert_weights: Optional[Callable] = None  # (config, weights, platform) -> weights, once at load
    variants: Optional[Callable] = None       # (config, quant, platform) -> {token bucket: kernel variant}

    def evaluate(self, config: MoEConfig, quant: QuantScheme, platform: Platform, *,
                 fmt: ActivationFormat = ActivationFormat.STANDARD, deterministic: bool = False,
                 max_tokens: Optional[int] = None) -> list[Reason]:
        r: list[Reason] = []
        if platform.kind not in self.devices:
            r.append(Reason("device", f"runs on {sorted(self.devices)}, not {platform.kind}"))
        if platform.kind == "cuda" and platform.sm < self.min_sm:
            r.append(Reason("min_sm", f"needs sm_{self.min_sm}+, {platform.name} is sm_{platform.sm}"))
        if quant.method not in self.quant_methods:
            r.append(Reason("quant", f"does not support quant scheme {quant.method.value}"))
        else:
            need = self.quant_min_sm.get(quant.method, 0)
            if platform.kind == "cuda" and platform.sm < need:
                r.append(Reason("quant_sm", f"{quant.method.value} needs sm_{need}+ here "
                                            f"(fp8/int8 tensor cores); {platform.name} is sm_{platform.sm}"))
        if config.activation not in self.activations:
            r.append(Reason("activation", f"does not support activation {config.activation.value}"))
        if config.routing.method not in self.routing_methods:
            r.append(Reason("routing", f"does not support routing method {config.routing.method}"))
        if fmt not in self.formats:
            r.append(Reason("format", f"does not support the {fmt.value} activation format"))
        mode = "ep" if config.parallel.use_ep else "single"
        if mode not in self.parallel:
            r.append(Reason("parallel", f"does not support parallel mode {mode}"))
        if deterministic and not self.deterministic:
            r.append(Reason("deterministic", "is not deterministic (deterministic=True was asked)"))
        if config.has_bias and not self.supports_bias:
            r.append(Reason("bias", "does not support expert biases"))
        if (config.swiglu_limit is not None or config.activation == Activation.SWIGLUOAI) and not self.supports_clamp:
            r.append(Reason("clamp", "does not honour the activation clamp (swiglu_limit / swigluoai limit)"))
        if self.max_tokens is not None and max_tokens is not None and max_tokens > self.max_tokens:
            r.append(Reason("max_tokens", f"serves at most {self.max_tokens} tokens per call, {max_tokens} asked"))
        if self.needs_triton and not platform.triton:
            r.append(Reason("triton", "needs Triton on a CUDA device (or TRITON_INTERPRET=1 on CPU)"))
        if self.check is not None and not r:
            r.extend(self.check(config, quant, platform))
        return r

    def capability_table(self) -> dict:
        return {
            "name": self.name, "description": self.description,
            "quant": sorted(q.value for q in self.quant_methods),
            "activations": sorted(a.value for a in self.activations),
            "routing": sorted(self.routing_methods), "formats": sorted(f.value for f in self.formats),
            "devices": sorted(self.devices), "min_sm": self.min_sm,
            "quant_min_sm": {k.value: v for k, v in self.quant_min_sm.items()},
            "parallel": sorted(self.parallel), "deterministic": self.deterministic,
            "cuda_graph_safe": self.cuda_graph_safe, "max_tokens": self.max_tokens,
            "bias": self.supports_bias, "clamp": self.supports_clamp, "native": self.native,
        }


_REGISTRY: dict[str, BackendSpec] = {}
_loaded = False


def register(spec: BackendSpec, *, replace: bool = False) -> BackendSpec:
    if not isinstance(spec, BackendSpec):
        raise ConfigError("spec", spec, "a fusedmoe.backends.BackendSpec", "build one with BackendSpec(...)")
    if spec.name in _REGISTRY and not replace:
        raise ConfigError("name", spec.name, "a backend name not registered yet",
                          "pick another name or pass replace=True", problem="is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        importlib.import_module(f"fusedmoe.backends.{mod}")
    try:
        from importlib.metadata import entry_points
        for ep in entry_points(group="fusedmoe.backends"):
            try:
                ep.load()
            except Exception as e:  # a broken plugin must not break fusedmoe: say so, once
                log.warning("fusedmoe: could not load backend entry point %r: %s", ep.name, e)
    except Exception as e:  # pragma: no cover
        log.warning("fusedmoe: entry points unavailable: %s", e)


def registered() -> dict[str, BackendSpec]:
    _load()
    return dict(_REGISTRY)


def get_spec(name: str) -> BackendSpec:
    specs = registered()
    if name not in specs:
        raise ConfigError("backend", name, ["auto", *specs], "see `fusedmoe backends` for the registered backends",
                          problem="is not a registered backend")
    return specs[name]
