"""Capture against eager ``output_attentions`` as the oracle, on the real default model."""
from __future__ import annotations

import torch

from workbench.capture import RowSet, capture_attention, run_capture
from workbench.run import adapter

TOL = 1e-5


def _eager_rows(model, ids):
    out = adapter.eager_attentions(model, ids)
    return torch.stack([a[0].float() for a in out.attentions])  # [L, H, T, T]


def test_prefill_and_decode_rows_equal_eager(smollm, smollm_capture, example_prompt):
    cap = smollm_capture
    T = example_prompt.T
    assert cap.attn.shape[:2] == (30, 9) and cap.attn.shape[-1] == T + 3
    assert len(cap.generated_ids) == 3
    full = torch.tensor([list(example_prompt.spans.input_ids) + cap.generated_ids])
    A = _eager_rows(smollm.model, full)  # rows of the prompt and of decode steps 1..3 in one pass
    ref = A[:, :, cap.row_pos, :]
    err = (ref - cap.attn).abs().max().item()
    assert err <= TOL, err
    dec = cap.rows_of("decode")
    assert cap.row_pos[dec].tolist() == [T, T + 1, T + 2]
    assert (ref[:, :, dec] - cap.attn[:, :, dec]).abs().max().item() <= TOL
    # every row is a probability vector over its causal keys
    sums = cap.attn.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    for i, u in enumerate(cap.row_pos.tolist()):
        assert cap.attn[:, :, i, u + 1:].abs().sum().item() == 0.0


def test_decode_ids_are_the_greedy_tokens(smollm, smollm_capture, example_prompt):
    g = smollm.model.generate(example_prompt.input_ids, max_new_tokens=3, do_sample=False)
    assert g[0, example_prompt.T:].tolist() == smollm_capture.generated_ids


def test_logits_unchanged_by_capture(smollm, example_prompt):
    model, ids = smollm.model, example_prompt.input_ids
    with torch.no_grad():
        plain = model(ids).logits
        with capture_attention(model, list(example_prompt.spans.observers), K=ids.shape[1], T=ids.shape[1]) as rec:
            captured = model(ids).logits
    assert torch.equal(plain, captured)
    assert rec.attn.abs().sum() > 0
    assert adapter.current_attn_implementation(model) == "sdpa"


def test_value_norms_and_hidden_states(smollm, smollm_capture, example_prompt):
    cap, T = smollm_capture, example_prompt.T
    shape = smollm.shape
    # max value norm per layer and KV head, recomputed from the model's own v_proj at layer 0
    h0 = cap.hidden[0]
    assert h0.shape == (T, shape.hidden)
    layer0 = smollm.model.model.layers[0]
    with torch.no_grad():
        v = layer0.self_attn.v_proj(layer0.input_layernorm(h0)).view(T, shape.G, shape.d)
    ref = v.norm(dim=-1).amax(dim=0)
    assert torch.allclose(cap.vnorm_max[0], ref, rtol=1e-5, atol=1e-5)
    assert (cap.vnorm_max > 0).all()
    assert set(cap.hidden) == {0, 10, 30} and cap.hidden[30].shape == (T, shape.hidden)
    with torch.no_grad():
        out = smollm.model(example_prompt.input_ids, output_hidden_states=True)
    assert torch.allclose(cap.hidden[10], out.hidden_states[10][0], atol=1e-5)


def test_restores_implementation_after_error(smollm, example_prompt):
    model = smollm.model
    try:
        with capture_attention(model, [0], K=4, T=4):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert adapter.current_attn_implementation(model) == "sdpa"
    layers = adapter.decoder_layers(model)
    assert all(len(l._forward_pre_hooks) == 0 for l in layers)


def test_capture_memory_is_rows_not_t_by_t(smollm, example_prompt):
    cap = run_capture(smollm, example_prompt, RowSet(audit=None, tail=0), progress=False)
    L, H, R, K = cap.attn.shape
    assert (R, K) == (example_prompt.spans.W_p, example_prompt.T)
