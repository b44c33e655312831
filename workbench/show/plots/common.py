"""Shared input helpers of the figure functions (spans, tokens, labels, hover columns)."""


import numpy as np
import pandas as pd

from workbench.show.figure_engine import (
    as_numpy,
)
from workbench.show.paper_layout import wrap_text
from workbench.show.theme import (
    token_label,
)

NOTE_CHARS = 28  # a line of a note on an empty plot: fits the plot area of a one-column canvas


def note_lines(text: str) -> str:
    """A note written on an empty plot (why it is empty), in lines of at most :data:`NOTE_CHARS` characters: one
    line of a whole clause ran past the plot and the canvas at one column."""
    return wrap_text(text, NOTE_CHARS, 1.0, 1.0)


def model_id_of(model_id, *sources):
    if model_id is not None:
        return model_id
    for s in sources:
        m = getattr(s, "model_id", None)
        if m is not None:
            return m
    return None


def spans_of(source):
    """``PromptSpans`` of a capture, a prompt, a trace or spans themselves (None if none)."""
    if source is None:
        return None
    if hasattr(source, "chunk_of") and hasattr(source, "tokens"):
        return source
    s = getattr(source, "spans", None)
    if s is not None:
        return s
    raise ValueError(f"spans: must be PromptSpans, a Prompt, a Capture or a TraceResult, got {type(source).__name__}")


def hover_tokens(spans, T: int) -> list[str]:
    """Hover labels of ``T`` positions: the tokens when known, else ``#j``."""
    if spans is not None and len(spans.tokens) >= T:
        return [token_label(t) for t in spans.tokens[:T]]
    return [f"#{j}" for j in range(T)]


def answer_chunk(spans) -> int | None:
    if spans is None or spans.answer_doc is None or spans.answer_doc not in spans.chunk_doc:
        return None
    return list(spans.chunk_doc).index(spans.answer_doc)


def head_labels(head_group) -> list[str]:
    return [f"h{h} (g{int(g)})" for h, g in enumerate(as_numpy(head_group).tolist())]


def removed_chunks(removed, layer: int, k: int) -> list[int] | None:
    """Chunk indices removed at ``layer`` from a list, a ``SelectionResult`` or a ``TraceResult``."""
    if removed is None:
        return None
    if hasattr(removed, "selections") and hasattr(removed, "records"):  # TraceResult
        sel = removed.selections.get(layer)
        out = list(sel.removed) if sel is not None else []
    elif hasattr(removed, "removed"):
        out = list(removed.removed)
    else:
        m = as_numpy(removed)
        out = np.flatnonzero(m).tolist() if m.dtype == bool and m.shape == (k,) else [int(i) for i in m.reshape(-1)]
    bad = [i for i in out if not 0 <= i < k]
    if bad:
        raise ValueError(f"removed: chunk indices must be in [0, {k - 1}], got {bad}")
    return sorted(out)


def customdata(*cols) -> np.ndarray:
    """``customdata`` rows from columns, as an object array ``[n, len(cols)]`` (fast to validate)."""
    out = np.empty((len(cols[0]) if cols else 0, len(cols)), dtype=object)
    for j, c in enumerate(cols):
        out[:, j] = list(c)
    return out


def repeat_rows(row, n: int) -> np.ndarray:
    """``n`` copies of one row as an object array ``[n, len(row)]`` (per-cell heatmap customdata)."""
    out = np.empty((n, len(row)), dtype=object)
    out[:] = list(row)
    return out




def check_frame(name: str, df, need) -> pd.DataFrame:
    """``df`` if it is a non-empty DataFrame with the columns ``need``, else a ``ValueError`` naming ``name``."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{name}: must be a pandas DataFrame, got {type(df).__name__}")
    if not set(need) <= set(df.columns):
        raise ValueError(f"{name}: needs columns {sorted(need)}, got {list(df.columns)}")
    if df.empty:
        raise ValueError(f"{name}: is empty")
    return df
