"""`import_heavy`: a process's first heavy imports with the cyclic collector paused, then frozen.

Each case runs in a fresh interpreter (the collector's state and `gc.freeze` are the process's):
planted modules record whether the collector ran while they were imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROBE = textwrap.dedent(
    """
    import gc, json, sys
    sys.path.insert(0, sys.argv[1])
    from fl_lightning.heavy_imports import import_heavy
    out = {}
    if sys.argv[2] == "disabled":
        gc.disable()
    import_heavy("json")  # imported already (by this probe): nothing to do, nothing frozen
    out["frozen_after_noop"] = gc.get_freeze_count()
    import_heavy("first_a", "first_b")
    out["first"] = [sys.modules["first_a"].GC_ON, sys.modules["first_b"].GC_ON]
    out["frozen"] = gc.get_freeze_count()
    out["enabled_after_first"] = gc.isenabled()
    import_heavy("second")
    out["second"] = sys.modules["second"].GC_ON
    out["frozen_after_second"] = gc.get_freeze_count()
    out["enabled_after_second"] = gc.isenabled()
    print(json.dumps(out))
    """
)


def _probe(tmp_path: Path, gc_state: str) -> dict:
    for name in ("first_a", "first_b", "second"):
        (tmp_path / f"{name}.py").write_text(
            "import gc\nGC_ON = gc.isenabled()\nTABLE = [[i] for i in range(5000)]\n"
        )
    r = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path), gc_state],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_first_imports_run_with_the_collector_paused_and_are_frozen(tmp_path):
    out = _probe(tmp_path, "enabled")
    assert out["frozen_after_noop"] == 0  # a call with nothing to import changes nothing
    assert out["first"] == [False, False]  # paused while both imported
    assert out["frozen"] > 5000 and out["enabled_after_first"] is True  # their objects frozen, collector back
    # a later call imports as usual: the collector on, nothing more frozen (a sweep's runs' objects never are)
    assert out["second"] is True and out["frozen_after_second"] == out["frozen"]


def test_a_collector_the_process_disabled_stays_disabled(tmp_path):
    out = _probe(tmp_path, "disabled")
    assert out["first"] == [False, False] and out["frozen"] > 5000
    assert out["enabled_after_first"] is False and out["enabled_after_second"] is False


def test_the_suite_runs_with_the_collector_on_and_its_imports_frozen():
    """conftest.py pauses the collector while pytest collects: it must be back on for the tests
    (a suite run without it would keep every cycle its runs make), the collection's imports frozen."""
    import gc

    assert gc.isenabled() and gc.get_freeze_count() > 0
