"""Defaults must train: every registered method, at its own defaults (the framework's where
it has none), trains on Fashion-MNIST at Dirichlet 0.1 and 2-class shards without diverging
and without a loss past `LOSS_BOUND` (5 clients, the first 1,000 images, 2 rounds, serial;
the multi-label methods on 150 mosaics at multi-label Dirichlet 0.1). Label skew is where a
too large default diverges (FedAvg's did at 2-class shards), so `make test` runs the most
skewed column, 2-class shards (the multi-label methods, which have no shards: their
Dirichlet 0.1); `FL_LIGHTNING_FULL_GRID=1` adds the IID and Dirichlet 0.1 columns (~5 more
minutes on 2 cores), run before a release: the suite's 15 minutes on 2 cores, of which the
grid was a quarter.

A cell is small, not easy: each client holds ~150 training images, as in 10 clients on
2,000, and takes the local steps a user's client of that size takes; 5 clients instead of 10
halve the cell's time. Too large rates diverge here as on 10 clients and 2,000 images: CReFF
at 3x its lr and CLIP2FL at 30x in round 1 (CLIP2FL's seen on twice its cell's images),
pFedMe at lr 1 and FedTSP at lr 5 by round 2 (FedTSP at 2-class shards to a finite ~1e17,
which the loss bound catches; `test_a_cell_tells_a_too_large_rate`).

Only what a method needs to run at all is added to its defaults: each client's own test
split (personal methods evaluate there), the multi-label variant of Fashion-MNIST for the
multi-label methods (which have no shards: a mosaic holds several classes), a server set for
the distillation methods (100 images). For the suite's time, server-side procedures run
fewer iterations at their default rates (distillation, feature matching, classifier
re-training, prototype and prompt tuning; FedBE's ensemble samples 3 models, not 10), and
CLIP2FL's teacher (built once, on held-out images) is a resnet8 at width 1: how long a
server step runs is not what diverges a client. The client optimiser, local schedule and
every rate are the defaults a user gets. CReFF and CLIP2FL (`MANY_STEPS`: 10 local epochs by
default) train on a quarter of the images (~37 a client): each client still takes 4x the
steps per round of a one-epoch method, and CReFF's 3x too large rate diverges in round 1 as
with 150 (`test_a_cell_tells_a_too_large_rate`).

The 2-class-shard cells of the single-label text methods run a control of `method.targets`
(`CONTROLS`, text/targets.py): fixed vectors in place of the text, so the column shows each
method accepts the switch and trains with it; FedLGT's tables are checked in test_fedlgt.py.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from fl_lightning.config import compose, validate_registered
from fl_lightning.core import progress
from fl_lightning.core.errors import DivergedError
from fl_lightning.methods import METHODS
from fl_lightning.runtime.runner import start_run

SPLITS = {
    "iid": ["data.partition=iid"],
    "dir01": ["data.partition=dirichlet", "data.alpha=0.1"],
    "shards2": ["data.partition=shards", "data.classes_per_client=2"],
}
MULTILABEL_SPLITS = {
    "iid": ["data.partition=iid"],
    "dir01": ["data.partition=multilabel_dirichlet", "data.alpha=0.1"],
}
FULL = os.environ.get("FL_LIGHTNING_FULL_GRID") == "1"
#: a loss past this has blown up, finite or not: at their defaults the losses here stay under
#: 50, but for FedLGT's and FedC-Tran's (~200: BCE summed over a batch's labels, as their code)
LOSS_BOUND = 1e4
MULTILABEL = {"fedlgt", "fedctran"}
#: the cells that take longest (10 local epochs, or C-Tran): scheduled among the long runs
LONG = {"creff", "clip2fl", *MULTILABEL}
#: 10 local epochs by default: a quarter of the images (a too large rate diverges on both)
MANY_STEPS = {"creff", "clip2fl"}
#: what a method needs to run at all, beyond its defaults
NEEDS = {
    "feddf": ["data.server_subset=100", "method.distill_steps=10"],
    "fedbe": ["data.server_subset=100", "method.distill_steps=10", "method.swa_every=5", "method.samples=3"],
    "ccvr": ["method.retrain_epochs=5"],
    "creff": ["method.match_steps=10", "method.retrain_epochs=5"],
    "clip2fl": [
        "method.teacher_epochs=1",
        "method.teacher_holdout_size=500",
        "method.teacher_model_kwargs={scaling: 1}",
        "method.match_steps=10",
        "method.retrain_epochs=5",
    ],  # fmt: skip
    "fedtgp": ["method.server_epochs=10"],
    # the prompt learners' default tower is a random RN50 (real CLIP weights are the user's file):
    # the cell trains the same prompt on open_clip's tiny test ViT (FedOTP needs a ViT)
    **{
        m: ["model.arch=clip-tiny-random"]
        for m in ("promptfl", "zeroshot", "fedotp", "fedtpg", "fedpgp", "dpfpl")
    },
    # the adapter methods' too (model=clip_lora: LoRA on both towers of the tiny ViT)
    **{m: ["model.arch=clip-tiny-random"] for m in ("fedit", "ffa_lora", "flora", "hetlora")},
    "fedtsp": ["method.server_epochs=2"],
}

#: the 2-class-shard cells of the text methods run a `method.targets` control
CONTROLS = {
    "fedglcl": ["method.targets=permuted"],
    "fedtsp": ["method.targets=permuted"],  # tuned through the fixed reassignment
    "feddtr": ["method.targets=centred"],
    "clip2fl": ["method.targets=uniform"],  # its aligned teacher learns the uniform vectors
}


def cases() -> list[tuple[str, str]]:
    out = []
    for m in METHODS.names():
        for split in MULTILABEL_SPLITS if m in MULTILABEL else SPLITS:
            out.append((m, split))
    return out


#: the column `make test` runs (the others before a release: `FL_LIGHTNING_FULL_GRID=1`)
SUITE_SPLIT = {"single": "shards2", "multilabel": "dir01"}


def run_cases() -> list[pytest.ParameterSet]:
    """`cases()` as test parameters: only the `SUITE_SPLIT` column unless FL_LIGHTNING_FULL_GRID=1."""
    out = []
    for m, s in cases():
        marks = [pytest.mark.slow] if m in LONG else []
        if s != SUITE_SPLIT["multilabel" if m in MULTILABEL else "single"] and not FULL:
            marks.append(pytest.mark.skip(reason=f"the {s} column: FL_LIGHTNING_FULL_GRID=1"))
        out.append(pytest.param(m, s, marks=marks))
    return out


def overrides(method: str, split: str, tmp_path) -> list[str]:
    # a mosaic holds up to 4 images and C-Tran is the largest model here: 150 mosaics (~22 to
    # train on a client: one batch a round, of its default size 64), and 60 to test on
    data = ["data=fmnist"]
    if method in MULTILABEL:
        data = ["data=fmnist_multilabel", "data.train_subset=150", "data.test_subset=60"]
    if method in MANY_STEPS:
        data.append("data.train_subset=250")
    splits = MULTILABEL_SPLITS if method in MULTILABEL else SPLITS
    return [
        f"method={method}", "data.train_subset=1000", "data.test_subset=200", *data, *splits[split],
        *NEEDS.get(method, []), *(CONTROLS.get(method, []) if split == "shards2" else []),
        "data.client_test_fraction=0.25",
        "fl.num_clients=5", "fl.rounds=2", "seed=0", "runtime=serial", "logger=none",
        f"output_dir={tmp_path}", "eval.overlap=false",
    ]  # fmt: skip


@pytest.fixture(autouse=True)
def quiet():
    """Progress off, as `fl-lightning run --quiet`: C-Tran's run-time announcement times two
    training steps and an evaluation before round 1 (a quarter of a multi-label cell), which
    is not what a cell tests (test_first_runs.py does)."""
    was = progress.enabled()
    progress.set_enabled(False)
    yield
    progress.set_enabled(was)


def test_every_method_is_in_the_grid():
    names = {m for m, _ in cases()}
    assert names == set(METHODS.names()) and len(names) >= 30


def problem(method: str, split: str, tmp_path, *extra: str) -> str | None:
    """Why the cell's run did not train (it diverged, a loss left `LOSS_BOUND`, no final
    metric), or None when it trained."""
    cfg = compose([*overrides(method, split, tmp_path), *extra])
    validate_registered(cfg)
    try:
        summary, run_dir = start_run(cfg, console=False)
    except DivergedError as e:
        return f"diverged: {e}"
    rounds = int(cfg.fl.rounds)
    if (summary["status"], summary["rounds_completed"], summary["method"]) != ("completed", rounds, method):
        return f"status {summary['status']}, {summary['rounds_completed']} rounds: {summary.get('error')}"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if len(records) != rounds or any(r.get("diverged") for r in records):
        return f"rounds {records}"
    for r in records:
        for key in ("train_loss", "loss"):
            if r.get(key) is not None and not (math.isfinite(r[key]) and abs(r[key]) < LOSS_BOUND):
                return f"round {r['round']}: {key} {r[key]}"
    final = summary[f"final_{summary['primary_metric']}"]  # accuracy, or a multi-label mAP
    return None if final is not None and 0.0 <= final <= 1.0 else f"final metric {final}"


@pytest.mark.parametrize(("method", "split"), run_cases())
def test_trains_at_its_defaults(method, split, tmp_path, data_root):
    assert problem(method, split, tmp_path) is None


@pytest.mark.parametrize(
    ("method", "split", "rate", "why"),
    [
        ("creff", "dir01", "optim.lr=0.3", ("diverged: round",)),
        ("fedtsp", "shards2", "optim.lr=5 fl.rounds=1", ("round 1: train_loss", "diverged: round 1")),
    ],
)
def test_a_cell_tells_a_too_large_rate(method, split, rate, why, tmp_path, data_root):
    """The grid's cells are small (5 clients, 2 rounds), but a default that diverges on a
    user's split diverges in them too: CReFF at 3x its lr turns NaN (in round 1 here), FedTSP
    at 500x its lr blows its loss up without a NaN (to ~6e8 in round 1, ~1e17 in round 2: one
    round here; `LOSS_BOUND` sees it). A float32 blow-up is the CPU's own: on another CPU
    the same run may reach a NaN a round apart or instead of the finite 6e8, and is flagged
    either way."""
    found = problem(method, split, tmp_path, *rate.split())
    assert found is not None and found.startswith(why), found
