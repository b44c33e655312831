"""The one validator family: every public parameter is checked here, and every error names the
parameter and its allowed range, in one format: ``"<name>: must be <allowed>, got <value>"``
(e.g. ``zeta: must be in (0, 1], got 0``).

A parameter's allowed set is a **constraint object** (in the manner of scikit-learn's
``utils/_param_validation.py``): :class:`Interval` (real or integer, open or closed ends),
:class:`Choice`, :class:`Bool`, :class:`AnyOf` (e.g. ``None`` allowed: :func:`optional`), :class:`Seq`
(a list of constrained entries) and :class:`InstanceOf`. Each has ``check(name, value)`` (raises
``ValueError`` with the message above, returns the value), ``describe()`` (the allowed set, the text
after "must be"), ``invalid()`` (generated values it refuses, as sklearn's ``generate_invalid_param_val``)
and ``valid()`` (values it accepts). The named constraint of each parameter lives in
:mod:`workbench.constraints`.

Booleans are not integers here (``True`` is refused where a count or a position is meant), floats are
never truncated to integers, and non-finite reals are refused.
"""
from __future__ import annotations

from collections.abc import Iterable

from workbench.constraint_types import (
    AnyOf,
    Bool,
    Choice,
    Const,
    Constraint,
    InstanceOf,
    Interval,
    Seq,
    check_args,
    check_fields,
    constraints_of,
    is_int,
    is_real,
    optional,
)

__all__ = ["is_int", "is_real", "check_target",
           "check_target_tokens", "check_max_new_tokens", "check_positions", "check_str", "check_device",
           "check_context", "check_nonempty", "SEED_MAX", "Constraint", "Interval", "Choice", "Bool", "Const", "AnyOf",
           "Seq", "InstanceOf", "optional", "check_fields", "check_args", "constraints_of"]

SEED_MAX = 2**63 - 1  # torch.manual_seed's range


TARGET = Interval("real", 0.0, 1.0, closed="right", what="a fraction of N, a float",
                  int_hint="for a number of tokens use target_tokens={value!r}")
"""A saving target as a fraction of ``N`` (an ``int`` is refused: ``1`` would read as one token or as all of ``N``)."""
TARGET_TOKENS = Interval("int", 0, None, note="tokens", float_hint="for a fraction of N use target={value!r}")
"""A saving target in tokens (a float is refused: use ``target`` for fractions)."""
SEED = Interval("int", 0, SEED_MAX)
"""A seed torch accepts."""
KERNEL = Interval("int", 1, None, odd=True, note="1 = no pooling")
"""A pooling kernel: odd (1 = no pooling)."""
MAX_NEW_TOKENS = Interval("int", 1, None)
"""Greedy tokens to generate."""


def _is_device(x) -> bool:
    return isinstance(x, str) and (x in ("auto", "cpu", "cuda", "mps") or (x.startswith("cuda:") and x[5:].isdigit()))


DEVICE = InstanceOf(_is_device, "'auto', 'cpu', 'cuda', 'cuda:<index>' or 'mps'",
                    examples=("auto", "cpu", "cuda", "cuda:1", "mps"))
"""A device name (whether this machine has it is checked where it is used)."""


def check_target(target, name: str = "target") -> float:
    """A saving target as a fraction of ``N``: a ``float`` in ``(0, 1]`` (:data:`TARGET`)."""
    return TARGET.check(name, target)


def check_target_tokens(x, name: str = "target_tokens") -> int:
    """A saving target in tokens: an integer ``>= 0`` (:data:`TARGET_TOKENS`)."""
    return TARGET_TOKENS.check(name, x)


def check_device(x, name: str = "device") -> str:
    """A device name: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:<index>"`` or ``"mps"`` (:data:`DEVICE`)."""
    return DEVICE.check(name, x)


def check_str(name: str, x, *, empty: bool = False) -> str:
    """A ``str`` (non-blank unless ``empty``)."""
    if not isinstance(x, str) or (not empty and not x.strip()):
        raise ValueError(f"{name}: must be a {'' if empty else 'non-empty '}string, got {x!r}")
    return x


def check_max_new_tokens(n, name: str = "max_new_tokens") -> int:
    """Greedy tokens to generate, an integer ``≥ 1`` (:data:`MAX_NEW_TOKENS`)."""
    return MAX_NEW_TOKENS.check(name, n)


def check_positions(name: str, xs, T: int) -> list[int]:
    """A sequence of integer positions in ``[0, T)`` (bools and floats refused, never truncated)."""
    if isinstance(xs, (str, bytes)) or not isinstance(xs, Iterable):
        raise ValueError(f"{name}: must be a sequence of integer positions in [0, {T}), got {xs!r}")
    out = []
    for x in xs:
        if not is_int(x) or not 0 <= x < T:
            raise ValueError(f"{name}: must hold integer positions in [0, {T}), got {x!r}")
        out.append(int(x))
    return out


def check_context(T: int, n_new: int, max_context: int | None, *, n_name: str = "max_new_tokens") -> None:
    """The one length check of every entry point: a prompt of ``T`` tokens and ``n_new`` tokens after it must
    fit in the model's context (``T + n_new <= max_context``; ``max_context`` 0 or ``None``: no limit known).

    A prompt longer than the context alone is named as ``prompt`` (with its length), never as the count of new
    tokens (which may be 0); otherwise ``n_name`` is named with the most that fits after this prompt.
    """
    if not max_context:
        return
    if T > max_context:
        raise ValueError(f"prompt: must have T <= max_context = {max_context} tokens (the model's context), got T = "
                         f"{T} tokens; shorten the documents")
    if T + n_new > max_context:
        raise ValueError(f"{n_name}: must be <= {max_context - T} after this prompt of T = {T} tokens (T + {n_name} "
                         f"<= max_context = {max_context}, the model's context), got {n_new}")


def check_nonempty(name: str, xs) -> list:
    """A non-empty list of ``xs`` (policies, budgets, prompts ...): an empty one would silently run nothing."""
    if isinstance(xs, (str, bytes)) or not isinstance(xs, Iterable):
        raise ValueError(f"{name}: must be a non-empty list, got {xs!r}")
    out = list(xs)
    if not out:
        raise ValueError(f"{name}: must be a non-empty list, got [] (nothing would run)")
    return out
