"""SPEC §2–§6 invariants on a real capture of the default model (the bundled 8-passage prompt)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from workbench.analyse.audit import AuditConfig, audit_bounds
from workbench.analyse.envelope import envelope, output_bound, output_shift
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.pooling import HeadPooling
from workbench.analyse.priorities import ChunkPriorities
from workbench.analyse.procedure import trace
from workbench.analyse.selection import GreedySelection, mass_table


@pytest.fixture(scope="module")
def pooled(smollm_capture):
    return HeadPooling(zeta=0.3, tau=0.5)(smollm_capture)


def test_pooling_invariants_on_real_capture(smollm_capture, pooled):
    cap, P = smollm_capture, pooled
    G, r = cap.G, cap.r
    wsum = P.w.reshape(cap.L, G, r).sum(-1)
    assert torch.allclose(wsum, torch.ones_like(wsum), atol=1e-9)
    assert torch.allclose(P.mu.sum(-1), torch.ones(cap.L, dtype=P.mu.dtype), atol=1e-6)
    assert (P.w >= 0.3 / r - 1e-12).all()  # the group floor ζ/r
    # μ equals Σ_h Σ_u ω_{h,u} A_{u,j}
    A = cap.observer_attn().double()
    mu = (P.omega.double()[:, :, None, None] * A).sum((1, 2))
    assert torch.allclose(mu, P.mu.double(), atol=1e-9)
    Tn = cap.T - cap.spans.n_sink
    assert ((P.H >= -1e-9) & (P.H <= math.log(Tn) + 1e-9))[P.valid_head].all()


def test_priorities_and_inequality_10_on_real_capture(smollm_capture, pooled):
    pr = ChunkPriorities(eps_s=0.1, lam=0.7).score(pooled.mu, smollm_capture.spans)
    assert ((pr.kappa >= -1e-12) & (pr.kappa <= 1 + 1e-12)).all()
    k = smollm_capture.spans.k
    lhs = pr.S[:, :, None] - pr.S[:, None, :]
    rhs = torch.log(pr.ell[:, :, None] / pr.ell[:, None, :]) - 0.7
    assert (lhs >= rhs - 1e-9).all() and lhs.shape[-1] == k


def test_envelope_holds_on_every_row_and_removal_set(smollm_capture, pooled):
    cap, P = smollm_capture, pooled
    A = cap.observer_attn()
    k = cap.spans.k
    sets = [list(c) for n in (1, 2, 4, 7) for c in itertools.combinations(range(k), n)]
    g = torch.Generator().manual_seed(0)
    checked = 0
    for l in range(cap.L):
        for s in sets[:: max(1, len(sets) // 40)] + [list(range(k))]:
            res = envelope(A[l], P.mu[l], P.omega[l], cap.spans.removal_mask(s))
            assert bool(res.holds.all()), (l, s, float((res.eta - res.bound).max()))
            assert (res.dchi2 <= res.dchi2_cap + 1e-6).all()
            checked += res.eta.numel()
        rnd = torch.rand(k, generator=g) < 0.5
        res = envelope(A[l], P.mu[l], P.omega[l], cap.spans.removal_mask(torch.nonzero(rnd).flatten()))
        assert bool(res.holds.all())
    assert checked > 30 * 9 * 8 * 40  # 100 % of the rows, many removal sets


def test_output_bound_with_real_values(smollm, smollm_capture):
    """Layer 0: values recomputed from the captured block input; ‖o − o_R‖ ≤ 2Vη for every observer row."""
    cap, shape = smollm_capture, smollm.shape
    layer0 = smollm.model.model.layers[0]
    with torch.no_grad():
        v = layer0.self_attn.v_proj(layer0.input_layernorm(cap.hidden[0])).view(cap.T, shape.G, shape.d)
    A = cap.observer_attn()[0]
    for E in ([0], [1, 2], [4], list(range(cap.spans.k))):
        mask = cap.spans.removal_mask(E)
        for h in range(shape.H_Q):
            g = int(cap.head_group[h])
            V = float(cap.vnorm_max[0, g])
            for u in range(A.shape[1]):
                o, o_R, shift, eta = output_shift(A[h, u], v[:, g], mask)
                assert shift <= output_bound(eta, V) * (1 + 1e-5) + 1e-6


def test_certificate_dominates_greedy_on_every_layer(smollm_capture, pooled):
    cap = smollm_capture
    pr = ChunkPriorities().score(pooled.mu, cap.spans)
    m = mass_table(cap.observer_attn(), cap.spans)
    sel = GreedySelection(target=0.5, eps_row=0.2, m0=1)
    for l in range(1, cap.L):
        res = sel.select(pr.S[l], cap.spans.n, m[l])
        assert res.U >= res.D - 1e-9
        assert (res.row_load <= 0.2 + 1e-12).all() and len(res.removed) <= cap.spans.k - 1


def test_audit_and_trace_on_real_capture(smollm_capture):
    cap = smollm_capture
    params = EntroPrefillParams(eps_row=0.3, target=0.2, streak=0, eps_audit=0.5)
    tr = trace(cap, params)
    df = tr.to_frame()
    assert len(df) == cap.L - 1 and {"D", "U", "gap", "d", "streak", "decision"} <= set(df.columns)
    ok = df[df["valid"]]
    assert (ok["U"] >= ok["D"] - 1e-9).all()
    assert tr.l_star is not None, tr.decision  # loose thresholds: some layer is accepted
    A_aud = cap.prompt_rows(tr.audit_rows)[tr.l_star]
    au = audit_bounds(A_aud, cap.spans.removal_mask(tr.removed), AuditConfig("exact", eps_audit=0.5))
    assert au.passed is True and bool(au.passed_head.all())
    assert float(au.bound.max()) <= 0.5 and au.b == 0.0
    # the exact-mode bound is the mean discarded mass over the audit population
    eta = A_aud[:, :, cap.spans.removal_mask(tr.removed)].sum(-1).mean(-1)
    assert torch.allclose(au.bound.double(), eta.double().clamp(max=1), atol=1e-6)
