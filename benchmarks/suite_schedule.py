"""How xdist's schedulers would lay `make test`'s tests over its workers, from measured durations
(issue 39: the suite's tail). Replays pytest-xdist 3.8's `worksteal` (each worker starts on a
contiguous share of the collection; one that runs low takes half of the longest queue's end)
and `load` (one queue; a worker is topped up by `--maxschedchunk` tests as it runs low) over the
suite's own order (tests/conftest.py: unit lane, long tests, the rest) with each test's wall
time from a `suite_cpu.py` JSON. A replay: tests are taken to last as long side by side as they
did when measured, so it ranks schedules; the suite's real time is `make test`'s.

Run: `python benchmarks/suite_schedule.py benchmarks/results/suite_cpu_8a9e64f.json --out
benchmarks/results/suite_schedule.json [--workers 3]`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIN_PENDING = 2  # xdist's: a worker with fewer queued tests asks for more


def worksteal(dur: list[float], n: int) -> list[float]:
    queues = [list(range(len(dur) * k // n, len(dur) * (k + 1) // n)) for k in range(n)]
    return _replay(dur, queues, lambda k, last: _steal(queues, k))


def _steal(queues: list[list[int]], k: int) -> None:
    if len(queues[k]) < MIN_PENDING:
        victim = max(range(len(queues)), key=lambda j: len(queues[j]))
        m = min(len(queues[victim]) // 2, max(0, len(queues[victim]) - MIN_PENDING))
        if m and victim != k:
            queues[k] += queues[victim][-m:]
            del queues[victim][-m:]


def load(dur: list[float], n: int, chunk: int) -> list[float]:
    pending = list(range(len(dur)))
    first = max(2, min(len(dur) // n // 4, chunk))
    queues = [pending[k * first : (k + 1) * first] for k in range(n)]
    del pending[: n * first]

    def top_up(k: int, last: float) -> None:  # xdist's LoadScheduling.check_schedule
        lo, hi = max(2, len(pending) // n // 4), max(2, len(pending) // n // 2)
        if pending and len(queues[k]) < lo and not (last >= 0.1 and len(queues[k]) >= 2):
            take = min(hi - len(queues[k]), max(2 - len(queues[k]), chunk))
            queues[k] += pending[:take]
            del pending[:take]

    return _replay(dur, queues, top_up)


def _replay(dur: list[float], queues: list[list[int]], after) -> list[float]:
    """Each worker's end time: it runs its queue's front; `after(worker, last)` on each finish."""
    events: list[tuple[float, int, float]] = []
    ends = [0.0] * len(queues)
    for k, q in enumerate(queues):
        if q:
            i = q.pop(0)
            heapq.heappush(events, (dur[i], k, dur[i]))
    while events:
        now, k, last = heapq.heappop(events)
        after(k, last)
        if queues[k]:
            i = queues[k].pop(0)
            heapq.heappush(events, (now + dur[i], k, dur[i]))
        else:
            ends[k] = now
    return ends


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured", type=Path, help="a suite_cpu.py JSON")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=3)
    args = ap.parse_args()
    wall = {t["id"]: t["wall"] for t in json.loads(args.measured.read_text())["tests"]}
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    listed = subprocess.run(collect, cwd=REPO, capture_output=True, text=True).stdout
    order = [line.strip() for line in listed.splitlines() if "::" in line]
    dur = [wall.get(i, 0.0) for i in order]  # a skipped test (not in the measurement): no time
    n = args.workers
    ends = {"worksteal": worksteal(dur, n), **{f"load_chunk{c}": load(dur, n, c) for c in (2, 8, 10**6)}}
    doc = {
        "measured": str(args.measured), "workers": n, "tests": len(order),
        "unmeasured": sum(i not in wall for i in order), "ideal_s": round(sum(dur) / n, 1),
        "replay": {k: {"last_worker_s": round(max(v), 1), "workers_s": [round(x, 1) for x in v]}
                   for k, v in ends.items()},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for k, v in doc["replay"].items():
        print(f"suite_schedule: {k}: last worker ends at {v['last_worker_s']} s (ideal {doc['ideal_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
