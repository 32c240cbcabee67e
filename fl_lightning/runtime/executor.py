"""Executors decide *where* clients run; strategies never see them (fedjax's
ForEachClientBackend, Flower's Grid). `fit` runs a round's cohort and yields results in
completion order; the scheduler sorts them by client id before aggregating, so sums are
order-independent. `submit` starts one client's fit from a given broadcast (the model version
it starts from) and returns a handle; `take` waits for that handle's update. The scheduler
(`scheduler.py`) decides which handle to take next (virtual arrival time, ties by client id),
never which worker answers first, so results do not depend on the executor.

Clients' resident state lives in the hosts; `collect_states` streams it out (one client
at a time, so the driver never holds all of it) for checkpoints, `restore_states` puts
it back on resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from ..core.bn_stats import BNStats
from ..core.messages import Broadcast, ClientEval, ClientPayload, ClientUpdate, RoundPlan
from ..core.types import ClientId, ClientState
from .host import ClientHost


class Executor(Protocol):
    #: one line per client dropped after its retry, per round: "round r: client c failed: cause"
    failures: list[str]
    #: one line per client retried (whether or not the retry succeeded)
    retries: list[str]

    def fit(self, plan: RoundPlan) -> Iterator[ClientUpdate]: ...

    def submit(self, broadcast: Broadcast, payload: ClientPayload) -> Any:
        """Start one client's fit from `broadcast`; a handle for `take`."""
        ...

    def take(self, handle: Any) -> ClientUpdate:
        """The update of a submitted fit, once it is done (each handle is taken once)."""
        ...

    def first(self, handles: Sequence[Any]) -> int:
        """The index in `handles` of a fit that is done, waiting for the first to finish
        (`system.clock=wall`: arrivals in the order they happen)."""
        ...

    def evaluate(self, plan: RoundPlan) -> Iterator[ClientEval]: ...

    def bn_stats(self, plan: RoundPlan) -> Iterator[BNStats]: ...

    def collect_states(self, client_ids: Iterable[ClientId]) -> Iterator[tuple[ClientId, ClientState]]: ...

    def restore_states(self, states: Iterable[tuple[ClientId, ClientState]]) -> None: ...

    def close(self, reuse: bool = False) -> None:
        """Free the clients' workers (`reuse`: a finished run's may stay warm for the next)."""
        ...


class SerialExecutor:
    """All clients in the driver process, one after another. For debugging and tests.
    (Client state is then in the driver's memory: that is what this executor is.)"""

    def __init__(self, host: ClientHost) -> None:
        self.host = host
        self.failures: list[str] = []
        self.retries: list[str] = []

    def fit(self, plan: RoundPlan) -> Iterator[ClientUpdate]:
        k = self.host.spec.batched  # runtime.batched: k clients at a time, stacked
        if k:
            for i in range(0, len(plan.payloads), k):
                yield from self.host.fit_many(plan.broadcast, plan.payloads[i : i + k])
            return
        for payload in plan.payloads:
            yield self.host.fit(plan.broadcast, payload)

    def submit(self, broadcast: Broadcast, payload: ClientPayload) -> Any:
        # at once: a client is in flight at most once, so each client's fits run in the order
        # they were submitted here as on Ray (its resident state sees the same sequence)
        return self.host.fit(broadcast, payload)

    def take(self, handle: Any) -> ClientUpdate:
        update: ClientUpdate = handle
        return update

    def first(self, handles: Sequence[Any]) -> int:
        # each fit ran when it was submitted: the first submitted is the first done (no order
        # to measure: `system.clock=wall` is refused on this executor)
        return 0

    def evaluate(self, plan: RoundPlan) -> Iterator[ClientEval]:
        for payload in plan.payloads:
            yield self.host.evaluate(plan.broadcast, payload)

    def bn_stats(self, plan: RoundPlan) -> Iterator[BNStats]:
        for payload in plan.payloads:
            yield self.host.bn_stats(plan.broadcast, payload)

    def collect_states(self, client_ids: Iterable[ClientId]) -> Iterator[tuple[ClientId, ClientState]]:
        for c in client_ids:
            yield from self.host.get_states([c]).items()

    def restore_states(self, states: Iterable[tuple[ClientId, ClientState]]) -> None:
        for c, st in states:
            self.host.set_states({c: st})

    def close(self, reuse: bool = False) -> None:
        pass
