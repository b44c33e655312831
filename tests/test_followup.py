"""The follow-up-question protocol (one eviction, two questions on the same context) against oracles written here:
a plain full-context two-turn greedy generation (no cache, the whole sequence recomputed every step) and one eager
forward over the whole conversation with a mask built here (rows after the eviction see only the policy's kept
prompt positions and what came after)."""
from __future__ import annotations

import pytest
import torch
from _oracle import eager_llama, four_passages, greedy_no_cache, oracle_logits_with

from workbench.rerun.eviction import DeferKV, FullCache, SnapKV
from workbench.rerun.eviction.followup import answer_body, chat_next_turn, run_followup
from workbench.run import adapter
from workbench.run.generate import stop_token_ids

N_NEW = 6
TURN2 = [5, 17, 33, 9, 41, 2, 60]  # the tiny model has no tokenizer: turn 2 is fixed ids


@pytest.fixture(scope="module")
def model():
    return eager_llama(seed=11)


@pytest.fixture(scope="module")
def spans():
    return four_passages()




def _masked_logits(m, ids, kept, gen_from):
    """One eager forward over ``ids`` at positions ``0 … N-1``: causal, and every row ``u ≥ gen_from`` of layer ``l``
    and KV head ``g`` sees only ``kept[l][g]`` and the positions ``≥ gen_from``."""
    c = adapter.text_config(m.config)
    H, G = c.num_attention_heads, c.num_key_value_heads
    N = len(ids)
    pos = torch.arange(N)

    def attention(module, query, key, value, attention_mask, **kw):
        l = module.layer_idx
        vis = (pos[:, None] >= pos[None, :]).expand(H, N, N).clone()
        for h in range(H):
            ok = torch.isin(pos, kept[l][h // (H // G)]) | (pos >= gen_from)
            vis[h, pos >= gen_from] &= ok[None, :]
        mask = torch.zeros(1, H, N, N, dtype=query.dtype).masked_fill(~vis[None], torch.finfo(query.dtype).min)
        return adapter.own_eager_function(module)(module, query, key, value, mask, **kw)

    return oracle_logits_with(m, "followup_oracle", attention, ids, pos)


def test_full_budget_equals_a_plain_two_turn_generation(model, spans):
    """B ≥ T: both answers equal a full-context two-turn greedy generation token for token."""
    stop = stop_token_ids(model)
    T = spans.T
    res = run_followup(model, spans, [(FullCache(), T), (SnapKV(), T), (DeferKV(), T)], N_NEW, lambda body: TURN2)
    a1 = greedy_no_cache(model, spans.input_ids, N_NEW, stop)
    body = answer_body(a1, stop)
    a2 = greedy_no_cache(model, list(spans.input_ids) + body + TURN2, N_NEW, stop)
    assert len(res) == 3
    for r in res:
        assert r.error is None, r.error
        assert r.first.ids == a1 and r.second.ids == a2, r.first.policy
        assert list(r.turn2_ids) == body[len(a1) - 1:] + TURN2
        assert r.cache_entries == T + len(a1) - 1 + len(r.turn2_ids)


@pytest.mark.parametrize("policy", [SnapKV(n_sink=2, recent=4, window=4), DeferKV(n_sink=2, recent=4, window=4)], ids=["snapkv", "deferkv"])
def test_small_budget_turn_two_sees_kept_set_answer_one_and_question_two(model, spans, policy):
    """B < T: the cache after turn 1 holds exactly the policy's kept set, answer 1 and question 2: both answers equal
    the argmax rows of one masked forward over the conversation, and the entry count is that sum."""
    stop = stop_token_ids(model)
    T, B = spans.T, 12
    (r,) = run_followup(model, spans, [(policy, B)], N_NEW, lambda body: TURN2)
    assert r.error is None, r.error
    d = r.first.evicted_at
    assert r.first.kept_prompt.shape[-1] == B and B < T
    body = answer_body(r.first.ids, stop)
    conv = list(spans.input_ids) + body + TURN2 + r.second.ids
    ref = _masked_logits(model, conv, r.first.kept, T + d).argmax(-1)
    assert ref[T - 1:T - 1 + len(r.first.ids)].tolist() == r.first.ids
    s0 = T + len(body) + len(TURN2)
    assert ref[s0 - 1:s0 - 1 + len(r.second.ids)].tolist() == r.second.ids
    assert r.cache_entries == B + d + (len(r.first.ids) - 1 - d) + len(r.turn2_ids)
    full = _masked_logits(model, conv, [[torch.arange(T)] * 2] * 3, T + d).argmax(-1)
    assert not torch.equal(full[s0 - 1:], ref[s0 - 1:]), "eviction changed nothing here: the test would be vacuous"


def test_turn_two_failure_is_reported_failed(model, spans):
    """A turn 2 that cannot run is the result's failed step; answer 1 stands and answer 2 is not an empty answer."""
    T = spans.T
    empty, too_long = run_followup(model, spans, [(SnapKV(n_sink=2, recent=4, window=4), b) for b in (12, 14)], N_NEW, lambda body: []), \
        run_followup(model, spans, [(SnapKV(n_sink=2, recent=4, window=4), 12)], N_NEW, lambda body: [3] * 100_000)
    for r in [*empty, *too_long]:
        assert r.first.error is None and r.first.ids
        assert r.second.error is not None and r.second.ids == []
        assert r.error.startswith("turn 2: ")
    assert "next_turn" in empty[0].second.error
    assert r.first.T == T


def test_turn_one_failure_fails_both(model, spans):
    (r,) = run_followup(model, spans, [(SnapKV(n_sink=2, recent=4, window=4), 1)], N_NEW, lambda body: TURN2)
    assert r.first.error is not None and r.second.error is not None and r.error.startswith("turn 1: ")


def test_bad_next_turn_is_refused(model, spans):
    with pytest.raises(ValueError, match="next_turn"):
        run_followup(model, spans, [(FullCache(), spans.T)], N_NEW, [1, 2])


def test_chat_next_turn_renders_the_second_user_turn(smollm):
    """The tokens after answer 1: the template's end of the assistant turn, the user turn with question 2 and the
    generation prompt; the full conversation text is the template's own."""
    tok = smollm.tokenizer
    nt = chat_next_turn(tok, "Be brief.", "What is the other number?")
    text = tok.decode(nt([1, 2]))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Question:\nWhat is the other number?"}]
    full = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert full.endswith("A1" + text)
    with pytest.raises(ValueError, match="query2"):
        chat_next_turn(tok, "", "<|im_start|>user")
    plain = tok.decode(chat_next_turn(tok, "", "Why?", chat=False)([]))
    assert plain == "\n\nQuestion:\nWhy?\nAnswer:"
