"""A frame as a markdown table (floats to three decimals): the study's summaries and ``benchmarks/``' tables."""
from __future__ import annotations

import pandas as pd

__all__ = ["markdown"]


def markdown(df: pd.DataFrame) -> str:
    """``df`` as a GitHub markdown table, floats with three decimals."""
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)
