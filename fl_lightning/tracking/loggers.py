"""Metric loggers. Strategies and objectives never import W&B; only the driver does.

`RunFiles` writes the run directory (always on); `WandbLogger` mirrors the same numbers
to Weights & Biases: online with an API key, offline files otherwise, off with
`logger=none`. One W&B run per (variant, seed), named `<variant>-s<seed>` (the variant: the
method, a reproduction's row or a sweep's method and swept keys, `config.variant_of`),
grouped by experiment, with the variant as its job type and tagged by method, dataset,
partition and seed, so the W&B UI can group by variant and average seeds without extra work.
The config is sent flat (`optim.lr`, `data.partition`) for W&B's filters; the numbers go
under sections (`WANDB_KEYS`: train/, eval/, server/, system/), each once, with `round` the
x-axis of every chart; a run with a virtual clock (`system=`) also sends its evaluation under
time/, charted over `virtual_time`, and each asynchronous step's staleness histogram.
`sync_offline` uploads the offline runs of a runs folder.
"""

from __future__ import annotations

import json
import netrc
import os
import secrets
from pathlib import Path
from typing import Any, Literal, Protocol

from ..core.errors import ConfigError
from ..core.files import open_new
from ..core.safe_json import loads, read_text


class MetricsLogger(Protocol):
    def log_config(self, config: dict[str, Any]) -> None: ...

    def log_round(self, rnd: int, metrics: dict[str, Any]) -> None: ...

    def log_summary(self, summary: dict[str, Any]) -> None: ...

    def close(self, ok: bool = True) -> None: ...


def read_jsonl(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl: the lines that are JSON objects with an integer `round`.
    Anything else is skipped: a torn last line (a run killed mid-write), garbage or nesting
    deeper than we write (a shared run directory). `limit`: read it only if it is a plain file
    (not a link) of at most that many bytes (`UnsafeInput` otherwise)."""
    out: list[dict[str, Any]] = []
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return out
    text = path.read_text(errors="replace") if limit is None else read_text(path, limit)
    for line in text.splitlines():
        try:
            rec = loads(line)
        except ValueError:
            continue
        rnd = rec.get("round") if isinstance(rec, dict) else None
        if isinstance(rnd, int) and not isinstance(rnd, bool):
            out.append(rec)
    return out


class RunFiles:
    """`metrics.jsonl` (one object per round, fsynced) and `summary.json` in the run dir."""

    def __init__(self, run_dir: Path, keep_until_round: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if keep_until_round is not None:  # resume: drop rounds after the checkpoint
            kept = [r for r in read_jsonl(self.metrics_path) if r.get("round", 0) <= keep_until_round]
            tmp = self.metrics_path.with_suffix(".tmp")
            with open_new(tmp) as f:  # not through a link planted under this name
                f.write("".join(json.dumps(r) + "\n" for r in kept).encode())
            tmp.replace(self.metrics_path)

    def log_config(self, config: dict[str, Any]) -> None:
        pass  # config.yaml is written by the runner before anything starts

    def log_round(self, rnd: int, metrics: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({"round": rnd, **metrics}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def log_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.run_dir / ".summary.json.tmp"
        with open_new(tmp) as f:
            f.write((json.dumps(summary, indent=2) + "\n").encode())
        tmp.replace(self.run_dir / "summary.json")

    def close(self, ok: bool = True) -> None:
        pass


def flat_config(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"optim": {"lr": 0.1}}` as `{"optim.lr": 0.1}`: one W&B config key per leaf, which its
    run filters and table columns can name (lists stay values; an empty group stays `{}`)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_config(v, key + "."))
        else:
            out[key] = v
    return out


#: The W&B name of every key a run logs: a metrics.jsonl line's (which keeps its own names:
#: compare and reproduce read them) and summary.json's. Patterns in order, the first match
#: wins; `*` stands for the rest of the key; None: not sent (the same number is sent under
#: another name, or W&B's config holds it). A key no other pattern names is one of the
#: global evaluation's metrics (each task names its own: accuracy, loss, c_ap, many_accuracy).
WANDB_KEYS: tuple[tuple[str, str | None], ...] = (
    ("round", "round"),
    # the virtual clock (docs/async.md): the x-axis of `time/*`; the scheduler's numbers
    # (staleness, dropped updates, clients in flight)
    ("virtual_time", "system/virtual_time"),
    ("system/*", "system/*"),
    # local training on the sampled clients (client/<k>: sample-weighted)
    ("client/train_loss", None),  # = train_loss
    ("train_loss", "train/loss"),
    ("client/*", "train/*"),
    ("clients", "train/clients"),
    ("clients_failed", "train/clients_failed"),
    ("clients_retried", "train/clients_retried"),
    ("client_failures", "train/client_failures"),
    ("diverged", "train/diverged"),
    ("rounds_completed", "train/rounds_completed"),
    ("clients_failed_total", "train/clients_failed_total"),
    # the server's own step (the method's metrics)
    ("server/*", "server/*"),
    # differential privacy: ε after each round, δ, σ, C (docs/privacy.md), beside accuracy
    ("privacy/*", "privacy/*"),
    # evaluation: the clients' own test splits (personalised), then the global model's
    ("clients_evaluated", "eval/clients_evaluated"),
    ("client_*", "eval/client_*"),
    # cost and machine
    ("bytes_*", "system/bytes_*"),
    ("time_*", "system/time_*"),
    ("round_time_s", "system/round_time_s"),
    ("wall_time_s", "system/wall_time_s"),
    ("driver_*", "system/driver_*"),
    ("num_actors", "system/num_actors"),
    ("actors_*", "system/actors_*"),
    ("startup_s", "system/startup_s"),
    ("threads_per_client", "system/threads_per_client"),
    ("machine", "system/machine"),
    # summary.json's words about the run: top level, W&B's runs table shows them as columns
    ("status", "status"),
    ("error", "error"),
    ("warning", "warning"),
    # in W&B's config already (summary.json repeats them for readers of the file alone)
    *((k, None) for k in ("method", "dataset", "model", "seed", "experiment", "run_id", "executor",
                          "num_clients", "rounds", "variant", "row", "nonfinite")),
    ("*", "eval/*"),
)  # fmt: skip
#: the sections of `WANDB_KEYS`: each charted over `round`
WANDB_SECTIONS = ("train", "eval", "server", "privacy", "system", "partition")
#: the global evaluation's metrics again, charted over `system/virtual_time`, in runs whose clock runs
#: (`system=`): methods compared at equal virtual time, beside `eval/*` over rounds (a round is
#: a server step, whose time differs between synchronous and asynchronous modes)
TIME_SECTION = "time"


def wandb_key(key: str) -> str | None:
    """`key`'s name in W&B (`WANDB_KEYS`), None when it is not sent."""
    for pattern, name in WANDB_KEYS:
        if pattern.endswith("*") and key.startswith(pattern[:-1]):
            return None if name is None else name[:-1] + key[len(pattern) - 1 :]
        if key == pattern:
            return name
    raise AssertionError("WANDB_KEYS ends with '*'")


WandbMode = Literal["online", "offline", "disabled", "shared"]
_WANDB_MODES: dict[str, WandbMode] = {
    "online": "online", "offline": "offline", "disabled": "disabled", "shared": "shared",
    "run": "online", "dryrun": "offline",  # W&B's older names
}  # fmt: skip


def wandb_mode(mode: str) -> WandbMode:
    """auto: online when an API key is configured, offline otherwise; `$WANDB_MODE` wins."""
    if mode == "auto":
        mode = os.environ.get("WANDB_MODE") or "auto"
    if mode != "auto":
        if mode not in _WANDB_MODES:
            raise ConfigError(f"W&B mode {mode!r}: expected one of {', '.join(_WANDB_MODES)}")
        return _WANDB_MODES[mode]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        rc = netrc.netrc(os.environ.get("NETRC") or None)
        if any(host.endswith("wandb.ai") for host in rc.hosts):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


#: where W&B keeps its caches (unless set): beside the experiment's runs, out of $HOME
WANDB_DIRS = (("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"), ("WANDB_CONFIG_DIR", "config"))


def wandb_dirs(run_dir: Path) -> dict[str, str]:
    """The W&B folders a run in `run_dir` uses (`<experiment>/.wandb/<sub>`; the variables set
    in the environment are the user's, and left alone). The runs folder is shared: a link
    planted at `.wandb` or below would send W&B's writes elsewhere, so one is refused (one line)."""
    base = Path(run_dir).parent / ".wandb"
    paths = {var: base / sub for var, sub in WANDB_DIRS if not os.environ.get(var)}
    for p in [base, *paths.values()] if paths else []:
        if p.is_symlink():
            raise ConfigError(
                f"{p} is a symbolic link: W&B's folders in a runs folder must be its own (a link would "
                "make W&B write outside it); remove the link, or set WANDB_CACHE_DIR, WANDB_DATA_DIR "
                "and WANDB_CONFIG_DIR"
            )
    return {var: str(p) for var, p in paths.items()}


def check_wandb_dirs(logger: Any, run_dir: Path) -> None:
    """`wandb_dirs`' check, before any work, for a run that logs to W&B (`logger`: `cfg.logger`)."""
    if logger.backend == "wandb" and logger.mode != "disabled":
        wandb_dirs(run_dir)


class WandbLogger:
    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        project: str,
        entity: str | None,
        group: str,
        tags: list[str],
        mode: str,
        config: dict[str, Any],
        resume_id: str | None = None,
        name: str | None = None,
        job_type: str | None = None,
    ) -> None:
        """`name` (default: `run_id`) is the name shown in W&B; `job_type` (the method) lets its
        UI group and filter runs by method within a group (the experiment)."""
        import wandb

        run_dir = Path(run_dir)
        # Keep W&B's caches out of $HOME (and out of other users' way) unless set.
        os.environ.update(wandb_dirs(run_dir))
        os.environ.setdefault("WANDB_SILENT", "true")
        self.mode = wandb_mode(mode)
        self._wandb = wandb
        self.run = wandb.init(
            project=project,
            entity=entity,
            group=group,
            job_type=job_type,
            name=name or run_id,
            id=resume_id or secrets.token_hex(4),
            resume="allow",
            tags=tags,
            config=flat_config(config),
            dir=str(run_dir),
            mode=self.mode,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True),
        )
        self.id = self.run.id
        # charts over rounds, not W&B's own step counter (the same numbers, but named and
        # kept when a resumed run logs a round again)
        self.run.define_metric("round")
        for section in WANDB_SECTIONS:
            self.run.define_metric(f"{section}/*", step_metric="round")
        self.run.define_metric(f"{TIME_SECTION}/*", step_metric="system/virtual_time")
        self._failures: list[list[Any]] = []  # [round, cause] of every client failure and retry

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(flat_config(config), allow_val_change=True)

    def log_round(self, rnd: int, metrics: dict[str, Any]) -> None:
        """The numbers (also `clients_failed` and `clients_retried`), and when clients failed or
        were retried, their causes: the table `client_failures` (round, what happened), all so far."""
        payload: dict[str, Any] = {
            name: v for k, v in metrics.items() if isinstance(v, (int, float)) and (name := wandb_key(k))
        }
        payload["round"] = int(rnd)
        if metrics.get("virtual_time"):  # a run with a clock: its evaluation over virtual time too
            payload.update({
                f"{TIME_SECTION}/{k}": v for k, v in metrics.items()
                if isinstance(v, (int, float)) and wandb_key(k) == f"eval/{k}" and not k.startswith("client")
            })  # fmt: skip
        hist = metrics.get("system/staleness_hist")
        if hist:  # how stale the step's updates were: one histogram a server step
            import numpy as np  # here: `compare` and `reproduce` read this module's files, no arrays

            counts = np.asarray(hist, dtype=np.int64)
            edges = np.arange(len(counts) + 1, dtype=np.float64)
            payload["system/staleness_hist"] = self._wandb.Histogram(np_histogram=(counts, edges))
        causes = metrics.get("client_failures") or []
        if causes:
            self._failures += [[int(rnd), str(c)] for c in causes]
            payload["train/client_failures"] = self._wandb.Table(
                columns=["round", "failure"], data=[list(row) for row in self._failures]
            )
        self.run.log(payload, step=rnd)

    def log_summary(self, summary: dict[str, Any]) -> None:
        privacy = summary.get("privacy")  # the block's numbers and words, as privacy/<k>
        flat = {
            **summary,
            **({f"privacy/{k}": v for k, v in privacy.items()} if isinstance(privacy, dict) else {}),
        }
        self.run.summary.update({
            name: v for k, v in flat.items() if isinstance(v, (int, float, str)) and (name := wandb_key(k))
        })  # fmt: skip

    def log_partition(self, stats_path: Path, plot_path: Path | None = None) -> None:
        """The partition statistics at step 0: a table of per-client sizes and class counts
        (`partition/class_histogram`) and the heatmap image (`partition/plot`) when present."""
        payload: dict[str, Any] = {}
        stats_path = Path(stats_path)
        if stats_path.is_file():
            stats = json.loads(stats_path.read_text())
            hist = stats.get("train_class_histogram") or []
            sizes = stats.get("train_sizes") or [sum(row) for row in hist]
            if hist:
                names = [str(n) for n in stats.get("class_names") or range(len(hist[0]))]
                if len(set(names) | {"client", "size"}) != len(names) + 2:
                    names = [f"{i}:{n}" for i, n in enumerate(names)]
                rows = [[i, int(sizes[i]), *(int(v) for v in row)] for i, row in enumerate(hist)]
                payload["partition/class_histogram"] = self._wandb.Table(
                    columns=["client", "size", *names], data=rows
                )
        if plot_path is not None and Path(plot_path).is_file():
            payload["partition/plot"] = self._wandb.Image(str(plot_path))
        if payload:
            self.run.log({**payload, "round": 0}, step=0)

    def close(self, ok: bool = True) -> None:
        self.run.finish(exit_code=0 if ok else 1)

    @property
    def location(self) -> str:
        return str(Path(self.run.dir).parent)
