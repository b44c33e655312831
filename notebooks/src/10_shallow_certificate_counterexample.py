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
# set explicitly) and checked numerically:
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
import math

import torch

f64 = torch.float64                              # float64 throughout: the checks below are tight
T, j_star, V, beta = 8, 3, 2.0, 0.1
D = 2 + T + 1                                  # [c, m, position one-hot (T), 1]
C, M, POS, ONE = 0, 1, slice(2, 2 + T), 2 + T

def prompt(sign):
    x = torch.zeros(T, D, dtype=f64)
    x[:, POS] = torch.eye(T, dtype=f64)
    x[:, ONE] = 1.0
    x[j_star, M] = 1.0
    x[j_star, C] = sign * V
    return x

def attn(q, k, keys):
    """Causal softmax row of the last query over the given key positions."""
    return torch.softmax(q[-1] @ k[keys].T, dim=-1)

class Net:
    """Shallow layer (identity prefix) then one deep attention head and a two-logit readout."""

    def __init__(self, eps, gamma):
        n_other = T - 1
        s1 = math.log(eps * n_other / (1 - eps))          # shallow: mass eps on j*
        s2 = math.log((1 - gamma) * n_other / gamma)       # deep: mass 1 - gamma on j*
        self.WQ1 = torch.zeros(D, 1, dtype=f64); self.WQ1[ONE, 0] = s1
        self.WK1 = torch.zeros(D, 1, dtype=f64); self.WK1[2 + j_star, 0] = 1.0    # reads the position, not c
        self.WQ2 = torch.zeros(D, 1, dtype=f64); self.WQ2[ONE, 0] = s2
        self.WK2 = torch.zeros(D, 1, dtype=f64); self.WK2[M, 0] = 1.0              # separate marker coordinate
        self.WV2 = torch.zeros(D, 1, dtype=f64); self.WV2[C, 0] = 1.0              # reads only the signed value

    def shallow_row(self, x):
        return attn(x @ self.WQ1, x @ self.WK1, torch.arange(T))     # [T]

    def forward(self, x, keep=None):
        """Logits of the first token; ``keep``: retained positions after the shallow layer."""
        # shallow layer: attention computed, then O_1 = 0 and MLP = 0 → X^1 = X^0
        x1 = x
        R = torch.arange(T) if keep is None else keep
        a2 = attn(x1[R] @ self.WQ2, x1[R] @ self.WK2, torch.arange(len(R)))
        o = float(a2 @ (x1[R] @ self.WV2)[:, 0])
        return torch.tensor([o, -o + beta], dtype=f64), a2

net = Net(eps=1e-3, gamma=0.05)
A, B = prompt(+1), prompt(-1)
R = torch.tensor([j for j in range(T) if j != j_star])

# %% [markdown]
# ## Shallow evidence: identical, and tiny
#
# The shallow attention rows of A and B are **identical** (the shallow maps ignore `c`), and the mass on
# `j*` is `ε`. The audit of SPEC §6 (exact mode, one head, the last row) passes for any `ε_audit ≥ ε`;
# so does the envelope of SPEC §4. The retained states `X|_R` are identical between A and B too.

# %%
from workbench.analyse.audit import audit_bounds

rowA, rowB = net.shallow_row(A), net.shallow_row(B)
E = torch.zeros(T, dtype=torch.bool); E[j_star] = True
au = audit_bounds(rowA[None, None, :], E, mode="exact", eps_audit=0.01)
print(f"shallow rows equal: {torch.equal(rowA, rowB)}; mass on j*: {float(rowA[j_star]):.2e}")
print(au.message)
assert torch.equal(rowA, rowB) and au.passed and torch.equal(A[R], B[R])

# %% [markdown]
# ## Deep reference vs reduced outputs
#
# The full (reference) deep head reads `j*` with mass `1 − γ` and outputs `±(1−γ)V`. The reduced
# computation runs the deep layer on `R` only: its inputs are the same for A and B, so its outputs
# agree (here 0). By the triangle inequality at least one of the two errors is `≥ (1−γ)V`; in this
# construction both are. With the readout, prompt A's first token flips.

# %%
import pandas as pd

rows = []
for name, x in (("A (c = +V)", A), ("B (c = −V)", B)):
    for run, keep in (("full", None), ("reduced", R)):
        z, a2 = net.forward(x, keep)
        rows.append(dict(prompt=name, run=run, o=float(z[0]), z0=float(z[0]), z1=float(z[1]),
                         first_token=int(z.argmax()), deep_mass_on_j=float(a2[j_star]) if keep is None else 0.0))
out = pd.DataFrame(rows)
out.round(4)

# %%
import plotly.graph_objects as go

from workbench.show import plots

fig = go.Figure()
for tok, color in ((0, "#0072B2"), (1, "#E69F00")):
    fig.add_bar(x=out.prompt + " · " + out.run, y=out[f"z{tok}"], name=f"logit of token {tok}", marker_color=color)
fig.update_layout(template=plots.TEMPLATE, barmode="group", title="First-token logits: full vs reduced (E = {j*})",
                  yaxis_title="logit")
fig

# %%
err = [abs(out.o[0] - out.o[1]), abs(out.o[2] - out.o[3])]
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
sweep = []
for gamma in (0.3, 0.05, 0.001):
    for eps in eps_grid:
        n = Net(eps, gamma)
        oA = n.forward(A)[0][0]; oA_R = n.forward(A, R)[0][0]
        sweep.append(dict(eps=eps, gamma=gamma, shallow_mass=float(n.shallow_row(A)[j_star]),
                          error=float(abs(oA - oA_R)), bound=(1 - gamma) * V))
sweep = pd.DataFrame(sweep)
fig = go.Figure()
for gamma, g in sweep.groupby("gamma"):
    fig.add_scatter(x=g.eps, y=g.error, mode="lines+markers", name=f"deletion error, γ = {gamma}")
g = sweep[sweep.gamma == 0.05]
fig.add_scatter(x=g.eps, y=g.shallow_mass, mode="lines", line=dict(dash="dash", color="#000"), name="shallow mass on j*")
fig.add_hline(y=V, line_dash="dot", annotation_text="V")
fig.update_layout(template=plots.TEMPLATE, xaxis_type="log", yaxis_type="log", xaxis_title="ε",
                  yaxis_title="mass / error", title="Shallow mass → 0, deletion error stays ≥ (1−γ)V")
fig

# %% [markdown]
# ### Interactive panel
#
# Move `ε` (the shallow mass on `j*`) and `γ` (the deep head's mass off `j*`): the construction is rebuilt,
# the last query's shallow and deep attention rows and the four first-token logit pairs are redrawn in place,
# and the line above them gives the audit's verdict, the deletion errors and the first tokens. The rows and
# the audit follow `ε`; the logits and the errors do not move with it.

# %%
import ipywidgets as W


def counterexample(eps, gamma):
    """This notebook's numbers for one (ε, γ): prompt A's shallow and deep rows of the last query, the
    first-token logits of both prompts (full and reduced), the deletion errors and the shallow audit."""
    n = Net(eps, gamma)
    shallow, deep = n.shallow_row(A), n.forward(A)[1]
    z = {(p, run): n.forward(x, keep)[0] for p, x in (("A", A), ("B", B)) for run, keep in (("full", None), ("reduced", R))}
    errors = [abs(float(z[p, "full"][0] - z[p, "reduced"][0])) for p in ("A", "B")]
    audit = audit_bounds(shallow[None, None, :], E, mode="exact", eps_audit=0.01)
    return shallow, deep, z, errors, audit


eps_slider = W.FloatLogSlider(value=1e-3, base=10, min=-9, max=-0.5, step=0.25, description="ε", readout_format=".1e")
gamma_slider = W.FloatSlider(value=0.05, min=0.001, max=0.5, step=0.001, description="γ", readout_format=".3f")
panel_status = W.HTML()
rows_fig = go.FigureWidget(layout=dict(template=plots.TEMPLATE, barmode="group", yaxis_type="log", width=480, height=360,
                                       title="Prompt A, last query: shallow vs deep row", xaxis_title="key position j",
                                       yaxis_title="attention"))
rows_fig.add_bar(x=list(range(T)), name="shallow layer", marker_color="#000")
rows_fig.add_bar(x=list(range(T)), name="deep head", marker_color="#009E73")
logits_fig = go.FigureWidget(layout=dict(template=plots.TEMPLATE, barmode="group", width=480, height=360,
                                         title="First-token logits: full vs reduced", yaxis_title="logit"))
for tok, color in ((0, "#0072B2"), (1, "#E69F00")):
    logits_fig.add_bar(x=[f"{p} · {run}" for p in ("A", "B") for run in ("full", "reduced")],
                       name=f"logit of token {tok}", marker_color=color)


def update_panel(_=None):
    eps_, gamma_ = eps_slider.value, gamma_slider.value
    shallow, deep, z, errors, audit = counterexample(eps_, gamma_)
    with rows_fig.batch_update():
        rows_fig.data[0].y = shallow.numpy()
        rows_fig.data[1].y = deep.numpy()
    with logits_fig.batch_update():
        for tok in (0, 1):
            logits_fig.data[tok].y = [float(zz[tok]) for zz in z.values()]
    first = {key: int(zz.argmax()) for key, zz in z.items()}
    panel_status.value = (
        f"shallow mass on j* = {float(shallow[j_star]):.2e}: the audit (ε_audit = 0.01) "
        f"{'passes' if audit.passed else 'fails'}; deep mass on j* = {float(deep[j_star]):.3f} = 1 − γ<br>"
        f"|o − o_R|: A {errors[0]:.4f}, B {errors[1]:.4f} ≥ (1 − γ)V = {(1 - gamma_) * V:.4f}; "
        f"first token of A: full {first['A', 'full']}, reduced {first['A', 'reduced']}")


update_panel()
eps_slider.observe(update_panel, names="value")
gamma_slider.observe(update_panel, names="value")
panel = W.VBox([W.HBox([eps_slider, gamma_slider]), panel_status, W.HBox([rows_fig, logits_fig])])
panel

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
eps_slider.value = 1e-6                                                         # the panel follows its ε slider
moved = (float(rows_fig.data[0].y[j_star]), list(logits_fig.data[0].y))
eps_slider.value = 1e-3
print(f"panel at ε = 1e-6: shallow mass on j* {moved[0]:.2e}, logits of token 0 {[round(v, 4) for v in moved[1]]}")
assert abs(moved[0] - 1e-6) < 1e-12 and max(abs(u - v) for u, v in zip(moved[1], out.z0)) < 1e-12   # logits: the table's
