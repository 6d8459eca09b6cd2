"""The oracle: ONE generic backend selection over the registry.

    select_backend(config, quant, platform, requested="auto") -> Selection

1. An explicit request (the argument, else ``FUSEDMOE_BACKEND``) is validated; if that
   backend cannot serve the configuration, raise ``NoBackendError`` with every reason.
   Never fall back silently.
2. Otherwise walk the priority table for (quant scheme, device family), minus
   ``FUSEDMOE_DISABLE_BACKENDS``; registered backends not in the table follow, in
   registration order. The first backend whose spec and check pass wins.
3. The ``Selection`` holds the winner and every candidate with reason codes and text.
   It is logged once at INFO; ``fusedmoe explain`` prints it.

The priority table is data (``PRIORITY``), with the benchmark evidence for each rule in
docs/BENCHMARKS.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from . import env
from .backends.registry import Reason, registered
from .config import MoEConfig, QuantMethod, QuantScheme
from .errors import ConfigError, ConfigTypeError, NoBackendError, check_bool, check_choice, check_int
from .modular.interfaces import ActivationFormat
from .platform import Platform

__all__ = ["select_backend", "Selection", "Candidate", "PRIORITY", "priority_order"]

log = logging.getLogger("fusedmoe")

_NATIVE_8BIT = (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_BLOCK, QuantMethod.INT8_CHANNEL)

# (scheme group, device family) -> order. Families: cpu, ampere, ada, hopper, blackwell.
# Evidence: docs/BENCHMARKS.md ("Why the priority table is what it is").
PRIORITY: dict[tuple[str, str], list[str]] = {
    # 16-bit: our Triton kernels beat PyTorch's grouped GEMM pipeline at every measured T on H100.
    ("none", "cuda"): ["triton", "grouped_mm", "triton_batched", "torch_ref"],
    # CPU: grouped_mm is one call per GEMM; the reference loops over experts in Python.
    ("none", "cpu"): ["grouped_mm", "triton", "torch_ref"],
    # fp8 / int8 W8A8 with tensor cores (sm89+): native Triton first, emulation as the safe path.
    # grouped_mm serves fp8_channel only, on sm90 only (torch._scaled_grouped_mm); measured on
    # H100 (qwen3-30b-a3b, T=1..16384): 3-5x slower than triton, hence after the Triton backends.
    ("w8a8", "cuda"): ["triton", "triton_batched", "grouped_mm", "emulation", "torch_ref"],
    ("w8a8", "cpu"): ["emulation", "triton", "torch_ref"],
    # weight-only and fp4 formats: no native kernel yet on these chips -> emulation (dequantized once).
    ("other", "cuda"): ["emulation", "torch_ref"],
    ("other", "cpu"): ["emulation", "torch_ref"],
}


def _group(method: QuantMethod) -> str:
    if method == QuantMethod.NONE:
        return "none"
    if method in _NATIVE_8BIT:
        return "w8a8"
    return "other"


def priority_order(quant: QuantScheme, platform: Platform) -> list[str]:
    """The table's order for this scheme and device, then every other registered backend."""
    table = PRIORITY.get((_group(quant.method), "cpu" if platform.kind == "cpu" else "cuda"), [])
    specs = registered()
    return [n for n in table if n in specs] + [n for n in specs if n not in table]


@dataclass
class Candidate:
    name: str
    reasons: list                    # list[Reason]; empty = could serve
    rank: int                        # position in the walk (0 = first tried)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "rank": self.rank,
                "reasons": [{"code": r.code, "text": r.text} for r in self.reasons]}


@dataclass
class Selection:
    """The oracle's answer: the winner, how it was asked for, and every candidate's verdict."""

    winner: str
    source: str                      # "argument", "env:FUSEDMOE_BACKEND" or "auto"
    requested: str
    config: MoEConfig
    quant: QuantScheme
    platform: Platform
    candidates: list = field(default_factory=list)
    variants: dict = field(default_factory=dict)   # token bucket -> kernel variant of the winner
    deterministic: bool = False
    notes: list = field(default_factory=list)

    def candidate(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.name == name)

    def to_dict(self) -> dict:
        return {"winner": self.winner, "source": self.source, "requested": self.requested,
                "quant": self.quant.name, "platform": self.platform.name, "family": self.platform.family,
                "config": repr(self.config), "deterministic": self.deterministic,
                "variants": dict(self.variants), "notes": list(self.notes),
                "candidates": [c.to_dict() for c in self.candidates]}

    def summary(self) -> str:
        return (f"fusedmoe: using backend '{self.winner}' ({self.source}) for {self.quant.name} on "
                f"{self.platform.name}; candidates: " +
                ", ".join(c.name + ("" if c.ok else "(x)") for c in self.candidates))

    def explain(self) -> str:
        lines = [f"Selection for {self.config!r}",
                 f"  quant={self.quant.name}  platform={self.platform.name} ({self.platform.family}, "
                 f"sm_{self.platform.sm})  requested={self.requested}  source={self.source}",
                 f"  winner: {self.winner}"]
        if self.variants:
            lines.append("  kernel variant per token bucket:")
            lines.extend(f"    {k:8s} {v}" for k, v in self.variants.items())
        lines.append("  candidates (in the order tried):")
        for c in self.candidates:
            mark = "WIN " if c.name == self.winner else ("ok  " if c.ok else "no  ")
            lines.append(f"    {mark}{c.name:16s} " + ("; ".join(str(r) for r in c.reasons) if c.reasons
                                                        else ("chosen" if c.name == self.winner
                                                              else "could serve; lower priority")))
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


_logged: set = set()


def select_backend(config: MoEConfig, quant=None, platform=None, requested: Optional[str] = "auto", *,
                   fmt: ActivationFormat = ActivationFormat.STANDARD, deterministic: bool = False,
                   max_tokens: Optional[int] = None, log_once: bool = True) -> Selection:
    """Choose the backend for ``config`` with weights in ``quant`` on ``platform``.

    ``requested``: "auto" (or None), or a backend name. ``FUSEDMOE_BACKEND`` applies when
    the argument is "auto". Raises ``NoBackendError`` when nothing (or the requested
    backend) can serve, with each candidate's reasons.
    """
    if not isinstance(config, MoEConfig):
        raise ConfigTypeError("config", config, "fusedmoe.MoEConfig")
    if requested is not None and not isinstance(requested, str):
        raise ConfigTypeError("backend", requested, "str: 'auto' or a backend name (`fusedmoe backends` lists them)")
    check_bool("deterministic", deterministic)
    if max_tokens is not None:
        check_int("max_tokens", max_tokens, min_value=1)
    quant = QuantScheme.parse(quant)
    platform = Platform.resolve(platform)
    fmt = check_choice("fmt", fmt, ActivationFormat, "'standard' (token-major) or 'batched' (expert-major)")
    specs = registered()
    source = "argument"
    if requested in (None, "auto"):
        forced = env.backend()
        requested, source = (forced, "env:FUSEDMOE_BACKEND") if forced else ("auto", "auto")
    if requested != "auto" and requested not in specs:
        raise ConfigError("backend" if source == "argument" else "FUSEDMOE_BACKEND", requested,
                          ["auto", *specs], "run `fusedmoe backends` to list them", problem="is not a registered backend")
    disabled = env.disabled_backends()
    unknown = sorted(disabled - set(specs))
    if unknown:   # a typo would otherwise leave the backend it meant enabled
        raise ConfigError("FUSEDMOE_DISABLE_BACKENDS", ",".join(sorted(disabled)), list(specs),
                          "name registered backends only (`fusedmoe backends` lists them)",
                          problem=f"names unknown backend{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    order = priority_order(quant, platform)
    kw = dict(fmt=fmt, deterministic=deterministic, max_tokens=max_tokens)
    candidates = []
    for rank, name in enumerate(order):
        reasons = specs[name].evaluate(config, quant, platform, **kw)
        if name in disabled:
            reasons = [Reason("disabled", "listed in FUSEDMOE_DISABLE_BACKENDS"), *reasons]
        candidates.append(Candidate(name, reasons, rank))

    if requested != "auto":
        cand = next(c for c in candidates if c.name == requested)
        if not cand.ok:
            raise NoBackendError(
                f"backend {requested!r} ({source}) cannot serve {config!r} with quant={quant.name} "
                f"on {platform.name}:", {requested: [str(r) for r in cand.reasons]},
                hint="use backend='auto', or `fusedmoe explain` to see which backends can")
        winner = requested
    else:
        winner = next((c.name for c in candidates if c.ok), None)
        if winner is None:
            raise NoBackendError(
                f"no backend can serve {config!r} with quant={quant.name} on {platform.name}:",
                {c.name: [str(r) for r in c.reasons] for c in candidates},
                hint="torch_ref serves every scheme on every device unless it is disabled; "
                     "check FUSEDMOE_DISABLE_BACKENDS and the configuration")
    spec = specs[winner]
    sel = Selection(winner, source, requested, config, quant, platform, candidates, deterministic=deterministic)
    if spec.variants is not None:
        sel.variants = spec.variants(config, quant, platform)
    if not spec.native or (winner == "torch_ref" and platform.kind == "cuda"):
        sel.notes.append(f"'{winner}' is a correctness path for {quant.name} here, not a fast one")
    if log_once:
        key = (winner, repr(config), quant.name, platform.name, source)
        if key not in _logged:
            _logged.add(key)
            log.info(sel.summary())
            if source == "auto":            # an explicit request knows what it asked for
                for n in sel.notes:
                    log.warning("fusedmoe: %s", n)
    return sel
