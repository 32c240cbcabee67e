"""FedDF and FedBE (CLIP2FL's table, issue 11 item 5): server-side distillation on unlabeled
server images (`data.server_subset`). Each against a plain PyTorch computation written out
here over two rounds of two clients out of three, in float32 and float64 (`twin`, compared
with `match`: tolerances from the arithmetic, see tests/test_methods.py). Mutations tried by
hand are listed in each docstring. Plus the data plumbing: the held-out images are in no
client's data, and a run without them is one line, exit 2."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fl_lightning.core.params import weighted_mean
from fl_lightning.core.strategy import server_rng

from . import test_longtail_baselines, test_methods
from .test_methods import Toy, ce, manual_clients, match, sd, twin

digits = test_methods.digits  # fixtures: 2 clients of scikit-learn's digits, and 3
digits3 = test_longtail_baselines.digits3

BATCH, STEPS = 16, 5


def unlabeled(ds) -> torch.Tensor:
    """48 digits images in no client's shard: the server's unlabeled set."""
    return ds.tensors(ds.train_x[1200:1248], ds.train_y[1200:1248])[0]


def run_rounds(name: str, data, **method_kwargs):
    """Two rounds, two clients of three each, with the server's unlabeled images."""
    _, init, _, history = test_longtail_baselines.run_rounds(
        name, data, 2, server_images=unlabeled(data[0]), **method_kwargs
    )
    return init, history


def order(rnd: int, n: int, g: torch.Generator | None = None) -> torch.Tensor:
    """The round's batches, written out: successive randperms of the server set (from the
    round's server RNG), concatenated and cut into STEPS full batches."""
    if g is None:
        g = torch.Generator().manual_seed(int(server_rng(0, rnd).integers(2**62)))
    perms = [torch.randperm(n, generator=g) for _ in range(math.ceil(STEPS * BATCH / n))]
    return torch.cat(perms)[: STEPS * BATCH].view(STEPS, BATCH)


def cast(sd_: dict, dt) -> dict:
    return {k: v.to(dt) if v.is_floating_point() else v for k, v in sd_.items()}


def toy(params: dict, dt) -> Toy:
    m = Toy().to(dt)
    m.load_state_dict(params)
    return m


def test_feddf_distils_the_clients_mean_logits_into_the_average(digits3):
    """Per round: w̄ = example-weighted mean of the client models; teacher = mean of their
    logits (eval mode) on the server images; STEPS Adam steps on T²·KL(softmax(t/T) ‖
    softmax(s/T)) from w̄ in train mode. Mutations caught: the mean of probabilities instead
    of logits, T² dropped (by the logged loss: Adam's steps are blind to a constant factor),
    the KL's arguments swapped, the student starting from the previous global model, the
    teachers in train mode."""
    ds, shards = digits3
    T, lr = 2.0, 1e-2
    kw = dict(distill_steps=STEPS, distill_batch_size=BATCH, distill_lr=lr, temperature=T)
    init, history = run_rounds("feddf", digits3, **kw)
    x_all = unlabeled(ds)

    def expect(dt):
        w = cast(init, dt)
        x = x_all.to(dt)
        for plan, _, _, _ in history:
            models = [m for m, _ in manual_clients(digits3, plan, w, ce, dtype=dt)]
            mean = weighted_mean([sd(m) for m in models], [len(shards[c]) for c in plan.client_ids])
            with torch.no_grad():
                teacher = sum(m.eval()(x) for m in models) / len(models)
            student = toy(mean, dt).train()
            opt = torch.optim.Adam(student.parameters(), lr=lr)
            for idx in order(plan.round, len(x)):
                opt.zero_grad()
                p_t = F.softmax(teacher[idx] / T, 1)
                log_s = F.log_softmax(student(x[idx]) / T, 1)
                loss = (p_t * (p_t.log() - log_s)).sum(1).mean() * T * T
                loss.backward()
                opt.step()
            w = sd(student)
        return w

    match(history[-1][2].global_params, twin(expect))
    # The logged first-step loss, from the engine's own round-2 inputs in float64 (Adam's
    # steps are blind to a constant factor such as T²; the loss is not). float32 error: each
    # log-probability is off by ~2 ulps of its size (|log p| <= 2 max|z|/T + log C), the
    # p-weighted sum keeps that scale, x2 for the two log terms, x T² (seen: ~1e-7 here; the
    # swapped KL is off by 6e-5, T² dropped by 5e-3).
    plan, ups, _, metrics = history[-1]
    clients = [cast(u.params, torch.float64) for u in ups]
    mean = weighted_mean(clients, [u.num_examples for u in ups])
    xb = x_all.double()[order(plan.round, len(x_all))[0]]
    with torch.no_grad():
        t = sum(toy(c, torch.float64).eval()(xb) for c in clients) / len(clients)
        z = toy(mean, torch.float64).train()(xb)
        p_t = F.softmax(t / T, 1)
        loss = float((p_t * (p_t.log() - F.log_softmax(z / T, 1))).sum(1).mean()) * T * T
    zmax = float(torch.cat([t, z]).abs().max()) / T
    tol = 4 * np.finfo(np.float32).eps * (2 * zmax + math.log(10)) * T * T
    assert abs(metrics["distill_loss_first"] - loss) <= tol, (metrics["distill_loss_first"], loss, tol)
    plans = [h[0] for h in history]
    assert plans[0].client_ids != plans[1].client_ids  # two of three clients, different pairs
    assert {"distill_loss_first", "distill_loss_last"} <= set(history[-1][3])


def test_fedbe_gaussian_ensemble_soft_labels_and_swa(digits3):
    """Per round: w̄ = FedAvg; σ² = Σ_k p_k (w_k − w̄)² on every weight (not the BN
    statistics); S samples w̄ + σ·ε; soft labels = mean softmax of {w̄, clients, samples} (eval
    mode); SGD (momentum 0.9) on the soft cross entropy from w̄, and the mean of the weights
    after every 2nd step (SWA). Mutations caught: σ² unweighted, the samples left out of the
    ensemble, ε not scaled by σ, hard labels, the last iterate instead of the SWA mean."""
    ds, shards = digits3
    S, lr, every = 3, 5e-2, 2
    kw = dict(samples=S, distill_steps=STEPS, distill_batch_size=BATCH, distill_lr=lr, swa_every=every)
    init, history = run_rounds("fedbe", digits3, **kw)
    x_all = unlabeled(ds)
    stat = ("running_mean", "running_var", "num_batches_tracked")

    def expect(dt):
        w = cast(init, dt)
        x = x_all.to(dt)
        for plan, _, _, _ in history:
            models = [m for m, _ in manual_clients(digits3, plan, w, ce, dtype=dt)]
            n = torch.tensor([float(len(shards[c])) for c in plan.client_ids], dtype=torch.float64)
            p = n / n.sum()
            clients = [sd(m) for m in models]
            mean = weighted_mean(clients, n.tolist())
            g = torch.Generator().manual_seed(int(server_rng(0, plan.round).integers(2**62)))
            var = {k: sum(float(pk) * (c[k] - v) ** 2 for pk, c in zip(p, clients, strict=True))
                   for k, v in mean.items() if not k.endswith(stat)}  # fmt: skip
            draws = []
            for _ in range(S):
                d = dict(mean)
                for k, v2 in var.items():
                    eps = torch.randn(mean[k].shape, generator=g, dtype=torch.float32).to(dt)
                    d[k] = mean[k] + v2.sqrt() * eps
                draws.append(d)
            members = [toy(m, dt).eval() for m in [mean, *clients, *draws]]
            with torch.no_grad():
                q = sum(F.softmax(m(x), 1) for m in members) / len(members)
            student = toy(mean, dt).train()
            opt = torch.optim.SGD(student.parameters(), lr=lr, momentum=0.9)
            snaps = []
            for step, idx in enumerate(order(plan.round, len(x), g), start=1):
                opt.zero_grad()
                loss = -(q[idx] * F.log_softmax(student(x[idx]), 1)).sum(1).mean()
                loss.backward()
                opt.step()
                if step % every == 0:
                    snaps.append(sd(student))
            w = {k: (sum(s[k] for s in snaps) / len(snaps) if v.is_floating_point() else snaps[-1][k])
                 for k, v in snaps[-1].items()}  # fmt: skip
        return w

    match(history[-1][2].global_params, twin(expect))
    assert history[-1][3]["ensemble_size"] == 1 + 2 + S


def test_server_subset_is_held_out_and_required(tmp_path, data_root, capsys):
    """The server's images are taken out before the split (in no client's shard, the same
    for every seed); a run without `data.server_subset` is one line, exit 2, nothing written
    (the methods' one-round runs: tests/test_methods.py)."""
    from fl_lightning.cli.main import main
    from fl_lightning.config import compose
    from fl_lightning.runtime.build import prepare

    from .conftest import small

    base = small(tmp_path, "method=feddf", "runtime=serial", "fl.rounds=1", "data.train_subset=600",
                 "data.test_subset=200")  # fmt: skip
    p = prepare(compose([*base, "data.server_subset=100"]))
    assert p.server_x is not None and len(p.server_x) == 100 and len(p.dataset.train_y) == 500
    again = prepare(compose([*base, "data.server_subset=100", "seed=1"]))
    np.testing.assert_array_equal(again.server_x, p.server_x)  # the same images for every seed
    seen = {p.dataset.train_x[i].tobytes() for part in p.split.train for i in part}
    assert not seen & {img.tobytes() for img in p.server_x}
    for method in ("feddf", "fedbe"):
        capsys.readouterr()
        assert main(["run", *base, f"method={method}", f"run_id={method}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "data.server_subset" in err[0]
        assert not (tmp_path / "default" / method).exists()
