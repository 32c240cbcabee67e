"""Live progress of a sweep's runs: a background thread that follows each active run's
`metrics.jsonl` and prints one line per completed round (the round, the primary metric so
far, the time spent and the time left), so a sweep never leaves a silent terminal. It reads
only the files a run writes anyway, so it works the same for runs in this process and in
subprocesses (`--parallel`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

PRIMARY = ("accuracy", "client_accuracy", "c_ap", "client_c_ap")


def round_line(label: str, record: dict[str, Any], rounds: int, elapsed: float) -> str:
    rnd = int(record.get("round", 0))
    metric = next((k for k in PRIMARY if isinstance(record.get(k), float)), None)
    loss = record.get("train_loss")
    value = (
        f"{metric} {record[metric]:.4f}"
        if metric
        else f"train loss {loss:.4f}"
        if isinstance(loss, (int, float))
        else "train loss -"
    )
    if record.get("diverged"):  # strict JSON: its non-finite numbers are null
        value = "DIVERGED (non-finite: " + ", ".join(record.get("nonfinite") or ["?"]) + ")"
    left = elapsed / max(rnd, 1) * max(rounds - rnd, 0)
    return f"{label}: round {rnd}/{rounds}  {value}  {elapsed:.0f}s, ~{left:.0f}s left"


class RoundMonitor:
    """Follows run directories added with `watch`; prints a line per new round."""

    def __init__(self, out: IO[str], interval_s: float = 0.5) -> None:
        self.out = out
        self.interval_s = interval_s
        self._runs: dict[Path, tuple[str, int, float, int]] = {}  # dir -> label, rounds, start, seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweep-progress", daemon=True)

    def __enter__(self) -> RoundMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()  # the last rounds of runs that just ended

    def watch(self, run_dir: Path, label: str, rounds: int) -> None:
        with self._lock:
            self._runs[Path(run_dir)] = (label, rounds, time.perf_counter(), 0)

    def forget(self, run_dir: Path) -> None:
        self._poll()
        with self._lock:
            self._runs.pop(Path(run_dir), None)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def _poll(self) -> None:
        with self._lock:
            items = list(self._runs.items())
        for run_dir, (label, rounds, start, seen) in items:
            lines = _read_lines(run_dir / "metrics.jsonl")
            for raw in lines[seen:]:
                try:
                    record = json.loads(raw)
                except ValueError:
                    break  # a line being written: read it next time
                self.out.write(round_line(label, record, rounds, time.perf_counter() - start) + "\n")
                self.out.flush()
                seen += 1
            with self._lock:
                if run_dir in self._runs:
                    self._runs[run_dir] = (label, rounds, start, seen)


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except OSError:
        return []
    # only complete lines: the writer appends a line and its newline in one write
    return text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]


def monitored(monitor: RoundMonitor, run_dir: Path, label: str, rounds: int, fn: Callable[[], None]) -> None:
    monitor.watch(run_dir, label, rounds)
    try:
        fn()
    finally:
        monitor.forget(run_dir)
