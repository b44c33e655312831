"""Prompt spans: where every chunk, the query, the protected set and the observers lie.

SPEC §0. Positions are token indices ``0 … T-1`` of the prompt. Candidate chunks are half-open
ranges ``[start, end)`` in prompt order; every token outside a candidate chunk is protected
(instruction, query, delimiters and template tokens), and so are the first ``n_sink`` positions.
A chunk that contains a protected position (a sink, say) is protected whole and is not a candidate.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from workbench.checks import Interval, is_int

Range = tuple[int, int]
_CHUNK_SIZE = Interval("int", 1, note="every chunk's size in tokens")


@dataclass(frozen=True)
class PromptSpans:
    """Token spans of one prompt.

    Attributes:
        T: prompt length in tokens.
        input_ids: the ``T`` token ids.
        tokens: the ``T`` token strings (for plotting).
        chunks: candidate chunks ``c_1 … c_k`` as ``[start, end)`` ranges, in prompt order.
        chunk_doc: for each candidate chunk, the index of the document it came from.
        documents: for every document given (candidates and protected ones), its ``[start, end)``.
        protected_docs: indices of documents whose chunk was protected whole (it held a protected token).
        query: ``[start, end)`` of the user query text.
        instruction: ``[start, end)`` of the instruction text, or ``None``.
        n_sink: number of sink positions ``|𝒮|`` (the first ``n_sink`` tokens).
        observers: proposal observer positions ``𝒬_p`` (the last ``W_p`` query tokens).
        answer_doc: index of the document holding the answer, when the prompt's author knows it.
    """

    T: int
    input_ids: tuple[int, ...]
    tokens: tuple[str, ...]
    chunks: tuple[Range, ...]
    chunk_doc: tuple[int, ...]
    documents: tuple[Range, ...]
    protected_docs: tuple[int, ...]
    query: Range
    instruction: Range | None
    n_sink: int
    observers: tuple[int, ...]
    answer_doc: int | None = None
    extra: dict = field(default_factory=dict)

    # ----- derived quantities (SPEC §0 notation) -----
    @property
    def k(self) -> int:
        """Number of candidate chunks."""
        return len(self.chunks)

    @property
    def n(self) -> torch.Tensor:
        """Chunk sizes ``n_i``, int64 ``[k]``."""
        return torch.tensor([e - s for s, e in self.chunks], dtype=torch.int64)

    @property
    def N(self) -> int:
        """Total candidate tokens ``N = Σ n_i``."""
        return int(sum(e - s for s, e in self.chunks))

    @property
    def W_p(self) -> int:
        return len(self.observers)

    def chunk_of(self) -> torch.Tensor:
        """Chunk index of every position, ``-1`` outside candidate chunks; int64 ``[T]``."""
        out = torch.full((self.T,), -1, dtype=torch.int64)
        for i, (s, e) in enumerate(self.chunks):
            out[s:e] = i
        return out

    def document_mask(self) -> torch.Tensor:
        """Mask of ``𝒟 = ∪ c_i``; bool ``[T]``."""
        return self.chunk_of() >= 0

    def protected_mask(self) -> torch.Tensor:
        """Mask of the protected set ``𝒫`` (everything not in a candidate chunk); bool ``[T]``."""
        return ~self.document_mask()

    def sink_mask(self) -> torch.Tensor:
        """Mask of the sinks ``𝒮``; bool ``[T]``."""
        m = torch.zeros(self.T, dtype=torch.bool)
        m[: self.n_sink] = True
        return m

    def removal_mask(self, removed: list[int] | tuple[int, ...] | torch.Tensor) -> torch.Tensor:
        """Token mask of a removal set ``E`` given as candidate-chunk indices; bool ``[T]``."""
        m = torch.zeros(self.T, dtype=torch.bool)
        for i in [int(x) for x in removed]:
            if not 0 <= i < self.k:
                raise ValueError(f"removed: chunk index {i} out of range [0, {self.k - 1}]")
            s, e = self.chunks[i]
            m[s:e] = True
        return m

    def retained_positions(self, removed) -> torch.Tensor:
        """``R = [T] \\ E`` in increasing order; int64 ``[T']``."""
        return torch.nonzero(~self.removal_mask(removed)).flatten()

    def validate(self, name: str = "spans") -> "PromptSpans":
        """Check that every span lies inside ``[0, T)`` and the fields agree; raise ``ValueError``
        naming the field (what a loaded file must pass before any analytic runs on it)."""

        def bad(field_, msg):
            raise ValueError(f"{name}: {field_} {msg}")

        T = self.T
        if not is_int(T) or T < 1:
            bad("T", f"must be an integer >= 1, got {T!r}")
        if len(self.input_ids) != T or not all(is_int(i) and i >= 0 for i in self.input_ids):
            bad("input_ids", f"must hold T = {T} integer token ids >= 0, got {len(self.input_ids)} entries")
        if len(self.tokens) != T:
            bad("tokens", f"must hold T = {T} strings, got {len(self.tokens)}")

        def check_range(field_, r):
            if (len(r) != 2 or not all(is_int(x) for x in r) or not 0 <= r[0] < r[1] <= T):
                bad(field_, f"must be a range [start, end) inside [0, T) = [0, {T}), got {tuple(r)}")

        for i, r in enumerate(self.chunks):
            check_range(f"chunks[{i}]", r)
        for a, b in zip(self.chunks, self.chunks[1:]):
            if b[0] < a[1]:
                bad("chunks", f"must be disjoint and in prompt order, got {a} then {b}")
        for i, r in enumerate(self.documents):
            check_range(f"documents[{i}]", r)
        if len(self.chunk_doc) != len(self.chunks) or not all(
                is_int(d) and 0 <= d < len(self.documents) for d in self.chunk_doc):
            bad("chunk_doc", f"must hold one document index in [0, {len(self.documents)}) per chunk "
                             f"({len(self.chunks)}), got {self.chunk_doc}")
        if not all(is_int(d) and 0 <= d < len(self.documents) for d in self.protected_docs):
            bad("protected_docs", f"must hold document indices in [0, {len(self.documents)}), got {self.protected_docs}")
        check_range("query", self.query)
        if self.instruction is not None:
            check_range("instruction", self.instruction)
        if not is_int(self.n_sink) or not 0 <= self.n_sink <= T:
            bad("n_sink", f"must be an integer in [0, {T}], got {self.n_sink!r}")
        if not all(is_int(p) and 0 <= p < T for p in self.observers):
            bad("observers", f"must hold positions in [0, {T}), got {self.observers}")
        if self.answer_doc is not None and not (is_int(self.answer_doc) and 0 <= self.answer_doc < len(self.documents)):
            bad("answer_doc", f"must be None or a document index in [0, {len(self.documents)}), got {self.answer_doc!r}")
        return self

    # ----- persistence -----
    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> "PromptSpans":
        d = json.loads(s)
        for key in ("input_ids", "tokens", "chunk_doc", "protected_docs", "observers"):
            d[key] = tuple(d[key])
        for key in ("chunks", "documents"):
            d[key] = tuple(tuple(r) for r in d[key])
        d["query"] = tuple(d["query"])
        if d["instruction"] is not None:
            d["instruction"] = tuple(d["instruction"])
        return cls(**d)

    @classmethod
    def synthetic(
        cls,
        chunk_sizes: list[int],
        *,
        prefix: int = 6,
        gap: int = 1,
        query_len: int = 10,
        suffix: int = 3,
        n_sink: int = 4,
        W_p: int | None = None,
        answer_doc: int | None = None,
    ) -> "PromptSpans":
        """A prompt layout without a tokenizer, for tests and examples.

        ``prefix`` protected tokens (must be ``≥ n_sink`` for all chunks to be candidates), then the
        chunks separated by ``gap`` delimiter tokens, then the query (``query_len`` tokens) and
        ``suffix`` template tokens. Observers default to the last ``min(8, query_len)`` query tokens.
        """
        pos = prefix
        docs = []
        for n in chunk_sizes:
            n = _CHUNK_SIZE.check("chunk_sizes", n)
            docs.append((pos, pos + n))
            pos += n + gap
        q = (pos, pos + query_len)
        T = q[1] + suffix
        W = min(8, query_len) if W_p is None else W_p
        chunks, chunk_doc, prot = [], [], []
        for d, (s, e) in enumerate(docs):
            if s < n_sink:
                prot.append(d)
            else:
                chunks.append((s, e))
                chunk_doc.append(d)
        return cls(
            T=T,
            input_ids=tuple(range(T)),
            tokens=tuple(f"t{i}" for i in range(T)),
            chunks=tuple(chunks),
            chunk_doc=tuple(chunk_doc),
            documents=tuple(docs),
            protected_docs=tuple(prot),
            query=q,
            instruction=(0, prefix) if prefix else None,
            n_sink=n_sink,
            observers=tuple(range(q[1] - W, q[1])),
            answer_doc=answer_doc,
        )


def spans_of(prompt, name: str = "prompt") -> PromptSpans:
    """The :class:`PromptSpans` of a Prompt (or of a Capture, or spans given directly); a ``TypeError`` naming
    ``name`` for anything else (a bare string has no spans: build it with :func:`workbench.build_prompt`)."""
    spans = getattr(prompt, "spans", prompt)
    if not isinstance(spans, PromptSpans):
        raise TypeError(f"{name}: must be a Prompt (from build_prompt), its PromptSpans or a Capture, got "
                        f"{type(prompt).__name__} {prompt!r:.60}; build one with "
                        f"wb.build_prompt(tokenizer, documents, query)")
    return spans
