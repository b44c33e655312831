"""Colour scales of the heatmaps and token views: linear, log or quantile, chosen by the prompt's length.

Attention over a long prompt is heavy-tailed: a few keys (the sinks, the needle) hold most of the mass and the
other thousands sit near zero. On a linear scale those thousands all take the lowest colour and the structure
among them is invisible. Below :data:`LONG_PROMPT_T` tokens the default stays linear (the values read directly
off the colour bar); from there on it is ``quantile``: colours by rank, every colour an equal share of the cells
shown whatever the distribution, the colour bar's ticks naming the values at those quantiles. ``log``
(``log10`` of the value, floored at :data:`LOG_FLOOR`) spreads a heavy tail too, but not always enough: on a
token-view page of the synthetic 4k prompt 43 % of the tokens still take the lowest tenth of its colours.
The scale in use is always named on the colour bar or key (:func:`scale_title`).
"""
from __future__ import annotations

import numpy as np

from workbench.checks import Choice
from workbench.choices import COLOUR_SCALES, ColourScale
from workbench.constraints import register_all

__all__ = ["LONG_PROMPT_T", "LOG_FLOOR", "default_scale", "resolve_scale", "scaled", "quantile_ranks",
           "scale_title", "QUANTILE_TICKS"]

LONG_PROMPT_T = 2048
"""Prompt length from which the default colour scale is ``quantile`` (linear below)."""
LOG_FLOOR = 1e-6
"""``log`` scale: values below are drawn at the floor (``log10`` of zero is not a colour)."""
QUANTILE_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Where a quantile colour bar names the value."""
_CHECKS = register_all("colour", {"scale": Choice(COLOUR_SCALES)}, __name__)
"""The colour scale a figure is asked for."""


def default_scale(T: int) -> ColourScale:
    """``"linear"`` below :data:`LONG_PROMPT_T` tokens, ``"quantile"`` from there on."""
    return "linear" if T < LONG_PROMPT_T else "quantile"


def resolve_scale(scale: ColourScale | None, log: bool, T: int) -> ColourScale:
    """The scale a figure uses: ``scale``, or ``"log"`` when ``log`` (the older switch), else the default by ``T``.
    ``log=True`` with another ``scale`` is refused (two answers to one question)."""
    if scale is not None:
        _CHECKS["scale"].check("scale", scale)
        if log and scale != "log":
            raise ValueError(f"log, scale: log=True asks for the log scale, scale={scale!r} for another; give one")
        return scale
    return "log" if log else default_scale(T)


def quantile_ranks(x) -> np.ndarray:
    """Every finite value's empirical quantile in ``[0, 1]`` (ties: their mean rank; NaN stays NaN)."""
    a = np.asarray(x, dtype=np.float64)
    out = np.full(a.shape, np.nan)
    ok = np.isfinite(a)
    v = a[ok]
    if v.size == 0:
        return out
    s = np.sort(v)
    lo = np.searchsorted(s, v, side="left")
    hi = np.searchsorted(s, v, side="right") - 1
    out[ok] = (lo + hi) / 2.0 / max(1, v.size - 1)
    return out


def scaled(x, scale: ColourScale) -> tuple[np.ndarray, dict]:
    """``x`` as drawn on ``scale`` and the colour bar's extra settings (quantile: ticks at
    :data:`QUANTILE_TICKS` named by the values there)."""
    a = np.asarray(x, dtype=np.float64)
    if scale == "linear":
        return a, {}
    if scale == "log":
        return np.log10(np.maximum(a, LOG_FLOOR)), {}
    z = quantile_ranks(a)
    fin = a[np.isfinite(a)]
    if fin.size == 0:
        return z, {}
    vals = np.quantile(fin, QUANTILE_TICKS)
    return z, dict(tickvals=list(QUANTILE_TICKS), ticktext=[f"{v:.2g}" for v in vals])


def scale_title(what: str, scale: ColourScale) -> str:
    """The colour bar's title: the quantity and its scale, e.g. ``"log₁₀ a/z (log)"``, ``"A (quantile)"``."""
    return f"log₁₀ {what} (log)" if scale == "log" else f"{what} ({scale})"
