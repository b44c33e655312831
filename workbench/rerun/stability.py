"""Stability diagnostics of a pruned prefill (SPEC §7, paper §6.2).

Compares the pruned run ``Y`` with the full run ``X`` on the retained rows ``R``: per-layer drift
``‖X^l|_R − Y^l‖_{max,2}`` for ``l > l*``, the final ``Δ_L``, the full-context first-token margin
``m = z_(1) − z_(2)``, ``Λ = ‖W_out‖_{2→∞} c_final``, the certificate ``m > 2ΛΔ_L`` (same greedy first
token), the observed first-token agreement, and the composed bound ``Σ_j e_j Π_{s>j} K_s`` from
weight norms — reported as it is, vacuous or not.

Constants used (paper §6.2, A.1–A.2; computed, not assumed):
- ``c`` of an RMSNorm ``γ ⊙ x / sqrt(mean x² + ε)`` on a set of inputs: ``max|γ| / min sqrt(‖x‖²/D + ε)``,
  the minimum taken over the segment between the full and the pruned input (``‖x‖ ≥ max(‖X‖, ‖Y‖) − ‖X − Y‖``);
- ``a_{l,h} = c_l/√d (Q̄‖W^K_h‖ + K̄‖W^Q_h‖)`` with ``Q̄, K̄`` the largest query/key norms of the full run,
  ``b_{l,h} = c_l‖W^V_h‖ + 2V_{l,h} a_{l,h}``, ``K_l = R_l (1 + ‖O_l‖ sqrt(Σ_h b_{l,h}²))``;
- ``R_l = 1 + f_l c̄_l`` with ``f_l`` a bound on the MLP's Jacobian over the observed inputs
  (gated: ``‖W_down‖ (max|φ'(g)| max|u| ‖W_gate‖ + max|φ(g)| ‖W_up‖)``, plain: ``‖W_down‖ max|φ'(h)| ‖W_up‖``,
  with ``φ`` the config's activation — SiLU, Gemma's GELU-tanh, ...; an enclosure taken from the two
  runs' actual normalised inputs, as the paper requires for gated MLPs). A LayerNorm is bounded as the
  RMSNorm of its centred input (the centring projection has norm 1);
- families whose block does not have this form (post-norm OLMo-2, parallel Cohere/GPT-NeoX, MoE MLPs,
  GPT-2's Conv1D ``c_attn``) get ``K_l`` reported as ``"not available for <family>: <reason>"`` in
  ``notes`` (the composed bound is then NaN); drift, ``Δ_L``, margin and certificate are always computed,
  except that a final norm whose constant is not offered (OLMo's norm without a gain) makes ``Λ`` NaN, the
  certificate not held and the reason a note;
- ``e_l = ‖F_l(X^{l-1})|_R − F_{l,R}(X^{l-1}|_R)‖_{max,2}``: block ``l`` run on the full trajectory's
  input restricted to ``R`` against the full block's output on ``R``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from workbench.run import adapter, blocks, families
from workbench.util import single_threaded


def max2(x: torch.Tensor) -> float:
    """``‖X‖_{max,2} = max_u ‖X_u‖_2`` of ``[rows, D]``."""
    return float(x.norm(dim=-1).max()) if x.numel() else 0.0


_SPEC_CACHE: dict = {}


def _spec(w: torch.Tensor) -> float:
    """Spectral norm ``‖W‖_2`` (from the smaller Gram matrix, float64; cached per weight tensor)."""
    key = (w.data_ptr(), tuple(w.shape), float(w.flatten()[:: max(1, w.numel() // 7)].sum()))
    if key not in _SPEC_CACHE:
        x = w.double()
        gram = x @ x.T if x.shape[0] <= x.shape[1] else x.T @ x
        _SPEC_CACHE[key] = float(torch.linalg.eigvalsh(gram).max().clamp(min=0).sqrt())
    return _SPEC_CACHE[key]


def _norm_lipschitz(gain_eps, X: torch.Tensor, Y: torch.Tensor) -> float:
    """RMSNorm Lipschitz bound over the segments between rows of ``X`` and ``Y`` (``[rows, D]``); a LayerNorm
    (``gain_eps.centred``) is the RMSNorm of its centred input."""
    g, eps = gain_eps
    if getattr(gain_eps, "centred", False):
        X, Y = X - X.mean(-1, keepdim=True), Y - Y.mean(-1, keepdim=True)
    D = X.shape[-1]
    low = torch.clamp(torch.maximum(X.norm(dim=-1), Y.norm(dim=-1)) - (X - Y).norm(dim=-1), min=0.0)
    rms = torch.sqrt(low.pow(2) / D + eps)
    return float(g.abs().max() / rms.min())


@dataclass
class StabilityResult:
    """Per-layer drift, the first-token certificate and the composed bound."""

    l_star: int
    drift: dict[int, float]
    Delta_L: float
    margin: float
    Lambda: float
    c_final: float
    certified: bool
    agree_first_token: bool
    full_first_token: int
    pruned_first_token: int
    defects: dict[int, float] = field(default_factory=dict)
    K: dict[int, float] = field(default_factory=dict)
    composed_bound: float = float("nan")
    notes: list[str] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        """One row per layer ``l > l*``: drift, defect ``e_l`` and constant ``K_l``."""
        rows = [dict(layer=l, drift=d, defect=self.defects.get(l, float("nan")), K=self.K.get(l, float("nan")))
                for l, d in sorted(self.drift.items())]
        df = pd.DataFrame(rows)
        df.attrs.update(self.summary())
        return df

    def summary(self) -> dict:
        return dict(l_star=self.l_star, Delta_L=self.Delta_L, margin=self.margin, Lambda=self.Lambda,
                    two_Lambda_Delta=2 * self.Lambda * self.Delta_L, certified=self.certified,
                    agree_first_token=self.agree_first_token, composed_bound=self.composed_bound,
                    composed_vacuous=not (self.composed_bound < self.margin / max(2 * self.Lambda, 1e-30)))


def logit_margin(z) -> float:
    """The logit margin of one next-token distribution: the top-1 logit minus the top-2 logit of ``z`` (``[V]``),
    ``>= 0``; the first token's margin is what the certificate ``m > 2ΛΔ_L`` compares against."""
    z = torch.as_tensor(z).reshape(-1)
    if z.numel() < 2:
        raise ValueError(f"z: needs at least 2 logits, got {z.numel()}")
    top2 = torch.topk(z, 2).values
    return float(top2[0] - top2[1])


@torch.no_grad()
def stability(model, full, pruned, *, composed: bool = True) -> StabilityResult:
    """Diagnostics of ``pruned`` (``run_pruned(..., keep_hidden=True)``) against ``full``
    (``run_full(..., keep_hidden=True)``), both on the same prompt.

    Hidden keys are block inputs: key ``l`` is ``X^l`` (the output of block ``l-1``), key ``L`` the
    final-norm input ``X^L``.
    """
    if hasattr(model, "model") and hasattr(model, "tokenizer"):
        model = model.model
    if pruned.l_star is None:
        raise ValueError("pruned: the run was a bypass (nothing pruned); stability needs l* not None")
    if not full.hidden or not pruned.hidden:
        raise ValueError("full/pruned: run both with keep_hidden=True")
    shape = adapter.model_shape(model)
    L, l_star = shape.L, pruned.l_star
    R = pruned.retained
    drift = {}
    for j in range(l_star + 1, L + 1):
        if j in pruned.hidden and j in full.hidden:
            drift[j] = max2(full.hidden[j][R] - pruned.hidden[j])
    Delta_L = drift.get(L, float("nan"))
    z = full.first_logits
    margin = logit_margin(z)
    XL, YL = full.hidden[L][R][-1:], pruned.hidden[L][-1:]
    try:
        c_final = _norm_lipschitz(blocks.final_norm_gain(model), XL, YL)
        note = None
    except blocks.Unavailable as e:  # a final norm whose Lipschitz constant is not offered (OLMo's gainless norm)
        c_final, note = float("nan"), str(e)
    W_out = blocks.lm_head_weight(model)
    Lambda = float(W_out.norm(dim=1).max()) * c_final
    certified = bool(margin > 2 * Lambda * Delta_L)  # NaN: not certified
    res = StabilityResult(l_star=l_star, drift=drift, Delta_L=Delta_L, margin=margin, Lambda=Lambda, c_final=c_final,
                          certified=bool(certified), agree_first_token=int(z.argmax()) == int(pruned.first_logits.argmax()),
                          full_first_token=int(z.argmax()), pruned_first_token=int(pruned.first_logits.argmax()))
    if note is not None:
        res.notes.append(note)
    if certified and not res.agree_first_token:  # would contradict the corollary
        res.notes.append("certificate holds but the first tokens differ: a constant is wrong")
    if composed:
        _composed(model, shape, full, pruned, R, res)
    return res


def _normed(x: torch.Tensor, ng) -> torch.Tensor:
    if ng.centred:
        x = x - x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + ng.eps) * ng.gain


def _mlp_bound(bw, xs: torch.Tensor) -> float:
    """``f_l``: the MLP Jacobian bound over the normalised inputs ``xs`` (config activation, autograd derivative)."""
    nx = _normed(xs, bw.post_norm)
    pre = nx @ (bw.mlp["gate"] if bw.gated else bw.mlp["up"]).T
    with torch.enable_grad():
        z = pre.detach().double().requires_grad_(True)
        a = bw.act(z)
        (da,) = torch.autograd.grad(a.sum(), z)
    if bw.gated:
        up = nx @ bw.mlp["up"].T
        return _spec(bw.mlp["down"]) * (float(da.abs().max()) * float(up.abs().max()) * _spec(bw.mlp["gate"])
                                        + float(a.detach().abs().max()) * _spec(bw.mlp["up"]))
    return _spec(bw.mlp["down"]) * float(da.abs().max()) * _spec(bw.mlp["up"])


@single_threaded  # ~100 small eigenproblems: thread sync costs more than the arithmetic (225 s vs ~30 s when busy)
def _composed(model, shape, full, pruned, R, res: StabilityResult) -> None:
    device = next(model.parameters()).device
    pos = R[None].to(device)
    d, r, H = shape.d, shape.r, shape.H_Q
    total = 0.0
    Ks = {}
    fam = families.family_of(model)
    for l in range(res.l_star + 1, shape.L):
        X_in = full.hidden[l][R]
        Y_in = pruned.hidden[l]
        try:
            out = blocks.run_block(model, l, X_in[None].to(device, next(model.parameters()).dtype), pos)[0].float().cpu()
            res.defects[l + 1] = max2(full.hidden[l + 1][R] - out)
        except Exception as e:  # noqa: BLE001 - a block that cannot run alone: say so, never crash
            res.notes.append(f"defect e_{l + 1} not available for {fam.name}: {type(e).__name__}: {e}")
            res.defects[l + 1] = float("nan")
        try:
            bw = blocks.block_weights(model, l)
        except blocks.Unavailable as e:
            if str(e) not in res.notes:
                res.notes.append(str(e))
            Ks[l + 1] = float("nan")
            continue
        c_l = _norm_lipschitz(bw.input_norm, X_in, Y_in)
        n_in = _normed(full.hidden[l], bw.input_norm)
        q = (n_in @ bw.W_Q.T).view(-1, H, d).norm(dim=-1).amax(0)  # Q̄ per head (RoPE keeps norms)
        k = (n_in @ bw.W_K.T).view(-1, shape.G, d).norm(dim=-1).amax(0)
        v = (n_in @ bw.W_V.T).view(-1, shape.G, d).norm(dim=-1).amax(0)
        b2 = 0.0
        for h in range(H):
            gi = h // r
            WQ, WK, WV = bw.W_Q[h * d:(h + 1) * d], bw.W_K[gi * d:(gi + 1) * d], bw.W_V[gi * d:(gi + 1) * d]
            a = c_l / math.sqrt(d) * (float(q[h]) * _spec(WK) + float(k[gi]) * _spec(WQ))
            b = c_l * _spec(WV) + 2 * float(v[gi]) * a
            b2 += b * b
        # MLP Jacobian bound over the observed normalised inputs of both runs
        f = _mlp_bound(bw, torch.cat([X_in, Y_in]))
        c_bar = _norm_lipschitz(bw.post_norm, X_in, Y_in)
        R_l = 1 + f * c_bar
        Ks[l + 1] = R_l * (1 + _spec(bw.W_O) * math.sqrt(b2))
    res.K = Ks
    js = sorted(res.defects)
    for j in js:
        prod = 1.0
        for s in js:
            if s > j:
                prod *= Ks[s]
        total += res.defects[j] * prod
    res.composed_bound = total
