"""Root pytest hook: on a machine without CUDA, Triton kernels run under the interpreter.

This must happen before anything imports triton (``triton.jit`` reads TRITON_INTERPRET when
a kernel is decorated), hence a root conftest rather than a fixture.
"""
import os

try:
    import torch
    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")
