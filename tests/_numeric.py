"""Shared helpers of the numeric property tests (pooling, priorities, envelope, streaming)."""
from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread_torch():
    """These tests use tiny tensors: run torch single-threaded (OpenMP hand-offs dominate and stall
    badly on a busy 2-core machine), and restore the setting afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def assert_close(actual, desired, rtol=1e-7, atol=0.0):
    """Fast elementwise |actual - desired| <= atol + rtol |desired| (equal infinities and NaNs pass)."""
    a = np.asarray(actual, dtype=np.float64)
    d = np.asarray(desired, dtype=np.float64)
    if a.shape != d.shape and a.size != 1 and d.size != 1:
        raise AssertionError(f"shape mismatch: {a.shape} vs {d.shape}")
    a, d = np.broadcast_arrays(a, d)
    with np.errstate(invalid="ignore"):
        ok = (a == d) | (np.abs(a - d) <= atol + rtol * np.abs(d)) | (np.isnan(a) & np.isnan(d))
    if not ok.all():
        i = np.argwhere(~ok)[0]
        raise AssertionError(f"{(~ok).sum()} mismatches; first at {tuple(i)}: {a[tuple(i)]!r} vs {d[tuple(i)]!r} "
                             f"(rtol={rtol}, atol={atol})")
