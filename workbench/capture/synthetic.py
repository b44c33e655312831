"""Synthetic attention rows at research shapes, for benchmarks and tests of the analytics.

``synthetic_rows`` draws ``attn [L, H_Q, R, K]`` one layer at a time (and a few heads at a time) in
float32, storing each layer in the requested dtype, so that an 8B shape (``L = 32, H_Q = 32, G = 8``) at
``T = 32k`` never holds more than one head block of float32 logits beside the stored rows: no float64 copy of
``[L, H_Q, R, K]``.

Structures (``SyntheticStructure``):

- ``"random"``: each row is a softmax of Gaussian logits (scale ``concentration``) over keys ``0 … u``.
  Small captures (``L·H_Q·R·K ≤ 2^22``) keep the historic single float64 draw, so seeded tests keep their
  values; larger ones are drawn per layer in float32.
- ``"realistic"``: logits ``z_{h,u,j} = s_h 1{j < n_sink} - β_h ln(1 + u - j) + σ ε`` with a per-head
  sink strength ``s_h = c_h ln K``, ``c_h ~ U(0.5, 1.3)`` (strong in most heads: most of the mass on the sinks, as in real LLMs), a
  per-head locality slope ``β_h`` (recency), Gaussian noise ``σ = concentration``, and in about a quarter
  of the heads of the middle layers a retrieval bonus ``+b_h`` on one span of ``span`` keys (a passage the
  head looks up). Row sums are 1 to float32 rounding.
"""
from __future__ import annotations

import math

import torch

from workbench.choices import SyntheticStructure

__all__ = ["synthetic_rows"]

_SMALL = 2 ** 22


def _random_layer(g, H: int, R: int, K: int, causal: torch.Tensor, concentration: float) -> torch.Tensor:
    z = torch.randn(H, R, K, generator=g, dtype=torch.float32) * concentration
    z.masked_fill_(~causal, float("-inf"))
    return torch.softmax(z, dim=-1)


def _realistic_layer(g, l: int, L: int, H: int, pos: torch.Tensor, K: int, causal: torch.Tensor,
                     concentration: float, n_sink: int, span: int, head_block: int, out: torch.Tensor) -> None:
    R = pos.numel()
    dist = torch.log1p((pos[:, None] - torch.arange(K)[None, :]).clamp(min=0).to(torch.float32))  # [R, K]
    depth = l / max(1, L - 1)
    for h0 in range(0, H, head_block):
        hb = min(head_block, H - h0)
        u = torch.rand(hb, 4, generator=g)
        sink = math.log(K) * (0.5 + 0.8 * u[:, 0])  # s_h in [0.5, 1.3] · ln K: sink mass ~0.1 … 0.95
        beta = 1.5 * u[:, 1]  # locality slope in [0, 1.5]
        z = torch.randn(hb, R, K, generator=g, dtype=torch.float32).mul_(concentration)
        z.addcmul_(dist.expand(hb, R, K), -beta[:, None, None])
        z[:, :, : min(n_sink, K)] += sink[:, None, None]
        retr = (u[:, 2] < 0.25) & (0.2 < depth < 0.9)
        for i in torch.nonzero(retr).flatten().tolist():
            start = int(u[i, 3] * max(1, K - span))
            z[i, :, start: start + span] += 3.0 + 2.0 * float(u[i, 0])
        z.masked_fill_(~causal, float("-inf"))
        out[h0: h0 + hb] = torch.softmax(z, dim=-1).to(out.dtype)


def synthetic_rows(pos: list[int], K: int, *, L: int, H_Q: int, generator: torch.Generator, concentration: float,
                   structure: SyntheticStructure = "random", n_sink: int = 4, dtype: torch.dtype = torch.float32,
                   span: int = 64, head_block: int = 8) -> torch.Tensor:
    """Causal attention rows ``[L, H_Q, R, K]`` in ``dtype`` for query positions ``pos`` (see module docstring)."""
    g = generator
    R = len(pos)
    p = torch.tensor(pos, dtype=torch.int64)
    causal = torch.arange(K)[None, :] <= p[:, None]  # [R, K]
    if structure == "random" and L * H_Q * R * K <= _SMALL:
        z = torch.randn(L, H_Q, R, K, generator=g, dtype=torch.float64) * concentration
        z = z.masked_fill(~causal, float("-inf"))
        return torch.softmax(z, dim=-1).to(dtype)
    attn = torch.empty(L, H_Q, R, K, dtype=dtype)
    for l in range(L):
        if structure == "random":
            for h0 in range(0, H_Q, head_block):
                hb = min(head_block, H_Q - h0)
                attn[l, h0: h0 + hb] = _random_layer(g, hb, R, K, causal, concentration).to(dtype)
        else:
            _realistic_layer(g, l, L, H_Q, p, K, causal, concentration, n_sink, span, head_block, attn[l])
    return attn
