"""Capture: attention rows and statistics recorded from the model's own kernel (SPEC §1).

- :mod:`.hooks`: :class:`RowSet`, :func:`run_capture`, :func:`capture_attention`;
- :mod:`.data`: :class:`Capture`, saved to and loaded from disk.
"""
from workbench.capture.data import Capture
from workbench.capture.hooks import RowSet, capture_attention, run_capture

__all__ = ["Capture", "RowSet", "capture_attention", "run_capture"]
