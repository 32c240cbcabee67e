"""Fetch the embedded default dataset, Fashion-MNIST, without root.

Debian ships it in the package `dataset-fashion-mnist`; `apt-get download` + `dpkg -x`
unpack it into a cache folder. Where apt is missing, torchvision's download is the
fallback (needs the network). Files are moved into place only when complete.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FMNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
FMNIST_DEB = "dataset-fashion-mnist"
FMNIST_DEB_DIR = "usr/share/datasets/fashion-mnist"


def fmnist_dir(root: str | Path) -> Path:
    return Path(root).expanduser() / "fashion-mnist"


def fmnist_present(root: str | Path) -> bool:
    return all((fmnist_dir(root) / f).is_file() for f in FMNIST_FILES)


def _from_apt(work: Path) -> Path:
    subprocess.run(
        ["apt-get", "download", FMNIST_DEB], cwd=work, check=True, capture_output=True, text=True
    )
    (deb,) = work.glob(f"{FMNIST_DEB}_*.deb")
    subprocess.run(["dpkg", "-x", str(deb), str(work / "x")], check=True, capture_output=True)
    return work / "x" / FMNIST_DEB_DIR


def _from_torchvision(work: Path) -> Path:
    from torchvision.datasets import FashionMNIST

    FashionMNIST(str(work), train=True, download=True)
    FashionMNIST(str(work), train=False, download=True)
    return work / "FashionMNIST" / "raw"


def fetch_fmnist(root: str | Path, log=print) -> Path:
    """Make the four Fashion-MNIST files present under `<root>/fashion-mnist/`. Idempotent."""
    target = fmnist_dir(root)
    if fmnist_present(root):
        return target
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
            for f in FMNIST_FILES:
                shutil.copyfile(src / f, target / (f + ".part"))
                (target / (f + ".part")).replace(target / f)
            log(f"fetched Fashion-MNIST via {name} into {target}")
            return target
    raise RuntimeError(f"could not fetch Fashion-MNIST into {target}: " + "; ".join(errors))
