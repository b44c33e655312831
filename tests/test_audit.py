"""Tests of workbench.analyse.audit (SPEC §6): audit bounds, candidate stability, the layer-selection trace."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from _examples import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.analyse.audit import NO_LAYER_CAN_PASS, AuditConfig, audit_bounds, hoeffding_b
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.procedure import candidate_drift, trace
from workbench.analyse.selection import VERDICT_INFEASIBLE, mass_table
from workbench.capture.data import Capture
from workbench.constraints import PARAMS
from workbench.run.spans import PromptSpans

PROPS = settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- stability
_SETS = st.sets(st.integers(0, 15), max_size=10)


@PROPS
@given(_SETS, _SETS)
def test_stability_range_symmetry_identity(a, b):
    d = candidate_drift(a, b)
    assert 0.0 <= d <= 1.0
    assert d == candidate_drift(b, a)
    assert (d == 0.0) == (a == b)
    if a and b and not (a & b):
        assert d == 1.0  # disjoint non-empty sets are maximally unstable


def test_stability_hand_values():
    assert candidate_drift({1, 2}, {2, 3}) == pytest.approx(2 / 3)
    assert candidate_drift([], []) == 0.0
    assert candidate_drift({4}, set()) == 1.0
    assert candidate_drift([0, 1, 2, 3], [0, 1, 2]) == pytest.approx(1 / 4)


# ----------------------------------------------------------------------------- audit bounds
def test_hoeffding_b_by_hand():
    # ln(3 * 4 / 0.05) = ln 240 = 5.480639, / (2 * 50) -> sqrt(0.0548064) = 0.234108
    assert hoeffding_b(50, 0.05, 3, 4) == pytest.approx(0.234108, abs=1e-6)
    assert hoeffding_b(1, 0.5, 1, 1) == pytest.approx(math.sqrt(math.log(2) / 2))


@settings(max_examples=examples(500), deadline=None)
@given(st.integers(1, 10_000), st.floats(1e-6, 0.999), st.integers(1, 40), st.integers(1, 64))
def test_hoeffding_b_gives_the_stated_failure_probability(m_a, delta, J, H):
    # P(eta > eta_hat + b) <= exp(-2 m_a b^2) = delta / (J H)   (paper, after (17))
    b = hoeffding_b(m_a, delta, J, H)
    assert b > 0
    assert math.exp(-2 * m_a * b * b) == pytest.approx(delta / (J * H), rel=1e-9)
    # more samples shrink b; more heads or layers or a smaller delta enlarge it
    assert hoeffding_b(m_a + 1, delta, J, H) < b
    assert hoeffding_b(m_a, delta, J + 1, H) > b
    assert hoeffding_b(m_a, delta / 2, J, H) > b


def _population(H=3, M=11, T=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(H, M, T, generator=g, dtype=torch.float64) * 2, -1)


def test_exact_audit_is_population_mean_with_b_zero():
    A = _population()
    removed = torch.zeros(20, dtype=torch.bool)
    removed[[2, 3, 7, 11]] = True
    res = audit_bounds(A, removed, AuditConfig("exact", m_a=5, delta=0.05, J=3, seed=0, eps_audit=0.5))
    assert res.b == 0.0 and res.sample is None
    for h in range(3):
        eta = sum(sum(float(A[h, u, j]) for j in (2, 3, 7, 11)) for u in range(11)) / 11
        assert res.eta[h].item() == pytest.approx(eta, abs=1e-12)
        assert res.bound[h].item() == pytest.approx(min(1.0, eta), abs=1e-12)
        assert bool(res.passed_head[h]) == (eta <= 0.5)
    assert res.passed == all(bool(x) for x in res.passed_head)
    df = res.to_frame()
    assert list(df.columns) == ["head", "eta", "b", "bound", "passed"] and len(df) == 3


def test_sampled_audit_mean_of_sample_plus_b():
    A = _population(M=7)
    removed = torch.zeros(20, dtype=torch.bool)
    removed[5:12] = True
    res = audit_bounds(A, removed, AuditConfig("sampled", m_a=25, delta=0.1, J=2, seed=3))
    assert res.sample.shape == (25,)
    assert int(res.sample.min()) >= 0 and int(res.sample.max()) < 7
    assert res.b == pytest.approx(math.sqrt(math.log(2 * 3 / 0.1) / 50))
    for h in range(3):
        eta_hat = np.mean([float(A[h, int(u), 5:12].sum()) for u in res.sample])
        assert res.eta[h].item() == pytest.approx(eta_hat, abs=1e-12)
        assert res.bound[h].item() == pytest.approx(min(1.0, eta_hat + res.b), abs=1e-12)
    # fixed seed: same sample; another seed: (almost surely) another sample
    again = audit_bounds(A, removed, AuditConfig("sampled", m_a=25, delta=0.1, J=2, seed=3))
    assert torch.equal(again.sample, res.sample) and torch.equal(again.bound, res.bound)
    other = audit_bounds(A, removed, AuditConfig("sampled", m_a=25, delta=0.1, J=2, seed=4))
    assert not torch.equal(other.sample, res.sample)


def test_sampled_bound_is_clipped_at_one():
    A = _population()
    res = audit_bounds(A, torch.ones(20, dtype=torch.bool), AuditConfig("sampled", m_a=2, delta=0.05, J=5, seed=0))
    assert torch.all(res.bound == 1.0)  # eta_hat = 1 and b > 0


def test_b_above_tolerance_means_no_layer_can_pass():
    A = _population()
    res = audit_bounds(A, torch.zeros(20, dtype=torch.bool),
                       AuditConfig("sampled", m_a=4, delta=0.05, J=3, seed=0, eps_audit=0.1))
    assert res.b > 0.1 and not res.passed
    assert NO_LAYER_CAN_PASS in res.message


def test_hoeffding_coverage_monte_carlo():
    # one head, J = 1, delta = 0.2: the bound may fail with probability <= 0.2; count failures
    g = torch.Generator().manual_seed(0)
    A = torch.zeros(1, 40, 10, dtype=torch.float64)
    A[0, :, 0] = torch.rand(40, generator=g)  # removed mass of each population row (key 0)
    A[0, :, 1] = 1 - A[0, :, 0]
    removed = torch.zeros(10, dtype=torch.bool)
    removed[0] = True
    eta = float(A[0, :, 0].mean())
    fails = sum(
        float(audit_bounds(A, removed, AuditConfig("sampled", m_a=8, delta=0.2, J=1, seed=s)).bound[0]) < eta for s in range(1000)
    )
    assert fails / 1000 <= 0.2 + 3 * math.sqrt(0.2 * 0.8 / 1000)


def test_audit_bounds_validation():
    A = _population()
    with pytest.raises(ValueError, match="^mode:"):
        audit_bounds(A, torch.zeros(20, dtype=torch.bool), AuditConfig("worst"))
    with pytest.raises(ValueError, match="^removed:"):
        audit_bounds(A, torch.zeros(19, dtype=torch.bool))
    with pytest.raises(ValueError, match="^A_audit:"):
        audit_bounds(torch.zeros(3, 0, 20), torch.zeros(20, dtype=torch.bool))
    with pytest.raises(ValueError, match="^m_a:"):
        audit_bounds(A, torch.zeros(20, dtype=torch.bool), AuditConfig("sampled", m_a=0))
    with pytest.raises(ValueError, match="^delta:"):
        audit_bounds(A, torch.zeros(20, dtype=torch.bool), AuditConfig(delta=1.0))


def test_audit_config_is_one_frozen_validated_object():
    # every field is checked in either mode, as EntroPrefillParams checks them: the exact audit does not read
    # m_a or the seed, but an out-of-range one is still refused rather than silently ignored
    for mode in ("exact", "sampled"):
        with pytest.raises(ValueError, match=r"^seed: must be an integer in \[0, 9223372036854775807\], got -1$"):
            AuditConfig(mode, seed=-1)
        with pytest.raises(ValueError, match=r"^m_a: must be an integer >= 1, got 0$"):
            AuditConfig(mode, m_a=0)
    assert AuditConfig.CHECKS["m_a"] is PARAMS["m_a"] and AuditConfig.CHECKS["seed"] is PARAMS["seed"]
    with pytest.raises(ValueError, match="^J:"):
        AuditConfig(J=0)
    with pytest.raises(ValueError, match="^eps_audit:"):
        AuditConfig(eps_audit=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        AuditConfig().m_a = 3
    with pytest.raises(ValueError, match="^config: must be an AuditConfig"):
        audit_bounds(_population(), torch.zeros(20, dtype=torch.bool), "sampled")


# ----------------------------------------------------------------------------- designed captures
SIZES = [8, 8, 8, 8, 8]  # N = 40; target 0.3 -> 12 tokens -> two chunks


def _row(spans, u, chunk_mass, sink=0.5):
    """One attention row of query position ``u`` (float64 ``[T]``): ``sink`` on the sinks, ``chunk_mass[i]``
    spread evenly over chunk ``i``, the rest evenly over the other non-sink keys ``<= u``."""
    T = spans.T
    row = torch.zeros(T, dtype=torch.float64)
    row[: spans.n_sink] = sink / spans.n_sink
    for (s, e), mass in zip(spans.chunks, chunk_mass):
        row[s:e] = mass / (e - s)
    other = torch.zeros(T, dtype=torch.bool)
    other[spans.n_sink : u + 1] = True
    other &= ~spans.document_mask()
    rest = 1.0 - sink - sum(chunk_mass)
    assert rest >= -1e-12
    row[other] = max(rest, 0.0) / int(other.sum())
    return row


def designed_capture(spans, L, obs_mass, aud_mass=None, *, H=4, G=2, sink=None):
    """Capture with the same designed row in every head; ``obs_mass[l]`` / ``aud_mass[l]`` give the
    per-chunk masses of observer / audit rows at layer ``l``; ``sink[l]`` the sink mass of the observer
    rows (audit rows: the same, capped so the row still sums to 1)."""
    aud_mass = obs_mass if aud_mass is None else aud_mass
    sink = [0.5] * L if sink is None else sink
    aud_pos = list(range(*spans.query))
    pos = list(spans.observers) + aud_pos
    kinds = ["observer"] * len(spans.observers) + ["audit"] * len(aud_pos)
    attn = torch.zeros(L, H, len(pos), spans.T, dtype=torch.float64)
    for l in range(L):
        for r, (u, kind) in enumerate(zip(pos, kinds)):
            if kind == "observer":
                attn[l, :, r] = _row(spans, u, obs_mass[l], sink[l])
            else:
                attn[l, :, r] = _row(spans, u, aud_mass[l], min(sink[l], 1.0 - sum(aud_mass[l])))
    return Capture(attn=attn.float(), row_pos=torch.tensor(pos), row_kind=kinds,
                   head_group=torch.arange(H) // (H // G), vnorm_max=torch.ones(L, G), spans=spans,
                   model_id="designed")


FAR = [0.001, 0.002, 0.003, 0.004, 0.005]  # attention mass far from the chunks; chunk 0 least attended
HEAVY = [0.18] * 5  # concentrated on every chunk (> eps_row = 0.05 per chunk)


@pytest.fixture(scope="module")
def spans():
    return PromptSpans.synthetic(SIZES, query_len=10)


@pytest.mark.parametrize("streak,l_star", [(0, 1), (1, 2), (2, 3)])
def test_far_attention_is_accepted_at_the_streak_layer(spans, streak, l_star):
    cap = designed_capture(spans, 4, [FAR] * 4)
    tr = trace(cap, EntroPrefillParams(streak=streak, audit_mode="exact"))
    assert tr.l_star == l_star
    assert tr.removed == [0, 1]  # the two least attended chunks reach 12 tokens
    assert tr.decision.startswith(f"accept at l* = {l_star}")
    df = tr.to_frame()
    assert list(df["layer"]) == [1, 2, 3]
    assert list(df["streak"]) == [0, 1, 2]
    assert math.isnan(df["d"][0]) and list(df["d"][1:]) == [0.0, 0.0]
    star = df[df["layer"] == l_star].iloc[0]
    assert star["status"] == "accept" and star["decision"].startswith("accept (l*)")
    # exact audit: bound = removed mass of the audit rows = 0.001 + 0.002 (float32 storage)
    assert star["max_audit_bound"] == pytest.approx(0.003, abs=1e-6) and star["b"] == 0.0
    assert list(df["executed"]) == [l <= l_star for l in (1, 2, 3)]
    for l in (1, 2, 3):
        if l < l_star:
            assert df[df["layer"] == l].iloc[0]["status"] == "short_streak"
    assert torch.equal(tr.retained_positions(), spans.retained_positions([0, 1]))


def test_concentrated_attention_gives_bypass(spans):
    cap = designed_capture(spans, 4, [HEAVY] * 4, sink=[0.05] * 4)
    tr = trace(cap, EntroPrefillParams(streak=0))
    assert tr.l_star is None and tr.bypass and tr.removed == []
    assert tr.decision.startswith("bypass")
    df = tr.to_frame()
    assert (df["status"] == "below_target").all() and (df["D"] == 0).all() and not df["audited"].any()
    # the LP proves it: 0.18 sum(x) <= 0.05 per row, so U = 8 * 0.05 / 0.18 = 2.22 < 12 tokens
    for l, sel in tr.selections.items():
        assert sel.U == pytest.approx(8 * 0.05 / 0.18, abs=1e-4)
        assert sel.verdict.startswith(VERDICT_INFEASIBLE)
    assert tr.retained_positions().numel() == spans.T


def test_audit_rows_decide_but_never_change_candidates(spans):
    good = designed_capture(spans, 4, [FAR] * 4)
    bad = designed_capture(spans, 4, [FAR] * 4, aud_mass=[[0.1] * 5] * 4)  # audit rows attend the chunks
    p = EntroPrefillParams(streak=1)
    tg, tb = trace(good, p), trace(bad, p)
    assert tg.l_star == 2 and tb.l_star is None
    assert {l: s.removed for l, s in tg.selections.items()} == {l: s.removed for l, s in tb.selections.items()}
    df = tb.to_frame()
    assert list(df["status"]) == ["short_streak", "audit_fail", "audit_fail"]
    assert df["max_audit_bound"][1] == pytest.approx(0.2, abs=1e-6)  # chunks 0 and 1 at 0.1 each


@pytest.mark.parametrize("kind", ["document", "residual"])
def test_invalid_layer_resets_predecessor_and_streak(spans, kind):
    obs = [FAR] * 5
    if kind == "document":
        obs[2] = [0.0] * 5  # no document mass at layer 2
    cap = designed_capture(spans, 5, obs)
    if kind == "residual":  # head 0 of layer 2 puts every observer's mass on the sinks: z = 0
        rows = cap.rows_of("observer")
        sinks_only = torch.zeros(len(rows), spans.T)
        sinks_only[:, : spans.n_sink] = 1.0 / spans.n_sink
        cap.attn[2, 0, rows, : spans.T] = sinks_only
    tr = trace(cap, EntroPrefillParams(streak=1))
    df = tr.to_frame()
    assert list(df["valid"]) == [True, False, True, True]
    bad = df.iloc[1]
    assert bad["status"] == "invalid" and kind in bad["decision"]
    assert bool(bad["valid_doc"]) == (kind != "document")
    assert bool(bad["valid_residual"]) == (kind != "residual")
    assert list(df["streak"]) == [0, 0, 0, 1]
    assert math.isnan(df["d"][2]) and df["d"][3] == 0.0  # layer 3 has no predecessor after the reset
    assert tr.l_star == 4
    # without the invalid layer the same candidates are accepted at layer 2
    assert trace(designed_capture(spans, 5, [FAR] * 5), EntroPrefillParams(streak=1)).l_star == 2


def test_sampled_audit_in_trace(spans):
    cap = designed_capture(spans, 4, [FAR] * 4)
    small = trace(cap, EntroPrefillParams(audit_mode="sampled", m_a=10, streak=1))
    b = math.sqrt(math.log(3 * 4 / 0.05) / 20)  # J = 3 monitored layers, H = 4 heads
    assert small.b == pytest.approx(b) and b > 0.1
    assert small.l_star is None and any(NO_LAYER_CAN_PASS in n for n in small.notes)
    large = trace(cap, EntroPrefillParams(audit_mode="sampled", m_a=5000, streak=1))
    assert large.l_star == 2
    assert large.to_frame()["max_audit_bound"][1] == pytest.approx(0.003 + large.b, abs=1e-6)


@pytest.mark.parametrize("priority", ["renyi", "mass", "uniform", "headmax", "random"])
def test_trace_priorities(spans, priority):
    cap = designed_capture(spans, 4, [FAR] * 4)
    tr = trace(cap, EntroPrefillParams(priority=priority, streak=1, seed=5))
    assert tr.l_star == 2 and len(tr.removed) == 2  # two equal chunks of 8 tokens reach 12 tokens
    if priority != "random":  # every ranking removes the least attended (or first) chunks
        assert tr.removed == [0, 1]


def test_trace_k_zero_is_ordinary_inference():
    sp = PromptSpans.synthetic([])
    cap = Capture.synthetic(sp, L=3, H_Q=4, G=2, extra_rows={"audit": list(range(*sp.query))})
    tr = trace(cap, EntroPrefillParams())
    assert tr.l_star is None and tr.removed == []
    assert any("k = 0" in n for n in tr.notes) and "k = 0" in tr.decision
    assert (tr.to_frame()["status"] == "no_candidates").all()


def test_trace_without_audit_rows_cannot_accept(spans):
    cap = Capture.synthetic(spans, L=3, H_Q=4, G=2, seed=0, concentration=0.1)
    tr = trace(cap, EntroPrefillParams(streak=0, eps_row=1.0))
    assert tr.l_star is None and any(NO_LAYER_CAN_PASS in n for n in tr.notes)


def test_trace_rejects_monitored_layers_out_of_range(spans):
    cap = designed_capture(spans, 3, [FAR] * 3)
    with pytest.raises(ValueError, match="^monitored:"):
        trace(cap, EntroPrefillParams(monitored=(1, 3)))


# ----------------------------------------------------------------------------- procedure invariants
def check_trace_invariants(cap, p, tr):
    """Re-derive the bookkeeping of steps 3–6 from the per-layer table and check every row."""
    df = tr.to_frame()
    spans = cap.spans
    A_obs = cap.observer_attn()
    aud = cap.rows_of("audit")
    aud = aud[cap.row_pos[aud] >= max(e for _, e in spans.chunks)]
    indep = aud[[int(cap.row_pos[i]) not in spans.observers for i in aud.tolist()]]
    aud = indep if indep.numel() else aud  # SPEC §6: outside the observers, unless every audit row is one
    assert tr.audit_rows.tolist() == aud.tolist()
    pred, streak, first = None, 0, None
    for _, r in df.iterrows():
        l = int(r["layer"])
        if not r["valid"]:
            assert r["status"] == "invalid" and r["streak"] == 0 and math.isnan(r["d"])
            pred, streak = None, 0
            continue
        R = set(r["removed"])
        if pred is None:
            assert math.isnan(r["d"]) and r["streak"] == 0
            streak = 0
        else:
            d = len(R ^ pred) / max(1, len(R | pred))
            assert r["d"] == pytest.approx(d)
            streak = streak + 1 if d <= p.d_max else 0
            assert r["streak"] == streak
        pred = R
        # the candidate is feasible for the observer rows of this layer and certified
        m = mass_table(A_obs[l], spans)
        x = torch.zeros(spans.k, dtype=torch.float64)
        x[list(R)] = 1
        assert torch.all(m @ x <= p.eps_row + 1e-9)
        assert len(R) <= spans.k - p.m0
        assert r["U"] >= r["D"] - 1e-6
        should_audit = bool(r["reached"]) and streak >= p.streak and aud.numel() > 0
        assert bool(r["audited"]) == should_audit
        if should_audit and p.audit_mode == "exact":
            mask = spans.removal_mask(sorted(R))
            eta = cap.attn[l][:, aud][:, :, : spans.T][:, :, mask].double().sum(-1).mean(-1)  # [H]
            assert r["max_audit_bound"] == pytest.approx(float(eta.max().clamp(max=1.0)), abs=1e-9)
            assert (r["status"] == "accept") == bool(float(eta.max()) <= p.eps_audit)
        if r["status"] == "accept" and first is None:
            first = l
    assert tr.l_star == first
    if first is not None:
        assert tr.removed == list(df[df["layer"] == first]["removed"].iloc[0])
    assert list(df["executed"]) == [first is None or l <= first for l in df["layer"]]


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=7),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.05, 0.2, 1.0]),
    st.sampled_from([0.05, 0.3, 0.8]),
    st.integers(0, 2),
    st.sampled_from([0.0, 0.5, 1.0]),
    st.sampled_from(["exact", "sampled"]),
    st.sets(st.integers(1, 4), max_size=2),
)
def test_trace_invariants_random_captures(sizes, seed, eps_row, eps_audit, streak, d_max, mode, invalid):
    sp = PromptSpans.synthetic(sizes, query_len=8)
    cap = Capture.synthetic(sp, L=5, H_Q=4, G=2, extra_rows={"audit": list(range(*sp.query))}, seed=seed,
                            concentration=2.0)
    for l in invalid:  # observers of layer l attend no document: invalid document mass
        obs = cap.rows_of("observer")
        a = cap.attn[l][:, obs]
        a[..., sp.document_mask()] = 0
        cap.attn[l][:, obs] = a / a.sum(-1, keepdim=True)
    p = EntroPrefillParams(eps_row=eps_row, eps_audit=eps_audit, streak=streak, d_max=d_max, audit_mode=mode,
                           m_a=200, target=0.25, m0=min(1, sp.k))
    tr = trace(cap, p)
    assert [bool(v) for v in tr.to_frame()["valid"]] == [l not in invalid for l in (1, 2, 3, 4)]
    check_trace_invariants(cap, p, tr)


@pytest.mark.model
def test_trace_on_smollm_capture(smollm_capture):
    cap = smollm_capture
    for p in (EntroPrefillParams(), EntroPrefillParams(eps_row=0.2, eps_audit=0.3, streak=1)):
        tr = trace(cap, p)
        assert tr.J == cap.L - 1 and len(tr.records) == cap.L - 1
        check_trace_invariants(cap, p, tr)


def test_audit_population_leaves_out_the_observers():
    """SPEC §6: the default audit population (the user query) minus the proposal observers; when every
    audit row is an observer the trace says the audit overlaps the proposal."""
    sp = PromptSpans.synthetic([6, 6, 6], query_len=10)  # observers: the last 8 query tokens
    q0, q1 = sp.query
    cap = Capture.synthetic(sp, L=3, H_Q=4, G=2, seed=1, extra_rows={"audit": list(range(q0, q1))})
    tr = trace(cap, EntroPrefillParams(streak=0, eps_row=1.0, eps_audit=1.0))
    used = cap.row_pos[tr.audit_rows].tolist()
    assert used == [q0, q0 + 1] and not set(used) & set(sp.observers)
    assert any("observer positions" in n and "left out" in n for n in tr.notes)
    only_obs = Capture.synthetic(sp, L=3, H_Q=4, G=2, seed=1, extra_rows={"audit": list(sp.observers)})
    tr2 = trace(only_obs, EntroPrefillParams(streak=0, eps_row=1.0, eps_audit=1.0))
    assert only_obs.row_pos[tr2.audit_rows].tolist() == list(sp.observers)
    assert any("overlaps the proposal observers" in n for n in tr2.notes)
