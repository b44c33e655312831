"""The one check of attention rows where they enter the analysis (SPEC §1).

An attention row ``A^{l,h}_{u,·}`` is a probability vector over the keys: finite, non-negative, and
summing to 1, or to less than 1 for models with a learned sink outside the keys (gpt-oss style) and
for a decode row restricted to the prompt keys. A row that sums to more than ``1 + tol``, holds a NaN,
an infinity or a negative value, or is all zeros is not attention: every analytic would turn it into
finite-looking but meaningless numbers (a NaN row pooled into weights, an all-zero row into a
"bypass" with NaN cells). :func:`check_rows` refuses such rows and names the layer, head and row;
:func:`check_capture_rows` checks a whole capture once and caches the verdict on it, so sliders that
re-run the analytics pay nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = ["check_rows", "check_capture_rows", "row_sum_tol"]


def row_sum_tol(dtype: torch.dtype) -> float:
    """Slack on ``Σ_j A_{u,j} <= 1``: rounding of the stored probabilities (fp32/fp64: ``1e-4``; half
    precision, whose elements carry a relative error up to ``2^-8``: ``1e-2``)."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 1e-2


def _where(idx: tuple[int, ...], dims: tuple[str, ...]) -> str:
    return ", ".join(f"{d} {i}" for d, i in zip(dims, idx))


def check_rows(A, name: str = "A", *, dims: tuple[str, ...] | None = None, layer: int | None = None,
               tol: float | None = None) -> None:
    """Refuse anything in ``A [..., R, K]`` that is not a set of attention rows.

    Args:
        A: rows over the keys, e.g. ``[L, H_Q, R, K]``, ``[H_Q, W, T]`` or ``[L, H_Q, W, T]``.
        name: the parameter named in the error.
        dims: names of the leading axes (default ``layer, head, row`` for 4-d, ``head, row`` for 3-d).
        layer: the layer of a single-layer ``A`` (named in the error).
        tol: slack on the row sum (default :func:`row_sum_tol` of the dtype).

    Raises:
        ValueError: ``"<name>: not attention rows: <what> at layer l, head h, row r"``.
    """
    A = torch.as_tensor(A)
    if not A.dtype.is_floating_point:
        raise ValueError(f"{name}: attention rows must be a floating-point tensor, got {A.dtype}")
    if A.dim() < 2:
        raise ValueError(f"{name}: attention rows must have shape [..., R, K], got {list(A.shape)}")
    if A.numel() == 0:
        return
    tol = row_sum_tol(A.dtype) if tol is None else tol
    # [..., R]; a float32 sum (float64 for float64 rows): its rounding (~1e-6 over thousands of keys) is far
    # below the tolerance, and it is ~20x faster than converting the rows to float64
    s = A.sum(-1, dtype=torch.float64 if A.dtype == torch.float64 else torch.float32)
    problems = (
        (~torch.isfinite(s), "a NaN or infinite value"),
        (A.amin(-1) < 0, "a negative value"),
        (s > 1.0 + tol, f"a row sum above 1 (+{tol:g})"),
        (s <= 0, "an all-zero row"),
    )
    for bad, what in problems:
        if bool(bad.any()):
            idx = tuple(int(i) for i in torch.nonzero(bad)[0])
            d = dims or (("layer", "head", "row") if A.dim() == 4 else ("head", "row") if A.dim() == 3 else
                         tuple(f"axis {i}" for i in range(A.dim() - 2)) + ("row",))
            where = _where(idx, d[-len(idx):])
            if layer is not None and "layer" not in d:
                where = f"layer {layer}, " + where
            extra = f" (sum {float(s[idx]):.6g})" if "sum" in what else ""
            raise ValueError(f"{name}: not attention rows: {what}{extra} at {where}; rows must be finite, "
                             f">= 0 and sum to at most 1 (+{tol:g})")


def check_capture_rows(capture: Capture) -> None:
    """:func:`check_rows` on every row of a capture (``attn [L, H_Q, R, K]``), once: the verdict is
    cached on the capture (``capture.clear_cache()`` after editing its rows in place). A hybrid's capture (layers
    without attention rows, ``Capture.softmax_layers``) is refused, naming those layers."""
    if hasattr(capture, "require_all_layers"):
        capture.require_all_layers("the analysis")
    if hasattr(capture, "cached"):
        capture.cached("rows_checked", lambda: check_rows(capture.attn, "capture.attn") or True)
    else:
        check_rows(capture.attn, "capture.attn")
