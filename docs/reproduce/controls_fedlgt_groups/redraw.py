"""E4's group controls read again with the blanked test pairs redrawn per seed (issue 55 item 2).

The runs were evaluated on one fixed set of 2,000 test mosaics (416 blanked pairs, rng 0xE4) for
every seed, so the report's seed-to-seed intervals leave test sampling out. This reads each
run's final global model (`checkpoints/round-<rounds>.pt`: the runs' `model_weights.pt` is the
trunk they started from, not their final weights) with the runtime's own global evaluation
(`GlobalEval`, `themed_mosaics.blanked_metrics`):

1. on the fixed test set, which must give the run's logged final values (`metrics.jsonl`);
2. on `themed_mosaics.draw_test(root, d)` for d = 0..DRAWS-1. The primary reading takes run seed
   s on draw s ("redrawn per seed": the two rows of a pair share their draw, each seed its own);
   every draw for every seed shows how far test sampling alone moves the numbers.

The claims' paired differences use the report's statistic (`final`), interval and Holm family
(`tracking.reproduce.paired`, `holm`, `holm_verdict`). Writes `redraw.json` and `redraw.md`
beside this file; a run already in `redraw.json` with the same checkpoint is not evaluated again.
An analysis after the registered runs: exploratory, it re-labels none of their verdicts.

Command (repository root; RUNS: the run directories of the clone that made them):

    RUNS=/work/e4run/docs/reproduce/controls_fedlgt_groups/controls_fedlgt_groups_mini
    python docs/reproduce/controls_fedlgt_groups/redraw.py --runs $RUNS --draws 5
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from fl_lightning.config.saved import load_run_config
from fl_lightning.data import themed_mosaics as tm
from fl_lightning.models.weights import kept_weights
from fl_lightning.runtime import checkpoint
from fl_lightning.runtime.build import Prepared, prepare
from fl_lightning.runtime.steps.clock import WallClock
from fl_lightning.runtime.steps.evaluation import GlobalEval
from fl_lightning.tracking.loggers import read_jsonl
from fl_lightning.tracking.reproduce import Claim, holm, holm_verdict, load_spec, paired, run_name, run_value

HERE = Path(__file__).resolve().parent
SPEC = Path("conf/reproduce/controls_fedlgt_groups.yaml")
SCALE = "mini"
METRICS = ("blank_c_ap", "blank_clothing_ap", "blank_digit_ap", "c_ap")
Values = dict[str, float]


def evaluate(p: Prepared, state: Any, test: tuple[Any, Any, Any] | None = None) -> Values:
    """The run's global evaluation of `state` (in line, one intra-op thread, as the runs'), on
    the fixed test set or on `test` (images, multi-hot, blanked pairs) in its place."""
    if test is not None:
        x, y, blank = test
        p = dataclasses.replace(
            p, dataset=dataclasses.replace(p.dataset, test_x=x, test_y=y, test_blank=blank)
        )
    ge = GlobalEval(p, Path("/nonexistent"), WallClock())
    ge.save_predictions = False  # nothing written anywhere
    try:
        out = ge.now(state)
    finally:
        ge.close()
    return {k: float(out[k]) for k in METRICS}


def _gap(logged: float | None, again: float) -> float:
    return math.nan if logged is None else abs(logged - again)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_run(
    run_dir: Path, draws: dict[int, tuple[Any, Any, Any]], old: dict[str, Any] | None
) -> dict[str, Any]:
    """One run: its logged final values and the same read again on the fixed set (once), and
    each of `draws` not in `old` (the run's earlier reading of the same checkpoint)."""
    cfg = load_run_config(run_dir, [])
    rounds = int(cfg.fl.rounds)
    ckpt = run_dir / "checkpoints" / f"round-{rounds:06d}.json"
    p = prepare(cfg, kept_weights(run_dir, str(cfg.model["weights"])))
    state, _, _ = checkpoint.load(ckpt)
    if int(state.round) != rounds:
        raise SystemExit(f"{ckpt}: round {state.round}, expected {rounds}")
    if old is None:
        records = read_jsonl(run_dir / "metrics.jsonl")
        logged = {k: run_value(records, k, "final") for k in METRICS}
        fixed = evaluate(p, state)
        old = {
            "checkpoint": str(ckpt),
            "checkpoint_sha256": sha256(ckpt.with_suffix(".pt")),
            "logged": logged,
            "fixed": fixed,
            "fixed_equals_logged": all(logged[k] == fixed[k] for k in METRICS),
            "fixed_max_abs_diff": max(_gap(logged[k], fixed[k]) for k in METRICS),
            "draws": {},
        }
    new = {str(d): evaluate(p, state, t) for d, t in draws.items() if str(d) not in old["draws"]}
    return {**old, "draws": {**old["draws"], **new}}


def judge(claims: list[Claim], value: dict[tuple[str, int], Values]) -> list[dict[str, Any]]:
    """The claims as the report judges them (paired t-interval, Holm over the non-exploratory
    ones) on `value[(row, seed)]`; a seed missing in either row drops out of that pair."""

    def of(row: str, metric: str) -> dict[int, float]:
        return {s: v[metric] for (r, s), v in value.items() if r == row}

    judged = [(c, paired(of(c.row, c.metric), of(c.baseline, c.metric), c.direction)) for c in claims]
    adjusted = holm([None if c.exploratory else p.p for c, p in judged])
    return [
        {"id": c.id, "row": c.row, "baseline": c.baseline, "metric": c.metric, "seeds": p.seeds,
         "diffs": p.diffs, "mean": p.mean, "low": p.low, "high": p.high, "verdict": p.verdict,
         "p": p.p, "holm_p": adj, "holm_verdict": holm_verdict(p, adj, c.direction)}
        for (c, p), adj in zip(judged, adjusted, strict=True)
    ]  # fmt: skip


def pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:+.2f}"


def cell(j: dict[str, Any]) -> str:
    holm_p = "–" if j["holm_p"] is None else f"{j['holm_p']:.4f}"
    return f"{pct(j['mean'])} [{pct(j['low'])}, {pct(j['high'])}], Holm p {holm_p}, {j['holm_verdict']}"


def table(out: dict[str, Any]) -> str:
    """redraw.md: per claim, the fixed set against the per-seed redraw and the spread over draws."""
    fixed, per_seed, by_draw = out["claims"]["fixed"], out["claims"]["per_seed"], out["claims"]["by_draw"]
    lines = [
        "# E4's group controls: the blanked test pairs redrawn per seed (exploratory)",
        "",
        "Written by `redraw.py` (its docstring has the command); an analysis after the registered",
        "runs, outside their pre-registration: it re-labels none of the report's verdicts.",
        f"Runs read: {len(out['runs'])} of {out['expected_runs']}"
        + (f" (missing: {', '.join(out['missing'])})" if out["missing"] else "")
        + f"; draws read by every run: {', '.join(map(str, out['complete_draws'])) or 'none'}. AP points, "
        "final round, paired over seeds, 95% t-interval,",
        "Holm over the six claims.",
        "",
        "| claim | metric | fixed test set (the report's) | redrawn per seed (seed s on draw s) "
        "| mean, all seeds on one draw (each complete draw): min / max | Holm verdicts over those draws |",
        "|---|---|---|---|---|---|",
    ]
    for i, c in enumerate(fixed):
        means = [d[i]["mean"] for d in by_draw if d[i]["mean"] is not None] or [None]
        verdicts = ", ".join(
            f"{v}: {n}" for v, n in sorted(Counter(d[i]["holm_verdict"] for d in by_draw).items())
        )
        lines.append(
            f"| {c['id']} ({c['row']} − {c['baseline']}) | {c['metric']} | {cell(c)} | {cell(per_seed[i])} "
            f"| {_range(means)} | {verdicts or '–'} |"
        )
    s = out["spread"]
    draws = ", ".join(map(str, out["complete_draws"])) or "none"
    if s["run_sd"] is not None:
        lines += [
            "",
            f"Test sampling alone (each run on draws {draws}, standard deviation over the draws, "
            "mean over runs):",
            f"blank_c_ap {s['run_sd']['blank_c_ap'] * 100:.2f} points a run; a claim's paired difference "
            f"{s['pair_sd_blank_c_ap'] * 100:.2f} points (blank_c_ap claims, mean over their seed pairs).",
        ]
    lines += [
        "",
        f"Fixed set read again against the logged final values: {out['check']['equal']} of "
        f"{len(out['runs'])} runs equal in every metric ({', '.join(METRICS)}); largest difference "
        f"{out['check']['max_abs_diff']:.3g}.",
        "",
    ]
    return "\n".join(lines)


def _range(xs: list[float | None]) -> str:
    got = [x for x in xs if x is not None]
    return f"{pct(min(got))} / {pct(max(got))}" if got else "–"


def spread(runs: dict[str, Any], claims: list[Claim], seeds: list[int], draws: list[int]) -> dict[str, Any]:
    """How much the draws alone move a run's numbers and a claim's paired difference (standard
    deviation over `draws`, mean over runs or seed pairs); None with fewer than 2 draws."""
    if len(draws) < 2:
        return {"run_sd": None, "pair_sd_blank_c_ap": None}
    keys = [str(d) for d in draws]
    run_sd = {
        k: statistics.mean(statistics.stdev(r["draws"][d][k] for d in keys) for r in runs.values())
        for k in METRICS
    }
    pair_sds = []
    for c in claims:
        if c.metric != "blank_c_ap":
            continue
        for s in seeds:
            a, b = runs.get(run_name(c.row, s)), runs.get(run_name(c.baseline, s))
            if a and b:
                pair_sds.append(
                    statistics.stdev(a["draws"][d][c.metric] - b["draws"][d][c.metric] for d in keys)
                )
    return {"run_sd": run_sd, "pair_sd_blank_c_ap": statistics.mean(pair_sds)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True, help="the groups experiment's run directories")
    ap.add_argument("--draws", type=int, default=5, help="test draws 0..N-1 (N > every seed)")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--report-only", action="store_true", help="evaluate nothing: the tables of redraw.json")
    ap.add_argument("--primary-only", action="store_true", help="the fixed set and each seed's own draw only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    spec = load_spec(SPEC)
    seeds = list(spec.scales[SCALE].seeds)
    rows = [r.id for r in spec.rows_for(SCALE)]
    claims = spec.claims_for(SCALE)
    if args.draws <= max(seeds):
        raise SystemExit(f"--draws {args.draws}: the per-seed reading needs draws 0..{max(seeds)}")
    json_path = args.out / "redraw.json"
    runs: dict[str, Any] = json.loads(json_path.read_text())["runs"] if json_path.is_file() else {}
    present = {}  # name -> run dir, for the runs with a final checkpoint
    for s in seeds:  # seed-major: a pass stopped early leaves whole seeds
        for row in rows:
            name, run_dir = run_name(row, s), args.runs / run_name(row, s)
            ckpt = run_dir / "checkpoints" / "round-000010.pt"
            if not ckpt.is_file():
                print(f"{name}: no final checkpoint, left out", file=sys.stderr)
                runs.pop(name, None)
                continue
            present[name] = (run_dir, s)
            if name in runs and runs[name]["checkpoint_sha256"] != sha256(ckpt):
                del runs[name]  # another checkpoint under the name: read again
    root = str(load_run_config(next(iter(present.values()))[0], []).data.root)
    test_draws = {d: tm.draw_test(root, d) for d in range(args.draws)}
    # pass 1: the fixed set and the draw of the run's own seed (the primary reading); pass 2:
    # the other draws (test sampling alone)
    for first in () if args.report_only else (True, False):
        for name, (run_dir, s) in present.items():
            want = {s: test_draws[s]} if first else test_draws
            have = runs.get(name, {}).get("draws", {})
            if all(str(d) in have for d in want):
                continue
            t = time.perf_counter()
            r = runs[name] = read_run(run_dir, want, runs.get(name))
            each = " ".join(f"{d}: {v['blank_c_ap']:.4f}" for d, v in sorted(r["draws"].items()))
            same = "= logged" if r["fixed_equals_logged"] else "!= logged"
            print(f"{name}: fixed {same} (max |diff| {r['fixed_max_abs_diff']:.2g}), blank_c_ap fixed "
                  f"{r['fixed']['blank_c_ap']:.4f}, draws {each}  {time.perf_counter() - t:.0f}s",
                  file=sys.stderr, flush=True)  # fmt: skip
            json_path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")  # as it goes
        if args.primary_only:
            break

    def at(which: str, draw: int | None = None) -> dict[tuple[str, int], Values]:
        out = {}
        for row in rows:
            for s in seeds:
                r = runs.get(run_name(row, s))
                if r is not None:
                    d = str(s if draw is not None and draw < 0 else draw)
                    if draw is None or d in r["draws"]:
                        out[(row, s)] = r[which] if draw is None else r["draws"][d]
        return out

    runs = {n: runs[n] for n in present if n in runs}  # a run read before its checkpoint went: out
    missing = [
        run_name(r, s)
        for s in seeds
        for r in rows
        if str(s) not in runs.get(run_name(r, s), {}).get("draws", {})
    ]
    complete = [d for d in range(args.draws) if all(str(d) in r["draws"] for r in runs.values())]
    out = {
        "what": "E4's group controls, the blanked test pairs redrawn per seed (exploratory; redraw.py)",
        "draws": args.draws,
        "complete_draws": complete,
        "expected_runs": len(rows) * len(seeds),
        "missing": missing,
        "check": {
            "equal": sum(r["fixed_equals_logged"] for r in runs.values()),
            "max_abs_diff": max(r["fixed_max_abs_diff"] for r in runs.values()),
        },
        "claims": {
            "logged": judge(claims, at("logged")),
            "fixed": judge(claims, at("fixed")),
            "per_seed": judge(claims, at("draws", -1)),
            "by_draw": [judge(claims, at("draws", d)) for d in complete],
        },
        "spread": spread(runs, claims, seeds, complete),
        "runs": runs,
    }
    json_path.write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "redraw.md").write_text(table(out))
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
