"""The figures' ES module (``figure_widget._LOADER_ESM``), run in Node against a stand-in of anywidget's model
and a stand-in plotly bundle.

What it must do, and what is checked here:
- ``initialize`` returns at once (anywidget drops every message of a model not ready within 2 s);
- the bundle is fetched from its widget and evaluated once per page, however many figures load it;
- edits (``_py2js_*``) that reach a model before the bundle has loaded are handed to plotly's model in their
  order, nulls skipped, before any view draws; later edits reach it once, not twice;
- a figure made after the bundle loaded starts at once from the loaded module;
- ``render`` draws with plotly's view of that model;
- ``_hidden`` hides the figure's element and shows it again (its view stays: a panel that shows a new capture);
- the room the page gives the view (the width of the box that holds it) is reported as ``_view_width`` once the
  element is in the page and whenever it changes by 4 px or more (a panel lays its figures out again there);
- each model sends one probe; one whose answer never comes while the bundle's widget's does (a model anywidget gave
  up on) reports itself deaf, once, with what it shows (its trace count and layout keys), and from then on sets on
  itself, in order, the states the kernel relays to it through the bundle's widget (binary buffers put back); a
  healthy one says it heard its answer and never reports itself deaf.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from workbench.show.figure_widget import _LOADER_ESM

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="no node on PATH")

# a stand-in for plotly's bundle: its model logs the edits it sees, its view logs a draw
BUNDLE = """
globalThis.LOG.push(['bundle evaluated']);
export default () => {
  let m = null;
  return {
    initialize({model}) {
      m = model;
      globalThis.LOG.push(['initialize', model.id]);
      for (const n of ['_py2js_restyle', '_py2js_relayout', '_py2js_update'])
        model.on('change:' + n, () => { const v = model.get(n); if (v === null) return;
          globalThis.LOG.push(['edit', model.id, n, v.k]);
          if (v.z) globalThis.LOG.push(['buffer', model.id, v.z.constructor.name, Array.from(new Uint8Array(v.z.buffer, v.z.byteOffset, v.z.byteLength))]); });
    },
    render({el}) { globalThis.LOG.push(['render', m.id]); el.drawn = m.id; },
  };
};
"""

HARNESS = """
globalThis.LOG = [];
globalThis.Blob = class { constructor(parts) { this.text = parts.join(''); } };
const dataUrl = (src) => 'data:text/javascript;base64,' + Buffer.from(src).toString('base64');
URL.createObjectURL = (blob) => dataUrl(blob.text);
URL.revokeObjectURL = () => {};

let fetches = 0, release;
const holderLoaded = new Promise((r) => { release = r; });
// the bundle's widget: a plain model with its source; custom messages from the kernel reach its 'msg:custom' handlers
const holder = {get: (k) => (k === 'source' ? (fetches += 1, process.env.BUNDLE) : undefined), id: 'h1', handlers: [],
  on(ev, f) { if (ev === 'msg:custom') this.handlers.push(f); },
  off(ev, f) { this.handlers = this.handlers.filter((g) => g !== f); },
  emit(content, buffers = []) { for (const f of [...this.handlers]) f(content, buffers); }};
const manager = {get_model: async (id) => { await holderLoaded; return holder; }};  // the bundle's source: read once

class Model {  // what anywidget hands the module: get/set/on, change events when a value changes
  constructor(id) { this.id = id; this.attrs = {_bundle_model: 'IPY_MODEL_h1', _bundle_sha: 'abc'};
    this.handlers = {}; this.widget_manager = manager; }
  get(k) { return this.attrs[k] ?? null; }
  set(k, v) {  // one trait, or an object of traits (as a comm's update sets them)
    if (typeof k === 'object') { for (const [n, x] of Object.entries(k)) this.set(n, x); return; }
    const old = this.get(k); this.attrs[k] = v;
    if (JSON.stringify(old) !== JSON.stringify(v)) for (const f of this.handlers['change:' + k] || []) f(); }
  on(ev, f) { (this.handlers[ev] ??= []).push(f); }
  save_changes() { this.saved = (this.saved || 0) + 1; }
  send(content) { (this.sent ??= []).push(content); }
}
const edit = (m, name, k) => { m.set(name, {k}); m.set(name, null); };  // plotly sends a message, then None

const loader = await import(dataUrl(process.env.LOADER));
const A = new Model('A'), B = new Model('B');
const wA = loader.default(), wB = loader.default();
const returned = wA.initialize({model: A});
wB.initialize({model: B});
edit(A, '_py2js_restyle', 1); edit(A, '_py2js_relayout', 2); edit(A, '_py2js_restyle', 3);
edit(B, '_py2js_update', 4);
LOG.push(['holder released']);
release();
const elA = {}, elB = {style: {}};
await wA.render({model: A, el: elA});
await wB.render({model: B, el: elB});
edit(A, '_py2js_restyle', 5);                       // after the load: plotly's model has it, once
const C = new Model('C'), wC = loader.default();
wC.initialize({model: C});
edit(C, '_py2js_update', 6);
const elC = {style: {}};
await wC.render({model: C, el: elC});
const shownC = elC.style.display;
C.set('_hidden', true);                              // a panel set it aside: hidden in the page, view kept
const hiddenC = elC.style.display;
C.set('_hidden', false);
// the room: a stand-in ResizeObserver and animation frame; the element joins the page one frame after render
const observers = [];
globalThis.ResizeObserver = class { constructor(f) { this.f = f; observers.push(this); } observe(e) { this.e = e; } };
let frames = [];
globalThis.requestAnimationFrame = (f) => frames.push(f);
const D = new Model('D'), wD = loader.default();
wD.initialize({model: D});
const box = {clientWidth: 568}, elD = {style: {}, isConnected: false, parentElement: null, offsetParent: null};
await wD.render({model: D, el: elD});
const room = [D.get('_view_width')];
Object.assign(elD, {isConnected: true, parentElement: box, offsetParent: box});
for (const f of frames.splice(0)) f();
room.push(D.get('_view_width'));
box.clientWidth = 570; observers[0].f(); room.push(D.get('_view_width'));   // 2 px: not reported
box.clientWidth = 968; observers[0].f(); room.push(D.get('_view_width'));
// the probe: every model sent one; the kernel answers a healthy model on the model, then on the bundle's widget;
// a deaf model (anywidget gave up on it) drops its answer, so only the bundle's widget's arrives
const probes = [A, B, C, D].map((m) => m.sent && m.sent.filter((c) => c.event === 'probe').length);
const answer = (m, deaf) => { const id = m.sent.find((c) => c.event === 'probe').id;
  if (!deaf) m.set('_probe', id); holder.emit({ack: id}); };
answer(A, false); answer(B, true); holder.emit({ack: 'another figure'});
await new Promise((r) => setTimeout(r, 1300));
const deaf = [A, B].map((m) => m.sent.filter((c) => c.event === 'deaf').length);
const heard = [A, B].map((m) => m.sent.filter((c) => c.event === 'heard').length);
const report = B.sent.find((c) => c.event === 'deaf');
// the kernel relays to the deaf model: states in order, a buffer put back where it was taken out; another id's: not B's
const idB = B.sent.find((c) => c.event === 'probe').id;
LOG.push(['relay']);
holder.emit({relay: ['someone else'], states: [{_py2js_restyle: {k: 8}}, {_py2js_restyle: null}], buffer_paths: []});
holder.emit({relay: [idB], states: [{_py2js_restyle: {k: 7, z: null}}, {_py2js_restyle: null}, {_hidden: true}],
             buffer_paths: [[0, '_py2js_restyle', 'z']]}, [new Uint8Array([9, 8, 7, 6]).buffer]);
const hiddenB = elB.style && elB.style.display;
console.log(JSON.stringify({probes, deaf, heard, report: {traces: report.traces, keys: report.layout_keys,
  same: report.id === idB}, hiddenB, listening: holder.handlers.length,
  room, saved: D.saved, observed: observers.length === 1 && observers[0].e === box,
  returned: returned === undefined ? 'undefined' : typeof returned, fetches,
  log: LOG, drawn: [elA.drawn, elB.drawn, elC.drawn], display: [shownC, hiddenC, elC.style.display]}));
"""


def test_loader_in_node(tmp_path):
    harness = tmp_path / "harness.mjs"
    harness.write_text(HARNESS)
    out = subprocess.run([NODE, str(harness)], capture_output=True, text=True, timeout=60,
                         env={"LOADER": _LOADER_ESM, "BUNDLE": BUNDLE, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    log = [tuple(x) for x in r["log"]]
    assert r["returned"] == "undefined"                       # ready at once: nothing awaited in initialize
    # one probe per model; the deaf one (its answer dropped) says so once, the healthy one never; each model stops
    # listening on the bundle's widget once its own answer came (C and D: not answered here)
    # (A says it heard its answer); the deaf one keeps listening there, for what the kernel relays to it
    assert r["probes"] == [1, 1, 1, 1] and r["deaf"] == [0, 1] and r["heard"] == [1, 0] and r["listening"] == 3
    assert r["report"] == {"traces": 0, "keys": [], "same": True}     # what it shows: the stand-in has no figure
    assert r["hiddenB"] == "none"                                        # a relayed _hidden, as a comm's would
    # a relayed message to B: its states set in order (the buffer back in place, as a DataView); another id's ignored
    j = log.index(("relay",))
    assert log[j + 1:] == [("edit", "B", "_py2js_restyle", 7), ("buffer", "B", "DataView", [9, 8, 7, 6])]
    assert r["fetches"] == 1 and log.count(("bundle evaluated",)) == 1
    assert r["drawn"] == ["A", "B", "C"]
    assert r["display"] == ["", "none", ""]                   # _hidden hides the figure's element, and shows it again
    assert r["room"] == [None, 568, 568, 968] and r["saved"] == 2 and r["observed"]   # the box's width, once attached
    i = log.index(("holder released",))
    assert all(e[0] != "initialize" for e in log[:i])         # nothing of plotly ran before the bundle came
    a = [e for e in log if e[1:2] == ("A",)]
    assert a == [("initialize", "A"), ("edit", "A", "_py2js_restyle", 1), ("edit", "A", "_py2js_relayout", 2),
                 ("edit", "A", "_py2js_restyle", 3), ("render", "A"), ("edit", "A", "_py2js_restyle", 5)]
    assert [e for e in log if e[1:2] == ("B",)] == [("initialize", "B"), ("edit", "B", "_py2js_update", 4),
                                                    ("render", "B"), ("edit", "B", "_py2js_restyle", 7),
                                                    ("buffer", "B", "DataView", [9, 8, 7, 6])]
    assert [e for e in log if e[1:2] == ("C",)] == [("initialize", "C"), ("edit", "C", "_py2js_update", 6),
                                                    ("render", "C")]
