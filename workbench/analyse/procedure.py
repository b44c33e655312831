"""The adaptive layer selection of paper §5 (steps 1–7, SPEC §2–§6), without running a model.

- ``layer_proposal``: the candidate removal ``E_l`` at one layer (pooling §2, priorities §3, the greedy
  proposal and its certificate §5);
- ``candidate_drift``: ``d_l = |R_l △ R_{l⁻}| / max{1, |R_l ∪ R_{l⁻}|}`` for removed chunk sets (the paper's
  "candidate stability"; not :func:`workbench.rerun.stability.stability`, the drift of a pruned run);
- ``trace``: the 7-step decision over the monitored layers of a capture, with the audit bound of
  :mod:`workbench.analyse.audit`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
import torch

from workbench.analyse import priorities as P
from workbench.analyse.audit import NO_LAYER_CAN_PASS, AuditConfig, audit_from_rows, hoeffding_b
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.pooling import PoolingCache
from workbench.analyse.rows import check_capture_rows
from workbench.analyse.selection import SelectionResult, mass_table
from workbench.constraints import index_into
from workbench.util import single_threaded, warn_at_caller

if TYPE_CHECKING:
    from workbench.capture.data import Capture


def _row_chunk_mass(A: torch.Tensor, spans) -> torch.Tensor:
    """``A_u(c_i)`` for rows ``A [..., T]`` → float64 ``[..., k]`` (one leading slice at a time: no float64
    copy of every layer's rows)."""
    if A.dim() > 2 and A.shape[0] > 1:
        return torch.stack([_row_chunk_mass(A[i], spans) for i in range(A.shape[0])])
    cof = spans.chunk_of()
    pos = torch.nonzero(cof >= 0).flatten()
    return P.chunk_sums_idx(P.take_last(A, pos), cof[pos], spans.k)


def candidate_drift(R_l, R_prev) -> float:
    """Candidate stability (drift between successive proposals) ``d_l = |R_l △ R_{l⁻}| / max{1, |R_l ∪ R_{l⁻}|}`` in ``[0, 1]``.

    Args:
        R_l, R_prev: removed chunk index sets (any iterables of ints).
    """
    a, b = {int(x) for x in R_l}, {int(x) for x in R_prev}
    return len(a ^ b) / max(1, len(a | b))


class AuditWarning(UserWarning):
    """The audit of a trace cannot bind (``b >= eps_audit``, ``eps_audit = 1``, or it accepted at the first
    monitored layer and passed everywhere): its decision then says little about the removal."""


def _warn_unbound(msg: str) -> None:
    warn_at_caller(msg, AuditWarning)


@dataclass
class TraceResult:
    """Per-layer trace of the adaptive procedure (paper §5 steps 1–7).

    Attributes:
        records: one dict per monitored layer (see ``to_frame``).
        l_star: first accepted layer, or None (bypass: full prefill).
        removed: removed chunk indices at ``l_star`` (``[]`` on bypass).
        decision: overall plain-language decision.
        selections: ``{layer: SelectionResult}`` for every valid monitored layer.
        audits: ``{layer: AuditResult}`` for every audited layer.
        b: audit radius (0 in exact mode).
        J: number of monitored layers.
        notes: warnings (``b > eps_audit``, no audit rows, ``k = 0``, dropped audit rows ...).
        params: the parameters.
        pooling: ``PoolingResult`` over all layers.
        priorities: the SPEC §3 ``PriorityResult`` over all layers (ℓ, κ, its ``S = ln ℓ + λκ`` and the
            document-mass validity; None when ``k = 0``). It is the priority the proposer used only for
            ``priority`` ``"renyi"`` and ``"mass"``; use :attr:`priority_used` for the one actually used.
        S: float64 ``[L, k]``, the priority the proposer used (``params.priority``); the documented name is
            :attr:`priority_used`.
        audit_rows: int64 indices (into the capture's row axis) of the audit population used.
        model_id: the capture's model identity (for figure and export metadata).
    """

    records: list[dict]
    l_star: int | None
    removed: list[int]
    decision: str
    selections: dict = field(default_factory=dict)
    audits: dict = field(default_factory=dict)
    b: float = 0.0
    J: int = 0
    notes: list[str] = field(default_factory=list)
    params: EntroPrefillParams | None = None
    pooling: object = None
    priorities: object = None
    S: torch.Tensor | None = None
    audit_rows: torch.Tensor | None = None
    spans: object = None
    model_id: str | None = None

    @property
    def bypass(self) -> bool:
        return self.l_star is None

    @property
    def priority_used(self) -> torch.Tensor | None:
        """float64 ``[L, k]``: the chunk priority the proposer ranked by (``params.priority``: Rényi, mass,
        uniform, random or head-max; lower = removed first). Not ``priorities.S`` unless the priority is
        ``"renyi"`` or ``"mass"``."""
        return self.S

    @property
    def priority_name(self) -> str:
        """The name of :attr:`priority_used` (``params.priority``)."""
        return (self.params or EntroPrefillParams()).priority

    @property
    def layers(self) -> list[int]:
        return [r["layer"] for r in self.records]

    def retained_positions(self) -> torch.Tensor:
        """``R = [T] \\ E_{l*}`` (all positions on bypass); int64 ``[T']``."""
        return self.spans.retained_positions(self.removed)

    def to_frame(self) -> pd.DataFrame:
        """One row per monitored layer.

        Columns: ``layer, valid, valid_residual, valid_doc, removed, D, target_tokens, reached, U,
        gap, d, streak, audited, max_audit_bound, b, passed, executed, status, decision``.
        ``D, U, gap, d`` are NaN where undefined (invalid layer; no predecessor for ``d``);
        ``max_audit_bound`` is NaN where no audit ran.
        """
        cols = [
            "layer", "valid", "valid_residual", "valid_doc", "removed", "D", "target_tokens", "reached", "U",
            "gap", "d", "streak", "audited", "max_audit_bound", "b", "passed", "executed", "status", "decision",
        ]
        return pd.DataFrame([{c: r[c] for c in cols} for r in self.records], columns=cols)


def _priority_S(params: EntroPrefillParams, pooling, prio, spans, L: int) -> torch.Tensor:
    """The priority ``params.priority`` names, float64 ``[L, k]`` (lower = removed first)."""
    if params.priority in ("renyi", "mass"):
        S = prio.S
    elif params.priority == "uniform":
        S = P.uniform_priorities(spans, L, order="index", seed=params.seed)
    elif params.priority == "random":
        S = P.uniform_priorities(spans, L, order="random", seed=params.seed)
    else:  # headmax
        S = P.per_head_max_priorities(pooling.a, spans)
    S = torch.as_tensor(S, dtype=torch.float64)
    if S.dim() == 1:
        S = S.expand(L, -1)
    return S


@dataclass(frozen=True)
class LayerProposal:
    """The candidate removal ``E_l`` at one layer, from the proposal rows only (SPEC §2–§5).

    Attributes:
        layer: ``l``.
        valid_residual / valid_doc: the residual and document masses exceed ``ρ_min``.
        S: float64 ``[k]``, the priority actually used (``params.priority``; lower = removed first).
        selection: the greedy proposal and its certificate, ``None`` when the layer is invalid.
    """

    layer: int
    valid_residual: bool
    valid_doc: bool
    S: torch.Tensor
    selection: SelectionResult | None

    @property
    def valid(self) -> bool:
        return self.valid_residual and self.valid_doc


@dataclass(frozen=True)
class ProposalInputs:
    """What every layer's proposal is computed from, once per capture and parameters: the pooling
    (§2), the priorities (§3), the priority used ``S [L, k]`` and the observer mass table ``[L, H_Q·W_p, k]``."""

    pooling: object
    priorities: object
    S: torch.Tensor
    mass: torch.Tensor


def proposal_inputs(capture: Capture, params: EntroPrefillParams,
                    pooling_cache: PoolingCache | None = None) -> ProposalInputs:
    """Pooling, priorities, the priority used and the mass table of a capture under ``params``
    (``pooling_cache``: the caller's :class:`~workbench.analyse.pooling.PoolingCache` of this capture)."""
    spans = capture.spans
    pooling = params.pooling()(capture, pooling_cache)
    prio = params.priorities().score(pooling.mu, spans)
    S = _priority_S(params, pooling, prio, spans, capture.L)
    m_all = capture.cached("observer_mass_table", lambda: mass_table(capture.observer_attn(), spans))  # [L, H_Q*W, k]
    return ProposalInputs(pooling=pooling, priorities=prio, S=S, mass=m_all)


def layer_proposal(capture: Capture, params: EntroPrefillParams, l: int, *, certify: bool = True,
                   inputs: ProposalInputs | None = None) -> LayerProposal:
    """The proposal ``E_l`` at layer ``l`` exactly as :func:`trace` computes it (the same pooling, the
    priority ``params.priority`` names, the same greedy scan and certificate). ``inputs`` reuses
    :func:`proposal_inputs` across layers."""
    index_into(capture.L).check("layer", l)
    inputs = inputs or proposal_inputs(capture, params)
    vr, vd = bool(inputs.pooling.valid[l]), bool(inputs.priorities.valid[l])
    sel = None
    if vr and vd and capture.spans.k:
        sel = params.selection().select(inputs.S[l], capture.spans.n, inputs.mass[l], certify=certify)
    return LayerProposal(layer=l, valid_residual=vr, valid_doc=vd, S=inputs.S[l], selection=sel)


@single_threaded
def trace(capture: Capture, params: EntroPrefillParams | None = None, *, certify: bool = True,
          pooling_cache: PoolingCache | None = None) -> TraceResult:
    """Run the adaptive layer selection of paper §5 (steps 1–7) on a capture, without a model.

    Per monitored layer ``l`` (in increasing order): pooling (§2) → priorities (§3) → mass table of
    the proposal observers → greedy proposal and LP certificate (§5) → if residual or document mass
    is invalid, reset predecessor and streak and continue → stability ``d_l`` against the previous
    valid monitored layer and streak (``d_l`` undefined and streak 0 without a predecessor) → if the
    saving target is reached and ``streak >= params.streak``, audit on the capture's ``"audit"`` rows
    after the documents (never used by the candidates) → accept when every head passes.

    **[decided]** The audit population is the audit rows after the documents *outside the proposal
    observers* (SPEC §6 asks for audit rows independent of the proposal). Only when every audit row is
    an observer (a query no longer than ``W_p``) are they used as they are, and ``notes`` says that
    the audit then overlaps the proposal; rows left out are named in ``notes`` too. The first
    accepted layer is ``l*``; without one the decision is bypass (full prefill). Layers after ``l*``
    are still traced as counterfactuals (``executed = False``, decision prefixed ``after l*:``).
    Pooling and priorities are computed once for all layers.

    Args:
        capture: ``Capture`` with observer rows and (for the audit) rows of kind ``"audit"``.
        params: ``EntroPrefillParams`` (defaults if None).
        certify: compute the LP certificate ``U_l`` per layer (off for the online decision inside a
            pruned prefill, where only the decisions are needed; they do not depend on ``U_l``).
        pooling_cache: a :class:`~workbench.analyse.pooling.PoolingCache` of ``capture`` the caller keeps
            between calls (a panel's slider moves), so that the pooling is not computed again.

    Returns:
        ``TraceResult``.
    """
    params = params or EntroPrefillParams()
    check_capture_rows(capture)  # every row finite, >= 0, summing to <= 1 (verdict cached on the capture)
    spans = capture.spans
    L, H_Q, k = capture.L, capture.H_Q, spans.k
    layers = params.monitored_layers(L)
    J = len(layers)
    # one audit configuration for every monitored layer (the same sample, δ split over the J layers)
    audit_config = AuditConfig(params.audit_mode, params.m_a, params.delta, J, params.seed,
                               params.eps_audit) if J else None
    notes: list[str] = []
    b = 0.0
    if params.audit_mode == "sampled":
        b = hoeffding_b(params.m_a, params.delta, J, H_Q)
        if b >= params.eps_audit and params.eps_audit < 1.0:
            notes.append(
                f"b = {b:.4g} >= eps_audit = {params.eps_audit:.4g}: {NO_LAYER_CAN_PASS}; enlarge m_a, audit the "
                "finite population exactly, relax eps_audit with an explicit scope change, or bypass pruning"
            )
            _warn_unbound(notes[-1])
    if params.eps_audit >= 1.0:
        notes.append("eps_audit = 1: a row's removed mass never exceeds 1, so the audit accepts any removal "
                     "(it cannot bind)")
        _warn_unbound(notes[-1])
    if k == 0:
        pooling = params.pooling()(capture, pooling_cache)
        notes.append("no candidate chunks (k = 0): ordinary inference, nothing removed")
        records = [
            dict(layer=l, valid=bool(pooling.valid[l]), valid_residual=bool(pooling.valid[l]), valid_doc=False,
                 removed=(), D=0, target_tokens=0, reached=False, U=0.0, gap=0.0, d=float("nan"), streak=0,
                 audited=False, max_audit_bound=float("nan"), b=b, passed=None, executed=True,
                 status="no_candidates", decision="continue: no candidate chunks (k = 0)")
            for l in layers
        ]
        return TraceResult(records=records, l_star=None, removed=[],
                           decision="bypass: full prefill (no candidate chunks, k = 0: ordinary inference)",
                           b=b, J=J, notes=notes, params=params, pooling=pooling, priorities=None,
                           S=torch.zeros(L, 0, dtype=torch.float64), audit_rows=torch.zeros(0, dtype=torch.int64),
                           spans=spans, model_id=getattr(capture, "model_id", None))

    inputs = proposal_inputs(capture, params, pooling_cache)
    pooling, prio, S = inputs.pooling, inputs.priorities, inputs.S
    too_big = params.target_tokens is not None and params.target_tokens > spans.N
    if too_big:
        notes.append(f"the target {params.target_tokens} tokens exceeds the N = {spans.N} candidate tokens: "
                     "no layer can reach it (lower target_tokens, or give target as a fraction of N)")

    # audit population: rows of kind "audit" after the documents (ν uniform over them), outside the
    # proposal observers (SPEC §6: audit rows independent of the proposal)
    docs_end = max(e for _, e in spans.chunks)
    aud_idx = capture.rows_of("audit")
    if aud_idx.numel():
        pos = capture.row_pos[aud_idx]
        keep = pos >= docs_end
        if int((~keep).sum()):
            notes.append(f"{int((~keep).sum())} audit rows before the end of the documents (position < {docs_end}) "
                         "were left out of the audit population")
        aud_idx, pos = aud_idx[keep], pos[keep]
        obs = torch.isin(pos, torch.tensor(spans.observers, dtype=pos.dtype))
        if bool(obs.any()) and not bool(obs.all()):
            notes.append(f"{int(obs.sum())} audit rows at observer positions {pos[obs].tolist()} were left out of "
                         "the audit population (SPEC §6: the audit is independent of the proposal rows)")
            aud_idx = aud_idx[~obs]
        elif bool(obs.any()):
            notes.append(f"the audit population overlaps the proposal observers: every audit row (positions "
                         f"{pos.tolist()}) is also an observer, so the audit is not independent of the proposal "
                         "(SPEC §6); capture audit rows outside the last W_p query tokens for an independent audit")
    if aud_idx.numel() == 0:
        notes.append(f"no audit rows after the documents in the capture: {NO_LAYER_CAN_PASS}")
        A_aud = None
    else:
        # row–chunk masses of the audit population, once per capture: [L, H_Q, n_pop, k]
        A_aud = capture.cached(("audit_chunk_mass", tuple(aud_idx.tolist())),
                               lambda: _row_chunk_mass(capture.prompt_rows(aud_idx), spans))

    records: list[dict] = []
    selections: dict[int, SelectionResult] = {}
    audits: dict = {}
    pred: set | None = None
    streak = 0
    l_star: int | None = None
    removed_star: list[int] = []
    for l in layers:
        prop = layer_proposal(capture, params, l, certify=certify, inputs=inputs)
        vr, vd = prop.valid_residual, prop.valid_doc
        rec = dict(layer=l, valid=vr and vd, valid_residual=vr, valid_doc=vd, removed=(), D=float("nan"),
                   target_tokens=None, reached=False, U=float("nan"), gap=float("nan"), d=float("nan"),
                   streak=0, audited=False, max_audit_bound=float("nan"), b=b, passed=None,
                   executed=l_star is None, status="", decision="")
        if not (vr and vd):
            pred, streak = None, 0
            why = "residual" if not vr else "document"
            rec.update(status="invalid", decision=f"reset: invalid {why} mass (predecessor and streak reset)")
        else:
            res = prop.selection
            selections[l] = res
            R = set(res.removed)
            if pred is None:
                d, streak = float("nan"), 0
            else:
                d = candidate_drift(R, pred)
                streak = streak + 1 if d <= params.d_max else 0
            pred = R
            rec.update(removed=tuple(res.removed), D=res.D, target_tokens=res.target_tokens, reached=res.reached,
                       U=res.U, gap=res.gap, d=d, streak=streak)
            if not res.reached:
                rec.update(status="below_target", decision=f"continue: saving target not reached ({res.verdict})")
            elif streak < params.streak:
                rec.update(status="short_streak", decision=f"continue: streak {streak} < required {params.streak}")
            elif A_aud is None:
                rec.update(status="no_audit", decision=f"continue: no audit rows, {NO_LAYER_CAN_PASS}")
            else:
                eta_rows = A_aud[l][:, :, list(res.removed)].sum(-1)  # [H_Q, n_pop]: A_U(E_l) per audit row
                au = audit_from_rows(eta_rows, audit_config)
                audits[l] = au
                rec.update(audited=True, max_audit_bound=au.max_bound, passed=au.passed)
                if au.passed:
                    rec.update(status="accept", decision=f"accept: every head's audit bound <= eps_audit "
                               f"(max {au.max_bound:.4g}); prune {res.D} tokens after layer {l}")
                    if l_star is None:
                        l_star, removed_star = l, list(res.removed)
                        rec["decision"] = "accept (l*): " + rec["decision"]
                        records.append(rec)
                        continue
                else:
                    rec.update(status="audit_fail", decision=f"continue: audit failed ({au.message})")
        if l_star is not None and not rec["executed"]:
            rec["decision"] = "after l*: " + rec["decision"]
        records.append(rec)

    audited = [r for r in records if r["audited"]]
    if l_star is not None and l_star == layers[0] and audited and all(r["passed"] for r in audited) \
            and params.eps_audit < 1.0:
        notes.append(f"the audit did not bind: it accepted at the first monitored layer (l* = {l_star}) and passed "
                     f"at every audited layer (max bound {max(r['max_audit_bound'] for r in audited):.3g} <= "
                     f"eps_audit = {params.eps_audit:.3g}); the selection alone decided")
        _warn_unbound(notes[-1])
    if l_star is None and too_big:
        decision = (f"bypass: the target {params.target_tokens} tokens exceeds the N = {spans.N} candidate tokens, "
                    "full prefill")
    elif l_star is None:
        decision = "bypass: no monitored layer accepted, full prefill"
    else:
        sel_star = selections[l_star]
        decision = (f"accept at l* = {l_star}: remove chunks {removed_star} ({sel_star.D} of {sel_star.N} candidate "
                    f"tokens; T' = {spans.T - sel_star.D})")
    return TraceResult(records=records, l_star=l_star, removed=removed_star, decision=decision,
                       selections=selections, audits=audits, b=b, J=J, notes=notes, params=params, pooling=pooling,
                       priorities=prio, S=S, audit_rows=aud_idx, spans=spans, model_id=getattr(capture, "model_id", None))
