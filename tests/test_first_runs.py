"""A researcher's first hour (issue 40): the README's first run of each seed method, at the
method's own defaults, is counted against a budget of work stated here, so that a default
that makes a first run take an hour fails a test instead of a new user's afternoon. Not
timed (a busy machine would fail it): counted, from the run's real configuration, data and
partition, with the round loop's own client draw and the hosts' own batch arithmetic
(`runtime/plan.py`; `fit_batches` is checked against the batches a fit really draws).

Units, per run: `steps` the clients' optimiser steps, `images` the images they see, `eval`
the images evaluated, `grads` CReFF's (and CLIP2FL's) per-class gradient batches before each
fit, `teacher` a CLIP2FL teacher build's batches, `server` the server's steps (CReFF's
feature matching and linear re-training, FedTSP's prompt tuning). A C-Tran step costs
~100-1000 CNN steps on a CPU, hence its own small budget.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fl_lightning.config import (
    clients_per_round,
    compose,
    participation,
    validate_registered,
)
from fl_lightning.core.objective import ClientObjective
from fl_lightning.core.strategy import Strategy
from fl_lightning.data.federated import split_from_config
from fl_lightning.data.registry import load_from_config
from fl_lightning.methods import METHODS
from fl_lightning.methods.clip2fl import aligned_config
from fl_lightning.runtime.host import batch_indices, fit_batches
from fl_lightning.runtime.plan import (
    CTRAN_SHORTER,
    WorkPlan,
    announce_client_training,
    plan_of,
    step_seconds,
    work_plan,
)

from .conftest import small

README = Path(__file__).resolve().parents[1] / "README.md"

#: the most work a first run may plan (see the module docstring for the units); a first run
#: above one of these takes more than minutes on a 2-core laptop
_NONE = {"grads": 0, "teacher": 0, "server": 0}
BUDGETS: dict[str, dict[str, int]] = {
    "fedavg": {"steps": 5_000, "images": 300_000, "eval": 50_000, **_NONE},
    "fedglcl": {"steps": 1_000, "images": 60_000, "eval": 50_000, **_NONE},
    "feddtr": {"steps": 1_000, "images": 60_000, "eval": 70_000, **_NONE},
    "fedtsp": {"steps": 2_000, "images": 150_000, "eval": 70_000, **_NONE, "server": 200},
    # the teacher: 15 epochs of ResNet-8 on 5,000 held-out images, announced before it starts
    "clip2fl": {
        "steps": 3_000,
        "images": 100_000,
        "eval": 50_000,
        "grads": 5_000,
        "teacher": 1_200,
        "server": 50_000,
    },
    "fedlgt": {"steps": 60, "images": 4_000, "eval": 4_000, **_NONE},
}


def readme_first_runs() -> dict[str, list[str]]:
    """The first `fl-lightning run method=<name> ...` line of the README for each method
    (its overrides), comments cut."""
    runs: dict[str, list[str]] = {}
    for line in README.read_text().replace("\\\n", " ").splitlines():  # continued lines joined
        m = re.match(r"\s*fl-lightning run (method=(\w+).*)", line)
        if m and m.group(2) not in runs:
            runs[m.group(2)] = shlex.split(m.group(1).split("#")[0])
    return runs


def method_work(method_cfg: Any, cfg: Any, plan: WorkPlan, num_classes: int) -> dict[str, int]:
    """The seed methods' work beside the clients' steps, from their config (module docstring)."""
    c, name, rounds = method_cfg, cfg.method.name, int(cfg.fl.rounds)
    work = {"grads": 0, "teacher": 0, "server": 0}
    if name in ("creff", "clip2fl"):
        features = num_classes * c.num_features
        work["grads"] = plan.fits * c.grad_repeats * num_classes  # at most, per class a client holds
        work["server"] = rounds * (
            c.match_steps + c.retrain_epochs * math.ceil(features / c.retrain_batch_size)
        )
    if name == "clip2fl" and c.teacher == "aligned":  # built on first use (then cached)
        t = aligned_config(c)
        held = t.holdout_size or 60_000 - t.holdout_from  # Fashion-MNIST's 60,000 training images
        work["teacher"] = t.epochs * math.ceil(held / t.batch_size)
    if name == "fedtsp" and c.tune_prompts:
        work["server"] = rounds * c.server_epochs
    return work


def first_run_work(args: list[str], loaded: tuple[Any, Any] | None = None) -> dict[str, int]:
    """What the run `args` plans, counted without running it (nor building its method: a
    CLIP2FL would build its teacher); `loaded`: its (dataset, split) if already at hand."""
    cfg = compose(args)
    method_cfg = validate_registered(cfg)  # every check a run makes before its data
    cls = METHODS.get(cfg.method.name)
    # the counts below read the base class's client draw and one phase: true of these methods
    assert cls.sample_clients is Strategy.sample_clients and cls.configure_round is Strategy.configure_round
    assert cls.objective_cls.phases is ClientObjective.phases and cfg.fl.sampling == "uniform"
    data = load_from_config(cfg.data) if loaded is None else loaded[0]
    split = split_from_config(data, cfg) if loaded is None else loaded[1]
    draw = SimpleNamespace(  # what Strategy.sample_clients reads, set as build.prepare sets it
        clients_per_round=clients_per_round(cfg), participation=participation(cfg),
        num_clients=int(cfg.fl.num_clients), sample_weights=None, poisson_rate=None,
    )  # fmt: skip
    plan = work_plan(
        cfg, [len(t) for t in split.train], [len(t) for t in split.test], len(data.test_y),
        lambda rnd, rng: Strategy.sample_clients(draw, rnd, rng),  # type: ignore[arg-type]
        [(int(cfg.fl.local_epochs), cfg.fl.local_steps)],
    )  # fmt: skip
    return {
        "steps": plan.client_steps,
        "images": plan.client_images,
        "eval": plan.eval_images,
        **method_work(method_cfg, cfg, plan, data.num_classes),
    }


def test_the_readme_has_a_first_run_for_every_seed_method():
    assert set(BUDGETS) <= set(readme_first_runs())
    assert "C-Tran" in README.read_text() and "data.train_subset" in CTRAN_SHORTER


@pytest.mark.parametrize("method", sorted(BUDGETS))
def test_first_run_stays_within_its_budget(method, data_root):
    work = first_run_work(readme_first_runs()[method])
    over = {k: f"{v} > {BUDGETS[method][k]}" for k, v in work.items() if v > BUDGETS[method][k]}
    assert not over, f"{method}'s README first run plans more work than its budget: {over}"
    assert work["steps"] > 0 and work["eval"] > 0  # a run that trains and is evaluated


@pytest.mark.parametrize(
    ("n", "batch", "epochs", "steps"),
    [(300, 64, 1, None), (257, 64, 2, None), (65, 64, 3, None), (1, 8, 2, None), (0, 8, 2, None),
     (100, 32, 1, 7), (100, 32, 5, 3), (129, 64, 1, 10), (64, 64, 4, None)],
)  # fmt: skip
def test_fit_batches_are_the_batches_a_fit_draws(n, batch, epochs, steps):
    """`fit_batches` (the plan's count) against `batch_indices` (the batches a fit draws,
    which the batched path trains on and test_batched checks against a Lightning fit)."""
    drawn = batch_indices(n, batch, seed=3, epochs=epochs, steps=steps)
    assert fit_batches(n, batch, epochs, steps) == [len(idx) for _, idx in drawn]


def test_c_tran_on_a_cpu_says_how_long_its_rounds_take_before_they_start(
    tmp_path, data_root, monkeypatch, capsys
):
    """Before round 1 (in `prepare`), a C-Tran run on the CPU times a step and an evaluation
    and says how long its rounds will take and what shortens them; the timing works on a copy
    (the run's weights and torch's random stream stay as they were); `--quiet`, or a run too
    small to pass 30 s (the tests' own), times nothing. Also: the count the first-run budgets
    use (the base client draw, one phase) is `plan_of` a prepared run, here with 2 of 3
    clients a round and local steps."""
    from fl_lightning.core import centralized, progress
    from fl_lightning.runtime import plan as plan_module
    from fl_lightning.runtime.build import prepare

    args = small(tmp_path, "data=fmnist_multilabel", "model=ctran", "data.train_subset=120",
                 "data.test_subset=40", "fl.num_clients=3", "fl.clients_per_round=2", "fl.local_steps=3",
                 "fl.batch_size=16", "model.layers=1", "data.image_size=28", "method=fedlgt",
                 "runtime=serial")  # fmt: skip
    monkeypatch.setattr(progress, "_enabled", True)  # an earlier `run --quiet` in this process: off
    monkeypatch.setattr(centralized, "ANNOUNCE_ABOVE_S", -1.0)  # every estimate is announced
    monkeypatch.setattr(plan_module, "MIN_TIMED_IMAGES", 0)  # however small the run
    announced = prepare(compose(args))
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("client training (C-Tran")]
    plan = plan_of(announced)
    assert plan.client_steps == plan.fits * 3 and plan.fits == 2 * int(announced.cfg.fl.rounds)
    # resumed after round 1 (`resume_run` prepares with first_round=2): the rounds left
    assert prepare(compose(args), first_round=2) and plan_of(announced, 2).fits == plan.fits - 2
    assert f"{plan_of(announced, 2).client_steps} steps" in capsys.readouterr().err
    assert len(lines) == 1 and f"{plan.client_steps} steps of batch 16" in lines[0], lines
    assert f"{plan.eval_images} images evaluated" in lines[0] and lines[0].endswith(CTRAN_SHORTER)
    counted = first_run_work(args, (announced.dataset, announced.split))
    assert (counted["steps"], counted["images"], counted["eval"]) == (
        plan.client_steps, plan.client_images, plan.eval_images
    )  # fmt: skip

    # the timing works on a copy: weights, batch-norm statistics and torch's stream stay
    before = {k: v.clone() for k, v in announced.objective.state_dict().items()}
    rng = torch.get_rng_state()
    step_s, image_s = step_seconds(announced, threads=1)
    assert step_s > 0 and image_s > 0 and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in announced.objective.state_dict().items())
    monkeypatch.setattr(progress, "_enabled", False)  # --quiet: nothing timed, nothing said
    announce_client_training(announced)
    assert "C-Tran" not in capsys.readouterr().err
    monkeypatch.setattr(progress, "_enabled", True)
    monkeypatch.setattr(plan_module, "MIN_TIMED_IMAGES", plan.client_images + plan.eval_images + 1)
    announce_client_training(announced)  # too small to be long
    assert "C-Tran" not in capsys.readouterr().err
