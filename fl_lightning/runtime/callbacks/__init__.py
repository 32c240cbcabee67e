"""What a run does beside the strategy, each where `runner.run_rounds` names it (evaluation,
checkpoints, divergence checks, batch-norm statistics), and the callbacks that observe it
(`base.py` for their hooks): metrics.jsonl and summary.json, W&B and the progress bar."""

from .base import Callback, CallbackList, RunContext, WallClock
from .bn import recompute_bn_stats
from .checkpointing import Checkpointer
from .evaluation import ClientEval, GlobalEval, Line
from .guards import finite_losses, finite_weights
from .metrics import Loggers, MetricsWriter

__all__ = [
    "Callback", "CallbackList", "Checkpointer", "ClientEval", "GlobalEval", "Line", "Loggers",
    "MetricsWriter", "RunContext", "WallClock", "finite_losses", "finite_weights", "recompute_bn_stats",
]  # fmt: skip
