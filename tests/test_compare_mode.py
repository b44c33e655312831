"""The eviction panel's compare mode: two settings side by side on the same prompt.

On the real default model and its capture: the compare preview's per-token membership (A only, B only, both,
neither) is the set arithmetic of the two policies' own previews, computed here from the kept tensors; the
token view draws exactly those positions with their marks and its CSV carries them; a run in compare mode gives
the answers of the single-mode runs of the same settings, KV bytes equal to the dense-cache formula for the
kept count, and the logit margins of the run's logits. On the tiny model: the toggle off restores the single
view, and comparing a setting with itself, budgets out of range and a side without a preview say so in the
panel with the figures unchanged and no model call.
"""
from __future__ import annotations

import math
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from workbench.analyse.cost import kv_bytes_dense
from workbench.analyse.params import EntroPrefillParams
from workbench.rerun.eviction import DeferKV, Evidence, GenerationResult, SnapKV, preview
from workbench.rerun.eviction.compare import KeptComparison, compare_kept, setting_labels, token_margin
from workbench.show import export as ex
from workbench.show import plots
from workbench.show import widgets as Wd
from workbench.show.notation import symbol
from workbench.show.plots.tokens import COMPARE_FILL

FILL_OF = {v: k for k, v in COMPARE_FILL.items() if k in ("A only", "B only")}


class _Marks(HTMLParser):
    """Per ``data-pos`` token span: its background colour and whether it is struck through (class ``rm``)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fill: dict[int, str] = {}
        self.struck: dict[int, bool] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "data-pos" in a:
            p = int(a["data-pos"])
            self.fill[p] = a["style"].split("background-color:")[1].strip().rstrip(";")
            self.struck[p] = "rm" in a["class"].split()


def drawn_membership(html: str) -> dict[int, str]:
    """The membership the token view's HTML shows for every position: its fill (A only, B only) or, unfilled,
    struck (neither) or not (both)."""
    m = _Marks()
    m.feed(html)
    out = {}
    for p, col in m.fill.items():
        if col in FILL_OF:
            assert not m.struck[p], f"position {p}: filled and struck"
            out[p] = FILL_OF[col]
        else:
            assert col == "#ffffff", f"position {p}: unexpected fill {col}"
            out[p] = "neither" if m.struck[p] else "both"
    return out


def union_kept(kept_prompt, layers) -> set[int]:
    """Positions kept by any of ``layers``' KV-group caches, read straight from the kept tensor."""
    kp = kept_prompt.numpy()
    return {int(p) for l in layers for p in kp[l].ravel() if p >= 0}


# ----------------------------------------------------------------------------- the real default model
@pytest.fixture(scope="module")
def real_panel(smollm, smollm_capture, example_prompt):
    B = smollm_capture.T // 8
    panel = Wd.EvictionPanel(smollm_capture, smollm, example_prompt, policy="snapkv", budget=B, max_new_tokens=4)
    return panel, B


def test_compare_preview_is_the_set_arithmetic_of_the_two_previews(real_panel, smollm_capture):
    """The compare mode draws two policies' kept sets: snapkv vs deferkv at the same B, at every compacted cache
    and at one layer, equal to the two previews computed independently, marked exactly so in the token view."""
    panel, B = real_panel
    cap = smollm_capture
    T, L, sp = cap.T, cap.L, cap.spans
    panel.set(compare=True, policy_b="deferkv", budget_b=B, defer_lam_b=0.1, compare_layer="all")
    assert panel.error is None and set(panel.figures) == {"kept", "compare"}
    assert panel.policy() == SnapKV(n_sink=sp.n_sink, recent=32)
    assert panel.policy_b() == DeferKV(n_sink=sp.n_sink, recent=32, lam=0.1)
    ev = Evidence.from_capture(cap)
    ka = preview(SnapKV(n_sink=sp.n_sink, recent=32), ev, B)
    kb = preview(DeferKV(n_sink=sp.n_sink, recent=32, lam=0.1), ev, B)
    assert tuple(ka.shape) == tuple(kb.shape) == (L, int(cap.head_group.max()) + 1, B)
    for layer in ("all", 10):
        if layer != "all":
            panel.set(compare_layer=layer)
        layers = range(L) if layer == "all" else [layer]
        a, b = union_kept(ka, layers), union_kept(kb, layers)
        expect = {"A only": a - b, "B only": b - a, "both": a & b, "neither": set(range(T)) - a - b}
        view = panel.figures["compare"].view
        drawn = drawn_membership(panel.figures["compare"].html)
        assert len(drawn) == T
        for cls, pos in expect.items():
            assert {p for p, m in drawn.items() if m == cls} == pos, (layer, cls)
            assert view.meta[cls.replace(" ", "_").lower()] == sorted(pos)
            assert view.meta["counts"][cls] == len(pos)
            assert f"{len(pos)} {cls}" in panel.status.value or cls == "neither"
        assert sum(len(v) for v in expect.values()) == T and expect["A only"] and expect["B only"]
        frame = ex.figure_data(view)  # the CSV sidecar: every token's membership
        assert list(frame["position"]) == list(range(T))
        assert [set(frame.loc[frame["category"] == c, "position"]) for c in expect] == list(expect.values())
        assert list(frame["kept_a"]) == [p in a for p in range(T)] and list(frame["kept_b"]) == [p in b for p in range(T)]
    # the heatmap: one row per setting, the fraction of caches keeping each position (the separate previews)
    kept = panel.figures["kept"]
    assert [str(y).split(" (")[0] for y in kept.data[1].y] == [f"A: snapkv B={B}", f"B: deferkv B={B}"]
    z = np.asarray(kept.data[1].z, dtype=float)
    for row, k in zip(z, (ka, kb)):
        m = np.zeros((L * k.shape[1], T))
        np.put_along_axis(m, k.reshape(-1, B).numpy(), 1.0, axis=1)
        assert np.allclose(row, m.mean(0))


def test_compare_run_equals_the_single_runs(real_panel, smollm, smollm_capture, example_prompt):
    """A compare run gives two answers, each the single-mode run's of the same setting (a second panel, its own
    prefill), KV bytes = 2·e·L·G·d·(kept entries) and the margins of the run's own logits."""
    panel, B = real_panel
    T = smollm_capture.T
    panel.set(compare=True, policy_b="deferkv", budget_b=B, defer_lam_b=0.1, compare_layer="all")
    before_run = panel.status.value  # the preview's KV bytes, before any model call
    prev_a, prev_b = panel.preview_of(panel.policy(), B), panel.preview_of(panel.policy_b(), B)
    cmp = panel.run()
    assert panel.model_calls == 6  # session + full cache + A + B + A and B teacher-forced (their divergence)
    assert panel.last_compare is cmp and cmp.a.label == f"snapkv, B = {B}" and cmp.b.label == f"deferkv, B = {B}"
    single = Wd.EvictionPanel(smollm_capture, smollm, example_prompt, policy="snapkv", budget=B, max_new_tokens=4)
    ra = single.run()
    single.set(policy="deferkv", defer_lam=0.1)
    rb = single.run()
    assert cmp.a.ids == tuple(ra.ids) and cmp.b.ids == tuple(rb.ids) and cmp.a.text == ra.text
    assert cmp.b.text == rb.text and ra.text in panel.answers.value and rb.text in panel.answers.value
    # KV bytes: the dense cache of the kept entries (B prompt positions + the tokens decoded before eviction)
    e = 4  # float32
    assert (ra.evicted_at, rb.evicted_at) == (0, 1)
    assert cmp.a.kv_bytes == kv_bytes_dense(smollm.shape, B, e) == ra.kv_bytes_after
    assert cmp.b.kv_bytes == kv_bytes_dense(smollm.shape, B + 1, e) == rb.kv_bytes_after
    assert cmp.full.kv_bytes == kv_bytes_dense(smollm.shape, T, e)
    assert cmp.a.kv_ratio == pytest.approx(B / T) and cmp.b.kv_ratio == pytest.approx((B + 1) / T)
    # what the compare preview said before Run: the bytes each run then held after eviction
    assert (prev_a.kv_bytes_after, prev_b.kv_bytes_after) == (ra.kv_bytes_after, rb.kv_bytes_after)
    assert (prev_a.kv_bytes_before, prev_b.kv_bytes_before) == (ra.kv_bytes_before, rb.kv_bytes_before)
    assert (f"KV bytes after eviction: A {ra.kv_bytes_after:,} ({ra.kv_bytes_after / ra.kv_bytes_before:.0%}), "
            f"B {rb.kv_bytes_after:,}") in before_run
    # margins: top-1 minus top-2 of the logits of token 1 (the prefill's: the same for every setting) and of the
    # first token decoded from the evicted cache (token 2 for snapkv, token 3 for deferkv)
    res_a, res_b = panel.cache[panel.run_key()], panel.cache[panel.run_key_b()]
    full = panel.cache[("full", 4)]

    def top2(r, j):
        z = np.sort(r.logits[j].numpy().astype(np.float64))
        return z[-1] - z[-2]

    assert cmp.a.first_margin == cmp.b.first_margin == cmp.full.first_margin == pytest.approx(top2(full, 0), abs=1e-5)
    assert (cmp.a.margin_token, cmp.b.margin_token) == (2, 3)
    assert cmp.a.margin == pytest.approx(top2(res_a, 1), abs=1e-5) and cmp.b.margin == pytest.approx(top2(res_b, 2), abs=1e-5)
    assert cmp.a.full_margin == pytest.approx(top2(full, 1), abs=1e-5)
    assert cmp.b.full_margin == pytest.approx(top2(full, 2), abs=1e-5)
    assert cmp.a.margin != pytest.approx(cmp.b.margin)
    # the runs' own kept sets give the counts shown
    a, b = union_kept(res_a.kept_prompt, res_a.compacted_layers), union_kept(res_b.kept_prompt, res_b.compacted_layers)
    assert cmp.kept.counts() == {"A only": len(a - b), "B only": len(b - a), "both": len(a & b),
                                 "neither": T - len(a | b)}
    assert f"A only {len(a - b)}, both {len(a & b)}" in panel.answers.value
    frame = cmp.to_frame()
    assert list(frame["side"]) == ["full", "A", "B"] and list(frame["kv_bytes"]) == [
        cmp.full.kv_bytes, cmp.a.kv_bytes, cmp.b.kv_bytes]
    # back in single mode on A's setting: the compare run's cached result, no model call
    calls = panel.model_calls
    panel.set(compare=False)
    assert panel.run().ids == ra.ids and panel.model_calls == calls


@pytest.mark.parametrize("policy", ["pyramidkv", "adakv", "streaming"])
def test_preview_kv_bytes_equal_the_run(policy, smollm, smollm_capture, example_prompt):
    """The bytes a preview says a run will hold after eviction (and just before it) are the run's measured ones,
    with budget allocations too (PyramidKV's ragged per-layer counts, AdaKV's per-head counts held densely),
    and the single-mode status says them before Run."""
    B = smollm_capture.T // 8
    panel = Wd.EvictionPanel(smollm_capture, smollm, example_prompt, policy=policy, budget=B, max_new_tokens=2)
    prev = panel.analysis()
    status = panel.status.value
    assert panel.model_calls == 0 and prev is not None
    r = panel.run()
    assert (prev.kv_bytes_after, prev.kv_bytes_before) == (r.kv_bytes_after, r.kv_bytes_before)
    assert 0 < r.kv_bytes_after < r.kv_bytes_before
    assert f"KV bytes after eviction {r.kv_bytes_after:,}" in status and f"{r.kv_bytes_before:,}" in status


def test_kv_bytes_per_position_only_where_every_layer_caches_one_shape():
    """``2·e·G·d`` for a model whose layers all cache full-attention K/V of one shape; ``None`` (a run is needed)
    with sliding-window layers or an MLA latent."""
    from workbench.run.adapter import kv_bytes_per_position
    from workbench.run.models import tiny_model

    assert kv_bytes_per_position(tiny_model("llama", G=2, d=16)) == 2 * 4 * 2 * 16
    assert kv_bytes_per_position(tiny_model("qwen2", G=1, H_Q=4, d=8)) == 2 * 4 * 1 * 8
    assert kv_bytes_per_position(tiny_model("gemma3", L=2)) is None          # a sliding-window layer
    assert kv_bytes_per_position(tiny_model("mistral", sliding_window=8)) is None
    assert kv_bytes_per_position(tiny_model("deepseek_v3")) is None          # MLA


# ----------------------------------------------------------------------------- the tiny model
# the `tiny` fixture (a tiny llama, its spans and capture) is in conftest.py


class _Forwards:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *a):
        self.n += 1


@pytest.fixture()
def forwards(tiny):
    f = _Forwards(tiny[0].model)
    yield f
    f.handle.remove()


def test_toggle_off_restores_the_single_view(tiny):
    lm, spans, cap = tiny
    panel = Wd.EvictionPanel(cap, lm, spans, policy="deferkv", budget=20, recent=8, max_new_tokens=2)
    single = panel.figures["kept"]
    z0 = np.asarray(single.data[1].z, dtype=float)
    assert set(panel.figures) == {"kept"} and panel._b_box.layout.display == "none"
    assert panel.controls["compare_layer"].layout.display == "none"
    # DeferKV's preview keeps B = 20 prompt positions per cache (its first decoded token is not one of them)
    assert panel.analysis().kept_prompt.shape[-1] == 20 and int(panel.analysis().kept.max()) == spans.T
    panel.set(compare=True, policy_b="snapkv", budget_b=25)
    assert set(panel.figures) == {"kept", "compare"} and panel._b_box.layout.display is None
    assert panel.figures["compare"] in panel._figure_box.children
    assert len(panel.figures["kept"].data[1].y) == 2
    panel.set(compare=False)
    assert set(panel.figures) == {"kept"} and panel._b_box.layout.display == "none"
    assert len(panel._figure_box.children) == 1 and panel.figures["kept"] is single
    assert np.array_equal(np.asarray(single.data[1].z, dtype=float), z0, equal_nan=True)
    ref = plots.kept_positions([panel.analysis()], spans, highlight=panel.highlight(), highlight_name="answer doc")
    assert list(single.data[1].y) == list(ref.data[1].y) and single.data[1].y[0].startswith("deferkv B=20 (")
    assert single.data[1].y[0].endswith("%)")  # the share is the answer document's, as the x title says
    assert single.layout.xaxis2.title.text.endswith("(%): share of answer doc kept")
    assert panel.status.value.startswith("preview from the capture: deferkv, B = 20")
    # single-mode controls of B are shown only for the policies that use them
    panel.set(policy_b="page-entrokv")
    assert panel.controls["page_b"].layout.display is None and panel.controls["defer_lam_b"].layout.display == "none"


def test_same_setting_and_bad_inputs_say_so_and_change_nothing(tiny, forwards):
    lm, spans, cap = tiny
    panel = Wd.EvictionPanel(cap, lm, spans, policy="deferkv", budget=20, recent=8, max_new_tokens=2)
    panel.set(compare=True, policy_b="snapkv", budget_b=20)
    html0, kept0 = panel.figures["compare"].html, np.asarray(panel.figures["kept"].data[1].z, dtype=float)
    # the same setting: refused in the status, figures unchanged, no run
    panel.set(policy_b="deferkv", defer_lam_b=panel.controls["defer_lam"].value)
    assert panel.error == ("A and B are the same setting (deferkv, B = 20): change B's policy, budget or "
                           "parameters to compare")
    assert "A and B are the same setting" in panel.status.value
    assert panel.figures["compare"].html == html0
    assert np.array_equal(np.asarray(panel.figures["kept"].data[1].z, dtype=float), kept0, equal_nan=True)
    answers = panel.answers.value
    with pytest.raises(ValueError, match="A and B are the same setting"):
        panel.run()
    assert forwards.n == 0 and panel.model_calls == 0 and panel.answers.value == answers
    # a λ that differs is another setting
    panel.set(defer_lam_b=0.5)
    assert panel.error is None and "λ = 0.5" in panel.figures["compare"].view.meta["label_b"]  # the slider's symbol
    # B's budget out of range: clamped by the slider to [protected positions, T]
    panel.controls["budget_b"].value = 10**6
    assert panel.controls["budget_b"].value == spans.T
    panel.controls["budget_b"].value = 0
    assert panel.controls["budget_b"].value == spans.n_sink + 8
    # a side without a preview: its placeholder, named
    panel.set(policy_b="h2o", budget_b=24)
    view = panel.figures["compare"].view
    assert view.meta["placeholder"].startswith("B (h2o) scores with evidence a capture does not hold")
    assert "B (h2o)" in panel.status.value and [y.split(" (")[0] for y in panel.figures["kept"].data[1].y] == ["A: deferkv B=20"]
    panel.set(policy="h2o")
    assert "A (h2o)" in panel.figures["compare"].view.meta["placeholder"]
    assert "B (h2o)" in panel.figures["compare"].view.meta["placeholder"]
    assert "placeholder" in panel.figures["kept"].layout.meta
    assert forwards.n == 0
    # ... and Run compares the runs' kept sets
    cmp = panel.run()
    assert cmp.a.label == "h2o, B = 20" and cmp.b.label == "h2o, B = 24" and cmp.b.kept == 24
    assert cmp.kept.counts()["A only"] == 0  # the 20 kept are among the 24 (the same scores, a larger budget)


def test_comparison_rejects_bad_input():
    with pytest.raises(ValueError, match=r"^kept_a: positions must be integers in \[0, 9\]"):
        KeptComparison(T=10, label_a="a", label_b="b", kept_a=frozenset({3, 10}), kept_b=frozenset())
    c = KeptComparison(T=5, label_a="a", label_b="b", kept_a=frozenset({0, 1, 2}), kept_b=frozenset({2, 3}))
    assert c.membership() == ["A only", "A only", "both", "B only", "neither"]
    assert c.counts() == {"A only": 2, "B only": 1, "both": 1, "neither": 1}
    with pytest.raises(ValueError, match="^comparison, placeholder: give exactly one of them"):
        plots.kept_compare(None, None)


def test_token_margin_needs_logits(tiny):
    from _all_figures import _gen

    r = _gen("snapkv", 10, 40, 0)
    with pytest.raises(ValueError, match="kept no logits; prepare the session with keep_logits=True"):
        token_margin(r, 0)
    r.logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 2.0, -1.0]])
    assert token_margin(r, 0) == 2.0 and token_margin(r, 1) == 0.0 and math.isnan(token_margin(r, 2))
    with pytest.raises(ValueError, match="^b: must be a result on the same prompt"):
        compare_kept(r, _gen("deferkv", 10, 41, 1))


def test_key_names_the_settings_and_counts_every_class():
    """The key lists the four classes in order with the settings' names and their counts on the page (the
    neither mark struck through even when no token is in it); a second page counts only its tokens."""
    from _all_figures import _gen, synthetic_inputs

    sp = synthetic_inputs(L=4, H_Q=6, G=2)[0]
    a, b = _gen("deferkv", 25, sp.T, 1), _gen("snapkv", 30, sp.T, 2)
    cmp = compare_kept(a, b, layer=0, group=1)
    view = plots.kept_compare(cmp, sp, per_page=48, page=1)
    key = view.key_html()
    lo, hi = 48, sp.T
    member = cmp.membership()[lo:hi]
    spans = [key.index(f'data-category="{c}"') for c in ("A only", "B only", "both", "neither")]
    assert spans == sorted(spans)
    assert f"kept by A only (A: deferkv, B = 25) ({member.count('A only')})" in key
    assert f"kept by B only (B: snapkv, B = 30) ({member.count('B only')})" in key
    assert f"kept by both ({member.count('both')})" in key and f"kept by neither ({member.count('neither')})" in key
    assert '<span class="tk rm" style="background-color:#ffffff">neither</span>' in key
    assert view.positions == list(range(lo, hi)) and view.meta["counts"] == cmp.counts()
    assert sum(cmp.counts().values()) == sp.T and cmp.where == "layer 0, KV group 1"
    assert view.title.startswith("Kept prompt positions, A: deferkv, B = 25 vs B: snapkv, B = 30 (layer 0, KV group 1)")


# ----------------------------------------------------------------------------- the prune panel's compare mode
def test_prune_compare_draws_both_retained_sets_and_runs_both(tiny, forwards):
    """Two pruned-prefill settings: the retained sets of the two traces (adaptive l* vs a fixed layer) computed
    here from the removed chunks, drawn exactly so; Run gives each setting's own run_pruned answer, KV bytes of
    the dense cache of T' positions and the first-token margin of its logits; the same setting is refused."""
    from workbench.analyse.params import EntroPrefillParams
    from workbench.analyse.procedure import trace
    from workbench.rerun.prune import run_full, run_pruned
    from workbench.run.adapter import model_shape

    lm, spans, cap = tiny
    T = spans.T
    base = EntroPrefillParams(target=0.2, eps_row=0.9, eps_audit=1.0, streak=0)
    panel = Wd.PrunePanel(cap, lm, spans, base, max_new_tokens=4)
    panel.set(compare=True, mode_b="fixed layer", run_layer_b=1, target_b=0.5, m0_b=0)
    assert panel.error is None and set(panel.figures) == {"trace", "compare"} and forwards.n == 0
    pb = base.replace(target=0.5, m0=0)
    assert panel.params_b() == pb and panel.layer_of("a") is None and panel.layer_of("b") == 1
    tr_a, tr_b = trace(cap, base, certify=False), trace(cap, pb, certify=False)
    assert tr_a.l_star is not None
    a = set(range(T)) - set(np.flatnonzero(spans.removal_mask(tr_a.removed).numpy()).tolist())
    b = set(range(T)) - set(np.flatnonzero(spans.removal_mask(tr_b.selections[1].removed).numpy()).tolist())
    expect = {"A only": a - b, "B only": b - a, "both": a & b, "neither": set(range(T)) - a - b}
    drawn = drawn_membership(panel.figures["compare"].html)
    assert {c: {p for p, m in drawn.items() if m == c} for c in expect} == expect
    assert expect["A only"] and expect["neither"] and len(a) < T and len(b) < len(a)
    assert f"{len(expect['A only'])} A only" in panel.status.value and "fixed l* = 1" in panel.status.value
    # the run: full + A + B prefills, each the single run's
    cmp = panel.run()
    assert panel.model_calls == 3
    ra = run_pruned(lm, spans, base, max_new_tokens=4, progress=False)
    rb = run_pruned(lm, spans, pb, layer=1, max_new_tokens=4, progress=False)
    full = run_full(lm, spans, max_new_tokens=4)
    assert cmp.a.ids == tuple(ra.generated_ids) and cmp.b.ids == tuple(rb.generated_ids)
    assert cmp.full.ids == tuple(full.generated_ids) and (cmp.a.l_star, cmp.b.l_star) == (ra.l_star, 1)
    shape = model_shape(lm.model)
    for side, r in ((cmp.a, ra), (cmp.b, rb), (cmp.full, full)):
        assert side.T_prime == r.T_prime and side.kv_bytes == kv_bytes_dense(shape, r.T_prime, 4)
        z = np.sort(r.first_logits.numpy().astype(np.float64))
        assert side.first_margin == pytest.approx(z[-1] - z[-2], abs=1e-5)
    assert (cmp.a.T_prime, cmp.b.T_prime) == (len(a), len(b))  # the run retained what the preview predicted
    assert cmp.kept.counts() == {k: len(v) for k, v in expect.items()}
    assert f"A only {len(expect['A only'])}, both {len(expect['both'])}" in panel.answers.value
    # the same setting: refused, figures unchanged, no model call
    html0, n0 = panel.figures["compare"].html, forwards.n
    panel.set(mode_b="adaptive", target_b=0.2, m0_b=panel.controls["m0"].value)
    assert panel.error.startswith("A and B are the same setting (adaptive)")
    assert panel.figures["compare"].html == html0
    with pytest.raises(ValueError, match="A and B are the same setting"):
        panel.run()
    assert forwards.n == n0
    # toggle off: the single view and the single-mode parameters
    panel.set(compare=False)
    assert set(panel.figures) == {"trace"} and "target_b" not in panel.params()
    assert panel.run().generated_ids == ra.generated_ids


def test_compare_labels_write_the_sliders_symbols(tiny):
    """The compare table and status name a parameter as its slider does (ε_audit, λ, m₀), never its code name."""
    assert [symbol(k) for k in ("eps_audit", "lam", "m0", "eps_row", "target", "defer_lam", "no_such")] == \
        ["ε_audit", "λ", "m₀", "ε_row", "target", "λ", "no_such"]
    kept = torch.zeros(1, 1, 3, dtype=torch.long)
    runs = [GenerationResult(policy="deferkv", params={"lam": lam}, budget=3, T=5, ids=[1], text="x", kept=kept,
                             evicted_at=0, compacted_layers=(0,), kv_bytes_before=10, kv_bytes_after=5, timings={})
            for lam in (0.1, 0.5)]
    assert setting_labels(*runs, name=symbol) == ("deferkv, B = 3, λ = 0.1", "deferkv, B = 3, λ = 0.5")
    lm, spans, cap = tiny
    base = EntroPrefillParams(target=0.2, eps_row=0.9, eps_audit=1.0, streak=0)
    panel = Wd.PrunePanel(cap, lm, spans, base, max_new_tokens=4)
    panel.set(compare=True, mode_b="fixed layer", run_layer_b=1, eps_audit_b=0.5, m0_b=0)
    la, lb = panel.labels()
    assert "ε_audit = " in lb and "m₀ = 0" in lb and "eps_audit" not in la + lb and "m0" not in la + lb
