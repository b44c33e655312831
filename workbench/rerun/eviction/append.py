"""Tokens appended to an evicted cache in one forward (a question, the next turn of a conversation), under the
eviction's per-head masks and with sliding windows measured in original positions (internal to
:meth:`~workbench.rerun.eviction.session.EvictionSession.continue_with`)."""
from __future__ import annotations

import contextlib
import time

import torch

from workbench.checks import check_context
from workbench.rerun.eviction.run_state import RunState
from workbench.run import adapter, families

__all__ = ["append_tokens", "check_room"]


def _first_position(st: RunState, T: int) -> int:
    """The first position ``st``'s cache does not hold (original; the compacted one after re-rotation): its last
    answer token's, never fed."""
    return T - st.shift + st.offset + len(st.ids) - 1


def check_room(model, st: RunState, n_tokens: int, *, T: int, n: int) -> None:
    """Refuse (``ValueError``) ``n_tokens`` appended to ``st`` and ``n`` decoded after them where they would pass
    the model's context or a position the model refuses (``T``: the prompt's length)."""
    end = _first_position(st, T) + st.shift + n_tokens  # in original positions
    check_context(end, n, adapter.model_shape(model).max_context)
    why = families.position_refusal(model, "eviction", end + n)
    if why:
        raise ValueError(why)


def append_tokens(model, st: RunState, tokens: list[int], *, T: int, head_group: torch.Tensor,
                  keep_logits: bool) -> None:
    """Feed ``tokens`` (ids ``[N]``, :func:`check_room` checked) to ``st``'s cache at the positions after those it
    holds, in place of the state's last answer token (never fed); ``st`` then holds an undecoded answer whose first
    token is the greedy choice after the last of them. ``T``: the prompt's length; ``head_group [H_Q]``: the KV
    group of each query head (the per-head masks)."""
    p0 = _first_position(st, T)
    ragged = st.drop is not None or bool((st.kept < 0).any())  # per-head masks, or layers of different lengths
    mask = adapter.per_head_key_mask(model, st.drop or {}, head_group) if ragged else contextlib.nullcontext()
    device = next(model.parameters()).device
    x = torch.tensor([tokens], device=device)
    pos = torch.arange(p0, p0 + len(tokens), device=device)[None]
    t0 = time.perf_counter()
    with mask, adapter.positions_context(model, st.cache) as pstate:  # windows in original positions
        pstate.q_pos = pos[0].cpu()
        fwd = adapter.forward(model, x, cache=st.cache, position_ids=pos, logits_to_keep=1)
    st.timings = dict(st.timings, question=time.perf_counter() - t0)
    logit = fwd.logits[0, -1].float()
    st.cache = adapter.output_cache(fwd) or st.cache
    st.ids, st.logits, st.steps = [int(logit.argmax())], [logit.cpu()] if keep_logits else [], []
    st.offset = p0 + len(tokens) - (T - st.shift)
    st.forced, st.done = None, False
