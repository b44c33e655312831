"""Budget allocations (PyramidKV per layer, AdaKV and EntroPrefill weights per head), the per-head key
mask that realises them in a dense cache, and the honest byte count."""
from __future__ import annotations

import pytest
import torch
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.rerun.eviction import (
    H2O,
    AdaKV,
    EntroBudget,
    EvictionSession,
    Needs,
    PyramidKV,
    SnapKV,
    preview,
    split_budget,
)
from workbench.run import adapter
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

SMALL = dict(n_sink=2, recent=4)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=12), st.integers(0, 5), st.integers(0, 40), st.data())
def test_split_budget_is_an_allocation(w, floor, extra, data):
    n = len(w)
    cap = floor + extra
    total = data.draw(st.integers(n * floor, n * cap))
    out = split_budget(total, torch.tensor(w), floor, cap)
    assert int(out.sum()) == total and int(out.min()) >= floor and int(out.max()) <= cap
    if sum(w) > 0:  # a larger weight never gets fewer slots, up to one for rounding
        order = torch.argsort(torch.tensor(w), stable=True)
        o = out[order]
        assert bool((o[1:] >= o[:-1] - 1).all())


def test_split_budget_refuses_an_impossible_total():
    with pytest.raises(ValueError, match="budget"):
        split_budget(3, torch.ones(2), 2, 5)


def test_pyramid_budgets_fall_linearly_and_sum_to_the_total():
    p = PyramidKV(base=SnapKV(n_sink=4, recent=32), beta=4.0)
    b = p.layer_budgets(30, 1000, 200)
    assert int(b.sum()) == 30 * 200 and bool((b[1:] <= b[:-1]).all())
    assert abs(int(b[0]) - (2 * 200 - 50)) <= 1 and abs(int(b[-1]) - 50) <= 1
    flat = p.layer_budgets(30, 1000, 40)  # B/β below the protected 36: flattened to 36 at the top layer
    assert int(flat.sum()) == 1200 and int(flat.min()) == 36
    with pytest.raises(ValueError, match="beta"):
        PyramidKV(beta=0.5)
    with pytest.raises(ValueError, match="base"):
        AdaKV(base="snapkv")


@pytest.fixture(scope="module")
def session():
    model = tiny_model("llama", G=2, H_Q=4, L=3, seed=7)
    spans = PromptSpans.synthetic([12, 10, 11], query_len=8)
    return EvictionSession.prepare(model, spans, Needs(tail=8, colsum=True, observers=6), 5, reusable=True,
                                   progress=False)


def test_adakv_takes_the_layers_top_scores_across_heads(session):
    ev = session.evidence
    base = SnapKV(**SMALL, window=8, kernel=1)
    pol = AdaKV(base=base, alpha_safeguard=0.0)
    B = 16
    kept = preview(pol, ev, B)
    s = ev.scores_of(base).clone()
    prot = base.protected(ev.T)
    for l in range(ev.L):
        x = s[l].clone()
        x[:, prot] = float("inf")
        thr = x.flatten().topk(ev.G * B).values[-1]
        got = sum(int((kept[l, g] >= 0).sum()) for g in range(ev.G))
        assert got == ev.G * B
        for g in range(ev.G):
            row = kept[l, g][kept[l, g] >= 0]
            assert bool((x[g, row] >= thr).all())
    counts = (kept >= 0).sum(-1)
    assert not bool((counts == B).all()), "the heads' counts differ on this prompt (else the test is vacuous)"


def test_per_head_mask_equals_removing_the_keys(session):
    """Masking the same slots for every KV head of a layer decodes exactly as compacting them away."""
    T = session.T
    model = session.model
    keep = torch.tensor([p for p in range(T) if p % 3 != 1])
    drop_pos = torch.tensor([p for p in range(T) if p % 3 == 1])
    G = session.evidence.G
    a = adapter.clone_cache(session.cache0)
    b = adapter.clone_cache(session.cache0)
    adapter.compact_cache_layers(a, [keep.expand(G, -1) if l == 1 else None for l in range(session.evidence.L)])
    mask = torch.zeros(G, T + 1, dtype=torch.bool)
    mask[:, drop_pos] = True
    x = torch.tensor([[session.y1]])
    pos = torch.tensor([[T]])
    out_a = adapter.forward(model, x, cache=a, position_ids=pos, logits_to_keep=1).logits
    with adapter.per_head_key_mask(model, {1: mask}, session.evidence.head_group):
        out_b = adapter.forward(model, x, cache=b, position_ids=pos, logits_to_keep=1).logits
    assert torch.allclose(out_a, out_b, atol=1e-5)
    out_c = adapter.forward(model, x, cache=adapter.clone_cache(session.cache0), position_ids=pos, logits_to_keep=1).logits
    assert not torch.allclose(out_a, out_c, atol=1e-3), "the masked keys mattered (else the test is vacuous)"


@pytest.mark.parametrize("pol", [AdaKV(base=SnapKV(**SMALL, window=8, kernel=3)),
                                 EntroBudget(base=H2O(**SMALL), W_p=6)], ids=["adakv", "entro-budget"])
def test_per_head_budgets_report_the_dense_bytes(pol, session):
    B = 14
    r = session.run(pol, B)
    counts = (r.kept_prompt >= 0).sum(-1)  # [L, G]
    shape = adapter.model_shape(session.model)
    per_entry = 2 * shape.d * 4  # key + value, fp32, one KV head
    dense = int(counts.max(-1).values.sum()) * shape.G * per_entry + shape.L * shape.G * per_entry * r.evicted_at
    assert r.kv_bytes_after == dense
    assert r.kv_bytes_masked == int((counts.max(-1, keepdim=True).values - counts).sum()) * per_entry
    assert r.kv_bytes_after - r.kv_bytes_masked == int(counts.sum()) * per_entry


def test_pyramid_saves_bytes_per_layer(session):
    pol = PyramidKV(base=SnapKV(**SMALL, window=8, kernel=3), beta=2.0)
    B = 14
    r = session.run(pol, B)
    counts = (r.kept_prompt >= 0).sum(-1)
    assert bool((counts == counts[:, :1]).all()) and int(counts[0, 0]) > int(counts[-1, 0])
    assert r.kv_bytes_masked == 0
    shape = adapter.model_shape(session.model)
    assert r.kv_bytes_after == shape.L * B * shape.G * 2 * shape.d * 4
