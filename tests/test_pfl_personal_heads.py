"""Personalised-FL methods (FedPer, FedRep, Ditto, FedRoD, FedDTR) on the toy model, checked
against plain PyTorch loops with each method's formulas written out: three clients, two of
them per round for two rounds (partial participation, so resident state matters), then each
client's personalised evaluation on its own split. Plus FedDTR's ablation equal to FedPer
bit for bit, the prior never uploaded, and a one-round CLI run of each method."""

from __future__ import annotations

import dataclasses
import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.config import compose
from fl_lightning.core.params import to_cpu, weighted_mean
from fl_lightning.core.strategy import OptimConfig, TaskInfo
from fl_lightning.runtime.runner import start_run
from fl_lightning.testing import check as check_config
from fl_lightning.testing import loop

from .conftest import small
from .test_methods import BS, LR, MOM, Toy, match, twin

PFL = ("fedper", "fedrep", "ditto", "fedrod", "feddtr")


@pytest.fixture(scope="module")
def clients3():
    """Three clients of scikit-learn digits with different label mixes and sizes, each with
    its own test split (disjoint from every training shard)."""
    from fl_lightning.data.registry import load_dataset

    ds = load_dataset("digits", "")
    y = ds.train_y
    pool, held = np.arange(0, 900), np.arange(900, len(y))
    rules = [lambda v: v < 6, lambda v: v >= 3, lambda v: v % 2 == 1]
    sizes = [70, 50, 40]
    train = {c: pool[rules[c](y[pool])][: sizes[c]] for c in range(3)}
    test = {c: held[rules[c](y[held])][:30] for c in range(3)}
    return ds, train, test


def run(
    name: str,
    data,
    rounds: int = 2,
    per_round: int = 2,
    bs: int = BS,
    momentum: float = MOM,
    evaluate: bool = False,
    **method_kwargs,
):
    """`rounds` rounds of `name` on the three clients, `per_round` of them each round, through
    the run's own loop on a serial executor (`fl_lightning.testing.loop`, no Ray): what the
    references are checked against. `evaluate`: each payload asks for its trained model's
    evaluation (`eval.timing=trained`)."""
    ds = data[0]
    task = TaskInfo(
        num_classes=10, class_names=tuple(ds.class_names), dataset="digits", has_client_test_split=True,
        rounds=rounds,
    )  # fmt: skip
    keys = [f"method.{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in method_kwargs.items()]
    check_config(name, "data.client_test_fraction=0.25", *keys)  # as a run's, before anything starts
    r = loop(name, data, method=method_kwargs, rounds=rounds, clients_per_round=per_round, task=task,
             optim=OptimConfig(lr=LR, momentum=momentum), batch_size=bs, evaluate=evaluate)  # fmt: skip
    return SimpleNamespace(strategy=r.strategy, plans=r.plans, updates=r.updates, state=r.state, init=r.init,
                           host=r.host)  # fmt: skip


def shard(data, cid, split="train", dt=torch.float32):
    ds, train, test = data
    idx = (train if split == "train" else test)[cid]
    x, y = ds.tensors(ds.train_x[idx], ds.train_y[idx])
    return x.to(dt), y


def cast(sd: dict, dt) -> dict:
    return {k: v.to(dt) if v.is_floating_point() else v for k, v in sd.items()}


def both(fn):
    """`twin` for references returning (global, {cid: personal}): pairs for `match`."""
    (g32, p32), (g64, p64) = twin(fn)
    return (g32, g64), {c: (p32[c], p64[c]) for c in p64}


def check(r, glob, pers, key="personal"):
    """The engine's global model and resident personal states against the reference pairs."""
    match(r.state.global_params, glob)
    for cid, ref in pers.items():
        match(r.host.states[cid][key], ref)


def loader(x, y, seed):
    torch.manual_seed(seed)
    return DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))  # fmt: skip


def sgd_epochs(model: nn.Module, params, batches, epochs: int, loss_fn) -> None:
    """`epochs` passes over `batches` (one DataLoader, its generator continuing across calls,
    as across the engine's phases) with a fresh SGD over `params`."""
    opt = torch.optim.SGD(list(params), lr=LR, momentum=MOM)
    model.train()
    for _ in range(epochs):
        for xb, yb in batches:
            opt.zero_grad()
            loss_fn(model, xb, yb).backward()
            opt.step()


def ce(m, x, y):
    return F.cross_entropy(m(x), y)


def split(sd, personal):
    return ({k: v for k, v in sd.items() if not personal(k)}, {k: v for k, v in sd.items() if personal(k)})


def n_train(data, cid):
    return len(data[1][cid])


def personal_eval(r, cid):
    """The engine's evaluation of client `cid` on its own test split (after the last round)."""
    return r.host.evaluate(
        r.strategy.broadcast(r.state, r.state.round), r.strategy.payload(r.state, r.state.round, cid)
    )


def accuracy(scores, y):
    return float((scores.argmax(1) == y).float().mean())


# --- FedPer ----------------------------------------------------------------------------------


def manual_split_head(data, r, make, train_fn, personal=lambda k: k.startswith("head.")):
    """Body (and whatever is not personal) averaged over the round's clients; personal keys
    resident per client (a client's first round: the global ones). In float32 and float64."""
    return both(lambda dt: _split_head(data, r, make, train_fn, personal, dt))


def _split_head(data, r, make, train_fn, personal, dt):
    glob, pers = cast(r.init, dt), {}
    for plan in r.plans:
        outs = []
        for p in plan.payloads:
            m = make().to(dt)
            m.load_state_dict({**glob, **pers.get(p.client_id, {})})
            train_fn(m, *shard(data, p.client_id, dt=dt), p.seed)
            shared, own = split(to_cpu(m.state_dict()), personal)
            pers[p.client_id] = own
            outs.append((shared, n_train(data, p.client_id)))
        glob = {**glob, **weighted_mean([s for s, _ in outs], [n for _, n in outs])}
    return glob, pers


def test_fedper_averages_the_body_and_keeps_each_head(clients3):
    r = run("fedper", clients3)
    assert [p.client_ids for p in r.plans] != [[0, 1, 2]] * 2  # partial participation

    def train(m, x, y, seed):
        sgd_epochs(m, m.parameters(), loader(x, y, seed), 1, ce)

    glob, pers = manual_split_head(clients3, r, Toy, train)
    check(r, glob, pers)
    assert torch.equal(r.state.global_params["head.weight"], r.init["head.weight"])  # never averaged
    for u in r.updates[-1]:
        assert not any(k.startswith("head.") for k in u.params)
    # personalised evaluation: the global body with the client's own head
    cid = r.plans[-1].client_ids[0]
    m = Toy()
    m.load_state_dict({**glob[0], **pers[cid][0]})
    m.eval()
    x, y = shard(clients3, cid, "test")
    assert personal_eval(r, cid).metrics["accuracy"] == pytest.approx(accuracy(m(x), y))


def test_eval_timing_trained_scores_the_model_local_training_left(clients3):
    """`eval.timing=trained` (FedDTR's code): each participant evaluates, on its own test
    split, the model its local training produced (FedPer: the trained body with its own
    head, before the body is averaged), not the one it received. Written out over two rounds
    of two clients out of three; checked on the test loss (a model off by one round's
    training, or the received one, moves it by ~1e-1) and the accuracy."""
    r = run("fedper", clients3, evaluate=True)

    def trained_evals(dt):
        glob, pers, out = cast(r.init, dt), {}, {}
        for plan in r.plans:
            outs = []
            for p in plan.payloads:
                m = Toy().to(dt)
                m.load_state_dict({**glob, **pers.get(p.client_id, {})})
                sgd_epochs(m, m.parameters(), loader(*shard(clients3, p.client_id, dt=dt), p.seed), 1, ce)
                m.eval()
                x, y = shard(clients3, p.client_id, "test", dt)
                with torch.no_grad():
                    scores = m(x)
                out[plan.round, p.client_id] = (float(F.cross_entropy(scores, y)), accuracy(scores, y))
                shared, own = split(to_cpu(m.state_dict()), lambda k: k.startswith("head."))
                pers[p.client_id] = own
                outs.append((shared, n_train(clients3, p.client_id)))
            glob = {**glob, **weighted_mean([s for s, _ in outs], [n for _, n in outs])}
        return out

    ref32, ref64 = twin(trained_evals)
    got = {(plan.round, u.client_id): u.evaluation
           for plan, ups in zip(r.plans, r.updates, strict=True) for u in ups}  # fmt: skip
    assert sorted(got) == sorted(ref64) and len(got) == 4  # the participants only
    for key, ev in got.items():
        assert ev is not None and ev.num_examples == len(clients3[2][key[1]])
        (l32, _), (l64, a64) = ref32[key], ref64[key]
        # as `match`: 16x the float32 twin's own error + 4 ulps
        tol = 16 * abs(l32 - l64) + 4 * np.finfo(np.float32).eps * abs(l64)
        assert abs(ev.metrics["loss"] - l64) <= tol, (key, ev.metrics["loss"], l64, tol)
        assert ev.metrics["accuracy"] == pytest.approx(a64)
    # the received model of the last round's participants (the default timing) is another one
    last = r.plans[-1].client_ids[0]
    assert abs(personal_eval(r, last).metrics["loss"] - got[2, last].metrics["loss"]) > 1e-3
    no_eval = run("fedper", clients3)
    assert all(u.evaluation is None for ups in no_eval.updates for u in ups)


# --- FedRep ----------------------------------------------------------------------------------


def test_fedrep_trains_the_head_then_the_body(clients3):
    r = run("fedrep", clients3, head_epochs=2)

    def train(m, x, y, seed):
        batches = loader(x, y, seed)
        sgd_epochs(m, m.head.parameters(), batches, 2, ce)  # head, body frozen
        sgd_epochs(m, m.features.parameters(), batches, 1, ce)  # body, head frozen

    glob, pers = manual_split_head(clients3, r, Toy, train)
    check(r, glob, pers)


# --- Ditto -----------------------------------------------------------------------------------


def test_ditto_global_is_fedavg_and_personal_models_pull_to_it(clients3):
    lam = 0.5
    r = run("ditto", clients3, lam=lam)

    def ref(dt):
        glob, pers = cast(r.init, dt), {}
        for plan in r.plans:
            outs = []
            for p in plan.payloads:
                x, y = shard(clients3, p.client_id, dt=dt)
                batches = loader(x, y, p.seed)
                w = Toy().to(dt)
                w.load_state_dict(glob)
                sgd_epochs(w, w.parameters(), batches, 1, ce)  # the global model's local update
                anchor = [glob[n] for n, _ in w.named_parameters()]

                def prox(m, xb, yb, anchor=anchor):
                    sq = sum(((q - a) ** 2).sum() for q, a in zip(m.parameters(), anchor, strict=True))
                    return ce(m, xb, yb) + lam / 2 * sq

                v = Toy().to(dt)
                v.load_state_dict(pers.get(p.client_id, glob))  # first time: the global it receives
                sgd_epochs(v, v.parameters(), batches, 1, prox)
                pers[p.client_id] = to_cpu(v.state_dict())
                outs.append((to_cpu(w.state_dict()), n_train(clients3, p.client_id)))
            glob = weighted_mean([s for s, _ in outs], [n for _, n in outs])
        return glob, pers

    glob, pers = both(ref)
    check(r, glob, pers, "ditto/personal")
    for u in r.updates[-1]:  # uploads w only
        assert set(u.params) == set(r.init)
    # evaluation scores the personal model v; global/accuracy the global model
    cid = r.plans[-1].client_ids[0]
    x, y = shard(clients3, cid, "test")
    v, w = Toy(), Toy()
    v.load_state_dict(pers[cid][0])
    w.load_state_dict(glob[0])
    v.eval(), w.eval()
    got = personal_eval(r, cid).metrics
    assert got["accuracy"] == pytest.approx(accuracy(v(x), y))
    assert got["global/accuracy"] == pytest.approx(accuracy(w(x), y))
    with torch.no_grad():
        assert got["loss"] == pytest.approx(float(F.cross_entropy(v(x), y)), rel=1e-5)


# --- FedRoD ----------------------------------------------------------------------------------


class RoDToy(Toy):
    def __init__(self) -> None:
        super().__init__()
        self.phead = nn.Linear(8, 10)


def test_fedrod_balanced_generic_head_and_personal_head(clients3):
    r = run("fedrod", clients3)
    assert torch.equal(r.init["phead.weight"], r.init["head.weight"])  # a copy of the generic head
    counts = {c: torch.bincount(shard(clients3, c)[1], minlength=10).double() for c in range(3)}

    def train(m, x, y, seed):
        n = counts[int(train.cid)]

        def loss(m, xb, yb):
            z = m.features(xb)
            g = m.head(z)
            bsm = F.cross_entropy(g + n.log().to(g.dtype), yb)
            return bsm + F.cross_entropy(g.detach() + m.phead(z.detach()), yb)

        sgd_epochs(m, m.parameters(), loader(x, y, seed), 1, loss)

    # the client id of each manual fit, from the plans (train_fn gets data, not ids); the
    # reference runs twice (float32, float64), so the ids cycle
    ids = itertools.cycle([p.client_id for plan in r.plans for p in plan.payloads])

    def train_with_id(m, x, y, seed):
        train.cid = next(ids)
        train(m, x, y, seed)

    glob, pers = manual_split_head(
        clients3, r, RoDToy, train_with_id, personal=lambda k: k.startswith("phead.")
    )
    check(r, glob, pers)
    cid = r.plans[-1].client_ids[0]
    m = RoDToy()
    m.load_state_dict({**glob[0], **pers[cid][0]})
    m.eval()
    x, y = shard(clients3, cid, "test")
    z = m.features(x)
    got = personal_eval(r, cid).metrics
    assert got["accuracy"] == pytest.approx(accuracy(m.head(z) + m.phead(z), y))
    assert got["generic/accuracy"] == pytest.approx(accuracy(m.head(z), y))


# --- FedDTR ----------------------------------------------------------------------------------


class DTRToy(Toy):
    def __init__(self, text_dim: int) -> None:
        super().__init__()
        self.text = nn.Linear(text_dim, 8)


def cosl(a, b, tau):
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T / tau


def test_feddtr_losses_prior_and_dual_head(clients3):
    tau = 0.05
    r = run("feddtr", clients3, tau=tau)
    T = r.strategy.class_features  # 𝔗: frozen class-prompt embeddings
    assert T.shape == (10, 384)
    pi = {c: torch.bincount(shard(clients3, c)[1], minlength=10).float() for c in range(3)}
    pi = {c: v / v.sum() for c, v in pi.items()}

    def ref(dt):
        Td = T.to(dt)
        glob, heads = cast(r.init, dt), {}
        for plan in r.plans:
            outs = []
            head_f = {k.removeprefix("head."): v for k, v in glob.items() if k.startswith("head.")}
            text_f = {k.removeprefix("text."): v for k, v in glob.items() if k.startswith("text.")}
            for p in plan.payloads:
                m = DTRToy(384).to(dt)
                m.load_state_dict({**glob, **heads.get(p.client_id, {})})
                f_glob = nn.Linear(8, 10).to(dt)
                f_glob.load_state_dict(head_f)
                t_glob = nn.Linear(384, 8).to(dt)
                t_glob.load_state_dict(text_f)
                prior_w = pi[p.client_id].to(dt)

                def loss(m, x, y, f_glob=f_glob, t_glob=t_glob, prior_w=prior_w, Td=Td):
                    z = m.features(x)
                    t_i = m.text(Td)
                    prior = prior_w @ t_i.detach()
                    logits = m.head(z + prior) + f_glob(z.detach()).detach()
                    l_ce = F.cross_entropy(logits, y)
                    with torch.no_grad():
                        t_fr = t_glob(Td)
                    l1 = F.cross_entropy(cosl(z, t_fr, tau), y)
                    l2 = F.cross_entropy(cosl(z.detach(), t_i, tau), y)
                    return l_ce + l1 + l2

                batches = loader(*shard(clients3, p.client_id, dt=dt), p.seed)
                sgd_epochs(m, m.parameters(), batches, 1, loss)
                sd = to_cpu(m.state_dict())
                heads[p.client_id] = {k: v for k, v in sd.items() if k.startswith("head.")}
                outs.append((sd, n_train(clients3, p.client_id)))  # ω, θ and h_i all go up
            glob = weighted_mean([s for s, _ in outs], [n for _, n in outs])
        return glob, heads

    glob_pair, heads_pair = both(ref)
    check(r, glob_pair, heads_pair)
    glob, heads = glob_pair[0], {c: h[0] for c, h in heads_pair.items()}
    # prediction: h_i(F + P_i) + h_f(F), with the round's global head as h_f
    cid = r.plans[-1].client_ids[0]
    m = DTRToy(384)
    m.load_state_dict({**glob, **heads[cid]})
    f_glob = nn.Linear(8, 10)
    f_glob.load_state_dict({k.removeprefix("head."): v for k, v in glob.items() if k.startswith("head.")})
    m.eval()
    x, y = shard(clients3, cid, "test")
    with torch.no_grad():
        z = m.features(x)
        scores = m.head(z + pi[cid] @ m.text(T)) + f_glob(z)
    assert personal_eval(r, cid).metrics["accuracy"] == pytest.approx(accuracy(scores, y))


def test_feddtr_without_text_prior_and_global_head_is_fedper_bit_for_bit(clients3):
    per = run("fedper", clients3)
    dtr = run("feddtr", clients3, text=False, prior=False, global_head=False)
    assert dtr.strategy.class_features is None
    assert set(per.state.global_params) == set(dtr.state.global_params)
    for k, v in per.state.global_params.items():
        assert torch.equal(v, dtr.state.global_params[k]), k
    for cid in per.host.states:
        for k, v in per.host.states[cid]["personal"].items():
            assert torch.equal(v, dtr.host.states[cid]["personal"][k]), (cid, k)
    for a, b in zip(per.updates[-1], dtr.updates[-1], strict=True):
        assert a.metrics["train_loss"] == b.metrics["train_loss"]
    for cid in range(3):
        ea, eb = personal_eval(per, cid).metrics, personal_eval(dtr, cid).metrics
        assert ea == eb


def test_feddtr_never_uploads_the_prior(clients3):
    r = run("feddtr", clients3, rounds=1)
    for u in r.updates[0]:
        assert set(u.params) == set(r.init)  # ω, θ (text.*) and h_i (head.*): nothing else
        sent = sum(v.numel() * v.element_size() for v in u.params.values())
        assert u.upload_nbytes() == sent
        fields = {"client_id", "num_examples", "params", "metrics", "evaluation"}
        assert set(dataclasses.asdict(u)) == fields and u.evaluation is None  # not asked for
    # without the global head, h_i stays home too
    r2 = run("feddtr", clients3, rounds=1, global_head=False)
    for u in r2.updates[0]:
        assert not any(k.startswith("head.") for k in u.params)


def test_feddtr_ablation_switches(clients3):
    from fl_lightning.core.errors import ConfigError

    with pytest.raises(ConfigError, match="prior"):  # the config's check, before anything runs
        check_config(
            "feddtr", "method.text=false", "data.client_test_fraction=0.25"
        )  # prior defaults to true
    naive = run("feddtr", clients3, rounds=1, freeze_text=False, prior=False)
    assert "client/loss/cl" not in naive.updates[0][0].metrics
    assert {"loss/ce", "loss/cl"} <= set(naive.updates[0][0].metrics)
    full = run("feddtr", clients3, rounds=1)
    assert {"loss/ce", "loss/cl_image", "loss/cl_text"} <= set(full.updates[0][0].metrics)


# --- every method through the CLI ------------------------------------------------------------


@pytest.mark.parametrize("method", PFL)
def test_pfl_method_runs_one_round_with_client_metrics(method, tmp_path, data_root):
    cfg = compose(small(tmp_path, f"method={method}", "runtime=serial", "fl.rounds=1", "fl.num_clients=2",
                        "data.train_subset=400", "data.test_subset=200",
                        "data.client_test_fraction=0.25"))  # fmt: skip
    summary, _ = start_run(cfg, console=False)
    assert summary["rounds_completed"] == 1 and summary["primary_metric"] == "client_accuracy"
    assert 0.0 <= summary["final_client_accuracy"] <= 1.0


def test_eval_timing_through_the_cli(tmp_path, data_root, capsys):
    from fl_lightning.cli.main import main

    base = [*small(tmp_path, "method=fedper", "runtime=serial", "fl.num_clients=3", "fl.clients_per_round=2",
                   "data.train_subset=400", "data.test_subset=200")]  # fmt: skip
    rc = main(["run", *base, "data.client_test_fraction=0.25", "eval.timing=trained", "run_id=t", "--quiet"])
    assert rc == 0
    recs = _records(tmp_path / "default" / "t")
    assert [r["clients_evaluated"] for r in recs] == [2, 2]  # the round's participants
    assert all(0.0 <= r["client_accuracy"] <= 1.0 for r in recs)
    capsys.readouterr()
    assert main(["run", *base, "eval.timing=trained", "run_id=n"]) == 2  # no client test split
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.client_test_fraction" in err[0]
    assert not (tmp_path / "default" / "n").exists()


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_client_without_test_images_is_left_out_of_client_evaluation(tmp_path):
    """Digits' first 6 test images hold classes 0, 3, 8, 9 only: with each client's own split
    from the test set (data.personal_from_test) in FedTPG blocks of 2 classes, clients 2 and 3
    have no test images. The run completes; client_* is over the other three, both timings."""
    from fl_lightning.data.registry import load_dataset

    test_y = load_dataset("digits", str(tmp_path)).test_y[:6]  # the labels, without the protocols
    sizes = [int(np.isin(test_y, [2 * k, 2 * k + 1]).sum()) for k in range(5)]
    assert sizes[2] == sizes[3] == 0 < min(sizes[0], sizes[1], sizes[4])
    for timing in ("received", "trained"):
        cfg = compose(["method=fedper", "model=mlp", "data=digits", "data.train_subset=100",
                       "data.test_subset=6", "data.personal_from_test=true", "data.partition=class_blocks",
                       "data.classes_per_client=2", "fl.num_clients=5", "fl.rounds=1", "fl.batch_size=8",
                       "runtime=serial", "logger=none",
                       "data.cache_partitions=false", f"eval.timing={timing}", f"run_id={timing}",
                       f"output_dir={tmp_path}"])  # fmt: skip
        summary, run_dir = start_run(cfg, console=False)
        assert json.loads((run_dir / "partition.json").read_text())["test_sizes"] == sizes
        (line,) = _records(run_dir)
        assert summary["status"] == "completed" and line["clients_evaluated"] == 3
        assert 0.0 <= summary["final_client_accuracy"] <= 1.0
        # the majority reference: over the same three clients, weighted by their test images
        each = summary["client_majority_accuracies"]
        ref = sum(a * n for a, n in zip(each, sizes, strict=True)) / sum(sizes)
        assert line["client_majority_accuracy"] == pytest.approx(ref, abs=1e-6)
