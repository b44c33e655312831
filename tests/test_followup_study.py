"""Follow-up items and their cells in the sweep and the conclusions: deterministic items with two distinct keys, and
a sweep on a random-weight model (the default model's tokenizer, for the chat template) whose ``full`` row equals a
plain two-turn greedy generation written here, whose failed turn is a failed cell, and whose DeferKV/SnapKV rows
reach "What this study shows" as second-answer claims."""
from __future__ import annotations

import json

import pytest
import torch
from _oracle import greedy_no_cache

import workbench.study.followup as fu
import workbench.study.report as report
import workbench.study.report_items as report_items
from workbench.rerun.eviction.followup import answer_body, chat_next_turn
from workbench.run.generate import stop_token_ids
from workbench.run.models import LoadedModel, tiny_model
from workbench.study.conclusions import FOLLOWUP_CLAIM, conclusions
from workbench.study.followup import first_turn_item, followup_multikey, is_followup
from workbench.study.report_config import ReportConfig
from workbench.study.sweep import sweep

N_NEW = 3


@pytest.fixture(scope="module")
def tok(smollm):
    return smollm.tokenizer


@pytest.fixture(scope="module")
def lm(tok):
    model = tiny_model("llama", L=2, H_Q=4, G=2, seed=3, vocab=len(tok), attn_implementation="eager")
    return LoadedModel(model=model, tokenizer=tok, model_id="tiny-llama-smollm-vocab", device=torch.device("cpu"),
                       dtype=torch.float32)


def test_followup_items_are_deterministic_and_ask_two_keys(tok):
    a = followup_multikey(tok, lengths=(256,), n=2, seed=4)
    b = followup_multikey(tok, lengths=(256,), n=2, seed=4)
    c = followup_multikey(tok, lengths=(256,), n=2, seed=5)
    assert [x.to_dict() for x in a] == [x.to_dict() for x in b]
    assert {x.item_id for x in a}.isdisjoint({x.item_id for x in c})
    for it in a:
        assert is_followup(it) and it.task == "followup_multikey"
        first = first_turn_item(it)
        assert first.query != it.query and first.answers != it.answers
        assert it.answers[0] in it.documents[it.answer_doc]
        assert first.answers[0] in first.documents[first.answer_doc]
        assert it.meta["cluster"].startswith("followup_multikey-r")
    assert len({x.meta["cluster"] for x in a}) == 2




def test_followup_sweep_rows_and_second_answer_claims(lm, tok):
    items = followup_multikey(tok, lengths=(256,), n=1, seed=0)
    df = sweep(lm, items, [("evict", {"policy": ["snapkv", "deferkv"], "budget_frac": [0.5]}), ("entroprefill", {})],
               max_new_tokens=N_NEW, progress=False, on_error="record")
    assert len(df) == 4
    ok = df[df["error"].isna()]
    assert sorted(ok["method"]) == ["evict", "evict", "full"]
    assert (ok["protocol"] == "followup").all() and (ok["turn2_tokens"] > 0).all()
    bad = df[df["method"] == "entroprefill"]["error"].iloc[0]
    assert "follow-up item" in bad  # refused, never scored as an answer
    # the reference row equals a plain full-context two-turn greedy generation (no cache, recomputed every step)
    it = items[0]
    prompt = first_turn_item(it).build(tok, max_context=lm.shape.max_context)
    stop = stop_token_ids(lm)
    a1 = greedy_no_cache(lm.model, prompt.spans.input_ids, N_NEW, stop)
    body = answer_body(a1, stop)
    a2 = greedy_no_cache(lm.model, list(prompt.spans.input_ids) + body + chat_next_turn(tok, it.instruction, it.query)(body),
                 N_NEW, stop)
    full = ok[ok["method"] == "full"].iloc[0]
    assert list(full["generated_ids"]) == a2
    assert full["first_answer"] == tok.decode(a1, skip_special_tokens=True)
    ev = ok[ok["method"] == "evict"]
    assert (ev["retained_tokens"] < ev["prompt_tokens"]).all()
    c = conclusions(df).to_frame()
    rows = c[c["claim"].str.endswith(FOLLOWUP_CLAIM)]
    assert len(rows) == 1 and rows["task"].iloc[0] == "followup_multikey"


def test_followup_turn_two_failure_is_a_failed_cell(lm, tok, monkeypatch):
    """A turn 2 that cannot run fails the cell (an error row, no scores), it never scores answer 1 or nothing."""
    monkeypatch.setattr(fu, "chat_next_turn", lambda *a, **k: (lambda body: []))
    items = followup_multikey(tok, lengths=(256,), n=1, seed=1)
    df = sweep(lm, items, [("evict", {"policy": ["snapkv"], "budget_frac": [0.5]})], max_new_tokens=N_NEW,
               progress=False, on_error="record", reference=False)
    (row,) = df.itertuples()
    assert "turn 2: " in row.error and "PolicyRunError" in row.error
    assert row.match != row.match  # NaN: not scored


def test_report_config_takes_followup_items():
    cfg = ReportConfig(n_squad=0, n_needle=0, n_followup=3)
    assert json.loads(json.dumps(cfg.to_dict()))["n_followup"] == 3
    with pytest.raises(ValueError, match="n_followup"):
        ReportConfig(n_followup=-1)


def test_report_sweep_runs_followup_items_under_full_and_evict_only(lm, tok, tmp_path):
    """The report's items and grid: ``n_followup`` items from the essays, run under ``full`` and ``evict`` (every
    policy and budget), never under ``entroprefill`` (no follow-up protocol there), with no failed cell."""
    cfg = ReportConfig(out=tmp_path, n_squad=0, n_needle=0, n_followup=1, needle_length=256, data="sample",
                       max_new_tokens=N_NEW, progress=False, budget_fracs=(0.5,), policies=("snapkv", "deferkv"))
    items, sources = report_items.study_items(cfg, tok, {"items": None, "filler": None})
    assert [it.task for it in items] == ["followup_multikey"] and sources[0]["task"] == "followup_multikey"
    df, partial = report._run_sweep(cfg, lm, items, tmp_path / "sweep.parquet")
    assert not partial and df["error"].isna().all()
    assert sorted(df["method"]) == ["evict", "evict", "full"]
