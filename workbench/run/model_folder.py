"""A local model folder checked against its config before transformers reads it.

:func:`check_folder` reads ``config.json`` (it must be a JSON object), refuses a family outside the table
(:func:`workbench.run.families.family_of`) from the raw ``model_type`` before transformers parses the config,
and reads the headers of the safetensors weights (the JSON header only, never a weight): every file must be
exactly as long as its header says (a truncated copy is named), and the tensor names and shapes must match
the config (layer count, query and KV heads, head and hidden sizes, vocabulary), then every tensor the model
its config describes holds under the same name (built on the meta device by its own modelling class,
:func:`workbench.run.load_checks.skeleton_shapes`: a gated ``q_proj`` of query and output gate, the MLP's
``intermediate_size``). A mismatch is a ``ValueError`` naming the folder, the file and what differs, with the
mend (:data:`MEND`). The raw config's own refusals (non-causal attention, a norm epsilon ``<= 0``) are
:func:`workbench.run.load_checks.check_config`'s.

The converted folders in the cache (the default model, the research models of :mod:`workbench.run.shipped`)
carry a manifest (:data:`MANIFEST`) of their files' sizes and sha256 checksums, recorded at conversion:
:func:`manifest_damage` compares a folder with it (sizes at every load, checksums at ``prepare``), and
:func:`cached_folder` builds a folder once, rebuilding it when it is damaged.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workbench.run import adapter, families, load_checks
from workbench.util import atomic_dir, atomic_write_bytes, file_lock, file_sha256, sweep_stale_temp

__all__ = ["MANIFEST", "MEND", "SIZES_ONLY", "check_folder", "read_config", "weight_headers", "make_manifest",
           "manifest_damage", "cached_folder", "package_dir", "convert_gguf"]

MANIFEST = "workbench-manifest.json"
SIZES_ONLY = "an older manifest of sizes alone"  # what manifest_damage says of {"sizes": {...}} (no checksums)
MEND = "delete it and run prepare again (python -m workbench prepare) for the default model, or copy the folder again"
_LAYER = re.compile(r"^(?:model\.|model\.language_model\.|language_model\.model\.|language_model\.|gpt_neox\.|"
                    r"transformer\.)?(?:layers|h)\.(\d+)\.")
_HEADER_MAX = 100 * 2**20  # safetensors' own limit on the header size


def _bad(folder: Path, what: str) -> ValueError:
    return ValueError(f"spec: the model folder {folder} {what}; {MEND}")


def read_config(folder: Path) -> dict:
    """``config.json`` of ``folder`` as a dict (a clear error when it is not a JSON object)."""
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise _bad(folder, f"has a config.json that is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _bad(folder, f"has a config.json that is not valid JSON (line {e.lineno}, column {e.colno}: "
                           f"{e.msg})") from None
    if not isinstance(cfg, dict):
        raise _bad(folder, f"has a config.json that is not a JSON object (got {type(cfg).__name__})")
    return cfg


def _text_config(cfg: dict) -> dict:
    tc = cfg.get("text_config")
    return {**cfg, **tc} if isinstance(tc, dict) and "num_hidden_layers" not in cfg else cfg


def check_family(cfg: dict) -> None:
    """The family refusal (``TypeError`` listing the supported families) from the raw config, so that a refused
    or unknown ``model_type`` never reaches transformers' config classes."""
    mt = cfg.get("model_type")
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    name = "".join(p.title() for p in str(mt).split("_")) + "Config"
    text = type(name, (), {"model_type": tc.get("model_type")})() if tc is not None else None
    raw = type(name, (), {"model_type": mt, "get_text_config": lambda self: text if text is not None else self})()
    families.family_of(raw)


def _first(cfg: dict, *names, default=None):
    for n in names:
        v = cfg.get(n)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _read_header(folder: Path, f: Path) -> dict:
    """The tensor table of one safetensors file, after checking the file is as long as its header says."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _bad(folder, f"has a truncated {f.name} ({size} bytes, shorter than a safetensors header)")
        n = struct.unpack("<Q", head)[0]
        if n > _HEADER_MAX or 8 + n > size:
            raise _bad(folder, f"has a truncated or damaged {f.name} ({size} bytes; its header alone would be "
                               f"{8 + n} bytes)")
        try:
            table = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise _bad(folder, f"has a damaged {f.name} (its header is not JSON)") from None
    if not isinstance(table, dict):
        raise _bad(folder, f"has a damaged {f.name} (its header is not a tensor table)")
    table.pop("__metadata__", None)
    try:
        end = max((int(v["data_offsets"][1]) for v in table.values()), default=0)
        out = {k: [int(x) for x in v["shape"]] for k, v in table.items()}
    except (KeyError, TypeError, ValueError, IndexError):
        raise _bad(folder, f"has a damaged {f.name} (its header lacks shapes or offsets)") from None
    if size != 8 + n + end:
        raise _bad(folder, f"has a truncated or damaged {f.name}: {size} bytes, its header describes {8 + n + end}")
    return out


def weight_headers(folder: Path) -> dict[str, list[int]] | None:
    """``{tensor name: shape}`` from the safetensors headers of ``folder`` (one file or an index of shards);
    ``None`` for weights in another format (``pytorch_model.bin``: not checked)."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return _read_header(folder, single)
    if not index.is_file():
        return None
    try:
        wmap = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(wmap.values()))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise _bad(folder, "has a damaged model.safetensors.index.json (no weight_map)") from None
    out: dict[str, list[int]] = {}
    for s in shards:
        if not (folder / s).is_file():
            raise _bad(folder, f"is incomplete: the weight shard {s} listed in model.safetensors.index.json is missing")
        out.update(_read_header(folder, folder / s))
    missing = sorted(set(wmap) - set(out))
    if missing:
        raise _bad(folder, f"is incomplete: {len(missing)} tensors of the index are in no shard (first: {missing[0]})")
    return out


def _check_shapes(folder: Path, cfg: dict, shapes: dict[str, list[int]],
                  expected: dict[str, list[int]] | None = None) -> None:
    """The folder's layer count, attention and embedding shapes against its config's fields (the message names
    them); ``expected``: the shapes of the model the config describes (:func:`workbench.run.load_checks.
    skeleton_shapes`), which tell a gated ``q_proj`` (query and output gate) from a plain one."""
    c = _text_config(cfg)
    built = _per_layer(expected or {})
    L = _first(c, "num_hidden_layers", "n_layer", "num_layers")
    H = _first(c, "num_attention_heads", "n_head")
    G = _first(c, "num_key_value_heads", default=H)
    D = _first(c, "hidden_size", "n_embd")
    d = _first(c, "head_dim", default=(D // H if D and H else None))
    V = _first(c, "vocab_size")
    layers = sorted({int(m.group(1)) for k in shapes if (m := _LAYER.match(k))})
    if L is not None and layers and layers != list(range(L)):
        raise _bad(folder, f"does not match its config: config.json says num_hidden_layers = {L}, the weights hold "
                           f"{len(layers)} layers ({layers[0]} … {layers[-1]})")
    if "quantization_config" in c or None in (H, G, D, d):
        return  # packed (quantised) weights have other shapes; a config without the geometry is not checked
    want = {"q_proj.weight": (H * d, "num_attention_heads", H), "k_proj.weight": (G * d, "num_key_value_heads", G),
            "v_proj.weight": (G * d, "num_key_value_heads", G), "qkv_proj.weight": ((H + 2 * G) * d, "heads", H),
            "query_key_value.weight": (3 * H * d, "num_attention_heads", H)}
    nope, rope, lat = (_first(c, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank"))
    if None not in (nope, rope, lat):  # MLA (DeepSeek): query heads are nope + rope wide, keys come from a latent
        d = nope + rope
        want = {"q_proj.weight": (H * d, "num_attention_heads", H),
                "kv_a_proj_with_mqa.weight": (lat + rope, "kv_lora_rank + qk_rope_head_dim", lat + rope)}
    per_layer = {int(i): v for i, v in (c.get("per_layer_config") or {}).items() if isinstance(v, dict)}
    for k, shape in shapes.items():
        if not (m := _LAYER.match(k)):
            continue
        if per_layer.get(int(m.group(1))):  # Gemma-4: this layer's head_dim / num_key_value_heads override the config's
            o = per_layer[int(m.group(1))]
            dl, Gl = _first(o, "head_dim", default=d), _first(o, "num_key_value_heads", default=G)
            want_l = {"q_proj.weight": (H * dl, "num_attention_heads", H),
                      "k_proj.weight": (Gl * dl, "num_key_value_heads", Gl)}
            if not c.get("attention_k_eq_v"):
                want_l["v_proj.weight"] = (Gl * dl, "num_key_value_heads", Gl)
        else:
            want_l = want
        for suffix, (rows, field, value) in want_l.items():
            if not (k.endswith("." + suffix) and len(shape) == 2):
                continue
            gate = ""
            if suffix == "q_proj.weight" and _gated_query(c, built.get((int(m.group(1)), k[m.end():])), rows):
                rows, gate = 2 * rows, " (query and output gate: 2 · num_attention_heads · head_dim rows)"
            if shape[0] != rows or shape[1] != D:
                raise _bad(folder, f"does not match its config: {k} has shape {shape}, the config ({field} = "
                                   f"{value}, num_key_value_heads = {G}, head_dim = {d}, hidden_size = {D}) needs "
                                   f"[{rows}, {D}]{gate}")
    for k, shape in shapes.items():
        if k.endswith(("embed_tokens.weight", "embed_in.weight", "wte.weight")) and V and shape != [V, D]:
            raise _bad(folder, f"does not match its config: {k} has shape {shape}, the config (vocab_size = {V}, "
                               f"hidden_size = {D}) needs [{V}, {D}]")


def _per_layer(shapes: dict[str, list[int]]) -> dict:
    """``shapes`` keyed by ``(layer, name inside the layer)`` for a decoder layer's tensors (a checkpoint saved
    under another prefix, ``model.language_model.layers.3.…``, renamed at load, is still matched), by the full
    name for the others."""
    return {((int(m.group(1)), k[m.end():]) if (m := _LAYER.match(k)) else k): v for k, v in shapes.items()}


def _check_against_model(folder: Path, c: dict, shapes: dict[str, list[int]], expected: dict[str, list[int]]) -> None:
    """Every tensor of the folder that the model its config describes holds under the same name (in the same
    layer) has that tensor's shape: the MLP's ``intermediate_size``, norms, biases, what the field-by-field check
    does not name. Tensors of three or more dimensions (fused experts) are left to the load, which may
    transpose them from the checkpoint's layout."""
    want = _per_layer(expected)
    for k, shape in sorted(shapes.items()):
        key = next(iter(_per_layer({k: shape})))
        if len(shape) <= 2 and key in want and shape != want[key]:
            raise _bad(folder, f"does not match its config: {k} has shape {shape}, the model its config describes "
                               f"({_fields_for(c, k)}) needs {want[key]}")


# config fields that size a tensor, by the part of the model it belongs to (named in a shape mismatch)
_MLP_FIELDS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
               "intermediate_size_mlp", "ffn_hidden_size", "hidden_size")
_GEOMETRY = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")


def _fields_for(c: dict, name: str) -> str:
    mlp = any(p in name for p in (".mlp.", ".feed_forward.", ".block_sparse_moe.", "experts", "gate_proj", "up_proj",
                                  "down_proj", ".fc1.", ".fc2.", ".c_fc.", "dense_h_to_4h", "dense_4h_to_h"))
    fields = [f"{f} = {c[f]}" for f in (_MLP_FIELDS if mlp else _GEOMETRY) if f in c]
    return ", ".join(fields) or "its geometry"


def _gated_query(c: dict, built: list[int] | None, rows: int) -> bool:
    """Whether ``q_proj`` holds the query and a per-head output gate (Qwen3-Next, Qwen3.5: ``2·H·d`` rows, the
    gate split from the query and applied as ``sigmoid`` to the attention output): read from the modelling class
    (the projection the model its config describes builds), else from the config's ``attn_output_gate``."""
    if built:
        return built[0] == 2 * rows
    return bool(c.get("attn_output_gate"))


TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def check_tokenizer_files(folder: Path) -> None:
    """The tokenizer's JSON files that are there parse (a truncated copy is named with its path, not left to
    the tokenizer library's bare ``JSONDecodeError``)."""
    for name in TOKENIZER_JSON:
        path = folder / name
        if not path.is_file():
            continue
        try:
            json.loads(path.read_bytes())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            where = f"line {e.lineno}, column {e.colno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else e.reason
            raise ValueError(f"spec: the tokenizer file {path} is not valid JSON ({where}; a truncated or damaged "
                             f"copy?); {MEND}") from None


def check_folder(folder: Path) -> dict:
    """Check ``folder`` against its config before any weight is read (see the module docstring); returns the
    config. ``TypeError`` for a refused family, ``ValueError`` naming the folder for anything else."""
    cfg = read_config(folder)
    check_tokenizer_files(folder)
    check_family(cfg)
    load_checks.check_config(folder, _text_config(cfg))
    shapes = weight_headers(folder)
    if shapes is not None:
        expected = load_checks.skeleton_shapes(folder, _text_config(cfg))
        _check_shapes(folder, cfg, shapes, expected)
        if expected:
            _check_against_model(folder, _text_config(cfg), shapes, expected)
    return cfg


# ----------------------------------------------------------------------------- building a folder from a wheel's GGUF
def package_dir(import_name: str) -> Path | None:
    """The folder of the installed package ``import_name`` (a model's wheel), found without importing it; None
    when it is not installed."""
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF file ``gguf`` into an HF folder ``out`` (model in fp32 and tokenizer)."""
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    adapter.clear_gguf_quantization(model)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))


# ----------------------------------------------------------------------------- the cache folders' manifest
def make_manifest(folder: Path, info: Mapping | None = None) -> bytes:
    """The manifest of ``folder``: every file's size and sha256 (``files``) beside ``info`` (what built it), JSON
    bytes written as :data:`MANIFEST`."""
    files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    return (json.dumps({**(info or {}), "files": files}, indent=1, sort_keys=True) + "\n").encode()


def manifest_damage(folder: Path, *, checksums: bool) -> str | None:
    """What in ``folder`` differs from its manifest (a missing or resized file; with ``checksums``, a changed
    sha256); ``"no manifest"`` when it has none, :data:`SIZES_ONLY` for an older workbench's manifest of sizes
    alone (``{"sizes": {name: bytes}}``); ``None`` when it matches."""
    unreadable = f"its {MANIFEST} is unreadable"
    try:
        man = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no manifest"
    except (UnicodeDecodeError, json.JSONDecodeError):
        return unreadable
    files = man.get("files") if isinstance(man, dict) else None
    if not isinstance(files, dict) or not all(isinstance(r, dict) for r in files.values()):
        return SIZES_ONLY if files is None and isinstance(man, dict) and isinstance(man.get("sizes"), dict) \
            else unreadable
    for name, rec in sorted(files.items()):
        p = folder / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != rec.get("size"):
            return f"{name} has {p.stat().st_size} bytes, {rec.get('size')} when it was converted"
    if checksums:
        for name, rec in sorted(files.items()):
            if file_sha256(folder / name) != rec.get("sha256"):
                return f"{name} does not match its sha256 checksum recorded at conversion"
    return None


def cached_folder(target: Path, build: Callable[[Path], None], *, verify: bool, progress: bool, doing: str,
                  info: Mapping | None = None, incomplete: Callable[[Path], str | None] | None = None,
                  adopt: Callable[[Path], str | None] | None = None) -> Path:
    """The converted model folder ``target`` in the cache, built by ``build(tmp)`` when it is missing or damaged.

    Every call compares the files' sizes with the manifest (:func:`manifest_damage`); ``verify=True``
    (``prepare``) also their sha256. ``incomplete(folder)`` names what a folder lacks (checked first, and on the
    new build). A folder of an older workbench (no manifest, or :data:`SIZES_ONLY`) is given to
    ``adopt(folder)``: when it returns ``None`` the folder is kept and its manifest recorded, else (and without
    ``adopt``) it is rebuilt, saying why. The build fills a temp folder under a lock (``.<name>.lock`` beside
    ``target``) that is renamed into place with its manifest (``info`` beside the files), so a second process
    never sees it half written; temp folders of a killed build are removed at the next call. ``doing``: what the
    progress line says is being done.
    """

    def damage(folder: Path, checksums: bool) -> str | None:
        return (incomplete(folder) if incomplete is not None else None) or manifest_damage(folder,
                                                                                           checksums=checksums)

    if not verify and damage(target, False) is None:
        return target
    home = target.parent
    with file_lock(home / f".{target.name}.lock"):
        sweep_stale_temp(home)
        for legacy in home.glob(f".{target.name}.*.tmp"):  # an older workbench's temp folder (under our lock)
            shutil.rmtree(legacy, ignore_errors=True)
        why = damage(target, verify)
        if why in ("no manifest", SIZES_ONLY) and adopt is not None:
            why = adopt(target)
            if why is None:
                atomic_write_bytes(target / MANIFEST, make_manifest(target, info))
        if why is None:
            return target
        if progress:
            state = "incomplete" if incomplete is not None and incomplete(target) else "damaged"
            again = f" (the folder there is {state}: {why}; rebuilding it)" if target.exists() else " (once)"
            print(f"{doing}{again} ...", flush=True)
        with atomic_dir(target) as tmp:
            build(tmp)
            why = incomplete(tmp) if incomplete is not None else None
            if why is not None:
                raise RuntimeError(f"prepare: the build of {target.name} produced an incomplete folder ({why})")
            (tmp / MANIFEST).write_bytes(make_manifest(tmp, info))
    return target
