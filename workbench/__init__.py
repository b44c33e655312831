"""Attention workbench: attention-guided context pruning and KV-cache eviction, exact and fast.

Data flows one way, one folder per step:

- ``workbench.run``: load a model, build a prompt with its spans, greedy decoding (``adapter`` holds every
  contact with transformers internals);
- ``workbench.capture``: attention rows from the model's own kernel → :class:`Capture`;
- ``workbench.analyse``: pure functions of a capture and parameters (SPEC §2–§9);
- ``workbench.rerun``: what changes the model's computation (pruned prefill, stability, KV eviction);
- ``workbench.show``: figures, widgets, export;
- ``workbench.study``: sweeps, methods, the headless report.

Base helpers (``checks``, ``choices``, ``util``) sit below every step.

The flat API, ``import workbench as wb``, follows one rule:

- a flat name in lower case or CamelCase is the **function, class or object** itself (``wb.load_model``,
  ``wb.RowSet``, ``wb.trace``, ``wb.export``, ``wb.sweep``, ``wb.policy_registry``); it may share its name with the module that
  defines it (``wb.export`` is ``workbench.show.export.export``, ``wb.sweep`` is ``workbench.study.sweep.sweep``);
- a **module** is a flat name only as a namespace of a family of like objects, and its name is a plural noun
  (:data:`MODULES`: ``wb.plots`` figure functions, ``wb.widgets`` panels, ``wb.policies`` eviction policies,
  ``wb.tasks`` task families and ``TaskItem`` files, ``wb.findings`` paired comparisons).

Every flat name is imported on first use, so ``import workbench`` stays cheap (``tests/test_readme.py``
checks the rule and that the README's examples use only names that resolve).
"""
from __future__ import annotations

import importlib

from workbench._version import __version__

# flat name -> the module that defines it (the object is ``getattr(module, name)``; "module:attr" where the
# module's own name differs)
NAMES = {
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
    "trace": "workbench.analyse.procedure",
    "layer_proposal": "workbench.analyse.procedure",
    "ShiftAnalysis": "workbench.analyse.shift",
    "PageSelection": "workbench.analyse.pages",
    "CostModel": "workbench.analyse.cost",
    "run_pruned": "workbench.rerun.prune",
    "run_full": "workbench.rerun.prune",
    "stability": "workbench.rerun.stability",
    "answer_divergence": "workbench.rerun.divergence",
    "answer_divergences": "workbench.rerun.divergence",
    "AnswerDivergence": "workbench.analyse.divergence",
    "EvictionSession": "workbench.rerun.eviction",
    "EvictionPolicy": "workbench.rerun.eviction",
    "Needs": "workbench.rerun.eviction",
    "generate_with_policy": "workbench.rerun.eviction",
    "run_policies": "workbench.rerun.eviction",
    "preview": "workbench.rerun.eviction",
    "register_policy": "workbench.rerun.eviction",
    "check_policy": "workbench.rerun.eviction",
    "policy_registry": "workbench.rerun.eviction:REGISTRY",
    "sweep": "workbench.study.sweep",
    "read_sweep": "workbench.study.sweep",
    "TaskItem": "workbench.study.tasks",
    "ruler_grid": "workbench.study.ruler",
    "PromptPanel": "workbench.study.prompt_panel",
    "export": "workbench.show.export",
    "export_all": "workbench.show.export",
}
# flat namespace (a plural noun) -> the module it is
MODULES = {
    "plots": "workbench.show.plots",
    "widgets": "workbench.show.widgets",
    "policies": "workbench.rerun.eviction.policies",
    "tasks": "workbench.study.tasks",
    "findings": "workbench.study.findings",
}

__all__ = ["__version__", *NAMES, *MODULES]


def __getattr__(name: str):
    if name in MODULES:
        value = importlib.import_module(MODULES[name])
    elif name in NAMES:
        module, _, attr = NAMES[name].partition(":")
        value = getattr(importlib.import_module(module), attr or name)
    else:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
