"""The protocols the field compares on, in the study's sweep: kvpress's compression ratios (``compression_ratio``:
``max(1, int(T·(1 − r)))`` positions kept), the matched-byte ladder (``kv_frac``: the largest budget whose KV bytes
stay within the rung, on a model whose layers store different amounts), query-aware vs query-agnostic cells (the
agnostic one equal to ``run_question_agnostic``), and time to first token per cell."""
from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction

import pandas as pd
import pytest
import torch
import yaml

from workbench.__main__ import main
from workbench.rerun.eviction import EvictionSession, Needs, policy_from_params, run_question_agnostic
from workbench.run import adapter
from workbench.run.models import LoadedModel, tiny_model
from workbench.run.spans import PromptSpans
from workbench.study.findings import PROTOCOL, evict_label, pair_query
from workbench.study.kv_budget import ladder_budget, ratio_budget
from workbench.study.kvpress_runs import write_kvpress_runs
from workbench.study.report_config import ReportConfig
from workbench.study.sweep import sweep
from workbench.study.tasks import TaskItem

ITEM = TaskItem(task="t", item_id="a", query="What is the name of the keeper's cat?", answers=("Biscuit",),
                answer_doc=1, documents=("The harbour opened in 1901 and ships still dock there every day.",
                                         "The keeper has a grey cat. The keeper's cat is named Biscuit."))
SMALL = {"n_sink": 2, "recent": 4, "window": 4}  # protected positions a short prompt leaves room beside
SLIDE, FULL = "sliding_attention", "full_attention"


@pytest.fixture(scope="module")
def tiny_lm(smollm):
    """A random-weight llama with the default model's tokenizer: real prompts, fast forwards."""
    model = tiny_model("llama", L=2, H_Q=4, G=2, vocab=len(smollm.tokenizer), seed=1)
    return LoadedModel(model=model, tokenizer=smollm.tokenizer, model_id="tiny-llama-smollm-vocab",
                       device=torch.device("cpu"), dtype=torch.float32)


@pytest.mark.parametrize("r", [0.25, 0.5, 0.75, 0.875])
def test_compression_ratio_keeps_kvpress_count(r):
    # kvpress's ScorerPress keeps max(1, int(k_len * (1 - r))): in exact arithmetic the floor of T·(1 − r)
    for T in range(1, 4097):
        assert ratio_budget(T, r) == max(1, math.floor(T * (1 - Fraction(r)))), T


def test_compression_ratio_refuses_out_of_range():
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="compression_ratio"):
            ratio_budget(10, bad)


@pytest.fixture(scope="module")
def axis_rows(tiny_lm):
    grid = [("evict", {"policy": "snapkv", "budget": 20, "query": ["aware", "agnostic"], **SMALL}),
            ("evict", {"policy": "snapkv", "compression_ratio": 0.75, **SMALL}),
            ("evict", {"policy": "deferkv", "budget": 20, "query": "agnostic", **SMALL})]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sweep(tiny_lm, [ITEM], grid, max_new_tokens=4, progress=False, on_error="record")


def _row(df, **where):
    m = torch.ones(len(df), dtype=torch.bool).numpy()
    for k, v in where.items():
        m &= (df[k] == v).to_numpy() if k in df else False
    (i,) = m.nonzero()[0]
    return df.iloc[i]


def test_compression_ratio_cell_keeps_the_mapped_budget(tiny_lm, axis_rows):
    T = ITEM.build(tiny_lm.tokenizer, max_context=tiny_lm.shape.max_context).T
    r = _row(axis_rows, p_compression_ratio=0.75)
    assert not isinstance(r["error"], str) and int(r["retained_tokens"]) == ratio_budget(T, 0.75) == int(T * 0.25)
    assert r["compression_ratio"] == pytest.approx(1 - int(T * 0.25) / T) and r["query"] == "aware"


def test_agnostic_rows_equal_run_question_agnostic_and_differ_from_aware(tiny_lm, axis_rows):
    prompt = ITEM.build(tiny_lm.tokenizer, max_context=tiny_lm.shape.max_context)
    pol = policy_from_params("snapkv", **SMALL)
    (oracle,) = run_question_agnostic(tiny_lm, [prompt], [pol], [20], 4, progress=False)
    ag = _row(axis_rows, p_query="agnostic", p_policy="snapkv")
    aw = _row(axis_rows, p_query="aware", p_policy="snapkv")
    assert not isinstance(ag["error"], str) and list(ag["generated_ids"]) == oracle.ids
    assert ag["query"] == "agnostic" and aw["query"] == "aware"
    # the agnostic cache holds 20 context positions (the question kept whole beside them); the aware one 20 of the
    # whole prompt: the question's tokens compete for the budget, and the scores come from other rows
    assert int(ag["compressed_tokens"]) < int(aw["compressed_tokens"]) == prompt.T
    assert int(ag["kv_bytes"]) == oracle.kv_bytes_after
    assert list(ag["generated_ids"]) != list(aw["generated_ids"])


def test_deferkv_is_refused_query_agnostic(axis_rows):
    r = _row(axis_rows, p_query="agnostic", p_policy="deferkv")
    assert "query: deferkv cannot run query-agnostic" in r["error"] and math.isnan(r["contains"])


def test_ttft_is_within_the_cell_time(tiny_lm, axis_rows):
    ok = axis_rows[axis_rows["error"].isna()]
    assert len(ok) == 4  # full, snapkv aware and agnostic, the compression-ratio cell
    assert (ok["ttft_s"] > 0).all()
    full = ok[ok["method"] == "full"].iloc[0]
    assert full["ttft_s"] <= full["wall_s"]
    ev = ok[ok["method"] == "evict"]
    assert (ev["ttft_s"] <= ev["shared_s"] + ev["method_s"]).all()
    assert (ev["ttft_s"] <= ev["wall_s"].max()).all()  # the call's wall time, charged to its first cell


# ----------------------------------------------------------------------------- the matched-byte ladder
@pytest.fixture(scope="module")
def per_layer_session():
    """Gemma-4-style layers: 4 KV heads on sliding-window layers (window 8), 1 on the global ones."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model("gemma4_text", L=4, H_Q=4, G=4, d=16, layer_types=[SLIDE, FULL, SLIDE, FULL],
                       attention_k_eq_v=True, num_global_key_value_heads=1, seed=3)
    spans = PromptSpans.synthetic([20, 20, 20, 12], query_len=6)
    pol = policy_from_params("snapkv", **SMALL)
    return EvictionSession.prepare(m, spans, Needs.of([pol]), 2, progress=False), pol


@pytest.mark.parametrize("rung", [0.5, 0.25, 0.125, 0.0625])
def test_ladder_budget_meets_its_byte_rung(per_layer_session, rung):
    sess, pol = per_layer_session
    full = adapter.cache_bytes(sess.cache0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            B, predicted = ladder_budget(sess, pol, rung)
        except ValueError as e:  # unreachable: the smallest accepted budget measures above the rung
            assert str(e).startswith(f"kv_frac: {rung:g} is unreachable")
            least = int(str(e).split("smallest budget B = ")[1].split(" ")[0])
            assert sess.run(pol, least).kv_bytes_after > rung * full
            with pytest.raises(ValueError, match="budget: must be"):
                sess.run(pol, least - 1) if least > 1 else (_ for _ in ()).throw(ValueError("budget: must be"))
            return
        got = sess.run(pol, B).kv_bytes_after
        assert got / full == predicted and got <= rung * full
        assert sess.run(pol, B + 1).kv_bytes_after > rung * full  # the largest budget that fits
    # bytes are not positions on this model: the rung's token fraction differs from its byte fraction
    assert abs(B / sess.T - got / full) > 0.02


def test_ladder_has_reachable_and_unreachable_rungs_here(per_layer_session):
    sess, pol = per_layer_session
    ladder_budget(sess, pol, 0.5)
    with pytest.raises(ValueError, match=r"kv_frac: 0.0625 is unreachable .* allowed: kv_frac >= "):
        ladder_budget(sess, pol, 0.0625)


# ----------------------------------------------------------------------------- the report, end to end
def test_kvpress_folders_follow_the_query_axis_and_name_ladder_rungs(tmp_path):
    def row(item, params, **kw):
        return dict(model="m/x", task="needle", item_id=item, method="evict", params=json.dumps(params, sort_keys=True),
                    seed=0, max_new_tokens=4, answer="a", gold="g", match=1.0, contains=1.0, em=1.0, f1=1.0,
                    prompt_tokens=100, hit_cap=False, error=None, meta_length=128, **kw)
    rows = [row("i", {"policy": "snapkv", "budget_frac": 0.5}, retained_tokens=50, kv_bytes=50, query="aware",
                compression_ratio=0.5),
            row("i", {"policy": "snapkv", "budget_frac": 0.5, "query": "agnostic"}, retained_tokens=45, kv_bytes=45,
                query="agnostic", compression_ratio=0.5),
            row("i", {"policy": "snapkv", "kv_frac": 0.5}, retained_tokens=50, kv_bytes=50, query="aware",
                compression_ratio=0.5, kv_frac=0.5),
            row("i", {"policy": "snapkv", "compression_ratio": 0.875}, retained_tokens=12, kv_bytes=12, query="aware",
                compression_ratio=0.88)]
    names = sorted(p.name for p in write_kvpress_runs(pd.DataFrame(rows), tmp_path))
    assert names == ["needle__128__m--x__snapkv-kv0.5__0.50__query_aware", "needle__128__m--x__snapkv__0.50",
                     "needle__128__m--x__snapkv__0.50__query_aware", "needle__128__m--x__snapkv__0.88__query_aware"]
    cfg = yaml.safe_load((tmp_path / names[0] / "config.yaml").read_text())
    assert (cfg["kv_frac_rung"], cfg["kv_frac"], cfg["query_aware"]) == (0.5, 0.5, True)
    assert yaml.safe_load((tmp_path / names[1] / "config.yaml").read_text())["query_aware"] is False


def test_setting_labels_and_pair_query():
    assert evict_label({"policy": "snapkv", "compression_ratio": 0.75}) == "snapkv @ r=0.75"
    assert evict_label({"policy": "snapkv", "kv_frac": 0.125, "query": "agnostic"}) == "snapkv @ kv=0.125 (agnostic)"
    assert pair_query("deferkv @ 0.5 vs snapkv @ 0.5 (agnostic)") == "aware vs agnostic"
    assert pair_query("snapkv @ 0.5 (agnostic) vs full") == "agnostic vs aware"
    assert pair_query("deferkv @ 0.5 vs snapkv @ 0.5") == "aware"


def test_report_tiny_with_the_protocol_flags(tmp_path, smollm):
    folder = tmp_path / "tiny-model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_model("llama", L=2, H_Q=4, G=2, vocab=len(smollm.tokenizer), seed=1).save_pretrained(folder)
        smollm.tokenizer.save_pretrained(folder)
    out = tmp_path / "rep"
    rc = main(["report", "--tiny", "--model", str(folder), "--policies", "snapkv", "deferkv", "--compression-ratios",
               "0.75", "--kv-ladder", "0.5", "--query", "aware", "agnostic", "--no-progress", "--threads", "1",
               "--no-divergence", "--out", str(out)])
    assert rc == 0
    t = out / "tables"
    # --no-divergence: the stage did not run, and the manifest says it was skipped (never a silent gap)
    man = json.loads((out / "manifest.json").read_text())
    assert man["config"]["divergence"] is False and man["skipped"] == [
        "the answer divergence (divergence=False, --no-divergence)"]
    assert not (t / "answer_divergence.csv").exists() and "answer_divergence" not in man["tables"]
    acc = pd.read_csv(t / "accuracy.csv").set_index(["task", "setting"])
    assert set(PROTOCOL) <= set(acc.columns)
    for task in ("needle", "squad_single"):
        assert acc.loc[(task, "snapkv @ 0.5"), "query"] == "aware"
        assert acc.loc[(task, "snapkv @ 0.5 (agnostic)"), "query"] == "agnostic"
        bad = acc.loc[(task, "deferkv @ 0.5 (agnostic)")]  # refused, counted as failed, never scored
        assert bad["n"] == 0 and bad["failed"] == 1 and "cannot run query-agnostic" in bad["failed_reason"]
        assert acc.loc[(task, "full"), "kv_frac"] == 1.0
    for name in ("summary", "timing", "comparisons", "conclusions"):
        assert "query" in pd.read_csv(t / f"{name}.csv").columns, name
    sw = pd.read_parquet(t / "sweep.parquet")
    ok = sw[sw["error"].isna()]
    ratio = ok[(ok["p_compression_ratio"] == 0.75) & (ok["query"] == "aware")]
    assert len(ratio) == 4 and (ratio["retained_tokens"] == [max(1, int(T * 0.25)) for T in ratio["prompt_tokens"]]).all()
    ladder = ok[ok["p_kv_frac"] == 0.5]
    assert len(ladder) and (ladder["kv_frac"] <= 0.5).all() and (ladder["kv_frac"] > 0.45).all()
    ev = ok[ok["method"] == "evict"]
    assert (ev["ttft_s"] > 0).all() and (ev["ttft_s"] <= ev["shared_s"] + ev["method_s"]).all()
    full = ok[ok["method"] == "full"]
    assert (full["ttft_s"] <= full["wall_s"]).all()
    runs = {p.name for p in (out / "kvpress").iterdir()}
    assert any(n.endswith("__snapkv__0.50") for n in runs) and any(n.endswith("__snapkv__0.50__query_aware")
                                                                   for n in runs)
    assert any("__snapkv-kv0.5__" in n for n in runs)
    concl = pd.read_csv(t / "conclusions.csv")
    cross = concl[concl["claim"].str.startswith("DeferKV (query-aware) ≥ SnapKV query-agnostic")]
    assert len(cross) and (cross["query"] == "aware vs agnostic").all()
    assert "DeferKV query-agnostic: not run" in (out / "report.html").read_text()


@pytest.mark.parametrize("kw, name", [({"compression_ratios": (1.0,)}, "compression_ratios"),
                                      ({"kv_ladder": (0.0,)}, "kv_ladder"), ({"query": ("both",)}, "query"),
                                      ({"query": ()}, "query"), ({"divergence": "no"}, "divergence")])
def test_report_config_refuses_bad_protocol_settings(tmp_path, kw, name):
    with pytest.raises(ValueError, match=name):
        ReportConfig(out=tmp_path / "r", **kw)
