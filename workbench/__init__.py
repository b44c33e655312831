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
from typing import TYPE_CHECKING

from workbench._version import __version__

if TYPE_CHECKING:  # editors and type checkers read the flat names here (``X as X``: a re-export); at run time
    # __getattr__ imports each on first use. tests/test_readme.py checks that this block binds exactly NAMES and MODULES.
    from workbench.analyse.audit import hoeffding_b as hoeffding_b
    from workbench.analyse.cost import CostModel as CostModel
    from workbench.analyse.cost import kv_bytes_dense as kv_bytes_dense
    from workbench.analyse.counterexample import ShallowCounterexample as ShallowCounterexample
    from workbench.analyse.counterexample import deletion_sweep as deletion_sweep
    from workbench.analyse.divergence import AnswerDivergence as AnswerDivergence
    from workbench.analyse.envelope import chi2_divergence as chi2_divergence
    from workbench.analyse.envelope import envelope as envelope
    from workbench.analyse.envelope import output_bound as output_bound
    from workbench.analyse.envelope import output_shift as output_shift
    from workbench.analyse.pages import PageSelection as PageSelection
    from workbench.analyse.params import EntroPrefillParams as EntroPrefillParams
    from workbench.analyse.pooling import HeadPooling as HeadPooling
    from workbench.analyse.pooling import dominant_head_bound as dominant_head_bound
    from workbench.analyse.priorities import ChunkPriorities as ChunkPriorities
    from workbench.analyse.priorities import mass_only_priorities as mass_only_priorities
    from workbench.analyse.priorities import per_head_max_priorities as per_head_max_priorities
    from workbench.analyse.procedure import layer_proposal as layer_proposal
    from workbench.analyse.procedure import proposal_inputs as proposal_inputs
    from workbench.analyse.procedure import trace as trace
    from workbench.analyse.selection import GreedySelection as GreedySelection
    from workbench.analyse.selection import mass_table as mass_table
    from workbench.analyse.shift import ShiftAnalysis as ShiftAnalysis
    from workbench.capture import Capture as Capture
    from workbench.capture import RowSet as RowSet
    from workbench.capture import run_capture as run_capture
    from workbench.rerun.divergence import answer_divergence as answer_divergence
    from workbench.rerun.divergence import answer_divergences as answer_divergences
    from workbench.rerun.eviction import REGISTRY as policy_registry  # noqa: F401 (re-exported under its flat name)
    from workbench.rerun.eviction import EvictionPolicy as EvictionPolicy
    from workbench.rerun.eviction import EvictionSession as EvictionSession
    from workbench.rerun.eviction import Needs as Needs
    from workbench.rerun.eviction import check_policy as check_policy
    from workbench.rerun.eviction import compare_kept as compare_kept
    from workbench.rerun.eviction import generate_with_policy as generate_with_policy
    from workbench.rerun.eviction import policies as policies
    from workbench.rerun.eviction import preview as preview
    from workbench.rerun.eviction import register_policy as register_policy
    from workbench.rerun.eviction import run_policies as run_policies
    from workbench.rerun.eviction import survival_table as survival_table
    from workbench.rerun.eviction import token_positions as token_positions
    from workbench.rerun.prune import run_full as run_full
    from workbench.rerun.prune import run_pruned as run_pruned
    from workbench.rerun.stability import stability as stability
    from workbench.run.adapter import eager_attentions as eager_attentions
    from workbench.run.examples import load_example as load_example
    from workbench.run.models import LoadedModel as LoadedModel
    from workbench.run.models import load_model as load_model
    from workbench.run.prompt import Prompt as Prompt
    from workbench.run.prompt import build_prompt as build_prompt
    from workbench.run.spans import PromptSpans as PromptSpans
    from workbench.show import plots as plots
    from workbench.show import widgets as widgets
    from workbench.show.export import export as export
    from workbench.show.export import export_all as export_all
    from workbench.show.interactive import export_interactive as export_interactive
    from workbench.show.outputs import use_laid_out_outputs as use_laid_out_outputs
    from workbench.study import findings as findings
    from workbench.study import tasks as tasks
    from workbench.study.prompt_panel import PromptPanel as PromptPanel
    from workbench.study.ruler import ruler_grid as ruler_grid
    from workbench.study.sweep import read_sweep as read_sweep
    from workbench.study.sweep import sweep as sweep
    from workbench.study.tasks import TaskItem as TaskItem
    from workbench.util import one_thread as one_thread

# flat name -> the module that defines it (the object is ``getattr(module, name)``; "module:attr" where the
# module's own name differs)
NAMES = {
    "load_model": "workbench.run.models",
    "LoadedModel": "workbench.run.models",
    "build_prompt": "workbench.run.prompt",
    "Prompt": "workbench.run.prompt",
    "PromptSpans": "workbench.run.spans",
    "load_example": "workbench.run.examples",
    "eager_attentions": "workbench.run.adapter",
    "run_capture": "workbench.capture",
    "RowSet": "workbench.capture",
    "Capture": "workbench.capture",
    "EntroPrefillParams": "workbench.analyse.params",
    "HeadPooling": "workbench.analyse.pooling",
    "dominant_head_bound": "workbench.analyse.pooling",
    "ChunkPriorities": "workbench.analyse.priorities",
    "mass_only_priorities": "workbench.analyse.priorities",
    "per_head_max_priorities": "workbench.analyse.priorities",
    "envelope": "workbench.analyse.envelope",
    "chi2_divergence": "workbench.analyse.envelope",
    "output_shift": "workbench.analyse.envelope",
    "output_bound": "workbench.analyse.envelope",
    "GreedySelection": "workbench.analyse.selection",
    "mass_table": "workbench.analyse.selection",
    "hoeffding_b": "workbench.analyse.audit",
    "trace": "workbench.analyse.procedure",
    "layer_proposal": "workbench.analyse.procedure",
    "proposal_inputs": "workbench.analyse.procedure",
    "ShiftAnalysis": "workbench.analyse.shift",
    "PageSelection": "workbench.analyse.pages",
    "CostModel": "workbench.analyse.cost",
    "kv_bytes_dense": "workbench.analyse.cost",
    "ShallowCounterexample": "workbench.analyse.counterexample",
    "deletion_sweep": "workbench.analyse.counterexample",
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
    "survival_table": "workbench.rerun.eviction",
    "token_positions": "workbench.rerun.eviction",
    "compare_kept": "workbench.rerun.eviction",
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
    "export_interactive": "workbench.show.interactive",
    "use_laid_out_outputs": "workbench.show.outputs",
    "one_thread": "workbench.util",
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
