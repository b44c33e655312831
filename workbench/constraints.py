"""The registry of parameter constraints (the constraint classes are in :mod:`workbench.checks`).

Each dataclass declares its fields' constraints next to them, as scikit-learn's ``_parameter_constraints``::

    @checked()
    @dataclass(frozen=True)
    class MyPolicy(EvictionPolicy):
        alpha: float = 0.5
        _parameter_constraints = {"alpha": Interval("real", 0, 1)}   # n_sink, recent: EvictionPolicy's

and its ``__post_init__`` checks them (``checks.check_fields``); a field with no declared constraint is refused
with a message saying how to declare it. A function checks its arguments with ``checks.check_args`` against a
mapping it declares beside it. :data:`PARAMS` maps each parameter's key to its one constraint object: the shared
ones below (parameters of several owners: ``zeta``, ``seed``, ``n_sink`` …, reused with :func:`shared`) and those
the owners register at definition (:func:`checked`, :func:`register_all`). The widget slider specs take their
range from it (``show.widgets.SliderSpec.constraint``), the notation its allowed ranges, and the bad-input tests
are generated from it (``tests/test_constraints.py``: every ``invalid()`` value is refused with the constraint's
message, every ``valid()`` value is accepted).

A name that means different things in different places is qualified by its owner (``deferkv.lam`` is DeferKV's
``λ ∈ [-50, 50]``, ``lam`` the priority weight ``λ ≥ 0``; ``report.seed`` the report's seed). The message format is
everywhere ``"<name>: must be <describe()>, got <value>"``.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from workbench.checks import (
    DEVICE,
    KERNEL,
    MAX_NEW_TOKENS,
    SEED,
    TARGET,
    TARGET_TOKENS,
    AnyOf,
    Bool,
    Choice,
    Const,
    Constraint,
    Interval,
    Seq,
    constraints_of,
    optional,
)
from workbench.choices import (
    AUDIT_MODES,
    H2O_NORMALISES,
    POLICY_NAMES,
    POOLINGS,
    PRIORITIES,
    QUERY_MODES,
)

__all__ = ["PARAMS", "shared", "register", "register_all", "checked", "BUDGET", "BUDGET_FRAC", "DEVICE", "POSITION", "pruned_layer",
           "answer_doc", "index_into", "count_upto", "zero_upto"]


def _real(lo=None, hi=None, closed="both", **kw) -> Interval:
    return Interval("real", lo, hi, closed=closed, **kw)


def _int(lo=None, hi=None, **kw) -> Interval:
    return Interval("int", lo, hi, **kw)


BUDGET = _int(1)
"""``B``, prompt positions kept per layer and KV group (``≥`` the protected count is checked where it is known)."""
BUDGET_FRAC = _real(0.0, 1.0, closed="right")
"""A budget as a fraction of the prompt length: ``B = ⌈budget_frac · T⌉`` (``rerun.eviction.resolve_budget``)."""
POSITION = _int(0, what="an integer position")
_COUNT0 = _int(0)
_COUNT1 = _int(1)
_UNIT = _real(0.0, 1.0)

_P: dict[str, Constraint] = {
    # ---- EntroPrefill (SPEC §2-§6): EntroPrefillParams, HeadPooling, ChunkPriorities, GreedySelection, the audit
    "zeta": _real(0.0, 1.0, closed="right"),
    "tau": _real(0.0, None, closed="right"),
    "rho_min": _real(0.0, 1.0, closed="neither"),
    "eps_s": _real(0.0, None, closed="right"),
    "lam": _real(0.0, None),
    "target": optional(TARGET),
    "target_tokens": optional(TARGET_TOKENS),
    "eps_row": _real(0.0, 1.0, closed="right"),
    "m0": _COUNT0,
    "monitored": optional(Seq(_int(1), nonempty=True, distinct=True, sort=True)),
    "audit_mode": Choice(AUDIT_MODES),
    "m_a": _COUNT1,
    "delta": _real(0.0, 1.0, closed="neither"),
    "eps_audit": _real(0.0, 1.0, closed="right"),
    "d_max": _UNIT,
    "streak": _COUNT0,
    "seed": SEED,
    "priority": Choice(PRIORITIES),
    "max_new_tokens": MAX_NEW_TOKENS,
    "layer": _COUNT0,
    # ---- eviction policies (SPEC §9) and budgets
    "n_sink": _COUNT0,
    "recent": _COUNT0,
    "window": _COUNT1,
    "kernel": KERNEL,
    "pooling": Choice(POOLINGS),
    "normalise": Choice(H2O_NORMALISES),
    "decode_weight": optional(_UNIT),
    "page": _COUNT1,
    "W_p": _COUNT1,
    "budget": BUDGET,
    "budget_frac": BUDGET_FRAC,
    # kvpress's compression ratio: the fraction of the prompt's KV cache removed (study.kv_budget.ratio_budget)
    "compression_ratio": _real(0.0, 1.0, closed="left"),
    # the matched-byte ladder: KV bytes kept as a fraction of the full prompt cache's (study.kv_budget.ladder_budget)
    "kv_frac": _real(0.0, 1.0, closed="right"),
    "query": Choice(QUERY_MODES),
    "policy": Choice(POLICY_NAMES),  # the built-in names (the eviction registry may add more)
    # ---- analyses shown by the panels
    "K": _COUNT1,
    "k": _COUNT1,
    "W": _COUNT1,
    "ref_start": _COUNT1,
    "run_layer": _COUNT1,
    # ---- RowSet (capture)
    "observers": Bool(),
    "audit": AnyOf(Const("query"), Const(None), Seq(POSITION, nonempty=False)),
    "tail": _COUNT0,
    "custom": Seq(POSITION, nonempty=False),
    "n_decode": _COUNT0,
    "device": DEVICE,
    # ---- entry points' shared arguments (build_prompt, run_pruned, run_capture, the panels)
    "max_context": optional(_int(1)),
    "chat": optional(Bool()),
    "keep_hidden": Bool(),
    "progress": Bool(),
    "seeds": AnyOf(SEED, Seq(SEED, nonempty=True)),
    # ---- PromptPanel (study): a RULER-style length (study.ruler.MIN_LENGTH and up), the document boxes
}

_OWNER: dict[str, str] = dict.fromkeys(_P, __name__)  # registered key -> the module or class that declared it

PARAMS: Mapping[str, Constraint] = MappingProxyType(_P)
"""Every parameter's constraint, by name (qualified by its owner where a name has several meanings): the shared
ones below, and those each owner declares (:func:`checked`, :func:`register_all`) once its module is imported."""


def pruned_layer(L: int) -> Constraint:
    """``run_pruned``'s fixed layer ``l* ∈ [-1, L-1]`` (or ``None``: adaptive) for a model of ``L`` layers."""
    return optional(_int(-1, L - 1, note=f"L = {L}; -1 = before layer 0"))


def index_into(n: int, note: str | None = None) -> Constraint:
    """An index into ``n`` things counted only at the call (a layer of ``L``, a head of ``H_Q``, a KV group of
    ``G``, a row, a page, a chunk, a prompt position): an integer in ``[0, n-1]``; ``note`` (bracketed after the
    range) says what ``n`` counts."""
    return _int(0, n - 1, note=note)


def count_upto(n: int, note: str | None = None) -> Constraint:
    """A count of at least one and at most ``n`` known only at the call (keys kept of ``T``, tail rows, questions
    drawn from those eligible): an integer in ``[1, n]``; ``note`` as in :func:`index_into`."""
    return _int(1, n, note=note)


def zero_upto(n: int, note: str | None = None) -> Constraint:
    """A count of none up to ``n`` known only at the call (successes of ``n`` trials, protected positions of a
    prompt of ``T``, chunks removed unconditionally of ``k``, a layer boundary of ``L`` layers, the final norm's
    input included): an integer in ``[0, n]``; ``note`` as in :func:`index_into`."""
    return _int(0, n, note=note)


def answer_doc(k: int) -> Constraint:
    """``build_prompt``'s answer document: ``None`` or an index into its ``k`` documents."""
    return optional(_int(0, k - 1))


def shared(*names: str) -> dict[str, Constraint]:
    """``{name: PARAMS[name]}``: the shared constraints of ``names``, for an owner's ``_parameter_constraints``
    (``{**shared("n_sink", "recent"), "lam": Interval("real", -50, 50)}``)."""
    return {n: _P[n] for n in names}


def register(key: str, c: Constraint, owner: str) -> None:
    """Add ``key -> c`` to :data:`PARAMS` for the sliders, the notation and the generated bad-input tests.

    One key means one constraint: a key already held by another constraint of another owner is refused (qualify
    it, ``deferkv.lam``); the same owner registering again (a module reloaded, a notebook cell run twice)
    replaces its entry."""
    if not isinstance(c, Constraint):
        raise TypeError(f"{key}: must be a Constraint (workbench.checks), got {c!r}")
    held = _P.get(key)
    if held is c:
        return
    if held is not None and _OWNER[key] != owner:
        raise ValueError(f"{key}: already the constraint {held!r} of {_OWNER[key]}; qualify the key "
                         f"(\"<owner>.{key}\") or reuse that constraint (constraints.shared({key!r}))")
    _P[key] = c
    _OWNER[key] = owner


def register_all(prefix: str, checks: Mapping[str, Constraint], owner: str) -> Mapping[str, Constraint]:
    """:func:`register` each ``name -> c`` of ``checks`` (a function's arguments or a class's fields): under
    ``name`` where ``c`` is the shared constraint of that name, else under ``prefix.name``. Returns ``checks``
    read-only."""
    for name, c in checks.items():
        register(name if _P.get(name) is c else f"{prefix}.{name}", c, owner)
    return MappingProxyType(dict(checks))


def checked(prefix: str | None = None):
    """Class decorator (over ``@dataclass``): ``cls.CHECKS`` = the constraint of every field, read from the
    ``_parameter_constraints`` that the class and its bases declare next to their fields
    (``checks.constraints_of``: an undeclared field is refused, saying how to declare it); each is registered
    in :data:`PARAMS` (:func:`register_all`; a constraint that is not the shared one of its name is registered
    as ``prefix.name``, ``prefix`` defaulting to the class name in lower case)."""

    def deco(cls):
        checks = constraints_of(cls)
        cls.CHECKS = register_all(prefix or cls.__name__.lower(), checks, f"{cls.__module__}.{cls.__qualname__}")
        return cls

    return deco
