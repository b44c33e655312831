"""kvpress's own presses on the workbench's bench: ``workbench.interop.kvpress.from_press(press)`` keeps, per layer
and KV head, exactly the positions kvpress's pipeline keeps (the press inside one prefill forward), and generates
the same tokens, for 7 press settings of kvpress 0.5.5 × 3 compression ratios × 2 prompts (20 of the 21 settings;
SnapKV at 0.9 is an open strict xfail, ``_OPEN``) (the needle prompt and
a SQuAD prompt); the budget is kvpress's ``int(T · (1 − ratio))``. The table is printed at the end of
``make test-peers`` (rows ``from_press: <press>``). A cell may differ only by an exact tie that float rounding
orders, as in test_kvpress_parity.py.

Not yet on the list: ``LagKVPress`` and ``LeverageScorePress`` differed from kvpress's pipeline at ratio 0.5 in
the first run (not investigated yet); ``CURPress``, ``NonCausalAttnPress``, ``CompactorPress`` and a seeded
``RandomPress`` have not been run.
"""
from __future__ import annotations

import pytest
from _kvpress_oracle import ROWS, greedy, jaccard, kept_positions, near_tie_cells, press_prefill
from kvpress import (
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)

from workbench.interop.kvpress import PressPolicy, from_press, press_policy_class, register_press
from workbench.rerun.eviction import REGISTRY, EvictionSession, Needs, check_policy, policy_from_params

RATIOS = (0.5, 0.75, 0.9)
N_NEW = 6
PRESSES = {  # name -> ratio -> press
    "knorm": lambda r: KnormPress(compression_ratio=r),
    "keydiff": lambda r: KeyDiffPress(compression_ratio=r),
    "streaming": lambda r: StreamingLLMPress(compression_ratio=r, n_sink=4),
    "snapkv": lambda r: SnapKVPress(compression_ratio=r),
    "snapkv W16 k1": lambda r: SnapKVPress(compression_ratio=r, window_size=16, kernel_size=1),
    "tova": lambda r: TOVAPress(compression_ratio=r),
    "expected attention": lambda r: ExpectedAttentionPress(compression_ratio=r),
}


@pytest.fixture(scope="module")
def sessions(smollm, prompts):
    """One workbench prefill per prompt (the needle and the first SQuAD prompt) with what a press is given."""
    need = Needs(keys=True, attn_inputs=True)
    names = ["needle", next(n for n in prompts if n.startswith("squad"))]
    return {n: EvictionSession.prepare(smollm, prompts[n], need, N_NEW, reusable=True, progress=False) for n in names}


# measured, not explained yet: at ratio 0.9 SnapKV's kept sets differ from kvpress's on the SQuAD prompt in 90 of
# 90 (layer, KV head) cells, every one at a near-tie (the tokens and the other 20 settings agree); strict, so a fix
# turns it into a failure that removes this mark
_OPEN = {("snapkv", 0.9): "SnapKV at ratio 0.9: 90 near-tie cells on the SQuAD prompt (not yet explained)"}
CASES = [pytest.param(n, r, marks=pytest.mark.xfail(strict=True, reason=_OPEN[(n, r)])) if (n, r) in _OPEN
         else pytest.param(n, r) for n in PRESSES for r in RATIOS]


@pytest.mark.parametrize("name, ratio", CASES)
def test_from_press_keeps_what_kvpress_keeps(name, ratio, smollm, sessions):
    model, tok = smollm.model, smollm.tokenizer
    for pname, sess in sessions.items():
        T = sess.T
        B = int(T * (1 - ratio))
        press = PRESSES[name](ratio)
        cache, first = press_prefill(model, sess.ids, press)
        assert first == sess.y1
        theirs = kept_positions(sess.cache0, cache, T)
        policy = from_press(PRESSES[name](ratio))
        res = sess.run(policy, B)
        jac = jaccard(theirs, res.kept_prompt)
        differ, ties = near_tie_cells(theirs, res.kept_prompt, sess.evidence.scores_of(policy), policy.protected(T))
        ids = greedy(model, tok, cache, first, T, N_NEW)
        ROWS.append({"policy": f"from_press: {name}", "ratio": ratio, "prompt": pname, "cells": len(jac),
                     "jaccard_mean": sum(jac) / len(jac), "jaccard_min": min(jac), "tie_cells": ties,
                     "identical_tokens": ids == res.ids, "refused": 0})
        assert differ == ties, f"{name} {pname} ratio {ratio}: {differ - ties} cells differ beyond near-ties"
        assert ties <= 1, f"{name} {pname} ratio {ratio}: {ties} tie cells"
        assert ids == res.ids, f"{name} {pname} ratio {ratio}: tokens differ"


def test_wrapped_press_is_a_policy_by_name(smollm):
    """A wrapped press keeps the contract (``check_policy`` on the tiny model) and, registered, is used by name."""
    df = check_policy(from_press(KnormPress()), models="tiny")
    assert df["passed"].all(), df[~df["passed"]].to_string()
    with REGISTRY.scoped():
        assert register_press(KnormPress) == "kvpress-knorm" and "kvpress-knorm" in REGISTRY
        p = policy_from_params("kvpress-knorm")
        assert isinstance(p, PressPolicy) and isinstance(p.press, KnormPress)
    assert press_policy_class(ExpectedAttentionPress).name == "kvpress-expected-attention"
    with pytest.raises(ValueError, match="ScorerPress"):
        from_press("knorm")
