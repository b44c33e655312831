"""Exact attention-row capture through transformers' attention interface (SPEC §1).

``capture_attention`` registers a wrapper around the model's own attention implementation (sdpa
or eager; under eager the model's own modelling module's eager function, never Llama's) and
selects it with ``model.set_attn_implementation``. The wrapper calls the original kernel unchanged (so
the model's outputs are unchanged) and, from the same post-RoPE ``query [B, H_Q, q, d]`` and
``key [B, G, S, d]``, the same scaling, soft-capping, mask and learned sinks (gpt-oss ``s_aux``: rows then
sum to less than 1, exactly as the model computes them, and the mass on the sink is kept as
``Capture.learned_sink``), computes only the requested rows ``A^{l,h}_{u,·}``:
``O(L · H_Q · |rows| · T)`` memory, never a ``T × T`` matrix. The context manager always restores the
implementation and removes its hooks. A model outside the supported families
(:mod:`workbench.run.families`) is refused.

``run_capture`` runs a prompt (prefill, then optional greedy decode steps) and returns a
:class:`~workbench.capture.data.Capture`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch
from tqdm.auto import tqdm

from workbench._version import __version__
from workbench.capture.budget import (
    CAPTURE_CHECKS,
    ESTIMATE_CHECKS,
    check_capture_budget,
    estimate_capture_bytes,
    max_capture_bytes,
    row_dtype,
)
from workbench.capture.data import Capture
from workbench.checks import check_args, check_context, check_fields
from workbench.choices import RowDtype
from workbench.constraints import checked, index_into, shared, zero_upto
from workbench.run import adapter, families
from workbench.run.spans import PromptSpans, spans_of

__all__ = ["capture_attention", "run_capture", "RowSet", "Capture"]


@checked()
@dataclass(frozen=True)
class RowSet:
    """Which query rows to capture.

    Attributes:
        observers: capture the proposal observers ``𝒬_p`` (kind ``"observer"``).
        audit: ``"query"`` (every user-query position; ``trace`` audits on those outside the observers,
            SPEC §6),
            ``None`` for none, or explicit positions (kind ``"audit"``).
        tail: prompt-tail window ``W``: rows ``T-W … T-1`` (kind ``"tail"``; ``r = -W+1 … 0``).
        custom: extra prompt positions (kind ``"custom"``).
        n_decode: greedy decode steps ``1 … n`` whose queries are captured (kind ``"decode"``).
    """

    observers: bool = True
    audit: str | tuple[int, ...] | None = "query"
    tail: int = 32
    custom: tuple[int, ...] = ()
    n_decode: int = 0
    _parameter_constraints: ClassVar = shared("observers", "audit", "tail", "custom", "n_decode")

    def __post_init__(self):
        check_fields(self)  # every field against its declared constraint
        for name in ("audit", "custom"):  # explicit positions stored as a tuple of ints
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                object.__setattr__(self, name, self.CHECKS[name].check(name, v))

    def rows(self, spans: PromptSpans) -> list[tuple[str, int]]:
        """``(kind, absolute position)`` of every requested row, prompt rows then decode rows."""
        T = spans.T
        out: list[tuple[str, int]] = []
        if self.observers:
            out += [("observer", p) for p in spans.observers]
        if self.audit == "query":
            out += [("audit", p) for p in range(*spans.query)]
        elif self.audit is not None:
            out += [("audit", int(p)) for p in self.audit]
        out += [("tail", p) for p in range(max(0, T - self.tail), T)]
        out += [("custom", int(p)) for p in self.custom]
        inside = index_into(T, note=f"a position of the prompt of T = {T} tokens")
        for kind, p in out:
            inside.check(kind, p)
        out += [("decode", T + t - 1) for t in range(1, self.n_decode + 1)]
        return out

    def as_dict(self) -> dict:
        return {"observers": self.observers, "audit": self.audit if isinstance(self.audit, (str, type(None))) else list(self.audit),
                "tail": self.tail, "custom": list(self.custom), "n_decode": self.n_decode}


class AttentionRecorder:
    """Receives attention calls and writes the requested rows into ``attn [L, H_Q, R, K]``.

    Rows are computed in float32 on the device of each layer's query (layers may sit on different
    devices) and moved to the host as each attention call is recorded, rounded once to ``dtype``; on CUDA
    through one pinned staging buffer (asynchronous copy, then synchronised). So the accelerator holds at
    most one call's rows (one layer), never ``[L, H_Q, R, K]``. The H2O column sums are accumulated per
    call in float64 on the layer's device (``[H_Q, T]``) and added to the host ``colsum`` once per call.
    """

    def __init__(self, shape: adapter.ModelShape, row_pos: list[int], K: int, T: int | None,
                 device: torch.device, hidden_layers=(), progress=None, colsum: bool = False,
                 colsum_tile: int = 128, dtype: torch.dtype = torch.float32):
        if colsum and T is None:
            raise ValueError("T: the prompt length is required when colsum=True")
        ESTIMATE_CHECKS["colsum_tile"].check("colsum_tile", colsum_tile)
        self.shape = shape
        self.row_pos = torch.tensor(row_pos, dtype=torch.int64)
        self.K = K
        self.T = T
        # --- scale: rows live on the host in their storage dtype (staged through pinned memory on CUDA)
        self.pinned = torch.device(device).type == "cuda" and torch.cuda.is_available()
        self.attn = torch.zeros(shape.L, shape.H_Q, len(row_pos), K, dtype=dtype)  # pageable; copies staged below
        self.vnorm_max = torch.zeros(shape.L, shape.G, dtype=torch.float32)
        self.device_peak_rows = 0  # largest rows block held on an accelerator at once (bytes), for checks
        self._stage: torch.Tensor | None = None  # pinned staging buffer for device → host copies (CUDA)
        self.hidden_layers = tuple(hidden_layers)
        self.hidden: dict[int, torch.Tensor] = {}
        self.positions: torch.Tensor | None = None  # absolute positions of the current input tokens
        self.progress = progress
        self.stop_after: int | None = None  # capture nothing in layers > stop_after
        self._calls = 0
        # H2O accumulator: Σ_u A^{l,h}_{u,j} over every prompt query u < T (float64 [L, H_Q, T])
        self.colsum = torch.zeros(shape.L, shape.H_Q, T, dtype=torch.float64) if colsum else None
        self.colsum_tile = colsum_tile
        self.learned_sink: torch.Tensor | None = None  # [L, H_Q, R]: mass on the learned sink (gpt-oss)
        self._sink_p: torch.Tensor | None = None

    # the attention function wrapper -------------------------------------------------
    def make_wrapper(self, base_fn):
        def workbench_capture_attention(module, query, key, value, attention_mask, **kwargs):
            out = base_fn(module, query, key, value, attention_mask, **kwargs)
            with torch.no_grad():
                self.record(adapter.read_attention_call(module, query, key, value, attention_mask, kwargs))
            return out

        return workbench_capture_attention

    def record(self, call: adapter.AttentionCall) -> None:
        q, k = call.query, call.key
        if q.shape[0] != 1:
            raise ValueError(f"batch: capture supports batch size 1, got {q.shape[0]}")
        l = call.layer_idx if call.layer_idx >= 0 else self._calls % self.shape.L
        self._calls += 1
        if self.stop_after is not None and l > self.stop_after:
            return  # rows after a mid-prefill gather are not captured (pruned execution)
        q_len, S = q.shape[2], k.shape[2]
        if self.positions is not None and len(self.positions) == q_len:
            q_abs = self.positions.to(torch.int64).cpu()
        else:  # a full cache: the queries are the last q_len keys
            q_abs = torch.arange(S - q_len, S)
        k0 = int(q_abs[-1]) - S + 1  # keys are the last S positions (full or sliding-window cache)
        if self.T is not None and k0 == 0 and S >= self.T and l < self.shape.L:
            vn = call.value[0, :, : self.T].float().norm(dim=-1).amax(dim=-1)  # [G_l]
            if vn.shape[0] != self.shape.G:  # per-layer KV heads: each group's heads read KV head h // r_l
                heads = torch.arange(self.shape.G, device=vn.device) * self.shape.r
                vn = vn[heads // (self.shape.H_Q // vn.shape[0])]
            self.vnorm_max[l] = torch.maximum(self.vnorm_max[l], vn.to(self.vnorm_max.device))
        if self.colsum is not None and l < self.shape.L:
            self._accumulate_colsum(call, l, q_abs, k0)
        # which requested rows are queries of this call
        r_idx, q_idx = self._hits(q_abs)
        if r_idx.numel() == 0:
            return
        probs = self._probs(call, q_idx, q_abs, k0)  # [H_Q, n, S]
        if call.sinks is not None:
            if self.learned_sink is None:
                self.learned_sink = torch.zeros(self.shape.L, self.shape.H_Q, len(self.row_pos), device=self.attn.device)
            self.learned_sink[l, :, r_idx.to(self.attn.device)] = self._sink_p.to(self.attn.device)
        lo = max(k0, 0)
        src = self._to_host(probs[..., lo - k0:])
        n = r_idx.numel()
        if n == len(self.row_pos) and bool((r_idx == torch.arange(n)).all()):
            self.attn[l, :, :, lo: k0 + S] = src  # every row in this call (a prefill): a plain copy
        else:
            self.attn[l, :, r_idx, lo: k0 + S] = src
        if self.progress is not None and q_len > 1:
            self.progress.update(1)

    def _to_host(self, probs: torch.Tensor) -> torch.Tensor:
        """One call's float32 rows ``[H_Q, n, S]`` in the storage dtype on the host (rounded on the device:
        half the bytes to move); on CUDA through a pinned staging buffer, synchronised before reuse."""
        self.device_peak_rows = max(self.device_peak_rows, probs.numel() * probs.element_size())
        x = probs.to(self.attn.dtype)
        if x.device.type == "cpu":
            return x
        if not self.pinned:
            return x.cpu()
        if self._stage is None or self._stage.numel() < x.numel():  # one pinned buffer, grown to the largest call
            self._stage = torch.empty(x.numel(), dtype=x.dtype, pin_memory=True)
        host = self._stage[: x.numel()].view(x.shape)
        host.copy_(x, non_blocking=True)
        torch.cuda.current_stream(x.device).synchronize()  # the buffer is reused by the next call
        return host

    def _hits(self, q_abs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r_idx, q_idx)``: requested rows that are queries of this call, and their query indices."""
        q0, q_len = int(q_abs[0]), q_abs.numel()
        if int(q_abs[-1]) - q0 + 1 == q_len:  # consecutive positions (prefill, decode): arithmetic, O(R)
            q_idx = self.row_pos - q0
            r_idx = torch.nonzero((q_idx >= 0) & (q_idx < q_len)).flatten()
            return r_idx, q_idx[r_idx]
        hit = self.row_pos[:, None] == q_abs[None, :]
        return torch.nonzero(hit, as_tuple=True)

    def _probs(self, call: adapter.AttentionCall, q_idx: torch.Tensor, q_abs: torch.Tensor, k0: int,
               S: int | None = None, contiguous: bool = False) -> torch.Tensor:
        """Softmax rows of the call's queries ``q_idx`` (indices into its ``q_len``) over its first ``S``
        keys (default all; the causal rule gives later keys probability 0, so they may be left out).

        Same scaling, soft-capping and mask as the model's kernel; ``q_abs [q_len]`` are the absolute
        query positions and ``k0`` the absolute position of key 0. ``contiguous``: ``q_idx`` is a range
        (sliced, not gathered). Returns float32 ``[H_Q, n, S]``.

        Few, fused operations (each costs a thread-pool round trip on CPU): the scaling is folded into
        the ``n`` queries, and the causal rule is an additive ``[n, S]`` bias fused into ``baddbmm``.
        """
        q, k = call.query, call.key
        S = k.shape[2] if S is None else S
        G, d = k.shape[1], q.shape[-1]  # the layer's own KV heads (Gemma-4: fewer on its global layers)
        r = q.shape[1] // G
        if contiguous:
            qs = q[0][:, int(q_idx[0]): int(q_idx[-1]) + 1]
        else:
            qs = q[0][:, q_idx.to(q.device)]  # [H_Q, n, d]
        n = qs.shape[1]
        scale = call.scaling if not call.softcap else 1.0
        qs = qs.float() * scale
        ks = k[0, :, :S].float()  # [G, S, d]
        if call.mask is None and not call.softcap and call.sinks is None:
            key_abs = torch.arange(k0, k0 + S, device=qs.device)
            bias = torch.zeros(n, S, device=qs.device).masked_fill_(
                key_abs[None, :] > q_abs[q_idx].to(qs.device)[:, None], float("-inf"))
            z = torch.baddbmm(bias.repeat(r, 1).expand(G, r * n, S), qs.reshape(G, r * n, d), ks.transpose(1, 2))
            return torch.softmax(z.reshape(G * r, n, S), dim=-1)
        z = torch.matmul(qs.reshape(G, r * n, d), ks.transpose(1, 2)).reshape(G * r, n, S)
        if call.softcap:
            z = torch.tanh(z * (call.scaling / call.softcap)) * call.softcap
        if call.mask is not None:
            m = call.mask[0][:, q_idx.to(call.mask.device)][..., :S]  # [1|H_Q, n, S]
            if m.dtype == torch.bool:
                z = z.masked_fill(~m, float("-inf"))
            else:
                z = z + m.float()
        else:
            key_abs = torch.arange(k0, k0 + S, device=z.device)
            causal = key_abs[None, :] <= q_abs[q_idx].to(z.device)[:, None]
            z.masked_fill_(~causal[None], float("-inf"))
        if call.sinks is not None:  # the learned sink is one more logit per head, dropped after the softmax
            sink = call.sinks.detach().float().to(z.device).reshape(-1, 1, 1).expand(z.shape[0], n, 1)
            p = torch.softmax(torch.cat([z, sink], dim=-1), dim=-1)
            self._sink_p = p[..., -1]
            return p[..., :-1]
        return torch.softmax(z, dim=-1)

    def _accumulate_colsum(self, call: adapter.AttentionCall, l: int, q_abs: torch.Tensor, k0: int) -> None:
        """H2O accumulator: add ``Σ_u A^{l,h}_{u,j}`` over this call's prompt queries ``u < T``.

        Computed in query tiles of ``colsum_tile`` rows (memory ``O(H_Q · tile · S)``, never
        ``T × T``), with the call's own mask (sliding windows, padding) or the causal rule.
        """
        S_all = call.key.shape[2]
        prompt_q = torch.nonzero(q_abs < self.T).flatten()
        acc = None  # float64 [H_Q, S_all] on the layer's device: one host transfer per call
        for i in range(0, prompt_q.numel(), self.colsum_tile):
            q_idx = prompt_q[i: i + self.colsum_tile]
            S = min(S_all, int(q_abs[q_idx].max()) - k0 + 1)  # keys after the tile's last query are masked
            probs = self._probs(call, q_idx, q_abs, k0, S, contiguous=bool(q_idx[-1] - q_idx[0] + 1 == q_idx.numel()))
            if acc is None:
                acc = torch.zeros(probs.shape[0], S_all, dtype=torch.float64, device=probs.device)
            acc[:, :S] += probs.sum(dim=1).double()  # [H_Q, S]
        if acc is not None:
            lo, hi = max(k0, 0), min(k0 + S_all, self.T)
            if hi > lo:
                self.colsum[l, :, lo:hi] += acc[:, lo - k0: hi - k0].cpu()

    # hidden-state hooks -------------------------------------------------------------
    def _hidden_hook(self, layer):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            if x is not None and x.shape[1] > 1 and layer not in self.hidden:
                self.hidden[layer] = x[0].detach().float().cpu()
        return hook


@contextlib.contextmanager
def capture_attention(model, row_pos: list[int], *, K: int, T: int | None = None,
                      hidden_layers=(), progress=None, colsum: bool = False, colsum_tile: int = 128,
                      dtype: RowDtype = "float32"):
    """Install the capture for one run; always restores the model's implementation and hooks.

    Args:
        model: an HF causal LM using the attention interface.
        row_pos: absolute query positions to capture (the ``R`` axis, duplicates allowed).
        K: length of the key axis to allocate (``T + n_decode``).
        T: prompt length (for the value norms of the prompt keys).
        hidden_layers: layers whose block input is stored (``L`` = final-norm input).
        colsum: also accumulate the H2O column sums ``Σ_{u<T} A^{l,h}_{u,j}`` over every prompt
            query (``rec.colsum``, float64 ``[L, H_Q, T]``; needs ``T``), in query tiles of
            ``colsum_tile`` rows, never a ``T × T`` matrix.
        dtype: storage dtype of the rows (``ROW_DTYPES``; computed in float32, see
            :mod:`workbench.capture.budget` for the error of half precision).
    Yields:
        the :class:`AttentionRecorder` (``attn [L, H_Q, R, K]``, ``vnorm_max [L, G]``, ``hidden``,
        ``colsum`` or ``None``).
    """
    adapter.check_supported(model)
    shape = adapter.model_shape(model)
    device = next(model.parameters()).device
    rec = AttentionRecorder(shape, row_pos, K, T, device, hidden_layers, progress, colsum, colsum_tile,
                            dtype=row_dtype(dtype))
    old = adapter.current_attn_implementation(model)
    base = old[len(adapter.CAPTURE_PREFIX):] if old.startswith(adapter.CAPTURE_PREFIX) else old
    name = adapter.register_wrapped_attention(base, rec.make_wrapper)
    handles = []
    try:
        layers = adapter.decoder_layers(model)
        for l in hidden_layers:
            zero_upto(shape.L, note=f"L = {shape.L}: the final norm's input").check("hidden_layers", l)
            mod = layers[l] if l < shape.L else adapter.final_norm(model)
            handles.append(mod.register_forward_pre_hook(rec._hidden_hook(l), with_kwargs=True))
        adapter.set_attn_implementation(model, name)
        yield rec
    finally:
        for h in handles:
            h.remove()
        adapter.set_attn_implementation(model, old)


def _input_device(model) -> torch.device:
    """Device of the input embedding (with ``device_map="auto"`` the layers may sit elsewhere)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    w = getattr(emb, "weight", None)
    return w.device if w is not None else next(model.parameters()).device


def _version() -> str:

    return __version__


def model_identity(model, model_id: str | None = None) -> str:
    s = adapter.model_shape(model)
    name = model_id or getattr(model.config, "_name_or_path", "") or type(model).__name__
    return f"{name} ({s.model_type}, L={s.L}, H_Q={s.H_Q}, G={s.G}, d={s.d})"


RUN_CAPTURE_CHECKS = {**CAPTURE_CHECKS, **shared("progress")}
"""The constraints of :func:`run_capture`'s scalar arguments."""


@torch.no_grad()
def run_capture(model, prompt, rows: RowSet | None = None, *, hidden_layers=(), model_id: str | None = None,
                progress: bool = True, dtype: RowDtype = "float32", max_bytes: int | None = None) -> Capture:
    """Prefill ``prompt`` (and greedily decode ``rows.n_decode`` steps) with capture on.

    Args:
        model: an HF causal LM, or a :class:`~workbench.run.models.LoadedModel`.
        prompt: a :class:`~workbench.run.prompt.Prompt` (or :class:`PromptSpans`).
        rows: which rows to capture (default :class:`RowSet()`: observers, the query as audit
            population, a 32-token prompt tail).
        hidden_layers: block inputs to keep (for stability diagnostics).
        dtype: storage dtype of the rows: ``"float32"`` (default), ``"float16"`` or ``"bfloat16"`` (half the
            host bytes; rows are computed in float32 and rounded once, error in :mod:`workbench.capture.budget`).
        max_bytes: refuse (``ValueError``, naming the estimate and the option that would fit) when the
            capture's host bytes exceed this; default ``$WORKBENCH_CAPTURE_MAX_BYTES``, else no limit. The
            estimate is printed before the run when ``progress`` is on.
    Returns:
        a :class:`Capture` with ``attn [L, H_Q, R, T + n_decode]``. In a hybrid family (capture only) the
        layers without softmax attention have NaN rows; ``Capture.softmax_layers`` lists the layers with rows.
    """
    check_args(RUN_CAPTURE_CHECKS, locals())  # the scalar arguments, before any model work
    if hasattr(model, "tokenizer") and hasattr(model, "model"):
        model_id = model_id or model.model_id
        model = model.model
    spans: PromptSpans = spans_of(prompt)
    rows = rows or RowSet()
    wanted = rows.rows(spans)
    T, n = spans.T, rows.n_decode
    shape = adapter.model_shape(model)
    check_context(T, n, shape.max_context, n_name="n_decode")
    if shape.vocab and max(spans.input_ids) >= shape.vocab:
        raise ValueError(f"prompt: token id {max(spans.input_ids)} is outside this model's vocabulary (size "
                         f"{shape.vocab}): the prompt was tokenised for another model")
    # --- scale: estimate, print, refuse over the limit; inputs on the embedding's device
    mem = estimate_capture_bytes(L=shape.L, H_Q=shape.H_Q, G=shape.G, R=len(wanted), T=T, n_decode=n, dtype=dtype,
                                 hidden_layers=len(tuple(hidden_layers)), hidden_size=shape.hidden)
    if progress:
        print(mem.describe())
    check_capture_budget(mem, max_capture_bytes(max_bytes), R=len(wanted))
    device = _input_device(model)
    ids = torch.tensor([spans.input_ids], dtype=torch.int64, device=device)
    bar = tqdm(total=shape.L + n, desc="capture", disable=not progress, leave=False)
    generated: list[int] = []
    with capture_attention(model, [p for _, p in wanted], K=T + n, T=T, hidden_layers=hidden_layers,
                           progress=bar, dtype=dtype) as rec:
        cache = adapter.new_cache(model)
        rec.positions = torch.arange(T)
        out = adapter.forward(model, ids, cache=cache, logits_to_keep=1)
        cache = adapter.output_cache(out) or cache
        nxt = int(out.logits[0, -1].argmax())
        for t in range(1, n + 1):
            generated.append(nxt)
            pos = T + t - 1
            rec.positions = torch.tensor([pos])
            out = adapter.forward(model, torch.tensor([[nxt]], device=device), cache=cache,
                                  position_ids=torch.tensor([[pos]], device=device), logits_to_keep=1)
            cache = adapter.output_cache(out) or cache
            nxt = int(out.logits[0, -1].argmax())
            bar.update(1)
    bar.close()
    attn = rec.attn.cpu()
    soft = families.softmax_layers(model)
    if len(soft) < shape.L:  # a hybrid: layers without softmax attention have no rows (NaN, never zeros)
        attn[[l for l in range(shape.L) if l not in soft]] = float("nan")
    return Capture(
        attn=attn,
        row_pos=torch.tensor([p for _, p in wanted], dtype=torch.int64),
        row_kind=[k for k, _ in wanted],
        head_group=shape.head_group(),
        vnorm_max=rec.vnorm_max.cpu(),
        spans=spans,
        model_id=model_identity(model, model_id),
        params={"rows": rows.as_dict(), "hidden_layers": list(hidden_layers), "dtype": dtype,
                "attn_implementation": adapter.current_attn_implementation(model), "softmax_layers": soft,
                "transformers": adapter.TRANSFORMERS_VERSION, "head_dim": shape.d,
                **({"vocab": shape.vocab} if shape.vocab else {})},
        version=_version(),
        hidden=dict(sorted(rec.hidden.items())),
        generated_ids=generated,
        learned_sink=rec.learned_sink.cpu() if rec.learned_sink is not None else None,
    )
