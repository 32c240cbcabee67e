"""The work a run will do, counted before it starts: who takes part in each round (the
strategy's own draw from (seed, round), as the round loop makes it), each client's shard and
each phase's length give every client fit's batches, as the hosts run them (`fit_batches`).

`announce_client_training` multiplies that count by a timed step where one step is slow
(C-Tran on a CPU) and says before round 1 how long the clients' training will take and the
flags that shorten it, as a teacher build does (`core/centralized.py`). The first-run test
(`tests/test_first_runs.py`) counts the README's first runs with `work_plan`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.centralized import StepTimer, announce_long, cores_given, torch_threads
from ..core.objective import ClientObjective
from ..core.progress import enabled
from ..core.strategy import round_rng
from ..core.types import ClientId
from ..models import traits
from .host import fit_batches

if TYPE_CHECKING:
    from .build import Prepared  # build.prepare calls this module: no import back at run time

#: what shortens a C-Tran run on a CPU
CTRAN_SHORTER = (
    "shorter: data.train_subset=<images> / data.test_subset=<images> or fl.rounds=<n>, or runtime=gpu"
)


#: fewer images than this (trained, plus evaluated) are not timed: C-Tran trains ~0.05 s an
#: image on 2 cores, so such a run stays near `ANNOUNCE_ABOVE_S`, and the tests' tiny C-Tran
#: runs start without the timing's seconds
MIN_TIMED_IMAGES = 500


@dataclass(frozen=True)
class WorkPlan:
    """A run's client training and evaluation, counted."""

    fits: int  # client fits (one per client and round it takes part in)
    client_steps: int  # their optimiser steps, every phase
    client_images: int  # the images those steps see, with repeats
    eval_images: int  # images evaluated: the global test set and the clients' own test splits


def phase_lengths(
    objective: ClientObjective[Any], epochs: int, steps: int | None
) -> list[tuple[int | None, int | None]]:
    """(epochs, steps) of each of the objective's phases, the run's `fl.local_*` where a phase
    names none (as the host's trainer reads them)."""
    return [
        (p.epochs, p.steps) if (p.epochs, p.steps) != (None, None) else (epochs, steps)
        for p in objective.phases()
    ]


def work_plan(
    cfg: Any,
    train_sizes: Sequence[int],
    test_sizes: Sequence[int],
    test_images: int,
    sample: Callable[[int, np.random.Generator], list[ClientId]],
    phases: Sequence[tuple[int | None, int | None]],
    first_round: int = 1,
) -> WorkPlan:
    """The work of rounds `first_round`..`fl.rounds`: `train_sizes` / `test_sizes` are the
    clients' shards and own test splits, `test_images` the global test set, `sample` the
    strategy's `sample_clients`, `phases` from `phase_lengths`."""
    rounds, bs = int(cfg.fl.rounds), int(cfg.fl.batch_size)
    fits = steps = images = evaluated = 0
    for rnd in range(first_round, rounds + 1):
        for cid in sample(rnd, round_rng(int(cfg.seed), rnd)):
            fits += 1
            for epochs, local_steps in phases:
                batches = fit_batches(train_sizes[cid], bs, epochs, local_steps)
                steps, images = steps + len(batches), images + sum(batches)
        if rnd % int(cfg.eval.every) == 0 or rnd == rounds:  # as steps/evaluation.py evaluates
            evaluated += test_images + (sum(test_sizes) if cfg.eval.clients else 0)
    return WorkPlan(fits, steps, images, evaluated)


def plan_of(prep: Prepared, first_round: int = 1) -> WorkPlan:
    """`work_plan` of a prepared run, from round `first_round` (a resumed run: what is left)."""
    s = prep.spec
    return work_plan(
        prep.cfg,
        [len(t) for t in prep.split.train],
        [len(t) for t in (prep.split.test or [])],
        len(prep.dataset.test_y),
        prep.strategy.sample_clients,
        phase_lengths(prep.objective, s.local_epochs, s.local_steps),
        first_round,
    )


def step_seconds(prep: Prepared, threads: int, timed: int = 1) -> tuple[float, float]:
    """(seconds of a training step, seconds of evaluating one image) of the run's model on a
    batch of client 0's images, timed in this process on `threads` threads after a warm-up
    step, on a copy: the run's weights and random streams are untouched."""
    ds, bs = prep.dataset, prep.spec.batch_size
    idx = prep.split.train[0][:bs]
    x, y = ds.tensors(ds.train_x[idx], ds.train_y[idx])
    with torch_threads(threads), torch.random.fork_rng(devices=[]):
        obj = copy.deepcopy(prep.objective).train()
        opt = torch.optim.SGD(obj.parameters(), lr=0.0)
        timer, step_s = StepTimer(timed), None
        while step_s is None:
            loss = torch.stack(list(obj.loss_terms((x, y)).values())).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step_s = timer.step()
        obj.eval()
        timer, eval_s = StepTimer(timed), None
        with torch.no_grad():
            while eval_s is None:
                obj.model(x)
                eval_s = timer.step()
    return step_s, eval_s / len(y)


def announce_client_training(prep: Prepared, first_round: int = 1) -> None:
    """A model whose step is slow on a CPU (its `ModelTraits.slow_on_cpu`: C-Tran, 3.5-14 s a
    step at batch 64 on 2 shared cores): before the first round, how long the clients' training
    and the evaluations will take, from `plan_of` and a timed step of each, once that passes
    `ANNOUNCE_ABOVE_S`. Other models' steps are fast enough to go untimed; with progress off
    (`--quiet`) nothing is timed.
    `first_round`: a resumed run announces the rounds it has left."""
    name = traits(prep.spec.model).slow_on_cpu  # the model's own trait: C-Tran's step
    if not name or not enabled() or not prep.split.train or not len(prep.split.train[0]):
        return
    plan = plan_of(prep, first_round)
    if plan.client_images + plan.eval_images < MIN_TIMED_IMAGES:
        return
    threads = min(torch.get_num_threads(), cores_given())
    step_s, image_s = step_seconds(prep, threads)
    announce_long(
        f"client training ({name} on the CPU)",
        plan.client_steps * step_s + plan.eval_images * image_s,
        f"{plan.client_steps} steps of batch {prep.spec.batch_size} at {step_s:.2f} s and "
        f"{plan.eval_images} images evaluated, timed here on {threads} threads; Ray's actors share them",
        CTRAN_SHORTER,
    )
