"""How long a refused `fl-lightning run` takes to say why (issue 40: configuration errors before
the work starts), on `runtime=ray` and `runtime=serial`.

Cases: an unknown method, an unknown key, a bad value, and the method's own checks: FedTSP keeps
personal models, so it needs `data.client_test_fraction` (its default is 0); a key FedProx's
config lacks; SCAFFOLD refusing momentum (its config's `check` reads the run's `optim`); and what
`privacy=dp_fedavg` cannot privatise (SCAFFOLD's control variates, an aggregation chain of its own,
a clipped-count noise too small for the σ given). Each is a fresh
process (`python -m fl_lightning run ...`), `--reps` times, alternating the runtimes; per run the
wall time from process start to exit, the exit code, the error line, and whether a Ray session
folder appeared (Ray started before the error). `--repo` measures another checkout (e.g. main,
for a before/after).

Run: `python benchmarks/config_errors.py --out benchmarks/results/config_errors.json`
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DP = ["privacy=dp_fedavg", "privacy.noise_multiplier=1", "fl.num_clients=4", "fl.clients_per_round=2",
      "privacy.delta=1e-3"]  # fmt: skip
CASES = {
    "unknown_method": ["method=nosuch"],
    "unknown_key": ["fl.roundz=3"],
    "bad_value": ["fl.rounds=-1"],
    "fedtsp_no_test_split": ["method=fedtsp"],
    "unknown_method_key": ["method=fedprox", "method.muu=1"],
    "scaffold_momentum": ["method=scaffold", "optim.momentum=0.9"],
    # privacy=dp_fedavg: what it cannot privatise (a method's channel, a chain, a too small σ_b)
    "dp_scaffold": [*DP, "method=scaffold"],
    "dp_chain": [*DP, "aggregator.steps=[uniform]"],
    "dp_count_stddev": [*DP, "privacy.adaptive=true", "privacy.clipped_count_stddev=0.1"],
}


def one(repo: Path, case: str, runtime: str, tmp: Path) -> dict[str, Any]:
    ray_tmp = tmp / f"{list(CASES).index(case)}{runtime[0]}"  # short: Ray's sockets live under it
    ray_tmp.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(repo), "WANDB_MODE": "disabled"}
    env["FL_LIGHTNING_RAY_TMPDIR"] = str(ray_tmp)
    cmd = [sys.executable, "-m", "fl_lightning", "run", *CASES[case], f"runtime={runtime}", "logger=none"]
    cmd += [f"output_dir={tmp / 'runs'}", "--quiet"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    return {
        "case": case, "runtime": runtime, "wall_s": round(wall, 3), "exit_code": done.returncode,
        "error": lines[-1] if lines else "", "stderr_lines": len(lines),
        "ray_started": any(ray_tmp.rglob("session_*")),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout to measure")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "config_errors.json")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    runs = []
    with tempfile.TemporaryDirectory(prefix="config_errors_") as tmp:
        for rep in range(args.reps):
            for runtime in ("ray", "serial") if rep % 2 == 0 else ("serial", "ray"):
                for case in cases:
                    runs.append(one(args.repo.resolve(), case, runtime, Path(tmp) / str(rep)))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    medians = {}
    for case in cases:
        for runtime in ("ray", "serial"):
            rs = [r for r in runs if r["case"] == case and r["runtime"] == runtime]
            medians[f"{case}/{runtime}"] = {
                "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                "ray_started": any(r["ray_started"] for r in rs),
                "exit_codes": sorted({r["exit_code"] for r in rs}),
                "error": rs[0]["error"],
            }
            m = medians[f"{case}/{runtime}"]
            print(f"{case:22} {runtime:7} {m['wall_s_median']:6.2f} s  ray started: {m['ray_started']!s:5}  "
                  f"{m['error'][:100]}")  # fmt: skip
    head = ["git", "log", "-1", "--format=%h %s"]
    git = subprocess.run(head, cwd=args.repo, capture_output=True, text=True)
    load = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "config_errors", "repo": str(args.repo), "commit": git.stdout.strip()[:80],
        "cpus": os.cpu_count(), "load_after": load, "reps": args.reps, "runs": runs, "medians": medians,
    }, indent=1) + "\n")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
