"""`Checkpointer`: every `checkpoint.every` rounds and at the last, the server state and the
resident state of the clients that trained since the previous checkpoint (`checkpoint.py`),
so a run resumed from it repeats exactly what the uninterrupted run would have done."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...core.messages import ClientUpdate, ServerState
from ...core.types import ClientId, ClientState
from .. import checkpoint, signals
from ..executor import Executor
from ..record import RoundRecord
from .base import Callback, RunContext


class Checkpointer(Callback):
    """Writes under held signals: a Ctrl-C or SIGTERM mid-write raises after it, so the run
    ends `interrupted` (resumable), never crashed with a torn file.

    A round's line is written before its checkpoint and logged to W&B after it (the order of
    the callbacks): a run killed in between repeats the round and logs it once. A round whose
    line waits for its overlapped evaluation is checkpointed at once, carrying the line
    without the evaluation (`pending_line` in the checkpoint's meta); a resume that finds that
    line missing from metrics.jsonl (`unwritten`) evaluates the same state again and writes it.
    """

    def __init__(
        self,
        run_dir: Path,
        every: int,
        last_round: int,
        state: ServerState,
        client_index: dict[ClientId, int],
        unwritten: dict[str, Any] | None = None,
        evaluate: Callable[[ServerState], dict[str, float]] = lambda state: {},
    ) -> None:
        self.run_dir, self.every, self.last_round = run_dir, every, last_round
        self.state = state  # the newest server state
        #: client id -> round of its newest state file in the last committed checkpoint
        self.client_index = client_index
        #: clients that trained since the last checkpoint (their resident state changed)
        self.changed: set[ClientId] = set()
        self.unwritten, self.evaluate = unwritten, evaluate
        self.due: RoundRecord | None = None  # a round to checkpoint once its line is written
        self.executor: Executor | None = None
        self.meta: dict[str, Any] = {}

    def saved_states(self, client_ids: Sequence[ClientId]) -> Iterator[tuple[ClientId, ClientState]]:
        """The clients' states of the last committed checkpoint, read one at a time (what a
        restarted Ray actor gets back)."""
        for c in client_ids:
            if c in self.client_index:
                yield c, checkpoint.load_client_state(self.run_dir, c, self.client_index[c])

    def on_run_start(self, ctx: RunContext) -> None:
        self.executor, self.meta = ctx.executor, ctx.meta
        if self.client_index:  # resume: the clients' state goes back to their hosts
            ctx.executor.restore_states(self.saved_states(sorted(self.client_index)))
        if self.unwritten is not None:  # killed after the checkpoint, before its evaluation ended
            record = RoundRecord.from_line({"round": self.state.round, **self.unwritten})
            record.evaluation = self.evaluate(self.state)
            ctx.write_line(record)

    def on_updates(self, record: RoundRecord, updates: Sequence[ClientUpdate]) -> None:
        self.changed.update(u.client_id for u in updates)

    def on_round_end(self, state: ServerState, record: RoundRecord) -> None:
        self.state = state
        if not (record.round % self.every == 0 or record.round == self.last_round):
            return
        if record.awaiting_evaluation:  # before the line: the checkpoint carries it
            self.save(state, {**self.meta, "pending_line": record.line()})
        else:
            self.due = record

    def on_line(self, record: RoundRecord) -> None:
        if record is self.due:
            self.due = None
            self.save(self.state, self.meta)

    def save(self, state: ServerState, meta: dict[str, Any]) -> None:
        assert self.executor is not None
        with signals.held():
            if self.changed:
                written = checkpoint.save_client_states(
                    self.run_dir, state.round, self.executor.collect_states(sorted(self.changed))
                )
                self.client_index.update(written)
                self.changed.clear()
            checkpoint.save(self.run_dir, state, meta, self.client_index)
