"""``EvictionSession.evict`` and ``continue_with``, the one public step that decodes from an evicted cache, against
oracles written here: one eager forward over the whole conversation with a visibility mask built from the policy's
kept sets (a turn appended and teacher-forced after the first answer), and a fresh eviction for every
continuation (a copy of one evicted state continues exactly as a new eviction of its own)."""
from __future__ import annotations

import pytest
import torch
from _oracle import eager_llama, four_passages, visible_logits

from workbench.rerun.eviction import DeferKV, SnapKV
from workbench.rerun.eviction.session import EvictionSession
from workbench.run import adapter

N_NEW = 5
TURN = [5, 17, 33, 9, 41, 2, 60]  # fixed ids (the tiny model has no tokenizer)
SMALL = dict(n_sink=2, recent=4, window=4)


@pytest.fixture(scope="module")
def model():
    return eager_llama(seed=5)


@pytest.fixture(scope="module")
def spans():
    return four_passages()


@pytest.mark.parametrize("policy", [SnapKV(**SMALL), DeferKV(**SMALL)], ids=["snapkv", "deferkv"])
def test_appended_turn_teacher_forced_equals_a_masked_forward(model, spans, policy):
    """Answer 1, then a turn appended in place of its last token and answer 2 teacher-forced on ids that start
    off the greedy choice: every logits row equals the masked forward's (the appended positions see the kept set,
    answer 1 and the turn; nothing evicted comes back) and the forced ids are the answer."""
    T, B = spans.T, 12
    ids = list(spans.input_ids)
    sess = EvictionSession.prepare(model, spans, policy.needs(), N_NEW, keep_logits=True, progress=False)
    st = sess.evict(policy, B)
    first = sess.continue_with(st)
    greedy = sess.continue_with(st, TURN, on="copy").ids
    V = adapter.text_config(model.config).vocab_size
    forced = [(greedy[0] + 1) % V, 3, 8, 1]  # the first forced token is not the greedy one
    second = sess.continue_with(st, TURN, forced=forced)
    assert second.ids == forced and second.logits.shape[0] == len(forced)
    d = first.evicted_at
    assert first.kept_prompt.shape[-1] == B < T
    conv = ids + first.ids[:-1] + TURN + forced[:-1]
    ref = visible_logits(model, conv, first.kept, T + d)
    torch.testing.assert_close(first.logits, ref[T - 1:T - 1 + len(first.ids)], atol=1e-4, rtol=0)
    s0 = T + len(first.ids) - 1 + len(TURN)  # the first forced token's position
    torch.testing.assert_close(second.logits, ref[s0 - 1:s0 - 1 + len(forced)], atol=1e-4, rtol=0)
    assert st.context_entries == B + len(first.ids) - 1 + len(TURN)
    full = visible_logits(model, conv, torch.arange(T).expand(3, 2, T), T + d)
    assert (full[s0 - 1:] - ref[s0 - 1:]).abs().max() > 1e-3, "eviction changed nothing here: the test is vacuous"


def test_a_copy_continues_as_a_fresh_eviction(model, spans):
    """``on="copy"`` leaves the state as it was: the prompt's answer from copies of one eviction equals
    :meth:`run`'s, and a question appended to a copy equals one appended to a new eviction of its own."""
    pol, B = SnapKV(**SMALL), 12
    sess = EvictionSession.prepare(model, spans, pol.needs(), N_NEW, keep_logits=True, progress=False)
    st = sess.evict(pol, B)
    one = sess.run(pol, B)
    for _ in range(2):
        a = sess.continue_with(st, on="copy")
        assert a.ids == one.ids and torch.equal(a.logits, one.logits)
    for q in (TURN, TURN[:3]):
        c = sess.continue_with(st, q, on="copy")
        fresh = sess.continue_with(sess.evict(pol, B), q)
        assert c.ids == fresh.ids and torch.equal(c.logits, fresh.logits)
        assert c.timings["question"] >= 0 and "question" not in one.timings
    last = sess.continue_with(st)  # the state itself, untouched by the copies
    assert last.ids == one.ids and torch.equal(last.logits, one.logits)


def test_bad_continuations_are_refused_and_leave_the_state_as_it_was(model, spans):
    """Each bad argument is refused, naming it, before the cache changes: the state then continues as if the
    refused calls had not been made."""
    pol = SnapKV(**SMALL)
    sess = EvictionSession.prepare(model, spans, pol.needs(), N_NEW, progress=False)
    st = sess.evict(pol, 12)
    with pytest.raises(ValueError, match=r"on: must be one of \['state', 'copy'\], got 'both'"):
        sess.continue_with(st, on="both")
    with pytest.raises(ValueError, match="tokens: must be"):
        sess.continue_with(st, [1.5, 2])
    with pytest.raises(ValueError, match="tokens: must be"):
        sess.continue_with(st, [-1])
    with pytest.raises(ValueError, match="state: must be a RunState"):
        sess.continue_with(sess.run(pol, 12), TURN)
    first = sess.continue_with(st)
    with pytest.raises(ValueError, match="tokens: the state's answer is decoded"):
        sess.continue_with(st)
    with pytest.raises(ValueError, match="forced: must hold 1 to max_new_tokens"):
        sess.continue_with(st, TURN, forced=[1] * (N_NEW + 1))
    with pytest.raises(ValueError, match="max_new_tokens|context"):
        sess.continue_with(st, [3] * 100_000)
    again = EvictionSession.prepare(model, spans, pol.needs(), N_NEW, progress=False)
    st2 = again.evict(pol, 12)
    assert again.continue_with(st2).ids == first.ids
    assert sess.continue_with(st, TURN).ids == again.continue_with(st2, TURN).ids


def test_a_state_a_failed_call_left_part_written_is_refused(model, spans, monkeypatch):
    """A continuation that fails once the cache is changing (here its forward) leaves a cache that may hold part of
    the step: the state is refused from then on, never decoded from silently; a copy's failure leaves it alone."""
    pol = SnapKV(**SMALL)
    sess = EvictionSession.prepare(model, spans, pol.needs(), N_NEW, progress=False)
    st, kept = sess.evict(pol, 12), sess.evict(pol, 12)
    sess.continue_with(st)
    sess.continue_with(kept)

    def fail(*a, **k):
        raise RuntimeError("the forward failed")

    with monkeypatch.context() as mp:
        mp.setattr(adapter, "forward", fail)
        with pytest.raises(RuntimeError, match="the forward failed"):
            sess.continue_with(st, TURN)
        with pytest.raises(RuntimeError, match="the forward failed"):
            sess.continue_with(kept, TURN, on="copy")
    with pytest.raises(ValueError, match="state: must be a RunState from evict, not one a failed call left"):
        sess.continue_with(st, TURN)
    assert sess.continue_with(kept, TURN).ids
