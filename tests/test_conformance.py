"""Conformance matrix: one row per architecture family, on tiny random-weight models built from configs.

Every supported row checks, with a prompt (T = 41) longer than the sliding window (8) where the family has
one: captured rows (prompt tail and decode steps 1–3) equal the model's own eager ``output_attentions``;
logits are bit-identical with capture on and off; ``E = ∅`` equals the full run; ``l* = -1`` equals its
reference (:func:`run_full` on ``R`` with original positions) with the window binding; every policy at
``B ≥ T`` equals the full cache; at ``B < T`` the KV bytes fall on every layer kind. A refused family's row
is its refusal. Runs under the transformers floor (5.2) and the current version alike.
"""
from __future__ import annotations

import os
import re
import warnings

import pytest
import torch
from _oracle import assert_capture_leaves_logits_unchanged, forward_with, oracle_logits_with

from workbench.capture import RowSet, capture_attention, run_capture
from workbench.rerun.eviction import H2O, DeferKV, SnapKV, StreamingLLM, every_policy, run_policies
from workbench.rerun.prune import run_full, run_pruned
from workbench.run import adapter, families, rotary, version_floor
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

TOL = 1e-5
WINDOWED = {"mistral", "mixtral", "gemma2", "gemma3", "phi3", "starcoder2", "gpt_oss", "ministral", "olmo3", "exaone4",
            "cohere2", "vaultgemma", "gemma4_text"}
EAGER = {"gemma2", "gpt_oss", "vaultgemma"}  # transformers runs these exactly only on eager
SUPPORTED = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
             "phi3", "olmo2", "cohere", "granite", "starcoder2", "gpt_neox", "gpt_oss"]
NEW = ["ministral", "ministral3", "ernie4_5", "seed_oss", "helium", "hunyuan_v1_dense", "olmo", "olmo3", "exaone4", "glm4",
       "glm4_moe", "apertus", "arcee", "cohere2", "phi", "phimoe", "granitemoe", "stablelm", "vaultgemma", "llama4_text",
       "gemma4_text"]
CLASSIC_ROWS = list(SUPPORTED)
SUPPORTED = SUPPORTED + NEW
# the rows of the default run (one of each kind: plain, windows + soft-capping + q-norm, sinks + MoE, NoPE +
# parallel, partial rotary + fused, post-norm, chunked attention); the others are `slow` (WORKBENCH_SLOW=1 runs every row)
FAST = {"llama", "gemma3", "gpt_oss", "cohere2", "phi3", "olmo3", "llama4_text"}
SLOW_OK = bool(os.environ.get("WORKBENCH_SLOW"))


def _rows(names, fast=FAST):
    return [f if f in fast else pytest.param(f, marks=[pytest.mark.slow, pytest.mark.skipif(
        not SLOW_OK, reason="a slow row of the matrix: WORKBENCH_SLOW=1 runs it")]) for f in names]
REFUSED = ["gpt2", "falcon"]
# policies a family refuses at the call (the rest of its row is exact)
REFUSED_POLICIES = {"llama4_text": {"expected-attention": r"policy: ExpectedAttention cannot run on llama4_text: its "
                                                         r"query statistics need the rotary maps, not available for "
                                                         r"llama4_text: complex rotary"},
                    "gemma4_text": {"expected-attention": r"policy: ExpectedAttention cannot run on gemma4_text: its "
                                                         r"query statistics need the rotary maps, not available for "
                                                         r"gemma4_text: per-layer head sizes"}}


def _spans() -> PromptSpans:
    return PromptSpans.synthetic([5, 6, 7, 4], query_len=6)  # T = 41


def _model(family: str, impl: str | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model(family, L=3, H_Q=4, G=2, d=16, seed=1,
                       attn_implementation=impl or ("eager" if family in EAGER else "sdpa"))
    if family == "gemma2":  # large attention logits, so that soft-capping (5.0) binds
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "q_proj" in name or "k_proj" in name:
                    p.mul_(20)
    return m


def test_matrix_is_the_family_table():
    assert sorted(families.supported_families()) == sorted(
        [{"gemma3": "gemma3_text"}.get(f, f) for f in SUPPORTED] + list(PARTIAL) + FULL_PARTIAL + list(MLA)
        + ["gemma3n_text"])  # capture and eviction exact, pruned prefill refused (tests/test_gemma4.py)
    assert {f.name for f in families.FAMILIES if f.prune} == {"gemma3n_text"}
    assert {f.name for f in families.FAMILIES if f.mla} == set(MLA)  # capture, pruning and eviction exact
    assert not {f.name for f in families.FAMILIES if f.evict}  # no family has eviction refused as a whole
    assert {f.name for f in families.FAMILIES if f.capture_only} == set(FULL_PARTIAL) - {"falcon_h1"}  # capture only
    assert {f.name for f in families.FAMILIES if f.hybrid} == set(PARTIAL) | {"falcon_h1"}  # capture and eviction
    assert set(REFUSED) <= set(families.REFUSED)


@pytest.mark.parametrize("family", REFUSED)
def test_refused_family(family):
    m = _model(family, "eager")
    with pytest.raises(TypeError, match=f"{family}.*not supported.*Supported families: llama"):
        adapter.check_supported(m)
    with pytest.raises(TypeError, match="Supported families"):  # at capture too (a model built by hand)
        with capture_attention(m, [0], K=1, T=1):
            pass


# ----------------------------------------------------------------------------- the independent oracle
ORACLE = "conformance_oracle"


def oracle_logits(m, ids, pos, *, removed_after=None, R=None, kept=None, T=None, gen_from=None):
    """Logits ``[N, V]`` of ONE eager forward over ``ids [N]`` at original positions ``pos [N]``, every layer
    through the model's own ``eager_attention_forward`` with a mask built here from scratch, per layer (and
    per KV head): key ``j`` is visible from query ``u`` iff ``pos_j ≤ pos_u`` and, on a window layer,
    ``pos_u - pos_j < window``; for layers ``> removed_after`` only keys at positions in ``R`` or ``≥ T``
    (pruned prefill from a mid layer; ``removed_after = -1``: every layer), and for the rows ``≥ T`` of every
    layer (the gathered cache); rows ``u ≥ gen_from`` see, in layer ``l``
    and KV head ``g``, only ``kept[l][g]`` and the positions ``≥ gen_from`` (evicted decoding)."""
    fam = families.family_of(m)
    c = adapter.text_config(m.config)
    H, G = c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    N = len(ids)
    dpos = pos[:, None] - pos[None, :]

    def attention(module, query, key, value, attention_mask, **kw):
        l = module.layer_idx
        vis = dpos >= 0
        w = families.layer_window(m, l)
        if w is not None:
            vis = vis & (dpos < w)
        C = families.layer_chunk(m, l)
        if C is not None:  # chunked attention: the same chunk of original positions
            vis = vis & (pos[:, None] // C == pos[None, :] // C)
        vis = vis.expand(H, N, N).clone()
        if R is not None:  # the gathered caches of layers <= removed_after hold only R for the decode rows
            ok = torch.isin(pos, R) | (pos >= T)
            rows = torch.ones(N, dtype=torch.bool) if l > removed_after else pos >= T
            vis[:, rows] &= ok[None, None, :]
        if kept is not None:
            for h in range(H):
                ok = torch.isin(pos, kept[l][h // (H // G)]) | (pos >= gen_from)
                vis[h, pos >= gen_from] &= ok[None, :]
        mask = torch.zeros(1, H, N, N, dtype=query.dtype).masked_fill(~vis[None], torch.finfo(query.dtype).min)
        return adapter.own_eager_function(module)(module, query, key, value, mask, **kw)

    assert fam is not None
    return oracle_logits_with(m, ORACLE, attention, ids, pos)


def _assert_capture_leaves_logits_unchanged(m, spans: PromptSpans) -> None:
    """The logits of the prompt are bit-identical with the capture hooks on and off."""
    assert_capture_leaves_logits_unchanged(m, spans.input_ids)


def _check_against_oracle(logits, ids, ref, T0):
    """``logits [n, V]`` of generated tokens ``ids`` equal the oracle's rows ``T0-1 …``; greedy ids follow."""
    n = len(ids)
    assert (ref[T0 - 1:T0 - 1 + n] - logits[:n]).abs().max().item() <= TOL
    assert ref[T0 - 1:T0 - 1 + n].argmax(-1).tolist() == ids


def _check_capture_and_pruning(m, spans: PromptSpans, family: str, layers=(-1, 0)):
    """Steps 1–3 of a row (capture, logits, pruned prefill at ``layers`` against the oracle); returns the full
    run."""
    T = spans.T
    # 1. captured rows = the model's own eager output_attentions (prompt tail + decode steps 1..3)
    cap = run_capture(m, spans, RowSet(tail=T, n_decode=3), progress=False)
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    ref = torch.stack([a[0] for a in adapter.eager_attentions(m, ids).attentions])  # [L, H, K, K]
    ref_rows = ref[:, :, cap.row_pos, : T + 3]
    assert (cap.attn - ref_rows).abs().max().item() <= TOL
    assert "decode" in cap.row_kind
    if family == "gpt_oss":  # learned sinks: rows sum to < 1 as the model computes them; the rest is the sink's
        sums = ref_rows.sum(-1)
        assert sums.max().item() < 1 - 1e-3
        assert (cap.learned_sink - (1 - sums)).abs().max().item() <= TOL
    else:
        assert cap.learned_sink is None
    # 2. logits bit-identical with capture on and off
    _assert_capture_leaves_logits_unchanged(m, spans)
    # 3. E = ∅ equals full; l* = -1 and a mid-prefill removal equal the independent oracle
    full = run_full(m, spans, max_new_tokens=4)
    e0 = run_pruned(m, spans, layer=1, removed=[], max_new_tokens=4, progress=False)
    assert (e0.first_logits - full.first_logits).abs().max().item() <= TOL and e0.generated_ids == full.generated_ids
    removed = [1, 3]
    R = spans.retained_positions(removed)
    for layer in layers:
        a = run_pruned(m, spans, layer=layer, removed=removed, max_new_tokens=4, progress=False)
        assert a.T_prime == len(R) and len(a.generated_ids) == 4
        gen = torch.arange(T, T + 3)
        if layer == -1:  # only the retained tokens, at their original positions
            toks = [spans.input_ids[int(i)] for i in R] + a.generated_ids[:-1]
            o = oracle_logits(m, toks, torch.cat([R, gen]), R=R, T=T, removed_after=-1)
            last = len(R)
        else:  # every token through layers 0..l*, then only R
            toks = list(spans.input_ids) + a.generated_ids[:-1]
            o = oracle_logits(m, toks, torch.arange(T + 3), R=R, T=T, removed_after=layer)
            last = T
        assert (o[last - 1] - a.first_logits).abs().max().item() <= TOL, layer
        assert o[last - 1:].argmax(-1).tolist() == a.generated_ids, layer
    return full


@pytest.mark.parametrize("family", _rows(SUPPORTED))
def test_conformance(family):
    if families.version_refusal(family):  # gemma4_text under the floor (5.2): test_gemma4_text_version_and_variants
        pytest.skip(f"{family}: {families.version_refusal(family)}")
    m = _model(family)
    spans = _spans()
    T = spans.T
    window = families.layer_window(m, 0)
    if family in WINDOWED:
        assert window is not None and window < T and families.sliding_layers(m)
    if family == "llama4_text":  # chunks of 8 bind on the RoPE layers; the last layer is NoPE, full attention
        assert families.chunked_layers(m) == [0, 1] and families.layer_chunk(m, 0) < T
        assert [rotary.rope_on_layer(m, l) for l in range(3)] == [True, True, False]
    full = _check_capture_and_pruning(m, spans, family)
    # 4. every policy at B >= T equals the full cache; at B < T the KV bytes fall on every layer kind
    pols = every_policy(n_sink=2, recent=2)
    res = run_policies(m, spans, pols, [T, 4], 4, progress=False)
    for r in res:
        if r.policy in REFUSED_POLICIES.get(family, {}):  # refused at the call, naming the policy and the reason
            assert re.match(REFUSED_POLICIES[family][r.policy], r.error or ""), (r.policy, r.error)
            continue
        assert r.error is None, (r.policy, r.error)
        if r.budget >= T or r.policy == "full":
            assert r.ids == full.generated_ids, (r.policy, r.budget)
            assert r.kv_bytes_after == r.kv_bytes_before
        else:
            assert not r.not_compacted
            assert all(a_ < b_ for a_, b_ in zip(r.kv_layer_bytes_after, r.kv_layer_bytes_before)), r.policy
    # 5. SnapKV, DeferKV and H2O at B < T equal the oracle masked to the kept sets, per layer and KV head
    for pol in (SnapKV(n_sink=2, recent=2, window=4), DeferKV(n_sink=2, recent=2), H2O(n_sink=2, recent=2)):
        r = run_policies(m, spans, [pol], [6], 4, progress=False, keep_logits=True)[0]
        assert r.error is None, r.error
        toks = list(spans.input_ids) + r.ids[:-1]
        o = oracle_logits(m, toks, torch.arange(len(toks)), kept=r.kept_layers, gen_from=T + r.evicted_at)
        _check_against_oracle(r.logits, r.ids, o, T)


def test_gemma4_text_version_and_variants(tmp_path):
    """gemma4_text: refused by ``load_model`` under transformers < 5.24 (no such model there), from the raw config
    before a weight is read; from 5.24 its per-layer head sizes are accepted (the weight-header check reads them per
    layer), and so are KV sharing across layers and per-layer KV-head counts that nest (their rows:
    tests/test_gemma4.py); counts that do not nest are refused from the config with the reason."""
    import json

    from workbench.run import model_folder
    from workbench.run.models import load_model

    if families.version_refusal("gemma4_text"):
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4_text"}))
        (tmp_path / "model.safetensors").write_bytes(b"not a weight file")
        (tmp_path / "tokenizer.json").write_text("{}")
        with pytest.raises(TypeError, match="'gemma4_text' architecture is not supported by the workbench under this "
                                            "transformers: transformers 5.2.*has no gemma4_text model"):
            load_model(tmp_path, device="cpu", progress=False)
        return
    from transformers import AutoConfig

    m = _model("gemma4_text")
    assert [b.self_attn.head_dim for b in adapter.decoder_layers(m)] == [16, 32, 32]
    m.save_pretrained(tmp_path)
    model_folder.check_folder(tmp_path)  # per-layer q/k/v shapes match their layer's head_dim
    kw = dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
    families.family_of(AutoConfig.for_model("gemma4_text", num_kv_shared_layers=2, **kw))
    families.family_of(AutoConfig.for_model("gemma4_text", attention_k_eq_v=True, num_global_key_value_heads=1, **kw))
    with pytest.raises(TypeError, match=r"'gemma4_text' configuration has per-layer KV-head counts \[3, 4\]"):
        families.family_of(AutoConfig.for_model("gemma4_text", attention_k_eq_v=True, num_global_key_value_heads=3,
                                                **kw))


def test_llama4_temperature_refuses_pruning_and_eviction():
    """Llama-4 with its NoPE layers' attention temperature binding inside the run (floor_scale 16 < T = 41): capture
    still equals the model's own eager attention (the kernel's queries carry the temperature) and leaves the logits
    unchanged; pruned prefill and eviction are refused at the call, since the model reads the temperature's position
    from the cache length. With the default floor_scale (8192) the same run is exact (its row of the matrix)."""
    from workbench.rerun.eviction import EvictionSession, Needs, generate_with_policy

    spans = _spans()
    T = spans.T
    assert families.position_refusal(_model("llama4_text"), "eviction", T + 4) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model("llama4_text", L=3, H_Q=4, G=2, d=16, seed=1, floor_scale=16, attn_scale=1.0)
    cap = run_capture(m, spans, RowSet(tail=T, n_decode=3), progress=False)
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    ref = torch.stack([a[0] for a in adapter.eager_attentions(m, ids).attentions])[:, :, cap.row_pos, : T + 3]
    assert (cap.attn - ref).abs().max().item() <= TOL
    _assert_capture_leaves_logits_unchanged(m, spans)
    why = r"cannot run on llama4_text over \d+ positions: its NoPE layers \[2\] scale their queries by an attention " \
          r"temperature of the position, which the model reads from the cache length"
    with pytest.raises(ValueError, match="run_pruned: pruned prefill " + why):
        run_pruned(m, spans, layer=-1, removed=[1, 3], max_new_tokens=2, progress=False)
    with pytest.raises(ValueError, match="eviction " + why):
        EvictionSession.prepare(m, spans, Needs(), 2)
    with pytest.raises(ValueError, match="eviction " + why):
        generate_with_policy(m, spans, SnapKV(n_sink=2, recent=2, window=4), 6, 2, progress=False)
    with pytest.raises(ValueError, match="eviction " + why):
        run_policies(m, spans, every_policy(n_sink=2, recent=2), [T, 4], 2, progress=False)
    ctx = list(spans.input_ids[:10])  # 10 + 2 positions < 16: not refused
    sess = EvictionSession.prepare(m, ctx, Needs(), 2, progress=False)
    with pytest.raises(ValueError, match="eviction " + why):  # a question would reach the binding positions
        sess.run_questions(StreamingLLM(n_sink=2, recent=2), 6, [list(spans.input_ids[10:])])


NEW_REFUSED = ["gpt2", "falcon"]  # four current families are now rows; the load refusal on older ones


@pytest.mark.parametrize("family", NEW_REFUSED)
def test_refused_current_family_at_load(family, tmp_path):
    """Refused by ``load_model`` from its config alone, with the reason, before a weight is read (the weight file
    here is not one)."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from workbench.run.models import load_model

    if family not in CONFIG_MAPPING_NAMES:  # e.g. gemma4_text on the floor (5.2): nothing to build a config from
        pytest.skip(f"{family} is not a config type of transformers {transformers.__version__}")
    AutoConfig.for_model(family).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a weight file")
    (tmp_path / "tokenizer.json").write_text("{}")
    why = families.REFUSED[family]
    with pytest.raises(TypeError, match=f"'{family}' architecture .* not supported: {re.escape(why[:30])}"):
        load_model(tmp_path, device="cpu", progress=False)


# ----------------------------------------------------------------------------- hybrids: capture and eviction on softmax layers
PARTIAL = {"lfm2": dict(layer_types=["conv", "full_attention", "conv", "full_attention"]),
           "qwen3_next": dict(layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
           "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
           "granitemoehybrid": dict(layer_types=["mamba", "attention", "mamba", "attention"]),
           "jamba": dict(attn_layer_period=2, attn_layer_offset=1),
           "bamba": dict(attn_layer_indices=[1, 3])}


def _assert_hybrid_evicts(m, spans, T: int, family: str) -> None:
    """A hybrid: pruned prefill is refused, saying why; every policy runs on its softmax layers (ExpectedAttention
    refused where the model has no rotary embedding to read), equal to the full cache at B ≥ T, and at B < T the KV
    bytes fall on the softmax layers only while the recurrent state is reported apart (the oracle at B < T:
    tests/test_hybrid_eviction.py)."""
    with pytest.raises(ValueError, match=rf"run_pruned: pruned prefill cannot run on {family}: .*read their input in "
                                         rf"sequence order"):
        run_pruned(m, spans, layer=-1, removed=[1, 3], max_new_tokens=2, progress=False)
    if version_floor.hybrid_eviction_refusal():  # the floor (5.2): its hybrid cache has no per-layer storage
        with pytest.raises(ValueError, match=rf"eviction cannot run on {family}: under transformers .* no per-layer "
                                             rf"storage"):
            run_policies(m, spans, [SnapKV(n_sink=2, recent=2, window=4)], [4], 2, progress=False)
        return
    soft = families.softmax_layers(m)
    full = run_full(m, spans, max_new_tokens=2)
    for r in run_policies(m, spans, every_policy(n_sink=2, recent=2), [T, 4], 2, progress=False):
        if r.policy == "expected-attention" and family in ("jamba", "granitemoehybrid"):
            assert re.match(rf"policy: ExpectedAttention cannot run on {family}: .*no shared rotary embedding",
                            r.error or ""), r.error
            continue
        assert r.error is None, (r.policy, r.error)
        assert r.layers == tuple(soft) and r.kv_bytes_state > 0
        if r.budget >= T or r.policy == "full":
            assert r.ids == full.generated_ids, (r.policy, r.budget)
            assert r.kv_bytes_after == r.kv_bytes_before
        else:
            assert not r.not_compacted and r.compacted_layers == tuple(soft)
            for l, (a_, b_) in enumerate(zip(r.kv_layer_bytes_after, r.kv_layer_bytes_before)):
                assert (a_ < b_) if l in soft else (a_ == b_ == 0), (r.policy, l)




@pytest.mark.parametrize("family", sorted(PARTIAL))
def test_hybrid_capture_and_eviction(family):
    """A hybrid: rows on its softmax layers equal the model's own eager attention on prompt and decode rows, the
    other layers' rows are NaN and named, logits are bit-identical with capture on and off, every policy evicts on
    its softmax layers, and pruned prefill is refused at the call with the family and the reason."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model(family, L=4, H_Q=4, G=2, d=16, seed=1, **PARTIAL[family])
    if families.version_refusal(family):  # e.g. bamba under the floor (5.2): no cache of its own, refused at load
        with pytest.raises(TypeError, match=f"{family}.*not supported .*under this transformers: .*builds no cache"):
            adapter.check_supported(m)
        with pytest.raises(TypeError, match=f"{family}.*not supported"):
            families.family_of(adapter.text_config(_model_cfg(family)))
        return
    assert families.family_of(adapter.text_config(_model_cfg(family))).hybrid
    spans = _spans()
    T = spans.T
    soft = families.softmax_layers(m)
    assert soft == [1, 3]
    cap = run_capture(m, spans, RowSet(tail=T, n_decode=3), progress=False)
    assert cap.softmax_layers == soft and "decode" in cap.row_kind
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    atts = adapter.eager_attentions(m, ids).attentions  # one per softmax layer, in layer order
    assert len(atts) == len(soft)
    ref = torch.stack([a[0] for a in atts])[:, :, cap.row_pos, : T + 3]
    assert (cap.attn[soft] - ref).abs().max().item() <= TOL
    assert bool(torch.isnan(cap.attn[[0, 2]]).all()) and not bool(torch.isnan(cap.attn[soft]).any())
    with pytest.raises(ValueError, match=r"layers \[0, 2\] of this capture are not softmax attention"):
        cap.require_all_layers("trace")
    _assert_capture_leaves_logits_unchanged(m, spans)
    _assert_hybrid_evicts(m, spans, T, family)


# capture-only rows whose every layer has softmax attention: falcon_h1 (Mamba-2 beside attention in every layer)
FULL_PARTIAL = ["falcon_h1"]


@pytest.mark.parametrize("family", FULL_PARTIAL)
def test_capture_only_every_layer(family):
    """A family with softmax attention in every layer beside something else (falcon_h1: Mamba-2 beside attention):
    rows on every layer equal the model's own eager attention on prompt and decode rows, logits are bit-identical
    with capture on and off, and it evicts its attention KV and refuses pruned prefill (gemma3n_text, every layer
    softmax attention with KV shared across layers: tests/test_gemma4.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model(family, L=4, H_Q=4, G=2, d=16, seed=1)
    if families.version_refusal(family):  # falcon_h1 under the floor (5.2): no cache of its own, refused at load
        with pytest.raises(TypeError, match=f"{family}.*not supported .*under this transformers: .*builds no cache"):
            adapter.check_supported(m)
        return
    fam = families.family_of(adapter.text_config(_model_cfg(family)))
    assert not fam.capture_only and fam.hybrid  # Mamba-2 beside attention: the attention's KV evicts
    assert all(hasattr(b, "mamba") for b in adapter.decoder_layers(m))
    spans = _spans()
    T = spans.T
    assert families.softmax_layers(m) == [0, 1, 2, 3]
    cap = run_capture(m, spans, RowSet(tail=T, n_decode=3), progress=False)
    assert cap.softmax_layers == [0, 1, 2, 3] and "decode" in cap.row_kind
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    ref = torch.stack([a[0] for a in adapter.eager_attentions(m, ids).attentions])[:, :, cap.row_pos, : T + 3]
    err = (cap.attn - ref).abs().max().item()
    assert err <= TOL, err
    _assert_capture_leaves_logits_unchanged(m, spans)
    _assert_hybrid_evicts(m, spans, T, family)


def _model_cfg(family):
    from transformers import AutoConfig
    return AutoConfig.for_model(family)



def test_hybrid_trace_refused():
    """The analyses refuse a hybrid's capture (layers without rows), naming the layers."""
    from workbench.analyse.procedure import trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model("lfm2", L=2, H_Q=4, G=2, d=16, seed=1, layer_types=["conv", "full_attention"])
    cap = run_capture(m, _spans(), RowSet(tail=4), progress=False)
    with pytest.raises(ValueError, match=r"the analysis needs attention rows on every layer; layers \[0\]"):
        trace(cap)


@pytest.mark.model
def test_hybrid_loads_with_a_warning(tmp_path, smollm):
    """``load_model`` accepts a hybrid, warning what is unavailable; capture then runs on it."""
    from workbench.run.models import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_model("lfm2", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16,
                   layer_types=["conv", "full_attention"]).save_pretrained(tmp_path)
    smollm.tokenizer.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="lfm2 is partially supported: attention rows are captured and the cache is "
                                         "evicted on its softmax layers only .*pruned prefill and the stability bounds "
                                         "are unavailable"):
        lm = load_model(tmp_path, device="cpu", progress=False)
    cap = run_capture(lm, _spans(), RowSet(observers=False, audit=None, tail=3), progress=False)
    assert cap.softmax_layers == [1] and bool(torch.isnan(cap.attn[0]).all())
    assert (cap.attn[1].sum(-1) - 1).abs().max().item() < 1e-5


# ----------------------------------------------------------------------------- MLA: capture and pruned prefill
# DeepSeek-V2/V3 (multi-head latent attention; tiny configs in workbench.run.models.TINY_OVERRIDES: kv
# latent 16, rope 8 + nope 16 key head, value head 16, layer 0 dense and layers 1-2 routed experts). Variants: a query
# LoRA or a plain q_proj, interleaved or rotate-half rope, YaRN with mscale (the attention's own scaling), eager.
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0,
         "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 10000.0}
MLA = {
    "deepseek_v3": [dict(), dict(q_lora_rank=24, rope_interleave=False), dict(rope_parameters=_YARN)],
    "deepseek_v2": [dict(), dict(q_lora_rank=None)],
}
_MLA_ROWS = [(f, i, impl) for f, vs in MLA.items() for i in range(len(vs)) for impl in ("sdpa",)] + \
            [("deepseek_v3", 0, "eager"), ("deepseek_v2", 0, "eager")]


def _mla_model(family, variant=0, impl="sdpa"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model(family, L=3, H_Q=4, G=2, d=16, seed=1, attn_implementation=impl, **MLA[family][variant])


@pytest.mark.parametrize("family,variant,impl", _MLA_ROWS)
def test_mla_capture_and_pruning(family, variant, impl):
    """MLA: captured rows (the model's own post-RoPE q·k over its expanded keys, prompt and decode rows) equal its
    eager attention; logits are bit-identical with capture on and off; E = ∅ equals the full run; l* = -1 and
    mid-prefill removals (after the dense layer 0, after the MoE layer 1) equal the independent oracle."""
    m = _mla_model(family, variant, impl)
    att = adapter.decoder_layers(m)[0].self_attn
    assert att.qk_head_dim == 24 and att.v_head_dim == 16
    assert type(adapter.decoder_layers(m)[0].mlp).__name__.endswith("MLP")
    assert type(adapter.decoder_layers(m)[1].mlp).__name__.lower().endswith("moe")
    if MLA[family][variant].get("rope_parameters"):
        assert att.scaling != att.qk_head_dim ** -0.5  # YaRN's mscale: the capture reads the call's own scaling
    _check_capture_and_pruning(m, _spans(), family, layers=(-1, 0, 1))


# ----------------------------------------------------------------------------- MLA: eviction
# Under transformers >= 5.24 the cache stores one latent and one shared rope key per position: a layer keeps the union
# of its heads' kept sets and masks each head to its own; under 5.2 it stores per-head keys (d_k = 24) and values
# (d_v = 16), compacted per head. Either way every head must attend exactly its own kept set: the oracle (one eager
# forward, each head masked to the policy's kept set ``r.kept``) checks it, for every policy.
MLA_TOL = 5e-6
_MLA_EVICT_ROWS = [("deepseek_v3", 0, "sdpa"), ("deepseek_v2", 0, "sdpa")] + [
    pytest.param(f, i, impl, marks=[pytest.mark.slow, pytest.mark.skipif(
        not SLOW_OK, reason="a slow row of the matrix: WORKBENCH_SLOW=1 runs it")])
    for f, i, impl in [("deepseek_v3", 1, "sdpa"), ("deepseek_v3", 2, "sdpa"), ("deepseek_v2", 1, "sdpa"),
                       ("deepseek_v3", 0, "eager"), ("deepseek_v2", 0, "eager")]]
_MLA_REFUSED_POLICIES = {"expected-attention"}


def _mla_layer_bytes(m, kept_l) -> int:
    """Bytes a layer must hold for the per-head kept sets ``kept_l [H, S]`` (``-1``-padded): the union once in a
    latent cache (latent + rope key per position), every head's own set (its largest count) in a per-head one."""
    att = adapter.decoder_layers(m)[0].self_attn
    if adapter.mla_latent_cache(m):
        return len(set(kept_l[kept_l >= 0].tolist())) * (att.kv_lora_rank + att.qk_rope_head_dim) * 4
    return int((kept_l >= 0).sum(-1).max()) * kept_l.shape[0] * (att.qk_head_dim + att.v_head_dim) * 4


@pytest.mark.parametrize("family,variant,impl", _MLA_EVICT_ROWS)
def test_mla_eviction_equals_the_oracle(family, variant, impl):
    """MLA: every policy (but the refused ones) at B >= T equals the full cache; at B < T the cache shrinks to what
    the layout must hold, and decoding equals the oracle with each head masked to its own kept set (<= 5e-6);
    ExpectedAttention is refused with the policy, the family and the reason."""
    m = _mla_model(family, variant, impl)
    latent = adapter.mla_latent_cache(m)
    from packaging.version import Version
    assert latent == (Version(adapter.TRANSFORMERS_VERSION) >= Version("5.24"))  # the layout it stores (see adapter)
    spans = _spans()
    T = spans.T
    res = run_policies(m, spans, every_policy(n_sink=2, recent=2), [T, 6], 4, progress=False, keep_logits=True)
    full = next(r for r in res if r.policy == "full")
    checked = set()
    for r in res:
        if r.policy in _MLA_REFUSED_POLICIES:
            assert re.match(rf"policy: ExpectedAttention cannot run on {family}: its query statistics need the rotary "
                            rf"maps, not available for {family}: multi-head latent attention", r.error or "")
            continue
        assert r.error is None, (r.policy, r.error)
        if r.budget >= T or r.policy == "full":
            assert r.ids == full.ids, (r.policy, r.budget)
            assert r.kv_bytes_after == r.kv_bytes_before
            continue
        assert not r.not_compacted and r.compacted_layers == (0, 1, 2)
        assert all(a_ < b_ for a_, b_ in zip(r.kv_layer_bytes_after, r.kv_layer_bytes_before)), r.policy
        assert list(r.kv_layer_bytes_after) == [_mla_layer_bytes(m, r.kept[l]) for l in range(3)], r.policy
        assert all(torch.equal(k, r.kept[l]) for l, k in enumerate(r.kept_layers)) if latent else True
        toks = list(spans.input_ids) + r.ids[:-1]
        o = oracle_logits(m, toks, torch.arange(len(toks)), kept=list(r.kept), gen_from=T + r.evicted_at)
        assert (o[T - 1:T - 1 + len(r.ids)] - r.logits).abs().max().item() <= MLA_TOL, r.policy
        assert o[T - 1:T - 1 + len(r.ids)].argmax(-1).tolist() == r.ids, r.policy
        checked.add(r.policy)
    assert checked == {p.name for p in every_policy()} - _MLA_REFUSED_POLICIES - {"full"}
    # the heads' kept sets differ (SnapKV), so the per-head masks matter: all heads on the union is another model
    snap = next(r for r in res if r.policy == "snapkv" and r.budget == 6)
    union = [torch.unique(k[k >= 0]).expand(k.shape[0], -1) for k in snap.kept]
    assert any(u.shape[-1] > k.shape[-1] for u, k in zip(union, snap.kept))
    toks = list(spans.input_ids) + snap.ids[:-1]
    o = oracle_logits(m, toks, torch.arange(len(toks)), kept=union, gen_from=T)
    assert (o[T - 1:T - 1 + len(snap.ids)] - snap.logits).abs().max().item() > 1e-3


def _attention_kv(m, ids):
    """The keys and values every attention call of one prefill receives (``{layer: (k [H, T, d_k], v [H, T, d_v])}``),
    read at the attention interface: what the kernel attends, whatever the cache stores."""
    got = {}

    def attention(module, query, key, value, attention_mask, **kw):
        got[module.layer_idx] = (key[0].clone(), value[0].clone())
        return adapter.own_eager_function(module)(module, query, key, value, attention_mask, **kw)

    forward_with(m, ORACLE + "_kv", attention, ids)
    return got


@pytest.mark.parametrize("family", sorted(MLA))
def test_mla_cache_evidence_is_the_attentions_own_keys(family):
    """KNorm, KeyDiff and CriticalKV read the per-head keys and values the attention attends (expanded from the
    latent by the model's own kv_b_proj under 5.24), never the latents; CriticalKV's ``‖W_O^h v_j‖_1`` uses head
    ``h``'s d_v columns of o_proj."""
    from workbench.rerun.eviction import EvictionSession, Needs

    m = _mla_model(family)
    spans = _spans()
    ev = EvictionSession.prepare(m, spans, Needs(keys=True, wov=True), 2, progress=False).evidence
    ref = _attention_kv(m, spans.input_ids)
    assert ev.keys.shape == (3, 4, spans.T, 24) and ev.values.shape == (3, 4, spans.T, 16)
    for l in range(3):
        assert (ev.keys[l] - ref[l][0]).abs().max().item() <= 1e-6
        assert (ev.values[l] - ref[l][1]).abs().max().item() <= 1e-6
        W_O = adapter.decoder_layers(m)[l].self_attn.o_proj.weight.detach()  # [D, H d_v]
        wov = torch.stack([(ref[l][1][h] @ W_O[:, 16 * h:16 * (h + 1)].T).abs().sum(-1) for h in range(4)])
        assert (ev.wov[l] - wov.double()).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", sorted(MLA))
def test_mla_batched_and_question_agnostic_runs(family):
    """Batched decoding (runs sharing a forward, masked runs alone) equals the unbatched runs; a question answered
    from an evicted MLA cache equals the oracle with each head masked to its kept set."""
    from workbench.rerun.eviction import EvictionSession, StreamingLLM

    m = _mla_model(family)
    spans = _spans()
    pols = [SnapKV(n_sink=2, recent=2, window=4), StreamingLLM(n_sink=2, recent=2), H2O(n_sink=2, recent=2)]
    one = run_policies(m, spans, pols, [6, 9], 3, progress=False)
    assert spans.T > 9
    bat = run_policies(m, spans, pols, [6, 9], 3, progress=False, batch=True)
    assert [r.ids for r in bat] == [r.ids for r in one] and all(r.error is None for r in bat)
    ctx, q = list(spans.input_ids[:30]), list(spans.input_ids[30:])
    sess = EvictionSession.prepare(m, ctx, SnapKV(n_sink=2, recent=2, window=4).needs(), 3, keep_logits=True,
                                   progress=False)
    r = sess.run_questions(SnapKV(n_sink=2, recent=2, window=4), 6, [q])[0]
    toks = ctx + q + r.ids[:-1]
    o = oracle_logits(m, toks, torch.arange(len(toks)), kept=list(r.kept), gen_from=len(ctx))
    assert (o[len(ctx + q) - 1:len(ctx + q) - 1 + len(r.ids)] - r.logits).abs().max().item() <= MLA_TOL
    assert o[len(ctx + q) - 1:].argmax(-1).tolist() == r.ids and r.kept.shape[-1] == 6 < len(ctx)


@pytest.mark.parametrize("family", sorted(MLA))
def test_mla_refusals(family):
    """MLA: ExpectedAttention, a kvpress press (a policy asking for the attention inputs), rerotate and the stability
    constants are refused at the call, naming the policy or feature, the family and the reason."""
    import dataclasses

    from workbench.rerun.eviction import EvictionSession, ExpectedAttention, Needs, StreamingLLM, generate_with_policy
    from workbench.run import blocks, rotary

    m = _mla_model(family)
    spans = _spans()
    with pytest.raises(ValueError, match=rf"policy: ExpectedAttention cannot run on {family}: its query statistics "
                                         rf"need the rotary maps, not available for {family}: multi-head latent"):
        generate_with_policy(m, spans, ExpectedAttention(n_sink=2, recent=2), 6, 2, progress=False)

    @dataclasses.dataclass(frozen=True)
    class PressLike(SnapKV):
        def needs(self):
            return Needs(keys=True, attn_inputs=True)

    with pytest.raises(ValueError, match=rf"policy: PressLike cannot run on {family}: multi-head latent attention: a "
                                         r"kvpress press scores from the attention module's inputs"):
        generate_with_policy(m, spans, PressLike(n_sink=2, recent=2), 6, 2, progress=False)
    with pytest.raises(ValueError, match=rf"policy: a kvpress press cannot run on {family}: multi-head latent attention"):
        EvictionSession.prepare(m, spans, Needs(attn_inputs=True), 2, progress=False)
    with pytest.raises(ValueError, match=rf"rerotate: not available for {family}: multi-head latent attention: RoPE"):
        EvictionSession.prepare(m, spans, Needs(), 2, progress=False).run(StreamingLLM(n_sink=2, recent=2), 12,
                                                                           rerotate=True)
    assert re.match(rf"not available for {family}: multi-head latent attention: RoPE turns only the decoupled rope",
                    rotary.unavailable(m))
    with pytest.raises(ValueError, match=f"rotary maps not available for {family}: multi-head latent"):
        rotary.rotary_maps(m, torch.arange(4))
    with pytest.raises(blocks.Unavailable, match=rf"not available for {family}: multi-head latent attention \(no "
                                                 r"per-head W_Q, W_K, W_V.*mixture-of-experts"):
        blocks.block_weights(m, 0)
    # the stability report still runs: per-block drift exact, the composed bound NaN with the MLA reason
    import math

    from workbench.rerun.stability import stability
    full = run_full(m, spans, max_new_tokens=1, keep_hidden=True)
    p = run_pruned(m, spans, layer=0, removed=[1, 3], max_new_tokens=1, keep_hidden=True, progress=False)
    st = stability(m, full, p)
    assert st.drift[1] == 0.0 and st.drift[2] == pytest.approx(st.defects[2], rel=1e-4, abs=1e-5)
    assert any(n.startswith(f"not available for {family}: multi-head latent") for n in st.notes)
    assert math.isnan(st.composed_bound)


@pytest.mark.parametrize("family", sorted(MLA))
def test_mla_refuses_grouped_heads(family):
    """An MLA config with fewer KV heads than query heads (which the model cannot run) is refused by its config."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(family, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(TypeError, match=f"'{family}' configuration has num_key_value_heads = 2 != "
                                        "num_attention_heads = 4; multi-head latent attention"):
        families.family_of(cfg)


@pytest.mark.model
def test_mla_loads_with_a_warning(tmp_path, smollm):
    """``load_model`` accepts an MLA model, warning that eviction is unavailable; capture then runs on it."""
    from workbench.run.models import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_model("deepseek_v3", vocab=len(smollm.tokenizer), L=2, H_Q=4, d=16).save_pretrained(tmp_path)
    smollm.tokenizer.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="deepseek_v3 is partially supported: capture, pruned prefill and eviction are "
                                         "exact; ExpectedAttention, kvpress presses, rerotate and the stability bounds "
                                         "are unavailable"):
        lm = load_model(tmp_path, device="cpu", progress=False)
    cap = run_capture(lm, _spans(), RowSet(observers=False, audit=None, tail=3), progress=False)
    assert (cap.attn.sum(-1) - 1).abs().max().item() < 1e-5
