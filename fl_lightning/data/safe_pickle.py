"""Pickles from a data root, read without running code.

A data root is shared and so untrusted: `pickle.load` would run whatever a planted file's
`__reduce__` names. `load_data_pickle` resolves only the globals that plain containers and
numpy arrays need (what the official CIFAR python batches and FedBN split files hold) and
raises a ConfigError naming the file for anything else.
"""

from __future__ import annotations

import _codecs
import importlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError


def _multiarray(name: str) -> Any:
    try:  # numpy 2 moved numpy.core to numpy._core; pickles written by either name it
        return getattr(importlib.import_module("numpy._core.multiarray"), name)
    except ImportError:
        return getattr(importlib.import_module("numpy.core.multiarray"), name)


#: what an ndarray pickle needs: its reconstructor, the class, its dtype, and (protocol 2
#: from Python 3) bytes as `_codecs.encode(str, "latin1")`
_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")
ARRAY_GLOBALS: dict[tuple[str, str], Any] = {
    **{(m, "_reconstruct"): _multiarray("_reconstruct") for m in _MODULES},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _codecs.encode,
}
#: numpy scalars (np.str_ items of an object array, as FedBN's split files hold)
SCALAR_GLOBALS: dict[tuple[str, str], Any] = {(m, "scalar"): _multiarray("scalar") for m in _MODULES}


class _Refused(pickle.UnpicklingError):
    pass


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, allowed: dict[tuple[str, str], Any]) -> None:
        super().__init__(file, encoding="latin1")  # Python 2 pickles (CIFAR's) hold str as bytes
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise _Refused(f"it names {module}.{name}, which a data file never needs")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it holds a persistent id")


def load_data_pickle(path: Path, what: str, scalars: bool = False) -> Any:
    """The object pickled in `path`, holding only containers, str/bytes, numbers and numpy
    arrays (and numpy scalars with `scalars`); ConfigError `<what> file <path> ...` otherwise."""
    allowed = {**ARRAY_GLOBALS, **SCALAR_GLOBALS} if scalars else ARRAY_GLOBALS
    try:
        with open(path, "rb") as f:
            return _Unpickler(f, allowed).load()
    except _Refused as e:
        raise ConfigError(f"{what} file {path} refused: {e} (not loaded; replace the file)") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} file {path}: {e.strerror or e}") from None
    except Exception as e:  # truncated or garbage: EOFError, UnpicklingError, ValueError, ...
        raise ConfigError(f"{what} file {path} is corrupt ({type(e).__name__}); replace it") from None
