"""Which value a control can take unchanged, and the widgets inside a container: what a panel that shows a new
capture (:meth:`~workbench.show.widgets.base.Panel.set_capture`) uses to keep its control values and to close
the controls it no longer shows."""
from __future__ import annotations

import ipywidgets as W

__all__ = ["accepts", "widget_tree"]


def widget_tree(w) -> list:
    """``w`` and every widget inside it (containers' children)."""
    out = [w]
    for c in getattr(w, "children", ()) or ():
        out += widget_tree(c)
    return out


def accepts(w: W.Widget, v) -> bool:
    """Whether control ``w`` can take value ``v`` unchanged (inside a slider's range, one of a menu's options,
    a check box's bool)."""
    if isinstance(w, W.FloatLogSlider):
        return isinstance(v, (int, float)) and v > 0 and w.base ** w.min <= v <= w.base ** w.max
    if isinstance(w, (W.IntSlider, W.FloatSlider)):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and w.min <= v <= w.max
    if isinstance(w, W.Dropdown):
        return any((o[1] if isinstance(o, tuple) else o) == v for o in w.options)
    if isinstance(w, W.Checkbox):
        return isinstance(v, bool)
    return False
