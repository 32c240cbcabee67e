"""Server-side ensemble distillation (FedDF, FedBE): a student model is trained on the
server's unlabeled images (`data.server_subset`) toward an ensemble's predictions.

The teacher's outputs are computed once per round over the whole unlabeled set (the
teachers are fixed and in eval mode, so this equals computing them batch by batch); the
student trains in train mode on batches cut from successive random passes over the set,
drawn from a generator seeded by the round's server RNG (a resumed run repeats them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..core.progress import progress
from ..core.types import StateDict

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (student logits, teacher targets)


def model_from(build_model: Callable[[], nn.Module], params: StateDict, device: torch.device) -> nn.Module:
    model = build_model()
    model.load_state_dict(params)
    return model.to(device)


@torch.no_grad()
def ensemble_mean(models: Sequence[nn.Module], x: torch.Tensor, batch_size: int, probs: bool) -> torch.Tensor:
    """The members' mean logits (`probs=False`: FedDF's AVGLOGITS) or mean softmax
    probabilities (`probs=True`: FedBE's pseudo-labels) over `x`, each member in eval mode."""
    device = next(models[0].parameters()).device
    out = []
    for i in range(0, len(x), batch_size):
        xb = x[i : i + batch_size].to(device)
        total = None
        for m in models:
            m.eval()
            y = m(xb)
            y = torch.softmax(y, 1) if probs else y
            total = y if total is None else total + y
        assert total is not None
        out.append(total / len(models))
    return torch.cat(out)


def batch_indices(n: int, batch_size: int, steps: int, generator: torch.Generator) -> torch.Tensor:
    """[steps, batch] indices: successive random permutations of range(n), concatenated and
    cut into full batches (every batch full: batch norm in train mode needs > 1 sample)."""
    passes = math.ceil(steps * batch_size / n)
    stream = torch.cat([torch.randperm(n, generator=generator) for _ in range(passes)])
    return stream[: steps * batch_size].view(steps, batch_size)


def distill(
    student: nn.Module,
    x: torch.Tensor,
    targets: torch.Tensor,
    order: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    loss_fn: Loss,
    average_every: int | None = None,
) -> tuple[float, float, StateDict | None]:
    """Train `student` (train mode) one step per row of `order` on loss_fn(student(x_b),
    targets_b). Returns the first and last step's loss and, with `average_every`, the mean
    of the student's floating weights and buffers after every `average_every`-th step
    (stochastic weight averaging; integer buffers: the last step's)."""
    device = next(student.parameters()).device
    student.train()
    first = last = float("nan")
    avg: StateDict | None = None
    taken = 0
    with progress("server distillation", len(order), "step") as bar:
        for step, idx in enumerate(order, start=1):
            optimizer.zero_grad()
            loss = loss_fn(student(x[idx].to(device)), targets[idx].to(device))
            loss.backward()
            optimizer.step()
            last = float(loss.detach())
            first = last if step == 1 else first
            bar.update(loss=last)
            if average_every and step % average_every == 0:
                taken += 1
                now = {k: v.detach().clone() for k, v in student.state_dict().items()}
                if avg is None:
                    avg = now
                else:
                    for k, v in now.items():
                        avg[k] = avg[k] + (v - avg[k]) / taken if v.is_floating_point() else v
    return first, last, avg
