"""Arithmetic cost of pruned prefill (SPEC §7 cost, paper §8.1) from the model config.

Per-layer FLOPs (multiply-add = 2 FLOPs) of a decoder block on ``T`` tokens:
projections ``2T·D·(H_Q d + 2 G d) + 2T·H_Q d·D``, gated MLP ``2T·3·D·I`` (two-matrix MLP:
``2T·2·D·I``), causal attention ``2·H_Q·d·T(T+1)`` (scores and values over ``T(T+1)/2`` pairs).
``F_EP = Σ_{l≤l*} F_l(T) + Σ_{l>l*} F_l(T') + F_aux`` with ``F_aux`` the row capture:
``2·H_Q·(W_p + m_audit)·T·d`` per monitored layer executed (``≤ l*``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.run.adapter import ModelShape


@dataclass(frozen=True)
class CostModel:
    """FLOP model of one architecture. ``gated``: SwiGLU/GeGLU MLP (three matrices)."""

    shape: ModelShape
    gated: bool = True

    def layer_flops(self, T) -> np.ndarray:
        """FLOPs of one decoder block on ``T`` tokens (array-friendly)."""
        s = self.shape
        T = np.asarray(T, dtype=np.float64)
        proj = 2 * T * s.hidden * (s.H_Q * s.d + 2 * s.G * s.d) + 2 * T * s.H_Q * s.d * s.hidden
        mlp = 2 * T * (3 if self.gated else 2) * s.hidden * s.intermediate
        attn = 2 * s.H_Q * s.d * T * (T + 1)
        return proj + mlp + attn

    def full(self, T) -> np.ndarray:
        """``F_full = L · F_l(T)``."""
        return self.shape.L * self.layer_flops(T)

    def aux(self, T, rows: int, monitored_executed: int) -> np.ndarray:
        """Row capture: ``2 · H_Q · rows · T · d`` per executed monitored layer."""
        return 2.0 * self.shape.H_Q * rows * np.asarray(T, dtype=np.float64) * self.shape.d * monitored_executed

    def pruned(self, T, T_prime, l_star: int, rows: int = 0, monitored_executed: int = 0) -> np.ndarray:
        """``F_EP`` for the gather after layer ``l_star`` (``-1``: before layer 0)."""
        shallow = (l_star + 1) * self.layer_flops(T)
        deep = (self.shape.L - l_star - 1) * self.layer_flops(T_prime)
        return shallow + deep + self.aux(T, rows, monitored_executed)

    def ratio(self, T, keep_fraction, l_star, rows: int = 0, monitored_executed: int = 0) -> np.ndarray:
        """``F_EP / F_full`` (``< 1``: pruning saves work)."""
        return self.pruned(T, np.asarray(keep_fraction) * T, l_star, rows, monitored_executed) / self.full(T)

    def break_even_keep_fraction(self, T, l_star: int, rows: int = 0, monitored_executed: int = 0) -> float:
        """Largest ``T'/T`` at which ``F_EP ≤ F_full`` (1.0 when the auxiliary cost is 0); NaN if none."""
        f = lambda x: float(self.ratio(T, x, l_star, rows, monitored_executed)) - 1.0  # noqa: E731
        if f(0.0) > 0:
            return float("nan")
        lo, hi = 0.0, 1.0
        if f(hi) <= 0:
            return 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) <= 0 else (lo, mid)
        return lo

    def grid(self, T: int, l_stars, keep_fractions, rows: int = 0, monitored_per_layer: bool = True) -> "CostGrid":
        recs = []
        for l in l_stars:
            mon = (l + 1) if monitored_per_layer else 0
            for x in keep_fractions:
                recs.append(dict(T=T, l_star=l, keep_fraction=float(x), T_prime=float(x) * T,
                                 F_full=float(self.full(T)), F_EP=float(self.pruned(T, x * T, l, rows, mon)),
                                 F_aux=float(self.aux(T, rows, mon)),
                                 ratio=float(self.ratio(T, x, l, rows, mon))))
            recs[-1]["break_even_keep_fraction"] = self.break_even_keep_fraction(T, l, rows, mon)
        return CostGrid(pd.DataFrame(recs))


@dataclass
class CostGrid:
    frame: pd.DataFrame

    def to_frame(self) -> pd.DataFrame:
        return self.frame


def kv_bytes_dense(shape: ModelShape, T_prime: int, bytes_per_element: int) -> int:
    """Dense retained cache ``2 e L G d T'`` (SPEC §8)."""
    return 2 * bytes_per_element * shape.L * shape.G * shape.d * int(T_prime)
