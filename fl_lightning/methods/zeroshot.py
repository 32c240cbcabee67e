"""Zero-shot CLIP: Radford et al., "Learning Transferable Visual Models From Natural Language
Supervision", ICML 2021, https://arxiv.org/abs/2103.00020.

The handwritten prompt "a photo of a {class}." classifies by scale · cos(image, text), nothing
trained. The row every federated prompt method is measured against (FLiP's `-palg CLIP`).

It runs as a prompt method so that it is evaluated by the same code on the same data: the
model is `clip_prompt` with its context set to the token embeddings of `method.template`'s
words before the class name (CoOp's initialisation from a phrase, which reproduces the
handwritten prompt's features exactly), clients fit nothing, and the server keeps the prompt.
One round is enough (`fl.rounds=1`); every round scores the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..core.messages import Broadcast, ClientUpdate, ServerState
from ..core.objective import Phase
from ..core.strategy import ServerContext
from .configs.zeroshot import ZeroShotConfig
from .prompting import PromptObjective, PromptStrategy


class ZeroShotObjective(PromptObjective[Broadcast]):
    fits_nothing: ClassVar[bool] = True  # what `--estimate` reads: no step to project

    def phases(self) -> list[Phase]:
        return []  # nothing trains


class ZeroShot(PromptStrategy[ZeroShotConfig, ServerState, Broadcast]):
    aggregates_through_chain = False
    aggregates_through_chain_why = "it trains and aggregates nothing"
    objective_cls = ZeroShotObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return {}

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        words = self.config.template[: -len("{}.")].strip()
        fixed = {"ctx_init": words, "class_specific": False, "class_token_position": "end"}
        return super().model_kwargs(model, {**kwargs, **fixed})

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> ServerState:
        return state  # the handwritten prompt, as it started
