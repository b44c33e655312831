"""Sweeps: grid expansion, the method registry, full-context greedy runs on the real model, resume
after an interruption, recorded errors, and the Ray executor against the local one."""
from __future__ import annotations

import math
import os

import pandas as pd
import pytest
import torch

from workbench.run.generate import stop_token_ids
from workbench.run.models import LoadedModel, tiny_model
from workbench.study import cells, datasets, executors, tasks
from workbench.study import sweep as sw


@pytest.fixture(scope="module")
def items():
    # two short single-hop prompts (~200-300 tokens with SmolLM2's template)
    return tasks.squad_single(datasets.load_squad("sample"), n=2, n_distractors=1, seed=0)


@pytest.fixture(scope="module")
def tiny_lm(smollm):
    """A random-weight 2-layer Llama with the real tokenizer: real prompts, instant forwards."""
    model = tiny_model("llama", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16, seed=0)
    return LoadedModel(model=model, tokenizer=smollm.tokenizer, model_id="tiny-llama-test",
                       device=torch.device("cpu"), dtype=torch.float32)


def _make_probe(calls=None, interrupt_at=None):
    """A method that needs no forward: it 'answers' the gold answer (mode=oracle) or a wrong string.
    Defined in a function so that Ray ships it by value."""

    def probe(lm, item, params):
        if calls is not None:
            calls.append(item.item_id)
            if interrupt_at is not None and len(calls) == interrupt_at:
                raise KeyboardInterrupt
        text = item.answers[0] if params["mode"] == "oracle" else "no idea at all"
        ids = lm.tokenizer.encode(text, add_special_tokens=False)
        return {"generated_ids": ids, "retained_tokens": params["budget"], "note": params["mode"],
                "pid": os.getpid(), "probe_s": 0.0}

    return probe


@pytest.fixture
def probe():
    sw.register_method("probe", _make_probe(), params=("mode", "budget"), replace=True)
    yield
    sw.unregister_method("probe")


GRID = {"probe": {"mode": ["oracle", "wrong"], "budget": 64}}


# ----------------------------------------------------------------------------- grid and registry
def test_grid_expansion(items, probe):
    cells = sw.expand_grid(items, GRID, seeds=(0, 1))
    # per item: the full reference once (first seed) + 2 modes x 2 seeds
    assert len(cells) == 2 * (1 + 4)
    assert sum(c.method == "full" for c in cells) == 2 and all(c.seed == 0 for c in cells if c.method == "full")
    explicit = sw.expand_grid(items, {"full": {}, **GRID}, seeds=(0, 1))
    assert sum(c.method == "full" for c in explicit) == 4  # asked for: every seed
    assert len(sw.expand_grid(items, GRID, seeds=(0,), reference=False)) == 4
    pairs = sw.expand_grid(items, [("probe", {"mode": "oracle", "budget": [1, 2, 3]}), ("probe", {"mode": "wrong",
                                                                                                  "budget": 1})])
    assert len(pairs) == 2 * (1 + 3 + 1)
    g = sw.grid_frame(cells)
    assert set(g.columns) == {"task", "item_id", "method", "params", "seed", "p_budget", "p_mode"}
    assert g["params"].iloc[1] == '{"budget": 64, "mode": "oracle"}'


def test_grid_validation(items, probe):
    with pytest.raises(ValueError, match="method: must be one of"):
        sw.expand_grid(items, {"nope": {}})
    with pytest.raises(ValueError, match="params: 'probe' accepts"):
        sw.expand_grid(items, {"probe": {"zeta": 1}})
    with pytest.raises(ValueError, match="reserved"):
        sw.expand_grid(items, {"probe": {"seed": 1}})
    with pytest.raises(ValueError, match="not NaN"):
        sw.expand_grid(items, {"probe": {"mode": "x", "budget": float("nan")}})
    with pytest.raises(ValueError, match="seeds"):
        sw.expand_grid(items, GRID, seeds=())
    with pytest.raises(ValueError, match="duplicate item"):
        sw.expand_grid(items + items[:1], GRID)
    with pytest.raises(ValueError, match="already registered"):
        sw.register_method("probe", lambda lm, item, params: {})
    with pytest.raises(ValueError, match="max_new_tokens"):
        sw.sweep(None, items, GRID, max_new_tokens=0)
    with pytest.raises(ValueError, match="executor"):
        sw.sweep(None, items, GRID, executor="dask")
    assert "full" in sw.available_methods() and "probe" in sw.available_methods()


# ----------------------------------------------------------------------------- the real model
def test_full_context_greedy_on_the_real_model(smollm, items):
    item = min(items, key=lambda it: sum(map(len, it.documents)))  # the shorter prompt
    df = sw.sweep(smollm, [item], ["full"], max_new_tokens=4, progress=False)
    assert len(df) == 1
    row = df.iloc[0]
    prompt = item.build(smollm.tokenizer)
    # greedy decoding agrees with transformers' own generate on the same ids
    ref = smollm.model.generate(prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids),
                                do_sample=False, max_new_tokens=4, pad_token_id=smollm.tokenizer.eos_token_id)
    ref_ids = ref[0, prompt.T:].tolist()
    stop = stop_token_ids(smollm)
    assert row["generated_ids"] == ref_ids[:len(row["generated_ids"])]
    assert row["n_generated"] == 4 or row["generated_ids"][-1] in stop
    assert row["answer"] == smollm.tokenizer.decode([t for t in ref_ids if t not in stop], skip_special_tokens=True).strip()
    # sizes: T tokens kept; the fp32 KV cache holds K and V for L layers, G heads, d dims per token
    s = smollm.shape
    assert row["prompt_tokens"] == row["retained_tokens"] == row["prefill_tokens"] == prompt.T
    assert row["kv_bytes"] == 2 * s.L * s.G * s.d * 4 * prompt.T
    assert row["first_token_agree"] == 1.0
    assert row["model"] == "SmolLM2-135M-Instruct" and row["device"] == "cpu" and row["dtype"] == "float32"
    assert row["wall_s"] > 0 and row["peak_rss_bytes"] > 1e8 and math.isnan(row["peak_cuda_bytes"])
    assert 0.0 <= row["f1"] <= 1.0 and pd.isna(row["error"])


# ----------------------------------------------------------------------------- resume
def test_interrupted_sweep_resumes_to_the_same_frame(tmp_path, tiny_lm, items, probe, monkeypatch):
    kw = dict(seeds=(0, 1), max_new_tokens=3, progress=False)
    full = sw.sweep(tiny_lm, items, GRID, out=tmp_path / "a.parquet", **kw)
    assert len(full) == 10

    calls = []
    sw.register_method("probe", _make_probe(calls, interrupt_at=3), params=("mode", "budget"), replace=True)
    with pytest.raises(KeyboardInterrupt):
        sw.sweep(tiny_lm, items, GRID, out=tmp_path / "b.parquet", checkpoint_s=1e9, **kw)
    partial = sw.read_sweep(tmp_path / "b.parquet")
    # item 1: full, probe(oracle, seed 0), probe(oracle, seed 1) finished; the third probe call was interrupted
    assert len(partial) == 3 and sorted(partial["method"]) == ["full", "probe", "probe"]

    sw.register_method("probe", _make_probe(), params=("mode", "budget"), replace=True)
    ran = []
    real_run_cell = cells.run_cell
    monkeypatch.setattr(cells, "run_cell", lambda *a, **k: ran.append(a[2]) or real_run_cell(*a, **k))
    resumed = sw.sweep(tiny_lm, items, GRID, out=tmp_path / "b.parquet", **kw)
    assert len(ran) == 7  # only the unfinished cells ran
    pd.testing.assert_frame_equal(sw.comparable(resumed), sw.comparable(full))
    ran.clear()
    again = sw.sweep(tiny_lm, items, GRID, out=tmp_path / "b.parquet", **kw)
    assert ran == []
    pd.testing.assert_frame_equal(again, resumed)

    # the numbers in the frame
    assert "probe_s" not in sw.comparable(full).columns and "wall_s" not in sw.comparable(full).columns
    assert full["p_budget"].dtype == "float64"  # NaN on the full rows
    pr = full[full["method"] == "probe"]
    assert set(pr["p_budget"]) == {64.0} and set(pr["retained_tokens"]) == {64.0}
    oracle, wrong = pr[pr["p_mode"] == "oracle"], pr[pr["p_mode"] == "wrong"]
    assert list(oracle["em"]) == [1.0] * 4 and list(oracle["contains"]) == [1.0] * 4
    assert list(wrong["em"]) == [0.0] * 4 and list(wrong["f1"]) == [0.0] * 4
    assert set(oracle["note"]) == {"oracle"}
    ref = full[full["method"] == "full"].set_index("item_id")["generated_ids"]
    for _, r in pr.iterrows():
        first = tiny_lm.tokenizer.encode(r["answer"] if r["p_mode"] == "oracle" else "no idea at all",
                                         add_special_tokens=False)[0]
        assert r["first_token_agree"] == float(first == ref[r["item_id"]][0])
    assert list(full[full["method"] == "full"]["first_token_agree"]) == [1.0, 1.0]
    assert list(full.columns[:5]) == ["model", "task", "item_id", "method", "params"]
    assert full["model"].unique().tolist() == ["tiny-llama-test"]
    assert set(full["gold"]) == {it.answers[0] for it in items} and set(full["n_docs"]) == {2}
    assert set(full["meta_qid"]) == {it.meta["qid"] for it in items}


def test_errors_are_recorded_then_retried(tmp_path, tiny_lm, items):
    def flaky(lm, item, params):
        if params["x"] == 1:
            raise ValueError("x=1 is broken")
        return {"generated_ids": [1, 2]}

    out = tmp_path / "e.parquet"
    sw.register_method("flaky", flaky, params=("x",), replace=True)
    try:
        df = sw.sweep(tiny_lm, items[:1], {"flaky": {"x": [0, 1]}}, out=out, reference=False, on_error="record",
                      progress=False, max_new_tokens=2)
        bad = df[df["p_x"] == 1].iloc[0]
        assert bad["error"] == "ValueError: x=1 is broken" and math.isnan(bad["em"]) and bad["generated_ids"] == []
        assert pd.isna(df[df["p_x"] == 0].iloc[0]["error"])
        with pytest.raises(ValueError, match="broken"):  # on_error="raise": the failing cell runs again and raises
            sw.sweep(tiny_lm, items[:1], {"flaky": {"x": [0, 1]}}, out=out, reference=False, progress=False,
                     max_new_tokens=2)
        kept = sw.read_sweep(out)  # nothing new finished: the file still holds both rows
        assert len(kept) == 2 and kept["error"].notna().sum() == 1

        sw.register_method("flaky", lambda lm, item, params: {"generated_ids": [3]}, params=("x",), replace=True)
        df = sw.sweep(tiny_lm, items[:1], {"flaky": {"x": [0, 1]}}, out=out, reference=False, progress=False,
                      max_new_tokens=2)
        assert df["error"].isna().all() and len(df) == 2
        assert df.set_index("p_x").loc[1, "generated_ids"] == [3] and df.set_index("p_x").loc[0, "generated_ids"] == [1, 2]
        assert df["first_token_agree"].isna().all()  # no full reference in this grid
    finally:
        sw.unregister_method("flaky")


def test_bad_method_output_is_an_error(tiny_lm, items):
    sw.register_method("broken", lambda lm, item, params: {"ids": [1]}, replace=True)
    try:
        with pytest.raises(ValueError, match="generated_ids"):
            sw.sweep(tiny_lm, items[:1], ["broken"], reference=False, progress=False)
    finally:
        sw.unregister_method("broken")


# ----------------------------------------------------------------------------- Ray
def _tiny_factory():
    """A picklable model factory (shipped by value to Ray workers): the tiny random Llama with the
    default model's tokenizer."""

    def make():
        from transformers import AutoTokenizer

        from workbench.run.models import default_model_folder

        tok = AutoTokenizer.from_pretrained(str(default_model_folder(progress=False)))
        model = tiny_model("llama", vocab=len(tok), L=2, H_Q=4, G=2, d=16, seed=0)
        return LoadedModel(model=model, tokenizer=tok, model_id=make.model_id, device=torch.device("cpu"),
                           dtype=torch.float32)

    make.model_id = "tiny-llama-factory"
    return make


def test_model_sources(smollm):
    assert executors.model_source(smollm) == (None, "SmolLM2-135M-Instruct")  # Ray workers load the default model
    assert executors.model_source(None) == (None, "SmolLM2-135M-Instruct")
    assert executors.model_source("/some/folder") == ("/some/folder", "/some/folder")
    f = _tiny_factory()
    assert executors.model_source(f) == (f, "tiny-llama-factory")
    with pytest.raises(ValueError, match="model_id"):
        executors.model_source(lambda: None)


@pytest.mark.slow
def test_ray_executor_matches_local(tmp_path, items):
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    sw.register_method("probe", _make_probe(), params=("mode", "budget"), replace=True)
    factory = _tiny_factory()
    try:
        kw = dict(seeds=(0, 1), max_new_tokens=4, progress=False)
        local = sw.sweep(factory, items, GRID, out=tmp_path / "local.parquet", **kw)
        remote = sw.sweep(factory, items, GRID, out=tmp_path / "ray.parquet", executor="ray",
                          ray_init={"num_cpus": 2}, checkpoint_s=0, **kw)
    finally:
        sw.unregister_method("probe")
    assert not ray.is_initialized()  # the sweep shut down the instance it started
    assert len(local) == 10 and local["error"].isna().all()
    assert set(local["pid"].dropna()) == {os.getpid()}
    assert os.getpid() not in set(remote["pid"].dropna()) and 1 <= remote["pid"].nunique() <= 2
    pd.testing.assert_frame_equal(sw.comparable(local).drop(columns="pid"), sw.comparable(remote).drop(columns="pid"))
    assert sw.read_sweep(tmp_path / "ray.parquet")["cell"].tolist() == remote["cell"].tolist()


# ----------------------------------------------------------------------------- the eviction method
def test_evict_method_in_a_sweep(tiny_lm, items):
    """The registered ``evict`` method: B ≥ T reproduces the full-context tokens; a fractional budget
    keeps ⌈f·T⌉ positions and fewer KV bytes; the random policy follows the sweep's seed."""
    from workbench.rerun.eviction import resolve_budget

    pols = ["snapkv", "deferkv", "random"]
    grid = [("full", {}), ("evict", {"policy": pols, "budget_frac": [1.0, 0.5]}), ("evict", {"policy": pols, "budget": 64})]
    df = sw.sweep(tiny_lm, items[:1], grid, seeds=(0,), max_new_tokens=4, progress=False)
    assert df["error"].isna().all(), df["error"].tolist()
    full = df[df.method == "full"].iloc[0]
    T = int(full.prompt_tokens)
    ev = df[df.method == "evict"]
    assert len(ev) == 9
    for _, r in ev.iterrows():
        frac = None if pd.isna(r.p_budget_frac) else float(r.p_budget_frac)
        bud = None if pd.isna(r.p_budget) else int(r.p_budget)
        assert r.retained_tokens == resolve_budget(T, bud, frac)
        if frac == 1.0:
            assert list(r.generated_ids) == list(full.generated_ids), r.p_policy
        else:
            assert r.kv_bytes < r.kv_bytes_full
    assert (ev[ev.p_budget_frac == 0.5].retained_tokens == math.ceil(0.5 * T)).all()
    assert (ev[ev.p_budget == 64].retained_tokens == 64).all()
    # cells share one prefill per prompt: each equals an independent run of the policy
    from workbench.rerun.eviction import RandomKV, SnapKV, generate_with_policy
    prompt = items[0].build(tiny_lm.tokenizer)
    for pol, row in [(SnapKV(), ev[(ev.p_policy == "snapkv") & (ev.p_budget == 64)].iloc[0]),
                     (RandomKV(seed=0), ev[(ev.p_policy == "random") & (ev.p_budget_frac == 0.5)].iloc[0])]:
        alone = generate_with_policy(tiny_lm, prompt, pol, int(row.retained_tokens), 4, progress=False)
        assert list(alone.ids[: len(row.generated_ids)]) == list(row.generated_ids), pol.name
        assert alone.kv_bytes_after == row.kv_bytes
    for bad in [dict(budget_frac=1.5), dict(budget=0), dict(budget=8, budget_frac=0.5), dict()]:
        with pytest.raises(ValueError, match="budget"):
            resolve_budget(100, **bad)
    with pytest.raises(ValueError, match="policy"):
        sw.sweep(tiny_lm, items[:1], {"evict": {"policy": "nope", "budget": 8}}, max_new_tokens=2, progress=False)
