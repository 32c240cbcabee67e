"""Fault injection: one test per row of issue 16's table, with real files, real processes and
real Ray (tiny Fashion-MNIST). Each fails on the behaviour the issue reported and passes now;
`docs/reliability.md` lists the guarantees and names these tests.

The soak test (30 rounds, a client actor killed every few rounds) runs only with
FL_LIGHTNING_SOAK=1: it takes minutes on two cores.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.errors import StoppedAfterCompletion, Terminated
from fl_lightning.data.federated import make_split, partition_cache_dir, partition_options
from fl_lightning.data.fetch import FMNIST_FILES, fmnist_dir
from fl_lightning.data.registry import load_from_config
from fl_lightning.runtime.callbacks.base import Callback
from fl_lightning.runtime.runner import start_run

from .conftest import WIDE, cpus_free, small, stderr_lines

EXE = os.path.join(os.path.dirname(sys.executable), "fl-lightning")
# Tiny and quick: 2 clients of 200 images, 3 local steps each round, one thread per client.
TINY = ["data.train_subset=400", "data.test_subset=100", "fl.num_clients=2", "fl.local_steps=3"]


def _strict(line: str) -> dict:
    """A metrics.jsonl line as strict JSON: NaN / Infinity tokens fail the test."""
    return json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON token {c} in metrics.jsonl"))


def _records(run_dir: Path) -> list[dict]:
    return [_strict(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _one_line(err: str) -> str:
    lines = stderr_lines(err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _of_run(ray_tmp: str) -> list[int]:
    """Live PIDs (not this one, not zombies) of the Ray whose RAY_TMPDIR is `ray_tmp` (a test's
    own): `ray_tmp` in their command line or environment, or a file they hold open or their
    working directory inside it. Ray's agents, renamed (`ray::DashboardAgent`), have lost
    their environment but still write their logs there."""
    want, found = ray_tmp.encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid() or not _alive(int(name)):
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                seen = want in f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                seen = seen or want in f.read()
            links = ["cwd", *(f"fd/{fd}" for fd in os.listdir(f"/proc/{name}/fd"))]
        except OSError:
            continue
        for link in links:
            with contextlib.suppress(OSError):
                seen = seen or os.readlink(f"/proc/{name}/{link}").startswith(ray_tmp + "/")
        if seen:
            found.append(int(name))
    return found


def _until_agents(proc: subprocess.Popen, ray_tmp: str, written: Path | None = None) -> None:
    """Wait until the run's Ray has both agents up (or `written` exists); the run goes on."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if _agents(_of_run(ray_tmp)) == 2 or (written is not None and written.exists()):
            break
        time.sleep(0.1)  # a scan of /proc costs ~10 ms of CPU; the workers take seconds to start
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""


def _left_after(ray_tmp: str, seconds: float) -> dict[int, str]:
    """The processes of that Ray still there `seconds` from now (at once when none is left)."""
    deadline = time.monotonic() + seconds
    while _of_run(ray_tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {p: _cmdline(p)[:80] for p in _of_run(ray_tmp)}


def _clean_up(ray_tmp: str) -> None:
    """End what a test's own Ray left (only that) and remove its folder."""
    for pid in _of_run(ray_tmp):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _agents(pids: list[int]) -> int:
    """How many of `pids` are Ray's two agents (renamed: their environment is gone)."""
    return sum(_cmdline(p).startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent")) for p in pids)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _actor_pids() -> list[int]:
    """PIDs of the live client actors of the Ray this process is connected to."""
    import ray

    table = ray._private.state.actors()  # GCS's actor table (no dashboard needed)
    return [
        int(a["Pid"])
        for a in table.values()
        if a["State"] == "ALIVE" and "ClientActor" in a["ActorClassName"] and a["Pid"]
    ]


def _kill_actor_after(ckdir: Path, rounds: list[int], log: list[str]) -> threading.Thread:
    """A thread that, as soon as each round's checkpoint in `rounds` is committed (so the next
    thing the run does is the next round's fit), kills one live client actor with SIGKILL."""

    def go() -> None:
        for rnd in rounds:
            marker = ckdir / f"round-{rnd:06d}.json"
            deadline = time.monotonic() + 600
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            pids = _actor_pids()
            if pids:
                os.kill(pids[rnd % len(pids)], signal.SIGKILL)
                log.append(f"round {rnd}: killed actor pid {pids[rnd % len(pids)]}")

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_root) -> Path:
    """A finished 3-round MOON run (client state in `checkpoints/clients/`), serial."""
    out = tmp_path_factory.mktemp("finished")
    # FedAvg's CNN at full width: at small()'s narrow one these 3 rounds stay at chance, and
    # the run's chance warning would stand beside the line the resume tests read
    cfg = compose(small(out, *TINY, "method=moon", "runtime=serial", "fl.rounds=3", "run_id=done", *WIDE))
    _, run_dir = start_run(cfg, console=False)
    return run_dir


def _copy(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir, dest)
    (dest / ".lock").unlink(missing_ok=True)
    return dest


# --- row 1: optim.lr=1e6 / nan / inf ------------------------------------------------------
@pytest.mark.parametrize(
    "override", ["optim.lr=nan", "optim.lr=inf", "optim.lr=-inf", "data.alpha=.nan", "method.mu=nan"]
)
def test_non_finite_config_values_are_one_line_before_anything_starts(tmp_path, capsys, override):
    args = small(tmp_path, *TINY, "runtime=serial", override)
    if override.startswith("method."):
        args.append("method=fedprox")
    assert main(["run", *args]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "must be a finite number" in line and override.split("=")[0] in line
    assert not any(tmp_path.iterdir())  # no run directory


def test_a_diverging_run_fails_and_is_never_averaged(tmp_path, capsys):
    """lr=1e6 next to a sane lr in one sweep: the diverged run is FAILED (exit 1), its record
    strict JSON, nothing non-finite checkpointed; `compare` lists it apart."""
    args = [*small(tmp_path, *TINY, "runtime=serial", "fl.rounds=2"), "experiment=lr", "--no-plots"]
    assert main(["sweep", "optim.lr=0.05,1e6", *args]) == 1
    out = capsys.readouterr()
    assert "lr=1e6: FAILED: " in out.out and "diverged" in out.out
    assert "1 of 2 sweep runs failed" in out.err
    runs = [d for d in (tmp_path / "lr").iterdir() if (d / "config.yaml").is_file()]
    (bad,) = [d for d in runs if "lr: 1000000.0" in (d / "config.yaml").read_text()]
    summary = json.loads((bad / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["best_accuracy"] is None
    last = _records(bad)[-1]  # strict JSON: no NaN token
    assert last["diverged"] is True and last["train_loss"] is None and "train_loss" in last["nonfinite"]
    assert not list(bad.glob("checkpoints/round-*.json"))
    (good,) = [d for d in runs if d != bad]
    good_acc = json.loads((good / "summary.json").read_text())["final_accuracy"]

    assert main(["compare", str(tmp_path / "lr"), "--no-plots", "--by", "optim.lr"]) == 0
    table = capsys.readouterr().out
    assert "not averaged" in table and bad.name in table
    doc = json.loads((tmp_path / "lr" / "compare" / "compare.json").read_text())
    rows = {r["group"]: r for r in doc["groups"]}
    assert rows["1000000.0"]["runs"] == 0 and rows["1000000.0"]["final"]["mean"] is None
    assert rows["0.05"]["final"]["mean"] == good_acc


# --- row 2: resume while the run is still going ---------------------------------------------
def test_a_second_writer_gets_one_line_naming_the_holder(tmp_path, capsys, data_root):
    """`resume` (or `run` of the same id) beside a live run: one line naming its PID, and the
    writer goes on undisturbed. That writer then gets SIGTERM mid-fit: the serial case of
    `test_sigterm_stops_a_run_like_ctrl_c` (exit 143, one line, `interrupted`, resumable), in
    the process this test starts anyway."""
    args = small(tmp_path, *TINY[:-1], "fl.local_steps=20", "runtime=serial", "fl.rounds=500", "run_id=r")
    run_dir = tmp_path / "default" / "r"
    proc = subprocess.Popen([EXE, "run", *args, "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        marker = run_dir / "checkpoints" / "round-000001.json"
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no checkpoint"
        assert main(["resume", str(run_dir), "--quiet"]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"PID {proc.pid}" in line and "in use" in line
        assert main(["run", *args, "--quiet"]) == 2  # the same run id: the directory exists
        assert "exists" in _one_line(capsys.readouterr().err)
        assert proc.poll() is None  # the writer went on undisturbed
        proc.terminate()  # `kill <pid>` (what `ray job stop` sends); 20 steps a client: mostly mid-fit
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err.decode()
    assert "terminated (SIGTERM)" in _one_line(err.decode())
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    done = len(_records(run_dir))
    assert main(["resume", str(run_dir), f"fl.rounds={done + 1}", "--quiet"]) == 0
    assert [r["round"] for r in _records(run_dir)] == list(range(1, done + 2))  # every round once


# --- row 3: corrupt Fashion-MNIST files -------------------------------------------------------
def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _random(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def _gzip_of_random(path: Path) -> None:  # a valid gzip stream of garbage (the huge reshape)
    path.write_bytes(gzip.compress(np.random.default_rng(1).bytes(1 << 16)))


def _other_file(path: Path) -> None:  # a valid IDX file, but the wrong one (test labels)
    shutil.copyfile(path.with_name("t10k-labels-idx1-ubyte.gz"), path)


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("train-labels-idx1-ubyte.gz", _truncated),
        ("t10k-images-idx3-ubyte.gz", _random),
        ("train-images-idx3-ubyte.gz", _gzip_of_random),
        ("train-labels-idx1-ubyte.gz", _other_file),
    ],
    ids=["truncated", "random-bytes", "gzip-of-garbage", "wrong-file"],
)
def test_a_corrupt_dataset_file_is_one_line_naming_it_and_the_fetch_command(
    tmp_path, capsys, data_root, name, damage
):
    root = tmp_path / "data"
    fmnist_dir(root).mkdir(parents=True)
    for f in FMNIST_FILES:
        shutil.copyfile(fmnist_dir(data_root) / f, fmnist_dir(root) / f)
    damage(fmnist_dir(root) / name)
    out = tmp_path / "runs"
    assert main(["run", *small(out, *TINY, "runtime=serial", f"data.root={root}"), "--quiet"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(fmnist_dir(root) / name) in line and "fl-lightning fetch fmnist" in line
    assert not out.exists()  # nothing written
    from fl_lightning.data.fetch import fmnist_problems

    assert list(fmnist_problems(root)) == [name]  # what `fetch` finds broken and fetches again


# --- row 4: a broken partition cache -------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_data(data_root):
    cfg = compose(["data.train_subset=400", "data.test_subset=100", "fl.num_clients=4"])
    return cfg, load_from_config(cfg.data)


def _bad_npz(key: str, **arrays: np.ndarray):
    def write(path: Path) -> None:
        with open(path, "wb") as f:
            np.savez(f, key=np.asarray(key), **arrays)

    return write


@pytest.mark.parametrize(
    "breakage", ["empty", "truncated", "random", "out_of_range", "negative", "twice", "client_missing"]
)
def test_a_broken_partition_cache_is_rebuilt_with_a_warning(tmp_path, tiny_data, caplog, breakage):
    cfg, ds = tiny_data
    kw = dict(cache_dir=tmp_path, **partition_options(cfg.data))
    fresh = make_split(ds, "dirichlet", 4, 0, **kw)
    path = tmp_path / f"{fresh.key}.npz"
    assert path.is_file() and make_split(ds, "dirichlet", 4, 0, **kw).from_cache
    parts = {f"train_{k}": p for k, p in enumerate(fresh.train)}
    n = len(ds.train_y)
    if breakage == "empty":
        path.write_bytes(b"")
    elif breakage == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif breakage == "random":
        path.write_bytes(np.random.default_rng(0).bytes(2000))
    elif breakage == "out_of_range":  # a well-formed file whose indices a fresh split would refuse
        _bad_npz(fresh.key, **{**parts, "train_0": np.append(parts["train_0"], n + 7)})(path)
    elif breakage == "negative":
        _bad_npz(fresh.key, **{**parts, "train_1": np.append(parts["train_1"], -1)})(path)
    elif breakage == "twice":
        _bad_npz(fresh.key, **{**parts, "train_1": np.append(parts["train_1"], parts["train_0"][0])})(path)
    else:
        _bad_npz(fresh.key, **{k: v for k, v in parts.items() if k != "train_3"})(path)
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        again = make_split(ds, "dirichlet", 4, 0, **kw)
    assert not again.from_cache
    assert all(np.array_equal(a, b) for a, b in zip(again.train, fresh.train, strict=True))
    assert str(path) in caplog.text and "rebuilding" in caplog.text
    assert make_split(ds, "dirichlet", 4, 0, **kw).from_cache  # rewritten: later runs use it again


def test_a_run_goes_on_over_a_broken_partition_cache(tmp_path, caplog, data_root):
    """Through the CLI: the cache entry of this exact run is garbage, the run still works."""
    args = small(tmp_path, *TINY, "runtime=serial", "fl.rounds=1", f"data.root={tmp_path / 'data'}")
    root = tmp_path / "data"
    fmnist_dir(root).mkdir(parents=True)
    for f in FMNIST_FILES:
        os.symlink(fmnist_dir(data_root) / f, fmnist_dir(root) / f)
    cfg = compose(args)
    ds = load_from_config(cfg.data)
    key = make_split(ds, "dirichlet", 2, 0, cache_dir=None, **partition_options(cfg.data)).key
    cache = partition_cache_dir(cfg.data)
    cache.mkdir(parents=True)
    (cache / f"{key}.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        assert main(["run", *args, "--quiet"]) == 0
    assert f"{key}.npz" in caplog.text and "rebuilding" in caplog.text


# --- row 5: output_dir a file, not writable, a link loop ---------------------------------------
@pytest.mark.parametrize(
    "kind", ["file", "below-a-file", "not-writable", "link-loop", "below-a-loop", "dangling"]
)
def test_an_unusable_output_dir_is_one_line_before_any_data_is_loaded(tmp_path, capsys, kind):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")  # a -> b -> a: Path.exists() says False
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    out = {
        "file": tmp_path / "afile",
        "below-a-file": tmp_path / "afile" / "runs",
        "not-writable": Path("/proc/fl_lightning_runs"),  # no one, root included, creates folders here
        "link-loop": tmp_path / "loop_a",
        "below-a-loop": tmp_path / "loop_a" / "runs",
        "dangling": tmp_path / "dangling",
    }[kind]
    # a dataset that is missing: were data looked at first, that would be the error
    args = small(tmp_path, *TINY, f"output_dir={out}", f"data.root={tmp_path / 'no_data'}")
    t0 = time.perf_counter()
    assert main(["run", *args, "--quiet"]) == 2
    line = _one_line(capsys.readouterr().err)
    why = ("a file", "not writable", "Too many levels of symbolic links", "a link to nothing")
    assert f"output_dir {out}" in line and any(w in line for w in why), line
    assert time.perf_counter() - t0 < 5
    assert main(["sweep", "seed=0,1", *args]) == 2
    assert f"output_dir {out}" in _one_line(capsys.readouterr().err)


# --- row 6: a YAML error in an override --------------------------------------------------------
def test_a_yaml_error_in_an_override_is_one_line(tmp_path, capsys, finished):
    bad = "fl.rounds=[2"
    for argv in (
        ["run", *small(tmp_path, bad)],
        ["config", bad],
        ["sweep", "seed=0,1", *small(tmp_path, bad)],
        ["resume", str(finished), bad],
    ):
        assert main(argv) == 2, argv
        line = _one_line(capsys.readouterr().err)
        assert f"bad override {bad!r}: not valid YAML" in line, argv
    assert not any(tmp_path.iterdir())


# --- row 7: resume of a dir with an empty or foreign config.yaml -----------------------------
@pytest.mark.parametrize(
    ("content", "why"),
    [("", "empty"), ("services:\n  web:\n    image: nginx\n", "no method"), ("seed: 3\n", "no method")],
    ids=["empty", "foreign", "partial"],
)
def test_resume_of_a_foreign_config_is_one_line(tmp_path, capsys, content, why):
    (tmp_path / "config.yaml").write_text(content)
    assert main(["resume", str(tmp_path)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "is not an fl_lightning run config" in line and why in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # nothing written


# --- row 8: the newest checkpoint is corrupt ----------------------------------------------------
@pytest.mark.parametrize("breakage", ["tensors", "json", "client_missing", "client_corrupt"])
def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, caplog, finished, breakage):
    run_dir = _copy(finished, tmp_path / "run")
    ck = run_dir / "checkpoints"
    before = _records(run_dir)
    if breakage == "tensors":
        _truncated(ck / "round-000003.pt")
    elif breakage == "json":
        _truncated(ck / "round-000003.json")
    elif breakage == "client_missing":
        (ck / "clients" / "c0000001-r000003.pt").unlink()
    else:
        _random(ck / "clients" / "c0000000-r000003.pt")
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        assert main(["resume", str(run_dir), "--quiet"]) == 0
    warned = [r.getMessage() for r in caplog.records if "skipped checkpoint" in r.getMessage()]
    assert len(warned) == 1 and "round-000003" in warned[0] and "resuming from round 2" in warned[0]
    assert (ck / "skipped" / "round-000003.json").exists()  # set aside, not deleted
    after = _records(run_dir)  # metrics.jsonl cut back to round 2, then round 3 again
    assert [r["round"] for r in after] == [1, 2, 3]
    assert [r["accuracy"] for r in after] == [r["accuracy"] for r in before]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


# --- row 9: a client actor killed mid-round ------------------------------------------------
@pytest.mark.fresh_ray  # its per-client run needs both of the shared Ray's CPUs
def test_a_killed_actor_is_in_metrics_and_wandb_and_changes_nothing(tmp_path, data_root, ray_session):
    from .wandb_files import read_finished_run

    # two rounds: the actor is killed once round 1 is committed, so round 2's fit meets it
    args = small(tmp_path, *TINY, "method=moon", "fl.rounds=2", "runtime.threads_per_client=1")
    undisturbed, _ = start_run(compose([*args, "runtime=serial", "run_id=serial"]), console=False)
    cfg = compose(
        [*args, "runtime.placement=per_client", "logger=wandb", "logger.mode=offline", "run_id=ray"]
    )
    run_dir = tmp_path / "default" / "ray"
    killed: list[str] = []
    killer = _kill_actor_after(run_dir / "checkpoints", [1], killed)
    summary, _ = start_run(cfg, console=False)
    killer.join(timeout=5)
    assert killed, "no actor was killed"
    recs = _records(run_dir)
    hit = [r for r in recs if r["clients_retried"]]
    assert len(hit) == 1 and hit[0]["clients_retried"] == 1 and hit[0]["clients_failed"] == 0
    assert all("actor died" in f for f in hit[0]["client_failures"])
    serial = _records(tmp_path / "default" / "serial")
    assert [r["accuracy"] for r in recs] == [r["accuracy"] for r in serial]
    assert summary["final_accuracy"] == undisturbed["final_accuracy"]
    (wb,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    history = read_finished_run(wb)["history"]
    assert [h["train/clients_retried"] for h in history if "train/clients_retried" in h] == [
        r["clients_retried"] for r in recs
    ]
    (step,) = [h for h in history if h.get("train/clients_retried")]
    assert step["train/clients_failed"] == 0 and step["train/client_failures/_type"] == "table-file"
    table = json.loads((wb.parent / "files" / step["train/client_failures/path"]).read_text())
    assert table["data"] == [[hit[0]["round"], f] for f in hit[0]["client_failures"]]


# --- row 10: Ctrl-C during Ray start-up (and kill -9: docs/reliability.md) -----------------
def _default_sigint() -> None:
    """In the child before exec: Ctrl-C as a terminal's foreground job gets it. A process
    whose SIGINT is ignored passes that on to its children (and a background job of a
    non-interactive shell starts so), which is not the case under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_serial_fit_is_an_interrupted_run_that_resumes(tmp_path):
    """Lightning turns Ctrl-C inside `trainer.fit` into `sys.exit(1)` (and ignores SIGINT
    from then on): the run must still end "interrupted", exit 130, and resume."""
    args = small(tmp_path, *TINY[:-1], "fl.local_steps=60", "runtime=serial", "fl.rounds=500", "run_id=s")
    run_dir = tmp_path / "default" / "s"
    proc = subprocess.Popen(
        [EXE, "run", *args, "--quiet"], start_new_session=True, preexec_fn=_default_sigint,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        metrics = run_dir / "metrics.jsonl"
        while not metrics.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # well inside a later round's fits (60 steps per client)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    assert "interrupted" in _one_line(err.decode())
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    done = len(_records(run_dir))
    assert main(["resume", str(run_dir), f"fl.rounds={done + 1}", "--quiet"]) == 0
    assert [r["round"] for r in _records(run_dir)] == list(range(1, done + 2))


class _SignalOnThirdWrite:
    """A file that sends this process SIGINT at its third write: Ctrl-C inside torch's zip
    writer, the moment a CI run once hit (the writer's own "unexpected pos" error then hid
    the Ctrl-C and the run ended as a crash)."""

    def __init__(self, f, sent: list[int]) -> None:
        self.f, self.sent = f, sent

    def write(self, data) -> int:
        self.sent.append(1)
        if len(self.sent) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_ctrl_c_while_a_checkpoint_is_written_ends_the_run_interrupted(tmp_path, monkeypatch, capsys):
    from fl_lightning.runtime import checkpoint

    real, sent = checkpoint._atomic_write, []

    def interrupted_in_round_2(path, write):
        if path.name == "round-000002.pt":
            return real(path, lambda f: write(_SignalOnThirdWrite(f, sent)))
        return real(path, write)

    run_dir = tmp_path / "default" / "k"
    monkeypatch.setattr(checkpoint, "_atomic_write", interrupted_in_round_2)
    args = small(tmp_path, *TINY, "runtime=serial", "fl.rounds=4", "run_id=k")
    # as in a terminal (CI may run the suite with SIGINT ignored, as a background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["run", *args, "--quiet"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(sent) > 3, "the checkpoint write was never reached"
    assert "interrupted" in _one_line(capsys.readouterr().err)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    monkeypatch.setattr(checkpoint, "_atomic_write", real)
    assert main(["resume", str(run_dir), "--quiet"]) == 0  # round 2's checkpoint is whole
    assert [r["round"] for r in _records(run_dir)] == [1, 2, 3, 4]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find processes")
@pytest.mark.slow
def test_ctrl_c_during_ray_start_up_leaves_no_ray_process(tmp_path, data_root):
    ray_tmp = tempfile.mkdtemp(prefix="flr", dir="/tmp")  # short: Ray's socket paths are limited
    env = {**os.environ, "FL_LIGHTNING_RAY_TMPDIR": ray_tmp}
    args = small(tmp_path, *TINY, "fl.rounds=50", "runtime.address=local", "run_id=c")
    proc = subprocess.Popen(
        [EXE, "run", *args, "--quiet"], env=env, start_new_session=True, preexec_fn=_default_sigint,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # Ctrl-C once Ray's two agents are up (what used to outlive the run by 1-2.5 minutes),
        # while the actors start; at the latest when the first round is written
        _until_agents(proc, ray_tmp, tmp_path / "default" / "c" / "metrics.jsonl")
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err.decode()
        assert "interrupted" in _one_line(err.decode())
        left = _left_after(ray_tmp, 15)
        assert not left, f"Ray processes outlived the run: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        _clean_up(ray_tmp)


@pytest.mark.fresh_ray  # it checks that its workers give their CPUs back: from all free
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["ctrl_c", "sighup"])
def test_a_signal_while_the_ray_workers_start_leaves_an_interrupted_summary(
    tmp_path, capsys, ray_session, sig
):
    """Ctrl-C (or SIGHUP: its terminal closed) the moment the run directory has its partition,
    while the client workers start: the worker start-up ran before the try/finally that writes
    summary.json, so the run had none (and SIGHUP ended the process at once). Now one line,
    exit 128 + the signal, `interrupted`, its workers ended (the shared Ray stays up, its CPUs
    free), and `resume` finishes it."""
    from fl_lightning.runtime.signals import handled_here, our_handler

    args = small(tmp_path, *TINY, "fl.rounds=1", "runtime.early_start=false", "run_id=w")
    run_dir = tmp_path / "default" / "w"
    sent: list[str] = []

    def signal_once_partitioned() -> None:
        deadline = time.monotonic() + 300
        while not (run_dir / "partition.json").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        # ours, or `held`'s that defers it over Ray's start-up; never SIGHUP's default: it ends pytest
        ours = handled_here(sig)  # (`our_handler()` is None inside a `held` block: it defers)
        if sig == signal.SIGINT or ours:
            os.kill(os.getpid(), sig)
        sent.append("sent" if sig == signal.SIGINT or ours else "no handler of ours")

    if signal.getsignal(sig) is signal.SIG_IGN and sig == signal.SIGHUP:
        pytest.skip("SIGHUP is ignored here (nohup), and so by the run")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    if our_handler() is None:  # the shared Ray's `ray.init` left its own, which a command's run never meets
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    watcher = threading.Thread(target=signal_once_partitioned, daemon=True)
    try:
        watcher.start()
        code = main(["run", *args, "--quiet"])
    finally:
        watcher.join(timeout=300)
        signal.signal(signal.SIGINT, previous)
        for s, handler in before.items():
            if handler is not None:  # (None: set outside Python, nothing to put back)
                signal.signal(s, handler)
    assert sent == ["sent"]
    what = "interrupted (Ctrl-C)" if sig == signal.SIGINT else "terminated (SIGHUP)"
    assert code == 128 + sig and what.split(" (")[0] in _one_line(capsys.readouterr().err)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == what
    assert summary["rounds_completed"] == 0 and not (run_dir / "metrics.jsonl").exists()
    # its workers ended: the shared Ray's CPUs are free again within 60 s
    assert cpus_free(wait_s=60), "the interrupted run's workers hold the shared Ray's CPUs"
    if sig == signal.SIGINT:  # (the way out after the signal is the same)
        assert main(["resume", str(run_dir), "runtime.executor=serial", "--quiet"]) == 0
        assert [r["round"] for r in _records(run_dir)] == [1]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find processes")
@pytest.mark.slow
def test_sigterm_stops_a_run_like_ctrl_c(tmp_path):
    """`kill <pid>` (also what `ray job stop` sends): exit 143, one line, the run `interrupted`
    and resumable, no Ray process left; not Ray's stack dump and a run with no summary. On Ray
    here; a serial run's SIGTERM is the end of `test_a_second_writer_gets_one_line_naming_the_holder`."""
    ray_tmp = tempfile.mkdtemp(prefix="flr", dir="/tmp")
    args = small(tmp_path, *TINY[:-1], "fl.local_steps=20", "runtime.address=local", "fl.rounds=500")
    args.append("run_id=t")
    run_dir = tmp_path / "default" / "t"
    proc = subprocess.Popen(
        [EXE, "run", *args, "--quiet"], env={**os.environ, "FL_LIGHTNING_RAY_TMPDIR": ray_tmp},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        metrics = run_dir / "metrics.jsonl"
        while not metrics.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.terminate()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err.decode()
        line = _one_line(err.decode())
        assert "terminated (SIGTERM)" in line and "continue with `fl-lightning resume <run dir>`" in line
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
        left = _left_after(ray_tmp, 15)
        assert not left, f"Ray processes outlived the run: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        _clean_up(ray_tmp)
    done = len(_records(run_dir))
    assert main(["resume", str(run_dir), "runtime.executor=serial", f"fl.rounds={done + 1}", "--quiet"]) == 0
    assert [r["round"] for r in _records(run_dir)] == list(range(1, done + 2))


class _SigtermAt(Callback):
    """Sends this process SIGTERM at one moment of a run: with its last round's line
    (`last_line`), or on the way out, once summary.json is written (`way_out`)."""

    def __init__(self, when: str, last: int) -> None:
        self.when, self.last, self.sent = when, last, False

    def _send(self) -> None:
        self.sent = True
        os.kill(os.getpid(), signal.SIGTERM)

    def on_line(self, record) -> None:
        if self.when == "last_line" and record.round == self.last:
            self._send()

    def on_run_end(self, status: str, summary: dict) -> None:
        if self.when == "way_out":
            self._send()


@pytest.mark.parametrize("when", ["last_line", "way_out"])
def test_sigterm_after_the_last_line_leaves_a_whole_run(tmp_path, when):
    """S-5: SIGTERM right after the last round's metrics line exited 143 with summary.json
    `completed` and no curves.png, and `resume` answered "already finished": the picture was
    lost for good. Now a signal once summary.json is written waits for the picture and says
    nothing is left to resume (`StoppedAfterCompletion`); one a moment earlier (with the last
    line) leaves the run `interrupted`, and its resume runs no round and ends it whole."""
    from fl_lightning.runtime.signals import our_handler, stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    if our_handler() is None:  # a shared Ray's `ray.init` may have left its own
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert stop_on_sigterm()
    args = small(tmp_path, *TINY, "fl.rounds=2", "runtime=serial", f"run_id={when}")
    run_dir = tmp_path / "default" / when
    hook = _SigtermAt(when, last=2)
    try:
        if when == "way_out":
            with pytest.raises(StoppedAfterCompletion):
                start_run(compose(args), console=False, callbacks=[hook])
        else:
            with pytest.raises(Terminated):
                start_run(compose(args), console=False, callbacks=[hook])
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
    assert hook.sent
    assert [r["round"] for r in _records(run_dir)] == [1, 2]
    status = json.loads((run_dir / "summary.json").read_text())["status"]
    if when == "way_out":
        assert status == "completed" and (run_dir / "curves.png").stat().st_size > 0
        return
    assert status == "interrupted" and not (run_dir / "curves.png").exists()
    assert main(["resume", str(run_dir), "--quiet"]) == 0
    assert [r["round"] for r in _records(run_dir)] == [1, 2]  # no round run twice
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    assert (run_dir / "curves.png").stat().st_size > 0
    (run_dir / "curves.png").unlink()  # drawing it was killed (kill -9): the next resume draws it
    assert main(["resume", str(run_dir), "--quiet"]) == 0
    assert (run_dir / "curves.png").stat().st_size > 0


def test_sigterm_of_an_estimate_names_nothing_to_resume(tmp_path):
    """`reproduce --estimate` writes no run: stopped, its one line says so and offers no
    `resume` (it did: "continue with `fl-lightning resume <run dir>`", of no run)."""
    proc = subprocess.Popen(
        [EXE, "reproduce", "fedglcl", "--scale", "paper", "--estimate"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # its header: the backbones are being timed now (~90 s here)
        assert first.startswith("reproduce fedglcl (paper)"), first + (
            proc.stderr.read() if proc.stderr else ""
        )
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    assert _one_line(err) == "fl-lightning: terminated (SIGTERM)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run"], "; continue with `fl-lightning resume <run dir>`"),
        (["resume", "x"], "; continue with `fl-lightning resume <run dir>`"),
        (["sweep", "seed=0,1"], "; continue with `fl-lightning sweep --resume <sweep folder>`"),
        (
            ["reproduce", "fedtsp"],
            "; run the same command again: finished runs are kept, interrupted ones resume",
        ),
        (["reproduce", "fedtsp", "--dry-run"], ""),
        (["reproduce", "fedtsp", "--list"], ""),
        (["reproduce", "fedtsp", "--report-only"], ""),
        (["compare", "x"], ""),
    ],
)
def test_an_interrupted_command_says_how_it_continues(argv, says):
    from fl_lightning.cli.main import _how_to_continue, _parser

    args, _ = _parser().parse_known_args(argv)
    assert _how_to_continue(args) == says


# --- row 11: resume of a finished run --------------------------------------------------------
def test_resume_of_a_finished_run_returns_at_once(tmp_path, capsys, monkeypatch, finished):
    run_dir = _copy(finished, tmp_path / "run")
    files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    ray_tmp = tmp_path / "ray"
    monkeypatch.setenv("FL_LIGHTNING_RAY_TMPDIR", str(ray_tmp))  # where a Ray start would write
    assert main(["resume", str(run_dir), "runtime.executor=ray", "runtime.address=local"]) == 0
    line = _one_line(capsys.readouterr().err)
    assert "already finished" in line and "nothing to do" in line
    assert not ray_tmp.exists()  # Ray was never started
    assert files == {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}


# --- the soak test (optional: FL_LIGHTNING_SOAK=1) --------------------------------------------
@pytest.mark.skipif(os.environ.get("FL_LIGHTNING_SOAK") != "1", reason="slow soak test: FL_LIGHTNING_SOAK=1")
def test_soak_30_rounds_with_an_actor_killed_every_few_rounds(tmp_path, data_root, ray_session):
    args = small(tmp_path, *TINY, "method=moon", "fl.rounds=30", "runtime.threads_per_client=1")
    start_run(compose([*args, "runtime=serial", "run_id=serial"]), console=False)
    run_dir = tmp_path / "default" / "ray"
    killed: list[str] = []
    killer = _kill_actor_after(run_dir / "checkpoints", [2, 7, 12, 17, 22, 27], killed)
    summary, _ = start_run(compose([*args, "runtime.placement=per_client", "run_id=ray"]), console=False)
    killer.join(timeout=5)
    assert len(killed) == 6, killed
    recs = _records(run_dir)
    assert sum(r["clients_retried"] for r in recs) == 6 and summary["clients_failed_total"] == 0
    assert [r["accuracy"] for r in recs] == [r["accuracy"] for r in _records(tmp_path / "default" / "serial")]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find processes")
@pytest.mark.slow
def test_kill_9_of_the_driver_leaves_no_ray_process(tmp_path, data_root):
    """kill -9 of a driver once Ray's two agents are up (its workers start): 10 s later no
    process of that Ray is left, the agents included (they outlived such a driver by a minute
    or more, and a search by environment mark could not see them)."""
    ray_tmp = tempfile.mkdtemp(prefix="flr", dir="/tmp")
    args = small(tmp_path, *TINY, "fl.rounds=50", "runtime.address=local", "run_id=k")
    proc = subprocess.Popen(
        [EXE, "run", *args, "--quiet"], env={**os.environ, "FL_LIGHTNING_RAY_TMPDIR": ray_tmp},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _until_agents(proc, ray_tmp)
        assert _agents(_of_run(ray_tmp)) == 2  # what is looked for afterwards is seen
        proc.kill()
        proc.wait()
        left = _left_after(ray_tmp, 10)
        assert not left, f"Ray processes outlived the killed driver: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        _clean_up(ray_tmp)


# --- a killed sweep resumes -------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def _holder_pid(run_dir: Path) -> int | None:
    try:
        text = (run_dir / ".lock").read_text().split()
    except OSError:
        return None
    return int(text[0]) if text and text[0].isdigit() else None


def _run_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "config.yaml").exists())


def _sweep_need(run_dir: Path, rounds: int) -> str:
    """What `sweep --resume` does with a run directory, read off the disk by the rule
    `cli/sweep.py::continue_run` documents: `finished` (summary.json says it completed its
    rounds, or diverged), `resume` (a checkpoints folder and fewer rounds in metrics.jsonl than
    asked), else `restart`."""
    from fl_lightning.tracking.reproduce import read_run

    state = read_run(run_dir)  # summary.json and metrics.jsonl as the sweep reads them
    done = int(state.summary.get("rounds_completed") or 0)
    if (state.status == "completed" and done >= rounds) or state.status == "diverged":
        return "finished"
    last = max((int(r["round"]) for r in state.records if "round" in r), default=0)
    return "resume" if (run_dir / "checkpoints").is_dir() and last < rounds else "restart"


@pytest.mark.slow
def test_a_killed_parallel_sweep_resumes_without_duplicates_or_orphans(tmp_path, capsys, data_root):
    """kill -9 of `sweep --parallel 2` once a run has checkpointed: its runs end with it (no
    orphan trains on), `sweep --resume` refuses while another sweep holds the folder, then
    finishes the grid: finished runs skipped, interrupted ones resumed from their checkpoint,
    one killed before its first checkpoint started again, every run once, every round once."""
    out = tmp_path / "runs"
    grid = ["seed=0,1,2", *small(out, *TINY, "runtime=serial", "fl.rounds=3", "experiment=sw")]
    sweep = subprocess.Popen([EXE, "sweep", *grid, "--parallel", "2", "--no-plots"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    folder = out / "sw"
    children: list[int] = []
    hogs: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 300
        recorded = folder / "sweep.json"  # (written once the sweep holds the folder)
        while not recorded.exists() and sweep.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _holder_pid(folder) == sweep.pid, sweep.stderr.read().decode() if sweep.poll() else ""
        # a second live sweep on the folder: refused, while this one's runs still start
        assert main(["sweep", "--resume", str(folder)]) == 2
        assert f"in use by another sweep (PID {sweep.pid}" in _one_line(capsys.readouterr().err)
        while time.monotonic() < deadline and sweep.poll() is None:
            if list(folder.glob("*/checkpoints/round-000001.json")):
                break
            time.sleep(0.05)
        assert sweep.poll() is None, sweep.stderr.read().decode() if sweep.stderr else ""
        children = [p for p in map(_holder_pid, _run_dirs(folder)) if p]
        assert children, "no run was started"
        # two CPU-bound processes in this test's process group compete with the runs' way out
        # (which drew curves.png, importing matplotlib, for minutes on two busy cores)
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        sweep.kill()  # kill -9: the runs get SIGTERM from the kernel (PR_SET_PDEATHSIG)
        sweep.wait()
        # their way out (summary.json, W&B, the watchdog's sweep of Ray) beside the two hogs and a
        # loaded suite took over 120 s once (CI, 3 pytest workers on 2 cores): wait for the end,
        # not for a time; a run that trained on would still be alive long after this
        deadline = time.monotonic() + 600
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in children), "a run of the killed sweep trains on"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if sweep.poll() is None:
            sweep.kill()
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert json.loads((folder / "sweep.json").read_text())["overrides"] == [*grid]
    started = _run_dirs(folder)
    assert any((d / "checkpoints" / "round-000001.json").exists() for d in started) and len(started) <= 3
    # What each run left decides what the resumed sweep does with it; how far each got when the
    # sweep died depends on the machine's load (under load, one run may even have finished), so
    # the expectation is read off the disk, as the sweep reads it
    # (every run directory the grid made, also one killed before its config.yaml: the sweep
    # restarts that too)
    made = [d for d in folder.iterdir() if d.is_dir() and ((d / ".lock").exists() or d in started)]
    need = {d: _sweep_need(d, rounds=3) for d in made}
    for d in [d for d in made if need[d] == "restart"]:  # made sure of: its checkpoints go
        shutil.rmtree(d / "checkpoints", ignore_errors=True)
    if "restart" not in need.values() and "resume" in need.values():  # one run killed before its
        d = [d for d in made if need[d] == "resume"][-1]  # first checkpoint, made so
        shutil.rmtree(d / "checkpoints")
        need[d] = _sweep_need(d, rounds=3)
        assert need[d] == "restart"
    counts = {k: sum(v == k for v in need.values()) for k in ("finished", "resume", "restart")}
    # the lines of a run that resumes (or had finished) stay as written: a run killed between its
    # checkpoint and that round's metrics line has no line yet (the checkpoint carries it, and
    # resume writes it), so only lines already written are compared
    lines = {d: d / "metrics.jsonl" for d in made if need[d] in ("resume", "finished")}
    kept = {d.name: f.read_text() for d, f in lines.items() if f.exists() and f.read_text().strip()}

    # the resumed sweep runs its runs one after another, here in this process (what it resumes
    # is the same either way; a process per run, as --parallel starts, costs ~5 CPU-seconds each)
    assert main(["sweep", "--resume", str(folder), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    want = f"{counts['finished']} finished, {counts['resume']} to resume, {counts['restart']} to restart"
    assert want in printed, (want, printed)
    runs = _run_dirs(folder)
    assert len(runs) == 3, [d.name for d in runs]  # no run twice
    for d in runs:
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds_completed"] == 3
        assert [r["round"] for r in _records(d)] == [1, 2, 3]  # every round once
    for name, text in kept.items():  # a resumed run keeps the rounds it had checkpointed
        first = json.loads(text.splitlines()[0])
        assert _records(folder / name)[0] == first
    assert sorted(json.loads((d / "summary.json").read_text())["seed"] for d in runs) == [0, 1, 2]

    # the same sweep again: everything finished, nothing runs or changes
    before = {d.name: (d / "metrics.jsonl").read_bytes() for d in runs}
    assert main(["sweep", *grid, "--no-plots"]) == 0
    assert "3 finished, 0 to resume, 0 to restart" in capsys.readouterr().out
    assert {d.name: (d / "metrics.jsonl").read_bytes() for d in _run_dirs(folder)} == before


def test_a_different_sweep_in_a_recorded_folder_is_one_line(tmp_path, capsys):
    folder = tmp_path / "runs" / "sw"
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({
        "format": "fl_lightning.sweep/1", "overrides": ["seed=0,1", "experiment=sw"], "runs": [],
    }))  # fmt: skip
    args = ["sweep", "seed=0,1,2", *small(tmp_path / "runs", *TINY, "experiment=sw")]
    assert main(args) == 2
    assert "holds another sweep" in _one_line(capsys.readouterr().err)
    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    assert "holds no sweep" in _one_line(capsys.readouterr().err)


# --- a run that learned nothing is flagged, not a success -------------------------------------
def test_chance_level_and_margin_come_from_the_test_targets():
    import math

    import torch
    from torchmetrics.functional.classification import multilabel_average_precision

    from fl_lightning.tracking.chance import chance_level

    y = np.repeat(np.arange(10), [60, 40, 50, 50, 50, 50, 50, 50, 50, 50])  # 500 images, class 0 most
    metric, level, margin = chance_level(y, multilabel=False)
    assert metric == "accuracy" and level == 60 / 500
    assert math.isclose(margin, 3 * math.sqrt(0.12 * 0.88 / 500))
    rng = np.random.default_rng(0)
    multi = (rng.random((400, 6)) < [0.05, 0.1, 0.2, 0.3, 0.5, 0.7]).astype(np.float32)
    metric, level, margin = chance_level(multi, multilabel=True)
    prevalence = float(multi.astype(np.float64).mean(0).mean())
    target = torch.from_numpy(multi).long()
    flat = multilabel_average_precision(torch.zeros(400, 6), target, num_labels=6)  # a constant model
    assert math.isclose(float(flat), prevalence, rel_tol=1e-5)  # gets the mean prevalence...
    assert metric == "c_ap" and prevalence < level < prevalence + 0.05  # ...random scores a bit more
    gen = torch.Generator().manual_seed(1)  # other draws than the margin's
    above = sum(
        float(multilabel_average_precision(torch.rand(400, 6, generator=gen), target, num_labels=6))
        > level + margin
        for _ in range(200)
    )
    assert above <= 4  # 3 standard deviations: ~0.1% expected above; 2% allowed for the estimate
    assert 0 < margin < 0.1


def test_a_run_at_chance_is_completed_with_a_warning_everywhere(tmp_path, capsys, data_root):
    """A run whose global accuracy never leaves chance (lr 1e-9: it does not learn) while its
    loss stays finite: `completed` plus `warning: no better than chance` in summary.json, and
    the sweep line, `compare`, the console of `resume`/`run` and `reproduce`'s report say so;
    the same sweep's learning run (lr 0.05) is not flagged."""
    from fl_lightning.tracking.reproduce import build_report, load_spec

    out = tmp_path / "runs"
    args = small(out, "runtime=serial", "experiment=ch", "method=fedavg")
    assert main(["sweep", "optim.lr=1e-9,0.05", *args, "--no-plots"]) == 0
    printed = capsys.readouterr().out
    flat_line = next(ln for ln in printed.splitlines() if ln.startswith("[1/2] optim.lr=1e-9: final"))
    good_line = next(ln for ln in printed.splitlines() if ln.startswith("[2/2] optim.lr=0.05: final"))
    assert flat_line.endswith("WARNING: no better than chance") and "WARNING" not in good_line
    flat, good = sorted((out / "ch").glob("fedavg_*"))
    s_flat = json.loads((flat / "summary.json").read_text())
    s_good = json.loads((good / "summary.json").read_text())
    assert s_flat["status"] == "completed" and s_flat["warning"] == "no better than chance"
    assert "warning" not in s_good and s_good["status"] == "completed"
    test_y = load_from_config(compose(args).data).test_y
    p = np.bincount(test_y).max() / len(test_y)  # always guessing the commonest test class
    chance = s_flat["chance"]
    assert chance["level"] == round(p, 6) and chance["rounds"] == [1, 2]
    assert all(v <= p + 3 * np.sqrt(p * (1 - p) / len(test_y)) for v in chance["values"])
    assert all(np.isfinite(r["train_loss"]) for r in _records(flat))

    assert main(["compare", str(out / "ch"), "--no-plots"]) == 0
    assert f"WARNING in group 'fedavg', no better than chance: {flat.name}" in capsys.readouterr().out
    assert main(["resume", str(flat), "--quiet"]) == 0  # finished: its summary, and the warning
    assert "fl-lightning: warning: no better than chance: accuracy" in capsys.readouterr().err

    spec_file = tmp_path / "ch.yaml"
    spec_file.write_text(
        "title: t\ncitation: c\nscales: {mini: {overrides: [], seeds: [0], needs: x}}\n"
        "rows: {flat: {overrides: [optim.lr=1e-9]}, good: {overrides: [optim.lr=0.05]}}\n"
        "claims: [{id: c, text: t, row: good, baseline: flat, metric: accuracy}]\n"
    )
    runs_dir = tmp_path / "reproduce"
    runs_dir.mkdir()
    shutil.copytree(flat, runs_dir / "flat_s0")
    shutil.copytree(good, runs_dir / "good_s0")
    report, numbers = build_report(load_spec(spec_file), "mini", runs_dir, [0], "cmd")
    row = next(ln for ln in report.splitlines() if ln.startswith("| flat |"))
    assert "1/1 (1 no better than chance)" in row
    assert numbers["rows"]["flat"]["accuracy"]["at_chance"] == 1
    assert numbers["rows"]["good"]["accuracy"]["at_chance"] == 0


def test_a_second_ctrl_c_on_the_way_out_still_leaves_a_summary(tmp_path, data_root):
    """Ctrl-C twice: the first while the driver waits for an overlapped global evaluation (a
    large test set, little training: where a run spends its time here), the second while the
    way out waits for that evaluation's thread. summary.json (`interrupted`, and why) is
    written before that wait, so the second Ctrl-C cannot cost it."""
    args = small(tmp_path, "runtime=serial", "data.test_subset=4000", "fl.num_clients=2", "fl.local_steps=1",
                 "eval.batch_size=100", "fl.rounds=40", "run_id=r")  # fmt: skip
    run_dir = tmp_path / "default" / "r"
    proc = subprocess.Popen(
        [EXE, "run", *args, "--quiet"], start_new_session=True, preexec_fn=_default_sigint,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        seen: list[float] = []  # when each round's line appeared: a round lasts one evaluation
        deadline = time.monotonic() + 600
        while len(seen) < 3 and proc.poll() is None and time.monotonic() < deadline:
            if (run_dir / "metrics.jsonl").exists():
                n = (run_dir / "metrics.jsonl").read_text().count("\n")
                seen += [time.monotonic()] * (n - len(seen))
            time.sleep(0.005)
        assert len(seen) == 3, proc.stderr.read() if proc.stderr else ""
        period = seen[2] - seen[1]
        time.sleep(period / 2)  # mid-evaluation, the next round's little training long done
        proc.send_signal(signal.SIGINT)
        # the second once the first has been handled (summary.json there: under load that took
        # longer than the 0.3 s this waited before), while the way out still waits for the
        # evaluation (~period / 2 of it left); summary.json written only after that wait, it
        # comes mid-wait and takes the summary with it
        second = time.monotonic() + period / 4
        while not (run_dir / "summary.json").exists() and time.monotonic() < second:
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == "interrupted (Ctrl-C)"
