"""Capture at scale: half-precision rows, memory estimate and limit, rows off the device layer by
layer, synthetic captures at research shapes, analytics on half-precision rows against float32."""
from __future__ import annotations

import pytest
import torch

import workbench.capture.synthetic as syn
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.pooling import HeadPooling
from workbench.analyse.procedure import trace
from workbench.analyse.selection import mass_table
from workbench.capture import Capture, RowSet, capture_attention, run_capture
from workbench.capture.budget import ENV_MAX_BYTES, HALF_REL_ERROR, estimate_capture_bytes, max_capture_bytes
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans

SPANS = PromptSpans.synthetic([12, 9, 15, 11, 10], query_len=10)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", L=3, H_Q=4, G=2, d=16, vocab=SPANS.T + 8)


@pytest.fixture(scope="module")
def caps(model):
    rows = RowSet(tail=6, n_decode=2)
    return {dt: run_capture(model, SPANS, rows, progress=False, dtype=dt) for dt in ("float32", "float16", "bfloat16")}


@pytest.mark.parametrize("dt, torch_dt", [("float16", torch.float16), ("bfloat16", torch.bfloat16)])
def test_half_rows_within_rounding_of_float32(caps, dt, torch_dt):
    a32, ah = caps["float32"].attn, caps[dt].attn
    assert ah.dtype == torch_dt and ah.shape == a32.shape
    err = (ah.float() - a32).abs()
    # round to nearest: relative 2^-11 (fp16) / 2^-8 (bf16); fp16 subnormals (< 2^-14): absolute 2^-25
    assert bool((err <= HALF_REL_ERROR[dt] * a32 + 2.0 ** -25).all()), float((err / a32.clamp_min(1e-30)).max())
    assert err.max() > 0  # really rounded (the test would pass trivially on a float32 copy)
    assert caps[dt].params["dtype"] == dt and caps[dt].generated_ids == caps["float32"].generated_ids


def test_half_capture_round_trip(caps, tmp_path):
    c = caps["bfloat16"]
    back = Capture.load(c.save(tmp_path / "c.safetensors"))
    assert back.attn.dtype == torch.bfloat16 and torch.equal(back.attn, c.attn)


@pytest.mark.parametrize("structure", ["random", "realistic"])
def test_analytics_on_half_rows_within_tolerance(structure):
    """Stated tolerance of float16 storage: μ and the mass tables to relative 2^-10 (+1e-7 absolute), the
    Rényi entropy of every valid head to 4·2^-11 ≈ 2e-3 absolute."""
    spans = PromptSpans.synthetic([40] * 6, query_len=12)
    extra = {"audit": list(range(*spans.query))}
    c32 = Capture.synthetic(spans, L=3, H_Q=8, G=2, extra_rows=extra, structure=structure, seed=3)
    c16 = Capture(attn=c32.attn.half(), row_pos=c32.row_pos, row_kind=c32.row_kind, head_group=c32.head_group,
                  vnorm_max=c32.vnorm_max, spans=spans, model_id="x")
    p32, p16 = HeadPooling()(c32), HeadPooling()(c16)
    assert p16.mu.dtype == torch.float64
    assert torch.allclose(p16.mu, p32.mu, rtol=2 ** -10, atol=1e-7)
    ok = p32.valid_head
    assert (p16.H[ok] - p32.H[ok]).abs().max() <= 4 * 2 ** -11
    m32, m16 = mass_table(c32.observer_attn(), spans), mass_table(c16.observer_attn(), spans)
    assert torch.allclose(m16, m32, rtol=2 ** -10, atol=1e-7)
    params = EntroPrefillParams(eps_row=0.3, target=0.2, streak=0, eps_audit=0.5)
    t32, t16 = trace(c32, params, certify=False), trace(c16, params, certify=False)
    assert [r["layer"] for r in t16.records] == [r["layer"] for r in t32.records]
    assert torch.allclose(t16.S, t32.S, rtol=1e-2, atol=1e-3, equal_nan=True)


def test_estimate_matches_the_rows_and_the_limit_refuses(model, caps, monkeypatch):
    c = caps["float32"]
    L, H, R, K = c.attn.shape
    mem = estimate_capture_bytes(L=L, H_Q=H, G=2, R=R, T=SPANS.T, n_decode=2, dtype="float16")
    assert mem.host_rows == caps["float16"].attn.numel() * 2
    full = estimate_capture_bytes(L=L, H_Q=H, G=2, R=R, T=SPANS.T, n_decode=2)
    assert full.host_rows == c.attn.numel() * 4 == 2 * mem.host_rows
    limit = full.host - 1
    with pytest.raises(ValueError, match=r"max_bytes: .*over the limit.*dtype='float16'"):
        run_capture(model, SPANS, RowSet(tail=6, n_decode=2), progress=False, max_bytes=limit)
    monkeypatch.setenv(ENV_MAX_BYTES, str(limit))
    assert max_capture_bytes() == limit
    with pytest.raises(ValueError, match="max_bytes"):
        run_capture(model, SPANS, RowSet(tail=6, n_decode=2), progress=False)
    ok = run_capture(model, SPANS, RowSet(tail=6, n_decode=2), progress=False, dtype="float16")  # fits
    assert torch.equal(ok.attn, caps["float16"].attn)
    monkeypatch.setenv(ENV_MAX_BYTES, "2K")
    assert max_capture_bytes() == 2048
    monkeypatch.setenv(ENV_MAX_BYTES, "lots")
    with pytest.raises(ValueError, match=ENV_MAX_BYTES):
        max_capture_bytes()
    with pytest.raises(ValueError, match="dtype"):
        estimate_capture_bytes(L=1, H_Q=1, G=1, R=1, T=4, dtype="float8")


def test_rows_leave_the_device_one_layer_at_a_time(model):
    """The recorder holds on the model's device at most one attention call's rows ``[H_Q, R, K]`` (float32);
    the ``[L, H_Q, R, K]`` rows live on the host."""
    rows = [p for _, p in RowSet(tail=6).rows(SPANS)]
    ids = torch.tensor([SPANS.input_ids])
    with torch.no_grad(), capture_attention(model, rows, K=SPANS.T, T=SPANS.T, dtype="float16") as rec:
        model(input_ids=ids)
    L, H, R, K = rec.attn.shape
    assert rec.attn.dtype == torch.float16 and rec.attn.device.type == "cpu"
    assert 0 < rec.device_peak_rows <= H * R * K * 4
    assert rec.device_peak_rows * L > rec.attn.numel() * rec.attn.element_size()


def test_colsum_accumulated_per_call_equals_direct(model):
    T = SPANS.T
    ids = torch.tensor([SPANS.input_ids])
    with torch.no_grad(), capture_attention(model, list(range(T)), K=T, T=T, colsum=True, colsum_tile=5) as rec:
        model(input_ids=ids)
    ref = rec.attn.double().sum(2)  # every prompt row captured: the column sums directly
    assert (rec.colsum - ref).abs().max() < 1e-5


def test_synthetic_research_structure():
    spans = PromptSpans.synthetic([64] * 8, query_len=16)
    cap = Capture.synthetic(spans, L=4, H_Q=8, G=2, extra_rows={"audit": list(range(*spans.query))},
                            structure="realistic", dtype="float16", seed=1)
    a = cap.attn.float()
    assert cap.attn.dtype == torch.float16
    assert torch.allclose(a.sum(-1), torch.ones(a.shape[:-1]), atol=1e-2)
    later = torch.arange(a.shape[-1])[None, :] > cap.row_pos[:, None]
    assert float(a[..., later].abs().max()) == 0.0  # causal
    sink = cap.sink_mass()
    assert 0.2 < float(sink.mean()) < 0.9 and float(sink.max()) > 0.5  # attention sinks, as in real models
    # locality: mean attention decreases with distance from the query (first 16 keys behind it vs far keys)
    u = int(cap.row_pos[0])
    near, far = a[:, :, 0, u - 16: u + 1].mean(), a[:, :, 0, spans.n_sink: u - 200].mean()
    assert near > 2 * far
    with pytest.raises(ValueError, match="structure"):
        Capture.synthetic(spans, structure="smooth")


def test_synthetic_large_is_drawn_per_layer_without_float64(monkeypatch):
    """Above 2^22 values (here: the threshold lowered) the generator draws one layer at a time in float32 and
    stores each in its dtype: the same rows whatever the dtype, up to its rounding."""
    spans = PromptSpans.synthetic([500] * 8, query_len=16)
    monkeypatch.setattr(syn, "_SMALL", 1)
    a = Capture.synthetic(spans, L=2, H_Q=4, G=2, seed=5).attn
    b = Capture.synthetic(spans, L=2, H_Q=4, G=2, seed=5, dtype="bfloat16").attn
    assert a.dtype == torch.float32 and torch.allclose(b.float(), a, rtol=2 ** -8, atol=1e-30)
    assert torch.allclose(a.sum(-1), torch.ones(a.shape[:-1]), atol=1e-5)
