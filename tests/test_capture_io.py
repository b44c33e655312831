"""Saved captures: bit-identical round trip, atomic writes, clear errors."""
from __future__ import annotations

import dataclasses
import json
import re
import struct

import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

import workbench.capture.data as cd
from workbench.capture.checksum import KEYS, PLACEHOLDER, seal
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans
from workbench.show.widgets.base import head_dim_of


def _same(a: Capture, b: Capture):
    for name in ("attn", "row_pos", "head_group", "vnorm_max"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert a.hidden.keys() == b.hidden.keys()
    for k in a.hidden:
        assert torch.equal(a.hidden[k], b.hidden[k])
    assert a.spans == b.spans
    assert (a.row_kind, a.model_id, a.params, a.version, a.generated_ids) == (
        b.row_kind, b.model_id, b.params, b.version, b.generated_ids)


def test_round_trip_real_capture(smollm_capture, tmp_path):
    path = smollm_capture.save(tmp_path / "c.safetensors")
    _same(smollm_capture, Capture.load(path))


def test_round_trip_synthetic(tmp_path):
    spans = PromptSpans.synthetic([3, 4, 5], answer_doc=1)
    cap = Capture.synthetic(spans, extra_rows={"audit": list(range(*spans.query))})
    cap.hidden = {2: torch.randn(spans.T, 8)}
    _same(cap, Capture.load(cap.save(tmp_path / "sub" / "c.safetensors")))


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    spans = PromptSpans.synthetic([3, 4])
    cap = Capture.synthetic(spans)
    target = tmp_path / "c.safetensors"

    def broken(tensors, metadata=None):
        raise OSError("disk full")

    monkeypatch.setattr(cd, "safetensors_save", broken)
    with pytest.raises(OSError, match="disk full"):
        cap.save(target)
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_old_file(tmp_path, monkeypatch):
    spans = PromptSpans.synthetic([3, 4])
    old = Capture.synthetic(spans, seed=1)
    target = old.save(tmp_path / "c.safetensors")
    monkeypatch.setattr(cd, "safetensors_save", lambda *a, **k: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        Capture.synthetic(spans, seed=2).save(target)
    _same(old, Capture.load(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors"]


def test_load_rejects_other_files(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="not a workbench capture"):
        Capture.load(tmp_path / "x.safetensors")


def test_row_selection():
    spans = PromptSpans.synthetic([3, 4], query_len=5)
    cap = Capture.synthetic(spans, extra_rows={"audit": [spans.query[0]], "decode": [spans.T, spans.T + 1]})
    assert cap.rows_of("decode").tolist() == [len(spans.observers) + 1, len(spans.observers) + 2]
    assert cap.observer_attn().shape == (2, 6, spans.W_p, spans.T)
    with pytest.raises(ValueError, match="kind"):
        cap.rows_of("nope")
    with pytest.raises(ValueError, match="positions"):
        cap.rows_at([0])


# ----------------------------------------------------------------------------- the whole file is checksummed
def _cap() -> Capture:
    spans = PromptSpans.synthetic([3, 4, 5], answer_doc=1)
    cap = Capture.synthetic(spans, L=2, H_Q=4, G=2, extra_rows={"decode": [spans.T, spans.T + 1]})
    return dataclasses.replace(cap, model_id="tiny (llama, L=2, H_Q=4, G=2, d=16)", generated_ids=[5, 7],
                               params={**cap.params, "vocab": 128, "rows": {"tail": 4}})


def _header(path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])["__metadata__"]


def _edited(path, out, reseal: bool = False, **fields):
    """``path`` rewritten with metadata ``fields`` changed, as a user editing the header would (the recorded
    checksum kept); ``reseal`` recomputes it (a consistent file, to reach the checks after the checksum)."""
    meta = {**_header(path), **fields}
    if reseal:
        meta.update(dict.fromkeys(KEYS, PLACEHOLDER))
    data = safetensors_save(safetensors_load(path.read_bytes()), metadata=meta)
    out.write_bytes(seal(data) if reseal else data)
    return out


def _header_refusal(path) -> str:
    return rf"^path: {re.escape(str(path))} .*header"


@pytest.mark.parametrize("field,value", [
    ("model_id", ""),
    ("model_id", "other (llama, L=2, H_Q=4, G=2, d=16)"),
    ("generated_ids", "[999999999, 7]"),
    ("params", json.dumps({"tail": -5})),
    ("version", ""),
    ("row_kind", None),  # set below: one row relabelled
    ("spans", None),  # set below: a chunk boundary moved by one token
])
def test_an_edited_header_field_is_refused_naming_file_and_header(tmp_path, field, value):
    cap = _cap()
    path = cap.save(tmp_path / "c.safetensors")
    if field == "spans":
        s = cap.spans
        chunks = list(s.chunks)
        chunks[1] = (chunks[1][0] + 1, chunks[1][1])
        value = dataclasses.replace(s, chunks=tuple(chunks)).to_json()
    if field == "row_kind":
        value = json.dumps(["audit"] + cap.row_kind[1:])
    bad = _edited(path, tmp_path / "edited.safetensors", **{field: value})
    with pytest.raises(ValueError, match=_header_refusal(bad)):
        Capture.load(bad)


def test_any_changed_header_byte_is_refused_naming_file_and_header(tmp_path):
    path = _cap().save(tmp_path / "c.safetensors")
    raw = path.read_bytes()
    end = 8 + struct.unpack("<Q", raw[:8])[0]
    bad = tmp_path / "bad.safetensors"
    for i in range(end):
        b = bytearray(raw)
        b[i] ^= 0x01
        bad.write_bytes(bytes(b))
        with pytest.raises(ValueError, match=_header_refusal(bad)):
            Capture.load(bad)


def test_a_changed_tensor_byte_is_named(tmp_path):
    path = _cap().save(tmp_path / "c.safetensors")
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    off = json.loads(raw[8:8 + n])["vnorm_max"]["data_offsets"][0]
    raw[8 + n + off + 2] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"^path: {re.escape(str(path))} is damaged: tensor 'vnorm_max' does not"):
        Capture.load(path)


@pytest.mark.parametrize("fmt,pattern", [
    ("workbench.capture/-1", r"unknown capture format tag 'workbench.capture/-1' in its header"),
    ("workbench.capture/0", r"unknown capture format tag 'workbench.capture/0' in its header"),
    ("workbench.capture/2x", r"unknown capture format tag 'workbench.capture/2x' in its header"),
    ("workbench.capture/1", r"older workbench \(capture format 1\).*re-capture"),
    ("workbench.capture/3", r"newer workbench \(capture format version 3 in its header"),
])
def test_an_unknown_format_version_is_refused(tmp_path, fmt, pattern):
    path = _cap().save(tmp_path / "c.safetensors")
    bad = _edited(path, tmp_path / "f.safetensors", reseal=True, format=fmt)
    with pytest.raises(ValueError, match=rf"^path: {re.escape(str(bad))} .*{pattern}"):
        Capture.load(bad)


def test_ids_outside_the_recorded_vocabulary_are_refused_even_with_a_valid_checksum(tmp_path):
    path = _cap().save(tmp_path / "c.safetensors")
    bad = _edited(path, tmp_path / "g.safetensors", reseal=True, generated_ids="[999999999]")
    with pytest.raises(ValueError, match=r"generated_ids must be token ids in \[0, 128\) .*got 999999999$"):
        Capture.load(bad)
    with pytest.raises(ValueError, match=r"^capture: spans.input_ids must be token ids in \[0, 20\)"):
        dataclasses.replace(_cap(), params={"vocab": 20}).save(tmp_path / "v.safetensors")
    with pytest.raises(ValueError, match=r"^capture: params\['vocab'\] must be the model's vocabulary size"):
        dataclasses.replace(_cap(), params={"vocab": 0}).save(tmp_path / "v.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors", "g.safetensors"]


@pytest.mark.parametrize("key", KEYS)
def test_a_file_without_its_header_or_file_checksum_is_refused(tmp_path, key):
    path = _cap().save(tmp_path / "c.safetensors")
    meta = _header(path)
    meta.pop(key)
    bad = tmp_path / "n.safetensors"
    bad.write_bytes(safetensors_save(safetensors_load(path.read_bytes()), metadata=meta))
    with pytest.raises(ValueError, match=rf"^path: {re.escape(str(bad))} is damaged: its header holds no {key} checksum"):
        Capture.load(bad)


# ----------------------------------------------------------------------------- a capture reused with a model
@pytest.fixture(scope="module")
def tiny_and_capture():
    from workbench.capture import RowSet, run_capture
    from workbench.run.models import tiny_model

    tiny = tiny_model("llama", vocab=128, L=2, H_Q=4, G=2, d=16)
    spans = PromptSpans.synthetic([3, 4, 5])
    return tiny, run_capture(tiny, spans, RowSet(n_decode=2), progress=False)


def test_a_real_capture_records_its_vocabulary_and_round_trips(tiny_and_capture, tmp_path):
    tiny, cap = tiny_and_capture
    assert cap.params["vocab"] == 128 and len(cap.generated_ids) == 2
    _same(cap, Capture.load(cap.save(tmp_path / "c.safetensors")))


def test_head_dim_comes_from_the_model_config_not_from_a_name_that_lies(tiny_and_capture, tmp_path):
    tiny, cap = tiny_and_capture
    d = tiny.config.hidden_size // tiny.config.num_attention_heads   # 16: the tiny model's config
    assert getattr(tiny.config, "head_dim", d) == d == 16
    assert cap.params["head_dim"] == d and cap.head_dim == d
    assert Capture.load(cap.save(tmp_path / "c.safetensors")).head_dim == d
    # a model whose name or path says another d: the config's wins (a regex on the id read 128 here)
    liar = dataclasses.replace(cap, model_id="runs/d=128/ckpt (llama, L=2, H_Q=4, G=2, d=16)")
    assert liar.head_dim == d and head_dim_of(liar) == d
    # a capture saved without the key: the d= of the config fingerprint at the end of the id, not the name's
    old = dataclasses.replace(liar, params={k: v for k, v in cap.params.items() if k != "head_dim"})
    assert old.head_dim == 16
    unknown = dataclasses.replace(old, model_id="runs/d=128/ckpt")
    assert unknown.head_dim is None
    with pytest.warns(UserWarning, match="records no head dimension: the KV byte counts take d = 64"):
        assert head_dim_of(unknown) == 64
    assert Capture.synthetic(PromptSpans.synthetic([3, 4])).head_dim is None


@pytest.mark.parametrize("model_id", ["", "synthetic", "tiny"])
def test_a_capture_without_a_model_identity_is_refused_with_a_model(tiny_and_capture, model_id):
    from workbench.rerun.eviction import EvictionSession, StreamingLLM
    from workbench.rerun.prune import run_pruned

    tiny, cap = tiny_and_capture
    bad = dataclasses.replace(cap, model_id=model_id)
    pattern = rf"^prompt: the capture's model identity {re.escape(repr(model_id))} does not say which model"
    with pytest.raises(ValueError, match=pattern):
        run_pruned(tiny, bad, max_new_tokens=1, progress=False)
    with pytest.raises(ValueError, match=pattern):
        EvictionSession.prepare(tiny, bad, StreamingLLM().needs(), 1, progress=False)
    run_pruned(tiny, bad, layer=1, removed=[0], max_new_tokens=1, progress=False, allow_foreign=True)


def test_a_capture_of_another_model_is_refused_naming_both_ids(tiny_and_capture):
    from workbench.capture.hooks import model_identity
    from workbench.rerun.prune import run_pruned

    tiny, cap = tiny_and_capture
    other = "other (llama, L=3, H_Q=4, G=2, d=16)"
    with pytest.raises(ValueError, match=rf"^prompt: the capture was made with {re.escape(repr(other))}, not with "
                                         rf"this model {re.escape(repr(model_identity(tiny)))}"):
        run_pruned(tiny, dataclasses.replace(cap, model_id=other), max_new_tokens=1, progress=False)
    run_pruned(tiny, cap, layer=1, removed=[0], max_new_tokens=1, progress=False)  # its own model: fine


def test_generated_ids_outside_the_models_vocabulary_are_refused(tiny_and_capture):
    from workbench.capture.identity import check_model_match

    tiny, cap = tiny_and_capture
    bad = dataclasses.replace(cap, generated_ids=[999_999_999], params={k: v for k, v in cap.params.items()
                                                                         if k != "vocab"})
    with pytest.raises(ValueError, match=r"^prompt: the capture's generated token id 999999999 is outside this "
                                         r"model's vocabulary \(size 128\)"):
        check_model_match(tiny, None, bad, allow_foreign=True)
