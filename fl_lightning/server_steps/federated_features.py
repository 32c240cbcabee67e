"""CReFF's federated features (Shang et al., IJCAI 2022) and CLIP2FL's prototype contrastive
term (CLIP2FL, arXiv:2312.08648).

A linear classifier (W [C, d], b [C]) and, per class c, the gradient of the mean cross-entropy
of features of class c: clients compute it on real features, the server on its synthetic
"federated features" V (m per class, [C·m, d], labels [0]*m + [1]*m + ...), which it moves so
that the two match (cosine distance, row by row), then re-trains a fresh classifier on V.
Pure tensor code: no model, no messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.centralized import torch_threads
from ..core.progress import progress


def class_gradient(weight: Tensor, bias: Tensor, z: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """∇ over (W, b) of mean_i CE(W z_i + b, c), for features `z` [n, d] all of class `c`:
    ((softmax − e_c)ᵀ z / n, mean(softmax − e_c)); differentiable in `z`."""
    err = torch.softmax(z @ weight.T + bias, dim=-1) - F.one_hot(torch.tensor(c), weight.shape[0]).to(z)
    return err.T @ z / len(z), err.mean(0)


def all_class_gradients(weight: Tensor, bias: Tensor, feats: Tensor) -> tuple[Tensor, Tensor]:
    """`class_gradient` of every class at once, for features `feats` [C, m, d] (row c of class c):
    ([C, C, d], [C, C])."""
    num_classes, m = feats.shape[0], feats.shape[1]
    err = torch.softmax(feats @ weight.T + bias, dim=-1) - torch.eye(num_classes).to(feats)[:, None, :]
    return err.transpose(1, 2) @ feats / m, err.mean(1)


def gradient_distance(
    gw: Tensor, gb: Tensor, rw: Tensor, rb: Tensor, with_bias: bool = True, eps: float = 1e-6
) -> Tensor:
    """CReFF's `match_loss` ('ours'), batched over a leading class dimension: per class, the sum
    over the rows j of the weight gradient of 1 − cos(gw[j], rw[j]) (ε in the denominator), plus
    1 − cos of the whole bias gradients (`with_bias`); summed over classes."""
    cos_w = (gw * rw).sum(-1) / (gw.norm(dim=-1) * rw.norm(dim=-1) + eps)
    dist = (1 - cos_w).sum()
    if with_bias:
        dist = dist + (1 - (gb * rb).sum(-1) / (gb.norm(dim=-1) * rb.norm(dim=-1) + eps)).sum()
    return dist


def prototype_contrastive(feats: Tensor, labels: Tensor, text: Tensor, tau: float) -> Tensor:
    """CLIP2FL's prototype contrastive loss as its code computes it (`SupConLoss_text`): with
    a_ic = ⟨v_i, t_c⟩/τ (v unnormalised, t the L2-normalised class text), each anchor i has the
    text of its own class as positive against the texts of the labels of every other feature:
    ℓ_i = −a_{i,y_i} + log Σ_{k≠i} exp(a_{i,y_k}); the mean over anchors with a positive."""
    num_classes = text.shape[0]
    a = feats @ F.normalize(text, dim=-1).T / tau  # [N, C]
    counts = torch.bincount(labels, minlength=num_classes).to(a)
    others = counts[None, :] - F.one_hot(labels, num_classes).to(a)  # k ≠ i, by label
    log_den = torch.logsumexp(a + torch.log(others), dim=1)  # log 0 = -inf drops empty labels
    has_pos = others.gather(1, labels[:, None]).squeeze(1) > 0
    loss = log_den - a.gather(1, labels[:, None]).squeeze(1)
    return loss[has_pos].mean()


@dataclass
class MatchResult:
    features: Tensor  # the moved federated features [C·m, d] (detached)
    match_before: float  # gradient-matching loss at the first step
    match_after: float  # ... with the final features
    pcl_before: float = 0.0
    pcl_after: float = 0.0


def optimise_features(
    features: Tensor,
    weight: Tensor,
    bias: Tensor,
    real_w: Tensor,
    real_b: Tensor,
    present: Tensor,
    steps: int,
    lr: float,
    with_bias: bool = True,
    text: Tensor | None = None,
    pcl_weight: float = 0.0,
    tau: float = 0.1,
) -> MatchResult:
    """`steps` plain SGD steps on the federated features `features` [C·m, d] (m per class, class
    order) of L = Σ_{c present} D(g_c(V), g_c^real) (+ pcl_weight · L_pcl(V, text) when
    pcl_weight > 0), with the classifier (W, b) fixed: the one the clients' gradients
    `real_w` [C, C, d], `real_b` [C, C] were computed with (rows of absent classes ignored)."""
    num_classes = weight.shape[0]
    m = features.shape[0] // num_classes
    labels = torch.arange(num_classes, device=features.device).repeat_interleave(m)
    idx = torch.nonzero(present).squeeze(1)
    use_pcl = pcl_weight > 0 and text is not None

    def losses(v: Tensor) -> tuple[Tensor, Tensor | None]:
        gw, gb = all_class_gradients(weight, bias, v.view(num_classes, m, -1))
        match = gradient_distance(gw[idx], gb[idx], real_w[idx], real_b[idx], with_bias)
        pcl = prototype_contrastive(v, labels, text, tau) if use_pcl and text is not None else None
        return match, pcl

    v = features.detach().clone()
    before: tuple[float, float] | None = None
    with torch_threads(1), progress("federated feature optimisation", steps, "step") as bar:
        for _ in range(steps):
            v.requires_grad_(True)
            match, pcl = losses(v)
            if before is None:
                before = (float(match.detach()), float(pcl.detach()) if pcl is not None else 0.0)
            total = match + pcl_weight * pcl if pcl is not None else match
            (grad,) = torch.autograd.grad(total, v)
            v = (v.detach() - lr * grad).detach()
            bar.update()  # no loss shown: reading it would wait for the GPU every step
    with torch.no_grad(), torch_threads(1):
        match, pcl = losses(v)
    after = (float(match), float(pcl) if pcl is not None else 0.0)
    before = before or after
    return MatchResult(v.detach(), before[0], after[0], before[1], after[1])


def retrain_classifier(
    features: Tensor, num_classes: int, epochs: int, lr: float, batch_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, float]:
    """A fresh Linear(d → C) (PyTorch's default init: U(±1/√d) for W and b, drawn from
    `generator`) trained with cross-entropy on the federated features (labels by block of m),
    `epochs` shuffled passes of plain SGD in batches of `batch_size`. Returns (W, b, the mean
    loss of the last epoch). The gradient of the batch-mean cross-entropy is written out
    ((softmax − onehot)ᵀ x / B): thousands of tiny steps, without autograd's overhead."""
    n, d = features.shape
    dev = features.device
    x = features.detach()
    labels = torch.arange(num_classes, device=dev).repeat_interleave(n // num_classes)
    onehot = F.one_hot(labels, num_classes).to(x)
    bound = 1.0 / math.sqrt(d)
    w = ((torch.rand(num_classes, d, generator=generator) * 2 - 1) * bound).to(x)
    b = ((torch.rand(num_classes, generator=generator) * 2 - 1) * bound).to(x)
    last = 0.0
    with torch_threads(1), progress("classifier re-training", epochs, "epoch") as bar:
        for _ in range(epochs):
            perm = torch.randperm(n, generator=generator).to(dev)
            total = torch.zeros((), dtype=torch.float64, device=dev)
            for i in range(0, n, batch_size):
                sel = perm[i : i + batch_size]
                xb = x[sel]
                logp = torch.log_softmax(xb @ w.T + b, dim=-1)
                err = (logp.exp() - onehot[sel]) / len(sel)
                total -= (logp * onehot[sel]).sum().double()
                w = w - lr * (err.T @ xb)
                b = b - lr * err.sum(0)
            last = float(total) / n
            bar.update(loss=last)
    return w, b, last
