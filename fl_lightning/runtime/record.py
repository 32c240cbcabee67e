"""`RoundRecord`: one round's line of `metrics.jsonl`, typed, and the metrics that fill it.

The loop fills the training part (clients, their metrics, bytes, times), then `server/*`
(from the strategy), the global evaluation and the clients' evaluation, and
`line()` gives the JSON object written, in this order:

    round, train_loss, clients, clients_failed, clients_retried, [client_failures],
    client/<k> (training, sample-weighted), server/<k>, virtual_time, system/<k> (the scheduler's;
    [system/staleness_hist]), privacy/<k> (ε after the round, δ, σ, C),
    <global evaluation: accuracy, loss, ...>,
    client_<m> (evaluation on the clients' own test splits, over those clients that have test
    images; client_majority_accuracy: its reference), clients_evaluated (those clients),
    bytes_down, bytes_up, time_fit_s, time_eval_wait_s, time_server_s, time_eval_s,
    round_time_s, driver_*_mb, wall_time_s

A field that is None (not measured yet: a round that diverged before its end) is left out.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import ClientFailure
from ..core.messages import ClientEval, ClientUpdate, RoundPlan, tensor_nbytes
from ..core.metrics import dual_metrics

#: record fields written as they are, in this order (the dicts go in between, see `line`)
_HEAD = ("train_loss", "clients", "clients_failed", "clients_retried")
_TAIL = (
    "bytes_down", "bytes_up", "time_fit_s", "time_eval_wait_s", "time_server_s", "time_eval_s",
    "round_time_s",
)  # fmt: skip


def down_nbytes(plan: RoundPlan) -> int:
    """Bytes `plan` sends over a real network: the broadcast to each of its clients, plus every
    tensor a payload carries for its client alone (other clients' models: FedFomo, FedAMP)."""
    return plan.broadcast.nbytes() * len(plan.payloads) + sum(tensor_nbytes(p) for p in plan.payloads)


@dataclasses.dataclass
class RoundRecord:
    """One round, as `metrics.jsonl` holds it (see the module docstring for the keys)."""

    round: int
    train_loss: float = 0.0
    clients: int = 0  # that returned an update
    clients_failed: int = 0  # sampled but dropped after their retry
    clients_retried: int = 0
    client_failures: list[str] = dataclasses.field(default_factory=list)
    client: dict[str, float] = dataclasses.field(default_factory=dict)  # `client/<k>`: training
    server: dict[str, float] = dataclasses.field(default_factory=dict)  # `server/<k>`
    #: the virtual clock when the round's server step ran (`runtime/system.py`; 0 on no system model)
    virtual_time: float = 0.0
    system: dict[str, float] = dataclasses.field(default_factory=dict)  # `system/<k>`: the scheduler's
    #: `system/staleness_hist`: how many of the step's updates had staleness 0, 1, 2, ...
    #: (asynchronous modes; left out when empty)
    staleness_hist: list[int] = dataclasses.field(default_factory=list)
    privacy: dict[str, float] = dataclasses.field(default_factory=dict)  # `privacy/<k>`: ε after the round
    evaluation: dict[str, float] = dataclasses.field(default_factory=dict)  # the global model's
    client_evaluation: dict[str, float] = dataclasses.field(default_factory=dict)  # client_<m>, ...
    bytes_down: int | None = None
    bytes_up: int | None = None
    time_fit_s: float | None = None
    time_eval_wait_s: float | None = None  # the previous round's overlapped evaluation, if not done
    time_server_s: float | None = None
    time_eval_s: float | None = None  # an overlapped global evaluation adds its own time when it ends
    round_time_s: float | None = None
    memory: dict[str, float] = dataclasses.field(default_factory=dict)  # driver_*_mb
    wall_time_s: float | None = None
    diverged: bool = False
    #: perf_counter when the round's own work ended (not written)
    done: float = 0.0

    @classmethod
    def of_fit(
        cls,
        rnd: int,
        plan: RoundPlan,
        updates: Sequence[ClientUpdate],
        failures: list[str],
        retries: list[str],
    ) -> RoundRecord:
        """The training part of round `rnd`'s record; ClientFailure when no client returned."""
        if not updates and plan.payloads:  # none drawn (Poisson cohorts) is an empty round, no failure
            causes = "; ".join(f.split(": ", 1)[1] for f in failures) or "no update returned"
            raise ClientFailure(f"round {rnd}: every client failed ({causes})")
        client = weighted_client_metrics(updates)
        return cls(
            round=rnd,
            train_loss=client.get("train_loss", 0.0),
            clients=len(updates),
            clients_failed=len(plan.payloads) - len(updates),
            clients_retried=len(retries),
            client_failures=failures + [f"retried {r}" for r in retries],
            client=client,
        )

    def finish(
        self, plan: RoundPlan, updates: Sequence[ClientUpdate], t0: float, tf: float, t1: float, t2: float
    ) -> None:
        """The round's traffic (what a callback added, e.g. batch-norm statistics, plus the
        broadcast to every sampled client and every update), its times (from `perf_counter`:
        start, fit done, updates checked, server done; evaluation ends now) and memory."""
        t3 = time.perf_counter()
        self.bytes_down = (self.bytes_down or 0) + down_nbytes(plan)
        self.bytes_up = (self.bytes_up or 0) + sum(u.upload_nbytes() for u in updates)
        self.time_fit_s, self.time_eval_wait_s, self.time_server_s = tf - t0, t1 - tf, t2 - t1
        self.time_eval_s, self.round_time_s = t3 - t2, t3 - t0
        self.memory = driver_memory_mb()
        self.done = time.perf_counter()

    def line(self) -> dict[str, Any]:
        """The JSON object of this round's line, as it is (non-finite numbers included)."""
        out: dict[str, Any] = {"round": self.round}
        out.update((k, getattr(self, k)) for k in _HEAD)
        if self.client_failures:
            out["client_failures"] = list(self.client_failures)
        out.update({f"client/{k}": v for k, v in self.client.items()})
        out.update({f"server/{k}": v for k, v in self.server.items()})
        out["virtual_time"] = self.virtual_time
        out.update({f"system/{k}": v for k, v in self.system.items()})
        if self.staleness_hist:
            out["system/staleness_hist"] = list(self.staleness_hist)
        out.update({f"privacy/{k}": v for k, v in self.privacy.items()})
        out.update(self.evaluation)
        out.update(self.client_evaluation)
        out.update(dual_metrics(out))  # FLiP's dual: global and personal accuracy's harmonic mean
        out.update((k, getattr(self, k)) for k in _TAIL if getattr(self, k) is not None)
        out.update(self.memory)
        if self.wall_time_s is not None:
            out["wall_time_s"] = self.wall_time_s
        if self.diverged:
            out["diverged"] = True
        return out

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> RoundRecord:
        """The record of a line `line()` wrote (a checkpoint's unwritten line, read back)."""
        dicts = {"client", "server", "system", "privacy", "memory", "evaluation"}
        known = {f.name for f in dataclasses.fields(cls)} - dicts
        rec = cls(round=int(line["round"]))
        for k, v in line.items():
            if k in known and k != "round":
                setattr(rec, k, v)
            elif k == "system/staleness_hist":
                rec.staleness_hist = [int(c) for c in v]
            elif k.startswith("client/"):
                rec.client[k.removeprefix("client/")] = v
            elif k.startswith("server/"):
                rec.server[k.removeprefix("server/")] = v
            elif k.startswith("system/"):
                rec.system[k.removeprefix("system/")] = v
            elif k.startswith("privacy/"):
                rec.privacy[k.removeprefix("privacy/")] = v
            elif k.startswith("driver_"):
                rec.memory[k] = v
            elif k.startswith("client_") or k == "clients_evaluated":
                rec.client_evaluation[k] = v
            elif k != "round":
                rec.evaluation[k] = v
        return rec


def strict_json(line: dict[str, Any]) -> dict[str, Any]:
    """Strict JSON: non-finite numbers become null, named under `nonfinite`."""
    bad = [k for k, v in line.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return line
    return {**{k: (None if k in bad else v) for k, v in line.items()}, "nonfinite": bad}


def client_metrics(evals: Sequence[ClientEval], primary: str = "accuracy") -> dict[str, float]:
    """Personalised metrics over clients' own test splits: `client_<m>` (sample-weighted
    mean over clients) for every metric m, and for the primary one also the unweighted
    mean, std and the mean of the worst 10% of clients. `evals`: the clients that have test
    images (`ClientEval.evaluate` leaves out those with an empty split)."""
    n = np.array([e.num_examples for e in evals], dtype=float)
    out: dict[str, float] = {}
    for key in evals[0].metrics:
        vals = np.array([e.metrics[key] for e in evals if key in e.metrics])
        if len(vals) == len(evals):
            out[f"client_{key}"] = float((vals * n).sum() / n.sum())
    acc = np.array([e.metrics[primary] for e in evals])
    worst = np.sort(acc)[: max(1, int(np.ceil(0.1 * len(acc))))]
    out.update({
        f"client_{primary}_mean": float(acc.mean()),
        f"client_{primary}_std": float(acc.std()),
        f"client_{primary}_worst10": float(worst.mean()),
    })  # fmt: skip
    return out


def majority_accuracies(
    train_y: np.ndarray, train: Sequence[np.ndarray], test: Sequence[np.ndarray]
) -> list[float]:
    """Each client's majority-class accuracy: always predicting the class most frequent in its
    training split (the smallest label on a tie), scored on its own test split (0.0 when it
    has none): the reference a personalised accuracy beats or not (single-label data)."""
    out = []
    for tr, te in zip(train, test, strict=True):
        labels = np.asarray(train_y)
        majority = int(np.bincount(labels[tr]).argmax()) if len(tr) else -1
        out.append(float((labels[te] == majority).mean()) if len(te) else 0.0)
    return out


def weighted_client_metrics(updates: Sequence[ClientUpdate]) -> dict[str, float]:
    """Every metric the clients report, sample-weighted over the clients that report it."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for u in updates:
        for k, v in u.metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * u.num_examples
            weights[k] = weights.get(k, 0.0) + u.num_examples
    return {k: sums[k] / max(weights[k], 1.0) for k in sums}


def driver_memory_mb() -> dict[str, float]:
    """The driver's memory in MiB (Linux; empty elsewhere): `driver_rss_mb` (resident now),
    `driver_anon_mb` (its private heap now: what it holds itself, without the shared pages of
    Ray's object store it has read through) and `driver_peak_rss_mb` (resident at its peak)."""
    keys = {"VmRSS": "driver_rss_mb", "RssAnon": "driver_anon_mb", "VmHWM": "driver_peak_rss_mb"}
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in keys:
                    out[keys[name]] = int(rest.split()[0]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return {}
    return out
