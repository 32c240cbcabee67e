"""FFA-LoRA: Sun et al., "Improving LoRA in Privacy-preserving Federated Learning", ICLR 2024,
arXiv:2403.12313 (github:david-stan/ffa-lora-flower).

Every A stays at its init, which is the same on every client (peft's Kaiming-uniform draw
seeded by `model.seed` wherever the model is built: `models/clip_lora.py`, `freeze_a`); only
the B matrices train and are uploaded (half of FedIT's bytes at equal rank when in = out), and
the server averages them through the run's aggregation chain. The mean is exact: with one A,
mean_k(B_k) · A = mean_k(B_k · A), so differential privacy's noise on B (the paper's point:
`aggregator.steps=[clip_l2,uniform,gaussian]`) is not squared through a product.
"""

from __future__ import annotations

from typing import Any

from ..core.messages import Broadcast, ServerState
from .adapters import AdapterStrategy
from .configs.ffa_lora import FFALoRAConfig


class FFALoRA(AdapterStrategy[FFALoRAConfig, ServerState, Broadcast]):
    def adapter_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return dict(kwargs, freeze_a=True)  # A frozen by role: neither trained nor sent
