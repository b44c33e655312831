"""What eviction changed in the answer: the pure per-token divergence on logits with known answers, the forced
decoding it runs on, and the view on a real prompt of the default model checked against an independent
computation from the two runs' logits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workbench.analyse.divergence import first_parting, logit_divergence
from workbench.analyse.params import EntroPrefillParams
from workbench.rerun.divergence import answer_divergence, answer_divergences
from workbench.rerun.eviction import EvictionSession, FullCache, Needs, StreamingLLM
from workbench.run import adapter
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans


# ------------------------------------------------------------------ pure functions, known answers
def test_known_two_token_answer():
    # p = (1/2, 1/2), q = (3/4, 1/4), chosen token 1
    d = logit_divergence([[0.0, 0.0]], [[math.log(3.0), 0.0]], [1])
    assert d.kl[0] == pytest.approx(0.5 * math.log(4 / 3), abs=1e-15)
    assert d.dlogp[0] == pytest.approx(-math.log(2), abs=1e-15)
    assert d.margin_full[0] == pytest.approx(0.0, abs=1e-15)
    assert d.dmargin[0] == pytest.approx(-math.log(3), abs=1e-15)
    assert d.first_divergence == 0  # the compressed argmax is token 0: it parts at once
    assert d.to_frame()["parted"].tolist() == [True]


def test_equal_and_shifted_logits_give_zero():
    g = np.random.default_rng(0).normal(size=(5, 11)) * 30
    ids = g.argmax(-1)
    d = logit_divergence(g, g + 7.5, ids)  # a constant shift is the same distribution
    np.testing.assert_allclose(d.kl, 0, atol=1e-12)
    np.testing.assert_allclose(d.dlogp, 0, atol=1e-12)
    np.testing.assert_allclose(d.dmargin, 0, atol=1e-12)
    assert d.first_divergence is None and d.summary()["mean_kl"] == pytest.approx(0, abs=1e-12)
    assert not d.to_frame()["parted"].any()


def test_large_logits_stay_finite():
    a = np.array([[1e4, 0.0, -1e4]])
    b = np.array([[0.0, 1e4, -1e4]])
    d = logit_divergence(a, b, [0])
    assert np.isfinite(d.kl).all() and d.kl[0] == pytest.approx(1e4, rel=1e-12)
    assert d.dlogp[0] == pytest.approx(-1e4, rel=1e-12) and d.dmargin[0] == pytest.approx(-2e4, rel=1e-12)


def test_against_torch_kl_div_on_random_logits():
    g = torch.Generator().manual_seed(1)
    p, q = torch.randn(7, 50, generator=g, dtype=torch.float64), torch.randn(7, 50, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 50, (7,), generator=g)
    d = logit_divergence(p, q, ids.tolist())
    lp, lq = p.log_softmax(-1), q.log_softmax(-1)
    ref = F.kl_div(lq, lp, log_target=True, reduction="none").sum(-1).numpy()
    np.testing.assert_allclose(d.kl, ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d.dlogp, (lq - lp)[torch.arange(7), ids].numpy(), atol=1e-13)


def test_first_parting():
    assert first_parting([1, 2, 3], [1, 2, 4]) == 2
    assert first_parting([1, 2, 3], [1, 2]) == 2  # the other stopped
    assert first_parting([1, 2, 3], [1, 2, 3]) is None
    assert first_parting([5], [6]) == 0
    g = np.zeros((4, 6))
    d = logit_divergence(g, g, [0, 1, 2, 3], other_ids=[0, 1, 5, 3])
    assert d.first_divergence == 2 and d.to_frame()["parted"].tolist() == [False, False, True, True]
    d = logit_divergence(g, g, [0, 1, 2, 3], other_ids=[0, 1, 2, 3, 4])  # agrees, then goes on
    assert d.first_divergence is None


def test_bad_inputs_name_the_parameter():
    g = np.zeros((3, 5))
    with pytest.raises(ValueError, match="compressed_logits: must have the shape"):
        logit_divergence(g, np.zeros((2, 5)), [0, 1, 2])
    with pytest.raises(ValueError, match=r"ids: token ids must lie in \[0, 4\]"):
        logit_divergence(g, g, [0, 1, 9])
    with pytest.raises(ValueError, match="ids: must hold one token id per logits row"):
        logit_divergence(g, g, [0, 1])
    with pytest.raises(ValueError, match="full_logits: has non-finite"):
        logit_divergence(np.full((3, 5), np.nan), g, [0, 1, 2])
    with pytest.raises(ValueError, match=r"full_logits: must be logits of shape"):
        logit_divergence(np.zeros(5), g, [0])


# ------------------------------------------------------------------ forced decoding, tiny model
@pytest.fixture(scope="module")
def tiny_lm():
    model = tiny_model("llama", L=4, H_Q=4, G=2, seed=3)
    spans = PromptSpans.synthetic([5, 6, 7, 4], query_len=6)
    return model, spans


def test_forced_tokens_are_checked(tiny_lm):
    model, spans = tiny_lm
    sess = EvictionSession.prepare(model, spans, Needs.of([StreamingLLM()]), 4, keep_logits=True, progress=False)
    full = sess.run(FullCache(), sess.T)
    with pytest.raises(ValueError, match="forced: must start with"):
        sess.run(StreamingLLM(), 38, forced=[(full.ids[0] + 1) % 64] + full.ids[1:])
    with pytest.raises(ValueError, match="forced: must hold 1 to max_new_tokens = 4"):
        sess.run(StreamingLLM(), 38, forced=full.ids * 3)
    with pytest.raises(ValueError, match="budget: a pruned prefill has no budget"):
        answer_divergence(model, spans, EntroPrefillParams(), 12)
    with pytest.raises(ValueError, match="budget: an eviction policy needs a budget"):
        answer_divergence(model, spans, StreamingLLM())


def _answer_logits(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    """One forward over the given tokens at the given positions: float64 logits of every position."""
    with torch.no_grad():
        out = adapter.forward(model, torch.tensor([ids]), position_ids=torch.tensor([positions]))
    return out.logits[0].double()


def test_pruned_prefill_divergence_matches_one_forward_oracle(tiny_lm):
    """Pruning before layer 0 is a forward on the retained tokens at their original positions: one forward over
    the retained prompt followed by the full answer is the teacher-forced oracle (and the full prompt followed by
    the answer the full one); the KL is then kl_div of the two."""
    model, spans = tiny_lm
    removed = [1, 3]
    n = 5
    d = answer_divergence(model, spans, EntroPrefillParams(), layer=-1, removed=removed, max_new_tokens=n)
    ids, T = list(d.ids), spans.T
    R = spans.retained_positions(removed).tolist()
    prompt = list(spans.input_ids)
    full = _answer_logits(model, prompt + ids[:-1], list(range(T + len(ids) - 1)))[T - 1:]
    pruned = _answer_logits(model, [prompt[p] for p in R] + ids[:-1], R + list(range(T, T + len(ids) - 1)))[len(R) - 1:]
    assert full.argmax(-1).tolist() == ids  # the full answer is greedy on the full prompt
    ref = F.kl_div(pruned.log_softmax(-1), full.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    np.testing.assert_allclose(d.kl, ref.numpy(), atol=1e-5)
    assert d.kl.max() > 1e-4  # removing two chunks changes the answer's distributions
    assert d.label.startswith("pruned prefill, l* = -1")


# ------------------------------------------------------------------ the default model, a real prompt
@pytest.fixture(scope="module")
def real(smollm, example_prompt):
    n = 12
    small = (StreamingLLM(), 40)
    ds = answer_divergences(smollm, example_prompt, [(StreamingLLM(), example_prompt.spans.T), small],
                            max_new_tokens=n)
    # the two runs' logits again, for an independent computation
    sess = EvictionSession.prepare(smollm, example_prompt, Needs.of([small[0]]), n, keep_logits=True,
                                   progress=False)
    full = sess.run(FullCache(), sess.T)
    forced = sess.run(*small, forced=full.ids)
    own = sess.run(*small)
    return ds, full, forced, own


def test_no_divergence_when_nothing_is_evicted(real):
    d = real[0][0]
    assert d.kl.shape == (12,)
    np.testing.assert_allclose(d.kl, 0, atol=1e-6)
    np.testing.assert_allclose(d.dlogp, 0, atol=1e-6)
    np.testing.assert_allclose(d.dmargin, 0, atol=1e-6)
    assert d.first_divergence is None


def test_small_budget_diverges_after_the_eviction(real):
    d, full, forced, own = real[0][1], *real[1:]
    assert d.kl[0] == 0.0  # the first token is the prefill's, before any eviction
    assert (d.kl[1:] > 1e-6).all()
    j = d.first_divergence
    assert j is not None and own.ids[:j] == full.ids[:j] and own.ids[j] != full.ids[j]
    assert d.kl[j] > 0 and d.dmargin[j] < 0 and d.to_frame()["parted"].tolist() == [i >= j for i in range(12)]
    # up to the parting the forced run is the free run: same inputs, same logits
    torch.testing.assert_close(forced.logits[: j + 1], own.logits[: j + 1], atol=1e-5, rtol=0)


def test_same_numbers_as_an_independent_computation(real):
    d, full, forced = real[0][1], real[1], real[2]
    assert forced.ids == full.ids and list(d.ids) == full.ids
    lp = torch.log_softmax(full.logits.double(), -1)
    lq = torch.log_softmax(forced.logits.double(), -1)
    kl = F.kl_div(lq, lp, log_target=True, reduction="none").sum(-1)
    np.testing.assert_allclose(d.kl, kl.numpy(), rtol=1e-6, atol=1e-9)
    y = torch.tensor(full.ids)
    rows = torch.arange(len(y))
    np.testing.assert_allclose(d.dlogp, (lq - lp)[rows, y].numpy(), atol=1e-9)
    top2 = full.logits.double().topk(2, -1).values
    m_full = full.logits.double()[rows, y] - torch.where(top2[:, 0] == full.logits.double()[rows, y], top2[:, 1],
                                                          top2[:, 0])
    np.testing.assert_allclose(d.margin_full, m_full.numpy(), atol=1e-9)
