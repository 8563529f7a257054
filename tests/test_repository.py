"""The repository's own text: it speaks of the product, and every path it cites exists.

Two checks over the files git tracks (needs a git checkout; skipped without one):

- no tracked text file (gzipped ones read decompressed) contains the word :data:`WORD`,
  in any case, but in Python's ``start_new_session`` keyword of :mod:`subprocess`: the
  repository speaks of the product, not of the work that made it;
- every repository-relative path cited in a tracked ``.md``, ``.py``, ``.j2``, ``.json``
  or ``.sh`` file exists: a token such as ``notes/cuda.md`` (components, the last with
  an extension of the files the repository holds) or ``benchmarks/tuning/`` (a
  top-level folder's subfolder). A path that continues a URL, a variable (``$W/x.log``)
  or another path is not one, nor a placeholder (``A/bench.json``, ``<device>``).
"""
import gzip
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CITING = (".md", ".py", ".j2", ".json", ".sh")
#: the word no tracked file uses (spelt in two parts, so that this file passes its check)
WORD = "sess" + "ion"
ALLOWED = ("start_new_" + WORD,)


def _tracked():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


TRACKED = _tracked() if (ROOT / ".git").exists() else []
if not TRACKED:
    pytest.skip("not a git checkout", allow_module_level=True)


def _text(rel):
    """The file's text, or None for a binary file."""
    data = (ROOT / rel).read_bytes()
    if rel.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except OSError:
            return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


TOP = sorted({p.split("/")[0] for p in TRACKED if "/" in p})
#: the kinds of file the repository holds: a token ending in one of these is a file path
EXTENSIONS = ("md", "py", "j2", "json", "gz", "png", "txt", "log", "sh", "toml", "msh",
              "cu", "cuh", "csv", "vtu")
_NOT_BEFORE = r"(?<![\w./~:$-])"          # not a continuation of a path, URL or variable
_NOT_AFTER = r"(?![\w/*{<-])"             # not a glob or a placeholder
#: a file: a lowercase first component (not a placeholder such as ``A/``), then components
#: of word characters, dots, + and -, the last with one of EXTENSIONS
FILE = re.compile(_NOT_BEFORE + r"([a-z_][\w+-]*/(?:[\w.+-]+/)*[\w+-][\w.+-]*\.(?:"
                  + "|".join(EXTENSIONS) + r"))" + _NOT_AFTER)
#: where the wheel installs the folders that are not ``smalltc/`` (pyproject's package-dir)
INSTALLED = {"smalltc/fem/": "fem/", "smalltc/tuning/": "tuning/",
             "smalltc/templates/": "templates/"}


def _folder(tops):
    """A folder: one of ``tops``, then components, ending with ``/``."""
    return re.compile(_NOT_BEFORE + r"((?:" + "|".join(re.escape(t) for t in sorted(tops))
                      + r")/(?:[\w.+-]+/)*)" + _NOT_AFTER.replace("/", ""))


def cited_paths(text, tops=()):
    """The repository-relative paths cited in ``text``: files (with one of the
    repository's extensions), then folders ending with ``/`` under a top-level folder
    of the repository or under one of ``tops`` (the first folders of cited files, so
    that a folder beside a cited file that does not exist is caught as well).

    >>> cited_paths("see notes/cuda.md, section 7; benchmarks/tuning/ and fem/x.py.")
    ['notes/cuda.md', 'fem/x.py', 'benchmarks/tuning/']
    """
    files = [m.group(1) for m in FILE.finditer(text)]
    return files + [m.group(1) for m in _folder(set(TOP) | set(tops)).finditer(text)]


def exists(path):
    """Whether ``path`` is in the tree (a path of the installed package counts as its
    source's: ``smalltc/fem/api.py`` is ``fem/api.py``)."""
    for inst, src in INSTALLED.items():
        if path.startswith(inst):
            path = src + path[len(inst):]
    return (ROOT / path).exists()


def test_path_pattern():
    assert TOP and "notes" in TOP and "tests" in TOP
    text = ("tests/test_x.py::test_y, `notes/a.md`, smalltc/spec.py. gone/b/c.json "
            "tuning/tables/sm90-<device>-float64.json tests/*.py docs.rs/notes/b.md ~/notes/c.md "
            "notes/ notes/{a,b}.md $W/log.txt A/bench.json https://x.org/a/b.md and/or "
            "gone/d/ mass_apply/3d/")
    assert cited_paths(text) == ["tests/test_x.py", "notes/a.md", "smalltc/spec.py",
                                 "gone/b/c.json", "notes/"]
    assert cited_paths(text, {"gone"})[-2:] == ["notes/", "gone/d/"]
    assert exists("smalltc/fem/api.py") and exists("fem/api.py") and exists("notes/")
    assert not exists("gone/b/c.json")


def test_no_file_uses_the_word():
    bad = []
    for rel in TRACKED:
        text = _text(rel)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            rest = line
            for ok in ALLOWED:
                rest = rest.replace(ok, "")
            if WORD in rest.lower():
                bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, f"{len(bad)} lines:\n" + "\n".join(bad[:40])


def test_every_cited_path_exists():
    texts = {}
    for rel in TRACKED:
        if not rel.endswith(CITING) or rel == "tests/test_repository.py":   # its examples
            continue
        text = _text(rel)
        if text is not None:
            texts[rel] = text
    tops = {p.split("/")[0] for text in texts.values() for p in cited_paths(text)}
    missing = []
    for rel, text in texts.items():
        for p in sorted(set(cited_paths(text, tops))):
            if not exists(p):
                missing.append(f"{rel}: {p}")
    assert not missing, f"{len(missing)} missing paths:\n" + "\n".join(missing[:60])
