"""GLUE text classification: SST-2 (Socher et al. 2013 in GLUE, Wang et al. 2019), the
single-sentence task of FFA-LoRA's GLUE experiments (Sun et al., ICLR 2024), for the adapter
methods' paper scale (`model=hf_lora`, `conf/reproduce/adapters.yaml`).

On disk, GLUE's own files: `<root>/SST-2/train.tsv` and `<root>/SST-2/dev.tsv` (a
`sentence<TAB>label` header, then one sentence and its 0/1 label a line), as the zip at
`SST2_URL` unpacks; `data.download=true` (or `fl-lightning fetch sst2`) fetches it. GLUE's
test labels are not public, so the test split is `dev.tsv` (what FFA-LoRA and every GLUE paper
report).

The pipeline carries uint8 arrays [N, C, H, W]; a sentence travels as its UTF-8 bytes, zero-padded,
[N, 1, 1, L] (L: the longest sentence, at most `MAX_BYTES`), with mean 0 and std 1/255 so a
model sees the byte values themselves (`core/sentences.py`); the model tokenizes them with its own
tokenizer (`models/hf_lora.py`). Partitioning (IID, Dirichlet over the labels) is the images'.
"""

from __future__ import annotations

import csv
import io
import shutil
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from ..core.sentences import BYTE_MEAN, BYTE_STD, encode_sentences
from .registry import DATASETS, ArrayDataset, DatasetEntry

#: the datasets of sentences (bytes, not pixels): only a model that tokenizes them takes them
TEXT_DATASETS = ("sst2",)
SST2_DIR = "SST-2"
SST2_URL = "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"
SST2_CLASSES = ("negative", "positive")


def _sst2_where(root: str) -> str:
    d = Path(root) / SST2_DIR
    return (
        f"SST-2 (GLUE) not found: expected {d}/train.tsv and {d}/dev.tsv (fetch them with "
        f"`fl-lightning fetch sst2 --root {root}`, or data.download=true, or unzip {SST2_URL} into {root})"
    )


def _sst2_present(root: str) -> bool:
    d = Path(root) / SST2_DIR
    return (d / "train.tsv").is_file() and (d / "dev.tsv").is_file()


def _read_tsv(path: Path) -> tuple[list[str], np.ndarray]:
    sentences, labels = [], []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None or header[:2] != ["sentence", "label"]:
            raise ConfigError(f"{path} is not GLUE's SST-2 file (its header is not 'sentence<TAB>label')")
        for n, row in enumerate(reader, start=2):
            if len(row) != 2 or row[1] not in ("0", "1"):
                raise ConfigError(f"{path} line {n}: expected 'sentence<TAB>0|1', got {row!r:.80}")
            sentences.append(row[0])
            labels.append(int(row[1]))
    return sentences, np.asarray(labels, dtype=np.int64)


def _load_sst2(root: str) -> ArrayDataset:
    d = Path(root) / SST2_DIR
    train_s, train_y = _read_tsv(d / "train.tsv")
    test_s, test_y = _read_tsv(d / "dev.tsv")
    if not train_s or not test_s:
        raise ConfigError(_sst2_where(root) + " (found no sentences)")
    width = max(encode_sentences(train_s).shape[3], encode_sentences(test_s).shape[3])

    def pad(x: np.ndarray) -> np.ndarray:  # train and test: one width
        return np.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - x.shape[3])))

    return ArrayDataset(
        "sst2", pad(encode_sentences(train_s)), train_y, pad(encode_sentences(test_s)), test_y,
        list(SST2_CLASSES), mean=BYTE_MEAN, std=BYTE_STD,
    )  # fmt: skip


def fetch_sst2(root: str) -> None:
    """Download GLUE's SST-2 zip and unpack `SST-2/{train,dev}.tsv` into `root` (moved into
    place only when complete)."""
    dest = Path(root) / SST2_DIR
    Path(root).mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(SST2_URL, timeout=60) as r:  # noqa: S310  (a fixed https URL)
        blob = r.read()
    with tempfile.TemporaryDirectory(dir=root) as tmp, zipfile.ZipFile(io.BytesIO(blob)) as z:
        for name in ("train.tsv", "dev.tsv"):
            (Path(tmp) / name).write_bytes(z.read(f"{SST2_DIR}/{name}"))
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("train.tsv", "dev.tsv"):
            shutil.move(str(Path(tmp) / name), dest / name)


DATASETS.register("sst2")(
    DatasetEntry(
        load=_load_sst2,
        present=_sst2_present,
        where=_sst2_where,
        download=fetch_sst2,
        class_names=SST2_CLASSES,
        inputs="sentences",
    )
)
