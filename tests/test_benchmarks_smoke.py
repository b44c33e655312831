"""The benchmark scripts: every one writes the same metadata through ``benchmarks/_harness.py`` (checked on
the source of all of them and on the files of the runs below); ``benchmarks/gpu.py`` runs end to end on the CPU
(its 2-layer smoke version, small T): every measurement of the GPU script is exercised here, so the GPU run
does not meet its first bug on the GPU."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import _harness as harness  # noqa: E402
import gpu  # noqa: E402

SCRIPTS = sorted(p for p in BENCH.glob("[a-z]*.py"))
# writes that are not results: a worker's claim file (study.py), the resume cache of finished prompts
# (eviction_field.py), the study's kept-tokens, leap, ranks and conclusions parquet (its summary carries the metadata),
# the mutants and the trial profile written into mutation.py's throwaway worktree
# study_tables.py rewrites the opening section of study_summary.md in place: the rest of the file, with the
# metadata of the run that wrote it, is kept as it was
OTHER_WRITES = {("study.py", "fdopen"), ("study.py", "atomic_write_bytes"), ("eviction_field.py", "open"),
                ("mutation.py", "write_text"), ("study_tables.py", "write_text")}


def _head() -> str | None:
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def _check_meta(meta: dict) -> None:
    assert set(harness.KEYS) <= set(meta), sorted(set(harness.KEYS) - set(meta))
    assert meta["commit"] == _head()
    assert set(meta["versions"]) == {"python", "torch", "transformers", "workbench"} and all(meta["versions"].values())
    assert meta["threads"] >= 1 and meta["cpus"] >= 1 and len(meta["load_avg"]) == 3 and meta["machine"]


def test_there_are_benchmark_scripts():
    assert len(SCRIPTS) >= 17, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_script_writes_through_the_harness(path):
    """Each script imports the harness and writes its results with ``harness.write_json`` / ``write_markdown``;
    no other write of a result (``write_text``, ``json.dump``, ``open(..., "w")``, ``atomic_write_bytes``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = any(isinstance(n, ast.Import) and any(a.name == "_harness" for a in n.names) for n in ast.walk(tree))
    assert imported, f"{path.name}: does not import _harness"
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
    names = {f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None) for f in calls}
    harness_calls = [f.attr for f in calls if isinstance(f, ast.Attribute) and getattr(f.value, "id", None) == "harness"]
    assert set(harness_calls) & {"write_json", "write_markdown"}, f"{path.name}: writes nothing through the harness"
    other = {n for n in names & {"write_text", "write_bytes", "dump", "atomic_write_bytes", "fdopen"}
             if (path.name, n) not in OTHER_WRITES}
    for f in calls:  # open(..., "w"/"a") outside the allowed ones
        if getattr(f, "id", None) == "open" and (path.name, "open") not in OTHER_WRITES:
            call = next(c for c in ast.walk(tree) if isinstance(c, ast.Call) and c.func is f)
            modes = [a.value for a in call.args[1:2] if isinstance(a, ast.Constant)]
            if modes and any(ch in modes[0] for ch in "wax"):
                other.add("open")
    assert not other, f"{path.name}: writes a result without the harness's metadata: {sorted(other)}"


def test_harness_layout(tmp_path):
    """``write_json`` / ``write_markdown`` put the same metadata in a JSON file and a markdown file; a list
    payload becomes ``results``; an extra key may not replace the harness's own; a file without it is refused."""
    j = harness.write_json(tmp_path / "a" / "x.json", [1, 2], T=8)
    d = json.loads(j.read_text())
    assert d["results"] == [1, 2] and d["meta"]["T"] == 8
    _check_meta(harness.read_meta(j))
    m = harness.write_markdown(tmp_path / "x.md", "# table\n\n| a |\n|---|\n| 1 |\n", note="n")
    text = m.read_text()
    assert text.startswith("# table") and text.rstrip().endswith("-->")
    meta = harness.read_meta(m)
    _check_meta(meta)
    assert meta["note"] == "n"
    with pytest.raises(ValueError, match="^extra: \\['commit'\\]"):
        harness.metadata(commit="x")
    with pytest.raises(ValueError, match="^payload:"):
        harness.write_json(tmp_path / "y.json", {"meta": {}})
    (tmp_path / "bare.json").write_text("{}")
    with pytest.raises(ValueError, match="^path: .*no benchmark metadata"):
        harness.read_meta(tmp_path / "bare.json")


def test_gpu_benchmark_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--T", "192", "--reps", "1", "--steps", "2", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["meta"]["smoke"] is True and "not GPU numbers" in d["meta"]["note"]
    _check_meta(harness.read_meta(out))
    (r,) = d["results"]
    assert (r["T"], r["L"], r["H_Q"], r["G"], r["smoke"]) == (192, 2, 4, 2, True)
    # half-precision rows on the host: L · H_Q · R · T · 2 bytes (8 observers + the 32-token query)
    assert r["rows"] == 40 and r["capture_rows_host_bytes"] == 2 * 4 * 40 * 192 * 2
    assert r["one_layer_rows_fp32_bytes"] == 4 * 40 * 192 * 4
    assert r["plain_prefill_s"] > 0 and r["capture_prefill_s"] > 0
    assert r["T_prime"] <= 192 // 2 + 16 and r["T_prime"] >= 192 // 2 - 16  # about half the prompt pruned
    assert 0 < r["pruned_predicted_ratio"] < 1
    assert abs(r["kv_bytes_b25"] / r["kv_bytes_full"] - 0.25) < 0.02  # B = T/4 prompt positions per layer/group
    assert set(r["policies"]) >= {"snapkv", "deferkv", "h2o", "streaming"}


def test_eviction_scale_smoke(tmp_path):
    """``benchmarks/eviction_scale.py`` (eviction memory at the 8B shape) at a small T: the compacted
    cache holds exactly ``B = T/4`` positions per layer and KV head (``2·L·G·d·4·B`` bytes)."""
    import eviction_scale

    out = tmp_path / "ev.json"
    assert eviction_scale.main(["--T", "512", "--steps", "2", "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    _check_meta(harness.read_meta(out))
    assert (r["L"], r["H_Q"], r["G"], r["d"], r["budget"]) == (2, 32, 8, 128, 128)
    assert r["kv_bytes_b25"] == r["kv_bytes_b25_formula"] == 2 * 2 * 8 * 128 * 4 * 128
    assert r["kv_bytes_full"] == 2 * 2 * 8 * 128 * 4 * 512 and r["kv_ratio"] == 0.25


def test_study_helpers(tmp_path):
    """The study's pieces that decide numbers (``workbench.study.priority_study``, ``.answer_kept``): the answer
    chunk's rank (mid-rank ties, NaN layers skipped), the standing findings (a win = the answer kept longer than
    under Rényi), the answer-kept findings; and ``benchmarks/study.py``'s flags as the report's settings."""
    import pandas as pd
    import study
    import torch

    from workbench.study.answer_kept import kept_findings
    from workbench.study.priority_study import answer_rank, priority_findings

    nan = float("nan")
    S = torch.tensor([[0.1, 0.5, 0.3, 0.2],        # answer (chunk 2) second highest: rank 2
                      [0.4, 0.4, 0.4, 0.1],        # tied with two others at the top: ranks 1, 2, 3 -> mid 2
                      [nan, nan, nan, nan]], dtype=torch.float64)  # an invalid layer: skipped
    assert answer_rank(S, 2) == 2.0
    assert answer_rank(S[:1], 1) == 1.0 and answer_rank(S[:1], 0) == 4.0
    assert answer_rank(S[2:], 0) != answer_rank(S[2:], 0)  # no valid layer: NaN
    ranks = pd.DataFrame([dict(item_id=i, priority=p, k=4, rank=r) for i, rr in enumerate(
        [(1, 2), (1, 3), (2, 2), (1, 4), (1, 2), (1, 3)]) for p, r in zip(("headmax", "renyi"), rr)])
    out = priority_findings(ranks)
    # standing 5 - rank: headmax 4,4,3,4,4,4 (mean 23/6, first on 5 of 6), renyi 3,2,3,1,3,2 (14/6)
    assert "| renyi | 6 | 2.333 | 0.000 |" in out[0] and "| headmax | 6 | 3.833 | 0.833 |" in out[0]
    assert "headmax vs renyi" in out[1] and "5 wins / 1 ties / 0 losses" in out[1]
    # answer tokens kept: deferkv above snapkv on 5 of 6 prompts at 0.25 (one tie), below on all 6 at 0.5
    kept = pd.DataFrame([dict(item_id=i, policy=p, budget_frac=f, kept=v)
                         for i in range(6) for f, (d, s) in ((0.25, (0.5 + 0.1 * (i > 0), 0.5)), (0.5, (0.6, 0.8)))
                         for p, v in (("deferkv", d), ("snapkv", s))])
    out = kept_findings(kept)
    assert "| deferkv | 0.250 | 6 | 0.583 |" in out[0] and "| snapkv | 0.500 | 6 | 0.800 |" in out[0]
    assert "deferkv @ 0.25 vs snapkv @ 0.25" in out[1] and "5 wins / 1 ties / 0 losses" in out[1]
    assert "deferkv @ 0.5 vs snapkv @ 0.5" in out[2] and "0 wins / 0 ties / 6 losses" in out[2]
    assert "difference -0.20" in out[2] and "deferkv @ 0.5 is lower than snapkv @ 0.5" in out[2]
    # benchmarks/study.py is the report with the study's settings: its flags map one to one
    cfg = study.config(study.parse(["--n-squad", "2", "--data", "sample", "--ruler", "niah_single", "--ruler-lengths",
                                    "512", "--ruler-seeds", "1", "--policies", "snapkv", "deferkv", "--leap-prompts",
                                    "2", "--kept-prompts", "3", "--cap-tokens", "0"]), tmp_path / "study")
    assert (cfg.n_squad, cfg.n_needle, cfg.n_distractors, cfg.data) == (2, 0, 3, "sample")
    assert (cfg.ruler, cfg.ruler_lengths, cfg.ruler_seeds) == (("niah_single",), (512,), 1)
    assert (cfg.policies, cfg.budget_fracs, cfg.presets) == (("snapkv", "deferkv"), (0.25, 0.5), ("paper", "loose"))
    assert (cfg.leap_prompts, cfg.kept_prompts, cfg.cap_tokens, cfg.threads) == (2, 3, 0, 1)


@pytest.mark.model
def test_study_cap_check(smollm, tmp_path):
    """``cap_check``: full context again with more new tokens, paired against the study's own full cells.
    Greedy: each longer reply starts with the shorter one, so a win can only be an answer after the cap."""
    import pandas as pd
    import torch

    from workbench.run.models import LoadedModel, tiny_model
    from workbench.study import datasets, tasks
    from workbench.study.cap_check import cap_check
    from workbench.study.sweep import sweep

    model = tiny_model("llama", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16, seed=0)
    lm = LoadedModel(model=model, tokenizer=smollm.tokenizer, model_id="tiny-llama-test",
                     device=torch.device("cpu"), dtype=torch.float32)
    items = tasks.squad_single(datasets.load_squad("sample"), n=2, n_distractors=1, seed=0)
    short = sweep(lm, items, [("full", {})], max_new_tokens=3, reference=False, progress=False)
    out = tmp_path / "cap6.parquet"
    lines = cap_check(lm, items, short, out, 6)
    long = pd.read_parquet(out)
    assert len(long) == 2 and (long.max_new_tokens == 6).all()
    for it in items:
        s = list(short[short.item_id == it.item_id].generated_ids.iloc[0])
        g = list(long[long.item_id == it.item_id].generated_ids.iloc[0])
        assert g[:len(s)] == s and len(g) > len(s)
    assert lines[0] == (f"- Full context hit the cap of 3 tokens on {int(short.hit_cap.sum())} of 2 prompts; "
                        f"with 6 it hits it on {int(long.hit_cap.sum())}.")
    assert "n = 2 paired prompts" in lines[1] and "full, 6 tokens vs full, 3 tokens on squad_single" in lines[1]
    assert cap_check(lm, items, short, out, 6) == lines  # resumed from the parquet: same finding


@pytest.mark.model
def test_study_answer_kept(smollm):
    """``answer_kept``: one row per (prompt, policy, budget) with the share kept in [0, 1]; a prompt whose gold
    passage lacks every gold answer (a diffuse item) is left out with a warning that names it, not silently."""
    import dataclasses

    import torch

    from workbench.run.models import LoadedModel, tiny_model
    from workbench.study import datasets, tasks
    from workbench.study.answer_kept import answer_kept

    model = tiny_model("llama", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16, seed=0)
    lm = LoadedModel(model=model, tokenizer=smollm.tokenizer, model_id="tiny-llama-test",
                     device=torch.device("cpu"), dtype=torch.float32)
    (it,) = tasks.squad_single(datasets.load_squad("sample"), n=1, n_distractors=1, seed=0)
    # TaskItem insists the gold answer lies in the gold passage, except for diffuse items (answer_parts)
    part = it.documents[it.answer_doc][:12]
    bad = dataclasses.replace(it, item_id="no-answer#0", answers=("zzz not in any passage",), answer_parts=(part,))
    with pytest.warns(UserWarning, match=r"1 of 2 prompts left out.*no-answer#0"):
        k = answer_kept(lm, [it, bad], 2)
    assert len(k) == 4 and set(k.item_id) == {it.item_id} and set(k.policy) == {"deferkv", "snapkv"}
    assert k.kept.between(0, 1).all() and (k.answer_tokens > 0).all()
    T = int(k["T"].iloc[0])
    assert sorted(set(k.budget)) == [-(-T // 4), -(-T // 2)]  # ⌈0.25 T⌉, ⌈0.5 T⌉
