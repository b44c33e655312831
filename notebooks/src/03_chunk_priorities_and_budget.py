# %% [markdown]
# # 03 · Chunk priorities and the saving budget
#
# SPEC §3 (paper §3.2) scores each candidate chunk from the pooled measure `μ^l`, calibrated
# against a **null** in which attention is spread evenly over the documents:
#
# - `p_j = μ_j / μ(𝒟)` on the documents, chunk mass `M_i = Σ_{j∈c_i} p_j`, null prior `π_i = n_i/N`;
# - lift `ℓ_i = (M_i + ε_s π_i) / ((1+ε_s) π_i)` (1 under the null);
# - concentration `κ_i ∈ [0, 1]` of the smoothed in-chunk distribution **[reconstructed]**;
# - priority `S_i = ln ℓ_i + λ κ_i` **[reconstructed]**; lowest `S_i` is removed first.
#
# The greedy proposer of SPEC §5 then scans chunks by increasing `S_i` and removes one only if every
# observer row's discarded mass stays within `ε_row`, until the saving target is met.

# %%
from lab_setup import example_capture

import workbench as wb

lm, ex, prompt, cap = example_capture()      # SmolLM2-135M-Instruct (or WORKBENCH_MODEL); data/example_prompt.json
spans = prompt.spans

# %%
import torch

pooling = wb.HeadPooling(zeta=0.5, tau=1.0)(cap)
prio = wb.ChunkPriorities(eps_s=0.1, lam=0.5).score(pooling.mu, spans)
layer = cap.L // 2                           # the middle layer (15 on the default model)
prio.to_frame().query("layer == @layer").round(3)

# %% [markdown]
# ## The greedy proposal at one layer
#
# The row–chunk mass table `m_{ai} = A^{l,h}_u(c_i)` has one row per (head, observer) pair
# (`9 × 8 = 72` rows). With target 25 % of the candidate tokens and `ε_row = 0.2`:

# %%
m = wb.mass_table(cap.observer_attn(), spans)               # [L, H_Q * W_p, k]
sel = wb.GreedySelection(target=0.25, eps_row=0.2, m0=1).select(prio.S[layer], spans.n, m[layer])
print(sel.verdict)
print("scan order (lowest S first):", sel.scan_order, "→ removed", sel.removed)

# %%
wb.plots.chunk_priorities(prio, spans, layer=layer, removed=sel.removed)

# %% [markdown]
# ## Where the answer chunk ranks, layer by layer
#
# Rank 0 = highest priority (removed last). Rényi priorities against the comparison priorities of
# SPEC §3: mass only (`λ = 0`) and per-head max. Early layers rank the answer chunk poorly; the
# reading layers put it on top.

# %%
import pandas as pd

ans = spans.chunk_doc.index(ex.answer_doc)
methods = {"Rényi (λ = 0.5)": prio.S, "mass only (λ = 0)": wb.mass_only_priorities(pooling.mu, spans).S,
           "per-head max": wb.per_head_max_priorities(pooling.a, spans)}
ranks = pd.DataFrame([dict(layer=l, method=name, rank=int((S[l] > S[l, ans]).sum()))
                      for name, S in methods.items() for l in range(cap.L)])
wb.plots.answer_rank(ranks, answer_chunk=ans, model_id=cap.model_id)

# %% [markdown]
# ## The null and property (10)
#
# Under the uniform null (`μ` spread evenly over the documents) every chunk has `ℓ_i = 1`, `κ_i = 0`,
# `S_i = 0`. And because `κ ∈ [0, 1]`, `S_i − S_j ≥ ln(ℓ_i/ℓ_j) − λ` for every pair.

# %%
doc = spans.document_mask().to(torch.float64)
null = wb.ChunkPriorities(eps_s=0.1, lam=0.5).score(doc / doc.sum(), spans)
assert torch.allclose(null.ell, torch.ones_like(null.ell)) and torch.allclose(null.kappa, torch.zeros_like(null.kappa), atol=1e-12)
S, ell = prio.S, prio.ell
gap = (S[:, :, None] - S[:, None, :]) - (torch.log(ell[:, :, None] / ell[:, None, :]) - prio.lam)
print(f"min over layers and pairs of (S_i − S_j) − (ln ℓ_i/ℓ_j − λ) = {float(gap.min()):.3e}")
assert float(gap.min()) >= -1e-12

# %% [markdown]
# ## Budget: saving target against the row tolerance
#
# How much the greedy scan removes (`D_l`, tokens) at this layer as the target and `ε_row` move,
# with the LP upper bound `U_l` on the best possible removal (SPEC §5). The scan stops at the first
# chunk that reaches the target, so `D_l` may overshoot it. Where the dashed `U_l` lies below the dotted
# diagonal the target is **provably** infeasible at that `ε_row`; where only the greedy misses, nothing
# is proved.

# %%
rows = []
for eps_row in (0.05, 0.1, 0.2, 0.4):
    for target in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        r = wb.GreedySelection(target=target, eps_row=eps_row, m0=1).select(prio.S[layer], spans.n, m[layer])
        rows.append(dict(eps_row=eps_row, target=r.target_tokens, D=r.D, U=r.U, reached=r.reached,
                         infeasible_proved=r.infeasible_proved))
budget = pd.DataFrame(rows)
wb.plots.removal_budget(budget, layer=layer, model_id=cap.model_id)

# %%
budget.tail(6)

# %% [markdown]
# ### Interactive panel
#
# Move `λ`, `ε_s`, the saving target and `ε_row`: the priority bars, the greedy removal, its envelope and the certificate of the layer follow. No model call.

# %%
panel = wb.widgets.PriorityPanel(cap, wb.EntroPrefillParams(target=0.25, eps_row=0.2), layer=layer)
panel.widget

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
row_load = m[layer][:, sel.removed].sum(-1)              # every (head, observer) row's removed mass
D_again = int(spans.n[sel.removed].sum())
print(f"layer {layer}: removed chunks {sel.removed}: D_l = {sel.D} = Σ n_i = {D_again} tokens "
      f"(target {sel.target_tokens}), LP bound U_l = {sel.U:.2f}; max row load {float(row_load.max()):.3f} ≤ ε_row = 0.2")
print(f"budget grid: {len(budget)} settings; max D_l − U_l = {float((budget.D - budget.U).max()):.2f}; "
      f"{int(budget.reached.sum())} reached the target, {int(budget.infeasible_proved.sum())} proved infeasible")
print(f"property (10): min slack {float(gap.min()):.2e}; null priorities max |S_i| = {float(null.S.abs().max()):.1e}")
assert sel.D == D_again and sel.D <= sel.U + 1e-6                              # greedy D_l ≤ LP bound U_l
assert sel.reached and sel.D >= sel.target_tokens                              # the target is met at this layer
assert float(row_load.max()) <= 0.2 + 1e-9 and len(sel.removed) <= spans.k - 1  # row constraints and m_0 = 1
assert (budget.D <= budget.U + 1e-6).all()                                     # the certificate bounds every removal
assert (budget.D[budget.reached] >= budget.target[budget.reached]).all()      # reached: removed ≥ target
assert (budget.U[budget.infeasible_proved] < budget.target[budget.infeasible_proved]).all()
assert not (budget.reached & budget.infeasible_proved).any()
assert float(gap.min()) >= -1e-12 and float(null.S.abs().max()) < 1e-9
