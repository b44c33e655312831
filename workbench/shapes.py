"""Checked tensor shapes: the ``[layers, heads, rows, keys]``-style shapes a signature names, enforced.

:func:`check_shape` checks one tensor against a shape such as ``"L, G, T"`` (or ``"..., H, W, T"``), binding
each named dimension on first sight so that the same letter means the same size across arguments.
:func:`shaped` decorates a public function whose tensor arguments carry jaxtyping annotations
(``scores: Float[Tensor, "L G T"]``): every annotated tensor argument is checked against its shape (an
argument given ``None`` is skipped; a union of several shapes lists alternatives, the first that fits wins).
jaxtyping says what the shapes are (editors and type checkers read them); the check here keeps one message
for every wrong shape, naming the argument, the shape with the sizes already bound, and the shape it got::

    protected: must have shape [T] = [12] (T from scores), got [10]

The decorator is active under pytest (``"pytest" in sys.modules`` when the function is decorated) or when
``WORKBENCH_CHECK_SHAPES=1``; ``WORKBENCH_CHECK_SHAPES=0`` turns it off. Inactive, it returns the
function unchanged (no cost per call).
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import types
import typing
from typing import Callable, TypeVar

from jaxtyping import AbstractArray

__all__ = ["ENV", "shapes_active", "parse_shape", "check_shape", "annotated_shapes", "shaped"]

ENV = "WORKBENCH_CHECK_SHAPES"
F = TypeVar("F", bound=Callable)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_']*$")


def shapes_active() -> bool:
    """Whether :func:`shaped` checks: ``WORKBENCH_CHECK_SHAPES`` (``1``/``0``), else whether pytest is loaded."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    return "pytest" in sys.modules


def parse_shape(spec: str) -> tuple[str, ...]:
    """``"L, G, T"`` (or ``"[L, G, T]"``) → ``("L", "G", "T")``. A dimension is a name (bound on first sight),
    an integer (checked as is), ``...`` (any number of leading dimensions, first only) or anything else
    (an expression such as ``min(B, T)``: not checked)."""
    s = spec.strip()
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1]
    dims, depth, cur = [], 0, ""
    for ch in s:  # split on the commas outside parentheses
        if ch == "," and depth == 0:
            dims.append(cur.strip())
            cur = ""
            continue
        depth += ch in "(["
        depth -= ch in ")]"
        cur += ch
    if cur.strip():
        dims.append(cur.strip())
    if "..." in dims[1:]:
        raise ValueError(f"shape: '...' may only lead, got [{spec}]")
    return tuple(dims)


def _fmt(dims: tuple[str, ...], bound: dict) -> str:
    plain = "[" + ", ".join(dims) + "]"
    if not any(d in bound for d in dims):
        return plain
    return plain + " = [" + ", ".join(str(bound.get(d, d)) for d in dims) + "]"


def _match(shape: tuple[int, ...], dims: tuple[str, ...], bound: dict) -> dict | None:
    """The bindings ``shape`` adds to ``bound`` under ``dims``, or None when it does not fit."""
    if dims and dims[0] == "...":
        rest = dims[1:]
        if len(shape) < len(rest):
            return None
        shape = shape[len(shape) - len(rest):]
        dims = rest
    if len(shape) != len(dims):
        return None
    new: dict = {}
    for n, d in zip(shape, dims):
        if d.isdigit():
            if n != int(d):
                return None
        elif _IDENT.match(d):
            want = bound.get(d, new.get(d))
            if want is None:
                new[d] = int(n)
            elif want != n:
                return None
    return new


def check_shape(name: str, x, shape, bound: dict | None = None, *, source: dict | None = None) -> dict:
    """Check ``x.shape`` against ``shape`` (a string such as ``"L, G, T"``, a tuple of names, or several
    alternatives as a list); return ``bound`` updated with the dimensions it binds.

    Args:
        name: the argument's name (the message starts with it).
        x: anything with a ``.shape`` (a tensor or an array).
        shape: the expected shape; names bind on first sight, ``bound`` gives sizes already known.
        bound: ``{dimension: size}`` known so far (not modified).
        source: ``{dimension: argument}`` where each bound size came from (for the message).
    """
    bound = dict(bound or {})
    alts = shape if isinstance(shape, list) else [shape]
    alts = [parse_shape(a) if isinstance(a, str) else tuple(a) for a in alts]
    got = tuple(int(n) for n in getattr(x, "shape", ()))
    if not hasattr(x, "shape"):
        raise ValueError(f"{name}: must be a tensor of shape {' or '.join(_fmt(a, bound) for a in alts)}, "
                         f"got {type(x).__name__}")
    for dims in alts:
        new = _match(got, dims, bound)
        if new is not None:
            bound.update(new)
            if source is not None:
                for d in new:
                    source.setdefault(d, name)
            return bound
    want = " or ".join(_fmt(a, bound) for a in alts)
    used = [d for d in dict.fromkeys(d for a in alts for d in a) if d in bound]
    came = [f"{d} from {source[d]}" for d in used if source and d in source and source[d] != name]
    why = f" ({', '.join(came)})" if came else ""
    raise ValueError(f"{name}: must have shape {want}{why}, got {list(got)}")


def annotated_shapes(fn: Callable) -> dict[str, list[tuple[str, ...]]]:
    """``{argument: [shape, ...]}`` from ``fn``'s jaxtyping annotations (``scores: Float[Tensor, "L G T"]``): the
    dimensions of every :class:`jaxtyping.AbstractArray` an argument's annotation names, several for a union
    (``Float[Tensor, "H_Q"] | Float[Tensor, "H_Q W"]``: alternatives, the first that fits wins); ``None`` in a
    union makes the argument optional. The return annotation is not an argument."""
    hints = typing.get_type_hints(fn, include_extras=True)
    out: dict[str, list[tuple[str, ...]]] = {}
    for name, hint in hints.items():
        if name == "return":
            continue
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is \
            typing.Union else (hint,)
        shapes = [parse_shape(", ".join(m.dim_str.split())) for m in members
                  if isinstance(m, type) and issubclass(m, AbstractArray)]
        if shapes:
            out[name] = shapes
    return out


def shaped(fn: F) -> F:
    """Check the shapes ``fn``'s jaxtyping annotations name for its tensor arguments, on every call (see the
    module docstring); a no-op when :func:`shapes_active` is false at decoration time."""
    if not shapes_active():
        return fn
    specs = annotated_shapes(fn)
    sig = inspect.signature(fn)
    if not specs:
        raise TypeError(f"shaped: {fn.__qualname__} annotates no shapes (jaxtyping, e.g. Float[Tensor, \"L G T\"])")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ba = sig.bind(*args, **kwargs)
        bound: dict = {}
        source: dict = {}
        for a, alts in specs.items():
            x = ba.arguments.get(a)
            if x is None or not hasattr(x, "shape"):
                continue  # optional, or not a tensor (the function's own checks name it)
            bound = check_shape(a, x, list(alts), bound, source=source)
        return fn(*args, **kwargs)

    wrapper.__shapes__ = specs
    return wrapper  # type: ignore[return-value]
