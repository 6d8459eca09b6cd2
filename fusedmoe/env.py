"""The only module that reads ``FUSEDMOE_*`` environment variables.

Each is read on call (not at import) so tests and users can change them at run time;
callers read them outside the forward pass (at construction / selection time).

| variable                    | meaning                                                      |
|-----------------------------|--------------------------------------------------------------|
| FUSEDMOE_BACKEND            | force a backend by name (same rules as an explicit request)   |
| FUSEDMOE_DISABLE_BACKENDS   | comma-separated backend names the oracle must skip            |
| FUSEDMOE_CHUNK_SIZE         | max tokens per ModularKernel chunk (default 16384)            |
| FUSEDMOE_CONFIG_DIR         | folder of tuned launch-config JSON files, searched first      |
| FUSEDMOE_DEBUG              | 1: run data-dependent input checks (these sync the device)    |
| FUSEDMOE_LOG_LEVEL          | level of the ``fusedmoe`` logger (default WARNING)            |
| FUSEDMOE_PLAN               | tuning / A-B work only: a JSON object overriding fields of    |
|                             | the Triton backend's launch plans (fusedmoe/plan.py           |
|                             | ``PlanOverride``; docs/DEVELOPING.md)                         |
"""
from __future__ import annotations

import logging
import os

from .errors import ConfigError

DEFAULT_CHUNK_SIZE = 16384

VARIABLES = ("FUSEDMOE_BACKEND", "FUSEDMOE_DISABLE_BACKENDS", "FUSEDMOE_CHUNK_SIZE",
             "FUSEDMOE_CONFIG_DIR", "FUSEDMOE_DEBUG", "FUSEDMOE_LOG_LEVEL", "FUSEDMOE_PLAN")


def backend() -> str | None:
    v = os.environ.get("FUSEDMOE_BACKEND", "").strip()
    return v or None


def disabled_backends() -> frozenset[str]:
    v = os.environ.get("FUSEDMOE_DISABLE_BACKENDS", "")
    return frozenset(s.strip() for s in v.split(",") if s.strip())


def _int_var(name: str, min_value: int, expected: str, example: str) -> int | None:
    """An integer variable, None when unset; a clear error when it is not an int >= min_value."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        n = int(v)
    except ValueError:
        n = min_value - 1
    if n < min_value:
        raise ConfigError(name, v, expected, f"unset it or set e.g. {name}={example}")
    return n


def chunk_size() -> int:
    n = _int_var("FUSEDMOE_CHUNK_SIZE", 1, "a positive integer", "8192")
    return DEFAULT_CHUNK_SIZE if n is None else n


def config_dir() -> str | None:
    v = os.environ.get("FUSEDMOE_CONFIG_DIR", "").strip()
    return v or None


_BOOLS = {"0": False, "false": False, "1": True, "true": True}


def _bool_var(name: str) -> bool:
    """A boolean variable: unset or empty is off; 0/1/true/false (any case); anything else is
    an error, not 'on' (a typo such as 'nope' or 'off' must not turn a mode on)."""
    v = os.environ.get(name, "").strip()
    if not v:
        return False
    if v.lower() not in _BOOLS:
        raise ConfigError(name, v, ["0", "1", "true", "false"], f"unset it or set {name}=1 (on) or {name}=0 (off)")
    return _BOOLS[v.lower()]


def debug() -> bool:
    return _bool_var("FUSEDMOE_DEBUG")


def plan() -> str | None:
    """FUSEDMOE_PLAN's JSON text, None when unset (parsed and checked by plan.PlanOverride)."""
    v = os.environ.get("FUSEDMOE_PLAN", "").strip()
    return v or None


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level() -> str:
    """FUSEDMOE_LOG_LEVEL: one of DEBUG, INFO, WARNING (default), ERROR, CRITICAL."""
    v = os.environ.get("FUSEDMOE_LOG_LEVEL", "").strip().upper() or "WARNING"
    if v not in _LEVELS:
        raise ConfigError("FUSEDMOE_LOG_LEVEL", v, list(_LEVELS), "unset it (WARNING) or set e.g. FUSEDMOE_LOG_LEVEL=INFO")
    return v


def apply_log_level() -> None:
    """Set the ``fusedmoe`` logger's level from FUSEDMOE_LOG_LEVEL (at import, and again by
    callers that changed the variable)."""
    logging.getLogger("fusedmoe").setLevel(log_level())


def snapshot() -> dict[str, str]:
    """Every FUSEDMOE_* variable that is set (for reports)."""
    return {k: v for k, v in os.environ.items() if k.startswith("FUSEDMOE_")}
