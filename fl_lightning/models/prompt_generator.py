"""FedTPG's prompt generator (Qiu et al., "Text-driven Prompt Generation for Vision-Language
Models in Federated Learning", ICLR 2024, https://openreview.net/forum?id=NW31gAylIm): learnable
queries that cross-attend to the frozen text tower's features of the class names and come out
as the prompt's context vectors, so a set of class names no client held still gets a context.

    q = soft_prompt                                  [n_ctx, width], N(0, 0.02²)
    x = MHA(LN(q), LN'(t), LN'(t))                   t: the names' features [k, kv_dim]
    x = x + FF(x)                                    FF: LN, Linear(w, 8w), GEGLU, Linear(4w, w)
    x = x + MHA(LN(x), LN(x), LN(x)); x = x + FF(x)  `depth` times (0 by default)

The cross-attention has no residual (the queries are replaced by what they read). Authors' code
(github:boschresearch/FedTPG @f141c29): `model/prompt_net.py` (`PromptTranslator`,
`CrossAttention`, `SelfAttention`, `FeedForward`, `GEGLU`), with `prompt_depth` 1 (their
`--depth_ctx 1`: no deep prompts) and float32 (they run it in fp16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GEGLU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        x, gates = x.chunk(2, dim=-1)
        return x * F.gelu(gates)


def feed_forward(dim: int, mult: int = 4) -> nn.Sequential:
    return nn.Sequential(
        nn.LayerNorm(dim), nn.Linear(dim, dim * mult * 2), GEGLU(), nn.Linear(dim * mult, dim)
    )


class SelfBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, num_heads=heads, batch_first=True)
        self.ff = feed_forward(dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        x = self.attn(h, h, h, need_weights=False)[0] + x
        return self.ff(x) + x


class PromptGenerator(nn.Module):
    """Class-name features [k, kv_dim] -> one context [n_ctx, width] for those k classes."""

    def __init__(self, n_ctx: int, width: int, kv_dim: int, depth: int = 0, heads: int = 4) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"method.heads={heads} must divide the text tower's width {width}")
        self.soft_prompt = nn.Parameter(torch.randn(n_ctx, width) * 0.02)
        self.norm = nn.LayerNorm(width)
        self.norm_context = nn.LayerNorm(kv_dim)
        self.cross = nn.MultiheadAttention(width, num_heads=heads, kdim=kv_dim, vdim=kv_dim, batch_first=True)
        self.ff = feed_forward(width)
        self.blocks = nn.ModuleList(SelfBlock(width, heads) for _ in range(depth))

    def forward(self, names: Tensor) -> Tensor:
        t = self.norm_context(names.unsqueeze(0))  # one sequence: every class attends together
        x = self.cross(self.norm(self.soft_prompt).unsqueeze(0), t, t, need_weights=False)[0]
        x = self.ff(x) + x
        for block in self.blocks:
            x = block(x)
        return x[0]
