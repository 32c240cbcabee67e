"""The callbacks that observe a run (`base.py` for their hooks): metrics.jsonl and
summary.json, W&B and the progress bar (`metrics.py`). They never change the plan or the state.

The loop's own steps (evaluation, checkpoints, divergence checks, batch-norm statistics) are
`runtime/steps/`; their names are importable from here too, as they were before the split."""

from ..steps import (
    Checkpointer,
    ClientEval,
    GlobalEval,
    Line,
    WallClock,
    finite_losses,
    finite_weights,
    recompute_bn_stats,
)
from .base import Callback, CallbackList, RunContext
from .metrics import Loggers, MetricsWriter

__all__ = [
    "Callback", "CallbackList", "Checkpointer", "ClientEval", "GlobalEval", "Line", "Loggers",
    "MetricsWriter", "RunContext", "WallClock", "finite_losses", "finite_weights", "recompute_bn_stats",
]  # fmt: skip
