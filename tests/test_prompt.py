"""Prompt spans on the real tokenizer (SPEC §0)."""
from __future__ import annotations

import pytest

from workbench.run.prompt import build_prompt

DOCS = ["The capital of France is Paris. It is large.", "Bananas are yellow fruit, rich in potassium.",
        "Ünïcode tëxt — with dashes, ‘quotes’ and 数字 123."]
Q = "What is the capital of France?"


def _decode(tok, spans, r):
    return tok.decode(list(spans.input_ids[r[0]:r[1]]))


def test_chunks_decode_back_to_documents(smollm):
    tok = smollm.tokenizer
    p = build_prompt(tok, DOCS, Q)
    s = p.spans
    assert s.k == 3 and s.chunk_doc == (0, 1, 2)
    for (a, b), d in zip(s.chunks, DOCS):
        assert _decode(tok, s, (a, b)) == d
    assert _decode(tok, s, s.query) == Q
    assert _decode(tok, s, s.instruction) == p.instruction
    # chunks are disjoint, ordered, and precede the query; observers are the last W_p query tokens
    ends = [e for _, e in s.chunks]
    starts = [a for a, _ in s.chunks]
    assert all(e <= a for e, a in zip(ends, starts[1:]))
    assert ends[-1] <= s.query[0]
    assert s.observers == tuple(range(s.query[1] - s.W_p, s.query[1]))
    assert s.W_p == min(8, s.query[1] - s.query[0])
    # everything outside the chunks is protected; ids match the chat template's tokenisation
    prot = s.protected_mask()
    assert int((~prot).sum()) == s.N == sum(e - a for a, e in s.chunks)
    ids = tok.apply_chat_template([{"role": "system", "content": p.instruction},
                                   {"role": "user", "content": p.text.split("user\n", 1)[1].split("<|im_end|>")[0]}],
                                  add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert list(ids) == list(s.input_ids)
    assert len(s.tokens) == s.T
    a, b = s.chunks[0]  # token strings for plotting read as the text (ASCII: no split bytes)
    assert "".join(s.tokens[a:b]) == DOCS[0]


def test_sink_inside_chunk_protects_whole_chunk(smollm):
    tok = smollm.tokenizer
    p = build_prompt(tok, DOCS, Q, instruction="", chat=False, n_sink=0)
    first = p.spans.documents[0]
    assert p.spans.k == 3
    n_sink = first[0] + 1  # one sink lands inside document 0
    q = build_prompt(tok, DOCS, Q, instruction="", chat=False, n_sink=n_sink)
    assert q.spans.protected_docs == (0,)
    assert q.spans.chunk_doc == (1, 2) and q.spans.k == 2
    assert q.spans.protected_mask()[first[0]:first[1]].all()


def test_no_documents_is_refused(smollm):
    """A prompt without documents has nothing to prune or evict: refused by name (it used to build with k = 0)."""
    for docs in ([], ()):
        with pytest.raises(ValueError, match=r"^documents: must hold at least one document"):
            build_prompt(smollm.tokenizer, docs, Q)


@pytest.mark.parametrize("query", ["\x00", "\u200d" * 20, " \ufeff\x07 "])
def test_a_query_without_visible_text_is_refused_like_a_document(smollm, query):
    with pytest.raises(ValueError, match=r"^query: has no visible text"):
        build_prompt(smollm.tokenizer, DOCS, query)
    assert build_prompt(smollm.tokenizer, DOCS, "\u200dWho?\x00").spans.k == len(DOCS)  # text around them is fine


@pytest.mark.parametrize("where,kw,pattern", [
    ("query", dict(query="Who \ud800?"), r"^query: holds a lone surrogate U\+D800 at character 4"),
    ("document", dict(documents=["fine.", "bad \udcff"]), r"^documents: document 1 holds a lone surrogate U\+DCFF"),
    ("instruction", dict(instruction="\ud83d"), r"^instruction: holds a lone surrogate U\+D83D at character 0"),
])
def test_a_lone_surrogate_is_a_named_error_not_a_tokenizer_type_error(smollm, where, kw, pattern):
    args = {"documents": DOCS, "query": Q, **kw}
    with pytest.raises(ValueError, match=pattern):
        build_prompt(smollm.tokenizer, args.pop("documents"), args.pop("query"), **args)


def test_plain_format_without_chat_template(smollm):
    p = build_prompt(smollm.tokenizer, DOCS[:2], Q, chat=False)
    assert p.text.endswith("Answer:") and "<|im_start|>" not in p.text
    assert _decode(smollm.tokenizer, p.spans, p.spans.chunks[1]) == DOCS[1]


@pytest.mark.parametrize("kwargs,match", [
    (dict(query=""), "query"),
    (dict(query="   "), "query"),
    (dict(documents=["ok", ""]), "documents"),
    (dict(W_p=50), r"W_p: must be in \[1, \d+\]"),
    (dict(W_p=0), "W_p"),
    (dict(n_sink=-1), "n_sink"),
    (dict(n_sink=10**6), r"^n_sink: must be an integer in \[0, (\d+)\] \(T = \1, the prompt's tokens\), got 1000000$"),
    (dict(max_context=20), "max_context"),
    (dict(answer_doc=7), "answer_doc"),
])
def test_bad_input_raises(smollm, kwargs, match):
    args = dict(documents=DOCS, query=Q)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build_prompt(smollm.tokenizer, args.pop("documents"), args.pop("query"), **args)


def test_example_prompt_spans(example_prompt, example, smollm):
    s = example_prompt.spans
    assert s.k == len(example.documents) == 8
    assert example.answer in _decode(smollm.tokenizer, s, s.chunks[s.chunk_doc.index(example.answer_doc)])
