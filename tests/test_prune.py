"""Pruned prefill (SPEC §7): oracles on the real default model and on tiny random models."""
from __future__ import annotations

import pytest
import torch

from workbench.analyse.cost import CostModel, kv_bytes_dense
from workbench.analyse.params import EntroPrefillParams
from workbench.rerun.prune import run_full, run_pruned
from workbench.rerun.stability import stability
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

TOL = 1e-4


@pytest.fixture(scope="module")
def full_ref(smollm, example_prompt):
    return run_full(smollm, example_prompt, max_new_tokens=6, keep_hidden=True)


def test_empty_removal_reproduces_full_forward(smollm, example_prompt, full_ref):
    for layer in (-1, 7, 29):
        r = run_pruned(smollm, example_prompt, layer=layer, removed=[], max_new_tokens=6, progress=False)
        assert (r.first_logits - full_ref.first_logits).abs().max().item() <= TOL
        assert r.generated_ids == full_ref.generated_ids and r.T_prime == example_prompt.T


def test_pruning_before_layer0_equals_shortened_sequence(smollm, example_prompt):
    removed = [0, 2, 5]
    R = example_prompt.spans.retained_positions(removed)
    a = run_pruned(smollm, example_prompt, layer=-1, removed=removed, max_new_tokens=6, progress=False)
    b = run_full(smollm, example_prompt, positions=R, max_new_tokens=6)
    assert a.T_prime == len(R) < example_prompt.T
    assert (a.first_logits - b.first_logits).abs().max().item() <= TOL
    assert a.generated_ids == b.generated_ids
    # original position ids matter: renumbered positions give different logits
    from workbench.run.prompt import Prompt  # noqa: F401
    ids = torch.tensor([example_prompt.spans.input_ids])[:, R]
    with torch.no_grad():
        renum = smollm.model(ids, logits_to_keep=1).logits[0, -1]
    assert (renum - a.first_logits).abs().max().item() > 1e-3


def test_last_layer_pruning_only_shrinks_cache(smollm, example_prompt, full_ref):
    L = smollm.shape.L
    r = run_pruned(smollm, example_prompt, layer=L - 1, removed=[1, 3, 4], max_new_tokens=2, progress=False)
    assert (r.first_logits - full_ref.first_logits).abs().max().item() <= TOL
    assert r.generated_ids[0] == full_ref.generated_ids[0]
    # the cache after the prefill holds exactly the T' retained entries in every layer (fp32: e = 4)
    assert r.kv_bytes == kv_bytes_dense(smollm.shape, r.T_prime, 4) < kv_bytes_dense(smollm.shape, example_prompt.T, 4)
    # the full run is measured at the same moment (after the prefill; it decoded 6 tokens since)
    assert full_ref.kv_bytes == kv_bytes_dense(smollm.shape, example_prompt.T, 4)


def test_mid_layer_pruning_changes_computation_but_keeps_positions(smollm, example_prompt, full_ref):
    l = 24
    r = run_pruned(smollm, example_prompt, layer=l, removed=[0, 1, 2], max_new_tokens=4, keep_hidden=True,
                   progress=False)
    assert r.l_star == l and r.mode == "explicit"
    st = stability(smollm, full_ref, r)
    # the first block after the gather sees exactly the full trajectory restricted to R
    assert st.drift[l + 1] == 0.0
    # the drift one block later is exactly the deletion defect of that block
    assert st.drift[l + 2] == pytest.approx(st.defects[l + 2], rel=1e-4, abs=1e-4)
    assert st.Delta_L > 0 and st.margin > 0 and st.Lambda > 0
    # the certificate is sufficient: whenever it holds, the first tokens agree
    assert (not st.certified) or st.agree_first_token
    assert st.composed_bound >= st.Delta_L or st.composed_bound != st.composed_bound  # an upper bound, or NaN
    assert st.to_frame().shape[0] == smollm.shape.L - l


def test_adaptive_accepts_with_loose_thresholds_and_bypasses_with_tight(smollm, example_prompt, full_ref):
    loose = EntroPrefillParams(eps_row=0.5, target=0.2, streak=0, eps_audit=0.9, monitored=tuple(range(2, 12)))
    r = run_pruned(smollm, example_prompt, loose, max_new_tokens=4, progress=False)
    assert r.l_star is not None and r.mode == "adaptive"
    assert r.T_prime == example_prompt.T - sum(e - s for i, (s, e) in enumerate(example_prompt.spans.chunks)
                                                 if i in r.removed)
    assert r.trace.l_star == r.l_star and list(r.trace.removed) == r.removed  # the offline trace agrees
    tight = EntroPrefillParams(eps_row=1e-6, monitored=tuple(range(2, 12)))
    b = run_pruned(smollm, example_prompt, tight, max_new_tokens=4, progress=False)
    assert b.bypass and "bypass" in b.decision and b.T_prime == example_prompt.T
    assert b.generated_ids == full_ref.generated_ids[:4]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma3"])
def test_oracles_on_tiny_models(model_type):
    kw = dict(sliding_window=64) if model_type == "gemma3" else {}
    model = tiny_model(model_type, G=2, H_Q=4, L=4, seed=3, **kw)
    spans = PromptSpans.synthetic([5, 6, 7, 4], query_len=6)
    full = run_full(model, spans, max_new_tokens=4)
    e0 = run_pruned(model, spans, layer=1, removed=[], max_new_tokens=4, progress=False)
    assert (e0.first_logits - full.first_logits).abs().max().item() <= TOL and e0.generated_ids == full.generated_ids
    removed = [1, 3]
    R = spans.retained_positions(removed)
    a = run_pruned(model, spans, layer=-1, removed=removed, max_new_tokens=4, progress=False)
    b = run_full(model, spans, positions=R, max_new_tokens=4)
    assert (a.first_logits - b.first_logits).abs().max().item() <= TOL and a.generated_ids == b.generated_ids
    c = run_pruned(model, spans, layer=3, removed=removed, max_new_tokens=1, progress=False)
    assert (c.first_logits - full.first_logits).abs().max().item() <= TOL


def test_bad_input(smollm, example_prompt):
    s = example_prompt.spans
    prot = torch.zeros(s.T, dtype=torch.bool)
    prot[s.query[0]] = True
    with pytest.raises(ValueError, match="protected"):
        run_pruned(smollm, example_prompt, layer=3, removed=prot, progress=False)
    part = torch.zeros(s.T, dtype=torch.bool)
    part[s.chunks[0][0]] = True
    with pytest.raises(ValueError, match="in part"):
        run_pruned(smollm, example_prompt, layer=3, removed=part, progress=False)
    with pytest.raises(ValueError, match=r"layer: must be None or an integer in \[-1, 29\]"):
        run_pruned(smollm, example_prompt, layer=30, removed=[], progress=False)
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_pruned(smollm, example_prompt, layer=3, removed=[], max_new_tokens=0, progress=False)
    with pytest.raises(ValueError, match="removed: chunk index"):
        run_pruned(smollm, example_prompt, layer=3, removed=[99], progress=False)
    with pytest.raises(ValueError, match="needs a fixed layer"):
        run_pruned(smollm, example_prompt, removed=[1], progress=False)
    for l in (-1, 0):  # no monitored layer, so no proposal E_l: the removal set must be explicit
        with pytest.raises(ValueError, match=r"layer: the proposal E_l exists for monitored layers l in \[1, 29\]"):
            run_pruned(smollm, example_prompt, layer=l, progress=False)


def test_cost_model_matches_hand_count_and_break_even(smollm):
    cm = CostModel(smollm.shape)
    s = smollm.shape
    T = 100
    hand = (2 * T * 576 * (9 * 64 + 2 * 3 * 64) + 2 * T * 9 * 64 * 576 + 2 * T * 3 * 576 * 1536
            + 2 * 9 * 64 * T * (T + 1))
    assert cm.layer_flops(T) == pytest.approx(hand)
    assert cm.ratio(2048, 1.0, 10) == pytest.approx(1.0)
    assert cm.ratio(2048, 0.5, -1) < cm.ratio(2048, 0.5, 10) < cm.ratio(2048, 0.5, 28) < 1.0
    x = cm.break_even_keep_fraction(2048, 10, rows=24, monitored_executed=10)
    assert 0.9 < x < 1.0
    assert cm.ratio(2048, x, 10, 24, 10) == pytest.approx(1.0, abs=1e-9)
    g = cm.grid(2048, [-1, 9, 19], [0.25, 0.5, 1.0]).to_frame()
    assert g.shape[0] == 9 and (g["F_EP"] <= g["F_full"] + g["F_aux"]).all()
    assert kv_bytes_dense(s, 100, 2) == 2 * 2 * 30 * 3 * 64 * 100
