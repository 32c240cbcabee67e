"""The method author's side of the engine (issue 52, item 5): checks that need the built model
run before the run directory exists (`MethodConfig.check_model`); refusals carry what they
need as data (`ConfigError.needs`, which `fl-lightning list` shows without parsing); the
objective gets only the config fields its `__init__` takes; the strategy's sampling is one
value given at construction; `bytes_down` counts what a payload carries; `fl_lightning.api`
is all a method file imports."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fl_lightning.cli.listing import method_needs
from fl_lightning.cli.main import main
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import ClientUpdate, tensor_nbytes
from fl_lightning.core.sampling import Sampling
from fl_lightning.core.strategy import FedAvgStrategy, MethodConfig, TaskInfo, round_rng
from fl_lightning.data.registry import load_dataset
from fl_lightning.methods import METHODS
from fl_lightning.runtime.host import build_objective
from fl_lightning.testing import Toy, loop, toy_spec, two_rounds

from .conftest import small

REPO = Path(__file__).resolve().parents[1]


# --- check_model: before the run directory -------------------------------------------------
def test_a_model_dependent_refusal_writes_nothing_and_says_one_line(tmp_path, capsys):
    """FedBN on a CNN without batch norm: refused once the driver's model is built, before the
    run directory, Ray or any file of the run: exit 2, one line, the output folder empty."""
    out = tmp_path / "runs"
    args = small(out, "method=fedbn", "model=cnn", "data.client_test_fraction=0.25", "runtime=serial")
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("fl-lightning: error: fedbn needs a model with batch norm"), err
    assert not out.exists() or not any(out.iterdir())  # no run directory, no config.yaml, no .lock


class _NoHead(nn.Module):
    """A backbone whose classifier is no Linear `head` (CReFF, τ-norm refuse it)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Linear(64, 8)
        self.head = nn.Sequential(nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.flatten(1)))


REFUSED = [
    ("fedbn", nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), "fedbn needs a model with batch norm"),
    ("creff", _NoHead(), "creff needs a model whose classifier is a Linear `head`"),
    ("taunorm", _NoHead(), "taunorm needs a model whose head has a linear classifier layer"),
    ("fedlgt", Toy(), "fedlgt / fedctran need a C-Tran model"),
    ("fedctran", Toy(), "fedlgt / fedctran need a C-Tran model"),
]


@pytest.mark.parametrize("name,model,message", REFUSED, ids=[r[0] for r in REFUSED])
def test_each_model_dependent_refusal_is_the_configs_check_model(name, model, message):
    """The refusals that objectives and `init_state` raised (so after the run directory, for
    CReFF's) are the configs' `check_model`, which accepts the model the method needs."""
    config = METHODS.config(name)()
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.check_model(model, TaskInfo(num_classes=10, multilabel=name in ("fedlgt", "fedctran")))
    if name in ("fedbn", "creff", "taunorm"):
        config.check_model(Toy(), TaskInfo(num_classes=10))  # batch norm, a Linear head: accepted


# --- refusals as data ------------------------------------------------------------------------
def test_list_shows_the_settings_a_refusal_carries_not_its_text(monkeypatch):
    """`fl-lightning list` shows a refusal's `needs` as they are; a message with brackets in it
    is never parsed (the old regex took its closing bracket into the setting)."""
    assert method_needs("feddf") == ["data.server_subset=N"]  # the package's, at their defaults
    assert method_needs("clip2fl") == ["data.train_subset=55000 or less"]
    feddf = METHODS.config("feddf")

    def bracketed(self: Any, run: Any) -> None:
        raise ConfigError(
            f"feddf splits [1, fl.num_clients={run.fl.num_clients}] in two; set fl.num_clients=20 or more",
            needs=("fl.num_clients=20 or more",),
        )

    monkeypatch.setattr(feddf, "check", bracketed)
    assert method_needs("feddf") == ["fl.num_clients=20 or more"]

    def wordy(self: Any, run: Any) -> None:  # no needs: its first clause, as written
        raise ConfigError(f"feddf wants [1, fl.num_clients={run.fl.num_clients}]; more text")

    monkeypatch.setattr(feddf, "check", wordy)
    assert method_needs("feddf") == ["feddf wants [1, fl.num_clients=10]"]  # the default 10 clients


def test_needs_survive_pickling():
    """A refusal raised in a worker reaches the driver with its needs."""
    import pickle

    e = pickle.loads(pickle.dumps(ConfigError("refused", needs=("model=cnn_bn",))))
    assert (str(e), e.needs) == ("refused", ("model=cnn_bn",))


# --- objective_kwargs: only what the objective takes ---------------------------------------
@dataclass
class _ServerKeysConfig(MethodConfig):
    mu: float = 0.25  # the objective's
    concurrency: int = 4  # the server's (FedBuff's): not an argument of the objective


def _objective_classes() -> tuple[type, type]:
    from fl_lightning.core.objective import ClientObjective

    class MuObjective(ClientObjective[Any]):
        def __init__(self, model: nn.Module, mu: float = 0.0, **kwargs: Any) -> None:
            super().__init__(model, **kwargs)  # lr, momentum, ...: ClientObjective's
            self.mu = mu

    class ServerKeys(FedAvgStrategy[_ServerKeysConfig]):
        objective_cls = MuObjective

    return MuObjective, ServerKeys


def test_objective_kwargs_pass_only_the_fields_the_objective_takes(monkeypatch, digits3):
    objective_cls, strategy_cls = _objective_classes()
    _ServerKeysConfig.name = "server_keys_probe"
    monkeypatch.setitem(METHODS._configs, "server_keys_probe", _ServerKeysConfig)
    monkeypatch.setitem(METHODS._strategies, _ServerKeysConfig, strategy_cls)
    strategy = strategy_cls(_ServerKeysConfig(), 3, 2, seed=0)
    assert strategy.objective_kwargs() == {"mu": 0.25}  # not `concurrency`
    obj = build_objective(toy_spec("server_keys_probe", strategy.objective_kwargs(), {}))
    assert isinstance(obj, objective_cls) and obj.mu == 0.25
    # the whole loop too: two rounds train
    r = loop("server_keys_probe", digits3)
    assert [s.round for s in r.states] == [1, 2]


# --- sampling: one value at construction ---------------------------------------------------
def test_the_strategy_gets_its_sampling_at_construction():
    cls = METHODS.get("fedavg")
    weights = (0.5, 0.25, 0.125, 0.125)
    s = cls(cls.config_cls(), 4, 2, seed=0, sampling=Sampling((1, 3), weights, local_bn=True))
    assert s.participation == (1, 3) and s.personalised and s.primary_metric() == "client_accuracy"
    assert s.sample_weights is not None and s.sample_weights.tolist() == list(weights)
    assert s.summary()["participation"] == [1, 3] and s.summary()["sampling"] == "size"
    # the draw: the participation first, then the clients by weight, from the round's stream
    rng = round_rng(0, 1)
    k = int(rng.integers(1, 4))
    want = sorted(int(c) for c in rng.choice(4, size=k, replace=False, p=np.asarray(weights)))
    assert s.sample_clients(1, round_rng(0, 1)) == want
    plain = cls(cls.config_cls(), 4, 2, seed=0)
    assert (plain.participation, plain.sample_weights, plain.personalised) == (None, None, False)


def test_build_gives_the_sampling_to_the_constructor_and_sets_nothing_after():
    """`runtime/build.py` constructs the strategy with its `Sampling`; no attribute of the
    strategy is assigned after `__init__` (`strategy.<x> = ...`)."""
    tree = ast.parse((REPO / "fl_lightning" / "runtime" / "build.py").read_text())
    poked = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "strategy"
    ]
    assert poked == []


# --- bytes_down: the payloads' tensors too -------------------------------------------------
@pytest.fixture(scope="module")
def digits3():
    from fl_lightning.testing import three_clients

    return three_clients()


@pytest.fixture(scope="module")
def digits3_tested():
    """The three clients, each with a test split of its own (disjoint from every shard)."""
    ds = load_dataset("digits", "")
    y, pool, held = ds.train_y, np.arange(0, 900), np.arange(900, len(ds.train_y))
    rules = [lambda v: v < 6, lambda v: v >= 3, lambda v: v % 2 == 1]
    train = {c: pool[rules[c](y[pool])][: (70, 50, 40)[c]] for c in range(3)}
    test = {c: held[rules[c](y[held])][:30] for c in range(3)}
    return ds, train, test


def test_bytes_down_counts_the_tensors_a_payload_carries(digits3_tested):
    """FedAMP sends each client its own cloud model in the payload (the broadcast carries no
    weights): bytes_down is the broadcast to every client plus every payload's tensors."""
    r = loop("fedamp", digits3_tested)
    for plan, record in zip(r.plans, r.records, strict=True):
        clouds = [tensor_nbytes(p) for p in plan.payloads]
        assert all(c > 0 for c in clouds)  # each a whole model's weights
        assert record.bytes_down == plan.broadcast.nbytes() * len(plan.payloads) + sum(clouds)
        ups = r.updates[plan.round - 1]
        assert record.bytes_up == sum(ClientUpdate.upload_nbytes(u) for u in ups)


# --- the import facade -----------------------------------------------------------------------
def test_a_method_file_needs_only_the_api_facade():
    """`fl_lightning.api` re-exports what a method file imports; each name is the one its home
    module defines (one object, not a copy), and importing it starts neither Ray nor W&B."""
    import subprocess
    import sys

    import fl_lightning.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    from fl_lightning.core.strategy import Strategy

    assert api.Strategy is Strategy and api.METHODS is METHODS and api.ConfigError is ConfigError
    code = "import sys, fl_lightning.api; print(sorted(m for m in ('ray', 'wandb') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_the_docs_write_a_method_example_imports_the_facade_alone():
    """docs/architecture.md's ProxM imports from `fl_lightning.api` (and the standard library,
    torch), nothing else of the package."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split('"""ProxM: FedProx')[1].split("```")[0]
    ours = sorted({line.split()[1] for line in block.splitlines() if line.startswith("from fl_lightning")})
    assert ours == ["fl_lightning.api"]


# --- the testing kit runs the run's loop -------------------------------------------------------
def test_the_kit_runs_the_runs_own_loop_with_any_model_and_sampler(digits3):
    """`loop` is `run_rounds` on a serial executor: a sampler of the test's own draws the clients,
    a model other than Toy trains, `state.round` is set, the global evaluation runs; with one
    client in round 2, FedAvg's new global model is that client's, bit for bit."""
    draws = {1: [0, 1, 2], 2: [1]}
    r = loop("fedavg", digits3, "mlp", lambda rnd, rng: draws[rnd])
    assert [p.client_ids for p in r.plans] == [[0, 1, 2], [1]]
    assert [s.round for s in r.states] == [1, 2] and r.initial.round == 0
    assert [[u.client_id for u in ups] for ups in r.updates] == [[0, 1, 2], [1]]
    assert all("accuracy" in rec.evaluation for rec in r.records)  # the driver evaluated each round
    assert set(r.init) == set(r.objective.model.state_dict()) != set(Toy().state_dict())  # the MLP
    only = r.updates[1][0].params
    assert all(torch.equal(r.states[1].global_params[k], only[k]) for k in only)
    # two_rounds: the same loop, FedAvg's own draw (3 clients, 2 a round)
    init, plans, states, _ = two_rounds("fedavg", digits3)
    assert [p.client_ids for p in plans] == [[0, 1], [0, 2]] and [s.round for s in states] == [1, 2]
