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
    adapter tensors train. `runtime.batched`: the step is the default cross-entropy of
    `classify(represent(x))` (the class text through the text tower's adapters, if any, inside
    it), so K clients step together where every adapted layer is a pure function of its
    weights: peft's LoRA of a `Linear` (base(x) + s · B A x). Not of an `nn.MultiheadAttention`
    (open_clip's `attn`): peft merges its adapters into the frozen weights in place for each
    call, which stacked weights cannot take (`batched_refusal`)."""

    batched_step = True

    def batched_refusal(self) -> str | None:
        from peft.tuners.lora.layer import MultiheadAttention as LoRAMultiheadAttention

        for name, m in self.model.named_modules():
            if isinstance(m, LoRAMultiheadAttention):
                return (
                    f"peft's LoRA of {name} (an nn.MultiheadAttention) merges into the frozen weights "
                    "in place for each call; batched clients need Linear targets "
                    "(model.target_modules=[c_fc,c_proj] on a ViT or text tower)"
                )
        return None


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
