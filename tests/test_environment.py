"""environment.yml stays honest: every runtime dependency of pyproject.toml appears with compatible bounds."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

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
