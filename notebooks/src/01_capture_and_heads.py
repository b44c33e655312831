# %% [markdown]
# # 01 · Capture and heads
#
# What the workbench records before any analysis (SPEC §0–§1): the model's attention **rows**
# `A^{l,h}_{u,·}` for a chosen set of query positions `u`, in every layer `l` and every query
# head `h`, computed from the same post-RoPE queries and keys the model's own kernel sees.
# This notebook shows the prompt's spans, which rows are captured, that they equal eager
# `output_attentions` exactly, and the first thing one sees in them: attention **sinks**.

# %%
import pandas as pd
import torch
from lab_setup import load

import workbench as wb

lm = load()
s = lm.shape
print(f"{lm.model_id}: L = {s.L} layers, H_Q = {s.H_Q} query heads, G = {s.G} KV heads "
      f"(r = {s.r} query heads per group), head dim d = {s.d}")

# %% [markdown]
# ## The prompt and its spans (SPEC §0)
#
# The bundled prompt: an instruction, eight short passages and a question, rendered with the
# model's chat template. Spans come from the tokenizer's character offsets. Each passage is a
# **candidate chunk** `c_i`; everything else (instruction, query, delimiters, template tokens, the
# first `n_sink` tokens) is **protected**. The proposal observers `𝒬_p` are the last `W_p` query tokens.

# %%
ex = wb.load_example()
prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
spans = prompt.spans
tok = spans.tokens
rows = [("sinks 𝒮", 0, spans.n_sink)]
if spans.instruction:
    rows.append(("instruction", *spans.instruction))
rows += [(f"chunk {i}" + (" (answer)" if spans.chunk_doc[i] == ex.answer_doc else ""), a, b)
         for i, (a, b) in enumerate(spans.chunks)]
rows += [("query", *spans.query), ("observers 𝒬_p", spans.observers[0], spans.observers[-1] + 1)]
pd.DataFrame([dict(segment=n, start=a, end=b, tokens=b - a, text="".join(tok[a:b])[:60]) for n, a, b in rows])

# %% [markdown]
# ## Capture (SPEC §1)
#
# `RowSet` says which query rows to keep: the observers, the whole query (the audit population of
# SPEC §6), a prompt-tail window and a few greedy decode steps. Memory is `O(L · H_Q · |rows| · T)`;
# no `T × T` matrix is formed, and the model keeps its own attention kernel (sdpa here) for its output.

# %%
cap = wb.run_capture(lm, prompt, wb.RowSet(tail=16, n_decode=4), progress=False)
kinds = pd.Series(cap.row_kind).value_counts()
print(f"attn {tuple(cap.attn.shape)} [L, H_Q, rows, T + n_decode], {cap.attn.numel() * 4 / 2**20:.1f} MiB")
print("rows per kind:", kinds.to_dict())
print("greedy continuation:", repr(lm.tokenizer.decode(cap.generated_ids)))

# %% [markdown]
# **Exactness.** The oracle is a full eager forward with `output_attentions=True` (it does build every
# `T × T` matrix; fine for one short prompt). Every captured prompt row must match it to float32
# rounding (SPEC §1 records 3e-6 on this model).

# %%
eager = wb.eager_attentions(lm.model, prompt.input_ids).attentions      # L x [1, H_Q, T, T]
prompt_rows = torch.tensor([k != "decode" for k in cap.row_kind])
pos = cap.row_pos[prompt_rows]
err = max(float((cap.attn[l][:, prompt_rows, :spans.T] - eager[l][0][:, pos]).abs().max()) for l in range(cap.L))
print(f"max |captured - eager| over {int(prompt_rows.sum())} rows x {cap.L} layers x {cap.H_Q} heads: {err:.2e}")
assert err < 1e-4
del eager

# %% [markdown]
# ## Sinks
#
# The share of each head's attention that lands on the first `n_sink = 4` tokens, averaged over the
# observers. Many heads put most of their mass there: this is why the pooling of SPEC §2 measures
# entropy on the **residual** (non-sink) part of each row.

# %%
wb.plots.sink_mass_heatmap(cap)

# %% [markdown]
# Two heads of one middle layer over the prompt tokens (hover shows the token): the head with the
# **most** sink mass and the one with the **least**. Orange bars are candidate chunks, green the
# chunk holding the answer, grey protected tokens.

# %%
spread = cap.sink_mass().amax(-1) - cap.sink_mass().amin(-1)  # [L]: how much the heads' sink mass differs
layer = cap.L // 2 if float(spread[cap.L // 2]) > 0 else int(spread.argmax())  # a window past the sinks: 0
sink = cap.sink_mass()[layer]
sink_head, reader_head = int(sink.argmax()), int(sink.argmin())
print(f"layer {layer}: head {sink_head} sink mass {float(sink.max()):.2f}, head {reader_head} {float(sink.min()):.2f}")
wb.plots.attention_strip(cap, layer=layer, head=sink_head)

# %%
wb.plots.attention_strip(cap, layer=layer, head=reader_head)

# %% [markdown]
# ## Heads by residual entropy
#
# Removing the sinks and renormalising, each head's non-sink Rényi-2 entropy `H_h = -ln Σ_j ã_j²`
# (SPEC §2) says how concentrated its residual attention is: low entropy = the head reads a few
# tokens, high entropy = it spreads. Notebook 02 turns these entropies into head weights.

# %%
pooling = wb.HeadPooling()(cap)
wb.plots.head_heatmap(pooling, "H")

# %% [markdown]
# ## A capture is a file
#
# `save()` writes safetensors plus a JSON header (spans, model identity, parameters), atomically;
# `load()` gives back the same tensors bit for bit. Analyses can run on a loaded capture without the model.

# %%
import tempfile
from pathlib import Path

path = cap.save(Path(tempfile.mkdtemp()) / "example.capture.safetensors")
back = wb.Capture.load(path)
assert torch.equal(back.attn, cap.attn) and back.spans == cap.spans and back.row_kind == cap.row_kind
print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB, identical after load; model {back.model_id}")

# %% [markdown]
# ### Interactive panel
#
# Pick the layer and the quantity (sink mass, entropy `H`, weight `w`); the heatmap and the residual rows of the layer follow. No model call: everything comes from the capture.

# %%
panel = wb.widgets.HeadsPanel(cap, quantity="sink")
panel.widget

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
import math

sums = cap.attn.sum(-1)                       # [L, H_Q, rows]; a decode row's future keys hold 0
if cap.learned_sink is not None:              # a model with learned sinks (gpt-oss): the rest of each row
    sums = sums + cap.learned_sink
row_err = float((sums - 1).abs().max())
sink = cap.sink_mass()                        # [L, H_Q], mean over the observers
H = pooling.H[pooling.valid_head]             # finite for valid heads
H_cap = math.log(spans.T - spans.n_sink)
print(f"{sums.numel()} captured rows ({ {k: int(v) for k, v in kinds.items()} }): max |Σ_j A_uj − 1| = {row_err:.1e}")
print(f"captured vs eager output_attentions: max |Δ| = {err:.1e}")
print(f"layer {layer}: sink mass of head {sink_head} = {float(sink[layer, sink_head]):.3f} (most), "
      f"head {reader_head} = {float(sink[layer, reader_head]):.3f} (least)")
print(f"H_h over {H.numel()} valid heads in [{float(H.min()):.3f}, {float(H.max()):.3f}] ⊂ [0, ln(T − n_sink)] = [0, {H_cap:.3f}]")
assert row_err < 1e-5                                               # every captured row is a distribution
assert err < 1e-4                                                   # ... and the model's own attention
assert int(kinds.sum()) == cap.attn.shape[2] and int(kinds["decode"]) == len(cap.generated_ids) == 4
assert float(sink.min()) >= 0 and float(sink.max()) <= 1 + 1e-5
assert torch.allclose(pooling.sink_mass, sink.double(), atol=1e-5)   # pooling's observer means agree
assert float(sink[layer, sink_head]) == float(sink[layer].max()) > float(sink[layer].min()) == float(sink[layer, reader_head])
assert float(H.min()) >= -1e-9 and float(H.max()) <= H_cap + 1e-9
assert cap.spans.k == len(ex.documents) and back.attn.shape == cap.attn.shape
