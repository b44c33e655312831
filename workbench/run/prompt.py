"""Build a RAG prompt and its token spans (SPEC §0).

The prompt is an instruction, a list of documents (one candidate chunk each) and a user query,
rendered through the model's chat template when it has one. Spans come from the tokenizer's
character offsets on the final rendered text, never from re-tokenising pieces: a document's chunk
is the run of tokens lying entirely inside the document's characters; a token that straddles a
document boundary and a delimiter is protected (it is a delimiter token). Every token outside a
candidate chunk is protected, and so are the first ``n_sink`` positions; a chunk that contains a
sink is protected whole and leaves the candidate list.

Documents and the query are text, never markup: a control-token string inside them (``<|im_start|>``
and the other added tokens of the tokenizer) is tokenised as plain text (the text pieces are tokenised
with ``split_special_tokens=True`` and their ids spliced between the template's pieces), so a retrieved
document cannot inject a chat turn. Prompts without such strings are tokenised in one piece, exactly
as before. ``spans.extra["tokenizer"]`` records a fingerprint of the tokenizer that built the spans
(checked before a rerun: :mod:`workbench.capture.identity`).
"""
from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass

import torch

from workbench.checks import check_context, check_str
from workbench.constraints import PARAMS, zero_upto
from workbench.constraints import answer_doc as answer_doc_of
from workbench.run.spans import PromptSpans

TOKENIZER_KEY = "tokenizer"

DEFAULT_W_P = 8
DEFAULT_INSTRUCTION = (
    "Answer the question using only the documents. Reply with a short answer."
)


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: its text, its spans (with the token ids), and what built it."""

    text: str
    spans: PromptSpans
    documents: tuple[str, ...]
    query: str
    instruction: str

    @property
    def input_ids(self) -> torch.Tensor:
        """Token ids, int64 ``[1, T]``."""
        return torch.tensor([self.spans.input_ids], dtype=torch.int64)

    @property
    def T(self) -> int:
        return self.spans.T

    def digest(self) -> str:
        """A short hash of the token ids (identifies the prompt in sidecars and caches)."""
        return hashlib.sha256(str(self.spans.input_ids).encode()).hexdigest()[:16]


def _no_surrogate(name: str, text: str) -> None:
    """A lone surrogate (``"\\ud800"``, from a bad decode) is not text: no tokenizer can encode it."""
    at = next((i for i, ch in enumerate(text) if unicodedata.category(ch) == "Cs"), None)
    if at is not None:
        raise ValueError(f"{name} holds a lone surrogate U+{ord(text[at]):04X} at character {at}, which is not text "
                         "(a string decoded with errors='surrogateescape'?); pass valid Unicode text")


def _check_inputs(documents, query, instruction, n_sink, W_p):
    check_str("query", query)
    _no_surrogate("query:", query)
    if not has_visible_text(query):
        raise ValueError("query: has no visible text (only whitespace, zero-width or control characters such as "
                         "NUL); the query must hold text")
    check_str("instruction", instruction, empty=True)
    _no_surrogate("instruction:", instruction)
    if not documents:
        raise ValueError("documents: must hold at least one document (each is a candidate chunk), got none; "
                         "a prompt without documents has nothing to prune or evict")
    for i, d in enumerate(documents):
        if not isinstance(d, str) or not d.strip():
            raise ValueError(f"documents: document {i} is empty; every document must be a non-empty string")
        _no_surrogate(f"documents: document {i}", d)
        if not has_visible_text(d):
            raise ValueError(f"documents: document {i} has no visible text (only whitespace, zero-width or control "
                             f"characters such as NUL); every document must hold text")
    PARAMS["n_sink"].check("n_sink", n_sink)
    PARAMS["W_p"].check("W_p", W_p)


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character that is not whitespace, a control character (NUL ...) or an invisible
    format character (zero-width space, joiner, BOM ...): a document of those alone is no passage."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn") for ch in text)


def tokenizer_fingerprint(tokenizer) -> str:
    """A cheap identity of a tokenizer: its size and a hash of 64 token strings spread over the
    vocabulary plus its added tokens (microseconds; equal for the same tokenizer saved and reloaded)."""
    n = len(tokenizer)
    step = max(1, n // 64)
    sample = tokenizer.convert_ids_to_tokens(list(range(0, n, step)))
    added = sorted(str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values())
    h = hashlib.sha256("\x00".join(map(str, sample + added)).encode()).hexdigest()[:12]
    return f"{n}:{h}"


def control_strings(tokenizer) -> list[str]:
    """Strings the tokenizer would read as added (control) tokens: its added and special tokens."""
    out = {str(getattr(t, "content", t)) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()}
    out |= set(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted(t for t in out if t)


def _encode(tokenizer, text, text_ranges, add_special):
    """``(ids, offsets)`` of ``text``; the character ranges ``text_ranges`` (documents, query) are
    tokenised as plain text (no control tokens) when they contain a control-token string."""
    ctrl = control_strings(tokenizer)
    plain = sorted(r for r in text_ranges if any(c in text[r[0]:r[1]] for c in ctrl))
    if not plain:
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=add_special)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    ids, offsets, pos = [], [], 0
    pieces = []
    for lo, hi in plain:
        pieces += [(pos, lo, False), (lo, hi, True)]
        pos = hi
    pieces.append((pos, len(text), False))
    for i, (lo, hi, is_text) in enumerate(pieces):
        if hi <= lo:
            continue
        enc = tokenizer(text[lo:hi], return_offsets_mapping=True, add_special_tokens=add_special and i == 0,
                        split_special_tokens=is_text)
        ids += list(enc["input_ids"])
        offsets += [(a + lo, b + lo) if b > a else (a, b) for a, b in enc["offset_mapping"]]
    return ids, offsets


def render(tokenizer, documents, query, instruction, chat: bool | None = None):
    """Render the prompt text; returns ``(text, doc_char_ranges, query_range, instruction_range)``."""
    pieces_user = []
    if documents:
        pieces_user.append(("delim", "Documents:\n"))
        for i, d in enumerate(documents):
            pieces_user.append(("delim", f"[{i + 1}]\n"))
            pieces_user.append(("doc", d, i))
            pieces_user.append(("delim", "\n"))
        pieces_user.append(("delim", "\n"))
    pieces_user.append(("delim", "Question:\n"))
    pieces_user.append(("query", query))
    user = "".join(p[1] for p in pieces_user)
    use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
    if use_chat:
        messages = []
        if instruction:
            messages.append({"role": "system", "content": instruction})
        messages.append({"role": "user", "content": user})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        user_at = text.rfind(user)
        instr_at = text.find(instruction) if instruction else -1
    else:
        head = f"{instruction}\n\n" if instruction else ""
        text = head + user + "\nAnswer:"
        user_at = len(head)
        instr_at = 0 if instruction else -1
    if user_at < 0:
        raise ValueError("chat: the chat template altered the user message; pass chat=False")
    doc_ranges, query_range = [], None
    pos = user_at
    for p in pieces_user:
        if p[0] == "doc":
            doc_ranges.append((pos, pos + len(p[1])))
        elif p[0] == "query":
            query_range = (pos, pos + len(p[1]))
        pos += len(p[1])
    instr_range = (instr_at, instr_at + len(instruction)) if instr_at >= 0 else None
    return text, doc_ranges, query_range, instr_range


def _tokens_inside(offsets, lo, hi):
    """Token index range ``[s, e)`` of the tokens whose characters lie entirely in ``[lo, hi)``."""
    idx = [t for t, (a, b) in enumerate(offsets) if b > a and a >= lo and b <= hi]
    if not idx:
        return None
    return idx[0], idx[-1] + 1


def _tokens_overlapping(offsets, lo, hi):
    idx = [t for t, (a, b) in enumerate(offsets) if b > a and a < hi and b > lo]
    return (idx[0], idx[-1] + 1) if idx else None


def build_prompt(
    tokenizer,
    documents: list[str] | tuple[str, ...],
    query: str,
    instruction: str = DEFAULT_INSTRUCTION,
    *,
    n_sink: int = 4,
    W_p: int | None = None,
    chat: bool | None = None,
    max_context: int | None = None,
    answer_doc: int | None = None,
) -> Prompt:
    """Render a RAG prompt and compute its spans.

    Args:
        tokenizer: a fast HF tokenizer (character offsets are required).
        documents: the retrieved passages, one candidate chunk each (at least one, each with visible text).
        query: the user question (with visible text).
        instruction: the system instruction (protected).
        n_sink: number of sink positions (the first ``n_sink`` tokens), ``≥ 0``.
        W_p: number of proposal observers (the last ``W_p`` query tokens), ``1 … len(query)``;
            default ``min(8, len(query))`` (SPEC §0).
        chat: use the chat template (default: when the tokenizer has one).
        max_context: the model's context length; a longer prompt raises.
        answer_doc: index of the document holding the answer (for plots and evaluation).
    """
    if isinstance(documents, (str, bytes)) or not hasattr(documents, "__iter__"):
        raise ValueError(f"documents: must be a list of strings (one per document), got {type(documents).__name__} "
                         f"{documents!r:.60}; wrap a single document as [document]")
    documents = tuple(documents)
    _check_inputs(documents, query, instruction, n_sink, 1 if W_p is None else W_p)
    PARAMS["chat"].check("chat", chat)
    PARAMS["max_context"].check("max_context", max_context)
    answer_doc_of(len(documents)).check("answer_doc", answer_doc)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenizer: a fast tokenizer is required (character offsets)")
    text, doc_chars, q_chars, instr_chars = render(tokenizer, documents, query, instruction, chat)
    use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
    ids, offsets = _encode(tokenizer, text, list(doc_chars) + [q_chars], not use_chat)
    T = len(ids)
    check_context(T, 0, max_context)
    zero_upto(T, note=f"T = {T}, the prompt's tokens").check("n_sink", n_sink)
    q_tok = _tokens_overlapping(offsets, *q_chars)
    if q_tok is None:
        raise ValueError("query: no token of the query survived tokenisation")
    q_len = q_tok[1] - q_tok[0]
    if W_p is None:
        W_p = min(DEFAULT_W_P, q_len)
    if W_p > q_len:
        raise ValueError(f"W_p: must be in [1, {q_len}] (the query has {q_len} tokens), got {W_p}")
    doc_tok = []
    for i, (lo, hi) in enumerate(doc_chars):
        r = _tokens_inside(offsets, lo, hi)
        if r is None:
            raise ValueError(f"documents: document {i} has no token of its own (too short to be a chunk)")
        doc_tok.append(r)
    chunks, chunk_doc, protected_docs = [], [], []
    for i, (s, e) in enumerate(doc_tok):
        if s < n_sink:  # a sink inside the chunk protects the whole chunk (SPEC §0)
            protected_docs.append(i)
        else:
            chunks.append((s, e))
            chunk_doc.append(i)
    instr_tok = _tokens_overlapping(offsets, *instr_chars) if instr_chars else None
    tokens = tuple(tokenizer.decode([i]) for i in ids)
    spans = PromptSpans(
        T=T,
        input_ids=tuple(int(t) for t in ids),
        tokens=tokens,
        chunks=tuple(chunks),
        chunk_doc=tuple(chunk_doc),
        documents=tuple(doc_tok),
        protected_docs=tuple(protected_docs),
        query=q_tok,
        instruction=instr_tok,
        n_sink=n_sink,
        observers=tuple(range(q_tok[1] - W_p, q_tok[1])),
        answer_doc=answer_doc,
        extra={TOKENIZER_KEY: tokenizer_fingerprint(tokenizer)},
    )
    return Prompt(text=text, spans=spans, documents=documents, query=query, instruction=instruction)
