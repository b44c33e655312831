"""Purpose-built policies that each breach one clause of the policy contract (tests/test_check_policy.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from workbench.rerun.eviction import EvictionPolicy, Needs, SnapKV


@dataclass(frozen=True)
class WrongShape(EvictionPolicy):
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "bad-shape"

    def scores(self, ev):
        return torch.zeros(ev.L, ev.T, dtype=torch.float64)  # no KV-group axis


@dataclass(frozen=True)
class NaNScores(EvictionPolicy):
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "bad-nan"

    def scores(self, ev):
        s = torch.arange(ev.T, dtype=torch.float64).expand(ev.L, ev.G, ev.T).clone()
        s[..., ev.T // 3] = float("nan")
        return s


@dataclass(frozen=True)
class UndeclaredKeys(EvictionPolicy):
    """Reads the cache's keys but declares nothing."""
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "bad-undeclared"

    def scores(self, ev):
        return -ev.require("keys", "UndeclaredKeys").double().norm(dim=-1)


@dataclass(frozen=True)
class MoreRowsThanDeclared(SnapKV):
    """Declares a 4-row tail but scores with every tail row the evidence holds."""
    name: ClassVar[str] = "bad-rows"

    def needs(self):
        return Needs(tail=4)

    def scores(self, ev):
        return ev.require("tail", "bad").double().sum(2).reshape(ev.L, ev.G, -1, ev.T).mean(2)


@dataclass(frozen=True)
class UnusedNeed(EvictionPolicy):
    """Declares H2O's column sums and never reads them."""
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "bad-unused"

    def needs(self):
        return Needs(colsum=True)

    def scores(self, ev):
        return torch.arange(ev.T, dtype=torch.float64).expand(ev.L, ev.G, ev.T).clone()


@dataclass(frozen=True)
class DropsProtected(EvictionPolicy):
    """+inf on the first half: those positions tie with the protected ones, and the budget rule's stable order
    (lower position first) then drops the protected recent window."""
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "bad-protected"

    def scores(self, ev):
        s = torch.zeros(ev.L, ev.G, ev.T, dtype=torch.float64)
        s[..., : ev.T // 2 + 4] = float("inf")
        return s


@dataclass(frozen=True)
class Unseeded(EvictionPolicy):
    """Random scores from the global generator."""
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "bad-unseeded"

    def scores(self, ev):
        return torch.rand(ev.L, ev.G, ev.T, dtype=torch.float64)


@dataclass(frozen=True)
class TwoStepDefer(SnapKV):
    """Claims to evict after decode step 2, which the session does not support: at B >= T the first decode
    step it pretends to have run is missing and the tokens differ from the full cache's."""
    name: ClassVar[str] = "bad-defer"
    defer: ClassVar[int] = 2


@dataclass(frozen=True)
class TopHeavy(SnapKV):
    """A per-layer allocation that forgets the cap ``B_l ≤ T``: layer 0 gets twice the others' share, so at
    ``B = T`` it asks for more than ``T`` positions and the other layers for fewer: not the full cache."""
    name: ClassVar[str] = "bad-full"

    def allocate(self, ev, budget):
        w = torch.tensor([2.0] + [1.0] * (ev.L - 1))
        per = torch.round(w / w.sum() * ev.L * budget).to(torch.int64)
        per[-1] += ev.L * budget - int(per.sum())
        return per[:, None].expand(ev.L, ev.G).clone()


@dataclass(frozen=True)
class Raising(EvictionPolicy):
    """Fails whenever it scores (a bug in a user's policy): every cell it runs in must be a failed cell."""
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "bad-raising"

    def scores(self, ev):
        raise RuntimeError("this policy always fails")


@dataclass(frozen=True)
class KeepsEverything(SnapKV):
    """An allocation that gives every layer and KV group all T positions: keeps more than the budget."""
    name: ClassVar[str] = "bad-alloc-all"

    def allocate(self, ev, budget):
        return torch.full((ev.L, ev.G), ev.T)


@dataclass(frozen=True)
class FloatCounts(SnapKV):
    """An allocation of float counts (each B + 0.7): truncation would silently change them."""
    name: ClassVar[str] = "bad-alloc-float"

    def allocate(self, ev, budget):
        return torch.full((ev.L, ev.G), budget + 0.7, dtype=torch.float64)


@dataclass(frozen=True)
class InfScores(SnapKV):
    """-inf on a few positions (NaN was refused at run time; ±inf was not)."""
    name: ClassVar[str] = "bad-inf"

    def scores(self, ev):
        s = super().scores(ev).clone()
        s[..., 10:13] = float("-inf")
        return s


@dataclass(frozen=True)
class NumpyScores(SnapKV):
    name: ClassVar[str] = "bad-numpy"

    def scores(self, ev):
        return super().scores(ev).numpy()


@dataclass(frozen=True)
class ListScores(SnapKV):
    name: ClassVar[str] = "bad-list"

    def scores(self, ev):
        return super().scores(ev).tolist()


@dataclass(frozen=True)
class IntProtected(SnapKV):
    name: ClassVar[str] = "bad-prot-int"

    def protected(self, T):
        return super().protected(T).to(torch.int64)


@dataclass(frozen=True)
class ListProtected(SnapKV):
    name: ClassVar[str] = "bad-prot-list"

    def protected(self, T):
        return super().protected(T).tolist()


@dataclass(frozen=True)
class AllProtected(SnapKV):
    """Protects every position: no budget below T can be tried, so the budget checks cannot run."""
    name: ClassVar[str] = "bad-prot-all"

    def protected(self, T):
        return torch.ones(T, dtype=torch.bool)


@dataclass(frozen=True)
class DirectKeys(EvictionPolicy):
    """A good policy reading ``ev.keys`` directly (as a user writes it), declared."""
    n_sink: int = 2
    recent: int = 4
    name: ClassVar[str] = "direct-keys"

    def needs(self):
        return Needs(keys=True)

    def scores(self, ev):
        return -ev.keys.double().norm(dim=-1)


@dataclass(frozen=True)
class UndeclaredDirectKeys(DirectKeys):
    """Reads ``ev.keys`` directly and declares nothing."""
    name: ClassVar[str] = "bad-direct-keys"

    def needs(self):
        return Needs()
