"""The notebook widget of a figure: a ``go.FigureWidget`` that opens with its figure, and its ES module.

The other plotly-private code (drafts, in-place updates) is in :mod:`workbench.show.figure_engine`; this
file holds what concerns the browser: the comm's first state and how plotly's widget bundle reaches the page.
"""
from __future__ import annotations

import copy
import hashlib

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import traitlets
from plotly.serializers import custom_serializers as plotly_serializers

from workbench.show.private_compat import edit_ids, figure_traces, layout_props, state_lock, widget_internals_ok

__all__ = ["FigureWidget"]

# The ES module of every FigureWidget: a few lines that import plotly's widget bundle (5 MB of JavaScript) once
# per page and hand each model to it. plotly's own FigureWidget sends the bundle as the ``_esm`` of every figure
# and the browser evaluates it once per figure; anywidget drops every message of a model that is not ready
# 2 s after it was created ("[anywidget] Failed to initialize model"), so on a loaded CPU a figure whose copy
# had not finished loading stayed deaf to every later edit (inert sliders). Here ``initialize``
# returns at once (the model is ready in milliseconds) and the bundle arrives once per kernel, in one
# model-only widget (:class:`_PlotlyBundle`). An edit that reaches a model before the bundle has loaded on the
# page is replayed into plotly's model as soon as it has, before any view draws.
_LOADER_ESM = """
const PAGE = (globalThis.__workbenchPlotly ??= new Map());  // bundle sha256 -> {promise, module}, one per page

// the bundle's widget (a plain ipywidgets model holding plotly's source)
const holderOf = (model) => model.widget_manager.get_model(model.get('_bundle_model').slice('IPY_MODEL_'.length));

function bundle(model) {
  const sha = model.get('_bundle_sha');
  let entry = PAGE.get(sha);
  if (!entry) {
    entry = {module: null};
    entry.promise = holderOf(model)
      .then((holder) => {
        const url = URL.createObjectURL(new Blob([holder.get('source')], {type: 'text/javascript'}));
        return import(url).finally(() => URL.revokeObjectURL(url));
      })
      .then((module) => (entry.module = module));
    PAGE.set(sha, entry);
  }
  return entry;
}

const EDITS = ['_py2js_addTraces', '_py2js_deleteTraces', '_py2js_moveTraces', '_py2js_restyle',
  '_py2js_relayout', '_py2js_update', '_py2js_animate', '_py2js_removeLayoutProps', '_py2js_removeTraceProps'];

// The room the page gives a figure: the width of the box that holds its view (a panel's row of figures, or the
// output area), reported as ``_view_width`` whenever it changes by a few px (a window resized, a side bar opened);
// the panel lays its figures out again at that width (widgets.base.live_width). Not while the figure is hidden.
function roomOf(model, el) {
  if (typeof ResizeObserver === 'undefined') return null;   // not a browser page
  let observer = null;
  const report = () => {
    const box = el.parentElement;
    if (!box || model.get('_hidden') || el.offsetParent === null) return;
    const w = Math.floor(box.clientWidth);
    if (w > 0 && Math.abs(w - model.get('_view_width')) >= 4) {
      model.set('_view_width', w);
      model.save_changes();
    }
  };
  const attach = () => {
    if (!el.isConnected || !el.parentElement) return requestAnimationFrame(attach);  // not in the page yet
    observer = new ResizeObserver(report);
    observer.observe(el.parentElement);
    report();
  };
  attach();
  model.on('change:_hidden', report);
  return () => observer && observer.disconnect();
}

// A model that anywidget gave up on (not ready 2 s after it was made, "[anywidget] Failed to initialize model":
// its tiny module's import outlasted by a busy page) drops every message of its comm for good: its figure would stay
// as first drawn, deaf to every slider. So each model asks once: it sends a probe, and the kernel answers on this
// model (``_probe``) and then on the bundle's widget, a plain ipywidgets model that anywidget never holds. The
// bundle's answer with none on this model means deaf: the model says so (``deaf``, with what it shows), and from
// then on the kernel sends it the whole figure once and every later change through the bundle's widget
// (FigureWidget.send_state), which this model sets on itself (``relayed``); the console says what happened. A model
// that heard its answer says so (``heard``).
function probe(model) {
  const id = Math.random().toString(36).slice(2) + Date.now().toString(36);
  let heard = false;
  model.on('change:_probe', () => { if (model.get('_probe') === id) heard = true; });
  return holderOf(model).then((holder) => {
    const onAck = (content) => {
      if (!content || content.ack !== id) return;
      holder.off('msg:custom', onAck);
      setTimeout(() => {  // this model's answer came first (one channel, in order); a second for its handlers
        if (heard) return model.send({event: 'heard', id});
        console.warn('[workbench] the widget model of a figure failed to initialize (the page was busy): its kernel '
          + "now sends its changes through the bundle's widget");
        holder.on('msg:custom', (c, buffers) => relayed(model, id, c, buffers));
        model.send({event: 'deaf', id, traces: (model.get('_widget_data') || []).length,
          layout_keys: Object.keys(model.get('_widget_layout') || {})});
      }, 1000);
    };
    holder.on('msg:custom', onAck);
    model.send({event: 'probe', id});
  });
}

// A message the kernel relays to deaf models (FigureWidget._relay): ``states`` to set in order, their binary buffers
// put back at ``buffer_paths``, as this model's own comm would have set them (ipywidgets' put_buffers).
function relayed(model, id, content, buffers) {
  if (!content || !Array.isArray(content.relay) || !content.relay.includes(id)) return;
  const states = content.states;
  (content.buffer_paths || []).forEach((path, i) => {
    let obj = states;
    for (const k of path.slice(0, -1)) obj = obj[k];
    const b = buffers[i];
    obj[path[path.length - 1]] = b instanceof DataView ? b
      : ArrayBuffer.isView(b) ? new DataView(b.buffer, b.byteOffset, b.byteLength) : new DataView(b);
  });
  for (const state of states) model.set(state);
}

export default () => {
  let inner = null;  // plotly's widget for this model, once its initialize has run
  let ready = null;  // a promise of it
  const start = async (module, model) => {
    const w = await module.default();
    await w.initialize?.({model});
    return w;
  };
  return {
    initialize({model}) {
      probe(model);
      const entry = bundle(model);
      const early = [];    // edits that arrive before plotly's model listens: replayed, in order
      const keep = (name) => () => { if (!inner) early.push([name, model.get(name)]); };
      for (const name of EDITS) model.on('change:' + name, keep(name));
      ready = (entry.module ? Promise.resolve(entry.module) : entry.promise)
        .then((module) => start(module, model))
        .then((w) => {
          inner = w;         // from here on plotly's model listens itself
          for (const [name, value] of early.splice(0)) {
            if (value === null) continue;
            model.set(name, null);
            model.set(name, value);
          }
          return w;
        });
    },
    async render({model, el}) {
      const show = () => { if (el.style) el.style.display = model.get('_hidden') ? 'none' : ''; };
      model.on('change:_hidden', show);  // a figure set aside (its panel shows a new capture) is hidden, not removed
      show();
      roomOf(model, el);
      const w = await ready;
      return w.render({model, el});
    },
  };
};
"""


_INT32 = np.iinfo(np.int32)


def _typed(a: np.ndarray) -> np.ndarray | None:
    """``a`` as an array the browser can take as a typed array (C-contiguous; int64 as int32 where every value
    fits, else float64; float16 as float32), or ``None`` for other kinds (strings, objects, booleans, dates)."""
    if a.dtype.kind not in "uif" or a.ndim not in (1, 2):
        return None
    if a.dtype.kind in "ui" and a.dtype.itemsize == 8:
        fits = a.size == 0 or (int(a.min()) >= _INT32.min and int(a.max()) <= _INT32.max)
        a = a.astype(np.int32) if fits else a.astype(np.float64)
    elif a.dtype == np.float16:
        a = a.astype(np.float32)
    return np.ascontiguousarray(a)


def _buffer(a: np.ndarray) -> dict:
    return {"buffer": memoryview(a), "dtype": str(a.dtype), "shape": a.shape}


def _to_js(v, widget_manager):
    """The Python → browser serializer of every figure trait: numeric arrays travel as binary buffers.

    plotly's own (``plotly.serializers.custom_serializers["to_json"]``) sends a 1-D float or int32 array as one binary buffer, but a
    2-D array (a heatmap's ``z``, ``[rows, columns]``) and any int64 array as JSON lists of numbers, written by
    Python and parsed by the browser number by number. Here a 2-D numeric array is sent as a list of its rows,
    each one binary buffer (plotly's front end makes each a typed array, and plotly.js takes a list of typed
    rows as a 2-D ``z``), and an int64 array as int32 (float64 when a value does not fit). NaN stays NaN (a
    gap), where JSON has no NaN. Everything else is plotly's serializer's."""
    if isinstance(v, dict):
        return {k: _to_js(x, widget_manager) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_js(x, widget_manager) for x in v]
    if isinstance(v, np.ndarray):
        a = _typed(v)
        if a is not None:
            return _buffer(a) if a.ndim == 1 else [_buffer(row) for row in a]
    return plotly_serializers["to_json"](v, widget_manager)


_SERIALIZERS = {"to_json": _to_js, "from_json": plotly_serializers["from_json"]}
_BINARY = (memoryview, bytearray, bytes)


def split_buffers(value, path: list | None = None, paths: list | None = None, buffers: list | None = None):
    """``(value without its binary buffers, their paths, the buffers)``, as ipywidgets' ``send_state`` sends a
    state: a buffer in a dict is left out of it, one in a list becomes None, a container without buffers is
    passed as it is, and the page puts each buffer back at its path (:data:`_LOADER_ESM`'s ``relayed``)."""
    path = [] if path is None else path
    paths = [] if paths is None else paths
    buffers = [] if buffers is None else buffers
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        return value, paths, buffers
    out, changed = [], False
    for k, v in items:
        if isinstance(v, _BINARY):
            paths.append([*path, k])
            buffers.append(v)
            out.append((k, None, isinstance(value, dict)))  # left out of a dict, None in a list
            changed = True
        else:
            new = split_buffers(v, [*path, k], paths, buffers)[0]
            changed = changed or new is not v
            out.append((k, new, False))
    if not changed:
        return value, paths, buffers
    if isinstance(value, dict):
        return {k: v for k, v, drop in out if not drop}, paths, buffers
    return [v for _, v, _ in out], paths, buffers


class _PlotlyBundle(W.Widget):
    """plotly's widget bundle (its JavaScript source) as one model-only widget per kernel: the figures'
    loader imports it from here once per page (:data:`_LOADER_ESM`)."""

    source = traitlets.Unicode().tag(sync=True)


_BUNDLE: dict = {}


def _plotly_bundle() -> tuple[_PlotlyBundle, str]:
    """The kernel's bundle widget (made again if it was closed) and the bundle's sha256."""
    w = _BUNDLE.get("widget")
    if w is None or w.comm is None:
        source = str(go.FigureWidget._esm)
        _BUNDLE["sha"] = hashlib.sha256(source.encode()).hexdigest()
        _BUNDLE["widget"] = w = _PlotlyBundle(source=source)
    return w, _BUNDLE["sha"]


class FigureWidget(go.FigureWidget):
    """A ``go.FigureWidget`` whose comm opens with the whole figure as its state (data, layout, ``uirevision``).

    ``go.FigureWidget`` opens its comm with an empty figure (ipywidgets opens it in ``Widget.__init__``,
    before plotly has set the figure) and sends the data in a second message. anywidget (plotly ≥ 6) holds
    every message of a model until the model's ES module has loaded (anywidget#803's fix), and a view created
    meanwhile can draw first; plotly's view draws ``_widget_data`` once and then follows only its
    ``_py2js_*`` edits, so it stayed empty for good: bare axes and inert sliders, seen in JupyterLab on a
    loaded CPU (notebook 04's chunk-priority and envelope figures, 3 runs in 9 under load). Here
    the comm is opened after plotly's ``__init__``, so the model is born with the figure and any view
    draws it; later edits reach every view as messages, as before. Its ES module is :data:`_LOADER_ESM`
    (plotly's bundle once per page and kernel, not once per figure, so its module loads in milliseconds; a model
    anywidget still gives up on, the page busy for over 2 s, reports itself deaf through its probe and is sent the
    figure and its changes through the bundle's widget: :meth:`send_state`), tested in Node by
    ``tests/test_figure_loader.py``. Numeric arrays, 2-D ones included, travel as
    binary buffers (:func:`_to_js`), not as JSON numbers.

    Shapes: as ``go.FigureWidget``. ``uirevision``: written into the figure before the comm opens.
    """

    _esm = _LOADER_ESM
    # plotly's Python → browser traits with the binary serializer (:func:`_to_js`); the same names, types and sync
    _widget_layout = traitlets.Dict().tag(sync=True, **_SERIALIZERS)
    _widget_data = traitlets.List().tag(sync=True, **_SERIALIZERS)
    _py2js_addTraces = traitlets.Dict(allow_none=True).tag(sync=True, **_SERIALIZERS)
    _py2js_restyle = traitlets.Dict(allow_none=True).tag(sync=True, **_SERIALIZERS)
    _py2js_relayout = traitlets.Dict(allow_none=True).tag(sync=True, **_SERIALIZERS)
    _py2js_update = traitlets.Dict(allow_none=True).tag(sync=True, **_SERIALIZERS)
    _py2js_animate = traitlets.Dict(allow_none=True).tag(sync=True, **_SERIALIZERS)
    # plotly's browser → Python traits, not echoed back (ipywidgets' echo would reach a deaf model's comm: :meth:`send_state`)
    _js2py_traceDeltas = traitlets.Dict(allow_none=True).tag(sync=True, echo_update=False, **_SERIALIZERS)
    _js2py_layoutDelta = traitlets.Dict(allow_none=True).tag(sync=True, echo_update=False, **_SERIALIZERS)
    _js2py_restyle = traitlets.Dict(allow_none=True).tag(sync=True, echo_update=False, **_SERIALIZERS)
    _js2py_relayout = traitlets.Dict(allow_none=True).tag(sync=True, echo_update=False, **_SERIALIZERS)
    _js2py_update = traitlets.Dict(allow_none=True).tag(sync=True, echo_update=False, **_SERIALIZERS)
    _js2py_pointsCallback = traitlets.Dict(allow_none=True).tag(sync=True, echo_update=False, **_SERIALIZERS)
    _bundle_model = traitlets.Unicode().tag(sync=True)
    _bundle_sha = traitlets.Unicode().tag(sync=True)
    #: hidden in the page (a panel that shows a new capture hides its previous figures, then closes them later:
    #: a plotly view removed while it draws fails). ``layout`` is plotly's here, not ipywidgets' Layout.
    _hidden = traitlets.Bool(False).tag(sync=True)
    #: the width (px) of the box that holds the figure's view in the page, as the view measured it (0: not yet);
    #: a panel lays its figures out again at the live width this allows (``widgets.base.live_width``)
    _view_width = traitlets.Int(0).tag(sync=True, echo_update=False)
    #: the answer to the page's probe (:data:`_LOADER_ESM`: a model that never hears it is deaf)
    _probe = traitlets.Unicode("").tag(sync=True)

    def __init__(self, data=None, layout=None, *, uirevision: str | None = None, **kw):
        self._open_later = True
        self._instances: dict[str, str] = {}  # the page's instances of this model: probe id -> probing, heard, deaf
        try:
            super().__init__(data, layout, **kw)
            if uirevision is not None:
                self.layout.uirevision = uirevision
                self._widget_layout = copy.deepcopy(layout_props(self))  # no comm yet: nothing is sent
            holder, self._bundle_sha = _plotly_bundle()
            self._bundle_model = f"IPY_MODEL_{holder.model_id}"
            self._holder = holder
        finally:
            self._open_later = False
        self.open()
        self.on_msg(self._from_page)

    def _from_page(self, _widget, content, _buffers) -> None:
        """The page's instances of this model (:data:`_LOADER_ESM`): each sends a probe, answered on this model and then
        on the bundle's widget (never deaf), and then says whether it heard its answer (``heard``) or not (``deaf``: a
        model anywidget gave up on, which drops every message of its comm). A deaf one gets the whole figure at once
        (:meth:`_resync`) and every later change through the bundle's widget (:meth:`send_state`)."""
        if not isinstance(content, dict) or content.get("event") not in ("probe", "heard", "deaf"):
            return
        pid = str(content.get("id", ""))
        if content["event"] == "probe":
            self._instances[pid] = "probing"
            self._probe = pid
            self._holder.send({"ack": pid})
        elif content["event"] == "heard":
            self._instances[pid] = "heard"
        else:
            self._instances[pid] = "deaf"
            self._resync(pid, content)

    def send_state(self, key=None) -> None:
        """Send the state (or the traits ``key``) to the page: on this model's comm, as ``ipywidgets`` does, unless every
        instance of the model in the page is deaf; and to each deaf instance through the bundle's widget
        (:meth:`_relay`)."""
        deaf = [pid for pid, s in self._instances.items() if s == "deaf"]
        plain = not deaf or len(deaf) < len(self._instances)
        if plain:
            super().send_state(key)
        if deaf:
            state = self.get_state(key=key)
            lock = state_lock(self)
            if not plain and lock:  # what super() keeps up to date while the page sets a trait
                for name, value in state.items():
                    if name in lock:
                        lock[name] = value
            if state:
                self._relay(deaf, [state])

    def _resync(self, pid: str, content: dict) -> None:
        """The figure as it is now, to the deaf instance ``pid``, which shows the figure it was born with: its traces
        (``content["traces"]``: how many it has) replaced by the present ones, its layout by the present one (keys it
        has that the figure no longer has: removed), its ``_hidden``, as plotly's own messages (the edit ids are the
        last ones, so the deltas its view sends back are taken)."""
        fig = {"data": figure_traces(self), "layout": layout_props(self)}  # numpy arrays stay arrays (buffers)
        t, lay = edit_ids(self) or (0, 0)
        n = int(content.get("traces") or 0)
        stale = [k for k in content.get("layout_keys") or [] if k not in fig["layout"]]
        edits = []
        if n:
            edits.append(("_py2js_deleteTraces", {"delete_inds": list(range(n)), "trace_edit_id": t,
                                                  "layout_edit_id": lay}))
        if fig["data"]:
            edits.append(("_py2js_addTraces", {"trace_data": fig["data"], "trace_edit_id": t, "layout_edit_id": lay}))
        edits.append(("_py2js_relayout", {"relayout_data": {**dict.fromkeys(stale), **fig["layout"]},
                                          "layout_edit_id": lay, "source_view_id": None}))
        states = [s for name, msg in edits for s in ({name: _to_js(msg, None)}, {name: None})]
        self._relay([pid], [*states, {"_hidden": self._hidden}])

    def _relay(self, pids: list[str], states: list[dict]) -> None:
        """Set ``states`` (serialized, as :meth:`get_state` gives them), in order, on the page's instances ``pids``
        through the bundle's widget, their binary buffers sent as buffers, as ipywidgets' own ``send_state`` takes them
        out (:func:`split_buffers`; the page puts them back: :data:`_LOADER_ESM`'s ``relayed``)."""
        states, paths, buffers = split_buffers(states)
        self._holder.send({"relay": list(pids), "states": states, "buffer_paths": paths}, buffers)

    def open(self) -> None:
        """Open the comm, except while ``__init__`` is still building the figure."""
        if not getattr(self, "_open_later", False):
            super().open()


def figure_widget(fig, *, uirevision: str | None = None) -> go.FigureWidget:
    """The widget a panel shows ``fig`` in: a :class:`FigureWidget`, or plotly's stock ``go.FigureWidget`` (with
    ``uirevision``) when plotly's widget internals it builds on are gone or the public fallback is forced
    (:mod:`workbench.show.private_compat`): the figure and its updates as plotly sends them, without the binary
    2-D arrays, the relay to views anywidget gave up on, or the room its view reports."""
    if widget_internals_ok():
        return FigureWidget(fig, uirevision=uirevision)
    fw = go.FigureWidget(fig)
    if uirevision is not None:
        fw.layout.uirevision = uirevision
    return fw
