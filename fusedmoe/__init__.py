"""fusedmoe: a fast, explainable fused Mixture-of-Experts layer for PyTorch."""
__version__ = "0.1.0"

from .config import (Activation, ExpertPlacement, GateUpLayout, MoEConfig, ParallelConfig,  # noqa: F401
                     QuantMethod, QuantScheme, Routing, ScoringFunc)
from .errors import ConfigError, FusedMoEError, InputError, NoBackendError  # noqa: F401
from .platform import Platform  # noqa: F401
from .weights import ExpertWeights  # noqa: F401
