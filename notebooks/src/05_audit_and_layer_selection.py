# %% [markdown]
# # 05 · Independent audit and adaptive layer selection
#
# SPEC §5–§6 (paper §4.2, §5). Every monitored layer `l` proposes a removal `E_l` from the proposal
# observers only (notebooks 02–04). A layer is **accepted** when
#
# 1. residual and document mass are valid,
# 2. the proposal reaches the saving target `D_l ≥ target`,
# 3. the candidate is stable: `d_l = |R_l △ R_{l⁻}| / |R_l ∪ R_{l⁻}| ≤ d_max` for `streak` consecutive layers,
# 4. an **independent audit** over rows after the documents bounds every head's discarded mass by `ε_audit`.
#
# The first accepted layer is `l*`; if none passes, the prefill runs in full (bypass). `trace()`
# replays the paper's steps 1–7 on a capture, without the model, and records every layer.

# %%
from lab_setup import example_capture

import workbench as wb

lm, ex, prompt, cap = example_capture()      # SmolLM2-135M-Instruct (or WORKBENCH_MODEL); data/example_prompt.json
spans = prompt.spans

# %%
params = wb.EntroPrefillParams(zeta=0.5, tau=1.0, target=0.25, eps_row=0.2, streak=1, eps_audit=0.2,
                               audit_mode="exact")
tr = wb.trace(cap, params)
print(tr.decision)
tr.to_frame()[["layer", "removed", "D", "U", "gap", "d", "streak", "max_audit_bound", "status"]].head(8)

# %% [markdown]
# ## The per-layer trace
#
# Proposal saving `D_l`, the LP certificate `U_l ≥ D*_l` and their gap, stability, streak, audit and
# the decision at each monitored layer. Layers after `l*` are shown as counterfactuals (not executed).

# %%
wb.plots.trace_layers(tr)

# %% [markdown]
# ## Certificate against the budget
#
# `U_l(y, t) = Σ_a y_a ε_a + t(k − m_0) + Σ_i [n_i − Σ_a y_a m_{ai} − t]_+` bounds the best removal for
# any prices `y, t ≥ 0`; LP prices make it tightest. Layers where `U_l` is below the target are
# provably infeasible at this `ε_row`; where `D_l < target ≤ U_l`, the greedy scan alone missed.

# %%
wb.plots.certificate(tr)

# %% [markdown]
# ## The audit at `l*`
#
# Audit population `ν`: the user-query rows after the documents (12 positions here, the default of
# SPEC §6). `E_l` was fixed from the proposal observers before any audit value was computed, and the
# audit thresholds were fixed in `params` before that. In **exact** mode the mean discarded mass over
# the population is computed exactly (`b = 0`). Every head must be within `ε_audit`.

# %%
au = tr.audits[tr.l_star]
print(au.message)
au.to_frame().round(4)

# %% [markdown]
# ## Sampled audit: when no layer can pass
#
# With an i.i.d. sample of `m_a` rows the Hoeffding radius is
# `b = sqrt(ln(J H_Q / δ) / (2 m_a))` over `J` monitored layers. If `b > ε_audit`, no layer can
# pass whatever the attention looks like, and the trace says so instead of failing silently.

# %%
import pandas as pd

J, H = len(tr.layers), cap.H_Q
m_grid = [8, 16, 32, 64, 128, 256, 512, 1024]
df = pd.DataFrame([dict(m_a=m, delta=d, b=wb.hoeffding_b(m, d, J, H)) for m in m_grid for d in (0.01, 0.05, 0.2)])
wb.plots.hoeffding_radius(df, eps_audit=params.eps_audit, J=J, H_Q=H, model_id=cap.model_id)

# %%
sampled = wb.trace(cap, params.replace(audit_mode="sampled", m_a=32))
print(sampled.decision)
print(*sampled.notes, sep="\n")
assert sampled.bypass and sampled.b > params.eps_audit

# %% [markdown]
# ## Sensitivity: which layer is accepted
#
# `l*` under a few settings of `ε_audit` and the streak requirement (`<NA>`: no layer passes, full
# prefill). A looser audit accepts earlier; a longer streak later. Each trace reuses the capture's
# cached statistics; no model call.

# %%
rows = []
for eps_audit in (0.05, 0.1, 0.2, 0.4):
    for streak in (0, 1, 2):
        t = wb.trace(cap, params.replace(eps_audit=eps_audit, streak=streak), certify=False)
        rows.append(dict(eps_audit=eps_audit, streak=streak, l_star=t.l_star, removed=t.removed,
                         saved_tokens=sum(spans.n[i].item() for i in t.removed)))
pd.DataFrame(rows).pivot(index="eps_audit", columns="streak", values="l_star").astype("Int64")   # <NA>: bypass

# %% [markdown]
# ### Interactive panel
#
# Every parameter of the 7-step procedure; the trace, the certificates and the decision follow. No model call (the LP certificates update when a slider is released).

# %%
panel = wb.widgets.AuditPanel(cap, params)
panel.widget

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
import math

import torch

f = tr.to_frame()
certified = f[f.U.notna()]
b_formula = math.sqrt(math.log(sampled.J * cap.H_Q / params.delta) / (2 * 32))      # m_a = 32
b_grid = [math.sqrt(math.log(J * H / d) / (2 * m)) for m, d in zip(df.m_a, df.delta)]
E_star = spans.removal_mask(tr.removed)
eta_again = cap.attn[tr.l_star][:, tr.audit_rows][..., :spans.T][..., E_star].sum(-1).double()   # [H_Q, M]
sens = pd.DataFrame(rows).pivot(index="eps_audit", columns="streak", values="l_star")
print(f"l* = {tr.l_star}, E = chunks {tr.removed}: exact audit over {eta_again.shape[1]} rows, "
      f"max_h η_h = {float(au.eta.max()):.4f} ≤ ε_audit = {params.eps_audit}")
print(f"U_l − D_l over {len(certified)} certified layers: min {float((certified.U - certified.D).min()):.3f}")
print(f"Hoeffding radius at m_a = 32, δ = {params.delta}, J = {sampled.J}, H_Q = {cap.H_Q}: "
      f"sqrt(ln(J H_Q/δ)/(2 m_a)) = {b_formula:.4f} = trace's b {sampled.b:.4f} > ε_audit → bypass")
print("l* by ε_audit (rows) × streak (columns), <NA> = bypass:\n" + sens.astype("Int64").to_string())
assert tr.l_star is not None and tr.records[tr.layers.index(tr.l_star)]["status"] == "accept"
assert (certified.U >= certified.D - 1e-6).all()                    # U_l bounds the greedy removal
assert au.b == 0 and torch.allclose(au.eta_rows, eta_again, atol=1e-6)          # the audit's rows, recomputed
assert torch.allclose(au.eta, eta_again.mean(-1), atol=1e-6) and float(au.bound.max()) <= params.eps_audit
assert abs(sampled.b - b_formula) < 1e-12 and sampled.bypass and sampled.b > params.eps_audit
assert max(abs(a - b) for a, b in zip(df.b, b_grid)) < 1e-12
for streak in sens.columns:                      # a looser audit never accepts later (NaN: bypass)
    ls = sens[streak].fillna(math.inf).tolist()
    assert all(x >= y for x, y in zip(ls, ls[1:])), (streak, ls)
