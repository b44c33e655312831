"""KV eviction policies (SPEC §9): selection invariants, exact compacted decoding, oracles, needle."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.capture import capture_attention
from workbench.rerun.eviction import (
    ALL_POLICIES,
    CLASSIC,
    H2O,
    AdaKV,
    DeferKV,
    EvictionPolicy,
    EvictionSession,
    Evidence,
    ExpectedAttention,
    FullCache,
    Needs,
    OracleKV,
    PageEntroKV,
    RandomKV,
    SnapKV,
    StreamingLLM,
    default_policies,
    deferkv_alpha,
    every_policy,
    generate_with_policy,
    protected_mask,
    run_policies,
    select_keep,
    survival_table,
    token_positions,
)
from workbench.run import adapter
from workbench.run.examples import DATA_DIR, load_example
from workbench.run.models import tiny_model
from workbench.run.prompt import build_prompt
from workbench.run.spans import PromptSpans

SMALL = dict(n_sink=2, recent=4)


def _small_policies():
    """Every policy with parameters that fit a ~50-token prompt."""
    return [FullCache(), StreamingLLM(**SMALL), H2O(**SMALL), SnapKV(**SMALL, window=8, kernel=3),
            DeferKV(**SMALL, window=8, kernel=3), PageEntroKV(**SMALL, page=4), RandomKV(**SMALL, seed=3),
            OracleKV(**SMALL)]


def _spans():
    return PromptSpans.synthetic([10, 12, 9], query_len=8)  # T = 51


def _by(results, name, budget=None):
    return [r for r in results if r.policy == name and (budget is None or r.budget == budget)]


# ----------------------------------------------------------------------------- shared selection step
@settings(max_examples=examples(80), deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 40), n_sink=st.integers(0, 6), recent=st.integers(0, 8),
       extra=st.integers(0, 40), levels=st.sampled_from([2, 5, 1000]), use_tb=st.booleans())
def test_select_keep_properties(seed, T, n_sink, recent, extra, levels, use_tb):
    g = torch.Generator().manual_seed(seed)
    L, G = 2, 3
    prot = protected_mask(T, n_sink, recent)
    B = int(prot.sum()) + extra
    if B == 0:
        B = 1
    scores = torch.randint(0, levels, (L, G, T), generator=g).double()  # many ties when levels is small
    tb = torch.randint(0, 3, (L, G, T), generator=g).double() if use_tb else None
    keep = select_keep(scores, B, prot, tb)
    assert keep.shape == (L, G, min(B, T))
    assert (keep[..., 1:] > keep[..., :-1]).all()  # sorted, no duplicates
    for l in range(L):
        for gg in range(G):
            kept = set(keep[l, gg].tolist())
            assert set(torch.nonzero(prot).flatten().tolist()) <= kept
            # optimality: every kept candidate ranks above every dropped one (score, tie-break, -position)
            key = lambda j: (float(scores[l, gg, j]), float(tb[l, gg, j]) if tb is not None else 0.0, -j)
            cand_kept = [j for j in kept if not prot[j]]
            dropped = [j for j in range(T) if j not in kept]
            if cand_kept and dropped:
                assert min(key(j) for j in cand_kept) > max(key(j) for j in dropped)


def test_select_keep_budget_errors():
    prot = protected_mask(50, 4, 32)
    with pytest.raises(ValueError, match=r"budget: must be >= 36 \(the protected"):
        select_keep(torch.rand(1, 1, 50), 35, prot)
    assert select_keep(torch.rand(1, 1, 50), 35 + 15, prot).shape == (1, 1, 50)  # B >= T keeps all
    with pytest.raises(ValueError, match="budget: must be an integer >= 1"):
        select_keep(torch.rand(1, 1, 50), 0, prot)
    with pytest.raises(ValueError, match="NaN"):
        select_keep(torch.full((1, 1, 50), float("nan")), 40, prot)


def test_policy_parameter_validation():
    with pytest.raises(ValueError, match="n_sink: must be an integer >= 0"):
        StreamingLLM(n_sink=-1)
    with pytest.raises(ValueError, match="kernel: must be an odd integer"):
        SnapKV(kernel=4)
    with pytest.raises(ValueError, match="window: must be an integer >= 1"):
        DeferKV(window=0)
    with pytest.raises(ValueError, match=r"decode_weight: must be None or in \[0, 1\]"):
        DeferKV(decode_weight=1.5)
    with pytest.raises(ValueError, match="lam: must be"):
        DeferKV(lam=float("nan"))
    with pytest.raises(ValueError, match="zeta"):
        PageEntroKV(zeta=0.0)
    with pytest.raises(ValueError, match="page: must be an integer >= 1"):
        PageEntroKV(page=0)
    with pytest.raises(ValueError, match="seed"):
        RandomKV(seed=-3)
    with pytest.raises(ValueError, match="pooling"):
        SnapKV(pooling="mean")
    with pytest.raises(ValueError, match="normalise"):
        H2O(normalise="avg")
    with pytest.raises(ValueError, match="n_sink"):
        ExpectedAttention(n_sink=17)  # the statistics keep the first 16 queries apart
    with pytest.raises(ValueError, match="alpha_safeguard"):
        AdaKV(alpha_safeguard=1.5)
    assert [type(p) for p in default_policies()] == list(CLASSIC)  # the eight of SPEC §9
    assert {type(p) for p in every_policy()} == set(ALL_POLICIES)
    assert default_policies(n_sink=7)[1].n_sink == 7
    assert every_policy(n_sink=7, recent=9)[-1].base == SnapKV(n_sink=7, recent=9)


def test_deferkv_alpha():
    a = deferkv_alpha(4, 0.5)
    assert a.shape == (5,) and math.isclose(float(a.sum()), 1.0)
    assert torch.allclose(a[1:] / a[:-1], torch.full((4,), math.exp(0.5), dtype=torch.float64))
    assert torch.allclose(deferkv_alpha(4, 0.0), torch.full((5,), 0.2, dtype=torch.float64))
    b = deferkv_alpha(4, 0.0, decode_weight=0.0)
    assert b.tolist() == [0.25, 0.25, 0.25, 0.25, 0.0]
    c = deferkv_alpha(3, 1.0, decode_weight=0.4)
    assert math.isclose(float(c[-1]), 0.4) and math.isclose(float(c[:-1].sum()), 0.6)


# ----------------------------------------------------------------------------- H2O accumulator
@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_h2o_column_sums_equal_eager(model_type):
    model = tiny_model(model_type, G=2, H_Q=4, L=2, seed=5)
    spans = _spans()
    T = spans.T
    ids = torch.tensor([list(spans.input_ids)])
    with torch.no_grad(), capture_attention(model, [T - 1], K=T, T=T, colsum=True, colsum_tile=7) as rec:
        rec.positions = torch.arange(T)
        adapter.forward(model, ids, cache=adapter.new_cache(model), logits_to_keep=1)
    out = adapter.eager_attentions(model, ids)
    ref = torch.stack([a[0].double().sum(1) for a in out.attentions])  # [L, H, T]: Σ_u A_{u,j}
    assert rec.colsum.shape == ref.shape
    assert (rec.colsum - ref).abs().max().item() < 1e-5
    assert torch.allclose(rec.colsum.sum(-1), torch.full((2, 4), float(T), dtype=torch.float64), atol=1e-4)
    if model_type == "gemma3":  # layer 0 slides over 8 keys: key 0 is seen by queries 0..7 only
        assert rec.colsum[0, :, 0].max() < 8.0 and rec.colsum[1, :, 0].min() > 0


# ----------------------------------------------------------------------------- tiny models: generation
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma3"])
def test_budget_at_least_T_reproduces_full_cache(model_type):
    model = tiny_model(model_type, G=2, H_Q=4, L=3, seed=11)
    spans = _spans()
    T = spans.T
    res = run_policies(model, spans, _small_policies(), [T, T + 9], 8, progress=False)
    with torch.no_grad():
        g = model.generate(torch.tensor([list(spans.input_ids)]), max_new_tokens=8, do_sample=False)
    ref = g[0, T:].tolist()
    assert len(res) == 1 + 7 * 2
    for r in res:
        assert r.ids == ref, (r.policy, r.budget)
        assert r.kv_bytes_after == r.kv_bytes_before


def test_batched_decoding_equals_unbatched():
    model = tiny_model("qwen2", G=2, H_Q=4, L=2, seed=8)
    spans = _spans()
    kw = dict(progress=False, keep_logits=True)
    a = run_policies(model, spans, _small_policies(), [12, 20], 7, **kw)
    b = run_policies(model, spans, _small_policies(), [12, 20], 7, batch=True, **kw)
    assert max(r.timings["batch"] for r in b) == 7 and all(r.timings["batch"] == 1 for r in a)
    for x, y in zip(a, b):
        assert (x.policy, x.budget, x.ids) == (y.policy, y.budget, y.ids)
        assert torch.equal(x.kept, y.kept)
        assert (x.logits - y.logits).abs().max().item() < 1e-5


def test_policy_invariants_on_tiny_llama():
    model = tiny_model("llama", G=2, H_Q=4, L=3, seed=2)
    spans = _spans()
    T, B = spans.T, 14
    shape = adapter.model_shape(model)
    pols = _small_policies() + [DeferKV(**SMALL, window=8, kernel=3, lam=0.0, decode_weight=0.0)]
    res = run_policies(model, spans, pols, [B], 6, progress=False)
    prot = set(torch.nonzero(protected_mask(T, 2, 4)).flatten().tolist())
    for r in res:
        if r.policy == "full":
            continue
        S = B + r.evicted_at
        assert r.kept.shape == (3, 2, S)
        assert (r.kept[..., 1:] > r.kept[..., :-1]).all()
        assert r.compacted_layers == (0, 1, 2)
        for row in r.kept_prompt.reshape(-1, B).tolist():
            assert prot <= set(row) and max(row) < T
        # bytes: every layer holds S entries of [G, d] keys and values in fp32
        assert r.kv_bytes_after == 2 * shape.L * shape.G * shape.d * 4 * S
        assert r.kv_bytes_before == 2 * shape.L * shape.G * shape.d * 4 * (T + r.evicted_at)
        assert len(r.ids) == 6 and len(r.step_s) == 6 - 1 - r.evicted_at
    d0, d1 = _by(res, "deferkv")
    assert (d0.kept[..., -1] == T).all() and d0.evicted_at == 1  # the generated token is kept
    snap = _by(res, "snapkv")[0]
    assert torch.equal(d1.kept_prompt, snap.kept_prompt)  # all weight on the prompt tail = SnapKV
    assert not torch.equal(d0.kept_prompt, snap.kept_prompt)  # the decode row changes the selection
    st_ = _by(res, "streaming")[0]
    expect = list(range(2)) + list(range(T - (B - 2), T))
    assert (st_.kept_prompt == torch.tensor(expect)).all()
    # Page-EntroKV takes whole pages: at most one page per (layer, group) is partly kept
    pe = _by(res, "page-entrokv")[0]
    for row in pe.kept_prompt.reshape(-1, B).tolist():
        pages = {}
        for j in range(T):
            if j not in prot:
                pages.setdefault(j // 4, []).append(j in row)
        partial = [p for p, v in pages.items() if any(v) and not all(v)]
        assert len(partial) <= 1
    frame = pd.concat([r.to_frame() for r in res], ignore_index=True)
    assert set(frame.policy) == {p.name for p in pols}
    assert (frame.loc[frame.policy != "full", "kv_ratio"] < 0.35).all()


@dataclass(frozen=True)
class _PerGroup(EvictionPolicy):
    """Test policy: fixed random scores that differ per KV group but not per layer."""

    n_sink: int = 2
    recent: int = 3
    name: ClassVar[str] = "per-group"

    def scores(self, ev: Evidence) -> torch.Tensor:
        g = torch.Generator().manual_seed(7)
        return torch.rand(ev.G, ev.T, generator=g, dtype=torch.float64).expand(ev.L, ev.G, ev.T)


def _masked_reference(model, ids, T, keep_g, head_group, positions=None):
    """Logits of one eager forward over prompt + generated tokens where decode rows (u >= T) of the
    full-attention layers see only the kept prompt keys of their KV group; sliding layers keep their window."""
    N = ids.shape[1]
    u = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    causal = j <= u
    H = head_group.numel()
    allowed = causal.expand(H, N, N).clone()
    for h in range(H):
        kept = torch.zeros(N, dtype=torch.bool)
        kept[keep_g[int(head_group[h])]] = True
        kept[T:] = True
        allowed[h, T:, :] &= kept[None, :]
    neg = torch.finfo(torch.float32).min
    full = torch.zeros(1, H, N, N).masked_fill(~allowed[None], neg)
    cfg = model.config
    kw = {}
    if positions is not None:
        kw["position_ids"] = positions[None]
    if getattr(cfg, "layer_types", None) and "sliding_attention" in cfg.layer_types:
        window = causal & (u - j < cfg.sliding_window)
        sliding = torch.zeros(1, 1, N, N).masked_fill(~window[None, None], neg)
        mask = {"full_attention": full, "sliding_attention": sliding}
    else:
        mask = full
    return adapter.eager_attentions(model, ids, attention_mask=mask, **kw).logits[0]


@pytest.mark.parametrize("model_type", ["llama", "gemma3"])
def test_compacted_decoding_is_exact_at_original_positions(model_type):
    """Decoding on the compacted cache equals attention restricted to the kept keys, at the original
    RoPE positions; renumbering the positions to the compacted length changes the logits."""
    model = tiny_model(model_type, G=2, H_Q=4, L=2, seed=4)
    spans = _spans()
    T, B, n = spans.T, 11, 6
    res = generate_with_policy(model, spans, _PerGroup(), B, n, keep_logits=True, progress=False)
    n = len(res.ids)  # generation stops early at EOS
    assert n >= 3 and res.logits.shape == (n, model.config.vocab_size)
    keep_g = res.kept_prompt[0]  # [G, B], the same in every layer
    assert not torch.equal(keep_g[0], keep_g[1])
    hg = adapter.model_shape(model).head_group()
    ids = torch.tensor([list(spans.input_ids) + res.ids[:-1]])
    ref = _masked_reference(model, ids, T, keep_g, hg)
    got = res.logits
    err = (ref[T - 1:] - got).abs().max().item()
    assert err < 1e-4, err
    assert set(res.compacted_layers) == {0, 1}  # sliding-window layers too (B = 11 >= their window: all kept)
    # negative control: positions renumbered to the compacted cache length
    pos = torch.cat([torch.arange(T), torch.arange(B, B + n - 1)])
    wrong = _masked_reference(model, ids, T, keep_g, hg, positions=pos)
    assert (wrong[T:] - got[1:]).abs().max().item() > 1e-3


def test_session_errors():
    model = tiny_model("llama", G=2, H_Q=4, L=2)
    spans = _spans()
    with pytest.raises(ValueError, match="max_new_tokens: must be an integer >= 1"):
        generate_with_policy(model, spans, StreamingLLM(), 40, 0)
    sess = EvictionSession.prepare(model, spans, Needs(tail=8), 3, progress=False)
    with pytest.raises(ValueError, match="needs"):
        sess.run(H2O(**SMALL), 20)
    with pytest.raises(ValueError, match=r"budget: must be >= 6"):
        sess.run(SnapKV(**SMALL, window=8), 5)
    with pytest.raises(ValueError, match="policy: must be an EvictionPolicy"):
        sess.run("snapkv", 20)
    r = sess.run(SnapKV(**SMALL, window=8), 20)  # reusable: a second run works
    assert r.kept.shape[-1] == 20 and sess.run(StreamingLLM(**SMALL), 20).kept.shape[-1] == 20


# ----------------------------------------------------------------------------- the default model
B_REAL = 96
on_model = pytest.mark.model


@pytest.fixture(scope="module")
def example_runs(smollm, example_prompt):
    pols = default_policies() + [DeferKV(lam=0.0, decode_weight=0.0)]
    return run_policies(smollm, example_prompt, pols, [B_REAL, example_prompt.T], 5, progress=False, batch=True)


def _maxpool_ref(x, k):
    pad = k // 2
    return F.pad(x, (pad, pad), value=float("-inf")).unfold(-1, k, 1).amax(-1)


def _assert_same_selection(kept, score, B, n_sink, recent, tol=1e-6):
    """``kept [L, G, B]`` equals protected + top-(B - |protected|) of ``score [L, G, T]``, up to near-ties."""
    L, G, T = score.shape
    prot = torch.zeros(T, dtype=torch.bool)
    prot[:n_sink] = True
    prot[T - recent:] = True
    m = B - int(prot.sum())
    bad = 0
    for l in range(L):
        for g in range(G):
            s = score[l, g].masked_fill(prot, float("-inf"))
            top = torch.sort(s, descending=True, stable=True).indices[:m]  # ties (max-pool): lower position
            ref = set(top.tolist()) | set(torch.nonzero(prot).flatten().tolist())
            got = set(kept[l, g].tolist())
            if ref != got:
                vals = torch.sort(s, descending=True).values
                cut = 0.5 * float(vals[m - 1] + vals[m])
                diff = torch.tensor(sorted(ref ^ got))
                assert (score[l, g, diff] - cut).abs().max().item() < tol, (l, g, sorted(ref ^ got))
                bad += 1
    assert bad <= 2  # near-ties at the budget boundary only


@on_model
def test_snapkv_and_h2o_equal_eager_reference(smollm, example_prompt, example_runs):
    out = adapter.eager_attentions(smollm.model, example_prompt.input_ids)
    A = torch.stack([a[0].double() for a in out.attentions])  # [L, H, T, T]
    L, H, T, _ = A.shape
    G = smollm.shape.G
    group = lambda x: x.reshape(L, G, H // G, T).mean(2)  # repeat_kv layout: heads g*r ... g*r + r-1
    snap_ref = _maxpool_ref(group(A[:, :, T - 32:, :].sum(2)), 7)
    h2o_ref = group(A.sum(2))
    for name, ref in (("snapkv", snap_ref), ("h2o", h2o_ref)):
        (res,) = _by(example_runs, name, B_REAL)
        assert res.kept_prompt.shape == (L, G, B_REAL)
        _assert_same_selection(res.kept_prompt, ref, B_REAL, 4, 32, tol=1e-6 * T)


@on_model
def test_real_model_invariants(smollm, example_prompt, example_runs):
    T = example_prompt.T
    with torch.no_grad():
        g = smollm.model.generate(example_prompt.input_ids, max_new_tokens=5, do_sample=False)
    full_ids = g[0, T:].tolist()
    prot = set(range(4)) | set(range(T - 32, T))
    for r in example_runs:
        if r.budget >= T or r.policy == "full":
            assert r.ids == full_ids, r.policy  # B >= T: exactly the full-cache tokens
            continue
        assert r.kept_prompt.shape == (30, 3, B_REAL)
        assert (r.kept[..., 1:] > r.kept[..., :-1]).all()
        for row in r.kept_prompt.reshape(-1, B_REAL).tolist():
            assert prot <= set(row)
    d_tail = [r for r in _by(example_runs, "deferkv", B_REAL) if r.params["decode_weight"] == 0.0][0]
    d_spec = [r for r in _by(example_runs, "deferkv", B_REAL) if r.params["decode_weight"] is None][0]
    snap = _by(example_runs, "snapkv", B_REAL)[0]
    assert torch.equal(d_tail.kept_prompt, snap.kept_prompt)
    assert not torch.equal(d_spec.kept_prompt, snap.kept_prompt)
    assert (d_spec.kept[..., -1] == T).all()


# ----------------------------------------------------------------------------- needle in a haystack
NEEDLE_BUDGETS = (128, 256, 512)


@pytest.mark.model
@pytest.mark.slow
def test_needle_in_a_haystack(smollm, capsys):
    ex = load_example("needle_haystack")
    meta = json.loads((DATA_DIR / "needle_haystack.json").read_text())
    prompt = ex.build(smollm.tokenizer, max_context=smollm.shape.max_context)
    T = prompt.T
    assert 1300 <= T <= 1700
    needle = token_positions(prompt, smollm.tokenizer, ex.answer)
    sentence = token_positions(prompt, smollm.tokenizer, meta["needle"])
    assert set(needle) <= set(sentence) and 0.3 * T < min(sentence) < max(sentence) < 0.7 * T  # in the middle
    res = run_policies(smollm, prompt, default_policies(), NEEDLE_BUDGETS, 20, progress=False, batch=True)
    table = survival_table(res, needle, ex.answer)
    with capsys.disabled():
        print(f"\n\nNeedle in a haystack (T = {T}, needle tokens {needle[0]}..{needle[-1]}, 20 new tokens):")
        print(table.to_string(index=False))
    full = table[table.policy == "full"].iloc[0]
    assert full.correct  # the model finds the needle with the whole context
    for r in res:
        if r.policy != "full":
            assert r.kept_prompt.shape[-1] == r.budget
    # StreamingLLM keeps sinks + the last B-4 positions: the needle (mid-prompt) never survives
    assert (table[table.policy == "streaming"].kept_mean == 0.0).all()
    # random scores keep a candidate with probability (B - 36) / (T - 36)
    for B in NEEDLE_BUDGETS:
        got = float(table[(table.policy == "random") & (table.budget == B)].kept_mean.iloc[0])
        assert abs(got - (B - 36) / (T - 36)) < 0.06, (B, got)


@on_model
def test_evidence_from_capture(smollm_capture):
    """Policies score a saved capture too (tail, decode and observer rows; no H2O sums)."""
    cap = smollm_capture
    ev = Evidence.from_capture(cap)
    T = cap.T
    assert ev.tail.shape == (30, 9, 32, T) and ev.decode.shape == (30, 9, 3, T)
    assert torch.allclose(ev.decode.sum(-1), torch.ones(30, 9, 3), atol=1e-5)
    d = DeferKV(kernel=1).scores(ev)
    # by hand for layer 3, group 1 (heads 3, 4, 5): Σ_r α_r A_{r,j} over the 32 tail rows and decode row 1
    a = deferkv_alpha(32, 0.1)
    rows = torch.cat([ev.tail[3, 3:6], ev.decode[3, 3:6, :1]], dim=1).double()  # [3, 33, T]
    ref = (rows * a[None, :, None]).sum(1).mean(0)
    assert torch.allclose(d[3, 1], ref, atol=1e-9)
    o = OracleKV().scores(ev)
    assert torch.allclose(o.sum(-1), torch.ones(30, 3, dtype=torch.float64), atol=1e-5)
    with pytest.raises(ValueError, match="colsum"):
        H2O().scores(ev)
    keep = select_keep(PageEntroKV().scores(ev), 64, PageEntroKV().protected(T), PageEntroKV().tiebreak(ev))
    assert keep.shape == (30, 3, 64)


@pytest.mark.model
def test_token_positions_within_a_passage(smollm):
    """An answer that a distractor also holds: ``within`` finds it in its own passage, not the first one."""
    tok = smollm.tokenizer
    docs = ("Lyon is a city, and Paris is larger.", "The capital of France is Paris, on the Seine.")
    prompt = build_prompt(tok, docs, "What is the capital of France?", "Answer briefly.", answer_doc=1)
    first = token_positions(prompt, tok, "Paris")
    inside = token_positions(prompt, tok, "Paris", within=docs[1])
    ids = prompt.spans.input_ids
    assert tok.decode([ids[t] for t in first]).strip() == "Paris"
    assert tok.decode([ids[t] for t in inside]).strip() == "Paris"
    assert min(inside) > max(first)  # the second passage's Paris, after the distractor's
    seine = token_positions(prompt, tok, "Seine")
    assert max(inside) < min(seine)  # and inside the gold passage
    with pytest.raises(ValueError, match="within"):
        token_positions(prompt, tok, "Paris", within="not in the prompt")
    with pytest.raises(ValueError, match="text"):
        token_positions(prompt, tok, "Berlin", within=docs[1])
