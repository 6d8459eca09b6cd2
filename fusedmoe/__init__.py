"""fusedmoe: a fast, explainable fused Mixture-of-Experts layer for PyTorch."""
__version__ = "0.1.0"

from . import env as _env

try:
    _env.apply_log_level()
except Exception as _e:  # a bad FUSEDMOE_LOG_LEVEL must not make the package unimportable
    import logging as _logging
    _logging.getLogger("fusedmoe").warning("%s", _e)

from .config import (Activation, ExpertPlacement, GateUpLayout, MoEConfig, ParallelConfig,  # noqa: F401
                     QuantMethod, QuantScheme, Routing, ScoringFunc)
from .errors import ConfigError, ConfigTypeError, FusedMoEError, InputError, NoBackendError  # noqa: F401
from .platform import Platform  # noqa: F401
from .weights import ExpertWeights  # noqa: F401
from .layer import FusedMoE, PreparedExperts, fused_experts, prepare_experts  # noqa: F401,E402
from .oracle import Selection, select_backend  # noqa: F401,E402
from .quantize import (dequantize_experts, from_deepseek_fp8, from_fused_gate_up,  # noqa: F401,E402
                       from_per_expert, from_quantized_per_expert, quantize_experts)
