"""Prototype procedures on the driver: aggregating per-class means from clients (FedProto,
FedDistill, FedTSP) and FedTGP's trainable global prototypes with an adaptive margin.

    means, counts = aggregate_class_means([P_0, P_1], [n_0, n_1], weighting="count")
    gen, protos, loss = train_global_prototypes(gen_params, uploads, margin, ...)   # FedTGP
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..core.centralized import torch_threads
from ..core.progress import progress
from ..core.types import StateDict


def aggregate_class_means(
    means: Sequence[torch.Tensor], counts: Sequence[torch.Tensor], weighting: str = "count"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class, the mean over the clients that hold it of their class means [C, D]:
    weighted by their class counts (`count`, Eq. 6 of FedTSP up to a scale) or not
    (`uniform`, the FedProto/FedTGP/FedTSP code). Classes nobody holds stay zero.
    Returns the means [C, D] and the total counts [C]. Sums in float64, in the order given."""
    if not means:
        raise ValueError("no class means to aggregate")
    if weighting not in ("count", "uniform"):
        raise ValueError(f"weighting={weighting!r}: expected count or uniform")
    n = torch.stack([c.double() for c in counts])  # [K, C]
    w = n if weighting == "count" else (n > 0).double()
    summed = sum(m.double() * wk[:, None] for m, wk in zip(means, w, strict=True))
    mean = summed / w.sum(0).clamp(min=1e-12)[:, None]
    return mean.float(), n.sum(0).round().long()


# --- FedTGP ------------------------------------------------------------------------------
class TrainablePrototypes(nn.Module):
    """FedTGP's generator: class embedding → Linear + ReLU → Linear (the authors' code)."""

    def __init__(self, num_classes: int, dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or dim
        self.embeddings = nn.Embedding(num_classes, dim)
        self.middle = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.fc = nn.Linear(hidden, dim)

    def forward(self, classes: torch.Tensor | None = None) -> torch.Tensor:
        ids = (
            classes
            if classes is not None
            else torch.arange(self.embeddings.num_embeddings, device=self.fc.weight.device)
        )
        return self.fc(self.middle(self.embeddings(ids)))


def init_prototype_generator(num_classes: int, dim: int, seed: int) -> StateDict:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {k: v.detach().clone() for k, v in TrainablePrototypes(num_classes, dim).state_dict().items()}


def class_gaps(means: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """FedTGP's class-wise minimum distance: for each present class, the smallest L2
    distance from its (unweighted) average prototype to another present class's; classes
    with none (absent, or the only one) get the smallest gap found."""
    idx = present.nonzero().squeeze(1)
    gap = torch.full((len(means),), float("inf"), dtype=means.dtype)
    if len(idx) > 1:
        d = torch.cdist(means[idx].double(), means[idx].double()).to(means.dtype)
        d.fill_diagonal_(float("inf"))
        gap[idx] = d.min(1).values
    finite = gap[torch.isfinite(gap)]
    fill = finite.min() if len(finite) else torch.tensor(0.0, dtype=means.dtype)
    return torch.where(torch.isfinite(gap), gap, fill)


def adaptive_margin_loss(
    protos: torch.Tensor, y: torch.Tensor, centers: torch.Tensor, margin: float
) -> torch.Tensor:
    """CE over negative L2 distances to the global prototypes, the true class's distance
    increased by `margin` (FedTGP's adaptive-margin-enhanced contrastive loss)."""
    dist = (
        (protos.pow(2).sum(1, keepdim=True) - 2 * protos @ centers.T + centers.pow(2).sum(1)[None])
        .clamp(min=0)
        .sqrt()
    )
    dist = dist + F.one_hot(y, centers.shape[0]).to(dist) * margin
    return F.cross_entropy(-dist, y)


def train_global_prototypes(
    params: StateDict,
    protos: torch.Tensor,
    labels: torch.Tensor,
    margin: float,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    device: str | torch.device = "cpu",
) -> tuple[StateDict, torch.Tensor, float]:
    """`epochs` passes of SGD (rebuilt every round, as in the authors' code) over the
    uploaded client prototypes `protos` [K, D] with classes `labels` [K], shuffled with
    `seed`. Returns the generator's new weights, the global prototypes [C, D] and the last
    batch's loss."""
    with torch_threads(1):  # tiny ops: see `core.centralized.torch_threads`
        return _train_global_prototypes(params, protos, labels, margin, epochs, batch_size, lr, seed, device)


def _train_global_prototypes(
    params: StateDict, protos: torch.Tensor, labels: torch.Tensor, margin: float, epochs: int,
    batch_size: int, lr: float, seed: int, device: str | torch.device,
) -> tuple[StateDict, torch.Tensor, float]:  # fmt: skip
    num_classes, dim = params["embeddings.weight"].shape
    hidden = params["middle.0.weight"].shape[0]
    gen = TrainablePrototypes(num_classes, dim, hidden).to(device)
    gen.load_state_dict(params)
    opt = torch.optim.SGD(gen.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    protos, labels = protos.to(device), labels.to(device)
    loss = torch.zeros(())
    gen.train()
    with progress("global prototype training", epochs, "epoch") as bar:
        for _ in range(epochs):
            order = torch.randperm(len(labels), generator=g).to(device)
            for i in range(0, len(order), batch_size):
                b = order[i : i + batch_size]
                loss = adaptive_margin_loss(protos[b], labels[b], gen(), margin)
                opt.zero_grad()
                loss.backward()
                opt.step()
            bar.update()
    gen.eval()
    with torch.no_grad():
        out = gen().cpu()
    return {k: v.detach().cpu().clone() for k, v in gen.state_dict().items()}, out, float(loss.detach())
