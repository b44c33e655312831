"""The run-again panels: pruned prefill and KV eviction, calling the model only from their run controls."""
from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import TYPE_CHECKING

import ipywidgets as W
import plotly.graph_objects as go
import torch

from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.procedure import trace
from workbench.checks import check_max_new_tokens
from workbench.choices import PolicyName
from workbench.rerun.eviction import (
    REGISTRY,
    EvictionSession,
    Evidence,
    FullCache,
    GenerationResult,
    Needs,
    build_policy,
    every_policy,
    preview,
)
from workbench.rerun.prune import run_full, run_pruned
from workbench.rerun.stability import stability
from workbench.run.adapter import kv_bytes_per_position
from workbench.run.models import unwrap_model
from workbench.show import plots
from workbench.show.figure_engine import figure_meta, finish
from workbench.show.plots.common import note_lines
from workbench.show.widgets.answers import answer_table
from workbench.show.widgets.base import (
    SLIDERS,
    Panel,
    ep_controls,
    ep_from,
    html_escape,
)
from workbench.show.widgets.compare import ANSWER_DOC, CompareMode
from workbench.show.widgets.compare_prune import PruneCompareMode
from workbench.show.widgets.divergence_view import DivergenceView
from workbench.show.widgets.run_control import RunControls

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = ["PrunePanel", "EvictionPanel"]


def _answer_table(left_title: str, left: str, right_title: str, right: str, rows=()) -> str:
    """Both answers in full, wrapped (never cut), side by side."""
    return answer_table([(left_title, left), (right_title, right)], rows)


def _text(res, ids_attr: str) -> str:
    t = getattr(res, "text", None)
    if t:
        return t
    return "ids " + str(list(getattr(res, ids_attr)))


class PrunePanel(PruneCompareMode, RunControls, Panel):
    """Pruned prefill vs the full prefill (SPEC §6–§7).

    The sliders update the *predicted* decision from the capture (the trace, no model). The run
    button (or *re-run on change*) calls :func:`~workbench.rerun.prune.run_pruned` (adaptive, or with a
    fixed ``l*``) and :func:`~workbench.rerun.prune.run_full` — each once per distinct parameter set — and
    shows both answers side by side and the per-layer drift (:func:`~workbench.rerun.stability.stability`).

    *compare* (:class:`~workbench.show.widgets.compare_prune.PruneCompareMode`) puts a second setting ``B`` beside
    this one (``A``): the positions each retains in one token view, and Run runs both.
    """

    title = "Pruned prefill vs full prefill (SPEC §6–§7)"
    TRANSIENT = ("compare",)
    NAMES = ("zeta", "tau", "eps_s", "lam", "target", "eps_row", "m0", "eps_audit", "streak")

    def __init__(self, capture: Capture, model, prompt, params: EntroPrefillParams | None = None, *,
                 max_new_tokens: int = 12, composed: bool = False):
        super().__init__()
        check_max_new_tokens(max_new_tokens)
        self.capture, self.model, self.prompt = capture, model, prompt
        self.base = params or EntroPrefillParams()
        self.max_new_tokens = max_new_tokens
        self.composed = bool(composed)
        L = capture.L
        self.controls = ep_controls(self.NAMES, self.base, k=capture.spans.k, continuous=False)  # on release
        self.controls["mode"] = W.Dropdown(options=["adaptive", "fixed layer"], value="adaptive", description="mode")
        self.controls["run_layer"] = SLIDERS["run_layer"].make(min(4, L - 1), lo=1, hi=L - 1, continuous=False)
        self.controls["mode"].observe(self._show_layer, names="value")
        self._show_layer()
        self._init_compare()
        self._init_run("Run pruned prefill", 3)
        self.last_pruned = self.last_full = self.last_stability = None
        self._finish()

    def analysis(self):

        return trace(self.capture, ep_from(self.controls, self.base), certify=False, pooling_cache=self.pooling_cache)

    def _show_layer(self, change=None) -> None:
        """The fixed-l* slider shows only in fixed-layer mode."""
        self.controls["run_layer"].layout.display = None if self.controls["mode"].value == "fixed layer" else "none"

    def compute(self):
        tr = self._analyse()
        fixed = None if self.controls["mode"].value == "adaptive" else int(self.controls["run_layer"].value)
        figs = {"trace": plots.trace_layers.draft(tr, fixed_layer=fixed)}
        if self.last_stability is not None:
            figs["drift"] = plots.drift.draft(self.last_stability)
        elif "drift" in self.figures:  # the last run was a bypass: nothing pruned, no drift
            figs["drift"] = go.Figure(layout=dict(title="No drift: the last run was a bypass (nothing pruned)",
                                                  meta={"figure": "drift", "bypass": True}))
        if fixed is None:
            status = "predicted from the capture: " + html_escape(tr.decision)
        else:
            sel = tr.selections.get(fixed)
            what = ("no selection there (invalid layer)" if sel is None else
                    f"removes chunks {list(sel.removed)} ({sel.D} tokens); {html_escape(sel.verdict)}")
            status = (f"fixed layer l* = {fixed} (dashed line): {what}. The adaptive procedure would: "
                      + html_escape(tr.decision))
        return self.compare_compute(tr, figs, status) if self.compare_on() else (figs, status)

    def run_key(self) -> tuple:
        """The frozen parameter tuple that identifies a pruned run."""
        p = ep_from(self.controls, self.base)
        layer = None if self.controls["mode"].value == "adaptive" else int(self.controls["run_layer"].value)
        return ("pruned", tuple(sorted(p.to_dict().items())), layer, self.max_new_tokens)

    def run(self):
        """Run (or fetch from the cache) the full and the pruned prefill for the current parameters (in compare
        mode: both settings, :meth:`~workbench.show.widgets.compare_prune.PruneCompareMode.run_compare`)."""
        if self.compare_on():
            return self.run_compare()
        key = self.run_key()
        p = ep_from(self.controls, self.base)
        layer = key[2]
        with self._busy():
            self._step(0, "full prefill…")
            full = self._cached(("full", self.max_new_tokens), lambda: run_full(
                self.model, self.prompt, max_new_tokens=self.max_new_tokens, keep_hidden=True))
            self._step(1, "pruned prefill…")
            pruned = self._cached(key, lambda: run_pruned(self.model, self.prompt, p, layer=layer,
                                                          max_new_tokens=self.max_new_tokens, keep_hidden=True,
                                                          progress=False))
            self._step(2, "stability…")
            stab = None
            if not pruned.bypass:
                stab = self.cache.get(("stability", key, self.composed))
                if stab is None:
                    stab = stability(self.model, full, pruned, composed=self.composed)
                    self.cache[("stability", key, self.composed)] = stab
            self._step(3, "done")
        self.last_full, self.last_pruned, self.last_stability = full, pruned, stab
        rows = [("full prefill: T = " + str(full.T), f"{pruned.decision}"),
                ("", f"T' = {pruned.T_prime}, first token agrees: "
                     f"{int(full.first_logits.argmax()) == int(pruned.first_logits.argmax())}")]
        if stab is not None:
            rows.append(("", f"Δ_L = {stab.Delta_L:.4g}, margin = {stab.margin:.4g}, certified (m > 2ΛΔ_L): "
                             f"{stab.certified}"))
        self._show_answers(_answer_table("full context", _text(full, "generated_ids"), "pruned prefill",
                                           _text(pruned, "generated_ids"), rows))
        self.update()  # the drift figure joins on the first run that pruned
        return pruned


def _no_preview(reason: str, policy: str, budget: int, model_id) -> go.Figure:
    """The kept-positions figure when a policy has no preview: no traces, the reason written on it, and
    ``meta["placeholder"]`` saying why it is empty (a figure left empty without a reason is a bug; the browser
    tests check both)."""
    meta = figure_meta("kept_positions", model_id, placeholder=reason, policy=policy, budget=budget)
    return finish(go.Figure(), f"Kept prompt positions: {html_escape(policy)}, B = {budget}", meta,
                  xaxis=dict(visible=False), yaxis=dict(visible=False), height=260,
                  annotations=[dict(text=note_lines(html_escape(reason)), x=0.5, y=0.5, xref="paper", yref="paper",
                                    showarrow=False)])


class EvictionPanel(DivergenceView, CompareMode, RunControls, Panel):
    """KV eviction policies (SPEC §9): policy, budget ``B``, DeferKV ``λ`` and the page size.

    The sliders update the *preview* of the kept prompt positions, scored from the capture's rows
    (:meth:`Evidence.from_capture`, no model; H2O needs column sums, which a capture does not hold).
    The run button generates with the model under the policy (one shared prefill,
    :class:`~workbench.rerun.eviction.EvictionSession`) and shows the answer beside the full-cache answer;
    every ``(policy parameters, budget)`` runs once.

    *compare* (:class:`~workbench.show.widgets.compare.CompareMode`) puts a second setting ``B`` beside this one
    (``A``): both kept sets in one token view with the difference marked, and Run generates under both.
    After a run, the *divergence* figure (:class:`~workbench.show.widgets.divergence_view.DivergenceView`) shows
    what the eviction changed in the answer (A and B in compare mode).
    """

    title = "KV-cache eviction (SPEC §9)"
    TOOLTIP_KEYS = CompareMode.TOOLTIP_KEYS
    TRANSIENT = ("compare", "divergence")

    def __init__(self, capture: Capture, model, prompt, *, policy: PolicyName = "deferkv", budget: int | None = None,
                 max_new_tokens: int = 12, n_sink: int | None = None, recent: int = 32):

        super().__init__()
        check_max_new_tokens(max_new_tokens)
        self.capture, self.model, self.prompt = capture, model, prompt
        self.max_new_tokens = max_new_tokens
        self.classes = {c.name: c for c in REGISTRY.classes()}  # built-in and registered (wb.register_policy)
        if policy not in self.classes:
            raise ValueError(f"policy: must be one of {sorted(self.classes)} (built-in or registered), got {policy!r}")
        T = capture.T
        self.common = {"n_sink": capture.spans.n_sink if n_sink is None else int(n_sink), "recent": int(recent)}
        n_tail = capture.rows_of("tail").numel()
        if 0 < n_tail < 32:  # SnapKV/DeferKV window: at most the captured tail
            self.common["window"] = n_tail
        lo = min(self.common["n_sink"] + self.common["recent"], T)
        self.controls = {
            "policy": W.Dropdown(options=[(f"{g} · {n}", n) for g, names in REGISTRY.groups().items() for n in names],
                                 value=policy, description="policy"),
            "budget": SLIDERS["budget"].make(budget if budget is not None else max(lo, T // 4), lo=max(lo, 1), hi=T,
                                             continuous=False),
            "defer_lam": SLIDERS["defer_lam"].make(continuous=False),
            "page": SLIDERS["page"].make(continuous=False),
        }
        self.controls["policy"].observe(self._show_applicable, names="value")
        self._show_applicable()
        self._init_compare()
        self._init_divergence()
        self._session = None
        self._init_run("Run eviction", 3)
        self._finish()

    SLIDER_FIELDS = {"defer_lam": "lam", "page": "page"}  # slider → the policy field it sets

    def _show_applicable(self, change=None) -> None:
        """Only the sliders the chosen policy uses are shown (the page size only for page-entrokv, ...)."""
        names = {f.name for f in fields(self.classes[self.controls["policy"].value])}
        for ctl, field in self.SLIDER_FIELDS.items():
            self.controls[ctl].layout.display = None if field in names else "none"

    def policy(self):
        """The policy object of the current controls: the panel's common parameters, DeferKV's ``λ`` and the page
        size, to those policies that have the field (the one builder, :func:`~workbench.rerun.eviction.build_policy`)."""
        c = self.controls
        return build_policy(self.classes[c["policy"].value], **self.common, lam=float(c["defer_lam"].value),
                            page=int(c["page"].value))

    def highlight(self) -> list[int]:
        """Positions of the answer document (the needle), when the prompt knows it."""
        sp = self.capture.spans
        if sp.answer_doc is None or not 0 <= sp.answer_doc < len(sp.documents):
            return []
        s, e = sp.documents[sp.answer_doc]
        return list(range(s, e))

    def analysis(self):
        """Preview :class:`GenerationResult` (kept positions only, no text) from the capture, or None
        when the policy needs evidence a capture does not hold."""
        return self.preview_of(self.policy(), int(self.controls["budget"].value))

    def preview_of(self, pol, B: int):
        """The preview of policy ``pol`` at budget ``B`` (see :meth:`analysis`)."""
        cap = self.capture
        ev = cap.cached("eviction_evidence", lambda: Evidence.from_capture(cap))
        T, L = cap.T, ev.L  # the layers an eviction compacts (a hybrid's softmax layers)
        try:
            kept = preview(pol, ev, B)  # the one budget rule (scores memoised: a budget move re-selects)
        except ValueError:  # evidence a capture does not hold (H2O's column sums, the cache's keys ...)
            return None
        # laid out as a run's: the kept prompt positions, then the tokens decoded before eviction (DeferKV's
        # first one), so that ``kept_prompt`` is the whole preview
        d = pol.defer
        kept = torch.cat([kept, torch.arange(T, T + d).expand(*kept.shape[:2], d)], dim=-1)
        res = GenerationResult(policy=pol.name, params=pol.params(), budget=B, T=T, ids=[], text=None, kept=kept,
                               evicted_at=pol.defer, compacted_layers=tuple(cap.softmax_layers), kv_bytes_before=0,
                               kv_bytes_after=0, timings={}, layers=tuple(cap.softmax_layers))
        per = self.kv_per_position()
        if per is None:  # the layers differ in what they cache: known after a run
            return res
        # the cache the run will hold just before (T + d positions in every layer) and just after eviction
        return dataclasses.replace(res, kv_bytes_before=per * L * (T + d), kv_bytes_after=res.dense_kv_bytes(per))

    def kv_per_position(self) -> int | None:
        """``adapter.kv_bytes_per_position`` of the panel's model (``None``: its layers differ, or the panel has no
        model, a preview-only panel on a synthetic capture: the bytes are known after a run)."""
        if not hasattr(self, "_kv_per_position"):  # the panel's model is fixed: read its config once
            self._kv_per_position = None if self.model is None else kv_bytes_per_position(unwrap_model(self.model)[0])
        return self._kv_per_position

    def kv_note(self, prev) -> str:
        """The KV bytes a preview says the run will hold after eviction, and their share of the full cache."""
        if self.kv_per_position() is None:
            return ("KV bytes: known after a run (" + ("no model in this panel" if self.model is None else
                                                      "this model's layers do not all cache the same shape") + ")")
        return (f"KV bytes after eviction {prev.kv_bytes_after:,} "
                f"({prev.kv_bytes_after / prev.kv_bytes_before:.0%} of the full cache's {prev.kv_bytes_before:,})")

    def no_preview(self, reason: str, policy: str, budget: int) -> go.Figure:
        """The kept-positions figure of a policy without a preview (the reason written on it)."""
        return _no_preview(reason, policy, budget, self.capture.model_id)

    def compute(self):
        figs, status = self.compute_preview(self._analyse())
        return self.divergence_figures(figs), status

    def compute_preview(self, prev):
        """The kept-positions preview (both settings' in compare mode) and the status line."""
        if self.compare_on():
            return self.compare_compute(prev)
        pol = self.policy()
        if prev is None:
            B = int(self.controls["budget"].value)
            ran = self.cache.get(self.run_key())
            if ran is not None:  # the run's own kept set stands in for the preview the capture cannot give
                fig = plots.kept_positions.draft([ran], self.prompt, highlight=self.highlight() or None)
                return {"kept": fig}, (f"kept by the run (no preview: {pol.name} scores with evidence a capture "
                                       f"does not hold): B = {ran.budget} of T = {ran.T} prompt positions")
            reason = f"{pol.name} scores with evidence a capture does not hold: no preview; press run"
            return {"kept": self.no_preview(reason, pol.name, B)}, (
                f"{reason} to generate under it with B = {B} of T = {self.capture.T} prompt positions")
        fig = plots.kept_positions.draft([prev], self.prompt, highlight=self.highlight() or None,
                                         highlight_name=ANSWER_DOC)
        B = prev.budget
        return {"kept": fig}, (f"preview from the capture: {pol.name}, B = {B} of T = {prev.T} prompt positions"
                               + (" (no eviction: B ≥ T)" if B >= prev.T else "") + f"; {self.kv_note(prev)}")

    def session(self):
        """The shared prefill for every policy (created on the first run; calls the model once)."""

        if self._session is None:
            needs = Needs.of(every_policy(**self.common))
            self._session = EvictionSession.prepare(self.model, self.prompt, needs, self.max_new_tokens,
                                                    reusable=True, keep_logits=True, progress=False)
            self.model_calls += 1
        return self._session

    def run_key(self) -> tuple:
        pol = self.policy()
        B = int(self.controls["budget"].value)
        return (pol.name, tuple(sorted(pol.params().items())), None if pol.keeps_all else B, self.max_new_tokens)

    def full_result(self, sess):
        """The full-cache answer of ``sess`` (cached: one per panel and ``max_new_tokens``)."""
        return self._cached(("full", self.max_new_tokens), lambda: sess.run(FullCache(), self.capture.T))

    def run(self):
        """Generate under the current policy and budget (cached), and the full-cache answer (in compare mode:
        under both settings, :meth:`~workbench.show.widgets.compare.CompareMode.run_compare`)."""
        if self.compare_on():
            return self.run_compare()
        pol, key = self.policy(), self.run_key()
        B = int(self.controls["budget"].value)
        self.progress.max = 3
        with self._busy():
            self._step(0, "prefill…" if self._session is None else "full cache…")
            sess = self.session()
            full = self.full_result(sess)
            self._step(1, f"{pol.name}…")
            res = self._cached(key, lambda: sess.run(pol, B))
            self._step(2, "divergence from the full-cache answer…")
            div = self.divergence_of(sess, full, pol, B, res, key)
            self._step(3, "done")
        rows = [("KV bytes " + f"{full.kv_bytes_after:,}", f"KV bytes {res.kv_bytes_after:,} "
                 f"({res.kv_bytes_after / max(full.kv_bytes_after, 1):.0%}), evicted after step {res.evicted_at}")]
        hl = self.highlight()
        if hl:
            rows.append(("answer document kept (mean over layers, groups)", f"{float(res.survival(hl).nanmean()):.3f}"))
        rows.append(("", self.divergence_note(div)))
        self._show_answers(_answer_table("full cache", _text(full, "ids"), f"{res.policy}, B = {res.budget}",
                                         _text(res, "ids"), rows))
        self.last_divergence = div
        self.update()  # the divergence figure joins (or leaves: an empty full answer); a policy without a preview:
        # the kept figure shows this run's kept set
        return res

