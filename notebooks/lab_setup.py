"""Shared set-up of the notebooks (they run with ``notebooks/`` as their working directory).

``load()`` loads the model every notebook works on: the embedded default (SmolLM2-135M-Instruct) unless
the environment names another. ``WORKBENCH_MODEL``: a local Hugging Face folder or a hub id already in the
local cache (nothing is downloaded); ``WORKBENCH_DEVICE``: ``auto`` (default: CUDA when available, else
CPU), ``cpu``, ``cuda``, ``cuda:1`` ...

Memory: each kernel holds its own copy of the model (about 1.0 GB resident for the default model with a
capture, CPU fp32). Notebooks that share one kernel (JupyterLab: *Kernel ▸ Change Kernel…* → the other
notebook's running kernel) share one model: ``load()`` returns the model already loaded in this kernel.

Figures: importing this module makes ``workbench.show.outputs``' renderer plotly's default, so a figure shown as a
cell's output is laid out for the screen like the panels' figures.
"""
from __future__ import annotations

import os

from workbench.capture import RowSet, run_capture
from workbench.run.examples import load_example
from workbench.run.models import load_model
from workbench.show.outputs import use_laid_out_outputs

# a workbench figure left as a cell's output is laid out by the panels' rules (title, legend, axis titles at a fixed
# width) instead of being stretched by plotly to the output area after its layout was decided
use_laid_out_outputs()

_LOADED: dict = {}  # (model, device, kw) -> LoadedModel, so that notebooks sharing a kernel share one model


def load(**kw):
    """The notebooks' model (see the module docstring), printed in one line with its shape.
    ``kw``: more arguments of :func:`workbench.run.models.load_model` (e.g. ``dtype``)."""
    kw.setdefault("progress", False)
    key = (os.environ.get("WORKBENCH_MODEL") or None, os.environ.get("WORKBENCH_DEVICE") or "auto", repr(sorted(kw.items())))
    lm = _LOADED.get(key)
    if lm is None:
        lm = _LOADED[key] = load_model(key[0], device=key[1], **kw)
    print(f"{lm.model_id} on {lm.device} ({str(lm.dtype).removeprefix('torch.')}): {lm.shape}")
    return lm


def example_capture(lm=None, name: str = "example_prompt", **rows):
    """The bundled example prompt (``data/<name>.json``) on the notebooks' model, captured with
    ``RowSet(**rows)`` (default: observers, the query as audit rows, a 32-token tail, 4 decode steps).

    Returns ``(lm, ex, prompt, cap)`` and prints the prompt's size and the capture's shape."""
    lm = lm if lm is not None else load()
    ex = load_example(name)
    prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
    rows = {"tail": 32, "n_decode": 4, **rows}
    cap = run_capture(lm, prompt, RowSet(**rows), progress=False)
    spans = prompt.spans
    print(f"T = {spans.T} tokens, k = {spans.k} chunks, answer in chunk {spans.chunk_doc.index(ex.answer_doc)}; "
          f"capture {tuple(cap.attn.shape)} [layers, heads, rows, keys]")
    return lm, ex, prompt, cap
