"""A process's heavy imports (torch, Lightning, Ray and ours) with Python's cyclic garbage
collector paused, and what they made frozen afterwards (issues 52 and 57: start-up CPU).

Importing torch and Lightning makes ~600,000 objects that live as long as the process
(modules, classes, functions). While they are made, the collector runs every 700 allocations
and scans its younger generations, and its full collections scan all of them: a client
worker's imports took 2.46 CPU-s on 2 cores, 1.84 with the collector paused
(`benchmarks/gc_imports.py`, medians); frozen (`gc.freeze`: moved to a generation the
collector never scans), a full collection during the run no longer walks them (0.17 s each
before, ~0 after).

Only the first call of a process that has anything to import pauses and freezes: later ones
import as usual, so a sweep's runs never freeze (and so never keep) another run's objects.
The objects alive at that point are frozen with the imports' (the command line's parsed
arguments and config): those live as long as the process anyway. Needs neither torch nor
Lightning; the CLI calls it before the driver's imports, a client worker in its constructor.
"""

from __future__ import annotations

import gc
import importlib
import sys
import threading

_lock = threading.Lock()
_frozen = False  # whether this process froze its imports already


def import_heavy(*modules: str) -> None:
    """Import `modules` (those not imported yet), the first time with the cyclic collector
    paused and what exists afterwards frozen; the collector is left as it was found (a
    process that disabled it keeps it disabled)."""
    global _frozen
    todo = [m for m in modules if m not in sys.modules]
    if not todo:
        return
    with _lock:
        first, _frozen = not _frozen, True
    if not first:
        for name in todo:
            importlib.import_module(name)
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in todo:
            importlib.import_module(name)
    finally:
        gc.freeze()  # the imports' objects: never scanned again (nor collected: they live on)
        if enabled:
            gc.enable()
