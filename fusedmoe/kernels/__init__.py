"""Triton kernels and their thin launchers.

Each module holds ``@triton.jit`` code plus a launcher that allocates nothing it is not
told to and validates nothing: shape/dtype/device checks, allocation policy and launch
config lookup live in the callers. Every kernel has a plain-torch reference in
``fusedmoe.reference`` and a test that compares the two (on CPU under TRITON_INTERPRET=1).

Modules are imported on demand (``from fusedmoe.kernels import routing``) so that
importing fusedmoe never requires Triton.
"""
