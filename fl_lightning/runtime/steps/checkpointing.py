"""`Checkpointer`: every `checkpoint.every` rounds and at the last, the server state and the
resident state of the clients that trained since the previous checkpoint (`checkpoint.py`),
so a run resumed from it repeats exactly what the uninterrupted run would have done."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...core.messages import ClientUpdate, ServerState
from ...core.types import ClientId, ClientState
from .. import checkpoint, signals
from ..executor import Executor
from ..record import RoundRecord

#: the checkpoint meta's keys for its round's line (below)
LINE, EVALUATING = "line", "evaluating"


def unwritten_line(meta: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """A checkpoint's line and whether its global evaluation had not ended (`pending_line`:
    the format before both were kept)."""
    if "pending_line" in meta:
        return meta["pending_line"], True
    return meta.get(LINE), bool(meta.get(EVALUATING, False))


class Checkpointer:
    """`run_rounds` calls `round_end` at the end of every round, before the round's line is
    written. A checkpoint carries that line as it is known then (`meta["line"]`), and whether
    its global evaluation was still running (`meta["evaluating"]`, `eval.overlap`): a resume
    that finds the line missing from metrics.jsonl writes it, evaluating the state again if
    needed. The line goes to metrics.jsonl and W&B only after its round is checkpointed, so a
    run killed in between writes it and logs it to W&B once.

    Writes under held signals: a Ctrl-C or SIGTERM mid-write raises after it, so the run ends
    `interrupted` (resumable), never crashed with a torn file."""

    def __init__(
        self,
        run_dir: Path,
        every: int,
        last_round: int,
        client_index: dict[ClientId, int],
    ) -> None:
        self.run_dir, self.every, self.last_round = run_dir, every, last_round
        #: client id -> round of its newest state file in the last committed checkpoint
        self.client_index = client_index
        #: clients that trained since the last checkpoint (their resident state changed)
        self.changed: set[ClientId] = set()
        #: states taken when their clients' updates arrived, not yet written (asynchronous runs)
        self.held: dict[ClientId, ClientState] = {}
        self.meta: dict[str, Any] = {}  # what every checkpoint carries (the W&B run id)
        self.executor: Executor | None = None

    def saved_states(self, client_ids: Sequence[ClientId]) -> Iterator[tuple[ClientId, ClientState]]:
        """The clients' states of the last committed checkpoint, read one at a time (what a
        restarted Ray actor gets back)."""
        for c in client_ids:
            if c in self.client_index:
                yield c, checkpoint.load_client_state(self.run_dir, c, self.client_index[c])

    def restore(self, executor: Executor, meta: dict[str, Any]) -> None:
        """Before the first round: the executor the states are collected from, what every
        checkpoint carries (`meta`), and on resume the clients' states back to their hosts."""
        self.executor, self.meta = executor, meta
        if self.client_index:
            executor.restore_states(self.saved_states(sorted(self.client_index)))

    def round_end(
        self,
        state: ServerState,
        updates: Sequence[ClientUpdate],
        record: RoundRecord,
        evaluating: bool,
        trained: Sequence[ClientId] | None = None,
        states: Sequence[tuple[ClientId, ClientState]] | None = None,
    ) -> None:
        """Round `state.round` ended: checkpoint it if due, with its line as known now.
        `trained`: the clients whose fits ended this round, where more than `updates` (a
        deadline's late ones); `states`: their states as taken when their updates arrived (an
        asynchronous run, whose clients may be in flight again by now), written in place of
        collecting them."""
        if states is not None:
            self.held.update(states)
        else:
            self.changed.update(u.client_id for u in updates)
            self.changed.update(trained or ())
        if state.round % self.every == 0 or state.round == self.last_round:
            self.save(state, {**self.meta, LINE: record.line(), EVALUATING: evaluating})

    def save(self, state: ServerState, meta: dict[str, Any]) -> None:
        assert self.executor is not None
        with signals.held():
            if self.changed:
                written = checkpoint.save_client_states(
                    self.run_dir, state.round, self.executor.collect_states(sorted(self.changed))
                )
                self.client_index.update(written)
                self.changed.clear()
            if self.held:
                held = sorted(self.held.items())
                self.client_index.update(checkpoint.save_client_states(self.run_dir, state.round, held))
                self.held.clear()
            checkpoint.save(self.run_dir, state, meta, self.client_index)
