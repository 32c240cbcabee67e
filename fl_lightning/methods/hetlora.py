"""HetLoRA: Cho et al., "Heterogeneous LoRA for Federated Fine-tuning of On-Device Foundation
Models", EMNLP 2024, arXiv:2401.06432.

Client k trains a rank-r_k adapter (`method.ranks`: r_k = ranks[k mod len(ranks)], a tier per
client id). Every copy of the model is built at r_max = max(ranks) (`model.rank` is set to it)
and a client's module is truncated to its rank: it loads the global A [r_max, in] and B [out,
r_max], keeps A's first r_k rows and B's first r_k columns and zeroes the rest. Zeroed
components have zero gradients (∂L/∂A_i ∝ B_{:,i}, ∂L/∂B_{:,i} ∝ A_i), so plain SGD, momentum
and weight decay keep them zero: the module is exactly a rank-r_k LoRA with scaling alpha/r_max,
and the client uploads only A[:r_k], B[:, :r_k]. The server zero-pads each upload back to r_max
and takes the sparsity-weighted mean, module by module,

    A = Σ_k w_k pad(A_k),  B = Σ_k w_k pad(B_k),   w_k = ‖B_k A_k‖_F / Σ_j ‖B_j A_j‖_F,

(the paper's weighting by the update's Frobenius norm). Not applied: the paper's rank
self-pruning (a client shrinking its own r_k during training).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.strategy import ServerContext
from ..models.clip_lora import adapter_keys, adapter_modules
from .adapters import AdapterObjective, AdapterStrategy
from .configs.hetlora import HetLoRAConfig


def rank_of(client_id: int, ranks: Sequence[int]) -> int:
    return int(ranks[int(client_id) % len(ranks)])


def truncate(key: str, t: torch.Tensor, rank: int) -> torch.Tensor:
    """An adapter tensor cut to `rank`: A's first rows, B's first columns; other keys as they are."""
    if ".lora_A." in key:
        return t[:rank]
    if ".lora_B." in key:
        return t[:, :rank]
    return t


def pad(key: str, t: torch.Tensor, rank: int) -> torch.Tensor:
    """A truncated adapter tensor zero-padded back to `rank` (the inverse of `truncate` on a
    module whose components beyond its own rank are zero)."""
    if ".lora_A." in key:
        return torch.cat([t, t.new_zeros(rank - t.shape[0], *t.shape[1:])], dim=0)
    if ".lora_B." in key:
        return torch.cat([t, t.new_zeros(t.shape[0], rank - t.shape[1], *t.shape[2:])], dim=1)
    return t


class HetLoRAObjective(AdapterObjective[Broadcast]):
    def __init__(self, model: nn.Module, ranks: Sequence[int] = (8,), **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.ranks = [int(r) for r in ranks]
        self.client_rank: int | None = None  # None: the full r_max model (the global evaluation)

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self.client_rank = None if payload is None else rank_of(payload.client_id, self.ranks)
        if self.client_rank is None:
            return
        r = self.client_rank
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if ".lora_A." in name:
                    p[r:] = 0
                elif ".lora_B." in name:
                    p[:, r:] = 0

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        up = super().end_round(payload, num_examples)
        r = rank_of(payload.client_id, self.ranks)
        if up.params is not None:
            up.params = {k: truncate(k, v, r).clone() for k, v in up.params.items()}
        return up


class HetLoRA(AdapterStrategy[HetLoRAConfig, ServerState, Broadcast]):
    objective_cls = HetLoRAObjective
    aggregates_through_chain = False
    aggregates_through_chain_why = "its weights are each client's ‖B_k A_k‖_F over zero-padded factors"

    def objective_kwargs(self) -> dict[str, Any]:
        return {"ranks": [int(r) for r in self.config.ranks]}

    def adapter_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return dict(kwargs, rank=max(int(r) for r in self.config.ranks))

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> ServerState:
        if state.global_params is None or not updates:
            return state
        ups = [u.params for u in updates if u.params is not None]
        new = dict(state.global_params)
        for prefix in adapter_modules(ups[0]):
            ka, kb = adapter_keys(prefix)
            r_max = new[ka].shape[0]
            norms = [float(torch.linalg.matrix_norm(p[kb].double() @ p[ka].double())) for p in ups]
            total = sum(norms)
            w = [x / total for x in norms] if total > 0 else [1.0 / len(ups)] * len(ups)
            for k in (ka, kb):
                acc = sum(wk * pad(k, p[k].double(), r_max) for wk, p in zip(w, ups, strict=True))
                assert isinstance(acc, torch.Tensor)
                new[k] = acc.to(new[k].dtype)
        return dataclasses.replace(state, global_params=new)
