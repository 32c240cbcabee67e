"""The driver's one running sum: a synchronous round's updates go into the aggregation chain's
float64 sum as they arrive, in client-id order, and each update's params are dropped once added
(`core/aggregation.py::summed_away`), so a 1,000-client round holds one sum, not 1,000 models
(fedjax's `delta_params_sum`; `benchmarks/driver_memory.py --updates` measures it).

Results arrive in completion order (Ray); a small reorder buffer holds those that came early
until every smaller client id of the plan has been added, so the sum is the one `average`
computes over the sorted list, bit for bit. A client that failed never arrives: the buffer
then waits for the end of the round and adds the rest in order.

The driver keeps the list whole where something reads each update after the round's fit:
a method whose server step reads them (`reads_each_update`, or `aggregates_through_chain`
False), a chain whose last client-side act needs the whole cohort (secure aggregation's
`upload`), a scheduler that chooses updates by arrival time (a deadline, over-selection,
the asynchronous modes), a method written before `aggregate` took the round's context, and
the testing kit (`RoundSteps.sum_on_arrival`), whose golden tests read every update.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..core.aggregation import Aggregator, Summed, summed_away
from ..core.bn_stats import BNStats
from ..core.messages import Broadcast, ClientEval, ClientPayload, ClientUpdate, RoundPlan, ServerState
from ..core.strategy import ServerContext, Strategy
from ..core.types import ClientId, ClientState
from .executor import Executor
from .scheduler import Scheduler, Synchronous


def sums_on_arrival(strategy: Strategy[Any, Any, Any], scheduler: Scheduler, state: ServerState) -> bool:
    """Whether this round's updates may be summed as they arrive and dropped (module docstring)."""
    return (
        state.global_params is not None
        and strategy.aggregates_through_chain
        and not strategy.reads_each_update
        and type(strategy.aggregator).upload is Aggregator.upload
        and "ctx" in inspect.signature(type(strategy).aggregate).parameters
        and isinstance(scheduler, Synchronous)
        and scheduler.takes_every_update
    )


class SummingExecutor:
    """`executor`, its `fit` adding each update to `summed` in client-id order and yielding it
    with its params dropped; everything else is `executor`'s."""

    def __init__(self, executor: Executor, summed: Summed, ctx: ServerContext) -> None:
        self.executor, self.summed, self.ctx = executor, summed, ctx
        self.failures, self.retries = executor.failures, executor.retries

    def fit(self, plan: RoundPlan) -> Iterator[ClientUpdate]:
        expected = sorted(p.client_id for p in plan.payloads)
        early: dict[ClientId, ClientUpdate] = {}  # arrived before a smaller client id
        i = 0
        for update in self.executor.fit(plan):
            early[update.client_id] = update
            while i < len(expected) and expected[i] in early:
                yield self._add(early.pop(expected[i]))
                i += 1
        for c in sorted(early):  # after a client that failed (never arrived): the rest in order
            yield self._add(early.pop(c))

    def _add(self, update: ClientUpdate) -> ClientUpdate:
        s = self.summed
        s.acc = s.aggregator.add(s.acc, update, self.ctx)
        return summed_away(update)

    def submit(self, broadcast: Broadcast, payload: ClientPayload) -> Any:
        return self.executor.submit(broadcast, payload)

    def take(self, handle: Any) -> ClientUpdate:
        return self.executor.take(handle)

    def first(self, handles: Sequence[Any]) -> int:
        return self.executor.first(handles)

    def evaluate(self, plan: RoundPlan) -> Iterator[ClientEval]:
        return self.executor.evaluate(plan)

    def bn_stats(self, plan: RoundPlan) -> Iterator[BNStats]:
        return self.executor.bn_stats(plan)

    def collect_states(self, client_ids: Iterable[ClientId]) -> Iterator[tuple[ClientId, ClientState]]:
        return self.executor.collect_states(client_ids)

    def restore_states(self, states: Iterable[tuple[ClientId, ClientState]]) -> None:
        self.executor.restore_states(states)

    def close(self, reuse: bool = False) -> None:
        self.executor.close(reuse)
