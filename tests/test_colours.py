"""Categorical styles (``workbench.show.theme.categorical``) stay distinct for as many heads as a model has:
colours far apart in CIELAB (ΔE*ab), also for deuteranopes and protanopes (Machado et al. 2009 simulation),
and past the eight colours a dash and a marker that differ; the figures use them per head and group."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from _all_figures import synthetic_inputs

from workbench.analyse.shift import ShiftAnalysis
from workbench.show import plots
from workbench.show.theme import PALETTE, categorical, categorical_px

# Machado, Oliveira & Fernandes (2009), severity 1.0, on linear RGB
CVD = {"normal": np.eye(3),
       "deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                                 [-0.011820, 0.042940, 0.968881]]),
       "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                               [-0.003882, -0.048116, 1.051998]])}
MIN_DE = {"normal": 20.0, "deuteranopia": 12.0, "protanopia": 12.0}  # ΔE*ab; ~2.3 is a just-noticeable difference


def lab(hex_color: str, cvd: str = "normal") -> np.ndarray:
    """CIELAB (D65) of an sRGB colour, after the colour-vision simulation ``cvd``."""
    c = np.array([int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    lin = np.clip(CVD[cvd] @ lin, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def delta_e(a: str, b: str, cvd: str = "normal") -> float:
    return float(np.linalg.norm(lab(a, cvd) - lab(b, cvd)))


def min_distinct(styles: list[dict], cvd: str) -> float:
    """The smallest ΔE between two styles that share dash and marker (inf when every pair differs there)."""
    out = np.inf
    for s, t in itertools.combinations(styles, 2):
        if (s["dash"], s["symbol"]) == (t["dash"], t["symbol"]):
            out = min(out, delta_e(s["color"], t["color"], cvd))
    return out


def test_lab_reference_values():
    assert np.allclose(lab("#ffffff"), [100, 0, 0], atol=0.05)
    assert np.allclose(lab("#000000"), [0, 0, 0], atol=1e-9)
    assert np.allclose(lab("#ff0000"), [53.24, 80.09, 67.20], atol=0.1)   # sRGB red
    # a deuteranope sees red and green alike: their distance shrinks a lot
    assert delta_e("#ff0000", "#00aa00", "deuteranopia") < 0.5 * delta_e("#ff0000", "#00aa00")


@pytest.mark.parametrize("cvd", list(CVD))
@pytest.mark.parametrize("n", [3, 8, 9, 16, 30, 48])
def test_categorical_styles_distinct(n, cvd):
    st = categorical(n)
    assert len(st) == n and len({(s["color"], s["dash"], s["symbol"]) for s in st}) == n
    assert min_distinct(st, cvd) >= MIN_DE[cvd]


def test_old_cycle_and_sequential_samples_fail_the_check():
    """The check can fail: the old colour cycle (h8 = h0) and cividis samples for 9 heads are not distinct."""
    cycle = [{"color": PALETTE[i % 8], "dash": "solid", "symbol": "circle"} for i in range(9)]
    assert min_distinct(cycle, "normal") == 0.0
    from plotly.colors import sample_colorscale
    seq = [{"color": "#%02x%02x%02x" % tuple(int(float(v)) for v in c[4:-1].split(",")), "dash": "solid",
            "symbol": "circle"} for c in sample_colorscale("Cividis", [i / 8 for i in range(9)])]
    assert min_distinct(seq, "normal") < MIN_DE["normal"]


def test_bad_n():
    for bad in (-1, 49, 2.0, True):
        with pytest.raises(ValueError, match=r"^n: must be an integer in \[0, 48\]"):
            categorical(bad)


def test_figures_style_each_head_distinctly():
    """shift_steps at one layer (9 query heads): every head's line differs from every other in colour or dash."""
    sp, cap, params, tr = synthetic_inputs(L=4, H_Q=12, G=3)
    fig = plots.shift_steps(ShiftAnalysis(k=8)(cap), level="head", layer=1)
    heads = [t for t in fig.data if t.type == "scatter" and t.showlegend is not False]
    assert len(heads) == 12
    st = [{"color": t.line.color, "dash": t.line.dash or "solid", "symbol": t.marker.symbol or "circle"} for t in heads]
    assert len({tuple(s.values()) for s in st}) == 12
    assert min_distinct(st, "deuteranopia") >= MIN_DE["deuteranopia"]
    kw = categorical_px([f"h{h}" for h in range(9)], "head")
    assert kw["color_discrete_map"]["h8"] == kw["color_discrete_map"]["h0"] and \
        kw["line_dash_map"]["h8"] != kw["line_dash_map"]["h0"]
