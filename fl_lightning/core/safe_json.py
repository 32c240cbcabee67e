"""Reading JSON (and small text files) that someone else may have written: a shared run
directory, a downloaded result archive. Nesting is bounded before the parser sees it (Python's
decoder recurses once per level, so a few thousand `[` raised RecursionError, which nothing
caught), and a file is read only if it is a plain file of this directory (not a link planted
under its name, not a FIFO that blocks forever or a device that never ends) and not larger
than the caller allows."""

from __future__ import annotations

import json
import os
import re
import stat
from itertools import accumulate
from pathlib import Path
from typing import Any

#: deeper than anything we write (a checkpoint's tree is ~10 levels) and far below the
#: interpreter's recursion limit (1000), which the decoder and our own walkers share
MAX_DEPTH = 64
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class UnsafeInput(ValueError):
    """A file or text refused before it is parsed (too deep, too large, not a plain file)."""


def depth(text: str) -> int:
    """How deeply `text`'s arrays and objects nest (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads`, refusing (UnsafeInput, a ValueError) text nested deeper than `max_depth`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if depth(text) > max_depth:
        raise UnsafeInput(f"JSON nested deeper than {max_depth} levels")
    return json.loads(text)


def read_bytes(path: Path | str, limit: int) -> bytes:
    """The bytes of `path` if it is a plain file (not a link: O_NOFOLLOW; not a FIFO or device)
    of at most `limit` bytes; UnsafeInput otherwise, OSError if it cannot be opened."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if Path(path).is_symlink():
            raise UnsafeInput(f"{path} is a symbolic link") from None
        raise e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeInput(f"{path} is not a plain file")
        if st.st_size > limit:
            raise UnsafeInput(f"{path} is {st.st_size} bytes (more than {limit})")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while we read it
        raise UnsafeInput(f"{path} is more than {limit} bytes")
    return data


def read_text(path: Path | str, limit: int) -> str:
    return read_bytes(path, limit).decode("utf-8", errors="replace")


def load_file(path: Path | str, limit: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON document in `path` (`read_bytes`, then `loads`)."""
    return loads(read_bytes(path, limit), max_depth)
