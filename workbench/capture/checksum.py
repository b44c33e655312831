"""sha256 checksums of a capture file: of each tensor, of the header, and of the whole file.

A capture file is safetensors bytes: an 8-byte header length, a JSON header (tensor table and string
metadata) and the tensor bytes. The header and whole-file checksums are stored in the header itself, so
they are computed over the bytes with their own 64 hex digits replaced by zeros (:data:`PLACEHOLDER`);
every other byte counts, so an edit anywhere (a metadata value, a tensor's shape or offsets, a padding
byte, a tensor's bytes) changes the file's, and one in the header changes the header's as well (which
says where the damage is). The per-tensor checksums only serve to name the tensor that changed.
"""
from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import torch

HEADER_KEY = "header_sha256"
FILE_KEY = "file_sha256"
KEYS = (HEADER_KEY, FILE_KEY)
PLACEHOLDER = "0" * 64
_CHUNK = 1 << 24


def _pattern(key: str) -> re.Pattern:
    # inside a JSON string every quote is escaped, so an unescaped `"key":"` is the metadata key itself
    return re.compile(rb'"' + key.encode() + rb'"\s*:\s*"([0-9a-f]{64})"')


_FIELDS = {k: _pattern(k) for k in KEYS}

__all__ = ["HEADER_KEY", "FILE_KEY", "KEYS", "PLACEHOLDER", "tensor_sha256", "seal", "file_digests"]


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (row-major, its own dtype), as stored in a capture file."""
    flat = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy() if flat.numel() else b"").hexdigest()


def _zeroed(header: bytes, keys=KEYS) -> tuple[bytes, dict[str, str | None]]:
    """``header`` with the recorded digest of each of ``keys`` replaced by zeros, and the recorded digests
    (``None`` where the header holds no single well-formed one)."""
    recorded = {}
    for k in keys:
        found = list(_FIELDS[k].finditer(header))
        recorded[k] = found[0].group(1).decode() if len(found) == 1 else None
        if len(found) == 1:
            s, e = found[0].span(1)
            header = header[:s] + PLACEHOLDER.encode() + header[e:]  # same length: later spans stay valid
    return header, recorded


def _fill(header: bytes, key: str, digest: str) -> bytes:
    s, e = _FIELDS[key].search(header).span(1)
    return header[:s] + digest.encode() + header[e:]


def seal(data: bytes) -> bytes:
    """``data`` (safetensors bytes whose metadata holds ``HEADER_KEY`` and ``FILE_KEY`` set to
    ``PLACEHOLDER``) with both placeholders replaced by their digests: the file's over the bytes with both
    zeroed, then the header's over the header holding the file's digest (so an edit of that digest is a
    header edit)."""
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8:8 + n]
    zeroed, recorded = _zeroed(header)
    if zeroed != header or any(v != PLACEHOLDER for v in recorded.values()):
        raise AssertionError(f"the capture header must hold one placeholder for each of {KEYS}")
    header = _fill(header, FILE_KEY, hashlib.sha256(data).hexdigest())
    header = _fill(header, HEADER_KEY, hashlib.sha256(data[:8] + header).hexdigest())
    return data[:8] + header + data[8 + n:]


def file_digests(path: Path) -> tuple[dict[str, str | None], dict[str, str]]:
    """``(recorded, actual)``: the header and whole-file checksums the header records (``None`` where it
    holds no single well-formed one) and those of the file, computed as :func:`seal` computed them. Read
    in chunks: a capture of several GB is hashed without holding it twice."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return dict.fromkeys(KEYS), {}
        raw = f.read(struct.unpack("<Q", head)[0])
        zeroed, recorded = _zeroed(raw)
        actual = {HEADER_KEY: hashlib.sha256(head + _zeroed(raw, (HEADER_KEY,))[0]).hexdigest()}
        h = hashlib.sha256(head + zeroed)
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    actual[FILE_KEY] = h.hexdigest()
    return recorded, actual
