"""Pretrained trunks: `fl-lightning pretrain` writes a weights file that `model.weights=`
loads into every backbone with the same trunk (and no other), EfficientNet-Lite0's ImageNet
weights load offline from their package and recognise real photographs, the long-tailed
mosaics keep the pretraining images out, and a run records what it started from."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.errors import ConfigError
from fl_lightning.models import build_model
from fl_lightning.models.weights import load_trunk, read_weights, save_weights

from .conftest import small


@pytest.fixture(scope="module")
def trunk_file(tmp_path_factory, data_root) -> Path:
    """A real, small pretraining: 3 epochs on 600 held-out images (55,000..55,599)."""
    out = tmp_path_factory.mktemp("weights") / "fmnist_cnn.pt"
    rc = main(["pretrain", "data=fmnist", "model=cnn", "data.test_subset=1000", "--holdout-size", "600",
               "--epochs", "3", "--out", str(out)])  # fmt: skip
    assert rc == 0 and out.is_file()
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], prefix: str = "") -> None:
    for k, v in b.items():
        assert torch.equal(a[prefix + k], v), k


def test_pretrain_writes_its_trunk_with_the_held_out_accuracy(trunk_file):
    state, meta = read_weights(trunk_file)
    info = meta["info"]
    assert meta["arch"] == "cnn" and info["dataset"] == "fmnist"
    assert info["train_range"] == [55000, 55600] and info["train_images"] == 600
    assert info["test_images"] == 1000
    assert 0.5 < info["held_out_accuracy"] <= 1.0  # ten classes: chance is 0.1
    assert not any(k.startswith("head.") for k in state)  # the classifier is the task's, not the trunk's
    assert {k.split(".")[0] for k in state} == {"features", "neck"}


def test_the_trunk_loads_into_every_backbone_that_has_it(trunk_file):
    state, _ = read_weights(trunk_file)
    cnn = build_model("cnn", 10, 1, 28)
    head = cnn.head.weight.clone()
    load_trunk(cnn, trunk_file)
    _same(cnn.state_dict(), state)
    assert torch.equal(cnn.head.weight, head)  # the head keeps its own initialisation
    # one token per mosaic tile: the same single-image trunk inside tilenet and C-Tran
    tiles = build_model("tilenet", 10, 1, 56)
    load_trunk(tiles, trunk_file)
    _same(tiles.state_dict(), state, "trunk.encoder.")
    ctran = build_model("ctran", 10, 1, 56, trunk="tiles", d_model=64, heads=2, layers=1)
    load_trunk(ctran, trunk_file)
    _same(ctran.state_dict(), state, "trunk.encoder.")
    # each tile's token is the single-image trunk's features of that tile (in float64: batches of
    # 12 tiles and of 3 images may take different float32 kernels)
    x = torch.randn(3, 1, 56, 56, dtype=torch.float64)
    with torch.no_grad():
        tok = ctran.double().trunk(x)  # [B, D, 2, 2]
        top_right = cnn.double().eval().forward_features(x[:, :, :28, 28:])
    assert tok.shape == (3, 512, 2, 2)
    assert torch.allclose(tok[:, :, 0, 1], top_right, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    ("model", "kwargs", "says"),
    [
        ("cnn", {"hidden": 256}, "'neck.0.weight' is (512, 3136) in the file, (256, 3136) in the model"),
        ("cnn_bn", {}, "does not fit this model"),
        ("resnet8", {}, "does not fit this model"),
        ("ctran", {"trunk": "cnn", "d_model": 64, "heads": 2, "layers": 1}, "does not fit this model"),
    ],
)
def test_a_trunk_that_does_not_fit_is_refused_naming_the_mismatch(trunk_file, model, kwargs, says):
    m = build_model(model, 10, 1, 56 if model == "ctran" else 28, **kwargs)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ConfigError, match="does not fit this model") as e:
        load_trunk(m, trunk_file)
    assert says in str(e.value) and "\n" not in str(e.value)
    _same(m.state_dict(), before)  # nothing half-loaded


def test_a_run_starts_from_the_trunk_and_records_it(trunk_file, tmp_path, data_root, capsys):
    from fl_lightning.runtime.build import prepare

    args = small(tmp_path, "runtime=serial", "fl.rounds=1", f"model.weights={trunk_file}", "seed=3")
    p = prepare(compose(args))
    state, _ = read_weights(trunk_file)
    assert p.init_params is not None
    _same(p.init_params, state)  # every client starts from the pretrained trunk
    assert main(["run", *args, "--quiet"]) == 0
    (summary,) = tmp_path.glob("*/*/summary.json")
    rec = json.loads(summary.read_text())["model_weights"]
    assert rec["arch"] == "cnn" and rec["path"] == str(trunk_file)
    assert rec["info"]["held_out_accuracy"] == read_weights(trunk_file)[1]["info"]["held_out_accuracy"]
    assert len(rec["sha256"]) == 16


def test_a_run_resumes_once_its_weights_file_is_gone(trunk_file, tmp_path, data_root, capsys):
    """`model.weights=FILE`, then FILE removed: the resume read FILE again and could not go on,
    though the run had started from it. The run keeps a copy (`model_weights.pt`) and resumes
    from it to the numbers of the run never interrupted; a run without a copy (started before
    runs kept one) is one line saying to put the file back."""
    import shutil

    weights = tmp_path / "w.pt"
    shutil.copy(trunk_file, weights)
    tiny = ["data.train_subset=400", "data.test_subset=100", "fl.num_clients=2", "fl.local_steps=3"]
    args = small(tmp_path, "runtime=serial", *tiny, f"model.weights={weights}")
    assert main(["run", *args, "run_id=whole", "--quiet"]) == 0
    assert main(["run", *args, "fl.rounds=1", "run_id=cut", "--quiet"]) == 0
    run_dir = tmp_path / "default" / "cut"
    assert (run_dir / "model_weights.pt").read_bytes() == trunk_file.read_bytes()
    weights.unlink()
    capsys.readouterr()
    assert main(["resume", str(run_dir), "fl.rounds=2", "--quiet"]) == 0, capsys.readouterr().err
    runs = tmp_path / "default"
    whole, cut = (json.loads((runs / r / "summary.json").read_text()) for r in ("whole", "cut"))
    assert cut["final_accuracy"] == whole["final_accuracy"] and cut["rounds_completed"] == 2
    assert cut["model_weights"] == whole["model_weights"]  # the file named, and its digest
    (run_dir / "model_weights.pt").unlink()
    assert main(["resume", str(run_dir), "fl.rounds=3", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0] and "put the file back" in err[0], err


def test_bad_weights_are_one_line_before_any_work(trunk_file, tmp_path, data_root, capsys):
    hostile = tmp_path / "hostile.pt"
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"state_dict": Payload()}, hostile)
    for weights, says in (
        (tmp_path / "nope.pt", "no such file"),
        (hostile, "not a readable weights file"),
    ):
        rc = main(["run", *small(tmp_path, "runtime=serial", f"model.weights={weights}"), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and says in err[0], err
    # never torch's advice to load it anyway (`weights_only=False` would run the payload)
    assert "refused" in err[0] and "weights_only" not in err[0] and "can still be loaded" not in err[0]
    assert not marker.exists()  # the pickled payload never ran
    # a family of architectures takes no single trunk; a mismatch is named once the model is built
    for extra, says in ((["method=fedproto", "model=htfe_cnn3", "data.client_test_fraction=0.25"],
                             "family of architectures"),
                        (["model=cnn_bn"], "does not fit this model")):  # fmt: skip
        args = small(tmp_path, "runtime=serial", f"model.weights={trunk_file}", *extra)
        rc = main(["run", *args, "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and says in err[0], err
    assert not list(tmp_path.glob("*/*/summary.json"))
    for argv, says in (
        (["pretrain", "data=fmnist"], "needs --out"),
        (["pretrain", "data=fmnist", "--holdout-from", "60000", "--out", str(tmp_path / "w.pt")], "is empty"),
        (["pretrain", "data=fmnist", "--epochs", "0", "--out", str(tmp_path / "w.pt")], "--epochs >= 1"),
        # below a file: refused before the training (it failed only after it, exit 1)
        (
            [
                "pretrain",
                "data=fmnist",
                "--holdout-size",
                "50",
                "--epochs",
                "1",
                "--out",
                str(hostile / "w.pt"),
            ],
            "is a file, not a folder",
        ),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "w.pt").exists()


def test_save_weights_is_whole_or_nothing(tmp_path):
    m = build_model("cnn", 10, 1, 28)
    path = save_weights(tmp_path / "sub" / "w.pt", m, "cnn", {"hidden": 512}, {"held_out_accuracy": 0.5})
    assert [p.name for p in path.parent.iterdir()] == ["w.pt"]  # no temporary left beside it
    state, meta = read_weights(path)
    _same(m.state_dict(), state)
    assert meta["model_kwargs"] == {"hidden": 512}


# --- EfficientNet-Lite0: ImageNet weights inside a package --------------------------------
def _photo(path: Path) -> torch.Tensor:
    from PIL import Image

    im = Image.open(path).convert("RGB").resize((224, 224), Image.Resampling.BICUBIC)
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    return (x - 0.5) / 0.5  # the TF-Lite weights' input range


def test_efficientnet_lite0_loads_offline_and_recognises_real_photographs(tmp_path, monkeypatch):
    """Photographs that ship inside installed packages, against ImageNet classes: Grace
    Hopper (matplotlib) is 652 military uniform; the daisy (scikit-learn) 985; the Chinese
    temple (scikit-learn) a building: bell cote 442, boathouse 449, castle 483, palace 698,
    monastery 663. Nothing may touch the network or torch's download cache."""
    import matplotlib
    import sklearn

    def no_network(*args, **kwargs):
        raise AssertionError("EfficientNet-Lite0 tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    from fl_lightning.models.efficientnet import imagenet_classifier, imagenet_state

    net = imagenet_classifier()
    mpl = Path(matplotlib.get_data_path()) / "sample_data"
    skl = Path(sklearn.__file__).parent / "datasets" / "images"
    with torch.no_grad():
        for path, expected in (
            (mpl / "grace_hopper.jpg", {652}),
            (skl / "flower.jpg", {985}),
            (skl / "china.jpg", {442, 449, 483, 663, 698}),
        ):
            p = net(_photo(path)).softmax(-1)[0]
            top5 = set(p.topk(5).indices.tolist())
            assert int(p.argmax()) in expected, (path, top5)
    assert not (tmp_path / "torch_home").exists()
    # the registered backbone and C-Tran's trunk carry the same ImageNet trunk, without the classifier
    ref = imagenet_state()
    bb = build_model("efficientnet_lite0", 10, 1, 28, feature_dim=384)
    _same(bb.state_dict(), {k: v for k, v in ref.items() if not k.startswith("_fc.")}, "trunk.net.")
    assert not any("_fc." in k for k in bb.state_dict())
    assert bb(torch.randn(2, 1, 28, 28)).shape == (2, 10) and bb.feature_dim == 384
    ct = build_model("ctran", 10, 1, 56, trunk="efficientnet_lite0", d_model=64, heads=2, layers=1)
    assert torch.equal(ct.trunk.net._conv_stem.weight, ref["_conv_stem.weight"])
    assert ct(torch.randn(2, 1, 56, 56)).shape == (2, 10)


# --- the long-tailed mosaics ---------------------------------------------------------------
def test_long_tailed_mosaics_hold_only_images_before_the_source_cut(data_root):
    from fl_lightning.data.datasets import load_fmnist_arrays
    from fl_lightning.data.registry import load_dataset

    tx, ty, _, _ = load_fmnist_arrays(data_root)
    cut = 20000
    ds = load_dataset("fmnist_multilabel", data_root, imbalance_factor=50.0, source_subset=cut)
    tiles = ds.train_x.reshape(-1, 1, 2, 28, 2, 28).transpose(0, 2, 4, 1, 3, 5).reshape(-1, 28 * 28)
    tiles = tiles[tiles.any(axis=1)]  # the images shown (empty tiles are black)
    before = {row.tobytes(): c for row, c in zip(tx[:cut].reshape(cut, -1), ty[:cut], strict=True)}
    after = {row.tobytes() for row in tx[cut:].reshape(len(tx) - cut, -1)} - set(before)
    shown = [t.tobytes() for t in tiles]
    assert all(s in before for s in shown) and not any(s in after for s in shown)
    # every image of the long-tailed subset once: per class, the Cui et al. profile of the source
    per_class = np.bincount([before[s] for s in shown], minlength=10)
    n = np.bincount(ty[:cut], minlength=10)
    want = [min(int(n[c]), max(int(n.max() * (1 / 50) ** (c / 9)), 1)) for c in range(10)]  # written out
    assert per_class.tolist() == want
    # the test mosaics use every test image: balanced
    assert ds.test_x.shape[0] > 3900
    with pytest.raises(ConfigError, match="data.source_subset=70000"):
        load_dataset("fmnist_multilabel", data_root, source_subset=70000)
