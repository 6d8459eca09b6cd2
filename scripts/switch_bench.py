"""Run the fusedmoe CLI with one module switch set first: the A/B of a module-level flag.

    python3 scripts/switch_bench.py MODULE.ATTR 0|1 bench --model ... [fusedmoe args]

e.g. ``python3 scripts/switch_bench.py fusedmoe.kernels.grouped_gemm.SCALE_PREFETCH 0 bench --tokens 4096``.
The flag is set as a bool before the CLI imports anything else, so the launches see it.
"""
import importlib
import sys

if __name__ == "__main__":
    target, value, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    module, attr = target.rsplit(".", 1)
    mod = importlib.import_module(module)
    if not hasattr(mod, attr):
        raise SystemExit(f"{module} has no attribute {attr}")
    setattr(mod, attr, bool(int(value)))
    from fusedmoe.cli.main import main
    raise SystemExit(main(args))
