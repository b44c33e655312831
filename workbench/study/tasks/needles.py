"""The needle families over a haystack of essays (``datasets.load_essays``, or ``--filler``): ``needle``,
``needle_diffuse``, ``needle_bridge``."""
from __future__ import annotations

from collections.abc import Sequence

import workbench.study.datasets as datasets
from workbench.study.tasks.haystack import Haystack, check_depth, check_lengths, count_tokens
from workbench.study.tasks.item import TaskItem, seeded_rng, with_content_id

__all__ = ["needle", "needle_diffuse", "needle_bridge"]

_COLORS = ("amber", "cobalt", "crimson", "ivory", "jade", "lilac", "ochre", "scarlet", "silver", "teal",
           "umber", "violet", "copper", "indigo", "saffron", "slate")
_ANIMALS = ("heron", "otter", "lynx", "badger", "falcon", "walrus", "gecko", "ibis", "marten", "newt",
            "puffin", "stoat", "tapir", "vole", "wren", "yak")
_INGREDIENTS = ("figs", "almonds", "honey", "cardamom", "lentils", "apricots", "walnuts", "fennel", "plums",
                "sesame", "chestnuts", "quinces", "barley", "juniper", "rhubarb", "pistachios", "sorrel",
                "nutmeg", "cranberries", "parsnips")
_FIRST = ("Ada", "Bruno", "Clara", "Dmitri", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kaja", "Lionel")
_LAST = ("Brennick", "Castellow", "Dunmore", "Eskeland", "Farrow", "Gallivan", "Hollister", "Ingram",
         "Jessop", "Kettering", "Lockhart", "Marlowe")
_TOWN_A = ("Oster", "Wend", "Kal", "Brun", "Tarn", "Mel", "Quen", "Hald", "Vor", "Lind")
_TOWN_B = ("leigh", "mark", "stead", "bury", "holm", "wick", "ford", "dal")


def _entity(rng) -> tuple[str, str]:
    return rng.choice(_COLORS), rng.choice(_ANIMALS)


def _own_facts(make_facts, keys: set, values: set, *seed_parts) -> dict:
    """The facts of one prompt, redrawn (seeded) until their key (the query) and value are new to the family."""
    for attempt in range(1000):
        facts = make_facts(seeded_rng(*seed_parts, "facts", *([attempt] if attempt else [])))
        if facts["query"] not in keys and facts["answers"][0] not in values:
            break
    keys.add(facts["query"])
    values.add(facts["answers"][0])
    return facts


def _needle_family(task, tokenizer, essays, lengths, n, seed, passage_tokens, layouts, make_facts):
    """Shared loop: for each replicate, each length and each layout (depths), one item with its own facts (its own
    key and value) in its own haystack, drawn from its own seeded region of the texts: no two prompts share a fact,
    and prompts built from one long text share few passages. Each item is its own ``cluster`` (``meta``)."""
    if not essays:
        raise ValueError("essays: must be a non-empty {name: text} mapping")
    out, keys, values = [], set(), set()
    for rep in range(n):
        for L in lengths:
            for depths in layouts:
                depth_tag = "-".join(f"{d:.2f}" for d in depths)
                facts = _own_facts(make_facts, keys, values, seed, task, rep, L, depth_tag)
                need = sum(count_tokens(tokenizer, " " + s) for s in facts["sentences"])
                hay = Haystack(tokenizer, essays, L - need, passage_tokens,
                               seeded_rng(seed, task, rep, L, depth_tag, "haystack"))
                docs, where = hay.documents(list(zip(depths, facts["sentences"])))
                kw = dict(answer_parts=facts.get("parts", ()))
                evidence = tuple(dict.fromkeys(where))
                answer_doc = where[facts.get("answer_fact", 0)]
                base = f"{task}-L{L}-d{depth_tag}-r{rep}"
                meta = dict(source=datasets.provenance(essays)["label"], length=L, depth=float(depths[0]),
                            depths=depth_tag, rep=rep, seed=seed, haystack_tokens=hay.total + need,
                            passages=len(docs), essays=",".join(hay.essays), region_start=hay.start,
                            cluster=f"{base}-s{seed}")
                item = TaskItem(task=task, item_id="-", documents=tuple(docs), query=facts["query"],
                                answers=facts["answers"], answer_doc=answer_doc, evidence_docs=evidence,
                                meta=meta, **kw)
                out.append(with_content_id(item, base))
    return out


def needle(tokenizer, essays: dict, *, lengths: Sequence[int] = (512, 1024, 2048),
           depths: Sequence[float] = (0.1, 0.5, 0.9), n: int = 1, seed: int = 0,
           passage_tokens: int = 128) -> list[TaskItem]:
    """Needle in a haystack: one secret-number fact at each depth of a haystack of each length.

    Args:
        tokenizer: measures lengths (the haystack plus needle is at most ``length`` tokens, short of
            it by less than one sentence).
        essays: ``{name: text}`` (:func:`workbench.study.datasets.load_essays`).
        lengths: haystack lengths in tokens, each in ``[64, 10^6]``.
        depths: relative needle positions in ``[0, 1]`` (0 = start, 1 = end).
        n: replicates, ``≥ 1`` (every prompt has its own fact and haystack region).
        passage_tokens: passage (candidate chunk) size in tokens, ``≥ 16``.
    """
    lengths = check_lengths(lengths, n, passage_tokens)
    layouts = [(check_depth("depths", d),) for d in depths]
    if not layouts:
        raise ValueError("depths: must be a non-empty list")

    def facts(rng):
        color, animal = _entity(rng)
        num = str(rng.randint(10000, 99999))
        return dict(sentences=[f"The secret number of the {color} {animal} is {num}."],
                    query=f"What is the secret number of the {color} {animal}?", answers=(num,))

    return _needle_family("needle", tokenizer, essays, lengths, n, seed, passage_tokens, layouts, facts)


def needle_diffuse(tokenizer, essays: dict, *, lengths: Sequence[int] = (512, 1024, 2048),
                   spread: Sequence[float] = (0.15, 0.5, 0.85), n: int = 1, seed: int = 0,
                   passage_tokens: int = 128) -> list[TaskItem]:
    """Diffuse evidence: ``len(spread)`` facts, each one ingredient of a secret recipe, at the depths
    ``spread`` (increasing, at least 2); the gold answer lists them all ("figs, almonds and honey"),
    ``answer_parts`` holds each (``contains`` needs all of them)."""
    lengths = check_lengths(lengths, n, passage_tokens)
    spread = tuple(check_depth("spread", d) for d in spread)
    if len(spread) < 2 or list(spread) != sorted(spread) or len(set(spread)) != len(spread):
        raise ValueError(f"spread: must be >= 2 strictly increasing depths, got {spread!r}")
    m = len(spread)
    words = {2: "two", 3: "three", 4: "four", 5: "five"}

    def facts(rng):
        color, animal = _entity(rng)
        ings = rng.sample(_INGREDIENTS, m)
        count = words.get(m, str(m))
        return dict(sentences=[f"One of the {count} secret ingredients of the {color} {animal} pie is {x}."
                               for x in ings],
                    query=f"What are the {count} secret ingredients of the {color} {animal} pie?",
                    answers=(", ".join(ings[:-1]) + " and " + ings[-1],), parts=tuple(ings))

    return _needle_family("needle_diffuse", tokenizer, essays, lengths, n, seed, passage_tokens, [spread], facts)


def needle_bridge(tokenizer, essays: dict, *, lengths: Sequence[int] = (512, 1024, 2048),
                  depth_pairs: Sequence[tuple[float, float]] = ((0.2, 0.8), (0.8, 0.2)), n: int = 1,
                  seed: int = 0, passage_tokens: int = 128) -> list[TaskItem]:
    """Multi-hop bridge: "The <entity> key is kept by <person>." at the first depth of each pair and
    "<person> lives in the town of <town>." at the second; the question names only the key. The
    answer document is the second fact's; both are evidence."""
    lengths = check_lengths(lengths, n, passage_tokens)
    layouts = []
    for pair in depth_pairs:
        if len(pair) != 2:
            raise ValueError(f"depth_pairs: every entry must be (depth of hop 1, depth of hop 2), got {pair!r}")
        layouts.append(tuple(check_depth("depth_pairs", d) for d in pair))
    if not layouts:
        raise ValueError("depth_pairs: must be a non-empty list")

    def facts(rng):
        color, animal = _entity(rng)
        person = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        town = rng.choice(_TOWN_A) + rng.choice(_TOWN_B)
        return dict(sentences=[f"The {color} {animal} key is kept by {person}.",
                               f"{person} lives in the town of {town}."],
                    query=f"In which town does the keeper of the {color} {animal} key live?",
                    answers=(town,), answer_fact=1)

    return _needle_family("needle_bridge", tokenizer, essays, lengths, n, seed, passage_tokens, layouts, facts)
