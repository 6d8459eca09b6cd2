"""The modular kernel framework (see interfaces.py for the pipeline)."""
from .interfaces import *  # noqa: F401,F403
from .kernel import ModularKernel  # noqa: F401
from .prepare_finalize import LocalBatched, NoEP  # noqa: F401
