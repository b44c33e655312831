"""The contract every eviction policy keeps (kvpress style: a new policy joins with one line in POLICIES).

The checks themselves live in the library (``workbench.rerun.eviction.contract.check_policy``, ``wb.check_policy``),
so a user runs the same ones on their own class; here they run for every built-in policy, on a tiny
random-weight model with a real prefill and real evidence (and on the default model):
- ``needs()`` is honoured: every declared piece is read, and nothing undeclared;
- ``scores`` has shape ``[L, G, T]`` and is finite;
- protected positions (sinks, recent window) are always kept;
- exactly ``B`` sorted prompt positions are kept per layer and KV group at ``B < T``, as the session keeps;
- ``B ≥ T`` gives the full cache (same kept set and same tokens as :class:`FullCache`);
- deterministic under a seed.
"""
from __future__ import annotations

import pytest

from workbench.choices import POLICY_NAMES
from workbench.rerun.eviction import (
    ALL_POLICIES,
    H2O,
    POLICY_BY_NAME,
    POLICY_GROUPS,
    TOVA,
    AdaKV,
    CriticalKV,
    DeferKV,
    EntroBudget,
    Evidence,
    ExpectedAttention,
    FullCache,
    KeyDiff,
    KNorm,
    Needs,
    OracleKV,
    PageEntroKV,
    PyramidKV,
    RandomKV,
    SnapKV,
    StreamingLLM,
    check_policy,
    every_policy,
    preview,
)
from workbench.rerun.eviction.contract import CHECKS, WIDE_NEEDS, contract_session
from workbench.run import adapter

SMALL = dict(n_sink=2, recent=4)
POLICIES = [  # one line per policy
    FullCache(),
    StreamingLLM(**SMALL),
    H2O(**SMALL),
    SnapKV(**SMALL, window=8, kernel=3),
    DeferKV(**SMALL, window=8, kernel=3),
    PageEntroKV(**SMALL, page=4),
    RandomKV(**SMALL, seed=3),
    OracleKV(**SMALL),
    TOVA(**SMALL),
    KNorm(**SMALL),
    KeyDiff(**SMALL),
    CriticalKV(base=H2O(**SMALL, normalise="mean")),
    ExpectedAttention(**SMALL, n_future=16),
    PyramidKV(base=SnapKV(**SMALL, window=8, kernel=3), beta=4.0),
    AdaKV(base=SnapKV(**SMALL, window=8, kernel=3, pooling="avg")),
    EntroBudget(base=H2O(**SMALL), W_p=6),
]
N_NEW = 4


def test_every_policy_is_in_the_contract():
    assert {type(p) for p in POLICIES} == set(ALL_POLICIES), "a policy in ALL_POLICIES has no contract line"
    assert set(POLICY_NAMES) == set(POLICY_BY_NAME), "choices.PolicyName and the policies disagree"
    grouped = [n for g in POLICY_GROUPS.values() for n in g]
    assert sorted(grouped) == sorted(POLICY_BY_NAME), "every policy in exactly one group (notebook, panel)"
    assert [p.name for p in every_policy(n_sink=2, recent=4)] == grouped


@pytest.fixture(scope="module")
def session():
    """The contract's own tiny-model session (``contract_session``), capturing every kind of evidence."""
    return contract_session("tiny", Needs.of(POLICIES, WIDE_NEEDS), N_NEW)


def test_needs_of_every_policy():
    """``Needs.of``: the widest of every field over the policies (and the base), so one prefill serves all."""
    u = Needs.of(POLICIES)
    each = [p.needs() for p in POLICIES]
    for f in ("tail", "observers", "qstats"):
        assert getattr(u, f) == max(getattr(n, f) for n in each) > 0, f
    for f in ("colsum", "decode1", "answer", "keys", "wov"):
        assert getattr(u, f) == any(getattr(n, f) for n in each), f
    base = Needs(tail=999)
    assert Needs.of([], base) == base and Needs.of(POLICIES, base).tail == 999


@pytest.mark.parametrize("policy", POLICIES, ids=[p.name for p in POLICIES])
def test_policy_contract(policy, session):
    """The library's contract (``wb.check_policy``, one home) passes for every built-in policy."""
    df = check_policy(policy, session=session)
    assert list(df["check"]) == list(CHECKS)
    failed = df[~df["passed"]]
    assert failed.empty, "\n" + failed[["check", "reason"]].to_string()
    assert adapter.model_shape(session.model).L == session.evidence.L


@pytest.mark.model
def test_policy_contract_on_the_default_model(smollm):
    """The same checks on the default model and the bundled prompt, for SnapKV, DeferKV and a per-head budget
    (one shared session; every policy runs there in tests/test_eviction.py)."""
    pols = [p for p in POLICIES if p.name in ("snapkv", "deferkv", "adakv")]
    sess = contract_session(smollm, Needs.of(pols, WIDE_NEEDS), N_NEW)
    for p in pols:
        df = check_policy(p, session=sess)
        assert df["passed"].all(), f"{p.name}:\n" + df[~df["passed"]][["check", "reason"]].to_string()


def test_preview_refuses_bad_input(session):
    ev = session.evidence
    with pytest.raises(ValueError, match="policy"):
        preview("snapkv", ev, 10)
    with pytest.raises(ValueError, match="budget"):
        preview(SnapKV(**SMALL, window=8, kernel=3), ev, 0)
    with pytest.raises(ValueError, match="budget"):
        preview(SnapKV(**SMALL, window=8, kernel=3), ev, True)
    assert isinstance(ev, Evidence)
