"""PageEntroKV: EntroPrefill's group pooling (SPEC §2, paper §3.1) with page selection (SPEC §8, paper §7)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from workbench.analyse.pages import group_scores, page_importance
from workbench.analyse.pooling import HeadPooling
from workbench.constraints import checked, shared
from workbench.rerun.eviction.evidence import Evidence, Needs
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class PageEntroKV(EvictionPolicy):
    """Page-EntroKV: SPEC §2 group weights on the proposal observers, SPEC §8 pages.

    Group score ``p_{l,g}(j) = Σ_{h∈ℋ_g} w_h a^h_j`` (``a`` = observer mean, ``w`` from
    :class:`~workbench.analyse.pooling.HeadPooling` with sink isolation over ``n_sink``); every token scores its
    page's importance ``I(P) = max_{j∈P} p(j)`` (pages of ``page`` tokens from position 0), so whole
    pages are taken in order of importance; within the last, partly kept page the higher ``p(j)`` wins.

    Attributes:
        n_sink, recent: protected sinks and recent window.
        page: page size ``b ≥ 1``.
        zeta, tau, rho_min: :class:`HeadPooling` parameters.
        W_p: observers when the prompt has no spans (its last ``W_p`` tokens), ``≥ 1``.
    """

    n_sink: int = 4
    recent: int = 32
    page: int = 16
    zeta: float = 0.5
    tau: float = 1.0
    rho_min: float = 1e-6
    W_p: int = 8
    _parameter_constraints = shared("page", "zeta", "tau", "rho_min", "W_p")
    name: ClassVar[str] = "page-entrokv"

    def needs(self) -> Needs:
        return Needs(observers=self.W_p)

    def group_score(self, ev: Evidence) -> Tensor:
        """``p_{l,g}(j)``; float64 ``[L, G, T]``."""
        obs = ev.require("observers", "Page-EntroKV")
        pool = HeadPooling(zeta=self.zeta, tau=self.tau, rho_min=self.rho_min).pool(
            obs, ev.head_group, min(self.n_sink, ev.T))
        return group_scores(pool.a, pool.w, ev.head_group)

    def scores(self, ev: Evidence) -> Tensor:
        p = self.group_score(ev)
        I = page_importance(p, self.page)  # [L, G, N_P]
        return I.repeat_interleave(self.page, dim=-1)[..., : ev.T]

    def tiebreak(self, ev: Evidence) -> Tensor:
        return self.group_score(ev)
