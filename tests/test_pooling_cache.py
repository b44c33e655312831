"""The pooling cache a panel owns (``analyse.pooling.PoolingCache``): results equal to the uncached pooling
(the oracle: ``HeadPooling.pool`` on the observer rows), reuse only at the same (ζ, τ, ρ_min), and no
parameter-keyed state left on the capture."""
from __future__ import annotations

import pytest
import torch

from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.pooling import HeadPooling, PoolingCache
from workbench.analyse.procedure import trace
from workbench.capture.data import Capture, PromptSpans
from workbench.show import widgets as Wd


def _capture(seed: int = 0) -> Capture:
    sp = PromptSpans.synthetic([8, 6, 9, 7, 5], prefix=6, query_len=10, answer_doc=2)
    return Capture.synthetic(sp, L=3, H_Q=4, G=2, seed=seed, extra_rows={"audit": list(range(*sp.query))})


def _oracle(cap: Capture, p: HeadPooling):
    return p.pool(cap.observer_attn(), cap.head_group, cap.spans.n_sink)


SETTINGS = [HeadPooling(0.5, 1.0), HeadPooling(0.2, 0.05), HeadPooling(0.5, 1.0, 1e-3), HeadPooling(1.0, 3.0),
            HeadPooling(0.2, 0.05), HeadPooling(0.7, 0.5), HeadPooling(0.3, 0.3), HeadPooling(0.5, 1.0)]


def test_cached_pooling_equals_the_uncached_one():
    cap = _capture()
    cache = PoolingCache(cap, size=2)
    for p in SETTINGS:
        got, want = cache(p), _oracle(cap, p)
        # μ from the cached Σ_h v_h a_h differs from the direct product in the last bits only
        assert torch.equal(got.w, want.w) and torch.equal(got.valid, want.valid)
        torch.testing.assert_close(got.mu, want.mu, rtol=1e-12, atol=1e-15)
        assert (got.zeta, got.tau, got.rho_min) == (p.zeta, p.tau, p.rho_min)
        assert p(cap, cache) is got and torch.equal(p(cap).mu, got.mu)  # with or without a cache: the same bits
    assert len(cache._results) == 2  # the last `size` settings only


def test_the_same_setting_is_reused_and_another_is_not():
    cap = _capture()
    cache = PoolingCache(cap)
    a = cache(HeadPooling(0.3, 0.5))
    assert cache(HeadPooling(0.3, 0.5)) is a and cache(HeadPooling(0.3, 0.6)) is not a
    assert cache(HeadPooling(0.3, 0.5, 1e-3)) is not a


def test_a_cache_serves_only_its_capture():
    cache = PoolingCache(_capture(0))
    with pytest.raises(ValueError, match="capture: a PoolingCache serves the capture it was made for"):
        HeadPooling()(_capture(1), cache)
    with pytest.raises(ValueError, match="size"):
        PoolingCache(_capture(0), size=0)


def test_trace_with_a_cache_equals_trace_without():
    cap = _capture()
    cache = PoolingCache(cap)
    for p in (EntroPrefillParams(), EntroPrefillParams(zeta=0.2, tau=0.3), EntroPrefillParams()):
        a, b = trace(cap, p, pooling_cache=cache), trace(cap, p)
        assert a.to_frame().equals(b.to_frame()) and a.decision == b.decision


def _parameter_keyed(cap: Capture) -> list:
    return [k for k in cap._derived if not isinstance(k, str) and k[0] != "audit_chunk_mass"]


def test_panels_keep_no_parameter_keyed_state_on_the_capture():
    """Slider moves of the heads and priority panels leave only parameter-free quantities on the capture; the
    pooling results live in the panel's own cache (a new capture: a new cache)."""
    cap = _capture()
    heads = Wd.HeadsPanel(cap)
    for z in (0.2, 0.3, 0.4):
        heads.controls["zeta"].value = z
    prio = Wd.PriorityPanel(cap)
    prio.controls["zeta"].value = 0.25
    assert _parameter_keyed(cap) == [] and not any(k.startswith("pool") for k in cap._derived if isinstance(k, str))
    assert heads.pooling_cache is not prio.pooling_cache and heads.pooling_cache.capture is cap
    assert (0.4, heads.controls["tau"].value, 1e-6, cap.spans.n_sink) in heads.pooling_cache._results
    new = _capture(1)
    heads.set_capture(new)
    assert heads.pooling_cache.capture is new
