"""A researcher's own policy on the bench: registered at run time (or by an installed package's entry point),
it is used by name wherever a built-in one is (``policy_from_params``, ``every_policy``, the eviction panel's
options, ``sweep``, the report CLI with ``--policy module:Class``); bad registrations are refused with a clear
message and leave the registry unchanged."""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from _all_figures import synthetic_inputs
from _my_policy import MeanKey

import workbench as wb
from workbench import __main__ as cli
from workbench.choices import POLICY_NAMES
from workbench.rerun.eviction import (
    POLICY_GROUPS,
    REGISTRY,
    EvictionPolicy,
    PolicyRegistry,
    SnapKV,
    every_policy,
    policy_from_params,
    register_policy,
)
from workbench.run.models import LoadedModel, tiny_model
from workbench.show import widgets as Wd
from workbench.study import datasets, tasks
from workbench.study import report as rp
from workbench.study import sweep as sw


def _state(reg):
    return reg.names(), reg.groups(), {n: reg.get(n) for n in reg.names()}


def test_builtins_and_their_literal():
    assert REGISTRY.builtin_names() == tuple(n for g in POLICY_GROUPS.values() for n in g)
    assert set(REGISTRY.builtin_names()) == set(POLICY_NAMES)  # choices.PolicyName stays the built-ins' Literal
    assert wb.register_policy is register_policy and wb.policy_registry is REGISTRY
    with pytest.raises(ValueError, match="policy: must be one of .*got 'nope'"):
        policy_from_params("nope")


def test_a_registered_policy_is_used_by_name_everywhere():
    with REGISTRY.scoped():
        assert wb.register_policy(MeanKey, group="attention-free") is MeanKey
        assert "mean-key" in REGISTRY and REGISTRY.group_of("mean-key") == "attention-free"
        assert REGISTRY.groups()["attention-free"][-1] == "mean-key" and REGISTRY.origin("mean-key") == "registered"
        assert policy_from_params("mean-key", recent=8, window=3) == MeanKey(recent=8)  # its own fields only
        assert [p.name for p in every_policy(n_sink=2)].count("mean-key") == 1
        assert MeanKey(n_sink=2) in every_policy(n_sink=2)
        # the eviction panel lists it (in its group) and builds it
        sp, cap, _, _ = synthetic_inputs(L=2, H_Q=4, G=2)
        panel = Wd.EvictionPanel(cap, None, type("P", (), {"spans": sp})(), policy="mean-key", budget=40)
        assert ("attention-free · mean-key", "mean-key") in panel.controls["policy"].options
        assert isinstance(panel.policy(), MeanKey) and panel.analysis() is None  # a capture holds no keys
        # the report takes its name
        assert rp.ReportConfig(policies=("mean-key", "snapkv")).policies == ("mean-key", "snapkv")
    assert "mean-key" not in REGISTRY  # the scope undid it
    assert "mean-key" not in [p.name for p in every_policy()]
    with pytest.raises(ValueError, match="policies: must be distinct entries"):
        rp.ReportConfig(policies=("mean-key",))


def test_module_class_spec_registers_once():
    with REGISTRY.scoped():
        assert REGISTRY.resolve("_my_policy:MeanKey") == "mean-key"
        assert REGISTRY.resolve("_my_policy:MeanKey") == "mean-key"  # the same class again: no duplicate
        assert policy_from_params("_my_policy:MeanKey") == MeanKey()
        with pytest.raises(ValueError, match="cannot import '_my_policy:Nope'"):
            REGISTRY.resolve("_my_policy:Nope")
    assert "mean-key" not in REGISTRY


@pytest.fixture(scope="module")
def tiny_lm(smollm):
    model = tiny_model("llama", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16, seed=0)
    return LoadedModel(model=model, tokenizer=smollm.tokenizer, model_id="tiny-llama-test",
                       device=torch.device("cpu"), dtype=torch.float32)


def test_sweep_by_name(tiny_lm):
    items = tasks.squad_single(datasets.load_squad("sample"), n=1, n_distractors=1, seed=0)
    with REGISTRY.scoped():
        register_policy(MeanKey)
        df = sw.sweep(tiny_lm, items, {"evict": {"policy": ["mean-key", "snapkv"], "budget_frac": [0.5]}},
                      max_new_tokens=3, progress=False)
        ev = df[df["method"] == "evict"].set_index("p_policy")
        assert set(ev.index) == {"mean-key", "snapkv"} and ev["error"].isna().all() if "error" in ev else True
        T = int(ev.loc["mean-key", "prompt_tokens"])
        assert int(ev.loc["mean-key", "retained_tokens"]) == -(-T // 2)
        # the same cell through the session directly: the sweep ran the registered policy
        from workbench.rerun.eviction import generate_with_policy
        prompt = items[0].build(tiny_lm.tokenizer, max_context=tiny_lm.shape.max_context)
        r = generate_with_policy(tiny_lm, prompt, MeanKey(), -(-T // 2), max_new_tokens=3, progress=False)
        assert list(ev.loc["mean-key", "generated_ids"]) == r.ids


def test_report_cli_takes_module_class(monkeypatch, tmp_path, capsys):
    """``python -m workbench report --policy _my_policy:MeanKey deferkv``: the class is imported and registered,
    and the report's config (whose ``evict`` grid and needle table take these names) holds its name."""
    seen = {}

    class Done:
        partial = False
        interrupted = None
        export_error = None

        def summary(self):
            return "done"

    def fake_run_report(cfg):  # the CLI wiring only: no model is loaded
        seen["cfg"] = cfg
        seen["policy"] = policy_from_params(cfg.policies[0])
        return Done()

    monkeypatch.setattr(cli, "run_report", fake_run_report)
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)
    with REGISTRY.scoped():
        assert cli.main(["report", "--tiny", "--out", str(tmp_path), "--policy", "_my_policy:MeanKey", "deferkv"]) == 0
        assert seen["cfg"].policies == ("mean-key", "deferkv") and seen["policy"] == MeanKey()
    assert "mean-key" not in REGISTRY
    assert cli.main(["report", "--tiny", "--out", str(tmp_path), "--policy", "_my_policy:Nope"]) == 2
    assert "cannot import '_my_policy:Nope'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- refused registrations
@dataclass(frozen=True)
class Clash(SnapKV):
    name: ClassVar[str] = "snapkv"


@dataclass(frozen=True)
class NoScores(EvictionPolicy):
    name: ClassVar[str] = "no-scores"


@dataclass
class NotFrozen(EvictionPolicy):
    name: ClassVar[str] = "not-frozen"

    def scores(self, ev):
        return torch.zeros(ev.L, ev.G, ev.T)


class NotADataclass(EvictionPolicy):
    name = "not-dataclass"

    def scores(self, ev):
        return torch.zeros(ev.L, ev.G, ev.T)


@dataclass(frozen=True)
class NoName(EvictionPolicy):
    def scores(self, ev):
        return torch.zeros(ev.L, ev.G, ev.T)


@dataclass(frozen=True)
class NotAPolicy:
    name: ClassVar[str] = "plain"

    def needs(self):
        return None

    def scores(self, ev):
        return None

    def protected(self, T):
        return None


@dataclass(frozen=True)
class NeedsArgs(EvictionPolicy):
    k: int
    name: ClassVar[str] = "needs-args"

    def scores(self, ev):
        return torch.zeros(ev.L, ev.G, ev.T)


@pytest.mark.parametrize("cls, match", [
    (Clash, "name 'snapkv' is a built-in policy's"),
    (NoScores, r"missing method scores\(\)"),
    (NotFrozen, "must be a frozen dataclass"),
    (NotADataclass, r"must be decorated with @dataclass\(frozen=True\)"),
    (NoName, "needs its own name"),
    (NotAPolicy, "must subclass workbench.rerun.eviction.policies.base.EvictionPolicy"),
    (NeedsArgs, "must be constructible with its defaults"),
    (MeanKey(), "must be a class"),
], ids=["builtin-clash", "missing-method", "non-frozen", "not-dataclass", "no-name", "not-a-policy", "needs-args",
        "instance"])
def test_bad_registrations_are_refused_and_change_nothing(cls, match):
    before = _state(REGISTRY)
    with pytest.raises(ValueError, match=match):
        register_policy(cls)
    assert _state(REGISTRY) == before


def test_duplicate_and_unregister():
    with REGISTRY.scoped():
        register_policy(MeanKey)
        before = _state(REGISTRY)

        @dataclass(frozen=True)
        class Other(MeanKey):
            name: ClassVar[str] = "mean-key"

        with pytest.raises(ValueError, match="'mean-key' is already registered .*replace=True"):
            register_policy(Other)
        assert _state(REGISTRY) == before
        register_policy(Other, replace=True)  # a notebook cell run twice
        assert REGISTRY.get("mean-key") is Other
        assert REGISTRY.unregister("mean-key") is Other and "mean-key" not in REGISTRY
        with pytest.raises(ValueError, match="built-in policy and cannot be unregistered"):
            REGISTRY.unregister("snapkv")
        with pytest.raises(ValueError, match="group: must be a non-empty string"):
            register_policy(MeanKey, group="")
        assert "mean-key" not in REGISTRY


# ----------------------------------------------------------------------------- entry points
PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar
import torch
from workbench.rerun.eviction import EvictionPolicy, Needs


@dataclass(frozen=True)
class Newest(EvictionPolicy):
    """Keep the newest keys (a plugin's policy)."""
    n_sink: int = 4
    recent: int = 8
    name: ClassVar[str] = "plugin-newest"
    group: ClassVar[str] = "plugins"

    def scores(self, ev):
        return torch.arange(ev.T, dtype=torch.float64).expand(ev.L, ev.G, ev.T).clone()
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A dummy installed package: a module and its dist-info with a ``workbench.policies`` entry point (and a
    broken one), on ``sys.path``; no pip."""
    (tmp_path / "wb_dummy_plugin.py").write_text(PLUGIN)
    di = tmp_path / "wb_dummy_plugin-0.1.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: wb-dummy-plugin\nVersion: 0.1\n")
    (di / "entry_points.txt").write_text("[workbench.policies]\nplugin-newest = wb_dummy_plugin:Newest\n"
                                         "plugin-broken = wb_dummy_plugin:DoesNotExist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("wb_dummy_plugin", None)


def test_entry_point_plugin_is_loaded_lazily_and_used_by_name(plugin, tiny_lm):
    reg = PolicyRegistry(EvictionPolicy, {g: tuple(REGISTRY.get(n) for n in ns) for g, ns in POLICY_GROUPS.items()})
    assert "wb_dummy_plugin" not in sys.modules  # nothing loaded yet
    with pytest.warns(RuntimeWarning, match="entry point 'plugin-broken' .*wb_dummy_plugin:DoesNotExist"):
        assert "plugin-newest" in reg  # first use loads the plugins
    assert reg.groups()["plugins"] == ("plugin-newest",) and reg.origin("plugin-newest").startswith("entry point")
    # the workbench's own registry, reloaded after "installing" the package
    with REGISTRY.scoped():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert REGISTRY.load_entry_points() == ["plugin-newest"]
        assert any("plugin-broken" in str(x.message) for x in w)
        assert "plugin-newest" in [p.name for p in every_policy()]
        assert policy_from_params("plugin-newest", recent=2).recent == 2
        items = tasks.squad_single(datasets.load_squad("sample"), n=1, n_distractors=1, seed=0)
        df = sw.sweep(tiny_lm, items, {"evict": {"policy": ["plugin-newest"], "budget_frac": [0.5]}},
                      max_new_tokens=2, progress=False, reference=False)
        assert df["p_policy"].tolist() == ["plugin-newest"] and len(df["generated_ids"].iloc[0]) >= 1
        assert rp.ReportConfig(policies=("plugin-newest",)).policies == ("plugin-newest",)
    assert "plugin-newest" not in REGISTRY
