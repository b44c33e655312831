"""The policy registry: every eviction policy by name, built-in or added by a user or an installed package.

A :class:`PolicyRegistry` is an explicit object. The workbench's own one is
``workbench.rerun.eviction.policies.REGISTRY`` (``wb.register_policy`` is its :meth:`~PolicyRegistry.register`);
every caller that takes a policy *name* (``policy_from_params``, ``every_policy``, the eviction panel, the
sweep's ``evict`` method, the report) looks it up there, so a registered policy appears wherever a built-in
one does. Nothing else mutates it: a registration is an explicit call, undone by
:meth:`~PolicyRegistry.unregister` or by leaving a :meth:`~PolicyRegistry.scoped` block (tests).

Installed packages add policies through the entry point group ``workbench.policies``
(``mine = my_pkg.my_module:MyPolicy``; the entry point's name must be the class's ``name``). They are loaded
once, on the first use of the registry; a plugin that fails to import or to register is reported in a
warning naming the entry point, and the others still load.

A registered policy is validated first (and a refused one leaves the registry unchanged):

- a class, subclass of ``EvictionPolicy`` (which gives ``tiebreak``, ``allocate``, ``params`` and the
  defaults of ``needs`` and ``protected``), and a **frozen** dataclass (its fields are its parameters);
- ``needs()``, ``scores()`` and ``protected()`` defined (``scores`` is abstract in the base);
- a ``name`` class attribute (``ClassVar[str]``): letters, digits, ``-``, ``_``, ``.``; not a built-in's
  name, not already registered (``replace=True`` replaces a registered one, e.g. a notebook cell run twice);
- constructible with its defaults (the sweep, the panel and ``every_policy`` build it from parameters).

The built-in names stay a ``Literal`` (``workbench.choices.PolicyName``); registered names are checked at
run time (:meth:`PolicyRegistry.check_name`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import re
import warnings
from importlib import metadata

__all__ = ["PolicyRegistry", "ENTRY_POINT_GROUP", "REGISTERED_GROUP"]

ENTRY_POINT_GROUP = "workbench.policies"
REGISTERED_GROUP = "registered"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PolicyRegistry:
    """Policies by name and family group: the built-ins (fixed) and the registered ones.

    Args:
        base: the policy base class every policy must subclass (``EvictionPolicy``).
        builtin_groups: ``{group: (policy classes ...)}`` of the built-in policies, in display order.
        entry_point_group: the entry point group read once on first use (``None``: no plugins).
    """

    def __init__(self, base: type, builtin_groups: dict, entry_point_group: str | None = ENTRY_POINT_GROUP):
        self._base = base
        self._builtin = {c.name: c for g in builtin_groups.values() for c in g}
        self._classes: dict[str, type] = dict(self._builtin)
        self._group_of: dict[str, str] = {c.name: g for g, cs in builtin_groups.items() for c in cs}
        self._origin: dict[str, str] = {n: "built-in" for n in self._builtin}
        self._entry_point_group = entry_point_group
        self._loaded = entry_point_group is None

    # ------------------------------------------------------------------ lookup
    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # first, so that a plugin using the registry while it loads does not recurse
        self.load_entry_points()

    def load_entry_points(self) -> list[str]:
        """Register every policy of the ``workbench.policies`` entry point group not registered yet (done once
        on first use; call again after installing a package). A failing plugin is a warning naming it.
        Returns the names added."""
        added = []
        for ep in metadata.entry_points(group=self._entry_point_group or ENTRY_POINT_GROUP):
            if self._classes.get(ep.name) is not None and self._origin.get(ep.name) == f"entry point {ep.value}":
                continue
            try:
                cls = ep.load()
                if getattr(cls, "name", None) != ep.name:
                    raise ValueError(f"the entry point's name {ep.name!r} must be the class's name "
                                     f"{getattr(cls, 'name', None)!r}")
                self._register(cls, getattr(cls, "group", None) or "plugins", replace=False,
                               origin=f"entry point {ep.value}")
                added.append(ep.name)
            except Exception as e:  # a broken plugin must not break the workbench: say which and why
                warnings.warn(f"workbench.policies entry point {ep.name!r} ({ep.value}) was not registered: "
                              f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
        return added

    def names(self) -> tuple[str, ...]:
        """Every policy name, in group order (built-in groups first)."""
        return tuple(n for names in self.groups().values() for n in names)

    def builtin_names(self) -> tuple[str, ...]:
        return tuple(self._builtin)

    def registered_names(self) -> tuple[str, ...]:
        """The names added by :meth:`register` or an entry point."""
        self._ensure_loaded()
        return tuple(n for n in self._classes if n not in self._builtin)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """``{group: names}``: the built-in families, then the groups of registered policies."""
        self._ensure_loaded()
        out: dict[str, list[str]] = {}
        for n, g in self._group_of.items():
            out.setdefault(g, []).append(n)
        return {g: tuple(ns) for g, ns in out.items()}

    def group_of(self, name: str) -> str:
        return self._group_of[self.check_name(name)]

    def origin(self, name: str) -> str:
        """``"built-in"``, ``"registered"`` or ``"entry point module:Class"``."""
        return self._origin[self.check_name(name)]

    def classes(self) -> tuple[type, ...]:
        return tuple(self._classes[n] for n in self.names())

    def __contains__(self, name) -> bool:
        self._ensure_loaded()
        return isinstance(name, str) and name in self._classes

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def is_builtin(self, name: str) -> bool:
        return name in self._builtin

    def check_name(self, name) -> str:
        """``name`` if it is a policy's name, else a ``ValueError`` naming every allowed name."""
        if name not in self:
            raise ValueError(f"policy: must be one of {sorted(self._classes)} (built-in or registered with "
                             f"wb.register_policy), got {name!r}")
        return name

    def get(self, name: str) -> type:
        """The policy class called ``name``; ``"module:Class"`` imports and registers that class first
        (:meth:`resolve`)."""
        if isinstance(name, str) and ":" in name:
            name = self.resolve(name)
        return self._classes[self.check_name(name)]

    def resolve(self, spec: str) -> str:
        """A policy name from ``spec``: a registered name as is, or ``"my_pkg.my_module:MyPolicy"``, whose class
        is imported and registered (once; the same class again is not a duplicate). Returns the name."""
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"policy: must be a policy name or 'module:Class', got {spec!r}")
        if ":" not in spec:
            return self.check_name(spec)
        mod, _, attr = spec.partition(":")
        if not (all(part.isidentifier() for part in mod.split(".")) and attr.isidentifier()):
            raise ValueError(f"policy: must be a policy name or 'module:Class' (a dotted module path, a colon and a "
                             f"class name, e.g. 'my_pkg.my_module:MyPolicy'), got {spec!r}")
        try:
            cls = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"policy: cannot import {spec!r} ({type(e).__name__}: {e})") from None
        name = getattr(cls, "name", None)
        if isinstance(name, str) and self._classes.get(name) is cls:
            return name
        self.register(cls)
        return cls.name

    # ------------------------------------------------------------------ changes
    def validate(self, cls, group: str = REGISTERED_GROUP, *, replace: bool = False) -> None:
        """Raise a ``ValueError`` naming what ``cls`` lacks to be registered (nothing is changed)."""
        what = getattr(cls, "__qualname__", repr(cls))
        if not isinstance(cls, type):
            raise ValueError(f"policy: must be a class (a frozen dataclass subclassing EvictionPolicy), got {cls!r}")
        if not issubclass(cls, self._base):
            raise ValueError(f"policy {what}: must subclass {self._base.__module__}.{self._base.__name__} "
                             f"(it gives tiebreak, allocate, params and the budget rule's interface)")
        if not isinstance(group, str) or not group.strip():
            raise ValueError(f"group: must be a non-empty string, got {group!r}")
        for m in ("needs", "scores", "protected"):
            if not callable(getattr(cls, m, None)) or m in getattr(cls, "__abstractmethods__", ()):
                raise ValueError(f"policy {what}: missing method {m}() (needs() -> Needs, scores(ev) -> [L, G, T], "
                                 f"protected(T) -> bool [T])")
        if inspect.isabstract(cls):
            raise ValueError(f"policy {what}: abstract methods not implemented: {sorted(cls.__abstractmethods__)}")
        if not dataclasses.is_dataclass(cls) or "__dataclass_params__" not in cls.__dict__:
            raise ValueError(f"policy {what}: must be decorated with @dataclass(frozen=True) (its fields are its "
                             f"parameters)")
        if not cls.__dataclass_params__.frozen:
            raise ValueError(f"policy {what}: must be a frozen dataclass (@dataclass(frozen=True)): scores are "
                             f"memoised per policy, so a policy must be hashable and immutable")
        if "name" in {f.name for f in dataclasses.fields(cls)}:
            raise ValueError(f"policy {what}: name must be a class attribute (name: ClassVar[str] = ...), not a field")
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"policy {what}: needs its own name (name: ClassVar[str] = 'my-policy'; letters, digits, "
                             f"'-', '_', '.'), got {name!r}")
        if name in self._builtin:
            raise ValueError(f"policy {what}: name {name!r} is a built-in policy's "
                             f"({self._builtin[name].__qualname__}); choose another name")
        self._ensure_loaded()
        if name in self._classes and not replace:
            raise ValueError(f"policy {what}: name {name!r} is already registered ({self._origin[name]}: "
                             f"{self._classes[name].__module__}.{self._classes[name].__qualname__}); "
                             f"unregister it first or pass replace=True")
        try:
            cls()
        except Exception as e:
            raise ValueError(f"policy {what}: must be constructible with its defaults ({type(e).__name__}: {e}); "
                             f"the sweep, the panel and every_policy build it from parameters") from None

    def register(self, cls=None, group: str = REGISTERED_GROUP, *, replace: bool = False):
        """Register the policy class ``cls`` under ``cls.name`` in ``group`` (a built-in family such as
        ``"attention-based"``, or a new one); returns ``cls``, so it also works as a decorator
        (``@REGISTRY.register`` or ``@REGISTRY.register(group="forecast")``). Raises a ``ValueError`` naming
        what is missing (module docstring), leaving the registry unchanged."""
        if cls is None:
            return lambda c: self.register(c, group, replace=replace)
        return self._register(cls, group, replace=replace, origin=REGISTERED_GROUP)

    def _register(self, cls, group, *, replace: bool, origin: str):
        self.validate(cls, group, replace=replace)
        self._classes.pop(cls.name, None)
        self._group_of.pop(cls.name, None)
        self._classes[cls.name] = cls
        self._group_of[cls.name] = group.strip()
        self._origin[cls.name] = origin
        return cls

    def unregister(self, name: str) -> type:
        """Remove a registered policy (built-ins cannot be removed); returns its class."""
        if name in self._builtin:
            raise ValueError(f"policy: {name!r} is a built-in policy and cannot be unregistered")
        self.check_name(name)
        self._group_of.pop(name)
        self._origin.pop(name)
        return self._classes.pop(name)

    @contextlib.contextmanager
    def scoped(self):
        """A block whose registrations (and unregistrations) are undone on exit, for tests::

            with REGISTRY.scoped():
                REGISTRY.register(Mine)
                ...
        """
        self._ensure_loaded()
        saved = (dict(self._classes), dict(self._group_of), dict(self._origin), self._loaded)
        try:
            yield self
        finally:
            self._classes, self._group_of, self._origin, self._loaded = (dict(saved[0]), dict(saved[1]),
                                                                         dict(saved[2]), saved[3])
