"""What two runs of the same config must share, read from their run directories: every metric of
every round (losses, accuracies, bytes, client counts; not timings or memory readings) and the
final checkpoint's state, the server's and every client's, tensor for tensor. A resumed run
is compared to an uninterrupted one with these (a lost or stale client state changes a loss or a
state before it changes an accuracy)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import torch

from fl_lightning.runtime import checkpoint

#: metrics that measure the machine, not the run
MACHINE = re.compile(r"time|_s$|_mb$|rss|anon")


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of metrics.jsonl without its timings and memory readings."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not MACHINE.search(k)} for line in lines]


def final_state(run_dir: Path) -> tuple[Any, dict[int, Any]]:
    """The newest checkpoint's server state and the state of every client it names."""
    path = checkpoint.latest(Path(run_dir))
    assert path is not None, f"no checkpoint in {run_dir}"
    state, _, index = checkpoint.load(path)
    return state, {c: checkpoint.load_client_state(Path(run_dir), c, r) for c, r in sorted(index.items())}


def assert_equal(a: Any, b: Any, where: str = "state") -> None:
    """Bit-identical: tensors by `torch.equal` (dtype included), dataclasses field by field."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_equal(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
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
