# %% [markdown]
# # 07 · Prefill vs first decode: the attention shift
#
# SPEC §9 (`deferkv-guide.md`). KV eviction right after prefill (SnapKV) scores prompt tokens with the
# attention of the last prompt rows `r = −W+1 … 0`. DeferKV waits one step and adds the query of the
# first generated token, `r = 1`. The claim to check: the attention pattern **jumps** across the
# prefill/decode boundary (`0 → 1`) much more than between later decode steps (`1 → 2`, `2 → 3`), so one
# step of waiting buys a better view of what the answer will read.
#
# Rows are restricted to the prompt keys and renormalised; recall is the top-`k` overlap with the
# future reference (mean attention of the decode rows).

# %%
import torch
from lab_setup import load

import workbench as wb

lm = load()
prompt = wb.load_example().build(lm.tokenizer, max_context=lm.shape.max_context)
cap = wb.run_capture(lm, prompt, wb.RowSet(observers=False, audit=None, tail=16, n_decode=10), progress=False)
print("answer:", repr(lm.tokenizer.decode(cap.generated_ids)))
sh = wb.ShiftAnalysis(k=32, ref_start=1)(cap)   # SPEC's reference: decode rows 1…n (the default is held out)
sh.summary().round(3)

# %%
wb.plots.shift_steps(sh)

# %% [markdown]
# ## The boundary leap, per layer
#
# Recall gain across the boundary `0 → 1` against the later gains `1 → 2` and `2 → 3`, per layer
# (mean over KV groups). With the reference containing decode rows 1…n, rows 1–3 are partly compared
# with themselves; the held-out reference (decode rows 4…10) below removes that advantage.

# %%
import pandas as pd

held = wb.ShiftAnalysis(k=32, ref_start=4)(cap)
g = sh.layer_gains("group")                  # per layer: gain_m10, gain_01, gain_12, gain_23 (mean over groups)
gains_fig = wb.plots.shift_gains(sh, held_out=held)
gains_fig

# %%
summ = pd.concat([sh.summary().assign(reference="decode 1..10"), held.summary().assign(reference="held-out 4..10")])
summ.query("level == 'group'")[["reference", "recall_0", "recall_1", "gain_01", "gain_12", "gain_23", "leap_fraction"]].round(3)

# %% [markdown]
# On the bundled prompt the recall jumps across the boundary and then flattens or falls (`1 → 2`,
# `2 → 3`) in most layers, also against the held-out reference. The last step *inside* the prompt
# (`−1 → 0`) gains almost as much as the boundary, though: the tail rows are still converging on the
# question, so the leap is real but not the only change. `benchmarks/RESULTS.md` has the same
# measurement on longer prompts.
#
# One head's rows side by side: the last prompt row (`r = 0`) and the first decode row (`r = 1`) at the
# layer with the largest boundary gain.

# %%
layer = int(g["gain_01"].idxmax())
tail0 = int(cap.rows_of("tail")[-1]); dec1 = int(cap.rows_of("decode")[0])
print(f"layer {layer}: rows {tail0} (r = 0, position {int(cap.row_pos[tail0])}) and {dec1} (r = 1)")
wb.plots.attention_strip(cap, layer=layer, head=0, row=tail0)

# %%
wb.plots.attention_strip(cap, layer=layer, head=0, row=dec1)

# %% [markdown]
# ### Interactive panel
#
# Choose `k`, the first decode row of the reference and the tail window. No model call.

# %%
panel = wb.widgets.ShiftPanel(cap, k=32)
panel.widget

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
import math

# by hand, for group 0 at the layer above: the rows r = 0 and r = 1 on the prompt keys, renormalised
# per head and averaged over the group's heads; JSD with natural logs, unclamped
T = prompt.T
heads = (cap.head_group == 0).nonzero().flatten()
def group_row(i):
    rows = cap.attn[layer][heads, i, :T].double()
    return (rows / rows.sum(-1, keepdim=True)).mean(0)
def H(p):
    return -float(torch.special.xlogy(p, p).sum())
p0, p1 = group_row(tail0), group_row(dec1)
jsd_hand = H((p0 + p1) / 2) - (H(p0) + H(p1)) / 2
i01 = int((sh.r == 0).nonzero())
ref = torch.stack([group_row(int(i)) for i in cap.rows_of("decode")]).mean(0)        # decode rows 1..10
top = lambda p: set(torch.topk(p, sh.k).indices.tolist())
recall_hand = len(top(p1) & top(ref)) / sh.k
gain = g[["gain_01", "gain_12", "gain_23"]].mean()
gain01_hand = (sh.recall_group[..., i01 + 1] - sh.recall_group[..., i01]).mean(1)    # [L]: r = 1 minus r = 0
print(f"layer {layer}, group 0: JSD(r=0, r=1) by hand {jsd_hand:.5f}, ShiftAnalysis {float(sh.jsd_group[layer, 0, i01]):.5f} "
      f"(ln 2 = {math.log(2):.4f}); top-{sh.k} recall at r = 1 by hand {recall_hand:.4f}, "
      f"ShiftAnalysis {float(sh.recall_group[layer, 0, i01 + 1]):.4f}")
print(f"JSD over all layers, groups, steps in [{float(sh.jsd_group.min()):.4f}, {float(sh.jsd_group.max()):.4f}]; "
      f"recall in [{float(sh.recall_group.min()):.3f}, {float(sh.recall_group.max()):.3f}]")
print(f"mean recall gain over layers: 0 → 1 {gain.gain_01:.3f}, 1 → 2 {gain.gain_12:.3f}, 2 → 3 {gain.gain_23:.3f}; "
      f"figure's 0 → 1 line equals the recall differences by hand (max over layers {float(gain01_hand.max()):.3f})")
assert 0 <= jsd_hand <= math.log(2) and abs(jsd_hand - float(sh.jsd_group[layer, 0, i01])) < 1e-6
assert abs(recall_hand - float(sh.recall_group[layer, 0, i01 + 1])) < 1e-9
assert float(sh.jsd_group.min()) >= 0 and float(sh.jsd_group.max()) <= math.log(2)
assert ((sh.recall_group >= 0) & (sh.recall_group <= 1)).all() and len(cap.generated_ids) == 10
assert gain.gain_01 > max(gain.gain_12, gain.gain_23)          # the boundary leap of the text above
assert torch.allclose(torch.as_tensor(gains_fig.data[1].y), gain01_hand, atol=1e-12)   # the figure's 0 → 1 line
