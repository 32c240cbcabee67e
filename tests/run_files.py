"""What two runs of the same config must share, read from their run directories: every metric of
every round (losses, accuracies, bytes, client counts; not timings or memory readings) and the
final checkpoint's state, the server's and every client's, tensor for tensor. A resumed run
is compared to an uninterrupted one with these (a lost or stale client state changes a loss or a
state before it changes an accuracy); `kill_after_checkpoint` makes the interrupted one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.runtime.runner import start_run
from fl_lightning.runtime.session import Session

#: metrics that measure the machine, not the run
MACHINE = re.compile(r"time|_s$|_mb$|rss|anon")


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of metrics.jsonl without its timings and memory readings."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not MACHINE.search(k)} for line in lines]


def _tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A checkpoint's JSON tree with its tensors put in; dataclasses stay dicts that name their
    class (`__dataclass__`), so no class is looked up: this reads any run's files, a method's
    from outside the package included."""
    if isinstance(obj, list):
        return [_tree(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__dict__" in obj:
        return {_tree(k, tensors): _tree(v, tensors) for k, v in obj["__dict__"]}
    return {k: _tree(v, tensors) for k, v in obj.items()}


def final_state(run_dir: Path) -> tuple[Any, dict[int, Any]]:
    """The newest checkpoint's server state and the state of every client it names, as trees."""
    ckdir = Path(run_dir) / "checkpoints"
    found = sorted(ckdir.glob("round-*.json"))
    assert found, f"no checkpoint in {run_dir}"
    doc = json.loads(found[-1].read_text())
    server = _tree(doc["state"], torch.load(found[-1].with_suffix(".pt"), weights_only=True))
    clients = {}
    for c, r in doc["clients"]:
        saved = torch.load(ckdir / "clients" / f"c{c:07d}-r{r:06d}.pt", weights_only=True)
        clients[int(c)] = _tree(json.loads(saved["tree"]), saved["tensors"])
    return server, clients


def assert_equal(a: Any, b: Any, where: str = "state") -> None:
    """Bit-identical: tensors by `torch.equal` (dtype included), containers item by item."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_same_run(a: Path, b: Path, stateful: bool = True) -> None:
    """Runs `a` and `b` agree on every metric of every round and on their final state;
    `stateful`: some client keeps a state (a test that expects one cannot pass without it)."""
    ra, rb = records(a), records(b)
    assert len(ra) == len(rb), (len(ra), len(rb))
    for x, y in zip(ra, rb, strict=True):
        assert x == y, {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)}
    (sa, ca), (sb, cb) = final_state(a), final_state(b)
    assert_equal(sa, sb, "server")
    assert_equal(ca, cb, "clients")
    assert not stateful or any(ca.values()), "no client kept a state: nothing was compared"


def kill_after_checkpoint(
    overrides: Sequence[str],
    run_dir: Path,
    rnd: int = 2,
    wait_s: float = 300.0,
    while_stopped: Callable[[], Any] | None = None,
) -> Any:
    """`fl-lightning run *overrides --quiet` in a process of its own (its run directory
    `run_dir`), killed with SIGKILL (no chance to clean up) once round `rnd`'s checkpoint is on
    disk. It is stopped first (SIGSTOP) and `while_stopped` reads what the files hold at the
    kill (a line not yet written); its value is returned. Waits for the checkpoint, not for a
    time: `wait_s` only bounds a run that never gets there (a slow machine's is minutes)."""
    exe = os.path.join(os.path.dirname(sys.executable), "fl-lightning")
    proc = subprocess.Popen([exe, "run", *overrides, "--quiet"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    marker = Path(run_dir) / "checkpoints" / f"round-{rnd:06d}.json"
    try:
        deadline = time.monotonic() + wait_s
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.stderr is not None
        assert marker.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no checkpoint"
        proc.send_signal(signal.SIGSTOP)
        return while_stopped() if while_stopped is not None else None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


#: clients in two pooled Ray actors (in the suite, `ray_session`'s Ray): an actor fits whichever
#: client it is handed, so randomness drawn per process, not per (seed, round, client), differs
#: from the serial run's
POOL = ["runtime=ray", "runtime.placement=pool", "runtime.num_actors=2"]


def assert_serial_is_ray_and_resume_is_exact(
    overrides: Sequence[str], session: Session | None = None
) -> Path:
    """One config (`overrides`) run serially, on pooled Ray actors
    (`POOL`, in `session`: the `ray_workers` fixture's), and killed (-9) after its next-to-last
    round's checkpoint then resumed: all three agree on every metric and on the final server and
    client state, bit for bit. The serial run's directory is returned."""
    cfg = compose(list(overrides))
    rounds = int(cfg.fl.rounds)
    _, serial = start_run(compose([*overrides, "runtime=serial", "experiment=full", "run_id=serial"]),
                          console=False)  # fmt: skip
    _, ray = start_run(compose([*overrides, *POOL, "experiment=full", "run_id=ray"]), console=False,
                       session=session)  # fmt: skip
    assert_same_run(ray, serial)
    killed = Path(cfg.output_dir) / "killed" / "b"
    kill_after_checkpoint([*overrides, "runtime=serial", "experiment=killed", "run_id=b"], killed, rounds - 1)
    # a run that got to its last checkpoint before the kill would test nothing
    assert not (killed / "checkpoints" / f"round-{rounds:06d}.json").exists(), "finished before the kill"
    assert main(["resume", str(killed), "--quiet"]) == 0
    assert_same_run(killed, serial)
    return serial
