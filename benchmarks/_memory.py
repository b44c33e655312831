"""Peak resident memory of a block of code, sampled from ``/proc/self/statm`` by a background thread.

``ru_maxrss`` only ever grows, so a prefill whose peak lies below the earlier peak of loading the model
shows up as 0; sampling the current RSS while the code runs measures the block itself.
"""
from __future__ import annotations

import os
import threading
import time

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class PeakRSS:
    """``with PeakRSS() as m: ...`` then ``m.extra_mib`` = peak RSS during the block − RSS before it."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s = interval_s
        self.base = self.peak = 0
        self._stop = threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval_s)

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.base) / 2**20
