"""Type aliases that name each piece of data once."""

from __future__ import annotations

from typing import Any

import torch

ClientId = int
StateDict = dict[str, torch.Tensor]
Metrics = dict[str, float]
#: A client's memory between rounds, keyed by component ("personal", "moon/prev",
#: "scaffold/c_local", ...), so several stateful parts of one method coexist. Values are
#: checkpointable: tensors, state dicts, numbers, strings, lists and dicts of them. It stays
#: resident in the host that runs the client; the driver never holds it.
ClientState = dict[str, Any]
