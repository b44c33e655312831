"""Pruned prefill that really runs (SPEC §6–§7, paper §2.2 and §5 steps 1–7).

The prompt runs through the model's own forward with per-layer pre-hooks. At each monitored
layer the hooks read the rows just captured and take the paper's decision online (the candidate
``E_l`` from the proposal rows only, the stability streak, then the independent audit). At the
first accepted layer ``l*`` (or a layer the user fixes) the hooks gather the hidden states
``X^{l*}|_R`` and the KV entries of layers ``≤ l*`` at ``R = [T] \\ E``, and every later block runs
on ``R`` only with the original position ids (RoPE positions are not renumbered). Decoding then
continues at position ``T`` on a cache of length ``T' = |R|``. This is not textual truncation.

``l* = -1`` prunes before layer 0 (a forward on the shortened sequence with the original
position ids); ``l* = L-1`` shrinks only the cache.

Sliding windows (SPEC §7 **[decided]**): after a gather a window is measured in original positions — a
retained key ``j`` is visible to query ``u`` when ``0 ≤ u - j < window`` — in the pruned prefill (the
gathered mask is the original mask restricted to ``R``), in every decode step after it, and in the
``l* = -1`` reference :func:`run_full` with ``positions=R`` (:func:`workbench.run.adapter.original_positions`),
so the oracle holds when the window binds, under ``sdpa`` and ``eager`` alike.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.procedure import TraceResult, trace
from workbench.capture import RowSet, capture_attention
from workbench.capture.data import Capture
from workbench.capture.identity import check_model_match
from workbench.checks import check_context, check_max_new_tokens
from workbench.constraints import PARAMS, pruned_layer
from workbench.run import adapter, families
from workbench.run.generate import forced_continue, greedy_continue, stop_token_ids
from workbench.run.models import unwrap_model
from workbench.run.spans import spans_of


@dataclass
class PruneResult:
    """What a pruned prefill did and what the model then answered.

    Attributes:
        l_star: the layer after which the gather happened (``-1``: before layer 0), ``None`` on bypass.
        removed: removed candidate-chunk indices ``E`` (empty on bypass).
        retained: retained prompt positions ``R``, int64 ``[T']``.
        T, T_prime: prompt length and retained length.
        mode: ``"adaptive"`` (the 7-step procedure), ``"fixed"`` (a user-fixed layer, the proposal's
            ``E_l``) or ``"explicit"`` (a user-given ``E``).
        decision: a sentence; says "bypass" when no layer passed and the full prefill ran.
        trace: the per-layer trace of the executed monitored layers (``None`` in explicit mode).
        generated_ids: the greedy tokens ``y_1 … y_n``; ``text`` their decoding.
        first_logits: float32 ``[V]`` logits of the first generated token.
        prefill_s, decode_s: wall times.
        kv_bytes: bytes of the KV cache after the prefill.
        hidden: block inputs ``{l: float32 [T', D]}`` for ``l > l*`` (and ``L`` = final-norm input), when asked.
        logits: with ``forced``, float32 ``[n, V]``: row ``j`` predicts ``forced[j]`` (teacher forcing; row 0 is
            ``first_logits``); ``generated_ids`` are then the forced ids.
    """

    l_star: int | None
    removed: list[int]
    retained: torch.Tensor
    T: int
    T_prime: int
    mode: str
    decision: str
    trace: TraceResult | None
    generated_ids: list[int]
    text: str
    first_logits: torch.Tensor
    prefill_s: float
    decode_s: float
    kv_bytes: int
    params: dict = field(default_factory=dict)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None

    @property
    def bypass(self) -> bool:
        return self.l_star is None

    def summary(self) -> dict:
        return dict(mode=self.mode, l_star=self.l_star, bypass=self.bypass, removed=list(self.removed), T=self.T,
                    T_prime=self.T_prime, saved_tokens=self.T - self.T_prime, text=self.text,
                    first_token=int(self.first_logits.argmax()), prefill_s=self.prefill_s, decode_s=self.decode_s,
                    kv_bytes=self.kv_bytes, decision=self.decision)

    def to_frame(self) -> pd.DataFrame:
        """One row: the summary of the run."""
        return pd.DataFrame([self.summary()])


def _check_removed(spans, removed) -> list[int]:
    """Chunk indices from chunk indices or a token mask; a mask touching protected tokens raises."""
    if isinstance(removed, torch.Tensor) and removed.dtype == torch.bool:
        if removed.shape != (spans.T,):
            raise ValueError(f"removed: a token mask must have shape [T] = [{spans.T}], got {tuple(removed.shape)}")
        prot = spans.protected_mask()
        bad = torch.nonzero(removed & prot).flatten()
        if bad.numel():
            raise ValueError(f"removed: the removal set cuts into protected tokens at positions {bad[:8].tolist()}; "
                             "only whole candidate chunks can be removed")
        chunk_of = spans.chunk_of()
        out = sorted(set(chunk_of[removed].tolist()))
        for i in out:
            s, e = spans.chunks[i]
            if not bool(removed[s:e].all()):
                raise ValueError(f"removed: chunk {i} is removed only in part; a removal set is a union of chunks")
        return out
    out = sorted(set(int(i) for i in removed))
    for i in out:
        if not 0 <= i < spans.k:
            raise ValueError(f"removed: chunk index {i} out of range [0, {spans.k - 1}] (k = {spans.k})")
    return out


def _forced_ids(forced, max_new_tokens: int) -> list[int]:
    f = [int(i) for i in torch.as_tensor(forced).flatten().tolist()]
    if not 1 <= len(f) <= max_new_tokens:
        raise ValueError(f"forced: must hold 1 to max_new_tokens = {max_new_tokens} token ids, got {len(f)}")
    return f


class _Gatherer:
    """Pre-hooks that take the online decision and restrict every later block to ``R``."""

    def __init__(self, model, spans, rec, params, mode, fixed_layer, fixed_removed, progress):
        self.model, self.spans, self.rec, self.params = model, spans, rec, params
        self.shape = adapter.model_shape(model)
        self.mode = mode
        self.l_star: int | None = fixed_layer if mode != "adaptive" else None
        self.removed: list[int] = list(fixed_removed or [])
        self.R: torch.Tensor | None = None
        self.cache = None
        self.monitored = params.monitored_layers(self.shape.L) if mode == "adaptive" else ()
        self.progress = progress
        self.hidden: dict[int, torch.Tensor] = {}
        self.keep_hidden = False

    def _partial_capture(self, upto: int) -> Capture:
        rec = self.rec
        return Capture(attn=rec.attn[: upto + 1].cpu(), row_pos=rec.row_pos, row_kind=self.row_kind,
                       head_group=self.shape.head_group(), vnorm_max=rec.vnorm_max[: upto + 1].cpu(),
                       spans=self.spans, model_id="(online)")

    def decide(self, l: int) -> None:
        """Online step at monitored layer ``l`` (its rows were just captured)."""
        mon = tuple(m for m in self.monitored if m <= l)
        tr = trace(self._partial_capture(l), self.params.replace(monitored=mon), certify=False)
        if tr.l_star == l:
            self.l_star, self.removed = l, list(tr.removed)

    def fixed_proposal(self, l: int) -> None:
        """Fixed-layer mode: take the proposal ``E_l`` at layer ``l`` (no audit gate)."""
        if l < 0 or self.spans.k == 0:
            return
        tr = trace(self._partial_capture(l), self.params.replace(monitored=(max(l, 1),), streak=0), certify=False)
        sel = tr.selections.get(max(l, 1))
        self.removed = list(sel.removed) if sel is not None else []

    def pre_hook(self, j: int):
        """Hook on block ``j`` (``j = L``: the final norm)."""

        def hook(module, args, kwargs):
            first = False
            if self.R is None:
                l = j - 1
                if self.mode == "adaptive" and l in self.monitored:
                    self.decide(l)
                elif self.mode == "fixed" and l == self.l_star and not self.removed:
                    self.fixed_proposal(l)
                if self.l_star is not None and self.l_star == l:
                    self.R = self.spans.retained_positions(self.removed)
                    self.rec.stop_after = l
                    adapter.gather_cache_positions(self.cache, range(l + 1), self.R, self.spans.T)
                    first = True
            if self.R is not None:
                if j == self.shape.L:  # final norm: hidden states only
                    if first:
                        args = (args[0].index_select(1, self.R.to(args[0].device)),) + tuple(args[1:]) if args else args
                        if not args:
                            kwargs = dict(kwargs)
                            kwargs["hidden_states"] = kwargs["hidden_states"].index_select(1, self.R)
                else:
                    args, kwargs = adapter.gather_layer_call(args, kwargs, self.R, hidden=first)
            if self.keep_hidden and (self.R is not None) and j not in self.hidden:
                self.hidden[j] = adapter.layer_hidden(args, kwargs)[0].detach().float().cpu()
            if self.progress is not None:
                self.progress.update(1)
            return args, kwargs

        return hook


@contextlib.contextmanager
def _hooks(model, gatherer):
    layers = adapter.decoder_layers(model)
    handles = [layers[j].register_forward_pre_hook(gatherer.pre_hook(j), with_kwargs=True) for j in range(len(layers))]
    handles.append(adapter.final_norm(model).register_forward_pre_hook(gatherer.pre_hook(len(layers)), with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def run_pruned(
    model,
    prompt,
    params: EntroPrefillParams | None = None,
    *,
    layer: int | None = None,
    removed=None,
    max_new_tokens: int = 16,
    keep_hidden: bool = False,
    progress: bool = True,
    allow_foreign: bool = False,
    forced=None,
) -> PruneResult:
    """Prefill with mid-prefill pruning, then greedy-decode ``max_new_tokens`` tokens.

    Args:
        model: a :class:`~workbench.run.models.LoadedModel` or an HF causal LM.
        prompt: a :class:`~workbench.run.prompt.Prompt` (or its spans).
        params: EntroPrefill parameters (monitored layers, thresholds, audit, ...).
        layer: ``None`` for the adaptive 7-step procedure; an integer ``l* ∈ [-1, L-1]`` to fix the
            layer (``-1`` = before layer 0).
        removed: with ``layer``: the removal set ``E`` as chunk indices or a bool token mask ``[T]``;
            ``None`` takes the proposal ``E_l`` at that layer (``layer ≥ 1``: monitored layers are
            ``1 … L-1``; ``layer ∈ {-1, 0}`` needs an explicit ``removed``).
        max_new_tokens: greedy tokens to generate, ``≥ 1``.
        keep_hidden: keep the block inputs of layers ``> l*`` (for the stability diagnostics).
        allow_foreign: run spans built by another tokenizer, or a capture of another model (refused
            by default: :func:`~workbench.capture.identity.check_model_match`).
        forced: token ids (1 to ``max_new_tokens``, e.g. the full-cache answer) to decode teacher-forced instead
            of greedily (:func:`~workbench.run.generate.forced_continue`); :attr:`PruneResult.logits` holds every row.
    """
    params = params or EntroPrefillParams()
    model, tok, model_id = unwrap_model(model)
    why = families.prune_refusal(model, "run_pruned: pruned prefill")
    if why:
        raise ValueError(why)
    spans = spans_of(prompt)
    check_model_match(model, tok, prompt, allow_foreign=allow_foreign)
    shape = adapter.model_shape(model)
    check_max_new_tokens(max_new_tokens)
    forced = _forced_ids(forced, max_new_tokens) if forced is not None else None
    check_context(spans.T, max_new_tokens, shape.max_context)
    why = families.position_refusal(model, "run_pruned: pruned prefill", spans.T + max_new_tokens)
    if why:
        raise ValueError(why)
    PARAMS["keep_hidden"].check("keep_hidden", keep_hidden)
    pruned_layer(shape.L).check("layer", layer)
    if layer is not None and layer in (-1, 0) and removed is None:
        raise ValueError(f"layer: the proposal E_l exists for monitored layers l in [1, {shape.L - 1}]; "
                         f"with layer={layer} pass the removal set explicitly (removed=...)")
    if removed is not None and layer is None:
        raise ValueError("removed: an explicit removal set needs a fixed layer (pass layer=...)")
    mode = "adaptive" if layer is None else ("explicit" if removed is not None else "fixed")
    fixed_removed = _check_removed(spans, removed) if removed is not None else None
    if mode == "adaptive":
        params.monitored_layers(shape.L)  # validates the monitored layers against L
    rows = RowSet(observers=True, audit="query", tail=0)
    wanted = rows.rows(spans)
    T = spans.T
    device = next(model.parameters()).device
    ids = torch.tensor([spans.input_ids], dtype=torch.int64, device=device)
    bar = tqdm(total=shape.L + 1 + max_new_tokens - 1, desc="pruned prefill", disable=not progress, leave=False)
    with capture_attention(model, [p for _, p in wanted], K=T, T=T) as rec:
        g = _Gatherer(model, spans, rec, params, mode, layer, fixed_removed, bar)
        g.row_kind = [k for k, _ in wanted]
        g.keep_hidden = keep_hidden
        g.cache = adapter.new_cache(model)
        rec.positions = torch.arange(T)
        t0 = time.perf_counter()
        with _hooks(model, g):
            out = adapter.forward(model, ids, cache=g.cache, logits_to_keep=1)
        prefill_s = time.perf_counter() - t0
    cache = adapter.output_cache(out) or g.cache
    kv_bytes = adapter.cache_bytes(cache)
    first_logits = out.logits[0, -1].float().cpu()
    t1 = time.perf_counter()
    if g.R is not None:
        adapter.track_positions(cache, g.R)
    logits = None
    with adapter.positions_context(model, cache) as pstate:
        def step(t):
            pstate.q_pos = torch.tensor([T + t - 1])
            bar.update(1)
        if forced is not None:
            generated = forced
            rest, cache = forced_continue(model, cache, generated, T, on_step=step)
            logits = torch.cat([first_logits[None], rest]) if len(generated) > 1 else first_logits[None]
        else:
            generated, _, cache = greedy_continue(model, cache, int(first_logits.argmax()), T, max_new_tokens,
                                                  stop_token_ids(model, tok), on_step=step)
    decode_s = time.perf_counter() - t1
    bar.close()
    R = g.R if g.R is not None else torch.arange(T)
    l_star = g.l_star if g.R is not None else None
    tr = None
    if mode == "adaptive" or mode == "fixed":
        upto = l_star if l_star is not None and l_star >= 0 else shape.L - 1
        mon = tuple(m for m in params.monitored_layers(shape.L) if m <= upto) if mode == "adaptive" else (max(upto, 1),)
        if mon:
            tr = trace(g._partial_capture(max(upto, max(mon))), params.replace(monitored=mon) if mode == "adaptive"
                       else params.replace(monitored=mon, streak=0))
    removed_final = list(g.removed) if l_star is not None else []
    if l_star is None:
        decision = ("bypass: no monitored layer accepted; the full prefill ran" if mode == "adaptive"
                    else "bypass: nothing pruned")
    else:
        where = "before layer 0" if l_star == -1 else f"after layer {l_star}"
        decision = (f"{mode}: pruned {T - len(R)} of {T} tokens (chunks {removed_final}) {where}; "
                    f"layers > {l_star} ran on T' = {len(R)} tokens")
    text = tok.decode(generated) if tok is not None else ""
    return PruneResult(l_star=l_star, removed=removed_final, retained=R.cpu(), T=T, T_prime=int(len(R)), mode=mode,
                       decision=decision, trace=tr, generated_ids=generated, text=text, first_logits=first_logits,
                       prefill_s=prefill_s, decode_s=decode_s, kv_bytes=kv_bytes, params=params.to_dict(),
                       hidden=g.hidden, logits=logits)


@torch.no_grad()
def run_full(model, prompt, *, max_new_tokens: int = 16, keep_hidden: bool = False, positions=None,
             progress: bool = False) -> PruneResult:
    """The unpruned reference with the same interface (``positions``: feed only these prompt
    positions with their original position ids, i.e. textual removal with original RoPE positions; a
    sliding window then counts original positions, not retained tokens, as in :func:`run_pruned`)."""
    model, tok, _ = unwrap_model(model)
    spans = spans_of(prompt)
    T = spans.T
    check_max_new_tokens(max_new_tokens)
    PARAMS["keep_hidden"].check("keep_hidden", keep_hidden)
    check_context(T, max_new_tokens, adapter.model_shape(model).max_context)
    device = next(model.parameters()).device
    R = torch.arange(T) if positions is None else torch.as_tensor(positions, dtype=torch.int64)
    ids = torch.tensor([spans.input_ids], dtype=torch.int64)[:, R].to(device)
    hidden: dict[int, torch.Tensor] = {}
    handles = []
    if keep_hidden:
        layers = adapter.decoder_layers(model)
        mods = list(layers) + [adapter.final_norm(model)]
        for j, mod in enumerate(mods):
            def hook(module, args, kwargs, j=j):
                hidden.setdefault(j, adapter.layer_hidden(args, kwargs)[0].detach().float().cpu())
            handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
    cache = adapter.new_cache(model)
    ctx = adapter.positions_context(model, cache) if positions is not None else contextlib.nullcontext(
        adapter.PositionState(cache=cache))
    with ctx as pstate:
        pstate.q_pos = R
        t0 = time.perf_counter()
        try:
            out = adapter.forward(model, ids, cache=cache, position_ids=R[None].to(device), logits_to_keep=1)
        finally:
            for h in handles:
                h.remove()
        prefill_s = time.perf_counter() - t0
        cache = adapter.output_cache(out) or cache
        kv_bytes = adapter.cache_bytes(cache)  # after the prefill, as run_pruned reports it
        first_logits = out.logits[0, -1].float().cpu()
        t1 = time.perf_counter()

        def step(t):
            pstate.q_pos = torch.tensor([T + t - 1])
        generated, _, cache = greedy_continue(model, cache, int(first_logits.argmax()), T, max_new_tokens,
                                              stop_token_ids(model, tok), on_step=step)
    return PruneResult(l_star=None, removed=[], retained=R, T=T, T_prime=int(len(R)), mode="full",
                       decision="full prefill" if positions is None else "shortened sequence, original positions",
                       trace=None, generated_ids=generated, text=tok.decode(generated) if tok is not None else "",
                       first_logits=first_logits, prefill_s=prefill_s, decode_s=time.perf_counter() - t1,
                       kv_bytes=kv_bytes, hidden=hidden)
