"""Question-agnostic eviction (kvpress's pipeline): compress the context without the question, then answer
several questions from the same compressed cache, resetting it after each answer. Against the usual
question-aware run (the whole prompt prefilled, then evicted) this measures what the question is worth to
a policy's scores."""
from __future__ import annotations

from workbench.checks import check_max_new_tokens, check_nonempty
from workbench.constraints import BUDGET
from workbench.rerun.eviction.evidence import Needs
from workbench.rerun.eviction.result import GenerationResult
from workbench.rerun.eviction.session import EvictionSession

__all__ = ["split_question", "run_question_agnostic"]


def split_question(prompt) -> tuple[list[int], list[int]]:
    """``(context ids, question ids)`` of a rendered prompt: everything before the user query's first token,
    and the rest (the query and the template's tail up to the answer)."""
    spans = getattr(prompt, "spans", prompt)
    if not hasattr(spans, "query") or not hasattr(spans, "input_ids"):
        raise ValueError("prompt: needs token spans (a Prompt or PromptSpans) to find the question")
    ids = list(spans.input_ids)
    q0 = int(spans.query[0])
    if not 0 < q0 < len(ids):
        raise ValueError(f"prompt: the query starts at {q0}, outside (0, {len(ids)})")
    return ids[:q0], ids[q0:]


def run_question_agnostic(model, prompts, policies, budgets, max_new_tokens: int, *,
                          progress: bool = True) -> list[GenerationResult]:
    """Question-agnostic eviction: ``prompts`` share one context (the documents before the query); it is
    prefilled and evicted once per policy and budget, then every prompt's question is answered from the
    same compressed cache (reset after each answer). Results in ``policies × budgets × prompts`` order
    (the full cache once, with the first budget)."""
    parts = [split_question(p) for p in check_nonempty("prompts", prompts)]
    policies = check_nonempty("policies", policies)
    budgets = [BUDGET.check("budgets", b) for b in check_nonempty("budgets", budgets)]
    check_max_new_tokens(max_new_tokens)
    ctx = parts[0][0]
    if any(c != ctx for c, _ in parts):
        raise ValueError("prompts: do not share their context tokens (same documents, same template)")
    needs = Needs.of(policies)
    sess = EvictionSession.prepare(model, ctx, needs, max_new_tokens, reusable=True, progress=progress)
    out = []
    for p in policies:
        for b in (budgets[:1] if p.keeps_all else budgets):
            out += sess.run_questions(p, b, [q for _, q in parts])
    return out
