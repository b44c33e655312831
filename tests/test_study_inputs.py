"""Bad inputs and faults on the study side (cases 1, 8, 9, 12, 13 report side, 16). Each test fails on
the code before the fix: every refusal comes before any model work or cell, names the file (and line and field)
or the parameter, and a damaged sweep file is kept aside, not lost.

No model is loaded: sweeps run a method that only answers, on a fake model (as in ``tests/test_faults.py``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import workbench.study.report as report_mod
import workbench.study.report_parts as report_parts
from workbench.study import sweep as sw
from workbench.study import tasks
from workbench.study.report import ReportConfig, run_report
from workbench.study.tasks import TaskItem

ITEM = {"task": "pets", "item_id": "cat", "query": "What is the name of the keeper's cat?",
        "documents": ["The harbour opened in 1901.", "The keeper's cat is named Biscuit."],
        "answers": ["Biscuit"], "answer_doc": 1}
ITEMS = [TaskItem(task="t", item_id=f"i{i}#0", documents=(f"the answer is a{i}",), query="q?", answers=(f"a{i}",),
                  answer_doc=0) for i in range(3)]


def fake_model():
    return SimpleNamespace(device="cpu", dtype=torch.float32, tokenizer=None, model_id="fake")


fake_model.model_id = "fake"


@pytest.fixture
def probe():
    calls = []

    def answer(lm, item, params):
        calls.append(item.item_id)
        return {"generated_ids": [1, 2], "answer": item.answers[0]}

    sw.register_method("study_probe", answer, params=(), replace=True)
    yield calls
    sw.unregister_method("study_probe")


def _sweep(out, **kw):
    return sw.sweep(fake_model, ITEMS, {"study_probe": {}}, out=out, reference=False, progress=False,
                    checkpoint_s=0, **kw)


def _no_model(*a, **k):
    raise AssertionError("a model was loaded before the inputs were checked")


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder this process cannot write in: a read-only tmpfs as root (root ignores permissions), else mode 0o555."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip("no read-only place to test with (mount refused)")
        yield d
        subprocess.run(["umount", str(d)], capture_output=True)
    else:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)


# ----------------------------------------------------------------------------- case 1: bools are not indices
@pytest.mark.parametrize("field, value, msg", [
    ("evidence_docs", [1, True], r"evidence_docs: every entry must be an integer index, got True"),
    ("evidence_docs", [1, 0.0], r"evidence_docs: every entry must be an integer index, got 0.0"),
    ("answer_doc", True, r"answer_doc: must be an integer, got True"),
    ("conflict_doc", False, r"conflict_doc: must be an integer, got False"),
])
def test_case1_items_refuse_bools_in_int_fields(tmp_path, field, value, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(ITEM) + "\n" + json.dumps({**ITEM, "item_id": "dog", field: value}) + "\n")
    with pytest.raises(ValueError, match=rf"^items: bad.jsonl line 2: {msg}"):
        tasks.load_items(f)
    with pytest.raises(ValueError, match="evidence_docs: every index must be an integer"):
        TaskItem(**{**ITEM, "evidence_docs": (1, True)})
    with pytest.raises(ValueError, match="conflict_doc: must be None or an integer"):
        TaskItem(**{**ITEM, "conflict_doc": True, "conflict_answers": ("Rex",)})


def test_case1_items_refuse_non_string_texts(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({**ITEM, "answer_parts": ["Biscuit", 7]}) + "\n")
    with pytest.raises(ValueError, match=r"^items: bad.jsonl line 1: answer_parts: every entry must be a string, got 7"):
        tasks.load_items(f)


# ----------------------------------------------------------------------------- case 8: items checked first
def test_case8_items_file_checked_before_any_model_work(tmp_path, monkeypatch):
    monkeypatch.setattr(report_mod, "load_model", _no_model)
    monkeypatch.setattr(report_parts, "run_capture", _no_model)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ITEM) + "\n" + json.dumps({**ITEM, "item_id": "dog", "answer_doc": 7}) + "\n")
    out = tmp_path / "rep"
    cfg = ReportConfig(out=out, items=bad, n_squad=0, n_needle=0, progress=False)
    with pytest.raises(ValueError, match=r"^items: bad.jsonl line 2: answer_doc: must be an integer in \[0, 1\]"):
        run_report(cfg)
    assert not out.exists()  # no empty out/tables/ left behind

    raw = (json.dumps(ITEM) + "\n").encode() + b'{"task": "pets", "query": "caf\xff?"}\n'
    bad.write_bytes(raw)
    with pytest.raises(ValueError, match=r"^items: bad.jsonl line 2: not UTF-8 text \(byte 0xff at column 31\)"):
        run_report(cfg)
    with pytest.raises(ValueError, match=r"^items: bad.jsonl line 2: not UTF-8"):
        tasks.load_items(bad)
    assert not out.exists()


def test_case8_filler_checked_before_any_model_work(tmp_path, monkeypatch):
    monkeypatch.setattr(report_mod, "load_model", _no_model)
    filler = tmp_path / "novel.txt"
    filler.write_bytes(b"It was a dark \xff night.")
    out = tmp_path / "rep"
    with pytest.raises(ValueError, match=r"^filler: .*novel.txt is not UTF-8"):
        run_report(ReportConfig(out=out, filler=filler, n_squad=0, n_needle=1, progress=False))
    assert not out.exists()


# ----------------------------------------------------------------------------- case 9: sweep(out=...)
def test_case9_sweep_out_a_directory_is_refused_before_any_cell(tmp_path, probe):
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "someone_elses.parquet")
    with pytest.raises(ValueError, match=r"^out: must be a \.parquet file path, got the directory"):
        _sweep(tmp_path)
    assert probe == []
    assert sorted(os.listdir(tmp_path)) == ["someone_elses.parquet"]


def test_case9_sweep_out_of_the_wrong_kind_is_refused(tmp_path, probe):
    with pytest.raises(ValueError, match=r"^out: must be a \.parquet file path \(the sweep writes parquet\)"):
        _sweep(tmp_path / "results.csv")
    other = tmp_path / "other.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(other)
    before = other.read_bytes()
    with pytest.raises(ValueError, match=r"^out: .*other.parquet' is a parquet file but not a sweep frame"):
        _sweep(other)
    assert probe == [] and other.read_bytes() == before  # someone else's data, untouched
    assert sorted(os.listdir(tmp_path)) == ["other.parquet"]


def test_case9_sweep_out_in_a_read_only_place_is_refused(read_only_dir, probe):
    with pytest.raises(ValueError, match=r"^out: cannot write in .*ro'.*choose a writable place"):
        _sweep(read_only_dir / "sub" / "sweep.parquet")
    assert probe == []


# ----------------------------------------------------------------------------- case 12: a damaged sweep file
def test_case12_a_damaged_sweep_file_is_kept_aside_and_recomputed(tmp_path, probe):
    out = tmp_path / "sweep.parquet"
    first = _sweep(out)
    assert len(probe) == 3
    good = out.read_bytes()
    out.write_bytes(good[: len(good) // 2])  # truncated
    probe.clear()
    with pytest.warns(RuntimeWarning, match=r"sweep.parquet' was damaged .*kept as .*sweep.parquet.damaged-"):
        again = _sweep(out)
    assert len(probe) == 3  # its cells were computed again
    pd.testing.assert_frame_equal(sw.comparable(again), sw.comparable(first))
    aside = [p for p in os.listdir(tmp_path) if p.startswith("sweep.parquet.damaged-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == good[: len(good) // 2]  # the copy, intact
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the repaired file resumes silently
        probe.clear()
        _sweep(out)
    assert probe == []


def test_case12_the_report_keeps_a_damaged_sweep_aside(tmp_path, monkeypatch):
    from workbench.study.storage import read_resumable

    path = tmp_path / "tables" / "sweep.parquet"
    path.parent.mkdir()
    path.write_bytes(b"PAR1 not really")
    with pytest.warns(RuntimeWarning, match="damaged"):
        df = read_resumable(path)
    assert df.empty and list(df.columns) == list(sw.COLUMNS) and not path.exists()
    assert len(list(path.parent.glob("sweep.parquet.damaged-*"))) == 1


# ----------------------------------------------------------------------------- case 13: report --out
def test_case13_report_out_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(report_mod, "load_model", _no_model)
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(ValueError, match=r"^out: must be a folder .*got the file .*notes.txt"):
        ReportConfig(out=f)
    assert f.read_text() == "mine"


def test_case13_report_out_in_a_read_only_place_is_refused(read_only_dir, monkeypatch):
    monkeypatch.setattr(report_mod, "load_model", _no_model)
    with pytest.raises(ValueError, match=r"^out: cannot write in .*ro'.*choose a writable place"):
        run_report(ReportConfig(out=read_only_dir / "report", progress=False))


def test_case13_cli_report_out_a_file_is_one_line(tmp_path, capsys):
    from workbench.__main__ import main

    f = tmp_path / "notes.txt"
    f.write_text("mine")
    rc = main(["report", "--out", str(f), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "out: must be a folder" in err[0] and "Traceback" not in err[0]


# ----------------------------------------------------------------------------- case 16: ReportConfig(entroprefill=)
def test_case16_unknown_entroprefill_field_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"^entroprefill: 'bogus' is not an EntroPrefill parameter \(allowed: .*zeta"):
        ReportConfig(out=tmp_path / "r", entroprefill={"bogus": 1})
    ReportConfig(out=tmp_path / "r", entroprefill={"zeta": 0.5, "layer": 3})  # known fields still pass
    with pytest.raises(ValueError, match="zeta"):
        ReportConfig(out=tmp_path / "r", entroprefill={"zeta": 0})
    assert Path(tmp_path / "r").exists() is False


# ----------------------------------------------------------------------------- --filler without usable passages
CHAT = "<|im_start|>user\nWhat is the capital of France<|im_end|>\n<|im_start|>assistant\nParis<|im_end|>\n"


@pytest.mark.parametrize("name,text,pattern", [
    ("nul", "\x00" * 5000, r"has no usable passage: no sentence holds a letter or a digit"),
    ("control", "\x01\x02\x03. \x07\x08!\n" * 50, r"has no usable passage: no sentence holds a letter or a digit"),
    ("emoji", "\U0001F600\U0001F680. " * 200, r"has no usable passage: no sentence holds a letter or a digit"),
    ("one line", "It was a dark night.\n" + "word " * 2_000_000,
     r"line 2: a sentence of 9999999 characters with no sentence boundary"),
    ("chat template", CHAT * 100, r"line 1: a sentence of \d+ characters with no sentence boundary"),
])
def test_filler_without_usable_passages_is_refused(tmp_path, name, text, pattern):
    from workbench.study import datasets

    f = tmp_path / "filler.txt"
    f.write_text(text)
    with pytest.raises(ValueError, match=rf"^filler: {re.escape(str(f))} {pattern}"):
        datasets.load_filler(f)


def test_report_filler_refusal_is_one_cli_line(tmp_path):
    import sys

    f = tmp_path / "emoji.txt"
    f.write_text("\U0001F600 " * 100)
    r = subprocess.run([sys.executable, "-m", "workbench", "report", "--filler", str(f), "--out", str(tmp_path / "rep"),
                        "--no-progress"], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1])
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert "filler: " in err[0] and "has no usable passage" in err[0] and "Traceback" not in r.stderr, err
    assert not (tmp_path / "rep").exists()


def test_a_haystack_whose_first_sentence_exceeds_the_budget_is_refused_not_an_index_error(smollm):
    long_sentence = " ".join(f"w{i}" for i in range(400)) + "."
    with pytest.raises(ValueError, match=r"^lengths: the haystack's first sentence \(\d+ tokens\) is longer than "
                                         r"the budget"):
        tasks.needle(smollm.tokenizer, {"x": long_sentence + " " + long_sentence}, lengths=(64,), depths=(0.5,))


# ----------------------------------------------------------------------------- --items: keys, copies, nesting
def _items_file(tmp_path, *lines: str) -> Path:
    f = tmp_path / "its.jsonl"
    f.write_text("".join(line + "\n" for line in lines))
    return f


def test_items_duplicate_json_key_is_refused_naming_file_line_and_key(tmp_path):
    good = json.dumps(ITEM)
    twice = good[:-1] + ', "query": "What is the name of the dog?"}'
    f = _items_file(tmp_path, good.replace('"cat"', '"cat0"'), twice)
    with pytest.raises(ValueError, match=r"^items: its.jsonl line 2: duplicate key 'query' in a JSON object"):
        tasks.load_items(f)
    nested = json.dumps({**ITEM, "meta": {}})[:-2] + '"a": 1, "a": 2}}'
    with pytest.raises(ValueError, match=r"^items: its.jsonl line 1: duplicate key 'a'"):
        tasks.load_items(_items_file(tmp_path, nested))


def test_items_identical_without_ids_are_refused_not_counted_twice(tmp_path):
    no_id = {k: v for k, v in ITEM.items() if k != "item_id"}
    f = _items_file(tmp_path, json.dumps(no_id), "", json.dumps(no_id))
    with pytest.raises(ValueError, match=r"^items: its.jsonl line 3: the same item as line 1 \(task 'pets'"):
        tasks.load_items(f)
    other = {**no_id, "task": "other-task"}  # the same content in another task is another unit
    assert [i.task for i in tasks.load_items(_items_file(tmp_path, json.dumps(no_id), json.dumps(other)))] == [
        "pets", "other-task"]


def test_items_deep_json_is_a_clear_error_with_file_and_line(tmp_path):
    f = _items_file(tmp_path, json.dumps(ITEM), "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"^items: its.jsonl line 2: not a TaskItem: its JSON is nested too deeply"):
        tasks.load_items(f)
