"""One constraint object per parameter (issue 23) and the bad-input tests generated from them (issue 28).

(a) Every public parameter of ``EntroPrefillParams``, the analysis dataclasses it builds, every eviction
policy, ``ReportConfig``, ``RowSet``, ``export()`` and the widget slider specs is checked by a constraint of
``workbench.constraints.PARAMS``; a parameter name means one constraint object wherever it is unqualified;
the sliders' ranges lie inside the constraint their parameter is checked with.

(b) For every parameter, every generated invalid value (``Constraint.invalid()``) is refused with exactly
the constraint's message, which names the parameter and its allowed range; every generated valid value
(``Constraint.valid()``) is accepted. No model is loaded: the whole file runs in seconds.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections import defaultdict
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

from workbench.analyse.audit import hoeffding_b
from workbench.analyse.pages import PageSelection
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.pooling import HeadPooling
from workbench.analyse.priorities import ChunkPriorities
from workbench.analyse.selection import GreedySelection
from workbench.capture import RowSet
from workbench.checks import (
    AnyOf,
    Bool,
    Choice,
    Const,
    Constraint,
    InstanceOf,
    Interval,
    Seq,
    check_target,
    check_target_tokens,
)
from workbench.constraints import BUDGET, BUDGET_FRAC, PARAMS
from workbench.rerun.eviction import (
    ALL_POLICIES,
    AdaKV,
    CriticalKV,
    DeferKV,
    EntroBudget,
    FullCache,
    PageEntroKV,
    SnapKV,
    protected_mask,
    resolve_budget,
    select_keep,
)
from workbench.show import export as ex
from workbench.show.widgets import SLIDERS
from workbench.study.report import ReportConfig

OWNERS = [EntroPrefillParams, HeadPooling, ChunkPriorities, GreedySelection, PageSelection, RowSet, ReportConfig,
          *ALL_POLICIES]
ALIASES = {("PageSelection", "b"): "page"}  # a field checked under another parameter's name (the page size b)
EP_SLIDERS = ("zeta", "tau", "eps_s", "lam", "target", "eps_row", "m0", "delta", "m_a", "eps_audit", "d_max",
              "streak", "seed")


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]


def _keys(c: Constraint) -> list[str]:
    return [k for k, v in PARAMS.items() if v is c]


def _words(c: Constraint) -> list[str]:
    """The pieces of the allowed range a message must name."""
    if isinstance(c, Interval):
        return [w for w in (c.range_text(), c.what) if w]
    if isinstance(c, (Choice, Bool, Const, InstanceOf)):
        return [c.describe()]
    if isinstance(c, Seq):
        return ["sequence", *_words(c.item)]
    if isinstance(c, AnyOf):
        return [w for p in c.parts for w in _words(p)]
    raise AssertionError(f"no range words for {c!r}")


def _assert_refused(call, name: str, c: Constraint, value) -> None:
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert msg == c.message(name, value)  # the constraint's own message, not another copy of the check
    assert msg.startswith(f"{name}: must be ")
    for w in _words(c):
        assert w in msg, (w, msg)


# ----------------------------------------------------------------------------- (a) one constraint per parameter
@pytest.mark.parametrize("cls", OWNERS, ids=lambda c: c.__name__)
def test_every_public_field_is_checked_by_its_registered_constraint(cls):
    assert set(cls.CHECKS) == set(_fields(cls)), f"{cls.__name__}: fields without a constraint"
    for name, c in cls.CHECKS.items():
        keys = _keys(c)
        assert keys, f"{cls.__name__}.{name}: its constraint is not one of PARAMS"
        want = ALIASES.get((cls.__name__, name), name)
        assert any(k == want or k.endswith("." + want) for k in keys), (cls.__name__, name, keys)
    defaults = cls()  # every default value lies inside its constraint
    for name, c in cls.CHECKS.items():
        assert c.accepts(getattr(defaults, name)), (cls.__name__, name)


def test_a_name_means_one_constraint_unless_qualified():
    by_name = defaultdict(dict)
    for cls in OWNERS:
        for name, c in cls.CHECKS.items():
            by_name[name][id(c)] = (cls.__name__, _keys(c))
    for name, objs in by_name.items():
        if len(objs) > 1:  # several constraints for one name: all but the unqualified one carry an owner prefix
            plain = [owner for owner, keys in objs.values() if name in keys]
            assert len(plain) <= 1, (name, objs)
    assert EntroBudget.CHECKS["zeta"] is HeadPooling.CHECKS["zeta"] is EntroPrefillParams.CHECKS["zeta"]
    assert PageEntroKV.CHECKS["tau"] is EntroPrefillParams.CHECKS["tau"]
    assert GreedySelection.CHECKS["target"] is EntroPrefillParams.CHECKS["target"]
    assert ChunkPriorities.CHECKS["lam"] is EntroPrefillParams.CHECKS["lam"] is not DeferKV.CHECKS["lam"]


def test_export_arguments_are_checked_by_their_constraints():
    sig = inspect.signature(ex.export)
    assert list(ex.EXPORT_CHECKS) == list(sig.parameters)
    for name, p in sig.parameters.items():
        c = ex.EXPORT_CHECKS[name]
        assert c is PARAMS[f"export.{name}"]
        if p.default is not inspect.Parameter.empty:
            assert c.accepts(p.default), name


def test_slider_specs_take_their_range_from_the_constraint():
    for key, spec in SLIDERS.items():
        c = spec.constraint
        assert c is PARAMS[spec.param], key
        conv = int if spec.kind == "int" else float
        assert c.accepts(conv(spec.lo)) and c.accepts(conv(spec.hi)), key
        iv = c if isinstance(c, Interval) else next(p for p in c.parts if isinstance(p, Interval))
        for end, bound in (("lo", iv.lo), ("hi", iv.hi)):
            if bound is None:
                continue
            outside = bound - 1 if end == "lo" else bound + 1
            with pytest.raises(ValueError, match=f"^{end}: the slider of {spec.param} must stay"):
                spec.make(**{end: outside})
            open_end = iv.lo_open if end == "lo" else iv.hi_open
            if iv.kind == "real" and not open_end:  # a closed end is the slider's end
                assert getattr(spec, end) == bound or (key, end) in {("lam", "hi"), ("eps_row", "lo"), ("delta", "lo"),
                                                                      ("delta", "hi"), ("defer_lam", "lo"),
                                                                      ("defer_lam", "hi")}
    for name in EP_SLIDERS:  # the panel's EntroPrefill sliders and EntroPrefillParams: one object each
        assert SLIDERS[name].constraint is EntroPrefillParams.CHECKS[name], name
    assert SLIDERS["defer_lam"].constraint is DeferKV.CHECKS["lam"]
    assert SLIDERS["page"].constraint is PageEntroKV.CHECKS["page"] is PageSelection.CHECKS["b"]
    assert SLIDERS["K"].constraint is PageSelection.CHECKS["K"]
    assert SLIDERS["budget"].constraint is BUDGET
    with pytest.raises(ValueError, match="^lo: the slider of zeta"):
        dataclasses.replace(SLIDERS["zeta"], lo=0.0)  # ζ = 0 is outside (0, 1]


def test_the_budget_becomes_b_in_one_place():
    assert resolve_budget(100, budget_frac=0.25) == 25 and resolve_budget(7, budget_frac=0.5) == 4
    assert resolve_budget(100, budget=3) == 3 and resolve_budget(3, budget_frac=1e-9) == 1
    with pytest.raises(ValueError, match=r"^budget: give exactly one of budget \(an integer >= 1\) and budget_frac "
                                         r"\(in \(0, 1\]\)"):
        resolve_budget(10, 3, 0.5)
    src = {p: p.read_text() for p in Path(__file__).resolve().parent.parent.joinpath("workbench").rglob("*.py")}
    ceil_of_frac = [str(p) for p, s in src.items() if "math.ceil(f * " in s or "ceil(float(budget_frac)" in s]
    assert not ceil_of_frac, ceil_of_frac


def test_a_full_cache_is_not_a_base():
    for cls in (AdaKV, CriticalKV, EntroBudget):
        with pytest.raises(ValueError, match=r"^base: must be an evicting EvictionPolicy"):
            cls(base=FullCache())
        cls(base=SnapKV(window=4))


# ----------------------------------------------------------------------------- (b) generated bad inputs
INVALID = [(cls, name, i, v) for cls in OWNERS for name, c in cls.CHECKS.items() for i, v in enumerate(c.invalid())]
VALID = [(cls, name, i, v) for cls in OWNERS for name, c in cls.CHECKS.items() for i, v in enumerate(c.valid())]


def _id(case) -> str:
    cls, name, i, v = case
    return f"{cls.__name__}.{name}[{i}]={v!r:.24}"


@pytest.mark.parametrize("case", INVALID, ids=[_id(c) for c in INVALID])
def test_generated_invalid_field_is_refused_naming_it_and_its_range(case):
    cls, name, _, value = case
    _assert_refused(lambda: cls(**{name: value}), name, cls.CHECKS[name], value)


@pytest.mark.parametrize("case", VALID, ids=[_id(c) for c in VALID])
def test_generated_valid_field_is_accepted(case):
    cls, name, _, value = case
    obj = cls(**{name: value})
    assert cls.CHECKS[name].accepts(getattr(obj, name))


def test_every_parameter_has_generated_cases():
    for cls in OWNERS:
        for name, c in cls.CHECKS.items():
            assert c.invalid() or c is PARAMS["export.prompt"], (cls.__name__, name)
            assert c.valid() or isinstance(c, InstanceOf), (cls.__name__, name)
    assert len(INVALID) >= 800 and len(VALID) >= 300


def _scatter() -> go.Figure:
    return go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))


EXPORT_INVALID = [(name, i, v) for name, c in ex.EXPORT_CHECKS.items() for i, v in enumerate(c.invalid())]


@pytest.mark.parametrize("case", EXPORT_INVALID, ids=[f"{n}[{i}]={v!r:.24}" for n, i, v in EXPORT_INVALID])
def test_generated_invalid_export_argument_is_refused_and_nothing_is_written(case, tmp_path):
    name, _, value = case
    args = {"fig": _scatter(), "path": tmp_path / "sub" / "fig", name: value}
    _assert_refused(lambda: ex.export(**args), name, ex.EXPORT_CHECKS[name], value)
    assert not (tmp_path / "sub").exists()


# entry points that take the same parameters: (id, parameter, call with the value)
_PROT = protected_mask(20, 0, 0)  # nothing protected: every B >= 1 is a valid budget
ENTRY_POINTS = [
    ("resolve_budget.budget", "budget", BUDGET, lambda v: resolve_budget(50, budget=v)),
    ("resolve_budget.budget_frac", "budget_frac", BUDGET_FRAC, lambda v: resolve_budget(50, budget_frac=v)),
    ("select_keep.budget", "budget", BUDGET, lambda v: select_keep(torch.rand(1, 1, 20), v, _PROT)),
    ("hoeffding_b.m_a", "m_a", PARAMS["m_a"], lambda v: hoeffding_b(v, 0.05, 1, 1)),
    ("hoeffding_b.delta", "delta", PARAMS["delta"], lambda v: hoeffding_b(8, v, 1, 1)),
    ("check_target", "target", PARAMS["target"].parts[1], check_target),
    ("check_target_tokens", "target_tokens", PARAMS["target_tokens"].parts[1], check_target_tokens),
]
ENTRY_CASES = [(eid, name, c, call, v) for eid, name, c, call in ENTRY_POINTS for v in c.invalid()
               if not (v is None and eid.startswith("resolve_budget"))]  # None: the other one of the pair is meant


@pytest.mark.parametrize("case", ENTRY_CASES, ids=[f"{e[0]}={e[4]!r:.24}" for e in ENTRY_CASES])
def test_generated_invalid_argument_of_an_entry_point_is_refused(case):
    _, name, c, call, value = case
    _assert_refused(lambda: call(value), name, c, value)


@pytest.mark.parametrize("eid, name, c, call", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_generated_valid_argument_of_an_entry_point_is_accepted(eid, name, c, call):
    for v in c.valid():
        call(v)


# ----------------------------------------------------------------------------- the constraint classes themselves
def test_constraints_describe_their_range_in_one_format():
    assert PARAMS["zeta"].message("zeta", 0) == "zeta: must be in (0, 1], got 0"
    assert PARAMS["m_a"].message("m_a", 0) == "m_a: must be an integer >= 1, got 0"
    assert PARAMS["zeta"].message("zeta", "x") == "zeta: must be a finite real number in (0, 1], got 'x'"
    assert PARAMS["target"].message("target", 1) == ("target: must be None or a fraction of N, a float in (0, 1], "
                                                     "got the int 1; for a number of tokens use target_tokens=1")
    assert PARAMS["report.threads"].describe() == "'auto', None or an integer in [1, 1024]"
    assert PARAMS["kernel"].describe() == "an odd integer >= 1 (1 = no pooling)"
    assert Interval("real", 0, 1, closed="neither").describe() == "in (0, 1)"
    assert Seq(Interval("int", 1), distinct=True).check("x", [3, 1]) == (3, 1)
    assert Seq(Interval("int", 1), sort=True).check("x", [3, 1]) == (1, 3)
    for c in PARAMS.values():  # generated values are on the right side of the constraint
        assert not any(c.accepts(v) for v in c.invalid()), c
        assert all(c.accepts(v) for v in c.valid()), c


def test_every_constraint_key_named_elsewhere_exists():
    """Modules that look a constraint up by key (the notation table's ``param``) name keys of PARAMS."""
    import re

    src = Path(__file__).resolve().parent.parent.joinpath("workbench", "show", "notation.py").read_text()
    missing = sorted(k for k in set(re.findall(r'param="([^"]+)"', src)) if k not in PARAMS)
    assert not missing, missing
