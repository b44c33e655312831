"""The contract every eviction policy keeps (kvpress style: a new policy joins with one line in POLICIES).

For each policy, on a tiny random-weight model with a real prefill and real evidence:
- ``needs()`` is honoured: scoring with the evidence it asked for works, and without it fails clearly;
- ``scores`` has shape ``[L, G, T]`` and no NaN;
- protected positions (sinks, recent window) are always kept;
- exactly ``B`` sorted prompt positions are kept per layer and KV group at ``B < T``;
- ``B ≥ T`` gives the full cache (same kept set and same tokens as :class:`FullCache`).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

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
    EvictionSession,
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
    every_policy,
    preview,
)
from workbench.run import adapter
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

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
    model = tiny_model("llama", G=2, H_Q=4, L=3, seed=5)
    spans = PromptSpans.synthetic([10, 12, 9], query_len=8)  # T = 51
    return EvictionSession.prepare(model, spans, Needs.of(POLICIES), N_NEW, reusable=True, progress=False)


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
    ev = session.evidence
    T, L, G = ev.T, ev.L, ev.G
    shape = adapter.model_shape(session.model)
    assert (L, G) == (shape.L, shape.G)
    # needs() is honoured: the evidence it declared is enough, and each declared piece is necessary
    s = policy.scores(ev)
    assert s.shape == (L, G, T) and not torch.isnan(torch.as_tensor(s, dtype=torch.float64)).any()
    need = policy.needs()
    for name, field in (("tail", "tail"), ("observers", "observers"), ("colsum", "colsum"),
                        ("decode1", "decode"), ("answer", "decode"), ("keys", "keys"), ("wov", "wov"),
                        ("qstats", "q_sum")):
        if getattr(need, name):
            bare = dataclasses.replace(ev, **{field: None}, _scores={})
            with pytest.raises(ValueError, match="needs|rows"):
                preview(policy, bare, T // 2)  # scores and, for a budget allocation, allocate
    prot = policy.protected(T)
    assert prot.shape == (T,) and prot.dtype == torch.bool
    full = session.run(FullCache(), T)
    for B in (int(prot.sum()) + 3, T // 2, T - 1):
        if policy.keeps_all:
            break
        kept = preview(policy, ev, B)
        alloc = policy.allocate(ev, B)  # a budget allocation: B_{l,g} per cell, L·G·B in all
        counts = torch.full((L, G), B) if alloc is None else alloc
        assert int(counts.sum()) == L * G * B and kept.shape == (L, G, int(counts.max()))
        assert torch.equal((kept >= 0).sum(-1), counts) and bool((kept < T).all())
        for row in kept.reshape(L * G, -1).tolist():
            row = [p for p in row if p >= 0]
            assert row == sorted(set(row)), "kept positions are sorted and distinct"
            assert set(torch.nonzero(prot).flatten().tolist()) <= set(row), "a protected position was evicted"
        r = session.run(policy, B)
        assert torch.equal(r.kept_prompt, kept), "the session keeps what preview() says"
        assert r.kv_bytes_after < r.kv_bytes_before
    # B >= T: the full cache, exactly
    for B in (T, T + 7):
        kept = preview(policy, ev, B)
        assert torch.equal(kept, torch.arange(T).expand(L, G, T))
        r = session.run(policy, B)
        assert r.ids == full.ids
        assert r.kv_bytes_after == r.kv_bytes_before


def test_preview_refuses_bad_input(session):
    ev = session.evidence
    with pytest.raises(ValueError, match="policy"):
        preview("snapkv", ev, 10)
    with pytest.raises(ValueError, match="budget"):
        preview(SnapKV(**SMALL, window=8, kernel=3), ev, 0)
    with pytest.raises(ValueError, match="budget"):
        preview(SnapKV(**SMALL, window=8, kernel=3), ev, True)
    assert isinstance(ev, Evidence)
