"""Prompt families of SPEC §10, built deterministically from real public text.

Every builder is a pure function of its data, its arguments and ``seed`` (Python's ``random.Random``
seeded from a string, so results do not depend on ``PYTHONHASHSEED``), and returns
:class:`TaskItem` s: documents (one candidate chunk each), a query, the gold answers and the index
of the document that holds the answer. ``item.build(tokenizer)`` renders it with
:func:`workbench.run.prompt.build_prompt`. An item's id ends with a digest of its content, so a sweep
never confuses two different items.

SQuAD v1.1 dev (``datasets.load_squad``):

* ``squad_single`` — single-hop RAG: the gold paragraph and ``n_distractors`` paragraphs of the same
  article that do not contain a gold answer, in a seeded order.
* ``squad_reordered`` — the same documents with the gold paragraph moved to each of ``positions``
  (first, middle, last by default): one item per position.
* ``squad_conflict`` — contradictory answer strings: one distractor is replaced by a copy of the gold
  paragraph whose answer is swapped for another answer of the same article (numeric for numeric).
  The gold answers stay the original ones; ``conflict_answers`` holds the planted one.

Paul Graham essays (``datasets.load_essays``), lengths in tokens of the given tokenizer:

* ``needle`` — one fact ("The secret number of the amber heron is 48213.") inserted at each depth
  of a haystack of each length. The haystack (split into passages of about ``passage_tokens``
  tokens, the candidate chunks) depends on the length and replicate only, so depths compare like
  with like.
* ``needle_diffuse`` — diffuse evidence: three facts, each one ingredient of a secret recipe, spread
  over three passages; the answer needs all three (``answer_parts``).
* ``needle_bridge`` — multi-hop bridge: "The amber heron key is kept by Ada Brennick." and "Ada
  Brennick lives in the town of Osterleigh."; the question names only the key.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

import workbench.study.datasets as datasets
from workbench.checks import check_int
from workbench.run.prompt import DEFAULT_INSTRUCTION, build_prompt
from workbench.study.metrics import normalize_answer

__all__ = ["TaskItem", "items_frame", "load_items", "squad_single", "squad_reordered", "squad_conflict", "needle",
           "needle_diffuse", "needle_bridge", "TASKS", "build_task", "split_sentences", "TASK_MAX_NEW_TOKENS",
           "max_new_tokens_for"]


# ----------------------------------------------------------------------------- the item
@dataclass(frozen=True)
class TaskItem:
    """One prompt of a task family, tokenizer-free (render it with :meth:`build`).

    Attributes:
        task: the family name (``squad_single``, ``needle`` ...).
        item_id: unique within the family; ends with ``#`` and a digest of the content.
        documents: the passages, one candidate chunk each.
        query: the user question.
        answers: gold answers (any one counts for EM/F1/contains).
        answer_doc: index of the document that holds the (final) answer.
        evidence_docs: every document needed to answer (default ``(answer_doc,)``).
        answer_parts: diffuse evidence: the per-fact answers, each inside one evidence document.
        conflict_answers: contradictory items: the planted wrong answers.
        conflict_doc: index of the document holding the planted answer.
        instruction: the system instruction.
        meta: provenance (source ids, length, depth, seed ...); not part of the id digest.
    """

    task: str
    item_id: str
    documents: tuple[str, ...]
    query: str
    answers: tuple[str, ...]
    answer_doc: int
    evidence_docs: tuple[int, ...] = ()
    answer_parts: tuple[str, ...] = ()
    conflict_answers: tuple[str, ...] = ()
    conflict_doc: int | None = None
    instruction: str = DEFAULT_INSTRUCTION
    meta: dict = field(default_factory=dict, hash=False)

    def __post_init__(self):
        for name in ("documents", "answers", "evidence_docs", "answer_parts", "conflict_answers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.evidence_docs:
            object.__setattr__(self, "evidence_docs", (self.answer_doc,))
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"task: must be a non-empty string, got {self.task!r}")
        if not isinstance(self.item_id, str) or not self.item_id:
            raise ValueError(f"item_id: must be a non-empty string, got {self.item_id!r}")
        k = len(self.documents)
        if k == 0 or any(not isinstance(d, str) or not d.strip() for d in self.documents):
            raise ValueError("documents: must be a non-empty list of non-empty strings")
        if not isinstance(self.query, str) or not self.query.strip():
            raise ValueError("query: must be a non-empty string")
        if not self.answers or any(not isinstance(a, str) or not a.strip() for a in self.answers):
            raise ValueError(f"answers: must be a non-empty list of non-empty strings, got {self.answers!r}")
        if not isinstance(self.answer_doc, int) or isinstance(self.answer_doc, bool) or not 0 <= self.answer_doc < k:
            raise ValueError(f"answer_doc: must be an integer in [0, {k - 1}], got {self.answer_doc!r}")
        for e in self.evidence_docs:
            if not isinstance(e, int) or not 0 <= e < k:
                raise ValueError(f"evidence_docs: every index must be in [0, {k - 1}], got {self.evidence_docs!r}")
        if self.answer_doc not in self.evidence_docs:
            raise ValueError(f"evidence_docs: must contain answer_doc={self.answer_doc}, got {self.evidence_docs!r}")
        if self.conflict_doc is not None and not (isinstance(self.conflict_doc, int) and 0 <= self.conflict_doc < k):
            raise ValueError(f"conflict_doc: must be None or an integer in [0, {k - 1}], got {self.conflict_doc!r}")
        if self.conflict_answers and self.conflict_doc is None:
            raise ValueError("conflict_doc: must be given with conflict_answers")
        # the gold answer lies inside the gold passage (the property evaluation relies on)
        if self.answer_parts:
            for p in self.answer_parts:
                if not any(p in self.documents[e] for e in self.evidence_docs):
                    raise ValueError(f"answer_parts: {p!r} is in no evidence document {self.evidence_docs}")
        elif not any(a in self.documents[self.answer_doc] for a in self.answers):
            raise ValueError(f"answer_doc: no gold answer {self.answers!r} occurs in document {self.answer_doc}")

    # -----
    def build(self, tokenizer, **kw):
        """Render with :func:`workbench.run.prompt.build_prompt` (``answer_doc`` set)."""
        return build_prompt(tokenizer, self.documents, self.query, self.instruction, answer_doc=self.answer_doc, **kw)

    def content_digest(self) -> str:
        """sha256 (16 hex) of what the model sees and what is scored (not ``meta`` nor ``item_id``)."""
        d = self.to_dict()
        for k in ("item_id", "meta"):
            d.pop(k)
        return hashlib.sha256(json.dumps(d, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TaskItem":
        return cls(**d)

    def summary(self) -> dict:
        out = dict(task=self.task, item_id=self.item_id, n_docs=len(self.documents), answer_doc=self.answer_doc,
                   evidence_docs=list(self.evidence_docs), query=self.query, answer=self.answers[0],
                   n_answers=len(self.answers), doc_chars=sum(len(d) for d in self.documents),
                   conflict_answer=self.conflict_answers[0] if self.conflict_answers else None)
        out.update({f"meta_{k}": v for k, v in self.meta.items() if isinstance(v, (int, float, str, bool))})
        return out


def items_frame(items: Sequence[TaskItem]) -> pd.DataFrame:
    """One row per item: id, sizes, answer position, question, first gold answer, scalar meta."""
    return pd.DataFrame([it.summary() for it in items])


ITEM_FIELDS = ("task", "item_id", "documents", "query", "answers", "answer_doc", "evidence_docs", "answer_parts",
               "conflict_answers", "conflict_doc", "instruction", "meta")
REQUIRED_FIELDS = ("task", "documents", "query", "answers", "answer_doc")


def load_items(path) -> list[TaskItem]:
    """TaskItems from a JSONL file: one JSON object per line with :class:`TaskItem` fields (``task,
    documents, query, answers, answer_doc`` required; ``item_id`` optional, else ``line<N>``); blank lines
    and lines starting with ``#`` are skipped. Every item gets a content digest in its id (``<id>#<8 hex>``)
    and ``meta.source = "items:<file name>"`` unless it names its own source.

    Raises:
        ValueError: naming the file, the line and the field (``items: f.jsonl line 3: answer_doc: ...``);
            nothing is returned unless every line is valid.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"items: must be a readable JSONL file, got {str(path)!r}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    out, seen = [], set()
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"items: {path.name} line {i}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{where}: must be a JSON object of TaskItem fields, got {type(d).__name__}")
        unknown = sorted(set(d) - set(ITEM_FIELDS))
        if unknown:
            raise ValueError(f"{where}: {unknown[0]}: not a TaskItem field (fields: {', '.join(ITEM_FIELDS)})")
        missing = [f for f in REQUIRED_FIELDS if f not in d]
        if missing:
            raise ValueError(f"{where}: {missing[0]}: required field missing")
        for f in ("documents", "answers", "evidence_docs", "answer_parts", "conflict_answers"):
            if f in d and not isinstance(d[f], list):
                raise ValueError(f"{where}: {f}: must be a JSON list, got {type(d[f]).__name__}")
        for f in ("answer_doc", "conflict_doc"):
            if f in d and d[f] is not None and (isinstance(d[f], bool) or not isinstance(d[f], int)):
                raise ValueError(f"{where}: {f}: must be an integer, got {d[f]!r}")
        meta = d.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: meta: must be a JSON object, got {type(meta).__name__}")
        d["meta"] = {"source": f"items:{path.name}", "items_sha256": digest[:16], "line": i, **meta}
        base = d.pop("item_id", None) or f"line{i}"
        if not isinstance(base, str):
            raise ValueError(f"{where}: item_id: must be a string, got {base!r}")
        try:
            item = _finish(TaskItem(item_id="-", **d), base)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        if (item.task, base) in seen:
            raise ValueError(f"{where}: item_id: duplicate id {base!r} in task {item.task!r}")
        seen.add((item.task, base))
        out.append(item)
    if not out:
        raise ValueError(f"items: {path.name} holds no item")
    return out


def _finish(item: TaskItem, base_id: str) -> TaskItem:
    """Give an item its content-addressed id ``<base_id>#<digest8>``."""

    return replace(item, item_id=f"{base_id}#{item.content_digest()[:8]}")


def _rng(*parts) -> random.Random:
    return random.Random("/".join(str(p) for p in parts))


# ----------------------------------------------------------------------------- SQuAD families
def _contains_norm(text_norm: str, answer_norm: str) -> bool:
    """Whether a normalised answer is a whole-word run of a normalised text (metrics.contains_answer)."""
    return bool(answer_norm) and f" {answer_norm} " in f" {text_norm} "


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
                answers = tuple(dict.fromkeys(a["text"].strip() for a in qa["answers"] if a["text"].strip()))
                if not answers or answers[0] not in ctx:
                    continue
                a_pad = [f" {n} " for n in map(normalize_answer, answers) if n]
                pool = tuple(pj for pj in short if pj != pi and not any(a in padded[pj] for a in a_pad))
                if len(pool) >= min_pool:
                    out.append(_SquadQ(ai, pi, qa["id"], qa["question"].strip(), answers, pool))
    return out


def _pick(questions: list, n: int, seed, name: str) -> list:
    check_int("n", n, 1, len(questions))
    return _rng(seed, name, "pick").sample(questions, n)


def _squad_item(task, q: _SquadQ, articles, docs_idx: list[int], gold_pos: int, seed, extra_meta=None,
                documents=None, **kw) -> TaskItem:
    paras = articles[q.article]["paragraphs"]
    docs = documents if documents is not None else [paras[i]["context"] for i in docs_idx]
    meta = dict(source=datasets.provenance(articles)["label"], title=articles[q.article]["title"], qid=q.qid,
                paragraph=q.paragraph,
                gold_position=gold_pos, seed=seed)
    meta.update(extra_meta or {})
    return TaskItem(task=task, item_id=q.qid, documents=tuple(docs), query=q.question, answers=q.answers,
                    answer_doc=gold_pos, meta=meta, **kw)


def _distractors(q: _SquadQ, n_distractors: int, seed) -> list[int]:
    return _rng(seed, q.qid, "distractors").sample(list(q.pool), n_distractors)


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
    check_int("n_distractors", n_distractors, 1)
    check_int("max_passage_chars", max_passage_chars, 50)
    qs = _pick(_squad_questions(articles, max_passage_chars, n_distractors), n, seed, "squad_single")
    out = []
    for q in qs:
        docs = [q.paragraph] + _distractors(q, n_distractors, seed)
        _rng(seed, q.qid, "order").shuffle(docs)
        pos = docs.index(q.paragraph)
        out.append(_finish(_squad_item("squad_single", q, articles, docs, pos, seed), q.qid))
    return out


def squad_reordered(articles, *, n: int = 10, n_distractors: int = 4, positions: Sequence[int] | None = None,
                    seed: int = 0, max_passage_chars: int = 800) -> list[TaskItem]:
    """Reordered documents: for each question, the same documents with the gold paragraph at each of
    ``positions`` (default first, middle, last); the distractors keep their relative order.

    Args:
        positions: gold positions in ``[0, n_distractors]``.
    """
    check_int("n_distractors", n_distractors, 1)
    check_int("max_passage_chars", max_passage_chars, 50)
    if positions is None:
        positions = sorted({0, (n_distractors + 1) // 2, n_distractors})
    positions = list(positions)
    for p in positions:
        check_int("positions", p, 0, n_distractors)
    if len(set(positions)) != len(positions) or not positions:
        raise ValueError(f"positions: must be distinct and non-empty, got {positions!r}")
    qs = _pick(_squad_questions(articles, max_passage_chars, n_distractors), n, seed, "squad_reordered")
    out = []
    for q in qs:
        dis = _distractors(q, n_distractors, seed)
        for pos in positions:
            docs = dis[:pos] + [q.paragraph] + dis[pos:]
            out.append(_finish(_squad_item("squad_reordered", q, articles, docs, pos, seed), f"{q.qid}@{pos}"))
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
    check_int("n_distractors", n_distractors, 1)
    check_int("max_passage_chars", max_passage_chars, 50)
    check_int("max_answer_chars", max_answer_chars, 1)
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
        sub = _rng(seed, q.qid, "substitute").choice(subs)
        conflict = gold.replace(q.answers[0], sub)
        c_norm = normalize_answer(conflict)
        if sub not in conflict or any(_contains_norm(c_norm, a) for a in golds_norm):
            continue
        eligible.append((q, sub, conflict))
    picks = _pick(eligible, n, seed, "squad_conflict")
    out = []
    for q, sub, conflict in picks:
        paras = articles[q.article]["paragraphs"]
        dis = _rng(seed, q.qid, "distractors").sample(list(q.pool), n_distractors - 1)
        order = ["gold", "conflict"] + dis
        _rng(seed, q.qid, "order").shuffle(order)
        docs = [paras[q.paragraph]["context"] if o == "gold" else conflict if o == "conflict" else paras[o]["context"]
                for o in order]
        item = _squad_item("squad_conflict", q, articles, [], order.index("gold"), seed, documents=docs,
                           extra_meta={"conflict_position": order.index("conflict")},
                           conflict_answers=(sub,), conflict_doc=order.index("conflict"))
        out.append(_finish(item, f"{q.qid}~conflict"))
    return out


# ----------------------------------------------------------------------------- needle families
_COLORS = ("amber", "cobalt", "crimson", "ivory", "jade", "lilac", "ochre", "scarlet", "silver", "teal",
           "umber", "violet", "copper", "indigo", "saffron", "slate")
_ANIMALS = ("heron", "otter", "lynx", "badger", "falcon", "walrus", "gecko", "ibis", "marten", "newt",
            "puffin", "stoat", "tapir", "vole", "wren", "yak")
_INGREDIENTS = ("figs", "almonds", "honey", "cardamom", "lentils", "apricots", "walnuts", "fennel", "plums",
                "sesame", "chestnuts", "quinces", "barley", "juniper", "rhubarb", "pistachios", "sorrel",
                "nutmeg", "cranberries", "parsnips")
_FIRST = ("Ada", "Bruno", "Clara", "Dmitri", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kaja", "Lionel")
_LAST = ("Brennick", "Castellow", "Dunmore", "Eskeland", "Farrow", "Gallivan", "Hollister", "Ingram",
         "Jessop", "Kettering", "Lockhart", "Marlowe")
_TOWN_A = ("Oster", "Wend", "Kal", "Brun", "Tarn", "Mel", "Quen", "Hald", "Vor", "Lind")
_TOWN_B = ("leigh", "mark", "stead", "bury", "holm", "wick", "ford", "dal")

_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[a-z0-9][.!?])(?=[A-Z])")


def split_sentences(text: str) -> list[str]:
    """Sentences of an essay (whitespace collapsed; the essays' lost paragraph breaks, as in
    ``accelerating.We``, are split too)."""
    text = " ".join(text.split())
    return [s.strip() for s in _SENT_SPLIT.split(text) if s.strip()]


def _count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


class _Haystack:
    """Sentences of the essays in a seeded order, grouped into passages, at most ``budget`` tokens."""

    def __init__(self, tokenizer, essays: dict, budget: int, passage_tokens: int, rng: random.Random):
        names = sorted(essays)
        rng.shuffle(names)
        sents, counts, used, total, full = [], [], [], 0, False
        for name in names:
            used.append(name)
            for s in split_sentences(essays[name]):
                c = _count_tokens(tokenizer, " " + s)
                if total + c > budget:
                    full = True
                    break
                sents.append(s)
                counts.append(c)
                total += c
            if full:
                break
        if not full:
            raise ValueError(f"lengths: the essays hold only ~{total} tokens, fewer than {budget}; "
                             "use shorter lengths or more essays (source='cache')")
        self.sentences, self.counts, self.total, self.essays = sents, counts, total, used
        # passages: consecutive sentences, closed when the next sentence would pass passage_tokens
        self.passages: list[list[int]] = []
        cur, cur_t = [], 0
        for i, c in enumerate(counts):
            if cur and cur_t + c > passage_tokens:
                self.passages.append(cur)
                cur, cur_t = [], 0
            cur.append(i)
            cur_t += c
        if cur:
            self.passages.append(cur)

    def slot(self, depth: float) -> tuple[int, int]:
        """``(passage, index in passage)`` of the sentence boundary at ``depth`` of the tokens."""
        target, acc = depth * self.total, 0
        b = len(self.sentences)
        for i, c in enumerate(self.counts):
            if acc + c / 2 >= target:
                b = i
                break
            acc += c
        for p, idx in enumerate(self.passages):
            if b <= idx[-1]:
                return p, idx.index(b)
        return len(self.passages) - 1, len(self.passages[-1])

    def documents(self, needles: Sequence[tuple[float, str]]) -> tuple[list[str], list[int]]:
        """Passages with each ``(depth, sentence)`` inserted; returns the documents and, per needle,
        the index of its document."""
        inserts: dict[int, list[tuple[int, int, str]]] = {}
        for n_i, (depth, sentence) in enumerate(needles):
            p, j = self.slot(depth)
            inserts.setdefault(p, []).append((j, n_i, sentence))
        docs, where = [], [0] * len(needles)
        for p, idx in enumerate(self.passages):
            sents = [self.sentences[i] for i in idx]
            for j, n_i, sentence in sorted(inserts.get(p, []), reverse=True):
                sents.insert(j, sentence)
                where[n_i] = p
            docs.append(" ".join(sents))
        return docs, where


def _check_needle_args(lengths, n, passage_tokens):
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths: must be a non-empty list of token counts")
    for L in lengths:
        check_int("lengths", L, 64, 1_000_000)
    check_int("n", n, 1)
    check_int("passage_tokens", passage_tokens, 16)
    return lengths


def _check_depth(name, d):
    if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0.0 <= d <= 1.0:
        raise ValueError(f"{name}: every depth must be a number in [0, 1], got {d!r}")
    return float(d)


def _entity(rng) -> tuple[str, str]:
    return rng.choice(_COLORS), rng.choice(_ANIMALS)


def _needle_family(task, tokenizer, essays, lengths, n, seed, passage_tokens, layouts, make_facts):
    """Shared loop: for each replicate, one fact set; for each length, one haystack; for each layout
    (depths), one item."""
    if not essays:
        raise ValueError("essays: must be a non-empty {name: text} mapping")
    out = []
    for rep in range(n):
        facts = make_facts(_rng(seed, task, rep, "facts"))
        need = sum(_count_tokens(tokenizer, " " + s) for s in facts["sentences"])
        for L in lengths:
            hay = _Haystack(tokenizer, essays, L - need, passage_tokens, _rng(seed, task, rep, L, "haystack"))
            for depths in layouts:
                docs, where = hay.documents(list(zip(depths, facts["sentences"])))
                kw = dict(answer_parts=facts.get("parts", ()))
                evidence = tuple(dict.fromkeys(where))
                answer_doc = where[facts.get("answer_fact", 0)]
                depth_tag = "-".join(f"{d:.2f}" for d in depths)
                meta = dict(source=datasets.provenance(essays)["label"], length=L, depth=float(depths[0]),
                            depths=depth_tag, rep=rep, seed=seed, haystack_tokens=hay.total + need,
                            passages=len(docs), essays=",".join(hay.essays))
                item = TaskItem(task=task, item_id="-", documents=tuple(docs), query=facts["query"],
                                answers=facts["answers"], answer_doc=answer_doc, evidence_docs=evidence,
                                meta=meta, **kw)
                out.append(_finish(item, f"{task}-L{L}-d{depth_tag}-r{rep}"))
    return out


def needle(tokenizer, essays: dict, *, lengths: Sequence[int] = (512, 1024, 2048),
           depths: Sequence[float] = (0.1, 0.5, 0.9), n: int = 1, seed: int = 0,
           passage_tokens: int = 128) -> list[TaskItem]:
    """Needle in a haystack: one secret-number fact at each depth of a haystack of each length.

    Args:
        tokenizer: measures lengths (the haystack plus needle is at most ``length`` tokens, short of
            it by less than one sentence).
        essays: ``{name: text}`` (:func:`workbench.study.datasets.load_essays`).
        lengths: haystack lengths in tokens, each in ``[64, 10^6]``.
        depths: relative needle positions in ``[0, 1]`` (0 = start, 1 = end).
        n: replicates (different facts and haystacks), ``≥ 1``.
        passage_tokens: passage (candidate chunk) size in tokens, ``≥ 16``.
    """
    lengths = _check_needle_args(lengths, n, passage_tokens)
    layouts = [(_check_depth("depths", d),) for d in depths]
    if not layouts:
        raise ValueError("depths: must be a non-empty list")

    def facts(rng):
        color, animal = _entity(rng)
        num = str(rng.randint(10000, 99999))
        return dict(sentences=[f"The secret number of the {color} {animal} is {num}."],
                    query=f"What is the secret number of the {color} {animal}?", answers=(num,))

    return _needle_family("needle", tokenizer, essays, lengths, n, seed, passage_tokens, layouts, facts)


def needle_diffuse(tokenizer, essays: dict, *, lengths: Sequence[int] = (512, 1024, 2048),
                   spread: Sequence[float] = (0.15, 0.5, 0.85), n: int = 1, seed: int = 0,
                   passage_tokens: int = 128) -> list[TaskItem]:
    """Diffuse evidence: ``len(spread)`` facts, each one ingredient of a secret recipe, at the depths
    ``spread`` (increasing, at least 2); the gold answer lists them all ("figs, almonds and honey"),
    ``answer_parts`` holds each (``contains`` needs all of them)."""
    lengths = _check_needle_args(lengths, n, passage_tokens)
    spread = tuple(_check_depth("spread", d) for d in spread)
    if len(spread) < 2 or list(spread) != sorted(spread) or len(set(spread)) != len(spread):
        raise ValueError(f"spread: must be >= 2 strictly increasing depths, got {spread!r}")
    m = len(spread)
    words = {2: "two", 3: "three", 4: "four", 5: "five"}

    def facts(rng):
        color, animal = _entity(rng)
        ings = rng.sample(_INGREDIENTS, m)
        count = words.get(m, str(m))
        return dict(sentences=[f"One of the {count} secret ingredients of the {color} {animal} pie is {x}."
                               for x in ings],
                    query=f"What are the {count} secret ingredients of the {color} {animal} pie?",
                    answers=(", ".join(ings[:-1]) + " and " + ings[-1],), parts=tuple(ings))

    return _needle_family("needle_diffuse", tokenizer, essays, lengths, n, seed, passage_tokens, [spread], facts)


def needle_bridge(tokenizer, essays: dict, *, lengths: Sequence[int] = (512, 1024, 2048),
                  depth_pairs: Sequence[tuple[float, float]] = ((0.2, 0.8), (0.8, 0.2)), n: int = 1,
                  seed: int = 0, passage_tokens: int = 128) -> list[TaskItem]:
    """Multi-hop bridge: "The <entity> key is kept by <person>." at the first depth of each pair and
    "<person> lives in the town of <town>." at the second; the question names only the key. The
    answer document is the second fact's; both are evidence."""
    lengths = _check_needle_args(lengths, n, passage_tokens)
    layouts = []
    for pair in depth_pairs:
        if len(pair) != 2:
            raise ValueError(f"depth_pairs: every entry must be (depth of hop 1, depth of hop 2), got {pair!r}")
        layouts.append(tuple(_check_depth("depth_pairs", d) for d in pair))
    if not layouts:
        raise ValueError("depth_pairs: must be a non-empty list")

    def facts(rng):
        color, animal = _entity(rng)
        person = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        town = rng.choice(_TOWN_A) + rng.choice(_TOWN_B)
        return dict(sentences=[f"The {color} {animal} key is kept by {person}.",
                               f"{person} lives in the town of {town}."],
                    query=f"In which town does the keeper of the {color} {animal} key live?",
                    answers=(town,), answer_fact=1)

    return _needle_family("needle_bridge", tokenizer, essays, lengths, n, seed, passage_tokens, layouts, facts)


# ----------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class TaskFamily:
    """A named builder: ``data`` is the source it reads (``squad`` or ``essays``)."""

    name: str
    builder: Callable
    data: str
    needs_tokenizer: bool
    description: str


TASKS: dict[str, TaskFamily] = {
    "squad_single": TaskFamily("squad_single", squad_single, "squad", False, "single-hop retrieval (SQuAD)"),
    "squad_reordered": TaskFamily("squad_reordered", squad_reordered, "squad", False, "reordered documents (SQuAD)"),
    "squad_conflict": TaskFamily("squad_conflict", squad_conflict, "squad", False, "contradictory answer (SQuAD)"),
    "needle": TaskFamily("needle", needle, "essays", True, "needle in a haystack (lengths x depths)"),
    "needle_diffuse": TaskFamily("needle_diffuse", needle_diffuse, "essays", True, "diffuse evidence"),
    "needle_bridge": TaskFamily("needle_bridge", needle_bridge, "essays", True, "multi-hop bridge"),
}


# greedy tokens a reply of each family needs (SmolLM2-class chat models preface the answer: "The secret number
# of the amber heron is 48213." is ~17 tokens); a reply that uses them all is flagged `hit_cap` by the sweep
TASK_MAX_NEW_TOKENS = {"squad_single": 32, "squad_reordered": 32, "squad_conflict": 32, "needle": 32,
                       "needle_diffuse": 40, "needle_bridge": 32,
                       # RULER-style families (workbench.study.ruler; RULER's own budgets, raised for chatty replies)
                       "niah_single": 32, "niah_multikey": 32, "niah_multivalue": 64, "niah_multiquery": 64,
                       "variable_tracking": 48, "common_words": 120, "frequent_words": 50, "qa_distractors": 32}
DEFAULT_MAX_NEW_TOKENS = 32


def max_new_tokens_for(task: str) -> int:
    """The default decode length of a family (:data:`TASK_MAX_NEW_TOKENS`, else ``DEFAULT_MAX_NEW_TOKENS``)."""
    return TASK_MAX_NEW_TOKENS.get(task, DEFAULT_MAX_NEW_TOKENS)


def build_task(name: str, tokenizer=None, *, source="cache", **kw) -> list[TaskItem]:
    """Build a family by name from its data (``source``: ``"cache"``, ``"sample"`` or a path; see
    :mod:`workbench.study.datasets`). Keyword arguments go to the builder (``n``, ``seed`` ...)."""

    if name not in TASKS:
        raise ValueError(f"name: must be one of {sorted(TASKS)}, got {name!r}")
    fam = TASKS[name]
    if fam.needs_tokenizer and tokenizer is None:
        raise ValueError(f"tokenizer: {name} measures lengths in tokens; pass the model's tokenizer")
    if fam.data == "squad":
        return fam.builder(datasets.load_squad(source), **kw)
    return fam.builder(tokenizer, datasets.load_essays(source), **kw)
