"""`fl.bn_stats`: federated batch-norm statistics on real Fashion-MNIST shards.

recompute: after aggregation the sampled clients measure the layer inputs under the new
weights and the server pools the sums; checked against the pooled statistics computed
directly (a written-out loop over the same data, float64 sums). local: the statistics stay
with each client and never travel."""

from __future__ import annotations

import json

import torch
from torch import nn

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.strategy import round_rng
from fl_lightning.models import build_model
from fl_lightning.runtime import checkpoint
from fl_lightning.runtime.runner import prepare, start_run

from .conftest import small

# 5 clients with 2 classes each (extreme label skew), 2 of them sampled in the round
ARGS = ["model=cnn_bn", "runtime=serial", "fl.rounds=1", "fl.num_clients=5", "fl.clients_per_round=2",
        "data.train_subset=1000", "data.partition=shards", "data.classes_per_client=2"]  # fmt: skip


def _record(run_dir):
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def test_recompute_gives_the_pooled_statistics_of_the_clients_data(tmp_path, data_root):
    cfg = compose(small(tmp_path, *ARGS, "fl.bn_stats=recompute", "experiment=re"))
    _, run_dir = start_run(cfg, console=False)
    state, _, _ = checkpoint.load(checkpoint.latest(run_dir))
    params = state.global_params

    # written out: the aggregated weights, each client's shard in batches, training-mode
    # batch norm (batch statistics normalise, as in local training), float64 sums per channel
    p = prepare(cfg)
    model = build_model("cnn_bn", 10, 1, 28)
    model.load_state_dict(params)
    model.train()
    sums: dict[str, list[torch.Tensor]] = {}

    def hook(name):
        def pre(_, inputs):
            a = inputs[0].detach().double()
            dims = [0, *range(2, a.dim())]
            n = torch.tensor(a.numel() / a.shape[1], dtype=torch.float64)
            new = [n, a.sum(dims), (a * a).sum(dims)]
            sums[name] = new if name not in sums else [x + y for x, y in zip(sums[name], new, strict=True)]

        return pre

    bns = {n: m for n, m in model.named_modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)}
    assert len(bns) >= 2
    for n, m in bns.items():
        m.register_forward_pre_hook(hook(n))
    sampled = p.strategy.sample_clients(1, round_rng(cfg.seed, 1))
    assert len(sampled) == 2
    with torch.no_grad():
        for c in sampled:
            x, _ = p.dataset.tensors(p.dataset.train_x[p.split.train[c]], p.dataset.train_y[p.split.train[c]])
            for i in range(0, len(x), cfg.fl.batch_size):
                model(x[i : i + cfg.fl.batch_size])
    for name, (n, s1, s2) in sums.items():
        mean = s1 / n
        var = (s2 / n - mean**2) * n / (n - 1)
        # float32 activations from another thread count differ by a few ulp; the sums are float64
        torch.testing.assert_close(params[f"{name}.running_mean"].double(), mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(params[f"{name}.running_var"].double(), var, rtol=1e-4, atol=1e-5)

    # the upload: (count, sum, sum of squares) per layer and client, float64; the download:
    # one more broadcast of the new weights to each client
    _, avg_dir = start_run(compose(small(tmp_path, *ARGS, "experiment=avg")), console=False)
    extra = sum(8 * (1 + 2 * m.num_features) for m in bns.values()) * 2
    assert _record(run_dir)["bytes_up"] - _record(avg_dir)["bytes_up"] == extra
    assert _record(run_dir)["bytes_down"] == 2 * _record(avg_dir)["bytes_down"]
    # and it changed something: the averaged statistics are not the pooled ones
    avg, _, _ = checkpoint.load(checkpoint.latest(avg_dir))
    key = next(f"{n}.running_var" for n in bns)
    assert not torch.allclose(avg.global_params[key], params[key], rtol=1e-2)


def test_local_keeps_statistics_with_each_client(tmp_path, data_root):
    cfg = compose(small(tmp_path, *ARGS, "fl.bn_stats=local", "data.client_test_fraction=0.25"))
    summary, run_dir = start_run(cfg, console=False)
    assert summary["primary_metric"] == "client_accuracy" and summary["final_accuracy"] is not None
    state, _, index = checkpoint.load(checkpoint.latest(run_dir))
    stats = ("running_mean", "running_var", "num_batches_tracked")
    stat_keys = {k for k in state.global_params if k.endswith(stats)}
    assert stat_keys and len(index) == 2  # the two clients that trained
    for cid, rnd in index.items():  # each client keeps exactly its statistics
        assert set(checkpoint.load_client_state(run_dir, cid, rnd)["personal"]) == stat_keys
    weights = sum(v.numel() * v.element_size() for k, v in state.global_params.items() if k not in stat_keys)
    assert _record(run_dir)["bytes_up"] == 2 * weights  # statistics never uploaded


def test_local_without_client_test_split_is_one_line(tmp_path, capsys):
    assert main(["run", "fl.bn_stats=local", "runtime=serial", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.client_test_fraction" in err
