"""The compare mode of the pruned-prefill panel: two EntroPrefill settings side by side.

:class:`PruneCompareMode` is mixed into :class:`~workbench.show.widgets.run.PrunePanel`. *compare* shows setting
``B``'s controls (every parameter, the mode and the fixed ``l*``) beside the panel's own (``A``). With it on, the
status adds both predicted decisions and a token view marks the prompt positions each setting's prefill retains
(A only, B only, both, neither: :func:`~workbench.rerun.prune_compare.retained_set` of each trace,
:func:`~workbench.show.plots.kept_compare`). *Run* runs both pruned prefills (each cached as its single-mode
run; the full prefill shared) and shows the answers beside the full prefill's with ``T'``, KV bytes, the
first-token margin and the membership counts of the runs' retained sets
(:func:`~workbench.rerun.prune_compare.compare_pruned`; no drift diagnostics in compare mode). A setting
compared with itself, or a fixed layer without a selection, is refused in the status, the figures unchanged.
"""
from __future__ import annotations

import ipywidgets as W

from workbench.analyse.procedure import trace
from workbench.rerun.prune import run_full, run_pruned
from workbench.rerun.prune_compare import PruneComparison, compare_pruned, compare_retained, retained_set
from workbench.show import plots
from workbench.show.notation import symbol
from workbench.show.widgets.answers import answer_table
from workbench.show.widgets.base import SLIDERS, ep_controls, ep_from, html_escape
from workbench.show.widgets.compare import CompareControls

__all__ = ["PruneCompareMode", "prune_table"]


def prune_table(cmp: PruneComparison) -> str:
    """The answers of a :class:`PruneComparison` side by side (full prefill, A, B) with ``l*``, ``T'``, KV bytes,
    first-token margins and the membership counts."""
    f, a, b = cmp.full, cmp.a, cmp.b
    c = cmp.kept.counts()

    def where(s):
        return "bypass (nothing pruned)" if s.l_star is None else f"l* = {s.l_star}, T' = {s.T_prime}"

    def agree(s):
        return "same first token" if s.first_token == f.first_token else "first token differs"

    rows = [(f"KV bytes {f.kv_bytes:,} (T = {f.T_prime})", f"KV bytes {a.kv_bytes:,} ({a.kv_ratio:.0%}), {where(a)}",
             f"KV bytes {b.kv_bytes:,} ({b.kv_ratio:.0%}), {where(b)}"),
            (f"first-token margin (top-1 − top-2 logit): {f.first_margin:.4g}",
             f"{a.first_margin:.4g}, {agree(a)}", f"{b.first_margin:.4g}, {agree(b)}"),
            (f"retained positions of T = {cmp.kept.T}", f"A only {c['A only']}, both {c['both']}",
             f"B only {c['B only']}, neither {c['neither']}")]
    return answer_table([("full prefill", f.text or f"ids {list(f.ids)}"), (f"A: {a.label}", a.text or f"ids {list(a.ids)}"),
                         (f"B: {b.label}", b.text or f"ids {list(b.ids)}")], rows)


class PruneCompareMode(CompareControls):
    """Setting ``B`` beside the prune panel's setting ``A`` (see the module docstring). Uses the panel's
    ``controls``, ``NAMES``, ``base``, ``capture``, ``run_key``, ``_cached``, ``_busy`` and ``_step``."""

    B_WHAT = "parameters, mode or fixed layer"

    def _init_compare(self) -> None:
        c, L = self.controls, self.capture.L
        names = tuple(self.NAMES) + ("mode", "run_layer")
        self.SIDE_B = {f"{n}_b": n for n in names}
        self.TOOLTIP_KEYS = dict(self.SIDE_B)
        c["compare"] = W.Checkbox(value=False, description="compare with setting B")
        for n, w in ep_controls(self.NAMES, self.base, k=self.capture.spans.k, continuous=False).items():
            w.description = f"{w.description} (B)"
            c[f"{n}_b"] = w
        c["mode_b"] = W.Dropdown(options=["adaptive", "fixed layer"], value="fixed layer", description="mode (B)")
        c["run_layer_b"] = SLIDERS["run_layer"].make(c["run_layer"].value, lo=1, hi=L - 1, continuous=False)
        c["run_layer_b"].description = "fixed l* (B)"
        self.last_compare: PruneComparison | None = None
        self._b_box = W.VBox([])
        c["mode_b"].observe(self._show_layer_b, names="value")
        c["compare"].observe(self._show_compare, names="value")
        self._show_layer_b()
        self._show_compare()

    def _show_layer_b(self, change=None) -> None:
        self.controls["run_layer_b"].layout.display = None if self.controls["mode_b"].value == "fixed layer" else "none"

    def params_b(self):
        """Setting B's EntroPrefill parameters."""
        return ep_from({n: self.controls[f"{n}_b"] for n in self.NAMES}, self.base)

    def layer_of(self, side: str) -> int | None:
        """The fixed ``l*`` of side ``"a"`` or ``"b"`` (``None``: adaptive)."""
        s = "" if side == "a" else "_b"
        return None if self.controls[f"mode{s}"].value == "adaptive" else int(self.controls[f"run_layer{s}"].value)

    def run_key_b(self) -> tuple:
        p = self.params_b()
        return ("pruned", tuple(sorted(p.to_dict().items())), self.layer_of("b"), self.max_new_tokens)

    def setting_name(self) -> str:
        la = self.layer_of("a")
        return "adaptive" if la is None else f"fixed l* = {la}"

    def labels(self) -> tuple[str, str]:
        """Short names of A and B: the mode and the parameters that tell them apart."""
        pa, pb = ep_from(self.controls, self.base).to_dict(), self.params_b().to_dict()
        la, lb = self.layer_of("a"), self.layer_of("b")
        out = []
        for p, layer, q in ((pa, la, pb), (pb, lb, pa)):
            name = "adaptive" if layer is None else f"fixed l* = {layer}"
            out.append(name + "".join(f", {symbol(k)} = {p[k]:.3g}" if isinstance(p[k], float) else f", {symbol(k)} = {p[k]}"
                                      for k in sorted(p) if p[k] != q[k]))
        return out[0], out[1]

    # ----- preview -----
    def compare_compute(self, tr_a, figs: dict, status: str):
        """The compare preview: the token view of the positions each setting's prefill retains (predicted from
        the capture) and both decisions in the status."""
        self.compare_check()
        cap = self.capture
        tr_b = trace(cap, self.params_b(), certify=False, pooling_cache=self.pooling_cache)
        ka = retained_set(tr_a, cap.spans, self.layer_of("a"))
        kb = retained_set(tr_b, cap.spans, self.layer_of("b"))
        cmp = compare_retained(ka, kb, cap.T, self.labels())
        n = cmp.counts()
        figs = dict(figs, compare=plots.kept_compare.draft(cmp, cap, per_page=max(16, cap.T), model_id=cap.model_id))
        lb = self.layer_of("b")
        b_what = html_escape(tr_b.decision) if lb is None else f"fixed l* = {lb}: removes chunks {list(tr_b.selections[lb].removed)}"
        return figs, (f"A ({html_escape(cmp.label_a)}): {status}<br>B ({html_escape(cmp.label_b)}): {b_what}<br>"
                      f"retained (predicted): {n['A only']} A only, {n['B only']} B only, {n['both']} both, "
                      f"{n['neither']} neither of T = {cmp.T}; press run to run both")

    # ----- run -----
    def run_compare(self) -> PruneComparison:
        """Run the full prefill and both pruned prefills (each cached as its single-mode run); the answers side
        by side. A setting compared with itself is refused before any model call."""
        self.refuse_same()
        pa, pb = ep_from(self.controls, self.base), self.params_b()
        la, lb = self.layer_of("a"), self.layer_of("b")
        n = self.max_new_tokens
        with self._busy():
            self._step(0, "full prefill…")
            full = self._cached(("full", n), lambda: run_full(self.model, self.prompt, max_new_tokens=n,
                                                              keep_hidden=True))
            self._step(1, "A: pruned prefill…")
            ra = self._cached(self.run_key(), lambda: run_pruned(self.model, self.prompt, pa, layer=la, max_new_tokens=n,
                                                                 keep_hidden=True, progress=False))
            self._step(2, "B: pruned prefill…")
            rb = self._cached(self.run_key_b(), lambda: run_pruned(self.model, self.prompt, pb, layer=lb,
                                                                   max_new_tokens=n, keep_hidden=True, progress=False))
            cmp = compare_pruned(full, ra, rb, self.labels())
            self._step(3, "done")
        self.last_compare = cmp
        self._show_answers(prune_table(cmp))
        return cmp
