"""Streaming collision statistic over key tiles (SPEC §1, paper §8.1).

For a row of attention logits ``z_j`` (keys ``j``), the collision ``Σ_j A_j²`` of ``A = softmax(z)``
can be accumulated tile by tile without materialising ``A``: with a running maximum ``m``,

    m' = max(m, max_tile z_j)
    ℓ' = e^{m-m'} ℓ + Σ_tile e^{z_j - m'}
    s' = e^{2(m-m')} s + Σ_tile e^{2(z_j - m')}
    Σ_j A_j² = s / ℓ²

Masked keys carry the logit ``-inf`` and contribute nothing. Masking the sinks this way gives the
non-sink collision ``C_h`` of SPEC §2 for a single row. All arithmetic is float64; the tile loop
runs in numpy (per-tile overhead of a few µs) and the results are returned as torch tensors.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from workbench.checks import Interval
from workbench.constraints import register_all

__all__ = ["collision_streaming", "collision_direct"]

_CHECKS = register_all("collision_streaming", {"tile": Interval("int", 1)}, __name__)


def _check_logits(z) -> Tensor:
    z = torch.as_tensor(z)
    if z.dim() < 1:
        raise ValueError("z: must have a key axis (shape [..., K]), got a scalar")
    if not (z.dtype.is_floating_point):
        z = z.to(torch.float64)
    if torch.isnan(z).any():
        raise ValueError("z: must not contain NaN (use -inf for masked keys)")
    if torch.isposinf(z).any():
        raise ValueError("z: must not contain +inf")
    return z.to(torch.float64)


def collision_streaming(z: Tensor, tile: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Tiled collision statistic with a running maximum (SPEC §1 streaming collision).

    Args:
        z: logits ``[..., K]`` (``-inf`` = masked key). Any leading shape, e.g.
            ``[layers, heads, rows, keys]``; the recursion is vectorised over it.
        tile: key-tile width, an integer ``≥ 1`` (the last tile may be shorter).

    Returns:
        ``(ell, m, s, sum_sq)``, each float64 ``[...]``: the final normaliser ``ℓ`` (relative to
        ``e^m``), the running maximum ``m``, the second-moment accumulator ``s`` (relative to
        ``e^{2m}``) and ``Σ_j A_j² = s/ℓ²``. A row whose keys are all masked has ``m = -inf``,
        ``ℓ = s = 0`` and ``sum_sq = NaN`` (there is no distribution).
    """
    _CHECKS["tile"].check("tile", tile)
    z = _check_logits(z).detach().cpu().numpy()
    K = z.shape[-1]
    lead = z.shape[:-1]
    tile = int(tile)
    floor = -np.finfo(np.float64).max  # finite stand-in for a running max of -inf
    m = np.full(lead, -np.inf)
    ell = np.zeros(lead)
    s = np.zeros(lead)
    for start in range(0, K, tile):
        zt = z[..., start : start + tile]
        m_new = np.maximum(m, zt.max(axis=-1))
        m_safe = np.maximum(m_new, floor)  # = m_new unless every key so far is masked
        scale = np.exp(m - m_safe)  # e^{m-m'}; 0 while m = -inf
        e = np.exp(zt - m_safe[..., None])  # masked keys: e^{-inf} = 0
        ell = scale * ell + e.sum(axis=-1)
        s = scale * scale * s + (e * e).sum(axis=-1)
        m = m_new
    with np.errstate(divide="ignore", invalid="ignore"):
        sum_sq = np.where(ell > 0, s / np.where(ell > 0, ell, 1.0) ** 2, np.nan)
    return tuple(torch.from_numpy(np.asarray(x, dtype=np.float64)) for x in (ell, m, s, sum_sq))


def collision_direct(z: Tensor) -> Tensor:
    """Direct collision ``Σ_j A_j²`` with ``A = softmax(z)`` over the last axis, float64 ``[...]``.

    The reference for :func:`collision_streaming`; a fully masked row gives NaN.
    """
    z = _check_logits(z).detach().cpu().numpy()
    if z.shape[-1] == 0:
        return torch.full(z.shape[:-1], math.nan, dtype=torch.float64)
    m = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - m)  # a fully masked row gives NaN
    A = e / e.sum(axis=-1, keepdims=True)
    return torch.from_numpy(np.asarray((A * A).sum(axis=-1), dtype=np.float64))
