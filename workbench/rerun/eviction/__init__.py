"""One-shot KV-cache eviction policies on one footing (SPEC §9, deferkv-guide.md).

- :mod:`.evidence`: what a policy scores with (:class:`Needs`, :class:`Evidence`);
- :mod:`.select`: the one budget rule (:func:`preview`, :func:`select_keep`, :func:`resolve_budget`);
- :mod:`.outputs`: the contract's rules on what a policy returns, checked on every run (:class:`PolicyContractError`);
- :mod:`.policies`: one short file per policy, citing its paper (base classes in :mod:`.policies.base`);
- :mod:`.contract`: :func:`check_policy`, the policy contract as a table of passed/failed checks;
- :mod:`.registry`: :class:`PolicyRegistry`, every policy by name (``REGISTRY``: built-in and registered);
- :mod:`.session`: :class:`EvictionSession` (one prefill, many evictions); :mod:`.generate`: the one-call
  :func:`generate_with_policy` and :func:`run_policies`; :mod:`.result`: :class:`GenerationResult`;
- :mod:`.cache_evidence`: keys, values, ``‖W_O v‖`` and query statistics read from the model;
- :mod:`.agnostic`: question-agnostic eviction (context compressed once, several questions answered);
- :mod:`.compare`: two settings side by side (kept sets, answers, KV bytes, margins) for the compare mode.
"""
from workbench.rerun.eviction.agnostic import run_question_agnostic, split_question
from workbench.rerun.eviction.compare import (
    KeptComparison,
    RunComparison,
    compare_kept,
    compare_runs,
    kept_set,
    token_margin,
)
from workbench.rerun.eviction.contract import check_policy
from workbench.rerun.eviction.evidence import Evidence, Needs, pool
from workbench.rerun.eviction.generate import generate_with_policy, run_policies
from workbench.rerun.eviction.outputs import PolicyContractError
from workbench.rerun.eviction.policies import (
    ALL_POLICIES,
    CLASSIC,
    H2O,
    POLICY_BY_NAME,
    POLICY_GROUPS,
    REGISTRY,
    TOVA,
    AdaKV,
    CriticalKV,
    DeferKV,
    EntroBudget,
    ExpectedAttention,
    FullCache,
    KeyDiff,
    KNorm,
    OracleKV,
    PageEntroKV,
    PyramidKV,
    RandomKV,
    SnapKV,
    StreamingLLM,
    build_policy,
    default_policies,
    every_policy,
    policy_from_params,
    register_policy,
)
from workbench.rerun.eviction.policies.base import EvictionPolicy, protected_mask, split_budget
from workbench.rerun.eviction.policies.deferkv import deferkv_alpha
from workbench.rerun.eviction.registry import PolicyRegistry
from workbench.rerun.eviction.result import GenerationResult, PolicyRunError, survival_table, token_positions
from workbench.rerun.eviction.select import preview, resolve_budget, select_keep
from workbench.rerun.eviction.session import EvictionSession

__all__ = [
    "Needs", "Evidence", "EvictionPolicy", "FullCache", "StreamingLLM", "H2O", "SnapKV", "DeferKV",
    "PageEntroKV", "RandomKV", "OracleKV", "TOVA", "KNorm", "KeyDiff", "CriticalKV", "PyramidKV", "AdaKV",
    "EntroBudget", "ExpectedAttention", "ALL_POLICIES", "CLASSIC", "POLICY_BY_NAME", "POLICY_GROUPS", "REGISTRY", "PolicyRegistry",
    "register_policy", "build_policy", "check_policy", "default_policies", "every_policy",
    "policy_from_params", "select_keep", "split_budget", "preview", "pool", "protected_mask", "deferkv_alpha", "resolve_budget",
    "GenerationResult", "PolicyRunError", "PolicyContractError", "EvictionSession", "generate_with_policy", "run_policies", "run_question_agnostic", "split_question", "token_positions",
    "survival_table", "KeptComparison", "RunComparison", "compare_kept", "compare_runs", "kept_set", "token_margin",
]
