"""The model chosen in the lab from the prompt panel: a saved tiny model folder is loaded, the panel's prompt is
captured on it and every panel following the shared state switches to it; a model that cannot be loaded is said in
the panel, naming the field, and changes nothing."""
from __future__ import annotations

import pytest
import torch

from workbench.capture import RowSet, run_capture
from workbench.run.models import load_model, tiny_model
from workbench.show.widgets import CaptureState, HeadsPanel, PriorityPanel, TokenPanel
from workbench.study.prompt_panel import PromptPanel

DOCS = ["The lighthouse keeper Marla Quint paints the tower red every spring.",
        "Ferries to the island leave twice a day from the north pier."]
QUESTION = "Who paints the lighthouse tower?"


@pytest.fixture()
def folder(smollm, tmp_path):
    d = tmp_path / "tiny-llama"
    tiny_model("llama", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16, seed=3).save_pretrained(str(d))
    smollm.tokenizer.save_pretrained(str(d))
    return d


def test_a_saved_model_folder_is_loaded_and_every_panel_follows(smollm, smollm_capture, folder):
    state = CaptureState(smollm_capture)
    heads, prio, tokens = HeadsPanel(state), PriorityPanel(state), TokenPanel(state)
    panel = PromptPanel(smollm, state, documents=DOCS, question=QUESTION, tail=8, n_decode=1)
    panel.model.value = str(folder)
    panel.load_button.click()
    assert panel.error is None, panel.error
    cap = state.capture
    assert cap is panel.capture and cap.model_id.startswith(str(folder)) and panel.lm is not smollm
    assert cap.L == 2 and cap.attn.shape[:2] == (2, 4)                  # the tiny model's layers and heads
    assert heads.capture is cap and prio.capture is cap and tokens.capture is cap and heads.controls["layer"].max == 1
    assert str(folder) in panel.status.value and "shown in 3 of 3 panels" in panel.status.value
    # the rows are the folder's model's own: an independent load and capture of the same prompt
    ref = run_capture(load_model(str(folder), device="cpu", progress=False), panel.prompt, RowSet(tail=8, n_decode=1),
                      progress=False)
    assert torch.equal(ref.attn, cap.attn) and ref.spans.T == cap.T
    # a clicked token's own row is captured on the chosen model (the state's)
    assert state.model is panel.lm and tokens.click(1) == ("token", 1)
    assert tokens.on_demand[1].model_id == cap.model_id and tokens.on_demand[1].attn.shape[:2] == (2, 4)
    # the next build captures on the chosen model too
    panel.set_documents(DOCS[:1], QUESTION)
    assert panel.build().L == 2


@pytest.mark.parametrize("spec, message", [("", r"^model: name a model folder"),
                                           ("/nonexistent/model-folder", r"^model: /nonexistent/model-folder cannot be used")])
def test_a_model_that_cannot_be_loaded_is_said_and_changes_nothing(smollm, smollm_capture, spec, message):
    state = CaptureState(smollm_capture)
    heads = HeadsPanel(state)
    panel = PromptPanel(smollm, state, documents=DOCS, question=QUESTION, tail=8, n_decode=1)
    panel.model.value = spec
    panel.load_button.click()
    assert panel.error is not None and __import__("re").search(message, panel.error), panel.error
    assert "D55E00" in panel.status.value and state.capture is smollm_capture and heads.capture is smollm_capture
    assert panel.lm is smollm and state.version == 1 and not panel.load_button.disabled
