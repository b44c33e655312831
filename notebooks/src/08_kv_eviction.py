# %% [markdown]
# # 08 · KV eviction policies on one footing
#
# SPEC §9. One prefill, then each policy keeps `B` prompt positions per layer and KV group (sinks and
# the last `recent` prompt tokens always kept) and the model decodes on the compacted cache at the
# original positions. Policies: full cache, StreamingLLM (sinks + recent), H2O (accumulated attention
# of all prompt queries), SnapKV (prompt-tail window at `t = 0`), **DeferKV** (the same plus the first
# decode row, evicting after step 1), Page-EntroKV (the pooling of SPEC §2 with pages of SPEC §8),
# random, and an oracle that scores with the full-cache answer's own attention.
#
# The test: a needle in a haystack from `data/needle_haystack.json` — paragraphs of plain prose with the
# password sentence in the middle. Which policies keep the needle's tokens, and which answer correctly?
# To keep the notebook quick on a CPU it uses five of the fourteen paragraphs (about 550 tokens, the
# needle at half depth); `benchmarks/RESULTS.md` has the same table on the full 1.5k-token prompt.

# %%
import dataclasses

import torch
from lab_setup import load

import workbench as wb

lm = load()
full_ex = wb.load_example("needle_haystack")
lo, hi = full_ex.answer_doc - 2, full_ex.answer_doc + 3          # five paragraphs, the needle in the middle
ex = dataclasses.replace(full_ex, documents=full_ex.documents[lo:hi], answer_doc=full_ex.answer_doc - lo,
                         evidence_docs=tuple(e - lo for e in full_ex.evidence_docs if lo <= e < hi))
prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
needle = wb.token_positions(prompt, lm.tokenizer, ex.answer)
print(f"T = {prompt.T}; answer {ex.answer!r} at positions {needle[0]}…{needle[-1]}")

# %% [markdown]
# All eight policies at `B = 64` and `B = 128` prompt positions (about 12 % and 23 % of the prompt), 20 new
# tokens, greedy. One shared prefill captures the union of the evidence the policies need.

# %%
policies = wb.policies.default_policies(n_sink=4, recent=32)
results = wb.run_policies(lm, prompt, policies, budgets=[64, 128], max_new_tokens=20, batch=True, progress=False)
table = wb.survival_table(results, needle, answer=ex.answer)
table

# %% [markdown]
# Which prompt positions each policy kept (fraction of layers × KV groups holding each position, at
# `B = 64`), with the needle marked. StreamingLLM keeps only the two ends; H2O favours tokens many
# queries read; SnapKV/DeferKV and Page-EntroKV find the question's topic.

# %%
wb.plots.kept_positions([r for r in results if r.budget == 64 or r.policy == 'full'], prompt, highlight=needle)

# %% [markdown]
# ## KV bytes and the answers
#
# Every evicting policy holds the same `B` prompt entries per layer and KV group, plus the tokens
# generated before its eviction (one for DeferKV, which evicts after step 1): the same bytes up to that
# one token. They differ only in *which* entries.

# %%
import pandas as pd

frame = pd.concat([r.to_frame() for r in results], ignore_index=True)
frame["correct"] = table["correct"].values
frame[["policy", "budget", "kv_bytes_before", "kv_bytes_after", "kv_ratio", "correct", "text"]]

# %%
wb.plots.kv_bytes_table(frame)

# %% [markdown]
# ## The whole field, by family
#
# Every policy the workbench has, at `B = 64`: **attention-based** (scores read observed attention: H2O,
# SnapKV, TOVA, Page-EntroKV, CriticalKV's value-aware rescaling of SnapKV), **attention-free** (the cache
# alone: StreamingLLM, key norms, key diversity), **forecasts** (the attention of future queries:
# ExpectedAttention predicts it from the prompt's query statistics, DeferKV waits for the first real decode
# query) and **budget allocations** on top of SnapKV's scores (PyramidKV per layer; AdaKV and the
# EntroPrefill head entropies per KV head). Per-head budgets keep each layer's largest head count in a dense
# cache and mask the rest: their KV bytes are higher than `B` alone would give, and `kv_bytes_masked` says
# how much of that is masked.

# %%
family = {n: g for g, names in wb.policies.POLICY_GROUPS.items() for n in names}
field = wb.run_policies(lm, prompt, wb.policies.every_policy(n_sink=4, recent=32), budgets=[64], max_new_tokens=20, batch=True,
                        progress=False)
field_frame = pd.concat([r.to_frame() for r in field], ignore_index=True)
field_table = wb.survival_table(field, needle, answer=ex.answer)
field_table.insert(0, "family", field_table.policy.map(family))
field_table["kv_bytes_after"] = field_frame.kv_bytes_after.values
field_table["kv_bytes_masked"] = field_frame.kv_bytes_masked.values
field_table.sort_values(["family", "policy"])

# %% [markdown]
# ## DeferKV's row weights
#
# DeferKV scores `S_i = Σ_r α_r A_{r,i}` over `r = −W+1 … 1` with `α_r ∝ exp(λr)`. With the guide's
# `λ = 0.1` and `W = 32` the decode row `r = 1` carries only ~10 % of the weight: the selection differs
# little from SnapKV. Larger `λ` leans on the first decode step.

# %%
alpha_fig = wb.plots.deferkv_weights([wb.policies.DeferKV(window=32, lam=lam) for lam in (0.0, 0.1, 0.3, 1.0)])
alpha_fig

# %% [markdown]
# ### Interactive panel
#
# Choose the policy, the budget and DeferKV's `λ`: the kept positions are previewed from a capture of the prompt tail and the first decode row (no model). The run button generates under the policy and shows the answer beside the full-cache answer.

# %%
cap = wb.run_capture(lm, prompt, wb.RowSet(tail=32, n_decode=1), progress=False)
panel = wb.widgets.EvictionPanel(cap, lm, prompt, budget=64, max_new_tokens=20)
panel.widget

# %% [markdown]
# ### Two settings side by side
#
# The panel's *compare with setting B* box puts a second setting beside the first: here SnapKV (A) and
# DeferKV (B), both at `B = 64` with the same sinks and recent window as the runs above. One token view marks
# the prompt positions A only, B only, both or neither kept (at every compacted cache, or one layer: *compare
# at*); the status line gives the counts and the KV bytes each run will hold after eviction, before any model
# call. *Run eviction* generates under both and puts the answers side by side with their KV bytes and logit
# margins. Move B's `λ` to see where DeferKV's first decode row changes the selection.

# %%
duo = wb.widgets.EvictionPanel(cap, lm, prompt, policy="snapkv", budget=64, max_new_tokens=20, n_sink=4, recent=32)
duo.set(compare=True, policy_b="deferkv", budget_b=64)
duo.widget

# %% [markdown]
# The prompt as text, shaded by the first decode step's attention (KV group 0); the positions one run at
# `B = 64` evicted from every compacted cache are struck through (the needle is outlined when it is the answer
# passage). Pick another query row or click a token.

# %%
run64 = next(r for r in results if r.budget == 64 and r.policy != "full")
tokens = wb.widgets.TokenPanel(cap, layer=cap.L // 2, removed=run64)
tokens.set(source=("group", 0), query=int(cap.rows_of("decode")[0]))
print(f"struck through: what {run64.policy} (B = 64) evicted")
tokens.widget

# %% [markdown]
# ## Your own task family, swept and compared
#
# A task family is any function that returns `TaskItem`s (documents = candidate chunks, a query, gold
# answers inside `documents[answer_doc]`). Give each item a `meta["source"]` saying where its text comes
# from; `sweep` runs it under any methods, and `findings.comparisons` states each comparison with n,
# wins/ties/losses, McNemar's test and a bootstrap CI. (The same items as a JSONL file, one object per
# line, run headless: `python -m workbench report --items my_items.jsonl`.)

# %%

def pets(n=2, seed=0):
    """A home-made family: which pet has which name, with one distractor passage."""
    names = ["Biscuit", "Pepper", "Juniper", "Moss"]
    out = []
    for i in range(n):
        name = names[(seed + i) % len(names)]
        docs = (f"The harbour opened in {1900 + i} and ships still dock there.",
                f"The keeper's cat number {i} is named {name}.")
        out.append(wb.TaskItem(task="pets", item_id=f"pets-{seed}-{i}", documents=docs,
                               query=f"What is the name of the keeper's cat number {i}?", answers=(name,),
                               answer_doc=1, meta={"source": "home-made (notebook 08)"}))
    return out


df = wb.sweep(lm, pets(), {"full": {}, "evict": {"policy": ["streaming", "snapkv"], "budget_frac": 0.5}},
              max_new_tokens=12, progress=False)
for sentence in wb.findings.comparisons(df)["finding"]:
    print(sentence)
wb.findings.reference_check(df)[0]

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
T, L, G = prompt.T, lm.shape.L, lm.shape.G
always = torch.cat([torch.arange(4), torch.arange(T - 32, T)])      # n_sink = 4 sinks and the 32 most recent
counts = []
for r in results:
    if r.policy == "full":
        continue
    kp = r.kept_prompt                                               # [L, G, B] sorted prompt positions
    assert kp.shape == (L, G, r.budget), (r.policy, r.budget, kp.shape)
    assert bool((kp[..., 1:] > kp[..., :-1]).all()) and int(kp.min()) >= 0 and int(kp.max()) < T   # distinct
    assert all(bool(torch.isin(always, kp[l, g]).all()) for l in range(L) for g in range(G)), r.policy  # sinks + recent kept
    needle_kept = torch.isin(kp, torch.as_tensor(needle)).sum(-1).double().mean() / len(needle)   # mean over caches
    counts.append(dict(policy=r.policy, budget=r.budget, needle_kept=float(needle_kept)))
counts = pd.DataFrame(counts)
full_row = table[table.policy == "full"].iloc[0]
r_rows = torch.arange(-31, 2, dtype=torch.float64)                  # r = −W+1 … 1, W = 32
alpha_hand = torch.exp(0.1 * r_rows) / torch.exp(0.1 * r_rows).sum()
decode_share = float(alpha_fig.data[1].y[-1])                        # λ = 0.1: the weight of r = 1
per_entry = frame.kv_bytes_before / (T + frame.evicted_at)
evicting = frame.policy != "full"
print(f"T = {T}; every evicting policy keeps exactly B prompt positions per layer and KV group, the 4 sinks "
      f"and the last 32 included; full cache answer {full_row.answer!r} (correct: {full_row.correct})")
print("share of the needle's tokens kept (mean over layers and KV groups):")
print(counts.pivot(index="policy", columns="budget", values="needle_kept").round(3).to_string())
print(f"DeferKV at λ = 0.1, W = 32: the decode row r = 1 carries α_1 = {decode_share:.4f} of the weight")
# the compare panel's preview (from the capture, no model call) is what the runs above kept, and their KV bytes

run_a, run_b = (next(r for r in field if r.policy == n) for n in ("snapkv", "deferkv"))
prev_a, prev_b = duo.preview_of(duo.policy(), 64), duo.preview_of(duo.policy_b(), 64)
duo_counts = wb.compare_kept(prev_a, prev_b, layer=duo.compare_layer()).counts()   # the layer the panel shows
print(f"compare mode, snapkv (A) vs deferkv (B) at B = 64: {duo_counts}; KV bytes after eviction "
      f"A {prev_a.kv_bytes_after:,}, B {prev_b.kv_bytes_after:,} (runs: {run_a.kv_bytes_after:,}, {run_b.kv_bytes_after:,})")
assert duo.model_calls == 0 and (prev_a.params, prev_b.params) == (run_a.params, run_b.params)
assert duo_counts == wb.compare_kept(run_a, run_b, layer=duo.compare_layer()).counts() and sum(duo_counts.values()) == T
assert (prev_a.kv_bytes_after, prev_b.kv_bytes_after) == (run_a.kv_bytes_after, run_b.kv_bytes_after)
assert f"{duo_counts['A only']} A only" in duo.status.value and f"A {run_a.kv_bytes_after:,}" in duo.status.value
assert full_row.correct and full_row.kept_mean == 1.0
assert torch.allclose(torch.as_tensor(alpha_fig.data[1].y), alpha_hand, atol=1e-15) and 0.09 < decode_share < 0.11
assert (abs(counts.needle_kept.values - table[evicting.values].kept_mean.values) <= 5e-4 + 1e-12).all()   # the table, recomputed
assert (table[table.policy == "streaming"].kept_mean == 0).all()      # sinks + recent never reach mid-prompt
# one footing: after eviction every policy holds B prompt entries plus the tokens generated before it
assert (frame.kv_bytes_after[evicting] == per_entry[evicting] * (frame.budget + frame.evicted_at)[evicting]).all()
assert len(df) == 6 and df["error"].isna().all() and set(df["meta_source"]) == {"home-made (notebook 08)"}
assert len(wb.findings.comparisons(df)) == 2   # streaming and snapkv, each against full context
# the field: every policy in one family; every evicting policy keeps L·G·B prompt entries in all (budget
# allocations move them between layers and heads), and only per-head budgets hold masked entries
assert sorted(field_table.policy) == sorted(family) and set(field_table.family) == set(wb.policies.POLICY_GROUPS)
for r in field:
    if r.policy != "full":
        assert int((r.kept_prompt >= 0).sum()) == L * G * 64, r.policy
        if r.policy not in ("adakv", "entro-budget"):
            assert r.kv_bytes_masked == 0, r.policy
