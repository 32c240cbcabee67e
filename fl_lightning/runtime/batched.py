"""K clients' local training at once (`runtime.batched=K`): their weights stacked along a
client axis, one `vmap(grad(...))` per step over the objective's `masked_terms`
(`core/batched.py`), and plain SGD (the run's lr, momentum, weight decay; a fresh momentum
buffer each round) applied to the stack: the step of `torch.optim.SGD`, written out.

Each client's batches are the ones it draws alone (`host.batch_indices`: same seed, order,
epochs and steps), padded to the batch size with weight 0; a client whose steps have run out
keeps its weights (its step is multiplied by an `active` mask). The whole schedule (indices,
weights, masks) is built before the first step and moved to the device once, and the loop reads
nothing back: on a GPU the steps queue without a host sync until the host copies the results.

Nothing here imports Ray: `ClientHost.fit_many` calls it, in the driver (`SerialExecutor`) or
in a client actor (`RayExecutor`, each actor its share of the round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from ..core.batched import MaskedStep
from ..core.optim import OptimConfig


@dataclass
class Shard:
    """A client's training data (CPU) and its steps: (epoch, example indices) per step."""

    x: torch.Tensor
    y: torch.Tensor
    steps: list[tuple[int, torch.Tensor]]


@dataclass
class Trained:
    """What K clients' stacked training leaves (client axis first).

    Attributes:
        params: the trained parameters, by the objective's parameter names.
        loss_sum: [K] float64, sum over steps of the step's loss x its examples.
        term_sums: each loss term's sums, like `loss_sum`.
        counts: each client's examples over all its steps.
        epoch_sums: the objective's `epoch_sums`, added up over each client's last epoch.
    """

    params: dict[str, torch.Tensor]
    loss_sum: torch.Tensor
    term_sums: dict[str, torch.Tensor]
    counts: list[int]
    epoch_sums: dict[str, torch.Tensor]

    def client(self, k: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], int, dict[str, torch.Tensor]]:
        """Client k's (loss_sum, term_sums, count, epoch_sums): `ClientObjective.end_batched`'s arguments."""
        return (
            self.loss_sum[k],
            {n: v[k] for n, v in self.term_sums.items()},
            self.counts[k],
            {n: v[k] for n, v in self.epoch_sums.items()},
        )


class _Forward(nn.Module):
    """(represent(x), classify(z)) of an objective, for `functional_call` with other weights."""

    def __init__(self, objective: nn.Module) -> None:
        super().__init__()
        self.objective = objective

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obj: Any = self.objective
        z = obj.represent(x)
        return z, obj.classify(z)


def _schedule(
    shards: list[Shard], batch_size: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[bool]]:
    """Every step's padded indices [S, K, B], example weights [S, K, B], active clients [S, K]
    and epoch starts [S, K] (a client's first step of an epoch), on the device; and, read on
    the host, whether each step has every client active."""
    k_clients, steps = len(shards), max((len(s.steps) for s in shards), default=0)
    idx = torch.zeros(steps, k_clients, batch_size, dtype=torch.long)
    w = torch.zeros(steps, k_clients, batch_size, dtype=dtype)
    active = torch.zeros(steps, k_clients, dtype=torch.bool)
    new_epoch = torch.zeros(steps, k_clients, dtype=torch.bool)
    for k, shard in enumerate(shards):
        previous = None
        for t, (epoch, ix) in enumerate(shard.steps):
            idx[t, k, : len(ix)] = ix  # padding points at example 0 (weight 0)
            w[t, k, : len(ix)] = 1
            active[t, k] = True
            new_epoch[t, k] = epoch != previous
            previous = epoch
    return idx.to(device), w.to(device), active.to(device), new_epoch.to(device), active.all(1).tolist()


def _stack_data(shards: list[Shard], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The shards as [K, N_max, ...] tensors (zero rows past a client's own), on the device."""
    n_max = max(len(s.y) for s in shards)
    x0, y0 = shards[0].x, shards[0].y
    xs = torch.zeros(len(shards), n_max, *x0.shape[1:], dtype=x0.dtype)
    ys = torch.zeros(len(shards), n_max, *y0.shape[1:], dtype=y0.dtype)
    for k, s in enumerate(shards):
        xs[k, : len(s.y)] = s.x
        ys[k, : len(s.y)] = s.y
    return xs.to(device), ys.to(device)


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [K] mask shaped to broadcast over a [K, ...] tensor."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


def train_stacked(
    objective: Any,
    starts: list[dict[str, torch.Tensor]],
    shards: list[Shard],
    optim: OptimConfig,
    batch_size: int,
    device: torch.device,
) -> Trained:
    """Train K clients together: client k starts from `starts[k]` (every parameter of
    `objective`, by name) and takes the steps of `shards[k]`. `objective` holds the round's
    shared state (begun for any of the clients, in train mode, on `device`); its own weights are
    not touched. Only its parameters with `requires_grad` are trained, as its optimiser would."""
    trainable = [n for n, p in objective.named_parameters() if p.requires_grad]
    start = {n: torch.stack([s[n] for s in starts]).to(device) for n in starts[0]}
    params = {n: start[n].clone() for n in trainable}
    dtype = next(iter(start.values())).dtype
    idx, w, active, new_epoch, everyone = _schedule(shards, batch_size, device, dtype)
    xs, ys = _stack_data(shards, device)
    xs = xs.to(dtype) if xs.is_floating_point() else xs
    forward = _Forward(objective)

    Tensors = dict[str, torch.Tensor]

    def loss(
        p: Tensors, p0: Tensors, x: torch.Tensor, y: torch.Tensor, wk: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, Tensors, Tensors]]:
        full = {**p0, **p}
        z, logits = functional_call(forward, {f"objective.{n}": v for n, v in full.items()}, (x,))
        step = MaskedStep(full, p0, x, y, wk, z, logits)
        terms = objective.masked_terms(step)
        total = torch.stack(list(terms.values())).sum()
        return total, (total.detach(), {n: v.detach() for n, v in terms.items()}, objective.epoch_sums(step))

    step_grads = vmap(grad(loss, has_aux=True))
    rows = torch.arange(len(shards), device=device)[:, None]
    loss_sum = torch.zeros(len(shards), dtype=torch.float64, device=device)
    term_sums: dict[str, torch.Tensor] = {}
    epoch_sums: dict[str, torch.Tensor] = {}
    momentum: dict[str, torch.Tensor] = {}
    lr, mu, wd = optim.lr, optim.momentum, optim.weight_decay
    for t in range(idx.shape[0]):
        i, wt, on = idx[t], w[t], active[t]
        grads, (total, terms, sums) = step_grads(params, start, xs[rows, i], ys[rows, i], wt)
        n = wt.sum(1).double()
        loss_sum += total.double() * n  # as `training_step`: the loss x the batch's examples
        for name, v in terms.items():
            term_sums[name] = term_sums.get(name, torch.zeros_like(loss_sum)) + v.double() * n
        fresh = ~new_epoch[t]
        for name, v in sums.items():  # from zero where a client starts an epoch (FedProto's reset)
            before = epoch_sums.get(name)
            epoch_sums[name] = v if before is None else before * _expand(fresh, v).to(v.dtype) + v
        with torch.no_grad():  # torch.optim.SGD's step (dampening 0, no Nesterov), in place
            for name in trainable:
                g, p = grads[name], params[name]  # g: this step's own tensor
                if wd != 0:
                    g.add_(p, alpha=wd)
                if mu != 0:  # a client's steps are its first ones: once done, its buffer is unused
                    buf = momentum.get(name)
                    momentum[name] = g = g if buf is None else buf.mul_(mu).add_(g)
                # clients whose steps have run out keep their weights (x 1.0 is exact, x 0.0 adds 0)
                p.add_(g if everyone[t] else g * _expand(on, p).to(g.dtype), alpha=-lr)
    counts = [sum(len(ix) for _, ix in s.steps) for s in shards]
    return Trained(params, loss_sum, term_sums, counts, epoch_sums)
