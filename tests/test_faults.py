"""Fault tests in subprocesses: kill -9 in the middle of a write, two writers on one sweep output, and a
full disk. After a kill, the next start leaves no stray file, and every target is intact or absent.

A child process blocks at a chosen ``os.replace`` (the moment its temp file is complete and not yet
renamed) and prints ``READY``; the test then kills it with SIGKILL. Everything is synthetic or fake (no
model is loaded, no Chromium is started), so each test takes a few seconds, mostly the child's imports.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

from workbench.capture.data import Capture
from workbench.run import models
from workbench.run.spans import PromptSpans
from workbench.study import sweep as sw
from workbench.util import TMP_DIRNAME, atomic_write_bytes

REPO = Path(__file__).resolve().parents[1]

# the child blocks at its WB_BLOCK_AT-th os.replace (0: never)
BLOCK = '''
import os, sys, time
import workbench.util as U
_real, _n = os.replace, [0]
def _replace(a, b):
    _n[0] += 1
    if _n[0] == int(os.environ.get("WB_BLOCK_AT", "0")):
        print("READY", flush=True)
        time.sleep(600)
    return _real(a, b)
U.os.replace = _replace
'''

# a sweep without a model: a fake LoadedModel and a method that only answers (shared by child and parent)
SWEEP_SETUP = '''
import time
from types import SimpleNamespace
import torch
from workbench.study import sweep as sw
from workbench.study.tasks import TaskItem

def factory():
    return SimpleNamespace(device="cpu", dtype=torch.float32, tokenizer=None, model_id="fake")
factory.model_id = "fake"

def _probe(lm, item, params):
    time.sleep(float(params.get("sleep", 0.0)))
    return {"generated_ids": [1, 2], "answer": item.answers[0]}

sw.register_method("fault_probe", _probe, params=("sleep",), replace=True)
ITEMS = [TaskItem(task="t", item_id=f"i{i}#0", documents=(f"the answer is a{i}",), query="q?", answers=(f"a{i}",), answer_doc=0)
         for i in range(4)]
'''


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def kill_at_ready(script: str, *, block_at: int = 1, timeout: float = 120, **env) -> None:
    """Run ``script`` in a child; when it prints READY, kill it with SIGKILL (and reap it)."""
    p = subprocess.Popen([sys.executable, "-c", BLOCK + script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env(WB_BLOCK_AT=block_at, **env))
    watchdog = threading.Timer(timeout, p.kill)
    watchdog.start()
    try:
        for line in p.stdout:
            if "READY" in line:
                os.kill(p.pid, signal.SIGKILL)
                break
        p.wait()
        err = p.stderr.read()
    finally:
        watchdog.cancel()
    assert p.returncode == -signal.SIGKILL, f"the child did not reach the kill point (rc {p.returncode}):\n{err}"


def stray(folder: Path) -> list[str]:
    """Temp files and folders anywhere under ``folder``."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if TMP_DIRNAME in p.parts or p.name.endswith((".tmp", ".part")) or p.name.startswith(".tmp"))


def _capture(seed: int, T_chunks=(40, 40, 40)) -> Capture:
    sp = PromptSpans.synthetic(list(T_chunks), query_len=10)
    return Capture.synthetic(sp, L=3, H_Q=4, G=2, seed=seed, extra_rows={"tail": list(range(sp.T - 8, sp.T))})


# ----------------------------------------------------------------------------- kill -9
@pytest.mark.parametrize("existed", [True, False])
def test_kill_during_capture_save(tmp_path, existed):
    target = tmp_path / "cap.safetensors"
    if existed:
        _capture(0).save(target)
    kill_at_ready(f'''
from workbench.run.spans import PromptSpans
from workbench.capture.data import Capture
sp = PromptSpans.synthetic([40, 40, 40], query_len=10)
Capture.synthetic(sp, L=3, H_Q=4, G=2, seed=1, extra_rows={{"tail": list(range(sp.T - 8, sp.T))}}).save({str(target)!r})
''')
    left = stray(tmp_path)
    assert left and all(TMP_DIRNAME in s for s in left)  # the killed writer's full-size temp file, in one place
    if existed:
        assert torch.equal(Capture.load(target).attn, _capture(0).attn)  # intact: the old capture
    else:
        assert not target.exists()  # absent
    _capture(2).save(tmp_path / "next.safetensors")  # the next start in this folder sweeps the dead writer's temp
    assert stray(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == (["cap.safetensors"] if existed else []) + ["next.safetensors"]


def test_kill_during_export(tmp_path):
    """Killed between the renames of one figure's files: each file is complete or absent; no temp stays."""
    kill_at_ready(f'''
import plotly.graph_objects as go
from workbench.show import export as ex
ex.render_all = lambda d, fmts, size: {{f: (f * 1000).encode() for f in fmts}}  # no Chromium needed
ex.export(go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2])), {str(tmp_path / "fig")!r}, formats=("svg", "png"))
''', block_at=3)
    files = sorted(os.listdir(tmp_path))
    done = [f for f in files if f != TMP_DIRNAME]
    assert len(done) == 2  # two of the four files renamed before the kill
    for f in done:
        data = (tmp_path / f).read_bytes()
        if f.endswith((".svg", ".png")):
            assert data == (f.rsplit(".", 1)[1] * 1000).encode()
        elif f.endswith(".csv"):
            assert len(pd.read_csv(tmp_path / f)) == 3
        else:
            assert data.rstrip().endswith(b"}")
    assert stray(tmp_path)
    atomic_write_bytes(tmp_path / "other.txt", b"x")  # next start
    assert stray(tmp_path) == []


def _fake_gguf(tmp_path) -> Path:
    g = tmp_path / "wheel" / "FakeLM.Q4.gguf"
    g.parent.mkdir(parents=True, exist_ok=True)
    g.write_bytes(b"gguf")
    return g


def _fast_convert(gguf, out):
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (Path(out) / name).write_text("{}")


def test_kill_during_prepare_then_next_start_rebuilds(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    gguf = _fake_gguf(tmp_path)
    kill_at_ready(f'''
import time
from pathlib import Path
from workbench.run import models
models.default_gguf_path = lambda: Path({str(gguf)!r})
def slow(gguf, out):  # a conversion killed half-way: a big partial folder
    (Path(out) / "model.safetensors").write_bytes(b"0" * 4_000_000)
    print("READY", flush=True)
    time.sleep(600)
models._convert = slow
models.default_model_folder(progress=False)
''', block_at=0, WORKBENCH_CACHE=cache)
    mdir = cache / "models"
    assert stray(mdir)  # the killed conversion's temp folder
    assert not (mdir / gguf.stem).exists()
    monkeypatch.setenv("WORKBENCH_CACHE", str(cache))
    monkeypatch.setattr(models, "default_gguf_path", lambda: gguf)
    monkeypatch.setattr(models, "_convert", _fast_convert)
    target = models.default_model_folder(progress=False)
    assert models.incomplete_reason(target) is None
    assert stray(mdir) == [] and sorted(os.listdir(mdir)) == sorted([gguf.stem, f".{gguf.stem}.lock"])


def test_prepare_rebuilds_an_incomplete_folder_and_old_temp_folders(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    gguf = _fake_gguf(tmp_path)
    mdir = cache / "models"
    half = mdir / gguf.stem
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"0" * 1000)  # no config.json: an incomplete folder
    legacy = mdir / f".{gguf.stem}.abc123.tmp"  # an older workbench's temp folder
    legacy.mkdir()
    (legacy / "model.safetensors").write_bytes(b"0" * 1000)
    monkeypatch.setenv("WORKBENCH_CACHE", str(cache))
    monkeypatch.setattr(models, "default_gguf_path", lambda: gguf)
    monkeypatch.setattr(models, "_convert", _fast_convert)
    assert models.incomplete_reason(half) == "no config.json"
    target = models.default_model_folder(progress=False)
    assert target == half and models.incomplete_reason(target) is None
    assert sorted(os.listdir(mdir)) == sorted([gguf.stem, f".{gguf.stem}.lock"])


def test_kill_during_sweep_checkpoint_then_resume(tmp_path):
    out = tmp_path / "sweep.parquet"
    kill_at_ready(SWEEP_SETUP + f'''
sw.sweep(factory, ITEMS, {{"fault_probe": {{}}}}, out={str(out)!r}, reference=False, checkpoint_s=0, progress=False)
''', block_at=3)  # two checkpoints written, killed while writing the third
    assert len(sw.read_sweep(out)) == 2  # the last complete checkpoint, intact
    assert stray(tmp_path)
    ns: dict = {}
    exec(SWEEP_SETUP, ns)
    try:
        df = sw.sweep(ns["factory"], ns["ITEMS"], {"fault_probe": {}}, out=out, reference=False, progress=False)
    finally:
        sw.unregister_method("fault_probe")
    assert len(df) == 4 and df["error"].isna().all()
    assert stray(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["sweep.parquet"]  # lock file gone too


@pytest.mark.slow  # two child processes importing torch and transformers: ~30-60 s on a loaded 2-core machine
def test_two_concurrent_sweeps_on_one_out_lose_no_row(tmp_path):
    out = tmp_path / "sweep.parquet"
    procs = []
    for seed in (0, 1):
        script = SWEEP_SETUP + f'''
sw.sweep(factory, ITEMS, {{"fault_probe": {{"sleep": 0.3}}}}, seeds=({seed},), out={str(out)!r}, reference=False,
         checkpoint_s=0, progress=False)
'''
        procs.append(subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=_env()))
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        errs.append(err)
        assert p.returncode == 0, err
    df = sw.read_sweep(out)
    assert len(df) == 8 and sorted(df["seed"].value_counts().to_dict().items()) == [(0, 4), (1, 4)]
    assert any("waiting for it" in e for e in errs)  # the second writer waited for the first
    assert stray(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["sweep.parquet"]


# ----------------------------------------------------------------------------- full disk
@contextlib.contextmanager
def tmpfs(mnt: Path, size: str):
    """A tmpfs of ``size`` mounted on the new folder ``mnt`` for the block (the test is skipped where that needs
    root or is refused)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "256k") as mnt:
        yield mnt


def test_full_disk_gives_a_clear_error_and_writes_nothing(small_disk):
    sp = PromptSpans.synthetic([100, 100, 100], query_len=10)
    cap = Capture.synthetic(sp, L=8, H_Q=8, G=2, seed=0)
    assert cap.attn.numel() * 4 > 256 * 1024
    with pytest.raises(OSError, match="no space left on the device to write .*cap.safetensors.*nothing was written"):
        cap.save(small_disk / "cap.safetensors")
    assert os.listdir(small_disk) == []
    atomic_write_bytes(small_disk / "small.txt", b"ok")  # the disk was not left full of temp data
    assert os.listdir(small_disk) == ["small.txt"]


# ----------------------------------------------------------------------------- bad inputs and faults, one test per case
MANIFEST = "workbench-manifest.json"  # the default model's sizes and checksums (workbench.run.model_folder)


def _converted(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A fake default model converted into a fresh cache (with its manifest); ``(gguf, folder)``."""
    gguf = _fake_gguf(tmp_path)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "default_gguf_path", lambda: gguf)
    monkeypatch.setattr(models, "_convert", _fast_convert)
    return gguf, models.default_model_folder(progress=False)


def test_case10_prepare_rebuilds_a_truncated_or_changed_default_model(tmp_path, monkeypatch, capsys):
    gguf, target = _converted(tmp_path, monkeypatch)
    assert (target / MANIFEST).is_file()
    w = target / "model.safetensors"
    w.write_bytes(b"{")  # truncated: 1 byte of 2
    assert models.default_model_folder(progress=True) == target  # every load compares the sizes
    out = capsys.readouterr().out
    assert "damaged: model.safetensors has 1 bytes, 2 when it was converted; rebuilding it" in out
    assert w.read_bytes() == b"{}"
    w.write_bytes(b"[]")  # the same size, other bytes: only prepare's checksums see it
    models.default_model_folder(progress=True)
    assert w.read_bytes() == b"[]" and capsys.readouterr().out == ""
    models.default_model_folder(progress=True, verify=True)
    assert "model.safetensors does not match its sha256 checksum recorded at conversion" in capsys.readouterr().out
    assert w.read_bytes() == b"{}"
    assert stray(target.parent) == []


def test_case10_an_old_default_folder_without_manifest_is_checked_then_adopted(tmp_path, monkeypatch, capsys):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models.default_model_folder(progress=False)))

    def tiny_convert(gguf, out):
        models.tiny_model("llama", vocab=128, L=2, H_Q=4, G=2, d=16).save_pretrained(str(out))
        tok.save_pretrained(str(out))

    gguf = _fake_gguf(tmp_path)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "default_gguf_path", lambda: gguf)
    monkeypatch.setattr(models, "_convert", tiny_convert)
    target = models.default_model_folder(progress=False)
    good = (target / "model.safetensors").read_bytes()
    (target / MANIFEST).unlink()  # an older workbench's folder
    assert models.default_model_folder(progress=True) == target  # checked against its config, then adopted
    assert (target / MANIFEST).is_file() and capsys.readouterr().out == ""
    (target / MANIFEST).unlink()
    (target / "model.safetensors").write_bytes(good[: len(good) // 2])  # and truncated
    models.default_model_folder(progress=True)
    assert "has a truncated or damaged model.safetensors" in capsys.readouterr().out
    assert (target / "model.safetensors").read_bytes() == good


def test_kill_during_prepare_checksum_step_then_prepare_again(tmp_path, monkeypatch):
    gguf, target = _converted(tmp_path, monkeypatch)
    before = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}
    kill_at_ready(f'''
import time
from pathlib import Path
from workbench.run import models, model_folder
models.default_gguf_path = lambda: Path({str(gguf)!r})
def slow(path):  # killed while hashing the weights
    print("READY", flush=True)
    time.sleep(600)
model_folder.file_sha256 = slow
models.default_model_folder(progress=False, verify=True)
''', block_at=0, WORKBENCH_CACHE=tmp_path / "cache")
    assert models.default_model_folder(progress=False, verify=True) == target  # intact: nothing to rebuild
    assert {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == before
    assert stray(target.parent) == [] and sorted(os.listdir(target.parent)) == sorted([gguf.stem, f".{gguf.stem}.lock"])


# kaleido's writer stood in for (no Chromium): an SVG and a PNG header per file; source text, so that the report
# children (:data:`FAKE_KALEIDO`) and this process (:func:`_fake_kaleido`) run the same code
FAKE_WRITER = '''
from pathlib import Path
def _write(specs, cancel_on_error=True):
    for s in specs:
        Path(s["path"]).write_bytes(b"<svg width='1' height='1'></svg>" if s["path"].endswith(".svg")
                                    else b"\\x89PNG\\r\\n\\x1a\\n")
'''


def _fake_kaleido(monkeypatch=None):
    """A stand-in for kaleido's writer (no Chromium): writes an SVG and a PNG (:data:`FAKE_WRITER`, the one the
    report children use)."""
    ns: dict = {}
    exec(FAKE_WRITER, ns)
    fake = types.ModuleType("kaleido")
    fake.write_fig_from_object_sync = ns["_write"]
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, "kaleido", fake)
    return fake


def test_case21_a_killed_export_leaves_no_temp_folder_after_the_next_export(tmp_path, monkeypatch):
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    kill_at_ready('''
import sys, time, types
from types import SimpleNamespace
fake = types.ModuleType("kaleido")
def write(specs, cancel_on_error=True):
    print("READY", flush=True)
    time.sleep(600)
fake.write_fig_from_object_sync = write
sys.modules["kaleido"] = fake
from workbench.show import kaleido_server as ks
ks.ensure_server = lambda: None
ks.render_all({}, ("svg", "png"), SimpleNamespace(width=10, height=10, scale=1, dpi=72))
''', block_at=0, TMPDIR=systmp)
    left = [p.name for p in systmp.iterdir()]
    assert len(left) == 1 and left[0].startswith("workbench-export-")  # the killed export's folder
    from workbench.show import kaleido_server as ks

    _fake_kaleido(monkeypatch)
    monkeypatch.setattr(ks, "ensure_server", lambda: None)
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    out = ks.render_all({}, ("svg", "png"), types.SimpleNamespace(width=10, height=10, scale=1, dpi=72))
    assert out["svg"].startswith(b"<svg") and out["png"].startswith(b"\x89PNG")
    assert list(systmp.iterdir()) == []  # the next export swept it, and removed its own


# a report child that blocks at the os.replace onto a file of a given name (WB_BLOCK_NAME)
BLOCK_NAMED = '''
import os, sys, time
import workbench.util as U
_real = os.replace
def _replace(a, b):
    if str(b).endswith(os.environ["WB_BLOCK_NAME"]):
        print("READY", flush=True)
        time.sleep(600)
    return _real(a, b)
U.os.replace = _replace
'''


def _report_args(out: Path) -> list[str]:
    return ["report", "--tiny", "--n-needle", "0", "--methods", "full", "--data", "sample", "--no-progress",
            "--out", str(out)]


# The report children render their figures with a stand-in for kaleido's writer (no Chromium; what these tests
# check is the report's own writes and its resume; a real export's kill is case 21, a real report is
# tests/test_report.py): ~11 s of the ~25 s of each tiny report.
FAKE_KALEIDO = FAKE_WRITER + '''
import sys, types
_fake = types.ModuleType("kaleido")
_fake.write_fig_from_object_sync = _write
sys.modules["kaleido"] = _fake
from workbench.show import kaleido_server as _ks
_ks.ensure_server = lambda: None
'''


def _report_cli(out: Path) -> subprocess.CompletedProcess:
    """The same report command again (``python -m workbench report ...``'s ``main``, figures by the stand-in)."""
    return subprocess.run([sys.executable, "-c", FAKE_KALEIDO + "from workbench.__main__ import main\n"
                           f"sys.exit(main({_report_args(out)!r}))"], capture_output=True, text=True,
                          timeout=600, env=_env())


def _report_complete(out: Path) -> None:
    html = (out / "report.html").read_text()
    assert html.rstrip().endswith("</html>")
    man = json.loads((out / "manifest.json").read_text())
    assert man["html"] == "report.html" and not man["partial"]
    for t in (out / "tables").glob("*.parquet"):
        pd.read_parquet(t)
    assert stray(out) == []


@pytest.mark.slow  # two tiny reports (~15 s each, figures by the stand-in)
def test_kill_during_report_html_write_then_the_same_command_finishes(tmp_path):
    out = tmp_path / "rep"
    p = subprocess.Popen([sys.executable, "-c", FAKE_KALEIDO + BLOCK_NAMED + "from workbench.__main__ import main\n"
                          f"main({_report_args(out)!r})"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(WB_BLOCK_NAME="report.html"))
    try:
        for line in p.stdout:
            if "READY" in line:
                os.kill(p.pid, signal.SIGKILL)
                break
        p.wait(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL, p.stderr.read()[-3000:]
    assert not (out / "report.html").exists() and stray(out)  # killed with its complete temp file not renamed
    cells = len(pd.read_parquet(out / "tables" / "sweep.parquet"))
    r = _report_cli(out)
    assert r.returncode == 0, r.stderr[-3000:]
    _report_complete(out)
    assert len(pd.read_parquet(out / "tables" / "sweep.parquet")) == cells  # resumed: no cell run twice


@pytest.mark.slow  # two tiny reports (~15 s each, figures by the stand-in)
def test_full_disk_during_report_tables_then_the_same_command_finishes(tmp_path):
    with tmpfs(tmp_path / "rep", "256m") as out:
        filler = out / "filler.bin"
        child = FAKE_KALEIDO + f'''
import sys
import workbench.study.report as R
_real = R.write_table
def full_then_write(df, folder, name):  # the disk fills up when the tables are written
    if not (getattr(full_then_write, "done", False)):
        full_then_write.done = True
        f = open({str(filler)!r}, "wb", buffering=0)
        try:
            while True:
                f.write(bytes(1 << 16))
        except OSError:
            pass
        f.close()
    return _real(df, folder, name)
R.write_table = full_then_write
from workbench.__main__ import main
sys.exit(main({_report_args(out)!r}))
'''
        r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600, env=_env())
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1, r.stderr[-3000:]
        assert "error: no space left on the device to write" in err[0] and "nothing was written" in err[0]
        assert not (out / "report.html").exists() and not (out / "manifest.json").exists()
        assert stray(out) == []  # nothing half-written: no temp file, and every table there is whole
        for t in (out / "tables").glob("*.parquet"):
            pd.read_parquet(t)
        filler.unlink()  # space again
        r = _report_cli(out)
        assert r.returncode == 0, r.stderr[-3000:]
        _report_complete(out)
