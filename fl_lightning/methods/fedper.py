"""FedPer: Arivazhagan et al., "Federated Learning with Personalization Layers", 2019,
https://arxiv.org/abs/1912.00818.

Differs from FedAvg by what leaves the client: the head (the backbone's `head`, the
classifier on the features) is personal and never uploaded; the body is averaged. Each
client trains body and head together on cross-entropy and is evaluated with the global
body and its own head on its own test split (PFLlib `clientper.py`/`serverper.py`).
"""

from __future__ import annotations

from ..core.messages import Broadcast
from ..core.objective import BroadcastT, ClientObjective
from ..core.strategy import FedAvgStrategy
from .configs.fedper import FedPerConfig

#: the state-dict prefix of the personal classifier
HEAD = "head."


def is_head(name: str) -> bool:
    return name.startswith(HEAD)


class PersonalHead(ClientObjective[BroadcastT]):
    """Mixin for any objective: the head stays with its client (`client_state["personal"]`)."""

    def is_personal(self, key: str) -> bool:
        return is_head(key)


class FedPerObjective(PersonalHead[Broadcast]):
    pass


class FedPer(FedAvgStrategy[FedPerConfig]):
    objective_cls = FedPerObjective
