"""Where a cold `runtime=ray` start's seconds go: each piece alone, in a fresh process.

Probes (each its own process, `--reps` times, alternating the order; seconds from the
probe's own first line, plus the process's wall time from the parent, its own CPU seconds
(`cpu_s`: what load on the machine disturbs least; Ray's processes apart, by kind, as
`cpu_s.<kind>` and `cpu_s.ray_total`, read before Ray's shutdown) and how many modules it had
imported):

  python          the interpreter alone (`pass`)
  torch           `import torch`
  driver_imports  what the driver imports before its first round (`fl_lightning.lean_imports`,
                  then `early.DRIVER_MODULES`: the runner, torch, Lightning)
  worker_imports  what a client worker imports in its constructor (`actor.py`: torch and
                  `runtime.host`, i.e. Lightning)
  ray_init        `local_ray.init_ray` (a private local Ray on loopback), then its shutdown
  actors_bare     Ray started, then one actor a core that imports nothing, until each answers
  actors_fl       the same with fl_lightning's `ClientActor` (its constructor's imports)

`--base DIR`: every probe also runs on the fl_lightning at DIR (a checkout of another
commit, first on PYTHONPATH), alternating with this one: before/after in one JSON.

`actors_fl - actors_bare` is the workers' own imports as Ray runs them (in parallel, one a
core, beside Ray's own processes); `actors_bare - ray_init` is Ray making worker processes.
The JSON keeps the load average before and after each probe (numbers of a loaded machine are
not a quiet one's). Compare with a run's `startup_phases_s` (summary.json; `peers.py`).

Run: `python benchmarks/cold_phases.py --reps 3 --out benchmarks/results/cold_phases.json`
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROBES = ("python", "torch", "driver_imports", "worker_imports", "ray_init", "actors_bare", "actors_fl")


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def ray_processes_cpu() -> dict[str, float]:
    """CPU seconds so far of every process Ray started under this one (GCS, raylet, its agents,
    the dashboard, the monitors, the workers), by kind: on 2 cores these compete with the
    driver's and the workers' imports, so what each costs says what a cut could save."""
    import psutil  # Ray's own dependency

    kinds: dict[str, float] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            times = child.cpu_times()
        except psutil.Error:
            continue
        kind = next(
            (k for k in ("gcs_server", "raylet", "dashboard_agent", "runtime_env", "log_monitor",
                         "monitor.py", "dashboard.py", "reaper", "default_worker") if k in cmd),
            child.name(),
        )  # fmt: skip
        key = f"cpu_s.{kind}"
        kinds[key] = kinds.get(key, 0.0) + times.user + times.system
    kinds["cpu_s.ray_total"] = sum(kinds.values())
    return kinds


def probe(name: str) -> dict[str, float]:
    """Run in the probe's process: the seconds each step took."""
    t0 = time.perf_counter()
    out: dict[str, float] = {}
    if name == "python":
        return out
    if name == "torch":
        import torch  # noqa: F401

        out["import_torch"] = time.perf_counter() - t0
        return out
    from fl_lightning.lean_imports import install

    install()  # as `fl-lightning run` and every worker do, first
    try:  # as the driver and a worker import (a `--base` checkout before it: as they did then)
        from fl_lightning.heavy_imports import import_heavy
    except ImportError:
        import importlib

        def import_heavy(*modules: str) -> None:
            for m in modules:
                importlib.import_module(m)

    if name == "driver_imports":
        from fl_lightning.runtime.early import DRIVER_MODULES

        import_heavy(*DRIVER_MODULES)
        out["imports"] = time.perf_counter() - t0
        return out
    if name == "worker_imports":
        import_heavy("torch", "fl_lightning.runtime.host")
        out["imports"] = time.perf_counter() - t0
        return out
    from fl_lightning.runtime.local_ray import init_ray

    t1 = time.perf_counter()
    conn = init_ray(None, os.cpu_count() or 1, 0)
    import ray

    out["ray_init"] = time.perf_counter() - t1
    if name in ("actors_bare", "actors_fl"):
        t2 = time.perf_counter()
        if name == "actors_bare":

            class Bare:
                pass

            cls: Any = ray.remote(Bare)
            actors = [cls.options(num_cpus=1).remote() for _ in range(os.cpu_count() or 1)]
        else:
            from fl_lightning.runtime.actor import remote_actor

            actors = [remote_actor().options(num_cpus=1).remote("cpu") for _ in range(os.cpu_count() or 1)]
        ray.get([a.__ray_ready__.remote() for a in actors])
        out["actors_ready"] = time.perf_counter() - t2
    out.update(ray_processes_cpu())
    t3 = time.perf_counter()
    assert conn is not None
    conn.shutdown()
    out["shutdown"] = time.perf_counter() - t3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--probes", default=",".join(PROBES), help="comma-separated subset of " + ", ".join(PROBES)
    )
    ap.add_argument("--label", default="", help="what this run measures (e.g. the commit), kept in the JSON")
    ap.add_argument("--base", type=Path, help="also run every probe on the fl_lightning checkout at DIR")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cold_phases.json")
    ap.add_argument("--probe", choices=PROBES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        steps = probe(args.probe)
        import resource

        use = resource.getrusage(resource.RUSAGE_SELF)  # this process's CPU: load disturbs it least
        steps.update(cpu_s=use.ru_utime + use.ru_stime, modules=float(len(sys.modules)))
        print("PROBE " + json.dumps(steps), flush=True)
        return 0
    probes = [p for p in args.probes.split(",") if p]
    bad = sorted(set(probes) - set(PROBES))
    if bad:
        ap.error(f"unknown probe {bad[0]!r}; valid: {', '.join(PROBES)}")
    from driver_memory import machine  # benchmarks/driver_memory.py

    from fl_lightning.runtime.local_ray import LOOPBACK_ENV, ray_tmpdir

    env = {**os.environ, **LOOPBACK_ENV, "RAY_TMPDIR": str(ray_tmpdir()), "WANDB_MODE": "disabled"}
    trees = {"this": env.get("PYTHONPATH", "")}
    if args.base:
        trees = {"base": os.pathsep.join(p for p in (str(args.base.resolve()), trees["this"]) if p), **trees}
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for name in probes if rep % 2 == 0 else probes[::-1]:
            for tree in trees if rep % 2 == 0 else list(trees)[::-1]:
                before = load_average()
                t0 = time.perf_counter()
                cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", name]
                penv = {**env, "PYTHONPATH": trees[tree]}
                proc = subprocess.run(cmd, cwd=REPO, env=penv, capture_output=True, text=True)
                wall = time.perf_counter() - t0
                line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
                steps = json.loads(line[6:]) if line else None
                run = {"tree": tree, "probe": name, "rep": rep, "process_wall_s": wall,
                       "exit_code": proc.returncode, "load_average_before": before,
                       "load_average_after": load_average(), "steps_s": steps}  # fmt: skip
                if proc.returncode or line is None:
                    run["stderr_tail"] = proc.stderr[-3000:]
                runs.append(run)
                print(json.dumps(run), file=sys.stderr, flush=True)
    medians: dict[str, Any] = {tree: {} for tree in trees}
    derived: dict[str, Any] = {tree: {} for tree in trees}
    for tree, med in medians.items():
        for name in probes:
            ok = [r for r in runs if (r["tree"], r["probe"]) == (tree, name) and r["steps_s"] is not None]
            if not ok:
                continue
            med[name] = {"process_wall_s": statistics.median(r["process_wall_s"] for r in ok)}
            for k in dict.fromkeys(k for r in ok for k in r["steps_s"]):  # a kind may be missing
                med[name][k] = statistics.median(r["steps_s"][k] for r in ok if k in r["steps_s"])
        if "actors_fl" in med and "actors_bare" in med:
            derived[tree]["worker_imports_in_actors_s"] = (
                med["actors_fl"]["actors_ready"] - med["actors_bare"]["actors_ready"]
            )
    doc = {
        "benchmark": "cold_phases", "label": args.label, "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()}, "trees": trees, "runs": runs,
        "medians": medians, "derived": derived,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for tree, med in medians.items():
        for name, m in med.items():
            print(f"{tree:5} {name:16} " + "  ".join(f"{k} {v:.2f}" for k, v in m.items()))
        for k, v in derived[tree].items():
            print(f"{tree:5} {k}: {v:.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
