# %% [markdown]
# # 00 · Quickstart: run → capture → show
#
# Load the embedded default model (SmolLM2-135M-Instruct, no network needed; `WORKBENCH_MODEL` and
# `WORKBENCH_DEVICE` choose another model or device, see `lab_setup.py`), build the bundled
# multi-document prompt with its spans, capture the attention rows the analyses need, and look at
# two views: the sink mass per layer and head, and one head's attention over the prompt tokens.

# %%
from lab_setup import load

from workbench.capture import RowSet, run_capture
from workbench.run.examples import load_example
from workbench.show import plots

lm = load()                  # CPU fp32 here; CUDA + bf16 when a GPU is present

# %% [markdown]
# The prompt: an instruction, eight short passages (one holds the answer) and a question. Spans come from
# the tokenizer's character offsets: each passage is a candidate chunk, everything else is protected.

# %%
ex = load_example()
prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
s = prompt.spans
print(f"T={s.T} tokens, k={s.k} chunks, N={s.N} chunk tokens, query at {s.query}, observers {s.observers}")
print("answer passage:", ex.documents[ex.answer_doc])

# %% [markdown]
# Capture: observer rows, the query as audit population, a 32-token prompt tail and 4 decode steps.
# The model keeps its own attention kernel; only the requested rows are computed.

# %%
cap = run_capture(lm, prompt, RowSet(tail=32, n_decode=4))
print(cap.attn.shape, "[layers, heads, rows, keys]")
print("first decoded tokens:", repr(lm.tokenizer.decode(cap.generated_ids)))

# %%
plots.sink_mass_heatmap(cap)

# %%
plots.attention_strip(cap, layer=cap.L // 2, head=0)

# %%
plots.attention_strip(cap, layer=cap.L // 2, head=0, log=True)   # the same row on a log axis

# %% [markdown]
# ### Attention over the text
#
# The prompt as text, each token shaded by the attention it gets from a query row: the observers' mean,
# a tail row or a decode step (the *query row* menu, or click a token: the captured row nearest to it
# becomes the query), for one head, a KV group or the pooled `μ`. The answer passage is outlined in
# green, chunk starts are ticks, the query token is boxed. *log scale* keeps the sinks (often > 0.5 of
# the mass) from washing out the rest; *exclude sinks* leaves them unshaded.

# %%
from workbench.show.widgets import TokenPanel

tokens = TokenPanel(cap, layer=cap.L // 2)
tokens.widget

# %% [markdown]
# ### Interactive panel
#
# Pick the layer and the quantity (sink mass, entropy `H`, weight `w`) and move `ζ` and `τ`: the heatmap and
# the residual rows of the layer follow. No model call: everything comes from the capture.

# %%
from workbench.show.widgets import HeadsPanel

panel = HeadsPanel(cap, quantity="sink")
panel.widget

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
