"""The constraint classes of :mod:`workbench.checks` (re-exported there): an allowed set of values with
``check(name, value)``, ``describe()``, ``message()``, and generated ``invalid()`` / ``valid()`` values, in
the manner of scikit-learn's ``utils/_param_validation.py``. The named constraint of each parameter lives
in :mod:`workbench.constraints`.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import numbers
import os
import weakref
from collections.abc import Iterable, Mapping
from types import MappingProxyType

__all__ = ["is_int", "is_real", "Constraint", "Interval", "Choice", "Bool", "Const", "AnyOf", "Seq", "InstanceOf",
           "optional", "check_fields", "check_args", "constraints_of"]


def is_int(x) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A finite real number that is not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def _fmt(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


class _Opaque:
    """A value of no accepted type (its repr names it)."""

    def __repr__(self) -> str:
        return "<object>"


# ----------------------------------------------------------------------------- constraint objects
class Constraint(abc.ABC):
    """An allowed set of values for a parameter."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The allowed set, as it reads after "must be" (``"in (0, 1]"``, ``"an integer >= 1"``)."""

    @abc.abstractmethod
    def accepts(self, value) -> bool:
        """Whether ``value`` is allowed."""

    @abc.abstractmethod
    def invalid(self) -> list:
        """Generated values outside the allowed set (boundaries, wrong types, non-finite numbers)."""

    @abc.abstractmethod
    def valid(self) -> list:
        """A few values inside the allowed set (boundaries included where they are allowed)."""

    def message(self, name: str, value) -> str:
        return f"{name}: must be {self.describe()}, got {value!r}"

    def check(self, name: str, value):
        """``value`` if allowed, else ``ValueError(self.message(name, value))``."""
        if not self.accepts(value):
            raise ValueError(self.message(name, value))
        return value

    def noun(self) -> str:
        """The allowed set as a noun phrase (inside "None or …", "each …")."""
        return self.describe()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


_CLOSED = {"both": (False, False), "left": (False, True), "right": (True, False), "neither": (True, True)}


class Interval(Constraint):
    """Numbers in ``[lo, hi]`` (either bound ``None`` for none), real or integer.

    ``closed`` (reals): ``"both"``, ``"left"`` (``[lo, hi)``), ``"right"`` (``(lo, hi]``) or ``"neither"``.
    Integers: ``odd`` asks for odd values; ``float_hint`` refuses floats with a pointer (``{value}`` is
    filled in). Reals: ``int_hint`` refuses ints with a pointer; ``what`` replaces the type word of the
    range text (``"a fraction of N, a float"``); ``note`` is appended in brackets.
    """

    def __init__(self, kind: str, lo=None, hi=None, *, closed: str = "both", odd: bool = False, what: str | None = None,
                 note: str | None = None, int_hint: str | None = None, float_hint: str | None = None):
        if kind not in ("int", "real"):
            raise ValueError(f"kind: must be one of ['int', 'real'], got {kind!r}")
        if closed not in _CLOSED:
            raise ValueError(f"closed: must be one of {list(_CLOSED)}, got {closed!r}")
        if kind == "int" and closed != "both":
            raise ValueError("closed: integer intervals are closed (give the inner bounds)")
        self.kind, self.lo, self.hi, self.closed, self.odd = kind, lo, hi, closed, odd
        self.lo_open, self.hi_open = _CLOSED[closed]
        self.what, self.note, self.int_hint, self.float_hint = what, note, int_hint, float_hint

    def range_text(self) -> str:
        lo = None if self.lo is None else _fmt(self.lo)
        hi = None if self.hi is None else _fmt(self.hi)
        if lo is not None and hi is not None:
            return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        if lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        if hi is not None:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return ""

    def describe(self) -> str:
        if self.kind == "int":
            head = self.what or ("an odd integer" if self.odd else "an integer")
        else:
            head = self.what or ""
        text = " ".join(t for t in (head, self.range_text()) if t) or "a finite real number"
        return text + (f" ({self.note})" if self.note else "")

    def noun(self) -> str:
        if self.kind == "real" and not self.what:
            return f"a real number {self.describe()}".rstrip()
        return self.describe()

    def _in_range(self, v) -> bool:
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        if self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)):
            return False
        return True

    def accepts(self, value) -> bool:
        if self.kind == "int":
            return is_int(value) and self._in_range(value) and (not self.odd or value % 2 == 1)
        if self.int_hint is not None and is_int(value):
            return False
        return is_real(value) and self._in_range(float(value))

    def message(self, name: str, value) -> str:
        if self.kind == "int" and self.float_hint is not None and isinstance(value, float):
            return f"{name}: must be {self.describe()}, got the float {value!r}; {self.float_hint.format(value=value)}"
        if self.kind == "real" and self.int_hint is not None and is_int(value):
            return f"{name}: must be {self.describe()}, got the int {value!r}; {self.int_hint.format(value=value)}"
        if self.kind == "real" and not self.what and not is_real(value):
            return f"{name}: must be a finite real number {self.describe()}, got {value!r}".replace("number , got",
                                                                                                    "number, got")
        return super().message(name, value)

    def check(self, name: str, value):
        super().check(name, value)
        return int(value) if self.kind == "int" else float(value)

    def invalid(self) -> list:
        out: list = ["1", None, True, _Opaque()]
        if self.kind == "int":
            out += [1.5, 2.0]
            if self.lo is not None:
                out.append(self.lo - 1)
            if self.hi is not None:
                out.append(self.hi + 1)
            if self.odd:
                base = 0 if self.lo is None else self.lo
                out.append(base if base % 2 == 0 else base + 1)
        else:
            out += [float("nan"), float("inf"), float("-inf")]
            span = 1.0 if self.lo is None or self.hi is None else max(float(self.hi - self.lo), 1e-9)
            if self.lo is not None:
                out += [self.lo - 0.1 * span] + ([float(self.lo)] if self.lo_open else [])
            if self.hi is not None:
                out += [self.hi + 0.1 * span] + ([float(self.hi)] if self.hi_open else [])
            if self.int_hint is not None:
                out.append(1)
        return [v for v in out if not self.accepts(v)]

    def valid(self) -> list:
        lo, hi = self.lo, self.hi
        out: list = []
        if self.kind == "int":
            base = lo if lo is not None else (hi - 5 if hi is not None else 0)
            cand = [base, base + 1, base + 7]
            if hi is not None:
                cand += [hi, (base + hi) // 2]
            out = [c for c in cand if self.accepts(c)]
        else:
            if lo is not None and hi is not None:
                cand = [lo + (hi - lo) * f for f in (0.0, 0.25, 0.5, 1.0)]
            elif lo is not None:
                cand = [lo, lo + 0.5, lo + 3.0, lo + 1e3]
            elif hi is not None:
                cand = [hi, hi - 0.5, hi - 3.0]
            else:
                cand = [-1.0, 0.0, 2.5]
            out = [float(c) for c in cand if self.accepts(float(c))]
            if not self.lo_open and lo is not None and self.int_hint is None and self.accepts(int(lo) if lo == int(lo) else lo):
                out.append(int(lo) if lo == int(lo) else lo)  # an int where a real is meant is fine
        return list(dict.fromkeys(out))


class Choice(Constraint):
    """One of ``options`` (a ``Literal`` alias's tuple from :mod:`workbench.choices`)."""

    def __init__(self, options: Iterable):
        self.options = tuple(options)

    def describe(self) -> str:
        return f"one of {list(self.options)}"

    def accepts(self, value) -> bool:
        return not isinstance(value, bool) and any(value == o and type(value) is type(o) for o in self.options)

    def invalid(self) -> list:
        out = ["bogus", "", None, True, 0, _Opaque()]
        out += [o.upper() for o in self.options if isinstance(o, str) and o.upper() != o]
        return [v for v in out if not self.accepts(v)]

    def valid(self) -> list:
        return list(self.options)


class Bool(Constraint):
    """A real ``bool`` (``"no"``, ``0`` or ``None`` are refused: they would silently read as a truth value)."""

    def describe(self) -> str:
        return "True or False"

    def accepts(self, value) -> bool:
        return isinstance(value, bool)

    def invalid(self) -> list:
        return ["no", "False", 0, 1, None]

    def valid(self) -> list:
        return [True, False]


class Const(Constraint):
    """Exactly ``value`` (``None``, ``"auto"``)."""

    def __init__(self, value):
        self.value = value

    def describe(self) -> str:
        return repr(self.value)

    def accepts(self, value) -> bool:
        return value is self.value if self.value is None else (type(value) is type(self.value) and value == self.value)

    def invalid(self) -> list:
        return [v for v in ("bogus", 0, _Opaque()) if not self.accepts(v)]

    def valid(self) -> list:
        return [self.value]


class AnyOf(Constraint):
    """Any value one of ``parts`` accepts (``optional(c)``: ``None`` or ``c``)."""

    def __init__(self, *parts: Constraint):
        self.parts = parts

    def describe(self) -> str:
        words = [p.noun() for p in self.parts]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]

    def accepts(self, value) -> bool:
        return any(p.accepts(value) for p in self.parts)

    def message(self, name: str, value) -> str:
        main = [p for p in self.parts if not isinstance(p, Const)]
        if len(main) != 1 or len(main) == len(self.parts):
            return super().message(name, value)
        # one constrained part beside constants: its own message (with its hints), the constants named first
        consts = [p.noun() for p in self.parts if isinstance(p, Const)]
        head, rest = f"{name}: must be ", main[0].message(name, value)
        return f"{head}{', '.join(consts)} or {rest[len(head):]}"

    def check(self, name: str, value):
        for p in self.parts:
            if p.accepts(value):
                return p.check(name, value)
        raise ValueError(self.message(name, value))

    def invalid(self) -> list:
        out = {repr(v): v for p in self.parts for v in p.invalid()}
        return [v for v in out.values() if not self.accepts(v)]

    def valid(self) -> list:
        return [v for p in self.parts for v in p.valid()]


def optional(c: Constraint) -> AnyOf:
    """``None`` or ``c``."""
    return AnyOf(Const(None), c)


class Seq(Constraint):
    """A list or tuple (not a string) whose entries all satisfy ``item``; ``nonempty``, ``distinct`` as named.
    ``check`` returns a tuple (``sort`` sorts it)."""

    def __init__(self, item: Constraint, *, nonempty: bool = True, distinct: bool = False, sort: bool = False):
        self.item, self.nonempty, self.distinct, self.sort = item, nonempty, distinct, sort

    def describe(self) -> str:
        ne = "non-empty " if self.nonempty else ""
        dis = " of distinct entries" if self.distinct else ""
        return f"a {ne}sequence{dis}, each {self.item.noun()}"

    def accepts(self, value) -> bool:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            return False
        xs = list(value)
        if self.nonempty and not xs:
            return False
        if not all(self.item.accepts(x) for x in xs):
            return False
        if not self.distinct:
            return True
        try:
            return len(set(xs)) == len(xs)
        except TypeError:  # unhashable entries
            return len({repr(x) for x in xs}) == len(xs)

    def check(self, name: str, value):
        super().check(name, value)
        xs = tuple(self.item.check(name, x) for x in value)
        return tuple(sorted(xs)) if self.sort else xs

    def invalid(self) -> list:
        good = self.item.valid()
        out: list = ["abc", 3, None, _Opaque()]
        if self.nonempty:
            out.append(())
        bad = [v for v in self.item.invalid() if v is not None][:3]
        out += [(good[0], b) for b in bad]
        if self.distinct:
            out.append((good[0], good[0]))
        return [v for v in out if not self.accepts(v)]

    def valid(self) -> list:
        good = self.item.valid()
        out = [(good[0],), tuple(good[:2]), list(good[:3])]
        return [v for v in out if self.accepts(v)]


class InstanceOf(Constraint):
    """An instance of ``types`` (a class, a tuple, or a predicate), described as ``what``; ``examples``
    are valid values for :meth:`valid`; ``nonempty`` refuses empty strings."""

    def __init__(self, types, what: str, *, examples: tuple = (), nonempty: bool = False):
        self.types, self.what, self.examples, self.nonempty = types, what, tuple(examples), nonempty

    def describe(self) -> str:
        return self.what

    def accepts(self, value) -> bool:
        ok = self.types(value) if callable(self.types) and not isinstance(self.types, type) else isinstance(value, self.types)
        if ok and self.nonempty and isinstance(value, (str, os.PathLike)) and not str(value).strip():
            return False
        return bool(ok) and not (isinstance(value, bool) and isinstance(self.types, type) and self.types not in (bool, object))

    def invalid(self) -> list:
        out = [_Opaque(), 12345, True] + (["", " "] if self.nonempty else [])
        return [v for v in out if not self.accepts(v)]

    def valid(self) -> list:
        return list(self.examples)


def check_args(checks: Mapping[str, Constraint], values: Mapping) -> None:
    """Check every argument named in ``checks`` (a function's ``locals()`` on entry)."""
    for name, c in checks.items():
        c.check(name, values[name])


def check_fields(obj, checks: Mapping[str, Constraint] | None = None) -> None:
    """Check every field of a dataclass instance against its declared constraint (default
    :func:`constraints_of` its class: a researcher's own subclass is checked like a built-in)."""
    for name, c in (constraints_of(type(obj)) if checks is None else checks).items():
        c.check(name, getattr(obj, name))


_DECLARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HOW = ('declare it next to the fields, e.g. _parameter_constraints = {{"{name}": Interval("real", 0, 1)}} (the '
        'bases\' declarations are merged in; the constraint types are in workbench.checks: Interval, Choice, Bool, '
        'Seq, InstanceOf, optional; InstanceOf(object, "any value") leaves a field unchecked on purpose)')


def constraints_of(cls) -> Mapping[str, Constraint]:
    """The constraint of every dataclass field of ``cls``, read from the ``_parameter_constraints`` mappings its
    class and its bases declare (a subclass's entry overrides its base's).

    A field with no declared constraint is refused with a ``TypeError`` saying how to declare one: an
    undeclared field would otherwise take any value silently.
    """
    got = _DECLARED.get(cls)
    if got is not None:
        return got
    declared: dict[str, Constraint] = {}
    for k in reversed(cls.__mro__):
        declared.update(vars(k).get("_parameter_constraints", {}))
    out: dict[str, Constraint] = {}
    for f in dataclasses.fields(cls):
        if f.name not in declared:
            raise TypeError(f"{cls.__name__}.{f.name}: the field has no declared constraint; "
                            + _HOW.format(name=f.name))
        c = declared[f.name]
        if not isinstance(c, Constraint):
            raise TypeError(f"{cls.__name__}._parameter_constraints[{f.name!r}]: must be a Constraint "
                            f"(workbench.checks), got {c!r}")
        out[f.name] = c
    got = MappingProxyType(out)
    _DECLARED[cls] = got
    return got
