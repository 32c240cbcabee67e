"""fl_lightning against its peers on the same federated workloads, whole processes alternating.

Systems (each run a fresh process, so start-up includes the imports):

  plain            the floor: one process, a plain PyTorch loop on fl_lightning's data, model,
                   client sampling, seeds, batches and averaging (`cross_device.child_plain`)
  serial           fl_lightning `runtime=serial` (clients one after another in the driver)
  ray              fl_lightning `runtime=ray` (local Ray on loopback, one client actor a core)
  batched          `runtime=ray` with `runtime.batched` = the round's clients (weights stacked)
  flower           Flower 1.41 `run_simulation` (Ray backend, `flower_app.py`; `pip install
                   -e '.[bench]'`): its own client sampling and seeds
  blazefl_thread   BlazeFL's FedAvg, thread pool (`blazefl_app.py`), in BlazeFL's own venv
  blazefl_process  the same, process pool (spawn, shared-memory IPC, as BlazeFL's benchmark)

Workloads (Fashion-MNIST, IID, FedAvg's CNN, 1 local epoch, SGD(`--lr`) without momentum,
server evaluation on `--test` test images after each round, `--rounds` rounds):

  10x600    10 clients x 600 images, all 10 a round, batch 32
  20x300    20 clients x 300 images, all 20 a round, batch 16
  1000x60   1,000 clients x 60 images (cross-device), 50 a round, batch 10

Parallelism is the machine's cores for everyone: fl_lightning's `runtime=ray` makes one actor a
core, Flower one actor a core (`num_cpus` 1), BlazeFL `num_parallels` = cores; one torch thread
a client everywhere (the plain loop and `serial`: one thread in all).

Per run: total (process start to exit), start-up (process start to the first round's start),
rounds (the first round's start to the last round's end, evaluations included), teardown,
each round's time, accuracy per round (plain, serial, ray and batched train the same clients on
the same batches: equal to `--same-tol`; Flower and BlazeFL sample and seed their own: the
final round to `--acc-tol`, so nobody wins by computing less), and for fl_lightning its
summary's `startup_phases_s`. The JSON keeps the machine, the load average before and after each
run (the numbers of a loaded machine are not a quiet machine's), and medians.

BlazeFL needs Python >= 3.12 (2.x; 3.0: >= 3.14): make its venv from pyenv's newest Python,
`~/.pyenv/versions/3.13.0/bin/python -m venv /work/blazefl-venv && /work/blazefl-venv/bin/pip
install 'blazefl[contrib,reproducibility]'`, and pass `--blazefl-python /work/blazefl-venv/bin/python`.
Its process gets the workload's data from a file this script writes first (outside the timing).

Run: `python benchmarks/peers.py --reps 3 --out benchmarks/results/peers.json`
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from driver_memory import poll_memory
from vs_flower import child_env, machine_facts, spread

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
SYSTEMS = ("plain", "serial", "ray", "batched", "flower", "blazefl_thread", "blazefl_process")
FL_LIGHTNING = ("serial", "ray", "batched")
SAME_CLIENTS = ("plain", "serial", "ray", "batched")  # the same clients, seeds and batches
#: name -> (clients, images a client, clients a round, batch size)
WORKLOADS = {"10x600": (10, 600, 10, 32), "20x300": (20, 300, 20, 16), "1000x60": (1000, 60, 50, 10)}


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def overrides(w: str, args: argparse.Namespace, out: str) -> list[str]:
    """Workload `w` as fl_lightning overrides (add `runtime=...`)."""
    clients, per_client, per_round, batch = WORKLOADS[w]
    return [
        "method=fedavg", "data=fmnist", "data.partition=iid", f"fl.num_clients={clients}",
        f"data.train_subset={clients * per_client}", f"data.test_subset={args.test}",
        f"fl.clients_per_round={per_round}", f"fl.rounds={args.rounds}", "fl.local_epochs=1",
        f"fl.batch_size={batch}", f"optim.lr={args.lr}", "optim.momentum=0", "eval.clients=false",
        "logger=none", f"output_dir={out}", f"seed={args.seed}", "runtime.threads_per_client=1",
    ]  # fmt: skip


def runtime_of(system: str, w: str) -> list[str]:
    if system in ("plain", "serial"):
        return ["runtime=serial"]
    if system == "batched":
        return ["runtime=ray", f"runtime.batched={WORKLOADS[w][2]}"]
    return ["runtime=ray"]


# --- the measured processes (this venv's) ------------------------------------------------------
def child(system: str, spec_file: Path, result_file: Path) -> None:
    """The measured process of `system` (this venv's): `cross_device.py`'s, whose "sequential"
    is any fl_lightning run (the spec's overrides say which runtime)."""
    from cross_device import child as cross_device_child

    cross_device_child("sequential" if system in ("serial", "ray") else system, spec_file, result_file)


def export_for_blazefl(w: str, args: argparse.Namespace, tmp: Path) -> Path:
    """The workload's images (uint8), IID split, test images and initial weights, as the other
    systems get them from fl_lightning, in one file BlazeFL's process reads (no numpy there)."""
    import torch

    from fl_lightning.config import compose
    from fl_lightning.runtime.build import prepare

    p = prepare(compose([*overrides(w, args, str(tmp / "export")), "runtime=serial"]))
    ds = p.dataset
    assert p.init_params is not None, "one set of initial weights for every client"
    mean, std = (float(torch.as_tensor(v).reshape(-1)[0]) for v in (ds.mean, ds.std))  # one grey channel
    data = {
        "train_x": torch.from_numpy(ds.train_x.copy()), "train_y": torch.from_numpy(ds.train_y.copy()),
        "split": [torch.from_numpy(i.copy()).long() for i in p.split.train],
        "test_x": torch.from_numpy(ds.test_x.copy()), "test_y": torch.from_numpy(ds.test_y.copy()),
        "mean": mean, "std": std, "init": dict(p.init_params),
    }  # fmt: skip
    path = tmp / f"blazefl_{w}.pt"
    torch.save(data, path)
    return path


# --- the parent ---------------------------------------------------------------------------------
def run_one(system: str, w: str, rep: int, args: argparse.Namespace, tmp: Path, data: Path | None) -> dict:
    out = tmp / f"{w}_{system}_{rep}"
    out.mkdir(parents=True)
    clients, _, per_round, batch = WORKLOADS[w]
    cores = os.cpu_count() or 1
    spec: dict[str, Any] = {
        "overrides": [*overrides(w, args, str(out)), *runtime_of(system, w), f"run_id={system}_{rep}"],
        "device": "cpu", "gpus_per_client": 0.0, "threads": 1, "plain_threads": 1, "seed": args.seed,
        "clients": clients, "per_round": per_round, "batches": "dataloader",
    }  # fmt: skip
    if system.startswith("blazefl"):
        spec.update(
            data=str(data), mode=system.removeprefix("blazefl_"), rounds=args.rounds, epochs=1,
            batch_size=batch, lr=args.lr, parallels=cores, eval_batch_size=1000, tmp=str(out),
        )  # fmt: skip
    (out / "spec.json").write_text(json.dumps(spec))
    if system.startswith("blazefl"):
        cmd = [
            args.blazefl_python,
            str(BENCH / "blazefl_app.py"),
            str(out / "spec.json"),
            str(out / "result.json"),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(TQDM_DISABLE="1", OMP_NUM_THREADS="1")  # one torch thread a client (spawned ones too)
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", system]
        cmd += ["--spec", str(out / "spec.json"), "--result", str(out / "result.json")]
        env = child_env("flower" if system == "flower" else "fl_lightning", "cpu", tmp)
    load_before = load_average()
    with open(out / "log.txt", "w") as log:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)
        peaks = poll_memory(proc)
        t_exit = time.time()
    run: dict[str, Any] = {"workload": w, "system": system, "rep": rep, "exit_code": proc.returncode}
    run.update(total_s=t_exit - t0, load_average_before=load_before, load_average_after=load_average())
    if proc.returncode != 0 or not (out / "result.json").exists():
        run["log_tail"] = (out / "log.txt").read_text()[-4000:]
        print(f"peers: {w} {system} (rep {rep}) failed, exit {proc.returncode}:", file=sys.stderr)
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
        accuracy=st["accuracy"],
        peak_driver_rss_mb=peaks["VmHWM"] or res.get("ru_maxrss_mb"),
        **{k: v for k, v in res.items() if k != "t_end"},
    )
    return run


def summarise(runs: list[dict[str, Any]], systems: tuple[str, ...], args: argparse.Namespace) -> dict:
    out: dict[str, Any] = {}
    for s in systems:
        ok = [r for r in runs if r["system"] == s and "rounds_s" in r]
        if not ok:
            out[s] = {"runs_ok": 0}
            continue
        out[s] = {
            "runs_ok": len(ok),
            **{k: spread([r[k] for r in ok]) for k in ("total_s", "startup_s", "rounds_s", "teardown_s")},
            "round_s_median": [statistics.median(x) for x in zip(*(r["round_s"] for r in ok), strict=True)],
            "accuracy_mean": [statistics.fmean(x) for x in zip(*(r["accuracy"] for r in ok), strict=True)],
            "accuracy_same_every_run": all(r["accuracy"] == ok[0]["accuracy"] for r in ok),
        }
        phases = [r["startup_phases_s"] for r in ok if r.get("startup_phases_s")]
        if phases:
            out[s]["startup_phases_s_median"] = {
                k: statistics.median(p[k] for p in phases if k in p) for k in phases[0]
            }
    ref = out.get("plain", {})
    if ref.get("runs_ok"):
        agree: dict[str, Any] = {}
        for s in systems:
            if s == "plain" or not out[s].get("runs_ok"):
                continue
            diffs = [abs(a - b) for a, b in zip(out[s]["accuracy_mean"], ref["accuracy_mean"], strict=True)]
            same = s in SAME_CLIENTS
            checked = diffs if same else diffs[-1:]
            tol = args.same_tol if same else args.acc_tol
            agree[s] = {"abs_diff_per_round": diffs, "tolerance": tol, "agrees": max(checked) <= tol}
        out["accuracy_vs_plain"] = agree
        out["total_s_vs_plain"] = {
            s: out[s]["total_s"]["median"] / ref["total_s"]["median"]
            for s in systems
            if out[s].get("runs_ok")
        }
    best_peer = [
        out[s]["total_s"]["median"]
        for s in ("blazefl_thread", "blazefl_process")
        if out.get(s, {}).get("runs_ok")
    ]
    flower = out.get("flower", {})
    for s in FL_LIGHTNING:
        if not out.get(s, {}).get("runs_ok"):
            continue
        t = out[s]["total_s"]["median"]
        if best_peer:
            out[s]["total_s_vs_blazefl_best"] = t / min(best_peer)
        if flower.get("runs_ok"):
            out[s]["total_s_vs_flower"] = t / flower["total_s"]["median"]
    return out


def fmt(d: dict[str, float], reps: int) -> str:
    return f"{d['median']:.1f}" + (f" ({d['min']:.1f}-{d['max']:.1f})" if reps > 1 else "")


def table(w: str, summary: dict[str, Any], systems: tuple[str, ...], reps: int) -> str:
    cols = ("start-up s", "rounds s", "teardown s", "total s", "final acc", "x plain")
    rows = [("", *cols)]
    for s in systems:
        m = summary[s]
        if not m.get("runs_ok"):
            rows.append((s, "failed", "", "", "", "", ""))
            continue
        ratio = summary.get("total_s_vs_plain", {}).get(s)
        rows.append((s, *(fmt(m[k], reps) for k in ("startup_s", "rounds_s", "teardown_s", "total_s")),
                     f"{m['accuracy_mean'][-1]:.4f}", f"{ratio:.2f}" if ratio else ""))  # fmt: skip
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols) + 1)]
    clients, per_client, per_round, batch = WORKLOADS[w]
    lines = [f"{w}: {clients} clients x {per_client}, {per_round} a round, batch {batch}; medians of {reps}"]
    for row in rows:
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(f"{c:<{w_}}" if i == 0 else f"{c:>{w_}}" for i, (c, w_) in enumerate(cells)))
    for s, a in summary.get("accuracy_vs_plain", {}).items():
        lines.append(f"  {s}: accuracy agrees with plain within {a['tolerance']}: {a['agrees']}")
    return "\n".join(lines)


def blazefl_python(given: str | None) -> str | None:
    """BlazeFL's interpreter: `--blazefl-python`, else /work/blazefl-venv's; None without blazefl."""
    for exe in [given] if given else ["/work/blazefl-venv/bin/python"]:
        if exe and Path(exe).exists():
            ok = subprocess.run([exe, "-c", "import blazefl.contrib"], capture_output=True).returncode == 0
            if ok:
                return exe
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ", ".join(WORKLOADS)
    )
    ap.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ", ".join(SYSTEMS)
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3, help="runs of each system a workload (alternating)")
    ap.add_argument("--blazefl-python", help="the interpreter of BlazeFL's venv (default /work/blazefl-venv)")
    ap.add_argument(
        "--same-tol", type=float, default=0.005, help="per-round accuracy, same clients and batches"
    )
    ap.add_argument("--acc-tol", type=float, default=0.03, help="final-round accuracy, Flower and BlazeFL")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "peers.json")
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.spec, args.result)
        return
    systems = tuple(s for s in args.systems.split(",") if s)
    workloads = tuple(w for w in args.workloads.split(",") if w)
    for name, given, valid in (("system", systems, SYSTEMS), ("workload", workloads, tuple(WORKLOADS))):
        unknown = sorted(set(given) - set(valid))
        if unknown:
            ap.error(f"unknown {name} {unknown[0]!r}; valid: {', '.join(valid)}")
    skipped: dict[str, str] = {}
    if "flower" in systems and importlib.util.find_spec("flwr") is None:
        skipped["flower"] = "flwr is not installed: pip install -e '.[bench]'"
    args.blazefl_python = blazefl_python(args.blazefl_python)
    if args.blazefl_python is None:
        for s in ("blazefl_thread", "blazefl_process"):
            skipped[s] = "no BlazeFL venv: see this script's docstring"
    for s, why in skipped.items():
        print(f"peers: {s} skipped: {why}", file=sys.stderr)
    systems = tuple(s for s in systems if s not in skipped)
    facts = machine_facts()
    if args.blazefl_python:
        facts["blazefl_python"] = args.blazefl_python
    doc: dict[str, Any] = {
        "benchmark": "peers",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "workloads": {
            w: dict(zip(("clients", "per_client", "per_round", "batch_size"), WORKLOADS[w], strict=True))
            for w in workloads
        },  # fmt: skip
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if v is not None},
        "machine": facts,
        "load_average_start": load_average(),
        "skipped": skipped,
        "order": "per workload, alternating: rep 0 runs the systems in order, rep 1 reversed, and so on",
        "notes": [
            "start-up: process start to the first round's start; rounds: the first round's start to "
            "the last round's end (evaluations included); teardown: from there to the process's exit",
            "BlazeFL reads the workload's data from a file written before its run (outside the timing); "
            "the others load Fashion-MNIST from fl_lightning's cache and split it inside theirs",
            "Flower and BlazeFL sample clients and seed batches their own way: their accuracy agrees "
            "with the plain loop's to noise (final round, --acc-tol), not to the digit",
        ],
        "runs": [],
        "summary": {},
    }
    tables = []
    with tempfile.TemporaryDirectory(prefix="peers_") as tmp_:
        tmp = Path(tmp_)
        for w in workloads:
            data = export_for_blazefl(w, args, tmp) if any(s.startswith("blazefl") for s in systems) else None
            for rep in range(args.reps):
                for system in systems if rep % 2 == 0 else systems[::-1]:
                    print(f"peers: {w} {system}, run {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
                    run = run_one(system, w, rep, args, tmp, data)
                    doc["runs"].append(run)
                    keys = ("total_s", "startup_s", "rounds_s", "accuracy", "load_average_before")
                    print("  " + json.dumps({k: run.get(k) for k in keys}), file=sys.stderr, flush=True)
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(doc, indent=1) + "\n")  # what is done so far
            summary = summarise([r for r in doc["runs"] if r["workload"] == w], systems, args)
            doc["summary"][w] = summary
            tables.append(table(w, summary, systems, args.reps))
            if data is not None:
                data.unlink()
    doc["load_average_end"] = load_average()
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("\n\n".join(tables))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
