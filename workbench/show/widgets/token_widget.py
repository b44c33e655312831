"""The token view's widget: an ``anywidget`` that shows a :class:`~workbench.show.token_view.TokenView`'s HTML
and reports clicks on tokens.

The front end is a few lines of JavaScript: it puts the view's HTML (tokens as spans, see
:mod:`workbench.show.token_view`) into the output and sends ``{"event": "click", "position": p}`` when a
token is clicked; the hover text is each span's ``title`` (token, position, value, chunk). No plotly, so no
per-token colour warnings and nothing clipped. ``meta`` mirrors the view's meta for the front end (tests).
"""
from __future__ import annotations

import anywidget
import traitlets

from workbench.show.token_view import TokenView

__all__ = ["TokenWidget"]

_ESM = """
function render({ model, el }) {
  el.classList.add('wb-token-widget');
  const draw = () => { el.innerHTML = model.get('html'); };
  draw();
  model.on('change:html', draw);
  el.addEventListener('click', (e) => {
    const t = e.target.closest('.tk[data-pos]');
    if (!t || !el.contains(t)) return;
    model.send({event: 'click', position: Number(t.dataset.pos)});
  });
}
export default { render };
"""


def _checked(view) -> TokenView:
    if not isinstance(view, TokenView):
        raise ValueError(f"view: must be a TokenView, got {type(view).__name__}")
    return view


class TokenWidget(anywidget.AnyWidget):
    """Shows one :class:`TokenView`; :meth:`show` replaces it; ``on_token_click(fn)`` registers
    ``fn(position)`` for clicks on tokens."""

    _esm = _ESM
    html = traitlets.Unicode("").tag(sync=True)
    meta = traitlets.Dict().tag(sync=True)

    def __init__(self, view: TokenView, **kw):
        # the comm opens with the view's HTML (no empty first state for a view to draw)
        super().__init__(html=_checked(view).html(), meta=dict(view.meta), **kw)
        self._click: list = []
        self.view = view
        self.on_msg(self._on_msg)

    def show(self, view: TokenView) -> None:
        """Draw ``view`` (one message: its HTML and meta)."""
        self.view = _checked(view)
        with self.hold_sync():
            self.html = view.html()
            self.meta = dict(view.meta)

    def on_token_click(self, fn) -> None:
        self._click.append(fn)

    def _on_msg(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("event") == "click":
            for fn in self._click:
                fn(int(content["position"]))
