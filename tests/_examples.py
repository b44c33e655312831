"""Hypothesis example counts per profile, chosen by ``WORKBENCH_HYPOTHESIS`` (``dev``, ``ci``, ``nightly``;
default ``ci``). ``tests/conftest.py`` registers and loads the profiles; a property test writes its count
for CI and gets the active profile's: ``@settings(max_examples=examples(2000), ...)``.

- ``ci`` (the default, ``make test``): every count as written (``examples(n) == n``), hypothesis's default
  of 100 where a test names none;
- ``dev``: a tenth, at least 10 (a quick local loop; not for a verdict);
- ``nightly``: five times the CI count (default 500).

The counts written in the SPEC property files of ``analyse/`` (``test_audit``, ``test_envelope``, ``test_pages``,
``test_pooling``, ``test_priorities``, ``test_selection``, ``test_shift``, ``test_stats``, ``test_streaming``) are a
quarter of those before the mutation run (``benchmarks/mutation.py``, RESULTS): on 108 sampled mutants of
those modules the quarter killed exactly the mutants the full counts killed (65), and none other.
"""
from __future__ import annotations

import os

PROFILE_ENV = "WORKBENCH_HYPOTHESIS"
DEFAULT_PROFILE = "ci"
# scale of the written (CI) count, the least count, hypothesis's default max_examples under the profile
PROFILES = {"dev": (0.1, 10, 10), "ci": (1.0, 1, 100), "nightly": (5.0, 1, 500)}


def profile_name() -> str:
    """The active profile (``$WORKBENCH_HYPOTHESIS``, default ``ci``); another name is refused."""
    name = os.environ.get(PROFILE_ENV, "").strip() or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}: must be one of {sorted(PROFILES)}, got {name!r}")
    return name


def examples(n: int) -> int:
    """``n`` (the CI count) scaled to the active profile: ``ci`` n, ``dev`` n/10 but at least min(n, 10), ``nightly`` 5n."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: must be an integer >= 1, got {n!r}")
    scale, least, _ = PROFILES[profile_name()]
    return max(min(n, least), round(n * scale))
