# %% [markdown]
# # 11 · Your own policy on the bench
#
# A new eviction rule in about twenty lines, checked against the contract every built-in policy keeps,
# its kept tokens beside DeferKV's, and a small RULER-style study against SnapKV and DeferKV with the paired
# findings and the reference check. A policy is a frozen dataclass whose fields are its parameters:
# `needs()` says which evidence it scores with (`Needs(keys=True)`: the cache's keys after prefill),
# `scores(ev)` gives every prompt position a score per layer and KV group (`[L, G, T]`, higher is kept) and
# `protected(T)` the positions always kept (the base class: `n_sink` sinks and the `recent` last tokens).
# The budget rule is the workbench's own: the same `B` prompt positions per layer and KV group for every
# policy. `wb.register_policy` makes it usable by name everywhere a built-in is: the sweep, the report
# (`python -m workbench report --policy my_pkg.my_module:MyPolicy`), the eviction panel.

# %%
from dataclasses import dataclass
from typing import ClassVar

import torch

import workbench as wb


@dataclass(frozen=True)
class MeanKey(wb.EvictionPolicy):
    """Keep the keys closest to their KV head's mean key (cosine similarity; attention-free: it needs no
    attention row, so it would run under any attention kernel)."""

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "mean-key"

    def needs(self) -> wb.Needs:
        return wb.Needs(keys=True)

    def scores(self, ev) -> torch.Tensor:
        k = ev.require("keys", "MeanKey").double()                     # [L, G, T, d], post-RoPE
        return torch.nn.functional.cosine_similarity(k, k.mean(2, keepdim=True), dim=-1)


wb.register_policy(MeanKey, group="attention-free", replace=True)    # replace: this cell may run twice
print(wb.policy_registry.groups()["attention-free"])

# %% [markdown]
# ## The contract
#
# `wb.check_policy` runs the contract test of the built-ins (`tests/test_policy_contract.py` calls the
# same function) on a tiny random-weight model and on the notebook's model: every declared need is read and
# nothing undeclared, scores `[L, G, T]` and finite, protected positions kept, exactly `B` sorted positions
# kept, `B ≥ T` the full cache, deterministic under a seed. Each failed row names the breach.

# %%
from lab_setup import load

lm = load()
contract = wb.check_policy(MeanKey, models=("tiny", lm))
contract

# %% [markdown]
# ## Its kept tokens beside DeferKV's
#
# A RULER-style needle (a "magic number" hidden in repeated filler, `workbench.study.ruler`) of about 512
# tokens, both policies at `B = 25 %` of the prompt, answers as long as the task's own decode length
# (`wb.tasks.max_new_tokens_for`: the model prefaces the number with a sentence, so 12 tokens stop before it). The token view shades the first decode step's attention
# (KV group 0, middle layer) and strikes through what each policy evicted there.

# %%
import math

item = wb.ruler_grid(lm.tokenizer, ("niah_single",), lengths=(512,), seeds=(0,))[0]
prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
B = math.ceil(0.25 * prompt.T)
needle = wb.token_positions(prompt, lm.tokenizer, item.answers[0])
mine, defer = MeanKey(), wb.policies.DeferKV()
n_new = wb.tasks.max_new_tokens_for(item.task)
results = wb.run_policies(lm, prompt, [wb.policies.FullCache(), mine, defer], budgets=[B], max_new_tokens=n_new,
                          progress=False)
kept = wb.survival_table(results, needle, answer=item.answers[0])
print(f"T = {prompt.T}, B = {B}; the answer {item.answers[0]!r} at positions {needle[0]}…{needle[-1]}")
kept

# %%
wb.plots.kept_positions(results, prompt, highlight=needle)

# %%
cap = wb.run_capture(lm, prompt, wb.RowSet(tail=32, n_decode=1), progress=False)
row = int(cap.rows_of("decode")[0])
by_name = {r.policy: r for r in results}
wb.plots.token_attention(cap, cap.L // 2, query=row, group=0, removed=by_name["mean-key"], removed_layer=cap.L // 2,
                         removed_group=0, log=True, per_page=512)

# %%
wb.plots.token_attention(cap, cap.L // 2, query=row, group=0, removed=by_name["deferkv"], removed_layer=cap.L // 2,
                         removed_group=0, log=True, per_page=512)

# %% [markdown]
# ### Interactive panel
#
# The eviction panel lists the registered policy in its group (`attention-free · mean-key`) beside every
# built-in. MeanKey scores from the cache's keys, which a capture does not hold, so the panel has no preview
# for it: the run button prefills once and generates under the chosen policy and budget, and the kept figure
# then shows the run's own kept set.

# %%
panel = wb.widgets.EvictionPanel(cap, lm, prompt, policy="mean-key", budget=B, max_new_tokens=n_new)
panel.widget

# %% [markdown]
# ## A small study: MeanKey against SnapKV and DeferKV
#
# Four short RULER-style single needles (256 tokens, RULER's 32 new tokens), full context as the
# reference and the three policies at half the prompt. `findings.comparisons` states each comparison in one
# sentence (n paired prompts, wins / ties / losses, McNemar's exact test, a bootstrap CI) and
# `findings.reference_check` says whether full context is right often enough for the comparisons to mean
# anything. Four items cannot show much: the sentences say so with their intervals.

# %%
items = wb.ruler_grid(lm.tokenizer, ("niah_single",), lengths=(256,), seeds=range(4),
                      max_context=lm.shape.max_context)
study = wb.sweep(lm, items, {"full": {}, "evict": {"policy": ["mean-key", "snapkv", "deferkv"], "budget_frac": 0.5}},
                 max_new_tokens=32, progress=False)
found = wb.findings.comparisons(study)
for sentence in found["finding"]:
    print(sentence)
ref, warnings_ = wb.findings.reference_check(study)
print("\n".join(warnings_) or "reference check: no warning")
ref

# %% [markdown]
# ## A kvpress press beside them
#
# `workbench.interop.kvpress.from_press(press)` wraps any kvpress `ScorerPress` as a workbench policy: the
# press scores at the end of prefill with the inputs it expects, and its scores go through the workbench's
# budget rule. kvpress is an optional extra (`pip install -e .[kvpress]`); this cell runs only when it is
# installed, and says so otherwise.

# %%
import importlib.util

press_results = None
if importlib.util.find_spec("kvpress") is None:
    print("kvpress is not installed (pip install -e .[kvpress]): the wrapped press is skipped")
else:
    from kvpress import KnormPress

    from workbench.interop.kvpress import from_press  # an optional extra: not a flat name

    wrapped = from_press(KnormPress())
    press_results = wb.run_policies(lm, prompt, [mine, defer, wrapped], budgets=[B], max_new_tokens=n_new,
                                    progress=False)
    print(wb.survival_table(press_results, needle, answer=item.answers[0]).to_string())

# %% [markdown]
# ## Checks
#
# The numbers this notebook talks about, recomputed from its own results, printed and asserted.

# %%
L, G, T = lm.shape.L, lm.shape.G, prompt.T
assert contract["passed"].all(), contract[~contract["passed"]]
assert set(contract["model"]) == {"tiny", lm.model_id} and len(contract) == 2 * 10
assert "mean-key" in wb.policy_registry and wb.policy_registry.group_of("mean-key") == "attention-free"
assert ("attention-free · mean-key", "mean-key") in panel.controls["policy"].options
for r in results[1:]:
    kp = r.kept_prompt
    assert kp.shape == (L, G, B) and bool((kp[..., 1:] > kp[..., :-1]).all()), r.policy     # B sorted positions
    assert bool(torch.isin(mine.protected(T).nonzero().flatten(), kp).all()), r.policy    # sinks + recent kept
assert by_name["deferkv"].evicted_at == 1 and by_name["mean-key"].evicted_at == 0
mean_kept = dict(zip(kept.policy, kept.kept_mean))
print(f"share of the needle's tokens kept at B = {B} of T = {T}: "
      + ", ".join(f"{p} {v:.3f}" for p, v in mean_kept.items()))
assert mean_kept["full"] == 1.0
assert kept.loc[kept.policy == "full", "correct"].all(), kept.answer.tolist()   # the reference holds the number
ev = study[study["method"] == "evict"]
assert len(study) == len(items) * 4 and study["error"].isna().all()
assert sorted(ev["p_policy"].unique()) == ["deferkv", "mean-key", "snapkv"]
assert (ev["retained_tokens"] == (ev["prompt_tokens"] / 2).apply(math.ceil)).all()          # B = ⌈T/2⌉
pairs = set(zip(found["a"], found["b"]))
assert any("mean-key" in a and b == "full" for a, b in pairs) and any(a.startswith("deferkv") and "mean-key" in b
                                                                        for a, b in pairs)
assert found["n"].max() <= len(items) and len(ref) >= 1
if press_results is not None:
    assert [r.policy for r in press_results] == ["mean-key", "deferkv", press_results[2].policy]
