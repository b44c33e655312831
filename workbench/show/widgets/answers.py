"""The answers of a run panel side by side, as HTML (full texts, wrapped, never cut)."""
from __future__ import annotations

from workbench.show.widgets.base import html_escape

__all__ = ["answer_table"]


def answer_table(columns, rows=()) -> str:
    """Answers in full, wrapped (never cut), side by side: ``columns`` ``[(title, answer), …]``, then ``rows``
    of one text per column."""
    cell = "style='vertical-align:top;padding:4px 10px;border:1px solid #ddd;max-width:520px'"
    code = "style='white-space:pre-wrap;overflow-wrap:anywhere'"
    head = "<tr>" + "".join(f"<th {cell}>{html_escape(t)}</th>" for t, _ in columns) + "</tr>"
    body = "<tr>" + "".join(f"<td {cell}><code {code}>{html_escape(a)}</code></td>" for _, a in columns) + "</tr>"
    extra = "".join("<tr>" + "".join(f"<td {cell}>{html_escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table style='border-collapse:collapse'>{head}{body}{extra}</table>"
