"""Mean ± std (over seeds, sample std) of final/best client accuracy per variant."""
import json, pathlib, statistics as st, sys
root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedtsp_evidence")
groups = {}
for s in sorted(root.glob("*_s[0-9]/summary.json")):
    d = json.loads(s.read_text()); run = s.parent.name.rsplit("_s", 1)[0]
    recs = [json.loads(l) for l in (s.parent / "metrics.jsonl").read_text().splitlines()]
    groups.setdefault(run, []).append((d["final_accuracy"], d["best_accuracy"], recs[-1]["client_accuracy_mean"],
                                       recs[-1]["client_accuracy_worst10"], d["wall_time_s"], d["seed"]))
f = lambda xs: f"{100*st.mean(xs):.2f} ± {100*st.stdev(xs):.2f}" if len(xs) > 1 else f"{100*xs[0]:.2f}"
print("| variant | seeds | final client acc. | best client acc. | final mean-over-clients | final worst-10% | wall time / run |")
print("|---|---|---|---|---|---|---|")
for run, rows in groups.items():
    cols = list(zip(*rows))
    print(f"| {run} | {','.join(str(s) for s in cols[5])} | {f(cols[0])} | {f(cols[1])} | {f(cols[2])} | {f(cols[3])} | {st.mean(cols[4]):.0f} s |")
