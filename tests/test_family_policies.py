"""Every policy on every family: one regression test per failure seen, on tiny random models.

CriticalKV read W_O through the stability bounds (refused on MoE, post-norm and parallel families);
ExpectedAttention hooked ``self_attn.q_proj`` (no fused projections, no q-norm, one rotary convention);
``rerotate=True`` turned NoPE layers and could not turn a partial rotary; one failing policy stopped
``run_policies``.
"""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from test_conformance import _model, _spans

from workbench.rerun.eviction import (
    H2O,
    CriticalKV,
    EvictionSession,
    ExpectedAttention,
    Needs,
    SnapKV,
    StreamingLLM,
    run_policies,
)
from workbench.rerun.eviction.cache_evidence import QueryStats
from workbench.run import adapter, families, rotary
from workbench.run.models import tiny_model

SMALL = dict(n_sink=2, recent=2)


def _tiny(family, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model(family, L=2, H_Q=4, G=2, d=16, seed=3, **kw)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "olmo2", "cohere", "gpt_neox"])
def test_criticalkv_runs_where_the_stability_bound_is_unavailable(family):
    m = _model(family)
    spans = _spans()
    T = spans.T
    res = run_policies(m, spans, [CriticalKV(base=SnapKV(**SMALL, window=4)), StreamingLLM(**SMALL)], [T, 6], 3,
                       progress=False)
    full = run_policies(m, spans, [StreamingLLM(**SMALL)], [T], 3, progress=False)[0]
    assert all(r.error is None for r in res)
    assert res[0].ids == full.ids and res[1].kept_prompt.shape[-1] == 6
    # W_O comes from the family table: the value norms use the output projection of each layer
    att = getattr(families.decoder_layers(m)[0], families.family_of(m).attn)
    assert torch.equal(adapter_w(m), getattr(att, families.family_of(m).out).weight.detach().float())


def adapter_w(m):
    from workbench.run import blocks

    return blocks.attention_output_weight(m, 0)


def _pre_rope_queries(m, family, x):
    """The model's pre-RoPE queries ``[L, H, T, d]`` read from its own modules (an oracle independent of
    the rotary maps): the q-norm's output, or the fused projection split as the model splits it."""
    fam = families.family_of(m)
    H, d = 4, 16
    got, hooks = {}, []
    for l, layer in enumerate(families.decoder_layers(m)):
        att = getattr(layer, fam.attn)
        if getattr(att, "q_norm", None) is not None:
            mod, cut = att.q_norm, lambda o: (o.transpose(1, 2) if o.dim() == 4 and o.shape[1] == H else
                                              o.reshape(o.shape[0], o.shape[1], H, d))  # Gemma-3: [B, H, T, d]
        elif family == "phi3":
            mod, cut = att.qkv_proj, lambda o: o[..., : H * d].reshape(o.shape[0], o.shape[1], H, d)
        elif family == "gpt_neox":
            mod, cut = att.query_key_value, lambda o: o.reshape(o.shape[0], o.shape[1], H, 3 * d)[..., :d]
        else:
            mod, cut = att.q_proj, lambda o: o.reshape(o.shape[0], o.shape[1], H, d)
        hooks.append(mod.register_forward_hook(lambda _m, _a, o, l=l, cut=cut: got.__setitem__(l, cut(o)[0].transpose(0, 1))))
    try:
        with torch.no_grad():
            m(x)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack([got[l] for l in range(len(got))]).double()


@pytest.mark.parametrize("family", ["phi3", "gpt_neox", "gpt_oss", "qwen3", "olmo2", "cohere", "gemma3"])
def test_expected_attention_reads_the_models_own_queries(family):
    m = _model(family)
    spans = _spans()
    T = spans.T
    x = torch.tensor([list(spans.input_ids)])
    qs = QueryStats(len(families.decoder_layers(m)), rotary.rotary_maps(m, torch.arange(T)))
    with adapter.attention_queries(m, qs), torch.no_grad():
        m(x)
    ref = _pre_rope_queries(m, family, x)  # [L, H, T, d]
    q_sum, q_outer, _ = qs.tensors()
    assert (q_sum - ref.sum(2)).abs().max().item() <= 1e-4 * max(1.0, ref.abs().sum(2).max().item())
    assert (q_outer - torch.einsum("lhti,lhtj->lhij", ref, ref)).abs().max().item() <= 1e-3
    pol = ExpectedAttention(**SMALL, n_future=16)
    res = run_policies(m, spans, [pol, SnapKV(**SMALL)], [T, 6], 3, progress=False)
    assert all(r.error is None for r in res), [r.error for r in res]
    full = run_policies(m, spans, [StreamingLLM(**SMALL)], [T], 3, progress=False)[0]
    assert res[0].ids == full.ids and res[1].kept_prompt.shape[-1] == 6


@pytest.mark.parametrize("family", ["llama", "gemma3", "phi3", "gpt_neox", "gpt_oss", "cohere", "olmo2", "starcoder2"])
def test_rotary_maps_turn_keys_by_a_shift(family):
    """The keys a prefill stores at positions ``p + s`` are ``R(s)`` of those it stores at ``p`` (RoPE is
    relative): the maps read from the model reproduce that on every layer, NoPE ones included."""
    m = _model(family, "eager")
    spans = _spans()
    T, s = spans.T, 7
    x = torch.tensor([list(spans.input_ids)])
    c0, c1 = adapter.new_cache(m), adapter.new_cache(m)
    with torch.no_grad():
        adapter.forward(m, x, cache=c0, position_ids=torch.arange(T)[None])
        adapter.forward(m, x, cache=c1, position_ids=torch.arange(s, T + s)[None])
    for l in range(len(families.decoder_layers(m))):
        k0, k1 = adapter.cache_kv(c0, l)[0], adapter.cache_kv(c1, l)[0]  # a window layer: its last S keys
        maps = rotary.rotary_maps(m, torch.full((k0.shape[-2],), s))
        assert (maps.apply(l, k0[0].double()) - k1[0].double()).abs().max().item() <= 1e-4, l


def _layer0_keys_after_rerotation(m, spans, pol, B):
    sess = EvictionSession.prepare(m, spans, pol.needs(), 3, progress=False)
    st = sess.evict(pol, B, rerotate=True)
    kept = st.kept[0, 0]
    fresh = adapter.new_cache(m)
    with torch.no_grad():
        adapter.forward(m, torch.tensor([[sess.ids[int(p)] for p in kept]]), cache=fresh, logits_to_keep=1)
    orig = adapter.cache_kv(sess.evict(pol, B).cache, 0)[0]
    return adapter.cache_kv(st.cache, 0)[0], adapter.cache_kv(fresh, 0)[0], orig


def test_rerotate_leaves_nope_layers_alone():
    m = _tiny("smollm3", no_rope_layers=[0, 1])  # layer 0 without RoPE, layer 1 with it
    assert not rotary.rope_on_layer(m, 0) and rotary.rope_on_layer(m, 1)
    spans = _spans()
    got, ref, orig = _layer0_keys_after_rerotation(m, spans, StreamingLLM(**SMALL), 12)
    assert torch.allclose(got, ref, atol=1e-5) and torch.equal(got, orig)  # unturned: a NoPE key has no position
    r = EvictionSession.prepare(m, spans, Needs(), 3, progress=False).run(StreamingLLM(**SMALL), 12, rerotate=True)
    assert r.rerotated and len(r.ids) == 3


def test_rerotate_turns_a_partial_rotary():
    m = _tiny("phi3", rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
              sliding_window=None)
    maps = rotary.rotary_maps(m, torch.tensor([3]))
    assert bool((maps.sin[0, 0, 8:] == 0).all()) and bool((maps.cos[0, 0, 8:] == 1).all())  # the pass-through half
    spans = _spans()
    got, ref, orig = _layer0_keys_after_rerotation(m, spans, StreamingLLM(**SMALL), 12)
    assert torch.allclose(got, ref, atol=1e-5) and not torch.allclose(orig, ref, atol=1e-3)


@dataclasses.dataclass(frozen=True)
class _Broken(H2O):
    def scores(self, ev):
        raise RuntimeError("this policy always fails")


@pytest.mark.parametrize("batch", [False, True])
def test_a_failing_policy_is_recorded_and_the_others_run(batch):
    m = _model("llama")
    spans = _spans()
    pols = [SnapKV(**SMALL), _Broken(**SMALL), StreamingLLM(**SMALL)]
    res = run_policies(m, spans, pols, [6], 3, progress=False, batch=batch)
    assert [r.policy for r in res] == ["snapkv", "h2o", "streaming"]
    assert res[1].error == "RuntimeError: this policy always fails" and res[1].ids == []
    assert res[0].error is None and res[2].error is None and len(res[0].ids) == len(res[2].ids) == 3
    assert res[1].to_frame().error.iloc[0].startswith("RuntimeError")


def test_a_policy_the_family_cannot_serve_is_refused_at_prepare(monkeypatch):
    m = _model("llama")
    spans = _spans()
    fam = families.family_of(m)
    monkeypatch.setitem(families._BY_TYPE, "llama", dataclasses.replace(fam, rotary="complex rotary frequencies"))
    pol = ExpectedAttention(**SMALL, n_future=8)
    with pytest.raises(ValueError, match="policy: ExpectedAttention cannot run on llama: .*complex rotary frequencies"):
        EvictionSession.prepare(m, spans, pol.needs(), 2, progress=False)
    with pytest.raises(ValueError, match="rerotate: not available for llama: complex rotary"):
        EvictionSession.prepare(m, spans, Needs(), 2, progress=False).run(StreamingLLM(**SMALL), 12, rerotate=True)
    res = run_policies(m, spans, [pol, SnapKV(**SMALL)], [6], 2, progress=False)
    assert res[0].error.startswith("policy: ExpectedAttention cannot run on llama") and res[1].error is None
