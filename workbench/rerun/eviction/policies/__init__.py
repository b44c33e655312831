"""The eviction policies, one short file each citing its paper (as kvpress does per press).

Every policy is a frozen dataclass whose fields are its parameters, with ``needs()`` (the evidence it
scores with), ``scores(ev) -> [L, G, T]``, ``protected(T)`` and ``defer`` (the decode step after which
it evicts). Adding a built-in policy: one file here, one line in ``ALL_POLICIES`` and ``POLICY_GROUPS``, one
line in the contract test (``tests/test_policy_contract.py``). A user's policy is registered instead
(``wb.register_policy(MyPolicy, group="attention-based")`` or the ``workbench.policies`` entry point group): it
goes to :data:`REGISTRY` (:class:`~workbench.rerun.eviction.registry.PolicyRegistry`), where every caller that
takes a policy by name looks it up. ``ALL_POLICIES``, ``POLICY_BY_NAME`` and ``POLICY_GROUPS`` are the
built-ins only (constants); ``REGISTRY.names()`` and ``REGISTRY.groups()`` include the registered ones.
"""
from __future__ import annotations

from dataclasses import fields

from workbench.choices import PolicyName
from workbench.rerun.eviction.policies.adakv import AdaKV
from workbench.rerun.eviction.policies.base import EvictionPolicy
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
from workbench.rerun.eviction.registry import PolicyRegistry

__all__ = ["FullCache", "StreamingLLM", "H2O", "SnapKV", "DeferKV", "PageEntroKV", "RandomKV", "OracleKV", "TOVA", "KNorm",
           "KeyDiff", "CriticalKV", "PyramidKV", "AdaKV", "EntroBudget",
           "ExpectedAttention", "ALL_POLICIES", "POLICY_BY_NAME",
           "CLASSIC", "POLICY_GROUPS", "REGISTRY", "register_policy", "build_policy", "every_policy", "default_policies",
           "policy_from_params"]

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

REGISTRY = PolicyRegistry(EvictionPolicy, {g: tuple(POLICY_BY_NAME[n] for n in names) for g, names in POLICY_GROUPS.items()})
"""Every policy by name: the built-ins above and the registered ones (see :mod:`..registry`)."""


def register_policy(cls=None, group: str = "registered", *, replace: bool = False):
    """Register a policy class so that it can be used by name everywhere a built-in one is (``policy_from_params``,
    ``every_policy``, the eviction panel, ``sweep(..., {"evict": {"policy": [name, ...]}})``, the report).

    ``cls`` must be a frozen dataclass subclassing ``EvictionPolicy``, with ``needs()``, ``scores()``,
    ``protected()`` and its own ``name`` (``ClassVar[str]``) that is no built-in's and not registered yet
    (``replace=True`` replaces a registered one). ``group`` is a family of :data:`POLICY_GROUPS` or a new one.
    A bad class is refused with a ``ValueError`` naming what is missing, and nothing is registered. Returns
    ``cls`` (also usable as a decorator). Check it with ``wb.check_policy(cls)``; undo with
    ``REGISTRY.unregister(name)``.
    """
    return REGISTRY.register(cls, group, replace=replace)


def _make(cls, common: dict) -> EvictionPolicy:
    names = {f.name for f in fields(cls)}
    kw = {k: v for k, v in common.items() if k in names}
    if "base" in names:  # wrappers (CriticalKV, budget allocations) rescale or reallocate SnapKV's scores
        kw["base"] = _make(SnapKV, common)
    return cls(**kw)


def build_policy(cls, **common) -> EvictionPolicy:
    """An instance of the policy class ``cls`` with those of ``common`` that are its fields (a wrapper with a
    ``base`` field gets ``SnapKV(**common)``): how ``every_policy`` and the contract build a class."""
    return _make(cls, common)


def default_policies(**common) -> list[EvictionPolicy]:
    """One instance of each of the eight SPEC §9 policies (:data:`CLASSIC`) with default parameters
    (``common`` e.g. ``n_sink=4, recent=32`` is passed to every policy that has the field)."""
    return [_make(cls, common) for cls in CLASSIC]


def every_policy(**common) -> list[EvictionPolicy]:
    """One instance of every policy of :data:`REGISTRY` (built-in and registered, in group order), ``common``
    passed to every policy that has the field; the wrappers get ``SnapKV(**common)`` as their base."""
    return [_make(REGISTRY.get(n), common) for n in REGISTRY.names()]


def policy_from_params(name: PolicyName | str, **params) -> EvictionPolicy:
    """The policy dataclass called ``name`` (a built-in :data:`~workbench.choices.PolicyName`, a registered
    name, or ``"module:Class"``, imported and registered) with those of ``params`` that are its fields."""
    cls = REGISTRY.get(name)
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in params.items() if k in names and v is not None})
