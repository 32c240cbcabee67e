"""SIGTERM (and SIGHUP: the terminal closed) stops a run the way Ctrl-C does.

By default SIGTERM kills the driver outright (with a local Ray, Ray's own handler prints a
stack dump first): `summary.json` is never written and the run looks failed. `stop_on_sigterm`
makes it raise `Terminated` (a KeyboardInterrupt) in the main thread instead, so the runner
ends the run `interrupted`, shuts its Ray down and `resume` continues it. `ray.init` installs
its own SIGTERM handler in the driver; `init_ray` puts ours back afterwards. SIGHUP, by
default also the end of the process with no summary, gets the same handler (not where it is
ignored: `nohup` asks for that).

`held()` defers both signals over a block that must not stop half-way (Ray's start-up, a
checkpoint write): torch's zip writer, interrupted mid-file, raised a RuntimeError that hid
the Ctrl-C and turned an interrupted run into a crashed one.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from ..core.errors import Terminated


class _Terminator:
    """Our SIGTERM (and SIGHUP) handler. It remembers which signal fired (`terminated`): Ray
    may re-raise a plain KeyboardInterrupt from inside `ray.get`. The handler installed is the
    only copy of that fact, so there is no module-level state."""

    def __init__(self) -> None:
        self.fired: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.fired = signum
        raise Terminated


def our_handler() -> _Terminator | None:
    """Our SIGTERM handler, if it is the one installed."""
    handler = signal.getsignal(signal.SIGTERM)
    return handler if isinstance(handler, _Terminator) else None


def handled_here(signum: int) -> bool:
    """Whether `signum` reaches our handler, or `held`'s that defers it (a signal sent now is
    the run's to handle, not the default's)."""
    handler = signal.getsignal(signum)
    return isinstance(handler, _Terminator | _Hold)


def terminated() -> bool:
    """Whether this process got SIGTERM or SIGHUP (through our handler)."""
    return stop_signal() is not None


def stop_signal() -> signal.Signals | None:
    """The signal that stopped this process through our handler (SIGTERM, SIGHUP), if one did;
    inside a `held` block too (the way out writes summary.json in one: its `error` names the signal)."""
    handler = our_handler()
    held_over = signal.getsignal(signal.SIGTERM)
    if handler is None and isinstance(held_over, _Hold):
        handler = held_over.sigterm
    return None if handler is None or handler.fired is None else signal.Signals(handler.fired)


def stop_on_sigterm() -> bool:
    """Install the handler (main thread only, and only over the default disposition: an
    embedding program's own handler is left alone; SIGHUP likewise, unless ignored). True if
    it is in place."""
    if threading.current_thread() is not threading.main_thread():
        return False
    handler = our_handler()
    if handler is not None:
        handler.fired = None  # a new command of this process (tests call `main` again) starts unsignalled
    elif signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return False
    else:
        handler = _Terminator()
        signal.signal(signal.SIGTERM, handler)
    # checked on every command, not only the first: SIGHUP may be back at its default since
    if signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, None):  # SIG_IGN (nohup): left ignored
        signal.signal(signal.SIGHUP, handler)
    return True


def restore_after_ray_init(handler: _Terminator | None) -> None:
    """`ray.init` replaced the C-level SIGTERM handler behind Python's back: re-install ours."""
    if handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then raise KeyboardInterrupt (or
    `Terminated`). A second signal raises at once: a user who insists is never ignored.
    Only in the main thread and over the handlers we know (Python's SIGINT default, ours for
    SIGTERM); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigterm = our_handler()
    hold = _Hold(sigterm)
    previous = {}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, hold)
    if sigterm is not None:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, hold)
    if sigterm is not None and signal.getsignal(signal.SIGHUP) is sigterm:
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if hold.got:
        _raise(next((s for s in hold.got if s != signal.SIGINT), hold.got[0]), sigterm)


class _Hold:
    """`held`'s handler: the first signal waits for the block's end, a second raises at once.
    It knows the handler it stands in for (`stop_signal` looks through it)."""

    def __init__(self, sigterm: _Terminator | None) -> None:
        self.sigterm, self.got = sigterm, list[int]()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.got:
            _raise(signum, self.sigterm)
        self.got.append(signum)


def _raise(signum: int, sigterm: _Terminator | None) -> None:
    if signum != signal.SIGINT and sigterm is not None:
        sigterm(signum, None)
    raise KeyboardInterrupt
