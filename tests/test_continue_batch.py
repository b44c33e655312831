"""``EvictionSession.continue_batch``: the answers of several evictions decoded together (equal cache lengths share
a batched forward, at most ``batch_size`` at a time; a per-head count decodes alone) against the oracle of
``test_continue_with``: one eager forward over prompt and answer with the policy's kept sets as the visibility mask,
and against ``continue_with`` on the same evictions one at a time."""
from __future__ import annotations

import pytest
import torch
from _oracle import eager_llama, four_passages, visible_logits

from workbench.rerun.eviction import H2O, TOVA, AdaKV, DeferKV, KNorm, Needs, SnapKV, StreamingLLM
from workbench.rerun.eviction.session import EvictionSession

N_NEW = 5
SMALL = dict(n_sink=2, recent=4)


@pytest.fixture(scope="module")
def model():
    return eager_llama(seed=5)


@pytest.fixture(scope="module")
def spans():
    return four_passages()


# four runs of one cache length (two batches of 2 with batch_size=2), one of another, one per-head count (alone),
# and DeferKV (its answer's first two tokens decided on the full cache: one step behind the others)
JOBS = [(SnapKV(window=4, **SMALL), 12), (H2O(**SMALL), 12), (KNorm(**SMALL), 12), (TOVA(**SMALL), 12),
        (StreamingLLM(**SMALL), 16), (AdaKV(base=SnapKV(window=4, **SMALL)), 12), (DeferKV(window=4, **SMALL), 12)]


def _session(model, spans):
    needs = Needs.of(p for p, _ in JOBS)
    return EvictionSession.prepare(model, spans, needs, N_NEW, keep_logits=True, progress=False)


def test_a_batch_equals_the_masked_forward_and_one_by_one(model, spans):
    sess = _session(model, spans)
    T, ids = spans.T, list(spans.input_ids)
    batch = sess.continue_batch([sess.evict(p, B) for p, B in JOBS], batch_size=2)
    alone = [sess.continue_with(sess.evict(p, B)) for p, B in JOBS]
    assert [r.policy for r in batch] == [p.name for p, _ in JOBS]
    for (p, B), r, a in zip(JOBS, batch, alone):
        assert r.ids == a.ids, p.name
        torch.testing.assert_close(r.logits, a.logits, atol=1e-5, rtol=0)
        ref = visible_logits(model, ids + r.ids[:-1], r.kept, T + r.evicted_at)
        torch.testing.assert_close(r.logits, ref[T - 1:T - 1 + len(r.ids)], atol=1e-4, rtol=0)
        assert float((r.kept_prompt >= 0).sum(-1).float().mean()) == B < T  # AdaKV: B per head on average
    # the batches formed as asked: the four runs of one length in pairs, the rest alone
    assert [r.timings["batch"] for r in batch] == [2, 2, 2, 2, 1, 1, 1]
    full = visible_logits(model, ids + batch[0].ids[:-1], torch.arange(T).expand(3, 2, T), T)
    assert (full[T - 1:] - batch[0].logits).abs().max() > 1e-3, "eviction changed nothing here: the test is vacuous"


def test_without_a_size_every_run_of_one_length_shares_a_batch(model, spans):
    sess = _session(model, spans)
    batch = sess.continue_batch([sess.evict(p, B) for p, B in JOBS[:4]])
    assert [r.timings["batch"] for r in batch] == [4] * 4


def test_bad_batches_are_refused_before_any_decoding(model, spans):
    sess = _session(model, spans)
    st = sess.evict(*JOBS[0])
    with pytest.raises(ValueError, match=r"^batch_size: must be None or an integer >= 1, got 0$"):
        sess.continue_batch([st], batch_size=0)
    with pytest.raises(ValueError, match=r"^states: must be a non-empty list, got \[\]"):
        sess.continue_batch([])
    with pytest.raises(ValueError, match=r"^states: must be distinct"):
        sess.continue_batch([st, st])
    with pytest.raises(ValueError, match=r"^states: entry 1 must be a RunState from evict, not yet decoded"):
        sess.continue_batch([st, "x"])
    first = sess.continue_batch([st])[0]  # the refusals left it as it was
    assert first.ids == sess.continue_with(sess.evict(*JOBS[0])).ids
    with pytest.raises(ValueError, match=r"^states: entry 0 must be a RunState from evict, not yet decoded"):
        sess.continue_batch([st])  # decoded: its cache is freed
