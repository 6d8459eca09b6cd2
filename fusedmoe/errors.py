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


class ConfigError(FusedMoEError, ValueError):
    """A parameter has a value fusedmoe does not accept.

    The message always reads: ``<param>=<value!r> <problem>; accepted: <...>. Fix: <hint>``.
    """

    def __init__(self, param: str, value: Any, accepted: Any, hint: str = "", problem: str = "is not valid"):
        self.param, self.value, self.accepted, self.hint = param, value, accepted, hint
        msg = f"{param}={value!r} {problem}; accepted: {_fmt_accepted(accepted)}."
        if hint:
            msg += f" Fix: {hint}"
        super().__init__(msg)


class InputError(ConfigError):
    """A tensor argument has the wrong shape, dtype, device or range."""


class ConfigTypeError(FusedMoEError, TypeError):
    """A parameter has the wrong Python type."""

    def __init__(self, param: str, value: Any, expected: str, hint: str = ""):
        self.param, self.value = param, value
        msg = f"{param}={value!r} has type {type(value).__name__}; expected {expected}."
        if hint:
            msg += f" Fix: {hint}"
        super().__init__(msg)


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
    """Coerce ``value`` into ``enum_cls`` (a str Enum) or raise a ConfigError listing the choices."""
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        raise ConfigError(param, value, [m.value for m in enum_cls],
                          hint or f"pass one of the accepted {enum_cls.__name__} values") from None


def check_int(param: str, value: Any, *, min_value: int | None = None, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(param, value, "int", hint)
    if min_value is not None and value < min_value:
        raise ConfigError(param, value, f"an integer >= {min_value}", hint, problem="is too small")
    return value
