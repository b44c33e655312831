"""What one eviction run returns (:class:`GenerationResult`), and the tables built from results: needle
survival (:func:`survival_table`) and the prompt positions of a piece of text (:func:`token_positions`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor

__all__ = ["GenerationResult", "PolicyRunError", "survival_table", "token_positions"]


class PolicyRunError(RuntimeError):
    """A policy's run failed (its :attr:`GenerationResult.error`): raised where a failed run must not pass as a
    result, such as a sweep cell, whose row then carries this error and is left out of every comparison."""


@dataclass
class GenerationResult:
    """One generation under a policy and budget.

    Attributes:
        policy: policy name; params: its parameters; budget: ``B`` (prompt positions per layer and group).
        T: prompt length.
        ids: generated token ids; text: their decoded text (``None`` without a tokenizer).
        kept: int64 ``[L, G, S']`` positions kept at eviction (the ``min(B, T)`` prompt positions, then
            the generated tokens held at that moment), sorted; for the full cache every position. With a
            budget allocation the prompt part is ``-1``-padded to the largest count.
        evicted_at: decode step after which the eviction ran (0 or 1).
        compacted_layers: layers whose cache was compacted (every layer the budget applies to; with
            ``B ≥ T`` nothing is evicted and every layer is listed).
        kv_bytes_before / kv_bytes_after: cache bytes just before and just after eviction (with per-head
            budgets the dense cache keeps each layer's largest head count: masked entries still count).
        kept_layers: per layer, int64 ``[G, S_l]`` original positions the layer holds after eviction (a
            sliding-window layer: at most ``B`` prompt positions its window still sees, then the generated
            tokens; a full layer: ``kept[l]``). ``[G_l, S_l]`` where the layer has ``G_l < G`` KV heads (one row
            per KV head); a KV-shared layer (Gemma-3n/4) reports its source's rows, which it attends.
        not_compacted: ``{layer: reason}`` for layers that could not be compacted (a warning was issued).
        kv_layer_bytes_before / kv_layer_bytes_after: cache bytes per layer just before and after eviction.
        kv_bytes_masked: bytes of the entries held but masked out of attention (per-head budgets).
        kv_bytes_state: bytes of the fixed-size recurrent and convolution states of a hybrid's cache (its
            linear-attention, Mamba or convolution layers; Falcon-H1's Mamba-2 beside attention): not evictable,
            left as they are, and not counted in ``kv_bytes_before``/``kv_bytes_after`` (the evictable bytes).
        layers: the decoder layer of every row of ``kept`` and ``kept_layers`` (the evictable layers,
            :func:`workbench.run.layer_roles.scored_layers`: every layer but a hybrid's recurrent ones);
            ``()`` for a result that did not run.
        rerotated: the kept keys were re-positioned to ``0 … S'-1`` (``run(..., rerotate=True)``).
        timings: seconds: ``prefill`` (with capture when needed), ``defer`` (decode step 1 on the full
            cache), ``answer`` (full-cache answer for the oracle), ``score`` (scores + selection),
            ``evict`` (cache compaction).
        step_s: seconds of every decode forward after eviction (one per generated token after the
            eviction, the last generated token needs none).
        logits: optional float32 ``[n, V]`` logits of every generated token.
        error: ``None``, or why this policy did not run (``run_policies``/``run_batch`` record one policy's
            failure here and return the others' results; ``ids`` is then empty).
    """

    policy: str
    params: dict
    budget: int
    T: int
    ids: list[int]
    text: str | None
    kept: Tensor
    evicted_at: int
    compacted_layers: tuple[int, ...]
    kv_bytes_before: int
    kv_bytes_after: int
    timings: dict
    step_s: list[float] = field(default_factory=list)
    logits: Tensor | None = None
    kept_layers: tuple = ()
    not_compacted: dict = field(default_factory=dict)
    kv_layer_bytes_before: tuple = ()
    kv_layer_bytes_after: tuple = ()
    kv_bytes_masked: int = 0
    rerotated: bool = False
    error: str | None = None
    kv_bytes_state: int = 0
    layers: tuple = ()

    @classmethod
    def failed(cls, policy, budget: int, T: int, error: str | Exception) -> "GenerationResult":
        """The result of a policy that could not run: no tokens, no cache, ``error`` the message (an exception
        as ``"TypeName: message"``)."""
        if isinstance(error, Exception):
            error = f"{type(error).__name__}: {error}"
        return cls(policy=policy.name, params=policy.params(), budget=budget, T=T, ids=[], text=None,
                   kept=torch.empty(0, 0, 0, dtype=torch.int64), evicted_at=0, compacted_layers=(), kv_bytes_before=0,
                   kv_bytes_after=0, timings={}, error=error)

    @property
    def kept_prompt(self) -> Tensor:
        """Kept prompt positions; int64 ``[L, G, min(B, T)]`` (``-1``-padded with a budget allocation)."""
        return self.kept[..., : self.kept.shape[-1] - self.evicted_at]

    def dense_kv_bytes(self, per_position: int) -> int:
        """The bytes a dense cache holds for the kept entries: per layer its largest KV-group count of kept
        entries (prompt positions and the tokens decoded before eviction; a group with fewer holds masked
        slots, which still count) times ``per_position`` (``2·e·G·d``, ``adapter.kv_bytes_per_position``).
        What a preview, which has no cache, says the run's ``kv_bytes_after`` will be."""
        held = (self.kept >= 0).sum(-1).amax(-1)                      # [L]
        return int(per_position) * int(held.sum())

    def survival(self, positions) -> Tensor:
        """Fraction of ``positions`` kept, per layer and group (NaN for layers not compacted); float64 ``[L, G]``."""
        pos = torch.as_tensor(list(positions), dtype=torch.int64)
        if pos.numel() == 0:
            raise ValueError("positions: must not be empty")
        if self.kept_layers:  # what every layer really holds (sliding-window layers: their window)
            hit = torch.stack([(k[..., None] == pos).any(-2).to(torch.float64).mean(-1) for k in self.kept_layers])
            for l in self.not_compacted:
                hit[self.layers.index(l) if self.layers else l] = float("nan")
            return hit
        hit = (self.kept_prompt[..., None] == pos).any(-2).to(torch.float64).mean(-1)
        if self.policy != "full":
            mask = torch.ones(hit.shape[0], dtype=torch.bool)
            rows = [self.layers.index(l) for l in self.compacted_layers if l in self.layers] if self.layers \
                else list(self.compacted_layers)
            mask[rows] = False
            hit[mask] = float("nan")
        return hit

    def to_frame(self) -> pd.DataFrame:
        """One row: ``policy, budget, T, n_new, text, kv_bytes_before, kv_bytes_after, kv_ratio,
        prefill_s, score_s, evict_s, step_s_median`` and the parameters (``param_*``)."""
        steps = sorted(self.step_s)
        d = {
            "policy": self.policy, "budget": self.budget, "T": self.T, "n_new": len(self.ids), "text": self.text,
            "evicted_at": self.evicted_at, "kv_bytes_before": self.kv_bytes_before,
            "kv_bytes_after": self.kv_bytes_after, "kv_bytes_masked": self.kv_bytes_masked, "rerotated": self.rerotated,
            "kv_bytes_state": self.kv_bytes_state,
            "kv_ratio": self.kv_bytes_after / self.kv_bytes_before if self.kv_bytes_before else float("nan"),
            "layers_not_compacted": len(self.not_compacted), "error": self.error,
            **{f"{k}_s": v for k, v in self.timings.items()},
            "step_s_median": steps[len(steps) // 2] if steps else float("nan"),
        }
        d.update({f"param_{k}": v for k, v in self.params.items()})
        return pd.DataFrame([d])

    def steps_frame(self) -> pd.DataFrame:
        """One row per decode forward after eviction: ``step, seconds``."""
        start = self.evicted_at + 1
        return pd.DataFrame({"step": range(start, start + len(self.step_s)), "seconds": self.step_s})


# ----------------------------------------------------------------------------- running


def token_positions(prompt, tokenizer, text: str, within: str | None = None) -> list[int]:
    """Prompt positions of the tokens lying inside the first occurrence of ``text`` in the prompt's text
    (e.g. a needle), or its first occurrence inside the first occurrence of ``within`` (e.g. an answer in
    its gold passage, when a distractor or the question also holds it); from the tokenizer's character
    offsets on the rendered text."""
    full = prompt.text
    if within is not None:
        start = full.find(within)
        if start < 0:
            raise ValueError("within: does not occur in the prompt")
        at = within.find(text)
        if at < 0:
            raise ValueError("text: does not occur in within")
        at += start
    else:
        at = full.find(text)
    if at < 0:
        raise ValueError("text: does not occur in the prompt")
    chat = bool(getattr(tokenizer, "chat_template", None))
    enc = tokenizer(full, return_offsets_mapping=True, add_special_tokens=not chat)
    if list(enc["input_ids"]) != list(prompt.spans.input_ids):
        raise ValueError("tokenizer: does not reproduce the prompt's token ids")
    return [t for t, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < at + len(text) and b > at]


def survival_table(results, positions, answer: str | None = None) -> pd.DataFrame:
    """One row per result: ``policy, budget, answer`` (the text), ``correct`` (``answer`` occurs in it,
    case-insensitive), and how many of ``positions`` (e.g. the needle's tokens) the cache kept:
    ``kept_mean`` (over compacted layers and groups), ``kept_min_layer`` (the worst layer's mean over
    its groups) and ``layers_all_kept`` (layers where every group kept every position); ``error``: why a run
    failed (its ``correct`` and counts are then empty: a failed run kept nothing and answered nothing, which is not
    a wrong answer)."""
    rows = []
    for r in results:
        if r.error is not None:
            rows.append({"policy": r.policy, "budget": "all" if r.policy == "full" else r.budget, "answer": None,
                         "correct": None, "kept_mean": float("nan"), "kept_min_layer": float("nan"),
                         "layers_all_kept": None, "error": r.error})
            continue
        surv = r.survival(positions)
        per_layer = surv.nanmean(-1)
        rows.append({
            "policy": r.policy,
            "budget": "all" if r.policy == "full" else r.budget,
            "answer": (r.text or "").strip().replace("\n", " "),
            "correct": bool(answer is not None and r.text is not None and answer.lower() in r.text.lower()),
            "kept_mean": round(float(surv.nanmean()), 3),
            "kept_min_layer": round(float(per_layer[~per_layer.isnan()].min()), 3) if (~per_layer.isnan()).any()
            else float("nan"),
            "layers_all_kept": int((surv == 1.0).all(-1).sum()),
            "error": None,
        })
    return pd.DataFrame(rows)
