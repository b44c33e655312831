"""One call per question: :func:`generate_with_policy` (one policy, one budget) and :func:`run_policies` (every
policy at every budget from one shared prefill), both on :class:`~workbench.rerun.eviction.session.EvictionSession`."""
from __future__ import annotations

from tqdm.auto import tqdm

from workbench.checks import check_nonempty
from workbench.constraints import BUDGET
from workbench.rerun.eviction.evidence import Needs
from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.rerun.eviction.refusals import policy_refusal
from workbench.rerun.eviction.result import GenerationResult
from workbench.rerun.eviction.session import EvictionSession
from workbench.run.models import unwrap_model

__all__ = ["generate_with_policy", "run_policies"]


def generate_with_policy(model, prompt, policy: EvictionPolicy, budget: int, max_new_tokens: int, *,
                         keep_logits: bool = False, progress: bool = True,
                         allow_foreign: bool = False) -> GenerationResult:
    """Greedy generation with one-shot eviction under ``policy`` at budget ``B``.

    Prefill (capturing only what the policy scores with), for DeferKV one decode step on the full cache,
    then score, select (:func:`select_keep`) and compact the model's own dynamic cache in place, and
    keep decoding with position ids continuing at the original positions (``T + t - 1``).

    Args:
        model: an HF causal LM or a :class:`~workbench.run.models.LoadedModel` (for ``text``).
        prompt: a Prompt, PromptSpans, string or token ids (batch size 1).
        policy: one of the policy dataclasses.
        budget: ``B``, prompt positions kept per layer and KV group (``≥`` the protected count, or ``≥ T``).
        max_new_tokens: ``≥ 1``; generation also stops at the model's EOS token.
        keep_logits: also return the logits of every generated token.
        allow_foreign: see :meth:`EvictionSession.prepare`.

    Returns:
        :class:`GenerationResult` (text, ids, kept positions ``[L, G, S']``, KV bytes before/after, timings).
    """
    BUDGET.check("budget", budget)  # before the prefill (the protected count is checked by the run)
    why = policy_refusal(unwrap_model(model)[0], policy)
    if why:
        raise ValueError(why)
    sess = EvictionSession.prepare(model, prompt, policy.needs(), max_new_tokens, reusable=False,
                                   keep_logits=keep_logits, progress=progress, allow_foreign=allow_foreign)
    return sess.run(policy, budget)


def run_policies(model, prompt, policies, budgets, max_new_tokens: int, *, progress: bool = True,
                 keep_logits: bool = False, batch: bool = False) -> list[GenerationResult]:
    """Every policy at every budget from one shared prefill (and one full-cache answer when needed).

    Returns the results in ``policies × budgets`` order (the full cache once, with the first budget).
    Timings of the shared steps (prefill with the union of all captures) are the same for every result.
    ``batch=True`` decodes runs with equal cache lengths together (:meth:`EvictionSession.run_batch`):
    faster, equal to the unbatched runs up to float rounding.
    """
    policies = list(check_nonempty("policies", policies))
    budgets = [BUDGET.check("budgets", b) for b in check_nonempty("budgets", budgets)]
    net, _, _ = unwrap_model(model)
    refused = {i: policy_refusal(net, p) for i, p in enumerate(policies)}
    needs = Needs.of([p for i, p in enumerate(policies) if not refused[i]])
    sess = EvictionSession.prepare(model, prompt, needs, max_new_tokens, reusable=True,
                                   keep_logits=keep_logits, progress=progress)
    jobs = [(i, p, b) for i, p in enumerate(policies) for b in (budgets[:1] if p.keeps_all else budgets)]
    todo = [(p, b) for i, p, b in jobs if not refused[i]]
    if batch:
        ran = iter(sess.run_batch(todo) if todo else [])
    else:
        ran = iter([_run_one(sess, p, b) for p, b in tqdm(todo, desc="policies", disable=not progress, leave=False)])
    return [GenerationResult.failed(p, b, sess.T, refused[i]) if refused[i] else next(ran) for i, p, b in jobs]


def _run_one(sess: EvictionSession, policy: EvictionPolicy, budget: int) -> GenerationResult:
    try:
        return sess.run(policy, budget)
    except Exception as e:  # one policy's failure is its result; the others still run
        return GenerationResult.failed(policy, budget, sess.T, e)
