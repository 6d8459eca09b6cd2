"""The Triton kernels compile for sm_90 (Hopper) on any machine: tools/compile_check.py
runs triton.compile (front end through ptxas, no launch) in a subprocess without
TRITON_INTERPRET. The interpreter accepts code the compiler rejects (a variable re-typed
inside an ``if``), so CPU CI would not see such an error otherwise.

How long a compile takes depends on the machine and its load (the full check is ~150
kernels: minutes on a free core, and a run once passed 10 minutes on a loaded 2-core
machine), so nothing here has a time limit but a hang guard of hours. A quick run (no
RUN_SLOW, no GPU) compiles one case of each kernel family (``QUICK``); RUN_SLOW=1 (CI) or a
CUDA machine compiles every case."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a guard against a hung compiler only: the subprocesses have no time limit that a slow or
# loaded machine could reach
HANG_GUARD_S = 4 * 3600
FULL = os.environ.get("RUN_SLOW", "") not in ("", "0") or torch.cuda.is_available()
# label substrings of tools/compile_check.py's cases (it compiles those whose label contains
# one): a case of each kernel family, for the quick run
QUICK = [
    "qwen3 T=1 gemm1 map+bias",                       # decode GEMM1 (bias, expert map, swigluoai)
    "deepseek-tp8 T=3 gemm2 pdl tiles8",              # decode GEMM2, several tiles a program
    "fp8 block gemm1 pdl_wait",                       # W8A8 decode chain
    "a16 channel int8 gemm2 tiles4",                  # 8-bit weights, 16-bit activations
    "quant group R=4 K=2048 counts pow2",             # activation quantizers
    "align scan P=8 pdl",                             # the alignment
    "grouped gemm1 float8_e4m3fn one_dot persistent",  # prefill grouped GEMMs
    "resident gemm2 deepseek fp8 block 128x64",       # A-resident GEMM2
    "epilogue gemm1 fp8_block 128x128 rescale",       # h quantized in GEMM1's epilogue
    "tc qwen3 int8 gemm2 pdl l2_pre",                 # tensor-core decode
]


def _ptxas_available() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


def _compile_env() -> dict:
    """The environment of a compile subprocess: no interpreter, and no TRITON_DEFAULT_FP_FUSION
    (compile_spec passes the launches' ``enable_fp_fusion=True`` itself, as every launch does)."""
    return {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}


def _run(args: list, env: dict) -> subprocess.CompletedProcess:
    """subprocess.run with only the hang guard (a clear failure if it trips)."""
    try:
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"the compile subprocess ({os.path.basename(args[1])}) still runs after {HANG_GUARD_S // 3600} "
                    f"hours: a hung compile, not a slow machine (the whole check takes minutes). "
                    f"Last output:\n{out[-3000:]}")


@pytest.mark.skipif(not _ptxas_available(), reason="triton without its bundled ptxas")
def test_decode_kernels_compile_for_sm90():
    r = _run([sys.executable, os.path.join(ROOT, "tools", "compile_check.py"), *([] if FULL else QUICK)],
             _compile_env())
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "FAIL" not in r.stdout, r.stdout[-4000:]
    # every quick label names a case (a renamed case must be renamed here too); the full run
    # compiles them all
    assert r.stdout.count("ok ") >= (23 if FULL else len(QUICK)), r.stdout
    if not FULL:
        for label in QUICK:
            assert f"ok   {label}" in r.stdout, f"no case of tools/compile_check.py is labelled {label!r}"
    # triton 3.9 warns once where a compile leaves FP fusion to its default (which 3.10 flips)
    assert "TRITON_DEFAULT_FP_FUSION is unset" not in r.stderr, r.stderr[-2000:]


_VECTOR_LOADS = r'''
import os, re, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import torch
import compile_check as cc
from fusedmoe.kernels import decode as dk
E, H, I, k, T = 256, 7168, 256, 8, 1
ids, tw = torch.zeros(T, k, dtype=torch.int32), torch.empty(T, k)
h, out = torch.empty(T * k, I, dtype=torch.bfloat16), torch.empty(T, H, dtype=torch.bfloat16)
for dt, q in ((torch.float8_e4m3fn, dict(quant="block", block_shape=(128, 128), b_scale=torch.empty(E, H // 128, I // 128))),
              (torch.bfloat16, {})):
    for nt in (1, 4):
        spec = dk.gemm2_launch(h, torch.empty(E, H, I, dtype=dt), ids, tw, out, pdl=True, config=dict(
            dk.decode_config(8, T, H, I, torch.empty(0, dtype=dt).element_size(), 132, 128 if q else None,
                             gemm2=True), TILES=nt), **q)
        ptx = cc.compile_spec(spec).asm["ptx"]
        print(str(dt), nt, sorted(set(re.findall(r"ld\.global[.\w]*", ptx))))
'''


@pytest.mark.skipif(not _ptxas_available(), reason="triton without its bundled ptxas")
def test_decode_gemm2_loads_are_vectorized():
    # the weight and h loads of the decode GEMM2 (deepseek-v3 tp8, T=1, fp8 blocks and bf16,
    # one and four N tiles a program) are 16-byte vector loads on sm_90: a slot's K limit
    # written as tl.where(keep, K, 0) cost triton 3.9 the alignment facts, and every weight
    # byte became its own ld.global.b8 (the k_lim of _gemm2_item / _gemm2_tiles is K * keep)
    env = _compile_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = _run([sys.executable, "-c", _VECTOR_LOADS, ROOT], env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("torch.")]
    assert len(lines) == 4, r.stdout
    for ln in lines:
        assert "ld.global.v4.b32" in ln and "ld.global.b8" not in ln and "ld.global.b16" not in ln, ln


_BYTE_PROBE = r'''
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import torch, triton, triton.language as tl
import compile_check as cc


@triton.jit
def _slice(w_ptr, out_ptr, n_cols, stride, WHERE: tl.constexpr, BH: tl.constexpr, BC: tl.constexpr):
    # a [BH, BC] column slice of 8-bit rows, as a split-I decode reads w2; WHERE writes the column
    # offsets the way that once lost their contiguity
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    ok = c < n_cols
    cols = tl.where(ok, c, 0) if WHERE else c
    r = tl.arange(0, BH)
    w = tl.load(w_ptr + r[:, None] * stride + cols[None, :], mask=ok[None, :], other=0)
    tl.store(out_ptr + r, tl.sum(w.to(tl.float32), axis=1))


for where in (False, True):
    spec = (_slice, (1,), (torch.empty(256, 256, dtype=torch.int8), torch.empty(256), 256, 256),
            dict(WHERE=where, BH=256, BC=16), 4, None, False)
    print("where", where, len(cc.byte_loads(cc.compile_spec(spec).asm["ptx"])))
'''


@pytest.mark.skipif(not _ptxas_available(), reason="triton without its bundled ptxas")
def test_compile_check_catches_byte_loads(tmp_path):
    # tools/compile_check.py fails any case with 8-bit global loads (byte_loads): the check
    # finds them in a column slice whose offsets went through tl.where, and none without
    env = _compile_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    probe = tmp_path / "byte_probe.py"          # (@triton.jit needs its source in a file)
    probe.write_text(_BYTE_PROBE)
    r = _run([sys.executable, str(probe), ROOT], env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    counts = dict(ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("where"))
    assert counts["False"] == "0" and int(counts["True"]) > 0, r.stdout
