"""The report interrupted after its sweep (the needle eviction, the figure export, the tables, the HTML page):
a partial report from the finished cells each time, and the same command then finishing with the tables of a
clean run; a failing figure export retried once on a new Chromium, else reported in one line without failing a
report whose tables are written.

The report runs in-process on the embedded model, its figures rendered by a stand-in for kaleido's writer (no
Chromium: what is checked is the report's own stages; a real export is tests/test_report.py)."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

import workbench.study.report as R
import workbench.study.report_parts as parts
from workbench import __main__ as cli
from workbench.show import export as ex
from workbench.show import kaleido_server as ks
from workbench.study.report_config import ReportConfig, ReportResult
from workbench.study.report_export import one_line
from workbench.study.storage import MEASURED

# what kaleido's Chromium answered once in a resumed report (a raw Chrome-protocol reply as the message)
PROTOCOL_ERROR = ("{'id': 7, 'error': {'code': -32000, 'message': 'ReferenceError: kaleido_scopes is not defined\\n"
                  "    at <anonymous>:1:1', 'data': {'exceptionDetails': {'lineNumber': 0}}}}")


@pytest.fixture
def renders(monkeypatch):
    """Figure renders by a stand-in writer; ``fail`` holds what the next renders raise (popped one per render)."""
    state = {"fail": [], "calls": 0}

    def write(specs, cancel_on_error=True):
        state["calls"] += 1
        if state["fail"]:
            raise state["fail"].pop(0)
        for s in specs:
            Path(s["path"]).write_bytes(b"<svg width='1' height='1'></svg>" if s["path"].endswith(".svg")
                                        else b"\x89PNG\r\n\x1a\n")

    fake = types.ModuleType("kaleido")
    fake.write_fig_from_object_sync = write
    monkeypatch.setitem(sys.modules, "kaleido", fake)
    for mod in (ks, ex):
        monkeypatch.setattr(mod, "ensure_server", lambda **kw: None)
        monkeypatch.setattr(mod, "shutdown_server", lambda: None)
    return state


def _cfg(out: Path) -> ReportConfig:
    return ReportConfig.tiny_config(out=out, n_squad=0, n_needle=1, methods=("full",), data="sample",
                                    progress=False)


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    """Every table of a report without what differs between two identical runs (times and memory)."""
    res = {}
    for f in sorted((out / "tables").glob("*.parquet")):
        df = pd.read_parquet(f)
        res[f.stem] = df.drop(columns=[c for c in df.columns if c in MEASURED or c.endswith("_s")])
    return res


def _once(monkeypatch, obj, name: str):
    """``obj.name`` raises KeyboardInterrupt at its first call (as Ctrl-C or SIGTERM would there), then works."""
    real = getattr(obj, name)
    armed = [True]

    def hook(*a, **kw):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(obj, name, hook)


def _assert_partial(res: ReportResult, out: Path, stage: str, cells: int) -> None:
    assert res.partial and res.interrupted == stage
    assert f"PARTIAL report ({stage} was interrupted" in res.summary()
    page = (out / "report.html").read_text()
    assert "PARTIAL REPORT" in page and f"interrupted during {stage}" in page and page.rstrip().endswith("</html>")
    man = json.loads((out / "manifest.json").read_text())
    assert man["partial"] is True and man["interrupted"] == stage
    assert len(pd.read_parquet(out / "tables" / "sweep.parquet")) == cells  # every cell kept
    assert {"sweep", "summary", "accuracy"} <= set(man["tables"])  # the tables of the finished cells


def test_interrupts_after_the_sweep_write_a_partial_report_and_the_rerun_finishes(tmp_path, smollm, renders,
                                                                                  monkeypatch):
    clean = R.run_report(_cfg(tmp_path / "clean"), lm=smollm)
    assert not clean.partial and clean.interrupted is None and clean.figures
    cells = len(pd.read_parquet(tmp_path / "clean" / "tables" / "sweep.parquet"))
    out = tmp_path / "rep"
    stages = [("the figure export", lambda: _once(monkeypatch, ex, "export_all")),
              ("the tables", lambda: _once(monkeypatch, R, "write_table")),
              ("the HTML page", lambda: _once(monkeypatch, R, "write_html")),
              ("the needle eviction", lambda: _once(monkeypatch, parts, "needle_part"))]
    for stage, arm in stages:
        arm()
        _assert_partial(R.run_report(_cfg(out), lm=smollm), out, stage, cells)
    done = R.run_report(_cfg(out), lm=smollm)  # the same command again: resumes and finishes
    assert not done.partial and done.interrupted is None and set(done.figures) == set(clean.figures)
    page = (out / "report.html").read_text()
    assert "PARTIAL REPORT" not in page and json.loads((out / "manifest.json").read_text())["partial"] is False
    got, want = _tables(out), _tables(tmp_path / "clean")
    assert set(got) == set(want)
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], obj=name)


def test_a_failed_export_is_retried_once_then_reported_in_one_line(tmp_path, smollm, renders, capsys):
    renders["fail"] = [RuntimeError(PROTOCOL_ERROR)]  # fails once, then renders: every figure is written
    res = R.run_report(_cfg(tmp_path / "a"), lm=smollm)
    assert res.export_error is None and not res.partial and all(res.figures.values())
    err = capsys.readouterr().err
    assert "failed (RuntimeError: ReferenceError: kaleido_scopes is not defined); retrying once" in err
    assert "'code'" not in err  # not the raw protocol dict
    renders["fail"] = [RuntimeError(PROTOCOL_ERROR)] * 2  # fails twice: the report is still written, not failed
    res = R.run_report(_cfg(tmp_path / "b"), lm=smollm)
    assert not res.partial and res.export_error.startswith("figure export failed twice at ")
    assert "kaleido_scopes is not defined" in res.export_error and "\n" not in res.export_error
    assert "'data'" not in res.export_error and f"WARNING: {res.export_error}" in res.summary()
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert man["export_error"] == res.export_error and {"sweep", "summary", "accuracy"} <= set(man["tables"])
    page = (tmp_path / "b" / "report.html").read_text()
    assert "FIGURE FILES MISSING" in page and page.rstrip().endswith("</html>")


def test_one_line_of_an_error():
    assert one_line(RuntimeError(PROTOCOL_ERROR)) == "RuntimeError: ReferenceError: kaleido_scopes is not defined"
    assert one_line(ValueError("a\n  b")) == "ValueError: a b" and one_line(KeyError()) == "KeyError"
    assert len(one_line(RuntimeError("x" * 1000))) == 300


@pytest.fixture
def cli_report(monkeypatch, tmp_path):
    """``main(["report", ...])`` in-process: its exit code (``os._exit`` and the SIGTERM handler left out)."""
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)

    def leave(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli, "_exit", leave)

    def run(result_or_error):
        def fake(cfg):
            if isinstance(result_or_error, BaseException):
                raise result_or_error
            return result_or_error

        monkeypatch.setattr(cli, "run_report", fake)
        try:
            return cli.main(["report", "--tiny", "--no-progress", "--out", str(tmp_path / "o")])
        except SystemExit as e:
            return e.code

    return run


def test_cli_says_what_an_interrupt_kept(cli_report, tmp_path, capsys):
    res = ReportResult(out=tmp_path / "o", html=tmp_path / "o" / "report.html", manifest=tmp_path / "m", figures={},
                       tables={}, timings={}, partial=True, interrupted="the figure export")
    assert cli_report(res) == 130
    out = capsys.readouterr()
    assert "PARTIAL report (the figure export was interrupted" in out.out and "before the sweep" not in out.err
    assert cli_report(KeyboardInterrupt()) == 130  # before the sweep, nothing kept
    assert "nothing to report" in capsys.readouterr().err
    (tmp_path / "o" / "tables").mkdir(parents=True)
    (tmp_path / "o" / "tables" / "sweep.parquet").write_bytes(b"PAR1")
    assert cli_report(KeyboardInterrupt()) == 130  # cells of an earlier run are there: they are kept
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "are kept: re-run the same command to resume" in err
    warned = ReportResult(out=tmp_path / "o", html=tmp_path / "r", manifest=tmp_path / "m", figures={}, tables={},
                          timings={}, export_error="figure export failed twice at 'x' (E: y); 3 figure(s) ...")
    assert cli_report(warned) == 0  # the tables and the page are written: a warning, not a failure
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m workbench report: warning: figure export failed twice at 'x' (E: y); 3 figure(s) ..."]


# the command line in a child: figures by a stand-in writer; the first os.replace onto report.html holds still
# (printing READY) so that a real SIGTERM arrives while the page is being written
CHILD = '''
import os, sys, time, types
from pathlib import Path
fake = types.ModuleType("kaleido")
def _write(specs, cancel_on_error=True):
    for s in specs:
        Path(s["path"]).write_bytes(b"<svg width='1' height='1'></svg>" if s["path"].endswith(".svg")
                                    else b"\\x89PNG\\r\\n\\x1a\\n")
fake.write_fig_from_object_sync = _write
sys.modules["kaleido"] = fake
from workbench.show import export as ex, kaleido_server as ks
for _m in (ks, ex):
    _m.ensure_server = lambda **kw: None
    _m.shutdown_server = lambda: None
_real = os.replace
def _replace(a, b):
    if os.environ.get("WB_HOLD") and str(b).endswith("report.html") and not getattr(_replace, "held", False):
        _replace.held = True
        print("READY", file=sys.stderr, flush=True)
        time.sleep(600)
    return _real(a, b)
os.replace = _replace
from workbench.__main__ import main
sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.slow  # two tiny reports in children (~30 s each: the model loads in each)
def test_sigterm_while_the_page_is_written_gives_a_partial_report_then_the_command_finishes(tmp_path):
    import os
    import signal
    import subprocess

    out = tmp_path / "rep"
    args = ["report", "--tiny", "--n-squad", "0", "--methods", "full", "--data", "sample", "--no-progress",
            "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**env, "WB_HOLD": "1"})
    try:
        for line in p.stderr:
            if "READY" in line:
                p.send_signal(signal.SIGTERM)
                break
        stdout, stderr = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, stderr[-3000:]
    assert "PARTIAL report (the HTML page was interrupted" in stdout and "before the sweep" not in stderr
    page = (out / "report.html").read_text()
    assert "PARTIAL REPORT" in page and "interrupted during the HTML page" in page
    assert json.loads((out / "manifest.json").read_text())["partial"] is True
    r = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PARTIAL" not in r.stdout and "PARTIAL REPORT" not in (out / "report.html").read_text()
    assert "warning" not in r.stderr and all(json.loads((out / "manifest.json").read_text())["figures"].values())
    assert json.loads((out / "manifest.json").read_text())["partial"] is False
