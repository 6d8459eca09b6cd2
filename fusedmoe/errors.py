"""User-facing errors.

Every user error names the parameter, the value given, what is accepted and a fix.
``assert`` is reserved for internal invariants.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence


class FusedMoEError(Exception):
    """Base class of every error fusedmoe raises on purpose."""


def _fmt_accepted(accepted: Any) -> str:
    if isinstance(accepted, str):
        return accepted
    if isinstance(accepted, Iterable):
        return ", ".join(str(getattr(a, "value", a)) for a in accepted)
    return str(accepted)


def _short_repr(value: Any, limit: int = 120) -> str:
    """repr(value), cut to ``limit`` characters (a list of 10^5 token weights passed where a
    tensor belongs must not become a 10^6-character message)."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 4] + " ..."


class ConfigError(FusedMoEError, ValueError):
    """A parameter has a value fusedmoe does not accept.

    The message always reads: ``<param>=<value!r> <problem>; accepted: <...>. Fix: <hint>``.
    """

    def __init__(self, param: str, value: Any, accepted: Any, hint: str = "", problem: str = "is not valid"):
        hint = hint or f"pass {param} as accepted"
        self.param, self.value, self.accepted, self.hint = param, value, accepted, hint
        super().__init__(f"{param}={_short_repr(value)} {problem}; accepted: {_fmt_accepted(accepted)}. Fix: {hint}")


class InputError(ConfigError):
    """A tensor argument has the wrong shape, dtype, device or range."""


class ConfigTypeError(FusedMoEError, TypeError):
    """A parameter has the wrong Python type."""

    def __init__(self, param: str, value: Any, expected: str, hint: str = ""):
        self.param, self.value = param, value
        hint = hint or f"pass {param} as {expected}"
        super().__init__(f"{param}={_short_repr(value)} has type {type(value).__name__}; expected {expected}. "
                         f"Fix: {hint}")


class NoBackendError(FusedMoEError, RuntimeError):
    """No backend can serve the configuration (or an explicit request cannot be honoured).

    ``rejections`` maps each candidate backend name to its list of reason texts.
    """

    def __init__(self, summary: str, rejections: dict[str, Sequence[str]], hint: str = ""):
        self.rejections = {k: list(v) for k, v in rejections.items()}
        lines = [summary]
        for name, reasons in self.rejections.items():
            lines.append(f"  - {name}: " + ("; ".join(reasons) if reasons else "(no reason given)"))
        if hint:
            lines.append(f"Hint: {hint}")
        super().__init__("\n".join(lines))


def check_choice(param: str, value: Any, enum_cls, hint: str = ""):
    """Coerce ``value`` into ``enum_cls`` (a str Enum of lower-case values) or raise a
    ConfigError listing the choices. Names are case-insensitive ('FP8_BLOCK', 'SiLU'), as
    platform and model names are, so one spelling rule holds for every name a user types."""
    if isinstance(value, enum_cls):
        return value
    accepted = [m.value for m in enum_cls]
    hint = hint or f"pass one of the accepted {enum_cls.__name__} values"
    if not isinstance(value, str):
        raise ConfigTypeError(param, value, f"str, one of: {_fmt_accepted(accepted)}", hint)
    try:
        return enum_cls(value.strip().lower())
    except ValueError:
        raise ConfigError(param, value, accepted, hint) from None


def check_bool(param: str, value: Any, hint: str = "") -> bool:
    if not isinstance(value, bool):
        raise ConfigTypeError(param, value, "bool (True or False)", hint)
    return value


def check_float(param: str, value: Any, *, positive: bool = True, hint: str = "") -> float:
    """A finite real number (> 0 when ``positive``) -> float; bool is not a number here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigTypeError(param, value, "a float" + (" > 0" if positive else ""), hint)
    if value != value or value in (float("inf"), float("-inf")) or (positive and not value > 0):
        raise ConfigError(param, value, "a finite float" + (" > 0" if positive else ""), hint,
                          problem="is not finite" if not abs(value) < float("inf") else "is not > 0")
    return float(value)


def check_int(param: str, value: Any, *, min_value: int | None = None, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(param, value, "int", hint)
    if min_value is not None and value < min_value:
        raise ConfigError(param, value, f"an integer >= {min_value}", hint, problem="is too small")
    return value
