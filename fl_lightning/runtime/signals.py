"""SIGTERM stops a run the way Ctrl-C does.

By default SIGTERM kills the driver outright (with a local Ray, Ray's own handler prints a
stack dump first): `summary.json` is never written and the run looks failed. `stop_on_sigterm`
makes it raise `Terminated` (a KeyboardInterrupt) in the main thread instead, so the runner
ends the run `interrupted`, shuts its Ray down and `resume` continues it. `ray.init` installs
its own SIGTERM handler in the driver; `init_ray` puts ours back afterwards.

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

_received: list[int] = []


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)  # Ray may re-raise a plain KeyboardInterrupt from inside ray.get
    raise Terminated


def terminated() -> bool:
    """Whether this process got SIGTERM (through our handler)."""
    return bool(_received)


def stop_on_sigterm() -> bool:
    """Install the handler (main thread only, and only over the default disposition: an
    embedding program's own handler is left alone). True if it is in place."""
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if current is _raise_terminated:
        return True
    if current not in (signal.SIG_DFL, None):
        return False
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True


def restore_after_ray_init(was_ours: bool) -> None:
    """`ray.init` replaced the C-level SIGTERM handler behind Python's back: re-install ours."""
    if was_ours and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def ours() -> bool:
    return signal.getsignal(signal.SIGTERM) is _raise_terminated


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then raise KeyboardInterrupt (or
    `Terminated`). A second signal raises at once: a user who insists is never ignored.
    Only in the main thread and over the handlers we know (Python's SIGINT default, ours for
    SIGTERM); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if got:
            _raise(signum)
        got.append(signum)

    previous = {}
    for sig, known in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, _raise_terminated)):
        if signal.getsignal(sig) is known:
            previous[sig] = signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if got:
        _raise(signal.SIGTERM if signal.SIGTERM in got else got[0])


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        _raise_terminated(signum, None)
    raise KeyboardInterrupt
