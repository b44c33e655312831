"""One figure of every figure function of :mod:`workbench.show.plots`, on synthetic inputs shaped like the
default model (9 query heads in 3 KV groups), for the layout and colour tests."""
from __future__ import annotations

import itertools

import pandas as pd
import torch

from workbench.analyse.audit import hoeffding_b
from workbench.analyse.cost import CostModel
from workbench.analyse.counterexample import ShallowCounterexample, deletion_sweep
from workbench.analyse.divergence import logit_divergence
from workbench.analyse.envelope import envelope, envelope_all_layers
from workbench.analyse.pages import PageSelection
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.pooling import HeadPooling
from workbench.analyse.priorities import mass_only_priorities, per_head_max_priorities
from workbench.analyse.procedure import trace
from workbench.analyse.selection import GreedySelection, mass_table
from workbench.analyse.shift import ShiftAnalysis
from workbench.capture.data import Capture
from workbench.rerun.eviction import DeferKV, GenerationResult, compare_kept
from workbench.rerun.stability import StabilityResult
from workbench.run.adapter import ModelShape
from workbench.run.spans import PromptSpans
from workbench.show import plots

#: Every public figure function of workbench.show.plots (tests check this list is complete).
FIGURE_FUNCTIONS = ("sink_mass_heatmap", "attention_strip", "head_heatmap", "residual_distribution",
                    "chunk_priorities", "envelope_rows", "certificate", "trace_layers", "drift", "break_even",
                    "pages", "shift_steps", "kept_positions", "accuracy_vs_budget", "kv_bytes_table",
                    "token_attention", "kept_compare",
                    "shift_gains", "page_union_bounds", "deferkv_weights",
                    "counterexample_rows", "counterexample_logits", "counterexample_errors",
                    "pooled_measure", "head_weights", "answer_rank", "removal_budget", "envelope_scatter",
                    "hoeffding_radius", "answer_divergence")


def synthetic_inputs(L: int = 12, H_Q: int = 9, G: int = 3):
    sp = PromptSpans.synthetic([12, 10, 14, 9, 11, 8], query_len=10, answer_doc=2)
    T = sp.T
    cap = Capture.synthetic(sp, L=L, H_Q=H_Q, G=G, seed=1, concentration=2.0,
                            extra_rows={"audit": list(range(sp.query[0], sp.query[1])),
                                        "tail": list(range(T - 8, T)), "decode": list(range(T, T + 4))})
    params = EntroPrefillParams(target=0.2, eps_row=0.5, eps_audit=0.9, streak=0)
    tr = trace(cap, params)
    return sp, cap, params, tr


def _gen(policy, B, T, seed, L=3, G=3):
    g = torch.Generator().manual_seed(seed)
    kept = torch.stack([torch.stack([torch.sort(torch.randperm(T, generator=g)[:B]).values for _ in range(G)])
                        for _ in range(L)])
    return GenerationResult(policy=policy, params={"n_sink": 4, "recent": 8}, budget=B, T=T, ids=[1, 2], text="x",
                            kept=kept, evicted_at=0, compacted_layers=tuple(range(L)), kv_bytes_before=1000,
                            kv_bytes_after=500, timings={})


def sweep_frame() -> pd.DataFrame:
    rows = []
    for method, budgets in (("full", [None]), ("deferkv", [32, 64, 128]), ("h2o", [32, 64, 128]),
                            ("snapkv", [32, 64, 128]), ("streaming", [32, 64, 128])):
        for b in budgets:
            for item in range(3):
                rows.append({"model": "m", "task": "squad", "item_id": item, "method": method, "p_budget": b,
                             "f1": (0.3 + 0.2 * item + (b or 256) / 512) % 1.0, "em": item % 2,
                             "kv_bytes": (b or 256) * 2**12, "retained_tokens": b or 256, "prompt_tokens": 256})
    return pd.DataFrame(rows)


def sensitivity_frames(cap, tr, layer: int) -> dict:
    """The tidy frames of the :mod:`workbench.show.plots.sensitivity` figures, computed as notebooks 02, 03 and
    05 compute them: ``{"head_weights": …, "answer_rank": …, "removal_budget": …, "hoeffding_radius": …}``."""
    sp, pool = cap.spans, tr.pooling
    w = [dict(zeta=z, tau=t, head=f"h{h} (g{g})", w=float(HeadPooling(zeta=z, tau=t)(cap).w[layer, h]))
         for z in (1.0, 0.5, 0.2, 0.05) for t in (0.1, 0.3, 1.0, 3.0) for h, g in enumerate(cap.head_group.tolist())]
    ans = sp.chunk_doc.index(sp.answer_doc)
    S = {"Rényi": tr.priorities.S, "mass only": mass_only_priorities(pool.mu, sp).S,
         "per-head max": per_head_max_priorities(pool.a, sp)}
    ranks = [dict(layer=l, method=m, rank=int((s[l] > s[l, ans]).sum())) for m, s in S.items() for l in range(cap.L)]
    m = mass_table(cap.observer_attn(), sp)[layer]
    sels = [(e, GreedySelection(target=t, eps_row=e, m0=1).select(tr.priorities.S[layer], sp.n, m))
            for e in (0.05, 0.2, 0.4) for t in (0.1, 0.3, 0.5)]
    budget = [dict(eps_row=e, target=r.target_tokens, D=r.D, U=r.U) for e, r in sels]
    b = [dict(m_a=n, delta=d, b=hoeffding_b(n, d, 11, cap.H_Q)) for n in (8, 32, 128, 512) for d in (0.01, 0.2)]
    return {"head_weights": pd.DataFrame(w), "answer_rank": pd.DataFrame(ranks), "removal_budget": pd.DataFrame(budget),
            "hoeffding_radius": pd.DataFrame(b)}


def every_removal(cap, pool, layer: int, size: int = 2) -> tuple[list, list]:
    """``(removals, envelopes)``: every union of up to ``size`` chunks at ``layer`` and its envelope (notebook 04)."""
    sp = cap.spans
    Es = [E for n in range(1, size + 1) for E in itertools.combinations(range(sp.k), n)]
    A = cap.observer_attn()[layer]
    return Es, [envelope(A, pool.mu[layer], pool.omega[layer], sp.removal_mask(E), layer=layer) for E in Es]


def divergences():
    """Two :class:`AnswerDivergence` on one 12-token answer (synthetic logits; ``A`` parts at token 5)."""
    g = torch.Generator().manual_seed(4)
    full = torch.randn(12, 40, generator=g, dtype=torch.float64) * 3
    ids = full.argmax(-1).tolist()
    toks = [" The", " V", "ell", "mar", " lighthouse", " was", " first", " lit", " in", " ", "1", "8"]
    a = full + torch.randn(12, 40, generator=g, dtype=torch.float64) * 0.4
    b = full + torch.randn(12, 40, generator=g, dtype=torch.float64) * 1.2
    other = ids[:5] + [(ids[5] + 1) % 40] + ids[6:]
    return (logit_divergence(full, a, ids, other_ids=other, tokens=toks, label="streaming, B = 40"),
            logit_divergence(full, b, ids, tokens=toks, label="snapkv, B = 48"))


def all_figures(L: int = 12, H_Q: int = 9, G: int = 3) -> dict:
    """``{function name: figure}`` for every name in :data:`FIGURE_FUNCTIONS` (several views of some)."""
    sp, cap, params, tr = synthetic_inputs(L, H_Q, G)
    pool, prio = tr.pooling, tr.priorities
    l = tr.l_star
    envs = envelope_all_layers(cap, pool, {l: tr.removed})
    st = StabilityResult(l_star=1, drift={2: 0.1, 3: 0.3, 4: 0.5, 5: 0.4}, Delta_L=0.4, margin=2.0, Lambda=3.0,
                         c_final=1.0, certified=True, agree_first_token=True, full_first_token=5, pruned_first_token=5,
                         defects={2: 0.05, 3: 0.1, 4: 0.2, 5: 0.1}, K={2: 3.0, 3: 4.0, 4: 5.0, 5: 5.0},
                         composed_bound=10.0)
    shape = ModelShape(L=30, H_Q=9, G=3, d=64, hidden=576, intermediate=1536, vocab=49152, max_context=8192,
                       model_type="llama")
    grid = CostModel(shape).grid(2000, [0, 4, 8, 12, 16, 20, 24, 28, 29], [0.25, 0.5, 0.75, 1.0], rows=40)
    pr = PageSelection(b=8, K=3, s=16).select(pool.a, pool.w, cap.head_group, d=64)
    sh = ShiftAnalysis(k=8)(cap)
    res = [_gen("streaming", 20, sp.T, 0), _gen("deferkv", 25, sp.T, 1), _gen("snapkv", 30, sp.T, 2)]
    df = sweep_frame()
    ce = ShallowCounterexample()()
    fr = sensitivity_frames(cap, tr, l)
    Es, envs_E = every_removal(cap, pool, l)
    return {
        "sink_mass_heatmap": plots.sink_mass_heatmap(cap),
        "attention_strip": plots.attention_strip(cap, 2, 4),
        "head_heatmap": plots.head_heatmap(pool, "w", model_id=cap.model_id, params=params),
        "residual_distribution": plots.residual_distribution(pool, 2, cap),
        "chunk_priorities": plots.chunk_priorities(prio, sp, l, removed=tr),
        "envelope_rows": plots.envelope_rows(envs, layer=l),
        "certificate": plots.certificate(tr),
        "trace_layers": plots.trace_layers(tr),
        "drift": plots.drift(st, model_id="m"),
        "break_even": plots.break_even(grid, model_id="m"),
        "pages": plots.pages(pr, 2, cap),
        "shift_steps": plots.shift_steps(sh),
        "shift_steps-head": plots.shift_steps(sh, level="head", layer=2),
        "shift_gains": plots.shift_gains(sh, held_out=ShiftAnalysis(k=8, ref_start=2)(cap)),
        "page_union_bounds": plots.page_union_bounds(PageSelection(b=8, K=3, s=16).union_by_K(
            [1, 2, 4, 8], pool.a, pool.w, cap.head_group, d=64)),
        "deferkv_weights": plots.deferkv_weights([DeferKV(window=8, lam=lam) for lam in (0.0, 0.1, 1.0)]),
        "counterexample_rows": plots.counterexample_rows(ce),
        "counterexample_logits": plots.counterexample_logits(ce),
        "counterexample_errors": plots.counterexample_errors(deletion_sweep([1e-1, 1e-4, 1e-8], [0.3, 0.05])),
        "kept_positions": plots.kept_positions(res, sp, highlight=[30, 31]),
        "accuracy_vs_budget": plots.accuracy_vs_budget(df, metric="f1"),
        "kv_bytes_table": plots.kv_bytes_table(df),
        "token_attention": plots.token_attention(cap, 2, head=4, removed=tr, removed_layer=l, log=True),
        "token_attention-row": plots.token_attention(cap, 2, query=int(cap.rows_of("tail")[0]), group=1,
                                                     removed=res[0], exclude_sinks=True),
        "kept_compare": plots.kept_compare(compare_kept(res[1], res[2]), sp),
        "kept_compare-layer": plots.kept_compare(compare_kept(res[1], res[2], layer=1, group=0), sp, per_page=48,
                                                 page=1),
        "pooled_measure": plots.pooled_measure(pool, l, sp, model_id=cap.model_id),
        "head_weights": plots.head_weights(fr["head_weights"], layer=l),
        "answer_rank": plots.answer_rank(fr["answer_rank"], answer_chunk=2),
        "removal_budget": plots.removal_budget(fr["removal_budget"], layer=l),
        "envelope_scatter": plots.envelope_scatter(envs_E, removals=Es),
        "hoeffding_radius": plots.hoeffding_radius(fr["hoeffding_radius"], eps_audit=0.2, J=11, H_Q=9),
        "answer_divergence": plots.answer_divergence(divergences()[0], model_id="m"),
        "answer_divergence-compare": plots.answer_divergence(*divergences(), model_id="m"),
    }
