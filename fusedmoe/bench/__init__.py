"""Benchmarks: fusedmoe's backends and the implementations users would pick instead, timed
side by side against the device's measured roofline (``fusedmoe bench``).

- ``harness``: roofline arithmetic, ceilings, timing (CUDA-graph replay and eager), results,
  the text table and the summary, ``run_bench``.
- ``peers``: the per-expert PyTorch loop, PyTorch's grouped GEMM pipeline, and Hugging Face
  transformers' experts implementations.
- ``plot``: the PNG (matplotlib optional).
"""
from .harness import BenchReport, BenchSpec, Measurement, run_bench  # noqa: F401
