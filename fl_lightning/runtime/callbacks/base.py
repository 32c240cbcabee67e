"""`Callback`: a concern of a run beside the algorithm (pfl-research's `TrainingProcessCallback`,
Lightning's `Callback`), owning its own state. The round loop (`runner.run_rounds`) calls
each hook on every callback in list order; the order is part of the protocol (see
`runner.default_callbacks`).

Per round, in this order:

    on_round_start(plan) -> plan        the round's plan, before any client trains
    on_fit_end(rnd)                     the clients trained (the previous round's overlapped
                                        evaluation is waited for here)
    on_updates(record, updates)         the updates, sorted by client id, before aggregation
    on_server_state(state, ...) -> state   the new server state (its round set), before evaluation
    on_evaluate(state, updates, record) evaluation: fill `record`
    on_round_end(state, record)         the round's own work is done
    on_line(record)                     the round's line is complete (at once, or when its
                                        overlapped evaluation ends): write it, checkpoint, log

Once per run: `on_run_start(ctx)` before the first round, `on_exception(error)` when the run
stops on an error (Ctrl-C included), `on_run_end(status, summary)` on the way out, always.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.messages import ClientUpdate, RoundPlan, ServerState
from ..executor import Executor
from ..record import RoundRecord


class WallClock:
    """A run's wall time: what earlier processes ran (`offset`, from its last line) plus the
    time since this process began its rounds (`start`)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.started = time.perf_counter()

    def start(self) -> float:
        self.started = time.perf_counter()
        return self.started

    def wall(self, t: float) -> float:
        """The run's wall time at `time.perf_counter()` value `t`."""
        return self.offset + t - self.started


@dataclass
class RunContext:
    """What callbacks get at the start of a run."""

    executor: Executor
    clock: WallClock
    #: hands a complete record to every callback's `on_line` (for a line that completes
    #: outside the loop: an overlapped evaluation, a resume's unwritten line)
    write_line: Callable[[RoundRecord], None]
    #: what every checkpoint carries besides the state (the W&B run id, for a resume)
    meta: dict[str, Any] = field(default_factory=dict)


class Callback:
    """Every hook does nothing; override the ones a concern needs."""

    def on_run_start(self, ctx: RunContext) -> None:
        pass

    def on_round_start(self, plan: RoundPlan) -> RoundPlan:
        return plan

    def on_fit_end(self, rnd: int) -> None:
        pass

    def on_updates(self, record: RoundRecord, updates: Sequence[ClientUpdate]) -> None:
        pass

    def on_server_state(
        self, state: ServerState, plan: RoundPlan, updates: Sequence[ClientUpdate], record: RoundRecord
    ) -> ServerState:
        return state

    def on_evaluate(self, state: ServerState, updates: Sequence[ClientUpdate], record: RoundRecord) -> None:
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

    def on_round_start(self, plan: RoundPlan) -> RoundPlan:
        for cb in self.callbacks:
            plan = cb.on_round_start(plan)
        return plan

    def on_fit_end(self, rnd: int) -> None:
        for cb in self.callbacks:
            cb.on_fit_end(rnd)

    def on_updates(self, record: RoundRecord, updates: Sequence[ClientUpdate]) -> None:
        for cb in self.callbacks:
            cb.on_updates(record, updates)

    def on_server_state(
        self, state: ServerState, plan: RoundPlan, updates: Sequence[ClientUpdate], record: RoundRecord
    ) -> ServerState:
        for cb in self.callbacks:
            state = cb.on_server_state(state, plan, updates, record)
        return state

    def on_evaluate(self, state: ServerState, updates: Sequence[ClientUpdate], record: RoundRecord) -> None:
        for cb in self.callbacks:
            cb.on_evaluate(state, updates, record)

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
