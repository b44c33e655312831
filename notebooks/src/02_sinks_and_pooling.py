# %% [markdown]
# # 02 · Sink-isolated Rényi head pooling (ζ, τ)
#
# SPEC §2 (paper §3.1). One layer's `H_Q` heads are pooled into a single measure `μ^l` over the
# prompt that later steps score chunks with. Each head's observer-mean row `a^h` is split into
# its sink part and its **residual** `z_h = Σ_{j∉𝒮} a^h_j`; the residual's Rényi-2 entropy
# `H_h` decides the head's weight inside its KV group:
#
# - `v_h = softmax_{h∈group}(−H_h / τ)`, temperature `τ > 0` — low entropy (focused) heads win;
# - `w_h = ζ/r + (1−ζ) v_h`, floor `ζ ∈ (0, 1]` — every head keeps at least `ζ/r`; `ζ = 1` is uniform;
# - `μ^l_j = (1/G) Σ_h w_h a^h_j`, which sums to 1.
#
# Both the softmax and the floor are **[reconstructed]** in SPEC. What to look at: how `w`
# moves as `ζ` and `τ` move, and that a sink head ends at the floor.

# %%
from lab_setup import example_capture

import workbench as wb

lm, ex, prompt, cap = example_capture()      # SmolLM2-135M-Instruct (or WORKBENCH_MODEL); data/example_prompt.json
spans = prompt.spans

# %%
import torch

pooling = wb.HeadPooling(zeta=0.5, tau=1.0)(cap)
layer = cap.L // 2                           # the middle layer (15 on the default model)
pooling.to_frame().query("layer == @layer").round(4)

# %% [markdown]
# Head weights `w_h` per layer. Inside each KV group (3 query heads here) the weights sum to 1;
# the darkest cells are the heads whose residual attention is most concentrated.

# %%
wb.plots.head_heatmap(pooling, "w")

# %% [markdown]
# The residual rows of one layer: how much of each head's mass is left after removing the sinks, and
# how spread it is. A head with `z_h ≤ ρ_min` is invalid and gets weight only through the floor.

# %%
wb.plots.residual_distribution(pooling, layer=layer, spans=spans)

# %% [markdown]
# ## Moving ζ and τ
#
# The same layer under a grid of `ζ` (floor) and `τ` (temperature). At `ζ = 1` every head has
# `1/r`; as `ζ → 0` and `τ → 0` each group's weight goes to its lowest-entropy head. Pooling is
# cheap: the observer means and entropies are cached per capture, so moving a slider costs only the
# softmax and the floor.

# %%
import pandas as pd

grid = []
for zeta in (1.0, 0.5, 0.2, 0.05):
    for tau in (0.1, 0.3, 1.0, 3.0):
        w = wb.HeadPooling(zeta=zeta, tau=tau)(cap).w[layer]
        grid += [dict(zeta=zeta, tau=tau, head=f"h{h} (g{g})", w=float(w[h]))
                 for h, g in enumerate(cap.head_group.tolist())]
grid = pd.DataFrame(grid)
wb.plots.head_weights(grid, layer=layer, model_id=cap.model_id)   # 9 heads: colour, then dash and marker past 8

# %% [markdown]
# ## Property (6) on real heads
#
# If head `h*` has entropy lower than each of its `r−1` siblings by at least `Δ`, then
# `w_{h*} ≥ ζ/r + (1−ζ)/(1 + (r−1) e^{−Δ/τ})` (`dominant_head_bound`). Checked here for every layer and
# group of this capture.

# %%
import math

zeta, tau, r = 0.5, 1.0, cap.r
worst = math.inf
for l in range(cap.L):
    for g in range(cap.G):
        heads = (cap.head_group == g).nonzero().flatten()
        H = pooling.H[l, heads]
        best = int(H.argmin())
        delta = float((H[torch.arange(len(heads)) != best] - H[best]).min())
        bound = wb.dominant_head_bound(zeta, tau, r, delta)
        worst = min(worst, float(pooling.w[l, heads[best]]) - bound)
print(f"min over layers and groups of w_h* − bound = {worst:.3e}  (never negative)")
assert worst >= -1e-12

# %% [markdown]
# ## A sink head goes to the floor
#
# The head with the flattest residual in a group (highest `H_h`) loses the softmax as `τ → 0`,
# and its weight tends to the floor `ζ/r` — it cannot vanish while `ζ > 0`.

# %%
g_heads = (cap.head_group == 0).nonzero().flatten()
flat = int(g_heads[pooling.H[layer, g_heads].argmax()])
for tau in (3.0, 1.0, 0.3, 0.1, 0.01):
    w = float(wb.HeadPooling(zeta=0.5, tau=tau)(cap).w[layer, flat])
    print(f"τ = {tau:<5} w_{flat} = {w:.4f}   (floor ζ/r = {0.5 / cap.r:.4f})")
assert abs(float(wb.HeadPooling(zeta=0.5, tau=0.01)(cap).w[layer, flat]) - 0.5 / cap.r) < 1e-3

# %% [markdown]
# ## The pooled measure
#
# `μ^l` over the prompt, coloured by span. It sums to 1; chunks that the observers read carry more
# of it. Notebook 03 turns it into chunk priorities.

# %%
wb.plots.pooled_measure(pooling, layer, spans)       # log scale; grey protected, orange chunks, green answer chunk

# %% [markdown]
# ### Interactive panel
#
# The `ζ` and `τ` sliders recompute the pooling from the capture (cached statistics, no model call) and update the head weights and the residual rows in place.

# %%
panel = wb.widgets.HeadsPanel(cap)
panel.widget

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
onehot = torch.nn.functional.one_hot(cap.head_group, cap.G).double()     # [H_Q, G]
group_sum = pooling.w @ onehot                                          # [L, G]: Σ_{h∈g} w_h
sink = pooling.sink_mass                                                # [L, H_Q]
mu_all = pooling.mu                                                     # [L, T]
mu_again = torch.einsum("lh,lht->lt", pooling.w, pooling.a) / cap.G     # (1/G) Σ_h w_h a^h
uniform = wb.HeadPooling(zeta=1.0)(cap).w
print(f"Σ_(h∈g) w_h over {cap.L} layers × {cap.G} groups: max |· − 1| = {float((group_sum - 1).abs().max()):.1e}")
print(f"min w_h = {float(pooling.w.min()):.4f} ≥ floor ζ/r = {0.5 / cap.r:.4f}; at ζ = 1 every w_h = {float(uniform.mean()):.4f} = 1/r")
print(f"sink mass in [{float(sink.min()):.3f}, {float(sink.max()):.3f}]; max |z_h + sink mass − 1| = {float((pooling.z + sink - 1).abs().max()):.1e}")
print(f"μ: min {float(mu_all.min()):.2e}, max |Σ_j μ_j − 1| = {float((mu_all.sum(-1) - 1).abs().max()):.1e}, "
      f"max |μ − (1/G) Σ_h w_h a^h| = {float((mu_all - mu_again).abs().max()):.1e}")
print(f"property (6): min margin w_h* − bound = {worst:.3e}; flat head {flat} at τ = 0.01: w = {float(wb.HeadPooling(zeta=0.5, tau=0.01)(cap).w[layer, flat]):.4f}")
assert torch.allclose(group_sum, torch.ones_like(group_sum), atol=1e-9)    # w_h sums to 1 in every group and layer
assert float(pooling.w.min()) >= 0.5 / cap.r - 1e-12                        # the floor ζ/r
assert torch.allclose(uniform, torch.full((cap.L, cap.H_Q), 1 / cap.r, dtype=torch.float64))
assert float(sink.min()) >= 0 and float(sink.max()) <= 1 + 1e-6             # sink mass is a share of the row
assert torch.allclose(pooling.z + sink, torch.ones_like(sink), atol=1e-5)   # sink + residual = the whole row
assert float(mu_all.min()) >= 0 and torch.allclose(mu_all.sum(-1), torch.ones(cap.L, dtype=torch.float64), atol=1e-6)
assert torch.allclose(mu_all, mu_again, atol=1e-9)                         # μ is the w-weighted mixture
assert worst >= -1e-12
