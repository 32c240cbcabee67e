"""The concerns of a run beside the algorithm, one callback each (see `base.py` for the hooks
and `runner.default_callbacks` for their order)."""

from .base import Callback, CallbackList, RunContext, WallClock
from .bn import BNStatistics
from .checkpointing import Checkpointer
from .evaluation import ClientEval, GlobalEval
from .guards import DivergenceGuard
from .metrics import Loggers, MetricsWriter

__all__ = [
    "BNStatistics", "Callback", "CallbackList", "Checkpointer", "ClientEval", "DivergenceGuard",
    "GlobalEval", "Loggers", "MetricsWriter", "RunContext", "WallClock",
]  # fmt: skip
