"""Correctness first: an implementation's output on fresh random inputs (not the timing sets)
vs ``reference_moe``, as the relative Frobenius error against ``fusedmoe.tolerances``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..config import MoEConfig
from .inputs import InputSet, make_input_sets

__all__ = ["CheckResult", "CheckCase", "make_check_case", "check_against", "check_impl"]


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    rel_err: Optional[float]
    tol: float
    message: str = ""


@dataclass
class CheckCase:
    inputs: InputSet
    ref: torch.Tensor
    tol: float
    # for implementations that keep W8A8 activations 16-bit on some calls (fusedmoe's triton
    # decode path): the reference without activation quantization, built on first use
    config: Optional[MoEConfig] = None
    weights: object = None
    _ref16: Optional[torch.Tensor] = None
    _ref_group: dict = field(default_factory=dict)

    def for_impl(self, fn) -> tuple[torch.Tensor, float]:
        """(reference, tolerance) matching the math ``fn`` does on these inputs."""
        qa = getattr(fn, "quantizes_activations", None)
        hg = getattr(fn, "h_group", None)
        g = hg(self.inputs.x.shape[0]) if hg is not None and self.config is not None else None
        if g is not None:            # h quantized in 1 x g groups (triton's fp8_channel epilogue)
            ref = self._ref_group.get(g)
            if ref is None:
                from ..reference.moe import reference_moe  # noqa: PLC0415
                s = self.inputs
                ref = self._ref_group[g] = reference_moe(s.x, self.weights, s.topk_weights, s.topk_ids,
                                                         self.config, h_group=g)
            return ref, self.tol
        if qa is None or self.config is None or not self.weights.scheme.method.quantizes_activations \
                or qa(self.inputs.x.shape[0]):
            return self.ref, self.tol
        if self._ref16 is None:
            from ..reference.moe import reference_moe  # noqa: PLC0415
            s = self.inputs
            self._ref16 = reference_moe(s.x, self.weights, s.topk_weights, s.topk_ids, self.config,
                                        quantize_activations=False)
        from ..tolerances import tolerance  # noqa: PLC0415
        return self._ref16, tolerance(self.config.dtype, "none")


def make_check_case(config: MoEConfig, weights, T: int, device, *, seed: int = 1, skew=None) -> CheckCase:
    """Fresh random inputs (not the timing sets) and the reference output on them."""
    from ..reference.moe import reference_moe  # noqa: PLC0415
    from ..tolerances import tolerance  # noqa: PLC0415
    s = make_input_sets(config, T, device, seed=10_000_019 + seed, skew=skew, min_sets=1, max_sets=1).sets[0]
    ref = reference_moe(s.x, weights, s.topk_weights, s.topk_ids, config)
    return CheckCase(s, ref, tolerance(config.dtype, weights.scheme.method), config, weights)


def check_against(fn: Callable, case: CheckCase, *, ids64: bool = False) -> CheckResult:
    from ..tolerances import rel_error  # noqa: PLC0415
    ref, tol = case.for_impl(fn)
    case = CheckCase(case.inputs, ref, tol)
    try:
        out = fn(*case.inputs.args(ids64))
    except Exception as e:  # a crash is a result too: report it
        first = str(e).splitlines()[0][:200] if str(e) else ""
        return CheckResult(False, None, case.tol, f"raised {type(e).__name__}: {first}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(case.ref.shape):
        return CheckResult(False, None, case.tol, f"output shape {getattr(out, 'shape', None)} != {tuple(case.ref.shape)}")
    if not torch.isfinite(out).all():
        return CheckResult(False, None, case.tol, "output has NaN/Inf")
    err = rel_error(out, case.ref)
    if not err <= case.tol:
        return CheckResult(False, err, case.tol, f"rel err {err:.3g} > tol {case.tol:g}")
    return CheckResult(True, err, case.tol)


def check_impl(fn: Callable, config: MoEConfig, weights, T: int, device, *, seed: int = 1, skew=None) -> CheckResult:
    return check_against(fn, make_check_case(config, weights, T, device, seed=seed, skew=skew))
