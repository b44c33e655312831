"""The one place that calls scipy's bundled HiGHS below :func:`scipy.optimize.linprog`.

The LP certificate of one layer (SPEC §5, :func:`workbench.analyse.selection.lp_certificate_status`) has 8 or so
variables; ``linprog(method="highs")`` spends ~1.7 ms on it, almost all in its input checks and conversions
around the solver, and an ``ε_row`` slider move solves one LP per monitored layer (29 on the default model:
~50 ms of a move). :func:`highs_row_duals` hands the same LP to the same solver (scipy's own HiGHS build,
``scipy.optimize._highspy._core``, the object ``linprog`` itself creates) for ~0.35 ms. That module is private
to scipy (since 1.15): if it moves, this import fails loudly, and ``tests/test_selection.py`` checks the statuses
and the certified values against ``linprog``'s on random LPs.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize._highspy import _core as _highs  # scipy >= 1.15 (pyproject)


def highs_row_duals(c: np.ndarray, A_ub: np.ndarray, b_ub: np.ndarray) -> tuple[np.ndarray | None, str]:
    """``min c·x  s.t.  A_ub x <= b_ub,  0 <= x <= 1`` by HiGHS (dense ``A_ub`` ``[rows, k]``).

    Returns ``(row duals [rows], "optimal")``, the duals ``<= 0`` as ``linprog``'s ``ineqlin.marginals``, or
    ``(None, "failed: HiGHS status <status>; trivial bound U = N used")``. A new solver per call (as ``linprog``
    makes one), so a solution never depends on an earlier one; the options are HiGHS's defaults, as
    ``linprog(method="highs")`` leaves them.
    """
    A_ub = np.ascontiguousarray(A_ub, dtype=np.float64)
    rows, k = A_ub.shape
    lp = _highs.HighsLp()
    lp.num_col_, lp.num_row_ = k, rows
    lp.col_cost_ = np.ascontiguousarray(c, dtype=np.float64)
    lp.col_lower_, lp.col_upper_ = np.zeros(k), np.ones(k)
    lp.row_lower_ = np.full(rows, -_highs.kHighsInf)
    lp.row_upper_ = np.ascontiguousarray(b_ub, dtype=np.float64)
    a = lp.a_matrix_
    a.num_col_, a.num_row_ = k, rows
    a.format_ = _highs.MatrixFormat.kColwise
    a.start_ = np.arange(0, (k + 1) * rows, rows, dtype=np.int32)
    a.index_ = np.tile(np.arange(rows, dtype=np.int32), k)
    a.value_ = A_ub.T.ravel()
    h = _highs._Highs()
    h.setOptionValue("output_flag", False)
    if h.passModel(lp) == _highs.HighsStatus.kError:
        return None, "failed: HiGHS refused the model; trivial bound U = N used"
    h.run()
    status = h.getModelStatus()
    if status != _highs.HighsModelStatus.kOptimal:
        return None, f"failed: HiGHS status {h.modelStatusToString(status)}; trivial bound U = N used"
    return np.asarray(h.getSolution().row_dual, dtype=np.float64), "optimal"
