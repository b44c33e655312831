"""The eviction policies, one short file each citing its paper (as kvpress does per press).

Every policy is a frozen dataclass whose fields are its parameters, with ``needs()`` (the evidence it
scores with), ``scores(ev) -> [L, G, T]``, ``protected(T)`` and ``defer`` (the decode step after which
it evicts). Adding a policy: one file here, one line in ``ALL_POLICIES``, one line in the contract test
(``tests/test_policy_contract.py``).
"""
from __future__ import annotations

from dataclasses import fields

from workbench.choices import PolicyName
from workbench.rerun.eviction.evidence import EvictionPolicy
from workbench.rerun.eviction.policies.adakv import AdaKV
from workbench.rerun.eviction.policies.criticalkv import CriticalKV
from workbench.rerun.eviction.policies.deferkv import DeferKV
from workbench.rerun.eviction.policies.entro_budget import EntroBudget
from workbench.rerun.eviction.policies.expected_attention import ExpectedAttention
from workbench.rerun.eviction.policies.full import FullCache
from workbench.rerun.eviction.policies.h2o import H2O
from workbench.rerun.eviction.policies.keydiff import KeyDiff
from workbench.rerun.eviction.policies.knorm import KNorm
from workbench.rerun.eviction.policies.oracle import OracleKV
from workbench.rerun.eviction.policies.page_entrokv import PageEntroKV
from workbench.rerun.eviction.policies.pyramidkv import PyramidKV
from workbench.rerun.eviction.policies.random_kv import RandomKV
from workbench.rerun.eviction.policies.snapkv import SnapKV
from workbench.rerun.eviction.policies.streaming_llm import StreamingLLM
from workbench.rerun.eviction.policies.tova import TOVA

__all__ = ["FullCache", "StreamingLLM", "H2O", "SnapKV", "DeferKV", "PageEntroKV", "RandomKV", "OracleKV", "TOVA", "KNorm",
           "KeyDiff", "CriticalKV", "PyramidKV", "AdaKV", "EntroBudget",
           "ExpectedAttention", "ALL_POLICIES", "POLICY_BY_NAME",
           "CLASSIC", "POLICY_GROUPS", "every_policy", "default_policies", "policy_from_params"]

ALL_POLICIES = (FullCache, StreamingLLM, H2O, SnapKV, DeferKV, PageEntroKV, RandomKV, OracleKV, TOVA, KNorm, KeyDiff,
                CriticalKV, ExpectedAttention, PyramidKV, AdaKV, EntroBudget)
POLICY_BY_NAME = {cls.name: cls for cls in ALL_POLICIES}


CLASSIC = (FullCache, StreamingLLM, H2O, SnapKV, DeferKV, PageEntroKV, RandomKV, OracleKV)
"""The eight policies of SPEC §9 (:func:`default_policies`)."""

POLICY_GROUPS: dict[str, tuple[str, ...]] = {
    "reference": ("full", "oracle", "random"),
    "attention-based": ("h2o", "snapkv", "tova", "page-entrokv", "criticalkv"),
    "attention-free": ("streaming", "knorm", "keydiff"),
    "forecast": ("expected-attention", "deferkv"),
    "budgets": ("pyramidkv", "adakv", "entro-budget"),
}
"""Every policy by family (the notebook and the eviction panel list them so): attention-based scores read
observed attention, attention-free ones the cache alone, forecasts predict the decode-time attention, and
budget allocations redistribute ``B`` over layers or KV heads on top of a base policy's scores."""


def _make(cls, common: dict) -> EvictionPolicy:
    names = {f.name for f in fields(cls)}
    kw = {k: v for k, v in common.items() if k in names}
    if "base" in names:  # wrappers (CriticalKV, budget allocations) rescale or reallocate SnapKV's scores
        kw["base"] = _make(SnapKV, common)
    return cls(**kw)


def default_policies(**common) -> list[EvictionPolicy]:
    """One instance of each of the eight SPEC §9 policies (:data:`CLASSIC`) with default parameters
    (``common`` e.g. ``n_sink=4, recent=32`` is passed to every policy that has the field)."""
    return [_make(cls, common) for cls in CLASSIC]


def every_policy(**common) -> list[EvictionPolicy]:
    """One instance of every policy (:data:`ALL_POLICIES`, in :data:`POLICY_GROUPS` order), ``common``
    passed to every policy that has the field; the wrappers get ``SnapKV(**common)`` as their base."""
    return [_make(POLICY_BY_NAME[n], common) for g in POLICY_GROUPS.values() for n in g]


def policy_from_params(name: PolicyName, **params) -> EvictionPolicy:
    """The policy dataclass called ``name`` (one of ``POLICY_BY_NAME``) with those of ``params`` that
    are its fields."""
    if name not in POLICY_BY_NAME:
        raise ValueError(f"policy: must be one of {sorted(POLICY_BY_NAME)}, got {name!r}")
    cls = POLICY_BY_NAME[name]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in params.items() if k in names and v is not None})
