"""FedLGT and FedC-Tran (issue 12) on the real multi-label Fashion-MNIST mosaics, MiniLM and
the real Trainer: C-Tran's readout and states, the label-mask and CA-MLE masks against
hand-computed ones, the loss against a written-out BCE, and whole runs (local Ray, serial)
for the properties the issue names."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, precision_score, recall_score

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.messages import Broadcast, ClientPayload
from fl_lightning.data.datasets import FMNIST_CLASSES
from fl_lightning.methods.fedlgt import LGTObjective, label_mask_training
from fl_lightning.models.ctran import NEGATIVE, POSITIVE, UNKNOWN, CTran
from fl_lightning.models.weights import load_trunk
from fl_lightning.runtime.runner import start_run
from fl_lightning.text.targets import derangement

from .conftest import small

C, D = 10, 32
ML = ["data=fmnist_multilabel", "model=ctran", "data.train_subset=240", "data.test_subset=120",
      "fl.num_clients=3", "fl.clients_per_round=2", "fl.local_steps=3", "fl.batch_size=16"]  # fmt: skip


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _model(seed: int = 0) -> CTran:
    torch.manual_seed(seed)
    return CTran(C, in_channels=1, d_model=D, layers=1, heads=2, dropout=0.0)


# --- the model ------------------------------------------------------------------------------
def test_ctran_reads_each_label_token_with_its_own_row_and_states_change_only_their_token():
    m = _model().eval()
    x = torch.randn(3, 1, 56, 56)
    o = m.forward_features(x)  # all unknown
    assert o.shape == (3, C, D)
    by_hand = torch.stack([o[:, c] @ m.head.weight[c] + m.head.bias[c] for c in range(C)], 1)
    torch.testing.assert_close(m(x), by_hand, rtol=0, atol=1e-5)
    # unknown is the zero state vector: giving label 0 the state "unknown" explicitly changes
    # nothing, "positive" changes the scores
    states = torch.full((3, C), UNKNOWN)
    torch.testing.assert_close(m(x, states), m(x), rtol=0, atol=0)
    states[:, 0] = POSITIVE
    assert not torch.allclose(m(x, states), m(x))


def test_fixed_embeddings_leave_the_state_dict_and_are_never_trained():
    m = _model()
    labels, states = torch.randn(C, D), torch.randn(2, D)
    obj = LGTObjective(m, labels, states, lmt=True, ca_mle=False, lr=1e-2, optimizer="adam")
    keys = set(obj.model.state_dict())
    assert not {"label_emb", "state_emb"} & keys
    assert not any(p is obj.model.label_emb for p in obj.parameters())
    opt = obj.configure_optimizers()
    y = (torch.rand(8, C) < 0.3).float()
    for _ in range(3):
        opt.zero_grad()
        obj.training_step((torch.randn(8, 1, 56, 56), y), 0).backward()
        opt.step()
    assert torch.equal(obj.model.label_emb, labels) and torch.equal(obj.model.state_emb, states)


def test_resnet18_trunk_loads_a_local_weights_file(tmp_path):
    from torchvision.models import resnet18

    torch.manual_seed(3)
    ref = resnet18(weights=None)
    torch.save(ref.state_dict(), tmp_path / "r18.pt")
    weights = str(tmp_path / "r18.pt")
    m = CTran(4, in_channels=3, trunk="resnet18", d_model=64, layers=1, heads=2)
    load_trunk(m, weights)  # model.weights=<a torchvision state dict>: its fc is dropped
    assert torch.equal(m.trunk.conv1.weight, ref.conv1.weight)  # conv1 is the trunk's first layer
    assert torch.equal(m.trunk.layer4[1].bn2.running_var, ref.layer4[1].bn2.running_var)
    assert m(torch.randn(2, 3, 64, 64)).shape == (2, 4)


# --- the masks and the loss -----------------------------------------------------------------
def test_label_mask_training_draws_a_uniform_number_of_known_labels_per_sample():
    torch.manual_seed(0)
    y = torch.zeros(20000, C)
    known = label_mask_training(y, 0.75)
    counts = known.sum(1)
    top = math.floor(0.75 * C)  # 7: k ~ U{0..7}
    freq = torch.bincount(counts, minlength=C + 1).double() / len(y)
    assert int(counts.max()) == top and freq[top + 1 :].sum() == 0
    # each of the 8 values has probability 1/8 (binomial sd ~0.0023 at n=20,000)
    uniform = torch.full((top + 1,), 1 / (top + 1), dtype=torch.float64)
    assert torch.allclose(freq[: top + 1], uniform, atol=0.015)
    # which labels are known is uniform over positions
    assert torch.allclose(known.double().mean(0), torch.full((C,), 3.5 / C, dtype=torch.float64), atol=0.02)


def _objective(ca_mle: bool, epsilon: float, lmt: bool = True, reduction: str = "sum") -> LGTObjective:
    obj = LGTObjective(_model(), lmt=lmt, ca_mle=ca_mle, epsilon=epsilon, reduction=reduction)
    obj.begin_round(Broadcast(round=1, global_params=None), ClientPayload(client_id=0, round=1, seed=0))
    return obj


def test_ca_mle_hides_exactly_the_labels_the_global_model_is_unsure_of():
    obj = _objective(ca_mle=True, epsilon=0.05)
    x, y = torch.randn(64, 1, 56, 56), (torch.rand(64, C) < 0.3).float()
    torch.manual_seed(7)
    lmt = label_mask_training(y, 0.75)
    torch.manual_seed(7)
    known = obj.known_mask(x, y)
    with torch.no_grad():  # the global model: a separate copy, eval mode, every state unknown
        ref = _model().eval()
        p = torch.sigmoid(ref(x)).double()
    unsure = (p - 0.5).abs() <= 0.05
    assert unsure.any() and (lmt & ~unsure).any()
    assert torch.equal(known, lmt & ~unsure)


def test_the_loss_is_bce_summed_over_the_unknown_labels_only():
    for reduction in ("sum", "mean"):
        obj = _objective(ca_mle=False, epsilon=0.0, reduction=reduction)
        obj.model.eval()  # no dropout: the two forward passes below must agree
        x, y = torch.randn(16, 1, 56, 56), (torch.rand(16, C) < 0.3).float()
        torch.manual_seed(11)
        loss = obj.loss_terms((x, y))["bce"]
        torch.manual_seed(11)
        known = label_mask_training(y, 0.75)
        states = torch.where(known, torch.where(y > 0, POSITIVE, NEGATIVE), UNKNOWN)
        with torch.no_grad():
            z = obj.model(x, states).double()
        total, n = 0.0, 0
        for b in range(16):
            for c in range(C):
                if not known[b, c]:
                    p = 1.0 / (1.0 + math.exp(-float(z[b, c])))
                    total += -(float(y[b, c]) * math.log(p) + (1 - float(y[b, c])) * math.log(1 - p))
                    n += 1
        want = total if reduction == "sum" else total / n
        # the same float32 logits on both sides; float32 BCE terms and their (pairwise) sum
        # over ~100 positions: relative error well under 100 * 2**-23 ~ 1.2e-5
        assert float(loss.detach()) == pytest.approx(want, rel=2e-5)


# --- whole runs -----------------------------------------------------------------------------
@pytest.mark.slow
def test_fedlgt_runs_fedctran_bit_for_bit_ca_mle_eps_0_and_multilabel_metrics_on_ray(
    tmp_path, data_root, ray_workers
):
    """Four small runs, each doing double duty. (1) FedC-Tran is FedLGT with learned label
    embeddings and CA-MLE off, bit for bit (lines and checkpoint); (2) CA-MLE with epsilon 0
    equals CA-MLE off (it hides nothing); (3) FedLGT's label embeddings are never sent: its
    bytes each way are FedC-Tran's less the label table; (4) FedLGT on local Ray (two pooled
    workers) logs multilabel metrics that scikit-learn recomputes from the saved predictions."""

    # one transformer layer and 2 steps of 8 a round: the properties hold at any size, and C-Tran's
    # 3 layers x 3 steps of 16 were 3x the CPU of each of the four runs
    lean = [*ML, "model.layers=1", "fl.local_steps=2", "fl.batch_size=8"]

    def run(name: str, *extra: str) -> tuple[list[dict], Path]:
        cfg = compose(small(tmp_path, *lean, "runtime=serial", f"run_id={name}", *extra))
        return _records(start_run(cfg, console=False)[1]), tmp_path / "default" / name

    def same(r: dict) -> dict:
        return {k: v for k, v in r.items() if "time" not in k and not k.startswith("driver_")}

    ctran, ctran_dir = run("ctran", "method=fedctran")
    learned = ("method=fedlgt", "method.label_embedding=learned")
    off, off_dir = run("learned", *learned, "method.ca_mle=false")
    eps0, _ = run("eps0", *learned, "method.epsilon=0")
    assert [same(r) for r in eps0] == [same(r) for r in off]  # (2)
    assert [same(r) for r in ctran] == [same(r) for r in off]  # (1)
    a = torch.load(sorted((ctran_dir / "checkpoints").glob("round-*.pt"))[-1], weights_only=True)
    b = torch.load(sorted((off_dir / "checkpoints").glob("round-*.pt"))[-1], weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # two pooled workers (warm from the test before, `ray_workers`), one torch thread each (2
    # threads spin on a busy machine: 3x the CPU)
    two = ["runtime.num_actors=2", "runtime.threads_per_client=1"]
    cfg = compose(small(tmp_path, *lean, "method=fedlgt", "runtime=ray", *two, "eval.save_predictions=true",
                        "run_id=lgt"))  # fmt: skip
    summary, run_dir = start_run(cfg, console=False, session=ray_workers)
    recs = _records(run_dir)
    assert summary["executor"] == "ray" and summary["num_actors"] == 2
    # (3) FedLGT sends everything FedC-Tran sends but the label embeddings: 10 labels, 384-d
    # float32 (model.d_model null: both take MiniLM's width); FedC-Tran's state embeddings are
    # frozen text features as in the authors' code, sent by neither
    per_client = 10 * 384 * 4
    for c, g in zip(ctran, recs, strict=True):
        assert c["bytes_up"] - g["bytes_up"] == c["clients"] * per_client
        assert c["bytes_down"] - g["bytes_down"] == c["clients"] * per_client
    # (4)
    assert [r["round"] for r in recs] == [1, 2]
    for r in recs:
        assert all(math.isfinite(r[k]) for k in ("c_ap", "o_ap", "c_f1", "o_f1", "c_p", "c_r", "o_p", "o_r"))
    assert summary["primary_metric"] == "c_ap" and summary["final_c_ap"] == recs[-1]["c_ap"]
    saved = np.load(run_dir / "predictions.npz")
    scores, y = saved["scores"].astype(np.float64), saved["targets"].astype(int)
    assert int(saved["round"]) == 2 and scores.shape == y.shape == (120, 10)
    pred = (scores > 0.0).astype(int)  # sigmoid(score) > 0.5
    last = recs[-1]
    cp = precision_score(y, pred, average="macro", zero_division=0)
    cr = recall_score(y, pred, average="macro", zero_division=0)
    op = precision_score(y, pred, average="micro", zero_division=0)
    orr = recall_score(y, pred, average="micro", zero_division=0)
    want = {
        "c_ap": average_precision_score(y, scores, average="macro"),
        "o_ap": average_precision_score(y, scores, average="micro"),
        "c_f1": 2 * cp * cr / (cp + cr) if cp + cr else 0.0,  # of macro P and R (spec §2.10)
        "o_f1": 2 * op * orr / (op + orr) if op + orr else 0.0,
    }
    for k, v in want.items():
        assert last[k] == pytest.approx(v, abs=1e-6), k


@pytest.mark.parametrize(
    ("extra", "label_learned", "state_learned"),
    [
        (["method=fedctran"], True, False),  # the authors' code: learned labels, frozen text states
        (["method=fedctran", "method.state_embedding=learned"], True, True),  # the paper's wording
        (["method=fedlgt"], False, False),
        (["method=fedlgt", "method.state_embedding=learned"], False, True),
        (["method=fedlgt", "method.label_embedding=frozen_random"], False, False),
        (["method=fedlgt", "method.targets=permuted", "method.state_targets=orthogonal"], False, False),
    ],
)
def test_which_embedding_tables_are_learned_and_sent(
    tmp_path, data_root, extra, label_learned, state_learned
):
    from fl_lightning.runtime.build import prepare

    p = prepare(compose(small(tmp_path, *ML, "runtime=serial", *extra)))
    model = p.objective.model
    keys = set(p.init_params or {})
    for name, learned in (("label_emb", label_learned), ("state_emb", state_learned)):
        assert (name in keys) is learned  # a learned table is in the state dict: sent and averaged
        assert isinstance(getattr(model, name), torch.nn.Parameter) is learned
    from fl_lightning.text import class_text_features

    words = class_text_features({"name": "minilm"}, ["positive", "negative"], templates=["{}"])
    if "method.state_targets=orthogonal" in extra:  # each table its own control
        labels = class_text_features(
            {"name": "minilm"}, list(FMNIST_CLASSES), templates=["The photo contains {}."]
        )
        perm = derangement(10, 0)  # the run's seed 0
        assert torch.equal(model.label_emb, labels[perm].float())
        torch.testing.assert_close(model.state_emb @ model.state_emb.T, torch.eye(2), atol=1e-5, rtol=0)
    elif not state_learned and "frozen_random" not in extra[-1]:  # the text features of the state words
        assert torch.equal(model.state_emb, words.float())


@pytest.mark.parametrize(
    ("override", "says"),
    [
        (["data=fmnist", "model=ctran"], "single-label"),
        (["data=fmnist_multilabel", "model=cnn"], "model=ctran"),
        (["data=fmnist_multilabel", "model=ctran", "method.label_embedding=clip"], "label_embedding"),
        (["data=fmnist_multilabel", "model=ctran", "model.d_model=512"], "d_model must be 384"),
    ],
)
def test_a_run_fedlgt_cannot_do_is_one_line_and_exit_2(tmp_path, capsys, data_root, override, says):
    assert main(["run", "method=fedlgt", *override, f"output_dir={tmp_path}", "logger=none", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not any(tmp_path.iterdir())  # nothing written


# --- the paper's datasets, in their real file formats (tiny) ----------------------------------
def _voc(root: Path) -> None:
    from PIL import Image

    d = root / "VOCdevkit" / "VOC2007"
    (d / "ImageSets" / "Main").mkdir(parents=True)
    (d / "Annotations").mkdir()
    (d / "JPEGImages").mkdir()
    names = ["dog", "person", "cat", "sofa", "car", "bird"]
    rng = np.random.default_rng(0)
    ids = [f"{i:06d}" for i in range(1, 13)]
    for k, i in enumerate(ids):
        objs = [names[k % 6], names[(k * 5 + 1) % 6]]
        xml = "".join(f"<object><name>{n}</name><difficult>0</difficult></object>" for n in objs)
        doc = f"<annotation><filename>{i}.jpg</filename>{xml}</annotation>"
        (d / "Annotations" / f"{i}.xml").write_text(doc)
        pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(d / "JPEGImages" / f"{i}.jpg")
    (d / "ImageSets" / "Main" / "trainval.txt").write_text("\n".join(ids[:8]) + "\n")
    (d / "ImageSets" / "Main" / "test.txt").write_text("\n".join(ids[8:]) + "\n")


def _flair(root: Path) -> None:
    h5py = pytest.importorskip("h5py")
    (root / "flair").mkdir(parents=True)
    rng = np.random.default_rng(0)
    users = {
        "train": {
            "u1": ["animal|plant", "food", "plant"],
            "u2": ["animal", "art|food"],
            "u3": ["art", "food|plant"],
        },
        "test": {"t1": ["plant|food", "animal", "art"]},
    }
    with h5py.File(root / "flair" / "flair_federated.hdf5", "w") as f:
        for part, us in users.items():
            for u, labs in us.items():
                f[f"/{part}/{u}/images"] = rng.integers(0, 255, (len(labs), 16, 16, 3), dtype=np.uint8)
                f[f"/{part}/{u}/labels"] = np.asarray(labs, dtype="S")
                f[f"/{part}/{u}/fine_grained_labels"] = np.asarray(["x_y"] * len(labs), dtype="S")
        f["/metadata/label_counter"] = json.dumps({"animal": 3, "plant": 4, "food": 4, "art": 3})


def _coco(root: Path) -> None:
    from PIL import Image

    d = root / "coco"
    (d / "annotations").mkdir(parents=True)
    cats = [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}, {"id": 10, "name": "traffic light"}]
    rng = np.random.default_rng(0)
    for split, ids in (("train2014", range(1, 9)), ("val2014", range(20, 24))):
        images = [{"id": i, "file_name": f"COCO_{split}_{i:012d}.jpg"} for i in ids]
        pairs = [(i, cats[(i + k) % 3]["id"]) for i in ids for k in range(1 + i % 2)]  # 1-2 labels
        anns = [{"image_id": i, "category_id": c} for i, c in pairs]
        (d / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": anns, "categories": cats})
        )
        (d / split).mkdir()
        for im in images:
            pixels = rng.integers(0, 255, (18, 22, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(d / split / im["file_name"])


@pytest.mark.parametrize(
    ("data", "build", "extra"),
    [
        ("voc2007", _voc, ["fl.num_clients=2", "data.min_size=1"]),
        ("coco", _coco, ["fl.num_clients=2", "data.min_size=1"]),
        ("flair", _flair, ["fl.num_clients=3", "data.partition=natural"]),  # one client per user
    ],
)
def test_fedlgt_trains_end_to_end_on_the_papers_file_formats(tmp_path, capsys, data, build, extra):
    build(tmp_path / "data")
    args = [f"data={data}", f"data.root={tmp_path / 'data'}", "data.image_size=16", "method=fedlgt",
            "model=ctran", "runtime=serial", "fl.rounds=2", "fl.batch_size=2", "fl.local_steps=2",
            "logger=none", f"output_dir={tmp_path / 'runs'}", "run_id=r", *extra]  # fmt: skip
    assert main(["run", *args, "--quiet"]) == 0
    run_dir = tmp_path / "runs" / "default" / "r"
    summary, recs = json.loads((run_dir / "summary.json").read_text()), _records(run_dir)
    assert capsys.readouterr().out.strip().endswith(f"final_c_ap={summary['final_c_ap']}")  # not accuracy
    assert summary["status"] == "completed" and [r["round"] for r in recs] == [1, 2]
    assert all(math.isfinite(r["c_ap"]) and 0.0 <= r["c_ap"] <= 1.0 for r in recs)
    parts = json.loads((run_dir / "partition.json").read_text())
    assert parts["num_clients"] == int(extra[0].split("=")[1])
