# %% [markdown]
# # 09 · GQA unions, pages, and what pruning costs
#
# SPEC §8 (paper §7) and the cost model of SPEC §7 (paper §8.1).
#
# **Pages.** A serving cache stores KV in pages of `b` tokens, one cache per KV group. Scoring per
# query head and keeping each head's top-`s` keys would, under GQA, keep the **union** over the group's
# heads — up to `r` times more (`UOR_g`). Page-EntroKV scores a page by the group score
# `p_{l,g}(j) = Σ_{h∈g} w_h a^h_j` and keeps the top-`K` pages per group.
#
# **Cost.** Pruning after `l*` saves the deep layers' work on `T − T'` tokens but pays for the shallow
# layers on all `T` tokens and for the row capture. Where is the break-even?

# %%
from lab_setup import example_capture

import workbench as wb

lm, ex, prompt, cap = example_capture()      # SmolLM2-135M-Instruct (or WORKBENCH_MODEL); data/example_prompt.json
spans = prompt.spans

# %%
import torch

pooling = wb.HeadPooling(zeta=0.5, tau=1.0)(cap)
ps = wb.PageSelection(b=16, K=4, s=32, e=2)
pages = ps.select(pooling.a, pooling.w, cap.head_group, d=lm.shape.d)
layer = cap.L // 2                           # the middle layer (15 on the default model)
shown = [cap.L // 6, layer, 5 * cap.L // 6]  # 5, 15, 25 on the default model
pages.to_frame().query("layer in @shown").round(3)

# %%
wb.plots.pages(pages, layer=layer, spans=spans)

# %% [markdown]
# ## The bounds of SPEC §8, on real scores
#
# - `1 ≤ UOR_g ≤ min{r, T/s}`;
# - `K ≤ U_l ≤ min{GK, N_P}` for the page union;
# - lemma: a token with `p_{l,g}(j) > 1/(K+1)` always has its page kept.

# %%
L, G, N_P = pages.importance.shape
r, T, K = cap.r, spans.T, ps.K
assert ((pages.uor >= 1 - 1e-12) & (pages.uor <= min(r, T / pages.s) + 1e-12)).all()
assert ((pages.U >= K) & (pages.U <= min(G * K, N_P))).all()
heavy = pages.p > 1 / (K + 1)
assert (pages.token_mask[heavy]).all()
print(f"UOR_g: mean {float(pages.uor.mean()):.2f} (max possible {r}); U_l: {pages.U.min().item()}–{pages.U.max().item()} "
      f"of N_P = {N_P} pages; {int(heavy.sum())} heavy tokens, all kept")
print("KV payload bytes:", pages.bytes)

# %% [markdown]
# How many pages the union needs as `K` grows (mean over layers), against the two extremes `K`
# (all groups agree) and `GK` (all disjoint):

# %%
u = wb.PageSelection(b=16, s=32).union_by_K((1, 2, 4, 8, 12), pooling.a, pooling.w, cap.head_group, d=lm.shape.d)
wb.plots.page_union_bounds(u)

# %% [markdown]
# ## Break-even of pruned prefill (SPEC §7 cost)
#
# `F_EP = Σ_{l≤l*} F_l(T) + Σ_{l>l*} F_l(T') + F_aux` with per-layer FLOPs from the model config.
# The table gives, per gather layer `l*`, the largest kept fraction `T'/T` at which pruning still saves
# arithmetic: the row capture (`F_aux`) pulls it just below 1, and the deeper the gather, the more the
# shallow layers on all `T` tokens dominate the ratio in the figure. At `l* = L − 1` nothing is left to
# save and the capture still costs: no break-even (NaN).

# %%
import numpy as np

cm = wb.CostModel(lm.shape)
T_long = 4096
rows = spans.W_p + (spans.query[1] - spans.query[0])       # observers + audit rows captured per layer
grid = cm.grid(T_long, l_stars=list(range(-1, lm.shape.L, 2)), keep_fractions=np.linspace(0.05, 1.0, 20), rows=rows)
grid.to_frame().groupby("l_star").break_even_keep_fraction.first().round(3).to_frame().T

# %%
wb.plots.break_even(grid)

# %% [markdown]
# For this notebook's prompt: the adaptive decision of notebook 05 (same parameters, replayed from the
# capture) predicts this ratio of prefill FLOPs, and the dense KV cache shrinks accordingly:

# %%
tr = wb.trace(cap, wb.EntroPrefillParams(target=0.25, eps_row=0.2, streak=1, eps_audit=0.2), certify=False)
T_, T_p, l_star = spans.T, len(tr.retained_positions()), tr.l_star
executed = sum(1 for l in tr.layers if l <= l_star)         # monitored layers run before the gather
ratio = float(cm.ratio(T_, T_p / T_, l_star, rows=rows, monitored_executed=executed))
print(f"{tr.decision}")
print(f"predicted F_EP / F_full = {ratio:.3f}; dense KV: {wb.kv_bytes_dense(lm.shape, T_, 2) / 2**20:.2f} MiB → "
      f"{wb.kv_bytes_dense(lm.shape, T_p, 2) / 2**20:.2f} MiB (bf16)")
assert ratio < 1 and cm.break_even_keep_fraction(T_long, -1) == 1.0

# %% [markdown]
# ### Interactive panel
#
# Page size `b`, pages per group `K`, `ζ`, `τ` and the layer; the page scores, the selection and the byte counts follow. No model call.

# %%
panel = wb.widgets.PagesPanel(cap, layer=layer, s=32)
panel.widget

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
import math

U_again = pages.selected.any(1).sum(-1)                                 # [L] pages kept by some group
b_, e_, d_ = pages.b, pages.e, pages.d
be = grid.to_frame().groupby("l_star").break_even_keep_fraction.first()
inner = be.drop(lm.shape.L - 1)
removed_tokens = sum(int(spans.n[i]) for i in tr.removed)
print(f"U_l recomputed from the selection: {U_again.min().item()}–{U_again.max().item()} pages, within "
      f"[K, min(GK, N_P)] = [{K}, {min(G * K, N_P)}]; UOR_g in [{float(pages.uor.min()):.2f}, {float(pages.uor.max()):.2f}] ⊂ [1, {min(r, T / pages.s):.0f}]")
print(f"{int(heavy.sum())} tokens with p > 1/(K+1) = {1 / (K + 1):.3f}, all in kept pages; bytes {pages.bytes}")
print(f"union against K: {u.union.round(2).tolist()} between {u.lower.tolist()} and {u.upper.tolist()}")
print(f"break-even T'/T by l*: {be.round(3).to_dict()}")
print(f"notebook 05's decision: T' = {T_p} = T − {removed_tokens}, l* = {l_star}, predicted F_EP / F_full = {ratio:.3f}")
assert torch.equal(U_again, pages.U) and ((pages.U >= K) & (pages.U <= min(G * K, N_P))).all()
assert ((pages.uor >= 1 - 1e-12) & (pages.uor <= min(r, T / pages.s) + 1e-12)).all()
assert bool(pages.token_mask[heavy].all())                                   # the lemma of SPEC §8
assert pages.bytes["per_group_pages"] == 2 * e_ * d_ * b_ * int(pages.K_lg.sum())
assert pages.bytes["union"] == 2 * e_ * d_ * b_ * G * int(pages.U.sum())
assert ((u.lower <= u.union) & (u.union <= u.upper)).all()
assert be[-1] == 1.0 and math.isnan(be[lm.shape.L - 1])                      # nothing to save at l* = L − 1
assert ((inner > 0) & (inner <= 1)).all() and (inner.diff().dropna() <= 1e-12).all()   # deeper gather: lower break-even
assert T_p == T_ - removed_tokens and 0 < ratio < 1
