"""The SQuAD families (``datasets.load_squad``): ``squad_single``, ``squad_reordered``, ``squad_conflict``."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import workbench.study.datasets as datasets
from workbench.checks import Interval
from workbench.constraints import count_upto, index_into, register_all
from workbench.study.metrics import normalize_answer
from workbench.study.tasks.item import TaskItem, seeded_rng, with_content_id

__all__ = ["squad_single", "squad_reordered", "squad_conflict", "squad_answers"]

_CHECKS = register_all("squad", {"n_distractors": Interval("int", 1), "max_passage_chars": Interval("int", 50),
                                 "max_answer_chars": Interval("int", 1)}, __name__)
"""The static arguments of the SQuAD families."""


def _contains_norm(text_norm: str, answer_norm: str) -> bool:
    """Whether a normalised answer is a whole-word run of a normalised text (metrics.contains_answer)."""
    return bool(answer_norm) and f" {answer_norm} " in f" {text_norm} "


def squad_answers(qa: dict, context: str) -> tuple[str, ...]:
    """The gold answers of a SQuAD question ``qa`` (stripped, blank and repeated ones dropped, in order) when the
    first of them stands in its paragraph ``context``, else ``()``: the question is not usable (the families here
    and RULER's ``qa_distractors`` take only these)."""
    answers = tuple(dict.fromkeys(a["text"].strip() for a in qa["answers"] if a["text"].strip()))
    return answers if answers and answers[0] in context else ()


@dataclass(frozen=True)
class _SquadQ:
    article: int
    paragraph: int
    qid: str
    question: str
    answers: tuple[str, ...]
    pool: tuple[int, ...]  # eligible distractor paragraphs (short, no gold answer inside)


def _squad_questions(articles, max_passage_chars: int, min_pool: int) -> list[_SquadQ]:
    out = []
    for ai, art in enumerate(articles):
        paras = art["paragraphs"]
        short = [pi for pi, p in enumerate(paras) if len(p["context"]) <= max_passage_chars]
        padded = {pi: f" {normalize_answer(paras[pi]['context'])} " for pi in short}
        for pi in short:
            ctx = paras[pi]["context"]
            for qa in paras[pi]["qas"]:
                answers = squad_answers(qa, ctx)
                if not answers:
                    continue
                a_pad = [f" {n} " for n in map(normalize_answer, answers) if n]
                pool = tuple(pj for pj in short if pj != pi and not any(a in padded[pj] for a in a_pad))
                if len(pool) >= min_pool:
                    out.append(_SquadQ(ai, pi, qa["id"], qa["question"].strip(), answers, pool))
    return out


def _pick(questions: list, n: int, seed, name: str) -> list:
    count_upto(len(questions)).check("n", n)
    return seeded_rng(seed, name, "pick").sample(questions, n)


def _squad_item(task, q: _SquadQ, articles, docs_idx: list[int], gold_pos: int, seed, extra_meta=None,
                documents=None, **kw) -> TaskItem:
    paras = articles[q.article]["paragraphs"]
    docs = documents if documents is not None else [paras[i]["context"] for i in docs_idx]
    meta = dict(source=datasets.provenance(articles)["label"], title=articles[q.article]["title"], qid=q.qid,
                paragraph=q.paragraph,
                gold_position=gold_pos, seed=seed, cluster=f"squad-{q.qid}")  # one question: one unit
    meta.update(extra_meta or {})
    return TaskItem(task=task, item_id=q.qid, documents=tuple(docs), query=q.question, answers=q.answers,
                    answer_doc=gold_pos, meta=meta, **kw)


def _distractors(q: _SquadQ, n_distractors: int, seed) -> list[int]:
    return seeded_rng(seed, q.qid, "distractors").sample(list(q.pool), n_distractors)


def squad_single(articles, *, n: int = 20, n_distractors: int = 4, seed: int = 0,
                 max_passage_chars: int = 800) -> list[TaskItem]:
    """Single-hop RAG items: the gold paragraph plus ``n_distractors`` same-article paragraphs
    (none containing a gold answer), in a seeded order.

    Args:
        articles: SQuAD articles (:func:`workbench.study.datasets.load_squad`).
        n: number of questions, ``1 …`` the number of eligible questions.
        n_distractors: distractor paragraphs per item, ``≥ 1`` (3–5 keeps SmolLM2 prompts under ~1k tokens).
        max_passage_chars: paragraphs longer than this are not used.
    """
    _CHECKS["n_distractors"].check("n_distractors", n_distractors)
    _CHECKS["max_passage_chars"].check("max_passage_chars", max_passage_chars)
    qs = _pick(_squad_questions(articles, max_passage_chars, n_distractors), n, seed, "squad_single")
    out = []
    for q in qs:
        docs = [q.paragraph] + _distractors(q, n_distractors, seed)
        seeded_rng(seed, q.qid, "order").shuffle(docs)
        pos = docs.index(q.paragraph)
        out.append(with_content_id(_squad_item("squad_single", q, articles, docs, pos, seed), q.qid))
    return out


def squad_reordered(articles, *, n: int = 10, n_distractors: int = 4, positions: Sequence[int] | None = None,
                    seed: int = 0, max_passage_chars: int = 800) -> list[TaskItem]:
    """Reordered documents: for each question, the same documents with the gold paragraph at each of
    ``positions`` (default first, middle, last); the distractors keep their relative order.

    Args:
        positions: gold positions in ``[0, n_distractors]``.
    """
    _CHECKS["n_distractors"].check("n_distractors", n_distractors)
    _CHECKS["max_passage_chars"].check("max_passage_chars", max_passage_chars)
    if positions is None:
        positions = sorted({0, (n_distractors + 1) // 2, n_distractors})
    positions = list(positions)
    for p in positions:
        index_into(n_distractors + 1).check("positions", p)  # a slot among the n_distractors + 1 documents
    if len(set(positions)) != len(positions) or not positions:
        raise ValueError(f"positions: must be distinct and non-empty, got {positions!r}")
    qs = _pick(_squad_questions(articles, max_passage_chars, n_distractors), n, seed, "squad_reordered")
    out = []
    for q in qs:
        dis = _distractors(q, n_distractors, seed)
        for pos in positions:
            docs = dis[:pos] + [q.paragraph] + dis[pos:]
            out.append(with_content_id(_squad_item("squad_reordered", q, articles, docs, pos, seed), f"{q.qid}@{pos}"))
    return out


def _is_numeric(s: str) -> bool:
    return any(ch.isdigit() for ch in s)


def _answer_kind(s: str) -> tuple[bool, bool, bool]:
    """(numeric, a bare year, capitalised): a substitute answer keeps all three, so a year stands in
    for a year and "Arizona Cardinals" for a name."""
    s = s.strip()
    return _is_numeric(s), re.fullmatch(r"(1[0-9]|20)[0-9][0-9]", s) is not None, s[:1].isupper()


_WH = ("who", "whom", "whose", "when", "where", "why", "how", "what", "which")


def _wh_word(question: str) -> str:
    words = re.findall(r"[a-z]+", question.lower())
    for i, w in enumerate(words):
        if w in _WH:
            return w + (" " + words[i + 1] if w == "how" and i + 1 < len(words) else "")
    return ""


def squad_conflict(articles, *, n: int = 20, n_distractors: int = 4, seed: int = 0,
                   max_passage_chars: int = 800, max_answer_chars: int = 40) -> list[TaskItem]:
    """Contradictory answer strings: the gold paragraph, a copy of it whose answer (every occurrence of
    the first gold answer) is swapped for another answer of the same article, and
    ``n_distractors - 1`` distractors, in a seeded order. The substitute has the same kind (numeric,
    capitalised) and, when the article has one, answers a question of the same form (who, when,
    how many ...). Questions whose swapped copy would still contain a gold answer, or with no
    substitute, are skipped.
    """
    _CHECKS["n_distractors"].check("n_distractors", n_distractors)
    _CHECKS["max_passage_chars"].check("max_passage_chars", max_passage_chars)
    _CHECKS["max_answer_chars"].check("max_answer_chars", max_answer_chars)
    eligible = []
    article_answers = {}  # article -> [(answer, normalised, kind, wh-word of its question)]
    for q in _squad_questions(articles, max_passage_chars, n_distractors - 1):
        paras = articles[q.article]["paragraphs"]
        if q.article not in article_answers:
            article_answers[q.article] = [
                (a, normalize_answer(a), _answer_kind(a), _wh_word(qa["question"]))
                for p in paras for qa in p["qas"] if qa["answers"]
                for a in [qa["answers"][0]["text"].strip()] if a and len(a) <= max_answer_chars]
        gold = paras[q.paragraph]["context"]
        gold_norm = normalize_answer(gold)
        golds_norm = [normalize_answer(a) for a in q.answers]
        kind, wh = _answer_kind(q.answers[0]), _wh_word(q.question)
        cands = {}  # substitute -> whether its question asks the same way (who / when / how many ...)
        for a, a_norm, a_kind, a_wh in article_answers[q.article]:
            if a_kind == kind and a_norm and a_norm not in golds_norm and not _contains_norm(gold_norm, a_norm):
                cands[a] = cands.get(a, False) or a_wh == wh
        same = sorted(a for a, w in cands.items() if w)
        subs = same or sorted(cands)
        if not subs:
            continue
        sub = seeded_rng(seed, q.qid, "substitute").choice(subs)
        conflict = gold.replace(q.answers[0], sub)
        c_norm = normalize_answer(conflict)
        if sub not in conflict or any(_contains_norm(c_norm, a) for a in golds_norm):
            continue
        eligible.append((q, sub, conflict))
    picks = _pick(eligible, n, seed, "squad_conflict")
    out = []
    for q, sub, conflict in picks:
        paras = articles[q.article]["paragraphs"]
        dis = seeded_rng(seed, q.qid, "distractors").sample(list(q.pool), n_distractors - 1)
        order = ["gold", "conflict"] + dis
        seeded_rng(seed, q.qid, "order").shuffle(order)
        docs = [paras[q.paragraph]["context"] if o == "gold" else conflict if o == "conflict" else paras[o]["context"]
                for o in order]
        item = _squad_item("squad_conflict", q, articles, [], order.index("gold"), seed, documents=docs,
                           extra_meta={"conflict_position": order.index("conflict")},
                           conflict_answers=(sub,), conflict_doc=order.index("conflict"))
        out.append(with_content_id(item, f"{q.qid}~conflict"))
    return out
