"""Rényi priorities vs mass-only vs uniform vs random vs per-head max on the bundled 8-passage prompt.

Same constraints for every method (row tolerance ε_row, saving target, m_0), greedy proposal at every
layer 1…L−1 of a real capture of the default model. Reports, per method: mean tokens removed D_l, the
number of layers where the target was reached, and in how many layers the answer passage survived
(was not removed); and the trace decision (l*, removal) of the full 7-step procedure.

    python benchmarks/compare_priorities.py [--target 0.5] [--eps-row 0.2] [--out benchmarks/out/compare_priorities.json]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import _harness as harness

PRIORITIES = ("renyi", "mass", "uniform", "random", "headmax")


def compare(cap, target: float, eps_row: float, m0: int = 1, **params):
    from workbench.analyse.params import EntroPrefillParams
    from workbench.analyse.procedure import trace

    spans = cap.spans
    ans_chunk = spans.chunk_doc.index(spans.answer_doc) if spans.answer_doc in spans.chunk_doc else None
    rows = []
    for pr in PRIORITIES:
        p = EntroPrefillParams(priority=pr, target=target, eps_row=eps_row, m0=m0, **params)
        tr = trace(cap, p)
        df = tr.to_frame()
        ok = df[df["valid"]]
        survived = [ans_chunk not in set(r) for r in ok["removed"]]
        rows.append(dict(
            priority=pr, layers=len(ok), mean_D=float(ok["D"].mean()), max_D=int(ok["D"].max()),
            reached=int(ok["reached"].sum()), answer_survived=int(sum(survived)),
            mean_gap=float(ok["gap"].mean()), l_star=tr.l_star, removed_at_l_star=list(tr.removed),
            answer_survived_at_l_star=(None if tr.l_star is None else ans_chunk not in tr.removed),
        ))
    return rows


def to_markdown(rows, N, target, eps_row) -> str:
    lines = [f"| priority | mean D_l (of N={N}) | max D_l | layers reaching target | answer passage survived | "
             f"mean gap U−D | l* | removed at l* | answer kept at l* |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['priority']} | {r['mean_D']:.1f} | {r['max_D']} | {r['reached']}/{r['layers']} | "
                     f"{r['answer_survived']}/{r['layers']} | {r['mean_gap']:.1f} | {r['l_star']} | "
                     f"{r['removed_at_l_star']} | {r['answer_survived_at_l_star']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--eps-row", type=float, default=0.2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "compare_priorities.json"))
    a = ap.parse_args()
    from workbench.capture import RowSet, run_capture
    from workbench.run.examples import load_example
    from workbench.run.models import load_model

    lm = load_model(device="cpu", progress=False)
    prompt = load_example().build(lm.tokenizer)
    cap = run_capture(lm, prompt, RowSet(tail=0), progress=False)
    rows = compare(cap, a.target, a.eps_row, streak=0, eps_audit=0.3)
    md = to_markdown(rows, cap.spans.N, a.target, a.eps_row)
    print(f"bundled prompt: T={cap.T}, k={cap.spans.k}, N={cap.spans.N}, answer passage = chunk "
          f"{cap.spans.chunk_doc.index(cap.spans.answer_doc)}; target {a.target} of N, eps_row {a.eps_row}, m0 1, "
          f"audit exact eps_audit 0.3, streak 0")
    print(md)
    harness.write_json(a.out, dict(target=a.target, eps_row=a.eps_row, rows=rows))


if __name__ == "__main__":
    main()
