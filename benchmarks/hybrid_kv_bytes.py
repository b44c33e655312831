"""The KV bytes an eviction saves on a hybrid and on a dense model at the same budget fraction (no timing: the bytes
are counted on the cache, so the numbers do not depend on the machine).

Two tiny random-weight models of one geometry (``--layers`` layers, 4 query heads, 2 KV heads, head size 16, fp32): a
Qwen3-Next hybrid with one softmax layer in four (its released pattern, ``full_attention_interval = 4``) and a dense
Qwen3. Each prefills the same random prompt of ``T`` tokens and SnapKV evicts to ``B = ⌈frac·T⌉`` prompt positions.
Printed and written to ``--out`` per model: the evictable KV bytes before and after (the softmax layers' keys and
values), the recurrent and convolution state (fixed-size, not evictable), and the bytes saved as a share of the KV and
of the whole cache. The same shares at a released geometry follow from its config alone (``--config-scale``): the
softmax layers' per-token KV ``2·e·G·d·L_softmax``, against the dense ``2·e·G·d·L``.

Run: ``python benchmarks/hybrid_kv_bytes.py [--T 256] [--frac 0.25] [--layers 8] [--out benchmarks/out/hybrid_kv_bytes.json]``.
"""
from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path

import _harness as harness
import torch

from workbench.rerun.eviction import SnapKV, generate_with_policy
from workbench.run import layer_roles
from workbench.run.models import tiny_model


def measure(model_type: str, L: int, T: int, frac: float, **cfg) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_model(model_type, L=L, H_Q=4, G=2, d=16, seed=0, **cfg)
    ids = torch.randint(0, m.config.vocab_size, (T,), generator=torch.Generator().manual_seed(0)).tolist()
    B = math.ceil(frac * T)
    r = generate_with_policy(m, ids, SnapKV(), B, 2, progress=False)
    saved = r.kv_bytes_before - r.kv_bytes_after
    total = r.kv_bytes_before + r.kv_bytes_state
    return {"model": model_type, "layers": L, "softmax_layers": len(layer_roles.evictable_layers(m)), "T": T,
            "budget": B, "kv_bytes_before": r.kv_bytes_before, "kv_bytes_after": r.kv_bytes_after,
            "state_bytes": r.kv_bytes_state, "saved_bytes": saved, "saved_of_kv": saved / r.kv_bytes_before,
            "saved_of_cache": saved / total}


def config_scale(frac: float, T: int) -> list[dict]:
    """Per-token KV bytes and the share saved at ``frac``, from the default (released) configs of transformers: the
    hybrid's softmax layers only, against a dense model of the same attention geometry in every layer."""
    from transformers import AutoConfig

    c = AutoConfig.for_model("qwen3_next")  # Qwen3-Next-80B-A3B's defaults
    soft = sum(1 for t in c.layer_types if t == "full_attention")
    per = 2 * 2 * c.num_key_value_heads * c.head_dim  # bf16
    out = []
    for name, layers in (("qwen3_next (softmax layers)", soft), ("dense, same attention in every layer", len(c.layer_types))):
        kv = per * layers * T
        out.append({"model": name, "layers": layers, "kv_bytes_per_token": per * layers, "kv_bytes_at_T": kv,
                    "saved_bytes_at_frac": kv - per * layers * math.ceil(frac * T)})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--frac", type=float, default=0.25)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "hybrid_kv_bytes.json")
    a = ap.parse_args(argv)
    L = a.layers
    rows = [measure("qwen3_next", L, a.T, a.frac,
                    layer_types=["full_attention" if (l + 1) % 4 == 0 else "linear_attention" for l in range(L)]),
            measure("qwen3", L, a.T, a.frac)]
    for r in rows:
        print(f"{r['model']:>10}: {r['softmax_layers']}/{r['layers']} softmax layers, T={r['T']}, B={r['budget']}: "
              f"KV {r['kv_bytes_before']:,} -> {r['kv_bytes_after']:,} B (saved {r['saved_bytes']:,} B, "
              f"{r['saved_of_kv']:.1%} of the KV); state {r['state_bytes']:,} B not evictable; saved "
              f"{r['saved_of_cache']:.1%} of the whole cache")
    scale = config_scale(a.frac, 32768)
    for r in scale:
        print(f"config scale, T=32768 bf16: {r['model']}: {r['kv_bytes_per_token']:,} B/token, saves "
              f"{r['saved_bytes_at_frac'] / 2**20:,.0f} MiB at frac {a.frac}")
    harness.write_json(a.out, {"measured": rows, "config_scale": scale}, T=a.T, frac=a.frac, layers=L)


if __name__ == "__main__":
    main()
