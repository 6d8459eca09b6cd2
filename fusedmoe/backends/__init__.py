"""Backends: one module each, registering one BackendSpec (see registry.py)."""
from .registry import BackendSpec, Reason, get_spec, register, registered, unregister  # noqa: F401
