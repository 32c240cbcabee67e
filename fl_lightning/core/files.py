"""Writing files of our own: whole or not at all, never through a link planted in a shared run
directory, as readable as the umask allows (a data root or cache folder may be a group's), and
never replacing a cache file another user wrote (no matplotlib import here: a figure is
duck-typed)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("fl_lightning")


def cache_dir(kind: str, env: str) -> Path:
    """Where the cache `kind` (text, teachers, ...) lives: `$<env>` when set; else, when
    `$FL_LIGHTNING_DATA` moves the datasets, `$FL_LIGHTNING_DATA/.cache/<kind>` beside their
    decoded images (so one variable moves everything a machine stores); else
    `~/.cache/fl_lightning/<kind>`, beside the default data root."""
    for value, sub in ((os.environ.get(env), ""), (os.environ.get("FL_LIGHTNING_DATA"), f".cache/{kind}")):
        if value:
            return Path(os.path.expandvars(value)).expanduser() / sub
    return Path("~/.cache/fl_lightning").expanduser() / kind


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """`write(f)` into a temporary file beside `path`, then renamed over it: `path` is whole or
    what it was before (a killed writer, a full disk), and a link planted at `path` is
    replaced, not written through. Its mode is what a plain `open` would give (0666 less the
    umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".part")
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 would hide it from the group sharing the folder
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a write cut short: name the file it was for
            e.filename = str(path)
        raise
    return path


def umask() -> int:
    """This process's umask (read, not changed: Linux's /proc; elsewhere set and put back)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_cache(path: str | Path, write: Callable[[BinaryIO], object]) -> bool:
    """A cache file, written as `write_atomic` does; False (with a warning) where it cannot be:
    a folder shared with others that we may not write costs the next run the work again, never
    this run. A file there that we cannot read is another user's: it is left as it is."""
    path = Path(path)
    try:
        if path.exists() and not os.access(path, os.R_OK):
            log.warning("cache file %s is not readable by you (another user's?): not replaced", path)
            return False
        write_atomic(path, write)
        return True
    except OSError as e:
        log.warning("could not write cache file %s: %s", path, e)
        return False


def save_figure(fig: Any, path: str | Path) -> Path:
    """`fig.savefig` as PNG, written atomically: a reader (the W&B upload, a dashboard) never
    sees half a picture, and a failed write leaves nothing. zlib level 1: a third of the
    encoding time of the default 6 for a few percent more bytes (plots are flat colour)."""
    return write_atomic(path, lambda f: fig.savefig(f, format="png", pil_kwargs={"compress_level": 1}))


def copy_atomic(src: str | Path, dst: str | Path) -> Path:
    """`src`'s bytes to `dst`, written atomically."""

    def copy(out: BinaryIO) -> None:
        with open(src, "rb") as f:
            shutil.copyfileobj(f, out)

    return write_atomic(dst, copy)


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """`torch.save`, written atomically: a cache or weights file is whole or absent, never half
    written."""
    import torch  # here: the CLI imports this module before torch

    return write_atomic(path, lambda f: torch.save(obj, f))


def open_new(path: Path) -> BinaryIO:
    """`path` opened for writing as a new file of its own: a leftover of the same name (a
    stale temporary file, or a planted link) is removed first, and O_EXCL | O_NOFOLLOW make
    sure that what is written cannot land in a file elsewhere."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o644), "wb")


def open_append(path: Path) -> BinaryIO:
    """`path` opened to add to (a resumed sweep's log): a link planted at `path` is removed
    first (its target is left as it was), and O_NOFOLLOW makes sure that what is written
    cannot land in a file elsewhere (a link planted again meanwhile: an OSError)."""
    if path.is_symlink():
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o666), "ab")


def own_folder(path: Path) -> Path:
    """`path` as a folder to write logs in, made if missing: a symbolic link there (planted in a
    shared sweep or reproduction folder) is one line, ConfigError, never written through."""
    from .errors import ConfigError

    if path.is_symlink():
        raise ConfigError(
            f"{path} is a symbolic link: the folder's logs must be its own (a link would make this "
            "command write outside it); remove the link"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path
