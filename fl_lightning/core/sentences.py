"""Sentences through a pipeline that carries uint8 arrays [N, C, H, W] (`data.registry.ArrayDataset`):
each sentence as its UTF-8 bytes, zero-padded, [N, 1, 1, L], in a normalisation (`BYTE_MEAN`,
`BYTE_STD`) under which the model sees the byte values themselves. The text datasets write them
(`data/glue.py`) and the text models read them back (`models/hf_lora.py`), each tokenizing
with its own tokenizer."""

from __future__ import annotations

import numpy as np

#: a sentence's bytes kept (SST-2's longest is 268): a model's tokenizer truncates anyway
MAX_BYTES = 512
#: mean and std that make `ArrayDataset.tensors` hand the byte values through: (b/255 - 0)·255
BYTE_MEAN, BYTE_STD = 0.0, 1.0 / 255.0


def encode_sentences(sentences: list[str], max_bytes: int = MAX_BYTES) -> np.ndarray:
    """uint8 [N, 1, 1, L]: each sentence's UTF-8 bytes, zero-padded (no sentence holds a NUL)."""
    raw = [s.encode("utf-8")[:max_bytes] for s in sentences]
    out = np.zeros((len(raw), 1, 1, max((len(r) for r in raw), default=1) or 1), dtype=np.uint8)
    for i, r in enumerate(raw):
        out[i, 0, 0, : len(r)] = np.frombuffer(r, dtype=np.uint8)
    return out


def decode_bytes(x: np.ndarray) -> list[str]:
    """The sentences of byte rows [N, L] (integers 0-255; zeros pad)."""
    return [bytes(int(b) for b in row if b).decode("utf-8", errors="ignore") for row in x]
