"""Fetch the embedded default dataset, Fashion-MNIST, without root.

Debian ships it in the package `dataset-fashion-mnist`; `apt-get download` + `dpkg -x`
unpack it into a cache folder. Where apt is missing, torchvision's download is the
fallback (needs the network). Files are moved into place only when complete.

Every load checks what it reads (`read_idx`: the gzip stream, the IDX header against the
length, then the shapes and labels Fashion-MNIST must have), so a truncated, random or
wrong file ends with one line naming it and the command that fetches it again; `fetch`
checks the files it finds the same way and fetches again when any is broken.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError

FMNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
FMNIST_DEB = "dataset-fashion-mnist"
FMNIST_DEB_DIR = "usr/share/datasets/fashion-mnist"


#: what each file must hold: uint8 images [N, 28, 28] or labels [N] in 0..9
FMNIST_SHAPES = {
    "train-images-idx3-ubyte.gz": (60000, 28, 28),
    "train-labels-idx1-ubyte.gz": (60000,),
    "t10k-images-idx3-ubyte.gz": (10000, 28, 28),
    "t10k-labels-idx1-ubyte.gz": (10000,),
}


class CorruptDataFile(ValueError):
    """A dataset file that cannot be what it claims (truncated, random bytes, wrong content)."""


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST format) of unsigned bytes, gzipped or not. CorruptDataFile (with
    the reason) when it is not one: a broken gzip stream, a bad header, or a length that
    does not match the header's shape."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise CorruptDataFile(f"{type(e).__name__}: {e}") from None
    if len(data) < 4 or data[:3] != b"\x00\x00\x08" or not 1 <= data[3] <= 4:
        raise CorruptDataFile("not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise CorruptDataFile("truncated IDX header")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = 4 + 4 * ndim + math.prod(shape)
    if len(data) != expected:
        raise CorruptDataFile(f"{len(data)} bytes, but its header promises {expected} (shape {shape})")
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fmnist_refetch_hint(root: str | Path) -> str:
    return f"fetch it again with `fl-lightning fetch fmnist --root {root}`"


def fmnist_shapes(root: str | Path) -> dict[str, tuple[int, ...]]:
    """`FMNIST_SHAPES`, or those of the subset that a `subset.json` beside the files declares
    (`{"images": {"train": n, "test": m}}`: the first images of each split, as
    benchmarks/gpu_prepare.py writes them for a machine without the full files)."""
    marker = fmnist_dir(root) / "subset.json"
    if not marker.is_file():
        return FMNIST_SHAPES
    try:
        n = json.loads(marker.read_text())["images"]
        counts = {"train": int(n["train"]), "test": int(n["test"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{marker} does not declare a subset ({type(e).__name__}: {e}); remove it to use the full files"
        ) from None
    return {
        name: (counts["train" if name.startswith("train") else "test"], *shape[1:])
        for name, shape in FMNIST_SHAPES.items()
    }


def fmnist_check(name: str, array: np.ndarray, shapes: dict[str, tuple[int, ...]] = FMNIST_SHAPES) -> None:
    """CorruptDataFile unless `array` is what Fashion-MNIST's file `name` holds (`shapes`:
    `fmnist_shapes` of its folder)."""
    want = shapes[name]
    if array.shape != want:
        raise CorruptDataFile(f"holds an array of shape {array.shape}, expected {want}")
    if len(want) == 1 and len(array) and int(array.max()) > 9:
        raise CorruptDataFile(f"holds label {int(array.max())}, expected labels 0-9")


def read_fmnist_file(root: str | Path, name: str) -> np.ndarray:
    """One Fashion-MNIST file, checked; a broken one is a ConfigError naming it and the
    command that fetches it again."""
    path = fmnist_dir(root) / name
    try:
        array = read_idx(path)
        fmnist_check(name, array, fmnist_shapes(root))
    except CorruptDataFile as e:
        raise ConfigError(
            f"Fashion-MNIST file {path} is corrupt ({e}); {fmnist_refetch_hint(root)}"
        ) from None
    except OSError as e:
        raise ConfigError(
            f"cannot read Fashion-MNIST file {path} ({e.strerror or e}); {fmnist_refetch_hint(root)}"
        ) from None
    return array


def fmnist_problems(root: str | Path) -> dict[str, str]:
    """The Fashion-MNIST files under `root` that are missing or broken, with why."""
    out: dict[str, str] = {}
    shapes = fmnist_shapes(root)
    for name in FMNIST_FILES:
        path = fmnist_dir(root) / name
        if not path.is_file():
            out[name] = "missing"
            continue
        try:
            fmnist_check(name, read_idx(path), shapes)
        except (CorruptDataFile, OSError) as e:
            out[name] = str(e)
    return out


def fmnist_dir(root: str | Path) -> Path:
    return Path(root).expanduser() / "fashion-mnist"


def fmnist_present(root: str | Path) -> bool:
    return all((fmnist_dir(root) / f).is_file() for f in FMNIST_FILES)


def _from_apt(work: Path) -> Path:
    subprocess.run(["apt-get", "download", FMNIST_DEB], cwd=work, check=True, capture_output=True, text=True)
    (deb,) = work.glob(f"{FMNIST_DEB}_*.deb")
    subprocess.run(["dpkg", "-x", str(deb), str(work / "x")], check=True, capture_output=True)
    return work / "x" / FMNIST_DEB_DIR


def _from_torchvision(work: Path) -> Path:
    from torchvision.datasets import FashionMNIST

    FashionMNIST(str(work), train=True, download=True)
    FashionMNIST(str(work), train=False, download=True)
    return work / "FashionMNIST" / "raw"


def fetch_fmnist(root: str | Path, log=print) -> Path:
    """Make the four Fashion-MNIST files present and intact under `<root>/fashion-mnist/`.
    Idempotent; files that are there but broken are fetched again (and replaced only by
    complete, checked ones)."""
    target = fmnist_dir(root)
    if fmnist_present(root):
        broken = fmnist_problems(root)
        if not broken:
            return target
        for name, why in broken.items():
            log(f"{target / name} is broken ({why}); fetching Fashion-MNIST again")
    made = [d for d in (*reversed(target.parents), target) if not d.exists()]  # removed again on failure
    target.mkdir(parents=True, exist_ok=True)
    errors = []
    for name, source in (("apt", _from_apt), ("torchvision", _from_torchvision)):
        with tempfile.TemporaryDirectory(dir=target) as tmp:
            try:
                src = source(Path(tmp))
            except (OSError, subprocess.CalledProcessError, RuntimeError, ValueError) as e:
                detail = getattr(e, "stderr", "") or str(e)
                errors.append(f"{name}: {detail.strip().splitlines()[-1] if detail.strip() else e}")
                continue
            bad = {f: why for f in FMNIST_FILES if (why := _problem(src / f, f))}
            if bad:
                errors.append(f"{name}: fetched a broken {', '.join(f'{f} ({w})' for f, w in bad.items())}")
                continue
            for f in FMNIST_FILES:
                shutil.copyfile(src / f, target / (f + ".part"))
                (target / (f + ".part")).replace(target / f)
            log(f"fetched Fashion-MNIST via {name} into {target}")
            return target
    for d in reversed(made):  # no empty folder left behind to look like a data root
        with contextlib.suppress(OSError):
            d.rmdir()
    raise ConfigError(
        f"could not fetch Fashion-MNIST into {target} ({'; '.join(errors)}): get Debian's "
        f"`{FMNIST_DEB}` package (`apt-get download {FMNIST_DEB}` then `dpkg -x`) or the four files "
        f"{', '.join(FMNIST_FILES)} from https://github.com/zalandoresearch/fashion-mnist, and put "
        f"them in {target}"
    )


def _problem(path: Path, name: str) -> str:
    try:
        fmnist_check(name, read_idx(path))
    except (CorruptDataFile, OSError) as e:
        return str(e) or type(e).__name__
    return ""
