"""What a compressed cache changed in the answer, run on the model: the full-cache answer, then each compressed
setting teacher-forced on its tokens (logits per step) and decoded freely (its own greedy answer, to find where
the answers part); the numbers are :func:`workbench.analyse.divergence.logit_divergence`'s.

A setting is an eviction policy with a budget ``B`` (one :class:`EvictionSession`: one prefill serves the full
answer and every setting) or an EntroPrefill pruned prefill (:func:`workbench.rerun.prune.run_pruned`, an
:class:`EntroPrefillParams`, with ``layer``/``removed`` to fix the layer and removal set).
"""
from __future__ import annotations

from collections.abc import Sequence

from workbench.analyse.divergence import AnswerDivergence, logit_divergence
from workbench.analyse.params import EntroPrefillParams
from workbench.checks import check_max_new_tokens, check_nonempty
from workbench.constraints import BUDGET
from workbench.rerun.eviction.evidence import Needs
from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.rerun.eviction.policies.full import FullCache
from workbench.rerun.eviction.refusals import policy_refusal
from workbench.rerun.eviction.session import EvictionSession
from workbench.rerun.prune import run_pruned
from workbench.run.models import unwrap_model

__all__ = ["answer_divergence", "answer_divergences", "session_divergence"]


def session_divergence(sess: EvictionSession, full, policy: EvictionPolicy, budget: int, *, own_ids=None,
                       tokenizer=None) -> AnswerDivergence:
    """The :class:`AnswerDivergence` of ``policy`` at ``budget`` in a prepared ``sess`` (``keep_logits=True``)
    against its full-cache answer ``full`` (``sess.run(FullCache(), sess.T)``): one eviction
    (:meth:`EvictionSession.evict`) decoded teacher-forced on ``full.ids`` (:meth:`EvictionSession.continue_with`),
    and its own greedy answer ``own_ids`` (decoded here from the same eviction when ``None``) for where the answers
    part."""
    if full.logits is None or len(full.ids) == 0:
        raise ValueError("full: needs the full-cache answer's logits (a session with keep_logits=True) and at "
                         "least one answer token")
    st = sess.evict(policy, budget)  # one eviction serves the forced run and the free one
    forced = sess.continue_with(st, forced=full.ids, on="copy" if own_ids is None else "state")
    own = sess.continue_with(st).ids if own_ids is None else own_ids
    tokens = [tokenizer.decode([i]) for i in full.ids] if tokenizer is not None else None
    return logit_divergence(full.logits, forced.logits, full.ids, other_ids=own, tokens=tokens,
                            label=f"{policy.name}, B = {budget}")


def _setting(s) -> tuple[EvictionPolicy | EntroPrefillParams, int | None]:
    if isinstance(s, EntroPrefillParams):
        return s, None
    if isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], EvictionPolicy):
        return s[0], BUDGET.check("settings", s[1])
    raise ValueError("settings: each must be (EvictionPolicy, budget) or EntroPrefillParams (a pruned prefill), "
                     f"got {s!r}")


def answer_divergences(model, prompt, settings: Sequence, *, max_new_tokens: int = 16, layer: int | None = None,
                       removed=None, progress: bool = False) -> list[AnswerDivergence]:
    """One :class:`AnswerDivergence` per setting against the one full-cache answer (``max_new_tokens`` tokens).

    Args:
        model: a :class:`~workbench.run.models.LoadedModel` or an HF causal LM.
        prompt: a Prompt, PromptSpans, string or token ids (a pruned prefill needs a Prompt or its spans).
        settings: ``(EvictionPolicy, budget)`` pairs and/or :class:`EntroPrefillParams` (pruned prefill).
        layer, removed: passed to :func:`~workbench.rerun.prune.run_pruned` for the pruning settings.
    """
    n = check_max_new_tokens(max_new_tokens)
    settings = [_setting(s) for s in check_nonempty("settings", settings)]
    net, tok, _ = unwrap_model(model)
    policies = [p for p, _ in settings if isinstance(p, EvictionPolicy)]
    for p in policies:
        why = policy_refusal(net, p)
        if why:
            raise ValueError(f"settings: {why}")
    sess = EvictionSession.prepare(model, prompt, Needs.of(policies), n, reusable=True, keep_logits=True,
                                   progress=progress)
    full = sess.run(FullCache(), sess.T)
    tokens = [tok.decode([i]) for i in full.ids] if tok is not None else None
    out = []
    for p, B in settings:
        if isinstance(p, EvictionPolicy):
            out.append(session_divergence(sess, full, p, B, tokenizer=tok))
            continue
        forced = run_pruned(model, prompt, p, layer=layer, removed=removed, max_new_tokens=n, forced=full.ids,
                            progress=progress)
        own = run_pruned(model, prompt, p, layer=layer, removed=removed, max_new_tokens=n,
                         progress=progress).generated_ids
        label = "pruned prefill, bypass" if forced.bypass else \
            f"pruned prefill, l* = {forced.l_star}, T' = {forced.T_prime} of {forced.T}"
        out.append(logit_divergence(full.logits, forced.logits, full.ids, other_ids=own, tokens=tokens, label=label))
    return out


def answer_divergence(model, prompt, method: EvictionPolicy | EntroPrefillParams, budget: int | None = None, *,
                      max_new_tokens: int = 16, layer: int | None = None, removed=None,
                      progress: bool = False) -> AnswerDivergence:
    """What ``method`` changed in the answer: per token of the full-cache answer, ``KL(p_full ‖ p_compressed)``,
    the change of the chosen token's log-probability and margin (teacher-forced), and where the greedy answers
    part. ``method``: an eviction policy (with ``budget`` ``B``) or :class:`EntroPrefillParams` (a pruned
    prefill, no budget; ``layer``/``removed`` as in :func:`~workbench.rerun.prune.run_pruned`)."""
    if isinstance(method, EvictionPolicy):
        if budget is None:
            raise ValueError("budget: an eviction policy needs a budget B (an integer ≥ 1)")
        setting = (method, budget)
    elif isinstance(method, EntroPrefillParams):
        if budget is not None:
            raise ValueError("budget: a pruned prefill has no budget (its removal is EntroPrefill's); pass None")
        setting = method
    else:
        raise ValueError(f"method: must be an EvictionPolicy or EntroPrefillParams, got {type(method).__name__}")
    return answer_divergences(model, prompt, [setting], max_new_tokens=max_new_tokens, layer=layer, removed=removed,
                              progress=progress)[0]
