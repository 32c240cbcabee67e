"""`BNStatistics` (`fl.bn_stats=recompute`): the clients that trained this round measure
their data under the new global weights, and the server pools the sums into the global
model's batch-norm running statistics (`core/bn_stats.py`), instead of averaging the
clients' own statistics, which were measured under their local weights."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...core.bn_stats import bn_stats_nbytes, pooled_bn_params
from ...core.messages import ClientUpdate, RoundPlan, ServerState
from ...core.strategy import Strategy
from ..executor import Executor
from ..record import RoundRecord
from .base import Callback, RunContext


class BNStatistics(Callback):
    def __init__(self, strategy: Strategy[Any, Any, Any]) -> None:
        self.strategy = strategy
        self.executor: Executor | None = None

    def on_run_start(self, ctx: RunContext) -> None:
        self.executor = ctx.executor

    def on_server_state(
        self, state: ServerState, plan: RoundPlan, updates: Sequence[ClientUpdate], record: RoundRecord
    ) -> ServerState:
        params = state.global_params
        if params is None or not any(k.endswith("running_mean") for k in params):
            return state
        assert self.executor is not None
        trained = {u.client_id for u in updates}
        bplan = RoundPlan(
            plan.round,
            self.strategy.broadcast(state, plan.round),
            [p for p in plan.payloads if p.client_id in trained],
        )
        stats = sorted(self.executor.bn_stats(bplan), key=lambda s: s.client_id)
        record.bytes_up = (record.bytes_up or 0) + sum(bn_stats_nbytes(s) for s in stats)
        record.bytes_down = (record.bytes_down or 0) + bplan.broadcast.nbytes() * len(stats)
        return dataclasses.replace(state, global_params=pooled_bn_params(stats, params))
