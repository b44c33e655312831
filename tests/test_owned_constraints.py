"""Constraints declared by their owners: a researcher's own policy, written as README.md's "Bring your own
policy" shows, is checked like a built-in: an out-of-range field is refused with its constraint's message (the
field's name and allowed range), a field of its own is declared next to its fields, an undeclared one is refused
saying how to declare it, and ``@checked`` registers what it declares without naming it in the base layer."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

import workbench as wb
import workbench.constraints as constraints_module
from workbench.analyse.stats import STATS_CHECKS, bootstrap_ci, mde
from workbench.checks import Interval, constraints_of
from workbench.constraints import PARAMS, checked, register, register_all


@dataclass(frozen=True)
class MeanKey(wb.EvictionPolicy):  # README.md's own policy, as written there
    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "mean-key"

    def needs(self):
        return wb.Needs(keys=True)

    def scores(self, ev):
        k = ev.require("keys", "MeanKey").double()
        return torch.nn.functional.cosine_similarity(k, k.mean(2, keepdim=True), dim=-1)


@checked()
@dataclass(frozen=True)
class TiltedMeanKey(MeanKey):  # the same with a parameter of its own, declared next to it
    alpha: float = 0.5
    _parameter_constraints: ClassVar = {"alpha": Interval("real", 0.0, 1.0, closed="right")}
    name: ClassVar[str] = "tilted-mean-key"


@pytest.mark.parametrize("field, value, message", [
    ("n_sink", -1, "n_sink: must be an integer >= 0, got -1"),
    ("recent", 2.5, "recent: must be an integer >= 0, got 2.5"),
    ("n_sink", True, "n_sink: must be an integer >= 0, got True"),
])
def test_the_readme_policy_refuses_an_out_of_range_field_with_its_constraint_message(field, value, message):
    with pytest.raises(ValueError) as e:
        MeanKey(**{field: value})
    assert str(e.value) == message == PARAMS[field].message(field, value)
    assert MeanKey(n_sink=0, recent=0).params() == {"n_sink": 0, "recent": 0}


@pytest.mark.parametrize("value, message", [
    (0.0, "alpha: must be in (0, 1], got 0.0"),
    (1.5, "alpha: must be in (0, 1], got 1.5"),
    ("0.5", "alpha: must be a finite real number in (0, 1], got '0.5'"),
    (float("nan"), "alpha: must be a finite real number in (0, 1], got nan"),
])
def test_an_own_field_declared_next_to_the_fields_is_refused_with_its_range(value, message):
    with pytest.raises(ValueError) as e:
        TiltedMeanKey(alpha=value)
    assert str(e.value) == message
    assert TiltedMeanKey(alpha=1).alpha == 1


def test_an_own_policy_checks_inherited_and_own_fields_together():
    with pytest.raises(ValueError, match=r"^n_sink: must be an integer >= 0, got -1$"):
        TiltedMeanKey(n_sink=-1)
    assert set(TiltedMeanKey.CHECKS) == {"n_sink", "recent", "alpha"}
    assert TiltedMeanKey.CHECKS["n_sink"] is PARAMS["n_sink"]  # the base's shared constraint
    assert PARAMS["tiltedmeankey.alpha"] is TiltedMeanKey.CHECKS["alpha"]  # registered under its owner


def test_an_undeclared_field_is_refused_saying_how_to_declare_it():
    @dataclass(frozen=True)
    class Undeclared(MeanKey):
        beta: float = 0.5

    with pytest.raises(TypeError) as e:
        Undeclared()
    msg = str(e.value)
    assert msg.startswith("Undeclared.beta: the field has no declared constraint; declare it next to the fields")
    assert '_parameter_constraints = {"beta": Interval("real", 0, 1)}' in msg
    with pytest.raises(TypeError, match=r"^Undeclared\.beta: the field has no declared constraint"):
        checked()(Undeclared)  # at class definition with @checked: no KeyError, the same message


def test_a_declared_value_that_is_not_a_constraint_is_refused():
    @dataclass(frozen=True)
    class Loose(MeanKey):
        gamma: float = 0.5
        _parameter_constraints: ClassVar = {"gamma": (0, 1)}

    with pytest.raises(TypeError, match=r"^Loose\._parameter_constraints\['gamma'\]: must be a Constraint"):
        constraints_of(Loose)


def test_the_registry_keeps_one_constraint_per_key():
    c = Interval("int", 0, 3)
    register("test_owned.x", c, "owner_a")
    register("test_owned.x", Interval("int", 0, 4), "owner_a")  # the same owner again (a cell run twice): replaced
    with pytest.raises(ValueError, match=r"^test_owned\.x: already the constraint"):
        register("test_owned.x", c, "owner_b")
    got = register_all("test_owned", {"zeta": PARAMS["zeta"], "z": c}, "owner_b")  # shared: under its own name
    assert dict(got) == {"zeta": PARAMS["zeta"], "z": c} and PARAMS["test_owned.z"] is c
    with pytest.raises(ValueError, match=r"^zeta: already the constraint"):
        register("zeta", c, "owner_b")
    with pytest.raises(TypeError, match=r"^test_owned\.y: must be a Constraint"):
        register("test_owned.y", (0, 1), "owner_a")


def test_the_base_layer_names_no_upper_layer_key():
    src = Path(constraints_module.__file__).read_text()
    for word in ('"report.', '"export.', '"sweep.', '"prompt_panel.', '"deferkv.', '"counterexample.', "duck"):
        assert word not in src, word


def test_the_statistics_check_their_arguments_with_their_declared_constraints():
    with pytest.raises(ValueError) as e:
        mde(10, float("inf"))  # an infinite discordance was taken, giving an infinite "detectable" effect
    assert str(e.value) == "discordance: must be a finite real number >= 0, got inf"
    with pytest.raises(ValueError, match=r"^level: must be in \(0, 1\), got 1.5$"):
        bootstrap_ci([1.0, 2.0], level=1.5)
    with pytest.raises(ValueError, match=r"^sided: must be one of \[1, 2\], got 3$"):
        mde(10, 0.5, sided=3)
    assert PARAMS["stats.n_boot"] is STATS_CHECKS["n_boot"]
