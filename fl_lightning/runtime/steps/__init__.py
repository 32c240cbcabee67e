"""The round loop's steps beside the strategy's hooks, each called where `runner.run_rounds`
names it: the global and the clients' evaluation (`evaluation.py`), checkpoints
(`checkpointing.py`), the divergence checks (`guards.py`), batch-norm statistics pooled anew
(`bn.py`) and the run's wall clock (`clock.py`). What they do changes the run's numbers or
files; the callbacks (`runtime/callbacks/`) only observe."""

from .bn import recompute_bn_stats
from .checkpointing import Checkpointer, unwritten_line
from .clock import WallClock
from .evaluation import ClientEval, GlobalEval, Line, driver_device
from .guards import finite_losses, finite_weights

__all__ = [
    "Checkpointer", "ClientEval", "GlobalEval", "Line", "WallClock", "driver_device", "finite_losses",
    "finite_weights", "recompute_bn_stats", "unwritten_line",
]  # fmt: skip
