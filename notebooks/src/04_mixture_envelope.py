# %% [markdown]
# # 04 · The mixture deletion envelope
#
# SPEC §4 (paper §4.1). The pooled measure is a mixture of the observer rows:
# `μ = Σ_a ω_a A_a` with `ω_{h,u} = w_h/(G W_p)`. So a removal `E` with small pooled mass
# `q = μ(E)` cannot hide a large mass `η_a = A_a(E)` in any single row beyond
#
# `η ≤ min{1, q/ω, q + sqrt(D_χ²(A_a‖μ) · q(1−q))}`,   with `D_χ² ≤ 1/ω − 1`.
#
# What to look at: every observer row sits below its envelope, for every removal; the bound is
# attained by a constructed example; and the output of a head moves by at most `2Vη`.

# %%
from lab_setup import example_capture

import workbench as wb

lm, ex, prompt, cap = example_capture()      # SmolLM2-135M-Instruct (or WORKBENCH_MODEL); data/example_prompt.json
spans = prompt.spans

# %%
import torch

layer = cap.L // 2                           # the middle layer (15 on the default model)
params = wb.EntroPrefillParams(target=0.25, eps_row=0.2)        # ζ = 0.5, τ = 1, ε_s = 0.1, λ = 0.5: the defaults
inputs = wb.proposal_inputs(cap, params)                        # the pooling (§2), the priorities (§3), the mass table
sel = wb.layer_proposal(cap, params, layer, inputs=inputs).selection   # the greedy proposal (§5), as trace() makes it
pooling = inputs.pooling
A_obs = cap.observer_attn()                                   # [L, H_Q, W_p, T]
env = wb.envelope(A_obs[layer], pooling.mu[layer], pooling.omega[layer], spans.removal_mask(sel.removed), layer=layer)
print(f"E = chunks {sel.removed}: q = μ(E) = {env.q:.4f}; max row mass η = {float(env.eta.max()):.4f}; "
      f"every row within its envelope: {env.all_hold}")
env.to_frame().sort_values("eta", ascending=False).head(8).round(4)

# %%
wb.plots.envelope_rows(env)

# %% [markdown]
# ## Every removal, every row
#
# All `2^8 − 1 = 255` unions of chunks at this layer, every observer row: actual `η` against the
# envelope. No point may lie above the diagonal. The closer to it, the tighter the envelope.

# %%
import itertools

import numpy as np

removals = [E for size in range(1, spans.k + 1) for E in itertools.combinations(range(spans.k), size)]
envs = [wb.envelope(A_obs[layer], pooling.mu[layer], pooling.omega[layer], spans.removal_mask(E), layer=layer)
        for E in removals]
above = [E for E, e in zip(removals, envs) if not e.all_hold]
assert not above, above                                       # removal sets with a row above its envelope
pts = np.concatenate([np.stack([e.bound.numpy(), e.eta.numpy()], 1) for e in envs])   # [(row, E), (envelope, η)]
print(f"{len(pts)} (row, E) pairs, none above the envelope; median η / envelope = {np.median(pts[:, 1] / pts[:, 0]):.3f}")
wb.plots.envelope_scatter(envs, removals=removals, model_id=cap.model_id)

# %% [markdown]
# The divergence cap `D_χ² ≤ 1/ω − 1` holds for every row, at every layer:

# %%
ratio = max(float((wb.chi2_divergence(A_obs[l].reshape(-1, spans.T), pooling.mu[l])
                   / (1 / pooling.omega[l].repeat_interleave(spans.W_p) - 1)).max()) for l in range(cap.L))
print(f"max over layers and rows of D_χ² / (1/ω − 1) = {ratio:.4f}")
assert ratio <= 1 + 1e-9

# %% [markdown]
# ## Sharpness (SPEC §4)
#
# Take a point mass `a`, a measure `b` supported elsewhere, `μ = ω a + (1−ω) b` and `E = supp a`.
# Then `q = ω` and the row `a` loses everything, `η = 1`, and both non-trivial terms of the envelope
# equal 1: it cannot be improved in general.

# %%
T, omega, f64 = 10, 0.2, torch.float64
a = torch.zeros(T, dtype=f64); a[3] = 1
b = torch.full((T,), 1 / (T - 1), dtype=f64); b[3] = 0
mu = omega * a + (1 - omega) * b
rows = torch.stack([a, b])[:, None, :]                           # two "heads", one row each
e = wb.envelope(rows, mu, torch.tensor([omega, 1 - omega], dtype=f64), a.bool())
print(f"q = {e.q:.3f}, η(a) = {float(e.eta[0]):.3f}, q/ω = {float(e.term_ratio[0]):.3f}, "
      f"q + sqrt(D_χ² q(1−q)) = {float(e.term_chi2[0]):.3f}")
assert abs(float(e.eta[0]) - 1) < 1e-12 and abs(float(e.term_ratio[0]) - 1) < 1e-9 and abs(float(e.term_chi2[0]) - 1) < 1e-9

# %% [markdown]
# ## From mass to output: `‖o − o_R‖ ≤ 2Vη`
#
# Removing `E` and renormalising moves a head's output by at most twice the largest value norm
# times the discarded mass. Equality: values `+V` on `E` and `−V` elsewhere along one direction.
# The capture records `V = max_j ‖v_j‖` per layer and KV head (`cap.vnorm_max`), so the bound for
# the real rows above is available without the values themselves.

# %%
V, eta = 2.5, 0.3
row = torch.full((T,), (1 - eta) / (T - 3), dtype=f64); row[:3] = eta / 3
E = torch.zeros(T, dtype=torch.bool); E[:3] = True
vals = torch.zeros(T, 4, dtype=f64); vals[:, 0] = torch.where(E, V, -V)
_, _, shift, eta_row = wb.output_shift(row, vals, E)
print(f"η = {eta_row:.3f}: ‖o − o_R‖ = {shift:.4f}, bound 2Vη = {wb.output_bound(eta_row, V):.4f}")
assert abs(shift - wb.output_bound(eta_row, V)) < 1e-9

g = cap.head_group
real = wb.output_bound(env.eta.view(cap.H_Q, -1).max(-1).values, cap.vnorm_max[layer, g].double())
print("bound on the output change of each head at layer", layer, "under E:", real.numpy().round(2))

# %% [markdown]
# ### Interactive panel
#
# The removal here is the greedy proposal; move the target, `ε_row` or the layer and the envelope of every observer row follows the new removal. No model call.

# %%
panel = wb.widgets.PriorityPanel(cap, params, layer=layer)
panel.widget

# %% [markdown]
# ### Export for a paper
#
# `workbench.show.export.export_all` writes every figure as PDF/SVG/PNG at the single-column width (3.33 in),
# with a JSON sidecar (the figure's parameters, model and prompt identity) and a CSV of its data.
# Here into a temporary folder; pass your own folder instead.

# %%
import tempfile
from pathlib import Path

out = Path(tempfile.mkdtemp(prefix="workbench-figures-"))
written = wb.export_all({"envelope_rows": wb.plots.envelope_rows(env)}, out, width="single")
sorted(p.name for paths in written.values() for p in paths)

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
removed_mask = spans.removal_mask(sel.removed)                         # bool [T], E = the greedy removal
q_chk = float(pooling.mu[layer][removed_mask].sum())                   # q = μ(E)
rows_chk = A_obs[layer].reshape(-1, spans.T).double()                  # [H_Q * W_p, T], a = (h, u)
eta_chk = rows_chk[:, removed_mask].sum(-1)                            # η_a = A_a(E)
omega_chk = pooling.omega[layer].repeat_interleave(spans.W_p)
chi2_chk = wb.chi2_divergence(rows_chk, pooling.mu[layer])
bound_chk = torch.minimum(torch.minimum(torch.ones_like(eta_chk), q_chk / omega_chk),
                          q_chk + torch.sqrt(chi2_chk * q_chk * (1 - q_chk)))
slack = bound_chk - eta_chk
files = sorted(p.suffix for paths in written.values() for p in paths)
print(f"E = chunks {sel.removed} at layer {layer}: q = {q_chk:.4f}; {len(eta_chk)} rows, η ≤ envelope everywhere, "
      f"min slack {float(slack.min()):.4f} (row {int(slack.argmin())}: η = {float(eta_chk[slack.argmin()]):.4f})")
print(f"all {len(pts)} (row, E) pairs: max η − envelope = {float((pts[:, 1] - pts[:, 0]).max()):.2e}; "
      f"max D_χ² / (1/ω − 1) = {ratio:.4f}")
print(f"sharpness: η = {float(e.eta[0]):.3f} = q/ω = {float(e.term_ratio[0]):.3f}; output bound attained: "
      f"{shift:.4f} = 2Vη = {wb.output_bound(eta_row, V):.4f}; exported {files}")
assert abs(q_chk - env.q) < 1e-9 and torch.allclose(eta_chk, env.eta, atol=1e-6)
assert torch.allclose(bound_chk, env.bound, atol=1e-9)
assert bool((eta_chk <= bound_chk + 1e-6).all())                      # SPEC §4: η ≤ min{1, q/ω, q + sqrt(D_χ² q(1−q))}
assert float((chi2_chk / (1 / omega_chk - 1)).max()) <= 1 + 1e-9       # D_χ² ≤ 1/ω − 1
assert (pts[:, 1] <= pts[:, 0] + 1e-6).all() and ratio <= 1 + 1e-9
assert abs(float(e.eta[0]) - 1) < 1e-12 and abs(shift - wb.output_bound(eta_row, V)) < 1e-9
assert files == [".csv", ".json", ".pdf", ".png", ".svg"] and all(p.stat().st_size > 0 for ps in written.values() for p in ps)
