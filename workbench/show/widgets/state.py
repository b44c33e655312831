"""One shared capture for the panels of a notebook (:class:`CaptureState`).

A panel built on a ``CaptureState`` (instead of a :class:`~workbench.capture.data.Capture`) shows the state's
capture and follows it: :meth:`CaptureState.set` hands a new capture (and the prompt that built it) to every
following panel (:meth:`~workbench.show.widgets.base.Panel.set_capture`), which rebuilds its controls' ranges
from the new capture (layers, chunks, rows), keeps the values that are still valid, and redraws. What sets the
state is, e.g., :class:`workbench.study.prompt_panel.PromptPanel` (paste documents and a question, capture).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = ["CaptureState"]


def _is_capture(x) -> bool:
    """A capture (duck-typed: attention rows, the prompt's spans and the layer count)."""
    return all(hasattr(x, a) for a in ("attn", "spans", "L", "T"))


class CaptureState:
    """The capture (``.capture``), the prompt that built it (``.prompt``, may be ``None``), the model that made it
    (``.model``, may be ``None``: what captures a clicked token's row on demand) and the panels that follow it
    (``.panels``, in the order they joined). ``.version`` counts the captures set (1: the first)."""

    def __init__(self, capture: Capture, prompt=None, *, model=None):
        if not _is_capture(capture):
            raise ValueError(f"capture: must be a Capture, got {type(capture).__name__}")
        self.capture = capture
        self.prompt = prompt
        self.model = model
        self.panels: list = []
        self.version = 1

    def follow(self, panel) -> None:
        """Make ``panel`` follow this state (a panel built on the state calls this itself)."""
        if not callable(getattr(panel, "set_capture", None)):
            raise ValueError(f"panel: must have set_capture (a Panel), got {type(panel).__name__}")
        if not any(p is panel for p in self.panels):
            self.panels.append(panel)

    def set(self, capture: Capture, prompt=None, *, model=None) -> dict[str, str]:
        """Make ``capture`` (made by ``model``; ``None``: unknown) the state's capture and hand it to every
        following panel. Returns
        ``{panel: reason}`` for the panels that could not show it (each keeps its previous capture, its figures
        and says so in its status line); empty when every panel follows."""
        if not _is_capture(capture):
            raise ValueError(f"capture: must be a Capture, got {type(capture).__name__}")
        self.capture, self.prompt, self.model = capture, prompt, model
        self.version += 1
        failed: dict[str, str] = {}
        for i, p in enumerate(self.panels):
            try:
                p.set_capture(capture)
            except ValueError as e:
                failed[f"{type(p).__name__} #{i}"] = str(e)
        return failed
