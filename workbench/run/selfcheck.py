"""The load-time self-check of a derived family (:func:`workbench.run.families.derived_family`).

A family derived from the modelling code is a reading of the code, not a verified row, so ``load_model`` checks it on
the user's own model before handing it out: one forward over a short prompt through the model's own attention
implementation, with every attention call's rows recomputed from what the call receives (the capture's reading,
:func:`workbench.run.adapter.read_attention_call`: query, key, mask, scaling, soft-cap, sinks), against the model's
own eager ``output_attentions``. It checks that the calls come from exactly the layers the family calls softmax
layers, with the head counts the capture allocates (``H_Q``, ``G`` of :func:`workbench.run.adapter.model_shape`), and
that every row equals the model's. A mismatch refuses the model, naming the layer and what differs.
The rows are ``softmax(q kᵀ · scaling + mask)`` per query head over its KV head's keys, soft-capped and with a
learned sink column where the call carries them.
"""
from __future__ import annotations

import torch

from workbench.run import adapter, families

__all__ = ["SELF_CHECK_T", "self_check_rows", "check_derived"]

SELF_CHECK_T = 12  # prompt length of the check: long enough for several keys per row, short on any model
_TOL = {torch.float32: 1e-4, torch.float64: 1e-8}
_HALF_TOL = 2e-2  # bf16/fp16 rows: the eager kernel rounds its probabilities to the model dtype


def _rows(call: adapter.AttentionCall) -> torch.Tensor:
    """``[H_Q, q_len, S]`` float32 rows of one attention call."""
    q, k = call.query[0].float(), call.key[0].float()
    r = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(r, dim=0)
    logits = q @ k.transpose(-1, -2) * call.scaling
    if call.softcap:
        logits = call.softcap * torch.tanh(logits / call.softcap)
    S, n = k.shape[1], q.shape[1]
    m = call.mask
    if m is None:
        vis = torch.ones(n, S, dtype=torch.bool, device=q.device).tril(S - n)
        logits = logits.masked_fill(~vis, float("-inf"))
    elif m.dtype == torch.bool:
        logits = logits.masked_fill(~m[0, :, :, :S].to(q.device), float("-inf"))
    else:
        logits = logits + m[0, :, :, :S].float().to(q.device)
    if call.sinks is not None:
        sink = call.sinks.float().to(q.device).reshape(-1, 1, 1).expand(-1, n, 1)
        return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :S]
    return torch.softmax(logits, dim=-1)


def self_check_rows(model, T: int = SELF_CHECK_T) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (rows read from the calls [H_Q, T, T], the model's eager rows [H_Q, T, T])}`` over a prompt of
    ``T`` tokens; ``TypeError`` when the calls do not come from the family's softmax layers with the capture's
    head counts."""
    fam = families.family_of(model)
    shape = adapter.model_shape(model)
    soft = families.softmax_layers(model)
    got: dict[int, torch.Tensor] = {}
    heads: dict[int, tuple[int, int]] = {}

    def make_wrapper(base_fn):
        def workbench_selfcheck_attention(module, query, key, value, attention_mask, **kwargs):
            out = base_fn(module, query, key, value, attention_mask, **kwargs)
            with torch.no_grad():
                call = adapter.read_attention_call(module, query, key, value, attention_mask, kwargs)
                got[call.layer_idx] = _rows(call).cpu()
                heads[call.layer_idx] = (query.shape[1], key.shape[1])
            return out
        return workbench_selfcheck_attention

    old = adapter.current_attn_implementation(model)
    name = adapter.register_wrapped_attention(old, make_wrapper)
    emb = model.get_input_embeddings().weight
    ids = (torch.arange(T, device=emb.device) * 7 + 3) % shape.vocab
    try:
        adapter.set_attn_implementation(model, name)
        with torch.no_grad():
            model(input_ids=ids[None], use_cache=False)
    finally:
        adapter.set_attn_implementation(model, old)
    if sorted(got) != soft:
        raise TypeError(f"its attention calls come from layers {sorted(got)}, the {fam.name} layout's softmax layers "
                        f"are {soft}")
    G = shape.H_Q if fam.mla else shape.G  # MLA expands its latent into one key per query head
    for l, (hq, g) in heads.items():
        if (hq, g) != (shape.H_Q, G):
            raise TypeError(f"layer {l} attends with {hq} query heads over {g} KV heads, the config gives "
                            f"H_Q = {shape.H_Q}, G = {G}")
    ref = adapter.eager_attentions(model, ids[None], use_cache=False).attentions
    if len(ref) != len(soft):
        raise TypeError(f"its eager forward returns {len(ref)} attention maps for {len(soft)} softmax layers")
    return {l: (got[l], ref[i][0].float().cpu()) for i, l in enumerate(soft)}


def check_derived(model) -> None:
    """Refuse (``TypeError``) a model of a derived family whose rows, read as the capture reads them, differ from
    its own eager attention; nothing for a family of the table."""
    fam = families.family_of(model)
    if not families.is_derived(fam):
        return
    what = (f"model: the {fam.name!r} layout was derived from its modelling code and failed its self-check at load "
            f"(a {SELF_CHECK_T}-token prompt, rows read at the attention interface against the model's own eager "
            f"output_attentions)")
    L = len(families.decoder_layers(model))
    other = sorted(set(range(L)) - set(families.softmax_layers(model)))
    if other and not fam.capture_only:  # the type's default config has softmax attention in every layer, this one not
        raise TypeError(f"{what}: layers {other} have no softmax attention, but the layout derived from the type's "
                        f"default configuration has it in every layer, so pruned prefill and eviction would treat a "
                        f"hybrid as a plain decoder")
    try:
        pairs = self_check_rows(model)
    except TypeError as e:
        raise TypeError(f"{what}: {e}") from None
    tol = _TOL.get(next(model.parameters()).dtype, _HALF_TOL)
    for l, (rows, ref) in pairs.items():
        if rows.shape != ref.shape:
            raise TypeError(f"{what}: layer {l} rows have shape {tuple(rows.shape)}, its eager attention "
                            f"{tuple(ref.shape)}")
        err = (rows - ref).abs().max().item()
        if not err <= tol:
            raise TypeError(f"{what}: layer {l} rows differ from its eager attention by {err:.3g} (> {tol:g})")
