"""Driver memory with resident client state: the driver's peak RSS as the number of clients grows.

Method LG-FedAvg (every parameter but the head stays with its client, so each client that
has trained keeps a personal state) or, with `--method ditto`, Ditto (each client keeps a
whole personal model), FedAvg's CNN with `model.hidden=64`, Fashion-MNIST
IID with a 25% client test split, `runtime=ray` (local Ray on loopback, as the CLI starts
it). Each client count runs in its own fresh process through the CLI:

    fl-lightning run method=<lg_fedavg|ditto> data=fmnist data.partition=iid data.client_test_fraction=0.25
        model.hidden=64 fl.num_clients=N fl.clients_per_round=max(N//10, 10) (or --per-round) fl.rounds=3
        fl.batch_size=8 eval.every=3 logger=none runtime.threads_per_client=1
        data.train_subset=min(N*per_client, 60000) output_dir=<tmp> --quiet

The runner writes `driver_peak_rss_mb` into `summary.json` and `driver_rss_mb` per round
into `metrics.jsonl`; this script reads them back, with the run's wall time, and sets them
next to the personal-state bytes per client (from the model's parameters, split by the
objective's own `is_personal`) and what those states would add if the driver held them:
for the clients that hold a state at the end of the run (the distinct clients sampled,
counted from the checkpoint's client-state files) and for all N clients. While a run
goes, its driver's /proc status is sampled every 0.1 s, to split the resident memory into
private (RssAnon) and file-backed/shared pages (RssFile, RssShmem: Ray's object store is
shared memory mapped into the driver).

The round's updates (`--method fedavg`): FedAvg keeps no client state, so what the driver holds
is the round's updates. A 1,000-client round, every client in it, one round:

    python benchmarks/driver_memory.py --method fedavg --clients 1000 --per-round 1000 --rounds 1
        --test-fraction 0 --runtime serial --label <which code> --out benchmarks/results/driver_updates.json

The driver sums each update into the aggregation chain's float64 running sum as it arrives and
drops its params (`runtime/summing.py`): its private memory (`driver_sampled_peak_mb.RssAnon`)
then holds one sum (`model.sum_bytes`), not `clients_per_round` updates (`model.shared_state_bytes`
each). Run it with `PYTHONPATH` set to an older checkout to measure that code (`--label`).
glibc's malloc raises its mmap threshold as large blocks are freed, so the freed updates' pages
stay in the driver's heap (RssAnon grows ~0.9 MiB a client though no update is alive); with
`--malloc-mmap-threshold 131072` (a fixed threshold) they go back to the system and RssAnon
shows what is alive. Both are worth reading: the default is what a run gets.

Run: `python benchmarks/driver_memory.py --clients 20,200,1000`
(writes `benchmarks/results/driver_memory.json`). The scaling table (fixed data
and participation, only the number of clients grows):
`python benchmarks/driver_memory.py --clients 10,100,1000,10000 --per-round 100
--train-images 60000 --out benchmarks/results/driver_scaling.json`.
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

REPO = Path(__file__).resolve().parent.parent


def cli() -> list[str]:
    exe = Path(sys.executable).parent / "fl-lightning"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fl_lightning"]


def per_round(n: int, args: argparse.Namespace) -> int:
    """Clients per round: `--per-round` (at most n), else 10% of n and at least 10."""
    return min(args.per_round, n) if args.per_round else max(n // 10, 10)


def train_subset(n: int, args: argparse.Namespace) -> int:
    """Training images: `--train-images` for every N (a fixed dataset), else N × `--per-client`."""
    return args.train_images if args.train_images else min(n * args.per_client, 60000)


def overrides(n: int, args: argparse.Namespace, rounds: int, out: str) -> list[str]:
    return [
        f"method={args.method}", "data=fmnist", "data.partition=iid",
        f"data.client_test_fraction={args.test_fraction}", f"model.hidden={args.hidden}",
        f"fl.num_clients={n}", f"fl.clients_per_round={per_round(n, args)}",
        f"fl.rounds={rounds}", f"fl.batch_size={args.batch_size}", f"eval.every={rounds}", "logger=none",
        f"runtime.threads_per_client={args.threads}", f"data.train_subset={train_subset(n, args)}",
        f"seed={args.seed}", f"output_dir={out}", "experiment=driver_memory", f"run_id=n{n}",
        *([f"runtime={args.runtime}"] if args.runtime != "ray" else []),
    ]  # fmt: skip


def personal_state_bytes(args: argparse.Namespace) -> dict[str, int]:
    """Bytes of one client's personal state, from the model the runs build (client 0's)."""
    from fl_lightning.core.optim import OptimConfig
    from fl_lightning.core.params import state_nbytes
    from fl_lightning.methods import METHODS
    from fl_lightning.models import build_client_model

    model = build_client_model("cnn", 0, 10, 1, 28, channels=[32, 64], hidden=args.hidden)
    objective = METHODS.get(args.method).build_objective(model, OptimConfig())
    # LG-FedAvg keeps its personal parameters; Ditto a whole personal model (all parameters)
    personal = objective.personal_params() if args.method != "ditto" else dict(model.named_parameters())
    shared = objective.shared_params()
    return {
        "params_total": sum(p.numel() for p in model.parameters()),
        "personal_tensors_numel": sum(v.numel() for v in personal.values()),
        "personal_state_bytes": state_nbytes(personal),
        "shared_state_bytes": state_nbytes(shared),
        # the running sum: one float64 tensor per floating entry uploaded (and integer buffers)
        "sum_bytes": sum(v.numel() * 8 for v in shared.values()),
    }


def poll_memory(proc: subprocess.Popen, every_s: float = 0.1) -> dict[str, float]:
    """Wait for `proc`, sampling its memory; the peak of each /proc status field (MiB)."""
    fields = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")
    peak = dict.fromkeys(fields, 0.0)
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in peak:
                    peak[key] = max(peak[key], int(rest.split()[0]) / 1024)
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(every_s)
    return peak


def run_one(n: int, rounds: int, args: argparse.Namespace, per_client_bytes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="driver_memory_") as out:
        cmd = [*cli(), "run", *overrides(n, args, rounds, out), "--quiet"]
        env = {**os.environ, "WANDB_MODE": "disabled"}
        if args.malloc_mmap_threshold is not None:  # glibc: a fixed threshold (see the docstring)
            env["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
        t0 = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out_f, stderr=err_f, text=True)
            peaks = poll_memory(proc)
            wall = time.perf_counter() - t0
            err_f.seek(0)
            stderr = err_f.read()
        run_dir = Path(out) / "driver_memory" / f"n{n}"
        result: dict[str, Any] = {
            "clients": n,
            "clients_per_round": per_round(n, args),
            "rounds": rounds,
            "train_subset": train_subset(n, args),
            "command": "fl-lightning run " + " ".join(overrides(n, args, rounds, "<tmp>")) + " --quiet",
            "exit_code": proc.returncode,
            "process_wall_s": wall,
            # sampled from /proc/<driver pid>/status every 0.1 s (MiB): private (anonymous)
            # memory vs file-backed and shared pages (Ray's object store is mapped shared memory)
            "driver_sampled_peak_mb": peaks,
        }
        if proc.returncode != 0:
            result["stderr_tail"] = stderr[-4000:]
            return result
        summary = json.loads((run_dir / "summary.json").read_text())
        recs = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
        ]
        state_files = sorted((run_dir / "checkpoints" / "clients").glob("c*-r*.pt"))
        with_state = len({f.name.split("-")[0] for f in state_files})
        result.update(
            status=summary.get("status"),
            num_actors=summary.get("num_actors"),
            driver_peak_rss_mb=summary.get("driver_peak_rss_mb"),
            driver_rss_mb_per_round=[r.get("driver_rss_mb") for r in recs],
            driver_peak_rss_mb_per_round=[r.get("driver_peak_rss_mb") for r in recs],
            # the runner's private-heap reading (RssAnon) at the end of each round, where it logs one
            driver_anon_mb_per_round=[r.get("driver_anon_mb") for r in recs],
            driver_anon_max_mb=summary.get("driver_anon_max_mb"),
            run_wall_time_s=summary.get("wall_time_s"),
            round_time_s=[r.get("round_time_s") for r in recs],
            time_fit_s=[r.get("time_fit_s") for r in recs],
            time_eval_s=[r.get("time_eval_s") for r in recs],
            mean_train_round_time_s=(
                sum(r["time_fit_s"] + r["time_server_s"] for r in recs) / len(recs) if recs else None
            ),
            final_client_accuracy=summary.get("final_client_accuracy"),
            clients_with_state=with_state,
            client_state_files_bytes=sum(f.stat().st_size for f in state_files),
            state_if_on_driver_trained_mb=with_state * per_client_bytes / 2**20,
            state_if_on_driver_all_mb=n * per_client_bytes / 2**20,
        )
        return result


def package_dir() -> str:
    import fl_lightning

    return str(Path(fl_lightning.__file__).resolve().parent)


def machine() -> dict[str, Any]:
    """CPU, memory and the versions that matter: Lightning's and Ray's from their metadata and
    the CPU from /proc, where importing them (torchmetrics with Lightning) cost each benchmark's
    parent ~8 CPU-s; torch's from torch (its metadata may lack the build's +cuXXX)."""
    from importlib.metadata import version

    import torch

    info: dict[str, str | None] = {"model name": None, "MemTotal": None}
    for name in ("cpuinfo", "meminfo"):
        try:
            for line in Path("/proc", name).read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() in info and info[key.strip()] is None:
                    info[key.strip()] = value.strip()
        except OSError:
            pass
    cpu = info["model name"] or platform.processor() or platform.machine()
    mem_gb = int(info["MemTotal"].split()[0]) / 2**20 if info["MemTotal"] else None
    return {
        "cpu_model": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": mem_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": version("ray"),
        "lightning": version("lightning"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="20,200,1000", help="comma-separated client counts")
    ap.add_argument("--method", default="lg_fedavg", choices=("lg_fedavg", "ditto", "fedavg"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--rounds-for", action="append", default=[], metavar="N=R",
        help="fewer rounds for client count N (e.g. 1000=2), repeatable",
    )  # fmt: skip
    ap.add_argument(
        "--per-client", type=int, default=16, help="training images per client before the client test split"
    )
    ap.add_argument("--train-images", type=int, default=None,
                    help="the same training set at every N (overrides --per-client), so the table "
                         "varies only the number of clients: --train-images 60000")  # fmt: skip
    ap.add_argument("--per-round", type=int, default=None,
                    help="clients per round for every N (default: max(N // 10, 10)); a scaling table "
                         "at fixed participation: --clients 10,100,1000,10000 --per-round 100")  # fmt: skip
    ap.add_argument("--test-fraction", type=float, default=0.25)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default=None, help="what code ran (recorded): e.g. a commit")
    ap.add_argument("--malloc-mmap-threshold", type=int, default=None, metavar="BYTES",
                    help="the runs' MALLOC_MMAP_THRESHOLD_ (glibc): 131072 returns freed blocks of "
                         "128 KiB and more to the system, so RSS shows what is alive")  # fmt: skip
    ap.add_argument("--runtime", default="ray", choices=("ray", "serial"),
                    help="serial: every client in the driver process (no Ray beside it)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="default: results/driver_memory[_<method>].json")
    args = ap.parse_args()
    if args.out is None:
        name = "driver_memory" + ("" if args.method == "lg_fedavg" else f"_{args.method}")
        args.out = REPO / "benchmarks" / "results" / f"{name}.json"
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    rounds_for = {int(k): int(v) for k, v in (s.split("=", 1) for s in args.rounds_for)}

    sizes = personal_state_bytes(args)
    runs = []
    for n in counts:
        res = run_one(n, rounds_for.get(n, args.rounds), args, sizes["personal_state_bytes"])
        runs.append(res)
        print(
            json.dumps({k: v for k, v in res.items() if not isinstance(v, list) and k != "command"}),
            file=sys.stderr,
            flush=True,
        )
    doc = {
        "benchmark": "driver_memory",
        "workload": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine(),
        "package": package_dir(),  # the fl_lightning the runs imported (PYTHONPATH)
        "model": {"name": "cnn", "channels": [32, 64], "hidden": args.hidden, **sizes},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
