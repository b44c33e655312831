"""Answer metrics against hand-computed SQuAD EM/F1 and the official torchmetrics aggregate."""
from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchmetrics.functional.text.squad import squad

from workbench.study import metrics


@pytest.mark.parametrize("pred, golds, em, f1", [
    ("the Denver Broncos", ["Denver Broncos"], 1.0, 1.0),            # article and case removed
    ("Denver Broncos!", ["denver broncos"], 1.0, 1.0),               # punctuation removed
    ("Broncos of Denver", ["Denver Broncos"], 0.0, 0.8),             # P = 2/3, R = 1 → 0.8
    ("Denver", ["Denver Broncos", "Paris"], 0.0, 2 / 3),             # P = 1, R = 1/2; max over golds
    ("In 1887, it was first lit.", ["1887"], 0.0, 2 * (1 / 6) / (1 + 1 / 6)),  # P = 1/6, R = 1
    ("the the the", ["Broncos"], 0.0, 0.0),                          # empty after normalisation
    ("red red blue", ["red blue blue"], 0.0, 2 / 3),                 # bag of words: common = {red:1, blue:1}
])
def test_em_f1_hand_computed(pred, golds, em, f1):
    assert metrics.exact_match(pred, golds) == pytest.approx(em)
    assert metrics.f1_score(pred, golds) == pytest.approx(f1)


def test_normalisation_is_the_squad_one():
    assert metrics.normalize_answer("  The  Quick, brown FOX — an a-b ") == "quick brown fox — ab"


_WORDS = st.sampled_from(["the", "The", "a", "An", "an", "Denver", "broncos", "1887", "it's", "—", "x-y", "a.b",
                          "", " ", "  ", "\t", ",", "!", "théâtre", "Ünïcode", "THE", "anna", "then"])


@settings(max_examples=150, deadline=None)
@given(st.lists(_WORDS, max_size=8).map(" ".join), st.lists(_WORDS, max_size=8).map(" ".join))
def test_normalisation_gives_torchmetrics_squad_scores(pred, gold):
    """EM and F1 computed from :func:`normalize_answer` by the SQuAD v1.1 rules equal torchmetrics' public
    ``squad`` metric (percent) on the same pair: the inlined normaliser is the one that metric applies."""
    p, g = metrics.normalize_answer(pred).split(), metrics.normalize_answer(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    f1 = 2 * common / (len(p) + len(g)) if p and g else float(p == g)  # torchmetrics: empty vs empty is 1
    ref = squad([{"prediction_text": pred, "id": "0"}], [{"answers": {"answer_start": [0], "text": [gold]},
                                                           "id": "0"}])
    assert float(ref["exact_match"]) == pytest.approx(100.0 * (p == g))
    assert float(ref["f1"]) == pytest.approx(100.0 * f1, abs=1e-4)


def test_contains_is_whole_word():
    assert metrics.contains_answer("It was first lit in 1887.", ["1887"]) == 1.0
    assert metrics.contains_answer("It was first lit in 18870.", ["1887"]) == 0.0
    assert metrics.contains_answer("the Denver Broncos won", ["Broncos won", "x"]) == 1.0
    assert metrics.contains_answer("Denver", ["Denver Broncos"]) == 0.0


def test_contains_all_any_order():
    parts = ["figs", "almonds", "honey"]
    assert metrics.contains_all("Honey, figs and almonds.", parts) == 1.0
    assert metrics.contains_all("figs and almonds", parts) == 0.0
    with pytest.raises(ValueError, match="parts"):
        metrics.contains_all("x", [])


def test_clean_answer_takes_first_line():
    assert metrics.clean_answer("\n  1887 \nThe lighthouse was lit in 1887.") == "1887"
    assert metrics.clean_answer("   \n") == ""
    s = metrics.answer_scores("\n1887\nmore text", ["1887"])
    assert (s["em"], s["f1"], s["contains"]) == (1.0, 1.0, 1.0)
    assert math.isnan(s["contains_conflict"])


def test_whole_reply_is_scored_not_only_the_first_line():
    s = metrics.answer_scores("Sure! Here is the answer.\nThe lighthouse was lit in 1887.", ["1887"])
    assert s["contains"] == 1.0 and s["em"] == 0.0 and 0 < s["f1"] < 1
    s = metrics.answer_scores("Let me see.\n1887", ["1887"])
    assert (s["em"], s["f1"], s["contains"]) == (1.0, 1.0, 1.0)
    s = metrics.answer_scores("No idea.\nMaybe 1888.", ["1887"], conflict=["1888"])
    assert (s["contains"], s["contains_conflict"]) == (0.0, 1.0)
    assert metrics.answer_scores("", ["1887"])["contains"] == 0.0


def test_answer_scores_parts_and_conflict():
    s = metrics.answer_scores("figs, honey and almonds", ["figs, almonds and honey"], parts=["figs", "almonds", "honey"])
    assert s["em"] == 0.0 and s["f1"] == 1.0 and s["contains"] == 1.0   # same bag of words, other order
    s = metrics.answer_scores("Arizona Cardinals", ["Sun Life Stadium"], conflict=["Arizona Cardinals"])
    assert (s["em"], s["contains"], s["contains_conflict"]) == (0.0, 0.0, 1.0)


def test_first_token_agreement():
    assert metrics.first_token_agreement([5, 6], [5, 9]) == 1.0
    assert metrics.first_token_agreement([4, 6], [5, 6]) == 0.0
    assert math.isnan(metrics.first_token_agreement([], [5]))
    assert math.isnan(metrics.first_token_agreement([5], None))


def test_batch_scores_match_torchmetrics_aggregate():
    from torchmetrics.functional.text.squad import squad

    preds = ["the Denver Broncos", "Broncos of Denver", "1887", "nothing"]
    golds = [["Denver Broncos"], ["Denver Broncos"], ["in 1887", "1887"], ["Carolina"]]
    df = metrics.squad_scores(preds, golds)
    assert list(df["em"]) == [1.0, 0.0, 1.0, 0.0]
    ref = squad([{"prediction_text": p, "id": str(i)} for i, p in enumerate(preds)],
                [{"answers": {"answer_start": [0] * len(g), "text": g}, "id": str(i)} for i, g in enumerate(golds)])
    assert df["em"].mean() * 100 == pytest.approx(float(ref["exact_match"]))
    assert df["f1"].mean() * 100 == pytest.approx(float(ref["f1"]))
    assert df["f1"].mean() == pytest.approx((1 + 0.8 + 1 + 0) / 4)


def test_invalid_answers():
    with pytest.raises(ValueError, match="answers"):
        metrics.exact_match("x", [])
    with pytest.raises(ValueError, match="answers"):
        metrics.squad_scores(["x"], [])
