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

(the paper's weighting by the update's Frobenius norm).

Rank self-pruning (the paper's Section 3.2; `method.prune_lambda` > 0): a client of rank r
penalises the last components of its module, kept = ⌊γ r⌋ (γ = `method.prune_gamma`),

    loss = CE + λ Σ_modules ‖B[:, kept:r]‖_F ‖A[kept:r]‖_F,

and when that norm has fallen over its local training (after < as received) it prunes them:
they are zeroed, it uploads rank `kept`, and it trains at rank `kept` from then on (its rank
is its resident state, `client_state["hetlora_rank"]`: it never grows back). A rank-1 client
has nothing to prune. `prune_lambda=0` (the default) is HetLoRA without self-pruning.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.strategy import ServerContext
from ..models.clip_lora import adapter_keys, adapter_modules
from .adapters import AdapterObjective, AdapterStrategy
from .configs.hetlora import HetLoRAConfig

#: the client's resident state entry holding its current rank (after any self-pruning)
RANK_KEY = "hetlora_rank"


def rank_of(client_id: int, ranks: Sequence[int]) -> int:
    return int(ranks[int(client_id) % len(ranks)])


def kept_rank(rank: int, gamma: float) -> int:
    """The rank a self-pruning client of rank `rank` keeps: ⌊γ r⌋ (0: nothing to prune)."""
    return int(math.floor(float(gamma) * int(rank)))


def tail_norm(params: dict[str, torch.Tensor], rank: int, kept: int) -> torch.Tensor:
    """Σ over the adapted modules of ‖B[:, kept:rank]‖_F ‖A[kept:rank]‖_F: the size of the
    components a self-pruning client would drop (differentiable in the factors; its gradient
    at B = 0 is 0)."""
    total = torch.zeros(())
    for prefix in adapter_modules(params):
        ka, kb = adapter_keys(prefix)
        a, b = params[ka][kept:rank], params[kb][:, kept:rank]
        total = total.to(a) + torch.linalg.matrix_norm(b) * torch.linalg.matrix_norm(a)
    return total


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
    """A rank-r_k client (its tier's, or what self-pruning left it). Not batched: each client's
    step has its own rank (and pruning term)."""

    batched_step = False

    def __init__(
        self,
        model: nn.Module,
        ranks: Sequence[int] = (8,),
        prune_lambda: float = 0.0,
        prune_gamma: float = 0.9,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.ranks = [int(r) for r in ranks]
        self.prune_lambda, self.prune_gamma = float(prune_lambda), float(prune_gamma)
        self.client_rank: int | None = None  # None: the full r_max model (the global evaluation)
        self.received_tail = 0.0  # the pruned components' norm as the round's module arrived

    def _zero_beyond(self, r: int) -> None:
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if ".lora_A." in name:
                    p[r:] = 0
                elif ".lora_B." in name:
                    p[:, r:] = 0

    def _keep_rank(self) -> int:
        """The rank self-pruning would keep this round; 0 where it is off or the rank is 1."""
        if self.prune_lambda <= 0 or self.client_rank is None:
            return 0
        return kept_rank(self.client_rank, self.prune_gamma)

    def _tail(self) -> torch.Tensor:
        assert self.client_rank is not None
        return tail_norm(dict(self.model.named_parameters()), self.client_rank, self._keep_rank())

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        if payload is None:
            self.client_rank = None
            return
        self.client_rank = int(self.client_state.get(RANK_KEY, rank_of(payload.client_id, self.ranks)))
        self._zero_beyond(self.client_rank)
        if self._keep_rank():
            with torch.no_grad():
                self.received_tail = float(self._tail())

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        if self._keep_rank():
            terms["prune"] = self.prune_lambda * self._tail()
        return terms

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        r = self.client_rank
        assert r is not None
        kept = self._keep_rank()
        if kept:
            with torch.no_grad():
                after = float(self._tail())
            if after < self.received_tail:  # the last components are fading: drop them
                r = kept
                self._zero_beyond(r)
            self.client_state[RANK_KEY] = r
        up = super().end_round(payload, num_examples)
        if up.params is not None:
            up.params = {k: truncate(k, v, r).clone() for k, v in up.params.items()}
        up.metrics["hetlora/rank"] = float(r)
        return up


class HetLoRA(AdapterStrategy[HetLoRAConfig, ServerState, Broadcast]):
    objective_cls = HetLoRAObjective
    aggregates_through_chain = False
    aggregates_through_chain_why = "its weights are each client's ‖B_k A_k‖_F over zero-padded factors"

    def objective_kwargs(self) -> dict[str, Any]:
        c = self.config
        ranks = [int(r) for r in c.ranks]
        return {"ranks": ranks, "prune_lambda": c.prune_lambda, "prune_gamma": c.prune_gamma}

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
