"""`fl-lightning compare <runs dir>`: methods side by side, averaged over seeds.

Reads run directories (`summary.json` + `metrics.jsonl`, written by every run) found
anywhere under the given folder, groups them by `--by` keys (default: `method`; a key is
looked up in `summary.json`, then in the run's `config.yaml` as a dotted path such as
`optim.lr`), and for each group prints n and the mean ± std over its runs (usually its
seeds) of the final and best value of the metric, the rounds completed and the wall time.

Runs are compared on their own primary metric (`accuracy`, `client_accuracy`, `c_ap`, ...):
one table per metric, titled with it, so that no number sits under another metric's header;
`--metric` puts every run on the one metric it names. "Best" is a run's optimum in the
metric's direction: the lowest value for losses (`lower_is_better`), the highest otherwise.
It also writes, as PNG, per metric one metric-vs-round plot per group (the mean over seeds
with a min/max band) and one with every group overlaid, plus `compare.json` with the numbers
of the tables, in their order.

Std is the sample standard deviation (ddof=1); none (no ±, `null` in compare.json) for one run.

Beside `client_accuracy` a table shows its reference, `client_majority_accuracy` (each client
always predicting its majority training class, on its own test split), at the same rounds.
Under each table of several groups, the paired differences of each group's final value from
a baseline group's (`--baseline`, default `fedavg` where present, else the first row) over
the seeds both have (the same seed: the same split and initial weights), with the mean and
95% t-interval as `reproduce` computes them (`tracking.reproduce.paired`).

A runs folder may come from someone else (a colleague's folder, a downloaded archive), so it is
read as untrusted: only plain files of bounded size (no links, FIFOs or devices), bounded JSON
nesting, `yaml.safe_load`, garbage lines and values of the wrong type skipped; nothing in it is
unpickled or imported. Without `--out`, the plots and compare.json go to `<first path>/compare/`,
refused if that is a link, and each file is written to a new temporary file and renamed into
place, so no planted link there is written through.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError
from ..core.files import open_new, save_figure
from ..core.safe_json import load_file, read_text
from .chance import WARNING as CHANCE
from .direction import lower_is_better
from .loggers import read_jsonl

log = logging.getLogger("fl_lightning")
SKIP_DIRS = {"checkpoints", "wandb", "compare", "sweep_logs"}
#: how deep under a runs folder run directories are looked for (`<experiment>/<run>` is 2; a
#: hostile folder 1,500 levels deep was a RecursionError in `rglob`)
MAX_DEPTH = 16
#: the most read of a run's files (ours are a few KiB; metrics.jsonl ~2 KiB a round)
SUMMARY_LIMIT = CONFIG_LIMIT = 1 << 20
METRICS_LIMIT = 256 << 20


def _scalar(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    return v is None or isinstance(v, (str, int, bool))


def _clean_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The scalar entries of a summary.json whose keys the tables use have the types they need."""
    out = {str(k): v for k, v in doc.items() if _scalar(v)}
    for key in ("primary_metric", "accuracy_metric", "status", "warning"):
        if key in out and not isinstance(out[key], str):
            del out[key]
    for key in ("seed", "rounds_completed"):
        if key in out and (not isinstance(out[key], int) or isinstance(out[key], bool)):
            del out[key]
    if "wall_time_s" in out and not isinstance(out["wall_time_s"], (int, float)):
        del out["wall_time_s"]
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
                doc = yaml.safe_load(read_text(path, CONFIG_LIMIT)) if path.is_file() else {}
            except (OSError, ValueError, yaml.YAMLError, RecursionError):  # too big, a link, too deep
                doc = {}
            self._config = doc if isinstance(doc, dict) else {}
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
            node = node.get("name")
        return node if _scalar(node) else str(node)  # a group key must be hashable

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
        ok = [r for r in self.records if _number(r.get(key)) and not r.get("diverged")]
        return {int(r["round"]): float(r[key]) for r in ok}

    def time_curve(self, metric: str | None = None) -> list[tuple[float, float]]:
        """(virtual_time, value) of each evaluated round (`system=`, docs/async.md)."""
        key = self.metric_key(metric)
        ok = [r for r in self.records if _number(r.get(key)) and not r.get("diverged")]
        return [(float(r.get("virtual_time", 0.0)), float(r[key])) for r in ok]

    def time_to(self, target: float, metric: str | None = None) -> float | None:
        """The virtual time of the first evaluated round whose metric reaches `target` (None: never)."""
        low = lower_is_better(self.metric_key(metric))
        for t, v in self.time_curve(metric):
            if (v <= target) if low else (v >= target):
                return t
        return None

    def final_best(self, metric: str | None = None) -> tuple[float | None, float | None]:
        """The last evaluated round's value and the best (`lower_is_better`) of any round."""
        curve = self.curve(metric)
        if curve:
            best = min if lower_is_better(self.metric_key(metric)) else max
            return curve[max(curve)], best(curve.values())
        if metric is None:  # no metrics.jsonl: fall back to the summary (primary metrics: max)
            key = self.metric_key(None)
            last: Any = self.summary.get(f"final_{key}")
            top: Any = self.summary.get(f"best_{key}")
            return (float(last) if _number(last) else None), (float(top) if _number(top) else None)
        return None, None

    @property
    def at_chance(self) -> bool:
        """Completed, but its global metric no better than chance (summary.json `warning`)."""
        return self.summary.get("warning") == CHANCE


def find_runs(paths: Sequence[Path]) -> list[RunResult]:
    """Every run directory (one holding summary.json) at or under `paths`."""
    found: dict[Path, RunResult] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise ConfigError(f"{root} does not exist")
        for s in summary_files(root):
            run_dir = s.parent.resolve()
            if run_dir in found:
                continue
            try:
                summary = load_file(s, SUMMARY_LIMIT)
                records = read_jsonl(run_dir / "metrics.jsonl", METRICS_LIMIT)
            except (OSError, ValueError) as e:  # torn, being written, or not a run's own file
                log.warning("compare: skipped %s: %s", s.parent, e)
                continue
            if isinstance(summary, dict):
                found[run_dir] = RunResult(run_dir, _clean_summary(summary), records)
    return list(found.values())


def summary_files(root: Path) -> list[Path]:
    """The `summary.json` files at or under `root`, at most MAX_DEPTH folders down (a warning
    when a folder goes deeper), never through a link nor into SKIP_DIRS. Walked without
    recursion: a tree of any depth is no RecursionError."""
    found: list[Path] = []
    todo, cut = [(root, 0)], False
    while todo:
        folder, depth = todo.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.name == "summary.json":  # a link or a FIFO too: `load_file` skips it, with a warning
                found.append(Path(e.path))
            elif e.is_dir(follow_symlinks=False) and e.name not in SKIP_DIRS:
                cut |= depth >= MAX_DEPTH
                todo += [] if depth >= MAX_DEPTH else [(Path(e.path), depth + 1)]
    if cut:
        log.warning("compare: %s holds folders more than %d levels deep: not searched there", root, MAX_DEPTH)
    return sorted(found)


def _stats(values: Sequence[float | None]) -> dict[str, float | None]:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
    return {"mean": mean, "std": std, "min": min(xs), "max": max(xs), "n": len(xs)}


@dataclass
class Group:
    key: tuple[Any, ...]
    runs: list[RunResult]
    metric: str | None
    by: tuple[str, ...] = ()

    @property
    def metric_name(self) -> str:
        """The metric of this group's numbers: `metric`, else its runs' (shared) primary metric."""
        return self.metric or self.runs[0].metric_key(None)

    @property
    def label(self) -> str:
        # read from files: no escapes, and one line (a newline in a `variant` split an error line)
        return _IN_A_LINE.sub("?", " ".join(str(k) for k in self.key))

    @property
    def legend(self) -> str:
        """`fedavg`, `fedavg optim.lr=0.1`: names for method/dataset, key=value otherwise."""
        names = self.by or ("",) * len(self.key)
        text = " ".join(
            str(v) if k in ("method", "dataset", "") else f"{k}={v}"
            for k, v in zip(names, self.key, strict=True)
        )
        return _IN_A_LINE.sub("?", text)

    def row(self) -> dict[str, Any]:
        """Every number is over the same n runs: those that finished and have the metric."""
        ok = [r for r in self.runs if not r.failed]
        fb = [(r, *r.final_best(self.metric)) for r in ok]
        have = [(r, f, b) for r, f, b in fb if f is not None]
        runs = [r for r, _, _ in have]
        seeds = [r.summary.get("seed") for r in runs]
        return {
            "group": self.label,
            "metric": self.metric_name,
            "direction": "min" if lower_is_better(self.metric_name) else "max",
            "n": len(have),
            "runs": len(ok),
            "failed": [f"{r.run_dir.name} ({r.summary.get('status')})" for r in self.runs if r.failed],
            "at_chance": [r.run_dir.name for r in ok if r.at_chance],
            "missing": [r.run_dir.name for r, f, _ in fb if f is None],
            "seeds": sorted(s for s in seeds if s is not None),
            "final": _stats([f for _, f, _ in have]),
            "best": _stats([b for _, _, b in have]),
            "rounds": _stats([r.summary.get("rounds_completed") for r in runs]),
            "wall_time_s": _stats([r.summary.get("wall_time_s") for r in runs]),
            "reference": _stats(
                [r.final_best(REFERENCES[self.metric_name])[0] for r in runs]
                if self.metric_name in REFERENCES
                else []
            ),
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


def by_metric(groups: Sequence[Group]) -> dict[str, list[Group]]:
    """The groups of each metric (one table each), metrics in name order."""
    out: dict[str, list[Group]] = {}
    for g in sorted(groups, key=lambda g: g.metric_name):
        out.setdefault(g.metric_name, []).append(g)
    return out


def common_metric(runs: Sequence[RunResult]) -> str | None:
    """None when every run has the same primary metric; otherwise the most common primary
    metric that every run logged (a `--metric` that puts them all on one table), None if
    there is none."""
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
    if s["std"] is None:  # one run: no spread to show
        return format(s["mean"], spec)
    return f"{format(s['mean'], spec)} ± {format(s['std'], spec)}"


def _rounds(s: dict[str, float | None]) -> str:
    if s["mean"] is None or s["min"] is None or s["max"] is None:
        return "-"
    lo, hi = int(s["min"]), int(s["max"])
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _table(metric: str, groups: Sequence[Group], by: Sequence[str]) -> list[str]:
    rows = [g.row() for g in groups]
    low = lower_is_better(metric)
    ref = any(r["reference"]["n"] for r in rows)  # its reference's final value beside the final
    header = [" ".join(by), "n", "seeds", f"final {metric}", *(["majority ref"] if ref else []),
              f"best {metric}", "rounds", "wall time s"]  # fmt: skip
    cells = [header]
    for r in rows:
        seeds = ",".join(str(s) for s in r["seeds"]) or "-"
        cells.append([r["group"], str(r["n"]), seeds, _pm(r["final"], ".4f"),
                      *([_pm(r["reference"], ".4f")] if ref else []), _pm(r["best"], ".4f"),
                      _rounds(r["rounds"]), _pm(r["wall_time_s"], ".1f")])  # fmt: skip
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(0, f"{metric} ({'lower' if low else 'higher'} is better; best = a run's "
                    f"{'lowest' if low else 'highest'} value of any evaluated round)")  # fmt: skip
    for r in rows:
        if len(set(r["seeds"])) < len(r["seeds"]):
            lines.append(f"note: group {r['group']!r} has repeated seeds ({len(r['seeds'])} runs)")
        if r["missing"]:
            missing = ", ".join(r["missing"])
            lines.append(f"note: no {metric} in group {r['group']!r}, not averaged: {missing}")
        if r["failed"]:
            lines.append(f"FAILED in group {r['group']!r}, not averaged: {', '.join(r['failed'])}")
        if r["at_chance"]:
            lines.append(f"WARNING in group {r['group']!r}, {CHANCE}: {', '.join(r['at_chance'])}")
    if ref:
        lines.append("majority ref: the clients always predicting their majority training class, "
                     "on the same test splits (final round)")  # fmt: skip
    return lines


def baseline_group(groups: Sequence[Group], baseline: str | None) -> Group | None:
    """The group the others are paired against: `baseline` (a row's label), else `fedavg`
    where a row is named so, else the first row; None for fewer than two groups."""
    if len(groups) < 2:
        return None
    named = [g for g in groups if g.label == (baseline or "fedavg")]
    return named[0] if named else (None if baseline else groups[0])


def paired_differences(groups: Sequence[Group], baseline: str | None = None) -> list[dict[str, Any]]:
    """Each group's final value minus the baseline group's, paired by seed (`reproduce`'s
    `paired`: mean, 95% t-interval, whether it excludes 0); groups with a repeated seed are
    not paired (which run of the seed would be meant is unknown)."""
    from .reproduce import paired

    base = baseline_group(groups, baseline)
    if base is None:
        return []

    def finals(g: Group) -> dict[int, float] | None:
        runs = [(r.summary.get("seed"), r.final_best(g.metric)[0]) for r in g.runs if not r.failed]
        have = [(int(s), float(v)) for s, v in runs if isinstance(s, int) and v is not None]
        return dict(have) if len({s for s, _ in have}) == len(have) else None

    metric = base.metric_name
    better = "lower" if lower_is_better(metric) else "higher"
    words = {"supported": "better", "contradicted": "worse", "inconclusive": "the interval holds 0"}
    out = []
    b = finals(base)
    for g in groups:
        if g is base:
            continue
        a = finals(g)
        row: dict[str, Any] = {"metric": metric, "group": g.label, "baseline": base.label}
        if a is None or b is None:
            out.append({**row, "seeds": [], "note": "a repeated seed: not paired"})
            continue
        p = paired(a, b, better)
        note = words.get(p.verdict) or p.why
        out.append({**row, "seeds": p.seeds, "diffs": p.diffs, "mean": p.mean, "low": p.low,
                    "high": p.high, "note": note})  # fmt: skip
    return out


def time_to_target(groups: Sequence[Group], target: float, baseline: str | None = None) -> list[str]:
    """Per group, the virtual time to reach `target` (mean ± std over the runs that reach it), and
    each group's time minus the baseline's, paired by seed (lower is better)."""
    from .reproduce import paired

    if not groups:
        return []
    metric = groups[0].metric_name
    sign = "<=" if lower_is_better(metric) else ">="
    lines = [f"virtual time to {metric} {sign} {target} (seconds; runs that reach it / runs)"]
    times: dict[str, dict[int, float]] = {}
    for g in groups:
        ok = [r for r in g.runs if not r.failed]
        got = [(r.summary.get("seed"), r.time_to(target, g.metric)) for r in ok]
        reached = [t for _, t in got if t is not None]
        times[g.label] = {int(sd): t for sd, t in got if isinstance(sd, int) and t is not None}
        lines.append(f"  {g.label}  {_pm(_stats(reached), '.1f')}  ({len(reached)}/{len(ok)})")
    base = baseline_group(groups, baseline)
    if base is not None:
        for g in groups:
            if g is base:
                continue
            p = paired(times[g.label], times[base.label], "lower")
            interval = f" [{p.low:+.1f}, {p.high:+.1f}]" if p.low is not None and p.high is not None else ""
            mean = "-" if p.mean is None else f"{p.mean:+.1f}"
            lines.append(f"  {g.label} minus {base.label}, paired by seed: {mean}{interval}  {p.verdict}")
    return lines


def write_time_plots(groups: Sequence[Group], out_dir: Path) -> list[Path]:
    """Per metric: every run's metric against virtual time, coloured by group
    (`<metric>_vs_time.png`): the seeds' clocks differ, so no band is drawn."""
    paths = []
    for metric, gs in by_metric(groups).items():
        fig, ax = _figure()
        for i, g in enumerate(gs):
            for j, r in enumerate(x for x in g.runs if not x.failed):
                pts = r.time_curve(g.metric)
                if pts:
                    ax.plot(*zip(*pts, strict=True), color=f"C{i % 10}", label=g.legend if j == 0 else None)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel(f"{metric} ({'lower' if lower_is_better(metric) else 'higher'} is better)")
        ax.set_title(f"{metric} against virtual time: one line per run", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        paths.append(save_figure(fig, Path(out_dir) / f"{_safe(metric)}_vs_time.png"))
    return paths


def _paired_lines(pairs: Sequence[dict[str, Any]]) -> list[str]:
    if not pairs:
        return []
    first = pairs[0]
    lines = [f"paired: final {first['metric']} minus {first['baseline']}'s on the same seeds "
             "(mean [95% t-interval])"]  # fmt: skip
    width = max(len(p["group"]) for p in pairs)
    for p in pairs:
        seeds = ",".join(map(str, p["seeds"])) or "none shared"
        mean = "-" if p.get("mean") is None else f"{p['mean']:+.4f}"
        interval = f" [{p['low']:+.4f}, {p['high']:+.4f}]" if p.get("low") is not None else ""
        lines.append(f"  {p['group'].ljust(width)}  seeds {seeds}  {mean}{interval}  {p['note']}")
    return lines


def format_compare(
    groups: Sequence[Group], by: Sequence[str], hint: str | None = None, baseline: str | None = None
) -> str:
    """One table per metric (`by_metric`), each with its paired differences from `baseline`;
    `hint`: a metric every run reports, when the tables are several."""
    tables = by_metric(groups)
    lines: list[str] = []
    for metric, gs in tables.items():
        lines += [
            *([""] if lines else []),
            *_table(metric, gs, by),
            *_paired_lines(paired_differences(gs, baseline)),
        ]
    lines.append("mean ± std over the n runs of a row (sample std; a single run: its value); "
                 "final = last evaluated round")  # fmt: skip
    if len(tables) > 1 and hint:
        lines.append(f"the runs differ in primary metric: --metric {hint} puts them all on one table")
    return _CONTROL.sub("?", "\n".join(lines))  # names from the runs' files: no terminal escapes


#: the reference shown beside a metric: what a trivial predictor scores on the same splits
REFERENCES = {"client_accuracy": "client_majority_accuracy"}


_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
_IN_A_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a name inside one line: no newline either


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
    n = sum(1 for r in group.runs if not r.failed and r.curve(group.metric))
    (line,) = ax.plot(rounds, mean, marker="o" if len(rounds) <= 30 else None, markersize=3, color=color,
                      label=f"{group.legend} (n={n})")  # fmt: skip
    if n > 1:
        ax.fill_between(rounds, lo, hi, alpha=0.2, color=line.get_color(), linewidth=0)


def _finish(fig, ax, metric: str, title: str, path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} ({'lower' if lower_is_better(metric) else 'higher'} is better)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")  # a loss falls where an accuracy rises
    fig.tight_layout()
    return save_figure(fig, path)  # a new temporary file, renamed: no planted link written through


def write_plots(groups: Sequence[Group], out_dir: Path) -> list[Path]:
    """Per metric: one metric-vs-round PNG per group (mean, min/max band over its runs) and
    one with all its groups overlaid (`<metric>_vs_round[_<group>].png`)."""
    out_dir = Path(out_dir)
    paths = []
    for metric, gs in by_metric([g for g in groups if g.band()[0]]).items():
        fig, ax = _figure()
        for i, g in enumerate(gs):
            _draw(ax, g, color=f"C{i % 10}")
        datasets = sorted({str(r.summary.get("dataset")) for g in gs for r in g.runs})
        title = f"{metric}, {', '.join(datasets)}: mean over seeds, band: min-max"
        paths.append(_finish(fig, ax, metric, title, out_dir / f"{_safe(metric)}_vs_round.png"))
        for i, g in enumerate(gs):
            fig, ax = _figure()
            _draw(ax, g, color=f"C{i % 10}")
            n = g.row()["n"]
            paths.append(_finish(fig, ax, metric, f"{g.legend}: mean over {n} runs, band: min-max",
                                 out_dir / f"{_safe(metric)}_vs_round_{_safe(g.legend)}.png"))  # fmt: skip
    return paths


def compare(
    paths: Sequence[Path] | None = None,
    by: Sequence[str] | None = None,
    metric: str | None = None,
    out_dir: Path | None = None,
    plots: bool = True,
    runs: Sequence[RunResult] | None = None,
    baseline: str | None = None,
    x: str = "round",
    target: float | None = None,
) -> tuple[str, list[Path]]:
    """The comparison table (as text) and the files written (plots, compare.json). `x="time"`:
    plots against the virtual clock; `target`: each group's virtual time to reach it."""
    if runs is None:
        runs = find_runs(paths or [])
    if not runs:
        raise ConfigError(f"no runs (no summary.json) under {', '.join(str(p) for p in paths or [])}")
    by = list(by) if by else default_by(runs)
    groups: list[Group] = []
    for m in sorted({r.metric_key(metric) for r in runs}):  # one table per metric
        groups += group_runs([r for r in runs if r.metric_key(metric) == m], by, metric)
    if baseline is not None and not any(g.label == baseline for g in groups):
        valid = ", ".join(sorted({g.label for g in groups}))
        raise ConfigError(f"--baseline {baseline!r} names no row; rows: {valid}")
    table = format_compare(groups, by, None if metric else common_metric(runs), baseline)
    if target is not None:
        extra = [ln for gs in by_metric(groups).values() for ln in time_to_target(gs, target, baseline)]
        table = table + "\n" + _CONTROL.sub("?", "\n".join(extra))
    written: list[Path] = []
    if out_dir is None:  # inside the compared folder, which may not be ours: not through a link
        out_dir = Path(paths[0]) / "compare" if paths else runs[0].run_dir.parent / "compare"
        if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
            raise ConfigError(
                f"{out_dir} is a link or not a folder: compare writes only into a folder of its "
                "own; remove it, or name one with --out"
            )
    if plots:
        written += write_time_plots(groups, out_dir) if x == "time" else write_plots(groups, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paired = [p for gs in by_metric(groups).values() for p in paired_differences(gs, baseline)]
    doc = {
        "by": by,
        "metrics": list(by_metric(groups)),
        "groups": [g.row() for g in groups],
        "paired": paired,
    }
    tmp = out_dir / ".compare.json.tmp"
    with open_new(tmp) as f:
        f.write((json.dumps(doc, indent=2) + "\n").encode())
    tmp.replace(out_dir / "compare.json")
    written.append(out_dir / "compare.json")
    return table, written


def compare_command(
    paths: Sequence[str],
    by: str | None,
    metric: str | None,
    out: str | None,
    plots: bool,
    baseline: str | None = None,
    x: str = "round",
    target: float | None = None,
) -> int:
    keys = [k.strip() for k in by.split(",") if k.strip()] if by else None
    out_dir = Path(out) if out else None
    table, written = compare(
        [Path(p) for p in paths], keys, metric, out_dir, plots, baseline=baseline, x=x, target=target
    )
    print(table)
    for p in written:
        print(f"wrote {p}")
    return 0
