"""One validation route: every parameter of ``workbench/`` is checked by a declared constraint object (a
dataclass's ``_parameter_constraints`` read by ``check_fields``, a module's mapping registered with
``register_all`` and checked with ``check_args`` or ``Constraint.check``, or, for a range known only at the call,
a named factory such as ``constraints.index_into(L)``). The ad-hoc ``check_int / check_real / check_bool /
check_choice`` family is gone: the package's syntax trees hold no call, import or definition of it, and the
messages of the checks that replaced it keep the one format ``"<name>: must be <allowed>, got <value>"``."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import workbench.checks as checks
from workbench.analyse.audit import hoeffding_b
from workbench.analyse.envelope import envelope, output_bound
from workbench.analyse.pages import keep_sets, page_importance, top_pages
from workbench.analyse.pooling import PoolingCache, dominant_head_bound
from workbench.analyse.priorities import uniform_priorities
from workbench.analyse.selection import certificate
from workbench.analyse.shift import ShiftAnalysis, topk_recall
from workbench.analyse.stats import mcnemar, tango_bounds, wilson_ci
from workbench.analyse.streaming import collision_streaming
from workbench.capture.budget import estimate_capture_bytes
from workbench.capture.hooks import AttentionRecorder, RowSet, capture_attention
from workbench.capture.identity import check_model_match
from workbench.constraints import count_upto, index_into, zero_upto
from workbench.rerun.eviction.compare import KeptComparison
from workbench.rerun.eviction.select import resolve_budget
from workbench.run.load_checks import check_config
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans
from workbench.run.task_item import TaskItem
from workbench.show.colour_scale import resolve_scale
from workbench.show.decimate import token_bins
from workbench.show.export import resolve_size
from workbench.show.theme import categorical
from workbench.study.conclusions import conclusions
from workbench.study.followup import followup_multikey
from workbench.study.registry import register_method
from workbench.study.ruler import frequent_words, niah_multikey
from workbench.study.tasks.haystack import check_lengths
from workbench.study.tasks.squad import squad_single
from workbench.study.verdicts import plan

PKG = Path(__file__).resolve().parent.parent / "workbench"
AD_HOC = ("check_int", "check_real", "check_bool", "check_choice")
# module (path under the repository) -> why it still validates a parameter ad hoc; empty: none does
ALLOWED: dict[str, str] = {}


def ad_hoc_uses(source: str, label: str) -> list[str]:
    """Every call, import or definition of one of :data:`AD_HOC` in ``source``, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in AD_HOC:
                found.append((node.lineno, f"{label}:{node.lineno} calls {name}"))
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, f"{label}:{node.lineno} imports {a.name}") for a in node.names if a.name in AD_HOC]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in AD_HOC:
            found.append((node.lineno, f"{label}:{node.lineno} defines {node.name}"))
    return [text for _, text in sorted(found)]


def test_no_module_checks_a_parameter_ad_hoc():
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        label = f.relative_to(PKG.parent).as_posix()
        if label not in ALLOWED:
            bad += ad_hoc_uses(f.read_text(), label)
    assert not bad, ("parameters checked outside their declared constraints (declare them with register_all or "
                     "_parameter_constraints, or use a named factory such as constraints.index_into):\n"
                     + "\n".join(bad))


def test_the_allowed_exceptions_exist_and_say_why():
    for label, why in ALLOWED.items():
        assert (PKG.parent / label).is_file(), label
        assert why.strip(), label


def test_the_ad_hoc_family_is_not_public():
    for name in AD_HOC:
        assert name not in checks.__all__, name
        assert not hasattr(checks, name), name


def test_the_scan_sees_a_call_an_import_and_a_definition():
    src = ("from workbench.checks import check_int, Interval\nimport workbench.checks as c\n"
           "c.check_real('x', 1)\ncheck_bool('b', True)\n\n\ndef check_choice(name, x, options):\n    return x\n")
    assert ad_hoc_uses(src, "m.py") == ["m.py:1 imports check_int", "m.py:3 calls check_real", "m.py:4 calls check_bool",
                                        "m.py:7 defines check_choice"]
    assert ad_hoc_uses("Interval('int', 1).check('x', 2)\n", "m.py") == []


def test_the_factories_name_the_range_known_at_the_call():
    assert index_into(12).describe() == "an integer in [0, 11]"
    assert count_upto(5).describe() == "an integer in [1, 5]"
    assert index_into(3).check("layer", np.int64(2)) == 2 and type(index_into(3).check("layer", 2)) is int
    with pytest.raises(ValueError, match=r"^layer: must be an integer in \[0, 2\], got 3$"):
        index_into(3).check("layer", 3)
    with pytest.raises(ValueError, match=r"^s: must be an integer in \[1, 5\], got True$"):
        count_upto(5).check("s", True)
    assert zero_upto(4).describe() == "an integer in [0, 4]"
    assert zero_upto(0).check("m0", np.int64(0)) == 0
    assert index_into(3, note="L = 3").describe() == "an integer in [0, 2] (L = 3)"
    with pytest.raises(ValueError, match=r"^k: must be an integer in \[0, 5\] \(n = 5\), got 6$"):
        zero_upto(5, note="n = 5").check("k", 6)


def _fn(lm, item, params):
    return {}


_ENV = (torch.full((1, 1, 4), 0.25), torch.full((4,), 0.25), torch.ones(1), torch.tensor([True, False, False, False]))
_SPANS = PromptSpans.synthetic([4, 4], query_len=4)  # T = 23


def _capture(**kw):
    with capture_attention(tiny_model("llama", L=2), [0], K=4, **kw):
        pass


def _item(**kw):
    return TaskItem(task="t", item_id="i", documents=("a x", "b x"), query="q", answers=("x",),
                    **{"answer_doc": 0, **kw})


# one call per migrated module: the exact message the old ad-hoc check gave (the format is unchanged)
MESSAGES = [
    ("pages.keep_sets", lambda: keep_sets(torch.rand(2, 5), 0), "s: must be an integer in [1, 5], got 0"),
    ("pages.page_importance", lambda: page_importance(torch.rand(4), 0), "b: must be an integer >= 1, got 0"),
    ("pages.top_pages", lambda: top_pages(torch.rand(4), 1.5), "K: must be an integer >= 1, got 1.5"),
    ("pooling.dominant_head_bound", lambda: dominant_head_bound(0.5, 1.0, 0, 0.0), "r: must be an integer >= 1, got 0"),
    ("pooling.PoolingCache", lambda: PoolingCache(None, size=0), "size: must be an integer >= 1, got 0"),
    ("priorities.uniform_priorities", lambda: uniform_priorities(None, -1), "L: must be an integer >= 0, got -1"),
    ("shift.topk_recall", lambda: topk_recall(torch.rand(2, 4), torch.rand(4), 5), "k: must be an integer in [1, 4], got 5"),
    ("audit.hoeffding_b", lambda: hoeffding_b(8, 0.05, 0, 1), "J: must be an integer >= 1, got 0"),
    ("audit.hoeffding_b", lambda: hoeffding_b(8, 0.05, 1, True), "H_Q: must be an integer >= 1, got True"),
    ("streaming.collision_streaming", lambda: collision_streaming(torch.zeros(1, 3), 0),
     "tile: must be an integer >= 1, got 0"),
    ("budget.estimate_capture_bytes", lambda: estimate_capture_bytes(L=0, H_Q=1, G=1, R=1, T=4),
     "L: must be an integer >= 1, got 0"),
    ("budget.estimate_capture_bytes", lambda: estimate_capture_bytes(L=1, H_Q=1, G=1, R=-1, T=4),
     "R: must be an integer >= 0, got -1"),
    ("hooks.AttentionRecorder", lambda: AttentionRecorder(None, [], 1, None, torch.device("cpu"), colsum_tile=True),
     "colsum_tile: must be an integer >= 1, got True"),
    ("identity.check_model_match", lambda: check_model_match(None, None, None, allow_foreign="no"),
     "allow_foreign: must be True or False, got 'no'"),
    ("load_checks.check_config", lambda: check_config(Path("m"), {"rms_norm_eps": 0}),
     "spec: the model folder m has a config that cannot describe a working model: config.json rms_norm_eps: must be "
     "> 0 (a norm divides by sqrt(mean square + eps)), got 0"),
    ("load_checks.check_config", lambda: check_config(Path("m"), {"rms_norm_eps": float("nan")}),
     "spec: the model folder m has a config that cannot describe a working model: config.json rms_norm_eps: must be "
     "a finite real number > 0 (a norm divides by sqrt(mean square + eps)), got nan"),
    ("select.resolve_budget", lambda: resolve_budget(0, budget_frac=0.5), "T: must be an integer >= 1, got 0"),
    ("compare.KeptComparison", lambda: KeptComparison(0, "a", "b", frozenset(), frozenset()),
     "T: must be an integer >= 1, got 0"),
    ("decimate.token_bins", lambda: token_bins(-1), "T: must be an integer >= 0, got -1"),
    ("decimate.token_bins", lambda: token_bins(10, 0), "width_px: must be an integer >= 1, got 0"),
    ("decimate.TokenBins.reduce", lambda: token_bins(10).reduce(np.zeros(10), "sum"),
     "how: must be one of ['max', 'mean'], got 'sum'"),
    ("colour_scale.resolve_scale", lambda: resolve_scale("bogus", False, 10),
     "scale: must be one of ['linear', 'log', 'quantile'], got 'bogus'"),
    ("theme.categorical", lambda: categorical(49), "n: must be an integer in [0, 48], got 49"),
    ("verdicts.plan", lambda: plan(0.2, kind="non-inferiority", margin=1.0), "margin: must be in (0, 1), got 1.0"),
    ("conclusions.conclusions", lambda: conclusions(None, margin=1.0), "margin: must be in [0, 1), got 1.0"),
    ("haystack.check_lengths", lambda: check_lengths([10], 1, 128), "lengths: must be an integer in [64, 1000000], got 10"),
    ("haystack.check_lengths", lambda: check_lengths([128], 1, 8), "passage_tokens: must be an integer >= 16, got 8"),
    ("ruler.niah_multikey", lambda: niah_multikey(None, n_distractors=51),
     "n_distractors: must be an integer in [1, 50], got 51"),
    ("followup.followup_multikey", lambda: followup_multikey(None, n_keys=1), "n_keys: must be an integer in [2, 51], got 1"),
    ("registry.register_method", lambda: register_method("one_route_probe", _fn, per_item=1),
     "per_item: must be True or False, got 1"),
    ("squad.squad_single", lambda: squad_single([], n_distractors=0), "n_distractors: must be an integer >= 1, got 0"),
    ("squad.squad_single", lambda: squad_single([], max_passage_chars=49),
     "max_passage_chars: must be an integer >= 50, got 49"),
    # range checks once written by hand, now through a declared constraint or a factory (the message kept
    # where a test pinned it, else naming the range known at the call)
    ("envelope.envelope", lambda: envelope(*_ENV, atol=-1.0), "atol: must be a finite number >= 0, got -1.0"),
    ("envelope.envelope", lambda: envelope(*_ENV, atol="0"), "atol: must be a finite number >= 0, got '0'"),
    ("envelope.output_bound", lambda: output_bound(0.1, -1.0), "V: must be >= 0, got -1.0"),
    ("envelope.output_bound", lambda: output_bound(0.1, float("inf")), "V: must be a finite real number >= 0, got inf"),
    ("selection.certificate", lambda: certificate(np.ones(2), np.ones((1, 2)), 0.1, 0, np.ones(1), -1.0),
     "t: must be a finite price >= 0, got -1.0"),
    ("selection.certificate", lambda: certificate(np.ones(2), np.ones((1, 2)), 0.1, 3, np.ones(1), 0.0),
     "m0: must be an integer in [0, 2] (k = 2 candidate chunks), got 3"),
    ("selection.certificate", lambda: certificate(np.ones(2), np.ones((1, 2)), 0.1, 1.0, np.ones(1), 0.0),
     "m0: must be an integer in [0, 2] (k = 2 candidate chunks), got 1.0"),
    ("shift.ShiftAnalysis", lambda: ShiftAnalysis(k=True), "k: must be an integer >= 1, got True"),
    ("shift.ShiftAnalysis", lambda: ShiftAnalysis(ref_start=0), "ref_start: must be None or an integer >= 1, got 0"),
    ("shift.ShiftAnalysis", lambda: ShiftAnalysis(ref_start=3, ref_end=2),
     "ref_end: must be None or an integer >= 3, got 2"),
    ("shift.ShiftAnalysis", lambda: ShiftAnalysis(W=0), "W: must be None or an integer >= 1, got 0"),
    ("stats.wilson_ci", lambda: wilson_ci(6, 5), "k: must be an integer in [0, 5] (n = 5 trials), got 6"),
    ("stats.wilson_ci", lambda: wilson_ci(-1, 5), "k: must be an integer >= 0, got -1"),
    ("stats.wilson_ci", lambda: wilson_ci(1, 2.0), "n: must be an integer >= 0, got 2.0"),
    ("stats.mcnemar", lambda: mcnemar(True, 1), "b: must be an integer >= 0, got True"),
    ("stats.mcnemar", lambda: mcnemar(1, -2), "c: must be an integer >= 0, got -2"),
    ("stats.tango_bounds", lambda: tango_bounds(0, 0, 0), "n: must be an integer >= 1, got 0"),
    ("hooks.RowSet.rows", lambda: RowSet(custom=(50,)).rows(_SPANS),
     "custom: must be an integer in [0, 22] (a position of the prompt of T = 23 tokens), got 50"),
    ("hooks.capture_attention", lambda: _capture(hidden_layers=[3]),
     "hidden_layers: must be an integer in [0, 2] (L = 2: the final norm's input), got 3"),
    ("spans.PromptSpans.synthetic", lambda: PromptSpans.synthetic([4, 0], query_len=4),
     "chunk_sizes: must be an integer >= 1 (every chunk's size in tokens), got 0"),
    ("task_item.TaskItem", lambda: _item(answer_doc=2), "answer_doc: must be an integer in [0, 1], got 2"),
    ("task_item.TaskItem", lambda: _item(conflict_doc=5), "conflict_doc: must be None or an integer in [0, 1], got 5"),
    ("export.resolve_size", lambda: resolve_size(go.Figure(), scale=0), "scale: must be a finite number > 0, got 0"),
    ("export.resolve_size", lambda: resolve_size(go.Figure(), width=-3), "width: must be a finite number > 0, got -3"),
    ("export.resolve_size", lambda: resolve_size(go.Figure(), height="1"),
     "height: must be a finite number > 0, got '1'"),
    ("ruler.frequent_words", lambda: frequent_words(None, alpha=1), "alpha: must be a number > 1, got 1"),
]


@pytest.mark.parametrize("call, message", [m[1:] for m in MESSAGES], ids=[m[0] for m in MESSAGES])
def test_a_migrated_check_keeps_its_message(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == message


def test_a_converted_check_still_accepts_its_range():
    """The other side of each converted check: values at its bounds pass (numpy integers as ints)."""
    assert output_bound(0.25, 0) == 0 and envelope(*_ENV, atol=0).atol == 0.0
    assert wilson_ci(np.int64(5), 5)[1] == pytest.approx(1.0) and mcnemar(0, 0)["p_exact"] == 1.0
    assert certificate(np.ones(2), np.ones((1, 2)), 0.1, np.int64(2), np.ones(1), 0) >= 0
    assert ShiftAnalysis(ref_start=3, ref_end=3, W=1).ref_end == 3
    assert [k for k, _ in RowSet(observers=False, audit=None, tail=0, custom=(0, 22)).rows(_SPANS)] == ["custom"] * 2
    assert _item(answer_doc=np.int64(1), conflict_doc=0).answer_doc == 1
    assert type(_item(answer_doc=np.int64(1)).answer_doc) is int and _item(answer_doc=1).evidence_docs == (1,)
    assert resolve_size(go.Figure(), width=300, scale=np.float32(2)).scale == 2.0
