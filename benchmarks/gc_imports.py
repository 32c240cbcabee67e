"""A client worker's imports with the cyclic collector as it comes against `import_heavy`'s
(paused while they run, their objects frozen after): CPU seconds, fresh interpreters,
alternating (issues 52 and 57: every Ray worker, CLI run and test process pays these imports).

Each rep starts one interpreter per mode that imports what `ClientActor.__init__` imports
(torchmetrics lean, torch, `fl_lightning.runtime.host`), then makes a round's worth of garbage
and runs one full collection (what a run's collections then scan).

Run: `python benchmarks/gc_imports.py --out benchmarks/results/gc_imports.json [--reps 5]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_CHILD = textwrap.dedent(
    """
    import gc, json, sys, time
    c0 = time.process_time()
    from fl_lightning.lean_imports import install
    install()
    modules = ("torch", "fl_lightning.runtime.host")
    if sys.argv[1] == "import_heavy":
        from fl_lightning.heavy_imports import import_heavy
        import_heavy(*modules)
    else:
        import importlib
        for m in modules:
            importlib.import_module(m)
    c1 = time.process_time()
    import torch
    garbage = [torch.nn.Linear(8, 8) for _ in range(2000)]  # a round's worth of short-lived objects
    del garbage
    c2 = time.process_time()
    gc.collect()
    c3 = time.process_time()
    print(json.dumps({"imports_cpu_s": c1 - c0, "full_collect_cpu_s": c3 - c2,
                      "tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}))
    """
)
MODES = ("as_is", "import_heavy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    runs = []
    for rep in range(args.reps):
        for mode in MODES if rep % 2 == 0 else MODES[::-1]:  # alternating: a load change hits both
            r = subprocess.run(
                [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, env=env, check=True
            )
            runs.append({"rep": rep, "mode": mode, **json.loads(r.stdout.strip().splitlines()[-1])})
            print(json.dumps(runs[-1]))
    summary = {
        mode: {
            k: round(statistics.median(r[k] for r in runs if r["mode"] == mode), 3)
            for k in ("imports_cpu_s", "full_collect_cpu_s")
        }
        for mode in MODES
    }
    doc = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_end": os.getloadavg()},
        "python": sys.version.split()[0],
        "reps": args.reps,
        "median": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
