"""FedIT: Zhang et al., "Towards Building the Federated GPT: Federated Instruction Tuning",
ICASSP 2024, arXiv:2305.05644 (Shepherd, github:JayZhang42/FederatedGPT-Shepherd; OpenFedLLM's
and FedLLM-Bench's default).

Clients train LoRA adapters (`model=clip_lora`); the server averages A and B separately
(FedAvg, example-weighted: Shepherd's `FedAvg` weighs by each client's data size), through the
run's aggregation chain. Inexact on purpose, as the paper does it: mean(B) · mean(A) is not the
mean of the clients' B · A (tests/test_adapters.py measures the gap); FFA-LoRA and FLoRA are
the exact ones.
"""

from __future__ import annotations

from ..core.messages import Broadcast, ServerState
from .adapters import AdapterStrategy
from .configs.fedit import FedITConfig


class FedIT(AdapterStrategy[FedITConfig, ServerState, Broadcast]):
    pass  # Strategy.aggregate: the chain's (example-weighted) mean of every uploaded tensor
