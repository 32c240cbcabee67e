"""Local training only: every client trains its own model with cross-entropy and nothing
is communicated (the lower baseline of the heterogeneous-model tables, e.g. Table 4 ID 1
of FedTSP). Evaluated on each client's own test split.
"""

from __future__ import annotations

from ..core.messages import Broadcast
from ..core.objective import ClientObjective
from ..core.strategy import FedAvgStrategy
from .configs.local import LocalConfig


class LocalObjective(ClientObjective[Broadcast]):
    def is_personal(self, key: str) -> bool:
        return True


class Local(FedAvgStrategy[LocalConfig]):
    objective_cls = LocalObjective
