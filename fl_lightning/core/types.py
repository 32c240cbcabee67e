"""Type aliases that name each piece of data once."""
from __future__ import annotations

from typing import Dict

import torch

ClientId = int
StateDict = Dict[str, torch.Tensor]
Metrics = Dict[str, float]
