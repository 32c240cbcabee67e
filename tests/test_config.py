"""Bad input: one clear line on stderr, a non-zero exit, nothing written, no Ray started."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.config import RootConfig, choices, clients_per_round, compose, conf_dir

BAD = [
    (["fl.roundz=3"], "unknown config key 'fl.roundz'"),
    # every method with a file in conf/method/, in order: a new method file changes no test
    (["method=fedfoo"], "unknown method 'fedfoo'; valid: " + ", ".join(choices("method"))),
    (["data=imagenet9"], "unknown dataset 'imagenet9'; valid:"),
    (["model=resnet999"], "unknown model 'resnet999'; valid: alexnet_bn, clip_lora, clip_prompt, cnn"),
    (["method.mu=0.1"], "unknown config key 'method.mu'"),
    (["model.hiden=3"], "unknown config key 'model.hiden'"),
    (["runtime.precision=64"], "runtime.precision='64' is not one of: 32, bf16-mixed, 16-mixed"),
    (["data.alpha=0"], "data.alpha must be > 0"),
    (["data.alpha=-0.5"], "data.alpha must be > 0"),
    (["fl.num_clients=5", "fl.clients_per_round=6"], "fl.clients_per_round=6 exceeds fl.num_clients=5"),
    (["fl.rounds=abc"], "bad value for 'fl.rounds'"),
    (["runtime.placement=everywhere"], "runtime.placement='everywhere' is not one of"),
    (["data.partition=zipf"], "unknown partition 'zipf'; valid:"),
    (["data.root=/nonexistent/fl_data"], "Fashion-MNIST not found: expected train-images-idx3-ubyte.gz"),
    (["+experiment=nope"], "unknown experiment 'nope'"),
    (["seed"], "bad override 'seed': expected key=value"),
    (
        ["data.augment=[random_crop,flip]"],
        "data.augment: unknown augmentation 'flip'; valid: random_crop, hflip",
    ),
    (["data.augment=[hflip]", "runtime.batched=2"], "runtime.batched trains from precomputed batch indices"),
    (["model.channels=[4]", "runtime=serial"], "model.channels=[4]: expected the two conv widths"),
    (["model.channels=[4,0]", "runtime=serial"], "model.channels=[4, 0]: the widths must be integers >= 1"),
    # the model's smallest input, checked on the meta device before any data loads (serial: no Ray)
    (
        ["model=alexnet_bn", "data.image_size=62", "runtime=serial"],
        "model alexnet_bn cannot take 62x62 images (Given input size: (256x2x2)",
    ),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_config_is_one_line_and_exit_2(overrides, message, tmp_path, capsys):
    code = main(["run", *overrides, f"output_dir={tmp_path}", "logger=none"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fl-lightning: error: "), err
    assert message in err
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_console_script_exit_code_and_single_line(tmp_path):
    """The installed entry point, as a user runs it: no traceback, exit code 2."""
    exe = os.path.join(os.path.dirname(sys.executable), "fl-lightning")
    r = subprocess.run(
        [exe, "run", "data.alpha=-1", f"output_dir={tmp_path}"], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert r.stderr == "fl-lightning: error: data.alpha must be > 0 (got -1.0)\n"


def test_overrides_groups_and_fraction():
    cfg = compose(
        [
            "method=fedavg",
            "data=fmnist",
            "fl.rounds=5",
            "fl.num_clients=10",
            "data.partition=dirichlet",
            "data.alpha=0.3",
            "seed=1",
            "output_dir=/some/dir",
        ]
    )
    assert (cfg.fl.rounds, cfg.fl.num_clients, cfg.data.alpha, cfg.seed) == (5, 10, 0.3, 1)
    assert cfg.output_dir == "/some/dir" and cfg.runtime.executor == "ray"
    assert clients_per_round(cfg) == 10
    assert clients_per_round(compose(["fl.fraction=0.25", "fl.num_clients=10"])) == 2  # round(2.5)
    assert compose(["runtime=serial"]).runtime.executor == "serial"


def test_composes_share_nothing_and_read_an_edited_file_again(tmp_path, monkeypatch):
    """A compose parses each conf file once per text and copies RootConfig's schema built once
    (`composition._parsed`, `schema`): what one compose set never reaches the next (a shared
    schema or parsed file would carry it), and a file edited between two composes in one
    process, to the same size within one clock tick, is read as it is now."""
    from fl_lightning.config.composition import compose_tree

    assert compose_tree(["fl.rounds=7", "method=fedprox", "method.mu=0.3"]).method.mu == 0.3
    plain = compose_tree([])  # FedAvg's: FedProx's key (no file sets it) is not carried over
    assert (plain.fl.rounds, plain.method.name, "mu" in plain.method) == (10, "fedavg", False)
    # the method's own schema, shared with `OmegaConf.merge` (which copies it): its default stays
    default = type(compose(["method=fedprox"]).method)().mu
    assert compose(["method=fedprox", f"method.mu={default + 0.25}"]).method.mu == default + 0.25
    assert compose(["method=fedprox"]).method.mu == default
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    monkeypatch.setenv("FL_LIGHTNING_CONF", str(conf))
    base = conf / "config.yaml"
    text = base.read_text()
    assert "\n  rounds: 10\n" in text and compose([]).fl.rounds == 10
    base.write_text(text.replace("\n  rounds: 10\n", "\n  rounds: 20\n"))  # the same size
    assert compose([]).fl.rounds == 20


def test_list_prints_one_line_per_method_with_its_paper_and_needs(capsys):
    from fl_lightning.methods import METHODS

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(METHODS.names()) <= set(lines)  # one line each
    fedavg = lines["fedavg"]
    assert '"Communication-Efficient Learning of Deep Networks from Decentralized Data"' in fedavg
    assert "AISTATS 2017, arXiv:1602.05629" in fedavg and "[" not in fedavg  # runs on the defaults
    # what each needs beyond the defaults, read off the code
    assert "[clients' own test splits (data.client_test_fraction > 0)]" in lines["ditto"]  # personalised
    assert "multi-label data" in lines["fedlgt"]
    assert "defaults model=ctran data=fmnist_multilabel" in lines["fedlgt"]
    assert "arXiv:2312.07165" in lines["fedlgt"] and "arXiv:2503.13543" in lines["fedtsp"]
    assert "defaults model=htfe_cnn3 text=minilm" in lines["fedtsp"]
    assert "clients' own test splits (data.client_test_fraction > 0)" in lines["fedtsp"]  # by its config
    assert "[data.server_subset=N]" in lines["feddf"]  # refuses to run without it
    assert "data.train_subset=55000 or less" in lines["clip2fl"]  # its teacher's hold-out
    assert lines["local"].split(None, 1)[1].startswith("Local training only")
    # datasets and models, one line each too
    assert "multi-label, 10 classes, offline stand-in" in lines["fmnist_multilabel"]
    assert "heterogeneous family" in lines["htfe_cnn3"] and "dirichlet" in out
    assert "+experiment=<name>" in out


def test_a_method_that_needs_client_test_splits_says_so_before_any_data(tmp_path, capsys, data_root):
    """FedTSP keeps personal models at its defaults: refused by the config checks
    (`validate_registered`, before the data is loaded or a model built); with shared weights it
    runs on the global test set, so the check does not apply."""
    from fl_lightning.config import validate_registered
    from fl_lightning.core.errors import ConfigError

    code = main(["run", "method=fedtsp", "runtime=serial", "logger=none", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and list(tmp_path.iterdir()) == [], err
    assert "fedtsp keeps personal models" in err and "data.client_test_fraction=0.25" in err
    validate_registered(compose(["method=fedtsp", "method.share_weights=true"]))  # no error
    with pytest.raises(ConfigError, match="eval.timing=trained"):
        validate_registered(compose(["eval.timing=trained"]))


def test_resume_refuses_to_change_the_experiment(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    assert main(["resume", str(tmp_path), "data.alpha=9"]) == 2
    assert "cannot change 'data.alpha' on resume" in capsys.readouterr().err
    assert main(["resume", str(tmp_path / "nope")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


PRESETS = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_composes(name):
    """A pinned paper set-up that no longer composes (a renamed key, a removed option) fails here,
    not on a user's GPU machine."""
    cfg = compose([f"+experiment={name}"])
    assert cfg.experiment == name


def test_clip2fl_imagenet_lt_student_neck_is_a_plain_linear_to_the_text_dimension():
    from fl_lightning.models import build_model

    cfg = compose(["+experiment=clip2fl_imagenet_lt"])
    assert cfg.data.name == "imagenet_lt" and cfg.model["neck"] == "linear"
    assert list(cfg.eval.longtail) == [100, 20]
    net = build_model("resnet50", num_classes=1000, in_channels=3, image_size=32, hidden=512, neck="linear")
    assert isinstance(net.neck, torch.nn.Linear) and net.neck.in_features == 2048
    assert net.forward_features(torch.zeros(2, 3, 32, 32)).shape == (2, 512)


def test_a_method_key_its_file_does_not_list_is_taken_from_its_dataclass(tmp_path, capsys):
    """FedAdam's conf file holds only its name (the dataclass holds the defaults): its keys are
    still set from the command line, and a key no field matches is one line, exit 2."""
    cfg = compose(["method=fedadam", "method.server_lr=0.3", "method.tau=0.01"])
    assert (cfg.method.server_lr, cfg.method.tau) == (0.3, 0.01)
    assert (
        main(["run", "method=fedadam", "method.server_lrr=0.3", f"output_dir={tmp_path}", "logger=none"]) == 2
    )
    err = capsys.readouterr().err
    assert err == "fl-lightning: error: unknown config key 'method.server_lrr'\n"
    assert list(tmp_path.iterdir()) == []


def test_the_run_level_yaml_files_list_the_schemas_defaults_and_nothing_else():
    """conf/config.yaml and the default group files (runtime/ray.yaml, logger/wandb.yaml) are the
    annotated listing of `RootConfig`'s defaults: a value that differs from the dataclass would
    make two sources of one default (OptimConfig said lr 0.05 with momentum 0.9 while
    config.yaml said 0.01 without), so a changed default must change both."""
    import yaml
    from omegaconf import OmegaConf

    schema = OmegaConf.to_container(OmegaConf.structured(RootConfig))
    assert isinstance(schema, dict)

    def differing(doc: dict, ref: dict, where: str) -> list[str]:
        out = []
        for key, value in doc.items():
            if key == "defaults":
                continue
            if isinstance(value, dict) and isinstance(ref.get(key), dict):
                out += differing(value, ref[key], f"{where}{key}.")
            elif key not in ref or ref[key] != value:
                out.append(f"{where}{key}: {value!r} (schema: {ref.get(key, 'no such key')!r})")
        return out

    root = conf_dir()
    found = differing(yaml.safe_load((root / "config.yaml").read_text()), schema, "")
    found += differing(
        yaml.safe_load((root / "runtime" / "ray.yaml").read_text()), schema["runtime"], "runtime."
    )
    found += differing(
        yaml.safe_load((root / "logger" / "wandb.yaml").read_text()), schema["logger"], "logger."
    )
    assert found == []
    # and the schema's Literal choices are what `validate` and the errors name
    assert "is not one of: ray, serial" in _error(["runtime.executor=dask"])


def _error(overrides: list[str]) -> str:
    from fl_lightning.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        compose(overrides)
    return str(err.value)


def test_a_run_recorded_under_wandb_shared_mode_resumes(tmp_path):
    """The runner writes the W&B mode it chose into config.yaml; `$WANDB_MODE=shared` makes it
    `shared`, which the schema must accept again on resume (it refused it before)."""
    from fl_lightning.config import load_run_config, to_yaml

    cfg = compose(["logger.mode=offline"])
    cfg.logger.mode = "shared"
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    assert load_run_config(tmp_path, []).logger.mode == "shared"


def test_each_section_checks_itself_and_cross_checks_read_two():
    """A section's `check()` alone refuses its own bad value; a value that is bad only beside
    another section's (eval.clients_sample beyond fl.num_clients) is refused by `cross_check`,
    and compose names it in the same line."""
    from fl_lightning.config import DataConfig, EvalConfig, FLConfig, RuntimeConfig, cross_check
    from fl_lightning.core.errors import ConfigError
    from fl_lightning.core.optim import OptimConfig

    for section, message in [
        (FLConfig(clients_per_round=11), "fl.clients_per_round=11 exceeds fl.num_clients=10"),
        (DataConfig(augment=["hflip", "hflip"]), "data.augment names an augmentation twice"),
        (EvalConfig(threshold=1.0), "eval.threshold must be in (0, 1) (got 1.0)"),
        (RuntimeConfig(num_gpus=-1), "runtime.num_gpus must be >= 0 (got -1)"),
        (OptimConfig(grad_clip=0.0), "optim.grad_clip must be > 0 (got 0.0)"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            section.check()
    run = RootConfig(eval=EvalConfig(clients_sample=20))
    run.eval.check()  # fine alone: the bound is fl's
    with pytest.raises(ConfigError, match=re.escape("eval.clients_sample must be in [1, fl.num_clients=10]")):
        cross_check(run)
    with pytest.raises(ConfigError, match=re.escape("eval.clients_sample must be in [1, fl.num_clients=10]")):
        compose(["eval.clients_sample=20"])


def test_config_refuses_the_values_run_refuses(capsys):
    """`fl-lightning config method.targets=foo` printed the config that `run` then refused."""
    assert main(["config", "method=fedglcl", "method.targets=foo"]) == 2
    err = capsys.readouterr()
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and "method.targets='foo' is not one of" in lines[0] and err.out == ""
    assert main(["config", "method=fedglcl", "method.targets=permuted"]) == 0
    assert "targets: permuted" in capsys.readouterr().out
