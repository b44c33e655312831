"""The sweep's method registry: a **method** is a function registered by name (see :mod:`workbench.study.sweep`
for the contract of ``fn(lm, item, params) -> dict`` and of ``per_item`` methods).

``METHODS`` is filled at import by the ``@register_method`` decorators of :mod:`workbench.study.methods`
(``full``, ``entroprefill``, ``evict``) and changed only through :func:`register_method` /
:func:`unregister_method`; it carries no state between cells.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workbench.checks import Bool
from workbench.constraints import register_all

__all__ = ["Method", "METHODS", "RESERVED_PARAMS", "register_method", "unregister_method", "get_method",
           "available_methods", "check_param_name"]

RESERVED_PARAMS = ("max_new_tokens", "seed")
_CHECKS = register_all("register_method", {"per_item": Bool()}, __name__)


@dataclass(frozen=True)
class Method:
    """A registered method: ``fn(lm, item, params) -> dict``; ``params`` the accepted parameter names
    (``None``: any); ``per_item``: ``fn(lm, item, [params, ...]) -> [dict or exception, ...]`` runs all
    the method's cells of one item in one call."""

    name: str
    fn: Callable
    params: tuple[str, ...] | None = None
    description: str = ""
    per_item: bool = False


METHODS: dict[str, Method] = {}


def register_method(name: str, fn: Callable | None = None, *, params: Sequence[str] | None = None,
                    description: str = "", replace: bool = False, per_item: bool = False):
    """Register ``fn(lm, item, params) -> dict`` under ``name`` (usable as a decorator).

    Args:
        params: the parameter names the method accepts (a grid with another name raises); ``None``: any.
        replace: allow replacing an existing registration.
        per_item: the method runs all its cells of one item together: ``fn(lm, item, [params, ...])``
            returns one dict (or one exception, that cell's error) per cell, in order.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: must be an identifier-like string, got {name!r}")
    _CHECKS["per_item"].check("per_item", per_item)
    if params is not None:
        params = tuple(params)
        for p in params:
            check_param_name(p)

    def deco(f):
        if not callable(f):
            raise ValueError(f"fn: must be callable, got {f!r}")
        if name in METHODS and not replace and METHODS[name].fn is not f:
            raise ValueError(f"name: method {name!r} is already registered (pass replace=True)")
        METHODS[name] = Method(name, f, params, description or (f.__doc__ or "").strip().split("\n")[0], per_item)
        return f

    return deco(fn) if fn is not None else deco


def unregister_method(name: str) -> None:
    METHODS.pop(name, None)


def get_method(name: str) -> Method:
    """The registered method ``name`` (importing the modules that register methods when needed)."""
    if name not in METHODS:
        raise ValueError(f"method: must be one of {available_methods()}, got {name!r}")
    return METHODS[name]


def available_methods() -> list[str]:
    return sorted(METHODS)


def check_param_name(p):
    if not isinstance(p, str) or not p.isidentifier():
        raise ValueError(f"params: parameter names must be identifiers, got {p!r}")
    if p in RESERVED_PARAMS:
        raise ValueError(f"params: {p!r} is reserved (set by the sweep: {RESERVED_PARAMS})")
