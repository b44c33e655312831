"""Families derived from the modelling code (``workbench.run.derive``), loaded the way a user loads a model.

Each row builds a tiny random-weight model of a model type outside the hand-written family table from a config,
saves it to a folder with a tokenizer, loads it with ``load_model(folder)`` (which runs the derived family's
self-check), and checks: captured rows (prompt tail and decode steps) equal the model's own eager
``output_attentions``; logits are bit-identical with capture on and off; every eviction policy at ``B ≥ T`` equals
the full cache (sparse attention is refused at load, and the test shows why). A few rows run
by default; the others are ``slow`` (``WORKBENCH_SLOW=1``).
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch
from _oracle import assert_capture_leaves_logits_unchanged
from tokenizers import Tokenizer, models
from transformers import AutoConfig, PreTrainedTokenizerFast

from workbench.capture import RowSet, run_capture
from workbench.rerun.eviction import SnapKV, every_policy, run_policies
from workbench.run import adapter, derive, families, selfcheck
from workbench.run.models import load_model, tiny_model
from workbench.run.spans import PromptSpans

TOL = 1e-5
VOCAB = 128
_MOE = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
_DS_MOE = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
               first_k_dense_replace=1, n_group=1, topk_group=1)
_INDEXER = dict(index_n_heads=2, index_head_dim=16, index_topk=8)
# tiny config fields per model type (on top of tiny_model's shared geometry: L = 3, H_Q = 4, G = 2, d = 16)
DERIVED = {
    "minimax_m2": dict(_MOE),
    "olmoe": dict(_MOE),
    "hunyuan_v1_moe": dict(_MOE, moe_topk=2),
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32),
    "dots1": dict(_DS_MOE),
    "flex_olmo": dict(_MOE),
    "granitemoeshared": dict(_MOE, shared_intermediate_size=32),
    "internlm3": dict(),
    "exaone": dict(),
    "glm": dict(partial_rotary_factor=0.5),
    "nemotron": dict(eos_token_id=127),  # with eos 2 this random model stops after 3 tokens (the checks decode 4)
    "bitnet": dict(),
    "cohere2_moe": dict(_MOE),
    "apertus1p5_text": dict(),
    "glm4_moe_lite": dict(_MLA, **_DS_MOE),
    "minicpm3": dict(_MLA),
}
SPARSE = {  # DeepSeek-V3.2 / GLM-5 sparse attention: a lightning indexer with its own key cache
    "deepseek_v32": dict(_MLA, **_DS_MOE, **_INDEXER),
    "glm_moe_dsa": dict(_MLA, **_DS_MOE, **_INDEXER),
}
MLA_TYPES = {"glm4_moe_lite", "minicpm3", "deepseek_v32", "glm_moe_dsa"}
_HYBRID = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
HYBRIDS = {  # capture-only: softmax layers 1 and 3, gated-delta or short-convolution layers 0 and 2
    "qwen3_5_moe_text": dict(_MOE, shared_expert_intermediate_size=32, linear_num_key_heads=2,
                             linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                             layer_types=_HYBRID, num_hidden_layers=4),
    "lfm2_moe": dict(_MOE, num_dense_layers=1, layer_types=["conv", "full_attention"] * 2, num_hidden_layers=4),
    "olmo_hybrid": dict(layer_types=_HYBRID, num_hidden_layers=4),
}
FAST = {"olmoe", "glm", "minicpm3", "lfm2_moe"}
SLOW_OK = bool(os.environ.get("WORKBENCH_SLOW"))


def _rows(names):
    return [f if f in FAST else pytest.param(f, marks=[pytest.mark.slow, pytest.mark.skipif(
        not SLOW_OK, reason="a slow row: WORKBENCH_SLOW=1 runs it")]) for f in names]


def _spans() -> PromptSpans:
    return PromptSpans.synthetic([5, 6, 7, 4], query_len=6)  # T = 41, token ids < 128


def _tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token="t1",
                                   eos_token="t2")


def _tiny(family: str, overrides: dict):
    kw = dict(overrides)
    if family in MLA_TYPES:  # MLA expands its latent into one key per query head
        kw.update(num_key_value_heads=4, head_dim=kw["qk_rope_head_dim"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model(family, L=3, H_Q=4, G=2, d=16, seed=1, vocab=VOCAB, **kw)


def _load(family: str, overrides: dict, tmp_path):
    _tiny(family, overrides).save_pretrained(tmp_path)
    _tokenizer().save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(tmp_path, device="cpu", progress=False)


def _check_capture(lm, spans: PromptSpans):
    """Captured rows (prompt tail and 3 decode steps, softmax layers) equal the model's own eager attention, and
    the logits are bit-identical with the capture on and off."""
    m = lm.model if hasattr(lm, "tokenizer") else lm  # a LoadedModel or a bare network
    T = spans.T
    cap = run_capture(lm, spans, RowSet(observers=False, audit=None, tail=T, n_decode=3), progress=False)
    soft = families.softmax_layers(m)
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    ref = torch.stack([a[0] for a in adapter.eager_attentions(m, ids).attentions])[:, :, cap.row_pos, : T + 3]
    assert (cap.attn[soft] - ref).abs().max().item() <= TOL
    assert "decode" in cap.row_kind
    assert_capture_leaves_logits_unchanged(m, spans.input_ids)


@pytest.mark.parametrize("family", _rows(sorted(DERIVED)))
def test_derived_family_loads_and_is_exact(family, tmp_path):
    """A model type outside the table: derived (not refused), loaded from a folder through the self-check; then the
    conformance checks of a table row: capture equals its eager attention, logits unchanged with capture on, pruned
    prefill (l* = -1 and after layer 0) equals the independent oracle, every policy at B >= T equals the full cache,
    and SnapKV at B < T equals the oracle masked to its kept sets."""
    from test_conformance import MLA_TOL, _check_capture_and_pruning, oracle_logits

    assert derive.refusal(family) is None
    lm = _load(family, DERIVED[family], tmp_path)
    m = lm.model
    fam = families.family_of(m)
    assert families.is_derived(fam) and not fam.capture_only and fam.mla == (family in MLA_TYPES)
    spans = _spans()
    T = spans.T
    full = _check_capture_and_pruning(m, spans, family)
    res = run_policies(m, spans, every_policy(n_sink=2, recent=2), [T], 4, progress=False)
    for r in res:
        if r.error is not None:  # refused at the call (ExpectedAttention without rotary maps): named, never run
            assert r.policy == "expected-attention" and "not available for" in r.error, (r.policy, r.error)
            continue
        assert r.ids == full.generated_ids, (r.policy, r.budget)
        assert r.kv_bytes_after == r.kv_bytes_before
    r = run_policies(m, spans, [SnapKV(n_sink=2, recent=2, window=4)], [6], 4, progress=False, keep_logits=True)[0]
    assert r.error is None and r.kv_bytes_after < r.kv_bytes_before, r.error
    toks = list(spans.input_ids) + r.ids[:-1]
    kept = list(r.kept) if fam.mla else r.kept_layers
    o = oracle_logits(m, toks, torch.arange(len(toks)), kept=kept, gen_from=T + r.evicted_at)
    assert (o[T - 1:T - 1 + len(r.ids)] - r.logits).abs().max().item() <= (MLA_TOL if fam.mla else TOL)
    assert o[T - 1:T - 1 + len(r.ids)].argmax(-1).tolist() == r.ids


@pytest.mark.parametrize("family", _rows(sorted(HYBRIDS)))
def test_derived_hybrid_is_capture_only(family, tmp_path):
    """A hybrid outside the table: derived as capture-only (its softmax layers told by their attention module),
    self-checked, rows on its softmax layers equal its eager attention, and pruned prefill and eviction are refused
    naming the other layers. lfm2_moe is loaded from a folder; the folder check of the gated-delta families
    (gated q_proj, linear-attention k_proj) is not this test's subject, so those run on the built model."""
    from workbench.rerun.eviction import generate_with_policy
    from workbench.rerun.prune import run_pruned

    m = _tiny(family, HYBRIDS[family])
    fam = families.family_of(m)
    assert families.is_derived(fam) and fam.capture_only.startswith("hybrid of")
    assert families.softmax_layers(m) == [1, 3]
    selfcheck.check_derived(m)
    lm = _load(family, HYBRIDS[family], tmp_path) if family == "lfm2_moe" else m
    spans = _spans()
    _check_capture(lm, spans)
    why = rf"cannot run on {family}: hybrid of .*\(layers \[0, 2\] are not softmax attention"
    with pytest.raises(ValueError, match="run_pruned: pruned prefill " + why):
        run_pruned(m, spans, layer=-1, removed=[1, 3], max_new_tokens=2, progress=False)
    with pytest.raises(ValueError, match="policy: SnapKV " + why):
        generate_with_policy(m, spans, SnapKV(n_sink=2, recent=2, window=4), 6, 2, progress=False)


@pytest.mark.parametrize("family", sorted(SPARSE))
def test_sparse_attention_is_refused_for_its_reason(family, tmp_path):
    """DeepSeek-V3.2 / GLM-5 sparse attention is refused at load, naming the reason, and the reason holds: under any
    implementation name but 'eager' and 'sdpa' (the capture registers its own) the attention does not fold the
    indexer's top-k selection into its mask, so the same kernel (sdpa, wrapped without any change) gives other
    logits: a capture would change the model. The self-check on the built model refuses it too."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    assert derive.refusal(family).endswith("kernel attends every key, so capturing would change the model's own "
                                           "computation")
    m = _tiny(family, SPARSE[family])
    x = torch.tensor([list(range(3, 40))])
    sdpa = adapter.base_attention_function("sdpa")
    AttentionInterface.register("renamed_sdpa", lambda *a, **k: sdpa(*a, **k))
    AttentionMaskInterface.register("renamed_sdpa", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    with torch.no_grad():
        own = m(x).logits
        m.set_attn_implementation("renamed_sdpa")
        renamed = m(x).logits
    assert (own - renamed).abs().max().item() > 1e-3  # the indexer's mask is dropped under another name
    m.save_pretrained(tmp_path)
    _tokenizer().save_pretrained(tmp_path)
    with pytest.raises(TypeError, match=f"'{family}' architecture .* not supported: .*sparse attention: a lightning "
                                        "indexer"):
        load_model(tmp_path, device="cpu", progress=False)


def test_self_check_refuses_a_wrong_layout(monkeypatch):
    """The self-check at load compares rows read at the attention interface with the model's own eager rows: a
    correct derived layout passes; one whose reading of the call is off (the scaling read twice too large) or whose
    softmax layers are not the layers that call attention is refused, naming the layer and the difference."""
    import dataclasses

    m = _tiny("olmoe", DERIVED["olmoe"])
    selfcheck.check_derived(m)
    pairs = selfcheck.self_check_rows(m)
    assert sorted(pairs) == [0, 1, 2]
    for rows, ref in pairs.values():
        assert rows.shape == ref.shape == (4, selfcheck.SELF_CHECK_T, selfcheck.SELF_CHECK_T)
        assert (rows - ref).abs().max().item() <= 1e-6
    read = adapter.read_attention_call
    with monkeypatch.context() as mp:
        mp.setattr(adapter, "read_attention_call",
                   lambda *a: dataclasses.replace(read(*a), scaling=2 * read(*a).scaling))
        with pytest.raises(TypeError, match=r"'olmoe' layout was derived from its modelling code and failed its "
                                            r"self-check at load .*: layer 0 rows differ from its eager attention by"):
            selfcheck.check_derived(m)
    with monkeypatch.context() as mp:
        mp.setattr(families, "softmax_layers", lambda model: [0, 2])
        with pytest.raises(TypeError, match=r"^its attention calls come from layers \[0, 1, 2\], the olmoe layout's "
                                            r"softmax layers are \[0, 2\]"):
            selfcheck.self_check_rows(m)


def test_self_check_refuses_a_hybrid_config_of_a_plain_type(monkeypatch):
    """A derived family's capture-only flag comes from the type's default config; a model whose own config leaves
    some layers without softmax attention (here: one block's attention removed) is refused at load naming them,
    never run as a plain decoder."""
    m = _tiny("olmoe", DERIVED["olmoe"])
    del adapter.decoder_layers(m)[1].self_attn
    with pytest.raises(TypeError, match=r"failed its self-check at load .*: layers \[1\] have no softmax attention, "
                                        r"but the layout derived from the type's default configuration"):
        selfcheck.check_derived(m)


def test_table_families_skip_the_self_check():
    """A family of the hand-written table is verified by its conformance row, not at load."""
    m = _tiny("llama", {})
    assert not families.is_derived(families.family_of(m))
    selfcheck.check_derived(m)  # no forward needed: returns at once


@pytest.mark.parametrize("model_type,reason", [
    ("mamba", "mamba: state-space model (MambaMixer), no attention rows"),
    ("rwkv", "RWKV: no softmax attention"),
    ("bart", "BartForCausalLM: its blocks carry cross-attention (encoder_attn)"),
    ("bert", "BertLMHeadModel runs an encoder stack"),
    ("bloom", "BloomForCausalLM: its attention (BloomAttention) computes the weights itself (ALiBi"),
    ("longcat_flash", "every block runs 2 attention modules"),
    ("dbrx", "its attention (DbrxAttention) sits inside another module of the block (norm_attn_norm.attn)"),
    ("jetmoe", "JetMoeForCausalLM: mixture of attention heads (JetMoeAttention"),
])
def test_refused_with_the_architectures_reason(model_type, reason, tmp_path):
    """Architectures the workbench cannot run exactly are refused at load from the config, with their own reason,
    never "not in the family table"."""
    AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a weight file")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TypeError, match=f"'{model_type}' architecture .* not supported: .*") as e:
        load_model(tmp_path, device="cpu", progress=False)
    assert reason in str(e.value) and "family table" not in str(e.value)


def test_a_config_with_two_text_configs_is_refused_not_crashed():
    """MusicGen's config holds a text encoder and a decoder (``get_text_config`` raises on it): ``family_of`` refuses
    it with its reason instead of letting transformers' ValueError through."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model("musicgen")
    with pytest.raises(TypeError, match="'musicgen' architecture .* not supported: MusicgenForCausalLM: MusicGen: a "
                                        "decoder over parallel audio-codebook streams"):
        families.family_of(cfg)
