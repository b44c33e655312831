"""Saved captures: bit-identical round trip, atomic writes, clear errors."""
from __future__ import annotations

import pytest
import torch

import workbench.capture.data as cd
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans


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
