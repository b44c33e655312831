"""A click on a document token makes that token's own row the query row: captured on demand (one prefill with
that row alone) when the capture does not hold it, equal to the token's row of the model's eager attention (the
oracle); with no model that made the capture, the nearest captured row, and the status says so."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.run import adapter
from workbench.run.models import LoadedModel, tiny_model
from workbench.show.widgets import CaptureState, TokenPanel


def test_a_clicked_token_gets_its_own_row_equal_to_the_eager_oracle(tiny):
    lm, spans, cap = tiny
    p = 3  # a prefix token: no captured row (observers, the query, a 16-row tail and decode steps)
    assert p not in cap.row_pos.tolist()
    panel = TokenPanel(CaptureState(cap, spans, model=lm), layer=1)
    assert panel.click(p) == ("token", p) and panel.controls["query"].value == ("token", p)
    ref = torch.stack([a[0] for a in adapter.eager_attentions(lm.model, torch.tensor([spans.input_ids])).attentions])
    row = panel.on_demand[p].attn[:, :, 0, : spans.T]
    assert (row - ref[:, :, p, :]).abs().max().item() <= 1e-5
    assert row[..., p + 1:].abs().max().item() == 0 and row[..., : p + 1].sum(-1).sub(1).abs().max().item() < 1e-5
    view = panel.figures["tokens"].view
    assert view.meta["query_pos"] == p
    drawn = dict(zip(np.asarray(view.positions).tolist(), np.asarray(view.values, dtype=float)))
    np.testing.assert_allclose([drawn[j] for j in range(p + 1)], ref[1, 0, p, : p + 1].numpy(), atol=1e-5)
    assert "token @ 3 (captured on demand)" in panel.status.value
    # a second click on it re-uses its row; a token with a captured row selects that row, no capture
    panel.click(p)
    assert len(panel.on_demand) == 1
    q = int(cap.row_pos[cap.row_kind.index("tail")])
    assert panel.click(q) == cap.row_kind.index("tail") and len(panel.on_demand) == 1
    with pytest.raises(ValueError, match=r"^position: must be a prompt position in \[0, "):
        panel.click(spans.T)


def test_without_the_capturing_model_the_nearest_row_is_said(tiny):
    lm, spans, cap = tiny
    p = 3
    other = LoadedModel(model=tiny_model("llama", L=3, H_Q=4, G=2, seed=7, vocab=256), tokenizer=None,
                        model_id="another tiny llama", device=torch.device("cpu"), dtype=torch.float32)
    for panel, why in ((TokenPanel(cap, layer=1), "no model in this panel"),
                       (TokenPanel(cap, layer=1, model=other), "did not make this capture")):
        r = panel.click(p)
        assert isinstance(r, int) and not panel.on_demand
        assert int(cap.row_pos[r]) == int(cap.row_pos[np.argmin(np.abs(cap.row_pos.numpy() - p))])
        assert "token 3 has no captured row" in panel.status.value and why in panel.status.value
