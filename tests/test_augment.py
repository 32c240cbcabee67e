"""`data.image_size` on datasets read at their native size, and `data.augment`: the batched
per-image ops are torchvision's, seeded per step; a CIFAR run (real images from foolbox's wheel,
in CIFAR-10's own pickle format) trains differently with them; AlexNet-BN runs on
Fashion-MNIST at 64 px. (Serial == Ray, resume and resident == DataLoader with augmentation on
are in test_engine.py and test_resume.py.)"""

import json
from pathlib import Path

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from fl_lightning.config import compose
from fl_lightning.core.augment import Augment, augment_batch, hflip, random_crop, rotate, step_seed
from fl_lightning.data.registry import load_from_config
from fl_lightning.runtime.runner import start_run

from .conftest import small
from .real_images import cifar10_root


def test_augmentations_are_torchvisions_ops_with_a_draw_per_image():
    x = torch.randn(12, 3, 16, 16)
    fill = [-1.0, -2.0, -3.0]
    g = torch.Generator().manual_seed(1)
    top, left = torch.randint(0, 9, (12,), generator=g), torch.randint(0, 9, (12,), generator=g)
    expect = torch.stack(
        [F.crop(F.pad(x[i], [4], fill=fill), int(top[i]), int(left[i]), 16, 16) for i in range(12)]
    )
    assert torch.equal(random_crop(x, 4, fill, torch.Generator().manual_seed(1)), expect)
    assert len({(int(t), int(u)) for t, u in zip(top, left, strict=True)}) > 1  # not one crop for all
    g = torch.Generator().manual_seed(2)
    angles = (torch.rand(12, generator=g, dtype=torch.float64) * 2 - 1) * 30
    expect = torch.stack([F.rotate(x[i], float(angles[i]), fill=fill) for i in range(12)])
    assert torch.equal(rotate(x, 30, fill, torch.Generator().manual_seed(2)), expect)
    flipped = hflip(x, torch.Generator().manual_seed(3))
    mirrored = [torch.equal(flipped[i], x[i].flip(-1)) for i in range(12)]
    assert all(m or torch.equal(flipped[i], x[i]) for i, m in enumerate(mirrored)) and 0 < sum(mirrored) < 12
    aug = Augment(("random_crop", "hflip", "rotate"), fill=(-1.0,))
    a, b = (augment_batch(x, aug, step_seed(7, s)) for s in (0, 1))
    assert torch.equal(a, augment_batch(x, aug, step_seed(7, 0))) and not torch.equal(a, b)
    assert step_seed(7, 0) != step_seed(8, 0)  # the fit's seed: (run seed, round, client)


def test_augmentation_changes_a_cifar_run_and_is_recorded(tmp_path):
    root = cifar10_root(tmp_path / "data")
    args = ["data=cifar10", f"data.root={root}", "data.partition=iid", "fl.num_clients=2", "fl.rounds=1",
            "fl.batch_size=4", "runtime=serial", "logger=none", f"output_dir={tmp_path}/runs"]  # fmt: skip
    plain, pdir = start_run(compose([*args, "run_id=plain"]), console=False)
    aug = ["data.augment=[random_crop,hflip,rotate]", "data.augment_degrees=30"]
    augmented, adir = start_run(compose([*args, *aug, "run_id=aug"]), console=False)
    loss = [json.loads((d / "metrics.jsonl").read_text().splitlines()[0])["train_loss"] for d in (pdir, adir)]
    assert np.isfinite(loss).all() and loss[0] != loss[1]
    text = (adir / "config.yaml").read_text()
    assert "- random_crop\n" in text and "augment_degrees: 30" in text and "augment_padding: 4" in text
    assert "augment: []" in (pdir / "config.yaml").read_text()


def test_alexnet_bn_on_fashion_mnist_at_64px(tmp_path, data_root):
    """FedGLCL's AlexNet-BN needs >= 63 px; Fashion-MNIST's 28 px images are resized once when
    loaded, cached, and a cached copy of the wrong shape is rebuilt."""
    args = small(tmp_path, "model=alexnet_bn", "model.hidden=64", "data.image_size=64", "fl.rounds=1",
                 "fl.num_clients=2", "data.train_subset=64", "data.test_subset=32", "runtime=serial",
                 f"data.root={tmp_path / 'data'}")  # fmt: skip
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "fashion-mnist").symlink_to(Path(data_root) / "fashion-mnist")  # its own .cache/
    summary, run_dir = start_run(compose(args), console=False)
    assert summary["status"] == "completed" and "image_size: 64" in (run_dir / "config.yaml").read_text()
    ds = load_from_config(compose(args).data)
    assert ds.train_x.shape == (64, 1, 64, 64) and ds.train_x.dtype == np.uint8
    cached = list((tmp_path / "data" / ".cache").glob("fmnist-64px-*.npz"))
    assert len(cached) == 1
    np.savez(cached[0], train=np.zeros((64, 1, 32, 32), np.uint8), test=ds.test_x)  # wrong size
    again = load_from_config(compose(args).data)
    assert np.array_equal(again.train_x, ds.train_x)
    with np.load(cached[0]) as z:
        assert z["train"].shape == (64, 1, 64, 64)  # rebuilt
    big = again.train_x.astype(np.float64).mean(axis=(2, 3))
    from fl_lightning.data.registry import load_dataset

    native = load_dataset("fmnist", data_root).train_x[:64].astype(np.float64).mean(axis=(2, 3))
    assert np.abs(big - native).max() < 3  # the same pictures, larger (mean brightness kept)
