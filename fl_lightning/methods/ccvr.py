"""CCVR: Luo et al., "No Fear of Heterogeneity: Classifier Calibration for Federated
Learning with Non-IID Data", NeurIPS 2021, https://arxiv.org/abs/2106.05001.

FedAvg training, plus classifier calibration with virtual representations. Each client,
with the model it receives and before local training (the timing of CReFF's per-class
gradients, so both baselines calibrate the same extractor), computes per class c the mean
μ_ck, the unbiased covariance Σ_ck and the count n_ck of its features (the head's input,
eval mode) and uploads them. The server pools them into the global class statistics
(CCVR Eq. 3-4: the mean and unbiased covariance of all clients' features together), draws
`virtual_per_class` features per seen class from N(μ_c, Σ_c) and trains the head on them
with cross-entropy, starting from the FedAvg head (CCVR calibrates it) or a fresh one.
The calibrated head is what the global model predicts with (the FedAvg head is logged as
`fedavg_head/*`); clients keep training the FedAvg model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.centralized import torch_threads
from ..core.messages import Broadcast, ClientPayload, ClientUpdate, RoundPlan, ServerState, extend
from ..core.objective import ClientObjective, on_shared_features
from ..core.params import to_cpu
from ..core.progress import progress
from ..core.strategy import ServerContext, Strategy
from ..core.types import ClientId, Metrics, StateDict
from .configs.ccvr import CCVRConfig

HEAD = "head."


@dataclass
class CCVRState(ServerState):
    head: StateDict | None = None  # the calibrated head ("head.*" keys); None before round 1


@dataclass
class CCVRBroadcast(Broadcast):
    head: StateDict | None = None  # evaluation only: training broadcasts carry none


@dataclass
class ClassStatsUpdate(ClientUpdate):
    means: torch.Tensor | None = None  # [C, d] float64; rows of absent classes are zero
    covs: torch.Tensor | None = None  # [C, d, d] float64, unbiased (zero where n_ck < 2)
    counts: torch.Tensor | None = None  # [C]


def class_stats(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, ...]:
    """(means [C, d], unbiased covariances [C, d, d], counts [C]) of features `z` by class."""
    z = z.double()
    d = z.shape[1]
    means = torch.zeros(num_classes, d, dtype=torch.float64)
    covs = torch.zeros(num_classes, d, d, dtype=torch.float64)
    counts = torch.bincount(y, minlength=num_classes)
    for c in range(num_classes):
        zc = z[y == c]
        if len(zc):
            means[c] = zc.mean(0)
        if len(zc) > 1:
            centred = zc - means[c]
            covs[c] = centred.T @ centred / (len(zc) - 1)
    return means, covs, counts


def pool_class_stats(
    means: Sequence[torch.Tensor], covs: Sequence[torch.Tensor], counts: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CCVR Eq. 3-4: the global mean and unbiased covariance per class from the clients'
    (μ_ck, Σ_ck, n_ck): Σ_c = Σ_k (n_ck−1)/(N_c−1)·Σ_ck + Σ_k n_ck/(N_c−1)·μ_ck μ_ckᵀ
    − N_c/(N_c−1)·μ_c μ_cᵀ, zero where N_c < 2."""
    n = torch.stack([c.double() for c in counts])  # [K, C]
    total = n.sum(0)
    mu = sum(m * nk[:, None] for m, nk in zip(means, n, strict=True)) / total.clamp(min=1)[:, None]
    assert isinstance(mu, torch.Tensor)
    denom = (total - 1).clamp(min=1)[:, None, None]
    cov = torch.zeros_like(covs[0])
    for m, s, nk in zip(means, covs, n, strict=True):
        cov = cov + (
            (nk - 1).clamp(min=0)[:, None, None] * s + nk[:, None, None] * m[:, :, None] * m[:, None, :]
        )
    cov = (cov - total[:, None, None] * mu[:, :, None] * mu[:, None, :]) / denom
    cov[total < 2] = 0
    return mu, cov, total


def sample_virtual(
    mu: torch.Tensor, cov: torch.Tensor, counts: torch.Tensor, per_class: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`per_class` draws of N(μ_c, Σ_c) for every class with counts > 0, class by class:
    μ_c + ε·(V·√λ)ᵀ with ε ~ N(0, I) from `gen` and Σ_c = V diag(λ) Vᵀ (eigenvalues clamped
    at 0: a pooled covariance can be rank-deficient, and rounding can make λ slightly < 0)."""
    feats, labels = [], []
    for c in torch.nonzero(counts > 0).flatten().tolist():
        lam, vec = torch.linalg.eigh(cov[c])
        eps = torch.randn(per_class, mu.shape[1], generator=gen, dtype=torch.float64)
        feats.append(mu[c] + eps @ (vec * lam.clamp(min=0).sqrt()).T)
        labels.append(torch.full((per_class,), c, dtype=torch.long))
    return torch.cat(feats), torch.cat(labels)


def retrain_head(
    head: nn.Module,
    z: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr: float,
    momentum: float,
    batch_size: int,
    gen: torch.Generator,
) -> float:
    """Cross-entropy SGD on (z, y), reshuffled each epoch by `gen`; the last epoch's mean loss."""
    opt = torch.optim.SGD(head.parameters(), lr=lr, momentum=momentum)
    head.train()
    last = 0.0
    with torch_threads(1), progress("classifier calibration", epochs, "epoch") as bar:
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=gen)
            total = torch.zeros((), dtype=torch.float64, device=z.device)
            for i in range(0, len(y), batch_size):
                idx = order[i : i + batch_size].to(z.device)
                opt.zero_grad()
                loss = F.cross_entropy(head(z[idx]), y[idx])
                loss.backward()
                opt.step()
                total += loss.detach().double() * len(idx)
            last = float(total) / len(y)
            bar.update(loss=last)
    return last


class CCVRObjective(ClientObjective[CCVRBroadcast]):
    def __init__(self, model: nn.Module, num_classes: int, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.num_classes = num_classes
        self._head: StateDict | None = None
        self._stats: tuple[torch.Tensor, ...] | None = None

    def begin_round(self, broadcast: CCVRBroadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._head = broadcast.head if isinstance(broadcast, CCVRBroadcast) else None
        self._stats = None

    @torch.no_grad()
    def before_fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        # The received model's features, batch norm with its running statistics (eval mode).
        was_training = self.training
        self.eval()
        zs = [self.represent(x[i : i + 256].to(self.device)).cpu() for i in range(0, len(y), 256)]
        self.train(was_training)
        self._stats = class_stats(torch.cat(zs), y, self.num_classes)

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        assert self._stats is not None, "before_fit did not run"
        means, covs, counts = self._stats
        return extend(update, ClassStatsUpdate, means=means, covs=covs, counts=counts)

    def calibrated(self, z: torch.Tensor) -> torch.Tensor:
        """Logits of the server's calibrated head on the model's features `z`."""
        assert self._head is not None
        head = self.model.get_submodule("head")
        params = {k.removeprefix(HEAD): v.to(z.device) for k, v in self._head.items()}
        return torch.func.functional_call(head, params, (z,))

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        if self._head is None:  # before the first calibration: the FedAvg head alone
            return super().eval_heads()
        return on_shared_features(self.represent, {"": self.calibrated, "fedavg_head": self.classify})


class CCVR(Strategy[CCVRConfig, CCVRState, CCVRBroadcast]):
    reads_each_update = "it reads each client's per-class feature means and covariances"
    objective_cls = CCVRObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return {"num_classes": self.task.num_classes}

    def eval_broadcast(self, state: CCVRState) -> CCVRBroadcast:
        return CCVRBroadcast(round=state.round, global_params=state.global_params, head=state.head)

    def configure_evaluate(self, state: CCVRState, client_ids: Sequence[ClientId]) -> RoundPlan:
        # clients' own test splits are scored with the calibrated head too
        plan = super().configure_evaluate(state, client_ids)
        return dataclasses.replace(plan, broadcast=self.eval_broadcast(state))

    def server_update(
        self, state: CCVRState, updates: Sequence[ClientUpdate], ctx: ServerContext
    ) -> tuple[CCVRState, Metrics]:
        ups = [u for u in updates if isinstance(u, ClassStatsUpdate) and u.counts is not None]
        if not ups or state.global_params is None:
            return state, {}  # nothing to calibrate on: the previous head stays
        mu, cov, total = pool_class_stats(
            [u.means for u in ups if u.means is not None],
            [u.covs for u in ups if u.covs is not None],
            [u.counts for u in ups if u.counts is not None],
        )
        c = self.config
        gen = torch.Generator().manual_seed(int(ctx.rng.integers(2**62)))
        z, y = sample_virtual(mu, cov, total, c.virtual_per_class, gen)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(ctx.rng.integers(2**62)))  # a fresh head's initialisation
            head = ctx.build_model().get_submodule("head")
        if c.init_head == "fedavg":
            head.load_state_dict(
                {k.removeprefix(HEAD): v for k, v in state.global_params.items() if k.startswith(HEAD)}
            )
        head = head.to(ctx.device)
        loss = retrain_head(
            head, z.float().to(ctx.device), y.to(ctx.device), c.retrain_epochs, c.retrain_lr,
            c.retrain_momentum, c.retrain_batch_size, gen,
        )  # fmt: skip
        calibrated = {HEAD + k: v for k, v in to_cpu(head.state_dict()).items()}
        metrics = {"retrain_loss": loss, "virtual_features": float(len(y))}
        return dataclasses.replace(state, head=calibrated), metrics
