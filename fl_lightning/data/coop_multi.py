"""`data=coop_multi`: several datasets of CoOp's suite (`coop.py`) federated in one run, FedTPG's
cross-class protocol (`Launch_FL.py --exp_name cross_cls`; github:boschresearch/FedTPG @f141c29,
`config/utils.py` and `federated/server.py:init_server`).

`data.datasets` lists the members (null: FedTPG's nine, in its order: `FEDTPG_NINE`); each is
read from its own CoOp layout under `data.root`, with the same protocol (`data.shots`, drawn per
member before decoding, `data.image_size`). One label space: the members' labels in the list's
order, each offset by the classes before it; the class names are their union, in that order
(a name two members share stays twice: each scores its own dataset's images). The dataset
records its members (`ArrayDataset.class_sets`), and from them:

* `data.base_new=true` trains on each member's own base half (its first ceil(C_i/2) classes),
  as the authors' `TRAIN.SPLIT = 'base'` per dataset (`protocols.py`);
* `data.partition=class_blocks` cuts each member's training classes into blocks of
  `data.classes_per_client` on its own (no block spans two datasets), round(m_i / C) clients a
  member, added up (`partition.class_blocks`): FedTPG's nine at C = 20 make 30;
* the evaluation scores each member on its own classes (`core.metrics.EvalSpec.base_new_sets`):
  `base_accuracy_<name>`, `new_accuracy_<name>`, `base_new_hm_<name>`, and their unweighted
  averages over the members as `base_accuracy`, `new_accuracy`, `base_new_hm`; FedTPG's prompt
  generator reads each member's base (and new) names apart (`methods/fedtpg.py`).

Refused before any work (`check_data`): a name that is not a trainable CoOp dataset, one listed
twice, a member missing on disk (each missing one named with what to get and where, as for the
dataset alone), and under `data.partition=class_blocks` a block size that leaves a member no
block of its own (round(m_i / C) = 0: C more than twice its m_i classes; the authors' code then
still makes it one client).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from .coop import CLIP_MEAN, CLIP_STD, LISTINGS
from .registry import DATASETS, ArrayDataset, DatasetEntry

NAME = "coop_multi"
#: FedTPG's `cross_cls` datasets (`config/utils.py`, `DATASET.NAME_SPACE`), in its order
FEDTPG_NINE = (
    "caltech101", "oxford_flowers", "fgvc_aircraft", "ucf101", "oxford_pets", "food101", "dtd",
    "stanford_cars", "sun397",
)  # fmt: skip


def trainable() -> list[str]:
    """The CoOp datasets a composite may hold: those with training images (not ImageNet's
    test-only variants)."""
    return [name for name, (suite, _) in LISTINGS.items() if not suite.test_only]


def members(datasets: Sequence[str] | None) -> tuple[str, ...]:
    """The member list (`data.datasets`; None: FedTPG's nine), checked."""
    names = FEDTPG_NINE if datasets is None else tuple(str(d) for d in datasets)
    valid = trainable()
    unknown = [d for d in names if d not in valid]
    if unknown:
        raise ConfigError(f"data.datasets: unknown CoOp dataset {unknown[0]!r}; valid: {', '.join(valid)}")
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"data.datasets must name one dataset or more, each once (got {list(names)})")
    return names


def _present(root: str, datasets: Sequence[str] | None = None) -> bool:
    return all(DATASETS.get(m).present(root) for m in members(datasets))


def _where(root: str, datasets: Sequence[str] | None = None) -> str:
    """What is missing: each absent member's own line, joined (every member's when none is)."""
    names = members(datasets)
    absent = [m for m in names if not DATASETS.get(m).present(root)] or list(names)
    return "; ".join(DATASETS.get(m).where(root) for m in absent)


def _check(data: Mapping[str, Any]) -> None:
    """Under `data.partition=class_blocks`, every member makes a block of its own: round(m / C)
    >= 1 for its m training classes (its base half under `data.base_new`). The class names
    are read from the members' split files, no image."""
    if data.get("partition") != "class_blocks":
        return
    from ..core.metrics import base_class_count

    c = int(data.get("classes_per_client") or 1)
    for m in members(data.get("datasets")):
        _, read = LISTINGS[m]
        n = len(read(str(data["root"]))[2])
        trained = base_class_count(n) if data.get("base_new") else n
        if int(np.around(trained / c)) < 1:
            half = " base" if data.get("base_new") else ""
            raise ConfigError(
                f"data.classes_per_client={c} is more than twice {m}'s {trained}{half} classes: round("
                f"{trained}/{c}) = 0 leaves it no block of its own (FedTPG's 20 makes OxfordPets' 19 one "
                f"client); use data.classes_per_client <= {2 * trained - 1}"
            )


def load(
    root: str,
    datasets: Sequence[str] | None = None,
    image_size: int | None = None,
    shots: int | None = None,
    shots_seed: int = 1,
    personal_shots: int | None = None,
) -> ArrayDataset:
    """Each member by its own loader (its k-shot draw before decoding), then one label space."""
    names = members(datasets)
    parts = [DATASETS.get(m).load(root, image_size, shots, shots_seed, personal_shots) for m in names]
    offsets = np.cumsum([0] + [p.num_classes for p in parts])[:-1]
    personal = None
    if any(p.train_personal is not None for p in parts):
        pools = [p.train_personal if p.train_personal is not None else np.zeros(len(p.train_y), bool)
                 for p in parts]  # fmt: skip
        personal = np.concatenate(pools)
    return ArrayDataset(
        NAME,
        np.concatenate([p.train_x for p in parts]),
        np.concatenate([p.train_y + o for p, o in zip(parts, offsets, strict=True)]),
        np.concatenate([p.test_x for p in parts]),
        np.concatenate([p.test_y + o for p, o in zip(parts, offsets, strict=True)]),
        [c for p in parts for c in p.class_names],
        mean=CLIP_MEAN,
        std=CLIP_STD,
        train_personal=personal,
        class_sets=tuple((m, p.num_classes) for m, p in zip(names, parts, strict=True)),
    )


DATASETS.register(NAME)(
    DatasetEntry(load=load, present=_present, where=_where, check=_check, members=members)
)
