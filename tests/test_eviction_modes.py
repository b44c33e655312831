"""Key re-rotation after compaction, and question-agnostic eviction (context compressed once, several
questions answered from the same cache, reset after each)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.rerun.eviction import (
    AdaKV,
    DeferKV,
    EvictionSession,
    FullCache,
    Needs,
    SnapKV,
    StreamingLLM,
    run_policies,
    run_question_agnostic,
    split_question,
)
from workbench.run import adapter
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

SMALL = dict(n_sink=2, recent=4)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", G=2, H_Q=4, L=3, seed=11)


@pytest.fixture(scope="module")
def session(model):
    spans = PromptSpans.synthetic([10, 12, 9], query_len=8)
    return EvictionSession.prepare(model, spans, Needs(tail=8), 5, reusable=True, progress=False)


def test_rerotated_keys_sit_at_their_new_positions(model, session):
    """Layer 0's keys depend only on the token and its position: after re-rotation the kept keys equal a
    fresh prefill of the kept tokens at positions 0 … S'-1."""
    pol = StreamingLLM(**SMALL)
    B = 20
    st = session.evict(pol, B, rerotate=True)
    kept = st.kept[0, 0]
    assert torch.equal(st.kept[0], kept.expand_as(st.kept[0]))  # StreamingLLM: the same positions in every head
    fresh = adapter.new_cache(model)
    adapter.forward(model, torch.tensor([[session.ids[int(p)] for p in kept]]), cache=fresh, logits_to_keep=1)
    k_new, _ = adapter.cache_kv(st.cache, 0)
    k_ref, _ = adapter.cache_kv(fresh, 0)
    assert torch.allclose(k_new, k_ref, atol=1e-5)
    k_orig, _ = adapter.cache_kv(session.evict(pol, B).cache, 0)
    assert not torch.allclose(k_orig, k_ref, atol=1e-3), "the original positions differ (else the test is vacuous)"


def test_rerotation_decodes_at_the_compacted_length(session):
    T = session.T
    r = session.run(StreamingLLM(**SMALL), T, rerotate=True)  # nothing evicted: nothing turned, same tokens
    assert r.ids == session.run(FullCache(), T).ids and not r.rerotated
    a = session.run(SnapKV(**SMALL, window=8), 20, rerotate=True)
    b = session.run(SnapKV(**SMALL, window=8), 20)
    assert a.rerotated and torch.equal(a.kept, b.kept)
    with pytest.raises(ValueError, match="rerotate"):
        session.run(AdaKV(base=SnapKV(**SMALL, window=8)), 20, rerotate=True)


def _prompts(query_len=(6, 7, 5)):
    """Three prompts with the same documents and different queries (synthetic token ids)."""
    base = PromptSpans.synthetic([10, 12, 9], query_len=query_len[0])
    out = []
    for i, q in enumerate(query_len):
        s = PromptSpans.synthetic([10, 12, 9], query_len=q)
        ids = list(base.input_ids[: base.query[0]]) + [(7 * i + j) % 50 + 3 for j in range(s.T - s.query[0])]
        out.append(dataclasses.replace(s, input_ids=tuple(ids)))
    return out


def test_question_agnostic_full_cache_equals_the_whole_prompt(model):
    prompts = _prompts()
    for p in prompts:
        ctx, q = split_question(p)
        assert ctx == list(prompts[0].input_ids[: prompts[0].query[0]]) and len(q) == p.T - p.query[0]
    res = run_question_agnostic(model, prompts, [FullCache()], [10], 4, progress=False)
    for p, r in zip(prompts, res):
        ref = run_policies(model, p, [FullCache()], [10], 4, progress=False)[0]
        assert r.ids == ref.ids  # context prefill + question prefill = one prefill of the whole prompt


def test_question_agnostic_resets_the_cache_after_each_answer(model):
    prompts = _prompts()
    pol = SnapKV(**SMALL, window=8)
    both = run_question_agnostic(model, prompts, [pol], [16], 4, progress=False)
    alone = run_question_agnostic(model, prompts[1:2], [pol], [16], 4, progress=False)
    assert both[1].ids == alone[0].ids and torch.equal(both[1].kept, alone[0].kept)
    T_ctx = prompts[0].query[0]
    assert both[0].T == T_ctx and int(both[0].kept_prompt.max()) < T_ctx
    with pytest.raises(ValueError, match="question"):
        run_question_agnostic(model, prompts, [DeferKV(**SMALL, window=8)], [16], 4, progress=False)
    with pytest.raises(ValueError, match="context"):
        run_question_agnostic(model, [prompts[0], PromptSpans.synthetic([9, 12, 9], query_len=6)], [pol], [16], 4,
                              progress=False)
