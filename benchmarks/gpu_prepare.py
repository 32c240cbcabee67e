"""Prepare, on a machine with PyPI, what `benchmarks/gpu_check.sh` needs on the GPU machine.

The GPU machine (the device tool's, see docs/results.md) has torch, Lightning, numpy, pyyaml,
scikit-learn, matplotlib, pytest, aiohttp, click, msgpack, protobuf and requests, but not Ray,
OmegaConf or jsonschema, no internet, and no Fashion-MNIST; what travels with the working tree is
at most 64 MiB. This writes into `--out` (default `.gpu/`, git-ignored, then named in the device
call's `carry`):

  wheels/   the missing packages for `--python-version` (the GPU image's Python is 3.12):
            Ray with `ray/jars` (Java workers), `ray/dashboard/client` (the web UI's build),
            `ray/rllib` and `ray/llm` taken out and its RECORD rewritten (75 MiB -> ~40 MiB),
            OmegaConf, jsonschema with its three dependencies, and open_clip with ftfy
            and wcwidth (the CLIP rows; its other needs are on the image)
  data/fashion-mnist/
            the first `--train` training and `--test` test images of Fashion-MNIST, in its
            IDX format (gzipped), with `subset.json` saying so (`fl_lightning/data/fetch.py`
            reads a folder with that file as the subset it declares)
  manifest.json
            every file with its size, and the total

and fails (exit 1) when the folder and the repository's tracked files together exceed the limit.
`--check-venv` then installs the wheels offline into a fresh virtual environment of this Python
(`--system-site-packages`; Ray's other needs, present on the GPU image, come from PyPI there
first) and starts and stops a local Ray on loopback in it.

Run (from the repository root): `python benchmarks/gpu_prepare.py --check-venv`
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT_MIB = 64.0  # the device tool's working tree + carried paths, per call

#: the packages the GPU image lacks, pinned as pyproject.toml / the project's venv has them
WHEELS = {
    "ray": "2.60.0",
    "omegaconf": "2.4.0",
    "jsonschema": "4.26.0",
    "jsonschema-specifications": "2025.9.1",
    "referencing": "0.37.0",
    "rpds-py": "2026.9.1",
    # the CLIP rows (FedGLCL, CLIP2FL, the prompt-learning family) build open_clip models
    "open_clip_torch": "3.3.0",
    "ftfy": "6.3.1",
    "wcwidth": "0.9.4",
}
#: what Ray's wheel carries that a local run never uses
RAY_DROP = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/llm/")
#: Ray's needs that the GPU image has: installed from PyPI into --check-venv's environment only
IMAGE_HAS = [
    "attrs",
    "click",
    "filelock",
    "msgpack",
    "packaging",
    "protobuf",
    "pyyaml",
    "requests",
    "typing-extensions",
]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
FMNIST = (  # (file, split): as fl_lightning/data/fetch.py names them
    ("train-images-idx3-ubyte.gz", "train"),
    ("train-labels-idx1-ubyte.gz", "train"),
    ("t10k-images-idx3-ubyte.gz", "test"),
    ("t10k-labels-idx1-ubyte.gz", "test"),
)


def log(msg: str) -> None:
    print(f"gpu_prepare: {msg}", file=sys.stderr, flush=True)


def download(wheels: Path, python_version: str) -> None:
    have = {p.name.split("-")[0].lower().replace("_", "-") for p in wheels.glob("*.whl")}
    want = [f"{n}=={v}" for n, v in WHEELS.items() if n.lower().replace("_", "-") not in have]
    if not want:
        return
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(wheels),
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    log("pip download " + " ".join(want))
    subprocess.run([*cmd, *want], check=True)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack_ray(wheel: Path) -> None:
    """Rewrite Ray's wheel in place without `RAY_DROP`, with a RECORD of what is left."""
    with zipfile.ZipFile(wheel) as src:
        if not any(i.filename.startswith(RAY_DROP) for i in src.infolist()):
            return  # repacked already
        before = wheel.stat().st_size
        tmp = wheel.with_suffix(".tmp")
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
            for info in src.infolist():
                if info.filename.startswith(RAY_DROP) or info.filename == record_name:
                    continue
                data = src.read(info)
                dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                lines.append(record_line(info.filename, data))
            lines.append(f"{record_name},,")
            dst.writestr(record_name, "\n".join(lines) + "\n")
    tmp.replace(wheel)
    log(f"{wheel.name}: {before / 2**20:.1f} MiB -> {wheel.stat().st_size / 2**20:.1f} MiB")


def write_idx(path: Path, array) -> None:  # type: ignore[no-untyped-def]
    """An IDX file of unsigned bytes (magic 0x0000080N, then N big-endian sizes), gzipped."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(header + array.tobytes())


def write_fmnist_subset(src_root: str, dest_root: Path, n_train: int, n_test: int) -> None:
    from fl_lightning.data.fetch import fmnist_dir, read_fmnist_file

    dest = fmnist_dir(dest_root)
    want = {"train": n_train, "test": n_test}
    marker = dest / "subset.json"
    if marker.is_file() and json.loads(marker.read_text()).get("images") == want:
        return
    dest.mkdir(parents=True, exist_ok=True)
    for name, split in FMNIST:
        write_idx(dest / name, read_fmnist_file(src_root, name)[: want[split]])
    marker.write_text(
        json.dumps(
            {
                "images": want,
                "what": "the first images of each split of Fashion-MNIST (benchmarks/gpu_prepare.py)",
            },
            indent=1,
        )
        + "\n"
    )
    log(f"Fashion-MNIST subset ({n_train} train, {n_test} test) in {dest}")


def tracked_bytes() -> int:
    """The repository's tracked files as they are on disk (what the device tool sends)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return sum((REPO / n).stat().st_size for n in names.decode().split("\0") if n and (REPO / n).is_file())


def manifest(out: Path) -> dict:  # type: ignore[type-arg]
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    files.pop("manifest.json", None)
    total = sum(files.values())
    repo = tracked_bytes()
    doc = {
        "files": files,
        "total_mib": round(total / 2**20, 2),
        "tracked_repo_mib": round(repo / 2**20, 2),
        "with_repo_mib": round((total + repo) / 2**20, 2),
        "limit_mib": LIMIT_MIB,
    }
    (out / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def check_venv(out: Path, python: str) -> None:
    """The wheels installed offline into a fresh venv, and a local Ray on loopback started in it."""
    with tempfile.TemporaryDirectory(prefix="gpu_prepare_venv_") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([python, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *IMAGE_HAS], check=True)  # what the GPU image has already
        subprocess.run(
            [*pip, "--no-index", "--no-deps", "--no-compile", *map(str, (out / "wheels").glob("*.whl"))],
            check=True,
        )
        # the project's own local Ray start (loopback settings of /work/shared/RAY_LOCAL.md);
        # local_ray.py imports nothing beyond the standard library and Ray
        probe = (
            "import ray, omegaconf\n"
            "from fl_lightning.runtime.local_ray import init_ray\n"
            "conn = init_ray(None, num_cpus=1)\n"
            "print('ray', ray.__version__, 'task says', ray.get(ray.remote(lambda: 6 * 7).remote()))\n"
            "conn.shutdown()\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
        if done.returncode != 0 or "task says 42" not in done.stdout:
            why = done.stderr[-3000:]
            sys.exit(f"gpu_prepare: Ray from {out / 'wheels'} did not start in a fresh venv:\n{why}")
        log(f"fresh venv ({python}): {done.stdout.strip()}")


def _images(most: int):
    """An argparse type: a count of images in [1, most] (`--train -5` wrote all 60,000 but 5)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not 1 <= n <= most:
            raise argparse.ArgumentTypeError(f"must be between 1 and {most} (got {n})")
        return n

    return parse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / ".gpu")
    ap.add_argument("--python-version", default="3.12", help="the GPU image's Python")
    ap.add_argument("--train", type=_images(60000), default=12000, help="Fashion-MNIST training images")
    ap.add_argument("--test", type=_images(10000), default=2000, help="Fashion-MNIST test images")
    ap.add_argument("--data-root", default=None, help="where the full Fashion-MNIST is (default: data.root)")
    ap.add_argument("--check-venv", action="store_true", help="install into a fresh venv and start Ray")
    ap.add_argument(
        "--venv-python",
        default=None,
        help="the Python of --check-venv (default: python<--python-version> on PATH)",
    )
    args = ap.parse_args()
    from fl_lightning.config import compose
    from fl_lightning.data.fetch import fetch_fmnist, fmnist_present

    root = args.data_root or compose([]).data.root
    if not fmnist_present(root):
        fetch_fmnist(root)
    wheels = args.out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    download(wheels, args.python_version)
    for w in wheels.glob("ray-*.whl"):
        repack_ray(w)
    write_fmnist_subset(root, args.out / "data", args.train, args.test)
    for made in (".cache", ".partitions"):  # what a dry run's runs wrote there: not carried
        shutil.rmtree(args.out / "data" / made, ignore_errors=True)
    doc = manifest(args.out)
    log(
        f"{args.out}: {doc['total_mib']} MiB, with the tracked files {doc['with_repo_mib']} MiB "
        f"(limit {LIMIT_MIB:g})"
    )
    if doc["with_repo_mib"] > LIMIT_MIB:
        print(
            f"gpu_prepare: {doc['with_repo_mib']} MiB exceeds the device's {LIMIT_MIB:g} MiB; "
            "lower --train/--test",
            file=sys.stderr,
        )
        return 1
    if args.check_venv:
        python = args.venv_python or shutil.which(f"python{args.python_version}")
        if python is None:
            print(
                f"gpu_prepare: no python{args.python_version} on PATH for --check-venv "
                "(--venv-python names one)",
                file=sys.stderr,
            )
            return 1
        check_venv(args.out, python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
