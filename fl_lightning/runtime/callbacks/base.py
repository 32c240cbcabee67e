"""`Callback`: a concern of a run that observes it (pfl-research's `TrainingProcessCallback`,
Lightning's `Callback`), owning its own state. Callbacks never change the plan or the state:
what the numbers depend on is in `runner.run_rounds`. The loop calls each hook on every
callback in list order.

Per round, in this order:

    on_round_start(plan)                the round's plan, before any client trains
    on_updates(record, updates)         the updates, sorted by client id, before aggregation
                                        (their params already in the running sum, as meta
                                        tensors, where the driver sums them on arrival)
    on_round_end(state, record)         the round's own work is done and it is checkpointed
    on_line(record)                     the round's line is complete (at once, or after the
                                        next round's fit when its evaluation overlapped it)

Once per run: `on_run_start(ctx)` before the first round (then a resume's unwritten line goes
to `on_line`), `on_exception(error)` when the run stops on an error (Ctrl-C included),
`on_run_end(status, summary)` on the way out, always.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.messages import ClientUpdate, RoundPlan, ServerState
from ..executor import Executor
from ..record import RoundRecord
from ..steps.clock import WallClock  # (its home is the loop's steps; here too for callbacks)

__all__ = ["Callback", "CallbackList", "RunContext", "WallClock"]


@dataclass
class RunContext:
    """What callbacks get at the start of a run."""

    executor: Executor
    clock: WallClock
    #: what every checkpoint carries besides the state (the W&B run id, for a resume)
    meta: dict[str, Any] = field(default_factory=dict)


class Callback:
    """Every hook does nothing; override the ones a concern needs."""

    def on_run_start(self, ctx: RunContext) -> None:
        pass

    def on_round_start(self, plan: RoundPlan) -> None:
        pass

    def on_updates(self, record: RoundRecord, updates: Sequence[ClientUpdate]) -> None:
        pass

    def on_round_end(self, state: ServerState, record: RoundRecord) -> None:
        pass

    def on_line(self, record: RoundRecord) -> None:
        pass

    def on_exception(self, error: BaseException) -> None:
        pass

    def on_run_end(self, status: str, summary: dict[str, Any]) -> None:
        pass


class CallbackList(Callback):
    """Callbacks called one after another, in list order (a `Callback` itself)."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)

    def on_run_start(self, ctx: RunContext) -> None:
        for cb in self.callbacks:
            cb.on_run_start(ctx)

    def on_round_start(self, plan: RoundPlan) -> None:
        for cb in self.callbacks:
            cb.on_round_start(plan)

    def on_updates(self, record: RoundRecord, updates: Sequence[ClientUpdate]) -> None:
        for cb in self.callbacks:
            cb.on_updates(record, updates)

    def on_round_end(self, state: ServerState, record: RoundRecord) -> None:
        for cb in self.callbacks:
            cb.on_round_end(state, record)

    def on_line(self, record: RoundRecord) -> None:
        for cb in self.callbacks:
            cb.on_line(record)

    def on_exception(self, error: BaseException) -> None:
        for cb in self.callbacks:
            cb.on_exception(error)

    def on_run_end(self, status: str, summary: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_run_end(status, summary)
