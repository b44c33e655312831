"""A stopping point between decoder layers: a model run that can be stopped within one layer's time."""
from __future__ import annotations

import contextlib
from typing import Callable

from workbench.run.families import decoder_layers

__all__ = ["layer_checkpoint"]


@contextlib.contextmanager
def layer_checkpoint(model, check: Callable[[int], None]):
    """``check(layer)`` before every decoder layer of ``model`` (the network) runs: a forward pre-hook on each block,
    removed on exit. An exception ``check`` raises leaves the forward at that layer (a panel's *cancel* stops within
    one layer's time instead of a whole prefill); the caller drops what the forward had written."""
    handles = []
    try:
        for l, block in enumerate(decoder_layers(model)):
            handles.append(block.register_forward_pre_hook(lambda m, a, l=l: check(l)))
        yield
    finally:
        for h in handles:
            h.remove()
