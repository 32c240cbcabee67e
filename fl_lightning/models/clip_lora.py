"""`clip_lora`: LoRA adapters (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
ICLR 2022, arXiv:2106.09685) on frozen open_clip towers through Hugging Face `peft`, the model
of the federated adapter methods (`method=fedit`, `ffa_lora`, `flora`, `hetlora`; other methods
refuse it).

    logits = scale · cos(image_tower(x), text_tower("a photo of a {class}.")),

each targeted module's weight W read as W + (alpha / rank) · B A, B [out, rank] from zeros and
A [rank, in] from peft's Kaiming-uniform init (seeded by `seed`: the same wherever the model is
built). `towers`: which towers get adapters (`image`, `text` or `both`); `target_modules`: the
module names peft matches inside them (open_clip's `attn`, an `nn.MultiheadAttention`: its
packed q/k/v projection and its output projection; `out_proj`, `c_fc`, `c_proj`, ... for other
layers). With the text tower adapted, the class names' text features are recomputed every step
(they move); without, they are computed once (the zero-shot head, as the prompt learners').

Every state entry that is not an adapter tensor (`lora_A` / `lora_B`) is frozen by role
(`frozen_key`): never trained, uploaded, broadcast or checkpointed; every copy of the model
builds it from `pretrained` (and `aligned`, the mini scale's stand-in, as `clip_prompt` does).
`freeze_a` (FFA-LoRA) freezes the A matrices too: they stay at their seeded init everywhere.
`train_base` (FLoRA) keeps the adapted layers' base weights in the federation's state (the
server folds the clients' stacked products into them), still never trained by a client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import MODELS
from .clip_prompt import _at_least_32, _channels, clip_view, frozen_clip, tower_size

#: open_clip's tower names inside `open_clip.CLIP`
TOWERS = {"image": ("visual",), "text": ("transformer",), "both": ("visual", "transformer")}
ADAPTER_MARKS = (".lora_A.", ".lora_B.")


def adapter_modules(state: dict[str, Tensor]) -> list[str]:
    """The adapted modules' names in a state (the prefixes of its `lora_A` keys), sorted."""
    return sorted(k.split(".lora_A.")[0] for k in state if ".lora_A." in k)


def adapter_keys(prefix: str, adapter: str = "default") -> tuple[str, str]:
    """The (A, B) state keys of module `prefix`'s peft adapter."""
    return f"{prefix}.lora_A.{adapter}.weight", f"{prefix}.lora_B.{adapter}.weight"


def base_weight_key(prefix: str, state: dict[str, Tensor] | Sequence[str]) -> str:
    """The base weight an adapter at `prefix` adds to: a Linear's `weight`, a
    MultiheadAttention's packed `in_proj_weight` (peft's LoRA of `nn.MultiheadAttention`)."""
    for k in (f"{prefix}.base_layer.weight", f"{prefix}.base_layer.in_proj_weight"):
        if k in state:
            return k
    raise KeyError(f"no base weight for the adapter at {prefix}")


def _stash_base(module: Any, args: Any) -> None:
    """Before a peft LoRA `nn.MultiheadAttention` runs: copy its base weights. peft merges the
    adapters into them for the call and unmerges after ((W + ΔW) − ΔW: W moved by rounding, a
    few 1e-7 a call), which would make every client's frozen tower drift apart and a resumed
    model differ from one that kept running."""
    base = module.get_base_layer()
    module._fl_base = (base.in_proj_weight.data.clone(), base.out_proj.get_base_layer().weight.data.clone())


def _restore_base(module: Any, args: Any, output: Any) -> None:
    """After it ran: the base weights exactly as they were (the forward's graph holds the merged
    copies, not these)."""
    w_in, w_out = module.__dict__.pop("_fl_base")
    base = module.get_base_layer()
    base.in_proj_weight.data.copy_(w_in)
    base.out_proj.get_base_layer().weight.data.copy_(w_out)


class CLIPLoRA(nn.Module):
    """LoRA (through `peft`) on frozen open_clip towers with CLIP's zero-shot head; only the
    adapter tensors train (the adapter methods set `class_names` from the dataset)."""

    frozen_prefixes: tuple[str, ...] = ()  # by key, not prefix: `frozen_key`

    #: only a method whose strategy has this flag trains it (config.validate_registered)
    method_flag = "adapter_learner"

    data_mean: Tensor
    data_std: Tensor
    name_features: Tensor  # text tower not adapted: the class names' frozen text features [C, d]
    name_ids: Tensor
    name_mask: Tensor

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        image_size: int,
        arch: str = "RN50",
        pretrained: str | None = None,
        seed: int = 0,
        class_names: Sequence[str] | None = None,
        towers: str = "both",
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: Sequence[str] = ("attn",),
        template: str = "a photo of a {}.",
        data_mean: float | Sequence[float] = 0.5,
        data_std: float | Sequence[float] = 0.5,
        cache_features: bool = True,
        aligned: str | None = None,
        align_holdout_from: int | None = None,
        align_holdout_size: int | None = None,
        align_epochs: int = 15,
        freeze_a: bool = False,
        train_base: bool = False,
    ) -> None:
        super().__init__()
        from peft import LoraConfig, inject_adapter_in_model

        from ..text.encoders import OpenCLIPTextEncoder
        from ..text.prompts import clean_class_name

        if towers not in TOWERS:
            raise ValueError(f"model.towers={towers!r}: one of {', '.join(TOWERS)}")
        if int(rank) < 1:
            raise ValueError(f"model.rank={rank}: at least 1")
        trainers = "an adapter method (method=fedit, ffa_lora, flora, hetlora)"
        clip, name = frozen_clip(
            "clip_lora",
            trainers,
            num_classes,
            class_names,
            arch,
            pretrained,
            seed,
            aligned,
            align_holdout_from,
        )
        assert class_names is not None  # (frozen_clip checked them)
        text = OpenCLIPTextEncoder.of_model(clip, name)  # (freezes the text tower's modules)
        self.image_size = tower_size(clip.visual)
        self.logit_scale = float(clip.logit_scale.detach().exp())
        self.rank, self.alpha, self.towers = int(rank), float(alpha), towers
        self.freeze_a, self.train_base = bool(freeze_a), bool(train_base)
        config = LoraConfig(  # (peft annotates lora_alpha int; its scaling alpha / r takes a float)
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]
            lora_dropout=float(dropout),
            target_modules=list(target_modules),
            bias="none",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # A's init: the same wherever the model is built (FFA-LoRA's shared A)
            for tower in TOWERS[towers]:
                try:
                    inject_adapter_in_model(config, getattr(clip, tower))
                except ValueError as e:  # peft: no module matched
                    raise ValueError(
                        f"model.target_modules={list(target_modules)} in the {tower}: {e}"
                    ) from None
        from peft.tuners.lora.layer import MultiheadAttention as LoRAMultiheadAttention

        for m in clip.modules():
            if isinstance(m, LoRAMultiheadAttention):
                m.register_forward_pre_hook(_stash_base)
                m.register_forward_hook(_restore_base)
        self.visual = clip.visual
        self.text = text  # its modules are clip's (token embedding, transformer, final norm, projection)
        for n, p in self.named_parameters():
            p.requires_grad_(".lora_B." in n or (".lora_A." in n and not self.freeze_a))
        names = [template.format(clean_class_name(c)) for c in class_names]
        ids, mask = text.tokenize(names)
        self.register_buffer("name_ids", ids, persistent=False)
        self.register_buffer("name_mask", mask, persistent=False)
        self.text_adapted = "transformer" in TOWERS[towers]
        if not self.text_adapted:
            with torch.no_grad():
                self.register_buffer("name_features", self._text_features(), persistent=False)
        self.register_buffer("data_mean", _channels(data_mean), persistent=False)
        self.register_buffer("data_std", _channels(data_std), persistent=False)
        #: the image tower unadapted: hosts compute each image's features once (`encode_images`)
        self.frozen_image_features = bool(cache_features) and "visual" not in TOWERS[towers]
        self.feature_dim = text.embed_dim

    def frozen_key(self, key: str) -> bool:
        """Role `frozen` (`ClientObjective.role`): every entry but the adapter tensors (and A
        under `freeze_a`; and the adapted layers' base weights are the federation's under
        `train_base`)."""
        if ".lora_B." in key:
            return False
        if ".lora_A." in key:
            return self.freeze_a
        if self.train_base and key.endswith((".base_layer.weight", ".base_layer.in_proj_weight")):
            return False
        return True

    def train(self, mode: bool = True) -> CLIPLoRA:
        """The frozen towers stay in eval mode (batch norm, dropout) whatever mode the trainer
        sets; only the adapters' dropout follows it."""
        super().train(mode)
        self.visual.eval()
        self.text.eval()
        for n, m in self.named_modules():
            if n.endswith(".lora_dropout.default"):
                m.train(mode)
        return self

    def _text_features(self) -> Tensor:
        embeds = self.text.embed_tokens(self.name_ids)
        return _at_least_32(self.text.forward_embeddings(embeds, self.name_mask))

    def text_features(self) -> Tensor:
        """The class names' normalised text features [C, d] (through the text tower's adapters
        when it has them)."""
        return self._text_features() if self.text_adapted else self.name_features

    @torch.no_grad()
    def encode_images(self, x: Tensor, batch_size: int = 256) -> Tensor:
        """L2-normalised image features [N, d] of images in the dataset's normalisation."""
        out = [self._image_features(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
        return torch.cat(out) if out else torch.zeros(0, self.feature_dim, device=x.device)

    def _image_features(self, x: Tensor) -> Tensor:
        v = clip_view(x, self.data_mean, self.data_std, self.image_size)
        return F.normalize(_at_least_32(self.visual(v)), dim=-1)

    def forward_features(self, x: Tensor) -> Tensor:
        """The normalised image feature [B, d]; a 2-d `x` is one already (`encode_images`)."""
        if x.dim() == 2:
            return x
        if "visual" in TOWERS[self.towers]:
            return self._image_features(x)
        with torch.no_grad():  # the tower is frozen: no graph through it
            return self._image_features(x)

    def forward_head(self, z: Tensor) -> Tensor:
        return self.logit_scale * z @ self.text_features().T

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


MODELS.register("clip_lora")(CLIPLoRA)
