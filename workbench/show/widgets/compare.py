"""The compare mode of the eviction panel: two settings side by side on the same prompt.

:class:`CompareMode` is mixed into :class:`~workbench.show.widgets.run.EvictionPanel`. The *compare* checkbox
shows a second set of controls, setting ``B`` (policy, budget, DeferKV ``λ``, page size) beside the panel's
own, setting ``A``. With it on, the preview draws both kept sets (:func:`~workbench.show.plots.kept_positions`,
one row each) and, in one token view, which positions A only, B only, both or neither kept
(:func:`~workbench.show.plots.kept_compare` of :func:`~workbench.rerun.eviction.compare.compare_kept`), at every
compacted cache or one layer (*compare at*). *Run* generates under both settings (each cached as a single run,
one shared prefill) and shows the two answers beside the full-cache answer with their KV bytes, logit margins
and the membership counts of the runs' own kept sets (:func:`~workbench.rerun.eviction.compare.compare_runs`).
Comparing a setting with itself is refused in the status line, the figures unchanged, no model call.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import fields

import ipywidgets as W

from workbench.rerun.eviction import build_policy
from workbench.rerun.eviction.compare import RunComparison, compare_kept, compare_runs, setting_labels
from workbench.show import plots
from workbench.show.notation import symbol
from workbench.show.widgets.answers import answer_table
from workbench.show.widgets.base import SLIDERS, html_escape

__all__ = ["CompareControls", "CompareMode", "compare_table", "same_set_note"]


def same_set_note(kept) -> str:
    """What the compare view says when A and B (a ``KeptComparison``) keep the same positions (an all-"both" view
    would look like a broken comparison), or ``""`` when they differ."""
    n = kept.counts()
    if n["A only"] or n["B only"]:
        return ""
    hint = "; choose one layer in *compare at* to see where they differ" if kept.layer is None else ""
    return f"A and B keep the same set at this budget ({kept.where}){hint}"

#: what the eviction panels' highlighted positions are (the answer document): the kept figure's row labels
#: say whose share they give
ANSWER_DOC = "answer doc"


def _fmt(x: float) -> str:
    return "n/a (stopped before it)" if math.isnan(x) else f"{x:.4g}"


def compare_table(cmp: RunComparison) -> str:
    """The answers of a :class:`RunComparison` side by side (full cache, A, B) with their KV bytes, kept
    counts, logit margins and the membership counts."""
    f, a, b = cmp.full, cmp.a, cmp.b
    c = cmp.kept.counts()
    after = sorted({a.margin_token, b.margin_token})
    full_after = "; ".join(f"token {j}: {_fmt(m)}" for j, m in
                           ((j, a.full_margin if j == a.margin_token else b.full_margin) for j in after))

    def side(s):
        return f"token {s.margin_token}: {_fmt(s.margin)} (full cache: {_fmt(s.full_margin)})"

    rows = [(f"KV bytes {f.kv_bytes:,}", f"KV bytes {a.kv_bytes:,} ({a.kv_ratio:.0%})",
             f"KV bytes {b.kv_bytes:,} ({b.kv_ratio:.0%})"),
            (f"prompt positions kept per cache: {f.kept}", f"{a.kept}, evicted after step {a.evicted_at}",
             f"{b.kept}, evicted after step {b.evicted_at}"),
            (f"first-token margin (top-1 − top-2 logit; token 1 is decided by the prefill, before any eviction): "
             f"{_fmt(f.first_margin)}", _fmt(a.first_margin), _fmt(b.first_margin)),
            (f"margin of the first token decoded after eviction, full cache at the same token: {full_after}",
             side(a), side(b)),
            (f"kept positions ({cmp.kept.where}) of T = {cmp.kept.T}", f"A only {c['A only']}, both {c['both']}",
             f"B only {c['B only']}, neither {c['neither']}")]
    if same_set_note(cmp.kept):
        rows.append(("", same_set_note(cmp.kept), ""))
    return answer_table([("full cache", f.text or f"ids {list(f.ids)}"), (f"A: {a.label}", a.text or f"ids {list(a.ids)}"),
                         (f"B: {b.label}", b.text or f"ids {list(b.ids)}")], rows)


class CompareControls:
    """What every compare mode shares: the *compare* checkbox, setting B's controls (:attr:`SIDE_B`: B control →
    the A control it mirrors) in a box shown only in compare mode, and the refusal of a setting compared with
    itself (equal ``run_key()`` and ``run_key_b()``)."""

    SIDE_B: dict[str, str] = {}

    def _show_compare(self, change=None) -> None:
        on = self.compare_on()
        self._b_box.layout.display = None if on else "none"
        if "compare_layer" in self.controls:
            self.controls["compare_layer"].layout.display = None if on else "none"

    def control_rows(self) -> list[W.Widget]:
        """A's controls, the compare row (*compare*, *compare at*), then B's controls (shown in compare mode)."""
        c = self.controls
        row = [c[k] for k in ("compare", "compare_layer") if k in c]
        a = [w for k, w in c.items() if k not in self.SIDE_B and k not in ("compare", "compare_layer")]
        b = [c[k] for k in self.SIDE_B]
        wrap = W.Layout(flex_flow="row wrap")
        self._b_box.children = [W.HBox(b[i:i + 3], layout=wrap) for i in range(0, len(b), 3)]
        return [W.HBox(a[i:i + 3], layout=wrap) for i in range(0, len(a), 3)] + [W.HBox(row, layout=wrap), self._b_box]

    def compare_on(self) -> bool:
        return bool(self.controls["compare"].value)

    def params(self) -> dict:
        """The panel's parameters; setting B's and the compare controls only in compare mode (off, the panel's
        parameters are exactly those of the single mode)."""
        out = super().params()
        if not self.compare_on():
            for k in (*self.SIDE_B, "compare", "compare_layer"):
                out.pop(k, None)
        return out

    def compare_check(self) -> None:
        """Refuse comparing a setting with itself (``ValueError`` naming it)."""
        if self.run_key() == self.run_key_b():
            raise ValueError(f"A and B are the same setting ({self.setting_name()}): change B's "
                             f"{self.B_WHAT} to compare")

    def refuse_same(self) -> None:
        """:meth:`compare_check` before a run: the refusal in the status line, no model call."""
        try:
            self.compare_check()
        except ValueError as e:
            self.error = str(e)
            self.status.value = f"<span style='color:#D55E00'>{html_escape(e)}</span>"
            raise


class CompareMode(CompareControls):
    """Setting ``B`` beside the eviction panel's setting ``A`` (see the module docstring). Uses the panel's
    ``controls``, ``classes``, ``build_policy``, ``preview_of``, ``no_preview``, ``highlight``, ``session``,
    ``run_key``, ``kv_per_position``, ``kv_note``, ``_cached``, ``_busy`` and ``_step``."""

    #: the B side's controls → the notation-table key of the A control they mirror
    TOOLTIP_KEYS = {"policy_b": "policy", "budget_b": "budget", "defer_lam_b": "defer_lam", "page_b": "page"}
    SIDE_B = {"policy_b": "policy", "budget_b": "budget", "defer_lam_b": "defer_lam", "page_b": "page"}
    B_WHAT = "policy, budget or parameters"

    def _init_compare(self) -> None:
        c = self.controls
        first = c["policy"].value
        other = next((n for n in ("snapkv", "deferkv") if n != first and n in self.classes), first)
        bud = c["budget"]
        c["compare"] = W.Checkbox(value=False, description="compare with setting B")
        # one layer by default: over every layer (a position kept in any cache) both sides keep almost the whole
        # prompt once B is a sizeable share of T, and the view would show A and B the same
        c["compare_layer"] = W.Dropdown(options=[("every layer", "all")] + [(f"layer {l}", l)
                                                                           for l in range(self.capture.L)],
                                        value=self.capture.L // 2, description="compare at")
        c["policy_b"] = W.Dropdown(options=c["policy"].options, value=other, description="policy (B)")
        c["budget_b"] = SLIDERS["budget"].make(bud.value, lo=bud.min, hi=bud.max, continuous=False)
        c["budget_b"].description = "eviction budget B (B)"
        c["defer_lam_b"] = SLIDERS["defer_lam"].make(c["defer_lam"].value, continuous=False)
        c["defer_lam_b"].description = "DeferKV λ (B)"
        c["page_b"] = SLIDERS["page"].make(c["page"].value, continuous=False)
        c["page_b"].description = "page size b (B)"
        self.last_compare: RunComparison | None = None
        self._b_box = W.VBox([])
        c["policy_b"].observe(self._show_applicable_b, names="value")
        c["compare"].observe(self._show_compare, names="value")
        self._show_applicable_b()
        self._show_compare()

    # ----- controls -----
    def _show_applicable_b(self, change=None) -> None:
        names = {f.name for f in fields(self.classes[self.controls["policy_b"].value])}
        for ctl, field in (("defer_lam_b", "lam"), ("page_b", "page")):
            self.controls[ctl].layout.display = None if field in names else "none"

    def compare_layer(self) -> int | None:
        v = self.controls["compare_layer"].value
        return None if v == "all" else int(v)

    def policy_b(self):
        """The policy object of setting B."""
        c = self.controls
        return build_policy(self.classes[c["policy_b"].value], **self.common, lam=float(c["defer_lam_b"].value),
                            page=int(c["page_b"].value))

    def run_key_b(self) -> tuple:
        pol = self.policy_b()
        B = int(self.controls["budget_b"].value)
        return (pol.name, tuple(sorted(pol.params().items())), None if pol.keeps_all else B, self.max_new_tokens)

    def setting_name(self) -> str:
        pol = self.policy()
        return pol.name if pol.keeps_all else f"{pol.name}, B = {int(self.controls['budget'].value)}"

    # ----- preview -----
    def compare_compute(self, prev_a):
        """The compare preview: both kept sets (one heatmap row each) and the token view of their difference; a
        side without a preview is named, its placeholder drawn."""
        self.compare_check()
        c = self.controls
        pa, pb = self.policy(), self.policy_b()
        Ba, Bb = int(c["budget"].value), int(c["budget_b"].value)
        prev_b = self.preview_of(pb, Bb)
        cap = self.capture
        sides = [("A", pa, Ba, prev_a), ("B", pb, Bb, prev_b)]
        missing = [f"{s} ({p.name}) scores with evidence a capture does not hold: no preview" for s, p, _, r in sides
                   if r is None]
        shown = [dataclasses.replace(r, policy=f"{s}: {r.policy}") for s, _, _, r in sides if r is not None]
        per_page = max(16, cap.T)
        hl = self.highlight() or None
        if missing:
            reason = "; ".join(missing)
            kept = (plots.kept_positions.draft(shown, self.prompt, highlight=hl, highlight_name=ANSWER_DOC) if shown
                    else self.no_preview(reason, f"A: {pa.name}, B: {pb.name}", Ba))
            view = plots.kept_compare.draft(None, cap, per_page=per_page, placeholder=reason, model_id=cap.model_id)
            return {"kept": kept, "compare": view}, (f"{html_escape(reason)}; press run to generate under both "
                                                     f"and compare the runs' kept sets")
        cmp = compare_kept(prev_a, prev_b, layer=self.compare_layer(), labels=setting_labels(prev_a, prev_b, name=symbol))
        n = cmp.counts()
        status = (f"compare (preview from the capture, {cmp.where}): A: {html_escape(cmp.label_a)}; "
                  f"B: {html_escape(cmp.label_b)}; {n['A only']} A only, {n['B only']} B only, {n['both']} both, "
                  f"{n['neither']} neither of T = {cmp.T} prompt positions; {self.kv_note_both(prev_a, prev_b)}; "
                  f"press run to generate under both")
        if same_set_note(cmp):
            status = f"<b>{html_escape(same_set_note(cmp))}</b><br>{status}"
        return {"kept": plots.kept_positions.draft(shown, self.prompt, highlight=hl, highlight_name=ANSWER_DOC),
                "compare": plots.kept_compare.draft(cmp, cap, per_page=per_page, model_id=cap.model_id)}, status

    def kv_note_both(self, prev_a, prev_b) -> str:
        """The KV bytes both previews say their runs will hold after eviction (the panel's ``kv_note`` rule)."""
        if self.kv_per_position() is None:
            return self.kv_note(prev_a)
        return "KV bytes after eviction: " + ", ".join(
            f"{s} {p.kv_bytes_after:,} ({p.kv_bytes_after / p.kv_bytes_before:.0%})" for s, p in (("A", prev_a), ("B", prev_b)))

    # ----- run -----
    def run_compare(self) -> RunComparison:
        """Generate under A and B (each cached as its single-mode run, one shared prefill) and the full cache;
        the answers side by side with KV bytes, margins and membership counts. A setting compared with itself
        is refused before any model call (the status says so, ``ValueError``)."""
        self.refuse_same()
        c = self.controls
        pa, pb = self.policy(), self.policy_b()
        Ba, Bb = int(c["budget"].value), int(c["budget_b"].value)
        ka, kb = self.run_key(), self.run_key_b()
        self.progress.max = 4
        with self._busy():
            self._step(0, "prefill…" if self._session is None else "full cache…")
            sess = self.session()
            full = self.full_result(sess)
            self._step(1, f"A: {pa.name}…")
            ra = self._cached(ka, lambda: sess.run(pa, Ba))
            self._step(2, f"B: {pb.name}…")
            rb = self._cached(kb, lambda: sess.run(pb, Bb))
            cmp = compare_runs(full, ra, rb, layer=self.compare_layer(), labels=setting_labels(ra, rb, name=symbol))
            self._step(3, "divergence from the full-cache answer…")
            da = self.divergence_of(sess, full, pa, Ba, ra, ka)
            db = self.divergence_of(sess, full, pb, Bb, rb, kb)
            self._step(4, "done")
        self.last_compare = cmp
        self.last_divergence_ab = None if da is None else (da, db)
        self._show_answers(compare_table(cmp))
        self.update()  # the divergence figure of A and B joins
        return cmp
