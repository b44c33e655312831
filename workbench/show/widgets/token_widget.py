"""The token view's widget: a :class:`TokenView`'s HTML in a standard ``ipywidgets.HTML``, and a one-line
``anywidget`` that reports clicks on its tokens.

The HTML (tokens as spans, see :mod:`workbench.show.token_view`) is the value of an ``ipywidgets.HTML``: every
redraw (a slider move) is a standard widget update. It used to be the state of an anywidget, whose front end drops
every message of a model that is not ready 2 s after it was created ("[anywidget] Failed to initialize model"): a
token view created while the page was busy (plotly's bundle evaluating, the figures of the cells above drawing)
stayed deaf to every later slider (CI, stop 35: the 32k token panel's page and layer sliders). The click relay is
an anywidget that only *sends*: a click on a token of its box (``.wb-token-widget``) goes to the kernel as
``{"event": "click", "position": p}``, which works whether or not its model ever became ready. The hover text is
each span's ``title`` (token, position, value, chunk). No plotly, so no per-token colour warnings and nothing
clipped.
"""
from __future__ import annotations

import anywidget
import ipywidgets as W

from workbench.show.token_view import TokenView

__all__ = ["TokenWidget"]

# One listener per view of the relay, on the document: a click on a token inside the token box that holds this
# view (so several views of one widget, or several token views, each report their own clicks once).
_RELAY_ESM = """
function render({ model, el }) {
  el.style.display = 'none';
  const onClick = (e) => {
    const t = e.target && e.target.closest ? e.target.closest('.tk[data-pos]') : null;
    const box = t && t.closest('.wb-token-widget');
    if (!box || !box.contains(el)) return;
    model.send({event: 'click', position: Number(t.dataset.pos)});
  };
  document.addEventListener('click', onClick);
  return () => document.removeEventListener('click', onClick);
}
export default { render };
"""


class _ClickRelay(anywidget.AnyWidget):
    """Sends ``{"event": "click", "position": p}`` for a click on a token of the box it sits in (no state)."""

    _esm = _RELAY_ESM


def _checked(view) -> TokenView:
    if not isinstance(view, TokenView):
        raise ValueError(f"view: must be a TokenView, got {type(view).__name__}")
    return view


class TokenWidget(W.VBox):
    """Shows one :class:`TokenView`; :meth:`show` replaces it; ``on_token_click(fn)`` registers
    ``fn(position)`` for clicks on tokens. ``html`` is the HTML shown, ``meta`` the view's meta."""

    def __init__(self, view: TokenView, **kw):
        view = _checked(view)
        self._shown = W.HTML(value=view.html())  # the comm opens with the view's HTML
        self._relay = _ClickRelay()
        super().__init__([self._shown, self._relay], **kw)
        self.add_class("wb-token-widget")
        self.view = view
        self._click: list = []
        self._relay.on_msg(self._on_msg)

    @property
    def html(self) -> str:
        return self._shown.value

    @property
    def meta(self) -> dict:
        return self.view.meta

    def show(self, view: TokenView) -> None:
        """Draw ``view`` (one message: its HTML)."""
        self.view = _checked(view)
        self._shown.value = view.html()

    def on_token_click(self, fn) -> None:
        self._click.append(fn)

    def _on_msg(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("event") == "click":
            for fn in self._click:
                fn(int(content["position"]))
