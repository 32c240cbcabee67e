"""FedTSP and the heterogeneous-model baselines, on the real parts: MiniLM weights, the
Lightning Trainer, Fashion-MNIST, local Ray. The client loss is checked against a plain
PyTorch loop; the server step against the frozen encoder's weights; what leaves a client
against its bytes; runs, Ray and resume end to end.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.cli import main
from fl_lightning.config import compose
from fl_lightning.core.messages import tensor_nbytes
from fl_lightning.core.strategy import OptimConfig, TaskInfo, round_rng
from fl_lightning.data.datasets import load_dataset
from fl_lightning.methods.fedtsp import FedTSP, FedTSPConfig, FedTSPState
from fl_lightning.models import MODELS, architecture, register_family
from fl_lightning.models.backbones import Backbone
from fl_lightning.runtime import checkpoint
from fl_lightning.runtime.host import ClientHost, ClientSpec, initial_params
from fl_lightning.runtime.runner import start_run
from fl_lightning.server_steps.prompt_tuning import LN_100, prototype_infonce

LR, MOM, BS, LAM = 0.01, 0.9, 16, 7.0


def toy_a(num_classes: int, in_channels: int = 1, image_size: int = 28, feature_dim: int = 16) -> Backbone:
    trunk = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size**2, 16), nn.ReLU())
    neck = nn.Sequential(nn.Linear(16, feature_dim), nn.BatchNorm1d(feature_dim))
    return Backbone(trunk, neck, nn.Linear(feature_dim, num_classes), feature_dim)


def toy_b(num_classes: int, in_channels: int = 1, image_size: int = 28, feature_dim: int = 16) -> Backbone:
    side = (image_size - 5) // 3 + 1
    trunk = nn.Sequential(nn.Conv2d(in_channels, 4, 5, stride=3), nn.ReLU())
    neck = nn.Sequential(nn.Linear(4 * side * side, feature_dim), nn.BatchNorm1d(feature_dim))
    return Backbone(trunk, neck, nn.Linear(feature_dim, num_classes), feature_dim)


if "toy_tsp" not in MODELS:
    MODELS.register("toy_tsp_a")(toy_a)
    MODELS.register("toy_tsp_b")(toy_b)
    register_family("toy_tsp", ["toy_tsp_a", "toy_tsp_b"])


@pytest.fixture(scope="module")
def fmnist(data_root):
    ds = load_dataset("fmnist", data_root).subset(2000, 100)
    shards = {0: np.flatnonzero(ds.train_y < 6)[:60], 1: np.flatnonzero(ds.train_y >= 3)[:50]}
    return ds, shards


@pytest.fixture(scope="module")
def tsp(fmnist):
    """FedTSP on the driver with real MiniLM (built once for the module)."""
    ds, _ = fmnist
    task = TaskInfo(num_classes=10, class_names=tuple(ds.class_names), dataset="fmnist", has_client_test_split=True)
    config = FedTSPConfig(lam=LAM, server_epochs=3, prompt_momentum=0.9)
    return FedTSP(config, num_clients=2, clients_per_round=2, seed=0, task=task)


@pytest.fixture(scope="module")
def golden(fmnist, tsp):
    """One round of two clients with different architectures (toy_tsp: a, b)."""
    ds, shards = fmnist
    spec = ClientSpec(method="fedtsp", objective_kwargs=tsp.objective_kwargs(), model="toy_tsp",
                      model_kwargs=tsp.model_kwargs("toy_tsp", {}), optim=OptimConfig(lr=LR, momentum=MOM),
                      num_classes=10, in_channels=1, image_size=28, batch_size=BS, threads=1, accelerator="cpu",
                      init_seed=0)  # fmt: skip
    host = ClientHost(spec, ds, shards)
    state = tsp.init_state(None)
    plan = tsp.configure_round(state, 1, round_rng(0, 1))
    updates = sorted((host.fit(plan.broadcast, p) for p in plan.payloads), key=lambda u: u.client_id)
    aggregated = tsp.aggregate(state, updates)
    return spec, state, plan, updates, aggregated


def manual_fit(model: nn.Module, x, y, seed: int, loss_fn) -> tuple[nn.Module, float]:
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    loader = DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True, generator=torch.Generator().manual_seed(seed))
    model.train()
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model, xb, yb)
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(yb)
    return model, total / len(y)


def test_client_loss_is_ce_plus_lambda_infonce_to_text_prototypes(fmnist, tsp, golden):
    ds, shards = fmnist
    spec, state, plan, updates, aggregated = golden
    T = F.normalize(state.text_prototypes, dim=-1)
    assert T.shape == (10, 384) and float(plan.broadcast.logit_scale) == pytest.approx(LN_100)

    def loss(m, x, y):  # Eq. 2 + Eq. 8, written out
        z = m.forward_features(x)
        return F.cross_entropy(m.head(z), y) + LAM * F.cross_entropy(100.0 * F.normalize(z, dim=-1) @ T.T, y)

    assert [architecture("toy_tsp", u.client_id) for u in updates] == ["toy_tsp_a", "toy_tsp_b"]
    for p, u, build in zip(plan.payloads, updates, (toy_a, toy_b)):
        x, y = ds.tensors(ds.train_x[shards[p.client_id]], ds.train_y[shards[p.client_id]])
        m = build(10, feature_dim=384)
        m.load_state_dict(initial_params(spec, p.client_id))
        m, mean_loss = manual_fit(m, x, y, p.seed, loss)
        for k, v in m.state_dict().items():  # the personal model after local training
            torch.testing.assert_close(u.client_state.personal_params[k].float(), v.float(), atol=1e-4, rtol=1e-4, msg=k)
        assert u.metrics["train_loss"] == pytest.approx(mean_loss, rel=1e-4)
        m.eval()  # image prototypes: class means of f(x) in eval mode over the training set
        with torch.no_grad():
            z = m.forward_features(x)
        n = torch.bincount(y, minlength=10)
        mean = torch.stack([z[y == c].mean(0) if n[c] else torch.zeros(384) for c in range(10)])
        torch.testing.assert_close(u.prototypes, mean, atol=1e-4, rtol=1e-4)
        assert torch.equal(u.proto_counts, n)
    # the two clients started from different seeded models of different architectures
    assert set(updates[0].client_state.personal_params) != set(updates[1].client_state.personal_params)
    # count-weighted aggregation (Eq. 6 up to a scale)
    n0, n1 = updates[0].proto_counts, updates[1].proto_counts
    expect = (updates[0].prototypes * n0[:, None] + updates[1].prototypes * n1[:, None]) / (n0 + n1).clamp(min=1)[:, None]
    torch.testing.assert_close(aggregated.image_prototypes, expect, atol=1e-5, rtol=1e-5)
    assert torch.equal(aggregated.proto_counts, n0 + n1)


def test_only_prototypes_counts_and_metrics_leave_a_client(golden):
    _, _, plan, updates, _ = golden
    for u in updates:
        assert u.params is None  # no weights
        uploaded = {f.name: getattr(u, f.name) for f in dataclasses.fields(u) if f.name != "client_state"}
        tensors = {k: v for k, v in uploaded.items() if isinstance(v, torch.Tensor)}
        assert set(tensors) == {"prototypes", "proto_counts"}
        assert tensors["prototypes"].shape == (10, 384) and tensors["proto_counts"].shape == (10,)
        assert all(tensor_nbytes(v) == 0 for k, v in uploaded.items() if k not in tensors)  # nothing nested
        assert all(isinstance(v, float) for v in u.metrics.values())
        assert u.upload_nbytes() == 10 * 384 * 4 + 10 * 8
    # down: text prototypes and the logit scale only
    assert plan.broadcast.global_params is None and plan.broadcast.nbytes() == 10 * 384 * 4 + 4


def test_server_step_tunes_only_the_prompts_through_the_frozen_encoder(tsp, golden):
    _, _, _, _, aggregated = golden
    enc = tsp.tuner.encoder
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    embeds = tsp.tuner.prompts.token_embeds.clone()
    present = aggregated.proto_counts > 0
    loss0 = prototype_infonce(aggregated.text_prototypes, aggregated.image_prototypes, aggregated.logit_scale, present)
    new = tsp.server_update(aggregated, [])
    assert isinstance(new, FedTSPState)
    # the loss between text and image prototypes went down, step after step
    assert new.prompt_loss[0] == pytest.approx(float(loss0), rel=1e-5)
    assert len(new.prompt_loss) == 4 and all(b < a for a, b in zip(new.prompt_loss, new.prompt_loss[1:]))
    after = prototype_infonce(new.text_prototypes, aggregated.image_prototypes, new.logit_scale, present)
    assert float(after) == pytest.approx(new.prompt_loss[-1], rel=1e-5) and float(after) < float(loss0)
    # the language model is bit-identical and got no gradient; so are the prompts' token embeddings
    for k, v in enc.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None and not p.requires_grad for p in enc.parameters())
    assert torch.equal(tsp.tuner.prompts.token_embeds, embeds)
    # only the soft prompts, the logit scale (and their momentum) changed; new text prototypes
    assert not torch.equal(new.prompt_ctx, aggregated.prompt_ctx)
    assert not torch.equal(new.logit_scale, aggregated.logit_scale)
    assert set(new.prompt_opt_state) == {0, 1}
    torch.testing.assert_close(new.text_prototypes, tsp.tuner.text_prototypes(new.prompt_ctx), atol=1e-6, rtol=0)
    for f in ("image_prototypes", "proto_counts"):
        assert torch.equal(getattr(new, f), getattr(aggregated, f))
    assert new.client_states == aggregated.client_states and new.global_params is None


def test_table4_switches_handcrafted_prompts_and_no_tuning(fmnist, golden):
    ds, _ = fmnist
    task = TaskInfo(num_classes=10, class_names=tuple(ds.class_names), dataset="fmnist", has_client_test_split=True)
    plain = FedTSP(FedTSPConfig(descriptions=False, tune_prompts=False), num_clients=2, clients_per_round=2, seed=0, task=task)
    assert plain.tuner.prompts.k == 1 and plain.tuner.prompts.prompts[0] == ["a photo of a t-shirt."]
    state = plain.init_state(None)
    torch.testing.assert_close(state.text_prototypes, plain.tuner.encoder.encode([f"a photo of a {c}." for c in ds.class_names]).cpu(), atol=1e-5, rtol=0)
    aggregated = plain.aggregate(state, golden[3])
    assert plain.server_update(aggregated, golden[3]) is aggregated  # frozen prompts: nothing to do


ARGS = ["method=fedtsp", "data=fmnist", "model=htfe_cnn3", "data.client_test_fraction=0.25",
        "data.train_subset=1500", "data.test_subset=200", "fl.num_clients=4", "fl.batch_size=32",
        "logger=none", "optim.lr=0.01", "method.prompt_momentum=0.9", "runtime.threads_per_client=1"]  # fmt: skip


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory, data_root):
    out = tmp_path_factory.mktemp("fedtsp_runs")
    code = main(["run", *ARGS, "runtime=serial", "fl.rounds=2", f"output_dir={out}", "run_id=serial", "--quiet"])
    return code, out / "default" / "serial"


def test_cli_run_writes_personalised_metrics(serial_run):
    code, run_dir = serial_run
    assert code == 0
    assert {"config.yaml", "metrics.jsonl", "summary.json", "partition.json", "checkpoints"} <= {p.name for p in run_dir.iterdir()}
    recs = _records(run_dir)
    assert [r["round"] for r in recs] == [1, 2]
    for r in recs:
        assert "accuracy" not in r  # no global model in heterogeneous mode
        for k in ("client_accuracy", "client_accuracy_mean", "client_accuracy_std", "client_accuracy_worst10"):
            assert 0.0 <= r[k] <= 1.0
        assert r["bytes_up"] == 4 * (10 * 384 * 4 + 10 * 8)  # prototypes + counts, per client
        assert r["bytes_down"] == 4 * (10 * 384 * 4 + 4)  # text prototypes + logit scale
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy_metric"] == "client_accuracy" and summary["model"] == "htfe_cnn3"
    assert summary["final_accuracy"] == recs[-1]["client_accuracy"]
    assert summary["best_accuracy"] == max(r["client_accuracy"] for r in recs)


def test_soft_prompts_survive_checkpoint_and_resume(serial_run, tsp, tmp_path):
    code, run_dir = serial_run
    assert code == 0
    state2, meta = checkpoint.load(run_dir / "checkpoints" / "round-000002.json")
    assert isinstance(state2, FedTSPState) and state2.round == 2
    assert state2.prompt_ctx.shape == (10, 4, 384) and set(state2.prompt_opt_state) == {0, 1}
    assert not torch.equal(state2.prompt_ctx, tsp.tuner.initial_ctx())  # tuned twice
    # save / load round trip: every tensor comes back bit for bit
    checkpoint.save(tmp_path, state2, meta)
    again, _ = checkpoint.load(checkpoint.latest(tmp_path))
    for f in ("prompt_ctx", "logit_scale", "text_prototypes", "image_prototypes", "proto_counts"):
        assert torch.equal(getattr(again, f), getattr(state2, f)), f
    for i, st in state2.prompt_opt_state.items():
        assert torch.equal(again.prompt_opt_state[i]["momentum_buffer"], st["momentum_buffer"])
    for cid, cs in state2.client_states.items():  # each client's own architecture
        assert all(torch.equal(again.client_states[cid].personal_params[k], v) for k, v in cs.personal_params.items())
    # resume: round 3 continues from the checkpointed prompts, logit scale and momentum
    assert main(["resume", str(run_dir), "fl.rounds=3", "--quiet"]) == 0
    assert [r["round"] for r in _records(run_dir)] == [1, 2, 3]
    state3, _ = checkpoint.load(run_dir / "checkpoints" / "round-000003.json")
    out = tsp.tuner.tune(state2.prompt_ctx, state2.logit_scale, state3.image_prototypes, state3.proto_counts > 0,
                         steps=1, lr=0.01, momentum=0.9, scale_lr=0.01, opt_state=state2.prompt_opt_state)  # fmt: skip
    torch.testing.assert_close(state3.prompt_ctx, out.ctx, atol=1e-6, rtol=0)
    torch.testing.assert_close(state3.logit_scale, out.logit_scale, atol=1e-6, rtol=0)


def test_ray_run_matches_serial(serial_run, tmp_path, ray_session):
    code, serial_dir = serial_run
    assert code == 0
    summary, ray_dir = start_run(compose([*ARGS, "runtime=ray", "fl.rounds=1", f"output_dir={tmp_path}"]), console=False)
    assert summary["executor"] == "ray" and summary["rounds_completed"] == 1
    keys = ("client_accuracy", "client_accuracy_mean", "train_loss", "bytes_up")
    assert [_records(ray_dir)[0][k] for k in keys] == [_records(serial_dir)[0][k] for k in keys]


BASELINES = {"local": 0, "fedproto": 3 * (10 * 512 * 4 + 80), "fedtgp": 3 * (10 * 512 * 4 + 80),
             "feddistill": 3 * (10 * 10 * 4 + 80), "lg_fedavg": 3 * (512 * 10 + 10) * 4}  # fmt: skip


@pytest.mark.parametrize("method", sorted(BASELINES))
def test_heterogeneous_baselines_run_one_round(method, tmp_path, data_root):
    extra = ["method.server_epochs=5"] if method == "fedtgp" else []
    cfg = compose([f"method={method}", "data=fmnist", "model=htfe_cnn3", "data.client_test_fraction=0.25",
                   "data.train_subset=600", "data.test_subset=100", "fl.num_clients=3", "fl.rounds=1",
                   "logger=none", "runtime=serial", "optim.lr=0.01", f"output_dir={tmp_path}", *extra])  # fmt: skip
    summary, run_dir = start_run(cfg, console=False)
    assert summary["rounds_completed"] == 1 and 0.0 <= summary["final_accuracy"] <= 1.0
    assert summary["accuracy_metric"] == "client_accuracy"
    assert _records(run_dir)[0]["bytes_up"] == BASELINES[method]
    state, _ = checkpoint.load(checkpoint.latest(run_dir))
    assert len(state.client_states) == 3  # three architectures, each client's own weights
    if method == "lg_fedavg":
        assert set(state.global_params) == {"head.weight", "head.bias"}
    else:
        assert state.global_params is None
    if method == "fedtgp":
        assert state.prototypes.shape == (10, 512) and 0 < state.margin <= 100


def test_weight_averaging_methods_refuse_a_model_family(tmp_path, capsys):
    assert main(["run", "method=fedavg", "model=htfe_cnn3", "runtime=serial", "logger=none",
                 "data.train_subset=300", f"output_dir={tmp_path}"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "averages weights that differ across the architectures" in err and err.count("\n") == 1


def test_homogeneous_fedavg_then_classifier_finetuning(tmp_path, data_root):
    """share_weights: FedAvg of all weights as well; finetune_after: then only personal heads."""
    cfg = compose(["method=fedtsp", "method.share_weights=true", "method.finetune_after=1", "model=cnn_bn",
                   "data.client_test_fraction=0.25", "data.train_subset=600", "data.test_subset=100",
                   "fl.num_clients=3", "fl.rounds=2", "logger=none", "runtime=serial", "optim.lr=0.01",
                   f"output_dir={tmp_path}"])  # fmt: skip
    summary, run_dir = start_run(cfg, console=False)
    r1, r2 = _records(run_dir)
    assert r1["bytes_up"] > 3 * 384 * 3136 * 4  # round 1: every weight (hidden = text dim) + prototypes
    assert r2["bytes_up"] == 0  # -FT round: the heads stay with their clients
    s1, _ = checkpoint.load(run_dir / "checkpoints" / "round-000001.json")
    s2, _ = checkpoint.load(run_dir / "checkpoints" / "round-000002.json")
    assert s1.client_states == {} and set(s2.client_states) == {0, 1, 2}
    for cs in s2.client_states.values():
        assert set(cs.personal_params) == {"head.weight", "head.bias"}
        assert not torch.equal(cs.personal_params["head.weight"], s1.global_params["head.weight"])
    assert all(torch.equal(s2.global_params[k], v) for k, v in s1.global_params.items())  # nothing averaged
    assert torch.equal(s2.prompt_ctx, s1.prompt_ctx)  # no prompt tuning without new prototypes
    assert summary["accuracy_metric"] == "client_accuracy"
