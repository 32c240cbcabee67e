"""PromptFL: Guo et al., "PromptFL: Let Federated Participants Cooperatively Learn Prompts
Instead of Models -- Federated Learning in Age of Foundation Model", IEEE TMC 2023,
https://arxiv.org/abs/2208.11625.

Clients train CoOp's context on frozen CLIP (`model=clip_prompt`) with cross-entropy on
scale · cos(image, text of "[ctx] {class}."); the server averages the contexts. Nothing else
leaves a client: the model's state is the prompt alone.

Authors' code (github:PEILab-Federated-Learning/PromptFL @da401e7): `federated_main.py`
loads the global state into each client's `CustomCLIP`, trains (`trainers/promptfl.py`:
`PromptLearner`, SGD on `prompt_learner` only) and aggregates with `utils.average_weights`,
a plain mean over the clients (`method.weighted=false`, the default; `true` weighs them by
their examples as FedAvg does). Where we differ, on purpose: that script never empties its
`local_weights` list, so from round 2 on its "average" also holds every earlier round's
uploads (a bug; we average the round's clients); its clients all train every round (set
`fl.fraction`); Dassl's cosine learning-rate schedule with a warm-up epoch and fp16 are left
out (constant rate, float32). `method.own_classes=true`: each client scores only the classes
it holds (FedTPG's FedCoOp baseline; PromptFL's clients score every class).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.aggregation import Uniform
from ..core.messages import Broadcast, ClientUpdate, ServerState
from ..core.strategy import ServerContext
from .configs.promptfl import PromptFLConfig
from .prompting import PromptObjective, PromptStrategy


class PromptFL(PromptStrategy[PromptFLConfig, ServerState, Broadcast]):
    objective_cls = PromptObjective

    def objective_kwargs(self) -> dict[str, Any]:
        # weighting is the server's
        return {"own_classes": self.config.own_classes, "trained_classes": self.trained_classes()}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.config.weighted:
            # utils.average_weights: Σ w_k / K, the run's chain after the uniform weights (set
            # here, not per round: under secure aggregation the clients weigh their own updates)
            self.aggregator = self.aggregator.after(Uniform())

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> ServerState:
        return self.average(state, updates, ctx)
