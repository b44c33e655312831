"""Loading a model the way a user does: a tiny random-weight model of every family saved to a folder and read back
with ``load_model(folder)`` (``tiny_model`` skips the folder check), and the folders that must be refused at load,
naming the field or the weight: non-causal attention, attention implementations the capture cannot read, configs
that lie (an untied head with no weight, a norm epsilon <= 0, a wrong intermediate_size) and non-finite weights."""
from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_conformance import PARTIAL, TOL, _spans
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tok_models
from transformers import PreTrainedTokenizerFast

from workbench.capture import RowSet, run_capture
from workbench.run import adapter, families, load_checks, model_folder
from workbench.run.models import load_model, tiny_model

VOCAB = 128


def _quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


def _tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny models' 128 ids (a folder needs one; the default model's is not needed)."""
    t = Tokenizer(tok_models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t3"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="t3", pad_token="t0", bos_token="t1", eos_token="t2")


def _eager(family: str) -> bool:
    return families.FAMILIES[[f.name for f in families.FAMILIES].index(family)].eager_only


def _tiny(family: str, **kw):
    """A tiny model of ``family`` (4 layers; a hybrid with its softmax layers at 1 and 3, as in the conformance
    matrix)."""
    return _quiet(tiny_model, family, L=4, vocab=VOCAB, seed=2,
                  attn_implementation="eager" if _eager(family) else "sdpa", **{**PARTIAL.get(family, {}), **kw})


def _save(model, folder: Path) -> Path:
    _quiet(model.save_pretrained, folder)
    _tokenizer().save_pretrained(folder)
    return folder


def _load(folder: Path, **kw):
    return _quiet(load_model, folder, device="cpu", progress=False, **kw)


def _edit_config(folder: Path, **fields) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **fields}))
    return folder


# ----------------------------------------------------------------------------- every family from a folder
@pytest.mark.parametrize("family", [f.name for f in families.FAMILIES])
def test_every_family_loads_from_a_folder(family, tmp_path):
    """Each row of the family table, saved to a folder and loaded as a user does: the folder check passes (a gated
    ``q_proj`` included), every weight comes back (logits equal the saved model's bit for bit), and the model is
    the one saved (its family)."""
    if families.version_refusal(family):
        pytest.skip(f"{family} is refused under this transformers: {families.version_refusal(family)}")
    m = _tiny(family)
    lm = _load(_save(m, tmp_path))
    assert families.family_of(lm.model).name == family
    ids = torch.tensor([[5, 9, 17, 33, 65, 7, 11, 3]])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, m(ids).logits)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text"])
def test_gated_attention_loads_and_captures_exactly(family, tmp_path):
    """Qwen3-Next and Qwen3.5 hold the query and its output gate in one ``q_proj`` (``2·H·d`` rows): their folder
    loads (it was refused as "does not match its config ... run prepare again") and capture on the softmax layers
    equals the model's own eager rows."""
    if families.version_refusal(family):
        pytest.skip(families.version_refusal(family))
    lm = _load(_save(_tiny(family), tmp_path))
    c = adapter.text_config(lm.model.config)
    q = families.decoder_layers(lm.model)[1].self_attn.q_proj.weight
    assert list(q.shape) == [2 * c.num_attention_heads * c.head_dim, c.hidden_size] == [128, 64]
    spans = _spans()
    cap = run_capture(lm, spans, RowSet(tail=spans.T), progress=False)
    soft = families.softmax_layers(lm.model)
    ref = torch.stack([a[0] for a in adapter.eager_attentions(lm.model, torch.tensor([list(spans.input_ids)]))
                       .attentions])[:, :, cap.row_pos, : spans.T]
    assert soft == [1, 3] and (cap.attn[soft] - ref).abs().max().item() <= TOL


def test_gated_attention_saved_under_the_multimodal_prefix_loads(tmp_path):
    """Qwen3.5's published weights sit under ``model.language_model.`` (renamed at load): the gate is still read
    per layer from the modelling class, and the weights come back."""
    if families.version_refusal("qwen3_5_text"):
        pytest.skip(families.version_refusal("qwen3_5_text"))
    m = _tiny("qwen3_5_text")
    d = _save(m, tmp_path)
    sd = load_file(d / "model.safetensors")
    renamed = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
               for k, v in sd.items()}
    assert "model.language_model.layers.1.self_attn.q_proj.weight" in renamed
    save_file(renamed, d / "model.safetensors", metadata={"format": "pt"})
    lm = _load(d)
    ids = torch.tensor([[5, 9, 17, 33]])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, m(ids).logits)


def test_gated_query_rows_are_still_checked(tmp_path):
    """The gate is read from the modelling class, not assumed: a gated folder whose config says other heads is
    refused naming the gate's rows."""
    d = _edit_config(_save(_tiny("qwen3_5_text"), tmp_path), num_attention_heads=2)
    with pytest.raises(ValueError, match=r"q_proj.weight has shape \[128, 64\], the config \(num_attention_heads = 2"
                                         r".*needs \[64, 64\] \(query and output gate: 2 · num_attention_heads"):
        model_folder.check_folder(d)


def test_gated_query_from_the_config_when_no_model_can_be_built(tmp_path, monkeypatch):
    """Without a model built from the config (transformers cannot build one), the gate is read from the config's
    ``attn_output_gate`` (the field of Qwen's published configs); without either the gated rows are refused."""
    monkeypatch.setattr(load_checks, "skeleton_shapes", lambda folder, c: None)
    d = _save(_tiny("qwen3_5_text"), tmp_path)
    with pytest.raises(ValueError, match=r"q_proj.weight has shape \[128, 64\].* needs \[64, 64\]"):
        model_folder.check_folder(d)
    model_folder.check_folder(_edit_config(d, attn_output_gate=True))


# ----------------------------------------------------------------------------- non-causal attention
@pytest.mark.parametrize("family, value", [("gemma3_text", True), ("gemma4_text", "all")])
def test_bidirectional_config_is_refused_naming_the_field(family, value, tmp_path):
    """EmbeddingGemma's config (gemma3_text, ``use_bidirectional_attention: true``) and Gemma 4's ``"all"`` make
    every position attend the later ones: refused at load from the raw config, naming the field."""
    if families.version_refusal(family):
        pytest.skip(families.version_refusal(family))
    d = _edit_config(_save(_tiny(family), tmp_path), use_bidirectional_attention=value)
    with pytest.raises(TypeError, match=rf"^model: the config of .* is not a causal LM: use_bidirectional_attention = "
                                        rf"{re.escape(repr(value))}: its attention is bidirectional"):
        _load(d)


def test_vision_only_bidirectional_attention_is_accepted(tmp_path):
    """Gemma 4's ``"vision"`` (bidirectional inside an image only) leaves text attention causal: the folder loads."""
    assert load_checks.non_causal_reason("vision") is None and load_checks.non_causal_reason(False) is None
    if families.version_refusal("gemma4_text"):
        pytest.skip(families.version_refusal("gemma4_text"))
    d = _edit_config(_save(_tiny("gemma4_text"), tmp_path), use_bidirectional_attention="vision")
    assert _load(d).shape.L == 4


def test_a_built_non_causal_model_is_refused_after_the_build():
    """The backstop: a model built by hand with non-causal attention (``is_causal = False`` on its attention
    modules) is refused by the support check, at load and at capture, naming the layers."""
    m = _quiet(tiny_model, "gemma3_text", L=2, vocab=VOCAB, use_bidirectional_attention=True)
    assert not families.decoder_layers(m)[0].self_attn.is_causal
    with pytest.raises(TypeError, match=r"the attention of layers \[0, 1\] is not causal \(is_causal = False"):
        adapter.check_supported(m)
    with pytest.raises(TypeError, match="is not causal"):
        run_capture(m, _spans(), RowSet(tail=4), progress=False)


# ----------------------------------------------------------------------------- attention implementations
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_supported_implementations_capture_exactly(impl, tmp_path):
    """sdpa and eager load and capture rows equal to the model's own eager attention (a window binding)."""
    lm = _load(_save(_tiny("gemma3_text"), tmp_path), attn_implementation=impl)
    assert adapter.current_attn_implementation(lm.model) == impl
    spans = _spans()
    assert spans.T > 8  # the sliding window (8) binds on layers 0 and 2
    cap = run_capture(lm, spans, RowSet(tail=spans.T), progress=False)
    ref = torch.stack([a[0] for a in adapter.eager_attentions(lm.model, torch.tensor([list(spans.input_ids)]))
                       .attentions])[:, :, cap.row_pos, : spans.T]
    assert (cap.attn - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("impl, why", [("flex_attention", "BlockMask"),
                                       ("flash_attention_2", "without a mask"),
                                       ("flash_attention_3", "without a mask")])
def test_unreadable_implementations_are_refused_at_load(impl, why, tmp_path):
    """flex_attention (a block mask; it crashed at the first capture with "'BlockMask' object has no attribute
    'device'") and flash attention (no mask) are refused by load_model with the reason, installed or not."""
    d = _save(_tiny("llama"), tmp_path)
    with pytest.raises(ValueError, match=rf"^attn_implementation: '{impl}' is refused: .*{why}.*use 'sdpa'"):
        _load(d, attn_implementation=impl)


def test_a_flex_model_built_by_hand_is_refused_before_its_first_capture():
    m = _quiet(tiny_model, "llama", L=2, vocab=VOCAB, attn_implementation="flex_attention")
    with pytest.raises(TypeError, match=r"attn_implementation = 'flex_attention': .*BlockMask"):
        run_capture(m, _spans(), RowSet(tail=4), progress=False)


# ----------------------------------------------------------------------------- configs that lie
def test_untied_head_without_its_weight_is_refused_naming_it(tmp_path):
    """``tie_word_embeddings: false`` in a folder saved tied (no ``lm_head.weight``): transformers would initialise
    the head at random; refused naming the weight."""
    d = _edit_config(_save(_tiny("llama", tie_word_embeddings=True), tmp_path), tie_word_embeddings=False)
    assert "lm_head.weight" not in load_file(d / "model.safetensors")
    with pytest.raises(ValueError, match=r"^spec: the model folder .* does not hold the model its config describes: "
                                         r"1 weight\(s\) missing from the folder .*: lm_head.weight"):
        _load(d)


def test_an_unexpected_weight_is_refused_naming_it(tmp_path):
    d = _save(_tiny("llama"), tmp_path)
    sd = load_file(d / "model.safetensors")
    save_file({**sd, "model.extra.weight": torch.zeros(3)}, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"1 weight\(s\) in the folder but not in the model .*: model.extra.weight"):
        _load(d)


@pytest.mark.parametrize("field, value", [("rms_norm_eps", -1e-6), ("rms_norm_eps", 0.0), ("rms_norm_eps", math.nan),
                                          ("layer_norm_eps", -1e-5)])
def test_a_norm_epsilon_not_above_zero_is_refused_naming_the_field(field, value, tmp_path):
    family = "llama" if field == "rms_norm_eps" else "starcoder2"
    d = _edit_config(_save(_tiny(family), tmp_path), **{field: value})
    with pytest.raises(ValueError, match=rf"^spec: the model folder .*: config.json {field}: must be .*> 0 .*got "
                                         rf"{re.escape(repr(value))}"):
        _load(d)


def test_a_wrong_intermediate_size_gets_the_workbench_message(tmp_path):
    """The MLP's shapes are checked with the attention's: a wrong ``intermediate_size`` names the tensor and the
    field (it was a raw transformers error)."""
    d = _edit_config(_save(_tiny("llama"), tmp_path), intermediate_size=100)
    with pytest.raises(ValueError, match=r"^spec: the model folder .* does not match its config: "
                                         r"model.layers.0.mlp.down_proj.weight has shape \[64, 128\], the model its "
                                         r"config describes \(intermediate_size = 100, hidden_size = 64\) needs "
                                         r"\[64, 100\]"):
        _load(d)


def test_a_non_finite_weight_is_refused_naming_the_tensor(tmp_path):
    """A NaN in a valid safetensors file (the header and sizes intact): refused at load naming the tensor."""
    d = _save(_tiny("llama"), tmp_path)
    sd = load_file(d / "model.safetensors")
    sd["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    sd["model.layers.1.mlp.up_proj.weight"][0, 0] = float("inf")
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    model_folder.check_folder(d)  # the header check cannot see it
    with pytest.raises(ValueError, match=r"the weight model.layers.1.mlp.up_proj.weight holds 2 non-finite value\(s\)"):
        _load(d)
