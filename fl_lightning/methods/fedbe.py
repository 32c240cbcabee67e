"""FedBE: Chen and Chao, "FedBE: Making Bayesian Model Ensemble Applicable to Federated
Learning", ICLR 2021, https://arxiv.org/abs/2009.01974.

Clients train FedAvg's objective and upload their models. The server builds a Bayesian
model ensemble around the round's FedAvg mean w̄: a diagonal Gaussian with mean w̄ and
variance σ² = Σ_k p_k (w_k − w̄)² (p_k ∝ examples) over every floating weight (batch-norm
statistics: w̄'s), from which it samples `samples` models. The ensemble {w̄, the client
models, the samples} labels the unlabeled server images (`data.server_subset`) with the
mean of its softmax outputs; w̄ is trained on these soft labels (cross entropy) by SGD with
momentum 0.9 for `distill_steps` batches, and the new global model is the stochastic weight
average (SWA) of the iterates after every `swa_every` steps.

Deviation: the paper distils for 20 epochs over its server set (and also offers a
Dirichlet-based ensemble); here the step count is a config value and the Gaussian is the
only ensemble. Sampling draws from the round's server RNG, so a resumed run repeats it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.messages import ClientUpdate
from ..core.objective import is_weight
from ..core.strategy import ServerContext
from ..core.types import Metrics, StateDict
from ..server_steps.distill import batch_indices, distill, ensemble_mean, model_from
from .configs.fedbe import FedBEConfig
from .feddf import ServerDistillation


def gaussian_samples(
    mean: StateDict, clients: Sequence[StateDict], weights: Sequence[float], n: int, g: torch.Generator
) -> list[StateDict]:
    """`n` draws of w̄ + σ·ε, ε ~ N(0, 1), σ² = Σ_k p_k (w_k − w̄)² per floating weight (p
    normalised `weights`); the other entries (BN statistics, counters) are w̄'s."""
    p = torch.tensor(weights, dtype=torch.float64)
    p = p / p.sum()
    std = {}
    for k, v in mean.items():
        if is_weight(k, v):
            var = sum(float(pk) * (c[k] - v) ** 2 for pk, c in zip(p, clients, strict=True))
            std[k] = torch.as_tensor(var).sqrt()
    out = []
    for _ in range(n):
        draw = dict(mean)
        for k, s in std.items():
            draw[k] = mean[k] + s * torch.randn(mean[k].shape, generator=g, dtype=mean[k].dtype)
        out.append(draw)
    return out


class FedBE(ServerDistillation[FedBEConfig]):
    def distil(
        self, mean: StateDict, sent: Sequence[ClientUpdate], ctx: ServerContext, x: torch.Tensor
    ) -> tuple[StateDict, Metrics]:
        c = self.config
        g = torch.Generator().manual_seed(int(ctx.rng.integers(2**62)))
        clients = [u.params for u in sent if u.params is not None]
        drawn = gaussian_samples(mean, clients, [u.num_examples for u in sent], c.samples, g)
        members = [model_from(ctx.build_model, p, ctx.device) for p in [mean, *clients, *drawn]]
        targets = ensemble_mean(members, x, c.distill_batch_size, probs=True)

        def soft_ce(s: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
            return -(q * torch.log_softmax(s, 1)).sum(1).mean()

        student = model_from(ctx.build_model, mean, ctx.device)
        order = batch_indices(len(x), c.distill_batch_size, c.distill_steps, g)
        opt = torch.optim.SGD(student.parameters(), lr=c.distill_lr, momentum=0.9)
        before, after, swa = distill(student, x, targets, order, opt, soft_ce, average_every=c.swa_every)
        final = swa if swa is not None else student.state_dict()  # fewer steps than swa_every: the last
        metrics: Metrics = {"distill_loss_first": before, "distill_loss_last": after}
        return final, {**metrics, "ensemble_size": len(members)}
