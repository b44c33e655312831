"""Readers of exported figure files, for the tests: PNG size and dpi, PDF text (``pdftotext`` when
installed, else a small built-in reader of the text layer through the fonts' ToUnicode CMaps)."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path


def png_size(path_or_bytes) -> tuple[int, int, float | None]:
    """``(width, height, dpi or None)`` of a PNG file or bytes."""
    data = Path(path_or_bytes).read_bytes() if not isinstance(path_or_bytes, (bytes, bytearray)) else bytes(path_or_bytes)
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("path_or_bytes: is not a PNG")
    w, h = struct.unpack(">II", data[16:24])
    dpi = None
    i = 8
    while i < len(data):
        n = struct.unpack(">I", data[i:i + 4])[0]
        if data[i + 4:i + 8] == b"pHYs":
            x, _, unit = struct.unpack(">IIB", data[i + 8:i + 17])
            dpi = x * 0.0254 if unit == 1 else None
            break
        i += 12 + n
    return w, h, dpi


def pdf_text(path_or_bytes) -> str:
    """The text drawn in a PDF (for checks that labels made it into an export).

    Uses ``pdftotext`` when installed; otherwise a small reader for the PDFs Chromium (Skia) writes: the
    content streams' ``Tj``/``TJ`` strings mapped through each font's ``ToUnicode`` CMap. Words come out
    in drawing order, separated by spaces/newlines.
    """
    data = Path(path_or_bytes).read_bytes() if not isinstance(path_or_bytes, (bytes, bytearray)) else bytes(path_or_bytes)
    exe = shutil.which("pdftotext")
    if exe:

        r = subprocess.run([exe, "-q", "-", "-"], input=data, capture_output=True, timeout=60)
        if r.returncode == 0:
            return unligature(r.stdout.decode("utf-8", "replace"))
    return _pdf_text_builtin(data)


def unligature(text: str) -> str:
    """Typographic ligatures (ﬁ, ﬂ, …) spelled out; nothing else changed (unlike NFKC, which maps ℓ to l)."""
    return text.translate(_LIGATURES)


def _pdf_objects(data: bytes) -> dict[int, tuple[bytes, bytes | None]]:
    """``{object number: (dictionary text, decoded stream or None)}``."""
    objs = {}
    for m in re.finditer(rb"(\d+) 0 obj\s*(<<.*?>>)\s*(stream\r?\n)?", data, re.S):
        stream = None
        if m.group(3):
            end = data.find(b"endstream", m.end())
            raw = data[m.end():end].rstrip(b"\r\n")
            try:
                stream = zlib.decompress(raw) if b"FlateDecode" in m.group(2) else raw
            except zlib.error:
                stream = None
        objs[int(m.group(1))] = (m.group(2), stream)
    return objs


def _parse_cmap(cmap: bytes) -> dict[int, str]:
    out = {}

    def uni(h: bytes) -> str:
        b = bytes.fromhex(h.decode())
        return b.decode("utf-16-be", "replace")

    for block in re.findall(rb"beginbfchar(.*?)endbfchar", cmap, re.S):
        for a, b in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            out[int(a, 16)] = uni(b)
    for block in re.findall(rb"beginbfrange(.*?)endbfrange", cmap, re.S):
        for a, b, c in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            start, stop, base = int(a, 16), int(b, 16), int(c, 16)
            for k in range(start, stop + 1):
                out[k] = chr(base + k - start)
    return out


_LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                            "\ufb05": "st", "\ufb06": "st"})


def _pdf_text_builtin(data: bytes) -> str:
    objs = _pdf_objects(data)
    fonts: dict[bytes, dict[int, str]] = {}  # resource name -> cmap
    by_obj = {}
    for num, (d, _) in objs.items():
        m = re.search(rb"/ToUnicode (\d+) 0 R", d)
        if m and int(m.group(1)) in objs and objs[int(m.group(1))][1] is not None:
            by_obj[num] = _parse_cmap(objs[int(m.group(1))][1])
    for d, _ in objs.values():  # /Font << /F1 7 0 R ... >> in resource dictionaries
        for fm in re.finditer(rb"/Font\s*<<(.*?)>>", d, re.S):
            for name, num in re.findall(rb"/([\w.+-]+) (\d+) 0 R", fm.group(1)):
                if int(num) in by_obj:
                    fonts[name] = by_obj[int(num)]
    default = next(iter(by_obj.values()), {})
    words = []
    for d, s in objs.values():
        if s is None or (b"Tj" not in s and b"TJ" not in s):
            continue
        cmap = default
        for tok in re.finditer(rb"/([\w.+-]+)\s+[\d.]+\s+Tf|<([0-9A-Fa-f]*)>\s*Tj|\[(.*?)\]\s*TJ|(BT)|(ET)", s, re.S):
            if tok.group(1):
                cmap = fonts.get(tok.group(1), default)
            elif tok.group(2) is not None or tok.group(3) is not None:
                hexes = [tok.group(2)] if tok.group(2) is not None else re.findall(rb"<([0-9A-Fa-f]*)>", tok.group(3))
                for h in hexes:
                    words.append("".join(cmap.get(int(h[i:i + 4], 16), "\ufffd") for i in range(0, len(h), 4)))
            elif tok.group(5):
                words.append("\n")
    text = "".join(words).translate(_LIGATURES)  # Skia maps ligature glyphs to U+FB00…
    return re.sub(r" *\n *", "\n", text).strip()
