"""Datasets, partitioners, per-client splits and partition statistics.

Importing this package imports every dataset loader, so registering into `DATASETS`
(`registry.py`) happens here, in one place, whichever `fl_lightning.data` module is
imported first. The loaders need numpy only (torch, torchvision, PIL and h5py are imported
when a dataset is loaded).
"""

from . import (  # noqa: F401  (register)
    coop,
    coop_multi,
    datasets,
    fmnist_digits20,
    folders,
    frozen_features,
    glue,
    multilabel,
    standins,
    themed_mosaics,
)
