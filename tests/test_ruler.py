"""RULER-style synthetic tasks (workbench.study.ruler): deterministic from the seed, at the asked lengths, with
the answers where the item says; the official-style scorers on hand-made replies."""
from __future__ import annotations

from collections import Counter

import pytest

from workbench.study import ruler
from workbench.study.metrics import answer_scores, string_match_all, string_match_part
from workbench.study.tasks import TASK_MAX_NEW_TOKENS


@pytest.fixture(scope="module")
def tok(smollm):
    return smollm.tokenizer


def _tokens(tok, item):
    return len(tok(" ".join(item.documents), add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("name", sorted(ruler.RULER_TASKS))
def test_deterministic_from_the_seed_and_at_length(tok, name):
    a = ruler.build_ruler(name, tok, lengths=(1024,), n=1, seed=3)
    b = ruler.build_ruler(name, tok, lengths=(1024,), n=1, seed=3)
    c = ruler.build_ruler(name, tok, lengths=(1024,), n=1, seed=4)
    assert [x.to_dict() for x in a] == [x.to_dict() for x in b]  # same seed: identical items
    assert a[0].item_id != c[0].item_id and a[0].documents != c[0].documents
    it = a[0]
    assert it.task == name and it.meta["length"] == 1024 and name in TASK_MAX_NEW_TOKENS
    n_tok = _tokens(tok, it)
    assert 0.8 * 1024 <= n_tok <= 1024 + 8, n_tok  # near the asked length, never far over it
    for p in it.answer_parts:
        assert any(p in it.documents[e] for e in it.evidence_docs)
    if not it.answer_parts:
        assert any(x in it.documents[it.answer_doc] for x in it.answers)
    assert ruler.score(" ".join(it.answer_parts or it.answers[:1]), it) == 1.0  # the gold reply scores 1
    assert ruler.score("I do not know.", it) == 0.0


def test_lengths_grow_and_stay_under_the_context(tok):
    items = ruler.niah_single(tok, lengths=(1024, 2048, 4096), n=1, seed=0)
    sizes = [_tokens(tok, it) for it in items]
    assert sizes == sorted(sizes) and sizes[-1] <= 4096 + 8 and sizes[0] >= 900
    with pytest.raises(ValueError, match="^lengths:"):
        ruler.ruler_grid(tok, ["niah_single"], lengths=(8192,), seeds=[0], max_context=8192)
    grid = ruler.ruler_grid(tok, ["niah_single", "variable_tracking"], lengths=(1024, 2048), seeds=range(3))
    assert len(grid) == 2 * 2 * 3 and len({it.item_id for it in grid}) == 12


def test_families_hold_what_they_promise(tok):
    mk = ruler.niah_multikey(tok, lengths=(1024,), n_distractors=3)[0]
    assert sum(d.count("special magic numbers for") for d in mk.documents) == 4
    mv = ruler.niah_multivalue(tok, lengths=(1024,), n_values=4)[0]
    assert len(mv.answer_parts) == 4 and all(p.isdigit() for p in mv.answer_parts)
    mq = ruler.niah_multiquery(tok, lengths=(1024,), n_queries=4)[0]
    assert len(mq.answer_parts) == 4 and mq.query.count("-") >= 4
    vt = ruler.variable_tracking(tok, lengths=(1024,), n_hops=4)[0]
    text = " ".join(vt.documents)
    assert len(vt.answer_parts) == 5 and all(f"VAR {v} =" in text for v in vt.answer_parts)
    cw = ruler.common_words(tok, lengths=(2048,), n_common=10)[0]
    words = [w.split(". ", 1)[1] for d in cw.documents for w in _lines(d)]
    counts = Counter(words)
    top = {w for w, _ in counts.most_common(10)}
    assert top == set(cw.answer_parts) and min(counts[w] for w in top) > max(
        c for w, c in counts.items() if w not in top)
    fw = ruler.frequent_words(tok, lengths=(1024,))[0]
    counts = Counter(w.split(". ", 1)[1] for d in fw.documents for w in _lines(d))
    assert [w for w, _ in counts.most_common(3)] == list(fw.answer_parts)
    qa = ruler.qa_distractors(tok, lengths=(1024,), n=2, seed=0)
    assert len(qa) == 2 and all(len(it.documents) > 3 for it in qa)
    assert qa[0].meta["source"] == "squad-v1.1-dev-sample"


def _lines(doc: str) -> list[str]:
    import re

    return [m.group(0).strip() for m in re.finditer(r"\d+\. [a-z]+", doc)]


def test_scorers_on_hand_made_replies():
    assert string_match_all("The numbers are 123 and 456.", ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert string_match_all("Sure!\nFirst: KALO\nsecond: mira", ["kalo", "MIRA"]) == 1.0  # every line, any case
    assert string_match_all("nothing", ["a1"]) == 0.0
    assert string_match_part("It might be Paris, or maybe Lyon", ["Lyon", "Marseille"]) == 1.0
    assert string_match_part("Marseill", ["Marseille"]) == 0.0
    s = answer_scores("I think\nthe values are 1234567 and 7654321", ["1234567, 7654321, 1111111"],
                      parts=["1234567", "7654321", "1111111"])
    assert s["match"] == pytest.approx(2 / 3) and s["contains"] == 0.0
    assert answer_scores("Answer: 42", ["42", "forty-two"])["match"] == 1.0
    with pytest.raises(ValueError, match="^answers:"):
        string_match_all("x", [])
