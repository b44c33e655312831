"""The analytic panels: no model calls; every slider recomputes pure analysis functions (SPEC §2–§9)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import ipywidgets as W
import plotly.graph_objects as go

from workbench.analyse.envelope import envelope
from workbench.analyse.pages import PageScoreMemo, PageSelection
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.procedure import layer_proposal, proposal_inputs, trace
from workbench.analyse.selection import target_tokens
from workbench.analyse.shift import ShiftAnalysis
from workbench.choices import HeadQuantity
from workbench.show import plots
from workbench.show.widgets.base import (
    SLIDERS,
    Panel,
    ep_controls,
    ep_from,
    head_dim_of,
    html_escape,
)
from workbench.show.widgets.sliders import scale_dropdown, scale_value

if TYPE_CHECKING:
    from workbench.capture.data import Capture
    from workbench.show.widgets.state import CaptureState

__all__ = ["HeadsPanel", "PriorityPanel", "AuditPanel", "ShiftPanel", "PagesPanel"]


# ----------------------------------------------------------------------------- analytic panels
class HeadsPanel(Panel):
    """Head pooling (SPEC §2): ζ, τ, the layer and the quantity → layer × head heatmap and the
    per-head residual distributions of one layer. No model calls."""

    title = "Head pooling (SPEC §2)"
    KEEP_NOT = ("scale",)  # the colour scale starts at the new prompt length's default

    def __init__(self, capture: Capture | CaptureState, params: EntroPrefillParams | None = None, *, layer: int | None = None,
                 quantity: HeadQuantity = "w"):
        super().__init__()
        self.base = params or EntroPrefillParams()
        self._layer, self._quantity = layer, quantity
        self._setup(self._source(capture))

    follows_capture = True

    def _setup(self, capture: Capture) -> None:
        self.capture = capture
        L = capture.L
        self.controls = ep_controls(("zeta", "tau"), self.base)
        self.controls["layer"] = SLIDERS["layer"].make(self._start_layer(L, self._layer), lo=0, hi=L - 1)
        self.controls["quantity"] = W.Dropdown(options=["w", "H", "sink"], value=self._quantity, description="heatmap")
        self.controls["scale"] = scale_dropdown(capture.T, "residual colours")
        self._finish()

    def analysis(self):
        p = ep_from(self.controls, self.base)
        return self.pooling_cache(p.pooling())

    def compute(self):
        pool = self._analyse()
        l = int(self.controls["layer"].value)
        figs = {"heads": plots.head_heatmap.draft(pool, quantity=self.controls["quantity"].value),
                "residual": plots.residual_distribution.draft(pool, l, self.capture.spans,
                                                        scale=scale_value(self.controls["scale"]))}
        nv = int((~pool.valid).sum())
        st = f"{pool.L} layers × {pool.n_heads} heads; {nv} layer(s) with an invalid head (z ≤ ρ_min)"
        return figs, st


class PriorityPanel(Panel):
    """Chunk priorities and the selection of one layer (SPEC §3–§5): ζ, τ, ε_s, λ, the saving target,
    the row tolerance, m₀ and the layer → priority bars (kept/removed), the envelope of the greedy
    removal per observer row, and the layer's certificate (D, U, gap) in the status line. No model."""

    title = "Chunk priorities, greedy selection and certificate (SPEC §3–§5)"

    def __init__(self, capture: Capture | CaptureState, params: EntroPrefillParams | None = None, *, layer: int | None = None,
                 certify: bool = True):
        super().__init__()
        self.base = params or EntroPrefillParams()
        self._layer, self._certify = layer, certify
        self._setup(self._source(capture))

    follows_capture = True

    def _setup(self, capture: Capture) -> None:
        L, k = capture.L, capture.spans.k
        if k == 0:
            raise ValueError("capture: the prompt has no candidate chunks (k = 0); nothing to prioritise")
        self.capture = capture
        self.controls = ep_controls(("zeta", "tau", "eps_s", "lam", "target", "eps_row", "m0"), self.base, k=k)
        self.controls["layer"] = SLIDERS["layer"].make(self._start_layer(L, self._layer), lo=0, hi=L - 1)
        self.controls["certify"] = W.Checkbox(value=self._certify, description="LP certificate U")
        self._m0_memo: dict = {}
        self._finish()
        self._m0_state()

    def m0_matters(self) -> bool:
        """Whether ``m₀`` can change the selection or the certificate at the current other parameters: the
        greedy's removals shrink and ``U_l`` falls as ``m₀`` grows (the cardinality row ``Σ x ≤ k − m₀``), so
        ``m₀`` is inert exactly when ``m₀ = 0`` and ``m₀ = k`` give the same removals, ``D``, ``U`` and verdict."""
        return self._m0_effect()[0]

    def _m0_effect(self) -> tuple[bool, int | None]:
        """``(m0_matters, r0)``: ``r0`` the chunks the greedy removes at the current layer with no count limit
        (``m₀ = 0``; ``None``: no selection there). The scan's removals do not depend on ``m₀`` until the count
        limit ``k − m₀`` stops it, so ``m₀`` changes the selection exactly when ``m₀ > k − r0``."""
        c = self.controls
        p = ep_from(c, self.base)
        l, cert, k = int(c["layer"].value), bool(c["certify"].value), self.capture.spans.k
        key = (p.replace(m0=0), l, cert)
        if key not in self._m0_memo:
            inputs = proposal_inputs(self.capture, p, self.pooling_cache)
            out = []
            for m0 in (0, k):
                sel = layer_proposal(self.capture, p.replace(m0=m0), l, certify=cert, inputs=inputs).selection
                out.append(None if sel is None else (tuple(sel.removed), sel.D, sel.U, sel.verdict.replace(
                    f"m0={m0}", "").replace(f"m₀ = {m0}", "")))
            self._m0_memo = {key: (out[0] != out[1], None if out[0] is None else len(out[0][0]))}
        return self._m0_memo[key]

    def m0_note(self) -> str:
        """One line on what ``m₀`` does here, when its slider moves nothing in the selection: disabled (no value
        changes anything), or the present value below the point where the count limit ``k − m₀`` binds."""
        matters, r0 = self._m0_effect()
        if r0 is None:
            return ""
        k, m0 = self.capture.spans.k, int(self.controls["m0"].value)
        if not matters:
            return (f"m₀ has no effect at this layer (slider disabled): the greedy removes {r0} of k = {k} chunks "
                    f"and U_l is the same for every m₀ in [0, {k}]")
        if r0 == 0:
            return "m₀ does not change the selection at this layer: the greedy removes no chunk at any m₀ (only U_l moves)"
        if m0 <= k - r0:
            return (f"m₀ = {m0} does not bind here: the greedy removes {r0} chunks, within the count limit "
                    f"k − m₀ = {k - m0}; the selection changes only for m₀ > {k - r0}")
        return ""

    def _m0_state(self) -> None:
        """Disable ``m₀`` (the reason in its tooltip) when it cannot change anything here."""
        w = self.controls["m0"]
        on = self.m0_matters()
        w.disabled = not on
        w.tooltip = (self.tooltip("m0") if on else
                     "m₀ cannot change anything here: at this layer the greedy removes the same chunks, and U_l is "
                     "the same, for every m₀ in [0, k] (nothing is removed even with m₀ = 0)")

    def update(self) -> None:
        super().update()
        self._m0_state()

    def analysis(self):
        """``(params, pooling, priorities, selection or None, envelope or None)`` at the chosen layer."""

        cap = self.capture
        p = ep_from(self.controls, self.base)
        l = int(self.controls["layer"].value)
        inputs = proposal_inputs(cap, p, self.pooling_cache)  # exactly what trace() uses, for every params.priority
        sel = layer_proposal(cap, p, l, certify=bool(self.controls["certify"].value), inputs=inputs).selection
        pool, prio = inputs.pooling, inputs.priorities
        env = None
        if sel is not None:
            env = envelope(cap.observer_attn()[l], pool.mu[l], pool.omega[l], cap.spans.removal_mask(sel.removed),
                           layer=l)
        return p, pool, prio, sel, env

    def compute(self):
        p, pool, prio, sel, env = self._analyse()
        l = int(self.controls["layer"].value)
        figs = {"priorities": plots.chunk_priorities.draft(prio, self.capture.spans, l,
                                                                  removed=None if sel is None else sel.removed)}
        if env is not None:
            figs["envelope"] = plots.envelope_rows.draft(env)
        elif "envelope" in self.figures:
            figs["envelope"] = go.Figure(self.figures["envelope"])  # unchanged
        if sel is not None:  # the saving target as a line, the greedy D against the LP's U (when certified)
            figs["certificate"] = plots.certificate.draft({l: sel})
        elif "certificate" in self.figures:
            figs["certificate"] = go.Figure(self.figures["certificate"])
        if sel is None:
            st = f"layer {l}: invalid (residual or document mass ≤ ρ_min); no selection"
        else:
            st = f"layer {l}: {html_escape(sel.verdict)}; envelope holds for every row: {env.all_hold}"
            note = self.m0_note()
            if note:
                st += f"<br><i>{html_escape(note)}</i>"
        return figs, st


class AuditPanel(Panel):
    """The adaptive procedure (paper §5 steps 1–7, SPEC §6) from every ``EntroPrefillParams`` →
    the per-layer trace, the certificate per layer and the decision. No model calls.

    The LP certificate of all monitored layers costs a few ms per layer; it depends on the row tolerance
    and ``m₀`` only (not on the priorities) and is memoised, so with ``certify`` on only the ``ε_row`` and
    ``m₀`` sliders update on release (``continuous_update=False``).
    """

    title = "Adaptive layer selection and audit (SPEC §5–§6)"
    NAMES = ("zeta", "tau", "eps_s", "lam", "target", "eps_row", "m0", "audit_mode", "m_a", "delta", "eps_audit",
             "d_max", "streak", "seed", "priority")

    def __init__(self, capture: Capture | CaptureState, params: EntroPrefillParams | None = None, *, certify: bool = True):
        super().__init__()
        self.base = params or EntroPrefillParams()
        self._certify = certify
        self._setup(self._source(capture))

    follows_capture = True

    def _setup(self, capture: Capture) -> None:
        self.capture = capture
        self.controls = ep_controls(self.NAMES, self.base, k=capture.spans.k)
        self.controls["certify"] = W.Checkbox(value=self._certify, description="LP certificates U_l")
        self.controls["certify"].observe(self._continuous, names="value")  # before a kept value is set
        self._continuous({"new": self._certify})
        self._finish()
        for name in ("audit_mode", "priority"):
            self.controls[name].observe(self._show_applicable, names="value")
        self._show_applicable()

    LP_INPUTS = ("eps_row", "m0")  # a new LP on every layer when these move

    def _show_applicable(self, change=None) -> None:
        """``m_a`` and ``δ`` only for the sampled audit (the exact audit has ``b = 0`` whatever they are);
        ``seed`` only where a draw uses it (the sampled audit, the random priority): a slider that changes
        nothing is hidden."""
        sampled = self.controls["audit_mode"].value == "sampled"
        for name in ("m_a", "delta"):
            self.controls[name].layout.display = None if sampled else "none"
        uses_seed = sampled or self.controls["priority"].value == "random"
        self.controls["seed"].layout.display = None if uses_seed else "none"

    def _continuous(self, change) -> None:
        for name in self.LP_INPUTS:
            self.controls[name].continuous_update = not change["new"]

    def analysis(self):

        p = ep_from(self.controls, self.base)
        return trace(self.capture, p, certify=bool(self.controls["certify"].value), pooling_cache=self.pooling_cache)

    def compute(self):

        tr = self._analyse()
        budget = target_tokens(tr.params.target, self.capture.spans.N, tr.params.target_tokens)
        figs = {"trace": plots.trace_layers.draft(tr),
                "certificate": plots.certificate.draft(tr, budget)}
        st = html_escape(tr.decision)
        if tr.notes:
            st += "<br><small>" + "<br>".join(html_escape(n) for n in tr.notes) + "</small>"
        return figs, st


class ShiftPanel(Panel):
    """Prefill-vs-first-decode shift (SPEC §9): top-k, the reference's first decode row and the tail
    window → JSD and recall per step and layer, the boundary leap; ``level`` (KV groups or query heads)
    and ``layer`` (all, or one) only change the view. No model calls."""

    title = "Prefill → decode attention shift (SPEC §9)"

    def __init__(self, capture: Capture | CaptureState, *, k: int = 32):
        super().__init__()
        self._k = k
        self._setup(self._source(capture))

    follows_capture = True

    def _setup(self, capture: Capture) -> None:
        k = self._k
        n_tail, n_dec = capture.rows_of("tail").numel(), capture.rows_of("decode").numel()
        if n_tail == 0 or n_dec == 0:
            raise ValueError("capture: needs tail and decode rows (capture with RowSet(tail >= 1, n_decode >= 1))")
        self.capture = capture
        # k and W only index what the analysis keeps per capture (~1 ms); a new reference costs ~1 s at
        # T ≈ 2k the first time (ranks looked up for every k), so ref_start updates on release
        self.controls = {
            "k": SLIDERS["k"].make(min(k, capture.T), lo=1, hi=capture.T),
            "ref_start": SLIDERS["ref_start"].make(1, lo=1, hi=max(n_dec, 1), continuous=False),
            "W": SLIDERS["W"].make(n_tail, lo=1, hi=n_tail),
            "level": W.Dropdown(options=["group", "head"], value="group", description="level"),
            "layer": W.Dropdown(options=[("all", "all")] + [(str(l), l) for l in range(capture.L)], value="all",
                                description="layer"),  # not None: a Dropdown shows None as a blank
        }
        self._shift_key = self._shift = None
        if n_dec == 1:
            self.controls["ref_start"].disabled = True
        self._finish()

    def analysis(self):
        """The :class:`~workbench.analyse.shift.ShiftResult` (kept while only the view controls change)."""

        c = self.controls
        key = (int(c["k"].value), int(c["ref_start"].value), int(c["W"].value))
        if key != self._shift_key:
            self._shift = ShiftAnalysis(k=key[0], ref_start=key[1], W=key[2])(self.capture)
            self._shift_key = key
        return self._shift

    def compute(self):
        sh = self._analyse()
        c = self.controls
        layer = None if c["layer"].value == "all" else int(c["layer"].value)
        fig = plots.shift_steps.draft(sh, level=c["level"].value, layer=layer)
        s = sh.summary()
        parts = [f"{r.level}: recall r=0 {r.recall_0:.3f} → r=1 {r.recall_1:.3f}, leap fraction {r.leap_fraction:.2f}"
                 for r in s.itertuples()]
        return {"shift": fig}, "; ".join(parts)


class PagesPanel(Panel):
    """GQA unions and pages (SPEC §8): page size, pages kept K, ζ, τ and the layer → page scores,
    selection and UOR; KV payloads in the status line. No model calls."""

    title = "Pages and GQA unions (SPEC §8)"

    def __init__(self, capture: Capture | CaptureState, params: EntroPrefillParams | None = None, *, layer: int | None = None,
                 s: int = 64, e: int = 2, head_dim: int | None = None):
        super().__init__()
        self.base = params or EntroPrefillParams()
        self.s, self.e = int(s), int(e)
        self._layer, self._head_dim = layer, head_dim
        self._setup(self._source(capture))

    follows_capture = True

    def _setup(self, capture: Capture) -> None:
        self.capture = capture
        self._memo: PageScoreMemo | None = None  # per-capture group-score sums (ζ moves O(L·G·T))
        self._results: dict = {}
        self.d = int(self._head_dim) if self._head_dim is not None else head_dim_of(capture)
        L = capture.L
        self.controls = {
            "page": SLIDERS["page"].make(),
            "K": SLIDERS["K"].make(),
            **ep_controls(("zeta", "tau"), self.base),
            "layer": SLIDERS["layer"].make(self._start_layer(L, self._layer), lo=0, hi=L - 1),
        }
        self._k_range()
        self.controls["page"].observe(self._k_range, names="value")  # before the panel's own observer
        self._finish()

    def n_pages(self) -> int:
        """Pages of the prompt at the current page size: ``⌈T / b⌉``."""
        return -(-self.capture.T // int(self.controls["page"].value))

    def _k_range(self, change=None) -> None:
        """K's range follows the data: ``1 ≤ K ≤`` the number of pages (a smaller page size allows more)."""
        k = self.controls["K"]
        n = self.n_pages()
        silent, self._silent = self._silent, True
        try:
            k.max = max(1, n)
        finally:
            self._silent = silent
        k.tooltip = f"{self.tooltip('K')} (here at most the {n} pages of size b = {int(self.controls['page'].value)})"

    def analysis(self):
        c = self.controls
        ep = ep_from(c, self.base)
        key = (ep.zeta, ep.tau, int(c["page"].value), int(c["K"].value))
        if key not in self._results:  # a layer move re-draws the figure only
            pool = self.pooling_cache(ep.pooling())
            if self._memo is None or self._memo.a is not pool.a:
                self._memo = PageScoreMemo(pool.a, self.capture.head_group)
            self._results[key] = PageSelection(b=key[2], K=key[3], s=self.s, e=self.e).select(
                pool.a, pool.w, self.capture.head_group, self.d, memo=self._memo, pooling=pool)
            while len(self._results) > 2:
                self._results.pop(next(iter(self._results)))
        return self._results[key]

    def compute(self):
        pr = self._analyse()
        l = int(self.controls["layer"].value)
        by = pr.bytes
        st = (f"layer {l}: page union U = {int(pr.U[l])} of {pr.importance.shape[-1]} pages; KV bytes: per-group pages "
              f"{by['per_group_pages']:,}, union {by['union']:,}, dense {by['dense']:,}")
        return {"pages": plots.pages.draft(pr, l, self.capture.spans)}, st


