"""Where `make test`'s time goes, in CPU seconds per test: robust to a loaded machine, where
wall times are not (issue 39: the suite over its 15 minutes on 2 cores).

Each pytest process (each xdist worker) moves itself into a cgroup-v1 `cpuacct` group of its
own, so every process it starts (Ray's raylet, GCS and actors, CLI subprocesses) is counted
with it, however they daemonise; a test's CPU is the group's usage across the test. Processes
that outlive a test (the session's Ray) add their background CPU to whichever test runs then.
Needs root and /sys/fs/cgroup/cpuacct (Linux); elsewhere it says so and exits 2.

Run: `python benchmarks/suite_cpu.py --out benchmarks/results/suite_cpu.json [-- pytest args]`
(default: the whole suite, three workers as `make test`). Writes per test CPU and wall seconds,
per file sums and the total.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPUACCT = Path("/sys/fs/cgroup/cpuacct")

PLUGIN = """
import json, os, time
import pytest
_grp = None

def _usage():
    with open(os.path.join(_grp, "cpuacct.usage")) as f:
        return int(f.read()) / 1e9

def pytest_configure(config):
    global _grp
    _grp = os.path.join(os.environ["SUITE_CPU_CGROUP"], os.environ.get("PYTEST_XDIST_WORKER", "main"))
    os.makedirs(_grp, exist_ok=True)
    with open(os.path.join(_grp, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, w0 = _usage(), time.time()
    yield
    with open(os.environ["SUITE_CPU_OUT"], "a") as f:
        f.write(json.dumps({"id": item.nodeid, "cpu": _usage() - c0, "wall": time.time() - w0,
                            "start": w0, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}) + "\\n")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("pytest_args", nargs="*", default=["-n", "3", "--dist", "worksteal"])
    args = ap.parse_args()
    if not os.access(CPUACCT, os.W_OK):
        print(f"suite_cpu: needs a writable {CPUACCT} (root, cgroup v1)", file=sys.stderr)
        return 2
    group = CPUACCT / f"fl_suite_cpu_{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "suite_cpu_plugin.py").write_text(PLUGIN)
        lines = Path(tmp) / "tests.jsonl"
        # no empty entry (the working directory: the suite's tests that plant a module there to
        # check that no child imports it would fail, as they did)
        path = os.pathsep.join(filter(None, [tmp, str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "SUITE_CPU_CGROUP": str(group), "SUITE_CPU_OUT": str(lines), "PYTHONPATH": path}
        t0 = time.time()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu_plugin", "-p", "no:cacheprovider"]
        rc = subprocess.run([*cmd, *args.pytest_args], cwd=REPO, env=env).returncode
        wall = time.time() - t0
        tests = [json.loads(x) for x in lines.read_text().splitlines()] if lines.exists() else []
    for sub in sorted(group.glob("*"), reverse=True):
        if sub.is_dir():
            sub.rmdir()  # empty once its processes ended; a stray one keeps it (harmless)
    if group.is_dir():
        group.rmdir()
    files: dict[str, float] = collections.Counter()
    for t in tests:
        files[t["id"].split("::")[0]] += t["cpu"]
    # per pytest worker, seconds from the suite's start: its first test's start (collection
    # before it), its last test's end (the tail after it) and the wall its tests took
    workers: dict[str, dict[str, float]] = {}
    for t in tests:
        w = workers.setdefault(t.get("worker", "main"), {"first_start": wall, "last_end": 0.0, "busy": 0.0})
        w["first_start"] = min(w["first_start"], t.get("start", t0) - t0)
        w["last_end"] = max(w["last_end"], t.get("start", t0) - t0 + t["wall"])
        w["busy"] += t["wall"]
    doc = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_end": os.getloadavg()},
        "pytest_args": args.pytest_args, "exit_code": rc, "wall_s": round(wall, 1),
        "cpu_s": round(sum(t["cpu"] for t in tests), 1),
        "workers": {k: {n: round(v, 1) for n, v in w.items()} for k, w in sorted(workers.items())},
        "files": {k: round(v, 1) for k, v in sorted(files.items(), key=lambda kv: -kv[1])},
        "tests": sorted(({**t, "cpu": round(t["cpu"], 2), "wall": round(t["wall"], 2)} for t in tests),
                        key=lambda t: -t["cpu"]),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"suite_cpu: {len(tests)} tests, {doc['cpu_s']} CPU-s, {doc['wall_s']} s wall -> {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
