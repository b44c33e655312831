"""Answer metrics (SPEC §10): exact match, F1, contains-answer, first-token agreement.

EM and F1 are the official SQuAD v1.1 definitions, computed by ``torchmetrics.functional.text.squad``
(lower-case, strip punctuation and the articles *a/an/the*, collapse whitespace; F1 over the bag of
normalised words; the maximum over the gold answers). Scores here are fractions in ``[0, 1]``
(torchmetrics reports percentages). ``contains`` asks whether a normalised gold answer occurs as a
whole-word run inside the normalised prediction, which suits chatty replies ("The answer is 1887.").

The whole reply is scored, not only its first line: ``contains`` (and ``contains_conflict``) read every
line; EM and F1 take the best of the whole reply and each of its non-empty lines (a chatty model often
puts the answer on the second line, "Sure!\n1887"). :func:`clean_answer` (the first non-empty line) is
kept for display.
"""
from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence

import pandas as pd
from torchmetrics.functional.text.squad import squad

_PUNCTUATION = frozenset(string.punctuation)

__all__ = ["string_match_all", "string_match_part", "normalize_answer", "clean_answer", "exact_match", "f1_score", "contains_answer", "contains_all",
           "first_token_agreement", "answer_scores", "squad_scores"]


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, collapse whitespace.

    The official SQuAD v1.1 evaluation script's ``normalize_answer`` (``evaluate-v1.1.py``, Rajpurkar et al.
    2016), the one torchmetrics' ``squad`` applies; ``tests/test_metrics.py`` checks it against that metric.
    """
    t = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", t).split())


def clean_answer(text: str) -> str:
    """The first non-empty line of a generated reply, stripped (``""`` when there is none)."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _golds(answers) -> list[str]:
    if isinstance(answers, str):
        answers = [answers]
    golds = [a for a in answers if isinstance(a, str)]
    if not golds:
        raise ValueError(f"answers: must be a non-empty list of strings, got {answers!r}")
    return golds


def _squad_one(prediction: str, answers) -> dict[str, float]:

    golds = _golds(answers)
    out = squad([{"prediction_text": prediction, "id": "0"}],
                [{"answers": {"answer_start": [0] * len(golds), "text": golds}, "id": "0"}])
    return {"em": float(out["exact_match"]) / 100.0, "f1": float(out["f1"]) / 100.0}


def exact_match(prediction: str, answers) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer, else 0.0."""
    return _squad_one(prediction, answers)["em"]


def f1_score(prediction: str, answers) -> float:
    """SQuAD word-bag F1 in ``[0, 1]``, the maximum over the gold answers."""
    return _squad_one(prediction, answers)["f1"]


def _contains(prediction_norm: str, gold: str) -> bool:
    g = normalize_answer(gold)
    return bool(g) and f" {g} " in f" {prediction_norm} "


def contains_answer(prediction: str, answers) -> float:
    """1.0 when some normalised gold answer is a whole-word run inside the normalised prediction."""
    p = normalize_answer(prediction)
    return float(any(_contains(p, g) for g in _golds(answers)))


def contains_all(prediction: str, parts: Sequence[str]) -> float:
    """1.0 when every part (diffuse evidence: each fact's answer) is contained, in any order."""
    if not parts:
        raise ValueError("parts: must be a non-empty list of strings")
    p = normalize_answer(prediction)
    return float(all(_contains(p, g) for g in parts))


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's official scorer for tasks whose references are all wanted: the fraction of ``references``
    that occur (case-insensitive substring) anywhere in the whole reply."""
    refs = _golds(list(references))
    p = str(prediction).lower()
    return sum(r.lower() in p for r in refs) / len(refs)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """RULER's official scorer for tasks with alternative answers: 1.0 when any reference occurs
    (case-insensitive substring) anywhere in the whole reply."""
    refs = _golds(list(references))
    p = str(prediction).lower()
    return float(any(r.lower() in p for r in refs))


def first_token_agreement(ids: Sequence[int], reference_ids: Sequence[int] | None) -> float:
    """1.0 when the first generated token equals the reference's (full context), 0.0 when not,
    NaN when either run generated nothing or there is no reference."""
    if reference_ids is None or len(ids) == 0 or len(reference_ids) == 0:
        return math.nan
    return float(int(ids[0]) == int(reference_ids[0]))


def _candidates(prediction: str) -> list[str]:
    """The whole reply (stripped) and each non-empty line of it, distinct, in order."""
    whole = str(prediction).strip()
    lines = [ln.strip() for ln in whole.splitlines() if ln.strip()]
    return list(dict.fromkeys([whole, *lines])) or [""]


def answer_scores(prediction: str, answers, *, parts: Sequence[str] = (), conflict: Sequence[str] = ()) -> dict:
    """EM, F1 and contains of one whole reply against its gold answers.

    ``contains`` reads the whole reply (every line); EM and F1 are the maxima over the whole reply and
    each of its non-empty lines. ``match`` is RULER's scorer (:func:`string_match_all` over ``parts`` when
    given, else :func:`string_match_part` over ``answers``), a fraction for partial recall of the parts.

    Args:
        prediction: the decoded reply.
        answers: the gold answers (any of them counts).
        parts: for diffuse-evidence items, the per-fact answers: ``contains`` then needs all of them.
        conflict: for contradictory items, the planted wrong answers: ``contains_conflict`` says
            whether the reply carries one (NaN when there are none).
    """
    cands = _candidates(prediction)
    scored = [_squad_one(c, answers) for c in cands]
    s = {"em": max(x["em"] for x in scored), "f1": max(x["f1"] for x in scored)}
    pred = cands[0]
    s["contains"] = contains_all(pred, parts) if parts else contains_answer(pred, answers)
    s["contains_conflict"] = contains_answer(pred, conflict) if conflict else math.nan
    s["match"] = string_match_all(pred, parts) if parts else string_match_part(pred, answers)
    return s


def squad_scores(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> pd.DataFrame:
    """Per-item EM, F1 and contains as a DataFrame (one row per prediction; ``.mean()`` gives the
    corpus scores, which equal torchmetrics' ``squad`` divided by 100)."""
    if len(predictions) != len(answers):
        raise ValueError(f"answers: must have one entry per prediction ({len(predictions)}), got {len(answers)}")
    return pd.DataFrame([answer_scores(p, a) for p, a in zip(predictions, answers)],
                        columns=["em", "f1", "contains"])
