"""Each failure seen with models other than SmolLM2, one test each, on tiny random models."""
from __future__ import annotations

import inspect
import math
import sys
import types
import warnings

import pytest
import torch
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conformance import CLASSIC_ROWS, SUPPORTED, _model, _rows, _spans
from transformers.cache_utils import DynamicLayer

from workbench.capture import RowSet, capture_attention, run_capture
from workbench.capture.data import Capture
from workbench.rerun.eviction import EvictionSession, Evidence, generate_with_policy
from workbench.rerun.eviction.policies import H2O, SnapKV
from workbench.rerun.eviction.select import preview_window
from workbench.rerun.prune import run_full, run_pruned
from workbench.rerun.stability import stability
from workbench.run import adapter, blocks, families
from workbench.run.models import load_model, tiny_model
from workbench.run.spans import PromptSpans


def _quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


# ----------------------------------------------------------------------------- capture: the model's own kernel
def test_gemma2_capture_keeps_soft_capping():
    m = _model("gemma2")
    spans = _spans()
    T = spans.T
    x = torch.tensor([list(spans.input_ids)])
    with torch.no_grad():
        off = m(x).logits
        with capture_attention(m, list(range(T)), K=T, T=T) as rec:
            rec.positions = torch.arange(T)
            on = m(x).logits
    assert torch.equal(on, off)  # Llama's eager in place of Gemma-2's would drop the soft-cap
    ref = torch.stack([a[0] for a in adapter.eager_attentions(m, x).attentions])
    assert (rec.attn - ref).abs().max().item() <= 1e-5
    # the soft-cap binds here: rows without it differ
    for layer in families.decoder_layers(m):
        layer.self_attn.attn_logit_softcapping = None
    uncapped = torch.stack([a[0] for a in adapter.eager_attentions(m, x).attentions])
    assert (uncapped - ref).abs().max().item() > 1e-2


def test_gpt_oss_rows_keep_the_learned_sink(tmp_path):
    m = _model("gpt_oss")
    spans = _spans()
    cap = run_capture(m, spans, RowSet(tail=8, n_decode=2), progress=False)
    sums = cap.attn.sum(-1)
    assert sums.max().item() < 0.999 and cap.learned_sink.min().item() > 0
    assert (sums + cap.learned_sink - 1).abs().max().item() < 1e-5
    back = Capture.load(cap.save(tmp_path / "c.capture.safetensors"))
    assert torch.equal(back.learned_sink, cap.learned_sink)


# ----------------------------------------------------------------------------- layouts and refusal at load
def _folder(tmp_path, model, smollm):
    model.save_pretrained(tmp_path)
    smollm.tokenizer.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.model
def test_load_model_refuses_unsupported_and_accepts_neox(tmp_path, smollm):
    gpt2 = _quiet(tiny_model, "gpt2", vocab=len(smollm.tokenizer))
    with pytest.raises(TypeError, match="gpt2.*not supported.*Supported families: llama, "):
        _quiet(load_model, _folder(tmp_path / "gpt2", gpt2, smollm), device="cpu", progress=False)
    neox = _quiet(tiny_model, "gpt_neox", vocab=len(smollm.tokenizer))
    lm = _quiet(load_model, _folder(tmp_path / "neox", neox, smollm), device="cpu", progress=False)
    assert families.decoder_layers(lm.model) is lm.model.gpt_neox.layers
    assert families.final_norm(lm.model) is lm.model.gpt_neox.final_layer_norm
    spans = _spans()
    cap = run_capture(lm, spans, RowSet(tail=4), progress=False)  # no "cannot find the decoder layers"
    assert cap.attn.shape[0] == 2


@pytest.mark.model
def test_load_model_switches_eager_only_families_to_eager(tmp_path, smollm):
    g2 = _quiet(tiny_model, "gemma2", vocab=len(smollm.tokenizer), attn_implementation="eager")
    with pytest.warns(UserWarning, match="eager"):
        lm = load_model(_folder(tmp_path / "g2", g2, smollm), device="cpu", progress=False, attn_implementation="sdpa")
    assert adapter.current_attn_implementation(lm.model) == "eager"


# ----------------------------------------------------------------------------- sliding windows
def _window_reference(model, ids, pos, window, kept=None, T=None):
    """Eager logits of one forward over ``ids`` at original positions ``pos`` where every layer (all sliding)
    sees key j from query u iff 0 <= pos_u - pos_j < window (and, for u >= T, j kept or generated)."""
    N = ids.shape[1]
    d = pos[:, None] - pos[None, :]
    ok = (d >= 0) & (d < window)
    H = model.config.num_attention_heads
    ok = ok.expand(H, N, N).clone()
    if kept is not None:
        r = H // kept.shape[0]
        for h in range(H):
            k = torch.zeros(N, dtype=torch.bool)
            k[kept[h // r]] = True
            k[T:] = True
            ok[h, T:] &= k[None, :]
    mask = torch.zeros(1, H, N, N).masked_fill(~ok[None], torch.finfo(torch.float32).min)
    return adapter.eager_attentions(model, ids, attention_mask=mask, position_ids=pos[None]).logits[0]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_shortened_sequence_counts_the_window_in_original_positions(impl):
    m = _model("mistral", impl)  # a window of 8 on every layer
    spans = _spans()
    R = spans.retained_positions([1, 3])
    b = run_full(m, spans, positions=R, max_new_tokens=4)
    ids = torch.tensor([[spans.input_ids[i] for i in R] + b.generated_ids[:-1]])
    pos = torch.cat([R, torch.arange(spans.T, spans.T + 3)])
    ref = _window_reference(m, ids, pos, 8)
    assert (ref[len(R) - 1] - b.first_logits).abs().max().item() < 1e-4
    assert ref[len(R) - 1:].argmax(-1).tolist() == b.generated_ids
    # counting the window in retained tokens (renumbered positions 0..T'-1 for the mask) differs
    wrong = _window_reference(m, ids, torch.arange(len(pos)), 8)
    assert (wrong[len(R) - 1] - b.first_logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("family", ["mistral", "gemma3", "gemma2"])
def test_pruning_with_a_binding_window_under_eager(family):
    m = _model(family, "eager")
    spans = _spans()
    assert families.layer_window(m, 0) < spans.T
    R = spans.retained_positions([0, 2])
    for layer in (-1, 1, 2):  # crashed at the next decode step ("size of tensor a (16) must match b (11)")
        r = run_pruned(m, spans, layer=layer, removed=[0, 2], max_new_tokens=4, progress=False)
        assert len(r.generated_ids) == 4 and r.T_prime == len(R)
    a = run_pruned(m, spans, layer=-1, removed=[0, 2], max_new_tokens=4, progress=False)
    b = run_full(m, spans, positions=R, max_new_tokens=4)
    assert (a.first_logits - b.first_logits).abs().max().item() <= 1e-5 and a.generated_ids == b.generated_ids


@pytest.mark.parametrize("family", ["mistral", "phi3", "mixtral"])
def test_eviction_compacts_window_layers_exactly(family):
    m = _model(family)
    spans = _spans()
    T, B = spans.T, 5
    pol = SnapKV(n_sink=2, recent=2, window=4)
    res = generate_with_policy(m, spans, pol, B, 6, keep_logits=True, progress=False)
    L = m.config.num_hidden_layers
    assert res.compacted_layers == tuple(range(L)) and not res.not_compacted
    assert all(a < b for a, b in zip(res.kv_layer_bytes_after, res.kv_layer_bytes_before))
    assert res.kv_bytes_after < res.kv_bytes_before
    for k in res.kept_layers:  # at most B positions the window (8) could still see from query T
        assert k.shape[-1] == B and int(k.min()) > T - 8
    # decoding equals attention restricted to the kept keys and the window in original positions
    if len({tuple(k.flatten().tolist()) for k in res.kept_layers}) == 1:
        ids = torch.tensor([list(spans.input_ids) + res.ids[:-1]])
        pos = torch.arange(ids.shape[1])
        ref = _window_reference(m, ids, pos, 8, kept=res.kept_layers[0], T=T)
        assert (ref[T - 1:] - res.logits).abs().max().item() < 1e-4


# ----------------------------------------------------------------------------- stability
@pytest.mark.parametrize("family", _rows(SUPPORTED, fast=set(CLASSIC_ROWS)))  # the newer families: slow rows
def test_stability_never_crashes(family):
    if families.version_refusal(family):  # gemma4_text under the floor (5.2): no such model there
        pytest.skip(f"{family}: {families.version_refusal(family)}")
    m = _model(family)
    spans = _spans()
    full = run_full(m, spans, max_new_tokens=1, keep_hidden=True)
    p = run_pruned(m, spans, layer=0, removed=[1, 3], max_new_tokens=1, keep_hidden=True, progress=False)
    st = stability(m, full, p)
    assert st.drift[1] == 0.0
    if family == "gemma4_text":  # a block run alone has no per-layer inputs: the defects are NaN, with the reason
        assert math.isnan(st.defects[2]) and any("per-layer inputs" in n for n in st.notes)
    else:
        assert st.drift[2] == pytest.approx(st.defects[2], rel=1e-4, abs=1e-5)  # exact per block, windows included
    fam = families.family_of(m)
    why = families.unavailable(fam, "K")
    if why:
        assert any(n.startswith(f"not available for {fam.name}") for n in st.notes) and math.isnan(st.composed_bound)
    else:
        assert all(math.isfinite(k) for k in st.K.values()) and st.composed_bound >= 0
    assert not any("approximated" in n for n in st.notes)


def test_stability_takes_the_activation_from_the_config():
    m = _model("gemma")
    assert blocks.activation(m)[0] == "gelu_pytorch_tanh"
    bw = blocks.block_weights(m, 0)
    assert bw.act_name == "gelu_pytorch_tanh"
    z = torch.linspace(-4, 4, 101, dtype=torch.float64)
    assert torch.allclose(bw.act(z), torch.nn.functional.gelu(z, approximate="tanh"))
    assert blocks.block_weights(_model("phi3"), 0).W_Q.shape == (4 * 16, 64)  # fused qkv split


def test_layer_window_is_per_layer():
    g3 = _model("gemma3")
    assert [families.layer_window(g3, l) for l in range(3)] == [8, None, 8]
    assert families.sliding_layers(_model("mistral")) == [0, 1, 2]
    assert families.sliding_layers(_model("llama")) == []
    assert families.sliding_layers(_quiet(tiny_model, "qwen2", L=2, sliding_window=8, use_sliding_window=False)) == []


def test_prompt_spans_are_long_enough():
    assert PromptSpans.synthetic([5, 6, 7, 4], query_len=6).T == 41


# ----------------------------------------------------------------------------- notebooks on another model
@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("notebook,family", [("01_", "gemma3"), ("00_", "gpt_oss")])
def test_notebook_runs_on_a_second_local_model(notebook, family, tmp_path, smollm, monkeypatch):
    """A notebook headless with ``WORKBENCH_MODEL`` = a tiny folder built here from a config, with the
    default model's tokenizer: Gemma-3-style (a window of 8 on every other layer) for 01, gpt-oss (learned
    sinks, eager) for 00."""
    tn = pytest.importorskip("test_notebooks")  # needs nbclient (the test extra)
    model = _quiet(tiny_model, family, L=4, H_Q=4, G=2, d=16, vocab=len(smollm.tokenizer), seed=3,
                   attn_implementation="eager" if family in ("gemma2", "gpt_oss") else "sdpa")
    folder = _folder(tmp_path / f"tiny-{family}", model, smollm)
    monkeypatch.setenv("WORKBENCH_MODEL", str(folder))
    monkeypatch.setenv("WORKBENCH_DEVICE", "cpu")
    path = next(p for p in tn.NOTEBOOKS if p.name.startswith(notebook))
    tn.execute_headless(path, tmp_path)


class _OddLayer(DynamicLayer):
    """A cache layer type eviction does not know (stands for a quantised or offloaded layer)."""


def test_a_layer_that_cannot_be_compacted_warns_and_shows_in_the_bytes():
    m = _model("gemma3")
    spans = _spans()
    pol = SnapKV(n_sink=2, recent=2, window=4)
    sess = EvictionSession.prepare(m, spans, pol.needs(), 3, progress=False)
    adapter.cache_layers(sess.cache0)[1].__class__ = _OddLayer  # the global layer
    with pytest.warns(UserWarning, match="1 layer.*not compacted"):
        res = sess.run(pol, 5)
    assert list(res.not_compacted) == [1] and "_OddLayer" in res.not_compacted[1]
    assert res.kv_layer_bytes_after[1] == res.kv_layer_bytes_before[1]
    assert res.kv_layer_bytes_after[0] < res.kv_layer_bytes_before[0]
    assert res.to_frame().layers_not_compacted.iloc[0] == 1
    assert math.isnan(float(res.survival([0]).mean(-1)[1]))


@given(T=st.integers(12, 40), S=st.integers(3, 11), B=st.integers(4, 14), seed=st.integers(0, 10_000))
@settings(max_examples=examples(60), deadline=None)
def test_window_layer_keeps_the_policy_choice_among_what_it_sees(T, S, B, seed):
    """SPEC §7 [decided]: a window layer keeps the policy's top-B among the positions it still holds
    (protected ones first), all of them when B >= their count."""
    g = torch.Generator().manual_seed(seed)
    L, G = 2, 2
    ev = Evidence(T=T, L=L, head_group=torch.tensor([0, 0, 1, 1]), colsum=torch.rand(L, 4, T, generator=g).double())
    pol = H2O(n_sink=2, recent=2)
    held = torch.arange(T - S, T)
    got = preview_window(pol, ev, B, 1, held)
    if B >= S:
        assert torch.equal(got, held.expand(G, S))
        return
    assert got.shape == (G, B) and bool(((got >= T - S) & (got < T)).all())
    scores = ev.scores_of(pol)[1]
    prot = pol.protected(T)
    for gi in range(G):
        kept = set(got[gi].tolist())
        assert {int(p) for p in held if prot[p]} <= kept
        rest = [int(p) for p in held if not prot[p]]
        free = [p for p in rest if p in kept]
        out = [p for p in rest if p not in kept]
        if free and out:
            assert min(float(scores[gi, p]) for p in free) >= max(float(scores[gi, p]) for p in out)


# ----------------------------------------------------------------------------- multimodal wrappers
@pytest.mark.parametrize("wrapper", ["llava", "mistral3", "paligemma"])
def test_load_model_refuses_a_multimodal_wrapper_before_reading_a_weight(tmp_path, wrapper):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(wrapper)
    assert families.family_of(cfg.get_text_config()) is not None  # its language model is a supported family
    cfg.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a weight file")  # read it and the load would fail otherwise
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TypeError, match=f"the '{wrapper}' configuration wraps a .* language model"):
        load_model(tmp_path, device="cpu", progress=False)


def test_gemma3_multimodal_model_runs_on_its_language_model():
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.rerun.eviction import every_policy, run_policies

    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, sliding_window=8, max_position_embeddings=4096,
                layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = AutoConfig.for_model("gemma3", text_config=text, vision_config=vision, mm_tokens_per_image=4,
                               image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    m = _quiet(AutoModelForCausalLM.from_config, cfg, attn_implementation="sdpa").eval()
    assert families.family_of(m).name == "gemma3_text" and len(families.decoder_layers(m)) == 2
    spans = _spans()
    T = spans.T
    cap = run_capture(m, spans, RowSet(tail=T, n_decode=2), progress=False)
    ids = torch.tensor([list(spans.input_ids) + cap.generated_ids])
    ref = torch.stack([a[0] for a in adapter.eager_attentions(m, ids).attentions])
    assert (cap.attn - ref[:, :, cap.row_pos, : T + 2]).abs().max().item() <= 1e-5
    full = run_full(m, spans, max_new_tokens=3)
    res = run_policies(m, spans, every_policy(n_sink=2, recent=2), [T], 3, progress=False)
    assert all(r.error is None and r.ids == full.generated_ids for r in res), [(r.policy, r.error) for r in res]


# ----------------------------------------------------------------------------- transformers >= 5.25: kernels wrappers
def _modelling_module(monkeypatch, **functions):
    """A stand-in modelling module holding ``functions``, and an attention class defined in it."""
    mod = types.ModuleType("wb_fake_modelling")
    mod.__dict__.update(functions)
    mod.Attention = type("Attention", (torch.nn.Module,), {"__module__": mod.__name__})
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod.Attention()


def test_a_kernels_wrapped_function_is_read_as_the_models_own(monkeypatch):
    """transformers 5.25 decorates ``apply_rotary_pos_emb`` with ``kernels``' hub wrapper, an ``nn.Module`` whose
    signature is ``(*args, **kwargs)``: read that way, the rotary probe called it with the wrong arguments."""
    kernels = pytest.importorskip("kernels")

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return q * cos + sin, k * cos - sin

    wrapped = kernels.use_kernel_forward_from_hub("wb_test_rotary")(apply_rotary_pos_emb)
    assert isinstance(wrapped, torch.nn.Module)
    att = _modelling_module(monkeypatch, apply_rotary_pos_emb=wrapped)
    fn = adapter.own_modelling_function(att, "apply_rotary_pos_emb")
    assert fn is apply_rotary_pos_emb
    x, c, s = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(fn(x, x, c, s)[0], wrapped(x, x, c, s)[0], rtol=0, atol=0)


def test_an_unknown_function_wrapper_is_refused_by_name(monkeypatch):
    class Opaque(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return args

    att = _modelling_module(monkeypatch, apply_rotary_pos_emb=Opaque())
    with pytest.raises(TypeError, match=r"Attention's apply_rotary_pos_emb is a .*Opaque module that wraps no function"):
        adapter.own_modelling_function(att, "apply_rotary_pos_emb")
    with pytest.raises(TypeError, match="Attention's modelling module has no eager_attention_forward"):
        adapter.own_modelling_function(att, "eager_attention_forward")


def test_the_real_rotary_function_is_a_plain_function_with_its_own_signature():
    """On every transformers this project runs (with or without ``kernels``), the probe reads the tiny Llama's
    own ``apply_rotary_pos_emb`` as a function taking ``(q, k, cos, sin, ...)``."""
    m = _model("llama")
    att = families.decoder_layers(m)[0].self_attn
    fn = adapter.own_modelling_function(att, "apply_rotary_pos_emb")
    assert inspect.isfunction(fn)
    assert list(inspect.signature(fn).parameters)[:4] == ["q", "k", "cos", "sin"]
