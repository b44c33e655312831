"""Memory of a capture, estimated before it runs, and the storage dtype of its rows (SPEC §1, at scale).

A capture holds ``attn [L, H_Q, R, K]`` on the host (``R`` rows, ``K = T + n_decode`` keys) in its
storage dtype (``float32``, or ``float16``/``bfloat16`` on request: rows are always computed in float32
and rounded once when stored). On the accelerator it needs, at any moment, only the rows of the attention
call being recorded (one layer: ``H_Q · R · K`` float32 values, plus the softmax's own temporary of the
same size) and, with H2O column sums, one query tile of ``H_Q · tile · T`` float32 values; the column sums
themselves (float64 ``[L, H_Q, T]``) live on the host.

:func:`estimate_capture_bytes` gives those figures; :func:`check_capture_budget` refuses a capture whose
host bytes exceed a limit (argument ``max_bytes``, else the environment variable
``WORKBENCH_CAPTURE_MAX_BYTES``), naming the figure and the storage dtype or row count that would fit.

Error of half-precision storage (rows are probabilities in ``[0, 1]``, rounded to nearest): the relative
error of each stored value is at most ``2^-11 ≈ 4.9e-4`` (float16, normal range ``≥ 6.1e-5``; below it the
absolute error is at most ``2^-25 ≈ 3e-8``) or ``2^-8 ≈ 3.9e-3`` (bfloat16). Every analytic reads rows
through a float32/float64 upcast, so a sum of stored values (a chunk mass, a residual mass) carries at
most the same relative error, and a squared sum (the collision ``C``) at most twice it; the Rényi entropy
``H = -ln C`` then moves by at most ``≈ 2 · 2^-11`` (float16) in absolute value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from workbench.checks import Choice, Interval, check_args, optional
from workbench.choices import ROW_DTYPES, RowDtype
from workbench.constraints import register_all

__all__ = ["CaptureMemory", "estimate_capture_bytes", "check_capture_budget", "row_dtype", "max_capture_bytes",
           "ENV_MAX_BYTES", "HALF_REL_ERROR"]

ENV_MAX_BYTES = "WORKBENCH_CAPTURE_MAX_BYTES"

HALF_REL_ERROR = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
"""Largest relative rounding error of one stored value (round to nearest, normal range)."""

CAPTURE_CHECKS = register_all("capture", {
    "dtype": Choice(ROW_DTYPES),
    "max_bytes": optional(Interval("int", 1)),
}, __name__)
"""The constraints of the capture's storage dtype and byte limit (registered as ``capture.<name>``)."""

_ONE, _ZERO = Interval("int", 1), Interval("int", 0)
ESTIMATE_CHECKS = register_all("estimate_capture_bytes", {
    "L": _ONE, "H_Q": _ONE, "G": _ONE, "R": _ZERO, "T": _ONE, "n_decode": _ZERO, "colsum_tile": _ONE,
    "hidden_layers": _ZERO, "hidden_size": _ZERO}, __name__)
"""The shape arguments of :func:`estimate_capture_bytes`."""

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def row_dtype(name: RowDtype) -> torch.dtype:
    """The torch dtype of a storage dtype name in ``ROW_DTYPES``."""
    return _TORCH[CAPTURE_CHECKS["dtype"].check("dtype", name)]


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class CaptureMemory:
    """Bytes a capture will need.

    Attributes:
        host_rows: ``L · H_Q · R · K · itemsize`` of the stored rows.
        host_other: value norms, hidden states and H2O column sums on the host.
        device_peak: the largest working set on the accelerator at one time (one layer's rows in float32,
            the softmax temporary, an H2O tile), beyond the model's own prefill.
        dtype: the storage dtype.
    """

    host_rows: int
    host_other: int
    device_peak: int
    dtype: RowDtype

    @property
    def host(self) -> int:
        return self.host_rows + self.host_other

    def describe(self) -> str:
        return (f"capture memory: host {_gib(self.host)} (rows {_gib(self.host_rows)} in {self.dtype}), "
                f"accelerator working set {_gib(self.device_peak)} (one layer at a time)")


def estimate_capture_bytes(*, L: int, H_Q: int, G: int, R: int, T: int, n_decode: int = 0, dtype: RowDtype = "float32",
                           colsum: bool = False, colsum_tile: int = 128, hidden_layers: int = 0,
                           hidden_size: int = 0) -> CaptureMemory:
    """Estimate the bytes of a capture before running it (see the module docstring for the layout).

    Args:
        L, H_Q, G: layers, query heads, KV heads.
        R: captured rows; ``T``: prompt length; ``n_decode``: decode steps (``K = T + n_decode``).
        dtype: storage dtype of the rows (``ROW_DTYPES``).
        colsum: H2O column sums (float64 ``[L, H_Q, T]`` on the host, tiles of ``colsum_tile`` queries).
        hidden_layers, hidden_size: number of stored block inputs (float32 ``[T, hidden_size]`` each).
    """
    check_args(ESTIMATE_CHECKS, locals())
    item = row_dtype(dtype).itemsize
    K = T + n_decode
    host_rows = L * H_Q * R * K * item
    other = L * G * 4 + hidden_layers * T * hidden_size * 4 + (L * H_Q * T * 8 if colsum else 0)
    layer_rows = H_Q * R * K * 4
    dev = 2 * layer_rows + (layer_rows // 2 if item < 4 else 0)  # fp32 rows + softmax temporary (+ the rounded copy)
    if colsum:
        dev = max(dev, 2 * H_Q * min(colsum_tile, T) * T * 4 + H_Q * T * 8)
    return CaptureMemory(host_rows=host_rows, host_other=other, device_peak=dev, dtype=dtype)


def max_capture_bytes(max_bytes: int | None = None) -> int | None:
    """The limit in force: ``max_bytes`` if given, else ``$WORKBENCH_CAPTURE_MAX_BYTES`` (an integer, or with
    a ``K``/``M``/``G`` suffix, powers of 1024), else no limit (``None``)."""
    if max_bytes is not None:
        return CAPTURE_CHECKS["max_bytes"].check("max_bytes", max_bytes)
    raw = os.environ.get(ENV_MAX_BYTES, "").strip()
    if not raw:
        return None
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(raw[-1].upper(), 1)
    num = raw[:-1] if mult > 1 else raw
    try:
        v = int(float(num) * mult)
    except ValueError:
        raise ValueError(f"{ENV_MAX_BYTES}: must be a byte count such as 8000000000 or 8G, got {raw!r}") from None
    if v < 1:
        raise ValueError(f"{ENV_MAX_BYTES}: must be >= 1 byte, got {raw!r}")
    return v


def check_capture_budget(mem: CaptureMemory, limit: int | None, *, R: int) -> None:
    """Refuse (``ValueError``) a capture whose host bytes exceed ``limit``, naming what would fit."""
    if limit is None or mem.host <= limit:
        return
    hints = []
    per_item = mem.host_rows // max(1, _TORCH[mem.dtype].itemsize)
    for name in ("float16", "bfloat16"):
        if _TORCH[name].itemsize < _TORCH[mem.dtype].itemsize and per_item * 2 + mem.host_other <= limit:
            hints.append(f"dtype='{name}' ({_gib(per_item * 2 + mem.host_other)})")
            break
    per_row = mem.host_rows // max(1, R)
    if per_row and limit > mem.host_other:
        fit = (limit - mem.host_other) // per_row
        if 0 < fit < R:
            hints.append(f"at most {fit} rows of {R} (fewer audit/tail/decode rows in the RowSet)")
    hint = "; would fit: " + " or ".join(hints) if hints else "; no storage option fits: raise the limit"
    raise ValueError(f"max_bytes: the capture needs {_gib(mem.host)} of host memory ({mem.host} bytes), over the "
                     f"limit {_gib(limit)} ({limit} bytes, from max_bytes or ${ENV_MAX_BYTES}){hint}")
