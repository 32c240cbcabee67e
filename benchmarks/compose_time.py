"""How long composing a run's config takes (issue 52: every run, sweep row, `list` and many tests
compose), in CPU milliseconds a compose, and `fl-lightning list` in CPU seconds: each rep a fresh
interpreter per checkout, alternating this one and `--base` (another checkout, e.g. a worktree of
main before a change), so a load change hits both.

Run: `python benchmarks/compose_time.py --out benchmarks/results/compose_time.json
[--base PATH] [--reps 3] [--composes 20]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: a default run, a method with its own files, a preset, a grid cell's overrides
CONFIGS = {
    "default": [],
    "fedlgt": ["method=fedlgt"],
    "preset": ["+experiment=fedlgt_fmnist_multilabel"],
    "cell": ["method=fedglcl", "data=fmnist", "fl.num_clients=5", "data.partition=shards"],
}

_CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys, time
    configs, n = json.loads(sys.argv[1]), int(sys.argv[2])
    from fl_lightning.config import compose
    out = {}
    for name, args in configs.items():
        compose(args)  # the first: imports, and whatever is built once
        c0 = time.process_time()
        for _ in range(n):
            compose(args)
        out[name] = (time.process_time() - c0) / n * 1000
    from fl_lightning.cli.main import main
    c0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        main(["list"])
    out["list_cpu_s"] = time.process_time() - c0
    import fl_lightning
    out["package"] = fl_lightning.__file__  # the checkout measured
    print(json.dumps(out))
    """
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base", type=Path, help="another checkout to measure beside this one")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--composes", type=int, default=20)
    args = ap.parse_args()
    checkouts = {"this": REPO, **({"base": args.base.resolve()} if args.base else {})}
    runs = []
    for rep in range(args.reps):
        order = list(checkouts) if rep % 2 == 0 else list(checkouts)[::-1]
        for name in order:
            env = {**os.environ, "PYTHONPATH": str(checkouts[name])}
            env.pop("FL_LIGHTNING_CONF", None)  # each checkout's own conf/
            cmd = [sys.executable, "-c", _CHILD, json.dumps(CONFIGS), str(args.composes)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, cwd=checkouts[name])
            runs.append({"rep": rep, "checkout": name, **json.loads(r.stdout.strip().splitlines()[-1])})
            print(json.dumps(runs[-1]))
    keys = [*CONFIGS, "list_cpu_s"]
    median = {
        name: {k: round(statistics.median(r[k] for r in runs if r["checkout"] == name), 2) for k in keys}
        for name in checkouts
    }
    doc = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_end": os.getloadavg()},
        "python": sys.version.split()[0],
        "checkouts": {k: str(v) for k, v in checkouts.items()},
        "unit": "CPU ms a compose (after the first); list_cpu_s: `fl-lightning list` in-process, CPU s",
        "median": median,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(median))
    return 0


if __name__ == "__main__":
    sys.exit(main())
