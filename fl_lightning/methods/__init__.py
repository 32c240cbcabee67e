"""One file per method; importing this package registers them all in `METHODS`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.registry import Registry

if TYPE_CHECKING:
    from ..core.strategy import Strategy

METHODS: Registry[type["Strategy"]] = Registry("method")

from . import fedavg, fedbn, fedglcl, fedlc, fednova, fedprox, fedproto, moon, scaffold  # noqa: E402,F401
from . import feddistill, fedtgp, fedtsp, lg_fedavg, local  # noqa: E402,F401  (heterogeneous-model FL)
