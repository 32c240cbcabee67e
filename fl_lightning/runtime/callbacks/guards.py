"""`DivergenceGuard`: a run whose training loss or global model is no longer finite stops,
marked `diverged` (its last finite checkpoint kept), instead of averaging NaNs for the
remaining rounds and looking like a result."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...core.errors import DivergedError
from ...core.messages import ClientUpdate, RoundPlan, ServerState
from ..record import RoundRecord
from .base import Callback


class DivergenceGuard(Callback):
    def on_updates(self, record: RoundRecord, updates: Sequence[ClientUpdate]) -> None:
        """Before aggregation: a client whose training loss is not finite."""
        bad = sorted(u.client_id for u in updates if not math.isfinite(u.metrics.get("train_loss", 0.0)))
        if bad:
            raise DivergedError(
                f"round {record.round}: non-finite training loss on client(s) "
                f"{', '.join(map(str, bad[:10]))}",
                record.line(),
            )

    def on_server_state(
        self, state: ServerState, plan: RoundPlan, updates: Sequence[ClientUpdate], record: RoundRecord
    ) -> ServerState:
        """After aggregation and the server update: a global model that is not finite."""
        params = state.global_params
        if params is not None and not all(
            bool(torch.isfinite(v).all()) for v in params.values() if v.is_floating_point()
        ):
            raise DivergedError(
                f"round {record.round}: the aggregated global model has non-finite weights",
                record.line(),
            )
        return state
