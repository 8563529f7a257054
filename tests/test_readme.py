"""The README's and the documentation's Python code runs as written.

README: every block fenced as plain ``python`` runs (``python poisson`` is run by
tests/test_fem_unstructured.py). Documentation (``docs/**/*.md``): every ``python`` block
of a page runs, in order, in one namespace per page, in a temporary folder. A block may be
marked on the line before its fence:

- ``<!-- norun: REASON -->``: not run here (it needs a GPU, MPI ranks, ...); it must
  still compile;
- ``<!-- requires: MODULE[, MODULE] -->``: run where the modules import, else skipped.

The examples print their checks (``print(err < 1e-8)``): what a page or the README prints
must not contain the word ``False``.
"""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?:<!--\s*(?P<mark>norun|requires)\s*:\s*(?P<arg>.*?)\s*-->\n)?"
                   r"```(?P<info>[^\n]*)\n(?P<code>.*?)^```\s*$", flags=re.S | re.M)


def blocks(text):
    """``(info, mark, arg, code, line)`` of each fenced block of a Markdown text."""
    return [(m["info"].strip(), m["mark"], m["arg"], m["code"],
             text.count("\n", 0, m.start("code")) + 1) for m in FENCE.finditer(text)]


def doc_pages():
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def test_readme_example_runs(capsys):
    code_blocks = [code for info, _, _, code, _ in blocks(README.read_text()) if info == "python"]
    assert code_blocks, "README has no python example"
    for code in code_blocks:
        exec(compile(code, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "smalltc.Plan" in out
    assert not re.search(r"\bFalse\b", out), out


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, flags=re.S).group(1)
    assert [ln.split()[:2] for ln in first_block.strip().splitlines()] == [["make", "demo"],
                                                                           ["make", "test"]]


def test_markers_are_read():
    text = ("<!-- norun: needs a GPU -->\n```python\nimport cupy\n```\n\n"
            "<!-- requires: torch, jax -->\n```python\nimport torch\n```\n\n"
            "```python\nx = 1\n```\n\n```sh\nmake test\n```\n")
    got = [(info, mark, arg, code) for info, mark, arg, code, _ in blocks(text)]
    assert got == [("python", "norun", "needs a GPU", "import cupy\n"),
                   ("python", "requires", "torch, jax", "import torch\n"),
                   ("python", None, None, "x = 1\n"), ("sh", None, None, "make test\n")]


@pytest.mark.parametrize("page", doc_pages())
def test_docs_page_code_runs(page, tmp_path, monkeypatch, capsys):
    path = DOCS / page
    found = blocks(path.read_text())
    python = [b for b in found if b[0].split()[:1] == ["python"]]
    assert len(python) == path.read_text().count("```python"), \
        f"{page}: a python block the test does not see (indented, or its fence not closed)"
    assert all(info == "python" for info, *_ in python), \
        f"{page}: a python fence takes no words after the language; mark blocks with " \
        "<!-- norun: ... --> or <!-- requires: ... --> on the line before"
    assert all(mark is None or info == "python" for info, mark, *_ in found), \
        f"{page}: a marker stands before a python block only"
    monkeypatch.chdir(tmp_path)
    namespace, skipped = {"__name__": f"docs.{page}"}, []
    for info, mark, arg, code, line in python:
        compiled = compile("\n" * (line - 1) + code, str(path), "exec")
        if mark == "norun":
            assert arg, f"{page}:{line}: a norun marker names its reason"
            continue
        if mark == "requires":
            missing = [m.strip() for m in arg.split(",")
                       if importlib.util.find_spec(m.strip()) is None]
            if missing:
                skipped.append(f"line {line}: {', '.join(missing)} missing")
                continue
        exec(compiled, namespace)
        out = capsys.readouterr().out
        assert not re.search(r"\bFalse\b", out), f"{page}:{line}: a check printed False:\n{out}"
    if skipped and len(skipped) == len([b for b in python if b[1] != "norun"]):
        pytest.skip(f"{page}: every runnable block needs a missing module ({'; '.join(skipped)})")
