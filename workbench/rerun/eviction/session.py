"""Running a policy: one prefill with the evidence its policies need, then evictions of copies of the
model's own KV cache, and greedy decoding at the original positions (SPEC §9).

:class:`EvictionSession` prefills once (capturing only what the policies score with), optionally runs
the first decode step (DeferKV) and the full-cache answer (the oracle), then evicts with
:func:`~workbench.rerun.eviction.select.preview` (the one budget rule) and decodes with the shared
stop rule (:func:`workbench.run.generate.stop_token_ids`). RoPE positions continue at ``T + t - 1`` for
the ``t``-th generated token, not at the compacted length.

Sliding-window layers are compacted too (SPEC §7 **[decided]**): such a layer keeps the policy's choice
among the positions its window can still see (:func:`~workbench.rerun.eviction.select.preview_window`:
at most ``B`` of them), and later decode steps measure the window in original positions
(:func:`workbench.run.adapter.original_positions`). :attr:`GenerationResult.kept_layers` lists per layer what
it holds; a layer that cannot be compacted (a cache layer type other than the dynamic ones) is listed in
:attr:`GenerationResult.not_compacted` with a warning, and the per-layer byte counts show it.

Hybrids (softmax layers beside linear-attention, Mamba or convolution layers): only the layers with softmax
attention are scored (:func:`workbench.run.layer_roles.scored_layers`) and those with per-position keys and values of
their own evicted (:func:`~workbench.run.layer_roles.evictable_layers`). The evidence, the policies' ``[L, G, T]`` scores, a budget allocation over layers and :attr:`GenerationResult.kept` have one row per
such layer (``GenerationResult.layers`` names them), so a budget is defined over the evictable KV; the recurrent and
convolution states are left as they are and reported apart (``GenerationResult.kv_bytes_state``).
"""
from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from workbench.capture import capture_attention
from workbench.capture.identity import check_model_match
from workbench.checks import (
    Choice,
    Interval,
    Seq,
    check_args,
    check_context,
    check_max_new_tokens,
    check_nonempty,
    optional,
)
from workbench.choices import CONTINUE_ONS, ContinueOn
from workbench.constraints import BUDGET, register_all
from workbench.rerun.eviction.append import append_tokens, check_room
from workbench.rerun.eviction.cache_evidence import QueryStats, cache_evidence
from workbench.rerun.eviction.decode_steps import decode_steps
from workbench.rerun.eviction.evidence import Evidence, Needs, renorm_rows
from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.rerun.eviction.refusals import needs_refusal
from workbench.rerun.eviction.rerotate import rerotate_keys
from workbench.rerun.eviction.result import GenerationResult
from workbench.rerun.eviction.run_state import RunState, forced_ids
from workbench.rerun.eviction.select import preview, preview_window
from workbench.rerun.eviction.storage import latent_union as _latent_union
from workbench.rerun.eviction.storage import ragged_storage as _ragged
from workbench.rerun.eviction.storage import storage_rows as _storage_rows
from workbench.run import adapter, families, layer_roles, rotary
from workbench.run.generate import stop_token_ids
from workbench.run.models import unwrap_model

__all__ = ["EvictionSession", "CONTINUE_CHECKS", "BATCH_CHECKS"]

CONTINUE_CHECKS = register_all("continue_with", {
    "tokens": Seq(Interval("int", 0, None, what="a token id"), nonempty=False),
    "on": Choice(CONTINUE_ONS),
}, __name__)
"""The constraints of :meth:`EvictionSession.continue_with`'s ``tokens`` and ``on``."""
BATCH_CHECKS = register_all("continue_batch", {"batch_size": optional(Interval("int", 1, None))}, __name__)
"""The constraint of :meth:`EvictionSession.continue_batch`'s ``batch_size``."""


def _prompt_ids(prompt, tokenizer) -> tuple[list[int], object]:
    """``(ids, spans or None)`` from a Prompt, PromptSpans, a string, a list or a tensor of ids."""
    spans = getattr(prompt, "spans", None)
    if spans is None and hasattr(prompt, "input_ids") and hasattr(prompt, "observers"):
        spans = prompt
    if spans is not None:
        return list(spans.input_ids), spans
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: a string needs a model with a tokenizer (a LoadedModel)")
        return list(tokenizer(prompt)["input_ids"]), None
    ids = torch.as_tensor(prompt).flatten().tolist()
    if not ids:
        raise ValueError("prompt: is empty")
    return [int(i) for i in ids], None


class EvictionSession:
    """One prefill (capturing the evidence the given needs ask for), optionally the first decode step
    and the full-cache answer; then any number of evictions, each on a copy of the cache: :meth:`run` (one answer),
    or :meth:`evict` and :meth:`continue_with` (an answer, then further turns or questions on the evicted cache).
    Use :meth:`prepare`; :func:`~workbench.rerun.eviction.generate.generate_with_policy` is one session and one run.
    """

    def __init__(self):
        raise TypeError("use EvictionSession.prepare(...)")

    @classmethod
    @torch.no_grad()
    def prepare(cls, model, prompt, needs: Needs, max_new_tokens: int, *, reusable: bool = True,
                keep_logits: bool = False, progress: bool = True, allow_foreign: bool = False) -> "EvictionSession":
        """Prefill ``prompt`` with the capture ``needs`` asks for.

        Args:
            model: an HF causal LM or a :class:`~workbench.run.models.LoadedModel`.
            prompt: a :class:`~workbench.run.prompt.Prompt`, :class:`~workbench.run.spans.PromptSpans`, a string
                (with a LoadedModel) or token ids.
            needs: evidence to capture (merge the policies' :meth:`needs`).
            max_new_tokens: tokens to generate, ``≥ 1``.
            reusable: keep pristine caches so that :meth:`run` can be called more than once.
            allow_foreign: run spans built by another tokenizer or a capture of another model (refused
                by default: :func:`~workbench.capture.identity.check_model_match`).
        """
        n = check_max_new_tokens(max_new_tokens)
        self = object.__new__(cls)
        self.model, self.tokenizer, _ = unwrap_model(model)
        why = needs_refusal(self.model, needs)
        if why:
            raise ValueError(why)
        check_model_match(self.model, self.tokenizer, prompt, allow_foreign=allow_foreign)
        ids, spans = _prompt_ids(prompt, self.tokenizer)
        T = len(ids)
        shape = adapter.model_shape(self.model)
        self.layers = evl = layer_roles.scored_layers(self.model)  # the evidence rows' decoder layers
        self.stateful = bool(layer_roles.state_layers(self.model))
        check_context(T, n, shape.max_context)
        why = families.position_refusal(self.model, "eviction", T + n)
        if why:
            raise ValueError(why)
        self.T, self.ids, self.spans, self.n, self.needs = T, ids, spans, n, needs
        self.keep_logits, self.reusable, self.progress = keep_logits, reusable, progress
        self.eos = stop_token_ids(self.model, self.tokenizer)
        self.device = next(self.model.parameters()).device
        W = min(needs.tail, T)
        tail_pos = list(range(T - W, T))
        if needs.observers:
            obs_pos = list(spans.observers) if spans is not None and spans.observers else list(range(max(0, T - needs.observers), T))
        else:
            obs_pos = []
        n_dec = n if needs.answer else (1 if needs.decode1 else 0)
        dec_pos = list(range(T, T + n_dec))
        rows = tail_pos + obs_pos + dec_pos
        capture = bool(rows) or needs.colsum
        self.timings = {"prefill": 0.0, "defer": 0.0, "answer": 0.0}
        x = torch.tensor([ids], dtype=torch.int64, device=self.device)
        bar = tqdm(total=1 + n_dec, desc="prefill+capture", disable=not progress, leave=False)
        with contextlib.ExitStack() as stack:
            stack.callback(bar.close)
            rec = stack.enter_context(capture_attention(self.model, rows, K=T + n_dec, T=T, colsum=needs.colsum)) \
                if capture else None
            cache = adapter.new_cache(self.model)
            if rec is not None:
                rec.positions = torch.arange(T)
            qs = QueryStats(shape.L, rotary.rotary_maps(self.model, torch.arange(T))) if needs.qstats else None
            if qs is not None:
                stack.enter_context(adapter.attention_queries(self.model, qs))
            inputs: dict = {}
            if needs.attn_inputs:  # the prefill's attention inputs (a wrapped kvpress press scores from them)
                stack.enter_context(adapter.attention_inputs(self.model, lambda l, m, h, kw: inputs.setdefault(
                    l, (m, h.detach(), kw.get("position_embeddings")))))
            t0 = time.perf_counter()
            out = adapter.forward(self.model, x, cache=cache, logits_to_keep=1)
            self.timings["prefill"] = time.perf_counter() - t0
            bar.update(1)
            if qs is not None:
                qs.active = False  # prompt queries only
            cache = adapter.output_cache(out) or cache
            logit = out.logits[0, -1].float()
            self.first_logits = [logit.cpu()] if keep_logits else []
            y = [int(logit.argmax())]
            self.cache0 = adapter.clone_cache(cache) if n_dec else cache  # decode steps below extend `cache`
            self.cache1 = None
            self.answer_ids = None
            t_ans = time.perf_counter()
            for t in range(1, n_dec + 1):
                if needs.answer and y[-1] in self.eos:
                    break
                pos = T + t - 1
                if rec is not None:
                    rec.positions = torch.tensor([pos])
                t0 = time.perf_counter()
                out = adapter.forward(self.model, torch.tensor([[y[-1]]], device=self.device), cache=cache,
                                      position_ids=torch.tensor([[pos]], device=self.device), logits_to_keep=1)
                dt = time.perf_counter() - t0
                cache = adapter.output_cache(out) or cache
                logit = out.logits[0, -1].float()
                if t == 1:
                    self.timings["defer"] = dt
                    self.cache1 = adapter.clone_cache(cache) if n_dec > 1 else cache
                    self.y2 = int(logit.argmax())
                    if keep_logits:
                        self.first_logits.append(logit.cpu())
                y.append(int(logit.argmax()))
                bar.update(1)
            if needs.answer:
                self.timings["answer"] = time.perf_counter() - t_ans
                self.answer_ids = y[:n]
            self.y1 = y[0]
        # evidence (prompt keys only; decode rows renormalised over them)
        ties = adapter.kv_ties(self.model)  # [L, G] cells reading one stored row (Gemma-4), None when none do
        ev = Evidence(T=T, L=len(evl), head_group=shape.head_group(), n_sink=spans.n_sink if spans is not None else 4,
                      ties=None if ties is None else ties[evl])

        def rows(t):  # every layer's rows -> the evictable layers' (a hybrid's recurrent layers have none)
            return t if len(evl) == t.shape[0] else t[evl]

        if rec is not None:
            A = rows(rec.attn)
            o = 0
            if tail_pos:
                ev.tail = A[:, :, o:o + len(tail_pos), :T].cpu()
            o += len(tail_pos)
            if obs_pos:
                ev.observers = A[:, :, o:o + len(obs_pos), :T].cpu()
            o += len(obs_pos)
            done = len(y) - 1  # decode forwards that ran (rows captured)
            if dec_pos and done > 0:
                d = A[:, :, o:o + done, :T].cpu()
                ev.decode = renorm_rows(d)
            if needs.colsum:
                ev.colsum = rows(rec.colsum).cpu()
        if qs is not None:
            ev.q_sum, ev.q_outer, ev.q_first = qs.tensors(evl)
            fut = rotary.rotary_maps(self.model, torch.arange(T, T + needs.qstats))
            ev.rope_cos, ev.rope_sin, ev.rope_pair = rows(fut.cos), rows(fut.sin), rows(fut.pair)
        if needs.attn_inputs:
            ev.attn_inputs = [inputs[l] for l in evl]
        if needs.keys or needs.wov:
            cache_evidence(self.model, self.cache0, ev, keys=needs.keys, wov=needs.wov, layers=evl)
        self.evidence = ev
        self._used = False
        return self

    @torch.no_grad()
    def run(self, policy: EvictionPolicy, budget: int, *, rerotate: bool = False,
            forced=None) -> GenerationResult:
        """Evict with ``policy`` at budget ``B`` and decode ``max_new_tokens`` tokens (stops at EOS): :meth:`evict`,
        then :meth:`continue_with`.

        ``rerotate=True`` re-positions the kept keys at the compacted length (StreamingLLM paper style; needs one
        count in every layer and KV head: :func:`~workbench.rerun.eviction.rerotate.rerotate_keys`); the default
        keeps every key at its original position (decoding at ``T + t - 1``).

        ``forced``: teacher forcing on these ids (the full-cache answer, at most ``max_new_tokens``): each step
        feeds the next of them, not the greedy choice, for ``len(forced)`` tokens whatever the stop tokens;
        ``ids`` are ``forced`` and logits row ``j`` predicts token ``j``."""
        return self.continue_with(self.evict(policy, budget, rerotate=rerotate), forced=forced)

    @torch.no_grad()
    def continue_with(self, state: RunState, tokens: Sequence[int] = (), *, forced=None,
                      on: ContinueOn = "state") -> GenerationResult:
        """Append ``tokens`` to an evicted cache and decode an answer (``max_new_tokens`` tokens, or to a stop token).

        Args:
            state: from :meth:`evict` (its answer's first tokens decided), or from an earlier call (it holds the
                answer decoded then). A call that fails part-way leaves it refused (continue copies to keep it).
            tokens: ids ``[N]`` fed in one forward at the positions after those the cache holds (original
                positions; the compacted ones after ``rerotate``), under the eviction's per-head masks and
                sliding windows: nothing evicted comes back. The state's last answer token was never fed, so
                ``tokens`` take its place (pass it first to keep it; the follow-up protocol does unless it is a
                stop token). Empty (a state from :meth:`evict` only): decode the state's own answer.
            forced: teacher forcing as in :meth:`run`; after ``tokens`` no token is decided: it may start anywhere.
            on: ``"state"`` decodes in the state's own cache (the state moves on and holds this answer, for the
                next turn); ``"copy"`` in a copy, leaving the state as it was (several continuations of one
                eviction, e.g. questions on one compressed context).

        Returns the answer (``T`` the prompt's length, ``kept`` the eviction's, logits row ``j`` predicting token
        ``j``, ``timings["question"]`` the seconds of the forward over ``tokens``)."""
        tokens = tokens.flatten().tolist() if isinstance(tokens, torch.Tensor) else tokens
        check_args(CONTINUE_CHECKS, {"tokens": tokens, "on": on})
        tokens = [int(i) for i in tokens]
        if not isinstance(state, RunState) or state.cache is None:
            raise ValueError(f"state: must be a RunState from evict, not one a failed call left, got {state!r:.60}")
        if not tokens and state.done:
            raise ValueError("tokens: the state's answer is decoded; continue it with at least one token")
        f = None if forced is None else forced_ids(forced, self.n, [] if tokens else state.ids)
        if tokens:
            check_room(self.model, state, len(tokens), T=self.T, n=self.n)
        if on == "copy":
            state = replace(state, cache=adapter.clone_cache(state.cache), ids=list(state.ids),
                            logits=list(state.logits), timings=dict(state.timings), steps=list(state.steps))
        try:  # checked: from here on the cache changes
            if tokens:
                append_tokens(self.model, state, tokens, T=self.T, head_group=self.evidence.head_group,
                              keep_logits=self.keep_logits)
            if f is not None:
                state.force(f)
            state.context_entries = adapter.cache_length(state.cache)
            return self._decode([state], keep_cache=True)[0]
        except BaseException:
            state.cache = None  # the cache may hold part of this step: the state is refused from here on
            raise

    @torch.no_grad()
    def run_batch(self, jobs) -> list[GenerationResult]:
        """Several ``(policy, budget)`` evictions decoded together: runs whose caches have the same length
        at the same step share one batched forward (rows of a batch are independent; the results equal
        :meth:`run`'s up to float rounding of the batched matrix products). Per-step times are the
        batch's; ``timings["batch"]`` is the largest batch a run was part of. Runs that keep a count per
        layer or head (a per-head key mask) decode alone; the others still share their batches."""
        jobs = list(check_nonempty("jobs", jobs))
        states, failed = [], {}
        for i, (p, b) in enumerate(jobs):
            try:
                states.append(self.evict(p, b))
            except Exception as e:  # one policy's failure is its result; the others still run
                failed[i] = GenerationResult.failed(p, b, self.T, e)
        ragged = [self._decodes_alone(st) for st in states]
        even = [st for st, r in zip(states, ragged) if not r]
        try:
            done = dict(zip(map(id, even), self._decode(even))) if even else {}
        except Exception:  # a shared batch failed: decode its runs alone, so the failure is one run's
            done = {}
            ragged = [True] * len(states)
        res = iter(self._decode_alone(st) if r else done[id(st)] for st, r in zip(states, ragged))
        return [failed[i] if i in failed else next(res) for i in range(len(jobs))]

    @torch.no_grad()
    def continue_batch(self, states: Sequence[RunState], *, batch_size: int | None = None) -> list[GenerationResult]:
        """Decode the answers of distinct, undecoded ``states`` from :meth:`evict` together, each equal to
        ``continue_with(state)``'s up to float rounding of the batched products (as :meth:`run_batch` decodes its
        evictions). States whose caches have the same length at the same step share a forward, at most
        ``batch_size`` (``None``: all) consecutive ones; those with a count per layer or head (a per-head key mask)
        or a recurrent state decode alone, after the batches. Returns one answer per state, in order; the states end
        here, their caches freed (a batched cache's rows cannot be continued apart: evict again to continue)."""
        states = list(check_nonempty("states", states))
        check_args(BATCH_CHECKS, {"batch_size": batch_size})
        for i, st in enumerate(states):
            if not isinstance(st, RunState) or st.cache is None or st.done or st.row:
                raise ValueError(f"states: entry {i} must be a RunState from evict, not yet decoded, got {st!r:.60}")
        if len({id(st) for st in states}) < len(states):
            raise ValueError("states: must be distinct (a state decodes once), got one state twice")
        alone = [self._decodes_alone(st) for st in states]
        even, k = [st for st, a in zip(states, alone) if not a], batch_size or len(states)
        try:  # checked: from here on the caches change
            done = {id(st): r for j in range(0, len(even), k) for st, r in zip(even[j:j + k], self._decode(even[j:j + k]))}
            return [self._decode([st])[0] if a else done[id(st)] for st, a in zip(states, alone)]
        except BaseException:
            for st in states:
                st.cache = None  # a cache may hold part of a step: its state is refused from here on
            raise

    def _decodes_alone(self, st: RunState) -> bool:
        """A count per layer or head (a per-head key mask), or a recurrent state (its batch rows are not stacked)."""
        return st.drop is not None or bool((st.kept < 0).any()) or self.stateful

    def _decode_alone(self, st) -> GenerationResult:
        try:
            return self._decode([st])[0]
        except Exception as e:
            return GenerationResult.failed(st.policy, st.B, self.T, e)

    @torch.no_grad()
    def run_questions(self, policy: EvictionPolicy, budget: int, questions, *,
                      rerotate: bool = False) -> list[GenerationResult]:
        """Question-agnostic eviction: the session's prompt is the context alone; evict it once with
        ``policy`` at budget ``B``, then answer every question (token ids appended at positions ``T …``)
        from a copy of the same compressed cache, reset after each answer (kvpress's pipeline does this).

        Policies that evict after a decode step or score with the answer (DeferKV, the oracle) are refused:
        without the question there is no first decode step to wait for.

        Returns one :class:`GenerationResult` per question (``T`` = the context length; ``kept`` the
        context positions; the question's tokens are kept whole and not counted in ``B``).
        """
        if policy.defer or policy.needs().answer:
            raise ValueError(f"policy: {policy.name} needs the question (a decode step or the answer); "
                             "question-agnostic eviction compresses the context alone")
        if not self.reusable:
            raise ValueError("reusable: question-agnostic runs need a reusable session")
        qs = [torch.as_tensor(q).flatten().tolist() for q in questions]
        if not all(qs):
            raise ValueError("questions: a question has no tokens")
        st0 = self.evict(policy, budget, rerotate=rerotate)
        return [self.continue_with(st0, q, on="copy") for q in qs]

    @torch.no_grad()
    def evict(self, policy: EvictionPolicy, budget: int, *, rerotate: bool = False) -> RunState:
        """One eviction with ``policy`` at budget ``B`` of a copy of the prefilled cache (DeferKV's after its
        first decode step), not decoded yet: a :class:`RunState` for :meth:`continue_with`, its answer's first
        token (two with DeferKV) decided on the full cache. ``rerotate`` as in :meth:`run`."""
        if not isinstance(policy, EvictionPolicy):
            raise ValueError(f"policy: must be an EvictionPolicy, got {type(policy).__name__}")
        B = BUDGET.check("budget", budget)
        need = policy.needs()
        have = self.needs
        if need.merge(have) != have:
            raise ValueError(f"policy: {policy.name} needs {need}, the session captured {have}")
        if self._used and not self.reusable:
            raise ValueError("reusable: this session was prepared with reusable=False and has been run once")
        self._used = True
        T, n = self.T, self.n
        defer = policy.defer
        if defer == 1 and self.cache1 is None:
            if self.y1 in self.eos or n == 1:
                defer = 0  # nothing is generated after step 0: evict right away
            else:
                raise ValueError("policy: DeferKV needs the first decode step (Needs(decode1=True))")
        src = self.cache1 if defer == 1 else self.cache0
        cache = adapter.clone_cache(src) if self.reusable else src
        ids = [self.y1] + ([self.y2] if defer == 1 else [])
        logits = list(self.first_logits[: len(ids)]) if self.keep_logits else []
        timings = dict(self.timings)
        if defer == 0:
            timings["defer"] = 0.0
        shape = adapter.model_shape(self.model)
        evl = self.layers  # row i of the kept sets is decoder layer evl[i]
        src = adapter.kv_source_layers(self.model)  # the layer whose cache each layer attends (itself unless KV-shared)
        L, G, L_all = len(evl), shape.G, shape.L
        before = adapter.cache_bytes(cache)
        state = adapter.state_bytes(cache)
        layer_before = tuple(adapter.layer_bytes(cache))
        gen = torch.arange(T, T + defer)
        t0 = time.perf_counter()
        keep = preview(policy, self.evidence, B)  # [L, G, M]; -1-padded with a budget allocation
        ragged = bool((keep < 0).any())  # a budget allocation: a count per layer, per-head counts masked
        evict = ragged or keep.shape[-1] < T
        kept = torch.cat([keep, gen.expand(L, G, defer)], dim=-1)
        drop, masked = None, 0
        latent = adapter.mla_latent_cache(self.model)  # one latent per position, shared by every head
        if evict:
            if latent:
                per_layer, drop = _latent_union(keep, gen)
            elif ragged:
                per_layer, drop = _ragged(keep, gen)
            else:
                per_layer = [kept[l] for l in range(L)]
            for i, l in enumerate(evl):  # sliding-window layers: the policy's choice among what the window still sees
                if latent:
                    adapter.check_latent_layer(self.model, cache, l)
                    if adapter.cache_layer_is_sliding(cache, l):
                        raise ValueError("eviction: a sliding-window layer in a multi-head latent attention cache "
                                         "is not supported")
                    continue
                if adapter.cache_layer_is_sliding(cache, src[l]):  # a KV-shared layer: its source's window
                    held = adapter.layer_positions(cache, src[l])[0]
                    w = preview_window(policy, self.evidence, B, i, held)
                    per_layer[i] = torch.cat([w, held[held >= T].expand(G, -1)], dim=-1)
                    if drop:
                        drop.pop(i, None)
            by_layer = [None] * L_all  # the other layers (a recurrent state) are left as they are
            for i, l in enumerate(evl):
                by_layer[l] = per_layer[i]
            drop = {evl[i]: d for i, d in drop.items()} if drop else drop
            if not latent:  # one row per stored KV head; a KV-shared layer stores nothing of its own
                by_layer = _storage_rows(self.model, by_layer)
        timings["score"] = time.perf_counter() - t0 if evict else 0.0
        t0 = time.perf_counter()
        skipped: dict = {}
        if evict:
            compacted, skipped = adapter.compact_cache_layers(cache, by_layer)
            compacted = tuple(compacted)
            if skipped:
                warnings.warn(f"eviction: {len(skipped)} layer(s) not compacted (they keep every entry; see "
                              f"GenerationResult.not_compacted and kv_layer_bytes_after): {skipped}", stacklevel=3)
            if drop:  # a KV-shared layer attends its source's compacted rows
                drop = {l: d for l, d in drop.items() if src[l] in compacted}
                if drop and not latent:  # slots stored only to be hidden (a latent slot serves some head)
                    k0, v0 = adapter.cache_kv(cache, next(iter(drop)))
                    masked = sum(int(d.sum()) for d in drop.values()) * (
                        k0.shape[-1] * k0.element_size() + v0.shape[-1] * v0.element_size())
        else:
            compacted = tuple(evl)
        if latent:  # what each head attends (the layer stores their union once)
            kept_layers = tuple(kept[i].clone() for i in range(L))
        else:
            kept_layers = tuple(adapter.layer_positions(cache, src[l]) for l in evl)
        timings["evict"] = time.perf_counter() - t0 if evict else 0.0
        timings["batch"] = 1
        after = adapter.cache_bytes(cache)
        shift = 0
        if rerotate and evict:
            rerotate_keys(self.model, cache, kept, evl, compacted, uniform=not (drop or ragged))
            shift = T - keep.shape[-1]
        return RunState(policy=policy, B=B, defer=defer, kept=kept, compacted=compacted, before=before,
                        after=after, timings=timings, ids=ids, logits=logits, cache=cache, kept_layers=kept_layers,
                        not_compacted=skipped, layer_before=layer_before, layer_after=tuple(adapter.layer_bytes(cache)),
                        drop=drop or None, masked=masked, shift=shift, state=state)

    def _decode(self, states: list[RunState], keep_cache: bool = False) -> list[GenerationResult]:
        """Greedy decoding of every state to ``max_new_tokens`` (or EOS), batching states whose caches have
        the same length at the same step; a lone state runs exactly as an unbatched generation."""
        n = self.n
        for st in states:
            st.done = st.finished(n, self.eos)
        bar = tqdm(total=sum(n - len(st.ids) for st in states if not st.done), desc="decode",
                   disable=not self.progress, leave=False)
        with adapter.positions_context(self.model) as pstate:
            decode_steps(self, states, bar, pstate)
        bar.close()
        out = [st.result(self.T, n, self.tokenizer, self.layers) for st in states]
        if not keep_cache:  # kept by a state to continue; else freed (a batch's, before the runs that decode alone)
            for st in states:
                st.cache = None
        return out
