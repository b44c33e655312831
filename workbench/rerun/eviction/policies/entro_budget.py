"""EntroBudget: per-head budgets from EntroPrefill's head entropies (SPEC §2, paper §3.1), the workbench's own allocation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.analyse.pooling import HeadPooling
from workbench.constraints import checked, shared
from workbench.rerun.eviction.evidence import Evidence, Needs
from workbench.rerun.eviction.policies.base import EvictionPolicy, OnBasePolicy, split_budget
from workbench.rerun.eviction.policies.snapkv import SnapKV


@checked()
@dataclass(frozen=True)
class EntroBudget(OnBasePolicy):
    """Per-head budgets inside a layer by EntroPrefill's head weights.

    **[decided]** SPEC §2's weights ``w_h`` sum to 1 within each KV group, so they are taken one level up:
    a group's entropy is ``H̄_g = Σ_{h∈ℋ_g} w_h H_h`` (sink-isolated Rényi-2 entropies of the proposal
    observers; an invalid head counts as uniform, ``ln(T − |𝒮|)``), and the layer's ``G·(B − p)`` free
    slots are shared by the same floored softmax, ``u_g = ζ/G + (1 − ζ) softmax_g(−H̄_g/τ)``: focused
    groups get more of the budget. ``p`` = the base's protected count, kept by every group. As for AdaKV,
    the dense cache keeps the layer's largest count and masks the rest.

    Attributes:
        base: the policy scoring within a layer (not the full cache).
        zeta, tau, rho_min: :class:`~workbench.analyse.pooling.HeadPooling` parameters (and the floor/temperature).
        W_p: observers when the prompt has no spans.
    """

    base: EvictionPolicy = SnapKV()
    zeta: float = 0.5
    tau: float = 1.0
    rho_min: float = 1e-6
    W_p: int = 8
    _parameter_constraints = shared("zeta", "tau", "rho_min", "W_p")
    name: ClassVar[str] = "entro-budget"

    def needs(self) -> Needs:
        return self.base.needs().merge(Needs(observers=self.W_p))

    def group_shares(self, ev: Evidence) -> Tensor:
        """``u_{l,g}``; float64 ``[L, G]``, summing to 1 over each layer's groups."""
        obs = ev.require("observers", "EntroBudget")
        n_sink = min(ev.n_sink, ev.T - 1)
        pool = HeadPooling(zeta=self.zeta, tau=self.tau, rho_min=self.rho_min).pool(obs, ev.head_group, n_sink)
        H = torch.where(torch.isfinite(pool.H), pool.H, torch.full_like(pool.H, float(torch.log(torch.tensor(ev.T - n_sink)))))
        Hg = torch.zeros(ev.L, ev.G, dtype=torch.float64).index_add_(1, ev.head_group, pool.w * H)
        return self.zeta / ev.G + (1 - self.zeta) * torch.softmax(-Hg / self.tau, dim=-1)

    def allocate(self, ev: Evidence, budget: int) -> Tensor:
        u = self.group_shares(ev)
        p, T = int(self.protected(ev.T).sum()), ev.T
        return torch.stack([split_budget(ev.G * budget, u[l], p, T) for l in range(ev.L)])
