"""fl_lightning against Flower's simulation engine on the same federated workload.

Workload (`bench_workload.py`, as `engine_overhead.py`): Fashion-MNIST, 10 IID clients x 600
images, FedAvg's CNN, 1 local epoch, batch 32, SGD(0.05, momentum 0.9), 5 rounds, server
evaluation on 2,000 test images each round. Two systems, alternating (A B, then B A, ...),
`--reps` runs each, every run in a fresh process so that start-up includes the imports:

  fl_lightning  `runtime=ray` on the CPU (local Ray on loopback, pooled client actors);
                `runtime=gpu` with `runtime.gpus_per_client` on a GPU
  flower        Flower 1.41 `run_simulation` (Ray backend), 1 CPU per actor on the CPU,
                plus `num_gpus` = `--gpus-per-client` per actor on a GPU (`flower_app.py`):
                same shards (fl_lightning's loader and split), model class and initial
                weights, optimiser, batch size and server evaluation; batches through a
                DataLoader on the CPU, by index from the shard resident on the GPU there
                (`--flower-batches`)

Flower's Ray gets the loopback settings of fl_lightning's own local Ray
(fl_lightning/runtime/local_ray.py): loopback node IP, usage stats off, a HOME holding
`ray_bootstrap_config.yaml`, `address="local"`; and Flower's telemetry is off.

Per run: total wall time (process start to exit), start-up (process start to the first
round's start), rounds (first round's start to the last round's end, evaluation included),
teardown, each round's time, peak driver RSS (the process's VmHWM) and the accuracy of each
round. Writes JSON (machine, every run, medians, the ratio fl_lightning / Flower) and prints
one table. Without flwr it says how to install it and measures fl_lightning alone.

Run: `python benchmarks/vs_flower.py --out benchmarks/results/vs_flower.json` (`make bench`);
Flower: `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_workload import add_workload_args, overrides
from driver_memory import machine, poll_memory

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
SYSTEMS = ("fl_lightning", "flower")
MISSING_FLWR = (
    "vs_flower: flwr is not installed, so Flower is skipped and fl_lightning is measured alone; "
    "install it with: pip install -e '.[bench]'"
)


# --- the measured processes ------------------------------------------------------------------
def child_fl_lightning(spec: dict[str, Any]) -> dict[str, Any]:
    """One fl_lightning run as `fl-lightning run` does it (`Session.early_start` around `start_run`:
    Ray and the workers start while the driver imports), each round timed."""
    from fl_lightning.lean_imports import install

    install()  # as `fl-lightning run` does, first
    from fl_lightning.config import compose
    from fl_lightning.runtime.lock import new_run_path
    from fl_lightning.runtime.session import Session

    cfg = compose(spec["overrides"])
    stamps: dict[str, list[float]] = {"round_start": [], "round_end": []}
    with Session() as session, session.early_start(cfg):
        from fl_lightning.runtime import runner
        from fl_lightning.runtime.callbacks import Callback

        class Stamps(Callback):  # each round's start and the end of its own work
            def on_round_start(self, plan: Any) -> None:
                stamps["round_start"].append(time.time())

            def on_round_end(self, state: Any, record: Any) -> None:
                stamps["round_end"].append(time.time())

        summary, run_dir = runner.start_run(
            cfg, console=False, run_dir=new_run_path(cfg), session=session, callbacks=[Stamps()]
        )
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    stamps["eval_s"] = [r["time_eval_s"] for r in recs]
    stamps["accuracy"] = [r["accuracy"] for r in recs]
    stamps["fit_s"] = [r["time_fit_s"] for r in recs]
    return {
        "stamps": stamps, "num_actors": summary.get("num_actors"),
        "startup_phases_s": summary.get("startup_phases_s"),  # where the start-up went (runner.py)
    }  # fmt: skip


def child(system: str, spec_file: Path, result_file: Path) -> None:
    spec = json.loads(spec_file.read_text())
    if system == "flower":
        import flower_app  # benchmarks/flower_app.py

        res = flower_app.run(spec)
    else:
        res = child_fl_lightning(spec)
    res["t_end"] = time.time()
    res["ru_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result_file.write_text(json.dumps(res))
    if system == "fl_lightning":
        from fl_lightning.cli.main import exit_now

        exit_now(0)  # as `fl-lightning run` ends: without Python's teardown of torch's modules


# --- the parent: run, alternate, summarise ---------------------------------------------------
def child_env(system: str, device: str, tmp: Path) -> dict[str, str]:
    from fl_lightning.runtime.local_ray import LOOPBACK_ENV, ray_home, ray_tmpdir

    env = {**os.environ, **LOOPBACK_ENV, "RAY_TMPDIR": str(ray_tmpdir()), "WANDB_MODE": "disabled"}
    # The data root as this user's (its default is under HOME, which Flower's process changes).
    env.setdefault("FL_LIGHTNING_DATA", str(Path("~/.cache/fl_lightning/data").expanduser()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH", "")) if p)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # both systems on the CPU, even on a GPU machine
    if system == "flower":
        # Flower calls ray.init itself: the HOME with ray_bootstrap_config.yaml (no
        # cloud-metadata probes) is this process's HOME; Flower's own files and telemetry stay off.
        env.update(HOME=str(ray_home()), FLWR_HOME=str(tmp / "flwr_home"), FLWR_TELEMETRY_ENABLED="0")
    return env


def run_one(system: str, device: str, rep: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{system}_{device}_{rep}"
    out.mkdir(parents=True)
    runtime = (
        ["runtime=ray"]
        if device == "cpu"
        else ["runtime=gpu", f"runtime.gpus_per_client={args.gpus_per_client}"]
    )
    spec = {
        "overrides": [*overrides(args, str(out)), *runtime, f"run_id={system}_{device}_{rep}"],
        "device": device, "gpus_per_client": args.gpus_per_client, "threads": args.threads,
        "seed": args.seed, "clients": args.clients, "batches": flower_batches(args, device),
    }  # fmt: skip
    (out / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", system]
    cmd += ["--spec", str(out / "spec.json"), "--result", str(out / "result.json")]
    with open(out / "log.txt", "w") as log:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(system, device, tmp), stdout=log, stderr=log)
        peaks = poll_memory(proc)
        t_exit = time.time()
    run: dict[str, Any] = {"system": system, "device": device, "rep": rep, "exit_code": proc.returncode}
    if system == "flower":
        run["flower_batches"] = spec["batches"]
    run["total_s"] = t_exit - t0
    if proc.returncode != 0 or not (out / "result.json").exists():
        run["log_tail"] = (out / "log.txt").read_text()[-4000:]
        print(f"vs_flower: {system} ({device}, rep {rep}) failed, exit {proc.returncode}:", file=sys.stderr)
        print(run["log_tail"], file=sys.stderr)
        return run
    res = json.loads((out / "result.json").read_text())
    st = res.pop("stamps")
    starts, ends = st["round_start"], st["round_end"]
    run.update(
        startup_s=starts[0] - t0,
        rounds_s=ends[-1] - starts[0],
        teardown_s=t_exit - ends[-1],
        round_s=[e - s for s, e in zip(starts, ends, strict=True)],
        eval_s=st["eval_s"],
        accuracy=st["accuracy"],
        peak_driver_rss_mb=peaks["VmHWM"] or res["ru_maxrss_mb"],
        driver_sampled_peak_mb=peaks,
        **{k: v for k, v in res.items() if k != "t_end"},
    )
    return run


def flower_batches(args: argparse.Namespace, device: str) -> str:
    """How Flower's clients draw batches: auto is a DataLoader on the CPU (as fl_lightning's
    clients) and the shard resident on the GPU, batches by index there."""
    if args.flower_batches != "auto":
        return str(args.flower_batches)
    return "dataloader" if device == "cpu" else "index"


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list[dict[str, Any]], systems: tuple[str, ...], tol: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in systems:
        ok = [r for r in runs if r["system"] == s and "rounds_s" in r]
        if not ok:
            out[s] = {"runs_ok": 0}
            continue
        accs = [r["accuracy"] for r in ok]
        out[s] = {
            "runs_ok": len(ok),
            **{k: spread([r[k] for r in ok]) for k in ("total_s", "startup_s", "rounds_s", "teardown_s")},
            "peak_driver_rss_mb": spread([r["peak_driver_rss_mb"] for r in ok]),
            "round_s_median": [statistics.median(x) for x in zip(*(r["round_s"] for r in ok), strict=True)],
            "accuracy_mean": [statistics.fmean(x) for x in zip(*accs, strict=True)],
        }
    a, b = out.get("fl_lightning", {}), out.get("flower", {})
    if a.get("runs_ok") and b.get("runs_ok"):
        out["ratio_fl_lightning_vs_flower"] = {
            k: a[k]["median"] / b[k]["median"] for k in ("total_s", "startup_s", "rounds_s")
        }
        diffs = [abs(x - y) for x, y in zip(a["accuracy_mean"], b["accuracy_mean"], strict=True)]
        out["accuracy_abs_diff_per_round"] = diffs
        # Judged on the last round: after the first rounds accuracy swings by several points
        # with the clients' seeds and batch order, which differ between the two systems.
        out["accuracy_agrees"] = diffs[-1] <= tol
        out["accuracy_tolerance"] = tol
    return out


def fmt(d: dict[str, float], reps: int) -> str:
    return f"{d['median']:.1f}" + (f" ({d['min']:.1f}-{d['max']:.1f})" if reps > 1 else "")


def table(
    device: str, summary: dict[str, Any], systems: tuple[str, ...], reps: int, args: argparse.Namespace
) -> str:
    names = {
        "fl_lightning": "fl_lightning runtime=" + ("ray" if device == "cpu" else "gpu"),
        "flower": "Flower simulation",
    }
    cols = ("start-up s", "rounds s", "teardown s", "total s", "peak RSS MB", "final acc")
    rows = [("", *cols)]
    for s in systems:
        m = summary[s]
        if not m.get("runs_ok"):
            rows.append((names[s], *(["failed"] + [""] * 5)))
            continue
        keys = ("startup_s", "rounds_s", "teardown_s", "total_s")
        rss = m["peak_driver_rss_mb"]
        rows.append(
            (
                names[s],
                *(fmt(m[k], reps) for k in keys),
                f"{rss['median']:.0f}",
                f"{m['accuracy_mean'][-1]:.4f}",
            )
        )
    if "ratio_fl_lightning_vs_flower" in summary:
        r = summary["ratio_fl_lightning_vs_flower"]
        rows.append(
            (
                "ratio fl_lightning/Flower",
                f"{r['startup_s']:.2f}",
                f"{r['rounds_s']:.2f}",
                "",
                f"{r['total_s']:.2f}",
                "",
                "",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols) + 1)]
    lines = [
        f"{device.upper()}: {args.clients} clients x {args.per_client}, {args.rounds} rounds, "
        f"medians (min-max) of {reps} runs each"
    ]
    lines += [
        "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    for s in systems:
        m = summary[s]
        if m.get("runs_ok"):
            rounds = " ".join(f"{x:.2f}" for x in m["round_s_median"])
            accs = " ".join(f"{x:.4f}" for x in m["accuracy_mean"])
            lines.append(f"{names[s]}: round s {rounds} | accuracy {accs}")
    if "accuracy_agrees" in summary:
        diffs = " ".join(f"{d:.4f}" for d in summary["accuracy_abs_diff_per_round"])
        lines.append(
            f"final accuracy agrees within {summary['accuracy_tolerance']}: {summary['accuracy_agrees']} "
            f"(|difference| per round: {diffs})"
        )
    return "\n".join(lines)


def machine_facts() -> dict[str, Any]:
    import torch

    facts = machine()  # CPU model, cores, memory, python, torch, ray, lightning
    facts["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    facts["gpus"] = torch.cuda.device_count()
    try:
        from importlib.metadata import version

        facts["flwr"] = version("flwr")
    except Exception:
        facts["flwr"] = None
    return facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--reps", type=int, default=2, help="runs of each system (alternating)")
    ap.add_argument("--device", choices=("auto", "cpu", "gpu", "both"), default="auto",
                    help="auto: the GPU when CUDA is present, else the CPU")  # fmt: skip
    ap.add_argument(
        "--gpus-per-client", type=float, default=0.1, help="GPU share of a client actor (both systems)"
    )
    ap.add_argument(
        "--flower-batches", choices=("auto", "dataloader", "index"), default="auto",
        help="Flower clients' batches: a DataLoader, or by index from the resident shard "
        "(auto: DataLoader on the CPU, index on the GPU)",
    )  # fmt: skip
    ap.add_argument(
        "--acc-tol", type=float, default=0.03, help="largest final-round accuracy difference taken as noise"
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vs_flower.json")
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.spec, args.result)
        return

    systems: tuple[str, ...] = SYSTEMS
    if importlib.util.find_spec("flwr") is None:
        print(MISSING_FLWR, file=sys.stderr)
        systems = ("fl_lightning",)
    facts = machine_facts()
    if args.device == "auto":
        devices = ["gpu" if facts["gpus"] else "cpu"]
    elif args.device == "both":
        devices = ["cpu", "gpu"]
    else:
        devices = [args.device]
    if "gpu" in devices and not facts["gpus"]:
        ap.error("--device gpu: no CUDA device here")
    doc: dict[str, Any] = {
        "benchmark": "vs_flower",
        "workload": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if v is not None
        },
        "machine": facts,
        "order": "alternating: rep 0 runs the systems in order, rep 1 reversed, and so on",
        "notes": [
            "total: process start to exit; start-up: process start to the first round's start; "
            "rounds: first round's start to the last round's end (evaluation included)",
            "peak driver RSS: VmHWM of the measured process (the driver), not of the Ray actors",
            "Flower's server evaluation counts top-1 correct on the same test images (fl_lightning's "
            "accuracy metric is the same quantity); its clients keep their shard per actor (on the GPU "
            "there) and draw batches as --flower-batches says (runs[].flower_batches)",
            "Flower's processes import fl_lightning's config, data loader and model registry (torchvision "
            "included) for the same data and model, not Lightning",
            "the client seeds differ between the systems (each its own), so accuracy agrees to within "
            "noise, not to the digit",
        ],
        "runs": [],
        "summary": {},
    }
    tables = []
    with tempfile.TemporaryDirectory(prefix="vs_flower_") as tmp:
        for device in devices:
            for rep in range(args.reps):
                for system in systems if rep % 2 == 0 else systems[::-1]:
                    print(
                        f"vs_flower: {system} on {device}, run {rep + 1}/{args.reps} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    run = run_one(system, device, rep, args, Path(tmp))
                    doc["runs"].append(run)
                    print(
                        "  "
                        + json.dumps(
                            {k: run.get(k) for k in ("total_s", "startup_s", "rounds_s", "accuracy")}
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
            summary = summarise([r for r in doc["runs"] if r["device"] == device], systems, args.acc_tol)
            doc["summary"][device] = summary
            tables.append(table(device, summary, systems, args.reps, args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("\n\n".join(tables))
    if len(systems) == 1:
        print(MISSING_FLWR)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
