"""Top-k membership with a fixed tie rule, shared by the shift recall (SPEC §9) and the keep sets (SPEC §8).

Ties at the k-th value go to the lower positions: the set a stable descending sort gives, so results do
not depend on the kernel's tie order.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["topk_mask"]


def topk_mask(x: Tensor, k: int) -> Tensor:
    """Bool mask of the top ``k`` entries of ``x`` over the last axis, ties at the k-th value resolved to the
    lower positions (the set a stable descending sort gives), without sorting: one ``topk`` for the k-th
    value, then a count of the ties that fit.

    Args:
        x: float ``[..., T]``.
        k: ``1 ≤ k ≤ T`` (not checked here; callers name their parameter).

    Returns:
        bool ``[..., T]`` with exactly ``k`` True per row.
    """
    vk = torch.topk(x, k, dim=-1, sorted=True).values[..., -1:]  # the k-th largest value
    gt = x > vk
    need = k - gt.sum(-1, keepdim=True)
    eq = x == vk
    return gt | (eq & (torch.cumsum(eq.to(torch.int32), -1) <= need))
