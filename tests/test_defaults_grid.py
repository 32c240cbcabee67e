"""Defaults must train: every registered method, at its own defaults (the framework's where
it has none), trains without diverging on Fashion-MNIST at IID, Dirichlet 0.1 and 2-class
shards (10 clients, the first 2,000 images, 2 rounds, serial; the multi-label methods on 500
mosaics at IID and multi-label Dirichlet 0.1).

Only what a method needs to run at all is added to its defaults: each client's own test split
(personal methods evaluate there), the multi-label variant of Fashion-MNIST for the
multi-label methods (which have no shards: a mosaic holds several classes), a server set for
the distillation methods. For the suite's time, server-side procedures run fewer iterations
at their default rates (distillation, feature matching, classifier re-training, prototype and
prompt tuning), and CLIP2FL's teacher (built once, on held-out images) is small: how long a
server step runs is not what diverges a client. The client optimiser, local schedule and
every rate are the defaults a user gets. CReFF and CLIP2FL (`MANY_STEPS`: 10 local epochs by
default) train on the first 1,000 images: each of their clients still takes 6x the steps per
round of a one-epoch method on 2,000, and a 3x too large rate (CReFF at lr 0.3) diverges in
round 1 on 1,000 images as on 2,000. Not so FedTSP (5 local epochs) and pFedMe (5 inner steps):
at too large rates (FedTSP at lr 5, pFedMe at lr 1) they diverge on 2,000 images but stay
finite on 1,000, so they keep 2,000.
CLIP2FL's teacher is a resnet8 at width 1.
"""

from __future__ import annotations

import json
import math

import pytest

from fl_lightning.config import compose, validate_registered
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
MULTILABEL = {"fedlgt", "fedctran"}
#: 10 local epochs by default: half the images (a too large rate diverges on both)
MANY_STEPS = {"creff", "clip2fl"}
#: what a method needs to run at all, beyond its defaults
NEEDS = {
    "feddf": ["data.server_subset=500", "method.distill_steps=20"],
    "fedbe": ["data.server_subset=500", "method.distill_steps=20", "method.swa_every=5"],
    "ccvr": ["method.retrain_epochs=20"],
    "creff": ["method.match_steps=10", "method.retrain_epochs=5"],
    "clip2fl": [
        "method.teacher_epochs=1",
        "method.teacher_holdout_size=500",
        "method.teacher_model_kwargs={scaling: 1}",
        "method.match_steps=10",
        "method.retrain_epochs=5",
    ],  # fmt: skip
    "fedtgp": ["method.server_epochs=10"],
    "fedtsp": ["method.server_epochs=5"],
}


def cases() -> list[tuple[str, str]]:
    out = []
    for m in METHODS.names():
        for split in MULTILABEL_SPLITS if m in MULTILABEL else SPLITS:
            out.append((m, split))
    return out


def overrides(method: str, split: str, tmp_path) -> list[str]:
    # a mosaic holds up to 4 images and C-Tran is the largest model here: 500 mosaics
    data = ["data=fmnist_multilabel", "data.train_subset=500"] if method in MULTILABEL else ["data=fmnist"]
    if method in MANY_STEPS:
        data.append("data.train_subset=1000")
    splits = MULTILABEL_SPLITS if method in MULTILABEL else SPLITS
    return [
        f"method={method}", "data.train_subset=2000", *data, *splits[split], *NEEDS.get(method, []),
        "data.test_subset=500", "data.client_test_fraction=0.25",
        "fl.num_clients=10", "fl.rounds=2", "seed=0", "runtime=serial", "logger=none",
        f"output_dir={tmp_path}", "eval.overlap=false",
    ]  # fmt: skip


def test_every_method_is_in_the_grid():
    names = {m for m, _ in cases()}
    assert names == set(METHODS.names()) and len(names) >= 30


#: the cells that take longest (10 local epochs, or C-Tran): scheduled among the long runs
LONG = {"creff", "clip2fl", *MULTILABEL}


@pytest.mark.parametrize(
    ("method", "split"),
    [pytest.param(m, s, marks=[pytest.mark.slow] if m in LONG else []) for m, s in cases()],
)
def test_trains_at_its_defaults(method, split, tmp_path, data_root):
    cfg = compose(overrides(method, split, tmp_path))
    validate_registered(cfg)
    summary, run_dir = start_run(cfg, console=False)
    assert summary["status"] == "completed", summary
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and not any(r.get("diverged") for r in records)
    for r in records:
        for key in ("train_loss", "loss"):
            if r.get(key) is not None:
                assert math.isfinite(r[key]), (key, r)
    metric = summary["primary_metric"]
    assert summary[f"final_{metric}"] is not None and math.isfinite(summary[f"final_{metric}"])
