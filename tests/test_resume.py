"""A run killed at any moment resumes from its last checkpoint and ends the same: every metric
of every round (losses included) and the final server and client state, bit for bit. SCAFFOLD
with 2 of 4 clients a round: both sides keep state, and clients that sat out keep theirs; with
training-time augmentation on (its draws are seeded: a repeated round draws them again)."""

import json

import pytest

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.runtime.runner import start_run

from .conftest import small
from .run_files import assert_same_run, kill_after_checkpoint


def _accs(run_dir):
    return [json.loads(line)["accuracy"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(tmp_path, data_root):
    args = small(tmp_path, "fl.rounds=3", "runtime=serial", "data.train_subset=3000", "method=scaffold",
                 "fl.clients_per_round=2", "data.augment=[random_crop,hflip]")  # fmt: skip
    full, full_dir = start_run(compose([*args, "experiment=full", "run_id=a"]), console=False)

    killed_dir = tmp_path / "killed" / "b"
    # eval.overlap: round 2's checkpoint is committed before its line, which waits for round 3's
    # fit; killed in between, the resume evaluates round 2's state again to write that line
    lines_at_kill = kill_after_checkpoint(
        [*args, "experiment=killed", "run_id=b"], killed_dir,
        while_stopped=lambda: len((killed_dir / "metrics.jsonl").read_text().splitlines()),
    )  # fmt: skip
    assert lines_at_kill == 1, "killed after round 2's line: the backfill path was not reached"
    done = json.loads(
        (
            killed_dir
            / "checkpoints"
            / sorted(p.name for p in (killed_dir / "checkpoints").glob("*.json"))[-1]
        ).read_text()
    )["round"]
    assert done < 3, "the run finished before it could be killed"
    assert (
        not (killed_dir / "summary.json").exists()
        or json.loads((killed_dir / "summary.json").read_text())["rounds_completed"] < 3
    )

    assert main(["resume", str(killed_dir), "--quiet"]) == 0
    resumed = json.loads((killed_dir / "summary.json").read_text())
    assert resumed["rounds_completed"] == 3
    assert resumed["final_accuracy"] == full["final_accuracy"]
    assert _accs(killed_dir) == _accs(full_dir)  # every round, none twice
    assert_same_run(killed_dir, full_dir)  # losses, bytes, client counts; server and client state


def test_corrupt_checkpoint_gives_one_line(tmp_path, data_root, capsys):
    summary, run_dir = start_run(compose(small(tmp_path, "runtime=serial", "fl.rounds=1")), console=False)
    (run_dir / "checkpoints" / "round-000001.pt").write_bytes(b"not a checkpoint")
    assert main(["resume", str(run_dir), "fl.rounds=2", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not match" in err
