"""Token-level figures at scale: decimation to the screen, and the full data kept for export.

A figure with one value per prompt token sends ``T`` values per trace (a residual heatmap sends
``H_Q · T`` cells: 1M at T = 32k), more than a slider step can move. :func:`token_bins` splits the
token axis into at most ``width_px`` contiguous bins (about one per screen pixel of the figure); a figure
then plots one value per bin (the maximum, or the mean, of its tokens, say which in the hover) at the bin's
first token, and the hover names the bin's token range. Below ``width_px`` tokens nothing changes (one bin
per token, exact values).

The full-resolution data (every token) is kept beside the figure (:func:`attach_full`) and written by
:func:`workbench.show.export.export` as the CSV sidecar, so an export loses nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import pandas as pd

from workbench.checks import Choice, Interval
from workbench.constraints import register_all

__all__ = ["TokenBins", "token_bins", "attach_full", "full_frame", "DEFAULT_WIDTH_PX", "Reduce"]

DEFAULT_WIDTH_PX = 1000
"""Bins of a token axis by default: about the plot width of a figure in pixels."""

Reduce = Literal["max", "mean"]

_CHECKS = register_all("token_bins", {"how": Choice(get_args(Reduce)), "T": Interval("int", 0),
                                      "width_px": Interval("int", 1)}, __name__)

_ATTR = "_workbench_full_data"


@dataclass(frozen=True)
class TokenBins:
    """Contiguous bins ``[lo_b, hi_b)`` covering tokens ``offset … offset + T - 1``.

    Attributes:
        T: tokens on the axis; ``offset``: position of the first one.
        edges: int64 ``[n + 1]`` bin edges relative to ``offset`` (``edges[0] = 0``, ``edges[-1] = T``).
    """

    T: int
    offset: int
    edges: np.ndarray

    @property
    def n(self) -> int:
        return len(self.edges) - 1

    @property
    def exact(self) -> bool:
        """One token per bin: the figure shows exact values."""
        return self.n == self.T

    @property
    def lo(self) -> np.ndarray:
        """First position of every bin (absolute), int64 ``[n]``."""
        return self.edges[:-1] + self.offset

    @property
    def hi(self) -> np.ndarray:
        """Last position of every bin (absolute, inclusive), int64 ``[n]``."""
        return self.edges[1:] - 1 + self.offset

    @property
    def width(self) -> int:
        """Largest number of tokens in a bin."""
        return int(np.diff(self.edges).max()) if self.n else 0

    def reduce(self, x, how: Reduce = "max") -> np.ndarray:
        """``x [..., T]`` → ``[..., n]``: the max or the mean of each bin's tokens (``x`` itself when exact)."""
        _CHECKS["how"].check("how", how)
        a = np.asarray(x)
        if a.shape[-1] != self.T:
            raise ValueError(f"x: last axis must have length T = {self.T}, got {a.shape[-1]}")
        if self.exact:
            return a
        starts = self.edges[:-1]
        if how == "max":
            return np.maximum.reduceat(a, starts, axis=-1)
        return np.add.reduceat(a.astype(np.float64), starts, axis=-1) / np.diff(self.edges)

    def any(self, mask) -> np.ndarray:
        """Bool ``[..., n]``: some token of the bin is set."""
        return self.reduce(np.asarray(mask, dtype=np.uint8), "max").astype(bool)

    def labels(self, tokens=None) -> list[str]:
        """Hover label of every bin: the token (exact) or the range ``lo–hi (n tokens)``."""
        if self.exact:
            return list(tokens) if tokens is not None else [str(p) for p in self.lo]
        return [f"{a}–{b} ({b - a + 1} tokens)" for a, b in zip(self.lo.tolist(), self.hi.tolist())]

    def describe(self, how: Reduce = "max") -> str:
        """A note for titles and hovers (empty when exact)."""
        return "" if self.exact else f"{how} over bins of ≤ {self.width} tokens"


def token_bins(T: int, width_px: int | None = None, *, offset: int = 0) -> TokenBins:
    """Bins for a token axis of ``T`` tokens shown ``width_px`` pixels wide (default :data:`DEFAULT_WIDTH_PX`):
    ``min(T, width_px)`` bins of equal size up to one token."""
    _CHECKS["T"].check("T", T)
    w = DEFAULT_WIDTH_PX if width_px is None else _CHECKS["width_px"].check("width_px", width_px)
    n = min(T, w)
    edges = np.round(np.linspace(0, T, n + 1)).astype(np.int64) if n else np.zeros(1, dtype=np.int64)
    return TokenBins(T=int(T), offset=int(offset), edges=edges)


def attach_full(fig, frame):
    """Keep ``frame`` (a DataFrame of every token, or a function making it on demand: a slider move pays
    nothing) beside ``fig`` for the export's CSV sidecar, as a private attribute of the figure object (not
    in its JSON: never sent to a widget); returns ``fig``. A copy of the figure does not carry it."""
    object.__setattr__(fig, _ATTR, frame)
    return fig


def full_frame(fig) -> pd.DataFrame | None:
    """The full-resolution data attached to ``fig`` by :func:`attach_full`, or ``None``."""
    f = getattr(fig, _ATTR, None)
    return f() if callable(f) else f
