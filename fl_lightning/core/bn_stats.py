"""Federated batch-norm statistics (`fl.bn_stats=recompute`).

Averaging clients' running statistics mixes statistics of different data (each client's
own classes) measured under different weights (each client's drifted model); under strong
label skew the averaged variance can be several times the averaged model's real activation
variance. Recomputing them: after aggregation every sampled client runs one forward-only
pass of the new global model over its training data, with batch norm normalising by batch
statistics as in training, and sends per layer and channel the count, the sum and the sum
of squares of the layer's inputs; the server forms the pooled mean and variance exactly:

    mean = Σ_k s1_k / Σ_k n_k,   var = (Σ_k s2_k / Σ_k n_k − mean²) · N / (N − 1)

(the unbiased variance, as PyTorch keeps `running_var`). No data leaves a client; the
upload is 2·C + 1 numbers per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .types import ClientId, StateDict


@dataclass
class BNStats:
    """One client's sums per batch-norm layer (by module name); float64."""

    client_id: ClientId
    count: dict[str, torch.Tensor] = field(default_factory=dict)  # [] samples (per channel: × spatial)
    sum: dict[str, torch.Tensor] = field(default_factory=dict)  # [C]
    sum_sq: dict[str, torch.Tensor] = field(default_factory=dict)  # [C]


def batchnorm_layers(model: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}


@torch.no_grad()
def collect_bn_stats(
    model: nn.Module,
    forward: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    batch_size: int,
    client_id: ClientId,
) -> BNStats:
    """Sums of every batch-norm layer's inputs over (x), batches in order, in training mode
    (batch statistics normalise, as in local training). Leaves the model's mode, running
    statistics and parameters as they were."""
    layers = batchnorm_layers(model)
    out = BNStats(client_id)
    saved = {n: (m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
             for n, m in layers.items() if m.running_mean is not None and m.running_var is not None
             and m.num_batches_tracked is not None}  # fmt: skip
    was_training = model.training

    def hook(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def pre(_: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            a = inputs[0].detach().double()
            dims = [0, *range(2, a.dim())]  # every axis but the channel
            n = torch.tensor(float(a.numel() // a.shape[1]), dtype=torch.float64)
            s1, s2 = a.sum(dims).cpu(), (a * a).sum(dims).cpu()
            if name in out.count:
                out.count[name] += n
                out.sum[name] += s1
                out.sum_sq[name] += s2
            else:
                out.count[name], out.sum[name], out.sum_sq[name] = n, s1, s2

        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in layers.items()]
    try:
        model.train()
        device = next(model.parameters()).device
        for i in range(0, len(x), batch_size):
            forward(x[i : i + batch_size].to(device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
        for n, (mean, var, nbt) in saved.items():
            m = layers[n]
            assert (
                m.running_mean is not None and m.running_var is not None and m.num_batches_tracked is not None
            )
            m.running_mean.copy_(mean)
            m.running_var.copy_(var)
            m.num_batches_tracked.copy_(nbt)
    return out


def pooled_bn_params(stats: list[BNStats], params: StateDict) -> StateDict:
    """`params` with every batch-norm layer's running mean and variance replaced by the
    pooled statistics of `stats` (layers no client measured keep theirs)."""
    new = dict(params)
    if not stats:
        return new
    for name in stats[0].count:
        n, s1, s2 = stats[0].count[name].clone(), stats[0].sum[name].clone(), stats[0].sum_sq[name].clone()
        for s in stats[1:]:  # in client-id order (callers sort): the same bits in every executor
            n, s1, s2 = n + s.count[name], s1 + s.sum[name], s2 + s.sum_sq[name]
        mean = s1 / n
        var = (s2 / n - mean * mean).clamp(min=0) * (n / (n - 1) if float(n) > 1 else 1.0)
        key = f"{name}.running_mean" if name else "running_mean"
        if key in new:
            new[key] = mean.to(new[key].dtype)
            vkey = key.replace("running_mean", "running_var")
            new[vkey] = var.to(new[vkey].dtype)
    return new


def bn_stats_nbytes(stats: BNStats) -> int:
    return sum(
        t.numel() * t.element_size() for d in (stats.count, stats.sum, stats.sum_sq) for t in d.values()
    )
