"""The slider specifications of the panels: one :class:`SliderSpec` per parameter (its range taken from and
checked against the parameter's constraint, ``workbench.constraints.PARAMS``) and :data:`SLIDERS`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import ipywidgets as W

from workbench.analyse.counterexample import ShallowCounterexample
from workbench.checks import Constraint, Interval
from workbench.choices import COLOUR_SCALES
from workbench.constraints import PARAMS
from workbench.rerun.eviction.policies.deferkv import DeferKV
from workbench.show.colour_scale import default_scale

__all__ = ["SliderSpec", "SLIDERS", "control_value", "LABEL_PX", "scale_dropdown", "scale_value"]

#: the sliders' label column; a longer label is cut with "…" by the widget, so every label fits it
#: (``tests/test_widgets.py`` counts 0.62 of the 13 px widget font per character, as for DejaVu Sans)
LABEL_PX = 170

OWNERS = (ShallowCounterexample, DeferKV)  # importing them registers the qualified keys named below


# ----------------------------------------------------------------------------- sliders
def _interval(c: Constraint) -> Interval | None:
    if isinstance(c, Interval):
        return c
    return next((p for p in getattr(c, "parts", ()) if isinstance(p, Interval)), None)


@dataclass(frozen=True)
class SliderSpec:
    """A slider's range: ``kind`` in ``float, log, int``; for ``log`` ``lo``/``hi`` are the values
    (the widget works in base-10 exponents).

    ``param`` names the parameter's constraint (``workbench.constraints.PARAMS[param]``, :attr:`constraint`):
    ``lo``/``hi`` given as ``None`` are taken from it (an open end one ``step`` inside), and every range
    (these, and the ``lo``/``hi`` a panel passes to :meth:`make`) must lie inside it (else ``ValueError``)."""

    label: str
    kind: str
    lo: float | None
    hi: float | None
    step: float
    value: float
    param: str

    def __post_init__(self):
        iv = _interval(self.constraint)
        for end in ("lo", "hi"):
            if getattr(self, end) is None:
                bound = None if iv is None else getattr(iv, end)
                if bound is None:
                    raise ValueError(f"{end}: the slider of {self.param} needs an explicit {end} "
                                     f"({self.constraint.describe()} has no such bound)")
                inside = iv.kind == "real" and (iv.lo_open if end == "lo" else iv.hi_open)
                object.__setattr__(self, end, bound + (self.step if end == "lo" else -self.step) * inside)
        self.check_range(self.lo, self.hi)

    @property
    def constraint(self) -> Constraint:
        """The parameter's constraint, the same object its dataclass checks it with."""
        return PARAMS[self.param]

    def check_range(self, lo, hi) -> None:
        """Refuse a slider range ``[lo, hi]`` that leaves the parameter's allowed set."""
        for end, v in (("lo", lo), ("hi", hi)):
            x = int(v) if self.kind == "int" else float(v)
            if (self.kind == "int" and x != v) or not self.constraint.accepts(x):
                raise ValueError(f"{end}: the slider of {self.param} must stay {self.constraint.describe()}, got {v!r}")

    def make(self, value=None, *, continuous: bool = True, hi=None, lo=None) -> W.Widget:
        v = self.value if value is None else value
        lo = self.lo if lo is None else lo
        hi = self.hi if hi is None else hi
        self.check_range(lo, hi)
        style = {"description_width": f"{LABEL_PX}px"}  # a fixed label column: long labels do not squeeze the track
        lay = W.Layout(width="440px")
        if self.kind == "int":
            return W.IntSlider(value=int(min(max(v, lo), hi)), min=int(lo), max=int(hi), step=int(self.step),
                               description=self.label, continuous_update=continuous, style=style, layout=lay)
        if self.kind == "log":
            return W.FloatLogSlider(value=float(min(max(v, lo), hi)), base=10, min=math.log10(lo),
                                    max=math.log10(hi), step=self.step, description=self.label,
                                    continuous_update=continuous, style=style, layout=lay, readout_format=".3g")
        return W.FloatSlider(value=float(min(max(v, lo), hi)), min=lo, max=hi, step=self.step,
                             description=self.label, continuous_update=continuous, style=style, layout=lay,
                             readout_format=".3g")


#: Slider ranges, each inside the constraint of its parameter (``param``; ``None`` ends come from it). Layer,
#: m₀, budget and the shift sizes get their upper bounds from the capture when a panel is built.
SLIDERS: dict[str, SliderSpec] = {
    "zeta": SliderSpec("ζ (group floor)", "float", None, None, 0.01, 0.5, "zeta"),
    "tau": SliderSpec("τ (temperature)", "log", 1e-3, 10.0, 0.05, 1.0, "tau"),
    "eps_s": SliderSpec("ε_s (smoothing)", "log", 1e-3, 10.0, 0.05, 0.1, "eps_s"),
    "lam": SliderSpec("λ (concentration)", "float", None, 5.0, 0.05, 0.5, "lam"),
    "target": SliderSpec("target (share of N)", "float", None, None, 0.01, 0.3, "target"),
    "eps_row": SliderSpec("ε_row (row tolerance)", "log", 1e-3, None, 0.05, 0.05, "eps_row"),
    "m0": SliderSpec("m₀ (kept chunks)", "int", None, 1, 1, 1, "m0"),
    "layer": SliderSpec("layer", "int", None, 1, 1, 1, "layer"),
    "delta": SliderSpec("δ (audit failure)", "log", 1e-4, 0.5, 0.05, 0.05, "delta"),
    "m_a": SliderSpec("m_a (audit sample)", "int", None, 1024, 1, 32, "m_a"),
    "eps_audit": SliderSpec("ε_audit", "float", None, None, 0.01, 0.1, "eps_audit"),
    "d_max": SliderSpec("d_max (stability)", "float", None, None, 0.01, 0.5, "d_max"),
    "streak": SliderSpec("streak", "int", None, 10, 1, 1, "streak"),
    "seed": SliderSpec("seed", "int", None, 99, 1, 0, "seed"),
    "page": SliderSpec("page size b", "int", None, 128, 1, 16, "page"),
    "K": SliderSpec("pages kept K", "int", None, 64, 1, 8, "K"),
    "defer_lam": SliderSpec("DeferKV λ", "float", -2.0, 2.0, 0.01, 0.1, "deferkv.lam"),
    "budget": SliderSpec("eviction budget B", "int", None, 2, 1, 64, "budget"),  # lo: the protected count
    "k": SliderSpec("top-k (recall)", "int", None, 2, 1, 32, "k"),  # hi: T
    "ref_start": SliderSpec("reference: decode row", "int", None, 1, 1, 1, "ref_start"),  # hi: n
    "W": SliderSpec("tail rows W", "int", None, 1, 1, 32, "W"),  # hi: the tail rows
    "run_layer": SliderSpec("fixed l*", "int", None, 1, 1, 4, "run_layer"),  # hi: L-1 (E_l exists)
    "ce_eps": SliderSpec("ε (shallow mass, j*)", "log", 1e-9, 10 ** -0.5, 0.25, 1e-3, "counterexample.eps"),
    "ce_gamma": SliderSpec("γ (deep mass off j*)", "float", 0.001, 0.5, 0.001, 0.05, "counterexample.gamma"),
}


def control_value(w: W.Widget):
    """A control's value as a sidecar writes it, a float to 12 significant digits: the widget's float arithmetic
    gives 0.35000000000000003 for ζ = 0.35, written 0.35. Not rounded to the slider's step: a value set from code
    (0.604 on a 0.01 slider) is what the panel computed with."""
    v = w.value
    return float(f"{v:.12g}") if isinstance(v, float) else v


# ----------------------------------------------------------------------------- colour scale
def scale_dropdown(T: int, description: str = "colour scale") -> W.Dropdown:
    """The colour-scale choice of a heatmap or token view of a ``T``-token prompt: linear, log or quantile, starting
    at the default for ``T`` (:func:`~workbench.show.colour_scale.default_scale`: linear below
    :data:`~workbench.show.colour_scale.LONG_PROMPT_T` tokens, quantile from there on), which its label names."""
    d = default_scale(T)
    # the label's own width: a longer one ("residual colours") would be cut to "residual c…" by the default column
    return W.Dropdown(options=[(f"{s} (default at T = {T:,})" if s == d else s, s) for s in COLOUR_SCALES], value=d,
                      description=description, style={"description_width": "initial"})


def scale_value(dropdown: W.Dropdown) -> str:
    """The ``scale`` argument of the figure functions from :func:`scale_dropdown`."""
    return dropdown.value
