"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629.

Clients run local SGD on cross-entropy; the server takes the example-weighted mean of
every parameter and buffer. This is the base `Strategy`/`ClientObjective` unchanged.
"""

from __future__ import annotations

from ..core.strategy import FedAvgStrategy
from .configs.fedavg import FedAvgConfig


class FedAvg(FedAvgStrategy[FedAvgConfig]):
    pass
