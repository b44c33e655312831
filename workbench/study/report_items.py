"""The study's prompts for the report: the built-in families (SQuAD, needles, RULER-style, follow-up items) and
the user's files, each with the provenance of its source."""
from __future__ import annotations

import workbench.study.datasets as datasets
import workbench.study.ruler as ruler
import workbench.study.tasks as tasks
from workbench.study.followup import followup_multikey
from workbench.study.report_config import ReportConfig
from workbench.util import file_sha256

__all__ = ["data_source", "user_data", "study_items"]


def data_source(cfg: ReportConfig) -> str:
    """``"cache"`` or ``"sample"`` for the datasets loaders (``auto``: the cache when both sources are fetched)."""
    if cfg.data == "fetched":
        return "cache"
    if cfg.data == "sample":
        return "sample"
    return "cache" if datasets.is_fetched("squad") and datasets.is_fetched("essays") else "sample"


def user_data(cfg: ReportConfig) -> dict:
    """The user's files (``items``, ``filler``), read and validated completely before any model work: errors name
    the file, the line and the field."""
    return {"items": tasks.load_items(cfg.items) if cfg.items is not None else None,
            "filler": datasets.load_filler(cfg.filler) if cfg.filler is not None and (cfg.n_needle or cfg.n_followup)
            else None}


def study_items(cfg: ReportConfig, tokenizer, user: dict, max_context: int | None = None) -> tuple[list, list[dict]]:
    """The study's items and the provenance of every source they come from (label, kind, path, sha256, size,
    items used); ``user``: :func:`user_data`."""
    items, sources = [], []
    src = data_source(cfg)
    if cfg.n_squad:
        arts = datasets.load_squad(src)
        new = tasks.squad_single(arts, n=cfg.n_squad, n_distractors=cfg.n_distractors, seed=cfg.seed)
        items += new
        sources.append({**datasets.provenance(arts), "task": "squad_single", "items": len(new)})
    if cfg.n_needle:
        n = cfg.n_needle
        depths = (0.5,) if n == 1 else tuple(round(0.1 + 0.8 * i / (n - 1), 3) for i in range(n))
        hay = user["filler"] if user["filler"] is not None else datasets.load_essays(src)
        new = tasks.needle(tokenizer, hay, lengths=(cfg.needle_length,), depths=depths, n=1, seed=cfg.seed)
        items += new
        sources.append({**datasets.provenance(hay), "task": "needle", "items": len(new)})
    if cfg.ruler:
        new = ruler.ruler_grid(tokenizer, cfg.ruler, lengths=cfg.ruler_lengths, seeds=range(cfg.ruler_seeds),
                               max_context=max_context)
        items += new
        sources.append({"label": new[0].meta.get("source", "ruler-style"), "kind": "generated", "path": None,
                        "sha256": None,
                        "size": f"{len(new)} items", "description": "RULER-style synthetic families (study.ruler)",
                        "task": ", ".join(cfg.ruler), "items": len(new)})
    if cfg.n_followup:
        hay = user["filler"] if user["filler"] is not None else datasets.load_essays(src)
        new = followup_multikey(tokenizer, hay, lengths=(cfg.needle_length,), n=cfg.n_followup, seed=cfg.seed)
        items += new
        sources.append({**datasets.provenance(hay), "task": "followup_multikey", "items": len(new)})
    if cfg.items is not None:
        new = user["items"]
        items += new
        prov = {"label": new[0].meta["source"], "kind": "file", "path": str(cfg.items),
                "sha256": file_sha256(cfg.items), "size": f"{len(new)} items",
                "description": "TaskItems given by the user (JSONL)"}
        sources.append({**prov, "task": ", ".join(sorted({it.task for it in new})), "items": len(new)})
    return items, sources
