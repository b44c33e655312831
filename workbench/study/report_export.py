"""The report's figure export (:func:`export_figures`): each figure's files through
:func:`workbench.show.export.export_all`; a failure is retried once on a new Chromium, and a second failure is
reported in one line (:func:`one_line`) instead of failing a report whose tables and page are still written.

Why a retry: kaleido's Chromium sometimes fails a render it does the next time (``ReferenceError: kaleido_scopes
is not defined`` from a page not ready yet, the identical rerun passing); a new Chromium is the mend.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

from tqdm.auto import tqdm

from workbench.show import export as ex

__all__ = ["export_figures", "one_line"]

ONE_LINE_CHARS = 300
# a Chrome DevTools protocol error comes as the repr of its reply (a dict); its description or message says what failed
_PROTOCOL_TEXT = re.compile(r"""['"](?:description|message)['"]\s*:\s*['"](.+?)(?:\\n|['"])""")


def one_line(e: BaseException) -> str:
    """``e`` as one line: its type and message, the text of a Chrome-protocol reply rather than its raw dict,
    whitespace folded, at most :data:`ONE_LINE_CHARS` characters."""
    text = " ".join(str(e).split())
    m = _PROTOCOL_TEXT.search(text)
    if m:
        text = m.group(1).strip()
    text = f"{type(e).__name__}: {text}" if text and not text.startswith(type(e).__name__) else text
    text = text or type(e).__name__
    return text if len(text) <= ONE_LINE_CHARS else text[:ONE_LINE_CHARS - 1] + "…"


def export_figures(figures: Mapping, folder, *, widths: Mapping, prompt_hash: str | None = None,
                   progress: bool = False) -> tuple[dict[str, list[Path]], str | None]:
    """Export every figure of ``{name: fig}`` to ``folder/<name>.*`` at ``widths[name]``. Returns ``({name: paths},
    error)``: ``error`` is None when every figure was written, else one line saying which figure failed twice
    (the second time on a new Chromium) and why; the figures after it are not tried (their export would fail
    alike)."""
    folder = Path(folder)
    out: dict[str, list[Path]] = {}
    names = list(figures)
    for name in tqdm(names, desc="export", unit="fig", disable=not progress):
        for attempt in (1, 2):
            try:
                out.update(ex.export_all({name: figures[name]}, folder, widths={name: widths[name]},
                                         prompt_hash=prompt_hash))
                break
            except Exception as e:  # noqa: BLE001 - a render's failure, whatever kaleido or Chromium raised
                why = one_line(e)
                ex.shutdown_server()  # the next render starts a new Chromium
                if attempt == 2:
                    left = len(names) - len(out)
                    return out, (f"figure export failed twice at {name!r} ({why}); {left} figure(s) have no "
                                 f"files (they are in report.html); re-run the same command to export them")
                print(f"figure export: {name!r} failed ({why}); retrying once on a new Chromium", file=sys.stderr,
                      flush=True)
    return out, None
