"""``benchmarks/gpu.py`` runs end to end on the CPU (its 2-layer smoke version, small T): every measurement
of the GPU script is exercised here, so the GPU run does not meet its first bug on the GPU."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import gpu  # noqa: E402


def test_gpu_benchmark_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--T", "192", "--reps", "1", "--steps", "2", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["meta"]["smoke"] is True and "not GPU numbers" in d["meta"]["note"]
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
    """``benchmarks/eviction_scale.py`` (issue 14: eviction memory at the 8B shape) at a small T: the compacted
    cache holds exactly ``B = T/4`` positions per layer and KV head (``2·L·G·d·4·B`` bytes)."""
    import eviction_scale

    out = tmp_path / "ev.json"
    assert eviction_scale.main(["--T", "512", "--steps", "2", "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert (r["L"], r["H_Q"], r["G"], r["d"], r["budget"]) == (2, 32, 8, 128, 128)
    assert r["kv_bytes_b25"] == r["kv_bytes_b25_formula"] == 2 * 2 * 8 * 128 * 4 * 128
    assert r["kv_bytes_full"] == 2 * 2 * 8 * 128 * 4 * 512 and r["kv_ratio"] == 0.25
