"""One constraint object per parameter and the bad-input tests generated from them.

(a) Every public parameter of ``EntroPrefillParams``, the analysis dataclasses it builds, every eviction
policy, ``ReportConfig``, ``RowSet``, ``export()`` and the widget slider specs is checked by a constraint of
``workbench.constraints.PARAMS``; a parameter name means one constraint object wherever it is unqualified;
the sliders' ranges lie inside the constraint their parameter is checked with.

(b) For every parameter, every generated invalid value (``Constraint.invalid()``) is refused with exactly
the constraint's message, which names the parameter and its allowed range; every generated valid value
(``Constraint.valid()``) is accepted. No model is loaded for (a) and (b): they run in seconds.

(c) The same over every public entry point's scalar and choice arguments (``build_prompt``, ``sweep``,
``run_pruned``, ``run_full``, ``run_capture``, ``generate_with_policy``, ``EvictionSession.prepare``,
``run_policies``, ``run_question_agnostic``, ``load_model``): each invalid value is refused with the
constraint's message before any model work (the tiny random model, with the default tokenizer, raises on a
forward pass while the check runs).
"""
from __future__ import annotations

import dataclasses
import inspect
from collections import defaultdict
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

from workbench.analyse.audit import AuditConfig, hoeffding_b
from workbench.analyse.counterexample import ShallowCounterexample
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
          ShallowCounterexample, AuditConfig, *ALL_POLICIES]
ALIASES = {("PageSelection", "b"): "page",  # a field checked under another parameter's name (the page size b)
           ("AuditConfig", "mode"): "audit_mode"}
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
    assert SLIDERS["ce_eps"].constraint is ShallowCounterexample.CHECKS["eps"] is PARAMS["counterexample.eps"]
    assert SLIDERS["ce_gamma"].constraint is ShallowCounterexample.CHECKS["gamma"]
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


# ----------------------------------------------------------------------------- (c) every public entry point
# Each scalar or choice argument of the model-bound entry points, generated from its constraint: every invalid
# value is refused with the constraint's own message before any model work (the tiny random model's forward
# pass raises while ``_ARMED`` is set); every valid value of the pure ones is accepted.
_D = ("Paris is the capital of France.", "Berlin is in Germany.", "Rome is in Italy.")
_Q = "What is the capital of France?"
_ARMED = {"on": False}


class _NoForward(AssertionError):
    pass


@pytest.fixture(scope="module")
def tiny(smollm):
    from workbench.run.models import LoadedModel, tiny_model

    model = tiny_model("llama", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16, seed=0)

    def no_forward(module, args):
        if _ARMED["on"]:
            raise _NoForward("a forward pass ran before the argument check")

    model.register_forward_pre_hook(no_forward)
    lm = LoadedModel(model=model, tokenizer=smollm.tokenizer, model_id="tiny-llama-test", device=torch.device("cpu"),
                     dtype=torch.float32)
    from workbench.run.prompt import build_prompt
    from workbench.study.tasks import TaskItem

    item = TaskItem(task="t", item_id="a#1", documents=_D, query=_Q, answers=("Paris",), answer_doc=0)
    return lm, build_prompt(smollm.tokenizer, list(_D), _Q), item


def _model_entry_points():
    from workbench.capture import run_capture
    from workbench.constraints import answer_doc, pruned_layer
    from workbench.rerun.eviction import EvictionSession, generate_with_policy, run_policies, run_question_agnostic
    from workbench.rerun.prune import run_full, run_pruned
    from workbench.run.models import load_model
    from workbench.run.prompt import build_prompt
    from workbench.study.sweep import SWEEP_CHECKS, sweep

    mnt = PARAMS["max_new_tokens"]

    def bp(**kw):
        return lambda t, v: build_prompt(t[0].tokenizer, list(_D), _Q, **{**kw, next(iter(kw)): v})

    def sw(name):
        return lambda t, v: sweep(t[0], [t[2]], ["full"], out=None, progress=False, **{name: v})

    snap = SnapKV(window=4)
    eps = [  # (id, parameter, constraint, call(tiny, value), whether its valid values are run)
        ("build_prompt.n_sink", "n_sink", PARAMS["n_sink"], bp(n_sink=0), True),
        ("build_prompt.W_p", "W_p", PARAMS["W_p"], bp(W_p=1), True),
        ("build_prompt.max_context", "max_context", PARAMS["max_context"], bp(max_context=None), True),
        ("build_prompt.chat", "chat", PARAMS["chat"], bp(chat=None), True),
        ("build_prompt.answer_doc", "answer_doc", answer_doc(len(_D)), bp(answer_doc=None), True),
        *[(f"sweep.{n}", n, c, sw(n), False) for n, c in SWEEP_CHECKS.items()],
        ("sweep.seeds", "seeds", PARAMS["seeds"], sw("seeds"), False),
        ("run_pruned.max_new_tokens", "max_new_tokens", mnt, lambda t, v: run_pruned(t[0], t[1], max_new_tokens=v,
                                                                                       progress=False), False),
        ("run_pruned.layer", "layer", pruned_layer(2), lambda t, v: run_pruned(t[0], t[1], layer=v, removed=[0],
                                                                                  max_new_tokens=1, progress=False), False),
        ("run_pruned.keep_hidden", "keep_hidden", PARAMS["keep_hidden"],
         lambda t, v: run_pruned(t[0], t[1], keep_hidden=v, max_new_tokens=1, progress=False), False),
        ("run_full.max_new_tokens", "max_new_tokens", mnt, lambda t, v: run_full(t[0], t[1], max_new_tokens=v), False),
        ("run_full.keep_hidden", "keep_hidden", PARAMS["keep_hidden"],
         lambda t, v: run_full(t[0], t[1], keep_hidden=v, max_new_tokens=1), False),
        ("run_capture.dtype", "dtype", PARAMS["capture.dtype"], lambda t, v: run_capture(t[0], t[1], dtype=v,
                                                                                        progress=False), False),
        ("run_capture.max_bytes", "max_bytes", PARAMS["capture.max_bytes"],
         lambda t, v: run_capture(t[0], t[1], max_bytes=v, progress=False), False),
        ("run_capture.progress", "progress", PARAMS["progress"], lambda t, v: run_capture(t[0], t[1], progress=v), False),
        ("generate_with_policy.max_new_tokens", "max_new_tokens", mnt,
         lambda t, v: generate_with_policy(t[0], t[1], snap, 8, v, progress=False), False),
        ("generate_with_policy.budget", "budget", BUDGET,
         lambda t, v: generate_with_policy(t[0], t[1], snap, v, 1, progress=False), False),
        ("EvictionSession.prepare.max_new_tokens", "max_new_tokens", mnt,
         lambda t, v: EvictionSession.prepare(t[0], t[1], snap.needs(), v, progress=False), False),
        ("run_policies.max_new_tokens", "max_new_tokens", mnt,
         lambda t, v: run_policies(t[0], t[1], [snap], [8], v, progress=False), False),
        ("run_policies.budgets", "budgets", BUDGET, lambda t, v: run_policies(t[0], t[1], [snap], [v], 1,
                                                                                progress=False), False),
        ("run_question_agnostic.max_new_tokens", "max_new_tokens", mnt,
         lambda t, v: run_question_agnostic(t[0], [t[1]], [snap], [8], v, progress=False), False),
        ("run_question_agnostic.budgets", "budgets", BUDGET,
         lambda t, v: run_question_agnostic(t[0], [t[1]], [snap], [v], 1, progress=False), False),
        ("load_model.device", "device", PARAMS["device"], lambda t, v: load_model(device=v, progress=False), False),
        ("load_model.dtype", "dtype", PARAMS["load.dtype"], lambda t, v: load_model(device="cpu", dtype=v,
                                                                                   progress=False), False),
        ("load_model.attn_implementation", "attn_implementation", PARAMS["load.attn_implementation"],
         lambda t, v: load_model(attn_implementation=v, progress=False), False),
    ]
    return eps


MODEL_ENTRY_POINTS = _model_entry_points()
# W_p=None is the default (min(8, query tokens)), not a value of W_p's constraint; None budgets mean nothing here
MODEL_CASES = [(eid, name, c, call, v) for eid, name, c, call, _ in MODEL_ENTRY_POINTS for v in c.invalid()
               if not (v is None and eid == "build_prompt.W_p")]


@pytest.mark.parametrize("case", MODEL_CASES, ids=[f"{e[0]}={e[4]!r:.24}" for e in MODEL_CASES])
def test_generated_invalid_argument_of_a_model_entry_point_is_refused_before_model_work(case, tiny):
    _, name, c, call, value = case
    _ARMED["on"] = True
    try:
        _assert_refused(lambda: call(tiny, value), name, c, value)
    finally:
        _ARMED["on"] = False


# bounds known only after rendering (n_sink <= T, W_p <= query tokens, T <= max_context) are tested elsewhere
_FITS = {"n_sink": lambda v: v <= 4, "W_p": lambda v: v <= 4, "max_context": lambda v: v is None or v >= 4096}
VALID_MODEL_CASES = [(eid, name, c, call, v) for eid, name, c, call, run in MODEL_ENTRY_POINTS if run
                     for v in [*c.valid(), *([8192] if name == "max_context" else [])]
                     if _FITS.get(name, lambda v: True)(v)]


@pytest.mark.parametrize("case", VALID_MODEL_CASES, ids=[f"{e[0]}={e[4]!r:.24}" for e in VALID_MODEL_CASES])
def test_generated_valid_argument_of_a_pure_entry_point_is_accepted(case, tiny):
    _, name, c, call, value = case
    call(tiny, value)


def test_every_entry_point_argument_is_generated():
    """The entry points the bad-input table names and the count of generated cases (one test each)."""
    from workbench.run.models import resolve_dtype
    from workbench.study.grid import check_seeds

    names = {eid for eid, *_ in MODEL_ENTRY_POINTS}
    for want in ("build_prompt.n_sink", "build_prompt.W_p", "build_prompt.max_context", "build_prompt.chat",
                 "build_prompt.answer_doc", "sweep.max_new_tokens", "sweep.executor", "sweep.on_error",
                 "sweep.checkpoint_s", "sweep.on_busy", "sweep.seeds", "run_pruned.max_new_tokens", "run_pruned.layer",
                 "run_full.max_new_tokens", "run_capture.dtype", "run_capture.max_bytes",
                 "generate_with_policy.max_new_tokens", "generate_with_policy.budget",
                 "EvictionSession.prepare.max_new_tokens", "run_policies.max_new_tokens", "run_policies.budgets",
                 "run_question_agnostic.max_new_tokens", "run_question_agnostic.budgets", "load_model.device",
                 "load_model.dtype", "load_model.attn_implementation"):
        assert want in names, want
    assert len(MODEL_CASES) >= 200, len(MODEL_CASES)
    for v in PARAMS["load.dtype"].valid():  # the dtype names load_model resolves
        assert isinstance(resolve_dtype(v, torch.device("cpu")), torch.dtype)
    assert resolve_dtype(torch.float16, torch.device("cpu")) is torch.float16
    for v in PARAMS["seeds"].valid():
        assert check_seeds(v) == list(dict.fromkeys([v] if isinstance(v, int) else v))
    assert check_seeds(iter([3, 3, 1])) == [3, 1]  # an iterator is read once
