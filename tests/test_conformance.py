"""Conformance matrix: one row per architecture family, on tiny random-weight models built from configs.

Every supported row checks, with a prompt (T = 41) longer than the sliding window (8) where the family has
one: captured rows (prompt tail and decode steps 1–3) equal the model's own eager ``output_attentions``;
logits are bit-identical with capture on and off; ``E = ∅`` equals the full run; ``l* = -1`` equals its
reference (:func:`run_full` on ``R`` with original positions) with the window binding; every policy at
``B ≥ T`` equals the full cache; at ``B < T`` the KV bytes fall on every layer kind. A refused family's row
is its refusal. Runs under the transformers floor (5.2) and the current version alike.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from workbench.capture import RowSet, capture_attention, run_capture
from workbench.rerun.eviction import default_policies, run_policies
from workbench.rerun.prune import run_full, run_pruned
from workbench.run import adapter, families
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

TOL = 1e-5
WINDOWED = {"mistral", "mixtral", "gemma2", "gemma3", "phi3", "starcoder2", "gpt_oss"}
EAGER = {"gemma2", "gpt_oss"}  # transformers runs these exactly only on eager
SUPPORTED = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
             "phi3", "olmo2", "cohere", "granite", "starcoder2", "gpt_neox", "gpt_oss"]
REFUSED = ["gpt2", "falcon"]


def _spans() -> PromptSpans:
    return PromptSpans.synthetic([5, 6, 7, 4], query_len=6)  # T = 41


def _model(family: str, impl: str | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model(family, L=3, H_Q=4, G=2, d=16, seed=1,
                       attn_implementation=impl or ("eager" if family in EAGER else "sdpa"))
    if family == "gemma2":  # large attention logits, so that soft-capping (5.0) binds
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "q_proj" in name or "k_proj" in name:
                    p.mul_(20)
    return m


def test_matrix_is_the_family_table():
    assert sorted(families.supported_families()) == sorted(
        {"gemma3": "gemma3_text"}.get(f, f) for f in SUPPORTED)
    assert set(REFUSED) <= set(families.REFUSED)


@pytest.mark.parametrize("family", REFUSED)
def test_refused_family(family):
    m = _model(family, "eager")
    with pytest.raises(TypeError, match=f"{family}.*not supported.*Supported families: llama"):
        adapter.check_supported(m)
    with pytest.raises(TypeError, match="Supported families"):  # at capture too (a model built by hand)
        with capture_attention(m, [0], K=1, T=1):
            pass


@pytest.mark.parametrize("family", SUPPORTED)
def test_conformance(family):
    m = _model(family)
    spans = _spans()
    T = spans.T
    window = families.layer_window(m, 0)
    if family in WINDOWED:
        assert window is not None and window < T and families.sliding_layers(m)
    # 1. captured rows = the model's own eager output_attentions (prompt tail + decode steps 1..3)
    cap = run_capture(m, spans, RowSet(tail=T, n_decode=3), progress=False)
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    ref = torch.stack([a[0] for a in adapter.eager_attentions(m, ids).attentions])  # [L, H, K, K]
    ref_rows = ref[:, :, cap.row_pos, : T + 3]
    assert (cap.attn - ref_rows).abs().max().item() <= TOL
    assert "decode" in cap.row_kind
    if family == "gpt_oss":  # learned sinks: rows sum to < 1 as the model computes them; the rest is the sink's
        sums = ref_rows.sum(-1)
        assert sums.max().item() < 1 - 1e-3
        assert (cap.learned_sink - (1 - sums)).abs().max().item() <= TOL
    else:
        assert cap.learned_sink is None
    # 2. logits bit-identical with capture on and off
    x = torch.tensor([list(spans.input_ids)])
    with torch.no_grad():
        off = m(x).logits
        with capture_attention(m, [T - 1], K=T, T=T):
            on = m(x).logits
    assert torch.equal(on, off)
    # 3. E = ∅ equals full; l* = -1 equals its reference with the window binding; a mid removal decodes
    full = run_full(m, spans, max_new_tokens=4)
    e0 = run_pruned(m, spans, layer=1, removed=[], max_new_tokens=4, progress=False)
    assert (e0.first_logits - full.first_logits).abs().max().item() <= TOL and e0.generated_ids == full.generated_ids
    removed = [1, 3]
    R = spans.retained_positions(removed)
    a = run_pruned(m, spans, layer=-1, removed=removed, max_new_tokens=4, progress=False)
    b = run_full(m, spans, positions=R, max_new_tokens=4)
    assert (a.first_logits - b.first_logits).abs().max().item() <= TOL and a.generated_ids == b.generated_ids
    c = run_pruned(m, spans, layer=1, removed=removed, max_new_tokens=4, progress=False)
    assert len(c.generated_ids) == 4 and c.T_prime == len(R)
    # 4. every policy at B >= T equals the full cache; 5. at B < T the KV bytes fall on every layer kind
    pols = default_policies(n_sink=2, recent=2)
    res = run_policies(m, spans, pols, [T, 4], 4, progress=False)
    for r in res:
        if r.budget >= T or r.policy == "full":
            assert r.ids == full.generated_ids, (r.policy, r.budget)
            assert r.kv_bytes_after == r.kv_bytes_before
        else:
            assert not r.not_compacted
            assert all(a_ < b_ for a_, b_ in zip(r.kv_layer_bytes_after, r.kv_layer_bytes_before)), r.policy
            assert all(k.shape[-1] <= 4 + r.evicted_at for k in r.kept_layers)
