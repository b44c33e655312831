"""The glossary: one table of the notation (symbol, name, meaning, SPEC section, allowed range).

:data:`SYMBOLS` is the one table. ``docs/notation.md`` is generated from it (:func:`markdown`;
``python -m workbench.show.notation`` rewrites the file, ``tests/test_notation.py`` checks it is up to
date), and every control of every panel takes its tooltip from it (:func:`tooltip`, keyed by the control's
name). The allowed range of a parameter comes from its constraint object (:data:`workbench.constraints.PARAMS`,
the same object that checks it), so the glossary, the tooltip and the error message cannot disagree.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from workbench.analyse.counterexample import ShallowCounterexample
from workbench.constraints import PARAMS
from workbench.rerun.eviction.policies.deferkv import DeferKV
from workbench.util import atomic_write_bytes

__all__ = ["Symbol", "SYMBOLS", "CONTROLS", "tooltip", "symbol", "markdown", "write_markdown", "DOC_PATH"]

OWNERS = (ShallowCounterexample, DeferKV)  # importing them registers the qualified keys named below

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "notation.md"


@dataclass(frozen=True)
class Symbol:
    """One row of the glossary. ``param``: the key of its constraint in ``PARAMS`` (the allowed range is
    ``PARAMS[param].describe()``); ``range``: the range in words for what has no constraint (derived
    quantities, capture-dependent bounds); ``controls``: the panel controls it is the tooltip of."""

    symbol: str
    name: str
    meaning: str
    spec: str
    param: str | None = None
    range: str = ""
    controls: tuple[str, ...] = ()

    def allowed(self) -> str:
        if self.param is not None:
            text = PARAMS[self.param].describe()
            return text + (f"; {self.range}" if self.range else "")
        return self.range or "—"


SYMBOLS: tuple[Symbol, ...] = (
    # ---- the model and the prompt (§0)
    Symbol("L, H_Q, G, r", "model shape", "decoder layers, query heads, KV heads (groups), query heads per group "
           "r = H_Q / G; head h reads KV head g(h) = h // r", "§0", range="from the model"),
    Symbol("T", "prompt length", "token positions 0 … T−1", "§0", range="≥ 1"),
    Symbol("l", "layer", "the decoder layer shown", "§0", param="layer", range="≤ L − 1",
           controls=("layer",)),
    Symbol("𝒮, n_sink", "sinks", "the first n_sink positions; pooling measures the residual mass off them; "
           "'exclude sinks' leaves them unshaded and out of the colour range", "§0", param="n_sink",
           controls=("exclude_sinks",)),
    Symbol("c_i, k, n_i, N", "candidate chunks", "the k disjoint token spans that may be removed (one per passage), "
           "n_i = |c_i|, N = Σ n_i", "§0", range="k ≥ 0"),
    Symbol("𝒬_p, W_p", "proposal observers", "the W_p positions at the end of the user query whose attention "
           "proposes the removal; a^{l,h}_j their mean attention", "§0", param="W_p"),
    Symbol("A^{l,h}_{u,j}", "attention", "the softmax probability of query u on key j in layer l, head h, as the "
           "model computes it; the token view shades each token by one row of it, on a linear, log₁₀ or quantile "
           "colour scale (by default quantile from 2,048 tokens, else linear)", "§0", range="[0, 1]", controls=("source", "query", "scale")),
    # ---- pooling (§2)
    Symbol("z_h", "residual mass", "a head's attention mass off the sinks; invalid when z_h ≤ ρ_min", "§2",
           range="[0, 1]"),
    Symbol("ρ_min", "validity floor", "residual or document mass at or below it makes a head or layer invalid",
           "§2", param="rho_min"),
    Symbol("H_h", "head entropy", "non-sink Rényi-2 entropy −ln Σ ã²: low for a sharp head", "§2",
           range="[0, ln(T − |𝒮|)]", controls=("quantity",)),
    Symbol("τ", "temperature", "temperature of the within-group softmax of −H_h: small τ gives the sharpest head "
           "the group's weight", "§2", param="tau", controls=("tau",)),
    Symbol("ζ", "group floor", "the share of each KV group's weight spread evenly over its r heads: "
           "w_h = ζ/r + (1 − ζ) v_h; ζ = 1 gives uniform weights", "§2", param="zeta", controls=("zeta",)),
    Symbol("w_h", "head weight", "the pooling weight of head h; Σ_{h∈g} w_h = 1, w_h ≥ ζ/r", "§2",
           range="[ζ/r, 1]"),
    Symbol("μ^l", "pooled measure", "the pooled observer attention of layer l, Σ_h w_h a^h / G; sums to 1", "§2",
           range="[0, 1] per position"),
    # ---- priorities (§3)
    Symbol("ε_s", "smoothing", "null-prior smoothing of a chunk's likelihood ratio ℓ_i", "§3", param="eps_s",
           controls=("eps_s",)),
    Symbol("λ", "concentration weight", "weight of the concentration κ_i in the priority S_i = ln ℓ_i + λ κ_i",
           "§3", param="lam", controls=("lam",)),
    Symbol("S_i, ℓ_i, κ_i", "chunk priority", "priority of chunk i (low: removed first), its likelihood ratio "
           "against the uniform null and its concentration in [0, 1]", "§3", range="S_i real"),
    Symbol("priority", "priority rule", "what orders the greedy: S_i, mass only (λ = 0), chunk order, seeded "
           "random, or the per-head max", "§3", param="priority", controls=("priority",)),
    # ---- envelope and selection (§4, §5)
    Symbol("q, η", "discarded mass", "q = μ^l(E) the pooled mass of a removal E; η = A_u(E) a row's; the "
           "envelope bounds η by q", "§4", range="[0, 1]"),
    Symbol("target, B_s", "saving target", "tokens to remove, as a fraction of the N candidate tokens (or a "
           "number of tokens, target_tokens)", "§5", param="target", controls=("target",)),
    Symbol("ε_row (ε_a)", "row tolerance", "the most attention mass any observer row may lose: "
           "Σ_i m_{ai} x_i ≤ ε_a", "§5", param="eps_row", controls=("eps_row",)),
    Symbol("m₀", "kept chunks", "keep at least m₀ candidate chunks: Σ_i x_i ≤ k − m₀ (binds the greedy and "
           "the certificate U_l)", "§5", param="m0", range="≤ k", controls=("m0",)),
    Symbol("D_l", "greedy removal", "tokens the greedy proposer removes at layer l", "§5", range="[0, N]"),
    Symbol("U_l (certificate)", "dual certificate", "an upper bound on the best removal D*_l under the row "
           "tolerances (LP prices); U_l below the target proves the target infeasible", "§5", range="≥ D*_l ≥ D_l",
           controls=("certify",)),
    Symbol("U_l − D_l", "gap", "how far the greedy may be from the best removal", "§5", range="≥ 0"),
    # ---- audit and layer selection (§6)
    Symbol("audit", "audit mode", "exact (every observer position, b = 0) or sampled (m_a draws, b > 0)", "§6",
           param="audit_mode", controls=("audit_mode",)),
    Symbol("m_a", "audit sample", "observer positions drawn for the sampled audit", "§6", param="m_a",
           controls=("m_a",)),
    Symbol("δ", "audit failure probability", "the sampled audit's bound fails with probability ≤ δ/(J H_Q) "
           "per head", "§6", param="delta", controls=("delta",)),
    Symbol("b", "audit half-width", "b = sqrt(ln(J H_Q/δ) / (2 m_a)), added to the sampled mass; 0 when exact",
           "§6", range="≥ 0"),
    Symbol("ε_audit", "audit tolerance", "a layer passes when every head's audit bound is ≤ ε_audit", "§6",
           param="eps_audit", controls=("eps_audit",)),
    Symbol("d_l", "candidate stability", "the change of the removal set against the previous monitored layer "
           "(symmetric difference / union)", "§6", range="[0, 1]"),
    Symbol("d_max", "stability threshold", "a layer is stable when d_l ≤ d_max", "§6", param="d_max",
           controls=("d_max",)),
    Symbol("streak", "required streak", "consecutive stable monitored layers needed before a layer may be "
           "accepted", "§6", param="streak", controls=("streak",)),
    Symbol("seed", "seed", "the seed of the sampled audit's draw and of the random priority", "§6",
           param="seed", controls=("seed",)),
    Symbol("ε (counterexample)", "shallow mass on j*", "the shallow layer's attention mass of the last query on the "
           "removed position j* in the counterexample of paper §6.1; the shallow audit passes once ε ≤ ε_audit",
           "§6 (paper §6.1)", param="counterexample.eps", controls=("eps",)),
    Symbol("γ (counterexample)", "deep mass off j*", "a later head reads j* with mass 1 − γ: removing j* after the "
           "shallow layer moves that head's output by ≥ (1 − γ)V, whatever ε", "§6 (paper §6.1)",
           param="counterexample.gamma", controls=("gamma",)),
    Symbol("l*", "pruning layer", "the accepted layer: layers after it run on the kept tokens only; "
           "'fixed l*' prunes after a chosen layer instead of the adaptive one", "§6–§7", param="layer",
           range="[1, L − 1] when fixed", controls=("mode", "run_layer")),
    # ---- pages (§8)
    Symbol("b (pages)", "page size", "tokens per page", "§8", param="page", controls=("page",)),
    Symbol("K", "pages kept", "top-K pages per layer and KV group", "§8", param="K",
           range="≤ the number of pages ⌈T / b⌉", controls=("K",)),
    Symbol("U_l (pages)", "page union", "pages kept by any KV group of layer l: K ≤ U_l ≤ min{GK, N_P}", "§8",
           range="[K, min{GK, N_P}]"),
    Symbol("UOR_g", "union-over-retained", "|∪_{h∈g} 𝒦_h| / s: how much a group's heads disagree on their top-s "
           "keys", "§8", range="[1, min{r, T/s}]"),
    # ---- shift and eviction (§9)
    Symbol("top-k", "recall top-k", "keys counted by the top-k recall against the decode reference", "§9",
           param="k", range="≤ T", controls=("k",)),
    Symbol("r₀", "reference start", "the first decode row of the future reference", "§9", param="ref_start",
           range="≤ the decode rows", controls=("ref_start",)),
    Symbol("W", "tail rows", "prompt-tail rows r = −W+1 … 0 compared with the decode rows", "§9", param="W",
           range="≤ the captured tail", controls=("W",)),
    Symbol("level", "shift level", "per KV group (probabilities averaged over its heads) or per query head", "§9",
           range="group, head", controls=("level",)),
    Symbol("B", "eviction budget", "prompt positions kept per layer and KV group (sinks and recent included)",
           "§9", param="budget", range="≥ the protected positions, ≤ T", controls=("budget",)),
    Symbol("λ (DeferKV)", "row-weight slope", "DeferKV's row weights α_r = exp(λ r), normalised over "
           "r = −W+1 … 1: λ > 0 leans on the first decode row", "§9", param="deferkv.lam", controls=("defer_lam",)),
    Symbol("policy", "eviction policy", "full cache, StreamingLLM, H2O, SnapKV, DeferKV, Page-EntroKV, random, "
           "oracle, and the registered others", "§9", param="policy", controls=("policy",)),
)

#: tooltip text of panel controls not in the notation (views, not parameters)
_VIEW_HELP = {
    "page_view": "which page of the prompt the token view shows (long prompts page through, 384 tokens a page)",
    "compare": "compare mode: a second eviction setting B (policy, budget, λ, page size) beside this one (A); the "
               "preview marks the prompt positions kept by A only, B only, both or neither, and Run generates "
               "under both",
    "compare_layer": "where the two kept sets are read: every compacted cache (a position is kept when any layer "
                     "and KV group keeps it) or the KV groups of one layer",
}

CONTROLS: dict[str, Symbol] = {c: s for s in SYMBOLS for c in s.controls}


def tooltip(control: str) -> str:
    """The tooltip of the panel control ``control``: symbol, name, meaning, SPEC section, allowed range."""
    s = CONTROLS.get(control)
    if s is None:
        if control in _VIEW_HELP:
            return _VIEW_HELP[control]
        raise ValueError(f"control: not in the notation table, got {control!r}; known: {sorted(CONTROLS)}")
    return f"{s.symbol} ({s.name}): {s.meaning}. SPEC {s.spec}; allowed: {s.allowed()}"


def symbol(name: str) -> str:
    """The symbol a reader knows the control or parameter ``name`` by, as its slider shows it (``eps_audit`` →
    ``ε_audit``, ``lam`` → ``λ``, ``m0`` → ``m₀``): the table's first symbol, without its gloss; ``name``
    itself when the table has none."""
    s = CONTROLS.get(name)
    if s is None:
        return name
    return s.symbol.split(",")[0].split(" (")[0].strip()


def markdown() -> str:
    """``docs/notation.md``: the table as Markdown."""
    rows = ["# Notation", "",
            "Generated from `workbench/show/notation.py` (`SYMBOLS`) by `python -m workbench.show.notation`; "
            "every panel control's tooltip comes from the same table. Sections refer to `../shared/SPEC.md`; "
            "the allowed ranges are the constraint objects' (`workbench.constraints.PARAMS`) that check each "
            "parameter.", "",
            "| symbol | name | meaning | SPEC | allowed range | controls |", "| --- | --- | --- | --- | --- | --- |"]
    esc = lambda t: t.replace("|", "\\|")  # noqa: E731
    for s in SYMBOLS:
        ctl = ", ".join(f"`{c}`" for c in s.controls)
        rows.append(f"| {esc(s.symbol)} | {esc(s.name)} | {esc(s.meaning)} | {s.spec} | {esc(s.allowed())} | {ctl} |")
    return "\n".join(rows) + "\n"


def write_markdown(path: Path = DOC_PATH) -> Path:
    """Write :func:`markdown` to ``path`` (atomically); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, markdown().encode("utf-8"))
    return path


if __name__ == "__main__":  # pragma: no cover - the docs build
    print(write_markdown(Path(sys.argv[1]) if len(sys.argv) > 1 else DOC_PATH))
