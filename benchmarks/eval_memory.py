"""The driver's memory during one global evaluation on a large test set: what keeping the test
images uint8 (normalised a batch at a time as they are scored, `data.registry.StoredImages`)
saves against a float copy of the whole set (`ArrayDataset.tensors`, 4x the images).

Each probe is a fresh process: it prepares a tiny FedAvg CNN run (Fashion-MNIST config,
`runtime=serial`), swaps in N synthetic uint8 test images of 3 x S x S (default N=2,000 at
S=224: 0.29 GiB uint8, 1.12 GiB as float32) and a CNN built for them, reads its own
/proc/self/status, builds the `GlobalEval` and runs one evaluation in line (`GlobalEval.now`),
then reads its status again. The numbers (MiB):

  rss_before_eval_mb     VmRSS with the data built, before the evaluation is constructed
  eval_peak_over_mb      VmHWM after the evaluation minus that: what the evaluation added at
                         its peak (VmHWM is the kernel's own peak, no sampling)
  sampled_peak_mb        the parent's readings of the probe's /proc status every 0.1 s
                         (`driver_memory.poll_memory`): RssAnon is its private memory

`--base DIR`: each probe also runs on the fl_lightning at DIR (a checkout of another commit,
e.g. main's before this change: `git archive <commit> | tar -x -C DIR`), first on PYTHONPATH,
alternating with this checkout: before and after in one JSON. The metrics of both must be the
same (the JSON keeps each probe's).

`eval.batch_size` is 32 by default here, so that the CNN's activations (1.3 GB at 256 images of
224 px) do not hide what the test set costs; `--batch-size 256` shows them.

Run: `python benchmarks/eval_memory.py --base /tmp/main_copy --reps 2 \
--out benchmarks/results/eval_memory.json`

Results (2 cores, shared; N=2,000 at 224 px, float copy 1,148 MiB; the metrics identical):
- `eval_memory.json` (the command above): before +2,298 MiB at the peak (`tensors` holds two
  whole-set float temporaries at once), after +363 and +375.
- `eval_memory_mmap.json` (`MALLOC_MMAP_THRESHOLD_=131072 ... --out ..._mmap.json`): before
  +2,298, after +179; with `--images 256` after is +179 as well (not kept): what is left is one
  batch and the libraries' first use, and it no longer grows with N. glibc's default threshold
  keeps freed batches in the heap: the rest of the default's +363.
- `eval_memory_bs256.json` (`--batch-size 256`): before +2,344, after +1,342 (the CNN's
  activations of a 256-image batch).
- `eval_memory_n256.json` (`--images 256`): before +313, after +289.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from driver_memory import poll_memory  # benchmarks/driver_memory.py

REPO = Path(__file__).resolve().parent.parent
#: CLIP's normalisation: a 3-channel dataset's, as the CoOp loaders give it
MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def status() -> dict[str, float]:
    """This process's VmRSS, RssAnon and VmHWM (MiB)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "VmHWM"):
            out[key] = int(rest.split()[0]) / 1024
    return out


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """In the probe's process: one global evaluation of a CNN on N synthetic images."""
    import dataclasses

    import numpy as np
    import torch

    import fl_lightning
    from fl_lightning.config import compose
    from fl_lightning.core.params import to_cpu
    from fl_lightning.runtime.build import prepare
    from fl_lightning.runtime.host import build_objective
    from fl_lightning.runtime.steps import GlobalEval, WallClock

    n, s = args.images, args.size
    with tempfile.TemporaryDirectory(prefix="eval_memory_") as out:
        p = prepare(compose([
            "data=fmnist", "data.train_subset=40", "data.test_subset=10", "fl.num_clients=2",
            "fl.clients_per_round=2", "model=cnn", f"model.channels=[{args.channels}]", "model.hidden=32",
            "logger=none", "runtime=serial", f"eval.batch_size={args.batch_size}", "eval.overlap=false",
            f"output_dir={out}",
        ]))  # fmt: skip
        rng = np.random.default_rng(0)
        test_x = np.empty((n, 3, s, s), np.uint8)
        for i in range(0, n, 256):  # filled in chunks: no int64 temporary of the whole set
            test_x[i : i + 256] = rng.integers(0, 256, (min(256, n - i), 3, s, s), dtype=np.uint8)
        ds = dataclasses.replace(
            p.dataset, name="synthetic", train_x=test_x[:40], test_x=test_x,
            test_y=rng.integers(0, 10, n), mean=MEAN, std=STD,
        )  # fmt: skip
        spec = dataclasses.replace(p.spec, in_channels=3, image_size=s)
        torch.manual_seed(0)
        obj = build_objective(spec)
        prep = dataclasses.replace(p, dataset=ds, spec=spec, objective=obj)
        state = p.strategy.init_state(to_cpu(obj.model_state()))
        before = status()
        ev = GlobalEval(prep, Path(out), WallClock())
        t0 = time.perf_counter()
        metrics = ev.now(state)
        eval_s = time.perf_counter() - t0
        ev.close()
        after = status()
    return {
        "fl_lightning": str(Path(fl_lightning.__file__).resolve().parent.parent),
        "rss_before_eval_mb": before["VmRSS"],
        "anon_before_eval_mb": before["RssAnon"],
        "hwm_before_eval_mb": before["VmHWM"],
        "hwm_after_eval_mb": after["VmHWM"],
        "eval_peak_over_mb": after["VmHWM"] - before["VmRSS"],
        "eval_s": eval_s,
        "metrics": metrics,
    }


def commit_of(root: Path) -> str:
    """The commit of checkout `root` (a git archive's: from `--base-commit`)."""
    r = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return r.stdout.strip() if r.returncode == 0 else ""


def run_probe(code: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One probe in a fresh process on the fl_lightning at `code`, sampled from here."""
    cmd = [sys.executable, __file__, "--probe", f"--images={args.images}", f"--size={args.size}",
           f"--channels={args.channels}", f"--batch-size={args.batch_size}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "WANDB_MODE": "disabled"}
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out_f, stderr=err_f, text=True)
        peaks = poll_memory(proc)
        wall = time.perf_counter() - t0
        out_f.seek(0)
        err_f.seek(0)
        lines, stderr = out_f.read().splitlines(), err_f.read()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"probe on {code} failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    return {**json.loads(lines[-1]), "sampled_peak_mb": peaks, "process_wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=2000, help="synthetic test images (N)")
    ap.add_argument("--size", type=int, default=224, help="their side in pixels (S)")
    ap.add_argument("--channels", default="8,16", help="the CNN's two conv widths (model.channels)")
    ap.add_argument(
        "--batch-size", type=int, default=32, help="eval.batch_size (small: the CNN's activations apart)"
    )
    ap.add_argument("--reps", type=int, default=1, help="probes of each checkout, alternating")
    ap.add_argument("--base", type=Path, default=None, help="a checkout of the code before, also probed")
    ap.add_argument("--base-commit", default="", help="the commit --base holds, when it is no git checkout")
    ap.add_argument("--label", default="", help="what this checkout is (recorded)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe(args)))
        return
    from bench_workload import emit  # benchmarks/bench_workload.py

    codes = {"after": REPO} | ({"before": args.base.resolve()} if args.base else {})
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in codes}
    for _ in range(args.reps):
        for name, code in sorted(codes.items(), reverse=True):  # before, then after
            runs[name].append(run_probe(code, args))
    gib = 2**30
    n, s = args.images, args.size
    result: dict[str, Any] = {
        "benchmark": "eval_memory",
        "images": n, "size": s, "channels": args.channels, "eval_batch_size": args.batch_size,
        "uint8_gib": n * 3 * s * s / gib, "float32_gib": n * 3 * s * s * 4 / gib,
        "commit": commit_of(REPO), "label": args.label,
        # glibc's: a fixed threshold returns freed batches to the system (driver_memory.py)
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "base_commit": (args.base_commit or commit_of(args.base)) if args.base else None,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_end": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]},
        "runs": runs,
        "eval_peak_over_mb": {k: [r["eval_peak_over_mb"] for r in v] for k, v in runs.items()},
        "sampled_anon_peak_mb": {k: [r["sampled_peak_mb"]["RssAnon"] for r in v] for k, v in runs.items()},
    }  # fmt: skip
    if args.base:  # the same model, weights and images: the same numbers
        result["same_metrics"] = all(
            r["metrics"] == runs["after"][0]["metrics"] for v in runs.values() for r in v
        )
    emit(result, args.out)


if __name__ == "__main__":
    main()
