"""`fl.bn_stats=recompute`: the clients that trained this round measure their data under the
new global weights, and the server pools the sums into the global model's batch-norm running
statistics (`core/bn_stats.py`), instead of averaging the clients' own statistics, which were
measured under their local weights. A step of `run_rounds`, after the server update."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...core.bn_stats import bn_stats_nbytes, pooled_bn_params
from ...core.messages import ClientUpdate, RoundPlan, ServerState, tensor_nbytes
from ...core.strategy import Strategy
from ..executor import Executor
from ..record import RoundRecord


def recompute_bn_stats(
    state: ServerState,
    plan: RoundPlan,
    updates: Sequence[ClientUpdate],
    record: RoundRecord,
    strategy: Strategy[Any, Any, Any],
    executor: Executor,
) -> ServerState:
    """`state` with its global batch-norm statistics pooled from the clients that trained (their
    bytes added to the round's); `state` itself for a model without batch norm."""
    params = state.global_params
    if params is None or not any(k.endswith("running_mean") for k in params):
        return state
    trained = {u.client_id for u in updates}
    bplan = RoundPlan(
        plan.round,
        strategy.broadcast(state, plan.round),
        [p for p in plan.payloads if p.client_id in trained],
    )
    stats = sorted(executor.bn_stats(bplan), key=lambda s: s.client_id)
    record.bytes_up = (record.bytes_up or 0) + sum(bn_stats_nbytes(s) for s in stats)
    measured = {s.client_id for s in stats}  # the payloads of those that answered, as the round's count
    sent = sum(tensor_nbytes(p) for p in bplan.payloads if p.client_id in measured)
    record.bytes_down = (record.bytes_down or 0) + bplan.broadcast.nbytes() * len(stats) + sent
    return dataclasses.replace(state, global_params=pooled_bn_params(stats, params))
