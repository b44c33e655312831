"""Fault tests in subprocesses: kill -9 in the middle of a write, two writers on one sweep output, and a
full disk. After a kill, the next start leaves no stray file, and every target is intact or absent.

A child process blocks at a chosen ``os.replace`` (the moment its temp file is complete and not yet
renamed) and prints ``READY``; the test then kills it with SIGKILL. Everything is synthetic or fake (no
model is loaded, no Chromium is started), so each test takes a few seconds, mostly the child's imports.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
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
@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_gives_a_clear_error_and_writes_nothing(small_disk):
    sp = PromptSpans.synthetic([100, 100, 100], query_len=10)
    cap = Capture.synthetic(sp, L=8, H_Q=8, G=2, seed=0)
    assert cap.attn.numel() * 4 > 256 * 1024
    with pytest.raises(OSError, match="no space left on the device to write .*cap.safetensors.*nothing was written"):
        cap.save(small_disk / "cap.safetensors")
    assert os.listdir(small_disk) == []
    atomic_write_bytes(small_disk / "small.txt", b"ok")  # the disk was not left full of temp data
    assert os.listdir(small_disk) == ["small.txt"]
