"""Methods anywhere: a method registers by being imported (every module of `fl_lightning.methods`,
the modules installed packages name under the entry-point group `fl_lightning.methods`, modules
a run names with `methods=`); a strategy's config, state and broadcast classes come from its
generic arguments; a method that changes only the server passes its clients nothing; a fit
works on a deep copy of its client's state."""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from fl_lightning.core.objective import ClientObjective
from fl_lightning.core.strategy import MethodConfig, OptimConfig, Strategy, TaskInfo, round_rng
from fl_lightning.methods import METHODS, import_methods
from fl_lightning.runtime.host import ClientHost

from .test_methods import Toy, digits, toy_spec  # noqa: F401  (digits: a fixture)

REPO = Path(__file__).resolve().parents[1]


#: a method of an outside package: FedAvg with a server learning rate η on the weights,
#: w ← w + η·(mean − w) (batch-norm statistics and counters take the mean)
FEDEXT = """
import dataclasses
from dataclasses import dataclass

from fl_lightning.core.messages import Broadcast, ServerState
from fl_lightning.core.objective import is_weight
from fl_lightning.core.strategy import MethodConfig, Strategy
from fl_lightning.methods import METHODS


@METHODS.register("fedext")
@dataclass
class FedExtConfig(MethodConfig):
    server_lr: float = 1.0


class FedExt(Strategy[FedExtConfig, ServerState, Broadcast]):
    def aggregate(self, state, updates):
        avg = self.average(state, updates)
        w, mean, lr = state.global_params, avg.global_params, self.config.server_lr
        step = {k: w[k] + lr * (m - w[k]) if is_weight(k, w[k]) else m for k, m in mean.items()}
        return dataclasses.replace(avg, global_params=step)


@METHODS.register("fedext_planted_bug")
@dataclass
class FedExtBugConfig(FedExtConfig):
    pass


class FedExtBug(FedExt):  # the step's sign flipped on the head's bias alone
    config_cls = FedExtBugConfig

    def aggregate(self, state, updates):
        new = super().aggregate(state, updates)
        w = state.global_params
        new.global_params["head.bias"] = 2 * w["head.bias"] - new.global_params["head.bias"]
        return new
"""

#: its golden test, written with `fl_lightning.testing` alone (no file of this repository's tests)
TEST_FEDEXT = """
from fl_lightning.core.objective import is_weight
from fl_lightning.testing import cast, example_mean, match, three_clients, train, twin, two_rounds

ETA = 0.5


def test_fedext_over_two_rounds(name="fedext"):
    data = three_clients()
    init, plans, states, _ = two_rounds(name, data, server_lr=ETA)

    def reference(dt):
        w, rounds = cast(init, dt), []
        for plan in plans:
            models = [(p.client_id, train(data, p.client_id, p.seed, w, dt)) for p in plan.payloads]
            mean = {k: example_mean(models, k, dt) for k in w}
            w = {k: w[k] + ETA * (mean[k] - w[k]) if is_weight(k, w[k]) else mean[k] for k in w}
            rounds.append(w)
        return rounds

    r32, r64 = twin(reference)
    for rnd in (0, 1):
        match(states[rnd].global_params, (r32[rnd], r64[rnd]))
"""

FRESH = """
import sys
import fl_lightning.methods as m
print("where", m.__file__)
print("names", " ".join(m.METHODS.names()))
from fl_lightning.config import compose
print("composed", compose(["method=fedtoyfile", "data=digits"]).method.name)  # no conf/method file
import fl_lightning.testing
print("loaded", " ".join(x for x in ("ray", "wandb") if x in sys.modules))
from extpkg import test_fedext
test_fedext.test_fedext_over_two_rounds()
print("golden", "passed")
try:
    test_fedext.test_fedext_over_two_rounds("fedext_planted_bug")
    print("planted", "passed")
except AssertionError as e:
    print("planted", "failed", str(e).splitlines()[0])
"""


@pytest.fixture(scope="module")
def fresh_names(tmp_path_factory) -> tuple[str, str, str, dict[str, str]]:
    """One fresh interpreter (its stdout: the package's file and the registered names; its
    stderr) over a copy of the package with one more file in `methods/` (nothing else
    edited), and a site folder holding two distributions as pip leaves them (a .dist-info with
    `entry_points.txt`): one names its module under `fl_lightning.methods`, one is broken. The
    same interpreter imports `fl_lightning.testing` (what it loaded then) and runs the outside
    method's golden test, on the method and on a copy with a planted bug."""
    tmp = tmp_path_factory.mktemp("fresh")
    shutil.copytree(REPO / "fl_lightning", tmp / "fl_lightning", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "conf", tmp / "conf")  # as shipped: no conf/method file for the new one
    (tmp / "fl_lightning" / "methods" / "fedtoyfile.py").write_text(
        "from dataclasses import dataclass\n\nfrom ..core.strategy import FedAvgStrategy, MethodConfig\n"
        "from . import METHODS\n\n\n"
        '@METHODS.register("fedtoyfile")\n@dataclass\nclass FedToyConfig(MethodConfig):\n    pass\n\n\n'
        "class FedToyFile(FedAvgStrategy[FedToyConfig]):\n    pass\n"
    )
    site = tmp / "site"
    (site / "extpkg").mkdir(parents=True)
    (site / "extpkg" / "__init__.py").write_text("")
    (site / "extpkg" / "fedext.py").write_text(FEDEXT)
    (site / "extpkg" / "test_fedext.py").write_text(TEST_FEDEXT)
    for dist, value in (("extpkg", "extpkg.fedext"), ("brokenpkg", "brokenpkg.nowhere")):
        info = site / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[fl_lightning.methods]\n{dist} = {value}\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{site}"}
    out = subprocess.run([sys.executable, "-c", FRESH], env=env, cwd=tmp, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    said = dict(line.partition(" ")[::2] for line in out.stdout.splitlines() if line.strip())
    return said["where"], said["names"], out.stderr, said


def test_a_file_dropped_into_methods_registers_without_editing_init(fresh_names, tmp_path_factory):
    where, names, _, _ = fresh_names
    assert where.startswith(str(tmp_path_factory.getbasetemp()))  # the copy, not the installed package
    shipped = {n for n in METHODS.names() if METHODS.get(n).__module__.startswith("fl_lightning.methods.")}
    assert "fedtoyfile" in names.split() and shipped <= set(names.split())  # not other tests' toys
    assert fresh_names[3]["composed"] == "fedtoyfile"  # a run may name it: its config holds the defaults


def test_an_installed_package_registers_its_methods_through_the_entry_point_group(fresh_names):
    """... and a broken one is one warning that stops nothing."""
    _, names, err, _ = fresh_names
    assert "fedext" in names.split() and "fedavg" in names.split()
    assert "entry point brokenpkg = brokenpkg.nowhere (group fl_lightning.methods) failed to import" in err
    assert "ModuleNotFoundError" in err


def test_an_outside_package_golden_tests_its_method_with_fl_lightning_testing(fresh_names):
    """Two rounds with partial participation, the reference written out, twin precisions: the
    kit's test passes on the method and fails on the planted bug (one bias's step flipped);
    importing the kit loads neither Ray nor W&B."""
    said = fresh_names[3]
    assert said["loaded"] == ""
    assert said["golden"] == "passed"
    assert said["planted"].startswith("failed head.bias"), said["planted"]


def test_import_methods_says_in_one_line_what_is_wrong(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="methods='../x' is not a module name"):
        import_methods(["../x"])
    with pytest.raises(ConfigError, match="methods=nowhere_such_pkg: cannot import it .ModuleNotFoundError"):
        import_methods(["nowhere_such_pkg"])
    with pytest.raises(ConfigError, match="methods=json registers no method"):
        import_methods(["json"])
    assert import_methods(["fl_lightning.methods.fedadam"]) == ["fedadagrad", "fedadam", "fedyogi"]


# --- the class attributes from the generic arguments ----------------------------------------
@dataclass
class GConfig(MethodConfig):
    g: int = 0


@dataclass
class GState(ServerState):
    extra: int = 0


@dataclass
class GBroadcast(Broadcast):
    extra: int = 0


C = TypeVar("C", bound=MethodConfig)


def test_config_state_and_broadcast_classes_come_from_the_generic_arguments():
    class Direct(Strategy[GConfig, GState, GBroadcast]):
        pass

    assert (Direct.config_cls, Direct.state_cls, Direct.broadcast_cls) == (GConfig, GState, GBroadcast)

    class Half(Strategy[C, GState, Broadcast]):  # a generic base of a family (ServerAdaptive)
        pass

    class Leaf(Half[GConfig]):
        pass

    assert (Leaf.config_cls, Leaf.state_cls, Leaf.broadcast_cls) == (GConfig, GState, Broadcast)

    class Narrower(Strategy[MethodConfig, ServerState, Broadcast]):  # a subclass may be declared
        config_cls = GConfig

    assert Narrower.config_cls is GConfig and Narrower.state_cls is ServerState
    with pytest.raises(TypeError, match="state_cls = ServerState is not its generic argument GState"):

        class Wrong(Strategy[GConfig, GState, Broadcast]):
            state_cls = ServerState

    for name in METHODS.names():  # every registered method: its attributes agree with its arguments
        cls = METHODS.get(name)
        assert isinstance(cls.state_cls(round=0, global_params=None), ServerState), name
        assert issubclass(cls.broadcast_cls, Broadcast) and issubclass(cls.config_cls, MethodConfig), name


# --- server-only methods ----------------------------------------------------------------------
@dataclass
class ServerOnlyConfig(MethodConfig):
    server_step: float = 0.5  # nothing a client takes


def test_a_server_only_method_passes_its_clients_nothing(digits):  # noqa: F811
    class ServerOnly(Strategy[ServerOnlyConfig, ServerState, Broadcast]):
        pass

    strategy = ServerOnly(ServerOnlyConfig(), 2, 2, 0, TaskInfo(num_classes=10))
    assert strategy.objective_kwargs() == {}
    obj = ServerOnly.build_objective(Toy(), OptimConfig(), **strategy.objective_kwargs())
    assert type(obj) is ClientObjective
    for name in ("fedavgm", "feddf", "fedadam", "fedyogi", "fedadagrad"):  # none overrides it
        assert "objective_kwargs" not in vars(METHODS.get(name)), name


# --- client state: a deep copy per fit ----------------------------------------------------------
class InPlace(ClientObjective[Broadcast]):
    """Counts its fits in its client's state, in place (nested too), and fails when told."""

    fail = False

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self.client_state.setdefault("count", torch.zeros(()))
        self.client_state.setdefault("nested", {"twice": torch.ones(2)})

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        self.client_state["count"].add_(1)
        self.client_state["nested"]["twice"].mul_(2)
        if InPlace.fail:
            raise RuntimeError("planted failure after the state was changed in place")
        return super().end_round(payload, num_examples)


@dataclass
class InPlaceConfig(MethodConfig):
    pass


class InPlaceStrategy(Strategy[InPlaceConfig, ServerState, Broadcast]):
    objective_cls = InPlace


def test_a_failed_fit_leaves_the_resident_state_as_it_was(digits, monkeypatch):  # noqa: F811
    monkeypatch.setitem(METHODS._configs, "test_inplace", InPlaceConfig)  # only for this test
    monkeypatch.setitem(METHODS._strategies, InPlaceConfig, InPlaceStrategy)
    monkeypatch.setattr(InPlace, "fail", False)
    ds, shards = digits
    strategy = InPlaceStrategy(MethodConfig(), 1, 1, 0, TaskInfo(num_classes=10))
    init = {k: v.clone() for k, v in Toy().state_dict().items()}
    host = ClientHost(toy_spec("test_inplace", {}, init), ds, {0: shards[0]})
    state: Any = strategy.init_state(init)
    plan = strategy.configure_round(state, 1, round_rng(0, 1))
    host.fit(plan.broadcast, plan.payloads[0])
    kept = host.states[0]
    assert float(kept["count"]) == 1 and kept["nested"]["twice"].tolist() == [2.0, 2.0]
    monkeypatch.setattr(InPlace, "fail", True)
    with pytest.raises(RuntimeError, match="planted failure"):
        host.fit(plan.broadcast, plan.payloads[0])
    assert float(host.states[0]["count"]) == 1 and host.states[0]["nested"]["twice"].tolist() == [2.0, 2.0]


# --- `methods=`: a run's own modules, and what a run directory may not do -------------------
def test_a_method_outside_conf_is_named_with_methods_and_checked_once_imported(tmp_path):
    from fl_lightning.config import compose

    # no conf/method file needed: the name composes, and typing it imports the module named
    with pytest.raises(ConfigError, match="methods=json registers no method"):
        compose(["method=fedelsewhere", "methods=json", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="unknown method 'fedelsewhere'"):  # without methods=
        compose(["method=fedelsewhere"])


def test_a_run_directory_alone_never_imports_a_module(tmp_path):
    from fl_lightning.config import compose, load_run_config, rerun_config, to_yaml

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = compose(["method=fedavg", f"output_dir={tmp_path}", "run_id=r"])
    cfg.methods = "somepkg.fedfoo"  # what a shared run directory's config.yaml may say
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    with pytest.raises(ConfigError, match="imports its method from somepkg.fedfoo: resume it with "
                                          "methods=somepkg.fedfoo to allow that"):  # fmt: skip
        load_run_config(run_dir, ["fl.rounds=3"])
    with pytest.raises(ConfigError, match="cannot change 'methods' on resume"):
        load_run_config(run_dir, ["methods=otherpkg.x"])
    # consent given, the module is imported (to type the method's config): here it is no module
    with pytest.raises(ConfigError, match="methods=somepkg.fedfoo: cannot import it"):
        load_run_config(run_dir, ["methods=somepkg.fedfoo"])
    with pytest.raises(ConfigError, match="run --from it with methods=somepkg.fedfoo"):
        rerun_config(run_dir, [])
    with pytest.raises(ConfigError, match="methods=otherpkg.x: cannot import it"):  # a new run may
        rerun_config(run_dir, ["methods=otherpkg.x"])


def test_a_method_is_named_once_by_its_registration():
    """`METHODS.register` on the config names the method: the config class and the strategy
    that declares it are called by that name (summaries, W&B and messages), and the strategy
    is what `METHODS.get` returns; neither class nor any config key restates it."""
    from fl_lightning.core.strategy import FedAvgStrategy

    @dataclass
    class UnnamedConfig(MethodConfig):
        pass

    METHODS.register("test_unnamed_toy")(UnnamedConfig)
    try:

        class Unnamed(FedAvgStrategy[UnnamedConfig]):
            pass

        assert UnnamedConfig.name == Unnamed.name == "test_unnamed_toy"
        assert (
            METHODS.get("test_unnamed_toy") is Unnamed and METHODS.config("test_unnamed_toy") is UnnamedConfig
        )
        assert "name" not in {f.name for f in dataclasses.fields(UnnamedConfig)}
        assert Unnamed(UnnamedConfig(), 2, 1, 0).summary()["method"] == "test_unnamed_toy"
        with pytest.raises(KeyError, match="already registered"):
            METHODS.register("fedavg")(UnnamedConfig)
    finally:
        del METHODS._configs["test_unnamed_toy"]
    assert FedAvgStrategy.name == "fedavg" and METHODS.get("fedavg").name == "fedavg"
    for name in METHODS.names():
        assert METHODS.get(name).name == METHODS.config(name).name == name
    restated = [  # a class body of the package's methods assigning `name`: a second copy
        f"{path.name}:{node.lineno}"
        for path in sorted((REPO / "fl_lightning" / "methods").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        for stmt in node.body
        if isinstance(stmt, ast.Assign | ast.AnnAssign)
        and "name"
        in {
            t.id
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
            if isinstance(t, ast.Name)
        }  # fmt: skip
    ]
    assert restated == []
