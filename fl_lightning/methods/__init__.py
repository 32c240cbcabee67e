"""One file per method; importing this package registers them all in `METHODS`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.registry import Registry

if TYPE_CHECKING:
    from ..core.strategy import Strategy

METHODS: Registry[type[Strategy]] = Registry("method")

from . import (  # noqa: E402,F401  (imported to register; after METHODS exists)
    ccvr,
    clip2fl,
    creff,
    ditto,
    fedala,
    fedamp,
    fedavg,
    fedavgm,
    fedbe,
    fedbn,
    feddf,
    feddistill,
    feddtr,
    fedfocal,
    fedfomo,
    fedglcl,
    fedlc,
    fedlgt,
    fednova,
    fedper,
    fedphp,
    fedproto,
    fedprox,
    fedrep,
    fedrod,
    fedtgp,
    fedtsp,
    lg_fedavg,
    local,
    moon,
    perfedavg,
    pfedme,
    scaffold,
    taunorm,
)
