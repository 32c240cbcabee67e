"""How a run ends on disk: `summary.json` says why it stopped (`error`, one line) and what is
wrong with a run that finished (`warning`), and it is written before anything slow happens on
the way out, so a second Ctrl-C, a full disk or a removed run directory never leaves a run
without one or hides why it stopped."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("fl_lightning")

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class _SummaryWriter(Protocol):
    run_dir: Path

    def log_summary(self, summary: dict[str, Any]) -> None: ...


def os_error_line(e: OSError, run: bool = True) -> str:
    """One line for a file the run could not write or read: a full disk, a removed folder.
    `run`: the command trains (its advice is a resume); else (a report, a comparison) the
    files it wrote before are whole (written to a new file, then renamed) and it is run again."""
    where = e.filename or ("a run file" if run else "an output file")
    why = e.strerror or type(e).__name__
    line = f"cannot write {where}: {why}"
    if e.errno in _FULL:
        line += (
            " (the newest whole checkpoint is kept: free space, then `fl-lightning resume <run dir>`)"
            if run
            else " (what was written before is kept whole: free space, then run the command again)"
        )
    elif e.errno == errno.ENOENT and e.filename and not Path(e.filename).parent.exists():
        line = f"cannot write {where}: its folder was removed while the run was writing it"
    return line


def os_cause(e: BaseException) -> OSError | None:
    """The OSError behind `e` (torch's zip writer wraps a failed write in a RuntimeError)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def reason(e: BaseException) -> str:
    """Why a run stopped, in one line (summary.json `error`)."""
    if isinstance(e, KeyboardInterrupt):
        from .signals import stop_signal

        sig = stop_signal()
        return f"terminated ({sig.name})" if sig is not None else "interrupted (Ctrl-C)"
    cause = os_cause(e)
    if cause is not None and not str(e).startswith("cannot write"):
        return os_error_line(cause)
    text = str(e).strip()
    return text.splitlines()[-1] if text else type(e).__name__


def write_summary(files: _SummaryWriter, summary: dict[str, Any], failing: bool) -> None:
    """`files.log_summary(summary)`; when the run is already failing (`failing`), a failure to
    write it (the disk that stopped the run is full, its folder was removed) is a warning, so
    that the error that stopped the run is the one reported."""
    try:
        files.log_summary(summary)
    except OSError as e:
        if not failing:
            raise
        log.warning("summary.json not written: %s", os_error_line(e))
