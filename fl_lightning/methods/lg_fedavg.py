"""LG-FedAvg: Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", 2020, https://arxiv.org/abs/2001.01523.

Differs from FedAvg by what is averaged: only the head (the backbone's `head`, the
classifier on the features) is global; each client keeps its feature extractor. With
heterogeneous clients (a model family) this works as long as every head has the same
shape, i.e. the same feature dimension (the HtFL baseline of FedTGP/FedTSP).
"""

from __future__ import annotations

from ..core.messages import Broadcast
from ..core.objective import ClientObjective
from ..core.strategy import FedAvgStrategy
from .configs.lg_fedavg import LGFedAvgConfig


class LGFedAvgObjective(ClientObjective[Broadcast]):
    def is_personal(self, key: str) -> bool:
        return not key.startswith("head.")


class LGFedAvg(FedAvgStrategy[LGFedAvgConfig]):
    objective_cls = LGFedAvgObjective
