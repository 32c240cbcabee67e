"""benchmarks/gpu_check.sh in its dry run: the GPU check's steps on the CPU, tiny, so that the
script a short GPU lease depends on cannot rot. `--no-ray`: the runs that start Ray (runtime=ray
in place of runtime=gpu, cross_device's sequential and batched clients, cold start) cost a Ray
start each, several seconds apiece; the engine's Ray paths have their own tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_dry_run_runs_every_step(tmp_path, data_root):
    out = tmp_path / "check"
    env = {**os.environ, "PYTHON": sys.executable, "FL_LIGHTNING_DATA": data_root}
    argv = ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(out), "--dry-run", "--no-ray"]
    done = subprocess.run(
        [*argv, "--work", str(tmp_path)],  # the runs' folders: the test's own, none left in /tmp
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:] + (out / "log.txt").read_text()[-3000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    steps = doc["steps"]
    assert list(steps) == ["env", "cuda_tests", "e2e", "cross_device", "cold_start", "reproduce_estimate"]
    assert all(s["ok"] for s in steps.values()), steps
    assert steps["env"]["gpus"] == [] and steps["env"]["torch"]  # CUDA hidden in a dry run
    # the suite's CUDA tests were found and collected, and each skipped on the CPU
    cuda = steps["cuda_tests"]
    assert cuda["tests"] >= 3 and cuda["skipped"] == cuda["tests"], cuda
    assert "tests/test_batched.py" in cuda["files"] and "tests/test_metrics.py" in cuda["files"]
    serial = steps["e2e"]["quarter_gpu"]["serial"]
    assert steps["e2e"]["quarter_gpu"]["clients"] == 8 and len(serial["accuracy"]) == 2
    assert all(0.0 <= a <= 1.0 for a in serial["accuracy"]) and serial["exit_code"] == 0
    assert steps["e2e"]["quarter_gpu"]["ray"] == {"skipped": "--no-ray"} and "one_per_gpu" not in steps["e2e"]
    plain = steps["cross_device"]["plain"]
    assert plain["clients_per_s"] > 0 and plain["startup_s"] > 0
    assert json.loads((out / "cross_device.json").read_text())["summary"]["cpu"]["plain"]["runs_ok"] == 1
    assert "skipped" in steps["cold_start"]
    estimate = steps["reproduce_estimate"]
    assert estimate.get("status", "").startswith("not available") or estimate["papers"]
    assert "===== e2e quarter_gpu_serial" in (out / "log.txt").read_text()


@pytest.mark.parametrize("bad", [["--train", "-5"], ["--test", "0"], ["--train", "60001"], ["--test", "x"]])
def test_gpu_prepare_refuses_an_impossible_image_count(tmp_path, bad):
    """`--train -5` was taken: `subset.json` said -5 and 59,995 images were written."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_prepare.py"
    res = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "gpu"), *bad],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and bad[0] in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "gpu").exists()
