"""The decode kernels compile for sm_90 (Hopper) on any machine: scripts/compile_check.py
runs triton.compile (front end through ptxas, no launch) in a subprocess without
TRITON_INTERPRET. The interpreter accepts code the compiler rejects (a variable re-typed
inside an ``if``), so CPU CI would not see such an error otherwise."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ptxas_available() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


@pytest.mark.skipif(not _ptxas_available(), reason="triton without its bundled ptxas")
def test_decode_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compile_check.py")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert r.stdout.count("ok ") >= 23
