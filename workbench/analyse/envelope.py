"""Deletion envelope: from the pooled measure to individual attention rows (SPEC §4, paper §4.1).

For a removal set ``E`` (a union of candidate chunks) with pooled discarded mass ``q = μ^l(E)`` and a
constraint row ``a = (h, u)`` with weight ``ω = ω_{h,u}`` in ``μ^l`` and discarded mass
``η = A^{l,h}_u(E)``:

    D_χ²(A_u ‖ μ) = Σ_{j: μ_j > 0} (A_{u,j} - μ_j)² / μ_j  ≤  1/ω - 1
    η ≤ min{1, q/ω, q + sqrt(D_χ² q (1-q))}

and for the head output ``o = Σ_j a_j v_j`` and the renormalised ``o_R``: ``‖o - o_R‖ ≤ 2 V η`` with
``V = max_j ‖v_j‖`` (equality attainable). All arithmetic is float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.analyse.rows import check_rows
from workbench.checks import Interval
from workbench.constraints import register_all
from workbench.shapes import shaped

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = [
    "EnvelopeResult",
    "envelope",
    "chi2_divergence",
    "output_bound",
    "output_shift",
    "envelope_all_layers",
]

_CHECKS = register_all("envelope", {"atol": Interval("real", 0.0, None, what="a finite number"),
                                    "V": Interval("real", 0.0, None)}, __name__)


def chi2_divergence(A: Tensor, mu: Tensor) -> Tensor:
    """``D_χ²(A_u ‖ μ) = Σ_{j: μ_j > 0} (A_{u,j} - μ_j)²/μ_j`` for every row; ``A [..., T]``, ``μ [T]`` → ``[...]``.

    Keys with ``μ_j = 0`` are left out, as in SPEC §4 (a row pooled into ``μ`` with ``ω > 0`` has no
    mass there).
    """
    mu = mu.to(torch.float64)
    pos = mu > 0
    mu_safe = torch.where(pos, mu, torch.ones_like(mu))
    keep = pos.to(torch.float64)
    # keys with μ_j = 0 get weight 0; rows in blocks of 16 (float64 copies that stay in cache: one pass
    # over the rows in their storage dtype, at T = 32k ~4x faster than masking the whole block)
    flat = A.reshape(-1, A.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float64)
    for i in range(0, flat.shape[0], 16):
        d = flat[i: i + 16].to(torch.float64, copy=True)
        d.sub_(mu).square_().div_(mu_safe)  # divided (not times 1/μ: a tiny μ would overflow to 0·inf)
        out[i: i + 16] = d @ keep
    return out.reshape(A.shape[:-1])


@dataclass
class EnvelopeResult:
    """Envelope of every constraint row ``a = (h, u)``, flattened ``a = h*W + u`` (SPEC §4).

    Attributes (float64 ``[A]`` with ``A = H*W`` unless noted):
        eta: discarded row mass ``η = A^{l,h}_u(E)``.
        q: pooled discarded mass ``q = μ^l(E)`` (a float; the same for every row).
        omega: row weight ``ω_{h,u}``.
        dchi2: ``D_χ²(A_u ‖ μ)``.
        dchi2_cap: ``1/ω - 1`` (``D_χ² ≤ dchi2_cap``).
        term_ratio: ``q/ω``.
        term_chi2: ``q + sqrt(D_χ² q (1-q))``.
        bound: ``min{1, q/ω, q + sqrt(D_χ² q(1-q))}``.
        holds: bool, ``η ≤ bound + atol``.
        W: observer rows per head (to unflatten ``a``).
        layer: the layer, when known.
        atol: the tolerance used for ``holds``.
    """

    eta: Tensor
    q: float
    omega: Tensor
    dchi2: Tensor
    dchi2_cap: Tensor
    term_ratio: Tensor
    term_chi2: Tensor
    bound: Tensor
    holds: Tensor
    W: int = 1
    layer: int | None = None
    atol: float = 0.0

    @property
    def all_hold(self) -> bool:
        return bool(self.holds.all())

    def to_frame(self) -> pd.DataFrame:
        """One row per constraint row: ``layer, a, head, u, eta, q, omega, dchi2, dchi2_cap, term_ratio,
        term_chi2, bound, holds``."""
        A = int(self.eta.shape[0])
        a = torch.arange(A)
        return pd.DataFrame(
            {
                "layer": [self.layer] * A,
                "a": a.numpy(),
                "head": (a // self.W).numpy(),
                "u": (a % self.W).numpy(),
                "eta": self.eta.numpy(),
                "q": [self.q] * A,
                "omega": self.omega.numpy(),
                "dchi2": self.dchi2.numpy(),
                "dchi2_cap": self.dchi2_cap.numpy(),
                "term_ratio": self.term_ratio.numpy(),
                "term_chi2": self.term_chi2.numpy(),
                "bound": self.bound.numpy(),
                "holds": self.holds.numpy(),
            }
        )


@shaped
def envelope(A_rows: Float[Tensor, "H_Q W T"], mu: Float[Tensor, " T"],
             omega: Float[Tensor, " H_Q"] | Float[Tensor, "H_Q W"], removed: Bool[Tensor, " T"], *,
             atol: float = 1e-6, layer: int | None = None) -> EnvelopeResult:
    """Deletion envelope of every constraint row of one layer (SPEC §4).

    Args:
        A_rows: attention rows ``[H_Q, W, T]`` (the rows pooled into ``μ``).
        mu: pooled measure ``μ^l`` ``[T]``.
        omega: row weights ``[H_Q]`` (same for every ``u``) or ``[H_Q, W]``; every entry ``> 0``.
        removed: bool ``[T]`` mask of ``E``.
        atol: tolerance of ``holds`` (float32 captured rows sum to 1 only to ~1e-7).
        layer: layer index recorded in the result.

    Returns:
        :class:`EnvelopeResult` with rows flattened ``a = h*W + u``.
    """
    A_rows = torch.as_tensor(A_rows)  # upcast piecewise below (half-precision captures: no float64 copy)
    if A_rows.dim() != 3:
        raise ValueError(f"A_rows: must have shape [H, W, T], got {list(A_rows.shape)}")
    check_rows(A_rows, "A_rows")
    Hn, W, T = A_rows.shape
    mu = torch.as_tensor(mu).to(torch.float64)
    if mu.shape != (T,):
        raise ValueError(f"mu: must have shape [T={T}], got {list(mu.shape)}")
    if not torch.isfinite(mu).all() or (mu < 0).any():
        raise ValueError("mu: must be finite and non-negative")
    removed = torch.as_tensor(removed)
    if removed.dtype != torch.bool or removed.shape != (T,):
        raise ValueError(f"removed: must be a bool mask of shape [T={T}], got {removed.dtype} {list(removed.shape)}")
    omega = torch.as_tensor(omega).to(torch.float64)
    if omega.shape == (Hn,):
        omega = omega[:, None].expand(Hn, W)
    if omega.shape != (Hn, W):
        raise ValueError(f"omega: must have shape [H={Hn}] or [H={Hn}, W={W}], got {list(omega.shape)}")
    if not (torch.isfinite(omega).all() and (omega > 0).all()):
        raise ValueError("omega: every entry must be a finite number > 0")
    atol = _CHECKS["atol"].check("atol", atol)

    rows = A_rows.reshape(Hn * W, T)
    om = omega.reshape(-1).contiguous()
    eta = rows.index_select(1, torch.nonzero(removed).flatten()).to(torch.float64).sum(-1)
    q = float(mu[removed].sum())
    dchi2 = chi2_divergence(rows, mu)
    term_ratio = q / om
    term_chi2 = q + torch.sqrt(dchi2 * max(q * (1.0 - q), 0.0))
    bound = torch.minimum(torch.minimum(torch.ones_like(term_ratio), term_ratio), term_chi2)
    return EnvelopeResult(
        eta=eta,
        q=q,
        omega=om,
        dchi2=dchi2,
        dchi2_cap=1.0 / om - 1.0,
        term_ratio=term_ratio,
        term_chi2=term_chi2,
        bound=bound,
        holds=eta <= bound + atol,
        W=W,
        layer=layer,
        atol=float(atol),
    )


def output_bound(eta, V):
    """Output bound ``2 V η`` on ``‖o - o_R‖`` (SPEC §4); ``eta`` and ``V`` floats or broadcastable tensors."""
    if isinstance(V, Tensor):
        if (V < 0).any():
            raise ValueError("V: must be >= 0")
    else:
        V = _CHECKS["V"].check("V", V)
    return 2 * V * eta


@shaped
def output_shift(a: Float[Tensor, " T"], values: Float[Tensor, "T d"],
                 removed: Bool[Tensor, " T"]) -> tuple[Tensor, Tensor, float, float]:
    """Actual output change of one attention row under removal (SPEC §4 output bound).

    Args:
        a: attention row ``[T]``.
        values: value vectors ``[T, d]``.
        removed: bool ``[T]`` mask of ``E``.

    Returns:
        ``(o, o_R, shift, eta)``: ``o = Σ_j a_j v_j``, ``o_R = Σ_{j∉E} a_j v_j / (1-η)``,
        ``shift = ‖o - o_R‖`` and ``η = a(E)``. When ``η = 1`` nothing is retained: ``o_R`` and
        ``shift`` are NaN.
    """
    a = torch.as_tensor(a).to(torch.float64)
    values = torch.as_tensor(values).to(torch.float64)
    removed = torch.as_tensor(removed)
    if a.dim() != 1 or values.dim() != 2 or values.shape[0] != a.shape[0] or removed.shape != a.shape:
        raise ValueError(f"a, values, removed: need shapes [T], [T, d], [T]; got {list(a.shape)}, "
                         f"{list(values.shape)}, {list(removed.shape)}")
    eta = float(a[removed].sum())
    o = a @ values
    kept = a.masked_fill(removed, 0.0)
    mass = float(kept.sum())
    if mass <= 0:
        o_R = torch.full_like(o, math.nan)
        return o, o_R, math.nan, eta
    o_R = (kept @ values) / mass
    return o, o_R, float(torch.linalg.vector_norm(o - o_R)), eta


def envelope_all_layers(capture: Capture, pooling_result, removed_by_layer, *, atol: float = 1e-6) -> list[EnvelopeResult]:
    """Envelope of the observer rows of several layers of a capture.

    Args:
        capture: :class:`~workbench.capture.data.Capture`.
        pooling_result: :class:`~workbench.analyse.pooling.PoolingResult` of the same capture.
        removed_by_layer: either a sequence with one entry per layer, or a dict ``{layer: entry}``
            (only those layers); each entry is a bool ``[T]`` mask or a list of chunk indices.

    Returns:
        One :class:`EnvelopeResult` per layer (in increasing layer order), ``layer`` set.
    """
    A_obs = capture.observer_attn()  # [L, H_Q, W, T]
    L = A_obs.shape[0]
    if isinstance(removed_by_layer, dict):
        items = sorted(removed_by_layer.items())
    else:
        seq = list(removed_by_layer)
        if len(seq) != L:
            raise ValueError(f"removed_by_layer: needs one entry per layer ({L}), got {len(seq)}")
        items = list(enumerate(seq))
    out = []
    for l, rem in items:
        if not 0 <= int(l) < L:
            raise ValueError(f"removed_by_layer: layer {l} out of range [0, {L - 1}]")
        if isinstance(rem, Tensor) and rem.dtype == torch.bool:
            mask = rem
        else:
            mask = capture.spans.removal_mask(rem)
        out.append(envelope(A_obs[int(l)], pooling_result.mu[int(l)], pooling_result.omega[int(l)], mask,
                            atol=atol, layer=int(l)))
    return out
