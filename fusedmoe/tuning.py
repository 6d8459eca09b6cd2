"""The public names of the launch-config lookup and the tuner under one module.

The lookup the backends use at construction is ``fusedmoe.tuned_configs``; the tuner behind
``fusedmoe tune`` is ``fusedmoe.tuner``; code in this package imports those two. This module
stays because ``fusedmoe.tuning.LaunchConfigs`` / ``fusedmoe.tuning.override`` are the names
``fusedmoe/kernels/configs/README.md`` documents and user scripts call. Private helpers are not
re-exported: patch them where they live.
"""
from .tuned_configs import (GEMM_KEYS, MAX_KEY_RATIO, SIBLING_DEVICES, VERSIONS_KEY,  # noqa: F401
                            LaunchConfigs, builtin_default, config_file_name, config_tag,
                            normalize_launch_config, override, package_config_dir, search_dirs)
from .tuner import (DEFAULT_TUNE_TOKENS, SMEM_LIMIT, STAGES, PointResult, candidate_configs,  # noqa: F401
                    search_point, tune, write_config_file)

__all__ = [
    "GEMM_KEYS", "LaunchConfigs", "config_file_name", "config_tag", "search_dirs", "package_config_dir",
    "override", "normalize_launch_config", "candidate_configs", "search_point", "write_config_file", "tune",
    "DEFAULT_TUNE_TOKENS", "PointResult",
]
