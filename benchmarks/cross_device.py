"""Cross-device FedAvg: many small clients, a few per round, through four systems.

Workload (default): Fashion-MNIST, all 60,000 training images split IID over 1,000 clients
(60 each), 50 clients per round, FedAvg's CNN, 1 local epoch at batch 10 (6 steps a client),
SGD(0.05), 5 rounds, server evaluation on 2,000 test images each round. Four systems, each run
in a fresh process (start-up includes the imports), alternating (A B C D, then D C B A, ...):

  plain       one process, a plain PyTorch loop over the round's clients: shards resident on
              the device, batches by index in the engine's order (`host.batch_indices`), the
              engine's client sampling, seeds and averaging (`weighted_mean`): fl_lightning's
              own numbers with none of its machinery
  sequential  fl_lightning, one client after another in each client actor: `runtime=ray` on
              the CPU (one actor per core); `runtime=gpu` with `--gpus-per-client` on a GPU
  batched     the same with `runtime.batched=K` (default: the whole round): each actor trains
              its share of the round K at a time, weights stacked (torch.func); on a GPU one
              actor holds the whole GPU (`--batched-gpus-per-client`)
  flower      Flower's simulation engine (`flower_app.py`): its FedAvg samples the clients of
              each round itself, and its clients seed their own batches, so its accuracy
              agrees with the others' to within noise, not to the digit

Per run: total (process start to exit), start-up (process start to the first round's start),
rounds (first round's start to the last round's end, evaluations included), each round's
time, clients trained per second of rounds, accuracy per round, peak driver RSS, and on a GPU
the GPU's utilisation and memory sampled each second (`nvidia-smi`). plain, sequential and
batched train the same clients with the same batches: their accuracy must agree per round to
`--same-tol` (float rounding may flip a few borderline test images); Flower's final round to
`--acc-tol`. On a GPU the plain loop synchronises CUDA before each time stamp; the engine's
rounds end on host copies of the results, which synchronise.

Run: `python benchmarks/cross_device.py --out benchmarks/results/cross_device.json` (`make
bench`): the CPU, and the GPU too where CUDA is present (`--device cpu|gpu|both` to choose).
Flower: `make bench-deps`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from driver_memory import poll_memory
from vs_flower import child_env, child_fl_lightning, machine_facts, spread

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("plain", "sequential", "batched", "flower")


def workload(args: argparse.Namespace, out: str) -> list[str]:
    """The workload as fl_lightning overrides (add `runtime=...`)."""
    return [
        "method=fedavg", "data=fmnist", "data.partition=iid", f"fl.num_clients={args.clients}",
        f"data.train_subset={args.clients * args.per_client}", f"data.test_subset={args.test}",
        f"fl.clients_per_round={args.per_round}", f"fl.rounds={args.rounds}",
        f"fl.local_epochs={args.epochs}", f"fl.batch_size={args.batch_size}", f"optim.lr={args.lr}",
        "optim.momentum=0", "eval.clients=false", "logger=none", f"output_dir={out}", f"seed={args.seed}",
        f"runtime.threads_per_client={args.threads}",
    ]  # fmt: skip


def runtime_of(system: str, device: str, args: argparse.Namespace) -> list[str]:
    if system == "plain":
        return ["runtime=serial"]
    if device == "cpu":
        rt = ["runtime=ray"]
    else:
        share = args.batched_gpus_per_client if system == "batched" else args.gpus_per_client
        rt = ["runtime=gpu", "runtime.placement=pool", f"runtime.gpus_per_client={share}"]
    if system == "batched":
        rt.append(f"runtime.batched={args.batched or args.per_round}")
    return rt


# --- the measured processes ------------------------------------------------------------------
def child_plain(spec: dict[str, Any]) -> dict[str, Any]:
    """FedAvg as a plain loop in one process, on fl_lightning's data, model and arithmetic."""
    from fl_lightning.lean_imports import install

    install()  # as the engine's driver and workers do: its start-up is compared with theirs
    import torch
    import torch.nn.functional as F

    from fl_lightning.config import compose
    from fl_lightning.core.params import weighted_mean
    from fl_lightning.core.strategy import client_seed, round_rng
    from fl_lightning.models import build_model
    from fl_lightning.runtime.build import prepare
    from fl_lightning.runtime.host import batch_indices

    gpu = spec["device"] == "gpu"
    device = torch.device("cuda" if gpu else "cpu")
    torch.set_num_threads(int(spec["plain_threads"]))
    p = prepare(compose(spec["overrides"]))
    ds, split, cfg = p.dataset, p.split, p.cfg
    shards = [tuple(t.to(device) for t in ds.tensors(ds.train_x[i], ds.train_y[i])) for i in split.train]
    test_x, test_y = (t.to(device) for t in ds.tensors(ds.test_x, ds.test_y))
    s = p.spec
    model = build_model(s.model, s.num_classes, s.in_channels, s.image_size, **s.model_kwargs).to(device)
    assert p.init_params is not None
    glob = {k: v.to(device) for k, v in p.init_params.items()}  # loaded per client device to device
    lr, seed = float(cfg.optim.lr), int(cfg.seed)
    stamps: dict[str, list[float]] = {"round_start": [], "round_end": [], "fit_s": [], "accuracy": []}

    def now() -> float:
        if gpu:
            torch.cuda.synchronize()  # the GPU's queued work belongs to the stamp before it
        return time.time()

    for rnd in range(1, int(cfg.fl.rounds) + 1):
        stamps["round_start"].append(now())
        states, sizes = [], []
        clients = p.strategy.sample_clients(rnd, round_rng(seed, rnd))
        seeds = [client_seed(seed, rnd, c) for c in clients]
        # every batch of the round drawn first and copied to the device at once: the steps
        # then read no host memory (a pageable copy per step would wait for the GPU)
        steps = [[ix for _, ix in batch_indices(len(shards[c][1]), s.batch_size, cs, s.local_epochs)]
                 for c, cs in zip(clients, seeds, strict=True)]  # fmt: skip
        flat = torch.cat([ix for client in steps for ix in client]).to(device)
        offset = 0
        for c, cs, batches in zip(clients, seeds, steps, strict=True):
            torch.manual_seed(cs)
            model.load_state_dict(glob)
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            x, y = shards[c]
            model.train()
            for ix in batches:
                idx = flat[offset : offset + len(ix)]
                offset += len(ix)
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            sizes.append(len(y))
        stamps["fit_s"].append(now() - stamps["round_start"][-1])
        glob = {k: v.to(device) for k, v in weighted_mean(states, sizes).items()}  # in float64, as the engine
        model.load_state_dict(glob)
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(test_x[i : i + 1000]).argmax(1) == test_y[i : i + 1000]).sum())
                          for i in range(0, len(test_y), 1000))  # fmt: skip
        stamps["accuracy"].append(correct / len(test_y))
        stamps["round_end"].append(now())
    return {"stamps": stamps}


def child(system: str, spec_file: Path, result_file: Path) -> None:
    import resource

    spec = json.loads(spec_file.read_text())
    if system == "flower":
        import flower_app  # benchmarks/flower_app.py

        res = flower_app.run(spec)
    elif system == "plain":
        res = child_plain(spec)
    else:
        res = child_fl_lightning(spec)
    res["ru_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result_file.write_text(json.dumps(res))
    if system in ("sequential", "batched"):
        from fl_lightning.cli.main import exit_now

        exit_now(0)  # as `fl-lightning run` ends


# --- the parent ---------------------------------------------------------------------------------
class GpuSampler:
    """`nvidia-smi` once a second while a run lasts: GPU utilisation (%) and memory used (MiB)."""

    def __init__(self) -> None:
        self.samples: list[list[float]] = []
        self._proc: subprocess.Popen[str] | None = None
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        query = [exe, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-l", "1"]
        self._proc = subprocess.Popen(query, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self.samples.append([float(v) for v in line.split(",")[:2]])
            except ValueError:
                continue

    def stop(self) -> dict[str, Any] | None:
        if self._proc is None:
            return None
        self._proc.terminate()
        self._proc.wait()
        util = [s[0] for s in self.samples]
        return {
            "util_pct": util,
            "mem_mib": [s[1] for s in self.samples],
            "util_mean": statistics.fmean(util) if util else None,
        }


def run_one(system: str, device: str, rep: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{system}_{device}_{rep}"
    out.mkdir(parents=True)
    spec = {
        "overrides": [*workload(args, str(out)), *runtime_of(system, device, args), f"run_id={system}_{rep}"],
        "device": device, "gpus_per_client": args.gpus_per_client, "threads": args.threads,
        "plain_threads": args.plain_threads, "seed": args.seed, "clients": args.clients,
        "per_round": args.per_round, "batches": "dataloader" if device == "cpu" else "index",
    }  # fmt: skip
    (out / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", system]
    cmd += ["--spec", str(out / "spec.json"), "--result", str(out / "result.json")]
    env = child_env("flower" if system == "flower" else "fl_lightning", device, tmp)
    gpu = GpuSampler() if device == "gpu" else None
    with open(out / "log.txt", "w") as log:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)
        peaks = poll_memory(proc)
        t_exit = time.time()
    run: dict[str, Any] = {"system": system, "device": device, "rep": rep, "exit_code": proc.returncode}
    run["overrides"] = spec["overrides"]
    run["total_s"] = t_exit - t0
    if gpu is not None:
        run["gpu"] = gpu.stop()
    if proc.returncode != 0 or not (out / "result.json").exists():
        run["log_tail"] = (out / "log.txt").read_text()[-4000:]
        print(
            f"cross_device: {system} ({device}, rep {rep}) failed, exit {proc.returncode}:", file=sys.stderr
        )
        print(run["log_tail"], file=sys.stderr)
        return run
    res = json.loads((out / "result.json").read_text())
    st = res.pop("stamps")
    starts, ends = st["round_start"], st["round_end"]
    rounds_s = ends[-1] - starts[0]
    run.update(
        startup_s=starts[0] - t0,
        rounds_s=rounds_s,
        teardown_s=t_exit - ends[-1],
        round_s=[e - s for s, e in zip(starts, ends, strict=True)],
        clients_per_s=args.per_round * len(starts) / rounds_s,
        accuracy=st["accuracy"],
        peak_driver_rss_mb=peaks["VmHWM"] or res.get("ru_maxrss_mb"),
        **({"fit_s": st["fit_s"]} if "fit_s" in st else {}),
        **{k: v for k, v in res.items() if k not in ("t_end",)},
    )
    return run


def summarise(
    runs: list[dict[str, Any]], systems: tuple[str, ...], args: argparse.Namespace
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in systems:
        ok = [r for r in runs if r["system"] == s and "rounds_s" in r]
        if not ok:
            out[s] = {"runs_ok": 0}
            continue
        out[s] = {
            "runs_ok": len(ok),
            **{k: spread([r[k] for r in ok]) for k in ("total_s", "startup_s", "rounds_s", "clients_per_s")},
            "peak_driver_rss_mb": spread([r["peak_driver_rss_mb"] for r in ok]),
            "round_s_median": [statistics.median(x) for x in zip(*(r["round_s"] for r in ok), strict=True)],
            "accuracy": ok[0]["accuracy"],
            "accuracy_same_every_run": all(r["accuracy"] == ok[0]["accuracy"] for r in ok),
        }
        gpu = [r["gpu"]["util_mean"] for r in ok if r.get("gpu") and r["gpu"]["util_mean"] is not None]
        if gpu:
            out[s]["gpu_util_mean_pct"] = spread(gpu)
    ref = out.get("plain", {})
    if ref.get("runs_ok"):
        agree: dict[str, Any] = {}
        for s in systems:
            if s == "plain" or not out[s].get("runs_ok"):
                continue
            diffs = [abs(a - b) for a, b in zip(out[s]["accuracy"], ref["accuracy"], strict=True)]
            tol = args.acc_tol if s == "flower" else args.same_tol
            checked = diffs[-1:] if s == "flower" else diffs  # Flower: its own sampling and seeds
            agree[s] = {"abs_diff_per_round": diffs, "tolerance": tol, "agrees": max(checked) <= tol}
            out[s]["clients_per_s_vs_plain"] = (
                out[s]["clients_per_s"]["median"] / ref["clients_per_s"]["median"]
            )
        out["accuracy_vs_plain"] = agree
    seq, bat = out.get("sequential", {}), out.get("batched", {})
    if seq.get("runs_ok") and bat.get("runs_ok"):
        out["batched_vs_sequential_clients_per_s"] = (
            bat["clients_per_s"]["median"] / seq["clients_per_s"]["median"]
        )
    return out


def fmt(d: dict[str, float], reps: int, digits: int = 1) -> str:
    f = f"{{:.{digits}f}}"
    return f.format(d["median"]) + (f" ({f.format(d['min'])}-{f.format(d['max'])})" if reps > 1 else "")


def table(device: str, summary: dict[str, Any], systems: tuple[str, ...], args: argparse.Namespace) -> str:
    cols = ("start-up s", "rounds s", "total s", "clients/s", "final acc")
    rows = [("", *cols)]
    for s in systems:
        m = summary[s]
        if not m.get("runs_ok"):
            rows.append((s, "failed", "", "", "", ""))
            continue
        rows.append((s, fmt(m["startup_s"], args.reps), fmt(m["rounds_s"], args.reps),
                     fmt(m["total_s"], args.reps), fmt(m["clients_per_s"], args.reps),
                     f"{m['accuracy'][-1]:.4f}"))  # fmt: skip
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols) + 1)]
    lines = [
        f"{device.upper()}: {args.clients} clients x {args.per_client}, {args.per_round} per round, batch "
        f"{args.batch_size}, {args.rounds} rounds; medians (min-max) of {args.reps} runs each"
    ]
    for row in rows:
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(cells)))
    for s in systems:
        if summary[s].get("runs_ok"):
            accs = " ".join(f"{a:.4f}" for a in summary[s]["accuracy"])
            lines.append(f"{s}: accuracy per round {accs}")
    for s, a in summary.get("accuracy_vs_plain", {}).items():
        lines.append(f"{s} agrees with plain within {a['tolerance']}: {a['agrees']}")
    if "batched_vs_sequential_clients_per_s" in summary:
        lines.append(
            f"batched / sequential clients per second: {summary['batched_vs_sequential_clients_per_s']:.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--per-client", type=int, default=60)
    ap.add_argument("--per-round", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per client actor")
    ap.add_argument("--plain-threads", type=int, default=1, help="torch threads of the plain loop")
    ap.add_argument(
        "--batched", type=int, default=0, help="runtime.batched (0: the whole round, --per-round)"
    )
    ap.add_argument("--reps", type=int, default=2, help="runs of each system (alternating)")
    ap.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ", ".join(SYSTEMS)
    )
    ap.add_argument("--device", choices=("auto", "cpu", "gpu", "both"), default="auto",
                    help="auto: the CPU, and the GPU too when CUDA is present")  # fmt: skip
    ap.add_argument(
        "--gpus-per-client", type=float, default=0.1, help="GPU share of a sequential/Flower actor"
    )
    ap.add_argument("--batched-gpus-per-client", type=float, default=1.0, help="GPU share of a batched actor")
    ap.add_argument(
        "--same-tol", type=float, default=0.005, help="per-round accuracy difference, same clients"
    )
    ap.add_argument("--acc-tol", type=float, default=0.03, help="final-round accuracy difference, Flower")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cross_device.json")
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.spec, args.result)
        return
    systems = tuple(s for s in args.systems.split(",") if s)
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        ap.error(f"unknown system {unknown[0]!r}; valid: {', '.join(SYSTEMS)}")
    if "flower" in systems and importlib.util.find_spec("flwr") is None:
        print("cross_device: flwr is not installed (make bench-deps); Flower is skipped", file=sys.stderr)
        systems = tuple(s for s in systems if s != "flower")
    facts = machine_facts()
    auto = ["cpu", "gpu"] if facts["gpus"] else ["cpu"]
    devices = {"auto": auto, "both": ["cpu", "gpu"]}.get(args.device, [args.device])
    if "gpu" in devices and not facts["gpus"]:
        ap.error("--device gpu: no CUDA device here")
    doc: dict[str, Any] = {
        "benchmark": "cross_device",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "workload": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if v is not None
        },
        "machine": facts,
        "order": "alternating: rep 0 runs the systems in order, rep 1 reversed, and so on",
        "runs": [],
        "summary": {},
    }
    tables = []
    with tempfile.TemporaryDirectory(prefix="cross_device_") as tmp:
        for device in devices:
            for rep in range(args.reps):
                for system in systems if rep % 2 == 0 else systems[::-1]:
                    print(f"cross_device: {system} on {device}, run {rep + 1}/{args.reps}", file=sys.stderr)
                    run = run_one(system, device, rep, args, Path(tmp))
                    doc["runs"].append(run)
                    keys = ("total_s", "startup_s", "rounds_s", "clients_per_s", "accuracy")
                    print("  " + json.dumps({k: run.get(k) for k in keys}), file=sys.stderr, flush=True)
            summary = summarise([r for r in doc["runs"] if r["device"] == device], systems, args)
            doc["summary"][device] = summary
            tables.append(table(device, summary, systems, args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("\n\n".join(tables))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
