"""The task item: one prompt (a bundled example or an item of a task family), tokenizer-free, with a
content-addressed id."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from workbench.constraints import answer_doc as answer_doc_of
from workbench.constraints import index_into
from workbench.run.prompt import DEFAULT_INSTRUCTION, build_prompt

__all__ = ["TaskItem", "with_content_id"]


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
        object.__setattr__(self, "answer_doc", index_into(k).check("answer_doc", self.answer_doc))  # a numpy int too
        if not self.evidence_docs:
            object.__setattr__(self, "evidence_docs", (self.answer_doc,))
        for e in self.evidence_docs:
            if not isinstance(e, int) or isinstance(e, bool) or not 0 <= e < k:
                raise ValueError(f"evidence_docs: every index must be an integer in [0, {k - 1}], got "
                                 f"{self.evidence_docs!r}")
        if self.answer_doc not in self.evidence_docs:
            raise ValueError(f"evidence_docs: must contain answer_doc={self.answer_doc}, got {self.evidence_docs!r}")
        object.__setattr__(self, "conflict_doc", answer_doc_of(k).check("conflict_doc", self.conflict_doc))
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

    @property
    def answer(self) -> str:
        """The first gold answer (the one a needle search or a survival table looks for)."""
        return self.answers[0]

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
                   evidence_docs=list(self.evidence_docs), query=self.query, answer=self.answer,
                   n_answers=len(self.answers), doc_chars=sum(len(d) for d in self.documents),
                   conflict_answer=self.conflict_answers[0] if self.conflict_answers else None)
        out.update({f"meta_{k}": v for k, v in self.meta.items() if isinstance(v, (int, float, str, bool))})
        return out


def with_content_id(item: TaskItem, base_id: str) -> TaskItem:
    """Give an item its content-addressed id ``<base_id>#<digest8>``."""

    return replace(item, item_id=f"{base_id}#{item.content_digest()[:8]}")
