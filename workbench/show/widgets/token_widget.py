"""The token view's widget: a :class:`TokenView`'s HTML in a standard ``ipywidgets.HTML``, and a hidden standard
``ipywidgets.Text`` that carries clicks on its tokens to the kernel. No anywidget, no front-end module of its own.

The HTML (tokens as spans, see :mod:`workbench.show.token_view`) is the value of an ``ipywidgets.HTML``: every
redraw (a slider move) is a standard widget update. It used to be the state of an anywidget, whose front end drops
every message of a model that is not ready 2 s after it was created ("[anywidget] Failed to initialize model"): a
token view created while the page was busy stayed deaf to every later slider (seen in CI). The click relay was
an anywidget too: under the same load it still sent its clicks, but anywidget's rejected promise showed as an
uncaught page error (notebook 08's compare view). Now the live HTML is wrapped in one element whose
``onclick`` (:data:`_ONCLICK`) writes ``"<position>:<time>"`` into the hidden text box of the same token box
(``.wb-token-widget``) and fires its ``input`` event: ipywidgets' own text view sends the value (``continuous_update``),
and the kernel calls the click handlers with the position. The exported HTML (``TokenView.html()``) has no handler.
The hover text is each span's ``title`` (token, position, value, chunk).
"""
from __future__ import annotations

import html

import ipywidgets as W

from workbench.show.token_view import TokenView

__all__ = ["TokenWidget"]

# On the live view's wrapper: a click on a token (``.tk[data-pos]``) sets the hidden text box of the token box that
# holds this view (so several views, or several token views, each report their own clicks), with the time so that a
# second click on the same token is a change too.
_ONCLICK = ("const t = event.target.closest && event.target.closest('.tk[data-pos]');"
            " const b = this.closest('.wb-token-widget');"
            " const i = b && b.querySelector('.wb-token-click input');"
            " if (t && i) { i.value = t.dataset.pos + ':' + Date.now();"
            " i.dispatchEvent(new Event('input', {bubbles: true})); }")


def _live(view: TokenView) -> str:
    """``view``'s HTML wrapped in the element whose click handler reports tokens (:data:`_ONCLICK`)."""
    return f'<div class="wb-token-live" onclick="{html.escape(_ONCLICK, quote=True)}">{view.html()}</div>'


def _checked(view) -> TokenView:
    if not isinstance(view, TokenView):
        raise ValueError(f"view: must be a TokenView, got {type(view).__name__}")
    return view


class TokenWidget(W.VBox):
    """Shows one :class:`TokenView`; :meth:`show` replaces it; ``on_token_click(fn)`` registers
    ``fn(position)`` for clicks on tokens. ``html`` is the HTML shown, ``meta`` the view's meta."""

    def __init__(self, view: TokenView, **kw):
        view = _checked(view)
        self._shown = W.HTML(value=_live(view))  # the comm opens with the view's HTML
        self._relay = W.Text(value="", continuous_update=True, layout=W.Layout(display="none"))
        self._relay.add_class("wb-token-click")
        super().__init__([self._shown, self._relay], **kw)
        self.add_class("wb-token-widget")
        self.view = view
        self._click: list = []
        self._relay.observe(self._on_click, "value")

    @property
    def html(self) -> str:
        """The HTML shown (the view's, in its click wrapper)."""
        return self._shown.value

    @property
    def meta(self) -> dict:
        return self.view.meta

    def show(self, view: TokenView) -> None:
        """Draw ``view`` (one message: its HTML)."""
        self.view = _checked(view)
        self._shown.value = _live(view)

    def on_token_click(self, fn) -> None:
        self._click.append(fn)

    def _on_click(self, change) -> None:
        """The hidden text box's new value, ``"<position>:<time>"`` (:data:`_ONCLICK`): the handlers get the position."""
        pos, _, _ = str(change["new"]).partition(":")
        if pos.isdigit():
            for fn in self._click:
                fn(int(pos))
