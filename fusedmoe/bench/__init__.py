"""Benchmarks: fusedmoe's backends and the implementations users would pick instead, timed
side by side against the device's measured roofline (``fusedmoe bench``).

- ``harness``: the run (``BenchSpec``, ``run_bench``); the names of the modules below are
  importable from it too.
- ``roofline``: FLOPs, bytes, the roofline, the measured ceilings.
- ``inputs``: routing, rotating input sets, random quantized weights.
- ``check``: an implementation's output against ``reference_moe``.
- ``timing``: CUDA-graph replay and eager timing.
- ``report``: measurements, the JSON report, speedups, the summary and the text table.
- ``progress``: the progress bar of ``fusedmoe bench`` and ``fusedmoe tune``.
- ``peers``: the per-expert PyTorch loop, PyTorch's grouped GEMM pipeline, Hugging Face
  transformers' experts implementations, and vLLM's and SGLang's fused-MoE kernels when installed.
- ``plot``: the PNG (matplotlib optional).
"""
from .harness import BenchReport, BenchSpec, Measurement, run_bench  # noqa: F401
