"""Tests of workbench.analyse.params.EntroPrefillParams: validation of every field and derived objects."""
from __future__ import annotations

import dataclasses

import pytest

from workbench.analyse.params import EntroPrefillParams

INVALID = [
    ("zeta", 0.0), ("zeta", -0.1), ("zeta", 1.0001), ("zeta", float("nan")), ("zeta", "0.5"),
    ("tau", 0.0), ("tau", -1.0), ("tau", float("inf")),
    ("rho_min", 0.0), ("rho_min", 1.0), ("rho_min", -1e-6),
    ("eps_s", 0.0), ("eps_s", -0.1), ("eps_s", float("inf")),
    ("lam", -0.01), ("lam", float("nan")),
    ("target", -1), ("target", 0.0), ("target", 1.5), ("target", True), ("target", "0.3"), ("target", float("nan")),
    ("target", 1), ("target", 500),  # an int is tokens: refused here, pointing to target_tokens
    ("target_tokens", -1), ("target_tokens", 0.5), ("target_tokens", True), ("target_tokens", "3"),
    ("eps_row", 0.0), ("eps_row", 1.2), ("eps_row", None),
    ("m0", -1), ("m0", 0.5), ("m0", True),
    ("monitored", ()), ("monitored", (0, 1)), ("monitored", (1, 1)), ("monitored", (1.0, 2)), ("monitored", "12"),
    ("monitored", 3),
    ("audit_mode", "worst_case"), ("audit_mode", None),
    ("m_a", 0), ("m_a", 3.0), ("m_a", -5),
    ("delta", 0.0), ("delta", 1.0), ("delta", 1.5),
    ("eps_audit", 0.0), ("eps_audit", 1.1),
    ("d_max", -0.1), ("d_max", 1.1),
    ("streak", -1), ("streak", 1.5),
    ("seed", -1), ("seed", 0.5), ("seed", False), ("seed", 2**63),
    ("priority", "entropy"), ("priority", None),
]


@pytest.mark.parametrize("field,value", INVALID)
def test_invalid_field_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: must"):
        EntroPrefillParams(**{field: value})


def test_every_field_has_an_invalid_case():
    assert {f.name for f in dataclasses.fields(EntroPrefillParams)} == {f for f, _ in INVALID}


VALID_EDGES = [
    ("zeta", 1.0), ("zeta", 1e-9), ("tau", 1e-4), ("lam", 0.0), ("lam", 3), ("target_tokens", 0),
    ("target_tokens", 500), ("target", 1.0), ("eps_row", 1.0), ("m0", 0), ("monitored", (5,)), ("audit_mode", "sampled"), ("m_a", 1),
    ("delta", 0.999), ("eps_audit", 1.0), ("d_max", 0.0), ("d_max", 1.0), ("streak", 0), ("seed", 2**40), ("seed", 2**63 - 1),
    ("priority", "renyi"), ("priority", "mass"), ("priority", "uniform"), ("priority", "random"), ("priority", "headmax"),
]


@pytest.mark.parametrize("field,value", VALID_EDGES)
def test_valid_edge_values(field, value):
    p = EntroPrefillParams(**{field: value})
    assert getattr(p, field) == value


def test_defaults():
    p = EntroPrefillParams()
    assert (p.zeta, p.tau, p.eps_s, p.lam, p.target, p.eps_row, p.m0) == (0.5, 1.0, 0.1, 0.5, 0.3, 0.05, 1)
    assert (p.audit_mode, p.m_a, p.delta, p.eps_audit, p.d_max, p.streak, p.seed, p.priority) == (
        "exact", 32, 0.05, 0.1, 0.5, 1, 0, "renyi")
    assert p.monitored is None and p.monitored_layers(30) == tuple(range(1, 30))


def test_monitored_is_normalised_and_checked_against_L():
    p = EntroPrefillParams(monitored=[7, 2, 4])
    assert p.monitored == (2, 4, 7)
    assert p.monitored_layers(8) == (2, 4, 7)
    with pytest.raises(ValueError, match="^monitored:"):
        p.monitored_layers(7)
    with pytest.raises(ValueError, match="^monitored:"):
        EntroPrefillParams().monitored_layers(1)


def test_frozen_and_replace_validates():
    p = EntroPrefillParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.zeta = 0.3
    q = p.replace(zeta=0.9, streak=3)
    assert (q.zeta, q.streak, p.zeta, p.streak) == (0.9, 3, 0.5, 1)
    with pytest.raises(ValueError, match="^zeta:"):
        p.replace(zeta=2.0)


def test_derived_objects_carry_the_parameters():
    p = EntroPrefillParams(zeta=0.7, tau=2.0, rho_min=1e-4, eps_s=0.3, lam=1.5, target_tokens=20, eps_row=0.2,
                           m0=2)
    hp = p.pooling()
    assert (hp.zeta, hp.tau, hp.rho_min) == (0.7, 2.0, 1e-4)
    cp = p.priorities()
    assert (cp.eps_s, cp.lam, cp.rho_min) == (0.3, 1.5, 1e-4)
    gs = p.selection()
    assert (gs.target, gs.target_tokens, gs.eps_row, gs.m0) == (None, 20, 0.2, 2)
    assert p.replace(priority="mass").priorities().lam == 0.0


def test_target_and_target_tokens_are_exclusive_and_replace_switches_units():
    with pytest.raises(ValueError, match="^target: give either"):
        EntroPrefillParams(target=0.5, target_tokens=10)
    with pytest.raises(ValueError, match="target_tokens=1"):  # the int 1 is refused, with the way out
        EntroPrefillParams(target=1)
    p = EntroPrefillParams(target_tokens=10)
    assert (p.target, p.target_tokens) == (None, 10)
    q = p.replace(target=0.5)
    assert (q.target, q.target_tokens) == (0.5, None)
    r = q.replace(target_tokens=7)
    assert (r.target, r.target_tokens) == (None, 7)
    assert EntroPrefillParams(**r.to_dict()) == r
