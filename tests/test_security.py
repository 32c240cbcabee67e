"""An untrusted run directory or data root cannot run code or touch files outside it, and
every bad value is one line (exit 2) before any work starts."""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from fl_lightning.cli.main import main
from fl_lightning.config import load_run_config
from fl_lightning.core.errors import ConfigError
from fl_lightning.data.registry import DATASETS

from .conftest import small

# tiny, so that code which wrongly accepts a value (the old code) ends soon
QUICK = [
    "runtime=serial", "logger=none", "data.train_subset=200", "data.test_subset=100",
    "fl.num_clients=2", "fl.rounds=1",
]  # fmt: skip


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fl-lightning: error: "), err
    assert "Traceback" not in err
    return err


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --- 1. pickles in a data root run no code ----------------------------------------------
class _Hostile:
    """Unpickled by plain `pickle.load`, this opens (creates) the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def _cifar10_root(root: Path, per_batch: int = 4) -> Path:
    """A tiny CIFAR-10 in the official layout: pickled dicts of uint8 `data` rows (N x 3072)
    and `labels` lists, five training batches, a test batch and batches.meta."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"label_names": [b"airplane"] * 10, b"num_cases_per_batch": per_batch, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder


def test_cifar_batches_load_and_a_hostile_pickle_runs_nothing(tmp_path, capsys):
    folder = _cifar10_root(tmp_path / "data")
    ds = DATASETS.get("cifar10").load(str(tmp_path / "data"))
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (4, 3, 32, 32) and len(ds.train_y) == 20

    marker = tmp_path / "pwned"
    (folder / "data_batch_3").write_bytes(pickle.dumps(_Hostile(marker), protocol=2))
    with pytest.raises(ConfigError) as e:
        DATASETS.get("cifar10").load(str(tmp_path / "data"))
    assert "data_batch_3" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()

    out = tmp_path / "out"
    args = ["run", "data=cifar10", f"data.root={tmp_path / 'data'}", *QUICK, f"output_dir={out}"]
    assert main(args) == 2
    assert "data_batch_3" in _one_line_error(capsys)
    assert not marker.exists() and not out.exists()


def test_a_truncated_cifar_batch_is_one_line(tmp_path):
    folder = _cifar10_root(tmp_path / "data")
    (folder / "test_batch").write_bytes((folder / "test_batch").read_bytes()[:100])
    with pytest.raises(ConfigError, match="test_batch is corrupt"):
        DATASETS.get("cifar10").load(str(tmp_path / "data"))


def test_a_hostile_fedbn_split_file_runs_nothing(tmp_path):
    from fl_lightning.data.folders import _read_split

    good = tmp_path / "amazon_train.pkl"
    good.write_bytes(pickle.dumps((np.array(["amazon/bike/1.jpg"]), np.array(["bike"])), protocol=2))
    assert _read_split(good) == (["amazon/bike/1.jpg"], ["bike"])
    marker = tmp_path / "pwned"
    bad = tmp_path / "amazon_test.pkl"
    bad.write_bytes(pickle.dumps(_Hostile(marker), protocol=2))
    with pytest.raises(ConfigError, match="amazon_test.pkl refused"):
        _read_split(bad)
    assert not marker.exists()


# --- 2. run_id and experiment stay inside output_dir -------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        "run_id=../../X",
        "experiment=../../../X",
        "run_id={tmp}/absolute",
        "run_id=a/b",
        "run_id=${{oc.env:FL_TEST_ESCAPE}}",
        "experiment=${{oc.env:FL_TEST_ESCAPE}}",
        "run_id=.hidden",
        "run_id=" + "x" * 300,
        "+experiment=../../../X",
    ],
)
def test_run_id_and_experiment_are_one_safe_folder_name(tmp_path, capsys, monkeypatch, bad):
    monkeypatch.setenv("FL_TEST_ESCAPE", str(tmp_path / "escaped"))  # where an interpolation would lead
    out = tmp_path / "a" / "b" / "c"  # deep enough that `..` escapes stay inside tmp_path
    assert main(["run", bad.format(tmp=tmp_path), *QUICK, f"output_dir={out}"]) == 2
    err = _one_line_error(capsys)
    assert "File name too long" not in err and len(err) < 1000
    assert _written(tmp_path) == []


def test_a_resumed_config_with_an_interpolated_run_id_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "run_id: ${oc.env:HOME}\nmethod: {name: fedavg}\ndata: {name: fmnist}\nmodel: {name: cnn}\nfl: {}\n"
    )
    with pytest.raises(ConfigError, match="run_id="):
        load_run_config(tmp_path, [])


# --- 4. bad numbers and loose booleans ----------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        "seed=-1",
        "optim.momentum=-1",
        "optim.weight_decay=-1",
        "eval.overlap=2",
        "runtime.early_start=2",
        "data.download=1",
    ],
)
def test_bad_values_are_one_line(tmp_path, capsys, bad):
    assert main(["run", bad, *QUICK, f"output_dir={tmp_path}"]) == 2
    assert bad.split("=")[0] in _one_line_error(capsys)
    assert _written(tmp_path) == []


def test_a_resumed_config_with_a_loose_boolean_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "method: {name: fedavg}\ndata: {name: fmnist}\nmodel: {name: cnn}\nfl: {}\neval: {overlap: 2}\n"
    )
    with pytest.raises(ConfigError, match="eval.overlap must be true or false"):
        load_run_config(tmp_path, [])


# --- 5. absurd method values --------------------------------------------------------------
@pytest.mark.parametrize(
    "method, bad",
    [
        ("fedglcl", "method.tau=-1"),
        ("fedglcl", "method.moon_temperature=-1"),
        ("feddtr", "method.tau=-0.5"),
        ("feddtr", "method.text=2"),
        ("fedtsp", "method.lam=-7"),
        ("fedtsp", "method.server_epochs=-5"),
        ("fedtsp", "method.n_ctx=-1"),
        ("fedtsp", "method.n_ctx=5000"),
        ("fedlgt", "method.epsilon=1.5"),
        ("fedlgt", "method.threshold=2"),
        ("clip2fl", "method.kd_temperature=-3"),
        ("clip2fl", "method.pcl_temperature=0"),
    ],
)
def test_absurd_method_values_are_one_line(tmp_path, capsys, method, bad):
    assert main(["run", f"method={method}", bad, *QUICK, f"output_dir={tmp_path}"]) == 2
    assert bad.split("=")[0] in _one_line_error(capsys)
    assert _written(tmp_path) == []


# --- 3. links planted in a run directory --------------------------------------------------
@pytest.fixture(scope="module")
def one_round_run(tmp_path_factory, data_root) -> Path:
    """A real tiny run stopped after round 1 of 2 (fl.rounds=1; resumed with fl.rounds=2)."""
    out = tmp_path_factory.mktemp("runs")
    args = ["run", *small(out, "runtime=serial", "fl.rounds=1", "run_id=base"), "--quiet"]
    assert main(args) == 0
    return out / "default" / "base"


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _plant(run_dir: Path, outside: Path, name: str) -> Path:
    """Replace (or add) `name` in the run directory by a link to a file or folder in `outside`."""
    link = run_dir / name
    if name in ("checkpoints", "checkpoints/clients"):
        target = outside / "folder"
        if name == "checkpoints":
            shutil.copytree(link, target)  # what a resume would otherwise write into
        else:
            target.mkdir()
        (target / "c0000001-r000001.pt").write_bytes(b"someone else's client state")
        (target / "c0000002-r000009.pt").write_bytes(b"another one")
        if link.is_dir():
            shutil.rmtree(link)
    else:
        target = outside / "precious.txt"
        target.write_text("precious data\n")
        link.unlink(missing_ok=True)
    link.symlink_to(target, target_is_directory=target.is_dir())
    return target


@pytest.mark.parametrize(
    "name", [".lock", "metrics.tmp", ".summary.json.tmp", "checkpoints", "checkpoints/clients"]
)
def test_resume_writes_through_no_planted_link(tmp_path, capsys, one_round_run, name):
    run_dir = tmp_path / "run"
    shutil.copytree(one_round_run, run_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = _plant(run_dir, outside, name)
    before = _snapshot(target)
    capsys.readouterr()
    code = main(["resume", str(run_dir), "fl.rounds=2", "--quiet"])
    assert _snapshot(target) == before, f"resume wrote through {name}"
    assert code == 2
    err = _one_line_error(capsys)
    assert name in err and "symbolic link" in err


def test_resume_of_a_clean_copy_runs(tmp_path, capsys, one_round_run):
    """The refusals above are the links': the same run directory without one resumes."""
    run_dir = tmp_path / "run"
    shutil.copytree(one_round_run, run_dir)
    assert main(["resume", str(run_dir), "fl.rounds=2", "--quiet"]) == 0
    assert (run_dir / "checkpoints" / "round-000002.json").is_file()
