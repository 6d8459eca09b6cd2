"""A snapshot of the hardware fusedmoe runs on; the only place that probes it.

``Platform.current()`` probes once (cached). ``Platform.preset('h100')`` builds one by
hand so that ``fusedmoe explain --platform h100`` answers "what would run there" on any
machine.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .errors import ConfigError, ConfigTypeError

__all__ = ["Platform", "PRESETS"]


@dataclass(frozen=True)
class Platform:
    kind: str                                  # "cpu" or "cuda"
    name: str                                  # e.g. "NVIDIA H100 80GB HBM3"
    capability: Optional[tuple] = None         # (major, minor) for CUDA
    memory_gb: float = 0.0
    num_sms: int = 0
    triton: bool = False                       # Triton importable and usable here
    interpreter: bool = False                  # TRITON_INTERPRET=1 (Triton kernels run on the CPU)

    @property
    def sm(self) -> int:
        """Compute capability as an int (90 for sm_90); 0 on CPU."""
        return self.capability[0] * 10 + self.capability[1] if self.capability else 0

    @property
    def family(self) -> str:
        """'cpu', 'ampere' (sm80/86), 'ada' (sm89), 'hopper' (sm90), 'blackwell' (sm100+)."""
        if self.kind != "cuda":
            return "cpu"
        sm = self.sm
        if sm >= 100:
            return "blackwell"
        if sm >= 90:
            return "hopper"
        if sm >= 89:
            return "ada"
        return "ampere"

    @property
    def has_fp8(self) -> bool:
        """fp8 e4m3 tensor cores (sm89+)."""
        return self.kind == "cuda" and self.sm >= 89

    @property
    def has_fp4(self) -> bool:
        """Native fp4 tensor cores (sm100+)."""
        return self.kind == "cuda" and self.sm >= 100

    @property
    def device_name(self) -> str:
        """Device name as used in tuned-config file names (spaces -> '_'; H200 family -> NVIDIA_H200)."""
        n = self.name.replace(" ", "_")
        if "H200" in n:
            return "NVIDIA_H200"
        return n

    @property
    def torch_device(self) -> str:
        return "cuda" if self.kind == "cuda" else "cpu"

    @classmethod
    def preset(cls, name: str) -> "Platform":
        if not isinstance(name, str):
            raise ConfigTypeError("platform", name, f"str, one of: {', '.join(sorted(PRESETS))}",
                                  "pass a preset name, 'current', or a Platform")
        try:
            return PRESETS[name.strip().lower()]
        except KeyError:
            raise ConfigError("platform", name, sorted(PRESETS), "use 'current' for this machine") from None

    @classmethod
    def current(cls) -> "Platform":
        return _probe()

    @classmethod
    def resolve(cls, spec) -> "Platform":
        """None/'current' -> probe; a preset name; or a Platform."""
        if spec is None or (isinstance(spec, str) and spec.strip().lower() == "current"):
            return cls.current()
        if isinstance(spec, Platform):
            return spec
        return cls.preset(spec)


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.lru_cache(maxsize=1)
def _probe() -> Platform:
    interp = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return Platform("cuda", p.name, (p.major, p.minor), round(p.total_memory / 2**30, 1),
                        p.multi_processor_count, _triton_importable(), interp)
    return Platform("cpu", "cpu", None, 0.0, os.cpu_count() or 1, _triton_importable() and interp, interp)


PRESETS = {
    "cpu": Platform("cpu", "cpu", None, 0.0, 0, False, False),
    "a100": Platform("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80.0, 108, True, False),
    "h100": Platform("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 79.6, 132, True, False),
    "h200": Platform("cuda", "NVIDIA H200", (9, 0), 140.4, 132, True, False),
    "b200": Platform("cuda", "NVIDIA B200", (10, 0), 179.0, 148, True, False),
}
