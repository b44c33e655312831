"""The policy contract holds on every run, not only under ``check_policy``: what a policy returns (scores, protected
mask, tie-break, allocation) is checked where every run selects (``preview``), and a breach is a named error
(the policy, the method, the rule), never torch's or Python's message and never a silent wrong run.
``check_policy`` reports every breach as a failed row (never raises, never passes vacuously) and validates its
own arguments; evidence a policy did not declare is refused by name where it is read."""
from __future__ import annotations

import re

import _bad_policies as bad
import pytest
import torch

import workbench as wb
from workbench.rerun.eviction import REGISTRY, Evidence, PolicyContractError, SnapKV, preview
from workbench.rerun.eviction.contract import WIDE_NEEDS, contract_session
from workbench.rerun.eviction.evidence import MissingEvidence


@pytest.fixture(scope="module")
def session():
    return contract_session("tiny", WIDE_NEEDS)


def _failed(df) -> dict:
    return dict(zip(df.loc[~df["passed"], "check"], df.loc[~df["passed"], "reason"]))


@pytest.mark.parametrize("cls, rule, message", [
    (bad.KeepsEverything, "exactly B sorted", r"bad-alloc-all\.allocate: counts sum to 570, not L·G·B = 3·2·47 = 282"),
    (bad.FloatCounts, "exactly B sorted", r"bad-alloc-float\.allocate: must be integer counts .*got dtype torch\.float64"),
    (bad.InfScores, "scores finite", r"bad-inf\.scores: 18 of 570 scores are not finite \(0 NaN, 18 ±inf\)"),
    (bad.NaNScores, "scores finite", r"bad-nan\.scores: 6 of 570 scores are not finite \(6 NaN, 0 ±inf\)"),
    (bad.NumpyScores, "scores shape [L, G, T]", r"bad-numpy\.scores: must return a torch\.Tensor \[L, G, T\] = "
                                                r"\[3, 2, 95\], got numpy\.ndarray"),
    (bad.ListScores, "scores shape [L, G, T]", r"bad-list\.scores: must return a torch\.Tensor .*, got list"),
    (bad.WrongShape, "scores shape [L, G, T]", r"bad-shape\.scores: must have shape \[L, G, T\] = \[3, 2, 95\]"),
    (bad.IntProtected, "protected mask bool [T]", r"bad-prot-int\.protected: must be a bool tensor \[T\] = \[95\], "
                                                  r"got torch\.int64 \[95\]"),
    (bad.ListProtected, "protected mask bool [T]", r"bad-prot-list\.protected: must return a torch\.Tensor bool "
                                                   r"\[T\] = \[95\], got list"),
], ids=lambda x: x.__name__ if isinstance(x, type) else None)
def test_every_run_keeps_the_contract(cls, rule, message, session):
    pol = cls() if cls not in (bad.NaNScores, bad.WrongShape) else cls(n_sink=2, recent=4)
    B = session.T // 2
    for run in (lambda: session.run(pol, B), lambda: preview(pol, session.evidence, B)):
        with pytest.raises(PolicyContractError, match=message) as e:
            run()
        assert f"rule {rule!r}" in str(e.value) and type(pol).__name__ in str(e.value)
    # in a batch (the sweep's path) the breach is that run's error, the others still run
    bad_run, good = session.run_batch([(pol, B), (SnapKV(), B)])
    assert re.search(message, bad_run.error) and good.error is None and good.ids


def test_a_good_allocation_still_runs(session):
    from workbench.rerun.eviction import PyramidKV
    r = session.run(PyramidKV(), session.T // 2)
    assert r.error is None and int((r.kept_prompt >= 0).sum()) == 3 * 2 * (session.T // 2)


def test_check_policy_reports_a_list_protected_mask_as_a_failed_row(session):
    """C2: check_policy itself raised AttributeError ('list' object has no attribute 'sum')."""
    failed = _failed(wb.check_policy(bad.ListProtected, session=session))
    assert "protected mask bool [T]" in failed and "got list [95]" in failed["protected mask bool [T]"]
    assert failed["protected kept"].startswith("not checked: protected(T) failed")
    assert failed["exactly B sorted"].startswith("not checked: protected(T) failed")


def test_check_policy_does_not_pass_vacuously_when_everything_is_protected(session):
    """W3: with every position protected no budget below T can be tried; the budget rows say so and fail."""
    failed = _failed(wb.check_policy(bad.AllProtected, session=session))
    for row in ("protected kept", "exactly B sorted"):
        assert row in failed and "protects 95 of T = 95 positions, so no budget B < T can be tried" in failed[row]


@pytest.mark.parametrize("seed", [-1, 2**32, 2**32 - 12345, 1.5, True])
def test_check_policy_validates_its_seed(seed, session):
    """W4: a bad seed was not validated; a good policy was reported failing with numpy's seed error."""
    with pytest.raises(ValueError, match=r"^seed: must be an integer in \[0, 4294954950\]"):
        wb.check_policy(SnapKV, session=session, seed=seed)


def test_check_policy_validates_its_session():
    with pytest.raises(ValueError, match="session: must be None or an EvictionSession"):
        wb.check_policy(SnapKV, session="tiny")


def test_undeclared_evidence_is_refused_by_name_where_it_is_read(session):
    """``ev.keys`` read directly: a named error when the evidence was not captured (not 'NoneType' ...), and a
    policy that reads it directly and declares it passes the contract."""
    ev = Evidence(T=6, L=1, head_group=torch.tensor([0, 0]))
    with pytest.raises(MissingEvidence, match=r"evidence: 'keys' was not captured: .*Needs\(keys=\.\.\.\)"):
        ev.keys
    with pytest.raises(ValueError, match=r"'decode' was not captured: .*Needs\(decode1=\.\.\.\)"):
        ev.decode
    assert not hasattr(ev, "colsum") and ev.get("colsum") is None and "captured=[]" in repr(ev)
    df = wb.check_policy(bad.DirectKeys, session=session)
    assert df["passed"].all(), df.to_string()
    failed = _failed(wb.check_policy(bad.UndeclaredDirectKeys, session=session))
    assert set(failed) == {"nothing undeclared read"}
    assert "it reads ['keys'] without declaring them" in failed["nothing undeclared read"]
    assert "NoneType" not in failed["nothing undeclared read"]


@pytest.mark.parametrize("spec", [":", "mod:", ":Cls", "a..b:C", ".rel:C", "a:b:c", "1mod:C", "m:C D"])
def test_resolve_refuses_a_malformed_module_class_spec(spec):
    with REGISTRY.scoped(), pytest.raises(ValueError, match=r"^policy: must be a policy name or 'module:Class' "
                                                            r"\(a dotted module path, a colon and a class name"):
        REGISTRY.resolve(spec)
