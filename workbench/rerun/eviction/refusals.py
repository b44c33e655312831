"""Why a policy cannot run on a model's family: :func:`needs_refusal` (the evidence it asks for) and
:func:`policy_refusal` (a policy); ``None`` when it can. The eviction session refuses before its prefill, and
:func:`~workbench.rerun.eviction.generate.run_policies` records the refusal as that policy's result."""
from __future__ import annotations

from workbench.rerun.eviction.evidence import Needs
from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.run import adapter, families, rotary

__all__ = ["needs_refusal", "policy_refusal"]


def needs_refusal(model, needs: Needs, policy: str | None = None) -> str | None:
    """Why ``model``'s family cannot give the evidence ``needs`` asks for (``None`` when it can): the message
    names the policy (or the policy that asks for that evidence), the family and the reason."""
    fam = families.family_of(model)
    why = families.eviction_refusal(model, f"policy: {policy}" if policy else "eviction")
    if why:
        return why
    if needs.attn_inputs and fam.mla:
        return (f"policy: {policy or 'a kvpress press'} cannot run on {fam.name}: {families.MLA_PRESS}")
    if needs.attn_inputs and adapter.kv_ties(model) is not None:
        return (f"policy: {policy or 'a kvpress press'} cannot run on {fam.name}: a kvpress press scores each layer "
                f"from its attention module's own key projection and cache, one row per KV head of that layer, and "
                f"this model has KV-shared layers (no key projection nor cache of their own) or layers with fewer KV "
                f"heads ({adapter.layer_kv_heads(model)}), which one kept set per stored row must serve")
    if needs.qstats:
        why = rotary.unavailable(model)
        if why:
            return (f"policy: {policy or 'ExpectedAttention'} cannot run on {fam.name}: its query statistics need the "
                    f"rotary maps, {why}")
    return None


def policy_refusal(model, policy: EvictionPolicy) -> str | None:
    """Why ``policy`` cannot run on ``model``'s family (``None`` when it can): names the policy, the family
    and the reason."""
    return needs_refusal(model, policy.needs(), type(policy).__name__)
