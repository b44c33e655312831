# %% [markdown]
# # 10 · Why a shallow certificate is insufficient (paper §6.1)
#
# The audit of notebook 05 certifies that the **shallow** attention (up to the gather layer `l*`)
# puts little mass on the removed tokens. Paper §6.1 shows that no bound depending only on that
# shallow mass can control the output: there are networks and prompt pairs where the shallow mass on
# the removed position tends to zero, while a **later** head reads that position with mass `1 − γ` and
# the first token changes.
#
# Here the construction is built by hand as a tiny two-layer attention network (plain torch, weights
# set explicitly; `workbench/analyse/counterexample.py`, which the panel below rebuilds at every slider move)
# and checked numerically:
#
# - residual stream `x_j = [c_j, m_j, e_j, 1]`: a signed value coordinate `c` (`±V` at `j*`, else 0), a
#   marker coordinate `m` (1 at `j*`), a position one-hot `e`, a constant;
# - **shallow layer**: query/key read only the position and the constant (never `c`) and give the last
#   query mass exactly `ε` on `j*`; its output projection and MLP are zero, so the shallow prefix is
#   the identity;
# - **deep layer**: its key reads the separate marker coordinate and gives mass `1 − γ` to `j*`; its
#   value reads only `c`;
# - **readout**: two logits `z = (o, −o + β)` for a small `β > 0`.
#
# Two prompts A and B differ only in `c_{j*} = +V` vs `−V`. Remove `E = {j*}` after the shallow layer.

# %%
import torch

import workbench as wb

wb.use_laid_out_outputs()   # figures shown as outputs are laid out for the screen (the other notebooks: lab_setup)

ce = wb.ShallowCounterexample(eps=1e-3, gamma=0.05)  # V = 2, β = 0.1; T = 8 positions, j* = 3
T, j_star, V = ce.T, ce.j_star, ce.V
A, B = ce.prompt("A"), ce.prompt("B")             # [T, D] residual streams: D = [c, m, one-hot (T), 1]
R = ce.retained                                   # every position but j*
for name, w in ce.weights().items():              # the weights, set explicitly: every non-zero entry
    print(name, {int(i): round(float(w[i, 0]), 4) for i in w[:, 0].nonzero().flatten()})
res = ce()                                        # both prompts, full and reduced, and the shallow audit

# %% [markdown]
# ## Shallow evidence: identical, and tiny
#
# The shallow attention rows of A and B are **identical** (the shallow maps ignore `c`), and the mass on
# `j*` is `ε`. The audit of SPEC §6 (exact mode, one head, the last row) passes for any `ε_audit ≥ ε`;
# so does the envelope of SPEC §4. The retained states `X|_R` are identical between A and B too.

# %%
rowA, rowB, au = res.shallow, res.shallow_b, res.audit   # audit_bounds(rowA[None, None, :], E, "exact", eps_audit=0.01)
print(f"shallow rows equal: {torch.equal(rowA, rowB)}; mass on j*: {float(rowA[j_star]):.2e}")
print(au.message)
assert torch.equal(rowA, rowB) and au.passed and res.retained_equal and torch.equal(A[R], B[R])

# %% [markdown]
# ## Deep reference vs reduced outputs
#
# The full (reference) deep head reads `j*` with mass `1 − γ` and outputs `±(1−γ)V`. The reduced
# computation runs the deep layer on `R` only: its inputs are the same for A and B, so its outputs
# agree (here 0). By the triangle inequality at least one of the two errors is `≥ (1−γ)V`; in this
# construction both are. With the readout, prompt A's first token flips.

# %%
out = res.to_frame()
out.round(4)

# %%
wb.plots.counterexample_logits(res)

# %%
err = list(res.errors)                             # |o − o_R| of A and B
print(f"output errors |o − o_R|: A {err[0]:.4f}, B {err[1]:.4f}; lower bound (1−γ)V = {(1 - 0.05) * V:.4f}")
assert max(err) >= (1 - 0.05) * V - 1e-9
assert out.first_token[0] != out.first_token[1]     # prompt A: the removal changes the first token

# %% [markdown]
# ## Taking `ε → 0`
#
# The shallow mass on the removed position goes to zero; the deletion error does not move. Taking
# `γ → 0` pushes the error up to `V`. No bound that depends only on shallow discarded attention can
# vanish uniformly over this class of networks: the certificate needs premises about the later
# layers (paper §6.2–§6.3), which notebook 06 measures on the real model.

# %%
eps_grid = [10.0 ** -p for p in range(1, 10)]
sweep = wb.deletion_sweep(eps_grid, (0.3, 0.05, 0.001), V=V)   # prompt A's error for every (ε, γ)
wb.plots.counterexample_errors(sweep)

# %% [markdown]
# ### Interactive panel
#
# Move `ε` (the shallow mass on `j*`) and `γ` (the deep head's mass off `j*`): the construction is rebuilt,
# the last query's shallow and deep attention rows and the four first-token logit pairs are redrawn in place,
# and the line above them gives the audit's verdict, the deletion errors and the first tokens. The rows and
# the audit follow `ε`; the logits and the errors do not move with it.

# %%
panel = wb.widgets.CounterexamplePanel(ce)
panel.widget

# %% [markdown]
# ## Checks
#
# The shallow mass on the removed position per `γ` (smallest over the `ε` grid) and the deletion error (smallest and largest over the grid), against `(1 − γ)V`.

# %%
per_gamma = sweep.groupby("gamma").agg(min_shallow_mass=("shallow_mass", "min"), min_error=("error", "min"),
                                       max_error=("error", "max"), bound=("bound", "first"))
print(per_gamma.to_string(float_format=lambda x: f"{x:.3g}"))
print(f"ε = 1e-3: first token full A {out.first_token[0]}, reduced A {out.first_token[1]}; errors A {err[0]:.4f}, B {err[1]:.4f}")
assert (abs(sweep.shallow_mass - sweep.eps) < 1e-9 * (1 + sweep.eps)).all()     # the shallow mass is exactly ε
assert float(sweep.shallow_mass.min()) < 1e-8                                   # ... and goes to 0
assert (sweep.error >= sweep.bound - 1e-9).all()                                # the error never drops below (1−γ)V
assert ((per_gamma.max_error - per_gamma.min_error) < 1e-9).all()               # nor moves as ε → 0
assert float(sweep[sweep.gamma == 0.001].error.min()) > 0.99 * V                # γ → 0: the error tends to V
assert out.first_token[0] != out.first_token[1] and min(err) >= (1 - 0.05) * V - 1e-9
# by hand: the full deep head outputs ±(1 − γ)V, the reduced one 0 (its inputs are the same for A and B)
assert abs(out.o[0] - (1 - 0.05) * V) < 1e-12 and abs(out.o[2] + (1 - 0.05) * V) < 1e-12
assert out.o[1] == out.o[3] and abs(out.o[1]) < 1e-12
panel.controls["eps"].value = 1e-6                                              # the panel follows its ε slider
moved = (float(panel.figures["rows"].data[0].y[j_star]), list(panel.figures["logits"].data[0].y))
panel.controls["eps"].value = 1e-3
print(f"panel at ε = 1e-6: shallow mass on j* {moved[0]:.2e}, logits of token 0 {[round(v, 4) for v in moved[1]]}")
assert abs(moved[0] - 1e-6) < 1e-12 and max(abs(u - v) for u, v in zip(moved[1], out.z0)) < 1e-12   # logits: the table's
