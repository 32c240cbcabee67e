"""One writer per run directory, and run directories that are usable before any work starts.

`RunLock` is an exclusive `flock` on `<run dir>/.lock`, taken by `run` (and so by each run
of a `sweep`) right after the directory is created and by `resume` before it reads or
writes anything, and held until the run ends. The kernel releases it when the process
exits in any way (also `kill -9`), so a lock is never stale. The file holds the holder's
PID and command line, which a second writer's error names (`RunDirBusy`: exit code 2).
The file itself stays (an empty `.lock` once released); it is never deleted, since deleting
a lock file lets two processes lock two different files of the same name.

`check_output_dir` says in one line, before any data is loaded, that an `output_dir` cannot
hold runs (a file in the way, not writable); `create_run_dir` creates a run directory
atomically (`mkdir` of the final name: of two processes creating the same run, one gets it,
the other a one-line error).

Run directories are shared, so a resumed one is untrusted: `check_run_dir` refuses one holding
a symbolic link where the run writes (its top level, `checkpoints/` and the folders in it),
which would redirect a write, truncation or deletion to a file outside it; the lock file is
opened with `O_NOFOLLOW`, and `core.files.open_new` writes a temporary file that is surely the run's own.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..config import RootConfig

LOCK_NAME = ".lock"
#: the folders under a run directory that a run writes into, besides its top level
WRITTEN_DIRS = ("checkpoints", "checkpoints/clients", "checkpoints/skipped", "checkpoints/skipped/clients")


class RunDirBusy(ConfigError):
    """Another process is writing this run directory (its PID is in the message and `holder`)."""

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


def _holder(fd: int) -> str:
    """What the holder wrote into the lock file: `PID <pid> (<command>)`; it writes right after
    taking the lock, so an empty file is retried for a moment."""
    text = ""
    for _ in range(20):
        try:
            text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        except OSError:
            text = ""
        if text:
            break
        time.sleep(0.025)
    pid, _, command = text.partition(" ")
    if not pid.isdigit():
        return "PID unknown"
    return f"PID {pid}" + (f": {command}" if command else "")


class RunLock:
    """`with RunLock(run_dir):` holds the run directory's lock; `RunDirBusy` if another
    process holds it."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self.path.is_symlink():  # O_NOFOLLOW below would say only "too many levels of links"
            raise ConfigError(_link_message(self.path))
        try:  # O_NOFOLLOW: never truncate a file elsewhere that a planted link names
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise ConfigError(f"cannot use run directory {self.run_dir}: {e.strerror or e}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device: nothing to truncate
            os.close(fd)
            raise ConfigError(f"{self.path} is not a plain file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder(fd) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else ""
            os.close(fd)
            if not holder:
                raise ConfigError(f"cannot lock run directory {self.run_dir}: {e.strerror or e}") from None
            raise RunDirBusy(
                f"run directory {self.run_dir} is in use by another fl-lightning process ({holder}); "
                "only one process may write a run: wait for it to end, or stop it",
                holder,
            ) from None
        prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
        prog = "fl-lightning" if prog in ("__main__.py", "fl-lightning") else prog
        command = " ".join([prog, *sys.argv[1:]])
        try:  # held now: nobody else writes the run while its files are checked
            check_run_dir(self.run_dir)
        except ConfigError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # still held: nobody reads a PID that is gone
        except OSError:
            pass
        os.close(self._fd)  # releases the lock
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _link_message(path: Path) -> str:
    return (
        f"{path} is a symbolic link: a run directory's files must be its own (a link would make "
        "this run write or delete outside it); remove the link"
    )


def check_run_dir(run_dir: Path | str) -> None:
    """ConfigError (one line naming the path) if the run directory holds a symbolic link
    where a run writes: an entry of its top level, `checkpoints/` or the folders in it."""
    base = Path(run_dir)
    for sub in ("", *WRITTEN_DIRS):
        folder = base / sub if sub else base
        if sub and folder.is_symlink():
            raise ConfigError(_link_message(folder))
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise ConfigError(f"cannot read {folder}: {e.strerror or e}") from None
        for entry in entries:
            if entry.is_symlink():
                raise ConfigError(_link_message(Path(entry.path)))


def check_output_dir(path: Path | str, shown: str | None = None, key: str = "output_dir") -> None:
    """ConfigError (one line, naming `key` `shown`, default `path`) unless runs can be written under
    `path`: its nearest existing ancestor (or itself) must be a folder, not a file, in which
    this process can create entries (tried for real: a temporary folder, removed at once, so
    also right for root and read-only file systems). Creates nothing that stays."""
    target = Path(path)
    shown = shown or str(target)
    probe = target.absolute()
    while True:
        try:
            os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):  # not there yet, or below a file (said below)
            if os.path.islink(probe):
                raise ConfigError(f"{key} {shown} is not usable: {probe} is a link to nothing") from None
        except OSError as e:  # a symbolic-link loop (Path.exists() says False to it), no permission
            raise ConfigError(f"{key} {shown} is not usable ({probe}: {e.strerror or e})") from None
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{key} {shown} is not usable: {probe} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fl-lightning-probe-", dir=probe))
    except OSError as e:
        raise ConfigError(
            f"{key} {shown} is not writable (cannot create a folder in {probe}: "
            f"{e.strerror or type(e).__name__})"
        ) from None


def create_run_dir(run_dir: Path) -> None:
    """Create `run_dir` atomically: its parents as needed, then the directory itself with one
    `mkdir`, which fails if it exists (whoever made it first owns it)."""
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir()
    except FileExistsError:
        raise ConfigError(
            f"run directory {run_dir} exists; continue it with `fl-lightning resume {run_dir}`"
        ) from None
    except OSError as e:
        raise ConfigError(f"cannot create run directory {run_dir}: {e.strerror or e}") from None


def new_run_path(cfg: RootConfig) -> Path:
    """Where a new run goes (`paths.new_run_dir`), checked before any work: a writable
    folder, and no run there already (ConfigError, one line)."""
    from ..tracking.loggers import check_wandb_dirs
    from .paths import new_run_dir

    run_dir = new_run_dir(cfg)
    check_output_dir(run_dir.parent, str(cfg.output_dir))  # a file in the way, not writable: no data yet
    check_wandb_dirs(cfg.logger, run_dir)
    if run_dir.exists():
        raise ConfigError(f"run directory {run_dir} exists; continue it with `fl-lightning resume {run_dir}`")
    return run_dir
