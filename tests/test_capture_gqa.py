"""Capture on tiny random-weight models (no download): Llama, Qwen2, Qwen3, Mistral, Gemma3."""
from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import repeat_kv

from workbench.capture import RowSet, run_capture
from workbench.run import adapter
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

CASES = [(mt, G) for mt in ("llama", "qwen2", "qwen3", "mistral", "gemma3") for G in (2, 4)]


@pytest.mark.parametrize("model_type,G", CASES)
def test_rows_match_eager(model_type, G):
    model = tiny_model(model_type, G=G, H_Q=4, L=3, seed=G)
    spans = PromptSpans.synthetic([5, 6, 7], query_len=6)  # T = 33 > gemma3's sliding window 8
    cap = run_capture(model, spans, RowSet(n_decode=3, tail=5), progress=False)
    full = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    out = adapter.eager_attentions(model, full)
    A = torch.stack([a[0] for a in out.attentions])
    ref = A[:, :, cap.row_pos, : cap.attn.shape[-1]]
    assert (ref - cap.attn).abs().max().item() <= 1e-5
    assert cap.attn.shape == (3, 4, spans.W_p + 6 + 5 + 3, spans.T + 3)


@pytest.mark.parametrize("G", [1, 2, 4])
def test_head_group_matches_repeat_kv(G):
    model = tiny_model("llama", G=G, H_Q=4, L=1)
    shape = adapter.model_shape(model)
    key = torch.randn(1, G, 5, 16)
    rep = repeat_kv(key, shape.H_Q // G)
    for h, g in enumerate(shape.head_group().tolist()):
        assert torch.equal(rep[0, h], key[0, g])


def test_gemma3_sliding_window_rows_are_local():
    model = tiny_model("gemma3", G=2, H_Q=4, L=2)  # layer 0 slides over 8 keys
    spans = PromptSpans.synthetic([10, 10], query_len=6)
    cap = run_capture(model, spans, RowSet(tail=2), progress=False)
    u = int(cap.row_pos[-1])
    row0 = cap.attn[0, :, -1]
    assert row0[:, : u - 7].abs().max().item() == 0.0  # outside the window
    assert cap.attn[1, :, -1, : u - 7].sum().item() > 0  # the full-attention layer sees them


def test_bad_row_positions_raise():
    spans = PromptSpans.synthetic([3], query_len=4)
    with pytest.raises(ValueError, match="custom"):
        RowSet(custom=(spans.T,)).rows(spans)
    with pytest.raises(ValueError, match="tail"):
        RowSet(tail=-1)
    with pytest.raises(ValueError, match="n_decode"):
        RowSet(n_decode=-2)
