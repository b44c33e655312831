"""The one validator family: every public parameter is checked here, and every error names the
parameter and its allowed range (``"<name>: must be ..., got <value>"``).

Booleans are not integers here (``True`` is refused where a count or a position is meant), floats are
never truncated to integers, and non-finite reals are refused.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

__all__ = ["is_int", "is_real", "check_int", "check_real", "check_bool", "check_choice", "check_target",
           "check_target_tokens", "check_max_new_tokens", "check_seed", "check_kernel", "check_positions",
           "check_str", "check_device", "SEED_MAX"]

SEED_MAX = 2**63 - 1  # torch.manual_seed's range


def is_int(x) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A finite real number that is not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def _fmt(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _range(lo, hi, lo_open=False, hi_open=False) -> str:
    lo = None if lo is None else _fmt(lo)
    hi = None if hi is None else _fmt(hi)
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return ""


def check_int(name: str, x, lo: int | None = None, hi: int | None = None, *, rng: str | None = None) -> int:
    """``x`` as an ``int`` in ``[lo, hi]`` (either bound optional); ``rng`` overrides the range text."""
    rng = rng if rng is not None else _range(lo, hi)
    if not is_int(x) or (lo is not None and x < lo) or (hi is not None and x > hi):
        raise ValueError(f"{name}: must be an integer {rng}, got {x!r}".replace("integer , got", "integer, got"))
    return int(x)


def check_real(name: str, x, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
               hi_open: bool = False, rng: str | None = None) -> float:
    """``x`` as a finite ``float`` within the bounds (open or closed at either end)."""
    rng = rng if rng is not None else _range(lo, hi, lo_open, hi_open)
    if not is_real(x):
        raise ValueError(f"{name}: must be a finite real number {rng}, got {x!r}".replace("number , got", "number, got"))
    v = float(x)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{name}: must be {rng}, got {x!r}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ValueError(f"{name}: must be {rng}, got {x!r}")
    return v


def check_bool(name: str, x) -> bool:
    """A real ``bool`` (``"no"``, ``0`` or ``None`` are refused: they would silently read as a truth value)."""
    if not isinstance(x, bool):
        raise ValueError(f"{name}: must be True or False, got {x!r}")
    return x


def check_choice(name: str, x, options: Iterable):
    """``x`` one of ``options``."""
    options = tuple(options)
    if isinstance(x, bool) or x not in options:
        raise ValueError(f"{name}: must be one of {list(options)}, got {x!r}")
    return x


def check_target(target, name: str = "target") -> float:
    """A saving target as a fraction of ``N``: a ``float`` in ``(0, 1]``. An ``int`` is refused (``1``
    would read as one token or as all of ``N``): a number of tokens goes to ``target_tokens``."""
    if is_int(target):
        raise ValueError(f"{name}: must be a fraction of N, a float in (0, 1], got the int {target!r}; "
                         f"for a number of tokens use target_tokens={target!r}")
    if isinstance(target, float) and math.isfinite(target) and 0.0 < target <= 1.0:
        return float(target)
    raise ValueError(f"{name}: must be a fraction of N, a float in (0, 1], got {target!r}")


def check_target_tokens(x, name: str = "target_tokens") -> int:
    """A saving target in tokens: an integer ``>= 0`` (a float is refused: use ``target`` for fractions)."""
    if isinstance(x, float):
        raise ValueError(f"{name}: must be an integer >= 0 (tokens), got the float {x!r}; "
                         f"for a fraction of N use target={x!r}")
    return check_int(name, x, 0)


def check_device(x, name: str = "device") -> str:
    """A device name: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:<index>"``."""
    ok = isinstance(x, str) and (x in ("auto", "cpu", "cuda") or (x.startswith("cuda:") and x[5:].isdigit()))
    if not ok:
        raise ValueError(f"{name}: must be 'auto', 'cpu', 'cuda' or 'cuda:<index>', got {x!r}")
    return x


def check_str(name: str, x, *, empty: bool = False) -> str:
    """A ``str`` (non-blank unless ``empty``)."""
    if not isinstance(x, str) or (not empty and not x.strip()):
        raise ValueError(f"{name}: must be a {'' if empty else 'non-empty '}string, got {x!r}")
    return x


def check_max_new_tokens(n, name: str = "max_new_tokens") -> int:
    """Greedy tokens to generate, an integer ``≥ 1``."""
    return check_int(name, n, 1)


def check_seed(x, name: str = "seed") -> int:
    """A seed torch accepts: an integer in ``[0, 2^63 - 1]``."""
    return check_int(name, x, 0, SEED_MAX)


def check_kernel(x, name: str = "kernel") -> int:
    """A pooling kernel: an odd integer ``≥ 1`` (1 = no pooling)."""
    if not is_int(x) or x < 1 or x % 2 == 0:
        raise ValueError(f"{name}: must be an odd integer >= 1 (1 = no pooling), got {x!r}")
    return int(x)


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
