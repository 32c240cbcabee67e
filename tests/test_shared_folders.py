"""Folders and files other people can write (a shared sweep folder, the working directory, a
group-shared data root, runs folders): nothing in them runs code or sends a write elsewhere,
what we write there they can read, and each bad thing is one line (docs/reliability.md,
"Shared folders")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fl_lightning.cli.main import main

from .conftest import small


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fl-lightning: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _plant_module(where: Path, name: str, marker: Path) -> None:
    """`<where>/<name>.py`: importing it creates `marker` (one line per process)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.py").write_text(
        f"import os\nwith open({str(marker)!r}, 'a') as f:\n    f.write(str(os.getpid()) + '\\n')\n"
    )


# --- 1. a sweep folder names no module and no folder elsewhere ------------------------------
def _record(folder: Path, overrides: list[str], runs: list[list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": "fl_lightning.sweep/1", "overrides": overrides, "started": "2026-01-01T00:00:00",
           "runs": [{"run_id": a[-1].split("=", 1)[1], "args": a} for a in runs]}  # fmt: skip
    (folder / "sweep.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("tail", ["methods", "output_dir", "experiment"])
def test_a_recorded_run_of_a_sweep_adds_nothing_to_its_grid_point(tmp_path, capsys, monkeypatch, tail):
    """sweep.json's second run carries `methods=<module>` (imported with no consent), or
    `output_dir=` / `experiment=` elsewhere (written outside the folder: only the first run's
    folder was checked). `sweep --resume`: one line, exit 2, nothing imported or written."""
    runs, elsewhere, marker = tmp_path / "runs", tmp_path / "elsewhere", tmp_path / "imported"
    _plant_module(tmp_path / "site", "sweepmod", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    overrides = ["seed=0,1", *small(runs, "runtime=serial", "fl.rounds=1", "experiment=sw")]
    extra = {
        "methods": ["methods=sweepmod", "method.planted=1"],  # a method key: compose imports
        "output_dir": [f"output_dir={elsewhere}"],
        "experiment": ["experiment=other"],
    }[tail]
    point = overrides[1:]
    planted = ["seed=1", *point, *extra, "run_id=r1"]
    _record(runs / "sw", overrides, [["seed=0", *point, "run_id=r0"], planted])
    assert main(["sweep", "--resume", str(runs / "sw"), "--no-plots"]) == 2
    assert "sweep.json records" in _one_line_error(capsys)
    assert not marker.exists() and not elsewhere.exists() and not (runs / "other").exists()
    assert sorted(p.name for p in (runs / "sw").iterdir()) == ["sweep.json"]


def test_sweep_resume_imports_a_recorded_module_only_when_the_command_line_names_it(
    tmp_path, capsys, monkeypatch
):
    """The grid itself (sweep.json's overrides) names `methods=<module>`: `sweep --resume`
    asks for `methods=<module>` on its command line, as `resume` does for a run directory."""
    runs, marker = tmp_path / "runs", tmp_path / "imported"
    _plant_module(tmp_path / "site", "sweepmod", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    overrides = ["seed=0,1", "methods=sweepmod", "method.planted=1", *small(runs, "experiment=sw")]
    _record(runs / "sw", overrides, [[f"seed={s}", *overrides[1:], f"run_id=r{s}"] for s in (0, 1)])
    assert main(["sweep", "--resume", str(runs / "sw"), "--dry-run"]) == 2
    line = _one_line_error(capsys)
    assert "imports its method from sweepmod" in line and "with methods=sweepmod to allow that" in line
    assert not marker.exists()
    assert main(["sweep", "--resume", str(runs / "sw"), "methods=other", "--dry-run"]) == 2
    assert "cannot change 'methods'" in _one_line_error(capsys) and not marker.exists()
    assert main(["sweep", "--resume", str(runs / "sw"), "fl.rounds=3"]) == 2
    assert "takes no overrides but methods=" in _one_line_error(capsys)
    # consent: the module is imported (it registers no method: that is the next line)
    assert main(["sweep", "--resume", str(runs / "sw"), "methods=sweepmod", "--dry-run"]) == 2
    assert "methods=sweepmod registers no method" in _one_line_error(capsys) and marker.exists()


def test_sweep_children_do_not_import_from_the_working_directory(tmp_path, capsys, monkeypatch):
    """`--parallel` children started as `python -m fl_lightning` put the working directory
    first on sys.path: a `yaml.py` lying where the user runs the sweep ran in each child.
    Here each child stops at once (no dataset under data.root), after importing the config."""
    marker = tmp_path / "imported"
    _plant_module(tmp_path / "cwd", "yaml", marker)
    monkeypatch.chdir(tmp_path / "cwd")
    (tmp_path / "empty").mkdir()
    empty = f"data.root={tmp_path / 'empty'}"
    args = small(tmp_path / "runs", empty, "data.download=false", "runtime=serial")
    assert main(["sweep", "seed=0,1", *args, "--parallel", "2", "--no-plots"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAILED: exit 2: fl-lightning: error: ") == 2, out  # the children ran
    assert "fetch fmnist" in out, out
    assert not marker.exists(), f"a child imported the planted yaml.py ({marker.read_text()!r})"
    assert sys.modules["yaml"].__file__ != str(tmp_path / "cwd" / "yaml.py")
