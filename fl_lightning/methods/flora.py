"""FLoRA: Wang et al., "FLoRA: Federated Fine-Tuning Large Language Models with Heterogeneous
Low-Rank Adaptations", NeurIPS 2024, arXiv:2409.05976 (github:ATP-1010/FederatedLLM).

Clients train LoRA adapters (`model=clip_lora`) and upload A_k, B_k only. The server stacks
them, A = [A_1; ...; A_K] (rows) and B = [p_1 B_1, ..., p_K B_K] (columns), so that

    B A = Σ_k p_k B_k A_k        (p_k = n_k / n; `method.weighted=false`: 1 / K),

exactly, at any ranks (no cross terms, unlike FedIT's mean(B) · mean(A)). As the authors'
`main.py` does, the stacked product is folded into the base weights (W ← W + (alpha/r) · B A:
the global model's adapted layers' base weights are the federation's, `train_base`; a client
never trains them) and every client starts the next round from a fresh adapter: A at the run's
seeded init, B = 0. So the global checkpoint holds the folded base weights of the adapted layers
(not the towers' other weights); uploads stay adapter-only; the broadcast carries the folded
weights (the authors broadcast the stacked factors and let each client fold them: the same
model, more bytes down here).

The server's step is the stacking itself, so the run's aggregation chain (clipping, noise) is
refused: it would act on the factors, not on ΔW.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.strategy import ServerContext
from ..core.types import StateDict
from ..models.clip_lora import ADAPTER_MARKS, adapter_keys, adapter_modules, base_weight_key
from .adapters import AdapterObjective, AdapterStrategy
from .configs.flora import FLoRAConfig


@dataclass
class FLoRAState(ServerState):
    """`restart`: the adapters' initial tensors (A seeded, B = 0), every round's fresh start."""

    restart: StateDict = field(default_factory=dict)


class FLoRAObjective(AdapterObjective[Broadcast]):
    """Uploads the adapter tensors only: the folded base weights come from the server. Its
    step is `AdapterObjective`'s (batched where that is)."""

    batched_step = True

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        up = super().end_round(payload, num_examples)
        if up.params is not None:
            up.params = {k: v for k, v in up.params.items() if any(m in k for m in ADAPTER_MARKS)}
        return up


def stacked_delta(
    factors: Sequence[tuple[torch.Tensor, torch.Tensor]], weights: Sequence[float], scaling: float
) -> torch.Tensor:
    """(alpha/r) · [p_1 B_1, ..., p_K B_K] [A_1; ...; A_K] in float64: Σ_k p_k (alpha/r) B_k A_k."""
    a = torch.cat([fa.double() for fa, _ in factors], dim=0)
    b = torch.cat([w * fb.double() for (_, fb), w in zip(factors, weights, strict=True)], dim=1)
    return scaling * b @ a


class FLoRA(AdapterStrategy[FLoRAConfig, FLoRAState, Broadcast]):
    objective_cls = FLoRAObjective
    state_cls = FLoRAState
    aggregates_through_chain = False
    aggregates_through_chain_why = (
        "it stacks the clients' factors (ΔW = Σ p_k B_k A_k), no mean to clip or noise"
    )

    def adapter_kwargs(self, kwargs: dict[str, object]) -> dict[str, object]:
        return dict(kwargs, train_base=True)

    def init_state(self, global_params: StateDict | None) -> FLoRAState:
        state = super().init_state(global_params)
        state.restart = {
            k: v.detach().clone()
            for k, v in (global_params or {}).items()
            if any(m in k for m in ADAPTER_MARKS)
        }
        return state

    def aggregate(
        self, state: FLoRAState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> FLoRAState:
        if state.global_params is None or not updates:
            return state
        ups = [u for u in updates if u.params is not None]
        n = [float(u.num_examples) if self.config.weighted else 1.0 for u in ups]
        weights = [w / sum(n) for w in n]
        new = dict(state.global_params)
        for prefix in adapter_modules(ups[0].params or {}):
            ka, kb = adapter_keys(prefix)
            base = base_weight_key(prefix, new)
            factors = [((u.params or {})[ka], (u.params or {})[kb]) for u in ups]
            if factors[0][0].dim() != 2:
                raise ValueError(f"method=flora folds 2-d factors only; {ka} is {factors[0][0].dim()}-d")
            delta = stacked_delta(factors, weights, self.lora_scaling())
            new[base] = (new[base].double() + delta).to(new[base].dtype)
        new.update({k: v.clone() for k, v in state.restart.items()})  # a fresh adapter each round
        return dataclasses.replace(state, global_params=new)
