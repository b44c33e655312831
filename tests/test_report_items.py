"""The report on data of one's own: ``--items FILE.jsonl`` end to end on the default model, stopped
halfway (SIGTERM: a partial report) and resumed without recomputing finished cells; ``load_items``'s errors
name the line and the field; ``--filler`` and the samples carry honest provenance."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest

from workbench.study import datasets, tasks

ITEMS = [  # two small home-made items (not SQuAD): a fact in one of two short passages
    {"task": "pets", "item_id": "cat", "query": "What is the name of the lighthouse keeper's cat?",
     "documents": ["The harbour opened in 1901 and ships still dock there every morning.",
                   "The lighthouse keeper has a grey cat. The lighthouse keeper's cat is named Biscuit."],
     "answers": ["Biscuit"], "answer_doc": 1},
    {"task": "pets", "item_id": "dog", "query": "What colour is the baker's dog?",
     "documents": ["The baker's dog is brown and sleeps by the oven.", "The mill burned down in 1888."],
     "answers": ["brown"], "answer_doc": 0, "meta": {"note": "home-made"}},
]


def _write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_load_items_reads_and_labels(tmp_path):
    f = _write(tmp_path / "mine.jsonl", ["# a comment", *ITEMS, ""])
    its = tasks.load_items(f)
    assert [it.item_id.split("#")[0] for it in its] == ["cat", "dog"]
    assert all(it.meta["source"] == "items:mine.jsonl" for it in its) and its[1].meta["note"] == "home-made"
    assert its[0].meta["line"] == 2 and its[1].meta["line"] == 3


@pytest.mark.parametrize("row, msg", [
    ("{not json", r"line 1: not valid JSON"),
    ([1, 2], r"line 1: must be a JSON object"),
    ({**ITEMS[0], "colour": 1}, r"line 1: colour: not a TaskItem field"),
    ({k: v for k, v in ITEMS[0].items() if k != "query"}, r"line 1: query: required field missing"),
    ({**ITEMS[0], "answer_doc": 5}, r"line 1: answer_doc: must be an integer in \[0, 1\]"),
    ({**ITEMS[0], "answer_doc": 0}, r"line 1: answer_doc: no gold answer"),
    ({**ITEMS[0], "documents": "one string"}, r"line 1: documents: must be a JSON list"),
    ({**ITEMS[0], "answer_doc": "1"}, r"line 1: answer_doc: must be an integer"),
])
def test_load_items_errors_name_line_and_field(tmp_path, row, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text((row if isinstance(row, str) else json.dumps(row)) + "\n")
    with pytest.raises(ValueError, match=rf"^items: bad.jsonl {msg}"):
        tasks.load_items(f)
    f.write_text(json.dumps(ITEMS[0]) + "\n" + json.dumps(ITEMS[0]) + "\n")
    with pytest.raises(ValueError, match=r"^items: bad.jsonl line 2: item_id: duplicate"):
        tasks.load_items(f)


def test_provenance_labels_samples_and_filler(tmp_path, smollm):
    assert datasets.provenance(datasets.load_squad("sample"))["label"] == "squad-v1.1-dev-sample"
    assert datasets.provenance(datasets.load_essays("sample"))["label"] == "paul-graham-essays-sample"
    f = tmp_path / "novel.txt"
    f.write_text(" ".join(f"Sentence number {i} of a public-domain novel." for i in range(300)))
    filler = datasets.load_filler(f)
    p = datasets.provenance(filler)
    assert p["label"] == "filler:novel.txt" and len(p["sha256"]) == 64
    tok = smollm.tokenizer
    its = tasks.needle(tok, filler, lengths=(128,), depths=(0.5,))
    assert its[0].meta["source"] == "filler:novel.txt"  # not "paul-graham-essays"
    assert tasks.needle(tok, {"x": filler["novel"]}, lengths=(128,), depths=(0.5,))[0].meta["source"] == "unlabelled"
    with pytest.raises(ValueError, match="^filler:"):
        datasets.load_filler(tmp_path / "absent.txt")


def test_items_report_end_to_end_stops_and_resumes(tmp_path):
    f = _write(tmp_path / "pets.jsonl", ITEMS)
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "workbench", "report", "--items", str(f), "--methods", "full", "evict",
           "--policies", "streaming", "snapkv", "--budget-fracs", "0.5", "--max-new-tokens", "12", "--no-progress",
           "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pq = out / "tables" / "sweep.parquet"
    # the first run holds still once the sweep's table is first saved (so SIGTERM always comes halfway, never
    # after the last cell), and says so on stderr
    pause = ("import os, sys, time\n_real = os.replace\n"
             "def _replace(a, b):\n    _real(a, b)\n"
             "    if str(b).endswith('sweep.parquet') and not getattr(_replace, 'done', False):\n"
             "        _replace.done = True\n        print('READY', file=sys.stderr, flush=True)\n        time.sleep(600)\n"
             "os.replace = _replace\nfrom workbench.__main__ import main\n"
             f"sys.exit(main({cmd[3:]!r}))\n")
    p = subprocess.Popen([sys.executable, "-c", pause], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    for line in p.stderr:
        if "READY" in line:
            break
    p.send_signal(signal.SIGTERM)  # halfway: at least one cell is saved
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 130, stderr[-3000:]
    assert "PARTIAL report" in stdout
    first = pd.read_parquet(pq)
    assert 1 <= len(first) < 6  # 2 items x (full, streaming, snapkv)
    page = (out / "report.html").read_text()
    assert "PARTIAL REPORT" in page and "items:pets.jsonl" in page

    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    sw = pd.read_parquet(pq)
    assert len(sw) == 6 and sw["error"].isna().all() and set(sw["task"]) == {"pets"}
    assert (sw["max_new_tokens"] == 12).all() and sw["n_generated"].between(1, 12).all()
    # the cells finished before the stop were not run again: their measured times are unchanged
    kept = sw.set_index("cell").loc[first["cell"], "wall_s"]
    assert list(kept) == list(first["wall_s"])
    page = (out / "report.html").read_text()
    assert "PARTIAL REPORT" not in page and "<section id='findings'>" in page
    assert page.count("<li class='finding'>") == 2  # streaming vs full, snapkv vs full (one task: no pooled line)
    assert "items:pets.jsonl" in page and json.loads((out / "manifest.json").read_text())["partial"] is False
