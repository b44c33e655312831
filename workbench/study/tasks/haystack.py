"""Haystacks shared by the needle families and the RULER-style tasks (:mod:`workbench.study.ruler`): texts split
into sentences, drawn in a seeded order, grouped into passages (the candidate chunks) of about ``passage_tokens``
tokens (:func:`group_passages`, also the RULER word lists' passages), with facts inserted at relative depths; and
the one check of their length arguments."""
from __future__ import annotations

import random
import re
from collections.abc import Sequence

from workbench.checks import Constraint, Interval
from workbench.constraints import register_all

__all__ = ["Haystack", "split_sentences", "count_tokens", "group_passages", "check_lengths", "check_depth",
           "check_filler_text", "SENTENCE_SPLIT", "MAX_SENTENCE_CHARS"]

SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[a-z0-9][.!?])(?=[A-Z])")

_CHECKS = register_all("haystack", {"n": Interval("int", 1), "passage_tokens": Interval("int", 16)}, __name__)
"""The replicates and the passage size of a haystack family (:func:`check_lengths`)."""


def _length(min_length: int) -> Constraint:
    """A haystack length in tokens, from the family's ``min_length`` on: an integer in ``[min_length, 10^6]``."""
    return Interval("int", min_length, 1_000_000)


def split_sentences(text: str) -> list[str]:
    """Sentences of an essay (whitespace collapsed; the essays' lost paragraph breaks, as in
    ``accelerating.We``, are split too)."""
    text = " ".join(text.split())
    return [s.strip() for s in SENTENCE_SPLIT.split(text) if s.strip()]


# a haystack is cut at sentence boundaries; a longer "sentence" (a file without them) cannot fit a length budget
MAX_SENTENCE_CHARS = 2000


def check_filler_text(text: str, where: str) -> None:
    """``ValueError`` starting with ``where`` unless ``text`` can make a haystack: every sentence at most
    :data:`MAX_SENTENCE_CHARS` characters (the first longer one is named by line), and at least one with a letter
    or digit (text of control characters, NUL bytes or emoji only has no passage a needle can sit in)."""
    pieces, pos = [], 0
    for m in [*SENTENCE_SPLIT.finditer(text), None]:
        pieces.append((pos, text[pos:m.start() if m else len(text)]))
        pos = m.end() if m else pos
    if not any(ch.isalnum() for _, piece in pieces for ch in piece):
        raise ValueError(f"{where} has no usable passage: no sentence holds a letter or a digit (control characters, "
                         "NUL bytes or symbols only); the text must be sentences of words")
    for at, piece in pieces:
        n = len(" ".join(piece.split()))
        if n > MAX_SENTENCE_CHARS:
            line = text.count("\n", 0, at + len(piece) - len(piece.lstrip())) + 1
            raise ValueError(f"{where} line {line}: a sentence of {n} characters with no sentence boundary ('.', '!' "
                             f"or '?' then a space) within {MAX_SENTENCE_CHARS}: a haystack is cut at sentence "
                             f"boundaries; the text must be sentences of at most {MAX_SENTENCE_CHARS} characters")


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def group_passages(counts: Sequence[int], passage_tokens: int) -> list[list[int]]:
    """Consecutive pieces (sentences, list lines) grouped into passages: the indices of each passage, closed when
    the next piece's ``counts`` (tokens) would take it past ``passage_tokens`` (a longer piece stands alone)."""
    passages: list[list[int]] = []
    cur, cur_t = [], 0
    for i, c in enumerate(counts):
        if cur and cur_t + c > passage_tokens:
            passages.append(cur)
            cur, cur_t = [], 0
        cur.append(i)
        cur_t += c
    if cur:
        passages.append(cur)
    return passages


class Haystack:
    """Sentences of the texts, from a seeded region of their whole, grouped into passages, at most ``budget`` tokens.

    The texts are put in a seeded order and read as one stream of sentences; the haystack starts at a seeded
    sentence of the whole stream (``region=True``: each prompt built with its own ``rng`` draws its passages from
    its own region, so prompts built from one long text share few passages) and runs on, wrapping around to the
    stream's start, until ``budget`` tokens; ``region=False`` starts at the stream's first sentence (a repeated
    noise text, where every region reads the same). ``start`` is the first sentence's index in the stream."""

    def __init__(self, tokenizer, essays: dict, budget: int, passage_tokens: int, rng: random.Random, *,
                 region: bool = True):
        names = sorted(essays)
        rng.shuffle(names)
        stream = [(name, s) for name in names for s in split_sentences(essays[name])]
        self.start = rng.randrange(len(stream)) if region and stream else 0
        sents, counts, used, total, full = [], [], [], 0, False
        for k in range(len(stream)):
            name, s = stream[(self.start + k) % len(stream)]
            c = count_tokens(tokenizer, " " + s)
            if total + c > budget:
                full = True
                break
            if not used or used[-1] != name:
                used.append(name)
            sents.append(s)
            counts.append(c)
            total += c
        if not sents and stream:
            first = count_tokens(tokenizer, " " + stream[self.start][1])
            raise ValueError(f"lengths: the haystack's first sentence ({first} tokens) is longer than the budget of "
                             f"{budget} tokens; use longer lengths or a text of shorter sentences")
        if not full:
            raise ValueError(f"lengths: the essays hold only ~{total} tokens, fewer than {budget}; "
                             "use shorter lengths or more essays (source='cache')")
        self.sentences, self.counts, self.total, self.essays = sents, counts, total, used
        self.passages: list[list[int]] = group_passages(counts, passage_tokens)

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


def check_lengths(lengths, n, passage_tokens, *, min_length: int = 64) -> list[int]:
    """The length arguments of a haystack family: ``lengths`` a non-empty list of token counts in
    ``[min_length, 10^6]``, ``n`` (replicates) ``>= 1``, ``passage_tokens`` ``>= 16``; returns ``lengths`` as a list."""
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths: must be a non-empty list of token counts")
    for L in lengths:
        _length(min_length).check("lengths", L)
    _CHECKS["n"].check("n", n)
    _CHECKS["passage_tokens"].check("passage_tokens", passage_tokens)
    return lengths


def check_depth(name, d):
    if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0.0 <= d <= 1.0:
        raise ValueError(f"{name}: every depth must be a number in [0, 1], got {d!r}")
    return float(d)
