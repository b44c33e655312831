"""Top-k membership with the lower-position tie rule (workbench.ranking), used by SPEC §8 keep sets and §9 recall."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from workbench.pages import keep_sets
from workbench.ranking import topk_mask


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 40), k=st.integers(1, 40), levels=st.integers(1, 4))
def test_topk_mask_equals_stable_sort(seed, T, k, levels):
    """With many ties (a few value levels) the mask is exactly the first k of a stable descending sort."""
    k = min(k, T)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (3, 4, T), generator=g).to(torch.float64)
    want = torch.zeros(x.shape, dtype=torch.bool)
    want.scatter_(-1, torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k], True)
    got = topk_mask(x, k)
    assert torch.equal(got, want)
    assert torch.equal(keep_sets(x, k), want)
    assert (got.sum(-1) == k).all()
