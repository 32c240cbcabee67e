"""What a private local Ray costs while it waits, per process kind (issue 52: the suite's three
shared Rays idle through most of its ~18 minutes, and their CPU is the suite's).

Each mode starts Ray with `init_ray` in this process, lets it settle, then reads every
process's CPU seconds over `--idle` seconds (the process and everything it started sit in a
`cpuacct` cgroup of their own, so daemonised Ray processes are counted too):

- `before`: as `init_ray` started a private Ray until issue 52's cut (metrics collected, a log
  monitor though nothing is forwarded, idle workers prestarted);
- `run`: a private run's Ray now (`init_ray(None, n)`: no metrics, idle workers kept);
- `shared`: the test suite's shared Ray now (`log_to_driver=False, idle_workers=False`).

Needs root and /sys/fs/cgroup/cpuacct (Linux). Run:
`python benchmarks/ray_idle.py --out benchmarks/results/ray_idle.json [--idle 90] [--reps 1]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _child(mode: str, idle_s: float, out: Path) -> None:
    import psutil
    import ray
    from ray._private import parameter

    from fl_lightning.runtime.local_ray import init_ray

    group = CPUACCT / f"fl_ray_idle_{os.getpid()}"
    group.mkdir()
    (group / "cgroup.procs").write_text(str(os.getpid()))

    def usage() -> float:
        return int((group / "cpuacct.usage").read_text()) / 1e9

    def per_kind() -> dict[int, tuple[str, float]]:
        seen = {}
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                p = psutil.Process(int(pid))
                t = p.cpu_times()
                seen[p.pid] = (p.name(), t.user + t.system)
            except psutil.Error:  # ended between the listing and the read
                continue
        return seen

    if mode == "before":  # the parameters init_ray passed until this cut
        real_init, real_params = ray.init, parameter.RayParams

        def init(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("_system_config", None)
            return real_init(*args, **kwargs)

        class Params(real_params):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["include_log_monitor"] = True
                super().__init__(*args, **kwargs)

        ray.init, parameter.RayParams = init, Params  # type: ignore[misc]
    c0 = usage()
    conn = init_ray(None, 2, log_to_driver=mode != "shared", idle_workers=mode != "shared")
    c1 = usage()
    time.sleep(10)  # the start-up's tail: workers registering, agents' first reports
    c2, a = usage(), per_kind()
    time.sleep(idle_s)
    c3, b = usage(), per_kind()
    kinds: dict[str, float] = {}
    for pid, (name, cpu) in b.items():
        if pid in a and pid != os.getpid():
            kinds[name] = kinds.get(name, 0.0) + cpu - a[pid][1]
    if conn is not None:
        conn.shutdown()
    doc = {
        "mode": mode,
        "start_cpu_s": round(c1 - c0, 2),
        "idle_cpu_s_per_min": round((c3 - c2) * 60 / idle_s, 2),
        "idle_by_kind_per_min": {k: round(v * 60 / idle_s, 2) for k, v in sorted(kinds.items())},
    }
    out.write_text(json.dumps(doc))
    (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))  # out of it, so it can go
    for _ in range(100):  # Ray's processes take a moment to end after the shutdown
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--idle", type=float, default=90.0, help="seconds of idle read after 10 s of settling")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--child", choices=["before", "run", "shared"], help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.idle, args.result)
        return 0
    if not os.access(CPUACCT, os.W_OK):
        print(f"ray_idle: needs a writable {CPUACCT} (root, cgroup v1)", file=sys.stderr)
        return 2
    import subprocess
    import tempfile

    runs = []
    for rep in range(args.reps):
        for mode in ("before", "run", "shared"):  # alternating: a load change hits all three
            with tempfile.TemporaryDirectory() as tmp:
                result = Path(tmp) / "r.json"
                cmd = [sys.executable, __file__, "--out", str(args.out), "--idle", str(args.idle)]
                subprocess.run([*cmd, "--child", mode, "--result", str(result)], check=True)
                runs.append({"rep": rep, **json.loads(result.read_text())})
                print(json.dumps(runs[-1]))
    doc = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_end": os.getloadavg()},
        "idle_s": args.idle,
        "runs": runs,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
