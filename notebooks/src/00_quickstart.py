# %% [markdown]
# # 00 · Quickstart: run → capture → show
#
# Load the embedded default model (SmolLM2-135M-Instruct, no network needed; `WORKBENCH_MODEL` and
# `WORKBENCH_DEVICE` choose another model or device, see `lab_setup.py`), build the bundled
# multi-document prompt with its spans, capture the attention rows the analyses need, and look at
# two views: the sink mass per layer and head, and one head's attention over the prompt tokens; then the panels,
# all on one shared capture that the prompt panel replaces with a capture of your own prompt.

# %%
from lab_setup import load

import workbench as wb

lm = load()                  # CPU fp32 here; CUDA + bf16 when a GPU is present

# %% [markdown]
# The prompt: an instruction, eight short passages (one holds the answer) and a question. Spans come from
# the tokenizer's character offsets: each passage is a candidate chunk, everything else is protected.

# %%
ex = wb.load_example()
prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
s = prompt.spans
print(f"T={s.T} tokens, k={s.k} chunks, N={s.N} chunk tokens, query at {s.query}, observers {s.observers}")
print("answer passage:", ex.documents[ex.answer_doc])

# %% [markdown]
# Capture: observer rows, the query as audit population, a 32-token prompt tail and 4 decode steps.
# The model keeps its own attention kernel; only the requested rows are computed.

# %%
cap = wb.run_capture(lm, prompt, wb.RowSet(tail=32, n_decode=4))
print(cap.attn.shape, "[layers, heads, rows, keys]")
print("first decoded tokens:", repr(lm.tokenizer.decode(cap.generated_ids)))

# %%
wb.plots.sink_mass_heatmap(cap)

# %%
wb.plots.attention_strip(cap, layer=cap.L // 2, head=0)

# %%
wb.plots.attention_strip(cap, layer=cap.L // 2, head=0, log=True)   # the same row on a log axis

# %% [markdown]
# ### Attention over the text
#
# The prompt as text, each token shaded by the attention it gets from a query row: the observers' mean,
# a tail row or a decode step (the *query row* menu, or click a token: its own row becomes the query,
# captured on demand), for one head, a KV group or the pooled `μ`. The answer passage is outlined in
# green, chunk starts are ticks, the query token is boxed. *colour scale* (log, or quantile, the default from 2,048 tokens) keeps the sinks (often > 0.5 of
# the mass) from washing out the rest; *exclude sinks* leaves them unshaded.

# %%
state = wb.widgets.CaptureState(cap, prompt, model=lm)   # one capture for the panels below; the prompt panel replaces it
tokens = wb.widgets.TokenPanel(state, layer=cap.L // 2)
tokens.widget

# %% [markdown]
# ### Interactive panel
#
# Pick the layer and the quantity (sink mass, entropy `H`, weight `w`) and move `ζ` and `τ`: the heatmap and
# the residual rows of the layer follow. No model call: everything comes from the capture.

# %%
panel = wb.widgets.HeadsPanel(state, quantity="sink")
panel.widget

# %% [markdown]
# The chunk priorities of one layer (SPEC §3–§5; notebook 03 explains them), on the same shared capture:

# %%
priorities = wb.widgets.PriorityPanel(state)
priorities.widget

# %% [markdown]
# ### Your own prompt
#
# Paste documents (one per box, or several in one box separated by a line `---`) and a question, or choose a
# RULER-style task, a length and a seed; **Build and capture** builds the prompt, captures it (the same rows as
# above) and hands the capture to every panel built on `state`: the token view, the head and the priority panels
# above redraw together, their controls fitted to the new prompt. Bad input (an empty document, no question, a
# prompt longer than the model's context) is said in the panel, naming the field, and changes nothing.

# %%
prompt_panel = wb.PromptPanel(lm, state, question="Who paints the lighthouse tower?", documents=[
          "The lighthouse keeper Marla Quint paints the tower red every spring.",
          "Ferries to the island leave twice a day from the north pier.",
          "The harbor market sells smoked mackerel on Fridays."])
prompt_panel.widget

# %%
prompt_panel.build()   # what the button does: the panels above now show this three-document prompt

# %% [markdown]
# ## Checks
#
# Real numbers from the capture, printed and asserted (CI runs this notebook):

# %%
import torch

sums = cap.attn.sum(-1) + (cap.learned_sink if cap.learned_sink is not None else 0)  # gpt-oss: + its learned sink
assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)   # every row is a distribution
sink = cap.sink_mass()
assert sink.shape == (lm.shape.L, lm.shape.H_Q) == (cap.L, cap.H_Q) and 0 <= float(sink.min()) and float(sink.max()) <= 1 + 1e-6
assert cap.spans.k == len(ex.documents) and len(cap.generated_ids) == 4
print(f"{sums.numel()} rows: max |Σ_j A_uj − 1| = {float((sums - 1).abs().max()):.1e}; sink mass in "
      f"[{float(sink.min()):.3f}, {float(sink.max()):.3f}]")
print(f"median sink mass {float(sink.median()):.3f}; heads with >50% on sinks: {int((sink > 0.5).sum())}/{sink.numel()}")
# the prompt panel's capture is what every panel on the shared state shows
new = state.capture
assert prompt_panel.error is None and new is prompt_panel.capture and new is not cap
assert new.spans.k == 3 and new.T == len(prompt_panel.prompt.spans.input_ids) and len(new.generated_ids) == 4
assert tokens.capture is panel.capture is priorities.capture is new and len(state.panels) == 3
assert "Marla Quint" in "".join(tokens.figures["tokens"].view.tokens) and priorities.controls["m0"].max == 3
print(f"prompt panel: T={new.T} tokens, k={new.spans.k} chunks, shown by {len(state.panels)} panels "
      f"(the bundled prompt had T={cap.T}, k={cap.spans.k})")
