"""RULER-style synthetic tasks (Hsieh et al. 2024, "RULER: What's the real context size of your long-context
language models?"), built offline and deterministically from a seed, so results sit beside kvpress's RULER
numbers. **[reconstructed]** from the paper's task descriptions and its public scorer; the prompts are this
workbench's own wording (a chat template and our ``DEFAULT_INSTRUCTION`` wrap them), and the haystack is the
paper's repeated noise sentence unless ``haystack`` passes texts (e.g. ``datasets.load_essays``).

Families (``RULER_TASKS``), each a pure function of its arguments and ``seed``, at each of ``lengths``
(prompt-content tokens of the given tokenizer, from 1k up to the model's context):

* ``niah_single`` — one "special magic number" for a key; ask for it.
* ``niah_multikey`` — the asked key among ``n_distractors`` needles of other keys.
* ``niah_multivalue`` — ``n_values`` numbers for one key; all are wanted.
* ``niah_multiquery`` — ``n_queries`` keys, each with its number; all are asked at once.
* ``variable_tracking`` — a chain ``VAR A = 12345``, ``VAR B = VAR A`` …; name every variable holding the value.
* ``common_words`` — a numbered word list in which ``n_common`` words recur; name the ``n_common`` most common.
* ``frequent_words`` — coded words drawn from a Zipf law (α = 2); name the three most frequent.
* ``qa_distractors`` — a SQuAD-format question's paragraph among distractor paragraphs up to the length.

Scoring (the official RULER scorer, over the whole reply, every line): :func:`string_match_all` (the
fraction of the references found, case-insensitive) for tasks whose references are all wanted
(``answer_parts``), :func:`string_match_part` (1 when any reference is found) for the others. The sweep
reports it as the ``match`` column (:func:`workbench.study.metrics.answer_scores`).
"""
from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import workbench.study.datasets as datasets
from workbench.checks import Interval
from workbench.constraints import register_all
from workbench.study.metrics import string_match_all, string_match_part
from workbench.study.tasks.haystack import Haystack, check_lengths, count_tokens, group_passages
from workbench.study.tasks.item import TaskItem, seeded_rng, with_content_id
from workbench.study.tasks.squad import squad_answers

__all__ = ["RULER_TASKS", "build_ruler", "ruler_grid", "grid_units", "score", "string_match_all", "string_match_part", "NOISE",
           "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "variable_tracking",
           "common_words", "frequent_words", "qa_distractors"]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_SYL = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "be", "do", "fu", "ga", "hi", "ju", "pe", "so", "wa", "xe")
_CHECKS = register_all("ruler", {
    "n_distractors": Interval("int", 1, 50), "n_values": Interval("int", 2, 20), "n_queries": Interval("int", 2, 20),
    "n_hops": Interval("int", 1, 20), "n_common": Interval("int", 1, 50), "vocab": Interval("int", 10, 10_000),
    "alpha": Interval("real", 1.0, None, closed="neither", what="a number")}, __name__)
"""The size arguments of the RULER-style families."""


def _word(rng: random.Random, syllables: int = 3) -> str:
    return "".join(rng.choice(_SYL) for _ in range(syllables))


def _words(rng: random.Random, n: int, syllables: int = 3, avoid: Sequence[str] = ()) -> list[str]:
    """``n`` distinct pseudo-words of ``syllables`` syllables, none containing (or inside) a word of ``avoid``
    (scoring is by substring)."""
    if n > len(_SYL) ** syllables // 4:
        raise ValueError(f"n: {n} distinct words of {syllables} syllables would take too long to draw")
    out, seen = [], set()
    while len(out) < n:
        w = _word(rng, syllables)
        if w not in seen and not any(a in w or w in a for a in avoid):
            seen.add(w)
            out.append(w)
    return out


def _keys(rng: random.Random, n: int) -> list[str]:
    return [f"{a}-{b}" for a, b in zip(_words(rng, n, 2), _words(rng, n, 3))]


def _numbers(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        v = str(rng.randint(1_000_000, 9_999_999))
        if v not in out:
            out.append(v)
    return out


MIN_LENGTH = 256  # tokens: the shortest RULER-style prompt


def _haystack_texts(tokenizer, haystack, budget: int) -> dict:
    if haystack is None:  # the paper's noise: one sentence block, repeated past the budget
        reps = budget // max(1, count_tokens(tokenizer, " " + NOISE)) + 2
        return {"noise": " ".join([NOISE] * reps)}
    return haystack


def _label(haystack) -> str:
    return "ruler-noise" if haystack is None else datasets.provenance(haystack)["label"]


def _needle_items(task, tokenizer, lengths, n, seed, passage_tokens, haystack, make):
    """For each replicate and length: ``make(rng) -> dict(sentences, depths, query, answers, parts, answer_fact)``;
    the sentences go at their depths of a haystack filling the rest of the length."""
    lengths = check_lengths(lengths, n, passage_tokens, min_length=MIN_LENGTH)
    out = []
    for rep in range(n):
        spec = make(seeded_rng(seed, task, rep, "facts"))
        need = sum(count_tokens(tokenizer, " " + s) for s in spec["sentences"])
        for L in lengths:
            if need >= L:
                raise ValueError(f"lengths: {L} tokens cannot hold the {need} tokens of the {task} needles")
            texts = _haystack_texts(tokenizer, haystack, L - need)
            hay = Haystack(tokenizer, texts, L - need, passage_tokens, seeded_rng(seed, task, rep, L, "haystack"),
                           region=haystack is not None)  # given texts: each prompt its own region; noise: the same
            docs, where = hay.documents(list(zip(spec["depths"], spec["sentences"])))
            evidence = tuple(dict.fromkeys(where[i] for i in spec.get("evidence", range(len(where)))))
            answer_doc = where[spec.get("answer_fact", 0)]
            if answer_doc not in evidence:
                evidence = (answer_doc, *evidence)
            meta = dict(source=_label(haystack), family="ruler", length=L, rep=rep, seed=seed,
                        haystack_tokens=hay.total + need, passages=len(docs), metric=spec["metric"],
                        region_start=hay.start, cluster=f"{task}-r{rep}-s{seed}")  # one fact at every length
            item = TaskItem(task=task, item_id="-", documents=tuple(docs), query=spec["query"],
                            answers=spec["answers"], answer_doc=answer_doc, evidence_docs=evidence,
                            answer_parts=spec.get("parts", ()), meta=meta)
            out.append(with_content_id(item, f"{task}-L{L}-r{rep}"))
    return out


def _depths(rng: random.Random, k: int) -> list[float]:
    return [round(rng.uniform(0.05, 0.95), 3) for _ in range(k)]


def _magic(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def niah_single(tokenizer, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1, seed: int = 0,
                passage_tokens: int = 128, haystack: dict | None = None) -> list[TaskItem]:
    """Single needle: one magic number for one key at a seeded depth; string_match_part."""

    def make(rng):
        key, val = _keys(rng, 1)[0], _numbers(rng, 1)[0]
        return dict(sentences=[_magic(key, val)], depths=_depths(rng, 1), answers=(val,), metric="part",
                    query=f"What is the special magic number for {key} mentioned in the provided text?")

    return _needle_items("niah_single", tokenizer, lengths, n, seed, passage_tokens, haystack, make)


def niah_multikey(tokenizer, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1, seed: int = 0,
                  n_distractors: int = 3, passage_tokens: int = 128, haystack: dict | None = None) -> list[TaskItem]:
    """The asked key's needle among ``n_distractors`` needles of other keys; string_match_part."""
    _CHECKS["n_distractors"].check("n_distractors", n_distractors)

    def make(rng):
        keys, vals = _keys(rng, 1 + n_distractors), _numbers(rng, 1 + n_distractors)
        return dict(sentences=[_magic(k, v) for k, v in zip(keys, vals)], depths=_depths(rng, 1 + n_distractors),
                    answers=(vals[0],), evidence=[0], metric="part",
                    query=f"What is the special magic number for {keys[0]} mentioned in the provided text?")

    return _needle_items("niah_multikey", tokenizer, lengths, n, seed, passage_tokens, haystack, make)


def niah_multivalue(tokenizer, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1, seed: int = 0,
                    n_values: int = 4, passage_tokens: int = 128, haystack: dict | None = None) -> list[TaskItem]:
    """``n_values`` magic numbers for one key, all wanted; string_match_all."""
    _CHECKS["n_values"].check("n_values", n_values)

    def make(rng):
        key, vals = _keys(rng, 1)[0], _numbers(rng, n_values)
        return dict(sentences=[_magic(key, v) for v in vals], depths=sorted(_depths(rng, n_values)),
                    answers=(", ".join(vals),), parts=tuple(vals), metric="all",
                    query=f"What are all the special magic numbers for {key} mentioned in the provided text?")

    return _needle_items("niah_multivalue", tokenizer, lengths, n, seed, passage_tokens, haystack, make)


def niah_multiquery(tokenizer, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1, seed: int = 0,
                    n_queries: int = 4, passage_tokens: int = 128, haystack: dict | None = None) -> list[TaskItem]:
    """``n_queries`` keys with one number each, all asked at once; string_match_all."""
    _CHECKS["n_queries"].check("n_queries", n_queries)

    def make(rng):
        keys, vals = _keys(rng, n_queries), _numbers(rng, n_queries)
        return dict(sentences=[_magic(k, v) for k, v in zip(keys, vals)], depths=_depths(rng, n_queries),
                    answers=(", ".join(vals),), parts=tuple(vals), metric="all",
                    query="What are all the special magic numbers for " + ", ".join(keys[:-1]) + f" and {keys[-1]} "
                          "mentioned in the provided text?")

    return _needle_items("niah_multiquery", tokenizer, lengths, n, seed, passage_tokens, haystack, make)


def variable_tracking(tokenizer, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1, seed: int = 0,
                      n_hops: int = 4, passage_tokens: int = 128, haystack: dict | None = None) -> list[TaskItem]:
    """A chain of ``n_hops`` assignments from one value; every variable in it is wanted; string_match_all."""
    _CHECKS["n_hops"].check("n_hops", n_hops)

    def make(rng):
        names = [w.upper() for w in _words(rng, n_hops + 1, 3)]
        val = str(rng.randint(10000, 99999))
        sents = [f"VAR {names[0]} = {val}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, n_hops + 1)]
        return dict(sentences=sents, depths=sorted(_depths(rng, n_hops + 1)), answers=(" ".join(names),),
                    parts=tuple(names), answer_fact=n_hops, metric="all",
                    query=f"Find all variables that are assigned the value {val} in the text above.")

    return _needle_items("variable_tracking", tokenizer, lengths, n, seed, passage_tokens, haystack, make)


def _list_items(task, tokenizer, lengths, n, seed, passage_tokens, make_words, query, parts_of):
    """Word-list families: ``make_words(rng, budget_words) -> words`` (in order) at each length, chunked."""
    lengths = check_lengths(lengths, n, passage_tokens, min_length=MIN_LENGTH)
    out = []
    per_word = max(1, count_tokens(tokenizer, " 12. kalomi"))
    for rep in range(n):
        for L in lengths:
            budget = max(20, L // per_word)
            for _ in range(20):  # shrink the word budget until the list fits the length (redrawn each time)
                words = make_words(seeded_rng(seed, task, rep, L), budget)
                lines = [f"{i + 1}. {w}" for i, w in enumerate(words)]
                t = count_tokens(tokenizer, " ".join(lines))
                if t <= L:
                    break
                budget = max(20, int(budget * L / t * 0.98))
            kept = [ln.split(". ", 1)[1] for ln in lines]
            parts = parts_of(kept)
            counts = [count_tokens(tokenizer, " " + ln) for ln in lines]
            docs = [" ".join(lines[i] for i in idx) for idx in group_passages(counts, passage_tokens)]
            ev = tuple(i for i, d in enumerate(docs) if any(f". {p}" in d for p in parts))
            meta = dict(source="ruler-synthetic-words", family="ruler", length=L, rep=rep, seed=seed,
                        words=len(kept), passages=len(docs), metric="all", cluster=f"{task}-L{L}-r{rep}-s{seed}")
            item = TaskItem(task=task, item_id="-", documents=tuple(docs), query=query, answers=(" ".join(parts),),
                            answer_doc=ev[0], evidence_docs=ev, answer_parts=tuple(parts), meta=meta)
            out.append(with_content_id(item, f"{task}-L{L}-r{rep}"))
    return out


def common_words(tokenizer, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1, seed: int = 0,
                 n_common: int = 10, passage_tokens: int = 128) -> list[TaskItem]:
    """A numbered word list: ``n_common`` words recur (RULER's cwe: 30 times at long lengths, fewer when the
    list is short), every other word appears at most 3 times; string_match_all over the ``n_common``."""
    _CHECKS["n_common"].check("n_common", n_common)

    def make(rng, budget):
        freq = max(4, min(30, budget // (3 * n_common)))
        common = _words(rng, n_common)
        n_rare = max(1, (budget - freq * n_common) // 3)
        rare = _words(rng, n_rare, 4, avoid=common)
        words = common * freq + rare * 3
        rng.shuffle(words)
        return words

    def parts(kept):
        c = Counter(kept).most_common()
        if len(c) > n_common and c[n_common - 1][1] <= c[n_common][1]:
            raise ValueError(f"lengths: the list is too short for {n_common} distinct common words")
        return [w for w, _ in c[:n_common]]

    return _list_items("common_words", tokenizer, lengths, n, seed, passage_tokens, make,
                       f"What are the {n_common} most common words in the above list?", parts)


def frequent_words(tokenizer, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1, seed: int = 0,
                   alpha: float = 2.0, vocab: int = 200, passage_tokens: int = 128) -> list[TaskItem]:
    """Coded words drawn from a Zipf law (``p_k ∝ k^-alpha`` over ``vocab`` words, RULER's fwe); the three most
    frequent are wanted (ties at rank 3 are redrawn); string_match_all."""
    _CHECKS["vocab"].check("vocab", vocab)
    _CHECKS["alpha"].check("alpha", alpha)
    weights = [1.0 / (k ** alpha) for k in range(1, vocab + 1)]

    def make(rng, budget):
        words = _words(rng, vocab)
        for _ in range(50):
            draw = rng.choices(words, weights, k=budget)
            c = Counter(draw).most_common(4)
            if len(c) == 4 and c[2][1] > c[3][1]:
                return draw
        return draw

    def parts(kept):
        c = Counter(kept).most_common(4)
        if len(c) < 4 or c[2][1] <= c[3][1]:
            raise ValueError("seed: the Zipf draw has a tie at rank 3; try another seed or length")
        return [w for w, _ in c[:3]]

    return _list_items("frequent_words", tokenizer, lengths, n, seed, passage_tokens, make,
                       "What are the three most frequently appearing coded words in the above list?", parts)


def qa_distractors(tokenizer, articles=None, *, lengths: Sequence[int] = (1024, 2048, 4096), n: int = 1,
                   seed: int = 0, max_passage_chars: int = 800) -> list[TaskItem]:
    """Question answering with distractors: a SQuAD-format question's paragraph among paragraphs of the other
    articles (none holding a gold answer) up to the length, the gold at a seeded position; string_match_part.
    ``articles``: SQuAD-format articles (default: the bundled sample, ``datasets.load_squad("sample")``)."""
    lengths = check_lengths(lengths, n, 16, min_length=MIN_LENGTH)
    arts = articles if articles is not None else datasets.load_squad("sample")
    label = datasets.provenance(arts)["label"]
    paras = [(ai, p["context"]) for ai, a in enumerate(arts) for p in a["paragraphs"] if len(p["context"]) <= max_passage_chars]
    qs = [(ai, p["context"], qa, answers) for ai, a in enumerate(arts) for p in a["paragraphs"]
          if len(p["context"]) <= max_passage_chars for qa in p["qas"]
          for answers in [squad_answers(qa, p["context"])] if answers]
    if len(qs) < n:
        raise ValueError(f"n: the articles hold {len(qs)} usable questions, fewer than {n}")
    picks = seeded_rng(seed, "qa_distractors", "pick").sample(qs, n)
    counts = {c: count_tokens(tokenizer, " " + c) for _, c in paras}
    out = []
    for rep, (ai, gold, qa, answers) in enumerate(picks):
        pool = [c for aj, c in paras if aj != ai and not any(a.lower() in c.lower() for a in answers)]
        for L in lengths:
            rng = seeded_rng(seed, "qa_distractors", rep, L)
            order = pool[:]
            rng.shuffle(order)
            docs, total = [], counts[gold]
            for c in order:
                if total + counts[c] > L:
                    continue
                docs.append(c)
                total += counts[c]
            pos = rng.randint(0, len(docs))
            docs.insert(pos, gold)
            meta = dict(source=label, family="ruler", length=L, rep=rep, seed=seed, qid=qa["id"], gold_position=pos,
                        haystack_tokens=total, passages=len(docs), metric="part", cluster=f"qa-{qa['id']}")
            item = TaskItem(task="qa_distractors", item_id="-", documents=tuple(docs), query=qa["question"].strip(),
                            answers=answers, answer_doc=pos, meta=meta)
            out.append(with_content_id(item, f"qa_distractors-L{L}-{qa['id']}"))
    return out


@dataclass(frozen=True)
class RulerTask:
    """A family: its builder and its scorer (``"all"``: string_match_all, ``"part"``: string_match_part); its
    decode length is ``tasks.TASK_MAX_NEW_TOKENS[name]``."""

    name: str
    builder: Callable
    metric: str


RULER_TASKS: dict[str, RulerTask] = {t.name: t for t in (
    RulerTask("niah_single", niah_single, "part"), RulerTask("niah_multikey", niah_multikey, "part"),
    RulerTask("niah_multivalue", niah_multivalue, "all"), RulerTask("niah_multiquery", niah_multiquery, "all"),
    RulerTask("variable_tracking", variable_tracking, "all"), RulerTask("common_words", common_words, "all"),
    RulerTask("frequent_words", frequent_words, "all"), RulerTask("qa_distractors", qa_distractors, "part"))}


def build_ruler(name: str, tokenizer, **kw) -> list[TaskItem]:
    """Build a RULER-style family by name (keyword arguments go to its builder: ``lengths``, ``n``, ``seed`` …)."""
    if name not in RULER_TASKS:
        raise ValueError(f"name: must be one of {sorted(RULER_TASKS)}, got {name!r}")
    return RULER_TASKS[name].builder(tokenizer, **kw)


def grid_units(name: str, lengths: Sequence[int], seeds: int) -> int:
    """The independent units (``meta.cluster``) :func:`ruler_grid` builds for family ``name`` at ``lengths`` and
    ``seeds`` seeds, without a tokenizer: the needle families share one fact across lengths (a unit per seed), the
    word-list families draw anew at every length (a unit per length and seed), qa_distractors a question per seed
    (two seeds may draw the same question: an upper bound there, which the split itself checks again)."""
    if name not in RULER_TASKS:
        raise ValueError(f"name: must be one of {sorted(RULER_TASKS)}, got {name!r}")
    return seeds * (len(set(lengths)) if name in ("common_words", "frequent_words") else 1)


def ruler_grid(tokenizer, names: Sequence[str] = ("niah_single", "niah_multikey", "variable_tracking",
                                                   "common_words"),
               *, lengths: Sequence[int] = (1024, 2048, 4096), seeds: Sequence[int] = range(10),
               max_context: int | None = None) -> list[TaskItem]:
    """A grid of families × lengths × seeds (one item each); ``max_context`` refuses lengths the model cannot hold
    (the chat template and instruction add ~60 tokens, so the longest usable length is a little under it)."""
    lengths = list(lengths)
    if max_context is not None:
        bad = [L for L in lengths if L > max_context - 128]
        if bad:
            raise ValueError(f"lengths: {bad} exceed the model's context {max_context} (less 128 for the template)")
    out = []
    for name in names:
        for s in seeds:
            out += build_ruler(name, tokenizer, lengths=lengths, n=1, seed=int(s))
    return out


def score(reply: str, item: TaskItem) -> float:
    """The RULER score of a reply: string_match_all over ``answer_parts`` when the item has them, else
    string_match_part over ``answers``."""
    return string_match_all(reply, item.answer_parts) if item.answer_parts else string_match_part(reply, item.answers)
