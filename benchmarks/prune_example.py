"""Side by side on the bundled 8-passage prompt: the answer with pruning and without (issue 4).

For a few settings (the adaptive 7-step procedure with default and with loose thresholds, and fixed
layers with the proposal ``E_l``): l*, removed chunks, T', whether the answer passage was removed, the
generated answer, the first-token margin, Δ_L, Λ, the certificate ``m > 2ΛΔ_L``, the observed
first-token agreement and the composed bound.

    python benchmarks/prune_example.py [--out benchmarks/out/prune_example.json]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import _harness as harness


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "prune_example.json"))
    ap.add_argument("--new-tokens", type=int, default=12)
    a = ap.parse_args()
    from workbench.analyse.params import EntroPrefillParams
    from workbench.rerun.prune import run_full, run_pruned
    from workbench.rerun.stability import stability
    from workbench.run.examples import load_example
    from workbench.run.models import load_model

    lm = load_model(device="cpu", progress=False)
    ex = load_example()
    prompt = ex.build(lm.tokenizer)
    spans = prompt.spans
    ans = spans.chunk_doc.index(ex.answer_doc)
    full = run_full(lm, prompt, max_new_tokens=a.new_tokens, keep_hidden=True)
    loose = EntroPrefillParams(eps_row=0.3, target=0.2, streak=0, eps_audit=0.5)
    settings = [("adaptive, defaults", EntroPrefillParams(), None),
                ("adaptive, loose (eps_row 0.3, target 0.2, streak 0, eps_audit 0.5)", loose, None),
                ("fixed l*=5, proposal E_l (loose)", loose, 5),
                ("fixed l*=15, proposal E_l (loose)", loose, 15),
                ("fixed l*=25, proposal E_l (loose)", loose, 25)]
    rows = [dict(setting="full context", l_star=None, removed=[], T=spans.T, T_prime=spans.T, answer_removed=False,
                 text=full.text, margin=None, Delta_L=None, Lambda=None, certified=None, agree=True, composed=None)]
    for name, p, layer in settings:
        r = run_pruned(lm, prompt, p, layer=layer, max_new_tokens=a.new_tokens, keep_hidden=True, progress=False)
        row = dict(setting=name, l_star=r.l_star, removed=r.removed, T=r.T, T_prime=r.T_prime,
                   answer_removed=ans in r.removed, text=r.text, decision=r.decision)
        if r.l_star is not None and r.removed:
            st = stability(lm, full, r)
            row.update(margin=st.margin, Delta_L=st.Delta_L, Lambda=st.Lambda, certified=st.certified,
                       agree=st.agree_first_token, composed=st.composed_bound)
        else:
            row.update(margin=None, Delta_L=None, Lambda=None, certified=None,
                       agree=r.generated_ids[0] == full.generated_ids[0], composed=None)
        rows.append(row)
    print(f"prompt: T={spans.T}, k={spans.k}, answer passage = chunk {ans}, answer {ex.answer!r}")
    print("| setting | l* | removed | T' | answer passage removed | answer | margin m | Δ_L | Λ | m > 2ΛΔ_L | same first token | composed bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    f = lambda x, fmt: "–" if x is None else format(x, fmt)  # noqa: E731
    for r in rows:
        print(f"| {r['setting']} | {r['l_star']} | {r['removed']} | {r['T_prime']} | {r['answer_removed']} | "
              f"{r['text'].strip()!r} | {f(r['margin'], '.3f')} | {f(r['Delta_L'], '.1f')} | {f(r['Lambda'], '.3f')} | "
              f"{r['certified'] if r['certified'] is not None else '–'} | {r['agree']} | {f(r['composed'], '.3g')} |")
    harness.write_json(a.out, dict(results=rows))


if __name__ == "__main__":
    main()
