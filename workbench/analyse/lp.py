"""The one place that calls HiGHS directly, through its public Python wheel ``highspy``.

The LP certificate of one layer (SPEC §5, :func:`workbench.analyse.selection.lp_certificate_status`) has 8 or so
variables; ``linprog(method="highs")`` spends ~1.7 ms on it, almost all in its input checks and conversions
around the solver, and an ``ε_row`` slider move solves one LP per monitored layer (29 on the default model:
~50 ms of a move). :func:`highs_row_duals` hands the same LP to HiGHS (the solver ``linprog`` wraps) through
``highspy``'s public ``Highs`` class for ~0.35 ms; ``tests/test_selection.py`` checks the statuses and the
certified values against ``linprog``'s on random LPs.
"""
from __future__ import annotations

import os
import sys
import threading

import highspy
import numpy as np

_SOLVERS = threading.local()  # one solver per thread, cleared before each LP


def _solver() -> highspy.Highs:
    """This thread's HiGHS, reset to a fresh solver's state (model, solution and options)."""
    h = getattr(_SOLVERS, "highs", None)
    if h is None:
        h = _SOLVERS.highs = _quiet_highs()
    h.clear()
    h.setOptionValue("output_flag", False)
    return h


def _quiet_highs() -> highspy.Highs:
    """A new ``highspy.Highs`` without its licence banner: the first one a process builds prints it on the C
    stdout before any option can turn output off, and a slider's first move should print nothing."""
    sys.stdout.flush()
    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        saved = os.dup(fd)
    except (OSError, ValueError):  # no file descriptor to silence (an embedded interpreter): banner and all
        return highspy.Highs()
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), fd)
            return highspy.Highs()
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def highs_row_duals(c: np.ndarray, A_ub: np.ndarray, b_ub: np.ndarray) -> tuple[np.ndarray | None, str]:
    """``min c·x  s.t.  A_ub x <= b_ub,  0 <= x <= 1`` by HiGHS (dense ``A_ub`` ``[rows, k]``).

    Returns ``(row duals [rows], "optimal")``, the duals ``<= 0`` as ``linprog``'s ``ineqlin.marginals``, or
    ``(None, "failed: HiGHS status <status>; trivial bound U = N used")``. The solver is cleared before each call
    (as ``linprog`` makes a new one), so a solution never depends on an earlier one; the options are HiGHS's defaults, as
    ``linprog(method="highs")`` leaves them.
    """
    A_ub = np.ascontiguousarray(A_ub, dtype=np.float64)
    rows, k = A_ub.shape
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = k, rows
    lp.col_cost_ = np.ascontiguousarray(c, dtype=np.float64)
    lp.col_lower_, lp.col_upper_ = np.zeros(k), np.ones(k)
    lp.row_lower_ = np.full(rows, -highspy.kHighsInf)
    lp.row_upper_ = np.ascontiguousarray(b_ub, dtype=np.float64)
    a = lp.a_matrix_
    a.num_col_, a.num_row_ = k, rows
    a.format_ = highspy.MatrixFormat.kColwise
    a.start_ = np.arange(0, (k + 1) * rows, rows, dtype=np.int32)
    a.index_ = np.tile(np.arange(rows, dtype=np.int32), k)
    a.value_ = A_ub.T.ravel()
    h = _solver()
    if h.passModel(lp) == highspy.HighsStatus.kError:
        return None, "failed: HiGHS refused the model; trivial bound U = N used"
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        return None, f"failed: HiGHS status {h.modelStatusToString(status)}; trivial bound U = N used"
    return np.asarray(h.getSolution().row_dual, dtype=np.float64), "optimal"
