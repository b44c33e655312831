"""Eviction on hybrids (softmax layers beside linear-attention, Mamba or convolution layers; Falcon-H1: Mamba-2
beside attention in every layer), against an oracle written here: ONE forward over the prompt and the generated
tokens, every softmax layer through the modelling module's own ``eager_attention_forward`` with a mask built here
from scratch (a decode row after the eviction sees, per layer and KV head, only its kept prompt positions and the
tokens since), the recurrent layers running as the model runs them. Logits after eviction equal the oracle's at
B < T and the full cache's at B ≥ T; the KV bytes fall on the softmax layers only and the recurrent state is
reported apart, unchanged by the length."""
from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
from _oracle import oracle_logits_with

from workbench.rerun.eviction import AdaKV, DeferKV, FullCache, PyramidKV, SnapKV, StreamingLLM, generate_with_policy
from workbench.rerun.prune import run_pruned
from workbench.run import adapter, families, layer_roles
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

TOL = 1e-5
HYBRIDS = {"lfm2": dict(layer_types=["conv", "full_attention", "conv", "full_attention"]),
           "qwen3_next": dict(layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
           "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
           "granitemoehybrid": dict(layer_types=["mamba", "attention", "mamba", "attention"]),
           "jamba": dict(attn_layer_period=2, attn_layer_offset=1),
           "bamba": dict(attn_layer_indices=[1, 3]),
           "falcon_h1": {}}
SOFTMAX = {f: [1, 3] for f in HYBRIDS} | {"falcon_h1": [0, 1, 2, 3]}
FAST = {"qwen3_next", "falcon_h1"}  # one of each kind; WORKBENCH_SLOW=1 runs every hybrid
SLOW_OK = bool(os.environ.get("WORKBENCH_SLOW"))


def _rows(names):
    return [f if f in FAST else pytest.param(f, marks=[pytest.mark.slow, pytest.mark.skipif(
        not SLOW_OK, reason="a slow row: WORKBENCH_SLOW=1 runs it")]) for f in names]


def _model(family):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model(family, L=4, H_Q=4, G=2, d=16, seed=1, **HYBRIDS[family])
    if families.version_refusal(family):
        pytest.skip(f"{family} is refused under this transformers: {families.version_refusal(family)}")
    return m


def _spans() -> PromptSpans:
    return PromptSpans.synthetic([5, 6, 7, 4], query_len=6)  # T = 41


ORACLE = "hybrid_eviction_oracle"


def _oracle_logits(m, toks, T: int, gen_from: int, kept: dict | None):
    """Logits ``[N, V]`` of one forward over ``toks`` at positions ``0 … N-1``: a softmax layer's row ``u`` sees the
    keys ``j ≤ u``; a row ``u ≥ gen_from`` of layer ``l`` and KV head ``g`` only ``kept[l][g]`` (the positions kept
    at the eviction) and ``j ≥ gen_from`` (``kept=None``: every key). Each softmax layer runs its modelling module's own
    ``eager_attention_forward``."""
    c = m.config
    H, G = c.num_attention_heads, c.num_key_value_heads
    N = len(toks)
    pos = torch.arange(N)

    def attention(module, query, key, value, attention_mask, **kw):
        l = module.layer_idx
        vis = (pos[:, None] >= pos[None, :]).expand(H, N, N).clone()
        if kept is not None:
            for h in range(H):
                ok = torch.isin(pos, kept[l][h // (H // G)]) | (pos >= gen_from)
                vis[h, pos >= gen_from] &= ok
        mask = torch.zeros(1, H, N, N, dtype=query.dtype).masked_fill(~vis[None], torch.finfo(query.dtype).min)
        own = sys.modules[type(module).__module__].eager_attention_forward
        return own(module, query, key, value, mask, **kw)

    return oracle_logits_with(m, ORACLE, attention, toks, pos)


def _kept_by_layer(r) -> dict:
    """``{decoder layer: [kept positions per KV head]}`` from a result (``-1`` padding dropped; with DeferKV the
    first generated token's position ``T`` too)."""
    return {l: [k[k >= 0] for k in r.kept[i]] for i, l in enumerate(r.layers)}


def _check(r, ref, T: int):
    n = len(r.ids)
    assert n >= 2
    err = (ref[T - 1:T - 1 + n] - r.logits[:n]).abs().max().item()
    assert err <= TOL, err
    assert ref[T - 1:T - 1 + n].argmax(-1).tolist() == r.ids


@pytest.mark.parametrize("family", _rows(sorted(HYBRIDS)))
def test_hybrid_eviction_equals_the_oracle(family):
    """At B < T every policy kind (a fixed rule with a kept set computed here, attention scores, a budget per layer,
    per-head budgets, an eviction after the first decode step) decodes the oracle's tokens with its logits to fp32
    noise; the kept sets have one row per softmax layer; at B ≥ T the logits equal the full cache's."""
    m = _model(family)
    spans = _spans()
    T, n, B = spans.T, 4, 8
    soft = SOFTMAX[family]
    assert families.softmax_layers(m) == soft and layer_roles.evictable_layers(m) == soft
    toks = lambda r: list(spans.input_ids) + r.ids[:-1]  # noqa: E731
    # StreamingLLM: the sinks and the last B - n_sink prompt positions, in every softmax layer and KV head
    r = generate_with_policy(m, spans, StreamingLLM(n_sink=2, recent=2), B, n, keep_logits=True, progress=False)
    want = torch.cat([torch.arange(2), torch.arange(T - (B - 2), T)])
    assert r.layers == tuple(soft) and r.kept.shape == (len(soft), 2, B) and bool((r.kept == want).all())
    assert r.compacted_layers == tuple(soft)
    _check(r, _oracle_logits(m, toks(r), T, T, {l: [want, want] for l in soft}), T)
    for policy in (SnapKV(n_sink=2, recent=2, window=4), PyramidKV(base=SnapKV(n_sink=2, recent=2, window=4)),
                   AdaKV(base=SnapKV(n_sink=2, recent=2, window=4))):
        r = generate_with_policy(m, spans, policy, B, n, keep_logits=True, progress=False)
        assert r.error is None and r.layers == tuple(soft)
        if isinstance(policy, PyramidKV):  # the budget is over the softmax layers: L_soft · B entries in all
            assert int((r.kept[:, 0] >= 0).sum()) == len(soft) * B
        _check(r, _oracle_logits(m, toks(r), T, T, _kept_by_layer(r)), T)
    r = generate_with_policy(m, spans, DeferKV(n_sink=2, recent=2), B, n, keep_logits=True, progress=False)
    assert r.evicted_at == 1 and bool((r.kept[..., -1] == T).all())  # the first generated token is kept too
    _check(r, _oracle_logits(m, toks(r), T, T + 1, _kept_by_layer(r)), T)
    # B ≥ T: the full cache, to fp32 noise, and the unmasked oracle
    full = generate_with_policy(m, spans, FullCache(), T, n, keep_logits=True, progress=False)
    for b in (T, T + 5):
        r = generate_with_policy(m, spans, SnapKV(n_sink=2, recent=2, window=4), b, n, keep_logits=True,
                                 progress=False)
        assert r.ids == full.ids and (r.logits - full.logits).abs().max().item() <= TOL
    _check(full, _oracle_logits(m, list(spans.input_ids) + full.ids[:-1], T, T, None), T)


def _state_bytes_by_hand(cache) -> list[int]:
    """Per cache layer, the bytes of every floating-point tensor it stores other than the keys and values (a
    position counter is not state)."""
    out = []
    for lay in cache.layers:
        n = 0
        for name, v in vars(lay).items():
            vals = v.values() if isinstance(v, dict) else [v]
            n += sum(t.numel() * t.element_size() for t in vals
                     if isinstance(t, torch.Tensor) and t.is_floating_point() and name not in ("keys", "values"))
        out.append(n)
    return out


@pytest.mark.parametrize("family", _rows(sorted(HYBRIDS)))
def test_hybrid_kv_bytes_fall_on_the_softmax_layers_only(family):
    """Before eviction each softmax layer holds ``2·e·G·d·T`` bytes of keys and values and after it ``2·e·G·d·B``;
    the recurrent layers hold none; the recurrent and convolution state is reported apart (``kv_bytes_state``),
    equal to the cache's other tensors and the same at another prompt length (nothing in it is per position)."""
    m = _model(family)
    spans = _spans()
    T, B, e, G, d = spans.T, 6, 4, 2, 16
    soft = SOFTMAX[family]
    r = generate_with_policy(m, spans, SnapKV(n_sink=2, recent=2, window=4), B, 2, progress=False)
    per = 2 * e * G * d
    assert list(r.kv_layer_bytes_before) == [per * T if l in soft else 0 for l in range(4)]
    assert list(r.kv_layer_bytes_after) == [per * B if l in soft else 0 for l in range(4)]
    assert r.kv_bytes_before == per * T * len(soft) and r.kv_bytes_after == per * B * len(soft)
    with torch.no_grad():
        out = m(input_ids=torch.tensor([list(spans.input_ids)]), use_cache=True)
    by_hand = _state_bytes_by_hand(adapter.output_cache(out))
    assert r.kv_bytes_state == sum(by_hand) > 0
    assert [l for l, b in enumerate(by_hand) if b] == layer_roles.state_layers(m)
    short = generate_with_policy(m, list(spans.input_ids[:20]), SnapKV(n_sink=2, recent=2, window=4), B, 2,
                                 progress=False)
    assert short.kv_bytes_state == r.kv_bytes_state
    assert r.to_frame()["kv_bytes_state"].iloc[0] == r.kv_bytes_state
    if len(soft) < 4:
        assert adapter.kv_bytes_per_position(m) == per  # one softmax layer's: kept rows are softmax layers
        assert r.dense_kv_bytes(per) == r.kv_bytes_after


@pytest.mark.parametrize("family", _rows(sorted(HYBRIDS)))
def test_hybrid_pruned_prefill_refused_with_the_reason(family):
    """Pruned prefill stays refused on a hybrid, saying why: its recurrent layers read the input in sequence order."""
    m = _model(family)
    with pytest.raises(ValueError, match=rf"run_pruned: pruned prefill cannot run on {family}: .*read their input in "
                                         rf"sequence order.*capture and eviction run on its softmax layers"):
        run_pruned(m, _spans(), layer=-1, removed=[1, 3], max_new_tokens=2, progress=False)


def test_compacting_a_recurrent_layer_is_refused():
    """The cache surgery names a recurrent layer given a kept set (it holds no keys) instead of failing inside
    transformers' cache, and compacts a softmax layer while the recurrent state stays as it was."""
    m = _model("qwen3_next")
    with torch.no_grad():
        out = m(input_ids=torch.arange(3, 13)[None], use_cache=True)
    cache = adapter.output_cache(out)
    keep = torch.tensor([[0, 5, 9], [1, 2, 9]])
    with pytest.raises(ValueError, match=r"keep: layer 0 stores no keys .*must be None"):
        adapter.compact_cache_layers(cache, [keep, None, None, None])
    before = [t.clone() for t in cache.layers[0].recurrent_states.values()]
    done, skipped = adapter.compact_cache_layers(cache, [None, keep, None, keep])
    assert done == [1, 3] and not skipped and cache.layers[1].keys.shape[-2] == 3
    assert all(torch.equal(a, b) for a, b in zip(before, cache.layers[0].recurrent_states.values()))


def test_layer_roles():
    """One role per layer, read from the family table, the config and the modules."""
    roles = {f: layer_roles.layer_roles(_model(f)) for f in ("qwen3_next", "falcon_h1")}
    assert roles["qwen3_next"] == ("recurrent", "full", "recurrent", "full")
    assert roles["falcon_h1"] == ("full",) * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g3 = tiny_model("gemma3", L=3, H_Q=4, G=2, d=16, seed=1)
        n3 = tiny_model("gemma3n_text", L=4, H_Q=4, G=2, d=16, seed=1)
        ds = tiny_model("deepseek_v3", L=2, H_Q=4, G=4, d=16, seed=1)
        l4 = tiny_model("llama4_text", L=4, H_Q=4, G=2, d=16, seed=1)
    want = tuple("sliding" if families.layer_window(g3, l) else "full" for l in range(3))
    assert layer_roles.layer_roles(g3) == want and "sliding" in want
    assert layer_roles.layer_roles(n3) == ("sliding", "full", "shared", "shared")  # num_kv_shared_layers = 2
    assert layer_roles.layer_roles(ds) == ("latent", "latent")
    assert "chunked" in layer_roles.layer_roles(l4)
    assert layer_roles.state_layers(g3) == [] and layer_roles.evictable_layers(n3) == [0, 1]
    assert set(layer_roles.ROLES) == {"full", "sliding", "chunked", "latent", "recurrent", "shared"}


def test_hybrid_preview_from_a_capture_scores_the_softmax_layers():
    """The panel's preview (evidence from a saved capture) scores a hybrid's softmax layers only, as the session
    does: the same kept sets as a run, one row per softmax layer (the recurrent layers' NaN rows are not scored)."""
    from workbench.capture import RowSet, run_capture
    from workbench.rerun.eviction import Evidence, preview

    m = _model("qwen3_next")
    spans = _spans()
    cap = run_capture(m, spans, RowSet(tail=4, n_decode=0), progress=False)
    ev = Evidence.from_capture(cap)
    pol = SnapKV(n_sink=2, recent=2, window=4)
    kept = preview(pol, ev, 8)
    assert ev.L == 2 and kept.shape == (2, 2, 8)
    r = generate_with_policy(m, spans, pol, 8, 2, progress=False)
    assert torch.equal(r.kept, kept)


def test_hybrid_batched_runs_and_rerotate():
    """``run_policies(batch=True)`` on a hybrid gives the unbatched results (its recurrent state is not stacked
    across runs: each decodes alone), and ``rerotate`` turns the softmax layers' kept keys (its decoded tokens equal
    the unbatched re-rotated run's)."""
    from workbench.rerun.eviction import EvictionSession, run_policies

    m = _model("qwen3_next")
    spans = _spans()
    pols = [SnapKV(n_sink=2, recent=2, window=4), StreamingLLM(n_sink=2, recent=2)]
    one = run_policies(m, spans, pols, [8], 3, progress=False, keep_logits=True)
    many = run_policies(m, spans, pols, [8], 3, progress=False, keep_logits=True, batch=True)
    for a, b in zip(one, many):
        assert a.error is None and b.error is None and a.ids == b.ids
        assert (a.logits - b.logits).abs().max().item() <= TOL
    sess = EvictionSession.prepare(m, spans, pols[1].needs(), 3, progress=False)
    r = sess.run(pols[1], 8, rerotate=True)
    assert r.rerotated and r.layers == (1, 3) and len(r.ids) == 3
