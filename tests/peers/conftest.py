"""Peer environment fixtures: the default model and the parity prompts (needle + SQuAD)."""
from __future__ import annotations

import pandas as pd
import pytest
from _kvpress_oracle import ROWS, record_prefill

from workbench.run.examples import load_example
from workbench.run.models import load_model
from workbench.study.datasets import load_squad
from workbench.study.tasks import squad_single


@pytest.fixture(scope="session")
def smollm():
    return load_model(device="cpu", progress=False)


@pytest.fixture(scope="session")
def prompts(smollm):
    """The needle prompt and two SQuAD prompts (bundled sample), rendered for the default model."""
    tok = smollm.tokenizer
    out = {"needle": load_example("needle_haystack").build(tok, max_context=smollm.shape.max_context)}
    for item in squad_single(load_squad("sample"), n=2, n_distractors=2, seed=0):
        out[f"squad:{item.item_id[:10]}"] = item.build(tok, max_context=smollm.shape.max_context)
    return out


@pytest.fixture(scope="session")
def recordings(smollm, prompts):
    """``recordings(prompt name, eager=False)``: the recorded plain prefill kvpress's presses are replayed on
    (``_kvpress_oracle.record_prefill``), one per prompt and attention kernel, made on first use."""
    memo = {}

    def get(name: str, eager: bool = False):
        if (name, eager) not in memo:
            p = prompts[name]
            spans = getattr(p, "spans", None) or p
            memo[name, eager] = record_prefill(smollm.model, list(spans.input_ids), eager=eager)
        return memo[name, eager]

    return get


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    df = pd.DataFrame(ROWS)
    for c in ("refused", "exact_ties", "near_ties", "identical_tokens"):
        df[c] = df[c].fillna(0) if c in df else 0
    agg = df.groupby(["policy", "ratio"], sort=False).agg(
        prompts=("prompt", "nunique"), refused=("refused", "sum"), cells=("cells", "sum"), jaccard_mean=("jaccard_mean", "mean"),
        jaccard_min=("jaccard_min", "min"), exact_ties=("exact_ties", "sum"), near_ties=("near_ties", "sum"), identical_tokens=("identical_tokens", "sum"))
    agg["identical_tokens"] = (agg["identical_tokens"].astype(int).astype(str) + "/"
                               + (agg["prompts"] - agg["refused"]).astype(str))
    terminalreporter.write_sep("=", "kvpress parity (workbench policy <-> kvpress press, per layer x KV head)")
    terminalreporter.write_line(agg.round(4).to_string())
