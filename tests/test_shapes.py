"""Checked shapes (``workbench.shapes``): the shapes a function's jaxtyping annotations name are the shapes a call
is checked against, active under pytest, and a wrong shape raises a message naming the argument and the sizes."""
from __future__ import annotations

import os
import subprocess
import sys
import typing
from dataclasses import dataclass
from typing import ClassVar

import jaxtyping
import pytest
import torch
from jaxtyping import Float

from workbench import shapes
from workbench.analyse.audit import audit_bounds
from workbench.analyse.envelope import envelope, output_shift
from workbench.analyse.pooling import HeadPooling
from workbench.analyse.selection import mass_table
from workbench.rerun.eviction import Evidence, SnapKV, preview, select_keep
from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.run.spans import PromptSpans
from workbench.shapes import annotated_shapes, check_shape, parse_shape, shaped

SHAPED = {
    select_keep: {"scores": [("L", "G", "T")], "protected": [("T",)], "tiebreak": [("L", "G", "T")],
                  "budgets": [("L", "G")]},
    HeadPooling.pool: {"A_obs": [("L", "H_Q", "W", "T")], "head_group": [("H_Q",)]},
    envelope: {"A_rows": [("H_Q", "W", "T")], "mu": [("T",)], "omega": [("H_Q",), ("H_Q", "W")],
               "removed": [("T",)]},
    output_shift: {"a": [("T",)], "values": [("T", "d")], "removed": [("T",)]},
    audit_bounds: {"A_audit": [("H_Q", "n_pop", "T")], "removed": [("T",)]},
}


def test_parse_shape():
    assert parse_shape("L, G, T") == ("L", "G", "T")
    assert parse_shape("[..., H, W, T]") == ("...", "H", "W", "T")
    assert parse_shape("L, G, min(B, T)") == ("L", "G", "min(B, T)")
    with pytest.raises(ValueError, match="may only lead"):
        parse_shape("L, ..., T")


def test_check_shape_binds_and_names_the_sizes():
    b = check_shape("scores", torch.zeros(2, 3, 12), "L, G, T")
    assert b == {"L": 2, "G": 3, "T": 12}
    assert check_shape("x", torch.zeros(7, 2, 3, 4), "..., H, W, T", {"T": 4}) == {"T": 4, "H": 2, "W": 3}
    assert check_shape("x", torch.zeros(5, 4), ["H", "H, W"], {"H": 5}) == {"H": 5, "W": 4}
    assert check_shape("x", torch.zeros(2, 9, 5), "2, L, min(B, T)") == {"L": 9}  # expressions are not checked
    with pytest.raises(ValueError, match=r"^protected: must have shape \[T\] = \[12\] \(T from scores\), got \[10\]$"):
        check_shape("protected", torch.zeros(10), "T", b, source={"L": "scores", "G": "scores", "T": "scores"})
    with pytest.raises(ValueError, match=r"^x: must have shape \[L, G, T\], got \[3, 12\]$"):
        check_shape("x", torch.zeros(3, 12), "L, G, T")
    with pytest.raises(ValueError, match=r"^x: must have shape \[2, T\], got \[3, 4\]$"):
        check_shape("x", torch.zeros(3, 4), "2, T")
    with pytest.raises(ValueError, match=r"^x: must have shape \[L, L\], got \[3, 4\]$"):
        check_shape("x", torch.zeros(3, 4), "L, L")
    with pytest.raises(ValueError, match=r"^x: must be a tensor of shape \[T\], got list$"):
        check_shape("x", [1, 2], "T")


def test_the_annotations_are_the_contract():
    """Each checked public function checks exactly the shapes its jaxtyping annotations name."""
    for fn, want in SHAPED.items():
        assert annotated_shapes(fn) == want, fn.__qualname__
        assert getattr(fn, "__shapes__", None) == want, f"{fn.__qualname__} is not checked under pytest"
    assert annotated_shapes(mass_table) == {"A_rows": [("...", "H", "W", "T")]}


def _hints(fn):
    return typing.get_type_hints(fn, include_extras=True)


def test_jaxtyping_reads_the_same_shapes():
    """The annotations are jaxtyping's own: its public ``isinstance`` accepts a tensor of the annotated shape and
    dtype and refuses another shape, and inside one ``jaxtyped`` context a dimension binds across arguments."""
    for fn in SHAPED:
        for name in SHAPED[fn]:
            hint = _hints(fn)[name]
            members = [m for m in typing.get_args(hint) or (hint,) if m is not type(None)]
            assert all(issubclass(m, jaxtyping.AbstractArray) for m in members), (fn.__qualname__, name)
    sk = _hints(select_keep)
    assert isinstance(torch.rand(2, 3, 12), sk["scores"]) and not isinstance(torch.rand(3, 12), sk["scores"])
    assert isinstance(torch.zeros(12, dtype=torch.bool), sk["protected"])
    assert not isinstance(torch.zeros(12), sk["protected"])  # a float mask is not the documented bool
    with jaxtyping.jaxtyped("context"):
        assert isinstance(torch.rand(2, 3, 12), sk["scores"])
        assert not isinstance(torch.zeros(10, dtype=torch.bool), sk["protected"])  # T is 12 here
    om = _hints(envelope)["omega"]
    assert isinstance(torch.rand(4), om) and isinstance(torch.rand(4, 3), om) and not isinstance(torch.rand(2, 2, 2), om)
    mt = _hints(mass_table)["A_rows"]
    assert isinstance(torch.rand(3, 4, 2, 9), mt) and isinstance(torch.rand(4, 2, 9), mt)


def test_shaped_refuses_a_function_without_shapes(monkeypatch):
    monkeypatch.setenv(shapes.ENV, "1")

    def f(x: int):
        """No shapes."""

    with pytest.raises(TypeError, match="annotates no shapes"):
        shaped(f)

    def g(x) -> Float[torch.Tensor, " T"]:
        """A shape on the result only: no argument to check."""

    with pytest.raises(TypeError, match="annotates no shapes"):
        shaped(g)


def test_inactive_is_the_function_itself(monkeypatch):
    def f(x: Float[torch.Tensor, " T"]):
        """Identity."""
        return x

    monkeypatch.setenv(shapes.ENV, "0")
    assert not shapes.shapes_active() and shaped(f) is f
    monkeypatch.setenv(shapes.ENV, "1")
    assert shapes.shapes_active() and shaped(f) is not f
    monkeypatch.delenv(shapes.ENV)
    assert shapes.shapes_active()  # pytest is loaded


def test_off_outside_pytest():
    code = ("import sys; from workbench.shapes import shapes_active; "
            "from workbench.rerun.eviction import select_keep; "
            "assert 'pytest' not in sys.modules and not shapes_active(); "
            "assert not hasattr(select_keep, '__shapes__'); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != shapes.ENV})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ----------------------------------------------------------------------------- wrong shapes, clear errors
def test_select_keep_wrong_shapes():
    s = torch.rand(2, 3, 12)
    prot = torch.zeros(12, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^protected: must have shape \[T\] = \[12\] \(T from scores\), got \[10\]"):
        select_keep(s, 4, torch.zeros(10, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^tiebreak: must have shape \[L, G, T\] = \[2, 3, 12\]"):
        select_keep(s, 4, prot, torch.rand(2, 3, 11))
    with pytest.raises(ValueError, match=r"^budgets: must have shape \[L, G\] = \[2, 3\] \(L from scores, G from scores\), got \[3, 2\]"):
        select_keep(s, 4, prot, None, torch.full((3, 2), 4))
    with pytest.raises(ValueError, match=r"^scores: must have shape \[L, G, T\], got \[3, 12\]"):
        select_keep(torch.rand(3, 12), 4, prot)


def test_pool_envelope_audit_mass_table_wrong_shapes():
    A = torch.softmax(torch.randn(2, 4, 3, 10), -1)
    with pytest.raises(ValueError, match=r"^head_group: must have shape \[H_Q\] = \[4\] \(H_Q from A_obs\), got \[3\]"):
        HeadPooling().pool(A, torch.tensor([0, 0, 1]), 1)
    rows = A[0]
    mu = torch.full((10,), 0.1, dtype=torch.float64)
    rem = torch.zeros(10, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^removed: must have shape \[T\] = \[10\] \(T from A_rows\), got \[9\]"):
        envelope(rows, mu, torch.full((4,), 0.25), torch.zeros(9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^omega: must have shape \[H_Q\] = \[4\] or \[H_Q, W\] = \[4, 3\]"):
        envelope(rows, mu, torch.full((3,), 0.25), rem)
    with pytest.raises(ValueError, match=r"^values: must have shape \[T, d\] = \[10, d\] \(T from a\), got \[9, 2\]"):
        output_shift(rows[0, 0], torch.zeros(9, 2), rem)
    with pytest.raises(ValueError, match=r"^removed: must have shape \[T\] = \[10\] \(T from A_audit\)"):
        audit_bounds(A[0], torch.zeros(8, dtype=torch.bool))
    sp = PromptSpans.synthetic([3, 3, 3])
    with pytest.raises(ValueError, match=r"^A_rows: must have shape \[\.\.\., H, W, T\]"):
        mass_table(torch.zeros(sp.T), sp)


@dataclass(frozen=True)
class _BadScores(EvictionPolicy):
    name: ClassVar[str] = "bad-scores"
    n_sink: int = 0
    recent: int = 0

    def scores(self, ev):
        return torch.zeros(ev.L, ev.T)  # forgot the group axis


def test_preview_names_a_policy_whose_scores_have_the_wrong_shape():
    ev = Evidence(T=12, L=2, head_group=torch.tensor([0, 0, 1, 1]), tail=torch.softmax(torch.randn(2, 4, 3, 12), -1))
    assert preview(SnapKV(n_sink=1, recent=2, window=3), ev, 6).shape == (2, 2, 6)
    with pytest.raises(ValueError, match=r"^bad-scores\.scores: must have shape \[L, G, T\] = \[2, 2, 12\] "
                                         r"\(L from evidence, G from evidence, T from evidence\), got \[2, 12\]"):
        preview(_BadScores(), ev, 6)
