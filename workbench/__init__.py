"""Attention workbench: attention-guided context pruning and KV-cache eviction, exact and fast.

Data flows one way, one folder per step:

- ``workbench.run``: load a model, build a prompt with its spans, greedy decoding (``adapter`` holds every
  contact with transformers internals);
- ``workbench.capture``: attention rows from the model's own kernel → :class:`Capture`;
- ``workbench.analyse``: pure functions of a capture and parameters (SPEC §2–§9);
- ``workbench.rerun``: what changes the model's computation (pruned prefill, stability, KV eviction);
- ``workbench.show``: figures, widgets, export;
- ``workbench.study``: sweeps, methods, the headless report.

Base helpers (``checks``, ``choices``, ``util``) sit below every step. The flat names below are the public
API; they are imported on first use, so ``import workbench`` stays cheap.
"""
from __future__ import annotations

import importlib

from workbench._version import __version__

_API = {
    "load_model": "workbench.run.models",
    "LoadedModel": "workbench.run.models",
    "build_prompt": "workbench.run.prompt",
    "Prompt": "workbench.run.prompt",
    "PromptSpans": "workbench.run.spans",
    "load_example": "workbench.run.examples",
    "run_capture": "workbench.capture",
    "RowSet": "workbench.capture",
    "Capture": "workbench.capture",
    "EntroPrefillParams": "workbench.analyse.params",
    "HeadPooling": "workbench.analyse.pooling",
    "ChunkPriorities": "workbench.analyse.priorities",
    "envelope": "workbench.analyse.envelope",
    "GreedySelection": "workbench.analyse.selection",
    "trace": "workbench.analyse.audit",
    "layer_proposal": "workbench.analyse.audit",
    "ShiftAnalysis": "workbench.analyse.shift",
    "PageSelection": "workbench.analyse.pages",
    "CostModel": "workbench.analyse.cost",
    "run_pruned": "workbench.rerun.prune",
    "run_full": "workbench.rerun.prune",
    "stability": "workbench.rerun.stability",
    "policies": "workbench.rerun.eviction",
    "EvictionSession": "workbench.rerun.eviction",
    "generate_with_policy": "workbench.rerun.eviction",
    "run_policies": "workbench.rerun.eviction",
    "preview": "workbench.rerun.eviction",
    "register_policy": "workbench.rerun.eviction",
    "check_policy": "workbench.rerun.eviction",
    "policy_registry": "workbench.rerun.eviction",
    "sweep": "workbench.study.sweep",
    "read_sweep": "workbench.study.sweep",
    "TaskItem": "workbench.study.tasks",
    "plots": "workbench.show",
    "widgets": "workbench.show",
    "export": "workbench.show.export",
    "export_all": "workbench.show.export",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    mod = importlib.import_module(_API[name])
    if name == "policies":
        value = importlib.import_module("workbench.rerun.eviction.policies")
    elif name == "policy_registry":
        value = mod.REGISTRY
    elif name in ("plots", "widgets"):
        value = importlib.import_module(f"workbench.show.{name}")
    else:
        value = getattr(mod, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
