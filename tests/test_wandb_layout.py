"""What a researcher reads in W&B: a sweep over a method key names each run by its value
(run name, job type, `variant`), every number sits once under its section, and
`fl-lightning sync` finds an experiment's offline runs (no key here: it says so, uploads nothing)."""

from __future__ import annotations

import json

import pytest

from fl_lightning.cli.main import main
from fl_lightning.cli.sync import offline_runs
from fl_lightning.tracking.loggers import WANDB_SECTIONS

from .test_compare import TINY
from .wandb_files import read_finished_run

#: what W&B adds to every history row by itself
W_AND_B_OWN = {"_step", "_runtime", "_timestamp", "round"}


@pytest.mark.slow  # two W&B runs: 15 s at load 7, 38 s at load 10 on 2 cores
def test_sweep_over_method_tau_names_runs_by_tau_with_sectioned_metrics(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no key in ~/.netrc either
    out = tmp_path / "runs"
    args = ["sweep", "method=fedlc", "method.tau=0.1,0.5", *TINY, "logger=wandb", "logger.mode=offline"]
    assert main([*args, f"output_dir={out}", "experiment=taus", "--no-plots"]) == 0, capsys.readouterr()
    exp = out / "taus"
    seen = set()
    for run_dir in sorted(p for p in exp.iterdir() if (p / "summary.json").is_file()):
        summary = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
        logged = read_finished_run(path)
        run, config = logged["run"], logged["config"]
        tau = config["method.tau"]
        variant = f"fedlc tau={tau}"
        seen.add(tau)
        assert summary["variant"] == config["variant"] == run.job_type == variant
        assert run.display_name == f"{variant}-s0" and run.run_group == "taus"
        # each hyperparameter once: the method's as method.<k>, none again as strategy.<k>
        assert not [k for k in config if k.startswith("strategy.") and f"method.{k[9:]}" in config]
        assert config.get("strategy.clients_per_round", 2) == 2 and "strategy.method" not in config
        rows = [h for h in logged["history"] if h["round"] >= 1]
        assert [h["round"] for h in rows] == [r["round"] for r in records] == [1, 2]
        for h, rec in zip(rows, records, strict=True):
            assert {k.split("/")[0] for k in h} - W_AND_B_OWN <= set(WANDB_SECTIONS)
            assert h["train/loss"] == rec["train_loss"] and h["eval/accuracy"] == rec["accuracy"]
            assert h["system/bytes_up"] == rec["bytes_up"] and h["train/clients"] == rec["clients"]
            assert not [k for k in h if k.endswith("train_loss")]  # once, as train/loss
        assert logged["summary"]["eval/final_accuracy"] == summary["final_accuracy"]
        assert "method" not in logged["summary"] and logged["summary"]["status"] == "completed"
        assert {m.glob_name: m.step_metric for m in logged["metrics"] if m.glob_name} == {
            **{f"{s}/*": "round" for s in WANDB_SECTIONS},
            "time/*": "system/virtual_time",
        }
        assert not [k for k in h if k.startswith("time/")]  # no clock (system=): nothing over time
    assert seen == {0.1, 0.5}
    capsys.readouterr()
    assert main(["compare", str(exp), "--by", "variant", "--no-plots"]) == 0
    table = capsys.readouterr().out
    assert "fedlc tau=0.1 " in table and "fedlc tau=0.5 " in table

    # sync: both offline runs found; without a key, one line, nothing uploaded
    found = offline_runs(exp)
    assert len(found) == 2 and all(p.parent.name == "wandb" for p in found)
    assert main(["sync", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no W&B API key" in err[0] and "2 offline runs" in err[0]
    (marked,) = found[0].glob("run-*.wandb")
    marked.with_name(marked.name + ".synced").write_text("")  # what `wandb sync` leaves
    assert offline_runs(exp) == found[1:]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "link").symlink_to(exp)  # never through a link
    assert offline_runs(tmp_path / "other") == [] and offline_runs(tmp_path) == found[1:]
