"""What eviction changed in the answer, in the eviction panel: after a run, the full-cache answer's tokens with the
policy's run teacher-forced on them (:func:`workbench.rerun.divergence.session_divergence`: per-token KL, change of
the chosen token's log-probability and margin, the first parting token), drawn by
:func:`workbench.show.plots.answer_divergence`; in compare mode A and B side by side.

:class:`DivergenceView` is mixed into :class:`~workbench.show.widgets.run.EvictionPanel`. The figure shows the
*last run* of the mode on screen (its title names the setting), so that a slider move keeps the previous result
on screen until the next run; the figure leaves the row in a mode that has not run yet.
"""
from __future__ import annotations

from workbench.analyse.divergence import AnswerDivergence
from workbench.rerun.divergence import session_divergence
from workbench.run.models import unwrap_model
from workbench.show import plots

__all__ = ["DivergenceView"]


class DivergenceView:
    """Uses the panel's ``model``, ``capture``, ``_cached`` and ``compare_on``."""

    #: why the last run has no divergence (an empty full-cache answer), shown in the answer box
    NO_ANSWER = "no divergence: the full-cache answer has no tokens"

    def _init_divergence(self) -> None:
        self.last_divergence: AnswerDivergence | None = None
        self.last_divergence_ab: tuple[AnswerDivergence, AnswerDivergence] | None = None

    def divergence_of(self, sess, full, pol, budget: int, res, key) -> AnswerDivergence | None:
        """The divergence of the run ``res`` (``pol`` at ``budget``, cached under ``key`` as a run) from ``full``:
        one more teacher-forced decode of the shared session, cached; ``None`` when the full answer is empty."""
        if len(full.ids) == 0:
            return None
        tok = unwrap_model(self.model)[1]
        return self._cached(("divergence", key), lambda: session_divergence(sess, full, pol, budget,
                                                                            own_ids=res.ids, tokenizer=tok))

    def divergence_note(self, div: AnswerDivergence | None) -> str:
        """The divergence in words for the answer box."""
        if div is None:
            return self.NO_ANSWER
        where = "the answers agree" if div.first_divergence is None else f"parts at answer token {div.first_divergence}"
        return f"mean KL {div.mean_kl:.3g} nats; {where}"

    def divergence_figures(self, figs: dict) -> dict:
        """``figs`` with the ``divergence`` figure of the mode on screen, when that mode has run."""
        if self.compare_on():
            runs = self.last_divergence_ab
        else:
            runs = None if self.last_divergence is None else (self.last_divergence,)
        if runs is not None:
            figs["divergence"] = plots.answer_divergence.draft(*runs, model_id=self.capture.model_id)
        return figs
