"""TaskItems from a JSONL file (``report --items``), validated completely before any model work."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from workbench.study.tasks.item import TaskItem, with_content_id

__all__ = ["load_items", "ITEM_FIELDS", "REQUIRED_FIELDS"]

ITEM_FIELDS = ("task", "item_id", "documents", "query", "answers", "answer_doc", "evidence_docs", "answer_parts",
               "conflict_answers", "conflict_doc", "instruction", "meta")
REQUIRED_FIELDS = ("task", "documents", "query", "answers", "answer_doc")
LIST_FIELDS = ("documents", "answers", "evidence_docs", "answer_parts", "conflict_answers")
STRING_FIELDS = ("task", "query", "instruction")
STRING_LIST_FIELDS = ("documents", "answers", "answer_parts", "conflict_answers")


def _lines(raw: bytes, path: Path) -> list[str]:
    """The file's lines as text (``\\n`` or ``\\r\\n`` ends); a line that is not UTF-8 is named with its line and
    column."""
    out = []
    for i, b in enumerate(raw.split(b"\n"), start=1):
        try:
            out.append(b.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise ValueError(f"items: {path.name} line {i}: not UTF-8 text (byte 0x{b[e.start]:02x} at column "
                             f"{e.start + 1}); save the file as UTF-8") from None
    if out and out[-1] == "":
        out.pop()
    return out


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """A JSON object's dict; a key given twice is refused (``json`` would keep the last one silently)."""
    d = {}
    for k, v in pairs:
        if k in d:
            raise _DuplicateKey(k)
        d[k] = v
    return d


def _parse(line: str, where: str):
    try:
        return json.loads(line, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise ValueError(f"{where}: duplicate key {e.args[0]!r} in a JSON object (JSON would keep only the last "
                         "value); give each field once") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError(f"{where}: not a TaskItem: its JSON is nested too deeply to read (an item is one object "
                         "of fields whose values are strings, lists of strings or integers)") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true/false are not indices


def _check_types(d: dict, where: str) -> None:
    """Each field's JSON type (an index is an integer, never true/false; texts are strings)."""
    for f in LIST_FIELDS:
        if f in d and not isinstance(d[f], list):
            raise ValueError(f"{where}: {f}: must be a JSON list, got {type(d[f]).__name__}")
    for f in STRING_FIELDS:
        if f in d and not isinstance(d[f], str):
            raise ValueError(f"{where}: {f}: must be a string, got {d[f]!r}")
    for f in STRING_LIST_FIELDS:
        bad = [v for v in d.get(f, []) if not isinstance(v, str)]
        if bad:
            raise ValueError(f"{where}: {f}: every entry must be a string, got {bad[0]!r}")
    for f in ("answer_doc", "conflict_doc"):
        if f in d and not (_is_int(d[f]) or (f == "conflict_doc" and d[f] is None)):
            raise ValueError(f"{where}: {f}: must be an integer, got {d[f]!r}")
    bad = [v for v in d.get("evidence_docs", []) if not _is_int(v)]
    if bad:
        raise ValueError(f"{where}: evidence_docs: every entry must be an integer index, got {bad[0]!r}")


def load_items(path) -> list[TaskItem]:
    """TaskItems from a JSONL file: one JSON object per line with :class:`TaskItem` fields (``task,
    documents, query, answers, answer_doc`` required; ``item_id`` optional, else ``line<N>``); blank lines
    and lines starting with ``#`` are skipped. Every item gets a content digest in its id (``<id>#<8 hex>``)
    and ``meta.source = "items:<file name>"`` unless it names its own source.

    Raises:
        ValueError: naming the file, the line and the field (``items: f.jsonl line 3: answer_doc: ...``), a key
            given twice in a line, or an item whose content repeats an earlier line's in the same task (it would
            count twice); nothing is returned unless every line is valid.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"items: must be a readable JSONL file, got {str(path)!r}")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    out, seen, same = [], set(), {}
    for i, line in enumerate(_lines(raw, path), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"items: {path.name} line {i}"
        d = _parse(line, where)
        if not isinstance(d, dict):
            raise ValueError(f"{where}: must be a JSON object of TaskItem fields, got {type(d).__name__}")
        unknown = sorted(set(d) - set(ITEM_FIELDS))
        if unknown:
            raise ValueError(f"{where}: {unknown[0]}: not a TaskItem field (fields: {', '.join(ITEM_FIELDS)})")
        missing = [f for f in REQUIRED_FIELDS if f not in d]
        if missing:
            raise ValueError(f"{where}: {missing[0]}: required field missing")
        _check_types(d, where)
        meta = d.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: meta: must be a JSON object, got {type(meta).__name__}")
        d["meta"] = {"source": f"items:{path.name}", "items_sha256": digest[:16], "line": i, **meta}
        base = d.pop("item_id", None) or f"line{i}"
        if not isinstance(base, str):
            raise ValueError(f"{where}: item_id: must be a string, got {base!r}")
        try:
            item = with_content_id(TaskItem(item_id="-", **d), base)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        if (item.task, base) in seen:
            raise ValueError(f"{where}: item_id: duplicate id {base!r} in task {item.task!r}")
        seen.add((item.task, base))
        first = same.setdefault((item.task, item.content_digest()), i)
        if first != i:  # one prompt twice would count as two independent units in the findings
            raise ValueError(f"{where}: the same item as line {first} (task {item.task!r}: identical documents, "
                             "query and answers); remove the copy, or change its content")
        out.append(item)
    if not out:
        raise ValueError(f"items: {path.name} holds no item")
    return out
