"""Study: sweeps over task items and methods, their scoring, and the headless report.

Importing the package registers the methods ``full``, ``entroprefill`` and ``evict``
(:mod:`workbench.study.methods`).
"""
from workbench.study import methods as methods  # noqa: F401  (registers the sweep methods)
