"""ExpectedAttention: Devoto et al., *Expected Attention: KV Cache Compression by Estimating Attention from Future Queries Distribution* (arXiv:2510.00636; kvpress's ExpectedAttentionPress)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.checks import check_bool, check_int, check_real
from workbench.rerun.eviction.evidence import EvictionPolicy, Evidence, Needs, group_mean


@dataclass(frozen=True)
class ExpectedAttention(EvictionPolicy):
    """The question-agnostic forecast (evict at ``t = 0``): attention predicted for the *future* queries
    from the statistics of the prompt's own queries, times the value norm.

    Per layer and query head, with pre-RoPE prompt queries ``q_i`` for ``i ≥ n_sink`` (the sinks left out):
    ``μ = mean q_i``, ``Σ = mean (q_i − μ)(q_i − μ)ᵀ``; the averaged future rotation
    ``R̄ = (1/F) Σ_{p=T}^{T+F-1} R(p)`` (``R(p) = diag(cos_p) + diag(sin_p)·P``, ``P x = rotate_half(x)``) gives
    ``μ' = R̄ μ`` and ``Σ' = R̄ Σ R̄ᵀ``. A query ``q ~ 𝒩(μ', Σ')`` has ``E[exp(qᵀk/√d)] = exp(μ'ᵀk/√d +
    kᵀΣ'k/(2d))``, so the expected attention of key ``k_j`` (post-RoPE, ``j ≥ n_sink``) is

        ``Â_j = softmax_j( μ'ᵀ k_j / √d + k_jᵀ Σ' k_j / (2d) )``,

    averaged over the group's heads, and the score is ``(Â_j + ε) · ‖v_j‖_2``. DeferKV's real first-decode
    query is what this forecast should be compared against. ``ExpectedAttention(recent=0)`` is kvpress's
    ``ExpectedAttentionPress()`` (tests/peers/).

    Attributes:
        n_sink: sinks, protected and left out of the statistics (``≤ 16``); recent: protected recent window.
        n_future: ``F ≥ 1`` future positions averaged in ``R̄``.
        use_covariance: include the ``Σ'`` term. use_vnorm: multiply by ``‖v_j‖``. epsilon: ``ε ≥ 0``.
    """

    n_sink: int = 4
    recent: int = 32
    n_future: int = 512
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0
    name: ClassVar[str] = "expected-attention"

    def __post_init__(self):
        self._check_common()
        check_int("n_sink", self.n_sink, 0, 16)
        check_int("n_future", self.n_future, 1, 1 << 20)
        check_bool("use_covariance", self.use_covariance)
        check_bool("use_vnorm", self.use_vnorm)
        check_real("epsilon", self.epsilon, 0.0, 1.0)

    def needs(self) -> Needs:
        return Needs(keys=True, qstats=self.n_future)

    def scores(self, ev: Evidence) -> Tensor:
        K = ev.require("keys", "ExpectedAttention").to(torch.float64)  # [L, G, T, d]
        qs, qo, q0 = (ev.require(n, "ExpectedAttention") for n in ("q_sum", "q_outer", "q_first"))
        cos, sin = ev.require("rope_cos", "ExpectedAttention"), ev.require("rope_sin", "ExpectedAttention")
        if cos.shape[0] < self.n_future:
            raise ValueError(f"n_future: {self.n_future} positions needed, the evidence has {cos.shape[0]}")
        s, T, d = min(self.n_sink, ev.T - 1), ev.T, K.shape[-1]
        head = q0[:, :, :s]
        n = T - s
        mu = (qs - head.sum(2)) / n  # [L, H, d]
        second = (qo - torch.einsum("lhti,lhtj->lhij", head, head)) / n
        cov = second - mu[..., :, None] * mu[..., None, :]
        cos, sin = cos[: self.n_future].double(), sin[: self.n_future].double()
        P = torch.zeros(d, d, dtype=torch.float64)
        P[d // 2:, : d // 2], P[: d // 2, d // 2:] = torch.eye(d // 2), -torch.eye(d // 2)
        R = (cos[:, :, None] * torch.eye(d, dtype=torch.float64) + sin[:, :, None] * P).mean(0)  # [d, d]
        mu = mu @ R.T
        k = K[:, ev.head_group, s:]  # [L, H_Q, T-s, d]
        z = torch.einsum("lhd,lhtd->lht", mu, k) / math.sqrt(d)
        if self.use_covariance:
            cov = R @ cov @ R.T
            z = z + torch.einsum("lhti,lhij,lhtj->lht", k, cov, k) / d / 2
        a = group_mean(torch.softmax(z, dim=-1), ev)  # [L, G, T-s]
        if self.use_vnorm:
            a = (a + self.epsilon) * ev.require("values", "ExpectedAttention")[:, :, s:].double().norm(dim=-1)
        return torch.cat([torch.zeros(ev.L, ev.G, s, dtype=torch.float64), a], -1)
