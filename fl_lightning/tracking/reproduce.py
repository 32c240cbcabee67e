"""A paper's claims as data, and the report that tests them (`fl-lightning reproduce`).

`conf/reproduce/<paper>.yaml` states, for one paper:

- `scales`: `mini` (Fashion-MNIST and our stand-ins, minutes per run on one CPU core) and
  `paper` (the paper's data, models and schedule): the overrides every run of that scale
  gets, its seeds, what data or weights it needs, and `reach` (an accuracy whose first
  round the report shows, optional); `requires` maps config keys that must name an existing
  file (`text.pretrained: "CLIP ViT-B/16 weights ..."`) to what to get, so a paper scale
  never runs on a stand-in: a missing file, like a missing dataset, stops it before any
  data loads with one line naming what to get and where to put it;
- `rows`: one configuration each (method and its switches, a control), as overrides; a row
  may add overrides for one scale only (`by_scale: {mini: [...]}`), carry the paper's
  numbers (`paper: 92.11` for the metric of the file's first claim, or one per metric:
  `paper: {c_ap: 60.9, c_f1: 55.1}`) and be left out of a scale (`scales: [paper]`);
- `claims`: "row beats baseline on metric", with the direction the paper claims;
- `metrics` (optional): more per-round metrics to tabulate beside the claimed ones.

A scale may `prepare` what its runs need before they start (a pretrained trunk: `fl-lightning
pretrain`; CLIP2FL's teachers: `fl-lightning teacher build`): each step gives the
`fl-lightning` arguments and may name the file it `creates` (relative to the reproduction's
folder), in which case it runs only while that file is missing; a step without one (a
builder that caches, and prints what it built) runs every time. `{out}` in a
step, a scale's or a row's overrides stands for the reproduction's folder. A row may also read
its numbers from another row's runs under a metric prefix (`runs_of: clip2fl`,
`metric_prefix: fedavg_head/`: CLIP2FL's own FedAvg head, i.e. FedAvg + distillation) instead
of runs of its own.

A claim's verdict comes from the paired difference over seeds (row minus baseline, the same
seed: the same split and initial weights): its mean and 95% t-interval; **supported** when
the interval excludes 0 in the claimed direction, **contradicted** when it excludes 0 the
other way, **inconclusive** otherwise (also with fewer than two pairs). A diverged run gives
no value; its seed drops out of the pairs and the report says so.

Pure: reads run directories written by `fl-lightning run`, writes Markdown, JSON and PNGs.
No torch, Ray or W&B.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError
from .chance import WARNING as CHANCE
from .compare import lower_is_better
from .loggers import read_jsonl

SCALES = ("mini", "paper")
STATS = ("final", "best")
NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")
ROW_KEYS = {"label", "overrides", "by_scale", "scales", "paper", "runs_of", "metric_prefix"}


@dataclass(frozen=True)
class Prepare:
    command: list[str]  # `fl-lightning` arguments; `{out}` is the folder
    creates: str | None = None  # a file relative to the folder; None: run every time (a cache's builder)


@dataclass(frozen=True)
class Scale:
    name: str
    overrides: list[str]
    seeds: list[int]
    needs: str
    reach: float | None = None
    prepare: tuple[Prepare, ...] = ()
    #: config key -> what to get (weights the paper used): each run's value of the key must
    #: name an existing file or folder, else the reproduction stops before any data loads
    requires: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    overrides: list[str]
    by_scale: dict[str, list[str]] = field(default_factory=dict)
    scales: tuple[str, ...] = SCALES
    paper: dict[str, float] = field(default_factory=dict)  # the paper's number per metric
    runs_of: str | None = None  # read another row's runs instead of running its own
    metric_prefix: str = ""  # ... under this prefix of every metric

    def args(self, scale: Scale, out: Path | str = "{out}") -> list[str]:
        return [a.replace("{out}", str(out)) for a in (*scale.overrides, *self.overrides,
                                                       *self.by_scale.get(scale.name, []))]  # fmt: skip

    @property
    def source(self) -> str:
        """The row whose runs hold this row's numbers."""
        return self.runs_of or self.id


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    row: str
    baseline: str
    metric: str
    stat: str = "final"  # final | best
    direction: str = "higher"  # higher | lower: what the paper claims of row - baseline
    paper_ref: str = ""


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    citation: str
    scales: dict[str, Scale]
    rows: dict[str, Row]
    claims: list[Claim]
    metrics: tuple[str, ...] = ()

    def rows_for(self, scale: str) -> list[Row]:
        return [r for r in self.rows.values() if scale in r.scales]

    def run_rows(self, scale: str) -> list[Row]:
        """The rows of `scale` that have runs of their own."""
        return [r for r in self.rows_for(scale) if r.runs_of is None]

    def table_metrics(self, scale: str) -> list[str]:
        claimed = sorted({c.metric for c in self.claims_for(scale)})
        return claimed + [m for m in self.metrics if m not in claimed]

    def claims_for(self, scale: str) -> list[Claim]:
        ids = {r.id for r in self.rows_for(scale)}
        return [c for c in self.claims if c.row in ids and c.baseline in ids]


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of overrides (strings)")
    return list(value)


def load_spec(path: Path) -> Spec:
    """Read and check a claims file; every mistake is one ConfigError naming the file."""
    name = path.stem
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping")
    unknown = set(doc) - {"title", "citation", "scales", "rows", "claims", "metrics"}
    if unknown:
        raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r}")
    scales: dict[str, Scale] = {}
    for s, body in (doc.get("scales") or {}).items():
        if s not in SCALES or not isinstance(body, dict):
            raise ConfigError(f"{path}: scales must be among {', '.join(SCALES)}, each a mapping")
        seeds = body.get("seeds") or [0]
        if not all(isinstance(x, int) and x >= 0 for x in seeds):
            raise ConfigError(f"{path}: scales.{s}.seeds must be non-negative integers")
        reach = body.get("reach")
        steps = []
        for i, step in enumerate(body.get("prepare") or []):
            if not isinstance(step, dict) or not step.get("command") or set(step) - {"creates", "command"}:
                raise ConfigError(
                    f"{path}: scales.{s}.prepare[{i}] needs a `command` (and may name what it `creates`)"
                )
            creates = None if step.get("creates") is None else str(step["creates"])
            if creates is not None and (creates.startswith("/") or ".." in Path(creates).parts):
                raise ConfigError(f"{path}: scales.{s}.prepare[{i}].creates must stay inside the folder")
            command = _strings(step["command"], f"{path}: scales.{s}.prepare[{i}].command")
            steps.append(Prepare(command, creates))
        requires = body.get("requires") or {}
        if not isinstance(requires, dict) or not all(isinstance(v, str) for v in requires.values()):
            raise ConfigError(f"{path}: scales.{s}.requires must map config keys to what to get")
        scales[s] = Scale(
            s, _strings(body.get("overrides"), f"{path}: scales.{s}.overrides"), list(seeds),
            str(body.get("needs", "")), None if reach is None else float(reach), tuple(steps),
            {str(k): v for k, v in requires.items()},
        )  # fmt: skip
    rows: dict[str, Row] = {}
    scalar_papers: dict[str, float] = {}  # `paper: 92.11`: the first claim's metric, once claims are read
    for rid, body in (doc.get("rows") or {}).items():
        if not NAME.match(str(rid)) or not isinstance(body, dict):
            raise ConfigError(f"{path}: row {rid!r} must be a lower-case name with a mapping")
        by_scale = body.get("by_scale") or {}
        if set(by_scale) - set(SCALES):
            raise ConfigError(f"{path}: rows.{rid}.by_scale keys must be among {', '.join(SCALES)}")
        only = tuple(body.get("scales") or SCALES)
        if set(only) - set(SCALES):
            raise ConfigError(f"{path}: rows.{rid}.scales must be among {', '.join(SCALES)}")
        paper = body.get("paper")
        if not (
            paper is None
            or isinstance(paper, (int, float))
            or (isinstance(paper, dict) and all(isinstance(v, (int, float)) for v in paper.values()))
        ):
            raise ConfigError(f"{path}: rows.{rid}.paper must be a number or a mapping metric: number")
        unknown_keys = set(body) - ROW_KEYS
        if unknown_keys:
            raise ConfigError(f"{path}: rows.{rid}: unknown key {sorted(unknown_keys)[0]!r}")
        runs_of = body.get("runs_of")
        if runs_of is not None and (body.get("overrides") or by_scale):
            raise ConfigError(f"{path}: rows.{rid} reads the runs of {runs_of!r}: it takes no overrides")
        rows[rid] = Row(
            rid, str(body.get("label", rid)),
            _strings(body.get("overrides"), f"{path}: rows.{rid}.overrides"),
            {k: _strings(v, f"{path}: rows.{rid}.by_scale.{k}") for k, v in by_scale.items()},
            only, {str(k): float(v) for k, v in paper.items()} if isinstance(paper, dict) else {},
            None if runs_of is None else str(runs_of), str(body.get("metric_prefix", "")),
        )  # fmt: skip
        if isinstance(paper, (int, float)):
            scalar_papers[rid] = float(paper)
    for row in rows.values():
        src = rows.get(row.runs_of) if row.runs_of is not None else row
        if src is None or src.runs_of is not None or not set(row.scales) <= set(src.scales):
            raise ConfigError(
                f"{path}: rows.{row.id}.runs_of must name a row with runs of its own in its scales"
            )
    claims: list[Claim] = []
    for i, body in enumerate(doc.get("claims") or []):
        try:
            claim = Claim(**body)
        except TypeError as e:
            raise ConfigError(f"{path}: claims[{i}]: {e}") from None
        for r in (claim.row, claim.baseline):
            if r not in rows:
                raise ConfigError(f"{path}: claim {claim.id!r} names row {r!r}, not in rows")
        if claim.stat not in STATS or claim.direction not in ("higher", "lower"):
            raise ConfigError(f"{path}: claim {claim.id!r}: stat in {STATS}, direction higher|lower")
        claims.append(claim)
    if not scales or not rows or not claims:
        raise ConfigError(f"{path}: needs scales, rows and claims")
    for rid, value in scalar_papers.items():
        rows[rid].paper[claims[0].metric] = value
    if len({c.id for c in claims}) != len(claims):
        raise ConfigError(f"{path}: claim ids must be unique")
    metrics = _strings(doc.get("metrics"), f"{path}: metrics")
    return Spec(
        name, str(doc.get("title", name)), str(doc.get("citation", "")), scales, rows, claims, tuple(metrics)
    )


# --- numbers ----------------------------------------------------------------------------
def run_value(records: Sequence[dict[str, Any]], metric: str, stat: str) -> float | None:
    """`final`: the metric at the last round that has it; `best`: its optimum over rounds."""
    xs = [float(r[metric]) for r in records if r.get(metric) is not None and not r.get("diverged")]
    if not xs:
        return None
    if stat == "final":
        return xs[-1]
    return min(xs) if lower_is_better(metric) else max(xs)


def first_round_reaching(records: Sequence[dict[str, Any]], metric: str, level: float) -> int | None:
    for r in records:
        v = r.get(metric)
        if v is not None and not r.get("diverged") and float(v) >= level:
            return int(r["round"])
    return None


def t_quantile(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def mean_std(xs: Sequence[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@dataclass
class Paired:
    seeds: list[int]
    diffs: list[float]
    mean: float | None
    low: float | None
    high: float | None
    verdict: str


def paired(a: dict[int, float], b: dict[int, float], direction: str) -> Paired:
    """Row minus baseline over the seeds both have; the 95% t-interval and the verdict."""
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    mean, sd = mean_std(diffs)
    if mean is None or sd is None:
        return Paired(seeds, diffs, mean, None, None, "inconclusive")
    half = t_quantile(len(diffs) - 1) * sd / math.sqrt(len(diffs))
    low, high = mean - half, mean + half
    sign = 1.0 if direction == "higher" else -1.0
    if sign * low > 0 and sign * high > 0:
        verdict = "supported"
    elif sign * low < 0 and sign * high < 0:
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    return Paired(seeds, diffs, mean, low, high, verdict)


# --- reading the runs ---------------------------------------------------------------------
def run_name(row: str, seed: int) -> str:
    return f"{row}_s{seed}"


@dataclass
class RunState:
    status: str  # missing | partial | completed | diverged | failed | interrupted
    records: list[dict[str, Any]]
    summary: dict[str, Any]


def read_run(run_dir: Path) -> RunState:
    if not run_dir.is_dir():
        return RunState("missing", [], {})
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    records = read_jsonl(run_dir / "metrics.jsonl")
    status = str(summary.get("status", "partial")) if isinstance(summary, dict) else "partial"
    return RunState(status, records, summary if isinstance(summary, dict) else {})


def is_finished(state: RunState, rounds: int) -> bool:
    """Nothing more to run: completed all `rounds`, or stopped for good (diverged, failed)."""
    if state.status == "completed":
        return int(state.summary.get("rounds_completed") or 0) >= rounds
    return state.status in ("diverged", "failed")


# --- the report ---------------------------------------------------------------------------
def _fmt(v: float | None, scale: float = 100.0, digits: int = 2) -> str:
    return "–" if v is None else f"{v * scale:.{digits}f}"


def _pm(xs: Sequence[float], pct: bool) -> str:
    m, sd = mean_std(xs)
    k = 100.0 if pct else 1.0
    if m is None:
        return "–"
    return f"{m * k:.2f}" + ("" if sd is None else f" ± {sd * k:.2f}")


def build_report(
    spec: Spec, scale: str, runs_dir: Path, seeds: Sequence[int], command: str
) -> tuple[str, dict[str, Any]]:
    """The Markdown report and its numbers, from the run directories under `runs_dir`."""
    sc = spec.scales[scale]
    rows = spec.rows_for(scale)
    states = {(r.id, s): read_run(runs_dir / run_name(r.source, s)) for r in rows for s in seeds}
    metrics = spec.table_metrics(scale)
    out: dict[str, Any] = {"paper": spec.name, "scale": scale, "seeds": list(seeds), "rows": {}, "claims": []}
    every = " ".join(o.replace("{out}", str(runs_dir.parent)) for o in sc.overrides)
    lines = [
        f"# Reproduction: {spec.title} ({scale} scale)",
        "",
        f"{spec.citation}",
        "",
        "Produced by this command (it writes this file; numbers are not edited by hand):",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Every run: `{every}`. Seeds: {', '.join(map(str, seeds))}. "
        f"Needs: {sc.needs or '-'}. Machine: {machine()}.",
        "",
        "Verdicts: the paired difference (row minus baseline, same seed) over the seeds where both "
        "finished; 95% t-interval; *supported* when it excludes 0 in the paper's direction, "
        "*contradicted* when it excludes 0 the other way, *inconclusive* otherwise. A run that "
        "diverged gives no value: its seed drops out of the claim's pairs, and the table says so.",
        "",
    ]
    # Rows.
    for metric in metrics:
        pct = not lower_is_better(metric)
        lines += [f"## Rows: `{metric}` (%)" if pct else f"## Rows: `{metric}`", ""]
        head = "| row | overrides | runs | final | best |"
        sep = "|---|---|---|---|---|"
        if sc.reach is not None and pct:
            head += f" first round ≥ {sc.reach * 100:g}% |"
            sep += "---|"
        lines += [head + (" paper |" if pct else ""), sep + ("---|" if pct else "")]
        for r in rows:
            finals = _values(states, r, seeds, metric, "final")
            bests = _values(states, r, seeds, metric, "best")
            bad = sum(states[(r.id, s)].status in ("diverged", "failed") for s in seeds)
            chance = sum(states[(r.id, s)].summary.get("warning") == CHANCE for s in seeds)
            done = f"{len(finals)}/{len(seeds)}" + (f" ({bad} diverged)" if bad else "")
            done += f" ({chance} no better than chance)" if chance else ""
            how = (
                f"{spec.rows[r.runs_of].label}'s runs, `{r.metric_prefix}*`"
                if r.runs_of is not None
                else "`" + " ".join(r.overrides + r.by_scale.get(scale, [])) + "`"
            )
            cells = [r.label, how, done, _pm(list(finals.values()), pct), _pm(list(bests.values()), pct)]
            if sc.reach is not None and pct:
                got = [first_round_reaching(states[(r.id, s)].records, metric, sc.reach) for s in finals]
                hit = [x for x in got if x is not None]
                shown = (f"{sum(hit) / len(hit):.1f}" if hit else "never") + f" ({len(hit)}/{len(got)})"
                cells.append(shown if got else "–")
            if pct:
                cells.append(f"{r.paper[metric]:g}" if metric in r.paper else "–")
            lines.append("| " + " | ".join(cells) + " |")
            out["rows"].setdefault(r.id, {})[metric] = {
                "final": finals, "best": bests, "diverged": bad, "at_chance": chance,
            }  # fmt: skip
        lines.append("")
    notes = _pretrained_notes(rows, states, seeds)
    if notes:
        lines += [
            "## Pretrained parts",
            "",
            "What the runs started from, as their `summary.json` records it "
            "(held-out accuracy on the test set, mean over the row's completed seeds):",
            "",
            *notes,
            "",
        ]
        out["pretrained"] = notes
    # Claims.
    lines += ["## Claims", "",
              "| claim | metric | row − baseline | per seed | mean | 95% interval | paper | verdict |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in spec.claims_for(scale):
        a = _values(states, spec.rows[c.row], seeds, c.metric, c.stat)
        b = _values(states, spec.rows[c.baseline], seeds, c.metric, c.stat)
        p = paired(a, b, c.direction)
        pct = not lower_is_better(c.metric)
        k = 100.0 if pct else 1.0
        ra, rb = spec.rows[c.row], spec.rows[c.baseline]
        known = c.metric in ra.paper and c.metric in rb.paper and pct
        paper = f"{ra.paper[c.metric] - rb.paper[c.metric]:+.2f}" if known else "–"
        per_seed = ", ".join(f"{d * k:+.2f}" for d in p.diffs) or "–"
        for r in (ra, rb):  # a seed that drops out because a row diverged is said, not hidden
            gone = [s for s in seeds if states[(r.id, s)].status in ("diverged", "failed")]
            if gone:
                per_seed += f"; {r.label} diverged (seed {', '.join(map(str, gone))})"
        interval = "–" if p.low is None or p.high is None else f"[{p.low * k:+.2f}, {p.high * k:+.2f}]"
        mean = "–" if p.mean is None else f"{p.mean * k:+.2f}"
        lines.append(
            f"| {c.text} | {c.stat} {c.metric} | {ra.label} − {rb.label} | {per_seed} | {mean} | "
            f"{interval} | {paper}{' (' + c.paper_ref + ')' if c.paper_ref else ''} | **{p.verdict}** |"
        )
        out["claims"].append(
            {"id": c.id, "row": c.row, "baseline": c.baseline, "metric": c.metric, "stat": c.stat,
             "direction": c.direction, "seeds": p.seeds, "diffs": p.diffs, "mean": p.mean,
             "low": p.low, "high": p.high, "verdict": p.verdict,
             "diverged": {r.id: [s for s in seeds if states[(r.id, s)].status in ("diverged", "failed")]
                          for r in (ra, rb)}}
        )  # fmt: skip
    lines += ["", "Curves: `curves.png` (every row, mean over seeds, band min-max).", ""]
    return "\n".join(lines), out


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    import platform

    return f"{cpu_model()}, Python {platform.python_version()}"


def _pretrained_notes(
    rows: Sequence[Row], states: dict[tuple[str, int], RunState], seeds: Sequence[int]
) -> list[str]:
    """One line per row whose runs started from a pretrained trunk (`model.weights`) or a
    teacher (CLIP2FL): its held-out accuracy, so a control's strength is on the page."""
    notes = []
    for r in rows:
        done = [states[(r.id, s)].summary for s in seeds if states[(r.id, s)].status == "completed"]
        parts = []
        trunk = [float(v) for d in done for k, v in ((d.get("model_weights") or {}).get("info") or {}).items()
                 if k.startswith("held_out_") and isinstance(v, (int, float))]  # fmt: skip
        if trunk:
            arch = ((done[0].get("model_weights") or {}).get("arch")) or "trunk"
            parts.append(f"pretrained {arch} trunk {sum(trunk) / len(trunk) * 100:.2f}%")
        key = "teacher_held_out_accuracy"
        teacher = [float(d[key]) for d in done if d.get(key) is not None]
        if teacher:
            parts.append(f"teacher {sum(teacher) / len(teacher) * 100:.2f}%")
        if parts:
            notes.append(f"- {r.label}: " + ", ".join(parts))
    return notes


def _values(
    states: dict[tuple[str, int], RunState], row: Row, seeds: Sequence[int], metric: str, stat: str
) -> dict[int, float]:
    got: dict[int, float] = {}
    for s in seeds:
        st = states[(row.id, s)]
        v = run_value(st.records, row.metric_prefix + metric, stat) if st.status == "completed" else None
        if v is not None:
            got[s] = v
    return got


def plot_curves(spec: Spec, scale: str, runs_dir: Path, seeds: Sequence[int], out: Path) -> Path | None:
    """One panel per claimed metric: each row's mean over its completed seeds per round,
    min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = spec.table_metrics(scale)
    rows = spec.rows_for(scale)
    cols = min(2, len(metrics))  # two panels a row: four side by side are too small to read
    rows_n = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(7 * cols, 4.5 * rows_n), squeeze=False)
    for ax in axes.flat[len(metrics) :]:
        ax.axis("off")
    drawn = False
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for r in rows:
            curves = []
            key = r.metric_prefix + metric
            for s in seeds:
                st = read_run(runs_dir / run_name(r.source, s))
                if st.status != "completed":  # as in the tables: a diverged run is no curve
                    continue
                c = {int(x["round"]): float(x[key]) for x in st.records
                     if x.get(key) is not None and not x.get("diverged")}  # fmt: skip
                if c:
                    curves.append(c)
            if not curves:
                continue
            rounds = sorted(set.intersection(*(set(c) for c in curves)))
            if not rounds:
                continue
            ys = [[c[t] for c in curves] for t in rounds]
            ax.plot(rounds, [sum(y) / len(y) for y in ys], label=f"{r.label} (n={len(curves)})")
            ax.fill_between(rounds, [min(y) for y in ys], [max(y) for y in ys], alpha=0.15)
            drawn = True
        ax.set_xlabel("round")
        ax.set_ylabel(metric)
        ax.set_title(f"{spec.name} ({scale}): {metric}")
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7, loc="best")
    if not drawn:
        plt.close(fig)
        return None
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
