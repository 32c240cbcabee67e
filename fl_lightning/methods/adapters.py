"""What the federated LoRA methods share (FedIT, FFA-LoRA, FLoRA, HetLoRA): they train
`model=clip_lora` (models/clip_lora.py: peft's LoRA on frozen open_clip towers) and only it,
give it the dataset's class names and normalisation (and the mini scales' aligned stand-in,
built as the prompt learners build it: methods/prompting.py), and upload adapter tensors only
(every other entry is frozen by role)."""

from __future__ import annotations

from typing import Any, ClassVar

from ..core.objective import BroadcastT, ClientObjective
from ..core.strategy import ConfigT, StateT
from .prompting import PromptStrategy


class AdapterObjective(ClientObjective[BroadcastT]):
    """Cross-entropy on scale · cos(image, class text) through the adapted towers; only the
    adapter tensors train. Not batched: a text tower with adapters runs inside the step."""

    batched_step = False


class AdapterStrategy(PromptStrategy[ConfigT, StateT, BroadcastT]):
    """The driver side: `model=clip_lora` required, given the task's class names and image
    normalisation (and its aligned weights when `model.align_holdout_from` is set); records the
    adapters' scaling alpha / rank, which the servers that multiply factors need."""

    prompt_learner: ClassVar[bool] = False
    adapter_learner: ClassVar[bool] = True  # models/clip_lora.py accepts only such methods
    objective_cls: ClassVar[type[ClientObjective[Any]]] = AdapterObjective
    scaling: float | None = None

    def objective_kwargs(self) -> dict[str, Any]:
        return {}

    def adapter_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A method's own model keys (FFA-LoRA: `freeze_a`; ...)."""
        return kwargs

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        out = self.adapter_kwargs(super().model_kwargs(model, kwargs))
        self.scaling = float(out.get("alpha", 16.0)) / int(out.get("rank", 8))  # the model's defaults
        return out

    def lora_scaling(self) -> float:
        if self.scaling is None:
            raise RuntimeError(f"{type(self).__name__}: model_kwargs was never called (no scaling)")
        return self.scaling
