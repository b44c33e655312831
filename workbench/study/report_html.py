"""The report's HTML page (:func:`write_html`): one self-contained file with the data provenance, a partial
banner when the sweep was interrupted, "What this study shows" (the seed claims with their verdicts, at the top),
the reference check, the findings (one sentence per comparison,
from :mod:`workbench.study.findings`), every figure and every table."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from workbench.util import atomic_write_bytes

__all__ = ["write_html", "MAX_HTML_ROWS"]

# ----------------------------------------------------------------------------- html
_CSS = """
body{font-family:"DejaVu Sans","Liberation Sans",Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.05em;margin-bottom:.2em}.note{color:#555;font-size:.92em}.files a{margin-right:.6em;font-size:.9em}
table.data{border-collapse:collapse;font-size:.8em;margin:.5em 0}table.data td,table.data th{border:1px solid #ddd;
padding:2px 6px;text-align:right}table.data th{background:#f4f4f4}.scroll{max-height:420px;overflow:auto}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;font-size:.9em}dl.meta dt{font-weight:bold}
nav a{margin-right:.8em}.partial{background:#fff3cd;border:2px solid #d39e00;padding:.6em 1em;font-weight:bold}
.warn{background:#fde2e1;border:2px solid #c0392b;padding:.6em 1em;margin:.4em 0;font-weight:bold}
ol.findings li{margin:.35em 0}
"""
MAX_HTML_ROWS = 200


def _table_html(df: pd.DataFrame) -> str:
    show = df.head(MAX_HTML_ROWS).copy()
    for c in show.columns:  # long lists (generated ids) and floats kept readable
        if show[c].dtype == object:
            show[c] = show[c].map(lambda v: (str(v)[:80] + "…") if isinstance(v, (list, tuple, str)) and len(str(v)) > 80
                                  else v)
    h = show.to_html(index=False, classes="data", border=0, escape=True, na_rep="", float_format=lambda v: f"{v:.4g}")
    more = f"<p class='note'>first {MAX_HTML_ROWS} of {len(df)} rows</p>" if len(df) > MAX_HTML_ROWS else ""
    return f"<div class='scroll'>{h}</div>{more}"


def _provenance_html(sources: list) -> str:
    e = html.escape
    if not sources:
        return "<section id='provenance'><h2>Data provenance</h2><p>No study data.</p></section>"
    rows = "".join(f"<tr><td>{e(str(s.get('task')))}</td><td>{e(str(s.get('items')))}</td><td>{e(str(s.get('label')))}"
                   f"</td><td>{e(str(s.get('kind')))}</td><td>{e(str(s.get('size')))}</td>"
                   f"<td><code>{e(str(s.get('sha256')))}</code></td><td>{e(str(s.get('path')))}</td>"
                   f"<td>{e(str(s.get('description')))}</td></tr>" for s in sources)
    return ("<section id='provenance'><h2>Data provenance</h2><table class='data'><tr><th>task</th><th>items</th>"
            "<th>source</th><th>kind</th><th>size</th><th>sha256</th><th>path</th><th>description</th></tr>"
            f"{rows}</table></section>")


def _reference_html(ref, warns: list) -> str:
    e = html.escape
    parts = ["<section id='reference-check'><h2>Reference check</h2>"]
    if ref is None or not len(ref):
        parts.append("<p class='warn'>No full-context reference run finished: nothing can be compared.</p>")
    else:
        lines = "".join(f"<li>{e(str(r.task))}: full context right on {int(r.right)}/{int(r.n)} prompts, accuracy "
                        f"{r.accuracy:.2f} [95% Wilson CI {r.lo:.2f}, {r.hi:.2f}] (n = {int(r.n)}); "
                        f"{'usable' if r.ok else 'TOO LOW for meaningful comparisons'}</li>" for r in ref.itertuples())
        parts.append(f"<ul>{lines}</ul>")
    parts += [f"<p class='warn'>{e(w)}</p>" for w in warns]
    return "".join(parts) + "</section>"


_VERDICT_STYLE = {"supported": "#1e7b34", "non-inferior": "#1e7b34", "inconclusive": "#555", "inferior": "#c0392b",
                  "contradicted": "#c0392b", "reference failed": "#d39e00", "descriptive": "#555"}


def _conclusions_html(table, info: dict) -> str:
    """"What this study shows": the verdict rule first, the counts, one line per claim, what could not be assessed."""
    e = html.escape
    parts = ["<section id='conclusions'><h2>What this study shows</h2>"]
    if not info:
        return parts[0] + "<p>No conclusions were computed.</p></section>"
    parts.append(f"<p class='note'>{e(info.get('rule', '').replace('**', ''))}</p>")
    counts = info.get("counts", {})
    parts.append(f"<p>{sum(counts.values())} substantive claims: " + ", ".join(f"{e(k)} {v}" for k, v in counts.items())
                 + " (descriptive rows: no verdict, not counted).</p>")
    if info.get("next"):  # underpowered rows: what would give a study that can show them
        parts.append(f"<p class='note'>{e(info['next'])}</p>")
    if table is not None and len(table):
        lines = []
        for r in table.itertuples(index=False):
            eff = ("n/a" if r.effect != r.effect else f"{r.effect:+.3f}"
                   + ("" if r.lo != r.lo else f" [{r.lo:+.3f}, {r.hi:+.3f}]"))
            mde = getattr(r, "mde", float("nan"))
            p = "—" if r.p != r.p else f"{r.p:.3g}"
            lines.append(f"<li class='claim'><b style='color:{_VERDICT_STYLE.get(r.verdict, '#222')}'>{e(r.verdict)}"
                         f"</b>: {e(r.claim)} ({e(r.source)}) on {e(str(r.task))}: {e(r.comparison)}, n = {int(r.n)} "
                         f"clusters ({int(r.prompts)} prompts), effect {e(eff)}, {e(r.test)} p = {e(p)}"
                         + ("" if mde != mde else f", MDE {mde:.3f}")
                         + (" (underpowered)" if getattr(r, "underpowered", False) else "")
                         + (f"; {e(r.note)}" if r.note else "")
                         + (f"; reference: {e(r.reference)}" if r.reference else "") + "</li>")
        parts.append("<ol class='findings'>" + "".join(lines) + "</ol>")
    missing = info.get("missing", [])
    if missing:
        parts.append("<h3>Not assessed here</h3><ul>" + "".join(f"<li>{e(m)}</li>" for m in missing) + "</ul>")
    return "".join(parts) + "</section>"


def _accuracy_line(r) -> str:
    """One accuracy row; the cells whose method failed are counted apart, with the first reason (never in n)."""
    e = html.escape
    failed = int(getattr(r, "failed", 0) or 0)
    body = "no cell finished" if int(r.n) == 0 else (
        f"{r.accuracy:.2f} [95% CI {r.lo:.2f}, {r.hi:.2f}] (n = {int(r.n)}, {int(r.right)} right"
        f"{f', {int(r.hit_cap)} hit the cap' if r.hit_cap else ''})")
    fail = f"; {failed} failed, not counted ({e(str(r.failed_reason))})" if failed else ""
    return f"<li class='accuracy'>{e(str(r.task))} / {e(str(r.setting))}: {body}{fail}</li>"


def _findings_html(findings: list, acc) -> str:
    e = html.escape
    parts = ["<section id='findings'><h2>Findings</h2>"]
    if findings:
        parts.append("<ol class='findings'>" + "".join(f"<li class='finding'>{e(f)}</li>" for f in findings) + "</ol>")
    else:
        parts.append("<p>No comparison could be made (no paired runs).</p>")
    if acc is not None and len(acc):
        lines = "".join(_accuracy_line(r) for r in acc.itertuples())
        parts.append(f"<h3>Accuracies (contains, Wilson 95% CI)</h3><ul>{lines}</ul>")
    return "".join(parts) + "</section>"


def write_html(path, figures: dict, tables: dict, fig_files: dict, table_files: dict, info: dict,
               notes: dict | None = None) -> Path:
    """One self-contained HTML page: plotly.js inlined once, each figure as an interactive div with links to
    its exported files, each table as HTML with links to its CSV/parquet. Written atomically."""

    path = Path(path)
    notes = notes or {}
    e = html.escape
    rel = lambda p: Path(p).relative_to(path.parent).as_posix()  # noqa: E731
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(info.get('title', 'report'))}"
             f"</title><style>{_CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
             f"<h1>{e(info.get('title', 'Report'))}</h1>"]
    meta = {"model": info.get("model_id"), "device / dtype": f"{info.get('device')} / {info.get('dtype')}",
            "created (UTC)": info.get("created_utc"),
            "settings": json.dumps({k: v for k, v in info.get("config", {}).items() if k not in ("widths", "progress")},
                                   default=str),
            "versions": ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items()),
            "example prompt sha256": info.get("example", {}).get("prompt_hash")}
    parts.append("<dl class='meta'>" + "".join(f"<dt>{e(k)}</dt><dd>{e(str(v))}</dd>" for k, v in meta.items())
                 + "</dl>")
    if info.get("partial"):
        stage = info.get("interrupted") or "the sweep"
        what = ("the sweep was interrupted before every cell finished; the numbers below come from the finished "
                "cells only" if stage == "the sweep" else
                f"the run was interrupted during {stage}, after every cell of the sweep had finished; what that "
                "stage and the ones after it add (figure files, the needle table) may be missing")
        parts.append(f"<p class='partial' id='partial'>PARTIAL REPORT: {e(what)}. Re-run the same command to "
                     "resume (finished cells are not recomputed).</p>")
    if info.get("export_error"):
        parts.append(f"<p class='partial' id='export-error'>FIGURE FILES MISSING: {e(info['export_error'])}</p>")
    parts.append(_conclusions_html(tables.get("conclusions"), info.get("conclusions", {})))
    parts.append(_provenance_html(info.get("sources", [])))
    parts.append(_reference_html(tables.get("reference_check"), info.get("reference_warnings", [])))
    parts.append(_findings_html(info.get("findings", []), tables.get("accuracy")))
    parts.append("<nav><b>Figures:</b> " + "".join(f"<a href='#fig-{e(n)}'>{e(n)}</a>" for n in figures)
                 + "<br><b>Tables:</b> " + "".join(f"<a href='#tab-{e(n)}'>{e(n)}</a>" for n in tables) + "</nav>")
    parts.append("<h2>Figures</h2>")
    for name, fig in figures.items():
        title = getattr(getattr(fig.layout, "title", None), "text", None) or name
        links = " ".join(f"<a href='{e(rel(p))}'>{e(Path(p).suffix[1:])}</a>" for p in fig_files.get(name, []))
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"plot-{name}",
                          config={"displaylogo": False, "responsive": True})
        parts.append(f"<section id='fig-{e(name)}'><h3>{e(name)}: {e(title)}</h3>"
                     + (f"<p class='note'>{e(notes[name])}</p>" if name in notes else "")
                     + f"{div}<p class='files'>files: {links}</p></section>")
    parts.append("<h2>Tables</h2>")
    for name, df in tables.items():
        links = " ".join(f"<a href='{e(rel(p))}'>{e(Path(p).suffix[1:])}</a>" for p in table_files.get(name, []))
        parts.append(f"<section id='tab-{e(name)}'><h3>{e(name)} ({len(df)} rows × {len(df.columns)} columns)</h3>"
                     + (f"<p class='note'>{e(notes[name])}</p>" if name in notes else "")
                     + f"{_table_html(df)}<p class='files'>files: {links}</p></section>")
    parts.append("</body></html>")
    atomic_write_bytes(path, "\n".join(parts).encode("utf-8"))
    return path
