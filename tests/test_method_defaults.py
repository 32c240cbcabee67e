"""Per-method defaults and the method-specific checks of issue 15.

A method file may carry `optim:` and `fl:` blocks (its paper's or its authors' code's
optimiser and local schedule), applied above config.yaml and below an experiment preset
and the command line, validated like every other key. SCAFFOLD refuses momentum unless
told; FedGLCL's projector is linear | bn | bn_relu (auto: by the backbone).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from fl_lightning.cli.main import main
from fl_lightning.config import (
    compose,
    conf_dir,
    load_run_config,
    method_defaults,
    to_yaml,
    tree,
    validate_registered,
)
from fl_lightning.core.errors import ConfigError
from fl_lightning.methods.fedglcl import FedGLCLConfig, GLCLObjective, projector_kind
from fl_lightning.models import MODELS


@pytest.fixture
def conf(tmp_path, monkeypatch) -> Path:
    """A copy of conf/ to add method files and presets to (FL_LIGHTNING_CONF points to it)."""
    root = tmp_path / "conf"
    shutil.copytree(conf_dir(), root)
    monkeypatch.setenv("FL_LIGHTNING_CONF", str(root))
    return root


def write(path: Path, text: str) -> None:
    path.write_text(text)


# --- the mechanism ------------------------------------------------------------------------
def test_precedence_config_yaml_method_defaults_preset_command_line(conf):
    write(conf / "method" / "toydef.yaml",
          "name: fedavg\noptim:\n  lr: 0.2\n  momentum: 0.5\nfl:\n  local_epochs: 3\n")  # fmt: skip
    write(conf / "experiment" / "pin.yaml", "optim:\n  momentum: 0.7\n")
    base = compose(["method=fedavg"])  # config.yaml alone
    # plain SGD 0.01 (PFLlib's): 0.05 with momentum 0.9 diverged on 2-class shards
    assert (base.optim.lr, base.optim.momentum, base.fl.local_epochs) == (0.01, 0.0, 1)
    cfg = compose(["method=toydef"])  # the method's defaults over config.yaml
    assert (cfg.optim.lr, cfg.optim.momentum, cfg.fl.local_epochs) == (0.2, 0.5, 3)
    assert (cfg.optim.weight_decay, cfg.fl.batch_size) == (base.optim.weight_decay, base.fl.batch_size)
    assert not {"optim", "fl"} & set(tree(cfg)["method"])  # run-level, not method keys
    cfg = compose(["method=toydef", "+experiment=pin"])  # the preset over the method
    assert (cfg.optim.lr, cfg.optim.momentum) == (0.2, 0.7)
    cfg = compose(["method=toydef", "+experiment=pin", "optim.momentum=0.1"])  # the command line over all
    assert cfg.optim.momentum == 0.1
    assert method_defaults("toydef") == {"optim": {"lr": 0.2, "momentum": 0.5}, "fl": {"local_epochs": 3}}


def test_method_group_defaults_below_preset_and_command_line(conf):
    """A method file's `defaults:` picks groups (FedTSP: its HtFE family, MiniLM), recorded in
    the config; an experiment preset or the command line choosing the group wins."""
    tsp = compose(["method=fedtsp"])  # the dataclass fills the method keys
    assert (tsp.model["name"], tsp.text["name"]) == ("htfe_cnn3", "minilm")
    assert "defaults" not in tree(tsp)["method"]
    assert compose(["method=fedtsp", "model=cnn"]).model["name"] == "cnn"
    assert compose(["method=fedglcl"]).text["name"] == "minilm"  # what ran, not `none`
    assert compose(["method=fedavg"]).text["name"] == "none"
    write(conf / "experiment" / "pick.yaml", "defaults:\n  model: cnn_bn\n")
    assert compose(["method=fedtsp", "+experiment=pick"]).model["name"] == "cnn_bn"
    write(conf / "method" / "toybad.yaml", "name: fedavg\ndefaults:\n  method: fedprox\n")
    with pytest.raises(ConfigError, match="toybad.yaml: 'defaults' must map groups"):
        compose(["method=toybad"])


@pytest.mark.parametrize(
    "block,message",
    [
        ("optim:\n  momentun: 0.0\n", "unknown config key 'optim.momentun'"),
        ("fl:\n  local_epoch: 2\n", "unknown config key 'fl.local_epoch'"),
        ("optim:\n  lr: fast\n", "bad value for 'optim.lr'"),
        ("optim: 0.0\n", "'optim' must be a mapping"),
    ],
)
def test_a_typo_in_a_methods_defaults_is_an_error_naming_the_file(conf, block, message):
    write(conf / "method" / "typo.yaml", f"name: fedavg\n{block}")
    with pytest.raises(ConfigError, match="typo.yaml") as err:
        compose(["method=typo"])
    assert message in str(err.value)


def test_a_typo_is_one_line_and_exit_2(conf, tmp_path, capsys):
    write(conf / "method" / "typo.yaml", "name: fedavg\noptim:\n  momentun: 0.0\n")
    assert main(["run", "method=typo", "logger=none", f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown config key 'optim.momentun'" in err
    assert not (tmp_path / "runs").exists()


def test_config_command_shows_the_methods_defaults(capsys):
    assert main(["config", "method=scaffold"]) == 0
    out = capsys.readouterr().out
    assert "momentum: 0.0" in out and "allow_momentum: false" in out


def test_the_papers_defaults():
    """scaffold: plain SGD. fedtsp: the authors' code (SGD lr 0.01, no momentum) and the
    paper's cross-silo schedule (5 local epochs, batch 100), 20 prompt steps. fedglcl: none
    (its paper's optimiser is the benchmark protocol of every method: the presets pin it)."""
    scaffold = compose(["method=scaffold"])
    assert (scaffold.optim.name, scaffold.optim.momentum) == ("sgd", 0.0)
    tsp = compose(["method=fedtsp"])  # the dataclass fills the method keys
    assert (tsp.optim.lr, tsp.optim.momentum, tsp.optim.weight_decay) == (0.01, 0.0, 0.0)
    assert (tsp.fl.local_epochs, tsp.fl.batch_size, tsp.method.server_epochs) == (5, 100, 20)
    assert tsp.method.logit_scale_init < tsp.method.logit_scale_max
    assert compose(["method=fedglcl"]).optim == compose(["method=fedavg"]).optim
    # a preset still means what it meant: its optimiser, whatever the method
    for m in ("fedavg", "fedglcl", "scaffold", "fedtsp"):
        cfg = compose(["+experiment=fedglcl_table2_fmnist", f"method={m}"])
        assert (cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay) == (0.1, 0.9, 1e-5)
        assert (cfg.fl.local_epochs, cfg.fl.batch_size) == (5, 256)


# --- SCAFFOLD -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,message",
    [
        (["optim.momentum=0.9"], "optim.momentum=0.9: option-II control variates assume plain SGD"),
        (["optim.name=adam"], "optim.name=adam: option-II control variates assume plain SGD"),
        (["+experiment=fedglcl_table2_fmnist"], "scaffold with optim.momentum=0.9"),
    ],
)
def test_scaffold_refuses_momentum_in_one_line_before_anything_runs(overrides, message, tmp_path, capsys):
    out = tmp_path / "runs"
    code = main(["run", "method=scaffold", *overrides, "runtime=serial", "logger=none", f"output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert "method.allow_momentum=true" in err
    assert not out.exists()  # nothing written, nothing started


def test_scaffold_runs_out_of_the_box_and_accepts_momentum_when_told():
    validate_registered(compose(["method=scaffold"]))  # its own default: momentum 0
    told = compose(["method=scaffold", "optim.momentum=0.9", "method.allow_momentum=true"])
    validate_registered(told)
    with pytest.raises(ConfigError, match="overestimate the mean gradient"):
        validate_registered(compose(["method=scaffold", "optim.momentum=0.9"]))
    preset = ["+experiment=fedglcl_table2_fmnist", "method=scaffold"]  # the paper's shared momentum 0.9
    validate_registered(compose([*preset, "method.allow_momentum=true"]))


def test_an_older_scaffold_run_with_momentum_can_resume_when_told(tmp_path):
    container = tree(compose(["method=scaffold", "optim.momentum=0.9"]))  # as a run writes it
    del container["method"]["allow_momentum"]  # written before the key existed
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(container))
    resumed = load_run_config(tmp_path, ["method.allow_momentum=true"])
    assert resumed.method.allow_momentum is True and resumed.optim.momentum == 0.9
    validate_registered(resumed)
    with pytest.raises(ConfigError, match="cannot change 'method.name'"):
        load_run_config(tmp_path, ["method.name=fedavg"])
    # the key is SCAFFOLD's to declare (`resumable`): another method's run may not take it
    (tmp_path / "config.yaml").write_text(to_yaml(compose(["method=fedavg"])))
    with pytest.raises(ConfigError) as e:
        load_run_config(tmp_path, ["method.allow_momentum=true"])
    assert str(e.value) == (
        "cannot change 'method.allow_momentum' on resume; "
        "only fl.rounds, runtime.*, logger.*, eval.batch_size and eval.device"
    )


# --- FedGLCL's projector --------------------------------------------------------------------
def has_bn(m: nn.Module) -> bool:
    return any(isinstance(x, nn.modules.batchnorm._BatchNorm) for x in m.modules())


@pytest.mark.parametrize("kind", ["linear", "bn", "bn_relu", "auto"])
def test_fedglcl_projector_variants_build_and_run(kind):
    obj = GLCLObjective(MODELS.get("cnn")(10), text_dim=16, projector=kind)
    head = obj.model.head
    assert isinstance(head[0], nn.Linear) and head[0].out_features == 16
    built = {"auto": "linear"}.get(kind, kind)  # model=cnn has no batch norm: auto is linear
    assert obj.projector_kind == built
    assert [type(m).__name__ for m in head] == {
        "linear": ["Linear"], "bn": ["Linear", "BatchNorm1d"], "bn_relu": ["Linear", "BatchNorm1d", "ReLU"]
    }[built]  # fmt: skip
    assert has_bn(obj.model) == (built != "linear")  # linear on a BN-free CNN: no batch norm anywhere
    obj.class_features = torch.nn.functional.normalize(torch.randn(10, 16), dim=-1)
    logits = obj(torch.randn(4, 1, 28, 28))
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()


def test_fedglcl_auto_projector_follows_the_backbone_and_final_relu_still_works():
    assert GLCLObjective(MODELS.get("cnn_bn")(10), text_dim=16).projector_kind == "bn_relu"
    assert GLCLObjective(MODELS.get("cnn")(10), text_dim=16).projector_kind == "linear"
    # final_relu (an older run's config): true = bn_relu, false = bn, whatever the backbone
    assert GLCLObjective(MODELS.get("cnn")(10), text_dim=16, final_relu=True).projector_kind == "bn_relu"
    assert projector_kind("auto", False, backbone_bn=True) == "bn"
    assert projector_kind("bn_relu", True) == "bn_relu"
    with pytest.raises(ConfigError, match="final_relu=true means method.projector=bn_relu"):
        projector_kind("linear", True)
    with pytest.raises(ConfigError, match="is not one of: auto, linear, bn, bn_relu"):
        projector_kind("mlp")
    assert FedGLCLConfig().projector == "auto" and FedGLCLConfig().final_relu is None
    assert compose(["method=fedglcl"]).method.projector == "auto"


# --- the method's dataclass: the one source of its defaults --------------------------------
def test_method_files_only_override_their_dataclass():
    """A key in conf/method/<name>.yaml equal to its dataclass default is a second copy that
    can drift from it (clip2fl's `beta` did: 1 in the file, 3 in the code): refused."""
    from fl_lightning.methods import METHODS, import_methods

    import_methods([])
    repeated = []
    for path in sorted((conf_dir() / "method").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        cls = METHODS.config(doc.get("name", path.stem))
        defaults = {k: v for k, v in dataclasses.asdict(cls()).items()}
        for key, value in doc.items():
            if key in ("name", "defaults", "optim", "fl"):
                continue
            assert key in defaults, f"{path.name}: {key!r} is no field of {cls.__name__}"
            if defaults[key] == value:
                repeated.append(f"{path.name}: {key}")
    assert repeated == []


def test_a_run_records_every_method_key_with_its_dataclass_default(tmp_path, data_root):
    """config.yaml holds the method's full config (FedAdam's file names only the method), so a
    default changed later does not change what `run --from` or a resume of that run does."""
    from fl_lightning.methods.fedadam import FedAdamConfig

    args = ["method=fedadam", "method.server_lr=0.3", "logger=none", "runtime=serial", "fl.rounds=1",
            "fl.num_clients=2", "data.train_subset=200", "data.test_subset=100", "run_id=adam",
            f"data.root={data_root}", f"output_dir={tmp_path}", "eval.clients=false"]  # fmt: skip
    shown = compose(args).method
    assert (shown.server_lr, shown.beta2, shown.tau) == (0.3, FedAdamConfig.beta2, FedAdamConfig.tau)
    assert main(["run", "--quiet", *args]) == 0
    saved = yaml.safe_load((tmp_path / "default" / "adam" / "config.yaml").read_text())["method"]
    assert saved == {"name": "fedadam", **dataclasses.asdict(FedAdamConfig(server_lr=0.3))}


@pytest.mark.parametrize(
    "method, bad, message",
    [
        ("ccvr", "method.virtual_per_class=0", "method.virtual_per_class must be >= 1"),
        ("creff", "method.grad_augment=blur", "method.grad_augment='blur'"),
        ("clip2fl", "method.num_features=0", "method.num_features must be >= 1"),  # CReFF's check
        ("ditto", "method.lam=-1", "method.lam >= 0"),
        ("fedala", "method.eta=0", "fedala needs method.eta > 0"),
        ("fedamp", "method.sigma=0", "method.sigma > 0"),
        ("fedbe", "method.samples=-1 data.server_subset=500", "method.samples must be >= 0"),
        ("fedbe", "method.distill_lr=0 data.server_subset=500", "method.distill_lr must be > 0"),
        ("fedfomo", "method.m=0", "fedfomo needs method.m >= 1"),
        ("feddtr", "method.text=false", "method.prior=true needs method.text=true"),
        ("fedphp", "method.mu=2", "fedphp needs 0 <= method.mu"),
        ("fedrep", "method.head_epochs=0", "method.head_epochs >= 1"),
        ("perfedavg", "method.alpha=-1", "method.alpha > 0"),
        ("pfedme", "method.lam=0", "pfedme needs method.lam > 0"),
        ("fedtsp", "method.direction=sideways", "method.direction='sideways'"),
        ("fedtsp", "method.weighting=median", "method.weighting='median'"),
        ("fedtsp", "method.finetune_after=3", "method.finetune_after (-FT) needs method.share_weights"),
        ("fedglcl", "method.projector=mlp", "is not one of: auto, linear, bn, bn_relu"),
        ("fedglcl", "method.class_embedding=onehot", "method.class_embedding='onehot' is not one of"),
        ("fedglcl", "method.targets=shuffled", "method.targets='shuffled' is not one of: text, permuted"),
        ("fedglcl", "method.targets=uniform method.class_embedding=random", "set only method.targets"),
        ("fedtsp", "method.targets=orthogonal", "add method.tune_prompts=false"),
        ("feddtr", "method.targets=permuted method.text=false method.prior=false", "needs method.text=true"),
        ("clip2fl", "method.targets=none", "method.targets='none' is not one of"),
        ("fedlgt", "method.state_targets=random data=fmnist_multilabel model=ctran", "method.state_targets="),
        (
            "fedlgt",
            "method.targets=permuted method.label_embedding=learned data=fmnist_multilabel model=ctran",
            "needs method.label_embedding=text",
        ),
    ],
)
def test_every_method_check_runs_before_any_data(method, bad, message):
    """The checks of a method's values live in its config's `check`, which `check_method` runs
    (from `validate_registered` and the command line) before the data is looked at: here the
    data root does not exist, so a check left in the strategy's constructor (after the data
    loads) would never be reached."""
    cfg = compose([f"method={method}", *bad.split(), "data.root=/nonexistent/fl_lightning_data"])
    with pytest.raises(ConfigError) as err:
        validate_registered(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)
