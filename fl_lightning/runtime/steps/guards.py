"""Divergence checks: a run whose training loss or global model is no longer finite stops,
marked `diverged` (its last finite checkpoint kept), instead of averaging NaNs for the
remaining rounds and looking like a result. `run_rounds` calls both where it names them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...core.errors import DivergedError
from ...core.messages import ClientUpdate, ServerState
from ..record import RoundRecord


def finite_losses(record: RoundRecord, updates: Sequence[ClientUpdate]) -> None:
    """Before aggregation: DivergedError if a client's training loss is not finite."""
    bad = sorted(u.client_id for u in updates if not math.isfinite(u.metrics.get("train_loss", 0.0)))
    if bad:
        raise DivergedError(
            f"round {record.round}: non-finite training loss on client(s) {', '.join(map(str, bad[:10]))}",
            record.line(),
        )


def finite_weights(state: ServerState, record: RoundRecord) -> ServerState:
    """After the server update: `state`, or DivergedError if its global model is not finite."""
    params = state.global_params
    if params is not None and not all(
        bool(torch.isfinite(v).all()) for v in params.values() if v.is_floating_point()
    ):
        raise DivergedError(
            f"round {record.round}: the aggregated global model has non-finite weights", record.line()
        )
    return state
