"""What a policy returns, checked on every run: the rules of the policy contract that a run depends on
(:mod:`.contract` tests every rule; these hold wherever :func:`~workbench.rerun.eviction.select.preview` selects,
which every run, preview and panel passes through).

- **scores**: a real ``torch.Tensor`` of shape ``[L, G, T]``, every value finite (no NaN, no ±inf: an infinite
  score ties with the protected positions and the budget rule could drop those);
- **protected**: a bool ``torch.Tensor`` of shape ``[T]``;
- **tiebreak**: ``None`` or a real ``torch.Tensor`` ``[L, G, T]``;
- **allocate**: ``None`` or an integer ``torch.Tensor`` ``[L, G]`` whose counts sum to ``L·G·B`` (a float count
  would be truncated, a larger sum would keep more than the budget).

A breach raises :class:`PolicyContractError` naming the policy, the method and the contract's rule.
"""
from __future__ import annotations

import torch
from torch import Tensor

from workbench.shapes import check_shape

__all__ = ["PolicyContractError", "checked_scores", "checked_protected", "checked_tiebreak", "checked_allocation",
           "RULES"]

RULES = {"scores": "scores shape [L, G, T]", "finite": "scores finite", "protected": "protected mask bool [T]",
         "allocate": "exactly B sorted"}
"""The contract's rule (a row of :func:`~workbench.rerun.eviction.contract.check_policy`) each check enforces."""


class PolicyContractError(ValueError):
    """A policy returned something the policy contract forbids (the message names the policy and the rule)."""


def _fail(policy, what: str, rule: str, detail: str) -> PolicyContractError:
    return PolicyContractError(f"{policy.name}.{what}: {detail} (policy {type(policy).__name__} breaks the policy "
                               f"contract's rule {RULES[rule]!r})")


def _tensor(policy, what: str, rule: str, x, want: str) -> Tensor:
    if not isinstance(x, torch.Tensor):
        raise _fail(policy, what, rule, f"must return a torch.Tensor {want}, got {type(x).__module__}."
                                        f"{type(x).__qualname__}" if type(x).__module__ != "builtins" else
                    f"must return a torch.Tensor {want}, got {type(x).__name__}")
    return x


def checked_scores(policy, scores, L: int, G: int, T: int) -> Tensor:
    """``policy.scores(ev)`` if it is a real tensor ``[L, G, T]`` of finite values, else a named error."""
    s = _tensor(policy, "scores", "scores", scores, f"[L, G, T] = [{L}, {G}, {T}]")
    if s.dtype == torch.bool or s.is_complex():
        raise _fail(policy, "scores", "scores", f"must be real numbers, got dtype {s.dtype}")
    dims = {"L": L, "G": G, "T": T}
    try:
        check_shape(f"{policy.name}.scores", s, "L, G, T", dims, source=dict.fromkeys(dims, "evidence"))
    except ValueError as e:
        raise PolicyContractError(f"{e} (policy {type(policy).__name__} breaks the policy contract's rule "
                                  f"{RULES['scores']!r})") from None
    if s.is_floating_point():
        bad = ~torch.isfinite(s.detach())
        if bool(bad.any()):
            nan = int(torch.isnan(s.detach()).sum())
            raise _fail(policy, "scores", "finite", f"{int(bad.sum())} of {s.numel()} scores are not finite "
                                                    f"({nan} NaN, {int(bad.sum()) - nan} ±inf)")
    return s


def checked_protected(policy, protected, T: int) -> Tensor:
    """``policy.protected(T)`` if it is a bool tensor ``[T]``, else a named error."""
    p = _tensor(policy, "protected", "protected", protected, f"bool [T] = [{T}]")
    if p.dtype != torch.bool or tuple(p.shape) != (T,):
        raise _fail(policy, "protected", "protected", f"must be a bool tensor [T] = [{T}], got {p.dtype} "
                                                      f"{list(p.shape)}")
    return p


def checked_tiebreak(policy, tiebreak, L: int, G: int, T: int) -> Tensor | None:
    """``policy.tiebreak(ev)`` if it is ``None`` or a real tensor ``[L, G, T]``, else a named error."""
    if tiebreak is None:
        return None
    t = _tensor(policy, "tiebreak", "scores", tiebreak, f"[L, G, T] = [{L}, {G}, {T}] or None")
    if tuple(t.shape) != (L, G, T) or t.dtype == torch.bool or t.is_complex():
        raise _fail(policy, "tiebreak", "scores", f"must be real numbers of shape [L, G, T] = [{L}, {G}, {T}], got "
                                                  f"{t.dtype} {list(t.shape)}")
    return t


def checked_allocation(policy, counts, L: int, G: int, B: int) -> Tensor | None:
    """``policy.allocate(ev, B)`` if it is ``None`` or integer counts ``[L, G]`` summing to ``L·G·B``, else a named
    error (the per-cell bounds are :func:`~workbench.rerun.eviction.select.select_keep`'s)."""
    if counts is None:
        return None
    c = _tensor(policy, "allocate", "allocate", counts, f"int64 [L, G] = [{L}, {G}] or None")
    if c.dtype == torch.bool or c.is_floating_point() or c.is_complex():
        raise _fail(policy, "allocate", "allocate", f"must be integer counts (a float count would be truncated), "
                                                    f"got dtype {c.dtype}")
    if tuple(c.shape) != (L, G):
        raise _fail(policy, "allocate", "allocate", f"must have shape [L, G] = [{L}, {G}], got {list(c.shape)}")
    total = int(c.sum())
    if total != L * G * B:
        raise _fail(policy, "allocate", "allocate", f"counts sum to {total}, not L·G·B = {L}·{G}·{B} = {L * G * B}: "
                                                    f"an allocation shares the budget, it never keeps more or less")
    return c.to(torch.int64)
