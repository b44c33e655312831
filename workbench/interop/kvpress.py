"""NVIDIA kvpress presses on the workbench's bench (the optional extra ``pip install -e .[kvpress]``).

:func:`from_press` wraps a kvpress ``ScorerPress`` as a workbench policy. At the end of prefill the eviction
session records, per layer, what kvpress's forward hook hands a press: the attention module, that layer's input
hidden states, its keys and values from the cache (post-RoPE) and the keyword inputs (``position_embeddings``,
``cache_position``). The wrapped policy calls ``press.score(module, hidden_states, keys, values, attentions,
kwargs)`` on them (torch's generator seeded with ``seed`` and restored after, so that a random press is
deterministic) and its scores (``[L, G, T]``, kvpress's own bit for bit) go through the workbench's budget rule:
``B`` prompt positions per layer and KV group (kvpress's ``int(T · (1 − ratio))`` is ``B``), the highest scores
kept, ties to the lower position (kvpress: torch.topk's unspecified order). The positions a press scores above
every other key by construction (SnapKV's window, TOVA's last token, ExpectedAttention's, CUR's and Compactor's
sinks, LagKV's sinks and unscored tail) are the policy's protected set, so that a budget below them is refused
(kvpress keeps an arbitrary part of them). A press whose scores depend on its own ``compression_ratio``
(StreamingLLM, Compactor with its default ``blending``) is evicted only at that ratio's budget; another is refused.
So the press joins the panels, the sweeps and the study (:func:`register_press` makes it usable by name).
``tests/peers/test_kvpress_from_press.py`` checks that the wrapped press keeps exactly what kvpress keeps for
14 settings of 12 presses (KNorm, KeyDiff, StreamingLLM, SnapKV ×2, TOVA, ExpectedAttention, LagKV
``cross_scoring=True`` ×2, LeverageScore, CUR, NonCausalAttn, Compactor, a seeded Random).

What is refused, and why (:func:`press_refusal`, the message names it):

- presses that read the attention weights (``ObservedAttentionPress``, ``CriticalKVPress`` on it): kvpress gets
  them from an eager prefill (``output_attentions``); the session's prefill runs the model's own kernel, so
  ``attentions`` is ``None`` (the workbench's ``H2O(normalise="mean")`` is that press; ``TOVAPress`` computes its
  own window attention when they are ``None``, as in kvpress's default pipeline);
- ``ScorerPress``es that override ``compress`` (``PyramidKVPress``: per-layer budgets; the workbench's
  ``PyramidKV``): their kept set is not their top scores under one budget;
- ``LagKVPress`` with its default ``cross_scoring=False``: its scores are ranks inside each partition of
  ``lag_size`` keys, so every partition has a key at each score and kvpress's set at the cut is torch.topk's
  choice among exact ties;
- presses that are not ``ScorerPress`` (the budget wrappers ``AdaKVPress``, ``DecodingPress``, the merging and
  chunk presses): they change the cache themselves rather than score; the workbench has its own allocations
  (``AdaKV``, ``PyramidKV``).

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

import contextlib
import re
from dataclasses import dataclass, field
from typing import ClassVar

import torch

try:
    from kvpress import (
        CapPress,
        CompactorPress,
        CriticalKVPress,
        CURPress,
        ExpectedAttentionPress,
        LagKVPress,
        ObservedAttentionPress,
        PyramidKVPress,
        ScorerPress,
        SnapKVPress,
        StreamingLLMPress,
        TOVAPress,
    )
except ModuleNotFoundError as e:
    if e.name != "kvpress":  # kvpress is there but something it needs is not: its own error says what
        raise
    raise ImportError("workbench.interop.kvpress needs NVIDIA kvpress, an optional extra that is not installed: "
                      "pip install -e '.[kvpress]' (or pip install 'kvpress>=0.5.5')", name="kvpress") from e

from workbench.checks import InstanceOf
from workbench.constraints import shared
from workbench.rerun.eviction import REGISTRY, EvictionPolicy, Needs

__all__ = ["PressPolicy", "from_press", "press_policy_class", "press_refusal", "register_press"]

_CLASSES: dict = {}  # press class -> its policy class (one per press class, so that names stay stable)


@dataclass(frozen=True, eq=False)
class PressPolicy(EvictionPolicy):
    """A kvpress ``ScorerPress`` as a workbench policy (see the module docstring); build it with
    :func:`from_press`. Identity equality (a press is a mutable dataclass): each wrapped press is its own policy.

    Attributes:
        press: the kvpress ``ScorerPress``.
        n_sink, recent: positions always kept (0 and 0: kvpress's pipeline protects nothing).
        seed: the seed of torch's random generator while the press scores (forked: the caller's generator is
            left as it was), so that a press that draws random numbers (``LeverageScorePress``'s and
            ``CompactorPress``' Gaussian sketch, ``RandomPress`` without a seed) scores deterministically; it keeps
            what kvpress's pipeline keeps after ``torch.manual_seed(seed)``.
    """

    press: object = None
    n_sink: int = 0
    recent: int = 0
    seed: int = 0
    name: ClassVar[str] = "kvpress"
    _parameter_constraints: ClassVar = {**shared("seed"),
                                        "press": InstanceOf(object, "a kvpress ScorerPress (press_refusal checks it)")}

    def __post_init__(self):
        why = press_refusal(self.press)
        if why:
            raise ValueError(why)
        super().__post_init__()

    def protected(self, T: int) -> torch.Tensor:
        """``n_sink`` / ``recent`` and the positions the press itself always keeps (it scores them above every
        other key: SnapKV's window, TOVA's last token, ExpectedAttention's, CapKV's, CUR's and Compactor's sinks, LagKV's
        sinks and unscored tail), so that a budget below them is refused rather than filled by torch.topk's
        arbitrary choice among their tied scores (what kvpress does)."""
        m = super().protected(T)
        first, last = _press_kept(self.press, T)
        m[: min(first, T)] = True
        if last > 0:
            m[max(0, T - last):] = True
        return m

    def needs(self) -> Needs:
        return Needs(keys=True, attn_inputs=True)

    def allocate(self, ev, budget: int) -> None:
        """``B`` everywhere; refuses a budget other than the press's own ``int(T · (1 − ratio))`` for a press whose
        scores depend on its ``compression_ratio`` (StreamingLLM's recent window, Compactor's default blending)."""
        r = _ratio_bound(self.press)
        if r is not None and budget < ev.T and budget != int(ev.T * (1 - r)):
            raise ValueError(f"budget: {type(self.press).__name__}'s scores depend on its compression_ratio={r}, so it "
                             f"keeps what kvpress keeps only at B = int(T·(1 − ratio)) = {int(ev.T * (1 - r))} "
                             f"(T={ev.T}), got {budget}; wrap a press built at the ratio of that budget")
        return None

    @torch.no_grad()
    def scores(self, ev) -> torch.Tensor:
        inputs = ev.require("attn_inputs", f"{type(self.press).__name__}")
        keys, values = ev.require("keys", "a kvpress press"), ev.require("values", "a kvpress press")
        out = []
        with _seeded(self.seed, inputs[0][1].device if inputs else torch.device("cpu")):
            for l, (module, hidden, pe) in enumerate(inputs):
                out.append(self._score_layer(ev, l, module, hidden, pe, keys, values))
        return torch.stack(out)

    def _score_layer(self, ev, l, module, hidden, pe, keys, values) -> torch.Tensor:
        k = keys[l][None].to(hidden.device, hidden.dtype)
        v = values[l][None].to(hidden.device, hidden.dtype)
        kw = {"hidden_states": hidden, "position_embeddings": pe, "attention_mask": None,
              "cache_position": torch.arange(ev.T, device=hidden.device)}
        s = self.press.score(module, hidden, k, v, None, kw)  # [1, G, T]
        if not isinstance(s, torch.Tensor):  # a list or an array: torch's own message would not name the press
            raise TypeError(f"press: {type(self.press).__name__}.score returned a {type(s).__name__} at layer {l}, "
                            f"not a torch.Tensor of [1, G={ev.G}, T={ev.T}]")
        if tuple(s.shape) != (1, ev.G, ev.T):
            raise ValueError(f"press: {type(self.press).__name__}.score gave shape {list(s.shape)} at layer {l}, "
                             f"not [1, G={ev.G}, T={ev.T}]")
        return s[0].detach().to("cpu", torch.float64)


def _ratio_bound(press) -> float | None:
    """The ``compression_ratio`` that ``press``'s scores depend on, or ``None`` when they do not (CriticalKV's first
    stage marks the top ``int((1 − ratio) · T · first_stage_ratio)`` of its scorer's scores; its scorer may itself
    depend on the ratio)."""
    if isinstance(press, StreamingLLMPress) or (isinstance(press, CompactorPress) and press.blending is None):
        return float(press.compression_ratio)
    if isinstance(press, CriticalKVPress):
        return float(press.compression_ratio) if press.first_stage_ratio > 0 else _ratio_bound(press.press)
    return None


def _press_kept(press, T: int) -> tuple[int, int]:
    """``(first, last)``: how many leading and trailing prompt positions ``press`` scores above every other key
    (kvpress 0.5.5's ``score`` pads them with the maximum), at prompt length ``T``; CriticalKV's are its scorer's."""
    if isinstance(press, CriticalKVPress):
        return _press_kept(press.press, T)
    if isinstance(press, SnapKVPress):
        return 0, press.window_size
    if isinstance(press, TOVAPress):
        return 0, 1
    if isinstance(press, (ExpectedAttentionPress, CapPress)):
        return press.n_sink, 0
    if isinstance(press, CURPress):
        return press.num_sinks, 0
    if isinstance(press, CompactorPress):
        return press.sink_size_start, press.sink_size_end
    if isinstance(press, LagKVPress) and T > press.n_sink:
        if T < press.n_sink + 2 * press.lag_size:  # too short to partition: sinks at 1, the rest ranked below
            return press.n_sink, 0
        end = press.n_sink + ((T - press.n_sink) // press.lag_size) * press.lag_size
        return press.n_sink, T - end + press.lag_size  # the last partition and the remainder are not scored
    return 0, 0


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device):
    """torch's generators (CPU, and ``device``'s if it is a CUDA device) seeded with ``seed``, restored after."""
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for i in cuda:
            torch.cuda.default_generators[i].manual_seed(seed)
        yield


def press_refusal(press) -> str | None:
    """Why ``press`` cannot be wrapped faithfully (the message names it), or ``None``."""
    if not isinstance(press, ScorerPress):
        return (f"press: must be a kvpress ScorerPress instance (its compress step is the workbench's budget rule), "
                f"got {type(press).__name__}")
    if type(press).compress is not ScorerPress.compress:
        return (f"press: {type(press).__name__} overrides ScorerPress.compress (its kept set is not its top scores "
                f"under one budget{', but per-layer budgets: use the workbench policy PyramidKV' if isinstance(press, PyramidKVPress) else ''}), "
                "so its scores through the workbench's budget rule would not keep what it keeps")
    inner = getattr(press, "press", None)  # a wrapper's scorer (CriticalKVPress)
    if isinstance(press, ObservedAttentionPress) or isinstance(inner, ObservedAttentionPress):
        return (f"press: {type(press).__name__} scores from the attention weights, which kvpress gets from an eager "
                "prefill and the session's prefill does not materialise (the workbench's H2O(normalise='mean') is "
                "ObservedAttentionPress, CriticalKV(base=that) its CriticalKVPress: tests/peers/test_kvpress_parity.py)")
    if isinstance(press, LagKVPress) and not press.cross_scoring:
        return ("press: LagKVPress with cross_scoring=False scores each key by its rank inside its partition of "
                f"lag_size={press.lag_size} keys, so every partition has one key at each score and the keys kvpress "
                "keeps at the cut are torch.topk's unspecified choice among exact ties (the workbench keeps the "
                "lower position): not the same set; LagKVPress(cross_scoring=True) is wrapped")
    return None


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


def from_press(press, *, n_sink: int = 0, recent: int = 0, seed: int = 0) -> PressPolicy:
    """``press`` (a kvpress ``ScorerPress`` instance) as a workbench policy named ``kvpress-<press>``; a press that
    cannot be wrapped faithfully is refused with the reason (:func:`press_refusal`)."""
    why = press_refusal(press)
    if why:
        raise ValueError(why)
    return press_policy_class(type(press))(press=press, n_sink=n_sink, recent=recent, seed=seed)


def register_press(press_cls: type, group: str = "kvpress", *, replace: bool = False) -> str:
    """Register a press class's policy (its default press) in the workbench's registry, so that sweeps, the
    report and the panel take it by name; returns the name."""
    cls = press_policy_class(press_cls)
    REGISTRY.register(cls, group, replace=replace)
    return cls.name
