"""Folders and files other people can write (a shared sweep folder, the working directory, a
group-shared data root, runs folders): nothing in them runs code or sends a write elsewhere,
what we write there they can read, and each bad thing is one line (docs/reliability.md,
"Shared folders")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fl_lightning.cli.main import main

from .conftest import small


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fl-lightning: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _plant_module(where: Path, name: str, marker: Path) -> None:
    """`<where>/<name>.py`: importing it creates `marker` (one line per process)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.py").write_text(
        f"import os\nwith open({str(marker)!r}, 'a') as f:\n    f.write(str(os.getpid()) + '\\n')\n"
    )


# --- 1. a sweep folder names no module and no folder elsewhere ------------------------------
def _record(folder: Path, overrides: list[str], runs: list[list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": "fl_lightning.sweep/1", "overrides": overrides, "started": "2026-01-01T00:00:00",
           "runs": [{"run_id": a[-1].split("=", 1)[1], "args": a} for a in runs]}  # fmt: skip
    (folder / "sweep.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("tail", ["methods", "output_dir", "experiment"])
def test_a_recorded_run_of_a_sweep_adds_nothing_to_its_grid_point(tmp_path, capsys, monkeypatch, tail):
    """sweep.json's second run carries `methods=<module>` (imported with no consent), or
    `output_dir=` / `experiment=` elsewhere (written outside the folder: only the first run's
    folder was checked). `sweep --resume`: one line, exit 2, nothing imported or written."""
    runs, elsewhere, marker = tmp_path / "runs", tmp_path / "elsewhere", tmp_path / "imported"
    _plant_module(tmp_path / "site", "sweepmod", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    overrides = ["seed=0,1", *small(runs, "runtime=serial", "fl.rounds=1", "experiment=sw")]
    extra = {
        "methods": ["methods=sweepmod", "method.planted=1"],  # a method key: compose imports
        "output_dir": [f"output_dir={elsewhere}"],
        "experiment": ["experiment=other"],
    }[tail]
    point = overrides[1:]
    planted = ["seed=1", *point, *extra, "run_id=r1"]
    _record(runs / "sw", overrides, [["seed=0", *point, "run_id=r0"], planted])
    assert main(["sweep", "--resume", str(runs / "sw"), "--no-plots"]) == 2
    assert "sweep.json records" in _one_line_error(capsys)
    assert not marker.exists() and not elsewhere.exists() and not (runs / "other").exists()
    assert sorted(p.name for p in (runs / "sw").iterdir()) == ["sweep.json"]


def test_sweep_resume_imports_a_recorded_module_only_when_the_command_line_names_it(
    tmp_path, capsys, monkeypatch
):
    """The grid itself (sweep.json's overrides) names `methods=<module>`: `sweep --resume`
    asks for `methods=<module>` on its command line, as `resume` does for a run directory."""
    runs, marker = tmp_path / "runs", tmp_path / "imported"
    _plant_module(tmp_path / "site", "sweepmod", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    overrides = ["seed=0,1", "methods=sweepmod", "method.planted=1", *small(runs, "experiment=sw")]
    _record(runs / "sw", overrides, [[f"seed={s}", *overrides[1:], f"run_id=r{s}"] for s in (0, 1)])
    assert main(["sweep", "--resume", str(runs / "sw"), "--dry-run"]) == 2
    line = _one_line_error(capsys)
    assert "imports its method from sweepmod" in line and "with methods=sweepmod to allow that" in line
    assert not marker.exists()
    assert main(["sweep", "--resume", str(runs / "sw"), "methods=other", "--dry-run"]) == 2
    assert "cannot change 'methods'" in _one_line_error(capsys) and not marker.exists()
    assert main(["sweep", "--resume", str(runs / "sw"), "fl.rounds=3"]) == 2
    assert "takes no overrides but methods=" in _one_line_error(capsys)
    # consent: the module is imported (it registers no method: that is the next line)
    assert main(["sweep", "--resume", str(runs / "sw"), "methods=sweepmod", "--dry-run"]) == 2
    assert "methods=sweepmod registers no method" in _one_line_error(capsys) and marker.exists()


def test_sweep_children_do_not_import_from_the_working_directory(tmp_path, capsys, monkeypatch):
    """`--parallel` children started as `python -m fl_lightning` put the working directory
    first on sys.path: a `yaml.py` lying where the user runs the sweep ran in each child.
    Here each child stops at once (no dataset under data.root), after importing the config."""
    marker = tmp_path / "imported"
    _plant_module(tmp_path / "cwd", "yaml", marker)
    monkeypatch.chdir(tmp_path / "cwd")
    (tmp_path / "empty").mkdir()
    empty = f"data.root={tmp_path / 'empty'}"
    args = small(tmp_path / "runs", empty, "data.download=false", "runtime=serial")
    assert main(["sweep", "seed=0,1", *args, "--parallel", "2", "--no-plots"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAILED: exit 2: fl-lightning: error: ") == 2, out  # the children ran
    assert "fetch fmnist" in out, out
    assert not marker.exists(), f"a child imported the planted yaml.py ({marker.read_text()!r})"
    assert sys.modules["yaml"].__file__ != str(tmp_path / "cwd" / "yaml.py")


# --- 3. a data root shared by a group -------------------------------------------------------
STATS = {"train_class_histogram": [[5, 0, 1], [0, 4, 2]], "train_sizes": [6, 6], "class_names": list("abc")}


@pytest.fixture
def umask():
    """Set the process's umask for the test (put back after)."""
    import os

    before = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(before)


@pytest.mark.parametrize(
    "mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)], ids=["022", "002", "077"]
)
def test_files_we_write_are_as_readable_as_the_umask_allows(tmp_path, umask, mask, mode):
    """Every file `write_atomic` wrote was 0600 (mkstemp's mode): pretrained weights, plots,
    the decoded dataset cache, partition, text and teacher caches were private to their
    writer on a group-shared data root. Now 0666 less the umask, as a plain `open` gives."""
    import numpy as np
    import torch

    from fl_lightning.core.files import atomic_torch_save, copy_atomic, write_atomic
    from fl_lightning.data.cache import atomic_savez, cached_arrays
    from fl_lightning.data.stats import save_partition_plot

    umask(mask)
    made = [
        write_atomic(tmp_path / "a.bin", lambda f: f.write(b"x")),
        atomic_torch_save({"w": torch.ones(1)}, tmp_path / "weights.pt"),
        copy_atomic(tmp_path / "a.bin", tmp_path / "b.bin"),
        save_partition_plot(STATS, tmp_path / "run" / "partition.png", tmp_path / "partitions"),
        *(tmp_path / "partitions").glob("plot-*.png"),
    ]
    assert atomic_savez(tmp_path / "split.npz", {"x": np.arange(3)})
    src = tmp_path / "a.bin"
    cached_arrays(tmp_path / "root", "t", [src], lambda: {"x": np.arange(2)})
    made.append(tmp_path / "split.npz")
    made += (tmp_path / "root" / ".cache").glob("t-*.npz")
    assert len(made) == 7
    assert {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in made} == {
        str(p.relative_to(tmp_path)): oct(mode) for p in made
    }


def _as_nobody(work) -> int:
    """`work()` in a forked child running as user `nobody` (a colleague); its return value is
    the child's exit status (an exception: 70, its traceback in the child's stderr)."""
    import encodings.cp437  # noqa: F401  (zipfile's; the child may not read the stdlib's folder)
    import os
    import traceback

    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest's, out with os._exit
        code = 70
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            code = int(work())
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def shared_root():
    """A folder two users share (outside pytest's 0700 temporary folder), as root; skipped
    where this process cannot act as another user (not root, or no `nobody`)."""
    import os
    import pwd
    import shutil
    import tempfile

    if not hasattr(os, "fork") or os.geteuid() != 0:
        pytest.skip("needs root, to act as a second user")
    try:
        pwd.getpwuid(65534)
    except KeyError:
        pytest.skip("no user nobody (65534)")
    root = Path(tempfile.mkdtemp(prefix="flshared", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_colleagues_run_uses_our_caches_and_leaves_an_unreadable_one_alone(shared_root, umask):
    """Two users, one data root (umask 022: the folders are ours, the files readable). The
    colleague (`nobody`) reads our cached partition plot and decoded arrays, replacing
    neither; a cached plot it cannot read (0600) is drawn again for its own run and left as
    it was (before: PermissionError, the run ended with exit 1 and no summary.json)."""
    import os

    import numpy as np

    from fl_lightning.data.cache import cached_arrays
    from fl_lightning.data.stats import draw_partition_plot, save_partition_plot

    umask(0o022)
    cache, data = shared_root / "partitions", shared_root / "data"
    data.mkdir()
    src = data / "images.bin"
    src.write_bytes(b"images")
    ours = save_partition_plot(STATS, shared_root / "mine" / "partition.png", cache)
    (cached,) = cache.glob("plot-*.png")
    other = {**STATS, "train_class_histogram": [[1, 1, 4], [2, 2, 2]]}
    cached.write_bytes(draw_partition_plot(other, shared_root / "other.png").read_bytes())  # a copy tells
    arrays = cached_arrays(data, "t", [src], lambda: {"x": np.arange(5)})
    (npz,) = (data / ".cache").glob("t-*.npz")
    before = {p: (p.stat().st_ino, p.read_bytes()) for p in (cached, npz)}
    theirs = shared_root / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)

    def colleague() -> int:
        png = save_partition_plot(STATS, theirs / "a" / "partition.png", cache)
        got = cached_arrays(data, "t", [src], lambda: {"x": np.zeros(1)})  # a rebuild differs
        return 0 if png.read_bytes() == cached.read_bytes() and np.array_equal(got["x"], arrays["x"]) else 3

    assert _as_nobody(colleague) == 0
    assert {p: (p.stat().st_ino, p.read_bytes()) for p in (cached, npz)} == before
    assert ours.read_bytes() != cached.read_bytes()

    cached.chmod(0o600)  # as every cache file was written before

    def colleague_unreadable() -> int:
        png = save_partition_plot(STATS, theirs / "b" / "partition.png", cache)
        return 0 if png.read_bytes() == ours.read_bytes() else 3  # drawn: its own split's picture

    assert _as_nobody(colleague_unreadable) == 0
    assert (cached.stat().st_ino, cached.read_bytes()) == before[cached]
    assert cached.stat().st_mode & 0o777 == 0o600


# --- 6. W&B's folders in a runs folder --------------------------------------------------------
@pytest.mark.parametrize("where", [".wandb", ".wandb/cache", ".wandb/config"])
def test_a_link_planted_where_wandb_keeps_its_folders_is_refused(tmp_path, capsys, monkeypatch, where):
    """`<experiment>/.wandb` (W&B's cache, data and config folders, unless set) linked out of the
    runs folder: W&B followed it. `run` and `resume` with W&B on: one line, exit 2, before any
    work; nothing written through the link."""
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.delenv(var, raising=False)  # (an earlier in-process run sets them)
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    outside.mkdir()
    link = runs / "exp" / where
    link.parent.mkdir(parents=True)
    link.symlink_to(outside, target_is_directory=True)
    wandb = ["logger=wandb", "logger.mode=offline", "experiment=exp"]
    args = small(runs, "runtime=serial", "fl.rounds=1", "data.train_subset=200", *wandb)
    assert main(["run", *args, "run_id=r", "--quiet"]) == 2
    assert f"{link} is a symbolic link" in _one_line_error(capsys)
    assert not (runs / "exp" / "r").exists() and list(outside.iterdir()) == []
    run_dir = runs / "exp" / "old"  # a run there before the link: its resume with W&B on
    run_dir.mkdir()
    groups = "method: {name: fedavg}\ndata: {name: fmnist}\nmodel: {name: cnn}\nfl: {}\n"
    (run_dir / "config.yaml").write_text(f"run_id: old\nexperiment: exp\n{groups}")
    resume = ["logger.backend=wandb", "logger.mode=offline", "--quiet"]
    assert main(["resume", str(run_dir), *resume]) == 2
    assert f"{link} is a symbolic link" in _one_line_error(capsys)
    assert list(outside.iterdir()) == [] and sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]
