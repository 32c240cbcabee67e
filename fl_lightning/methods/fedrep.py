"""FedRep: Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021, https://arxiv.org/abs/2102.07078.

Differs from FedPer by the local training: each round a client first trains its personal
head with the body frozen (`head_epochs`), then the body with the head frozen
(`body_epochs`), as two Lightning fits, each with a fresh optimiser (PFLlib `clientrep.py`:
`poptimizer` over the head for `plocal_epochs`, then `optimizer` over the base for
`local_epochs`). The head never leaves the client; the body is averaged.

Defaults follow PFLlib, the protocol FedDTR's baseline numbers come from: `-pls
plocal_epochs` = 1 head epoch and `-ls local_epochs` = 1 body epoch (`body_epochs: null` =
`fl.local_epochs`). The FedRep paper itself trains the head for many more local updates
(10 epochs in its experiments); set `method.head_epochs=10` for that.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..core.messages import Broadcast, ServerState
from ..core.objective import Phase
from ..core.strategy import Strategy
from .configs.fedrep import FedRepConfig
from .fedper import PersonalHead, is_head


def is_body(name: str) -> bool:
    return not is_head(name)


class FedRepObjective(PersonalHead[Broadcast]):
    def __init__(
        self, model: nn.Module, head_epochs: int = 1, body_epochs: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        self.head_epochs, self.body_epochs = head_epochs, body_epochs

    def phases(self) -> list[Phase]:
        return [
            Phase("head", trainable=is_head, epochs=self.head_epochs),
            Phase("body", trainable=is_body, epochs=self.body_epochs),
        ]


class FedRep(Strategy[FedRepConfig, ServerState, Broadcast]):
    objective_cls = FedRepObjective
