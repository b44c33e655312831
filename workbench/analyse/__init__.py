"""Analyse: pure functions of a capture and parameters, no model calls (SPEC §2–§9).

``params`` (§2–§6 parameters), ``pooling`` (§2), ``priorities`` (§3), ``envelope`` (§4), ``selection`` (§5),
``audit`` (§6 bound), ``procedure`` (§5–§6 the 7-step decision), ``streaming`` (§1 streaming collision), ``pages`` (§8), ``shift`` (§9), ``cost`` (§7 cost),
``ranking`` (shared top-k)."""
