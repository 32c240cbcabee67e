"""Decoded-image and npz caches under `<data.root>/.cache/`.

`cached_arrays` keeps arrays built from files in an `.npz` keyed by the files' paths, sizes
and mtimes, so later runs skip building them: Fashion-MNIST's gzipped IDX files (~0.3 s a run
to inflate, ~0.05 s to read back), and `cached_images`'s decoded image files (PIL, RGB,
squashed to `size` x `size`: uint8 [N, 3, S, S]). `atomic_savez` / `load_npz` write and read
such files safely (temp file + rename; a corrupt or foreign file is ignored and rebuilt); the
per-client split cache of `federated.py` and FLAIR's user cache use them too.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..core.files import write_cache
from ..core.progress import progress

log = logging.getLogger("fl_lightning")

CACHE_VERSION = 1


def decode_image(path: Path, size: int, crop: bool = False) -> np.ndarray:
    """One image as uint8 [3, size, size] (RGB): squashed to the square (bilinear), or with
    `crop` CLIP's preprocessing (bicubic resize of the short side to `size`, centre crop)."""
    from PIL import Image

    with Image.open(path) as im:
        if not crop:  # JPEG: decode at reduced scale; CLIP's preprocessing decodes in full
            im.draft("RGB", (size, size))
        rgb = im.convert("RGB")
        if crop:
            rgb = center_crop(rgb, size)
        elif rgb.size != (size, size):
            rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def center_crop(im: Any, size: int) -> Any:
    """torchvision's Resize(size, BICUBIC) + CenterCrop(size) on a PIL image, as CLIP's
    `_transform` does: the short side to `size` (the long one truncated), then the centre."""
    from PIL import Image

    w, h = im.size
    if (w, h) != (size, size):
        nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
        im = im.resize((nw, nh), Image.Resampling.BICUBIC)
    w, h = im.size
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    return im.crop((left, top, left + size, top + size))


def decode_images(paths: Sequence[Path], size: int, crop: bool = False) -> np.ndarray:
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    if not len(paths):
        return out

    def one(i: int) -> None:
        from PIL import Image

        try:
            out[i] = decode_image(paths[i], size, crop)
        except (OSError, ValueError, Image.DecompressionBombError) as e:  # a 20000x10000 PNG of 194 KB
            raise ConfigError(f"cannot read image {paths[i]}: {e}") from None
        bar.update()

    # once per dataset (then cached), but minutes for a large folder
    with (
        progress(f"decoding images at {size}px", len(paths), "image") as bar,
        ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool,
    ):
        list(pool.map(one, range(len(paths))))
    return out


def atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> bool:
    """Write `arrays` to `path` (temp file + rename, `core.files.write_cache`). False when the
    folder is not writable, or `path` is another user's file we cannot read."""
    named: dict[str, Any] = dict(arrays)  # (numpy's stub would also match a key to `allow_pickle`)
    return write_cache(path, lambda f: np.savez(f, **named))


def load_npz(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of an `.npz` cache file; None (with a warning) when it is missing, or
    unreadable in any way (empty, truncated, random bytes, not an npz): the caller rebuilds."""
    try:
        if not path.is_file():  # (a folder we may not enter: PermissionError, below)
            return None
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise ValueError("not an .npz archive")
            return {k: z[k] for k in z.files}
    except PermissionError as e:  # another user's (a shared data root): built for this run, left alone
        log.warning("cannot read cache file %s (%s): built again", path, e.strerror)
        return None
    except Exception as e:  # BadZipFile, EOFError, zlib.error, ...: corrupt or foreign, rebuilt
        log.warning("ignoring unreadable cache file %s (%s: %s); rebuilding it", path, type(e).__name__, e)
        return None


def cached_arrays(
    root: str | Path,
    name: str,
    paths: Sequence[Path],
    build: Callable[[], dict[str, np.ndarray]],
    salt: str = "",
    valid: Callable[[dict[str, np.ndarray]], bool] = lambda arrays: True,
) -> dict[str, np.ndarray]:
    """`build()`'s arrays, from `<root>/.cache/<name>-<key>.npz` when the files in `paths`
    (which `build` reads and checks) are unchanged since (the key hashes `salt` and each
    file's path, size and mtime); else built and written there. A cache file that is
    unreadable or not `valid` is rebuilt."""
    h = hashlib.sha1(f"{CACHE_VERSION}|{salt}".encode())
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            return build()  # a missing file: `build` says so in its own words
        h.update(f"|{p}|{st.st_size}|{int(st.st_mtime)}".encode())
    cache = Path(root).expanduser() / ".cache" / f"{name}-{h.hexdigest()[:16]}.npz"
    hit = load_npz(cache)
    if hit is not None and valid(hit):
        return hit
    arrays = build()
    atomic_savez(cache, arrays)
    return arrays


def cached_images(root: str, tag: str, paths: Sequence[Path], size: int, crop: bool = False) -> np.ndarray:
    """Decoded images for `paths` (`decode_image`), from `<root>/.cache/` when the same files
    were decoded at the same size the same way before (keyed by path, file size and mtime)."""
    salt = f"{size}|crop" if crop else str(size)  # squashed: the key as it always was
    return cached_arrays(
        root, f"{tag}-{size}px", paths, lambda: {"x": decode_images(paths, size, crop)}, salt=salt,
        valid=lambda a: "x" in a and len(a["x"]) == len(paths),
    )["x"]  # fmt: skip
