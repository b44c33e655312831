"""Tests of the streaming (tiled) collision statistic (SPEC §1)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from workbench.analyse.pooling import HeadPooling
from workbench.analyse.streaming import collision_direct, collision_streaming

PROP = settings(max_examples=examples(500), deadline=None, database=None)
seeds = st.integers(0, 2**32 - 1)


from _numeric import _single_thread_torch, assert_close  # noqa: E402,F401  (autouse fixture)


def np_collision(z):
    """Reference Σ_j A_j² with A = softmax(z) along the last axis (numpy, max-shifted)."""
    m = z.max(-1, keepdims=True)
    e = np.exp(z - m)
    A = e / e.sum(-1, keepdims=True)
    return (A**2).sum(-1)


@PROP
@given(K=st.integers(1, 80), tile_frac=st.floats(0.0, 1.0), seed=seeds)
def test_streaming_equals_direct_random(K, tile_frac, seed):
    """Random logits (scales 1e-3 … 1e3, offsets up to ±1e3, masked keys, sorted orders), tiles 1 … K+1."""
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 5))
    scale = float(rng.choice([1e-3, 1.0, 10.0, 100.0, 1e3]))
    offset = float(rng.uniform(-1e3, 1e3)) if rng.random() < 0.5 else 0.0
    mask_p = float(rng.choice([0.0, 0.0, 0.5, 0.95]))
    order = rng.choice(["random", "increasing", "decreasing"])
    z = offset + rng.standard_normal((B, K)) * scale
    z = np.clip(z, -1e3 - abs(offset), 1e3 + abs(offset))
    if order == "increasing":  # the running max changes in every tile: every old accumulator is rescaled
        z = np.sort(z, axis=-1)
    elif order == "decreasing":
        z = np.sort(z, axis=-1)[:, ::-1].copy()
    drop = rng.random((B, K)) < mask_p
    drop[np.arange(B), rng.integers(0, K, size=B)] = False  # at least one live key per row
    z[drop] = -np.inf
    tile = 1 + int(tile_frac * K)  # 1 … K+1 (a tile longer than K is one tile)
    ell, m, s, sum_sq = collision_streaming(torch.from_numpy(z), tile)
    ref = np_collision(z)
    assert_close(sum_sq.numpy(), ref, rtol=1e-10, atol=0)
    assert_close(collision_direct(torch.from_numpy(z)).numpy(), ref, rtol=1e-10, atol=0)
    # the accumulators themselves: m = max z, ℓ = Σ e^{z-m}, s = Σ e^{2(z-m)}
    zmax = z.max(-1)
    assert np.array_equal(m.numpy(), zmax)
    assert_close(ell.numpy(), np.exp(z - zmax[:, None]).sum(-1), rtol=1e-12)
    assert_close(s.numpy(), np.exp(2 * (z - zmax[:, None])).sum(-1), rtol=1e-12)
    assert (ell.numpy() >= 1.0).all() and (s.numpy() >= 1.0).all()  # the max key contributes 1
    assert (sum_sq.numpy() >= 1.0 / K * (1 - 1e-12)).all() and (sum_sq.numpy() <= 1 + 1e-12).all()


@PROP
@given(
    z=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9),
        elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
    ),
    tile=st.integers(1, 12),
)
def test_streaming_equals_direct_adversarial(z, tile):
    """Hypothesis-chosen logits (ties, ±1e3 extremes, mixed magnitudes), every tile size 1..12."""
    *_, sum_sq = collision_streaming(torch.from_numpy(z), tile)
    ref = np_collision(z)
    assert sum_sq.shape == z.shape[:-1]
    assert_close(sum_sq.numpy(), ref, rtol=1e-10, atol=0)


@settings(max_examples=examples(75), deadline=None, database=None)  # every tile size 1..K per example: ≈ 7000 cases
@given(K=st.integers(1, 48), seed=seeds, scale=st.sampled_from([0.1, 5.0, 1e3]))
def test_all_tile_sizes_agree(K, seed, scale):
    rng = np.random.default_rng(seed)
    z = torch.from_numpy(rng.standard_normal((2, K)) * scale)
    ref = np_collision(z.numpy())
    for tile in range(1, K + 1):
        assert_close(collision_streaming(z, tile)[3].numpy(), ref, rtol=1e-10, atol=0)


def test_leading_shape_layers_heads_rows():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(3, 4, 2, 300, generator=g, dtype=torch.float64) * 50
    z[..., 200:] = -math.inf  # causal mask
    ell, m, s, sum_sq = collision_streaming(z, 64)
    assert ell.shape == m.shape == s.shape == sum_sq.shape == (3, 4, 2)
    assert_close(sum_sq.numpy(), np_collision(z[..., :200].numpy()), rtol=1e-10)


def test_known_values():
    # uniform over n live keys: Σ A² = 1/n; two keys with logits 0, ln 3: A = (1/4, 3/4) → 10/16
    z = torch.tensor([[0.0, 0.0, 0.0, 0.0, -math.inf], [0.0, math.log(3.0), -math.inf, -math.inf, -math.inf]],
                     dtype=torch.float64)
    for tile in (1, 2, 5):
        assert_close(collision_streaming(z, tile)[3].numpy(), [0.25, 10 / 16], rtol=1e-14)
    # magnitudes that overflow a naive exp: e^{1000} = inf in float64
    z = torch.tensor([[1000.0, 1000.0 - math.log(3.0)]], dtype=torch.float64)
    assert_close(collision_streaming(z, 1)[3].numpy(), [10 / 16], rtol=1e-12)  # 1000 - ln 3 is rounded


def test_non_sink_collision_matches_pooling():
    """Masking the sinks with -inf gives the non-sink collision C_h of SPEC §2 (single observer row)."""
    g = torch.Generator().manual_seed(5)
    n_sink, T = 4, 50
    z = torch.randn(2, 3, 1, T, generator=g, dtype=torch.float64) * 3
    A = torch.softmax(z, dim=-1)
    pooled = HeadPooling().pool(A, torch.zeros(3, dtype=torch.int64), n_sink)
    zm = z[:, :, 0, :].clone()
    zm[..., :n_sink] = -math.inf
    assert_close(collision_streaming(zm, 7)[3].numpy(), pooled.C.numpy(), rtol=1e-10)


def test_fully_masked_row_and_empty_key_axis():
    z = torch.full((2, 5), -math.inf, dtype=torch.float64)
    z[1, 2] = 3.0
    ell, m, s, sum_sq = collision_streaming(z, 2)
    assert m[0] == -math.inf and ell[0] == 0 and s[0] == 0 and math.isnan(sum_sq[0])
    assert sum_sq[1] == 1.0 and m[1] == 3.0
    assert math.isnan(collision_streaming(torch.zeros(1, 0, dtype=torch.float64), 3)[3][0])


@pytest.mark.parametrize("tile", [0, -1, 1.5, True, "2"])
def test_tile_validation(tile):
    with pytest.raises(ValueError, match="tile: must be an integer >= 1"):
        collision_streaming(torch.zeros(3), tile)


def test_logit_validation():
    with pytest.raises(ValueError, match="z: must not contain NaN"):
        collision_streaming(torch.tensor([0.0, math.nan]), 1)
    with pytest.raises(ValueError, match=r"z: must not contain \+inf"):
        collision_direct(torch.tensor([0.0, math.inf]))
    with pytest.raises(ValueError, match="z: must have a key axis"):
        collision_streaming(torch.tensor(1.0), 1)
