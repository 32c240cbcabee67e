"""Every preset on the data a fresh checkout has (Fashion-MNIST and its stand-ins) runs as its
header documents (`fl-lightning run +experiment=<name>`), shrunk only in size: one round on
1,000 images, one local epoch, serial, with CLIP2FL's teacher and the server steps small. One
preset per seed method (FedGLCL, CLIP2FL, FedLGT, FedDTR, FedTSP) is among them."""

import json

import pytest

from fl_lightning.cli.main import main

SMALLER = ["fl.rounds=1", "data.train_subset=1000", "data.test_subset=200", "fl.local_epochs=1",
           "runtime=serial", "logger=none", "eval.every=1"]  # fmt: skip
PRESETS = {
    "demo": [],
    "fedglcl_table2_fmnist": [],
    # kept at 2,000 images: a long tail over 20 clients, and its teacher's held-out images after them
    "clip2fl_fmnist_lt": ["data.train_subset=2000", "method.teacher_holdout_from=2000",
                          "method.teacher_holdout_size=200", "method.teacher_epochs=1",
                          "method.teacher_model_kwargs.scaling=1",
                          "method.match_steps=2", "method.retrain_epochs=2", "method.grad_repeats=1"],
    # C-Tran, 0.25 CPU-s a step: ~10 mosaics a client (one step), 60 to test
    "fedlgt_fmnist_multilabel": ["data.train_subset=200", "data.min_size=4", "data.test_subset=60"],
    "feddtr_fmnist": [],
    "fedtsp_fmnist": ["method.server_epochs=1"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_runs_as_documented(name, tmp_path, data_root, monkeypatch, capsys):
    monkeypatch.setenv("FL_LIGHTNING_TEACHER_CACHE", str(tmp_path / "teachers"))
    args = ["run", "--quiet", f"+experiment={name}", *SMALLER, *PRESETS[name], f"output_dir={tmp_path}"]
    assert main(args) == 0, capsys.readouterr().err
    (run_dir,) = (tmp_path / name).iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    metric = summary["primary_metric"]
    assert summary["status"] == "completed" and summary["experiment"] == name
    assert 0.0 < summary[f"final_{metric}"] <= 1.0, summary  # finite, not a broken run
