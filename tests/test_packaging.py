"""The distribution: a built wheel carries the templates and tuning tables, and
an installed (non-editable) copy works from any directory."""
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _isolation_flags():
    """Build without isolation (offline, fast) when this environment has the setuptools that
    pyproject.toml requires; otherwise let pip fetch the declared build requirements."""
    from importlib.metadata import PackageNotFoundError, version
    need = re.search(r'"setuptools>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    try:
        have = version("setuptools")
    except PackageNotFoundError:
        return []
    as_tuple = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:3])
    return ["--no-build-isolation"] if as_tuple(have) >= as_tuple(need) else []


# a Python warning category in a build log (SetuptoolsDeprecationWarning, pip's
# BuildBackendWarning, setuptools' _Warning, ...), not pip's own "WARNING:" lines
WARNING = re.compile(r"\b\w*Warning\b")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The wheel pip builds from the checkout, and the build's verbose log."""
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", *_isolation_flags(),
           "-v", "-w", str(out), str(ROOT)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    (whl,) = out.glob("smalltc-*.whl")
    return whl, res.stdout + res.stderr


@pytest.fixture(scope="module")
def wheel(built):
    return built[0]


def test_build_prints_no_warnings(built):
    """Every folder that ships is declared (no "absent from the packages configuration")
    and the metadata uses current forms (no deprecation)."""
    lines = [line.strip() for line in built[1].splitlines() if WARNING.search(line)]
    assert not lines, "\n".join(lines[:20])


def test_wheel_metadata_declares_license_and_urls(wheel):
    zf = zipfile.ZipFile(wheel)
    info = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    meta = zf.read(f"{info}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in meta
    assert "License-File: LICENSE" in meta
    for name in ("Homepage", "Documentation", "Source"):
        assert f"Project-URL: {name}, https://" in meta, name
    shipped = zf.read(f"{info}/licenses/LICENSE").decode()
    assert shipped == (ROOT / "LICENSE").read_text()
    assert "BSD 3-Clause" in shipped and "the smalltc developers" in shipped


def _expected(pattern_dir, suffix):
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / pattern_dir).rglob(f"*{suffix}"))


def test_wheel_contains_templates_and_tables(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for sub in ("smalltc/__init__.py", "smalltc/fem/__init__.py", "smalltc/tuning/__init__.py",
                "smalltc/templates/__init__.py", "smalltc/backends/reference.py"):
        assert sub in names, sub
    for folder in ("smalltc", "fem", "tuning", "templates"):   # every module and data file
        for src in sorted(ROOT.joinpath(folder).rglob("*")):
            if not src.is_file() or "__pycache__" in src.parts or src.suffix == ".pyc":
                continue
            rel = src.relative_to(ROOT).as_posix()
            rel = rel if folder == "smalltc" else "smalltc/" + rel
            assert rel in names, f"{rel} missing from the wheel (a package not in pyproject?)"
    for src in _expected("templates", ".j2"):          # templates/<x> -> smalltc/templates/<x>
        assert "smalltc/" + src in names, f"{src} missing from the wheel"
    for src in _expected("tuning/tables", ".json"):
        assert "smalltc/" + src in names, f"{src} missing from the wheel"
    print("\n".join(sorted(n for n in names if "/templates/" in n or "/tables/" in n)))


def test_installed_copy_works_from_another_directory(wheel, tmp_path):
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--target", str(target), str(wheel)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    script = (
        "import smalltc, smalltc.fem, smalltc.tuning, numpy as np\n"
        "from importlib.resources import files\n"
        "assert smalltc.__file__.startswith(%r), smalltc.__file__\n"
        "t = files('smalltc.templates')\n"
        "found = sorted(p.name for d in ('cuda', 'cpu') if (t / d).is_dir() for p in (t / d).iterdir())\n"
        "print('templates:', found)\n"
        "B = np.random.rand(4, 3); D = np.random.rand(5, 4, 4); V = np.random.rand(5, 3, 3)\n"
        "print('shape', smalltc.batched_contract(B, D, V, backend='reference').shape)\n"
    ) % str(target)
    env = dict(os.environ, PYTHONPATH=str(target))
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "shape (5, 3, 3)" in res.stdout
    expected = {p.name for p in (ROOT / "templates").rglob("*.j2")}
    for name in expected:
        assert name in res.stdout, f"template {name} not found by the installed copy"
    res = subprocess.run([sys.executable, "-m", "smalltc", "--version"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("smalltc "), res.stdout
    res = subprocess.run([sys.executable, "-c", "import smalltc.fem as f; "
                          "print(open(f.demo_mesh_path(2)).readline().strip())"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "$MeshFormat", res.stdout      # the shipped demo mesh


def test_sdist_carries_the_docs(tmp_path):
    """The mathematics and conventions page travels with the source distribution."""
    import tarfile
    isolation = ["--no-isolation"] if _isolation_flags() else []
    res = subprocess.run([sys.executable, "-m", "build", "--sdist", *isolation,
                          "--outdir", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    if res.returncode != 0 and "No module named build" in res.stderr:
        pytest.skip("the build package is not installed")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (sdist,) = tmp_path.glob("smalltc-*.tar.gz")
    names = tarfile.open(sdist).getnames()
    assert any(n.endswith("/docs/math.md") for n in names), names[:20]
    assert any(n.endswith("/LICENSE") for n in names), names[:20]


def test_nothing_points_outside_the_repository():
    """The README, docstrings, notes, benchmarks and templates cite docs/math.md, never a file
    outside the repository (a shared SPEC, ../shared, a seeds/ path)."""
    import re
    bad = re.compile(r"\bSPEC section|\bSPEC \d|\.\./shared|SPEC\.md|seeds/")
    hits = []
    for folder in ("smalltc", "fem", "tuning", "templates", "tests", "notes", "benchmarks", "docs",
                   "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".j2", ".sh", ".txt") and path.is_file():
                for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if bad.search(line) and path.name != "test_packaging.py":
                        hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    for name in ("README.md", "Makefile", "pyproject.toml"):
        for i, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            if bad.search(line):
                hits.append(f"{name}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits[:20])
    assert (ROOT / "docs" / "math.md").read_text().count("\n## ") >= 8   # sections 1-8
