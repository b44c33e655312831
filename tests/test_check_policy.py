"""``wb.check_policy``: the policy contract as a library function. Each purpose-built bad policy
(tests/_bad_policies.py) fails the check it breaches, and the table's reason names the breach; a user's own
policy and the built-ins pass (the built-ins: tests/test_policy_contract.py, through the same function)."""
from __future__ import annotations

import re

import _bad_policies as bad
import pytest
from _my_policy import MeanKey

import workbench as wb
from workbench.rerun.eviction import Needs, SnapKV
from workbench.rerun.eviction.contract import CHECKS, WIDE_NEEDS, contract_session


@pytest.fixture(scope="module")
def session():
    return contract_session("tiny", WIDE_NEEDS)


def _failed(df) -> dict:
    return dict(zip(df.loc[~df["passed"], "check"], df.loc[~df["passed"], "reason"]))


@pytest.mark.parametrize("cls, check, reason", [
    (bad.WrongShape, "scores shape [L, G, T]", r"shape \[3, 95\], not \[L, G, T\] = \[3, 2, 95\]"),
    (bad.NaNScores, "scores finite", r"6 of 570 scores are not finite \(6 NaN"),
    (bad.UndeclaredKeys, "nothing undeclared read", r"it reads \['keys'\] without declaring them"),
    (bad.MoreRowsThanDeclared, "nothing undeclared read", "scores change when undeclared evidence is present"),
    (bad.UnusedNeed, "declared needs used", r"declares \['colsum'\] but scoring works without"),
    # its +inf scores tie with the protected positions: refused on every run, so its breach is the finiteness rule
    (bad.DropsProtected, "scores finite", r"306 of 570 scores are not finite \(0 NaN, 306 ±inf\)"),
    (bad.Unseeded, "deterministic", "scores change with the global RNG state"),
    (bad.TopHeavy, "B >= T full cache", r"allocate\(ev, B = T = 95\) gives counts"),
    (bad.TwoStepDefer, "constructs", "defer = 2"),
], ids=lambda x: x.__name__ if isinstance(x, type) else None)
def test_each_breach_is_named(cls, check, reason, session):
    df = wb.check_policy(cls, session=session)
    assert list(df.columns) == ["policy", "model", "check", "passed", "reason"]
    assert list(df["check"]) == list(CHECKS) and set(df["model"]) == {"session"}
    failed = _failed(df)
    assert check in failed, df.to_string()
    assert re.search(reason, failed[check]), failed[check]


def test_a_breach_fails_only_what_it_breaches(session):
    """The undeclared read and the unused need fail one check each; the rest of their contract holds."""
    assert set(_failed(wb.check_policy(bad.UndeclaredKeys, session=session))) == {"nothing undeclared read"}
    assert set(_failed(wb.check_policy(bad.UnusedNeed, session=session))) == {"declared needs used"}
    assert set(_failed(wb.check_policy(bad.MoreRowsThanDeclared, session=session))) == {"nothing undeclared read"}


def test_a_users_policy_passes_on_the_tiny_and_its_own_session():
    df = wb.check_policy(MeanKey, models="tiny")
    assert df["passed"].all(), df.to_string()
    assert df.loc[df["check"] == "constructs", "reason"].item() == repr(MeanKey(n_sink=2, recent=4))


def test_refusals(session):
    df = wb.check_policy(42, session=session)
    assert not df["passed"].any() and "must be an EvictionPolicy" in df["reason"].iloc[0]
    with pytest.raises(ValueError, match="session: captured"):
        wb.check_policy(SnapKV(window=64), session=contract_session("tiny", Needs(tail=8)))
    with pytest.raises(ValueError, match="models: each must be"):
        wb.check_policy(MeanKey, models=("huge",))


@pytest.mark.model
def test_check_policy_on_the_default_model(smollm):
    df = wb.check_policy(MeanKey, models=("tiny", smollm))
    assert set(df["model"]) == {"tiny", smollm.model_id} and df["passed"].all(), df.to_string()
