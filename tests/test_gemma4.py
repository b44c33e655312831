"""Gemma 4 as released, and Gemma 3n: per-layer KV-head counts (``num_global_key_value_heads``) and KV sharing
across layers (``num_kv_shared_layers``), on tiny random-weight models saved to a folder and loaded with
``load_model(folder)``, checked against an oracle written here: ONE eager forward through the model's own attention
with a mask built from the config alone (causal, windows of the sliding layers in original positions, per query
head the kept set of the KV head it reads, a KV-shared layer reading its source's kept set).
"""
from __future__ import annotations

import warnings

import pytest
import torch
from _oracle import oracle_logits_with

from workbench.capture import RowSet, run_capture
from workbench.rerun.eviction import H2O, SnapKV, StreamingLLM, run_policies
from workbench.rerun.prune import run_full, run_pruned
from workbench.run import adapter, families
from workbench.run.models import load_model, tiny_model
from workbench.run.spans import PromptSpans

pytestmark = pytest.mark.skipif(bool(families.version_refusal("gemma4_text")),
                                reason="transformers has no gemma4_text model below 5.24")

TOL = 1e-5
# captured rows against eager output_attentions: the capture's forward runs sdpa, the reference eager, and their
# fp32 rounding reaches the later layers' inputs (measured up to 1.4e-5 on layer 3; 6e-6 when both run eager)
TOL_ROWS = 3e-5
SLIDE, FULL = "sliding_attention", "full_attention"
# per-layer KV heads: 4 KV heads on the sliding layers, 1 on the global ones (the 26B-A4B's pattern)
PER_LAYER_G = dict(L=4, G=4, layer_types=[SLIDE, FULL, SLIDE, FULL], attention_k_eq_v=True,
                   num_global_key_value_heads=1)
# KV sharing: layers 3 (sliding) and 4 (global) read layers 2 and 1's caches, layer 0 stores its own
SHARED = dict(L=5, G=2, layer_types=[SLIDE, FULL, SLIDE, SLIDE, FULL], num_kv_shared_layers=2)
# both at once
BOTH = dict(L=5, G=4, layer_types=[SLIDE, FULL, SLIDE, SLIDE, FULL], num_kv_shared_layers=2, attention_k_eq_v=True,
            num_global_key_value_heads=2)
VARIANTS = {"per_layer_kv_heads": ("gemma4_text", PER_LAYER_G), "kv_shared": ("gemma4_text", SHARED),
            "both": ("gemma4_text", BOTH), "gemma3n": ("gemma3n_text", dict(L=4, G=2))}


def _spans() -> PromptSpans:
    return PromptSpans.synthetic([5, 6, 7, 4], query_len=6)  # T = 41 > the window (8)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, smollm):
    """Each variant saved to a folder with a tokenizer and loaded back the way a user does."""
    out = {}
    for name, (mt, kw) in VARIANTS.items():
        kw = dict(kw)
        L, G = kw.pop("L"), kw.pop("G")
        folder = tmp_path_factory.mktemp(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tiny_model(mt, vocab=len(smollm.tokenizer), L=L, H_Q=4, G=G, d=16, seed=3,  # per-layer inputs: every id
                       vocab_size_per_layer_input=len(smollm.tokenizer), **kw).save_pretrained(folder)
            smollm.tokenizer.save_pretrained(folder)
            out[name] = load_model(folder, device="cpu", progress=False)
    return out


# ----------------------------------------------------------------------------- the oracle (from the config alone)
def _geometry(m):
    """Per layer, from the config: KV heads, the source layer whose cache it reads, and its window."""
    c = m.config.get_text_config()
    L, H = c.num_hidden_layers, c.num_attention_heads
    per = getattr(c, "per_layer_config", None)
    G = [int(per[l].num_key_value_heads) if per is not None else int(c.num_key_value_heads) for l in range(L)]
    first = L - int(getattr(c, "num_kv_shared_layers", 0) or 0)
    src = []
    for l in range(L):  # a shared layer reads the last earlier non-shared layer of its kind
        src.append(l if l < first else max(j for j in range(first) if c.layer_types[j] == c.layer_types[l]))
    win = [int(c.sliding_window) if c.layer_types[l] == SLIDE else None for l in range(L)]
    return H, G, src, win


ORACLE = "gemma4_test_oracle"


def oracle_logits(m, ids, pos, *, kept=None, gen_from=None, R=None, T=None, removed_after=None):
    """Logits ``[N, V]`` of one eager forward over ``ids`` at original positions ``pos``: key ``j`` visible from
    query ``u`` iff ``pos_j ≤ pos_u`` and, on a sliding layer, ``pos_u - pos_j < window``; rows ``≥ gen_from`` of
    layer ``l``, query head ``h`` see only ``kept[src(l)][h // (H / G_src)]`` and the positions ``≥ gen_from``;
    with ``R``: layers ``> removed_after`` see only ``R`` and the positions ``≥ T``, and so do the rows ``≥ T`` of
    every layer (pruned prefill's gathered caches)."""
    H, G, src, win = _geometry(m)
    N = len(ids)
    dpos = pos[:, None] - pos[None, :]

    def attention(module, query, key, value, attention_mask, **kw):
        l = module.layer_idx
        vis = dpos >= 0
        if win[l] is not None:
            vis = vis & (dpos < win[l])
        vis = vis.expand(H, N, N).clone()
        if R is not None:
            ok = torch.isin(pos, R) | (pos >= T)
            rows = torch.ones(N, dtype=torch.bool) if l > removed_after else pos >= T
            vis[:, rows] &= ok[None, None, :]
        if kept is not None:
            s = src[l]
            for h in range(H):
                ok = torch.isin(pos, kept[s][h // (H // kept[s].shape[0])]) | (pos >= gen_from)
                vis[h, pos >= gen_from] &= ok[None, :]
        mask = torch.zeros(1, H, N, N, dtype=query.dtype).masked_fill(~vis[None], torch.finfo(query.dtype).min)
        return adapter.own_eager_function(module)(module, query, key, value, mask, **kw)

    return oracle_logits_with(m, ORACLE, attention, ids, pos)


# ----------------------------------------------------------------------------- the geometry
def test_geometry_of_the_variants(loaded):
    """The variants load, and the workbench reads their geometry as the config sets it."""
    m = loaded["per_layer_kv_heads"].model
    assert adapter.layer_kv_heads(m) == [4, 1, 4, 1] and adapter.model_shape(m).G == 4
    assert adapter.kv_source_layers(m) == [0, 1, 2, 3]
    assert adapter.kv_group_heads(m, 1).tolist() == [0, 0, 0, 0]
    m = loaded["kv_shared"].model
    assert adapter.kv_source_layers(m) == [0, 1, 2, 2, 1]
    assert [b.self_attn.is_kv_shared_layer for b in adapter.decoder_layers(m)] == [False, False, False, True, True]
    assert adapter.kv_ties(m)[3].tolist() == adapter.kv_ties(m)[2].tolist()
    m = loaded["both"].model
    assert adapter.layer_kv_heads(m) == [4, 2, 4, 4, 2] and adapter.kv_source_layers(m) == [0, 1, 2, 2, 1]
    assert adapter.kv_group_heads(m, 4).tolist() == [0, 0, 1, 1]
    assert adapter.kv_source_layers(loaded["gemma3n"].model) == [0, 1, 0, 1]
    from workbench.rerun.eviction import Needs
    from workbench.rerun.eviction.refusals import needs_refusal

    for name in VARIANTS:  # a kvpress press reads each layer's own key projection and cache: refused, with why
        assert "has KV-shared layers (no key projection nor cache of their own) or layers with fewer KV heads" in \
            needs_refusal(loaded[name].model, Needs(attn_inputs=True), "KVPress")


def test_non_nesting_kv_heads_refused():
    """KV-head counts that do not divide the largest are refused from the config, naming the field."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma4_text", num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                               layer_types=[SLIDE, FULL], attention_k_eq_v=True, num_global_key_value_heads=2)
    with pytest.raises(TypeError, match=r"per-layer KV-head counts \[2, 3\] \(num_global_key_value_heads\) that "
                                        r"do not divide the largest"):
        families.family_of(cfg)


# ----------------------------------------------------------------------------- capture
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_capture_equals_eager_attention(loaded, name):
    """Captured rows (the whole prompt and 3 decode steps) equal the model's own eager ``output_attentions`` on
    every layer, the KV-shared ones included; the logits are unchanged by the capture."""
    lm = loaded[name]
    m, spans = lm.model, _spans()
    T = spans.T
    cap = run_capture(lm, spans, RowSet(tail=T, n_decode=3), progress=False)
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    old = m.config._attn_implementation
    m.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = m(input_ids=ids, output_attentions=True, use_cache=False)
    finally:
        m.set_attn_implementation(old)
    ref = torch.stack([a[0] for a in out.attentions])[:, :, cap.row_pos, : T + 3]
    assert (cap.attn - ref).abs().max().item() <= TOL_ROWS
    assert cap.generated_ids == out.logits[0, T - 1:T + 2].argmax(-1).tolist()


# ----------------------------------------------------------------------------- pruned prefill
@pytest.mark.parametrize("name", ["per_layer_kv_heads", "kv_shared", "both"])
def test_pruned_prefill_equals_the_oracle(loaded, name):
    """``l* = -1`` equals the model's own forward on the kept positions at their original positions (the oracle,
    windows in original positions); a gather after layer 2 (before the KV-shared layers reading layers 1 and 2)
    equals the oracle in which layers > 2 and the decode rows see only R."""
    lm = loaded[name]
    m, spans = lm.model, _spans()
    T = spans.T
    removed = [1, 3]
    R = spans.retained_positions(removed)
    gen = torch.arange(T, T + 3)
    for layer in (-1, 2):
        a = run_pruned(lm, spans, layer=layer, removed=removed, max_new_tokens=4, progress=False)
        assert a.T_prime == len(R)
        if layer == -1:
            toks = [spans.input_ids[int(i)] for i in R] + a.generated_ids[:-1]
            o = oracle_logits(m, toks, torch.cat([R, gen]), R=R, T=T, removed_after=-1)
            last = len(R)
        else:
            toks = list(spans.input_ids) + a.generated_ids[:-1]
            o = oracle_logits(m, toks, torch.arange(T + 3), R=R, T=T, removed_after=layer)
            last = T
        assert (o[last - 1] - a.first_logits).abs().max().item() <= TOL, layer
        assert o[last - 1:].argmax(-1).tolist() == a.generated_ids, layer


def test_gemma3n_pruned_prefill_refused(loaded):
    """Gemma 3n's pruned prefill is refused at the call with its own reason (AltUp's stacked streams)."""
    with pytest.raises(ValueError, match=r"run_pruned: pruned prefill cannot run on gemma3n_text: its blocks carry "
                                         r"AltUp's stacked hidden streams"):
        run_pruned(loaded["gemma3n"], _spans(), layer=-1, removed=[1, 3], max_new_tokens=2, progress=False)


# ----------------------------------------------------------------------------- eviction
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_eviction_equals_the_oracle(loaded, name):
    """At ``B < T`` each policy's logits equal the oracle masked, per layer and query head, to the kept set of the
    KV head it reads, a KV-shared layer to its source's; every stored row holds ``B`` prompt positions (a sliding
    layer: at most its window's); the KV-shared layers store nothing before or after. At ``B ≥ T`` the run equals
    the full cache."""
    lm = loaded[name]
    m, spans = lm.model, _spans()
    T = spans.T
    H, G, src, win = _geometry(m)
    full = run_full(lm, spans, max_new_tokens=4)
    for pol in (SnapKV(n_sink=2, recent=2, window=4), H2O(n_sink=2, recent=2), StreamingLLM(n_sink=2, recent=2)):
        r = run_policies(lm, spans, [pol], [6], 4, progress=False, keep_logits=True)[0]
        assert r.error is None, r.error
        assert not r.not_compacted
        for l in range(len(G)):
            k = r.kept_layers[l]
            assert k.shape[0] == G[src[l]], (l, k.shape)
            prompt = k[:, k[0] < T]
            assert prompt.shape[-1] == (6 if win[l] is None else min(6, win[l])), (l, prompt.shape)
            if src[l] != l:  # a KV-shared layer attends its source's kept set and stores nothing
                assert torch.equal(k, r.kept_layers[src[l]])
                assert r.kv_layer_bytes_before[l] == r.kv_layer_bytes_after[l] == 0
            else:
                assert r.kv_layer_bytes_after[l] < r.kv_layer_bytes_before[l]
        toks = list(spans.input_ids) + r.ids[:-1]
        o = oracle_logits(m, toks, torch.arange(len(toks)), kept=r.kept_layers, gen_from=T + r.evicted_at)
        assert (o[T - 1:T - 1 + len(r.ids)] - r.logits[:len(r.ids)]).abs().max().item() <= TOL, pol.name
        assert o[T - 1:T - 1 + len(r.ids)].argmax(-1).tolist() == r.ids
    for r in run_policies(lm, spans, [SnapKV(n_sink=2, recent=2, window=4), H2O(n_sink=2, recent=2)], [T], 4,
                          progress=False, keep_logits=True):
        assert r.error is None and r.ids == full.generated_ids
        assert r.kv_bytes_after == r.kv_bytes_before


def test_shared_group_scores_are_pooled():
    """The kept set of a sharing group is chosen once from its layers' scores pooled (the mean): a layer reading
    another's cache and a coarser layer's KV head serving several groups select from one score row."""
    from workbench.rerun.eviction.evidence import Evidence
    from workbench.rerun.eviction.select import select_keep

    ties = torch.tensor([[0, 1], [2, 2], [0, 1]])  # layer 1: one KV head for both groups; layer 2 reads layer 0
    ev = Evidence(T=4, L=3, head_group=torch.tensor([0, 0, 1, 1]), ties=ties)
    s = torch.tensor([[[4., 0, 0, 0], [0, 4, 0, 0]], [[1, 2, 3, 0], [3, 0, 0, 2]], [[0, 0, 2, 0], [0, 0, 0, 0]]])
    p = ev.pooled(s)
    assert torch.equal(p[0, 0], torch.tensor([2., 0, 1, 0], dtype=torch.float64))  # (layer 0 + layer 2) / 2
    assert torch.equal(p[2], p[0]) and torch.equal(p[1, 0], p[1, 1])
    assert torch.equal(p[1, 0], torch.tensor([2., 1, 1.5, 1], dtype=torch.float64))
    keep = select_keep(p, 1, torch.zeros(4, dtype=torch.bool))
    assert keep[:, :, 0].tolist() == [[0, 1], [0, 0], [0, 1]]


def test_allocation_across_a_tie_fails_with_the_reason(loaded):
    """A budget allocation that gives the layers of one sharing group different counts is reported as that
    policy's failure, naming it (one stored row cannot keep two counts), never run on a count it did not ask for."""
    from workbench.rerun.eviction import PyramidKV

    r = run_policies(loaded["kv_shared"], _spans(), [PyramidKV(base=SnapKV(n_sink=2, recent=2, window=4))], [12], 2, progress=False)[0]
    assert r.error is not None and "policy: pyramidkv allocates different budgets" in r.error
    assert "which one kept set must serve" in r.error


def test_kv_bytes_per_position_not_read_off_a_shared_cache():
    """With every layer global, a KV-shared layer still stores nothing: the bytes of a kept position cannot be read
    off ``2·e·G·d`` per layer (``None``); without sharing they can."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared = tiny_model("gemma4_text", L=3, H_Q=4, G=2, d=16, layer_types=[FULL] * 3, num_kv_shared_layers=1)
        plain = tiny_model("gemma4_text", L=3, H_Q=4, G=2, d=16, layer_types=[FULL] * 3)
    assert adapter.kv_source_layers(shared) == [0, 1, 1]
    assert adapter.kv_bytes_per_position(shared) is None
    assert adapter.kv_bytes_per_position(plain) == 2 * 4 * 2 * 32  # fp32, G = 2, the global head size 32


@pytest.mark.parametrize("name", ["per_layer_kv_heads", "kv_shared", "gemma3"])
def test_question_agnostic_eviction_equals_the_oracle(loaded, name):
    """A context evicted once, then a question fed whole: the question's and the answer's logits equal the oracle
    masked to each layer's kept set (windows in original positions). On old code the question's forward ran
    without the original-position windows and crashed on any windowed model (gemma3 too)."""
    from workbench.rerun.eviction import EvictionSession, Needs

    lm = loaded[name] if name in loaded else tiny_model("gemma3", L=3, H_Q=4, G=2, d=16, seed=1)
    ids = list(_spans().input_ids)
    Tc = 30
    sess = EvictionSession.prepare(lm, ids[:Tc], Needs(), 3, keep_logits=True, progress=False)
    r = sess.run_questions(StreamingLLM(n_sink=2, recent=2), 6, [ids[Tc:]])[0]
    assert r.error is None and r.kept_layers
    toks = ids + r.ids[:-1]
    o = oracle_logits(lm.model if name in loaded else lm, toks, torch.arange(len(toks)), kept=r.kept_layers, gen_from=Tc)
    T = len(ids)
    assert (o[T - 1:T - 1 + len(r.ids)] - r.logits[:len(r.ids)]).abs().max().item() <= TOL
    assert o[T - 1:T - 1 + len(r.ids)].argmax(-1).tolist() == r.ids
