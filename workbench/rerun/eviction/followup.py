"""The follow-up-question protocol (SCBench's multi-turn reuse): one eviction, two questions on the same context.

The prompt (context and question 1) is prefilled and evicted as in the usual question-aware run (DeferKV after
its first decode step), answer 1 is decoded greedily, and then the second user turn (the rest of answer 1, the
template's end of the assistant turn, question 2 and the generation prompt) is appended to the SAME evicted cache
and answer 2 is decoded from it, positions continuing at the original ones. Nothing evicted before answer 1 comes
back for question 2: this is where a one-shot eviction tuned to question 1 (DeferKV waits for answer 1's first
step) can lose what question 2 needs. The full cache (:class:`~.policies.full.FullCache`) is the reference: with
``B ≥ T`` the two turns equal a plain full-context two-turn generation.

Answer 1's tokens go into turn 2 as generated (not re-tokenised from text), up to its stop token, which the
template's end-of-turn text replaces (:func:`chat_next_turn`). Both answers are
:meth:`EvictionSession.continue_with <workbench.rerun.eviction.session.EvictionSession.continue_with>` on one
:meth:`~workbench.rerun.eviction.session.EvictionSession.evict` state.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from workbench.checks import check_nonempty, check_str
from workbench.constraints import BUDGET
from workbench.rerun.eviction.evidence import Needs
from workbench.rerun.eviction.refusals import policy_refusal
from workbench.rerun.eviction.result import GenerationResult
from workbench.rerun.eviction.session import EvictionSession
from workbench.run.models import unwrap_model
from workbench.run.prompt import control_strings

__all__ = ["FollowupResult", "run_followup", "chat_next_turn", "answer_body"]

NextTurn = Callable[[list[int]], Sequence[int]]
_SENTINEL = "\u2063FOLLOWUP-ANSWER\u2063"  # an assistant message no template rewrites or contains


@dataclass(frozen=True)
class FollowupResult:
    """Both answers of one policy at one budget.

    Attributes:
        first: answer 1, decoded from the evicted cache (as :meth:`EvictionSession.run` would).
        second: answer 2, decoded after turn 2 was appended to the same cache (``error`` set when turn 2 failed).
        turn2_ids: the tokens appended before answer 2 (the rest of answer 1, then the next turn's tokens).
        cache_entries: entries the cache held once turn 2 was appended (its first layer): the kept prompt
            positions (and DeferKV's first generated token), answer 1's other tokens and ``turn2_ids``.
    """

    first: GenerationResult
    second: GenerationResult
    turn2_ids: tuple[int, ...] = ()
    cache_entries: int = 0

    @property
    def error(self) -> str | None:
        """The first failed step's message (``"turn 1: …"`` or ``"turn 2: …"``), ``None`` when both ran."""
        if self.first.error is not None:
            return f"turn 1: {self.first.error}"
        if self.second.error is not None:
            return f"turn 2: {self.second.error}"
        return None


def answer_body(ids: Sequence[int], stop: set[int] | frozenset[int]) -> list[int]:
    """Answer 1's tokens without the stop token that ended it (the next turn's own end-of-turn text follows)."""
    ids = [int(i) for i in ids]
    return ids[:-1] if ids and ids[-1] in stop else ids


def chat_next_turn(tokenizer, instruction: str, query2: str, *, chat: bool | None = None) -> NextTurn:
    """``next_turn(answer_body) -> ids`` of the second user turn rendered with the tokenizer's chat template:
    the text the template puts after an assistant message (end of turn, the user turn ``"Question:\\n" + query2``,
    the generation prompt), tokenised without added special tokens. Without a chat template (or ``chat=False``)
    the plain format of :func:`workbench.run.prompt.render`: ``"\\n\\nQuestion:\\n" + query2 + "\\nAnswer:"``."""
    check_str("query2", query2)
    check_str("instruction", instruction, empty=True)
    bad = [c for c in control_strings(tokenizer) if c in query2]
    if bad:
        raise ValueError(f"query2: holds the control-token string {bad[0]!r}; a question is text, not markup")
    user2 = f"Question:\n{query2}"
    use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
    if use_chat:
        msgs = ([{"role": "system", "content": instruction}] if instruction else []) + [
            {"role": "user", "content": "Question:\n?"}, {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": user2}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        at = text.rfind(_SENTINEL)
        if at < 0 or user2 not in text[at:]:
            raise ValueError("chat: the chat template drops or rewrites an earlier assistant turn; the follow-up "
                             "protocol needs a template that keeps the conversation (or pass chat=False)")
        glue = text[at + len(_SENTINEL):]
    else:
        glue = f"\n\n{user2}\nAnswer:"
    ids = [int(i) for i in tokenizer(glue, add_special_tokens=False)["input_ids"]]

    def next_turn(body: list[int]) -> list[int]:
        return list(ids)

    return next_turn


def run_followup(model, prompt, jobs, max_new_tokens: int, next_turn: NextTurn, *,
                 progress: bool = False) -> list[FollowupResult]:
    """The follow-up protocol for each ``(policy, budget)`` of ``jobs`` from one shared prefill of ``prompt`` (context
    and question 1). ``next_turn(answer_body) -> token ids`` gives turn 2 (:func:`chat_next_turn`); it is called with
    answer 1's tokens less its stop token. One result per job, in order. A step that fails is that result's error
    (``first`` or ``second``), never an answer: a policy refused by the model, an eviction that fails, a turn 2 the
    model cannot hold."""
    jobs = [(p, BUDGET.check("budget", b)) for p, b in check_nonempty("jobs", jobs)]
    if not callable(next_turn):
        raise ValueError(f"next_turn: must be a callable answer ids -> turn-2 ids, got {type(next_turn).__name__}")
    net = unwrap_model(model)[0]
    refused = [policy_refusal(net, p) for p, _ in jobs]
    needs = Needs.of([p for (p, _), why in zip(jobs, refused) if not why])
    sess = EvictionSession.prepare(model, prompt, needs, max_new_tokens, reusable=True, progress=progress)
    out = []
    for (p, b), why in zip(jobs, refused):
        if why:
            fail = GenerationResult.failed(p, b, sess.T, why)
            out.append(FollowupResult(first=fail, second=GenerationResult.failed(p, b, sess.T, "turn 1 failed")))
        else:
            out.append(_two_turns(sess, p, b, next_turn))
    return out


def _two_turns(sess: EvictionSession, policy, budget: int, next_turn: NextTurn) -> FollowupResult:
    try:
        st = sess.evict(policy, budget)
        first = sess.continue_with(st)  # st moves on: its cache holds answer 1 but its last token
    except Exception as e:  # this policy's failure is its result; the others still run
        fail = GenerationResult.failed(policy, budget, sess.T, e)
        return FollowupResult(first=fail, second=GenerationResult.failed(policy, budget, sess.T, "turn 1 failed"))
    try:
        feed = _turn_two(first.ids, sess.eos, next_turn)
        second = sess.continue_with(st, feed)
    except Exception as e:  # answer 1 stands; answer 2 is this run's failed step
        return FollowupResult(first=first, second=GenerationResult.failed(policy, budget, sess.T, e))
    return FollowupResult(first=first, second=second, turn2_ids=tuple(feed), cache_entries=st.context_entries)


def _turn_two(a1: Sequence[int], stop, next_turn: NextTurn) -> list[int]:
    """The tokens appended after answer 1 ``a1``: its last token unless it is a stop token (the cache holds the
    others), then ``next_turn(answer body)``."""
    body = answer_body(a1, stop)
    turn = next_turn(list(body))
    turn = turn.flatten().tolist() if isinstance(turn, torch.Tensor) else list(turn)
    if not turn:
        raise ValueError("next_turn: returned no tokens (turn 2 needs at least its question)")
    return body[len(a1) - 1:] + [int(i) for i in turn]
