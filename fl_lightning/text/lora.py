"""LoRA (Hu et al., arXiv:2106.09685) through Hugging Face `peft` on a sentence encoder of ours
(`text=minilm`, `text=hf`: a BERT-style `HFTextEncoder`), so that a method can train its text
side with a few numbers a client: FedGLCL's `method.text_lora_rank` (methods/fedglcl.py).

    tower = LoRATextTower(text={"name": "minilm"}, prompts=["a photo of a zero", ...], rank=4)
    tower()          # [C, d] the prompts' L2-normalised features through the adapted encoder

Each targeted projection W (`target_modules`, BERT's `query` / `value` by default: the LoRA
paper's W_q, W_v) is read as W + (alpha / rank) · B A, B [out, rank] = 0 and A [rank, in] from
peft's Kaiming-uniform draw seeded by `seed`, so an untrained tower gives the frozen
encoder's features exactly. Every entry but the adapter tensors (`is_adapter_key`) is frozen:
the encoder's weights come from its folder on every copy and are never trained, uploaded,
broadcast or checkpointed (the method's `ClientObjective.role` says so). No dropout anywhere
(the encoder stays in eval mode)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..core.errors import ConfigError

#: what marks an adapter tensor in a state key (peft's names)
ADAPTER_MARKS = (".lora_A.", ".lora_B.")
#: the sentence encoders LoRA can go on (BERT-style Hugging Face models)
LORA_ENCODERS = ("minilm", "hf")


def is_adapter_key(key: str) -> bool:
    return any(m in key for m in ADAPTER_MARKS)


def inject_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    target_modules: Sequence[str],
    seed: int,
    what: str,
    dropout: float = 0.0,
) -> None:
    """peft's LoRA (B = 0, A from its Kaiming-uniform draw seeded by `seed`: the same wherever
    the model is built) on `model`'s modules named `target_modules`, in place; a ConfigError
    naming `what` when none matches."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(  # (peft annotates lora_alpha int; its scaling alpha / r takes a float)
        r=int(rank),
        lora_alpha=float(alpha),  # type: ignore[arg-type]
        lora_dropout=float(dropout),
        target_modules=list(target_modules),
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # A's init: the same wherever the model is built
        try:
            inject_adapter_in_model(config, model)
        except ValueError as e:  # peft: no module matched
            raise ConfigError(f"{what} target_modules={list(target_modules)}: {e}") from None


class LoRATextTower(nn.Module):
    """A frozen Hugging Face sentence encoder with peft LoRA adapters on its attention
    projections, and the token ids of the prompts it encodes (the classes' text)."""

    prompt_ids: Tensor
    prompt_mask: Tensor

    def __init__(
        self,
        text: Mapping[str, Any],
        prompts: Sequence[str],
        rank: int = 4,
        alpha: float = 8.0,
        target_modules: Sequence[str] = ("query", "value"),
        seed: int = 0,
    ) -> None:
        super().__init__()
        from . import build_text_encoder
        from .encoders import HFTextEncoder

        name = str(text.get("name", "none"))
        if name not in LORA_ENCODERS:
            raise ConfigError(
                f"LoRA on the text encoder needs a Hugging Face sentence encoder (text=minilm or text=hf), "
                f"not text={name}"
            )
        if int(rank) < 1:
            raise ConfigError(f"text LoRA rank {rank}: at least 1")
        # CPU here: the host moves the objective to its device (as every model)
        self.encoder = build_text_encoder({**text, "device": "cpu"})
        assert isinstance(self.encoder, HFTextEncoder)
        self.rank, self.alpha = int(rank), float(alpha)
        inject_lora(self.encoder.model, self.rank, self.alpha, target_modules, seed, "text LoRA")
        for n, p in self.named_parameters():
            p.requires_grad_(is_adapter_key(n))
        ids, mask = self.encoder.tokenize(list(prompts))
        self.register_buffer("prompt_ids", ids, persistent=False)
        self.register_buffer("prompt_mask", mask, persistent=False)

    def forward(self) -> Tensor:
        """The prompts' L2-normalised features [C, d] through the adapted encoder."""
        return self.encoder.forward_embeddings(self.encoder.embed_tokens(self.prompt_ids), self.prompt_mask)

    def train(self, mode: bool = True) -> LoRATextTower:
        super().train(mode)
        self.encoder.train(False)  # frozen: its dropout stays off whatever the trainer asks
        return self
