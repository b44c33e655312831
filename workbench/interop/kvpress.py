"""NVIDIA kvpress presses on the workbench's bench (the optional extra ``pip install -e .[kvpress]``).

:func:`from_press` wraps any kvpress ``ScorerPress`` as a workbench policy. At the end of prefill the eviction
session records, per layer, what kvpress's forward hook hands a press: the attention module, that layer's input
hidden states, its keys and values from the cache (post-RoPE) and the keyword inputs (``position_embeddings``,
``cache_position``). The wrapped policy calls ``press.score(module, hidden_states, keys, values, attentions,
kwargs)`` on them and its scores (``[L, G, T]``) go through the workbench's budget rule: ``B`` prompt positions
per layer and KV group (the press's own ``compression_ratio`` is not used; kvpress's ``int(T · (1 − ratio))``
is ``B``), the highest scores kept, ties to the lower position. So the press joins the panels, the sweeps and
the study (:func:`register_press` makes it usable by name). ``tests/peers/`` checks that the wrapped press keeps
exactly what kvpress's own pipeline keeps.

What is not wrapped, and why:

- presses that read the attention weights (``ObservedAttentionPress``; ``TOVAPress`` only when they are given):
  kvpress gets them from an eager prefill (``output_attentions``); the session's prefill runs the model's own
  kernel, so ``attentions`` is ``None`` and such a press computes what it does without them (TOVA: its own
  window attention) or fails;
- presses that are not ``ScorerPress`` (the budget wrappers ``AdaKVPress``, ``PyramidKVPress``,
  ``CriticalKVPress``' first stage, ``DecodingPress``, the merging and chunk presses): they change the
  cache themselves rather than score; the workbench has its own allocations (``AdaKV``, ``PyramidKV``).

The workbench's methods as kvpress presses: **DeferKV cannot be expressed faithfully in kvpress 0.5.5**, and
no press of that name is shipped. DeferKV evicts once, after the first decode step, scoring the prompt's keys
with the prompt-tail rows *and the first generated token's attention row* (SPEC §9). kvpress's presses compress
only inside the prefill forward (``BasePress.forward_hook`` returns without compressing when
``is_prefilling`` is false, so the first decode query is never seen), and ``DecodingPress`` — the one press
that acts while decoding — compresses every ``compression_interval`` steps down to a fixed ``target_size`` from a
buffer of the decode steps' hidden states, i.e. repeatedly and over the whole cache including generated
tokens, not once over the prompt with the prompt-tail rows. What is missing is a hook that (1) keeps the
prefill's tail-row scores, (2) runs at decode step 1 with that step's query, and (3) evicts prompt positions
only, once. ``EntroBudget`` and ``PageEntroKV`` score from the proposal observers' attention rows (and EntroBudget
allocates per KV head on top of H2O's column sums, which need every prompt query's attention): they are not
offered as presses in this version either.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

import torch
from kvpress import ScorerPress

from workbench.constraints import checks_for
from workbench.rerun.eviction import REGISTRY, EvictionPolicy, Needs

__all__ = ["PressPolicy", "from_press", "press_policy_class", "register_press"]

_CLASSES: dict = {}  # press class -> its policy class (one per press class, so that names stay stable)


@dataclass(frozen=True, eq=False)
class PressPolicy(EvictionPolicy):
    """A kvpress ``ScorerPress`` as a workbench policy (see the module docstring); build it with
    :func:`from_press`. Identity equality (a press is a mutable dataclass): each wrapped press is its own policy.

    Attributes:
        press: the kvpress ``ScorerPress``.
        n_sink, recent: positions always kept (0 and 0: kvpress's pipeline protects nothing).
    """

    press: object = None
    n_sink: int = 0
    recent: int = 0
    name: ClassVar[str] = "kvpress"
    CHECKS: ClassVar = MappingProxyType(checks_for("n_sink", "recent"))  # ``press`` is checked below

    def __post_init__(self):
        if not isinstance(self.press, ScorerPress):
            raise ValueError(f"press: must be a kvpress ScorerPress, got {type(self.press).__name__}")
        super().__post_init__()

    def needs(self) -> Needs:
        return Needs(keys=True, attn_inputs=True)

    @torch.no_grad()
    def scores(self, ev) -> torch.Tensor:
        inputs = ev.require("attn_inputs", f"{type(self.press).__name__}")
        keys, values = ev.require("keys", "a kvpress press"), ev.require("values", "a kvpress press")
        out = []
        for l, (module, hidden, pe) in enumerate(inputs):
            k = keys[l][None].to(hidden.device, hidden.dtype)
            v = values[l][None].to(hidden.device, hidden.dtype)
            kw = {"hidden_states": hidden, "position_embeddings": pe, "attention_mask": None,
                  "cache_position": torch.arange(ev.T, device=hidden.device)}
            s = self.press.score(module, hidden, k, v, None, kw)  # [1, G, T]
            if tuple(s.shape) != (1, ev.G, ev.T):
                raise ValueError(f"press: {type(self.press).__name__}.score gave shape {list(s.shape)} at layer {l}, "
                                 f"not [1, G={ev.G}, T={ev.T}]")
            out.append(s[0].detach().to("cpu", torch.float64))
        return torch.stack(out)


def _name(press_cls: type) -> str:
    base = press_cls.__name__.removesuffix("Press") or press_cls.__name__
    return "kvpress-" + re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", base).lower()


def press_policy_class(press_cls: type) -> type:
    """The policy class of a press class (a frozen dataclass named ``kvpress-<press>``, e.g. ``kvpress-knorm``
    for ``KnormPress``, whose default ``press`` is ``press_cls()``)."""
    if not (isinstance(press_cls, type) and issubclass(press_cls, ScorerPress)):
        raise ValueError(f"press: must be a kvpress ScorerPress class, got {press_cls!r}")
    if press_cls not in _CLASSES:
        ns = {"__annotations__": {"press": object}, "press": field(default_factory=press_cls),
              "name": _name(press_cls), "__module__": __name__,
              "__doc__": f"kvpress's {press_cls.__name__} through the workbench's budget rule (:func:`from_press`)."}
        _CLASSES[press_cls] = dataclass(frozen=True, eq=False)(type(f"{press_cls.__name__}Policy", (PressPolicy,), ns))
    return _CLASSES[press_cls]


def from_press(press, *, n_sink: int = 0, recent: int = 0) -> PressPolicy:
    """``press`` (a kvpress ``ScorerPress`` instance) as a workbench policy named ``kvpress-<press>``."""
    if not isinstance(press, ScorerPress):
        raise ValueError(f"press: must be a kvpress ScorerPress instance (its compress step is the workbench's "
                         f"budget rule), got {type(press).__name__}")
    return press_policy_class(type(press))(press=press, n_sink=n_sink, recent=recent)


def register_press(press_cls: type, group: str = "kvpress", *, replace: bool = False) -> str:
    """Register a press class's policy (its default press) in the workbench's registry, so that sweeps, the
    report and the panel take it by name; returns the name."""
    cls = press_policy_class(press_cls)
    REGISTRY.register(cls, group, replace=replace)
    return cls.name
