"""What a compressed cache changed in the answer: per answer token, the compressed run teacher-forced on the
full-cache answer's tokens against the full-cache run.

For answer token ``j`` (0-based) with full-cache token ``y_j`` and next-token log-probabilities ``log p_j``
(full cache) and ``log q_j`` (compressed, teacher-forced on ``y_0 … y_{j-1}``):

- ``kl_j = KL(p_j ‖ q_j) = Σ_v p_j(v) (log p_j(v) − log q_j(v))`` (natural log, ``≥ 0``);
- ``dlogp_j = log q_j(y_j) − log p_j(y_j)`` (negative: the compressed run believes the full answer less);
- ``dmargin_j = m_q − m_p`` with the margin ``m = log p(y_j) − max_{v ≠ y_j} log p(v)`` of the chosen token over
  the best other token (equal to the logit difference: the normaliser cancels); a negative margin under ``q``
  means the compressed run would have chosen another token there;
- the **first parting** position: the first ``j`` where the compressed run's own greedy answer differs from the
  full answer (one answer ending before the other counts as parting where it ends).

**[reconstructed]** SPEC names no divergence of answers; teacher forcing on the full answer is the choice that
makes every position comparable (the free-running compressed answer is another text after it parts).
Arithmetic is float64 over ``log_softmax`` (stable for logits of any scale).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from workbench.checks import check_str

__all__ = ["AnswerDivergence", "logit_divergence", "token_kl", "chosen_margin", "first_parting"]


def _logprobs(name: str, logits) -> np.ndarray:
    """float64 ``[n, V]`` log-probabilities of finite ``[n, V]`` logits."""
    t = logits.detach().cpu() if isinstance(logits, torch.Tensor) else torch.as_tensor(np.asarray(logits))
    if t.ndim != 2 or t.shape[0] < 1 or t.shape[1] < 2:
        raise ValueError(f"{name}: must be logits of shape [n_answer ≥ 1, vocab ≥ 2], got {tuple(t.shape)}")
    t = t.to(torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: has non-finite logits")
    return torch.log_softmax(t, dim=-1).numpy()


def _ids(name: str, ids, n: int | None, V: int) -> np.ndarray:
    a = np.asarray([int(i) for i in ids], dtype=np.int64)
    if n is not None and a.shape != (n,):
        raise ValueError(f"{name}: must hold one token id per logits row ({n}), got {a.shape[0]}")
    bad = a[(a < 0) | (a >= V)]
    if bad.size:
        raise ValueError(f"{name}: token ids must lie in [0, {V - 1}], got {bad[:5].tolist()}")
    return a


def token_kl(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """``KL(p_j ‖ q_j)`` per row of two float64 ``[n, V]`` log-probability arrays → ``[n]`` (``0·log 0 = 0``)."""
    p = np.exp(logp)
    terms = np.where(p > 0, p * (logp - logq), 0.0)
    return np.maximum(terms.sum(-1), 0.0)  # rounding can leave −1e-17 on equal rows


def chosen_margin(logp: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``log p_j(y_j) − max_{v ≠ y_j} log p_j(v)`` per row of float64 ``[n, V]`` → ``[n]``."""
    rows = np.arange(len(ids))
    chosen = logp[rows, ids]
    other = logp.copy()
    other[rows, ids] = -np.inf
    return chosen - other.max(-1)


def first_parting(full_ids: Sequence[int], other_ids: Sequence[int]) -> int | None:
    """The first position where two answers differ; where one is a prefix of the other, the shorter one's
    length (it stopped, the other went on); ``None`` for equal answers."""
    a, b = [int(i) for i in full_ids], [int(i) for i in other_ids]
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class AnswerDivergence:
    """Per answer token of the full-cache answer: the divergence of a compressed run (teacher-forced on it).

    Attributes:
        label: the compressed setting in words (``"snapkv, B = 64"``).
        ids: ``[n]`` the full-cache answer's token ids; tokens: their text (``""`` without a tokenizer).
        kl, dlogp, dmargin: float64 ``[n]`` (see the module).
        margin_full: float64 ``[n]`` the full cache's margin of each chosen token.
        other_ids: the compressed run's own greedy answer (``()`` when not given).
        first_divergence: the first parting position (:func:`first_parting`), ``None`` when the answers agree.
    """

    label: str
    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    kl: np.ndarray
    dlogp: np.ndarray
    dmargin: np.ndarray
    margin_full: np.ndarray
    other_ids: tuple[int, ...] = ()
    first_divergence: int | None = None

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def mean_kl(self) -> float:
        return float(np.mean(self.kl))

    @property
    def parted(self) -> np.ndarray:
        """bool ``[n]``: positions at or after the first parting."""
        j = self.n if self.first_divergence is None else self.first_divergence
        return np.arange(self.n) >= j

    def to_frame(self) -> pd.DataFrame:
        """One row per answer token: ``position, token_id, token, kl, dlogp, dmargin, margin_full, parted``."""
        return pd.DataFrame({"position": np.arange(self.n), "token_id": list(self.ids), "token": list(self.tokens),
                             "kl": self.kl, "dlogp": self.dlogp, "dmargin": self.dmargin,
                             "margin_full": self.margin_full, "parted": self.parted})

    def summary(self) -> dict:
        """``label, n_answer, mean_kl, max_kl, mean_dlogp, first_divergence`` (``None``: the answers agree)."""
        return {"label": self.label, "n_answer": self.n, "mean_kl": self.mean_kl, "max_kl": float(np.max(self.kl)),
                "mean_dlogp": float(np.mean(self.dlogp)), "first_divergence": self.first_divergence}


def logit_divergence(full_logits, compressed_logits, ids: Sequence[int], *, other_ids: Sequence[int] | None = None,
                      tokens: Sequence[str] | None = None, label: str = "compressed") -> AnswerDivergence:
    """The :class:`AnswerDivergence` of two runs' logits on the full answer's tokens.

    Args:
        full_logits: ``[n, V]`` logits of the full-cache run; row ``j`` predicts answer token ``j``.
        compressed_logits: ``[n, V]`` logits of the compressed run teacher-forced on ``ids``.
        ids: ``[n]`` the full-cache answer's token ids.
        other_ids: the compressed run's own greedy answer; ``None`` takes the first row whose argmax differs
            from ``ids`` (where the greedy answers part when they agree up to it).
        tokens: ``[n]`` the text of each token (default ``""``).
        label: the compressed setting in words.
    """
    label = check_str("label", label)
    logp = _logprobs("full_logits", full_logits)
    logq = _logprobs("compressed_logits", compressed_logits)
    if logq.shape != logp.shape:
        raise ValueError(f"compressed_logits: must have the shape of full_logits {logp.shape}, got {logq.shape}")
    n, V = logp.shape
    y = _ids("ids", ids, n, V)
    if other_ids is None:
        differ = np.flatnonzero(logq.argmax(-1) != y)
        first = int(differ[0]) if differ.size else None
        other = ()
    else:
        other = tuple(int(i) for i in _ids("other_ids", other_ids, None, V))
        first = first_parting(y.tolist(), other)
        if first is not None and first >= n:  # it agrees on every token of the full answer, then goes on
            first = None
    toks = tuple("" for _ in range(n)) if tokens is None else tuple(str(t) for t in tokens)
    if len(toks) != n:
        raise ValueError(f"tokens: must hold one text per answer token ({n}), got {len(toks)}")
    rows = np.arange(n)
    m_p, m_q = chosen_margin(logp, y), chosen_margin(logq, y)
    return AnswerDivergence(label=label, ids=tuple(y.tolist()), tokens=toks, kl=token_kl(logp, logq),
                            dlogp=logq[rows, y] - logp[rows, y], dmargin=m_q - m_p, margin_full=m_p,
                            other_ids=other, first_divergence=first)

