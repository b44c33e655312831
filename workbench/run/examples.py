"""Bundled example prompts (``data/``), loadable without a model."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from workbench.run.prompt import build_prompt

DATA_DIR = Path(__file__).resolve().parents[2] / "data"


@dataclass(frozen=True)
class Example:
    name: str
    instruction: str
    documents: tuple[str, ...]
    query: str
    answer: str
    answer_doc: int

    def build(self, tokenizer, **kw):
        """Render with :func:`workbench.run.prompt.build_prompt`."""

        return build_prompt(tokenizer, self.documents, self.query, self.instruction,
                            answer_doc=self.answer_doc, **kw)


EXAMPLES = ("example_prompt", "needle_haystack")  # the bundled prompts (data/<name>.json); other files are data sets


def load_example(name: str = "example_prompt") -> Example:
    """Load the bundled prompt ``data/<name>.json`` (default: the multi-document harbor-town prompt). Only the
    names of :data:`EXAMPLES` are taken: never a path, nor a data set of ``data/``."""
    if not isinstance(name, str) or name not in EXAMPLES:
        raise ValueError(f"name: no bundled example {name!r}; available: {list(EXAMPLES)}")
    d = json.loads((DATA_DIR / f"{name}.json").read_text())
    return Example(name=d["name"], instruction=d["instruction"], documents=tuple(d["documents"]),
                   query=d["query"], answer=d["answer"], answer_doc=int(d["answer_doc"]))
