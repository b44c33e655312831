"""The answer-divergence figure: its data in the CSV and its parameters in the sidecar, and the paper rules (plot
≥ 55 %, legend ≤ 25 %, no text < 7 pt, no overlap) in the exported SVG at one and two columns, one run and A/B."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _all_figures import divergences
from _layout_rules import layout_problems, whole_axes
from test_figure_layout import CHROMIUM, FONTS_JS, boxes, paper_rule_misses

from workbench.show import export as ex
from workbench.show import plots


def test_csv_holds_the_numbers_and_the_sidecar_the_parameters(tmp_path):
    a, b = divergences()
    fig = plots.answer_divergence(a, b, model_id="m")
    ex.export(fig, tmp_path / "div", width="single", formats=("svg",))
    df = pd.read_csv(tmp_path / "div.csv")
    for d, side in ((a, "A"), (b, "B")):
        rows = df[df["name"].str.startswith("KL") & (df["setting"] == f"{side}: {d.label}")].sort_values("x")
        np.testing.assert_allclose(rows["y"].to_numpy(), d.kl, rtol=1e-9)
        assert rows["parted"].tolist() == d.parted.tolist() and rows["token"].iloc[0] == "·The"
        np.testing.assert_allclose(df[(df["name"] == "Δ margin") & (df["setting"] == f"{side}: {d.label}")]["y"],
                                   d.dmargin, rtol=1e-9)
    part = df[df["name"] == "first parting token"]
    assert part["x"].tolist() == [5, b.first_divergence] and part["token"].tolist()[0] == "·was"
    meta = json.loads((tmp_path / "div.json").read_text())
    text = json.dumps(meta)
    assert "answer_divergence" in text and f'"first_divergence": [5, {b.first_divergence}]' in text


def test_refuses_other_answers():
    a, b = divergences()
    with pytest.raises(ValueError, match="a: must be an AnswerDivergence"):
        plots.answer_divergence(a.to_frame())
    with pytest.raises(ValueError, match="b: must be the divergence on the same full-cache answer"):
        plots.answer_divergence(a, replace(b, ids=tuple(reversed(b.ids))))


@pytest.mark.skipif(not Path(CHROMIUM).exists() or ex.browser_path() is None, reason="no Debian chromium")
@pytest.mark.parametrize("width", ["single", "double"])
def test_paper_rules_at_export_width(tmp_path, width):
    sync_api = pytest.importorskip("playwright.sync_api")
    a, b = divergences()
    figs = {"one": plots.answer_divergence(a), "compare": plots.answer_divergence(a, b)}
    ex.ensure_server()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True)
        try:
            page = browser.new_page()
            for name, fig in figs.items():
                ex.export(fig, tmp_path / name, width=width, formats=("svg",), csv=False, sidecar=False)
                d = boxes(page, tmp_path / f"{name}.svg")
                d["whole"] = whole_axes(fig.to_dict())
                assert d["plots"] and len(d["texts"]) >= 3
                assert layout_problems(d) == [], (name, layout_problems(d))
                assert paper_rule_misses(d, page.evaluate(FONTS_JS)) == (), name
        finally:
            browser.close()
