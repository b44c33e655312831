"""Greedy decoding of evicted caches, one token per step (internal to
:class:`~workbench.rerun.eviction.session.EvictionSession`): at each step the states with the fewest tokens whose
caches hold the same number of entries share one batched forward (their cache rows stacked), the others wait, so a
lone state runs exactly as an unbatched generation."""
from __future__ import annotations

import contextlib
import time

import torch

from workbench.run import adapter

__all__ = ["decode_steps"]


def decode_steps(sess, states: list, bar, pstate) -> None:
    """Decode every state of ``states`` (:class:`~workbench.rerun.eviction.run_state.RunState`) of session ``sess``
    until each is finished (``max_new_tokens``, a stop token or its forced tokens), in place; ``bar`` counts the
    tokens, ``pstate`` is the model's position context (original positions for the sliding windows)."""
    T, n = sess.T, sess.n
    while True:
        live = [st for st in states if not st.done]
        if not live:
            break
        m = min(len(st.ids) for st in live)
        first = [st for st in live if len(st.ids) == m]
        length = first[0].kept.shape[-1] + first[0].offset + len(first[0].steps)  # entries of a compacted layer
        grp = [st for st in first if st.kept.shape[-1] + st.offset + len(st.steps) == length]
        same = len({id(st.cache) for st in grp}) == 1 and [st.row for st in grp] == list(range(len(grp))) \
            and adapter.cache_batch_size(grp[0].cache) == len(grp)
        if not same:
            cache = adapter.stack_cache_rows([(st.cache, st.row) for st in grp])
            for i, st in enumerate(grp):
                st.cache, st.row = cache, i
        cache = grp[0].cache
        x = torch.tensor([[st.ids[-1]] for st in grp], device=sess.device)
        p = T - grp[0].shift + grp[0].offset + m - 1  # original position (re-rotated: the compacted one)
        pos = torch.full((len(grp), 1), p, device=sess.device)
        pstate.cache, pstate.q_pos = cache, torch.tensor([p])
        mask = adapter.per_head_key_mask(sess.model, grp[0].drop, sess.evidence.head_group) \
            if grp[0].drop else contextlib.nullcontext()
        t0 = time.perf_counter()
        with mask:
            fwd = adapter.forward(sess.model, x, cache=cache, position_ids=pos, logits_to_keep=1)
        dt = time.perf_counter() - t0
        new = adapter.output_cache(fwd)
        logit = fwd.logits[:, -1].float()
        for i, st in enumerate(grp):
            if new is not None:
                st.cache = new
            st.steps.append(dt)
            st.timings["batch"] = max(st.timings["batch"], len(grp))
            if sess.keep_logits:
                st.logits.append(logit[i].cpu())
            st.ids.append(st.forced[len(st.ids)] if st.forced else int(logit[i].argmax()))
            st.done = st.finished(n, sess.eos)
        bar.update(len(grp))
