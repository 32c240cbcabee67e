"""`hf_lora`: sequence classification over a frozen Hugging Face encoder with LoRA adapters
(Hu et al., arXiv:2106.09685) through `peft` on its attention projections and a trained
classifier head: the model of the adapter methods' language tasks (FFA-LoRA's RoBERTa on GLUE;
`data=sst2`, `conf/reproduce/adapters.yaml`'s paper scale). Trained by `method=fedit`,
`ffa_lora`, `flora`, `hetlora` only, as `clip_lora`.

    logits = out_proj(tanh(dense(h))),   h = the encoder's first-token state (`pooling=cls`:
    RoBERTa's <s>, as RobertaClassificationHead reads it) or its mean over real tokens,
    each targeted weight W (`target_modules`: BERT/RoBERTa's `query`, `value` by default, the
    LoRA paper's W_q, W_v) read as W + (alpha / rank) · B A, B = 0, A seeded by `seed`.

`encoder`: `minilm` (the shipped all-MiniLM-L6-v2, offline: tests) or a Hugging Face folder (a
local one sets HF_HUB_OFFLINE=1) or hub name (roberta-large at the paper scale). Inputs are
sentences as UTF-8 bytes in the dataset's byte normalisation (`data/glue.py`); the model decodes
and tokenizes them with the encoder's tokenizer (truncated to `max_length` tokens).

Roles as `clip_lora`'s (`frozen_key`): the adapters and the head train and are uploaded; every
encoder weight is frozen (built from `encoder` on every copy; never trained, uploaded, broadcast
or checkpointed), except the adapted layers' base weights under `train_base` (FLoRA folds into
them). `freeze_a` (FFA-LoRA): A frozen at its seeded init. The head starts from the same seeded
init on every copy. The encoder stays in eval mode (no dropout: RoBERTa's 0.1 is not applied),
so serial, Ray and resumed runs see one function; only the adapters' dropout follows the trainer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ..core.errors import ConfigError
from ..core.sentences import BYTE_MEAN, BYTE_STD, decode_bytes
from . import MODEL_TRAITS, MODELS, ModelTraits


def _first(v: float | Sequence[float]) -> float:
    return float(v[0]) if isinstance(v, Sequence) else float(v)


class HFLoRA(nn.Module):
    """peft LoRA on a frozen Hugging Face encoder, with RoBERTa's classification head."""

    #: only a method whose strategy has this flag trains it (config.validate_registered)
    method_flag = "adapter_learner"

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        image_size: int,
        encoder: str = "minilm",
        pooling: str = "cls",
        max_length: int = 128,
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: Sequence[str] = ("query", "value"),
        seed: int = 0,
        class_names: Sequence[str] | None = None,
        data_mean: float | Sequence[float] = BYTE_MEAN,
        data_std: float | Sequence[float] = BYTE_STD,
        freeze_a: bool = False,
        train_base: bool = False,
    ) -> None:
        super().__init__()
        from ..text.encoders import HFTextEncoder, minilm_path
        from ..text.lora import inject_lora

        if int(rank) < 1:
            raise ConfigError(f"model.rank={rank}: at least 1")
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"model=hf_lora: {len(class_names)} class names for {num_classes} classes")
        src = str(minilm_path()) if encoder == "minilm" else str(Path(encoder).expanduser())
        if Path(src).exists():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: never reach for the network
        else:
            src = encoder  # a hub name (the network or the Hugging Face cache)
        # CPU here: the host moves the objective to its device (as every model)
        self.encoder = HFTextEncoder(src, pooling=pooling, max_length=max_length, device="cpu")
        self.rank, self.alpha = int(rank), float(alpha)
        self.freeze_a, self.train_base = bool(freeze_a), bool(train_base)
        inject_lora(self.encoder.model, self.rank, self.alpha, target_modules, seed, "model", dropout)
        d = self.encoder.embed_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the head's init: the same wherever the model is built
            self.head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, num_classes))
        for n, p in self.named_parameters():
            p.requires_grad_(not self.frozen_key(n) and not n.endswith("base_layer.weight"))
        self.byte_mean, self.byte_std = _first(data_mean), _first(data_std)
        self.feature_dim = d

    def frozen_key(self, key: str) -> bool:
        """Role `frozen` (`ClientObjective.role`): every entry but the adapters (A too unless
        `freeze_a`) and the head (and the adapted layers' base weights under `train_base`)."""
        if ".lora_B." in key or key.startswith("head."):
            return False
        if ".lora_A." in key:
            return self.freeze_a
        return not (self.train_base and key.endswith(".base_layer.weight"))

    def train(self, mode: bool = True) -> HFLoRA:
        super().train(mode)
        self.encoder.eval()  # frozen: its dropout stays off whatever the trainer asks
        for n, m in self.named_modules():
            if n.endswith(".lora_dropout.default"):
                m.train(mode)
        return self

    def sentences(self, x: Tensor) -> list[str]:
        """The sentences of a batch [B, 1, 1, L] in the dataset's byte normalisation."""
        b = (x.detach().double().flatten(1) * self.byte_std + self.byte_mean) * 255.0
        return decode_bytes(b.round().clamp(0, 255).to(torch.uint8).cpu().numpy())

    def forward_features(self, x: Tensor) -> Tensor:
        """The pooled encoder state [B, d]; a 2-d `x` is one already."""
        if x.dim() == 2:
            return x
        ids, mask = self.encoder.tokenize(self.sentences(x))
        ids, mask = ids.to(x.device), mask.to(x.device)
        return self.encoder.forward_embeddings(self.encoder.embed_tokens(ids), mask, normalize=False)

    def forward_head(self, z: Tensor) -> Tensor:
        return self.head(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


MODELS.register("hf_lora")(HFLoRA)
MODEL_TRAITS["hf_lora"] = ModelTraits(inputs="sentences")
