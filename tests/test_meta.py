"""Meta-tests: every kernel has a reference, a test and a benchmark entry; every backend is tested.

These fail when someone adds a kernel module or a backend without the rest (STYLE.md rule 5).
"""
import importlib.util
import pathlib
import sys

from fusedmoe.backends.registry import BUILTIN_MODULES
from fusedmoe.config import Activation

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bench_kernels():
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks" / "bench_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_kernels"] = mod          # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_every_kernel_module_has_reference_test_and_benchmark_entry():
    # launcher.py holds no kernel (the launch path of the others); common.py only the @triton.jit
    # helpers the kernels share, tested and timed through them
    not_kernels = ("__init__", "launcher", "common")
    kernels = {p.stem for p in (ROOT / "fusedmoe" / "kernels").glob("*.py") if p.stem not in not_kernels}
    entries = _bench_kernels().KERNELS
    assert kernels == set(entries), f"kernel modules without a benchmark entry: {kernels - set(entries)}; " \
                                    f"entries without a module: {set(entries) - kernels}"
    for name, e in entries.items():
        assert (ROOT / e.reference.split(" ")[0]).is_file(), (name, e.reference)
        assert (ROOT / e.test).is_file(), (name, e.test)


def test_every_builtin_backend_is_exercised_by_the_backend_tests():
    text = (ROOT / "tests" / "test_backends.py").read_text() + (ROOT / "tests" / "conftest.py").read_text()
    for name in BUILTIN_MODULES:
        assert f'"{name}"' in text or "registered()" in text, name


def test_every_activation_has_a_kernel_epilogue():
    from fusedmoe.kernels.grouped_gemm import ACTIVATIONS
    assert {a.value for a in Activation} == set(ACTIVATIONS)


def test_kernels_take_every_choice_as_an_argument():
    # fusedmoe/kernels/ is the layer below the package: its modules read no environment variable,
    # probe no device (fusedmoe/platform.py does; the plan passes the facts in) and import nothing
    # from the package above them (relative imports stay within kernels/)
    banned = ("os.environ", "from .. import env", "get_device_name", "get_device_capability", "from ..")
    found = []
    for path in sorted((ROOT / "fusedmoe" / "kernels").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(b in line for b in banned):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_modular_imports_neither_kernels_nor_reference():
    # the framework is above the kernels and the reference in name only: it knows neither (the
    # experts bring their quantizer, the layer brings the launch-state pin)
    import re
    for p in (ROOT / "fusedmoe" / "modular").glob("*.py"):
        text = p.read_text()
        assert not re.search(r"from \.\.(kernels|reference)|import fusedmoe\.(kernels|reference)", text), p.name
