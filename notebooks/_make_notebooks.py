"""Generate the notebook series ``notebooks/NN_*.ipynb`` (nbformat v4, no outputs).

The cells live here as Python source so that they can be reviewed and diffed; run

    .venv/bin/python notebooks/_make_notebooks.py            # write every notebook
    .venv/bin/python notebooks/_make_notebooks.py 03 08      # only some

and commit the regenerated ``.ipynb`` files. ``tests/test_notebooks.py`` executes all of them.

Every figure comes from :mod:`workbench.plots`; each notebook shows an interactive panel from
:mod:`workbench.widgets` (displayed directly, never inside ``ipywidgets.Output``; notebook 04 also
exports its figure with :mod:`workbench.export`) and ends with a ``## Checks`` cell
(:func:`check_cells`) that prints and asserts real numbers the notebook computed.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------- helpers
def md(s: str):
    return new_markdown_cell(textwrap.dedent(s).strip("\n"))


def code(s: str):
    return new_code_cell(textwrap.dedent(s).strip("\n"))


def panel_cells(cls: str, args: str, note: str, prelude: str = "") -> list:
    """The closing interactive panel of a notebook: ``workbench.widgets.<cls>(<args>)``, displayed directly
    (no ``ipywidgets.Output``). ``prelude``: lines the panel needs first (e.g. a capture)."""
    src = f"from workbench.widgets import {cls}\n\n{prelude.strip()}\n" if prelude.strip() else f"from workbench.widgets import {cls}\n"
    return [
        md("### Interactive panel\n\n" + note),
        code(src + f"panel = {cls}({args})\npanel.widget"),
    ]


def check_cells(src: str, note: str = "") -> list:
    """The closing cells of every notebook: a ``## Checks`` title and one code cell that recomputes the
    numbers the notebook talks about from its own results, prints them and asserts them (SPEC's
    inequalities, sums, counts). CI executes every notebook; ``tests/test_notebooks.py`` requires the last
    code cell to assert."""
    note = note or "The numbers this notebook talks about, recomputed from its own results, printed and asserted."
    return [md("## Checks\n\n" + note), code(src)]


def export_cells(figs: str) -> list:
    """One export cell writing ``figs`` (a dict expression ``{name: figure}``) to a temporary folder."""
    return [
        md("""
        ### Export for a paper

        `workbench.export.export_all` writes every figure as PDF/SVG/PNG at the single-column width (3.33 in),
        with a JSON sidecar (the figure's parameters, model and prompt identity) and a CSV of its data.
        Here into a temporary folder; pass your own folder instead.
        """),
        code(f"""
        import tempfile
        from pathlib import Path
        from workbench.export import export_all

        out = Path(tempfile.mkdtemp(prefix="workbench-figures-"))
        written = export_all({figs}, out, width="single")
        sorted(p.name for paths in written.values() for p in paths)
        """),
    ]


SETUP = """
from workbench.models import load_model
from workbench.examples import load_example
from workbench.capture import run_capture, RowSet
from workbench import plots

lm = load_model(progress=False)             # SmolLM2-135M-Instruct, embedded; CPU fp32 or GPU bf16
ex = load_example()                          # data/example_prompt.json
prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
spans = prompt.spans
cap = run_capture(lm, prompt, RowSet(tail=32, n_decode=4), progress=False)
print(f"T = {spans.T} tokens, k = {spans.k} chunks, answer in chunk {spans.chunk_doc.index(ex.answer_doc)}; "
      f"capture {tuple(cap.attn.shape)} [layers, heads, rows, keys]")
"""


# ----------------------------------------------------------------------------- 01 capture and heads
def nb01():
    cells = [
        md("""
        # 01 · Capture and heads

        What the workbench records before any analysis (SPEC §0–§1): the model's attention **rows**
        `A^{l,h}_{u,·}` for a chosen set of query positions `u`, in every layer `l` and every query
        head `h`, computed from the same post-RoPE queries and keys the model's own kernel sees.
        This notebook shows the prompt's spans, which rows are captured, that they equal eager
        `output_attentions` exactly, and the first thing one sees in them: attention **sinks**.
        """),
        code("""
        import torch
        import pandas as pd
        from workbench.models import load_model
        from workbench.examples import load_example
        from workbench.capture import run_capture, RowSet
        from workbench import plots

        lm = load_model(progress=False)
        s = lm.shape
        print(f"{lm.model_id}: L = {s.L} layers, H_Q = {s.H_Q} query heads, G = {s.G} KV heads "
              f"(r = {s.r} query heads per group), head dim d = {s.d}")
        """),
        md("""
        ## The prompt and its spans (SPEC §0)

        The bundled prompt: an instruction, eight short passages and a question, rendered with the
        model's chat template. Spans come from the tokenizer's character offsets. Each passage is a
        **candidate chunk** `c_i`; everything else (instruction, query, delimiters, template tokens, the
        first `n_sink` tokens) is **protected**. The proposal observers `𝒬_p` are the last `W_p` query tokens.
        """),
        code("""
        ex = load_example()
        prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
        spans = prompt.spans
        tok = spans.tokens
        rows = [("sinks 𝒮", 0, spans.n_sink)]
        if spans.instruction:
            rows.append(("instruction", *spans.instruction))
        rows += [(f"chunk {i}" + (" (answer)" if spans.chunk_doc[i] == ex.answer_doc else ""), a, b)
                 for i, (a, b) in enumerate(spans.chunks)]
        rows += [("query", *spans.query), ("observers 𝒬_p", spans.observers[0], spans.observers[-1] + 1)]
        pd.DataFrame([dict(segment=n, start=a, end=b, tokens=b - a, text="".join(tok[a:b])[:60]) for n, a, b in rows])
        """),
        md("""
        ## Capture (SPEC §1)

        `RowSet` says which query rows to keep: the observers, the whole query (the audit population of
        SPEC §6), a prompt-tail window and a few greedy decode steps. Memory is `O(L · H_Q · |rows| · T)`;
        no `T × T` matrix is formed, and the model keeps its own attention kernel (sdpa here) for its output.
        """),
        code("""
        cap = run_capture(lm, prompt, RowSet(tail=16, n_decode=4), progress=False)
        kinds = pd.Series(cap.row_kind).value_counts()
        print(f"attn {tuple(cap.attn.shape)} [L, H_Q, rows, T + n_decode], {cap.attn.numel() * 4 / 2**20:.1f} MiB")
        print("rows per kind:", kinds.to_dict())
        print("greedy continuation:", repr(lm.tokenizer.decode(cap.generated_ids)))
        """),
        md("""
        **Exactness.** The oracle is a full eager forward with `output_attentions=True` (it does build every
        `T × T` matrix; fine for one short prompt). Every captured prompt row must match it to float32
        rounding (SPEC §1 records 3e-6 on this model).
        """),
        code("""
        from workbench.adapter import eager_attentions

        eager = eager_attentions(lm.model, prompt.input_ids).attentions      # L x [1, H_Q, T, T]
        prompt_rows = torch.tensor([k != "decode" for k in cap.row_kind])
        pos = cap.row_pos[prompt_rows]
        err = max(float((cap.attn[l][:, prompt_rows, :spans.T] - eager[l][0][:, pos]).abs().max()) for l in range(cap.L))
        print(f"max |captured - eager| over {int(prompt_rows.sum())} rows x {cap.L} layers x {cap.H_Q} heads: {err:.2e}")
        assert err < 1e-4
        del eager
        """),
        md("""
        ## Sinks

        The share of each head's attention that lands on the first `n_sink = 4` tokens, averaged over the
        observers. Many heads put most of their mass there: this is why the pooling of SPEC §2 measures
        entropy on the **residual** (non-sink) part of each row.
        """),
        code("plots.sink_mass_heatmap(cap)"),
        md("""
        Two heads of one middle layer over the prompt tokens (hover shows the token): the head with the
        **most** sink mass and the one with the **least**. Orange bars are candidate chunks, green the
        chunk holding the answer, grey protected tokens.
        """),
        code("""
        layer = cap.L // 2
        sink = cap.sink_mass()[layer]
        sink_head, reader_head = int(sink.argmax()), int(sink.argmin())
        print(f"layer {layer}: head {sink_head} sink mass {float(sink.max()):.2f}, head {reader_head} {float(sink.min()):.2f}")
        plots.attention_strip(cap, layer=layer, head=sink_head)
        """),
        code("plots.attention_strip(cap, layer=layer, head=reader_head)"),
        md("""
        ## Heads by residual entropy

        Removing the sinks and renormalising, each head's non-sink Rényi-2 entropy `H_h = -ln Σ_j ã_j²`
        (SPEC §2) says how concentrated its residual attention is: low entropy = the head reads a few
        tokens, high entropy = it spreads. Notebook 02 turns these entropies into head weights.
        """),
        code("""
        from workbench.pooling import HeadPooling

        pooling = HeadPooling()(cap)
        plots.head_heatmap(pooling, "H")
        """),
        md("""
        ## A capture is a file

        `save()` writes safetensors plus a JSON header (spans, model identity, parameters), atomically;
        `load()` gives back the same tensors bit for bit. Analyses can run on a loaded capture without the model.
        """),
        code("""
        import tempfile
        from pathlib import Path
        from workbench.capture_data import Capture

        path = cap.save(Path(tempfile.mkdtemp()) / "example.capture.safetensors")
        back = Capture.load(path)
        assert torch.equal(back.attn, cap.attn) and back.spans == cap.spans and back.row_kind == cap.row_kind
        print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB, identical after load; model {back.model_id}")
        """),
    ]
    cells += panel_cells("HeadsPanel", 'cap, quantity="sink"',
                         "Pick the layer and the quantity (sink mass, entropy `H`, weight `w`); the heatmap and the "
                         "residual rows of the layer follow. No model call: everything comes from the capture.")
    cells += check_cells("""
        import math

        sums = cap.attn.sum(-1)                       # [L, H_Q, rows]; a decode row's future keys hold 0
        row_err = float((sums - 1).abs().max())
        sink = cap.sink_mass()                        # [L, H_Q], mean over the observers
        H = pooling.H[pooling.valid_head]             # finite for valid heads
        H_cap = math.log(spans.T - spans.n_sink)
        print(f"{sums.numel()} captured rows ({ {k: int(v) for k, v in kinds.items()} }): max |Σ_j A_uj − 1| = {row_err:.1e}")
        print(f"captured vs eager output_attentions: max |Δ| = {err:.1e}")
        print(f"layer {layer}: sink mass of head {sink_head} = {float(sink[layer, sink_head]):.3f} (most), "
              f"head {reader_head} = {float(sink[layer, reader_head]):.3f} (least)")
        print(f"H_h over {H.numel()} valid heads in [{float(H.min()):.3f}, {float(H.max()):.3f}] ⊂ [0, ln(T − n_sink)] = [0, {H_cap:.3f}]")
        assert row_err < 1e-5                                               # every captured row is a distribution
        assert err < 1e-4                                                   # ... and the model's own attention
        assert int(kinds.sum()) == cap.attn.shape[2] and int(kinds["decode"]) == len(cap.generated_ids) == 4
        assert float(sink.min()) >= 0 and float(sink.max()) <= 1 + 1e-5
        assert torch.allclose(pooling.sink_mass, sink.double(), atol=1e-5)   # pooling's observer means agree
        assert float(sink[layer, sink_head]) == float(sink[layer].max()) > float(sink[layer].min()) == float(sink[layer, reader_head])
        assert float(H.min()) >= -1e-9 and float(H.max()) <= H_cap + 1e-9
        assert cap.spans.k == 8 and back.attn.shape == cap.attn.shape
        """)
    return cells


# ----------------------------------------------------------------------------- 02 sinks and pooling
def nb02():
    cells = [
        md("""
        # 02 · Sink-isolated Rényi head pooling (ζ, τ)

        SPEC §2 (paper §3.1). One layer's `H_Q` heads are pooled into a single measure `μ^l` over the
        prompt that later steps score chunks with. Each head's observer-mean row `a^h` is split into
        its sink part and its **residual** `z_h = Σ_{j∉𝒮} a^h_j`; the residual's Rényi-2 entropy
        `H_h` decides the head's weight inside its KV group:

        - `v_h = softmax_{h∈group}(−H_h / τ)`, temperature `τ > 0` — low entropy (focused) heads win;
        - `w_h = ζ/r + (1−ζ) v_h`, floor `ζ ∈ (0, 1]` — every head keeps at least `ζ/r`; `ζ = 1` is uniform;
        - `μ^l_j = (1/G) Σ_h w_h a^h_j`, which sums to 1.

        Both the softmax and the floor are **[reconstructed]** in SPEC. What to look at: how `w`
        moves as `ζ` and `τ` move, and that a sink head ends at the floor.
        """),
        code(SETUP),
        code("""
        import torch
        from workbench.pooling import HeadPooling

        pooling = HeadPooling(zeta=0.5, tau=1.0)(cap)
        pooling.to_frame().query("layer == 15").round(4)
        """),
        md("""
        Head weights `w_h` per layer. Inside each KV group (3 query heads here) the weights sum to 1;
        the darkest cells are the heads whose residual attention is most concentrated.
        """),
        code('plots.head_heatmap(pooling, "w")'),
        md("""
        The residual rows of one layer: how much of each head's mass is left after removing the sinks, and
        how spread it is. A head with `z_h ≤ ρ_min` is invalid and gets weight only through the floor.
        """),
        code("plots.residual_distribution(pooling, layer=15, spans=spans)"),
        md("""
        ## Moving ζ and τ

        The same layer under a grid of `ζ` (floor) and `τ` (temperature). At `ζ = 1` every head has
        `1/r`; as `ζ → 0` and `τ → 0` each group's weight goes to its lowest-entropy head. Pooling is
        cheap: the observer means and entropies are cached per capture, so moving a slider costs only the
        softmax and the floor.
        """),
        code("""
        import pandas as pd
        import plotly.express as px

        layer = 15
        grid = []
        for zeta in (1.0, 0.5, 0.2, 0.05):
            for tau in (0.1, 0.3, 1.0, 3.0):
                w = HeadPooling(zeta=zeta, tau=tau)(cap).w[layer]
                grid += [dict(zeta=zeta, tau=tau, head=f"h{h} (g{g})", w=float(w[h]))
                         for h, g in enumerate(cap.head_group.tolist())]
        grid = pd.DataFrame(grid)
        fig = px.line(grid, x="tau", y="w", color="head", facet_col="zeta", log_x=True, markers=True,
                      template=plots.TEMPLATE, title=f"Layer {layer}: head weight w_h against τ, one panel per ζ")
        fig
        """),
        md("""
        ## Property (6) on real heads

        If head `h*` has entropy lower than each of its `r−1` siblings by at least `Δ`, then
        `w_{h*} ≥ ζ/r + (1−ζ)/(1 + (r−1) e^{−Δ/τ})`. Checked here for every layer and group of this capture.
        """),
        code("""
        import math

        zeta, tau, r = 0.5, 1.0, cap.r
        worst = math.inf
        for l in range(cap.L):
            for g in range(cap.G):
                heads = (cap.head_group == g).nonzero().flatten()
                H = pooling.H[l, heads]
                best = int(H.argmin())
                delta = float((H[torch.arange(len(heads)) != best] - H[best]).min())
                bound = zeta / r + (1 - zeta) / (1 + (r - 1) * math.exp(-delta / tau))
                worst = min(worst, float(pooling.w[l, heads[best]]) - bound)
        print(f"min over layers and groups of w_h* − bound = {worst:.3e}  (never negative)")
        assert worst >= -1e-12
        """),
        md("""
        ## A sink head goes to the floor

        The head with the flattest residual in a group (highest `H_h`) loses the softmax as `τ → 0`,
        and its weight tends to the floor `ζ/r` — it cannot vanish while `ζ > 0`.
        """),
        code("""
        g_heads = (cap.head_group == 0).nonzero().flatten()
        flat = int(g_heads[pooling.H[layer, g_heads].argmax()])
        for tau in (3.0, 1.0, 0.3, 0.1, 0.01):
            w = float(HeadPooling(zeta=0.5, tau=tau)(cap).w[layer, flat])
            print(f"τ = {tau:<5} w_{flat} = {w:.4f}   (floor ζ/r = {0.5 / cap.r:.4f})")
        assert abs(float(HeadPooling(zeta=0.5, tau=0.01)(cap).w[layer, flat]) - 0.5 / cap.r) < 1e-3
        """),
        md("""
        ## The pooled measure

        `μ^l` over the prompt, coloured by span. It sums to 1; chunks that the observers read carry more
        of it. Notebook 03 turns it into chunk priorities.
        """),
        code("""
        import plotly.graph_objects as go

        mu = pooling.mu[layer]
        chunk_of = spans.chunk_of()
        colors = [plots.NEUTRAL if c < 0 else (plots.ANSWER if spans.chunk_doc[c] == ex.answer_doc else plots.PALETTE[1])
                  for c in chunk_of.tolist()]
        fig = go.Figure(go.Bar(x=list(range(spans.T)), y=mu.numpy(), marker_color=colors,
                               customdata=list(spans.tokens), hovertemplate="%{x}: %{customdata}<br>μ=%{y:.4f}<extra></extra>"))
        fig.update_layout(template=plots.TEMPLATE, bargap=0, yaxis_type="log",
                          title=f"Pooled measure μ at layer {layer} (grey protected, orange chunks, green answer chunk)",
                          xaxis_title="prompt position", yaxis_title="μ_j")
        fig
        """),
    ]
    cells += panel_cells("HeadsPanel", "cap",
                         "The `ζ` and `τ` sliders recompute the pooling from the capture (cached statistics, no model "
                         "call) and update the head weights and the residual rows in place.")
    cells += check_cells("""
        onehot = torch.nn.functional.one_hot(cap.head_group, cap.G).double()     # [H_Q, G]
        group_sum = pooling.w @ onehot                                          # [L, G]: Σ_{h∈g} w_h
        sink = pooling.sink_mass                                                # [L, H_Q]
        mu_all = pooling.mu                                                     # [L, T]
        mu_again = torch.einsum("lh,lht->lt", pooling.w, pooling.a) / cap.G     # (1/G) Σ_h w_h a^h
        uniform = HeadPooling(zeta=1.0)(cap).w
        print(f"Σ_(h∈g) w_h over {cap.L} layers × {cap.G} groups: max |· − 1| = {float((group_sum - 1).abs().max()):.1e}")
        print(f"min w_h = {float(pooling.w.min()):.4f} ≥ floor ζ/r = {0.5 / cap.r:.4f}; at ζ = 1 every w_h = {float(uniform.mean()):.4f} = 1/r")
        print(f"sink mass in [{float(sink.min()):.3f}, {float(sink.max()):.3f}]; max |z_h + sink mass − 1| = {float((pooling.z + sink - 1).abs().max()):.1e}")
        print(f"μ: min {float(mu_all.min()):.2e}, max |Σ_j μ_j − 1| = {float((mu_all.sum(-1) - 1).abs().max()):.1e}, "
              f"max |μ − (1/G) Σ_h w_h a^h| = {float((mu_all - mu_again).abs().max()):.1e}")
        print(f"property (6): min margin w_h* − bound = {worst:.3e}; flat head {flat} at τ = 0.01: w = {float(HeadPooling(zeta=0.5, tau=0.01)(cap).w[layer, flat]):.4f}")
        assert torch.allclose(group_sum, torch.ones_like(group_sum), atol=1e-9)    # w_h sums to 1 in every group and layer
        assert float(pooling.w.min()) >= 0.5 / cap.r - 1e-12                        # the floor ζ/r
        assert torch.allclose(uniform, torch.full((cap.L, cap.H_Q), 1 / cap.r, dtype=torch.float64))
        assert float(sink.min()) >= 0 and float(sink.max()) <= 1 + 1e-6             # sink mass is a share of the row
        assert torch.allclose(pooling.z + sink, torch.ones_like(sink), atol=1e-5)   # sink + residual = the whole row
        assert float(mu_all.min()) >= 0 and torch.allclose(mu_all.sum(-1), torch.ones(cap.L, dtype=torch.float64), atol=1e-6)
        assert torch.allclose(mu_all, mu_again, atol=1e-9)                         # μ is the w-weighted mixture
        assert worst >= -1e-12
        """)
    return cells


# ----------------------------------------------------------------------------- 03 priorities and budget
def nb03():
    cells = [
        md("""
        # 03 · Chunk priorities and the saving budget

        SPEC §3 (paper §3.2) scores each candidate chunk from the pooled measure `μ^l`, calibrated
        against a **null** in which attention is spread evenly over the documents:

        - `p_j = μ_j / μ(𝒟)` on the documents, chunk mass `M_i = Σ_{j∈c_i} p_j`, null prior `π_i = n_i/N`;
        - lift `ℓ_i = (M_i + ε_s π_i) / ((1+ε_s) π_i)` (1 under the null);
        - concentration `κ_i ∈ [0, 1]` of the smoothed in-chunk distribution **[reconstructed]**;
        - priority `S_i = ln ℓ_i + λ κ_i` **[reconstructed]**; lowest `S_i` is removed first.

        The greedy proposer of SPEC §5 then scans chunks by increasing `S_i` and removes one only if every
        observer row's discarded mass stays within `ε_row`, until the saving target is met.
        """),
        code(SETUP),
        code("""
        import torch
        from workbench.pooling import HeadPooling
        from workbench.priorities import ChunkPriorities

        pooling = HeadPooling(zeta=0.5, tau=1.0)(cap)
        prio = ChunkPriorities(eps_s=0.1, lam=0.5).score(pooling.mu, spans)
        layer = 15
        prio.to_frame().query("layer == @layer").round(3)
        """),
        md("""
        ## The greedy proposal at one layer

        The row–chunk mass table `m_{ai} = A^{l,h}_u(c_i)` has one row per (head, observer) pair
        (`9 × 8 = 72` rows). With target 25 % of the candidate tokens and `ε_row = 0.2`:
        """),
        code("""
        from workbench.selection import GreedySelection, mass_table

        m = mass_table(cap.observer_attn(), spans)               # [L, H_Q * W_p, k]
        sel = GreedySelection(target=0.25, eps_row=0.2, m0=1).select(prio.S[layer], spans.n, m[layer])
        print(sel.verdict)
        print("scan order (lowest S first):", sel.scan_order, "→ removed", sel.removed)
        """),
        code("plots.chunk_priorities(prio, spans, layer=layer, removed=sel.removed)"),
        md("""
        ## Where the answer chunk ranks, layer by layer

        Rank 0 = highest priority (removed last). Rényi priorities against the comparison priorities of
        SPEC §3: mass only (`λ = 0`) and per-head max. Early layers rank the answer chunk poorly; the
        reading layers put it on top.
        """),
        code("""
        import pandas as pd
        import plotly.express as px
        from workbench.priorities import mass_only_priorities, per_head_max_priorities

        ans = spans.chunk_doc.index(ex.answer_doc)
        methods = {"Rényi (λ = 0.5)": prio.S, "mass only (λ = 0)": mass_only_priorities(pooling.mu, spans).S,
                   "per-head max": per_head_max_priorities(pooling.a, spans)}
        ranks = pd.DataFrame([dict(layer=l, method=name, rank=int((S[l] > S[l, ans]).sum()))
                              for name, S in methods.items() for l in range(cap.L)])
        px.line(ranks, x="layer", y="rank", color="method", markers=True, template=plots.TEMPLATE,
                title=f"Rank of the answer chunk c{ans} (0 = kept longest)")
        """),
        md("""
        ## The null and property (10)

        Under the uniform null (`μ` spread evenly over the documents) every chunk has `ℓ_i = 1`, `κ_i = 0`,
        `S_i = 0`. And because `κ ∈ [0, 1]`, `S_i − S_j ≥ ln(ℓ_i/ℓ_j) − λ` for every pair.
        """),
        code("""
        doc = spans.document_mask().to(torch.float64)
        null = ChunkPriorities(eps_s=0.1, lam=0.5).score(doc / doc.sum(), spans)
        assert torch.allclose(null.ell, torch.ones_like(null.ell)) and torch.allclose(null.kappa, torch.zeros_like(null.kappa), atol=1e-12)
        S, ell = prio.S, prio.ell
        gap = (S[:, :, None] - S[:, None, :]) - (torch.log(ell[:, :, None] / ell[:, None, :]) - prio.lam)
        print(f"min over layers and pairs of (S_i − S_j) − (ln ℓ_i/ℓ_j − λ) = {float(gap.min()):.3e}")
        assert float(gap.min()) >= -1e-12
        """),
        md("""
        ## Budget: saving target against the row tolerance

        How much the greedy scan removes (`D_l`, tokens) at this layer as the target and `ε_row` move,
        with the LP upper bound `U_l` on the best possible removal (SPEC §5). The scan stops at the first
        chunk that reaches the target, so `D_l` may overshoot it. Where the dashed `U_l` lies below the dotted
        diagonal the target is **provably** infeasible at that `ε_row`; where only the greedy misses, nothing
        is proved.
        """),
        code("""
        import plotly.graph_objects as go

        rows = []
        for eps_row in (0.05, 0.1, 0.2, 0.4):
            for target in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
                r = GreedySelection(target=target, eps_row=eps_row, m0=1).select(prio.S[layer], spans.n, m[layer])
                rows.append(dict(eps_row=eps_row, target=r.target_tokens, D=r.D, U=r.U, reached=r.reached,
                                 infeasible_proved=r.infeasible_proved))
        budget = pd.DataFrame(rows)
        fig = go.Figure()
        for color, (eps_row, g) in zip(plots.PALETTE, budget.groupby("eps_row")):
            fig.add_scatter(x=g.target, y=g.D, mode="lines+markers", line=dict(color=color), name=f"D_l, ε_row = {eps_row}")
            fig.add_scatter(x=g.target, y=g.U, mode="lines", line=dict(color=color, dash="dash"), name=f"U_l, ε_row = {eps_row}")
        fig.add_scatter(x=budget.target, y=budget.target, mode="lines", line=dict(color=plots.NEUTRAL, dash="dot"), name="D = target")
        fig.update_layout(template=plots.TEMPLATE, xaxis_title="saving target (tokens)", yaxis_title="tokens",
                          title=f"Layer {layer}: greedy removal D_l (solid) and LP bound U_l (dashed) against the target")
        fig
        """),
        code("budget.tail(6)"),
    ]
    cells += panel_cells("PriorityPanel", "cap, EntroPrefillParams(target=0.25, eps_row=0.2), layer=15",
                         "Move `λ`, `ε_s`, the saving target and `ε_row`: the priority bars, the greedy removal, its "
                         "envelope and the certificate of the layer follow. No model call.",
                         prelude="from workbench.params import EntroPrefillParams")
    cells += check_cells("""
        row_load = m[layer][:, sel.removed].sum(-1)              # every (head, observer) row's removed mass
        D_again = int(spans.n[sel.removed].sum())
        print(f"layer {layer}: removed chunks {sel.removed}: D_l = {sel.D} = Σ n_i = {D_again} tokens "
              f"(target {sel.target_tokens}), LP bound U_l = {sel.U:.2f}; max row load {float(row_load.max()):.3f} ≤ ε_row = 0.2")
        print(f"budget grid: {len(budget)} settings; max D_l − U_l = {float((budget.D - budget.U).max()):.2f}; "
              f"{int(budget.reached.sum())} reached the target, {int(budget.infeasible_proved.sum())} proved infeasible")
        print(f"property (10): min slack {float(gap.min()):.2e}; null priorities max |S_i| = {float(null.S.abs().max()):.1e}")
        assert sel.D == D_again and sel.D <= sel.U + 1e-6                              # greedy D_l ≤ LP bound U_l
        assert sel.reached and sel.D >= sel.target_tokens                              # the target is met at this layer
        assert float(row_load.max()) <= 0.2 + 1e-9 and len(sel.removed) <= spans.k - 1  # row constraints and m_0 = 1
        assert (budget.D <= budget.U + 1e-6).all()                                     # the certificate bounds every removal
        assert (budget.D[budget.reached] >= budget.target[budget.reached]).all()      # reached: removed ≥ target
        assert (budget.U[budget.infeasible_proved] < budget.target[budget.infeasible_proved]).all()
        assert not (budget.reached & budget.infeasible_proved).any()
        assert float(gap.min()) >= -1e-12 and float(null.S.abs().max()) < 1e-9
        """)
    return cells


# ----------------------------------------------------------------------------- 04 envelope
def nb04():
    cells = [
        md("""
        # 04 · The mixture deletion envelope

        SPEC §4 (paper §4.1). The pooled measure is a mixture of the observer rows:
        `μ = Σ_a ω_a A_a` with `ω_{h,u} = w_h/(G W_p)`. So a removal `E` with small pooled mass
        `q = μ(E)` cannot hide a large mass `η_a = A_a(E)` in any single row beyond

        `η ≤ min{1, q/ω, q + sqrt(D_χ²(A_a‖μ) · q(1−q))}`,   with `D_χ² ≤ 1/ω − 1`.

        What to look at: every observer row sits below its envelope, for every removal; the bound is
        attained by a constructed example; and the output of a head moves by at most `2Vη`.
        """),
        code(SETUP),
        code("""
        import torch
        from workbench.pooling import HeadPooling
        from workbench.priorities import ChunkPriorities
        from workbench.selection import GreedySelection, mass_table
        from workbench.envelope import envelope

        layer = 15
        pooling = HeadPooling(zeta=0.5, tau=1.0)(cap)
        prio = ChunkPriorities().score(pooling.mu, spans)
        sel = GreedySelection(target=0.25, eps_row=0.2).select(prio.S[layer], spans.n, mass_table(cap.observer_attn(), spans)[layer])
        A_obs = cap.observer_attn()                                   # [L, H_Q, W_p, T]
        env = envelope(A_obs[layer], pooling.mu[layer], pooling.omega[layer], spans.removal_mask(sel.removed), layer=layer)
        print(f"E = chunks {sel.removed}: q = μ(E) = {env.q:.4f}; max row mass η = {float(env.eta.max()):.4f}; "
              f"every row within its envelope: {env.all_hold}")
        env.to_frame().sort_values("eta", ascending=False).head(8).round(4)
        """),
        code("plots.envelope_rows(env)"),
        md("""
        ## Every removal, every row

        All `2^8 − 1 = 255` unions of chunks at this layer, every observer row: actual `η` against the
        envelope. No point may lie above the diagonal. The closer to it, the tighter the envelope.
        """),
        code("""
        import itertools
        import numpy as np
        import plotly.graph_objects as go

        pts = []
        for size in range(1, spans.k + 1):
            for E in itertools.combinations(range(spans.k), size):
                e = envelope(A_obs[layer], pooling.mu[layer], pooling.omega[layer], spans.removal_mask(E))
                assert e.all_hold, E
                pts.append(np.stack([e.bound.numpy(), e.eta.numpy()], 1))
        pts = np.concatenate(pts)
        print(f"{len(pts)} (row, E) pairs, none above the envelope; median η / envelope = {np.median(pts[:, 1] / pts[:, 0]):.3f}")
        fig = go.Figure([go.Scattergl(x=pts[:, 0], y=pts[:, 1], mode="markers", marker=dict(size=3, opacity=0.3), name="(row, E)"),
                         go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#D55E00"), name="η = envelope")])
        fig.update_layout(template=plots.TEMPLATE, title=f"Layer {layer}: every removal set, every observer row",
                          xaxis_title="envelope min{1, q/ω, q + sqrt(D_χ² q(1−q))}", yaxis_title="actual η = A_a(E)")
        fig
        """),
        md("""
        The divergence cap `D_χ² ≤ 1/ω − 1` holds for every row, at every layer:
        """),
        code("""
        from workbench.envelope import chi2_divergence

        ratio = max(float((chi2_divergence(A_obs[l].reshape(-1, spans.T), pooling.mu[l])
                           / (1 / pooling.omega[l].repeat_interleave(spans.W_p) - 1)).max()) for l in range(cap.L))
        print(f"max over layers and rows of D_χ² / (1/ω − 1) = {ratio:.4f}")
        assert ratio <= 1 + 1e-9
        """),
        md("""
        ## Sharpness (SPEC §4)

        Take a point mass `a`, a measure `b` supported elsewhere, `μ = ω a + (1−ω) b` and `E = supp a`.
        Then `q = ω` and the row `a` loses everything, `η = 1`, and both non-trivial terms of the envelope
        equal 1: it cannot be improved in general.
        """),
        code("""
        T, omega, f64 = 10, 0.2, torch.float64
        a = torch.zeros(T, dtype=f64); a[3] = 1
        b = torch.full((T,), 1 / (T - 1), dtype=f64); b[3] = 0
        mu = omega * a + (1 - omega) * b
        rows = torch.stack([a, b])[:, None, :]                           # two "heads", one row each
        e = envelope(rows, mu, torch.tensor([omega, 1 - omega], dtype=f64), a.bool())
        print(f"q = {e.q:.3f}, η(a) = {float(e.eta[0]):.3f}, q/ω = {float(e.term_ratio[0]):.3f}, "
              f"q + sqrt(D_χ² q(1−q)) = {float(e.term_chi2[0]):.3f}")
        assert abs(float(e.eta[0]) - 1) < 1e-12 and abs(float(e.term_ratio[0]) - 1) < 1e-9 and abs(float(e.term_chi2[0]) - 1) < 1e-9
        """),
        md("""
        ## From mass to output: `‖o − o_R‖ ≤ 2Vη`

        Removing `E` and renormalising moves a head's output by at most twice the largest value norm
        times the discarded mass. Equality: values `+V` on `E` and `−V` elsewhere along one direction.
        The capture records `V = max_j ‖v_j‖` per layer and KV head (`cap.vnorm_max`), so the bound for
        the real rows above is available without the values themselves.
        """),
        code("""
        from workbench.envelope import output_bound, output_shift

        V, eta = 2.5, 0.3
        row = torch.full((T,), (1 - eta) / (T - 3), dtype=f64); row[:3] = eta / 3
        E = torch.zeros(T, dtype=torch.bool); E[:3] = True
        vals = torch.zeros(T, 4, dtype=f64); vals[:, 0] = torch.where(E, V, -V)
        _, _, shift, eta_row = output_shift(row, vals, E)
        print(f"η = {eta_row:.3f}: ‖o − o_R‖ = {shift:.4f}, bound 2Vη = {output_bound(eta_row, V):.4f}")
        assert abs(shift - output_bound(eta_row, V)) < 1e-9

        g = cap.head_group
        real = output_bound(env.eta.view(cap.H_Q, -1).max(-1).values, cap.vnorm_max[layer, g].double())
        print("bound on the output change of each head at layer", layer, "under E:", real.numpy().round(2))
        """),
    ]
    cells += panel_cells("PriorityPanel", "cap, EntroPrefillParams(target=0.25, eps_row=0.2), layer=layer",
                         "The removal here is the greedy proposal; move the target, `ε_row` or the layer and the "
                         "envelope of every observer row follows the new removal. No model call.",
                         prelude="from workbench.params import EntroPrefillParams")
    cells += export_cells('{"envelope_rows": plots.envelope_rows(env)}')
    cells += check_cells("""
        removed_mask = spans.removal_mask(sel.removed)                         # bool [T], E = the greedy removal
        q_chk = float(pooling.mu[layer][removed_mask].sum())                   # q = μ(E)
        rows_chk = A_obs[layer].reshape(-1, spans.T).double()                  # [H_Q * W_p, T], a = (h, u)
        eta_chk = rows_chk[:, removed_mask].sum(-1)                            # η_a = A_a(E)
        omega_chk = pooling.omega[layer].repeat_interleave(spans.W_p)
        chi2_chk = chi2_divergence(rows_chk, pooling.mu[layer])
        bound_chk = torch.minimum(torch.minimum(torch.ones_like(eta_chk), q_chk / omega_chk),
                                  q_chk + torch.sqrt(chi2_chk * q_chk * (1 - q_chk)))
        slack = bound_chk - eta_chk
        files = sorted(p.suffix for paths in written.values() for p in paths)
        print(f"E = chunks {sel.removed} at layer {layer}: q = {q_chk:.4f}; {len(eta_chk)} rows, η ≤ envelope everywhere, "
              f"min slack {float(slack.min()):.4f} (row {int(slack.argmin())}: η = {float(eta_chk[slack.argmin()]):.4f})")
        print(f"all {len(pts)} (row, E) pairs: max η − envelope = {float((pts[:, 1] - pts[:, 0]).max()):.2e}; "
              f"max D_χ² / (1/ω − 1) = {ratio:.4f}")
        print(f"sharpness: η = {float(e.eta[0]):.3f} = q/ω = {float(e.term_ratio[0]):.3f}; output bound attained: "
              f"{shift:.4f} = 2Vη = {output_bound(eta_row, V):.4f}; exported {files}")
        assert abs(q_chk - env.q) < 1e-9 and torch.allclose(eta_chk, env.eta, atol=1e-6)
        assert torch.allclose(bound_chk, env.bound, atol=1e-9)
        assert bool((eta_chk <= bound_chk + 1e-6).all())                      # SPEC §4: η ≤ min{1, q/ω, q + sqrt(D_χ² q(1−q))}
        assert float((chi2_chk / (1 / omega_chk - 1)).max()) <= 1 + 1e-9       # D_χ² ≤ 1/ω − 1
        assert (pts[:, 1] <= pts[:, 0] + 1e-6).all() and ratio <= 1 + 1e-9
        assert abs(float(e.eta[0]) - 1) < 1e-12 and abs(shift - output_bound(eta_row, V)) < 1e-9
        assert files == [".csv", ".json", ".pdf", ".png", ".svg"] and all(p.stat().st_size > 0 for ps in written.values() for p in ps)
        """)
    return cells


# ----------------------------------------------------------------------------- 05 audit and layer selection
def nb05():
    cells = [
        md("""
        # 05 · Independent audit and adaptive layer selection

        SPEC §5–§6 (paper §4.2, §5). Every monitored layer `l` proposes a removal `E_l` from the proposal
        observers only (notebooks 02–04). A layer is **accepted** when

        1. residual and document mass are valid,
        2. the proposal reaches the saving target `D_l ≥ target`,
        3. the candidate is stable: `d_l = |R_l △ R_{l⁻}| / |R_l ∪ R_{l⁻}| ≤ d_max` for `streak` consecutive layers,
        4. an **independent audit** over rows after the documents bounds every head's discarded mass by `ε_audit`.

        The first accepted layer is `l*`; if none passes, the prefill runs in full (bypass). `trace()`
        replays the paper's steps 1–7 on a capture, without the model, and records every layer.
        """),
        code(SETUP),
        code("""
        from workbench.params import EntroPrefillParams
        from workbench.audit import trace

        params = EntroPrefillParams(zeta=0.5, tau=1.0, target=0.25, eps_row=0.2, streak=1, eps_audit=0.2,
                                    audit_mode="exact")
        tr = trace(cap, params)
        print(tr.decision)
        tr.to_frame()[["layer", "removed", "D", "U", "gap", "d", "streak", "max_audit_bound", "status"]].head(8)
        """),
        md("""
        ## The per-layer trace

        Proposal saving `D_l`, the LP certificate `U_l ≥ D*_l` and their gap, stability, streak, audit and
        the decision at each monitored layer. Layers after `l*` are shown as counterfactuals (not executed).
        """),
        code("plots.trace_layers(tr)"),
        md("""
        ## Certificate against the budget

        `U_l(y, t) = Σ_a y_a ε_a + t(k − m_0) + Σ_i [n_i − Σ_a y_a m_{ai} − t]_+` bounds the best removal for
        any prices `y, t ≥ 0`; LP prices make it tightest. Layers where `U_l` is below the target are
        provably infeasible at this `ε_row`; where `D_l < target ≤ U_l`, the greedy scan alone missed.
        """),
        code("plots.certificate(tr)"),
        md("""
        ## The audit at `l*`

        Audit population `ν`: the user-query rows after the documents (12 positions here, the default of
        SPEC §6). `E_l` was fixed from the proposal observers before any audit value was computed, and the
        audit thresholds were fixed in `params` before that. In **exact** mode the mean discarded mass over
        the population is computed exactly (`b = 0`). Every head must be within `ε_audit`.
        """),
        code("""
        au = tr.audits[tr.l_star]
        print(au.message)
        au.to_frame().round(4)
        """),
        md("""
        ## Sampled audit: when no layer can pass

        With an i.i.d. sample of `m_a` rows the Hoeffding radius is
        `b = sqrt(ln(J H_Q / δ) / (2 m_a))` over `J` monitored layers. If `b > ε_audit`, no layer can
        pass whatever the attention looks like, and the trace says so instead of failing silently.
        """),
        code("""
        import pandas as pd
        import plotly.express as px
        from workbench.audit import hoeffding_b

        J, H = len(tr.layers), cap.H_Q
        m_grid = [8, 16, 32, 64, 128, 256, 512, 1024]
        df = pd.DataFrame([dict(m_a=m, delta=d, b=hoeffding_b(m, d, J, H)) for m in m_grid for d in (0.01, 0.05, 0.2)])
        fig = px.line(df, x="m_a", y="b", color="delta", log_x=True, markers=True, template=plots.TEMPLATE,
                      title=f"Hoeffding radius b (J = {J} layers, H_Q = {H}); dashed: ε_audit = {params.eps_audit}")
        fig.add_hline(y=params.eps_audit, line_dash="dash")
        fig
        """),
        code("""
        sampled = trace(cap, params.replace(audit_mode="sampled", m_a=32))
        print(sampled.decision)
        print(*sampled.notes, sep="\\n")
        assert sampled.bypass and sampled.b > params.eps_audit
        """),
        md("""
        ## Sensitivity: which layer is accepted

        `l*` under a few settings of `ε_audit` and the streak requirement (`<NA>`: no layer passes, full
        prefill). A looser audit accepts earlier; a longer streak later. Each trace reuses the capture's
        cached statistics; no model call.
        """),
        code("""
        rows = []
        for eps_audit in (0.05, 0.1, 0.2, 0.4):
            for streak in (0, 1, 2):
                t = trace(cap, params.replace(eps_audit=eps_audit, streak=streak), certify=False)
                rows.append(dict(eps_audit=eps_audit, streak=streak, l_star=t.l_star, removed=t.removed,
                                 saved_tokens=sum(spans.n[i].item() for i in t.removed)))
        pd.DataFrame(rows).pivot(index="eps_audit", columns="streak", values="l_star").astype("Int64")   # <NA>: bypass
        """),
    ]
    cells += panel_cells("AuditPanel", "cap, params",
                         "Every parameter of the 7-step procedure; the trace, the certificates and the decision "
                         "follow. No model call (the LP certificates update when a slider is released).")
    cells += check_cells("""
        import math
        import torch

        f = tr.to_frame()
        certified = f[f.U.notna()]
        b_formula = math.sqrt(math.log(sampled.J * cap.H_Q / params.delta) / (2 * 32))      # m_a = 32
        b_grid = [math.sqrt(math.log(J * H / d) / (2 * m)) for m, d in zip(df.m_a, df.delta)]
        E_star = spans.removal_mask(tr.removed)
        eta_again = cap.attn[tr.l_star][:, tr.audit_rows][..., :spans.T][..., E_star].sum(-1).double()   # [H_Q, M]
        sens = pd.DataFrame(rows).pivot(index="eps_audit", columns="streak", values="l_star")
        print(f"l* = {tr.l_star}, E = chunks {tr.removed}: exact audit over {eta_again.shape[1]} rows, "
              f"max_h η_h = {float(au.eta.max()):.4f} ≤ ε_audit = {params.eps_audit}")
        print(f"U_l − D_l over {len(certified)} certified layers: min {float((certified.U - certified.D).min()):.3f}")
        print(f"Hoeffding radius at m_a = 32, δ = {params.delta}, J = {sampled.J}, H_Q = {cap.H_Q}: "
              f"sqrt(ln(J H_Q/δ)/(2 m_a)) = {b_formula:.4f} = trace's b {sampled.b:.4f} > ε_audit → bypass")
        print("l* by ε_audit (rows) × streak (columns), <NA> = bypass:\\n" + sens.astype("Int64").to_string())
        assert tr.l_star is not None and tr.records[tr.layers.index(tr.l_star)]["status"] == "accept"
        assert (certified.U >= certified.D - 1e-6).all()                    # U_l bounds the greedy removal
        assert au.b == 0 and torch.allclose(au.eta_rows, eta_again, atol=1e-6)          # the audit's rows, recomputed
        assert torch.allclose(au.eta, eta_again.mean(-1), atol=1e-6) and float(au.bound.max()) <= params.eps_audit
        assert abs(sampled.b - b_formula) < 1e-12 and sampled.bypass and sampled.b > params.eps_audit
        assert max(abs(a - b) for a, b in zip(df.b, b_grid)) < 1e-12
        for streak in sens.columns:                      # a looser audit never accepts later (NaN: bypass)
            ls = sens[streak].fillna(math.inf).tolist()
            assert all(x >= y for x, y in zip(ls, ls[1:])), (streak, ls)
        """)
    return cells


# ----------------------------------------------------------------------------- 06 pruned prefill and stability
def nb06():
    cells = [
        md("""
        # 06 · Pruned prefill and output stability

        SPEC §7 (paper §2.2, §6.2). `run_pruned` really prunes: the prompt runs through the model with
        per-layer hooks that take the 7-step decision **online**; at the accepted layer `l*` they keep the
        hidden states `X^{l*}|_R` and the KV entries of layers `≤ l*` at `R = [T] \\ E`, and every later layer
        runs on `R` only, with the **original** RoPE positions. Decoding continues at position `T` with a
        cache of `T' = |R|` entries. This is not textual truncation.

        Then the stability diagnostics compare the pruned and the full run layer by layer and check the
        first-token certificate `m > 2ΛΔ_L`.
        """),
        code("""
        import torch
        from workbench.models import load_model
        from workbench.examples import load_example
        from workbench.params import EntroPrefillParams
        from workbench.prune import run_pruned, run_full
        from workbench import plots

        lm = load_model(progress=False)
        ex = load_example()
        prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
        params = EntroPrefillParams(target=0.25, eps_row=0.2, streak=1, eps_audit=0.2)

        pruned = run_pruned(lm, prompt, params, max_new_tokens=8, keep_hidden=True, progress=False)
        full = run_full(lm, prompt, max_new_tokens=8, keep_hidden=True)
        print(pruned.decision)
        print(f"full  : {full.text!r}  (KV {full.kv_bytes / 2**20:.2f} MiB)")
        print(f"pruned: {pruned.text!r}  (KV {pruned.kv_bytes / 2**20:.2f} MiB)")
        """),
        md("""
        The per-layer trace of the layers that actually ran the decision (the same as notebook 05's, now
        computed inside the forward pass):
        """),
        code("""pruned.trace.to_frame()[["layer", "removed", "D", "d", "streak", "max_audit_bound", "status"]]"""),
        md("""
        ## Oracles (SPEC §7)

        - With `E = ∅` the pruned path reproduces the full forward exactly.
        - Pruning before layer 0 (`l* = −1`) reproduces a forward on the shortened token sequence with the
          original position ids.
        """),
        code("""
        E = pruned.removed
        nothing = run_pruned(lm, prompt, params, layer=10, removed=[], max_new_tokens=1, progress=False)
        before0 = run_pruned(lm, prompt, params, layer=-1, removed=E, max_new_tokens=1, progress=False)
        shortened = run_full(lm, prompt, max_new_tokens=1, positions=before0.retained)
        d0 = float((nothing.first_logits - full.first_logits).abs().max())
        d1 = float((before0.first_logits - shortened.first_logits).abs().max())
        print(f"E = ∅ vs full: max |Δ logit| = {d0:.2e};  l* = −1 vs shortened sequence: {d1:.2e}")
        assert d0 < 1e-4 and d1 < 1e-4
        """),
        md("""
        ## Drift and the first-token certificate (paper §6.2)

        For every layer after `l*`: drift `‖X^l|_R − Y^l‖_{max,2}` between the full trajectory restricted to
        `R` and the pruned one. With the full-context first-token margin `m = z_(1) − z_(2)` and
        `Λ = ‖W_out‖_{2→∞} c_final`, the certificate `m > 2ΛΔ_L` guarantees the same greedy first token.
        The composed bound `Σ_j e_j Π_{s>j} K_s` from weight norms is reported as it is — on a real model it
        is vacuous by many orders of magnitude (paper §6.3: products of `K_l` amplify small defects). Why a
        shallow audit cannot replace such premises about the later layers is notebook 10.
        """),
        code("""
        from workbench.stability import stability
        from workbench.util import one_thread

        with one_thread():           # the weight-norm constants are many small eigenvalue problems
            st = stability(lm, full, pruned, composed=True)
        st.summary()
        """),
        code("plots.drift(st)"),
        code("""
        print(f"margin m = {st.margin:.3f}, Λ = {st.Lambda:.3f}, Δ_L = {st.Delta_L:.3f}: 2ΛΔ_L = {2 * st.Lambda * st.Delta_L:.3f}")
        print(f"certified: {st.certified};  observed first-token agreement: {st.agree_first_token}")
        print(f"composed bound Σ e_j Π K_s = {st.composed_bound:.3g} (vacuous: {st.summary()['composed_vacuous']})")
        assert not (st.certified and not st.agree_first_token)      # the certificate is never wrong
        assert st.drift[st.l_star + 1] < 1e-3                         # the gather itself changes nothing
        """),
        md("""
        The certificate is only *sufficient*. On the bundled prompt (CPU, fp32) it fails by two orders of
        magnitude — the residual stream's drift after the gather is large in absolute terms, `2ΛΔ_L` is in the
        hundreds against a margin of a few logits — while the first token (and here the whole answer)
        agrees. Agreement is observed, not proved; the composed weight-norm bound is astronomically vacuous.
        """),
    ]
    cells += panel_cells("PrunePanel", "cap, lm, prompt, params, max_new_tokens=8",
                         "The sliders update the *predicted* decision from a capture (no model). The run button "
                         "calls the model: the pruned and the full prefill, the answers side by side and the drift.",
                         prelude="from workbench.capture import run_capture, RowSet\n\n"
                                 "cap = run_capture(lm, prompt, RowSet(tail=0), progress=False)")
    cells += check_cells("""
        from workbench.cost import kv_bytes_dense

        spans = prompt.spans
        removed_pos = {p for i in pruned.removed for p in range(*spans.chunks[i])}
        kept = set(pruned.retained.tolist())
        two_LD = 2 * st.Lambda * st.Delta_L
        e = next(lm.model.parameters()).element_size()                  # bytes per cache element (fp32 on a CPU)
        print(f"l* = {pruned.l_star}, removed chunks {pruned.removed}: T = {pruned.T} → T' = {pruned.T_prime} "
              f"({len(removed_pos)} chunk tokens removed, {len(kept)} kept)")
        print(f"pruned answer: {len(pruned.generated_ids)} tokens {pruned.text!r}; full: {full.text!r}")
        print(f"pruned KV cache after the prefill: {pruned.kv_bytes} bytes = 2 e L G d T' with e = {e}, T' = {pruned.T_prime}")
        print(f"oracles: E = ∅ {d0:.1e}, l* = −1 {d1:.1e}; drift at l*+1 {st.drift[st.l_star + 1]:.1e}; "
              f"m = {st.margin:.3f} vs 2ΛΔ_L = {two_LD:.3f} → certified {st.certified}, first tokens agree {st.agree_first_token}")
        assert not pruned.bypass and pruned.removed and pruned.l_star == st.l_star
        assert len(pruned.generated_ids) == 8 and pruned.text.strip() and len(full.generated_ids) == 8
        assert pruned.T_prime == len(pruned.retained) == len(kept) == pruned.T - len(removed_pos)   # kept-token count
        assert not (kept & removed_pos) and kept | removed_pos == set(range(pruned.T))
        assert pruned.kv_bytes == kv_bytes_dense(lm.shape, pruned.T_prime, e)    # a dense cache of T' entries per layer
        assert d0 < 1e-4 and d1 < 1e-4 and st.drift[st.l_star + 1] < 1e-3
        assert st.certified == (st.margin > two_LD) and not (st.certified and not st.agree_first_token)
        assert st.agree_first_token == (int(pruned.first_logits.argmax()) == int(full.first_logits.argmax()))
        """)
    return cells


# ----------------------------------------------------------------------------- 07 shift
def nb07():
    cells = [
        md("""
        # 07 · Prefill vs first decode: the attention shift

        SPEC §9 (`deferkv-guide.md`). KV eviction right after prefill (SnapKV) scores prompt tokens with the
        attention of the last prompt rows `r = −W+1 … 0`. DeferKV waits one step and adds the query of the
        first generated token, `r = 1`. The claim to check: the attention pattern **jumps** across the
        prefill/decode boundary (`0 → 1`) much more than between later decode steps (`1 → 2`, `2 → 3`), so one
        step of waiting buys a better view of what the answer will read.

        Rows are restricted to the prompt keys and renormalised; recall is the top-`k` overlap with the
        future reference (mean attention of the decode rows).
        """),
        code("""
        import torch
        from workbench.models import load_model
        from workbench.examples import load_example
        from workbench.capture import run_capture, RowSet
        from workbench.shift import ShiftAnalysis
        from workbench import plots

        lm = load_model(progress=False)
        prompt = load_example().build(lm.tokenizer, max_context=lm.shape.max_context)
        cap = run_capture(lm, prompt, RowSet(observers=False, audit=None, tail=16, n_decode=10), progress=False)
        print("answer:", repr(lm.tokenizer.decode(cap.generated_ids)))
        sh = ShiftAnalysis(k=32)(cap)
        sh.summary().round(3)
        """),
        code("plots.shift_steps(sh)"),
        md("""
        ## The boundary leap, per layer

        Recall gain across the boundary `0 → 1` against the later gains `1 → 2` and `2 → 3`, per layer
        (mean over KV groups). With the reference containing decode rows 1…n, rows 1–3 are partly compared
        with themselves; the held-out reference (decode rows 4…10) below removes that advantage.
        """),
        code("""
        import pandas as pd
        import plotly.graph_objects as go

        def gains(result):
            lf = result.leap_frame().query("level == 'group'")
            return lf.groupby("layer")[["gain_m10", "gain_01", "gain_12", "gain_23"]].mean()

        g = gains(sh)
        held = ShiftAnalysis(k=32, ref_start=4)(cap)
        gh = gains(held)
        fig = go.Figure([go.Scatter(x=g.index, y=g[c], mode="lines+markers", name=n) for c, n in
                         (("gain_m10", "−1 → 0 (inside the prompt)"), ("gain_01", "0 → 1 (boundary)"),
                          ("gain_12", "1 → 2"), ("gain_23", "2 → 3"))])
        fig.add_scatter(x=gh.index, y=gh["gain_01"], mode="lines", line=dict(dash="dash"), name="0 → 1, held-out reference")
        fig.update_layout(template=plots.TEMPLATE, title="Top-32 recall gain per step, mean over KV groups",
                          xaxis_title="layer", yaxis_title="recall gain")
        fig
        """),
        code("""
        summ = pd.concat([sh.summary().assign(reference="decode 1..10"), held.summary().assign(reference="held-out 4..10")])
        summ.query("level == 'group'")[["reference", "recall_0", "recall_1", "gain_01", "gain_12", "gain_23", "leap_fraction"]].round(3)
        """),
        md("""
        On the bundled prompt the recall jumps across the boundary and then flattens or falls (`1 → 2`,
        `2 → 3`) in most layers, also against the held-out reference. The last step *inside* the prompt
        (`−1 → 0`) gains almost as much as the boundary, though: the tail rows are still converging on the
        question, so the leap is real but not the only change. `benchmarks/RESULTS.md` has the same
        measurement on longer prompts.

        One head's rows side by side: the last prompt row (`r = 0`) and the first decode row (`r = 1`) at the
        layer with the largest boundary gain.
        """),
        code("""
        layer = int(g["gain_01"].idxmax())
        tail0 = int(cap.rows_of("tail")[-1]); dec1 = int(cap.rows_of("decode")[0])
        print(f"layer {layer}: rows {tail0} (r = 0, position {int(cap.row_pos[tail0])}) and {dec1} (r = 1)")
        plots.attention_strip(cap, layer=layer, head=0, row=tail0)
        """),
        code("plots.attention_strip(cap, layer=layer, head=0, row=dec1)"),
    ]
    cells += panel_cells("ShiftPanel", "cap, k=32",
                         "Choose `k`, the first decode row of the reference and the tail window. No model call.")
    cells += check_cells("""
        import math

        # by hand, for group 0 at the layer above: the rows r = 0 and r = 1 on the prompt keys, renormalised
        # per head and averaged over the group's heads; JSD with natural logs, unclamped
        T = prompt.T
        heads = (cap.head_group == 0).nonzero().flatten()
        def group_row(i):
            rows = cap.attn[layer][heads, i, :T].double()
            return (rows / rows.sum(-1, keepdim=True)).mean(0)
        def H(p):
            return -float(torch.special.xlogy(p, p).sum())
        p0, p1 = group_row(tail0), group_row(dec1)
        jsd_hand = H((p0 + p1) / 2) - (H(p0) + H(p1)) / 2
        i01 = int((sh.r == 0).nonzero())
        ref = torch.stack([group_row(int(i)) for i in cap.rows_of("decode")]).mean(0)        # decode rows 1..10
        top = lambda p: set(torch.topk(p, sh.k).indices.tolist())
        recall_hand = len(top(p1) & top(ref)) / sh.k
        gain = g[["gain_01", "gain_12", "gain_23"]].mean()
        print(f"layer {layer}, group 0: JSD(r=0, r=1) by hand {jsd_hand:.5f}, ShiftAnalysis {float(sh.jsd_group[layer, 0, i01]):.5f} "
              f"(ln 2 = {math.log(2):.4f}); top-{sh.k} recall at r = 1 by hand {recall_hand:.4f}, "
              f"ShiftAnalysis {float(sh.recall_group[layer, 0, i01 + 1]):.4f}")
        print(f"JSD over all layers, groups, steps in [{float(sh.jsd_group.min()):.4f}, {float(sh.jsd_group.max()):.4f}]; "
              f"recall in [{float(sh.recall_group.min()):.3f}, {float(sh.recall_group.max()):.3f}]")
        print(f"mean recall gain over layers: 0 → 1 {gain.gain_01:.3f}, 1 → 2 {gain.gain_12:.3f}, 2 → 3 {gain.gain_23:.3f}")
        assert 0 <= jsd_hand <= math.log(2) and abs(jsd_hand - float(sh.jsd_group[layer, 0, i01])) < 1e-6
        assert abs(recall_hand - float(sh.recall_group[layer, 0, i01 + 1])) < 1e-9
        assert float(sh.jsd_group.min()) >= 0 and float(sh.jsd_group.max()) <= math.log(2)
        assert ((sh.recall_group >= 0) & (sh.recall_group <= 1)).all() and len(cap.generated_ids) == 10
        assert gain.gain_01 > max(gain.gain_12, gain.gain_23)          # the boundary leap of the text above
        """)
    return cells


# ----------------------------------------------------------------------------- 08 eviction
def nb08():
    cells = [
        md("""
        # 08 · KV eviction policies on one footing

        SPEC §9. One prefill, then each policy keeps `B` prompt positions per layer and KV group (sinks and
        the last `recent` prompt tokens always kept) and the model decodes on the compacted cache at the
        original positions. Policies: full cache, StreamingLLM (sinks + recent), H2O (accumulated attention
        of all prompt queries), SnapKV (prompt-tail window at `t = 0`), **DeferKV** (the same plus the first
        decode row, evicting after step 1), Page-EntroKV (the pooling of SPEC §2 with pages of SPEC §8),
        random, and an oracle that scores with the full-cache answer's own attention.

        The test: a needle in a haystack from `data/needle_haystack.json` — paragraphs of plain prose with the
        password sentence in the middle. Which policies keep the needle's tokens, and which answer correctly?
        To keep the notebook quick on a CPU it uses five of the fourteen paragraphs (about 550 tokens, the
        needle at half depth); `benchmarks/RESULTS.md` has the same table on the full 1.5k-token prompt.
        """),
        code("""
        import torch
        from workbench.models import load_model
        from workbench.examples import load_example
        from workbench.eviction import default_policies, run_policies, survival_table, token_positions
        from workbench import plots

        import dataclasses

        lm = load_model(progress=False)
        full_ex = load_example("needle_haystack")
        lo, hi = full_ex.answer_doc - 2, full_ex.answer_doc + 3          # five paragraphs, the needle in the middle
        ex = dataclasses.replace(full_ex, documents=full_ex.documents[lo:hi], answer_doc=full_ex.answer_doc - lo)
        prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
        needle = token_positions(prompt, lm.tokenizer, ex.answer)
        print(f"T = {prompt.T}; answer {ex.answer!r} at positions {needle[0]}…{needle[-1]}")
        """),
        md("""
        All eight policies at `B = 64` and `B = 128` prompt positions (about 12 % and 23 % of the prompt), 20 new
        tokens, greedy. One shared prefill captures the union of the evidence the policies need.
        """),
        code("""
        policies = default_policies(n_sink=4, recent=32)
        results = run_policies(lm, prompt, policies, budgets=[64, 128], max_new_tokens=20, batch=True, progress=False)
        table = survival_table(results, needle, answer=ex.answer)
        table
        """),
        md("""
        Which prompt positions each policy kept (fraction of layers × KV groups holding each position, at
        `B = 64`), with the needle marked. StreamingLLM keeps only the two ends; H2O favours tokens many
        queries read; SnapKV/DeferKV and Page-EntroKV find the question's topic.
        """),
        code("plots.kept_positions([r for r in results if r.budget == 64 or r.policy == 'full'], prompt, highlight=needle)"),
        md("""
        ## KV bytes and the answers

        Every evicting policy holds the same `B` prompt entries per layer and KV group, plus the tokens
        generated before its eviction (one for DeferKV, which evicts after step 1): the same bytes up to that
        one token. They differ only in *which* entries.
        """),
        code("""
        import pandas as pd

        frame = pd.concat([r.to_frame() for r in results], ignore_index=True)
        frame["correct"] = table["correct"].values
        frame[["policy", "budget", "kv_bytes_before", "kv_bytes_after", "kv_ratio", "correct", "text"]]
        """),
        code("plots.kv_bytes_table(frame)"),
        md("""
        ## DeferKV's row weights

        DeferKV scores `S_i = Σ_r α_r A_{r,i}` over `r = −W+1 … 1` with `α_r ∝ exp(λr)`. With the guide's
        `λ = 0.1` and `W = 32` the decode row `r = 1` carries only ~10 % of the weight: the selection differs
        little from SnapKV. Larger `λ` leans on the first decode step.
        """),
        code("""
        import plotly.graph_objects as go
        from workbench.eviction import deferkv_alpha

        fig = go.Figure([go.Scatter(x=list(range(-31, 2)), y=deferkv_alpha(32, lam).numpy(), mode="lines+markers", name=f"λ = {lam}")
                         for lam in (0.0, 0.1, 0.3, 1.0)])
        fig.update_layout(template=plots.TEMPLATE, title="DeferKV weights α_r (W = 32)", xaxis_title="row r", yaxis_title="α_r")
        fig
        """),
    ]
    cells += panel_cells("EvictionPanel", "cap, lm, prompt, budget=64, max_new_tokens=20",
                         "Choose the policy, the budget and DeferKV's `λ`: the kept positions are previewed from a "
                         "capture of the prompt tail and the first decode row (no model). The run button generates "
                         "under the policy and shows the answer beside the full-cache answer.",
                         prelude="from workbench.capture import run_capture, RowSet\n\n"
                                 "cap = run_capture(lm, prompt, RowSet(tail=32, n_decode=1), progress=False)")
    cells += check_cells("""
        T, L, G = prompt.T, lm.shape.L, lm.shape.G
        always = torch.cat([torch.arange(4), torch.arange(T - 32, T)])      # n_sink = 4 sinks and the 32 most recent
        counts = []
        for r in results:
            if r.policy == "full":
                continue
            kp = r.kept_prompt                                               # [L, G, B] sorted prompt positions
            assert kp.shape == (L, G, r.budget), (r.policy, r.budget, kp.shape)
            assert bool((kp[..., 1:] > kp[..., :-1]).all()) and int(kp.min()) >= 0 and int(kp.max()) < T   # distinct
            assert all(bool(torch.isin(always, kp[l, g]).all()) for l in range(L) for g in range(G)), r.policy  # sinks + recent kept
            needle_kept = torch.isin(kp, torch.as_tensor(needle)).sum(-1).double().mean() / len(needle)   # mean over caches
            counts.append(dict(policy=r.policy, budget=r.budget, needle_kept=float(needle_kept)))
        counts = pd.DataFrame(counts)
        full_row = table[table.policy == "full"].iloc[0]
        per_entry = frame.kv_bytes_before / (T + frame.evicted_at)
        evicting = frame.policy != "full"
        print(f"T = {T}; every evicting policy keeps exactly B prompt positions per layer and KV group, the 4 sinks "
              f"and the last 32 included; full cache answer {full_row.answer!r} (correct: {full_row.correct})")
        print("share of the needle's tokens kept (mean over layers and KV groups):")
        print(counts.pivot(index="policy", columns="budget", values="needle_kept").round(3).to_string())
        assert full_row.correct and full_row.kept_mean == 1.0
        assert (abs(counts.needle_kept.values - table[evicting.values].kept_mean.values) <= 5e-4 + 1e-12).all()   # the table, recomputed
        assert (table[table.policy == "streaming"].kept_mean == 0).all()      # sinks + recent never reach mid-prompt
        # one footing: after eviction every policy holds B prompt entries plus the tokens generated before it
        assert (frame.kv_bytes_after[evicting] == per_entry[evicting] * (frame.budget + frame.evicted_at)[evicting]).all()
        """)
    return cells


# ----------------------------------------------------------------------------- 09 pages and cost
def nb09():
    cells = [
        md("""
        # 09 · GQA unions, pages, and what pruning costs

        SPEC §8 (paper §7) and the cost model of SPEC §7 (paper §8.1).

        **Pages.** A serving cache stores KV in pages of `b` tokens, one cache per KV group. Scoring per
        query head and keeping each head's top-`s` keys would, under GQA, keep the **union** over the group's
        heads — up to `r` times more (`UOR_g`). Page-EntroKV scores a page by the group score
        `p_{l,g}(j) = Σ_{h∈g} w_h a^h_j` and keeps the top-`K` pages per group.

        **Cost.** Pruning after `l*` saves the deep layers' work on `T − T'` tokens but pays for the shallow
        layers on all `T` tokens and for the row capture. Where is the break-even?
        """),
        code(SETUP),
        code("""
        import torch
        from workbench.pooling import HeadPooling
        from workbench.pages import PageSelection

        pooling = HeadPooling(zeta=0.5, tau=1.0)(cap)
        ps = PageSelection(b=16, K=4, s=32, e=2)
        pages = ps.select(pooling.a, pooling.w, cap.head_group, d=lm.shape.d)
        pages.to_frame().query("layer in (5, 15, 25)").round(3)
        """),
        code("plots.pages(pages, layer=15, spans=spans)"),
        md("""
        ## The bounds of SPEC §8, on real scores

        - `1 ≤ UOR_g ≤ min{r, T/s}`;
        - `K ≤ U_l ≤ min{GK, N_P}` for the page union;
        - lemma: a token with `p_{l,g}(j) > 1/(K+1)` always has its page kept.
        """),
        code("""
        L, G, N_P = pages.importance.shape
        r, T, K = cap.r, spans.T, ps.K
        assert ((pages.uor >= 1 - 1e-12) & (pages.uor <= min(r, T / pages.s) + 1e-12)).all()
        assert ((pages.U >= K) & (pages.U <= min(G * K, N_P))).all()
        heavy = pages.p > 1 / (K + 1)
        assert (pages.token_mask[heavy]).all()
        print(f"UOR_g: mean {float(pages.uor.mean()):.2f} (max possible {r}); U_l: {pages.U.min().item()}–{pages.U.max().item()} "
              f"of N_P = {N_P} pages; {int(heavy.sum())} heavy tokens, all kept")
        print("KV payload bytes:", pages.bytes)
        """),
        md("""
        How many pages the union needs as `K` grows (mean over layers), against the two extremes `K`
        (all groups agree) and `GK` (all disjoint):
        """),
        code("""
        import pandas as pd
        import plotly.express as px

        rows = []
        for K_ in (1, 2, 4, 8, 12):
            pr = PageSelection(b=16, K=K_, s=32).select(pooling.a, pooling.w, cap.head_group, d=lm.shape.d)
            rows.append(dict(K=K_, union=float(pr.U.double().mean()), lower=K_, upper=min(G * K_, N_P)))
        u = pd.DataFrame(rows)
        px.line(u.melt(id_vars="K"), x="K", y="value", color="variable", markers=True, template=plots.TEMPLATE,
                title="Page union U_l (mean over layers) against its bounds")
        """),
        md("""
        ## Break-even of pruned prefill (SPEC §7 cost)

        `F_EP = Σ_{l≤l*} F_l(T) + Σ_{l>l*} F_l(T') + F_aux` with per-layer FLOPs from the model config.
        The table gives, per gather layer `l*`, the largest kept fraction `T'/T` at which pruning still saves
        arithmetic: the row capture (`F_aux`) pulls it just below 1, and the deeper the gather, the more the
        shallow layers on all `T` tokens dominate the ratio in the figure. At `l* = L − 1` nothing is left to
        save and the capture still costs: no break-even (NaN).
        """),
        code("""
        import numpy as np
        from workbench.cost import CostModel, kv_bytes_dense

        cm = CostModel(lm.shape)
        T_long = 4096
        rows = spans.W_p + (spans.query[1] - spans.query[0])       # observers + audit rows captured per layer
        grid = cm.grid(T_long, l_stars=list(range(-1, lm.shape.L, 2)), keep_fractions=np.linspace(0.05, 1.0, 20), rows=rows)
        grid.to_frame().groupby("l_star").break_even_keep_fraction.first().round(3).to_frame().T
        """),
        code("plots.break_even(grid)"),
        md("""
        For this notebook's prompt: the adaptive decision of notebook 05 (same parameters, replayed from the
        capture) predicts this ratio of prefill FLOPs, and the dense KV cache shrinks accordingly:
        """),
        code("""
        from workbench.audit import trace
        from workbench.params import EntroPrefillParams

        tr = trace(cap, EntroPrefillParams(target=0.25, eps_row=0.2, streak=1, eps_audit=0.2), certify=False)
        T_, T_p, l_star = spans.T, len(tr.retained_positions()), tr.l_star
        executed = sum(1 for l in tr.layers if l <= l_star)         # monitored layers run before the gather
        ratio = float(cm.ratio(T_, T_p / T_, l_star, rows=rows, monitored_executed=executed))
        print(f"{tr.decision}")
        print(f"predicted F_EP / F_full = {ratio:.3f}; dense KV: {kv_bytes_dense(lm.shape, T_, 2) / 2**20:.2f} MiB → "
              f"{kv_bytes_dense(lm.shape, T_p, 2) / 2**20:.2f} MiB (bf16)")
        assert ratio < 1 and cm.break_even_keep_fraction(T_long, -1) == 1.0
        """),
    ]
    cells += panel_cells("PagesPanel", "cap, layer=15, s=32",
                         "Page size `b`, pages per group `K`, `ζ`, `τ` and the layer; the page scores, the selection "
                         "and the byte counts follow. No model call.")
    cells += check_cells("""
        import math

        U_again = pages.selected.any(1).sum(-1)                                 # [L] pages kept by some group
        b_, e_, d_ = pages.b, pages.e, pages.d
        be = grid.to_frame().groupby("l_star").break_even_keep_fraction.first()
        inner = be.drop(lm.shape.L - 1)
        removed_tokens = sum(int(spans.n[i]) for i in tr.removed)
        print(f"U_l recomputed from the selection: {U_again.min().item()}–{U_again.max().item()} pages, within "
              f"[K, min(GK, N_P)] = [{K}, {min(G * K, N_P)}]; UOR_g in [{float(pages.uor.min()):.2f}, {float(pages.uor.max()):.2f}] ⊂ [1, {min(r, T / pages.s):.0f}]")
        print(f"{int(heavy.sum())} tokens with p > 1/(K+1) = {1 / (K + 1):.3f}, all in kept pages; bytes {pages.bytes}")
        print(f"union against K: {u.union.round(2).tolist()} between {u.lower.tolist()} and {u.upper.tolist()}")
        print(f"break-even T'/T by l*: {be.round(3).to_dict()}")
        print(f"notebook 05's decision: T' = {T_p} = T − {removed_tokens}, l* = {l_star}, predicted F_EP / F_full = {ratio:.3f}")
        assert torch.equal(U_again, pages.U) and ((pages.U >= K) & (pages.U <= min(G * K, N_P))).all()
        assert ((pages.uor >= 1 - 1e-12) & (pages.uor <= min(r, T / pages.s) + 1e-12)).all()
        assert bool(pages.token_mask[heavy].all())                                   # the lemma of SPEC §8
        assert pages.bytes["per_group_pages"] == 2 * e_ * d_ * b_ * int(pages.K_lg.sum())
        assert pages.bytes["union"] == 2 * e_ * d_ * b_ * G * int(pages.U.sum())
        assert ((u.lower <= u.union) & (u.union <= u.upper)).all()
        assert be[-1] == 1.0 and math.isnan(be[lm.shape.L - 1])                      # nothing to save at l* = L − 1
        assert ((inner > 0) & (inner <= 1)).all() and (inner.diff().dropna() <= 1e-12).all()   # deeper gather: lower break-even
        assert T_p == T_ - removed_tokens and 0 < ratio < 1
        """)
    return cells


# ----------------------------------------------------------------------------- 10 the §6.1 counterexample
def nb10():
    return [
        md("""
        # 10 · Why a shallow certificate is insufficient (paper §6.1)

        The audit of notebook 05 certifies that the **shallow** attention (up to the gather layer `l*`)
        puts little mass on the removed tokens. Paper §6.1 shows that no bound depending only on that
        shallow mass can control the output: there are networks and prompt pairs where the shallow mass on
        the removed position tends to zero, while a **later** head reads that position with mass `1 − γ` and
        the first token changes.

        Here the construction is built by hand as a tiny two-layer attention network (plain torch, weights
        set explicitly) and checked numerically:

        - residual stream `x_j = [c_j, m_j, e_j, 1]`: a signed value coordinate `c` (`±V` at `j*`, else 0), a
          marker coordinate `m` (1 at `j*`), a position one-hot `e`, a constant;
        - **shallow layer**: query/key read only the position and the constant (never `c`) and give the last
          query mass exactly `ε` on `j*`; its output projection and MLP are zero, so the shallow prefix is
          the identity;
        - **deep layer**: its key reads the separate marker coordinate and gives mass `1 − γ` to `j*`; its
          value reads only `c`;
        - **readout**: two logits `z = (o, −o + β)` for a small `β > 0`.

        Two prompts A and B differ only in `c_{j*} = +V` vs `−V`. Remove `E = {j*}` after the shallow layer.
        """),
        code("""
        import math
        import torch

        f64 = torch.float64                              # float64 throughout: the checks below are tight
        T, j_star, V, beta = 8, 3, 2.0, 0.1
        D = 2 + T + 1                                  # [c, m, position one-hot (T), 1]
        C, M, POS, ONE = 0, 1, slice(2, 2 + T), 2 + T

        def prompt(sign):
            x = torch.zeros(T, D, dtype=f64)
            x[:, POS] = torch.eye(T, dtype=f64)
            x[:, ONE] = 1.0
            x[j_star, M] = 1.0
            x[j_star, C] = sign * V
            return x

        def attn(q, k, keys):
            \"\"\"Causal softmax row of the last query over the given key positions.\"\"\"
            return torch.softmax(q[-1] @ k[keys].T, dim=-1)

        class Net:
            \"\"\"Shallow layer (identity prefix) then one deep attention head and a two-logit readout.\"\"\"

            def __init__(self, eps, gamma):
                n_other = T - 1
                s1 = math.log(eps * n_other / (1 - eps))          # shallow: mass eps on j*
                s2 = math.log((1 - gamma) * n_other / gamma)       # deep: mass 1 - gamma on j*
                self.WQ1 = torch.zeros(D, 1, dtype=f64); self.WQ1[ONE, 0] = s1
                self.WK1 = torch.zeros(D, 1, dtype=f64); self.WK1[2 + j_star, 0] = 1.0    # reads the position, not c
                self.WQ2 = torch.zeros(D, 1, dtype=f64); self.WQ2[ONE, 0] = s2
                self.WK2 = torch.zeros(D, 1, dtype=f64); self.WK2[M, 0] = 1.0              # separate marker coordinate
                self.WV2 = torch.zeros(D, 1, dtype=f64); self.WV2[C, 0] = 1.0              # reads only the signed value

            def shallow_row(self, x):
                return attn(x @ self.WQ1, x @ self.WK1, torch.arange(T))     # [T]

            def forward(self, x, keep=None):
                \"\"\"Logits of the first token; ``keep``: retained positions after the shallow layer.\"\"\"
                # shallow layer: attention computed, then O_1 = 0 and MLP = 0 → X^1 = X^0
                x1 = x
                R = torch.arange(T) if keep is None else keep
                a2 = attn(x1[R] @ self.WQ2, x1[R] @ self.WK2, torch.arange(len(R)))
                o = float(a2 @ (x1[R] @ self.WV2)[:, 0])
                return torch.tensor([o, -o + beta], dtype=f64), a2

        net = Net(eps=1e-3, gamma=0.05)
        A, B = prompt(+1), prompt(-1)
        R = torch.tensor([j for j in range(T) if j != j_star])
        """),
        md("""
        ## Shallow evidence: identical, and tiny

        The shallow attention rows of A and B are **identical** (the shallow maps ignore `c`), and the mass on
        `j*` is `ε`. The audit of SPEC §6 (exact mode, one head, the last row) passes for any `ε_audit ≥ ε`;
        so does the envelope of SPEC §4. The retained states `X|_R` are identical between A and B too.
        """),
        code("""
        from workbench.audit import audit_bounds

        rowA, rowB = net.shallow_row(A), net.shallow_row(B)
        E = torch.zeros(T, dtype=torch.bool); E[j_star] = True
        au = audit_bounds(rowA[None, None, :], E, mode="exact", eps_audit=0.01)
        print(f"shallow rows equal: {torch.equal(rowA, rowB)}; mass on j*: {float(rowA[j_star]):.2e}")
        print(au.message)
        assert torch.equal(rowA, rowB) and au.passed and torch.equal(A[R], B[R])
        """),
        md("""
        ## Deep reference vs reduced outputs

        The full (reference) deep head reads `j*` with mass `1 − γ` and outputs `±(1−γ)V`. The reduced
        computation runs the deep layer on `R` only: its inputs are the same for A and B, so its outputs
        agree (here 0). By the triangle inequality at least one of the two errors is `≥ (1−γ)V`; in this
        construction both are. With the readout, prompt A's first token flips.
        """),
        code("""
        import pandas as pd

        rows = []
        for name, x in (("A (c = +V)", A), ("B (c = −V)", B)):
            for run, keep in (("full", None), ("reduced", R)):
                z, a2 = net.forward(x, keep)
                rows.append(dict(prompt=name, run=run, o=float(z[0]), z0=float(z[0]), z1=float(z[1]),
                                 first_token=int(z.argmax()), deep_mass_on_j=float(a2[j_star]) if keep is None else 0.0))
        out = pd.DataFrame(rows)
        out.round(4)
        """),
        code("""
        import plotly.graph_objects as go
        from workbench import plots

        fig = go.Figure()
        for tok, color in ((0, "#0072B2"), (1, "#E69F00")):
            fig.add_bar(x=out.prompt + " · " + out.run, y=out[f"z{tok}"], name=f"logit of token {tok}", marker_color=color)
        fig.update_layout(template=plots.TEMPLATE, barmode="group", title="First-token logits: full vs reduced (E = {j*})",
                          yaxis_title="logit")
        fig
        """),
        code("""
        err = [abs(out.o[0] - out.o[1]), abs(out.o[2] - out.o[3])]
        print(f"output errors |o − o_R|: A {err[0]:.4f}, B {err[1]:.4f}; lower bound (1−γ)V = {(1 - 0.05) * V:.4f}")
        assert max(err) >= (1 - 0.05) * V - 1e-9
        assert out.first_token[0] != out.first_token[1]     # prompt A: the removal changes the first token
        """),
        md("""
        ## Taking `ε → 0`

        The shallow mass on the removed position goes to zero; the deletion error does not move. Taking
        `γ → 0` pushes the error up to `V`. No bound that depends only on shallow discarded attention can
        vanish uniformly over this class of networks: the certificate needs premises about the later
        layers (paper §6.2–§6.3), which notebook 06 measures on the real model.
        """),
        code("""
        eps_grid = [10.0 ** -p for p in range(1, 10)]
        sweep = []
        for gamma in (0.3, 0.05, 0.001):
            for eps in eps_grid:
                n = Net(eps, gamma)
                oA = n.forward(A)[0][0]; oA_R = n.forward(A, R)[0][0]
                sweep.append(dict(eps=eps, gamma=gamma, shallow_mass=float(n.shallow_row(A)[j_star]),
                                  error=float(abs(oA - oA_R)), bound=(1 - gamma) * V))
        sweep = pd.DataFrame(sweep)
        fig = go.Figure()
        for gamma, g in sweep.groupby("gamma"):
            fig.add_scatter(x=g.eps, y=g.error, mode="lines+markers", name=f"deletion error, γ = {gamma}")
        g = sweep[sweep.gamma == 0.05]
        fig.add_scatter(x=g.eps, y=g.shallow_mass, mode="lines", line=dict(dash="dash", color="#000"), name="shallow mass on j*")
        fig.add_hline(y=V, line_dash="dot", annotation_text="V")
        fig.update_layout(template=plots.TEMPLATE, xaxis_type="log", yaxis_type="log", xaxis_title="ε",
                          yaxis_title="mass / error", title="Shallow mass → 0, deletion error stays ≥ (1−γ)V")
        fig
        """),
        *check_cells("""
        per_gamma = sweep.groupby("gamma").agg(min_shallow_mass=("shallow_mass", "min"), min_error=("error", "min"),
                                               max_error=("error", "max"), bound=("bound", "first"))
        print(per_gamma.to_string(float_format=lambda x: f"{x:.3g}"))
        print(f"ε = 1e-3: first token full A {out.first_token[0]}, reduced A {out.first_token[1]}; errors A {err[0]:.4f}, B {err[1]:.4f}")
        assert (abs(sweep.shallow_mass - sweep.eps) < 1e-9 * (1 + sweep.eps)).all()     # the shallow mass is exactly ε
        assert float(sweep.shallow_mass.min()) < 1e-8                                   # ... and goes to 0
        assert (sweep.error >= sweep.bound - 1e-9).all()                                # the error never drops below (1−γ)V
        assert ((per_gamma.max_error - per_gamma.min_error) < 1e-9).all()               # nor moves as ε → 0
        assert float(sweep[sweep.gamma == 0.001].error.min()) > 0.99 * V                # γ → 0: the error tends to V
        assert out.first_token[0] != out.first_token[1] and min(err) >= (1 - 0.05) * V - 1e-9
        """, "The shallow mass on the removed position per `γ` (smallest over the `ε` grid) and the deletion error "
             "(smallest and largest over the grid), against `(1 − γ)V`."),
    ]


NOTEBOOKS = {
    "01_capture_and_heads": nb01,
    "02_sinks_and_pooling": nb02,
    "03_chunk_priorities_and_budget": nb03,
    "04_mixture_envelope": nb04,
    "05_audit_and_layer_selection": nb05,
    "06_pruned_prefill_and_stability": nb06,
    "07_prefill_decode_shift": nb07,
    "08_kv_eviction": nb08,
    "09_pages_and_cost": nb09,
    "10_shallow_certificate_counterexample": nb10,
}


def build(name: str) -> nbformat.NotebookNode:
    nb = new_notebook(cells=NOTEBOOKS[name]())
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating an unchanged notebook gives the same file
        cell.id = f"{name[:2]}-{i:02d}"
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def main(argv: list[str]) -> None:
    wanted = [n for n in NOTEBOOKS if not argv or any(n.startswith(a) for a in argv)]
    for name in wanted:
        nb = build(name)
        nbformat.validate(nb)
        path = HERE / f"{name}.ipynb"
        tmp = path.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        tmp.replace(path)
        print(f"wrote {path.relative_to(ROOT)} ({len(nb.cells)} cells)")

if __name__ == "__main__":
    main(sys.argv[1:])
