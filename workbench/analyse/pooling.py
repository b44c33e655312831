"""Sink-isolated Rényi head pooling (SPEC §2, paper §3.1).

For one layer ``l`` and the proposal observers ``𝒬_p`` (``W_p`` rows):

- observer mean ``a^h_j = (1/W_p) Σ_{u∈𝒬_p} A^{l,h}_{u,j}``;
- residual mass ``z_h = Σ_{j∉𝒮} a^h_j`` (invalid when ``z_h ≤ ρ_min``);
- non-sink collision ``C_h = Σ_{j∉𝒮} (a^h_j / z_h)²`` and Rényi-2 entropy ``H_h = -ln C_h``;
- within-group softmax ``v_h`` of ``-H_h/τ`` and group floor ``w_h = ζ/r + (1-ζ) v_h``
  (both **[reconstructed]** in SPEC);
- pooled measure ``μ^l_j = (1/G) Σ_g Σ_{h∈ℋ_g} w_h a^h_j = Σ_h Σ_u ω_{h,u} A^{l,h}_{u,j}``,
  ``ω_{h,u} = w_h / (G W_p)``.

Everything is vectorised over layers and heads and computed in float64; the softmax of ``-H/τ`` is
taken in log space, so tiny temperatures (``τ = 1e-4``) neither overflow nor produce NaN.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.analyse.rows import check_capture_rows, check_rows
from workbench.checks import Interval, check_fields
from workbench.constraints import PARAMS, checked, index_into, register_all, shared
from workbench.shapes import shaped

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = [
    "HeadPooling",
    "PoolingCache",
    "PoolingResult",
    "residual_stats",
    "group_softmax",
    "group_floor",
    "group_onehot",
    "dominant_head_bound",
]


# ----------------------------------------------------------------------------- validation helpers
_CHECKS = register_all("pooling", {"r": Interval("int", 1), "size": Interval("int", 1)}, __name__)
"""The heads of a group in :func:`dominant_head_bound` (``r``) and the results a :class:`PoolingCache` keeps."""


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be a real number, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------- group helpers
def group_onehot(head_group: Tensor, H_Q: int) -> Tensor:
    """One-hot group membership ``onehot[h, g] = 1{g(h) = g}``, float64 ``[H_Q, G]``.

    ``head_group`` is int ``[H_Q]`` with values ``0 … G-1``; every group must be non-empty.
    """
    hg = torch.as_tensor(head_group)
    if hg.dim() != 1 or hg.shape[0] != H_Q:
        raise ValueError(f"head_group: must have shape [{H_Q}], got {list(hg.shape)}")
    if hg.dtype.is_floating_point or hg.dtype == torch.bool:
        raise ValueError(f"head_group: must be an integer tensor, got {hg.dtype}")
    hg = hg.to(torch.int64)
    if H_Q == 0:
        raise ValueError("head_group: must have at least one head, got 0")
    if int(hg.min()) < 0:
        raise ValueError(f"head_group: values must be >= 0, got {int(hg.min())}")
    G = int(hg.max()) + 1
    onehot = torch.zeros(H_Q, G, dtype=torch.float64)
    onehot[torch.arange(H_Q), hg] = 1.0
    empty = (onehot.sum(0) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"head_group: every group 0..{G - 1} must have a head, groups {empty} are empty")
    return onehot


def observer_mean(A_obs: Tensor) -> Tensor:
    """Observer mean ``a^{l,h}_j = (1/W_p) Σ_u A^{l,h}_{u,j}`` accumulated in float64.

    Args:
        A_obs: float ``[L, H_Q, W, T]``.

    Returns:
        float64 ``[L, H_Q, T]``.
    """
    W = A_obs.shape[2]
    if A_obs.device.type == "cpu" and not A_obs.requires_grad and A_obs.dtype in (torch.float32, torch.float64):
        # numpy's float64-accumulating reduction is ~8x faster than torch's dtype conversion on CPU
        return torch.from_numpy(A_obs.numpy().sum(axis=2, dtype=np.float64) / W)
    if A_obs.dim() == 4 and A_obs.dtype in (torch.float16, torch.bfloat16):  # half storage: upcast one layer at a time
        return torch.stack([observer_mean(A_obs[l].float()[None])[0] for l in range(A_obs.shape[0])])
    return A_obs.to(torch.float64).sum(dim=2) / W


def residual_stats(a: Tensor, n_sink: int, rho_min: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Residual mass, validity, non-sink collision and Rényi-2 entropy (SPEC §2).

    Args:
        a: observer-mean attention ``a^{l,h}_j``, float ``[L, H_Q, T]``.
        n_sink: ``|𝒮|``; the sinks are keys ``0 … n_sink-1``.
        rho_min: residual threshold ``ρ_min``.

    Returns:
        ``z`` float64 ``[L, H_Q]`` residual mass ``Σ_{j∉𝒮} a_j``;
        ``valid_head`` bool ``[L, H_Q]`` (``z > ρ_min``);
        ``C`` float64 ``[L, H_Q]`` collision ``Σ_{j∉𝒮} (a_j/z)²`` (``0`` for invalid heads);
        ``H`` float64 ``[L, H_Q]`` ``-ln C`` (in ``[0, ln(T-|𝒮|)]`` up to rounding; ``+inf`` for
        invalid heads).
    """
    a = a.to(torch.float64)
    res = a[..., n_sink:]
    z = res.sum(-1)
    valid = z > rho_min
    zs = torch.where(valid, z, torch.ones_like(z))
    C = (res.square().sum(-1) / zs.square())
    C = torch.where(valid, C, torch.zeros_like(C))
    H = torch.where(valid, -torch.log(torch.where(valid, C, torch.ones_like(C))), torch.full_like(C, math.inf))
    return z, valid, C, H


def group_softmax(H: Tensor, valid_head: Tensor, onehot: Tensor, tau: float) -> Tensor:
    """Within-group softmax of negative entropy **[reconstructed]** (SPEC §2).

    ``v_h = exp(-H_h/τ) / Σ_{h'∈ℋ_{g(h)}} exp(-H_{h'}/τ)``, computed in log space: the exponents
    are ``-(H_h - min_{h'∈ℋ_g} H_{h'})/τ ≤ 0``, so no τ > 0 overflows or yields NaN. An invalid head gets ``v = 0``; a group with no valid head
    gets the uniform ``v = 1/|ℋ_g|``.

    Args:
        H: entropies ``[L, H_Q]`` (``+inf`` allowed for invalid heads).
        valid_head: bool ``[L, H_Q]``.
        onehot: one-hot membership ``[H_Q, G]`` (:func:`group_onehot`).
        tau: temperature ``τ > 0``.

    Returns:
        ``v`` float64 ``[L, H_Q]``; sums to 1 over each group.
    """
    H = H.to(torch.float64)
    member = onehot.to(torch.bool)  # [H_Q, G]
    Hv = torch.where(valid_head, H, torch.full_like(H, math.inf))
    # lowest entropy of each group, [L, G]; shifting by it before dividing by τ keeps every exponent
    # finite and <= 0 for any τ > 0 (the best head of a group has exponent exactly 0)
    Hmin = torch.where(member[None], Hv[..., None], torch.full_like(Hv[..., None], math.inf)).amin(dim=1)
    group_ok = torch.isfinite(Hmin)  # group has at least one valid head
    Hmin_h = torch.where(group_ok, Hmin, torch.zeros_like(Hmin)) @ onehot.T  # [L, H_Q] own group's minimum
    x = -(Hv - Hmin_h) / tau  # log of the unnormalised factor exp(-H/τ), shifted; invalid -> -inf
    e = torch.exp(x)
    den = e @ onehot  # [L, G], >= 1 for groups with a valid head
    den_h = torch.where(group_ok, den, torch.ones_like(den)) @ onehot.T
    v = e / den_h
    r_h = onehot.sum(0) @ onehot.T  # [H_Q] group size of each head
    uniform = (1.0 / r_h).expand_as(v)
    ok_h = (group_ok.to(torch.float64) @ onehot.T) > 0.5
    return torch.where(ok_h, v, uniform)


def group_floor(v: Tensor, onehot: Tensor, zeta: float) -> Tensor:
    """Group floor **[reconstructed]** (SPEC §2): ``w_h = ζ/r + (1-ζ) v_h``.

    ``r`` is the size of the head's group (``H_Q/G`` under GQA). With ``v`` summing to 1 per group,
    ``Σ_{h∈ℋ_g} w_h = 1``; ``ζ = 1`` gives uniform weights ``1/r``.

    Args:
        v: within-group softmax ``[L, H_Q]``.
        onehot: one-hot membership ``[H_Q, G]``.
        zeta: floor ``ζ ∈ (0, 1]``.

    Returns:
        ``w`` float64 ``[L, H_Q]``.
    """
    r_h = onehot.sum(0) @ onehot.T  # [H_Q]
    return zeta / r_h + (1.0 - zeta) * v.to(torch.float64)


def dominant_head_bound(zeta: float, tau: float, r: int, gap: float) -> float:
    """Property (6) (SPEC §2): the least weight of a head ``h*`` whose entropy is lower than each of its
    ``r − 1`` siblings' by at least ``Δ`` (``gap``):

    ``w_{h*} ≥ ζ/r + (1−ζ) / (1 + (r−1) e^{−Δ/τ})``.

    It follows from the within-group softmax (:func:`group_softmax`) and the group floor
    (:func:`group_floor`), both **[reconstructed]** in SPEC; it holds with equality when every sibling has
    entropy exactly ``H_{h*} + Δ``. The denominator is taken in log space,
    ``(1−ζ) exp(−logaddexp(0, ln(r−1) − Δ/τ))``, so a tiny ``τ`` or a large ``|Δ|`` neither overflows nor
    gives NaN.

    Args:
        zeta: group floor ``ζ ∈ (0, 1]``.
        tau: temperature ``τ > 0``.
        r: heads in the group, an integer ``>= 1`` (``r = 1``: the bound is 1).
        gap: ``Δ``, a real number; negative values are allowed (the premise then allows a sibling below
            ``h*``), and so are ``±inf`` (``+inf``: every sibling invalid or infinitely flat, bound
            ``ζ/r + 1 − ζ``; ``−inf``: the floor ``ζ/r``).

    Returns:
        The bound, a float in ``[ζ/r, 1]``.
    """
    zeta = PARAMS["zeta"].check("zeta", zeta)
    tau = PARAMS["tau"].check("tau", tau)
    r = _CHECKS["r"].check("r", r)
    if isinstance(gap, bool) or not isinstance(gap, numbers.Real) or math.isnan(gap):
        raise ValueError(f"gap: must be a real number (±inf allowed, not NaN), got {gap!r}")
    if r == 1:
        return 1.0
    return zeta / r + (1.0 - zeta) * math.exp(-float(np.logaddexp(0.0, math.log(r - 1) - float(gap) / tau)))


# ----------------------------------------------------------------------------- result
@dataclass
class PoolingResult:
    """Output of :meth:`HeadPooling.pool` (SPEC §2). All tensors float64 unless noted.

    Attributes:
        a: ``[L, H_Q, T]`` observer mean ``a^{l,h}_j``.
        z: ``[L, H_Q]`` residual mass ``z_h = Σ_{j∉𝒮} a^h_j``.
        valid_head: bool ``[L, H_Q]``, ``z_h > ρ_min``.
        valid: bool ``[L]``, every head of the layer valid.
        C: ``[L, H_Q]`` non-sink collision (``0`` for an invalid head).
        H: ``[L, H_Q]`` non-sink Rényi-2 entropy ``-ln C`` in ``[0, ln(T-|𝒮|)]`` (``+inf`` if invalid).
        v: ``[L, H_Q]`` within-group softmax of ``-H/τ`` (``0`` if invalid; uniform if the whole group is).
        w: ``[L, H_Q]`` floored weights ``ζ/r + (1-ζ) v``; sum to 1 per group.
        mu: ``[L, T]`` pooled measure ``μ^l``; sums to 1 when the observer rows do.
        omega: ``[L, H_Q]`` row weight ``ω_{h,u} = w_h/(G W_p)`` (the same for every observer ``u``).
        head_group: int64 ``[H_Q]`` group ``g(h)`` of each head.
        n_sink: ``|𝒮|``.
        W_p: number of observer rows.
        zeta, tau, rho_min: the :class:`HeadPooling` parameters that made it (NaN when unknown).
    """

    a: Tensor
    z: Tensor
    valid_head: Tensor
    valid: Tensor
    C: Tensor
    H: Tensor
    v: Tensor
    w: Tensor
    mu: Tensor
    omega: Tensor
    head_group: Tensor | None = None
    n_sink: int = 0
    W_p: int = 0
    zeta: float = math.nan
    tau: float = math.nan
    rho_min: float = math.nan

    @property
    def L(self) -> int:
        return int(self.z.shape[0])

    @property
    def sink_mass(self) -> Tensor:
        """Observer-mean mass on the sinks ``Σ_{j∈𝒮} a^h_j``, float64 ``[L, H_Q]``."""
        return self.a[..., : self.n_sink].sum(-1)

    def residual(self, layer: int | None = None) -> Tensor:
        """Residual distribution ``a^h_j / z_h`` over the non-sink keys ``j ≥ |𝒮|``, float64
        ``[L, H, T-|𝒮|]`` (the distribution whose Rényi-2 entropy is ``H_h``; NaN for invalid heads);
        ``[H, T-|𝒮|]`` of one ``layer`` (O(H·T), not O(L·H·T): what a layer slider needs)."""
        sl = slice(None) if layer is None else layer
        res = self.a[sl, ..., self.n_sink:]
        valid, z = self.valid_head[sl], self.z[sl]
        zs = torch.where(valid, z, torch.ones_like(z))
        return torch.where(valid[..., None], res / zs[..., None], torch.full_like(res, math.nan))

    @property
    def n_heads(self) -> int:
        return int(self.z.shape[1])

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, head): ``layer, head, group, z, valid_head, valid_layer, C, H, v, w, omega``."""
        L, Hn = self.z.shape
        layer = torch.arange(L).repeat_interleave(Hn)
        head = torch.arange(Hn).repeat(L)
        hg = self.head_group if self.head_group is not None else torch.zeros(Hn, dtype=torch.int64)
        return pd.DataFrame(
            {
                "layer": layer.numpy(),
                "head": head.numpy(),
                "group": hg[head].numpy(),
                "z": self.z.reshape(-1).numpy(),
                "valid_head": self.valid_head.reshape(-1).numpy(),
                "valid_layer": self.valid[layer].numpy(),
                "C": self.C.reshape(-1).numpy(),
                "H": self.H.reshape(-1).numpy(),
                "v": self.v.reshape(-1).numpy(),
                "w": self.w.reshape(-1).numpy(),
                "omega": self.omega.reshape(-1).numpy(),
            }
        )

    def mu_frame(self) -> pd.DataFrame:
        """One row per (layer, key position): ``layer, pos, mu, sink``."""
        L, T = self.mu.shape
        pos = torch.arange(T).repeat(L)
        return pd.DataFrame(
            {
                "layer": torch.arange(L).repeat_interleave(T).numpy(),
                "pos": pos.numpy(),
                "mu": self.mu.reshape(-1).numpy(),
                "sink": (pos < self.n_sink).numpy(),
            }
        )


# ----------------------------------------------------------------------------- parameters
@checked()
@dataclass(frozen=True)
class HeadPooling:
    """Parameters of sink-isolated Rényi head pooling (SPEC §2).

    Attributes:
        zeta: group floor ``ζ ∈ (0, 1]`` (``1`` = uniform head weights).
        tau: entropy temperature ``τ > 0``.
        rho_min: residual threshold ``ρ_min > 0``; a head with ``z_h ≤ ρ_min`` is invalid.
    """

    zeta: float = 0.5
    tau: float = 1.0
    rho_min: float = 1e-6
    _parameter_constraints: ClassVar = shared("zeta", "tau", "rho_min")

    def __post_init__(self):
        check_fields(self)

    @shaped
    def pool(self, A_obs: Float[Tensor, "L H_Q W T"], head_group: Int[Tensor, " H_Q"], n_sink: int, *, _stats=None,
             _va: dict | None = None) -> PoolingResult:
        """Pool the observer rows of every layer (SPEC §2).

        Computes ``a``, ``z``, ``C``, ``H``, the within-group softmax ``v`` **[reconstructed]**
        (:func:`group_softmax`), the floored weights ``w`` **[reconstructed]** (:func:`group_floor`),
        ``μ`` and ``ω``, vectorised over layers and heads.

        Args:
            A_obs: float ``[L, H_Q, W, T]`` observer rows ``A^{l,h}_{u,·}`` over the prompt keys.
            head_group: int ``[H_Q]``, ``g(h)``.
            n_sink: ``|𝒮|``, ``0 ≤ n_sink ≤ T``.

        Returns:
            :class:`PoolingResult` (float64 tensors).
        """
        A_obs = torch.as_tensor(A_obs)
        if A_obs.dim() != 4:
            raise ValueError(f"A_obs: must have shape [L, H, W, T], got {list(A_obs.shape)}")
        L, Hn, W, T = A_obs.shape
        if W < 1:
            raise ValueError(f"A_obs: needs at least one observer row (W >= 1), got W={W}")
        index_into(T + 1).check("n_sink", n_sink)  # a count in [0, T]
        onehot = group_onehot(head_group, Hn)
        G = onehot.shape[1]
        if _stats is None:
            check_rows(A_obs, "A_obs")  # finite, >= 0, sums <= 1, per layer and head
            a = observer_mean(A_obs)  # [L, H_Q, T] float64
            z, valid_head, C, H = residual_stats(a, int(n_sink), self.rho_min)
        else:  # parameter-free statistics precomputed for this capture (slider path)
            a, z, valid_head, C, H = _stats
        v = group_softmax(H, valid_head, onehot, self.tau)
        w = group_floor(v, onehot, self.zeta)
        if _va is None:
            mu = torch.einsum("lh,lht->lt", w, a) / G
        else:  # slider path: Σ_h w_h a_h = ζ Σ_h a_h/r_h + (1-ζ) Σ_h v_h a_h, both sums memoised (ζ moves: O(L·T))
            if "sa" not in _va:
                _va["sa"] = torch.einsum("h,lht->lt", 1.0 / (onehot.sum(0) @ onehot.T), a)
            tk = float(self.tau)
            if tk not in _va:
                _va[tk] = torch.einsum("lh,lht->lt", v, a)
                while len(_va) > 5:
                    _va.pop(next(k for k in _va if k != "sa"))
            mu = (self.zeta * _va["sa"] + (1.0 - self.zeta) * _va[tk]) / G
        omega = w / (G * W)
        return PoolingResult(
            a=a,
            z=z,
            valid_head=valid_head,
            valid=valid_head.all(dim=1),
            C=C,
            H=H,
            v=v,
            w=w,
            mu=mu,
            omega=omega,
            head_group=torch.as_tensor(head_group).to(torch.int64).clone(),
            n_sink=int(n_sink),
            W_p=W,
            zeta=float(self.zeta),
            tau=float(self.tau),
            rho_min=float(self.rho_min),
        )

    def __call__(self, capture: Capture, cache: PoolingCache | None = None) -> PoolingResult:
        """Pool ``capture.observer_attn()`` with the capture's head groups and ``spans.n_sink``.

        ``cache``: a :class:`PoolingCache` of this capture (what a panel owns), which keeps the observer mean
        and the residual statistics (they depend only on the capture, ``n_sink`` and ``ρ_min``) and the last
        few results, so that moving ``ζ`` or ``τ`` costs only the softmax, the floor and ``μ``, and moving
        any other parameter nothing. Without one, everything is computed.
        """
        check_capture_rows(capture)  # once per capture (cached verdict)
        if cache is not None:
            if cache.capture is not capture:
                raise ValueError("capture: a PoolingCache serves the capture it was made for; make one per capture")
            return cache(self)
        # μ by the same sums as a cache computes it, so a result is the same to the last bit with or without one
        return self.pool(capture.observer_attn(), capture.head_group, capture.spans.n_sink, _va={})


class PoolingCache:
    """The pooling results of one capture that its owner (a widget panel) reuses from one slider move to the
    next: the observer mean and residual statistics per ``(n_sink, ρ_min)``, ``Σ_h v_h a_h`` per ``τ``, and the
    last :attr:`size` results per ``(ζ, τ, ρ_min, n_sink)`` (a slider that does not touch them, ``ε_s``, ``λ``,
    the target, ``ε_row``, re-uses ``μ`` instead of an ``O(L·H_Q·T)`` product). Results equal
    ``pooling(capture)``'s; the capture must not be edited in place while the cache is used.
    """

    def __init__(self, capture: Capture, size: int = 4):
        _CHECKS["size"].check("size", size)
        self.capture = capture
        self.size = int(size)
        self._results: dict = {}
        self._stats: dict = {}
        self._va: dict = {}

    def __call__(self, pooling: HeadPooling) -> PoolingResult:
        """``pooling(self.capture)``, from this cache where it holds the result."""
        cap = self.capture
        A_obs, n_sink = cap.observer_attn(), int(cap.spans.n_sink)
        rho = float(pooling.rho_min)
        key = (float(pooling.zeta), float(pooling.tau), rho, n_sink)
        if key not in self._results:
            check_capture_rows(cap)
            if (n_sink, rho) not in self._stats:
                a = observer_mean(A_obs)
                self._stats[(n_sink, rho)] = (a, *residual_stats(a, n_sink, rho))
            va = self._va.setdefault((n_sink, rho), {})
            self._results[key] = pooling.pool(A_obs, cap.head_group, n_sink, _stats=self._stats[(n_sink, rho)], _va=va)
            while len(self._results) > self.size:
                self._results.pop(next(iter(self._results)))
        return self._results[key]
