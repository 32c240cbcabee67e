"""Progress of a long step, so that nothing that can take more than a few seconds runs
silent: a teacher's training, the server's prompt tuning, federated feature optimisation,
server distillation, a partition's redraws, decoding a folder of images, pretraining.

    from fl_lightning.core.progress import progress

    with progress("teacher build", total=epochs * batches, unit="batch") as bar:
        for ...:
            ...
            bar.update(loss=float(loss))      # one step; keyword values are shown beside it

On a terminal: a tqdm bar on stderr, shown once the step has run `delay_s` (2 s) and
removed when it ends. Elsewhere (a log file, a Ray job, CI): one line on stderr every
`$FL_LIGHTNING_PROGRESS_EVERY_S` seconds (default 30; 0: every step) with the count, the
time spent and the time left, and a last line when it ends, for a step that showed one
or took longer than `delay_s`. `$FL_LIGHTNING_PROGRESS=0` or `set_enabled(False)` (the
CLI's `--quiet`): nothing. Safe to update from several threads.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import IO, Any


def env_enabled() -> bool:
    """`$FL_LIGHTNING_PROGRESS` is not 0."""
    return os.environ.get("FL_LIGHTNING_PROGRESS", "1") != "0"


_enabled = env_enabled()


def set_enabled(on: bool) -> None:
    """Progress on or off for this process (`fl-lightning run --quiet`: off)."""
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    """Whether progress and announcements are shown in this process (`--quiet`: no)."""
    return _enabled


def announce(line: str) -> None:
    """One line on stderr before (or at the start of) a long step: what it is, how long it
    will take, how to shorten it. Off where progress is off (`--quiet`)."""
    if _enabled:
        print(line, file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _every_s() -> float:
    try:
        return max(0.0, float(os.environ.get("FL_LIGHTNING_PROGRESS_EVERY_S", "30")))
    except ValueError:
        return 30.0


class Progress:
    """One long step's progress (see the module docstring); `progress(...)` makes one."""

    def __init__(
        self,
        what: str,
        total: int | None,
        unit: str = "step",
        stream: IO[str] | None = None,
        delay_s: float = 2.0,
        every_s: float | None = None,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.delay_s = delay_s
        self.every_s = _every_s() if every_s is None else every_s
        self.n = 0
        self.info: dict[str, Any] = {}
        self.start = self._last = time.perf_counter()
        self.lines = 0
        self._lock = threading.Lock()
        self._bar: Any = None
        self.enabled = _enabled
        if self.enabled and _isatty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=what, unit=unit, file=self.stream, delay=delay_s, leave=False,
                dynamic_ncols=True,
            )  # fmt: skip

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(ok=kind is None)

    def update(self, n: int = 1, **info: Any) -> None:
        """`n` more steps done; `info` (a loss, ...) is shown with the count."""
        if not self.enabled:
            return
        with self._lock:
            self.n += n
            self.info.update(info)
            if self._bar is not None:
                if info:
                    self._bar.set_postfix({k: _short(v) for k, v in info.items()}, refresh=False)
                self._bar.update(n)
                return
            now = time.perf_counter()
            if now - self._last >= self.every_s:
                self._last = now
                self._write(self.line(now))

    def line(self, now: float | None = None) -> str:
        """`<what>: 120/1500 batches (8%), loss 1.2345, 30s spent, ~5m45s left`."""
        spent = (time.perf_counter() if now is None else now) - self.start
        unit = _plural(self.unit, self.total or self.n)  # "1/6 batches"
        parts = [f"{self.n}/{self.total} {unit} ({100 * self.n / max(self.total, 1):.0f}%)"
                 if self.total else f"{self.n} {unit}"]  # fmt: skip
        parts += [f"{k} {_short(v)}" for k, v in self.info.items()]
        parts.append(f"{duration(spent)} spent")
        if self.total and self.n:
            parts.append(f"~{duration(spent / self.n * max(self.total - self.n, 0))} left")
        return f"{self.what}: " + ", ".join(parts)

    def close(self, ok: bool = True) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
                return
            spent = time.perf_counter() - self.start
            if self.lines or spent >= self.delay_s:
                end = "done" if ok else "stopped"
                self._write(f"{self.what}: {end}, {self.n} {_plural(self.unit, self.n)} in {duration(spent)}")
            self.enabled = False  # closed: nothing more

    def _write(self, text: str) -> None:
        self.lines += 1
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe: progress is never worth a failed run
            pass


def progress(what: str, total: int | None = None, unit: str = "step", **kwargs: Any) -> Progress:
    """A progress line for a step of `total` units (None: unknown), as a context manager;
    `kwargs`: `stream`, `delay_s`, `every_s` (see `Progress`)."""
    return Progress(what, total, unit, **kwargs)


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _plural(unit: str, n: int) -> str:
    return unit if n == 1 else f"{unit}es" if unit.endswith(("sh", "tch")) else f"{unit}s"


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
