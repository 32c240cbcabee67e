"""Long steps show their progress (`core.progress`): a line per N seconds with the time left
where stderr is not a terminal, a tqdm bar where it is; nothing with `--quiet`. Each step
is run for real, tiny, with `$FL_LIGHTNING_PROGRESS_EVERY_S=0` (a line per step)."""

import io
import os
import re
import select

import numpy as np
import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.core import progress as progress_mod
from fl_lightning.core.progress import Progress, duration, progress

from .conftest import small


@pytest.fixture(autouse=True)
def progress_on(monkeypatch):
    """Progress on: a `--quiet` run earlier in this process (another test) turns it off."""
    monkeypatch.setattr(progress_mod, "_enabled", True)


@pytest.fixture
def every_step(monkeypatch):
    """A line per step."""
    monkeypatch.setenv("FL_LIGHTNING_PROGRESS_EVERY_S", "0")


def _lines(text, what):
    return [line for line in text.splitlines() if line.startswith(f"{what}: ")]


def test_lines_count_the_steps_and_the_time_left():
    out = io.StringIO()
    with progress("toy", 4, "batch", stream=out, every_s=0) as bar:
        for i in range(4):
            bar.update(loss=1.0 / (i + 1))
    lines = out.getvalue().splitlines()
    assert [re.match(r"toy: (\d)/4 batch(es)? \((\d+)%\)", x).group(1) for x in lines[:4]] == [
        "1",
        "2",
        "3",
        "4",
    ]
    assert "loss 0.25" in lines[3] and "spent" in lines[3] and "~0s left" in lines[3]
    assert re.fullmatch(r"toy: done, 4 batches in \d+s", lines[4])
    assert len(lines) == 5

    quiet = io.StringIO()  # a step quicker than the delay and the interval: no line at all
    with progress("quick", 3, stream=quiet, every_s=30, delay_s=2) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""

    failed = io.StringIO()
    with pytest.raises(ValueError), progress("broken", 10, stream=failed, every_s=0) as bar:
        bar.update()
        raise ValueError
    assert failed.getvalue().splitlines()[-1].startswith("broken: stopped, 1 step in")
    assert (duration(42), duration(185), duration(3720)) == ("42s", "3m05s", "1h02m")


def test_a_terminal_gets_a_tqdm_bar():
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0x0
    with os.fdopen(slave, "w") as tty:
        bar = Progress("on a terminal", 5, "step", stream=tty, delay_s=0)
        for _ in range(5):
            bar.update()
        bar.close()
        tty.flush()
        assert select.select([master], [], [], 10)[0], "nothing written to the terminal"  # no hang
        # the kernel hands a pty's output to its master side asynchronously: under load a first
        # read may hold only the first write, so read until nothing more comes for a second
        shown = ""
        while select.select([master], [], [], 1)[0] and len(shown) < 65536:
            shown += os.read(master, 65536).decode(errors="replace")
    os.close(master)
    assert "on a terminal:" in shown and "/5 [" in shown and "step/s" in shown  # tqdm's bar
    assert "done," not in shown and shown.endswith("\r")  # not our lines; the bar cleared at the end


def test_teacher_build_shows_its_progress(tmp_path, data_root, capsys, monkeypatch, every_step):
    """The issue's silent step: `fl-lightning teacher build`, 2 epochs of 3 batches. Once three
    batches are timed, a build estimated long (here: any, the threshold set below zero) says how
    long and how to shorten it, once."""
    monkeypatch.setenv("FL_LIGHTNING_TEACHER_CACHE", str(tmp_path / "teachers"))
    monkeypatch.setattr("fl_lightning.core.centralized.ANNOUNCE_ABOVE_S", -1.0)
    args = ["teacher", "build", "data=fmnist", "data.train_subset=2000", "data.test_subset=200",
            "method.teacher_holdout_from=2000", "method.teacher_holdout_size=192",
            "method.teacher_epochs=2", "method.teacher_model_kwargs.scaling=1"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr()
    lines = _lines(out.err, "teacher build (resnet8, 192 images)")
    said = [line for line in lines if ": about " in line]
    assert len(said) == 1 and "(2 epochs x 3 batches on " in said[0], said
    assert "method.teacher_epochs=3" in said[0] and "fl-lightning teacher build" in said[0]
    lines = [line for line in lines if ": about " not in line]
    assert [line.split(": ", 1)[1].split(" ", 1)[0] for line in lines[:6]] == [f"{k}/6" for k in range(1, 7)]
    assert "epoch 1/2" in lines[0] and "epoch 2/2" in lines[5] and "left" in lines[5]
    assert re.search(r"loss \d", lines[0])
    assert lines[6].startswith("teacher build (resnet8, 192 images): done, 6 batches in")
    assert "cached at" in out.out
    assert main(args) == 0  # from the cache: nothing trained, nothing shown
    assert "teacher build (" not in capsys.readouterr().err


def test_server_prompt_tuning_shows_its_progress(capsys, every_step):
    from fl_lightning.server_steps.prompt_tuning import PromptTuner

    tuner = PromptTuner({"name": "minilm"}, ["t-shirt", "trouser"])
    image = torch.nn.functional.normalize(
        torch.randn(2, tuner.text_dim, generator=torch.Generator().manual_seed(0))
    )
    tuner.tune(tuner.initial_ctx(), torch.tensor(np.log(100.0)), image, steps=2)
    lines = _lines(capsys.readouterr().err, "server prompt tuning")
    assert [line.split(": ", 1)[1].split(" ", 1)[0] for line in lines] == ["1/2", "2/2", "done,"]
    assert "loss" in lines[0]


def test_federated_features_and_classifier_retraining_show_their_progress(capsys, every_step):
    from fl_lightning.server_steps.federated_features import optimise_features, retrain_classifier

    g = torch.Generator().manual_seed(0)
    classes, m, d = 3, 2, 4
    w, b = torch.randn(classes, d, generator=g), torch.randn(classes, generator=g)
    optimise_features(
        torch.randn(classes * m, d, generator=g), w, b, torch.randn(classes, classes, d, generator=g),
        torch.randn(classes, classes, generator=g), torch.ones(classes, dtype=torch.bool), steps=3, lr=0.1,
    )  # fmt: skip
    retrain_classifier(
        torch.randn(classes * m, d, generator=g), classes, epochs=2, lr=0.1, batch_size=4, generator=g
    )
    err = capsys.readouterr().err
    assert len(_lines(err, "federated feature optimisation")) == 4  # 3 steps, done
    retrain = _lines(err, "classifier re-training")
    assert retrain[1].startswith("classifier re-training: 2/2 epochs (100%), loss") and "done" in retrain[2]


def test_partition_shows_its_draws_and_quiet_runs_show_nothing(tmp_path, data_root, capsys, every_step):
    assert main(["partition", *small(tmp_path, "data.cache_partitions=false", "fl.num_clients=5")]) == 0
    lines = _lines(capsys.readouterr().err, "dirichlet partition (2000 samples, 5 clients)")
    assert lines[0].startswith("dirichlet partition (2000 samples, 5 clients): 1/1000 draws")
    assert "smallest_client" in lines[0] and lines[-1].split(": ", 1)[1].startswith("done")
    # --quiet: neither the round bar nor any step's progress (same split, uncached)
    args = small(tmp_path, "data.cache_partitions=false", "fl.num_clients=5", "runtime=serial", "fl.rounds=1")
    assert main(["run", "--quiet", *args]) == 0
    assert "dirichlet partition" not in capsys.readouterr().err
