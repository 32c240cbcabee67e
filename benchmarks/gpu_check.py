"""One prepared pass over every GPU path of the engine, for a short lease of a GPU machine.

Started by `benchmarks/gpu_check.sh OUT` (which first installs what the GPU image lacks from the
wheels `benchmarks/gpu_prepare.py` wrote), it runs these steps in order, each in fresh
processes, each within its share of `--budget-s` (default 450 s: the whole in under 8 minutes),
and writes `OUT/gpu_check.json` after every step, every process's output to `OUT/log.txt`, and
beside them the JSON of the benchmarks it runs and the CUDA tests' JUnit XML (5 files):

  env                GPU names and memory, driver, CUDA, cuDNN, torch, Lightning, Ray, Python, CPUs
  cuda_tests         the suite's tests marked `cuda` (`pytest -m cuda`), counted from JUnit XML
  e2e                `runtime=gpu` end to end, 2 rounds each: one client per GPU
                     (`runtime.gpus_per_client=1`), and 8 clients at `runtime.gpus_per_client=0.25`
                     in a pool on one GPU; each against `runtime=serial` on the GPU over the same
                     workload (accuracy per round to `--tol`), with `nvidia-smi` sampled each second
  cross_device       `benchmarks/cross_device.py --device gpu`: the plain loop, sequential and
                     batched clients (Flower where flwr is installed): clients per second of
                     rounds, batched / sequential, GPU utilisation during the runs
  cold_start         `benchmarks/cold_start.py --runtime gpu`: one cold `fl-lightning run` with
                     and without `runtime.early_start` (process start to the first round),
                     beside the plain loop's start-up from cross_device
  reproduce_estimate `fl-lightning reproduce <paper> --scale paper --estimate` for each paper in
                     conf/reproduce/, where the CLI has `--estimate` (else "not available")

`--dry-run`: the same steps on the CPU with tiny sizes (the "GPU" runs become `runtime=ray` with
`runtime.accelerator=cpu`; the CUDA tests are collected and skip), so that the script is run by
the suite (tests/test_gpu_check.py) and cannot rot. `--no-ray` leaves out the runs that start Ray
and the e2e step's first case (the suite's test: each process costs it seconds). `--steps` picks
steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
STEPS = ("env", "cuda_tests", "e2e", "cross_device", "cold_start", "reproduce_estimate")
#: each step's most seconds (the budget left caps it too)
STEP_CAP_S = {
    "env": 60,
    "cuda_tests": 120,
    "e2e": 180,
    "cross_device": 200,
    "cold_start": 120,
    "reproduce_estimate": 90,
}

ENV_PROBE = r"""
import json, os, platform, subprocess, shutil
from importlib.metadata import version, PackageNotFoundError
import torch
def v(dist):  # from the package's metadata: importing Lightning and Ray would cost seconds
    try:
        return version(dist)
    except PackageNotFoundError:
        return None
gpus = [{"name": torch.cuda.get_device_name(i),
         "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
        for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
smi = None
if shutil.which("nvidia-smi"):
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                        "--format=csv,noheader"], capture_output=True, text=True)
    smi = q.stdout.strip().splitlines() if q.returncode == 0 else q.stderr.strip()
print(json.dumps({
    "gpus": gpus, "nvidia_smi": smi, "cuda": torch.version.cuda,
    "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
    "torch": torch.__version__, "lightning": v("lightning"), "ray": v("ray"),
    "python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
}))
"""


class Check:
    """The run's folder, its log, its budget and its results."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.out: Path = args.out
        # the runs' folders: outside OUT, whose files the device tool brings back (8 at most)
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.dry: bool = args.dry_run
        self.no_ray: bool = args.no_ray
        self.tol: float = args.tol
        self.deadline = time.monotonic() + args.budget_s
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "log.txt", "a")  # noqa: SIM115 (open for the whole check)
        self.doc: dict[str, Any] = {
            "check": "gpu_check",
            "dry_run": self.dry,
            "no_ray": self.no_ray,
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "steps": {},
        }
        self.gpus = 0

    def env(self) -> dict[str, str]:
        env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        if self.dry:
            env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU even on a GPU machine
        return env

    def left(self, cap: float) -> float:
        """Seconds a process may take: the budget left, and on a GPU the step's cap (a dry run on
        a busy CPU takes what it takes)."""
        left = self.deadline - time.monotonic()
        return max(0.0, left if self.dry else min(cap, left))

    def run(self, cmd: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
        """`cmd` with its output in the log (and returned); TimeoutExpired past `timeout`."""
        self.log.write(f"\n===== {what}: {' '.join(cmd)}\n")
        self.log.flush()
        t0 = time.monotonic()
        try:
            done = subprocess.run(
                cmd, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            for stream in (e.stdout, e.stderr):
                self.log.write(stream.decode() if isinstance(stream, bytes) else stream or "")
            self.log.write(f"\n===== {what}: killed after {timeout:.0f} s\n")
            raise
        self.log.write(done.stdout + done.stderr)
        self.log.write(f"\n===== {what}: exit {done.returncode} in {time.monotonic() - t0:.1f} s\n")
        self.log.flush()
        return done

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.doc, indent=1) + "\n")


def fl_cli() -> list[str]:
    return [sys.executable, "-m", "fl_lightning"]


# --- steps ------------------------------------------------------------------------------------
def step_env(c: Check) -> dict[str, Any]:
    done = c.run([sys.executable, "-c", ENV_PROBE], c.left(STEP_CAP_S["env"]), "env")
    if done.returncode != 0:
        return {"ok": False, "error": done.stderr.strip()[-2000:]}
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    c.gpus = len(facts["gpus"])
    if not c.dry and not c.gpus:
        return {"ok": False, "error": "no CUDA device: run with --dry-run on a CPU", **facts}
    return {"ok": True, **facts}


def step_cuda_tests(c: Check) -> dict[str, Any]:
    files = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").glob("test_*.py")
        if "pytest.mark.cuda" in p.read_text()
    )
    xml = c.out / "cuda_tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "cuda",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        *files,
    ]
    done = c.run(cmd, c.left(STEP_CAP_S["cuda_tests"]), "cuda_tests")
    counts: dict[str, int] = {}
    if xml.is_file():
        suite = ET.parse(xml).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        if suite is not None:
            counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts.get("tests", 0) - sum(counts.get(k, 0) for k in ("failures", "errors", "skipped"))
    # on a GPU every one runs and passes; in a dry run they are collected and skip
    ok = done.returncode == 0 and counts.get("tests", 0) > 0 and (c.dry or passed == counts["tests"])
    return {"ok": ok, "files": files, "exit_code": done.returncode, "passed": passed, **counts}


def read_run(run_dir: Path) -> dict[str, Any]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    s = json.loads((run_dir / "summary.json").read_text())
    return {
        "accuracy": [r["accuracy"] for r in recs],
        "num_actors": s.get("num_actors"),
        "startup_s": s.get("startup_s"),
        "rounds_wall_s": s.get("wall_time_s"),
    }


def step_e2e(c: Check) -> dict[str, Any]:
    from cross_device import GpuSampler  # benchmarks/cross_device.py: nvidia-smi once a second

    per_client, test = (25, 100) if c.dry else (500, 1000)
    share = ["runtime=ray", "runtime.accelerator=cpu"] if c.dry else ["runtime=gpu"]
    serial = ["runtime=serial", f"runtime.accelerator={'cpu' if c.dry else 'gpu'}"]
    cases = {  # name: (clients, the Ray runtime's overrides)
        "one_per_gpu": (
            max(c.gpus, 1),
            [*share, "runtime.placement=per_client"] + ([] if c.dry else ["runtime.gpus_per_client=1"]),
        ),
        "quarter_gpu": (
            8,
            [*share, "runtime.placement=pool"]
            + (["runtime.num_actors=2"] if c.dry else ["runtime.gpus_per_client=0.25"]),
        ),
    }
    out: dict[str, Any] = {"tolerance": c.tol, "ok": True}
    if c.no_ray:  # nothing to compare with: one serial run still checks the step's own workings
        cases.pop("one_per_gpu")
    for name, (clients, ray_rt) in cases.items():
        base = [
            "method=fedavg",
            "data=fmnist",
            "data.partition=iid",
            f"fl.num_clients={clients}",
            f"data.train_subset={clients * per_client}",
            f"data.test_subset={test}",
            "fl.rounds=2",
            "fl.batch_size=32",
            "eval.clients=false",
            "logger=none",
            "seed=0",
            f"output_dir={c.work / 'runs'}",
            "experiment=e2e",
            "--quiet",
        ]
        case: dict[str, Any] = {"clients": clients}
        for label, rt in (("serial", serial), ("ray", ray_rt)):
            if label == "ray" and c.no_ray:
                case["ray"] = {"skipped": "--no-ray"}
                continue
            run_id = f"{name}_{label}"
            sampler = None if c.dry else GpuSampler()
            t0 = time.monotonic()
            cmd = [*fl_cli(), "run", *base, *rt, f"run_id={run_id}"]
            done = c.run(cmd, c.left(STEP_CAP_S["e2e"]), f"e2e {run_id}")
            r: dict[str, Any] = {
                "overrides": rt,
                "exit_code": done.returncode,
                "process_s": time.monotonic() - t0,
            }
            if sampler is not None:
                r["gpu"] = sampler.stop()
            if done.returncode == 0:
                r.update(read_run(c.work / "runs" / "e2e" / run_id))
            else:
                r["stderr_tail"] = done.stderr[-2000:]
                out["ok"] = False
            case[label] = r
        ref, ray_r = case["serial"].get("accuracy"), case.get("ray", {}).get("accuracy")
        if ref and ray_r:
            diffs = [abs(a - b) for a, b in zip(ray_r, ref, strict=True)]
            case["abs_diff_per_round"] = diffs
            case["bit_identical"] = ray_r == ref
            case["agrees"] = max(diffs) <= c.tol
            out["ok"] = out["ok"] and case["agrees"]
        out[name] = case
    return out


def step_cross_device(c: Check) -> dict[str, Any]:
    import importlib.util

    systems = ["plain"] if c.no_ray else ["plain", "sequential", "batched"]
    if not c.no_ray and importlib.util.find_spec("flwr") is not None:
        systems.append("flower")
    if c.dry:
        sizes = [
            "--device",
            "cpu",
            "--clients",
            "8",
            "--per-client",
            "20",
            "--per-round",
            "4",
            "--rounds",
            "1",
            "--test",
            "100",
        ]
    else:  # many small clients, as the benchmark's default but on the 12,000 images carried
        sizes = [
            "--device",
            "gpu",
            "--clients",
            "200",
            "--per-client",
            "60",
            "--per-round",
            "50",
            "--rounds",
            "3",
            "--test",
            "2000",
        ]
    dest = c.out / "cross_device.json"
    cmd = [
        sys.executable,
        str(BENCH / "cross_device.py"),
        *sizes,
        "--reps",
        "1",
        "--systems",
        ",".join(systems),
        "--out",
        str(dest),
    ]
    done = c.run(cmd, c.left(STEP_CAP_S["cross_device"]), "cross_device")
    if done.returncode != 0 or not dest.is_file():
        return {"ok": False, "exit_code": done.returncode, "stderr_tail": done.stderr[-2000:]}
    summary = next(iter(json.loads(dest.read_text())["summary"].values()))
    out: dict[str, Any] = {"ok": True, "file": dest.name, "systems": systems}
    for s in systems:
        m = summary.get(s, {})
        if not m.get("runs_ok"):
            out["ok"] = False
            out[s] = {"failed": True}
            continue
        out[s] = {
            "clients_per_s": m["clients_per_s"]["median"],
            "startup_s": m["startup_s"]["median"],
            "rounds_s": m["rounds_s"]["median"],
            "final_accuracy": m["accuracy"][-1],
            "gpu_util_mean_pct": (m.get("gpu_util_mean_pct") or {}).get("median"),
        }
    agree = summary.get("accuracy_vs_plain", {})
    out["agrees_with_plain"] = {s: a["agrees"] for s, a in agree.items()}
    out["ok"] = out["ok"] and all(a["agrees"] for s, a in agree.items() if s != "flower")
    if "batched_vs_sequential_clients_per_s" in summary:
        ratio = summary["batched_vs_sequential_clients_per_s"]
        out["batched_vs_sequential"] = ratio
        out["batched_at_least_5x"] = ratio >= 5.0
    return out


def step_cold_start(c: Check) -> dict[str, Any]:
    if c.no_ray:
        return {"ok": True, "skipped": "--no-ray (early start is a Ray start)"}
    dest = c.out / "cold_start.json"
    rt = ["--runtime", "ray", "--override", "runtime.accelerator=cpu"] if c.dry else ["--runtime", "gpu"]
    sizes = ["--clients", "2", "--per-client", "25", "--test", "100"] if c.dry else ["--clients", "8"]
    cmd = [
        sys.executable,
        str(BENCH / "cold_start.py"),
        "--reps",
        "1",
        "--rounds",
        "1",
        *rt,
        *sizes,
        "--out",
        str(dest),
    ]
    done = c.run(cmd, c.left(STEP_CAP_S["cold_start"]), "cold_start")
    if done.returncode != 0 or not dest.is_file():
        return {"ok": False, "exit_code": done.returncode, "stderr_tail": done.stderr[-2000:]}
    med = json.loads(dest.read_text())["medians"]
    out: dict[str, Any] = {"ok": True, "file": dest.name}
    for on in ("true", "false"):
        out[f"early_start_{on}"] = {
            "process_s": med[on]["process_wall_s_median"],
            "startup_s": med[on]["startup_s_median"],
        }
    plain = c.doc["steps"].get("cross_device", {}).get("plain", {})
    if "startup_s" in plain:
        out["plain_loop_startup_s"] = plain["startup_s"]  # process start to its first round
    out["startup_under_5s"] = med["true"]["startup_s_median"] < 5.0
    runs = json.loads(dest.read_text()).get("runs", [])
    out["startup_phases_s"] = {  # where the start-up went, each run
        f"early_start_{str(r['early_start']).lower()}_{r['rep']}": r.get("startup_phases_s") for r in runs
    }
    return out


def step_reproduce_estimate(c: Check) -> dict[str, Any]:
    helped = c.run([*fl_cli(), "reproduce", "--help"], c.left(30), "reproduce --help")
    if "--estimate" not in helped.stdout:
        return {"ok": True, "status": "not available: `fl-lightning reproduce` has no --estimate"}
    out: dict[str, Any] = {"ok": True, "papers": {}}
    # the papers before the controls: on a GPU the budget may end inside this step
    papers = sorted(
        (p.stem for p in (REPO / "conf" / "reproduce").glob("*.yaml")),
        key=lambda n: (n.startswith("controls_"), n),
    )
    # a dry run checks the step, not every paper's CPU cost: one paper, the one whose backbones time fastest
    for paper in (["feddtr"] if "feddtr" in papers else papers[:1]) if c.dry else papers:
        cmd = [*fl_cli(), "reproduce", paper, "--scale", "paper", "--estimate"]
        done = c.run(cmd, c.left(STEP_CAP_S["reproduce_estimate"]), f"reproduce {paper} --estimate")
        out["papers"][paper] = {"exit_code": done.returncode, "stdout": done.stdout[-3000:]}
        if done.returncode != 0:
            out["ok"] = False
            out["papers"][paper]["stderr_tail"] = done.stderr[-1000:]
    return out


STEP_FN = {
    "env": step_env,
    "cuda_tests": step_cuda_tests,
    "e2e": step_e2e,
    "cross_device": step_cross_device,
    "cold_start": step_cold_start,
    "reproduce_estimate": step_reproduce_estimate,
}


def reading(doc: dict[str, Any]) -> list[str]:
    """The lines docs/results.md reads off the JSON."""
    s = doc["steps"]
    lines = []
    env = s.get("env", {})
    if env.get("gpus"):
        lines.append(
            f"device: {env['gpus'][0]['name']} x{len(env['gpus'])}, CUDA {env.get('cuda')}, "
            f"torch {env.get('torch')}, Lightning {env.get('lightning')}, Ray {env.get('ray')}"
        )
    for name, st in s.items():
        lines.append(
            f"{name}: {'ok' if st.get('ok') else 'FAILED'}"
            + (f" ({st['error'][:200]})" if "error" in st else "")
        )
    cd = s.get("cross_device", {})
    for k in ("plain", "sequential", "batched", "flower"):
        if isinstance(cd.get(k), dict) and "clients_per_s" in cd[k]:
            m = cd[k]
            util = "" if m["gpu_util_mean_pct"] is None else f", GPU util {m['gpu_util_mean_pct']:.0f}%"
            lines.append(f"  {k}: {m['clients_per_s']:.1f} clients/s, start-up {m['startup_s']:.1f} s{util}")
    if "batched_vs_sequential" in cd:
        lines.append(
            f"  batched / sequential: {cd['batched_vs_sequential']:.2f} (>= 5: {cd['batched_at_least_5x']})"
        )
    cs = s.get("cold_start", {})
    if "early_start_true" in cs:
        lines.append(
            f"  start-up with early start {cs['early_start_true']['startup_s']:.2f} s, without "
            f"{cs['early_start_false']['startup_s']:.2f} s; under 5 s: {cs['startup_under_5s']}"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", type=Path, required=True, help="folder for gpu_check.json, log.txt, the benchmarks' JSON"
    )
    ap.add_argument("--work", default=None, help="folder for the runs (default: a new temporary one)")
    ap.add_argument("--dry-run", action="store_true", help="the same steps on the CPU, tiny")
    ap.add_argument("--no-ray", action="store_true", help="leave out the runs that start Ray")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated subset of " + ", ".join(STEPS))
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for all steps together (default 450; --dry-run: 1800, a busy CPU)",
    )
    ap.add_argument("--tol", type=float, default=0.005, help="accuracy difference per round, Ray vs serial")
    args = ap.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        ap.error(f"unknown step {unknown[0]!r}; valid: {', '.join(STEPS)}")
    if args.budget_s is None:
        args.budget_s = 1800.0 if args.dry_run else 450.0
    sys.path.insert(0, str(BENCH))
    c = Check(args)
    if "env" not in steps:
        steps.insert(0, "env")  # the others read the GPU count
    for name in steps:
        print(f"gpu_check: {name} ({c.left(1e9):.0f} s of the budget left)", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        if c.left(1e9) <= 0:
            res: dict[str, Any] = {"ok": False, "error": "skipped: the budget was spent"}
        else:
            try:
                res = STEP_FN[name](c)
            except subprocess.TimeoutExpired as e:
                res = {"ok": False, "error": f"timed out after {e.timeout:.0f} s"}
            except Exception as e:  # one broken step must not lose the others' results
                res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        res["wall_s"] = round(time.monotonic() - t0, 2)
        c.doc["steps"][name] = res
        c.save()
        if name == "env" and not res["ok"]:
            break
    c.doc["reading"] = reading(c.doc)
    c.save()
    print("\n".join(c.doc["reading"]))
    print(f"wrote {c.out / 'gpu_check.json'} and {c.out / 'log.txt'}")
    return 0 if all(s.get("ok") for s in c.doc["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
