"""`fl-lightning compare <runs dir>`: methods side by side, averaged over seeds.

Reads run directories (`summary.json` + `metrics.jsonl`, written by every run) found
anywhere under the given folder, groups them by `--by` keys (default: `method`; a key is
looked up in `summary.json`, then in the run's `config.yaml` as a dotted path such as
`optim.lr`), and for each group prints mean ± std over its runs (usually its seeds) of
the final and best accuracy, the rounds completed and the wall time. It also writes, as
PNG, one accuracy-vs-round plot per group (the mean over seeds with a min/max band) and
one with every group overlaid, plus `compare.json` with the same numbers.

Std is the sample standard deviation (ddof=1), 0 for a group with one run.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError
from .loggers import read_jsonl

SKIP_DIRS = {"checkpoints", "wandb", "compare", "sweep_logs"}


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    _config: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            path = self.run_dir / "config.yaml"
            try:
                self._config = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
            except yaml.YAMLError:
                self._config = {}
        return self._config

    def value(self, key: str) -> Any:
        """`key` from summary.json, else the dotted path in config.yaml (a group such as
        `data` or `method` gives its `name`)."""
        key = key.lstrip("+")
        if key in self.summary:
            return self.summary[key]
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if isinstance(node, dict):
            return node.get("name")
        return node

    def metric_key(self, metric: str | None) -> str:
        return (
            metric or self.summary.get("primary_metric") or self.summary.get("accuracy_metric") or "accuracy"
        )

    @property
    def failed(self) -> bool:
        """Diverged or broken runs: listed, never averaged in."""
        return self.summary.get("status") in ("diverged", "failed")

    def curve(self, metric: str | None = None) -> dict[int, float]:
        key = self.metric_key(metric)
        return {
            int(r["round"]): float(r[key])
            for r in self.records
            if r.get(key) is not None and "round" in r and not r.get("diverged")
        }

    def final_best(self, metric: str | None = None) -> tuple[float | None, float | None]:
        curve = self.curve(metric)
        if curve:
            return curve[max(curve)], max(curve.values())
        if metric is None:  # no metrics.jsonl: fall back to the summary
            key = self.metric_key(None)
            return self.summary.get(f"final_{key}"), self.summary.get(f"best_{key}")
        return None, None


def find_runs(paths: Sequence[Path]) -> list[RunResult]:
    """Every run directory (one holding summary.json) at or under `paths`."""
    found: dict[Path, RunResult] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise ConfigError(f"{root} does not exist")
        summaries = [root / "summary.json"] if (root / "summary.json").is_file() else []
        summaries += [
            p
            for p in sorted(root.rglob("summary.json"))
            if not SKIP_DIRS & set(p.relative_to(root).parts[:-1])
        ]
        for s in summaries:
            run_dir = s.parent.resolve()
            if run_dir in found:
                continue
            try:
                summary = json.loads(s.read_text())
            except ValueError:
                continue  # being written, or torn: skip it
            found[run_dir] = RunResult(run_dir, summary, read_jsonl(run_dir / "metrics.jsonl"))
    return list(found.values())


def _stats(values: Sequence[float | None]) -> dict[str, float | None]:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(xs), "max": max(xs), "n": len(xs)}


@dataclass
class Group:
    key: tuple[Any, ...]
    runs: list[RunResult]
    metric: str | None
    by: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return " ".join(str(k) for k in self.key)

    @property
    def legend(self) -> str:
        """`fedavg`, `fedavg optim.lr=0.1`: names for method/dataset, key=value otherwise."""
        names = self.by or ("",) * len(self.key)
        return " ".join(
            str(v) if k in ("method", "dataset", "") else f"{k}={v}"
            for k, v in zip(names, self.key, strict=True)
        )

    def row(self) -> dict[str, Any]:
        ok = [r for r in self.runs if not r.failed]
        fb = [r.final_best(self.metric) for r in ok]
        seeds = [r.summary.get("seed") for r in ok]
        return {
            "group": self.label,
            "runs": len(ok),
            "failed": [f"{r.run_dir.name} ({r.summary.get('status')})" for r in self.runs if r.failed],
            "seeds": sorted(s for s in seeds if s is not None),
            "metric": self.metric or self.runs[0].metric_key(None),
            "final": _stats([f for f, _ in fb]),
            "best": _stats([b for _, b in fb]),
            "rounds": _stats([r.summary.get("rounds_completed") for r in ok]),
            "wall_time_s": _stats([r.summary.get("wall_time_s") for r in ok]),
            "run_dirs": [str(r.run_dir) for r in self.runs],
        }

    def band(self) -> tuple[list[int], list[float], list[float], list[float]]:
        """Per round: mean, min, max over the runs that have the round."""
        curves = [r.curve(self.metric) for r in self.runs if not r.failed]
        rounds = sorted(set().union(*curves)) if curves else []
        mean, lo, hi = [], [], []
        for rnd in rounds:
            vals = [c[rnd] for c in curves if rnd in c]
            mean.append(sum(vals) / len(vals))
            lo.append(min(vals))
            hi.append(max(vals))
        return rounds, mean, lo, hi


def group_runs(runs: Sequence[RunResult], by: Sequence[str], metric: str | None = None) -> list[Group]:
    groups: dict[tuple[Any, ...], list[RunResult]] = {}
    for r in runs:
        key = tuple("-" if r.value(k) is None else r.value(k) for k in by)
        groups.setdefault(key, []).append(r)
    order = sorted(groups, key=lambda k: tuple(str(x) for x in k))
    return [
        Group(
            k, sorted(groups[k], key=lambda r: (r.summary.get("seed", 0), str(r.run_dir))), metric, tuple(by)
        )
        for k in order
    ]


def common_metric(runs: Sequence[RunResult]) -> str | None:
    """None when every run has the same primary metric; otherwise the most common primary
    metric that every run logged, so that no row of one table shows another metric under its
    header; None if there is none."""
    primary = Counter(r.metric_key(None) for r in runs)
    if len(primary) < 2:
        return None
    reported = [m for m, _ in primary.most_common() if all(r.curve(m) for r in runs)]
    return reported[0] if reported else None


def default_by(runs: Sequence[RunResult]) -> list[str]:
    """`method`, or `dataset method` when the runs span several datasets."""
    datasets = {r.summary.get("dataset") for r in runs}
    return ["dataset", "method"] if len(datasets) > 1 else ["method"]


def _pm(s: dict[str, float | None], spec: str) -> str:
    if s["mean"] is None:
        return "-"
    return f"{format(s['mean'], spec)} ± {format(s['std'], spec)}"


def _rounds(s: dict[str, float | None]) -> str:
    if s["mean"] is None or s["min"] is None or s["max"] is None:
        return "-"
    lo, hi = int(s["min"]), int(s["max"])
    return str(lo) if lo == hi else f"{lo}-{hi}"


def format_compare(groups: Sequence[Group], by: Sequence[str]) -> str:
    rows = [g.row() for g in groups]
    metric = rows[0]["metric"] if rows else "accuracy"
    header = [" ".join(by), "runs", "seeds", f"final {metric}", f"best {metric}", "rounds", "wall time s"]
    cells = [header]
    for r in rows:
        seeds = ",".join(str(s) for s in r["seeds"]) or "-"
        cells.append([r["group"], str(r["runs"]), seeds, _pm(r["final"], ".4f"), _pm(r["best"], ".4f"),
                      _rounds(r["rounds"]), _pm(r["wall_time_s"], ".1f")])  # fmt: skip
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        "mean ± std over runs (sample std); final = last evaluated round, best = best evaluated round"
    )
    for r in rows:
        if len(set(r["seeds"])) < len(r["seeds"]):
            lines.append(f"note: group {r['group']!r} has repeated seeds ({len(r['seeds'])} runs)")
        if r["failed"]:
            lines.append(f"FAILED in group {r['group']!r}, not averaged: {', '.join(r['failed'])}")
    return "\n".join(lines)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name).strip("_") or "all"


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _draw(ax, group: Group, color: Any = None) -> None:
    rounds, mean, lo, hi = group.band()
    n = len(group.runs)
    (line,) = ax.plot(rounds, mean, marker="o" if len(rounds) <= 30 else None, markersize=3, color=color,
                      label=f"{group.legend} (n={n})")  # fmt: skip
    if n > 1:
        ax.fill_between(rounds, lo, hi, alpha=0.2, color=line.get_color(), linewidth=0)


def _finish(fig, ax, metric: str, title: str, path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        fig.savefig(f, format="png")
    tmp.replace(path)
    return path


def write_plots(groups: Sequence[Group], out_dir: Path) -> list[Path]:
    """One accuracy-vs-round PNG per group (mean, min/max band over its runs) and one
    with all groups overlaid."""
    out_dir = Path(out_dir)
    groups = [g for g in groups if g.band()[0]]
    if not groups:
        return []
    metric = groups[0].metric or groups[0].runs[0].metric_key(None)
    paths = []
    fig, ax = _figure()
    for g in groups:
        _draw(ax, g)
    datasets = sorted({str(r.summary.get("dataset")) for g in groups for r in g.runs})
    title = f"{', '.join(datasets)}: mean over seeds, band: min-max"
    paths.append(_finish(fig, ax, metric, title, out_dir / f"{metric}_vs_round.png"))
    for i, g in enumerate(groups):
        fig, ax = _figure()
        _draw(ax, g, color=f"C{i % 10}")
        paths.append(_finish(fig, ax, metric, f"{g.legend}: mean over {len(g.runs)} runs, band: min-max",
                             out_dir / f"{metric}_vs_round_{_safe(g.legend)}.png"))  # fmt: skip
    return paths


def compare(
    paths: Sequence[Path] | None = None,
    by: Sequence[str] | None = None,
    metric: str | None = None,
    out_dir: Path | None = None,
    plots: bool = True,
    runs: Sequence[RunResult] | None = None,
) -> tuple[str, list[Path]]:
    """The comparison table (as text) and the files written (plots, compare.json)."""
    if runs is None:
        runs = find_runs(paths or [])
    if not runs:
        raise ConfigError(f"no runs (no summary.json) under {', '.join(str(p) for p in paths or [])}")
    by = list(by) if by else default_by(runs)
    if metric is None:  # runs of different primary metrics (FedAvg beside personalised methods)
        metric = common_metric(runs)
    groups = group_runs(runs, by, metric)
    table = format_compare(groups, by)
    written: list[Path] = []
    if out_dir is None:
        out_dir = Path(paths[0]) / "compare" if paths else runs[0].run_dir.parent / "compare"
    if plots:
        written += write_plots(groups, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(
        json.dumps({"by": by, "groups": [g.row() for g in groups]}, indent=2) + "\n"
    )
    written.append(out_dir / "compare.json")
    return table, written


def compare_command(
    paths: Sequence[str], by: str | None, metric: str | None, out: str | None, plots: bool
) -> int:
    keys = [k.strip() for k in by.split(",") if k.strip()] if by else None
    table, written = compare([Path(p) for p in paths], keys, metric, Path(out) if out else None, plots)
    print(table)
    for p in written:
        print(f"wrote {p}")
    return 0
