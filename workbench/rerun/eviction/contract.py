"""The contract every eviction policy keeps, as a library function: :func:`check_policy`.

kvpress style: a new policy joins the bench once it passes these checks (``tests/test_policy_contract.py``
runs them on every built-in policy; a user runs ``wb.check_policy(MyPolicy)`` on their own class). Each
check is run on a real prefill with real evidence (a tiny random-weight model, and the default model):

- **declared needs used**: removing any evidence ``needs()`` declares makes scoring fail (it is read);
- **nothing undeclared read**: scoring from the declared evidence alone (undeclared fields absent, tail and
  decode rows cut to the declared counts) works and gives the same scores as from every piece of evidence;
- **scores shape**: ``scores(ev)`` has shape ``[L, G, T]``; **scores finite**: no NaN or ±inf (where cells attend
  one stored row, ``ev.ties``, the selection pools their scores by the mean: one kept set per tie);
- **protected mask**: ``protected(T)`` is bool ``[T]``; **protected kept**: at every ``B < T`` tried;
- **exactly B sorted**: ``B`` distinct sorted prompt positions per layer and KV group (a budget allocation:
  its counts, summing to ``L·G·B``), and the eviction session keeps exactly that and frees KV bytes;
- **B ≥ T full cache**: at ``B = T`` and ``B > T`` every position is kept, the tokens equal the full cache's
  and no byte is freed; a budget allocation gives every cell all ``T`` positions at ``B = T``;
- **deterministic**: the same scores and kept sets under different global RNG states (torch, numpy,
  random): a random policy seeds its own generator from a field.
"""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import torch

from workbench.checks import Interval
from workbench.constraints import register_all
from workbench.rerun.eviction.evidence import PROVIDES, Evidence, MissingEvidence, Needs
from workbench.rerun.eviction.outputs import checked_protected
from workbench.rerun.eviction.policies import FullCache, build_policy
from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.rerun.eviction.select import preview
from workbench.rerun.eviction.session import EvictionSession
from workbench.run import adapter, layer_roles
from workbench.run.examples import load_example
from workbench.run.models import load_model, tiny_model
from workbench.run.spans import PromptSpans

__all__ = ["check_policy", "contract_session", "CHECKS", "TINY_COMMON", "WIDE_NEEDS"]

CHECKS = ("constructs", "scores shape [L, G, T]", "scores finite", "declared needs used", "nothing undeclared read",
          "protected mask bool [T]", "protected kept", "exactly B sorted", "B >= T full cache", "deterministic")
"""The checks, in the order of the table's rows."""

TINY_COMMON = dict(n_sink=2, recent=4, window=8, kernel=3)
"""Parameters given to a policy class on the tiny model (those that are its fields), so that ``B < T`` leaves room."""

WIDE_NEEDS = Needs(tail=32, observers=8, colsum=True, decode1=True, answer=True, keys=True, wov=True, qstats=16)
"""Every kind of evidence: the session captures it, so that a read of an undeclared piece is caught."""

_EVIDENCE = tuple(sorted({f for fs in PROVIDES.values() for f in fs}))
N_NEW = 4


def contract_session(model="tiny", needs: Needs = WIDE_NEEDS, max_new_tokens: int = N_NEW) -> EvictionSession:
    """The session the checks run on: ``"tiny"`` (a 3-layer random-weight Llama, GQA 4:2, a 91-token synthetic
    prompt), ``"default"`` (the default model on the bundled example prompt) or a model (``LoadedModel``, with
    the bundled example prompt), capturing ``needs`` (every kind of evidence by default)."""
    if isinstance(model, str) and model == "tiny":
        m = tiny_model("llama", G=2, H_Q=4, L=3, seed=5)
        spans = PromptSpans.synthetic([24, 30, 21], query_len=8)
        return EvictionSession.prepare(m, spans, needs, max_new_tokens, reusable=True, progress=False)
    lm = load_model(progress=False) if isinstance(model, str) and model == "default" else model
    if isinstance(model, str) and model != "default":
        raise ValueError(f"models: each must be 'tiny', 'default' or a LoadedModel, got {model!r}")
    prompt = load_example().build(lm.tokenizer, max_context=lm.shape.max_context)
    return EvictionSession.prepare(lm, prompt, needs, max_new_tokens, reusable=True, progress=False)


def _declared(ev: Evidence, need: Needs) -> Evidence:
    """``ev`` with only what ``need`` declares: undeclared fields ``None``, rows cut to the declared counts."""
    keep = {f for n, fs in PROVIDES.items() if getattr(need, n) for f in fs}
    kw = {f: (ev.get(f) if f in keep else None) for f in _EVIDENCE}
    if kw["tail"] is not None:
        kw["tail"] = kw["tail"][:, :, -need.tail:]
    if kw["decode"] is not None and not need.answer:
        kw["decode"] = kw["decode"][:, :, :1]
    for f in ("rope_cos", "rope_sin"):  # [L, F, d]: the rotary maps of the next qstats positions
        if kw[f] is not None:
            kw[f] = kw[f][:, : need.qstats]
    return ev.replaced(**kw)


def _same(a, b) -> bool:
    """Equal tensors (NaN equal to NaN: a NaN is the finiteness check's to report, not determinism's)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all()) if a.is_floating_point() \
        else torch.equal(a, b)


def _fresh(ev: Evidence) -> Evidence:
    return ev.replaced()


def _reseeded(fn, seed: int):
    """``fn()`` with the global RNGs seeded to ``seed``, and their states restored afterwards."""
    t, n, r = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        return fn()
    finally:
        torch.set_rng_state(t)
        np.random.set_state(n)
        random.setstate(r)


def _rows_of(policy: EvictionPolicy, sess: EvictionSession, seed: int) -> list[tuple[str, bool, str]]:
    ev = sess.evidence
    T, L, G = ev.T, ev.L, ev.G
    need = policy.needs()
    out: list[tuple[str, bool, str]] = []

    def check(name, fn):
        try:
            ok, why = fn()
        except Exception as e:  # a check that crashes is a failed check, with the error as its reason
            ok, why = False, f"{type(e).__name__}: {e}"
        out.append((name, bool(ok), why))
        return ok

    s_box = {}

    def shape():
        s = _reseeded(lambda: policy.scores(_fresh(ev)), seed)
        s_box["s"] = torch.as_tensor(s)
        got = list(s_box["s"].shape)
        return got == [L, G, T], f"scores(ev) has shape {got}" + ("" if got == [L, G, T] else f", not [L, G, T] = {[L, G, T]}")

    def finite():
        s = s_box["s"].detach().to(torch.float64)
        bad = int((~torch.isfinite(s)).sum())
        nan = int(torch.isnan(s).sum())
        return bad == 0, ("every score finite" if bad == 0 else
                          f"{bad} of {s.numel()} scores are not finite ({nan} NaN, {bad - nan} ±inf)")

    def used():
        missing = []
        for n, fs in PROVIDES.items():
            if not getattr(need, n):
                continue
            bare = ev.replaced(**{f: None for f in fs})
            try:
                _reseeded(lambda: policy.scores(bare), seed)
                try:
                    policy.allocate(bare, max(n_prot, T // 2))
                except MissingEvidence:
                    raise
                except Exception:  # noqa: BLE001 - the allocation's own refusals are the budget rows' to report
                    pass
                missing.append(n)
            except MissingEvidence:
                pass
        if missing:
            return False, (f"needs() declares {missing} but scoring works without "
                           f"{[f for n in missing for f in PROVIDES[n]]}: declare only what it reads")
        return True, f"every declared piece is read ({need})"

    def undeclared():
        mine = _declared(ev, need)
        try:
            s1 = _reseeded(lambda: policy.scores(mine), seed)
        except MissingEvidence as e:
            extra = []
            for n, fs in PROVIDES.items():
                if getattr(need, n):
                    continue
                more = mine.replaced(**{f: ev.get(f) for f in fs})
                try:
                    _reseeded(lambda: policy.scores(more), seed)
                    extra.append(n)
                except MissingEvidence:
                    pass
            return False, (f"scoring from the declared evidence ({need}) fails ({e})"
                           + (f"; it reads {extra} without declaring them in needs()" if extra else ""))
        s0 = _reseeded(lambda: policy.scores(_fresh(ev)), seed)
        same = _same(s1, s0)
        return same, ("scores from the declared evidence alone equal the scores from all of it" if same else
                      "scores change when undeclared evidence is present (or more tail/decode rows than declared): "
                      "it reads evidence needs() does not declare")

    def prot():
        p = policy.protected(T)
        ok = isinstance(p, torch.Tensor) and p.dtype == torch.bool and tuple(p.shape) == (T,)
        return ok, (f"{int(p.sum())} of T = {T} positions protected" if ok else
                    f"protected(T) must be a bool tensor [T] = [{T}], got "
                    f"{getattr(p, 'dtype', type(p).__name__)} {list(getattr(p, 'shape', [len(p)] if isinstance(p, (list, tuple)) else []))}")

    try:
        prot_mask = checked_protected(policy, policy.protected(T), T)
        n_prot, no_budget = int(prot_mask.sum()), None
    except Exception as e:  # the protected row reports it; the budget rows cannot run without a mask
        prot_mask, n_prot, no_budget = None, 0, f"not checked: protected(T) failed ({type(e).__name__}: {e})"
    budgets = sorted({B for B in (n_prot + 3, T // 2, T - 1) if max(n_prot, 1) <= B < T})
    if no_budget is None and not budgets and not policy.keeps_all:
        no_budget = (f"not checked: protected(T) protects {n_prot} of T = {T} positions, so no budget B < T can be "
                     f"tried (a policy that evicts must leave positions to evict)")

    def kept_ok():
        if policy.keeps_all:
            return True, "keeps every position (keeps_all)"
        if no_budget:
            return False, no_budget
        pset = set(torch.nonzero(prot_mask).flatten().tolist())
        for B in budgets:
            kept = preview(policy, _fresh(ev), B)
            for l in range(kept.shape[0]):
                for g in range(kept.shape[1]):
                    row = {p for p in kept[l, g].tolist() if p >= 0}
                    lost = sorted(pset - row)
                    if lost:
                        return False, (f"B = {B}: layer {l}, KV group {g} dropped protected positions {lost[:8]}"
                                       f"{' …' if len(lost) > 8 else ''}")
        return True, f"every protected position kept at B = {budgets}"

    def exactly_b():
        if policy.keeps_all:
            return True, "keeps every position (keeps_all)"
        if no_budget:
            return False, no_budget
        for B in budgets:
            kept = preview(policy, _fresh(ev), B)
            alloc = policy.allocate(_fresh(ev), B)
            counts = torch.full((L, G), B) if alloc is None else torch.as_tensor(alloc)
            if int(counts.sum()) != L * G * B:
                return False, f"B = {B}: the allocation keeps {int(counts.sum())} positions in all, not L·G·B = {L * G * B}"
            if tuple(kept.shape) != (L, G, int(counts.max())) or not torch.equal((kept >= 0).sum(-1), counts):
                return False, f"B = {B}: kept {list(kept.shape)}, counts {(kept >= 0).sum(-1).tolist()}"
            if not bool((kept < T).all()):
                return False, f"B = {B}: a kept position is >= T = {T}"
            for row in kept.reshape(L * G, -1).tolist():
                row = [p for p in row if p >= 0]
                if row != sorted(set(row)):
                    return False, f"B = {B}: kept positions not sorted and distinct: {row[:12]}"
            r = sess.run(policy, B)
            if not torch.equal(r.kept_prompt, kept):
                return False, f"B = {B}: the eviction session kept other positions than preview() says"
            if int(counts.max()) < T and not r.kv_bytes_after < r.kv_bytes_before:
                return False, f"B = {B}: no KV byte freed ({r.kv_bytes_after} of {r.kv_bytes_before})"
            if int(counts.max()) >= T and not bool((kept < 0).any()):
                # a per-head allocation that gives one KV head every position keeps that layer's cache T long:
                # the other heads' evicted slots are masked (-1), not freed
                return False, f"B = {B}: a per-head allocation reaches T = {T} but masks no slot"
        return True, f"exactly B sorted positions per layer and KV group at B = {budgets}, as the session keeps"

    def full():
        alloc = policy.allocate(_fresh(ev), T)
        if alloc is not None and not bool((torch.as_tensor(alloc) == T).all()):
            return False, (f"allocate(ev, B = T = {T}) gives counts {torch.as_tensor(alloc).tolist()}: at B >= T every "
                           f"layer and KV group must hold all T positions (counts <= T summing to L·G·B)")
        ref = sess.run(FullCache(), T)
        for B in (T, T + 7):
            kept = preview(policy, _fresh(ev), B)
            if not torch.equal(kept, torch.arange(T).expand(L, G, T)):
                return False, f"B = {B} >= T = {T}: preview keeps {list(kept.shape)}, not every position"
            r = sess.run(policy, B)
            if r.ids != ref.ids:
                return False, f"B = {B} >= T: tokens {r.ids} differ from the full cache's {ref.ids}"
            if r.kv_bytes_after != r.kv_bytes_before:
                return False, f"B = {B} >= T: KV bytes {r.kv_bytes_after} != the full cache's {r.kv_bytes_before}"
        return True, f"B = T and T + 7 keep every position and generate the full cache's {len(ref.ids)} tokens"

    def deterministic():
        a = [_reseeded(lambda: torch.as_tensor(policy.scores(_fresh(ev))), s) for s in (seed, seed + 1, seed + 12345)]
        if not all(_same(a[0], x) for x in a[1:]):
            return False, ("scores change with the global RNG state: draw random numbers from a generator seeded "
                           "by a field of the policy (as RandomKV's seed)")
        if budgets and not policy.keeps_all and not bool(torch.isnan(a[0].double()).any()):
            k = [_reseeded(lambda: preview(policy, _fresh(ev), budgets[0]), s) for s in (seed, seed + 1)]
            if not torch.equal(k[0], k[1]):
                return False, f"kept positions at B = {budgets[0]} change with the global RNG state"
        return True, "same scores and kept sets under three global seeds"

    if not check("scores shape [L, G, T]", shape):
        out.append(("scores finite", False, "not checked: scores failed"))
    else:
        check("scores finite", finite)
    check("declared needs used", used)
    check("nothing undeclared read", undeclared)
    check("protected mask bool [T]", prot)
    check("protected kept", kept_ok)
    check("exactly B sorted", exactly_b)
    check("B >= T full cache", full)
    check("deterministic", deterministic)
    return out


CHECK_POLICY_CHECKS = register_all("check_policy", {
    # the determinism check seeds numpy with seed, seed + 1 and seed + 12345
    "seed": Interval("int", 0, 2**32 - 1 - 12345, note="numpy takes seed + 12345 too"),
}, __name__)


def check_policy(policy, models=("tiny", "default"), *, session: EvictionSession | None = None,
                 seed: int = 0) -> pd.DataFrame:
    """Run the policy contract (module docstring) on ``policy`` and return the table of checks.

    Args:
        policy: a policy class (built with its defaults; on the tiny model with :data:`TINY_COMMON` for the
            fields it has) or an instance (used as is).
        models: where to run: ``"tiny"`` (a random-weight model, a fraction of a second), ``"default"`` (the
            default model on the bundled prompt, a few seconds) or ``LoadedModel`` objects.
        session: run on this prepared :class:`EvictionSession` instead of ``models`` (it must capture what the
            policy needs; :func:`contract_session` captures every kind of evidence).
        seed: the first global seed of the determinism check, an integer in ``[0, 2**32 - 1 - 12345]`` (it and
            ``seed + 1``, ``seed + 12345`` seed torch, numpy and random).

    Returns:
        a DataFrame with one row per (model, check): ``policy, model, check, passed, reason``; ``df.passed.all()``
        is the verdict, and each failed row's ``reason`` names the breach. A breach is a failed row, never an
        exception; a check that cannot run (no budget ``B < T`` leaves a position to evict, a protected mask that
        is not one) is a failed row saying why, never a vacuous pass. Bad arguments raise a ``ValueError``.
    """
    CHECK_POLICY_CHECKS["seed"].check("seed", seed)
    if session is not None and not isinstance(session, EvictionSession):
        raise ValueError(f"session: must be None or an EvictionSession (contract_session(...)), got "
                         f"{type(session).__name__}")
    if isinstance(models, str):
        models = (models,)
    targets = [("session", session)] if session is not None else [
        (m if isinstance(m, str) else getattr(m, "model_id", type(m).__name__), m) for m in models]
    if not targets:
        raise ValueError("models: give at least one of 'tiny', 'default' or a LoadedModel")
    rows = []
    for label, m in targets:
        sess = session
        if isinstance(policy, type):
            try:
                pol = build_policy(policy, **(TINY_COMMON if label == "tiny" else {}))
                if not isinstance(pol, EvictionPolicy):
                    raise ValueError(f"{policy.__qualname__} is not an EvictionPolicy subclass")
                made = (True, f"{pol!r}")
            except Exception as e:
                pol, made = None, (False, f"{type(e).__name__}: {e}")
        else:
            pol = policy
            made = (isinstance(pol, EvictionPolicy), repr(pol) if isinstance(pol, EvictionPolicy) else
                    f"must be an EvictionPolicy instance or class, got {type(pol).__name__}")
            if not made[0]:
                pol = None
        name = getattr(pol, "name", getattr(policy, "__name__", repr(policy)))
        if pol is not None and pol.defer not in (0, 1):
            made = (False, f"defer = {pol.defer!r}: the session evicts after prefill (0) or after the first decode "
                           f"step (1) only")
        rows.append((name, label, "constructs", *made))
        if pol is None:
            rows += [(name, label, c, False, "not checked: the policy could not be built") for c in CHECKS[1:]]
            continue
        if sess is None:
            sess = contract_session(m, WIDE_NEEDS.merge(pol.needs()))
        elif pol.needs().merge(sess.needs) != sess.needs:
            raise ValueError(f"session: captured {sess.needs}, the policy needs {pol.needs()}")
        shape = adapter.model_shape(sess.model)  # the evidence has a row per evictable layer (a hybrid's softmax ones)
        assert (len(layer_roles.scored_layers(sess.model)), shape.G) == (sess.evidence.L, sess.evidence.G)
        rows += [(name, label, *r) for r in _rows_of(pol, sess, seed)]
    return pd.DataFrame(rows, columns=["policy", "model", "check", "passed", "reason"])
