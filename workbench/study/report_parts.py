"""The report's model parts (:mod:`workbench.study.report`): the bundled example's capture and trace, and the
needle prompt under every eviction policy from one shared prefill."""
from __future__ import annotations

import re

import pandas as pd

from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.procedure import trace
from workbench.capture import RowSet, run_capture
from workbench.rerun import eviction
from workbench.rerun.divergence import answer_divergences
from workbench.run.examples import load_example
from workbench.show import plots
from workbench.show.export import prompt_hash
from workbench.study.report_config import ReportConfig
from workbench.study.tasks import max_new_tokens_for

__all__ = ["capture_part", "needle_part", "needle_sentence", "divergence_part"]


def needle_sentence(item) -> str:
    """The needle's sentence in its haystack (the answer alone when the sentence is not found)."""
    doc = item.documents[item.answer_doc]
    m = re.search(r"The secret number of the [^.]*? is \d+\.", doc)
    return m.group(0) if m else item.answers[0]


def capture_part(cfg: ReportConfig, lm):
    """The bundled example captured and traced: its figures, tables, notes and prompt info (module docstring, 1)."""

    prompt = load_example().build(lm.tokenizer, max_context=lm.shape.max_context)
    cap = run_capture(lm, prompt, RowSet(tail=cfg.capture_tail, n_decode=cfg.capture_decode), progress=cfg.progress)
    params = EntroPrefillParams(**{k: v for k, v in cfg.entroprefill_settings()[0].items() if k != "layer"})
    tr = trace(cap, params)
    tf = tr.to_frame()
    valid = [int(l) for l in tf.loc[tf["valid"].astype(bool), "layer"]]
    layer = tr.l_star if tr.l_star is not None and tr.l_star >= 0 else (valid[-1] if valid else cap.L - 1)
    pool = tr.pooling
    head = int(pool.w[layer].argmax()) if getattr(pool, "w", None) is not None else 0
    figs = {
        "sink_mass": plots.sink_mass_heatmap(cap),
        "attention_strip": plots.attention_strip(cap, layer, head),
        "head_weights": plots.head_heatmap(pool, "w", model_id=cap.model_id),
        "chunk_priorities": plots.chunk_priorities(tr.priorities, cap.spans, layer, removed=tr, model_id=cap.model_id),
        "trace_layers": plots.trace_layers(tr),
    }
    if tr.selections:
        figs["certificate"] = plots.certificate(tr)
    tabs = {"trace": tr.to_frame(), "priorities": tr.priorities.to_frame(), "head_pooling": pool.to_frame()}
    answer = lm.tokenizer.decode(cap.generated_ids) if cap.generated_ids else ""
    notes = {"trace": f"{tr.decision} (capture of the bundled example: T = {cap.T}, k = {cap.spans.k} chunks, "
                      f"greedy continuation {answer!r}; figures at layer {layer}, head {head})",
             "sink_mass": "Attention mass the observer rows put on the first tokens (sinks), per layer and head.",
             "attention_strip": f"Layer {layer}, head {head} (its largest head weight w), mean of the observer rows.",
             "head_weights": "Head weights w of the sink-isolated Rényi pooling (SPEC §2).",
             "chunk_priorities": f"Chunk priorities S, ℓ, κ at layer {layer}; removed chunks in vermillion.",
             "trace_layers": "The per-layer 7-step decision (validity, D_l, U_l, stability streak, audit).",
             "certificate": "Greedy removal D_l against the dual certificate U_l, per monitored layer."}
    info = {"prompt_hash": prompt_hash(prompt), "example_T": cap.T, "decision": tr.decision, "layer": layer,
            "head": head}
    return figs, tabs, notes, info


def needle_part(cfg: ReportConfig, lm, item):
    """The needle prompt under every policy from one shared prefill: its figure, survival table and note (3)."""

    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    pols = [eviction.policy_from_params("full")] + [eviction.policy_from_params(p) for p in cfg.policies]
    budgets = sorted({eviction.resolve_budget(prompt.T, budget_frac=f) for f in cfg.budget_fracs})
    results = eviction.run_policies(lm, prompt, pols, budgets, cfg.max_new_tokens or max_new_tokens_for(item.task),
                                      progress=cfg.progress)
    sentence = needle_sentence(item)
    positions = eviction.token_positions(prompt, lm.tokenizer, sentence)
    surv = eviction.survival_table(results, positions, answer=item.answers[0])
    surv.insert(0, "item_id", item.item_id)
    figs = {"kept_positions": plots.kept_positions(results, prompt, highlight=positions, highlight_name="needle",
                                                     model_id=lm.model_id)}
    note = (f"Needle {sentence!r} ({len(positions)} tokens) in a {prompt.T}-token haystack; every policy at budgets "
            f"{budgets} from one shared prefill; kept_mean = fraction of needle tokens kept (mean over layers and KV "
            f"groups); correct = the answer {item.answers[0]!r} occurs in the reply.")
    return figs, {"needle_survival": surv}, note


def divergence_part(cfg: ReportConfig, lm, items):
    """What each eviction policy changed in the answer, per task family (its first prompt, the smallest budget
    fraction): mean KL over the full-cache answer's tokens and the first token where the greedy answers part.
    A policy that cannot run there (refused, a budget under its protected count) is a row with its error, not a
    number. Returns ``(table, note)``."""
    rows = []
    frac = min(cfg.budget_fracs)
    first: dict = {}
    for it in items:
        first.setdefault(it.task, it)
    for item in first.values():
        prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
        B = eviction.resolve_budget(prompt.T, budget_frac=frac)
        n = cfg.max_new_tokens or max_new_tokens_for(item.task)
        base = [{"task": item.task, "item_id": item.item_id, "method": name, "budget": B, "T": prompt.T}
                for name in cfg.policies]
        try:  # one shared prefill and full-cache answer for every policy of the item
            found = answer_divergences(lm, prompt, [(eviction.policy_from_params(r["method"]), B) for r in base],
                                       max_new_tokens=n)
            for row, d in zip(base, found):
                row.update(n_answer=d.n, mean_kl=d.mean_kl, first_divergence=d.first_divergence, error=None)
        except Exception:  # noqa: BLE001 - a policy refused or failed there: each alone, so the others still get theirs
            for row in base:
                try:
                    d = answer_divergences(lm, prompt, [(eviction.policy_from_params(row["method"]), B)],
                                           max_new_tokens=n)[0]
                    row.update(n_answer=d.n, mean_kl=d.mean_kl, first_divergence=d.first_divergence, error=None)
                except Exception as e:  # noqa: BLE001 - a failed policy is a row with its error, never a number
                    row.update(n_answer=None, mean_kl=None, first_divergence=None,
                               error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
        rows += base
    note = (f"Per family (its first prompt) and eviction policy at the smallest budget fraction {frac:g}: the "
            "compressed run teacher-forced on the full-cache answer; mean_kl = mean over the answer's tokens of "
            "KL(p_full ‖ p_compressed) in nats; first_divergence = the first answer token (0-based) where the greedy "
            "answers part (empty: they agree); error: why the policy did not run.")
    return pd.DataFrame(rows), note
