"""Mean ± std (over seeds, sample std) of final/best client accuracy per variant."""

import json
import pathlib
import statistics as st
import sys
from collections.abc import Sequence


def pm(xs: Sequence[float]) -> str:
    return f"{100 * st.mean(xs):.2f} ± {100 * st.stdev(xs):.2f}" if len(xs) > 1 else f"{100 * xs[0]:.2f}"


root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedtsp_evidence")
groups: dict[str, list[tuple]] = {}
for s in sorted(root.glob("*_s[0-9]/summary.json")):
    d = json.loads(s.read_text())
    run = s.parent.name.rsplit("_s", 1)[0]
    recs = [json.loads(line) for line in (s.parent / "metrics.jsonl").read_text().splitlines()]
    last = recs[-1]
    groups.setdefault(run, []).append(
        (d["final_accuracy"], d["best_accuracy"], last["client_accuracy_mean"],
         last["client_accuracy_worst10"], d["wall_time_s"], d["seed"])
    )  # fmt: skip
print(
    "| variant | seeds | final client acc. | best client acc. | final mean-over-clients "
    "| final worst-10% | wall time / run |"
)
print("|---|---|---|---|---|---|---|")
for run, rows in groups.items():
    cols = list(zip(*rows, strict=True))
    seeds = ",".join(str(s) for s in cols[5])
    print(
        f"| {run} | {seeds} | {pm(cols[0])} | {pm(cols[1])} | {pm(cols[2])} | {pm(cols[3])} "
        f"| {st.mean(cols[4]):.0f} s |"
    )
