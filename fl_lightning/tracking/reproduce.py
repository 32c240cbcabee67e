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
- `claims`: "row beats baseline on metric", with the direction the paper claims and the
  statistic of each run it is judged on, the one the paper reports (`stat`: `final`, the last
  evaluated round, the default; `best`, the best round; `last_k`, the mean of the last 5;
  `time_to_reach`, the virtual time of the first evaluated round whose metric reaches the
  scale's `reach`, for claims of speed on the clients' clock, docs/async.md: a run that never
  reaches it gives no value, and the report says so);
- `metrics` (optional): more per-round metrics to tabulate beside the claimed ones;
- `stat` (the declared statistic, the default of every claim that names none) and `stat_note`
  (where and why it departs from the paper's protocol; the report prints it beside the claims);
- `multiplicity`: `holm` (the report adds Holm-adjusted p-values over the file's claims and the
  verdict each keeps under them) or `none` (each claim stands alone; the report says so);
- `decision` (optional): the decision rule written before the runs, printed in the report;
- a claim's `exploratory` (optional): why it is not confirmatory (added after its runs were
  seen): the report marks it and leaves it out of the multiplicity family.

A scale may `prepare` what its runs need before they start (a pretrained trunk: `fl-lightning
pretrain`; CLIP2FL's teachers: `fl-lightning teacher build`): each step gives the
`fl-lightning` arguments and may name the file it `creates` (relative to the reproduction's
folder), in which case it runs only while that file is missing; a step without one (a
builder that caches, and prints what it built) runs every time. A step may run only
`pretrain ... --out {out}/<file>` or `teacher build` (a claims file may come from someone
else: it writes nothing outside the folder but that command's own cache). `{out}` in a
step, a scale's or a row's overrides stands for the reproduction's folder. A row may also read
its numbers from another row's runs under a metric prefix (`runs_of: clip2fl`,
`metric_prefix: fedavg_head/`: CLIP2FL's own FedAvg head, i.e. FedAvg + distillation) instead
of runs of its own.

A claim's verdict comes from the paired difference over seeds (row minus baseline, the same
seed: the same split and initial weights): its mean and 95% t-interval; **supported** when
the interval excludes 0 in the claimed direction, **contradicted** when it excludes 0 the
other way, **inconclusive** otherwise; **no verdict** with fewer than 3 pairs or with
differences that do not vary over seeds (a zero-width interval), and the report says why. A
diverged run gives no value; its seed drops out of the pairs and the report says so. Every
row shows each statistic; a run no better than chance is flagged from its metrics when the
report is written; the machine is the one the runs' summaries record.

A claims file is read as untrusted input: at most 256 KiB of UTF-8, plain YAML without
anchors or aliases, nested at most 8 levels, every key checked for its type; each mistake is
one ConfigError naming the file and the key.

Pure: reads run directories written by `fl-lightning run`, writes Markdown, JSON and PNGs.
No torch, Ray or W&B.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError
from ..core.safe_json import UnsafeInput, read_bytes
from .chance import chance_note
from .direction import lower_is_better
from .loggers import read_jsonl

SCALES = ("mini", "paper")
STATS = ("final", "best", "last_k")
#: a claim may also be judged on the virtual time its runs take to reach the scale's `reach`
TIME_TO_REACH = "time_to_reach"
CLAIM_STATS = (*STATS, TIME_TO_REACH)
LAST_K = 5  # `last_k`: the mean of the last LAST_K evaluated rounds
#: a metric's majority-class reference, recorded beside it in each round's line
REFERENCES = {"client_accuracy": "client_majority_accuracy"}
#: a claim's verdict needs at least this many seed pairs (two give one degree of freedom: an
#: interval so wide, or with equal differences so narrow, that it says nothing)
MIN_PAIRS = 3
#: `fl-lightning pretrain`'s options a prepare step may pass
PRETRAIN_FLAGS = {"--out", "--holdout-from", "--holdout-size", "--epochs", "--lr", "--batch-size", "--seed"}
#: overrides that decide where a command writes: a prepare step may not set them
WRITES_ELSEWHERE = {"output_dir", "data.root"}
#: overrides only the command line (or the environment) gives: a claims file may not set them
#: (`runtime.address`: the Ray cluster that gets the runs' data and whose replies the driver
#: unpickles)
CHOSEN_BY_THE_USER = {"runtime.address"}
NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")
ROW_KEYS = {"label", "overrides", "by_scale", "scales", "paper", "runs_of", "metric_prefix"}
MULTIPLICITY = ("holm", "none")


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
    stat: str = (
        "final"  # final | best | last_k | time_to_reach: what the paper reports (its tables' protocol)
    )
    direction: str = "higher"  # higher | lower: what the paper claims of row - baseline
    paper_ref: str = ""
    exploratory: str = ""  # why it is not confirmatory (added after its runs): outside the family


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    citation: str
    scales: dict[str, Scale]
    rows: dict[str, Row]
    claims: list[Claim]
    metrics: tuple[str, ...] = ()
    stat: str | None = None  # the declared statistic (None: the file declares none)
    stat_note: str = ""  # where the statistic departs from the paper's protocol, and why
    multiplicity: str | None = None  # holm | none (None: the file declares nothing)
    decision: str = ""  # the decision rule, written before the runs

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


# --- reading a claims file -------------------------------------------------------------------
#: a claims file is a few kilobytes; these bound what a planted one can make us parse
MAX_BYTES = 256 << 10
MAX_DEPTH = 8  # rows.<id>.paper.<metric> is the deepest a claims file goes (4)
SPEC_KEYS = {
    "title",
    "citation",
    "scales",
    "rows",
    "claims",
    "metrics",
    "stat",
    "stat_note",
    "multiplicity",
    "decision",
}
SCALE_KEYS = {"overrides", "seeds", "needs", "reach", "prepare", "requires"}
CLAIM_KEYS = {f.name for f in dataclasses.fields(Claim)}


class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` without anchors and aliases (one alias can stand for a tree that
    doubles with each level: a few hundred bytes expanded for minutes into a MemoryError) and
    nested at most MAX_DEPTH levels (the composer recurses once per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.YAMLError(
                f"anchors and aliases (&, *) are not allowed (line {event.start_mark.line + 1})"
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels (line {event.start_mark.line + 1})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_claims_yaml(path: Path) -> Any:
    """The document in a claims file: a plain UTF-8 file of at most MAX_BYTES, plain YAML."""
    try:
        raw = read_bytes(path, MAX_BYTES)
    except (OSError, UnsafeInput) as e:
        raise ConfigError(f"{path}: cannot read ({e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not a claims file ({str(e).splitlines()[0]})") from None
    finally:
        loader.dispose()


class _Check:
    """Type checks of one claims file; each failure is one ConfigError naming file and key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where} {what}")

    def mapping(self, v: Any, where: str, keys: set[str] | None = None) -> dict[str, Any]:
        if v is None:
            return {}
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise self.fail(where, "must be a mapping (name: value)")
        unknown = sorted(set(v) - keys) if keys is not None else []
        if unknown:
            raise self.fail(
                where, f"has an unknown key {unknown[0]!r} (valid: {', '.join(sorted(keys or ()))})"
            )
        return v

    def items(self, v: Any, where: str) -> list[Any]:
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.fail(where, "must be a list")
        return v

    def text(self, v: Any, where: str, default: str = "") -> str:
        if v is None:
            return default
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise self.fail(where, "must be text")
        return str(v)

    def number(self, v: Any, where: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(where, f"must be a number (got {_short(v)})")
        return float(v)

    def strings(self, v: Any, where: str) -> list[str]:
        xs = self.items(v, where)
        if not all(isinstance(x, str) for x in xs):
            raise self.fail(where, "must be a list of overrides (strings)")
        for x in xs:  # the cluster to join is the command line's or $RAY_ADDRESS's, never a file's
            if x.split("=", 1)[0].lstrip("+") in CHOSEN_BY_THE_USER:
                raise self.fail(where, f"may not set {x.split('=', 1)[0]!r} (give it on the command line)")
        return list(xs)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _prepare_step(chk: _Check, step: Any, where: str) -> Prepare:
    """A prepare step runs one of the commands that make a reproduction's inputs, and writes
    only inside the reproduction's folder (or the cache that command keeps for every run):
    `pretrain ... --out {out}/<file>`, or `teacher build <overrides>`."""
    body = chk.mapping(step, where, {"command", "creates"})
    command = chk.strings(body.get("command"), f"{where}.command")
    creates = None if body.get("creates") is None else chk.text(body["creates"], f"{where}.creates")
    if creates is not None and (not creates or creates.startswith("/") or ".." in Path(creates).parts):
        raise chk.fail(f"{where}.creates", "must stay inside the folder")
    verb = command[:1] if command[:1] == ["pretrain"] else command[:2]
    if verb not in (["pretrain"], ["teacher", "build"]):
        raise chk.fail(f"{where}.command", "may run only `pretrain` or `teacher build`")
    args = command[len(verb) :]
    flags = PRETRAIN_FLAGS if verb == ["pretrain"] else set()
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            if a not in flags or i + 1 == len(args):
                raise chk.fail(
                    f"{where}.command", f"may not pass {a!r} (valid: {', '.join(sorted(flags)) or 'none'})"
                )
            if a == "--out":
                target = args[i + 1]
                rel = target[len("{out}/") :] if target.startswith("{out}/") else None
                if not rel or ".." in Path(rel).parts:
                    raise chk.fail(f"{where}.command", "writes only inside the folder: --out {out}/<file>")
            i += 2
            continue
        key = a.split("=", 1)[0].lstrip("+")
        if "=" not in a or key in WRITES_ELSEWHERE:
            raise chk.fail(f"{where}.command", f"may not set {key!r} (it decides where files are written)"
                           if "=" in a else f"takes key=value overrides (got {a!r})")  # fmt: skip
        i += 1
    if verb == ["pretrain"] and "--out" not in args:
        raise chk.fail(f"{where}.command", "must name its file: --out {out}/<file>")
    return Prepare(command, creates)


def load_spec(path: Path) -> Spec:
    """Read and check a claims file; every mistake is one ConfigError naming the file."""
    name = path.stem
    chk = _Check(path)
    doc = chk.mapping(read_claims_yaml(path), "the file", SPEC_KEYS)
    scales: dict[str, Scale] = {}
    for s, body in chk.mapping(doc.get("scales"), "scales", set(SCALES)).items():
        body = chk.mapping(body, f"scales.{s}", SCALE_KEYS)
        seeds = chk.items(body.get("seeds", [0]), f"scales.{s}.seeds")
        if not seeds or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds):
            raise chk.fail(f"scales.{s}.seeds", "must be a list of non-negative integers")
        if len(set(seeds)) != len(seeds):
            raise chk.fail(f"scales.{s}.seeds", "must be distinct")
        reach = None if body.get("reach") is None else chk.number(body["reach"], f"scales.{s}.reach")
        steps = tuple(
            _prepare_step(chk, step, f"scales.{s}.prepare[{i}]")
            for i, step in enumerate(chk.items(body.get("prepare"), f"scales.{s}.prepare"))
        )
        requires = chk.mapping(body.get("requires"), f"scales.{s}.requires")
        scales[s] = Scale(
            s, chk.strings(body.get("overrides"), f"scales.{s}.overrides"), list(seeds),
            chk.text(body.get("needs"), f"scales.{s}.needs"), reach, steps,
            {k: chk.text(v, f"scales.{s}.requires.{k}") for k, v in requires.items()},
        )  # fmt: skip
    rows: dict[str, Row] = {}
    scalar_papers: dict[str, float] = {}  # `paper: 92.11`: the first claim's metric, once claims are read
    for rid, body in chk.mapping(doc.get("rows"), "rows").items():
        if not NAME.match(rid) or not isinstance(body, dict):
            raise chk.fail(f"row {rid!r}", "must be a lower-case name with a mapping")
        body = chk.mapping(body, f"rows.{rid}", ROW_KEYS)
        by_scale = chk.mapping(body.get("by_scale"), f"rows.{rid}.by_scale", set(SCALES))
        only = tuple(chk.strings(body.get("scales"), f"rows.{rid}.scales") or SCALES)
        if set(only) - set(SCALES):
            raise chk.fail(f"rows.{rid}.scales", f"must be among {', '.join(SCALES)}")
        paper = body.get("paper")
        if isinstance(paper, dict):
            papers = {str(k): chk.number(v, f"rows.{rid}.paper.{k}") for k, v in paper.items()}
        elif paper is not None:
            scalar_papers[rid] = chk.number(paper, f"rows.{rid}.paper")
            papers = {}
        else:
            papers = {}
        runs_of = None if body.get("runs_of") is None else chk.text(body["runs_of"], f"rows.{rid}.runs_of")
        if runs_of is not None and (body.get("overrides") or by_scale):
            raise chk.fail(f"rows.{rid}", f"reads the runs of {runs_of!r}: it takes no overrides")
        rows[rid] = Row(
            rid, chk.text(body.get("label"), f"rows.{rid}.label", rid),
            chk.strings(body.get("overrides"), f"rows.{rid}.overrides"),
            {k: chk.strings(v, f"rows.{rid}.by_scale.{k}") for k, v in by_scale.items()},
            only, papers, runs_of, chk.text(body.get("metric_prefix"), f"rows.{rid}.metric_prefix"),
        )  # fmt: skip
    for row in rows.values():
        src = rows.get(row.runs_of) if row.runs_of is not None else row
        if src is None or src.runs_of is not None or not set(row.scales) <= set(src.scales):
            raise chk.fail(f"rows.{row.id}.runs_of", "must name a row with runs of its own in its scales")
    declared = None if doc.get("stat") is None else chk.text(doc["stat"], "stat")
    if declared is not None and declared not in CLAIM_STATS:
        raise chk.fail("stat", f"must be one of {'|'.join(CLAIM_STATS)} (got {_short(declared)})")
    multiplicity = None if doc.get("multiplicity") is None else chk.text(doc["multiplicity"], "multiplicity")
    if multiplicity is not None and multiplicity not in MULTIPLICITY:
        got = _short(multiplicity)
        raise chk.fail("multiplicity", f"must be one of {'|'.join(MULTIPLICITY)} (got {got})")
    claims: list[Claim] = []
    for i, body in enumerate(chk.items(doc.get("claims"), "claims")):
        body = chk.mapping(body, f"claims[{i}]", CLAIM_KEYS)
        missing = sorted({"id", "text", "row", "baseline", "metric"} - set(body))
        if missing:
            raise chk.fail(f"claims[{i}]", f"needs {missing[0]!r}")
        if declared is not None and body.get("stat") is None:
            body = {**body, "stat": declared}
        claim = Claim(**{k: chk.text(v, f"claims[{i}].{k}") for k, v in body.items()})
        for r in (claim.row, claim.baseline):
            if r not in rows:
                raise chk.fail(f"claim {claim.id!r}", f"names row {r!r}, not in rows")
        if claim.stat not in CLAIM_STATS or claim.direction not in ("higher", "lower"):
            raise chk.fail(f"claim {claim.id!r}:", f"stat in {'|'.join(CLAIM_STATS)}, direction higher|lower")
        if claim.stat == TIME_TO_REACH:
            blind = [n for n, sc in scales.items() if sc.reach is None and {claim.row, claim.baseline} <= {
                r.id for r in rows.values() if n in r.scales}]  # fmt: skip
            if blind:
                raise chk.fail(f"claim {claim.id!r}:", f"stat time_to_reach needs scales.{blind[0]}.reach")
        claims.append(claim)
    if not scales or not rows or not claims:
        raise ConfigError(f"{path}: needs scales, rows and claims")
    for rid, value in scalar_papers.items():
        rows[rid].paper[claims[0].metric] = value
    if len({c.id for c in claims}) != len(claims):
        raise ConfigError(f"{path}: claim ids must be unique")
    metrics = chk.strings(doc.get("metrics"), "metrics")
    return Spec(
        name, chk.text(doc.get("title"), "title", name), chk.text(doc.get("citation"), "citation"),
        scales, rows, claims, tuple(metrics), declared, chk.text(doc.get("stat_note"), "stat_note"),
        multiplicity, chk.text(doc.get("decision"), "decision"),
    )  # fmt: skip


# --- numbers ----------------------------------------------------------------------------
def run_value(
    records: Sequence[dict[str, Any]], metric: str, stat: str, level: float | None = None
) -> float | None:
    """`final`: the metric at the last round that has it; `best`: its optimum over rounds;
    `last_k`: its mean over the last LAST_K rounds that have it (all, if fewer);
    `time_to_reach`: the `virtual_time` of the first round whose metric reaches `level` (None
    if none does)."""
    if stat == TIME_TO_REACH:
        if level is None:
            raise ValueError("time_to_reach needs the level to reach")
        first = first_round_reaching(records, metric, level)
        hit = [r for r in records if first is not None and r["round"] == first]
        return float(hit[0].get("virtual_time", 0.0)) if hit else None
    xs = [float(r[metric]) for r in records if r.get(metric) is not None and not r.get("diverged")]
    if not xs:
        return None
    if stat == "final":
        return xs[-1]
    if stat == "last_k":
        tail = xs[-LAST_K:]
        return sum(tail) / len(tail)
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
    verdict: str  # supported | contradicted | inconclusive | no verdict
    why: str = ""  # why there is no verdict
    p: float | None = None  # two-sided paired t-test p-value (None: no verdict)


def paired(a: dict[int, float], b: dict[int, float], direction: str) -> Paired:
    """Row minus baseline over the seeds both have; the 95% t-interval and the verdict. Fewer
    than MIN_PAIRS pairs, or differences all equal (no spread: the t-interval is a point),
    give no verdict, and say why."""
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    mean, sd = mean_std(diffs)
    if mean is None or sd is None or len(diffs) < MIN_PAIRS:
        why = f"fewer than {MIN_PAIRS} seed pairs"
        return Paired(seeds, diffs, mean, None, None, "no verdict", why)
    if sd <= 1e-9 * max(1.0, max(abs(d) for d in diffs)):  # float noise of equal differences
        return Paired(seeds, diffs, mean, None, None, "no verdict", "the differences do not vary over seeds")
    se = sd / math.sqrt(len(diffs))
    half = t_quantile(len(diffs) - 1) * se
    low, high = mean - half, mean + half
    p = two_sided_p(mean / se, len(diffs) - 1)
    sign = 1.0 if direction == "higher" else -1.0
    if sign * low > 0 and sign * high > 0:
        verdict = "supported"
    elif sign * low < 0 and sign * high < 0:
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    return Paired(seeds, diffs, mean, low, high, verdict, p=p)


def two_sided_p(t: float, df: int) -> float:
    """The two-sided p-value of Student's t statistic `t` with `df` degrees of freedom."""
    from scipy.stats import t as student

    return float(2.0 * student.sf(abs(t), df))


def holm(ps: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values over the family of the non-None `ps` (None stays
    None: a claim with no verdict, or an exploratory one, is not in the family)."""
    idx = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: float(ps[i] or 0.0))
    m = len(idx)
    out: list[float | None] = [None] * len(ps)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * float(ps[i] or 0.0)))
        out[i] = running
    return out


def holm_verdict(p: Paired, adjusted: float | None, direction: str, alpha: float = 0.05) -> str:
    """The verdict under Holm: supported / contradicted when the adjusted p-value is below
    `alpha` (the sign of the mean against the claimed direction), else inconclusive."""
    if adjusted is None or p.mean is None:
        return p.verdict if p.verdict == "no verdict" else "–"
    if adjusted >= alpha:
        return "inconclusive"
    return "supported" if (p.mean > 0) == (direction == "higher") else "contradicted"


# --- reading the runs ---------------------------------------------------------------------
def run_name(row: str, seed: int) -> str:
    return f"{row}_s{seed}"


@dataclass
class RunState:
    status: str  # missing | partial | completed | diverged | failed | interrupted
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    run_dir: Path | None = None


def read_run(run_dir: Path) -> RunState:
    if not run_dir.is_dir():
        return RunState("missing", [], {}, run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    records = read_jsonl(run_dir / "metrics.jsonl")
    status = str(summary.get("status", "partial")) if isinstance(summary, dict) else "partial"
    return RunState(status, records, summary if isinstance(summary, dict) else {}, run_dir)


def chance_of(state: RunState) -> tuple[str, float, float] | None:
    """The chance level (metric, level, margin) a run is judged against: the one its summary
    records (`chance_level`, or `chance` when it was flagged), else, for a single-label run
    from before summaries recorded it, 1/K over its K classes (`partition.json`) with no
    margin: the majority-class level is at least 1/K, so this flags only runs at or below
    what any test set's chance is, never one above it."""
    for key in ("chance_level", "chance"):
        c = state.summary.get(key)
        if isinstance(c, dict):
            try:
                return str(c["metric"]), float(c["level"]), float(c["margin"])
            except (KeyError, TypeError, ValueError):
                pass
    if state.run_dir is None or not any("accuracy" in r for r in state.records):
        return None
    try:
        part = json.loads(read_bytes(state.run_dir / "partition.json", 64 << 20))
        classes = len(part["class_names"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if part.get("multilabel") or classes < 2:
        return None
    return "accuracy", 1.0 / classes, 0.0


def at_chance(state: RunState) -> bool:
    """A completed run whose last evaluated rounds are no better than chance, recomputed
    from its metrics now (`tracking.chance.chance_note`), not read from its summary."""
    return state.status == "completed" and bool(chance_note(state.records, chance_of(state)))


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


def stat_label(stat: str) -> str:
    return {"last_k": f"last {LAST_K}", TIME_TO_REACH: "virtual time (s) to reach"}.get(stat, stat)


def machines(summaries: Sequence[dict[str, Any]]) -> str:
    """Where the runs ran, as their own summaries record it (`machine`): one machine, the
    several it differs between, or that they do not say."""
    told = [str(d["machine"]) for d in summaries if isinstance(d.get("machine"), str)]
    if not summaries:
        return "no runs"
    if not told:
        return "not recorded in the runs' summaries"
    counts: dict[str, int] = {}
    for m in told:
        counts[m] = counts.get(m, 0) + 1
    silent = len(summaries) - len(told)
    tail = f"; {silent} runs do not record it" if silent else ""
    if len(counts) == 1:
        return f"{told[0]} (every run's summary{' that records it' if silent else ''}){tail}"
    parts = ", ".join(f"{m} ({n} runs)" for m, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"the runs differ: {parts}{tail}"


def build_report(
    spec: Spec,
    scale: str,
    runs_dir: Path,
    seeds: Sequence[int],
    command: str,
    extra: Sequence[str] = (),
    differ: dict[str, list[str]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The Markdown report and its numbers, from the run directories under `runs_dir`;
    `extra`: the command line's overrides, which every run got after the scale's; `differ`:
    runs whose config differs from the one planned now (`--report-only`), and how."""
    sc = spec.scales[scale]
    rows = spec.rows_for(scale)
    states = {(r.id, s): read_run(runs_dir / run_name(r.source, s)) for r in rows for s in seeds}
    chance = {k: at_chance(st) for k, st in states.items()}
    metrics = spec.table_metrics(scale)
    folder = str(runs_dir.parent)
    scale_over = [o.replace("{out}", folder) for o in sc.overrides]
    ran = {st.run_dir.name: st.summary for st in states.values() if st.run_dir is not None and st.summary}
    machine_line = machines(list(ran.values()))
    out: dict[str, Any] = {
        "paper": spec.name, "scale": scale, "seeds": list(seeds),
        "overrides": {"scale": scale_over, "command_line": list(extra)},
        "machine": machine_line, "rows": {}, "claims": [], "runs_made_otherwise": dict(differ or {}),
    }  # fmt: skip
    every = " ".join([*scale_over, *extra])
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
        f"Every run: `{every}` (the scale's overrides"
        + (f", then the command line's: `{' '.join(extra)}`" if extra else "; none from the command line")
        + f"), then its row's. Seeds: {', '.join(map(str, seeds))}. Needs: {sc.needs or '-'}. "
        f"Machine: {machine_line}.",
        "",
        "Every row shows three statistics of each run's curve: *final* (the last evaluated round), "
        f"*best* (the best round) and *last {LAST_K}* (the mean of the last {LAST_K} evaluated rounds); "
        "a claim is judged on the statistic it names (the paper's protocol). Verdicts: the paired "
        "difference (row minus baseline, same seed) over the seeds where both finished; 95% "
        "t-interval; *supported* when it excludes 0 in the paper's direction, *contradicted* when "
        f"it excludes 0 the other way, *inconclusive* otherwise; *no verdict* with fewer than {MIN_PAIRS} "
        "pairs or differences that do not vary over seeds (the interval would mean nothing). A run "
        "that diverged gives no value: its seed drops out of the claim's pairs, and the table says "
        "so. Chance is checked from each run's metrics when this report is written.",
        "",
    ]
    if differ:
        lines += [
            "**Runs made with other settings** than the claims file and this command give now "
            "(their `config.yaml`, `key: then -> now`); their numbers are in the tables:",
            "",
            *(f"- `{name}`: {'; '.join(changes)}" for name, changes in sorted(differ.items())),
            "",
        ]
    for metric in metrics:
        pct = not lower_is_better(metric)
        lines += [f"## Rows: `{metric}` (%)" if pct else f"## Rows: `{metric}`", ""]
        head = f"| row | overrides | runs | final | best | last {LAST_K} |"
        sep = "|---|---|---|---|---|---|"
        if sc.reach is not None and pct:
            head += f" first round ≥ {sc.reach * 100:g}% |"
            sep += "---|"
        timed = pct and sc.reach is not None and any(c.stat == TIME_TO_REACH for c in spec.claims_for(scale))
        if timed:
            head += " virtual time (s) to reach it |"
            sep += "---|"
        lines += [head + (" paper |" if pct else ""), sep + ("---|" if pct else "")]
        for r in rows:
            got = {stat: _values(states, r, seeds, metric, stat) for stat in STATS}
            finals = got["final"]
            bad = sum(states[(r.id, s)].status in ("diverged", "failed") for s in seeds)
            flat = sum(chance[(r.id, s)] for s in seeds)
            done = f"{len(finals)}/{len(seeds)}" + (f" ({bad} diverged)" if bad else "")
            done += f" ({flat} no better than chance)" if flat else ""
            how = (
                f"{spec.rows[r.runs_of].label}'s runs, `{r.metric_prefix}*`"
                if r.runs_of is not None
                else "`" + " ".join(r.overrides + r.by_scale.get(scale, [])) + "`"
            )
            cells = [r.label, how, done, *(_pm(list(got[stat].values()), pct) for stat in STATS)]
            if sc.reach is not None and pct:
                firsts = [first_round_reaching(states[(r.id, s)].records, metric, sc.reach) for s in finals]
                hit = [x for x in firsts if x is not None]
                shown = (f"{sum(hit) / len(hit):.1f}" if hit else "never") + f" ({len(hit)}/{len(firsts)})"
                cells.append(shown if firsts else "–")
            if timed:
                times = _values(states, r, seeds, metric, TIME_TO_REACH, sc.reach)
                cells.append(_pm(list(times.values()), False) + f" ({len(times)}/{len(finals)})")
                got[TIME_TO_REACH] = times
            if pct:
                cells.append(f"{r.paper[metric]:g}" if metric in r.paper else "–")
            lines.append("| " + " | ".join(cells) + " |")
            out["rows"].setdefault(r.id, {})[metric] = {
                **got, "diverged": bad, "at_chance": flat,
                "no_better_than_chance": [s for s in seeds if chance[(r.id, s)]],
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
    claims = spec.claims_for(scale)
    judged: list[tuple[Claim, Paired]] = []
    for c in claims:
        ra, rb = spec.rows[c.row], spec.rows[c.baseline]
        p = paired(_values(states, ra, seeds, c.metric, c.stat, sc.reach),
                   _values(states, rb, seeds, c.metric, c.stat, sc.reach), c.direction)  # fmt: skip
        below = "" if c.stat == TIME_TO_REACH else _below_reference(states, rb, p.seeds, c.metric, c.stat)
        if below and p.verdict != "no verdict":
            p = dataclasses.replace(p, verdict="no verdict", why=below, p=None)
        judged.append((c, p))
    adjusted = holm([None if c.exploratory else p.p for c, p in judged])
    lines += _inference_lines(spec, judged)
    lines += ["## Claims", "",
              "| claim | statistic | row − baseline | per seed | mean | 95% interval | other statistics "
              "(mean) | paper | verdict | p | Holm p | verdict under Holm |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (c, p), adj in zip(judged, adjusted, strict=True):
        pct = not lower_is_better(c.metric)
        k = 100.0 if pct and c.stat != TIME_TO_REACH else 1.0
        ra, rb = spec.rows[c.row], spec.rows[c.baseline]
        known = c.metric in ra.paper and c.metric in rb.paper and pct
        paper = f"{ra.paper[c.metric] - rb.paper[c.metric]:+.2f}" if known else "–"
        per_seed = ", ".join(f"{d * k:+.2f}" for d in p.diffs) or "–"
        for r in (ra, rb):  # a seed that drops out because a row diverged is said, not hidden
            gone = [s for s in seeds if states[(r.id, s)].status in ("diverged", "failed")]
            if gone:
                per_seed += f"; {r.label} diverged (seed {', '.join(map(str, gone))})"
            at = [s for s in seeds if chance[(r.id, s)]]
            if at:
                per_seed += f"; {r.label} no better than chance (seed {', '.join(map(str, at))})"
            if c.stat == TIME_TO_REACH:  # a run that never reaches the level has no time: said
                completed = [s for s in seeds if states[(r.id, s)].status == "completed"]
                reached = _values(states, r, seeds, c.metric, c.stat, sc.reach)
                never = [s for s in completed if s not in reached]
                if never:
                    per_seed += f"; {r.label} never reached {sc.reach} (seed {', '.join(map(str, never))})"
        others = []
        for stat in STATS:  # the same pairs on the statistics the claim is not judged on
            if stat == c.stat:
                continue
            o = paired(_values(states, ra, seeds, c.metric, stat), _values(states, rb, seeds, c.metric, stat),
                       "lower" if lower_is_better(c.metric) else "higher")  # fmt: skip
            ko = 100.0 if pct else 1.0
            others.append(f"{stat_label(stat)} {'–' if o.mean is None else f'{o.mean * ko:+.2f}'}")
        interval = "–" if p.low is None or p.high is None else f"[{p.low * k:+.2f}, {p.high * k:+.2f}]"
        mean = "–" if p.mean is None else f"{p.mean * k:+.2f}"
        verdict = f"**{p.verdict}**" + (f" ({p.why})" if p.why else "")
        text = c.text + (f" *(exploratory: {c.exploratory})*" if c.exploratory else "")
        under = "– (exploratory)" if c.exploratory else holm_verdict(p, adj, c.direction)
        lines.append(
            f"| {text} | {stat_label(c.stat)} {c.metric}"
            + (f" {sc.reach:g}" if c.stat == TIME_TO_REACH else "")
            + f" | {ra.label} − {rb.label} | {per_seed} | {mean} | "
            f"{interval} | {', '.join(others)} | {paper}{' (' + c.paper_ref + ')' if c.paper_ref else ''} | "
            f"{verdict} | {_p(p.p)} | {_p(adj)} | {under} |"
        )
        out["claims"].append(
            {"id": c.id, "row": c.row, "baseline": c.baseline, "metric": c.metric, "stat": c.stat,
             "direction": c.direction, "seeds": p.seeds, "diffs": p.diffs, "mean": p.mean,
             "low": p.low, "high": p.high, "verdict": p.verdict, "why": p.why,
             "p": p.p, "holm_p": adj, "holm_verdict": under, "exploratory": c.exploratory,
             "diverged": {r.id: [s for s in seeds if states[(r.id, s)].status in ("diverged", "failed")]
                          for r in (ra, rb)}}
        )  # fmt: skip
    out["multiplicity"] = spec.multiplicity or "none (not declared)"
    out["stat"] = {"declared": spec.stat, "note": spec.stat_note}
    lines += ["", "Curves: `curves.png` (every row, mean over seeds, band min-max).", ""]
    return "\n".join(lines), out


def _p(p: float | None) -> str:
    return "–" if p is None else (f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}")


def _inference_lines(spec: Spec, judged: Sequence[tuple[Claim, Paired]]) -> list[str]:
    """What the claims are judged on, said once above them: the statistic the file declares
    (and where it departs from the paper's), the multiplicity rule, the decision rule."""
    stats = sorted({c.stat for c, _ in judged})
    if spec.stat is not None:
        said = f"declared in the claims file: `{spec.stat}`"
    else:
        said = "not declared in the claims file (each claim's own, default `final`)"
    used = ", ".join(f"`{s}`" for s in stats) or "–"
    lines = ["## Inference", "", f"- **Statistic**: {said}; the claims use {used}."
             + (f" {spec.stat_note}" if spec.stat_note else "")]  # fmt: skip
    family = [c for c, p in judged if not c.exploratory and p.p is not None]
    explo = [c.id for c, _ in judged if c.exploratory]
    if spec.multiplicity == "holm":
        rule = "Holm, declared in the claims file: the verdict under Holm is the one to read"
    elif spec.multiplicity == "none":
        rule = "none, declared in the claims file (each claim at its own 95%); Holm is shown for reference"
    else:
        rule = "not declared in the claims file (each claim at its own 95%); Holm is shown for reference"
    lines.append(
        f"- **Multiplicity**: {rule}. Family: the {len(family)} claims with a verdict"
        + (f" (exploratory, outside it: {', '.join(explo)})" if explo else "")
        + "; Holm's step-down adjusted p-values of the two-sided paired t-tests, verdict at 0.05."
    )
    if spec.decision:
        lines.append(f"- **Decision rule** (written in the claims file before the runs): {spec.decision}")
    return [*lines, ""]


def _below_reference(
    states: dict[tuple[str, int], RunState], row: Row, seeds: Sequence[int], metric: str, stat: str
) -> str:
    """Why a claim against `row` gets no verdict because that baseline scores below its
    majority-class reference (mean over `seeds`): `client_accuracy` against each client's
    majority class (`client_majority_accuracy`), `accuracy` against the test set's majority
    class (the chance level its summary records); "" when it does not, or has no reference."""
    if row.metric_prefix or not seeds:
        return ""
    vals, refs = [], []
    for s in seeds:
        st = states[(row.id, s)]
        v = run_value(st.records, metric, stat)
        if metric in REFERENCES:
            ref = run_value(st.records, REFERENCES[metric], "final")
        else:
            c = chance_of(st)
            ref = c[1] if c is not None and c[0] == metric else None
        if v is None or ref is None:
            return ""
        vals.append(v)
        refs.append(ref)
    v, ref = sum(vals) / len(vals), sum(refs) / len(refs)
    if v >= ref:
        return ""
    return f"baseline below the majority reference: {v * 100:.2f} vs {ref * 100:.2f}"


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
    states: dict[tuple[str, int], RunState],
    row: Row,
    seeds: Sequence[int],
    metric: str,
    stat: str,
    level: float | None = None,
) -> dict[int, float]:
    got: dict[int, float] = {}
    for s in seeds:
        st = states[(row.id, s)]
        ok = st.status == "completed"
        v = run_value(st.records, row.metric_prefix + metric, stat, level) if ok else None
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
    if not metrics:  # a scale with no claims and no metrics of its own: nothing to draw
        return None
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
