"""A run's config.yaml is what ran: every choice the run made where the config left it open
(`auto`, null, `text: none`) is written as made, and a new run from that file
(`fl-lightning run --from <run dir>`) repeats the first one's numbers exactly (same machine)."""

import json
import os

import yaml

from fl_lightning.cli.main import main
from fl_lightning.config import compose, load_run_config, rerun_config

from .conftest import small

#: FedGLCL with every choice left open: the text encoder (`text=none`: it falls back to MiniLM),
#: the projector (`auto`: linear on the BN-free cnn), the run id, the placement, the devices
LEFT_OPEN = ["method=fedglcl", "text=none", "model=cnn", "runtime=serial", "fl.num_clients=3",
             "data.train_subset=900", "data.test_subset=200", "experiment=saved"]  # fmt: skip


def _run_dir(root):
    (run_dir,) = (root / "saved").iterdir()
    return run_dir


def _numbers(run_dir):
    """Each round's line without its timings and memory (which differ between any two runs)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "time" not in k and not k.startswith("driver_")} for r in lines]


def test_config_yaml_holds_what_ran_and_a_run_from_it_repeats_the_numbers(tmp_path, data_root, capsys):
    first, again = tmp_path / "first", tmp_path / "again"
    assert compose(small(first, *LEFT_OPEN)).method.projector == "auto"  # given
    assert main(["run", "--quiet", *small(first, *LEFT_OPEN)]) == 0
    run_dir = _run_dir(first)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    from fl_lightning.text.encoders import minilm_path

    # trained with MiniLM, recorded so, with the files it read (`path: null` names none)
    assert saved["text"] == {"name": "minilm", "path": str(minilm_path())}
    assert saved["data"]["root"] == os.path.expanduser(data_root)  # the folder read, not `~/...`
    assert saved["method"]["projector"] == "linear"  # auto on a backbone without batch norm
    assert saved["run_id"] == run_dir.name
    assert saved["runtime"]["placement"] in ("per_client", "pool")
    assert saved["runtime"]["accelerator"] == "cpu" and saved["eval"]["device"] == "cpu"
    assert saved["logger"]["group"] == "saved"  # the experiment, which W&B groups by
    built = {"name": "cnn", "channels": [8, 16], "hidden": 64, "neck": "relu", "weights": None}  # small()'s
    assert saved["model"] == built  # as built
    assert saved["logger"]["mode"] == "auto"  # the one `auto` left: logger=none, no W&B to decide on
    assert "auto" not in (run_dir / "config.yaml").read_text().replace("mode: auto", "")

    # the same run again from the file alone: a new run id, the same numbers bit for bit
    assert main(["run", "--quiet", "--from", str(run_dir), f"output_dir={again}"]) == 0
    rerun = _run_dir(again)
    assert rerun.name != run_dir.name
    assert _numbers(rerun) == _numbers(run_dir) and len(_numbers(run_dir)) == 2
    twice = yaml.safe_load((rerun / "config.yaml").read_text())
    assert {**twice, "run_id": None, "output_dir": None} == {**saved, "run_id": None, "output_dir": None}
    capsys.readouterr()
    # the variant (W&B's job type) as used; a rerun that changes a setting is labelled anew
    assert (
        saved["variant"]
        == saved["method"]["name"]
        == json.loads((run_dir / "summary.json").read_text())["variant"]
    )
    assert rerun_config(run_dir, ["seed=4"]).variant == saved["variant"]
    assert rerun_config(run_dir, ["optim.lr=0.5"]).variant is None

    # a resume decides the machine's parts again (the run may have moved), keeps the rest
    resumed = load_run_config(run_dir, ["fl.rounds=3"])
    assert (resumed.runtime.placement, resumed.runtime.accelerator, resumed.eval.device) == ("auto",) * 3
    assert (resumed.method.projector, resumed.text["name"], resumed.fl.rounds) == ("linear", "minilm", 3)
    assert load_run_config(run_dir, ["runtime.placement=pool"]).runtime.placement == "pool"


def test_ctran_records_pretrained_only_where_its_trunk_loaded_imagenet_weights():
    """FedLGT's C-Tran: `model.pretrained: true` is read by the efficientnet_lite0 trunk alone;
    config.yaml records false for a trunk that loaded none (`resolved_config`)."""
    from fl_lightning.models.ctran import pretrained_loaded

    assert not pretrained_loaded({"trunk": "cnn", "pretrained": True})
    assert not pretrained_loaded({"trunk": "tiles", "pretrained": True})
    assert pretrained_loaded({"trunk": "efficientnet_lite0", "pretrained": True})
    assert not pretrained_loaded({"trunk": "efficientnet_lite0", "pretrained": False})


def test_from_takes_values_not_groups_and_needs_a_run(tmp_path, capsys):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"seed": 1}))
    for args, message in [
        (["--from", str(tmp_path / "nope")], "--from"),
        (["--from", str(run_dir)], "is not an fl_lightning run config"),
        (["--from", str(run_dir), "method=fedprox"], "only key=value (groups and presets are the file's)"),
        (["--from", str(run_dir), "+experiment=demo"], "only key=value"),
    ]:
        assert main(["run", *args, f"output_dir={tmp_path / 'out'}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_experiment_naming_a_preset_without_plus_gets_a_hint(capsys, monkeypatch):
    from fl_lightning.config import composition

    monkeypatch.setattr(composition, "_HINTED", set())  # once per name and process
    assert compose(["experiment=demo"]).experiment == "demo"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "+experiment=demo" in err and "only names the run folder" in err
    compose(["+experiment=demo"])
    compose(["experiment=my_comparison"])  # not a preset's name: nothing to hint
    assert capsys.readouterr().err == ""
