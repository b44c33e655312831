"""The shallow-certificate counterexample of paper §6.1 (``workbench.analyse.counterexample``): its numbers
against closed forms computed here by hand, its figures' data against the result, and its panel."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from workbench.analyse.counterexample import ShallowCounterexample, deletion_sweep
from workbench.show import plots
from workbench.show import widgets as Wd


def softmax_last(q_score: float, T: int, j: int) -> np.ndarray:
    """By hand: a row of T keys where key j scores q_score and every other key 0."""
    e = np.ones(T)
    e[j] = math.exp(q_score)
    return e / e.sum()


@pytest.mark.parametrize("eps,gamma", [(1e-3, 0.05), (0.3, 0.5), (1e-9, 0.001), (0.9, 0.9)])
def test_closed_forms(eps, gamma):
    ce = ShallowCounterexample(eps=eps, gamma=gamma, V=1.5, beta=0.2)
    T, j = ce.T, ce.j_star
    res = ce()
    # the shallow row puts exactly ε on j*, the rest spread evenly; A's and B's are the same
    hand = np.full(T, (1 - eps) / (T - 1))
    hand[j] = eps
    assert np.allclose(res.shallow.numpy(), hand, rtol=1e-12, atol=1e-15)
    assert np.allclose(res.shallow.numpy(), softmax_last(math.log(eps * (T - 1) / (1 - eps)), T, j), rtol=1e-12)
    assert torch.equal(res.shallow, res.shallow_b) and res.retained_equal
    # the deep head reads j* with 1 − γ: output ±(1 − γ)V in full, 0 without j* (the other keys carry c = 0)
    assert float(res.deep[j]) == pytest.approx(1 - gamma, rel=1e-12)
    assert float(res.deep.sum()) == pytest.approx(1.0, abs=1e-12)
    for p, sign in (("A", 1), ("B", -1)):
        z_full, z_red = res.logits[p, "full"].numpy(), res.logits[p, "reduced"].numpy()
        assert z_full == pytest.approx([sign * (1 - gamma) * 1.5, -sign * (1 - gamma) * 1.5 + 0.2], abs=1e-12)
        assert z_red == pytest.approx([0.0, 0.2], abs=1e-12)
    assert res.errors == pytest.approx(((1 - gamma) * 1.5,) * 2, abs=1e-12) and res.bound == pytest.approx((1 - gamma) * 1.5)
    # the exact audit of E = {j*} on the one shallow row: bound ε, passes iff ε ≤ ε_audit = 0.01
    assert float(res.audit.bound[0]) == pytest.approx(eps, rel=1e-12) and res.audit.passed == (eps <= 0.01)
    first = res.first_tokens()
    assert first["A", "full"] == (0 if (1 - gamma) * 1.5 > -(1 - gamma) * 1.5 + 0.2 else 1)
    assert first["A", "reduced"] == first["B", "reduced"] == 1   # 0 < β: the second logit wins without j*
    df = res.to_frame()
    assert df.prompt.tolist() == ["A (c = +V)", "A (c = +V)", "B (c = −V)", "B (c = −V)"]
    assert df.run.tolist() == ["full", "reduced"] * 2
    assert df.deep_mass_on_j.tolist() == pytest.approx([1 - gamma, 0, 1 - gamma, 0], abs=1e-12)
    assert (df.o == df.z0).all() and df.first_token.tolist() == [first[k] for k in res.logits]


def test_the_construction_s_inputs():
    ce = ShallowCounterexample()
    A, B = ce.prompt("A"), ce.prompt("B")
    assert A.shape == (ce.T, ce.D) and A.dtype == torch.float64
    diff = (A != B).nonzero().tolist()
    assert diff == [[ce.j_star, ce.C]] and float(A[ce.j_star, ce.C]) == ce.V == -float(B[ce.j_star, ce.C])
    assert ce.retained.tolist() == [j for j in range(ce.T) if j != ce.j_star]
    assert ce.removed.nonzero().flatten().tolist() == [ce.j_star]
    w = ce.weights()   # the shallow maps never read c; the deep value reads only c
    assert float(w["WQ1"][ce.C].abs().sum() + w["WK1"][ce.C].abs().sum()) == 0
    assert w["WV2"].nonzero().tolist() == [[ce.C, 0]]
    with pytest.raises(ValueError, match=r"^name: must be one of \['A', 'B'\], got 'C'"):
        ce.prompt("C")


@pytest.mark.parametrize("kw,name", [({"eps": 0.0}, "eps"), ({"eps": 1.0}, "eps"), ({"gamma": 1.0}, "gamma"),
                                     ({"V": 0.0}, "V"), ({"beta": -1.0}, "beta"), ({"eps_audit": 0.0}, "eps_audit")])
def test_bad_parameters_name_themselves(kw, name):
    with pytest.raises(ValueError, match=f"^{name}: must be "):
        ShallowCounterexample(**kw)


def test_deletion_sweep():
    sw = deletion_sweep([1e-2, 1e-6], [0.3, 0.001], V=3.0, beta=0.5)
    assert sw.attrs == {"V": 3.0, "beta": 0.5} and len(sw) == 4
    assert sw.gamma.tolist() == [0.3, 0.3, 0.001, 0.001] and sw.eps.tolist() == [1e-2, 1e-6] * 2
    assert np.allclose(sw.shallow_mass, sw.eps, rtol=1e-9)
    assert np.allclose(sw.error, (1 - sw.gamma) * 3.0, atol=1e-12) and np.allclose(sw.bound, (1 - sw.gamma) * 3.0)
    with pytest.raises(ValueError, match="^eps: must be in"):
        deletion_sweep([0.0], [0.1])
    with pytest.raises(ValueError, match="^eps, gammas: must be non-empty"):
        deletion_sweep([], [0.1])


# ----------------------------------------------------------------------------- figures
def _meta(fig, name):
    meta = fig.layout.meta
    assert meta["figure"] == name and "model_id" in meta
    json.dumps(meta, allow_nan=False)
    return meta


def test_figures_show_the_result():
    res = ShallowCounterexample(eps=1e-4, gamma=0.2)()
    fig = plots.counterexample_rows(res)
    assert [t.name for t in fig.data] == ["shallow layer", "deep head"] and fig.layout.yaxis.type == "log"
    assert list(fig.data[0].x) == list(range(8))
    assert np.array_equal(fig.data[0].y, res.shallow.numpy()) and np.array_equal(fig.data[1].y, res.deep.numpy())
    meta = _meta(fig, "counterexample_rows")
    assert (meta["eps"], meta["gamma"], meta["V"], meta["j_star"]) == (1e-4, 0.2, 2.0, 3)
    fig = plots.counterexample_logits(res)
    df = res.to_frame()
    assert list(fig.data[0].x) == [f"{p[0]} · {r}" for p, r in zip(df.prompt, df.run)]
    assert np.array_equal(fig.data[0].y, df.z0.to_numpy()) and np.array_equal(fig.data[1].y, df.z1.to_numpy())
    meta = _meta(fig, "counterexample_logits")
    assert meta["errors"] == pytest.approx([1.6, 1.6]) and meta["first_tokens"]["A reduced"] == 1
    sw = deletion_sweep([1e-1, 1e-3, 1e-5], [0.3, 0.05])
    fig = plots.counterexample_errors(sw)
    by = {t.name: t for t in fig.data}
    for g in (0.3, 0.05):
        tr = by[f"deletion error, γ = {g:g}"]
        sub = sw[sw.gamma == g].sort_values("eps")
        assert np.array_equal(tr.x, sub.eps.to_numpy()) and np.array_equal(tr.y, sub.error.to_numpy())
    assert np.allclose(by["shallow mass on j*"].y, [1e-5, 1e-3, 1e-1], rtol=1e-9)
    assert list(by["V = 2"].y) == [2.0, 2.0]
    meta = _meta(fig, "counterexample_errors")
    assert meta["gammas"] == [0.3, 0.05] and meta["V"] == 2.0 and meta["eps"] == [1e-5, 1e-3, 1e-1]
    for f in (plots.counterexample_rows, plots.counterexample_logits):
        with pytest.raises(ValueError, match="^result: must be a CounterexampleResult"):
            f(sw)
    with pytest.raises(ValueError, match="^sweep: must be a frame with columns"):
        plots.counterexample_errors(res.to_frame())


@pytest.mark.slow
def test_figures_export_with_their_sidecar(tmp_path):
    from workbench.show import export as ex

    if ex.browser_path() is None:
        pytest.skip("no Chromium for kaleido")
    res = ShallowCounterexample()()
    paths = ex.export(plots.counterexample_logits(res), tmp_path / "logits", formats=("pdf", "svg", "png"))
    assert sorted(p.name for p in paths) == ["logits.csv", "logits.json", "logits.pdf", "logits.png", "logits.svg"]
    side = json.loads((tmp_path / "logits.json").read_text())
    assert side["figure"] == "counterexample_logits" and side["meta"]["eps"] == 1e-3 and side["meta"]["j_star"] == 3


# ----------------------------------------------------------------------------- the panel
def test_panel_follows_its_sliders():
    panel = Wd.CounterexamplePanel(ShallowCounterexample(eps=1e-3, gamma=0.05))
    assert set(panel.figures) == {"rows", "logits"} and panel.params() == {"eps": pytest.approx(1e-3), "gamma": 0.05}
    assert "the audit (ε_audit = 0.01) passes" in panel.status.value and "A 1.9000, B 1.9000" in panel.status.value
    panel.controls["eps"].value = 1e-1   # the user's path: the slider's observer
    assert float(panel.figures["rows"].data[0].y[3]) == pytest.approx(0.1, rel=1e-12)
    assert "fails" in panel.status.value and "1.00e-01" in panel.status.value
    assert list(panel.figures["logits"].data[0].y) == pytest.approx([1.9, 0.0, -1.9, 0.0], abs=1e-12)  # not with ε
    panel.set(gamma=0.3)
    res = ShallowCounterexample(eps=panel.controls["eps"].value, gamma=0.3)()
    assert np.allclose(panel.figures["rows"].data[1].y, res.deep.numpy(), rtol=1e-12)
    assert list(panel.figures["logits"].data[0].y) == pytest.approx([1.4, 0.0, -1.4, 0.0], abs=1e-12)
    assert "(1 − γ)V = 1.4000" in panel.status.value and panel.figures["logits"].layout.meta["gamma"] == 0.3
    with pytest.raises(ValueError, match="^construction: must be a ShallowCounterexample"):
        Wd.CounterexamplePanel("x")


@pytest.mark.slow
def test_panel_export_button_writes_every_figure(tmp_path):
    from workbench.show import export as ex

    if ex.browser_path() is None:
        pytest.skip("no Chromium for kaleido")
    panel = Wd.CounterexamplePanel()
    paths = panel.export_clicked(tmp_path / "out")
    for name in ("rows", "logits"):
        for ext in (".pdf", ".svg", ".png", ".json", ".csv"):
            assert (tmp_path / "out" / f"{name}{ext}").exists(), (name, ext)
    side = json.loads((tmp_path / "out" / "rows.json").read_text())
    assert side["params"]["panel"] == "CounterexamplePanel" and side["params"]["eps"] == pytest.approx(1e-3)
    assert len(paths) >= 10 and "files in" in panel.export_links.value
