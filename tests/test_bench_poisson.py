"""``smalltc bench --suite poisson`` and ``--suite basis`` end to end on the CPU, tiny
sizes: the JSON (the phases of both runs, the memory, the checks), the tables, the plots;
pmg skipped without pyamg; a wrong basis result caught before it is timed."""
import json
import sys

import numpy as np
import pytest

from optional_deps import needs
import smalltc
from smalltc import roofline
from smalltc.bench import basis, poisson
from smalltc.bench.cases import case_spec
from smalltc.app.cli import main

QUICK = ["bench", "--quick", "--repeats", "2", "--warmup", "1", "--no-progress", "--device",
         "cpu"]
PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
    assert path.exists() and path.stat().st_size > 10_000, path
    with open(path, "rb") as f:
        assert f.read(8) == PNG


def test_poisson_suite_end_to_end(tmp_path, capsys):
    """Box mesh, p = 2, Jacobi and p-multigrid: every phase timed in the cold and the warm
    run, the solve converged, the errors of the exact solution, the VTU written, the peak
    memory; the pieces are fem.poisson_problem's; the table and the stacked-bar plot."""
    needs("meshio", "scipy", "pyamg", "matplotlib")
    assert main(QUICK + ["--suite", "poisson", "--p", "2", "--mesh", "box", "--out",
                         str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench-poisson-p2-meshbox-float64.json").read_text())
    assert [c["sizes"]["precond"] for c in doc["cases"]] == ["jacobi", "pmg"]
    assert doc["options"]["suites"] == ["poisson"]
    for c in doc["cases"]:
        assert not c.get("error") and not c.get("skipped"), c
        assert c["phases"] == list(poisson.PHASES)
        for name in ("cold", "warm"):
            r = c["impls"][name]
            assert r["status"] == "ok", r.get("error")
            assert set(r["phases_s"]) == set(poisson.PHASES)
            assert all(t > 0 for t in r["phases_s"].values()), r["phases_s"]
            assert r["total_s"] == pytest.approx(sum(r["phases_s"].values()))
            assert r["converged"] and r["residual"] <= poisson.TOL
            assert r["per_iteration_s"] == pytest.approx(r["phases_s"]["solve"]
                                                         / r["iterations"])
            assert 0 < r["l2_error"] < r["h1_error"] < 0.1          # p = 2 on 7^3 elements
            assert r["vtu_bytes"] > 1000
            assert r["memory"]["rss_peak_bytes"] > 10 * 2 ** 20
            assert r["memory"]["rss_scope"] in ("run", "process")
        assert c["compile_s"] == pytest.approx(c["impls"]["cold"]["total_s"]
                                               - c["impls"]["warm"]["total_s"])
        assert c["poisson_problem_s"] > 0 and c["poisson_problem_b_diff"] < 1e-13
        assert c["impls"]["cold"]["iterations"] == c["impls"]["warm"]["iterations"] > 0
        assert c["impls"]["cold"]["l2_error"] == c["impls"]["warm"]["l2_error"]
    assert "PMultigrid" in doc["cases"][1]["impls"]["warm"]["precond"]
    out = capsys.readouterr().out
    assert "== poisson" in out and "box jacobi" in out and "fem.poisson_problem" in out
    _png(tmp_path / "poisson-p2-meshbox-poisson-float64.png")


def test_pmg_is_skipped_without_pyamg(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyamg", None)          # find_spec: not installed
    (case,) = poisson.cases("float64", "cpu", ps=[2], quick=True, mesh="box",
                            preconds=["pmg"])
    rec = poisson.run_case(case, xp=np)
    assert "pyamg" in rec["skipped"] and rec["impls"] == {}
    poisson.table([rec], sys.stdout)
    assert "skipped: pmg needs pyamg" in capsys.readouterr().out


def test_poisson_cases_and_their_errors():
    gpu = poisson.cases("float64", "gpu", preconds=["jacobi"])
    assert [c.sizes["p"] for c in gpu] == [2, 4, 7] * 2
    assert all(1.9e6 < c.sizes["ndofs"] < 2.2e6 for c in gpu)
    cpu = poisson.cases("float64", "cpu", mesh="box", preconds=["jacobi"])
    assert all(1.8e5 < c.sizes["ndofs"] < 2.2e5 for c in cpu)
    k = poisson.cases("float64", "cpu", ps=[4], mesh="kershaw:0.5")
    assert [c.sizes["mesh"] for c in k] == ["kershaw:0.5"] * 2
    assert k[0].sizes["shape"][0] % 6 == 0 and k[0].sizes["first_of_order"]
    assert not poisson.cases("float64", "cpu", ps=[2, 2], mesh="box")[2].sizes[
        "first_of_order"]
    with pytest.raises(ValueError, match="takes 'box' and 'kershaw"):
        poisson.cases("float64", "cpu", mesh="sine")
    with pytest.raises(ValueError, match="eps must be in"):
        poisson.parse_meshes("kershaw:2")
    with pytest.raises(ValueError, match="--precond takes jacobi, pmg, got amg"):
        poisson.cases("float64", "cpu", preconds=["amg"])
    with pytest.raises(ValueError, match="runs in float64"):
        poisson.cases("float32", "cpu")


def test_exact_solution_and_its_gradient():
    x = np.random.default_rng(0).random((3, 50))
    h = 1e-6
    for a in range(3):
        e = np.zeros((3, 1))
        e[a] = h
        fd = (poisson.exact_u(x + e) - poisson.exact_u(x - e)) / (2 * h)
        np.testing.assert_allclose(poisson.exact_grad(x)[a], fd, atol=1e-8)
    np.testing.assert_allclose(poisson.source(x), 3 * np.pi ** 2 * poisson.exact_u(x))


def test_basis_suite_end_to_end(tmp_path, capsys):
    """p = 2, every what and both directions through the map: smalltc, the reference path
    and the einsum chain checked against the oracle and timed, against the bound; the
    table and the plots."""
    needs("matplotlib")
    assert main(QUICK + ["--backend", "reference", "--suite", "basis", "--p", "2", "--out",
                         str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench-basis-p2-float64.json").read_text())
    assert [(c["sizes"]["direction"], c["sizes"]["what"]) for c in doc["cases"]] == [
        (d, w) for w in basis.WHATS for d in basis.DIRECTIONS]
    for c in doc["cases"]:
        assert not c.get("error"), c.get("trace")
        assert c["bound"]["bytes"] == roofline.counts(case_spec(c_of(c))).bytes
        im = c["impls"]
        assert set(im) == {"smalltc", "reference", "einsum"}
        for name, r in im.items():
            assert r["status"] == "ok", (c["id"], name, r)
            assert r["rel_err"] <= 1e-12 and r["fraction"] > 0 and r["dofs_per_s"] > 0
            assert len(r["times_ns"]) == (2 if name != "einsum" else 3)
        assert im["smalltc"]["poisoned"] and not im["einsum"]["poisoned"]
        assert im["smalltc"]["backend"] == "reference" and im["smalltc"]["kernel"]
        assert im["smalltc"]["specialized"] in (True, False)
    out = capsys.readouterr().out
    assert "== basis" in out and "integrate both" in out
    _png(tmp_path / "basis-p2-basis-float64.png")
    _png(tmp_path / "basis-p2-fraction-float64.png")


def c_of(rec):
    from smalltc.bench.cases import Case
    return Case(rec["suite"], rec["op"], rec["sizes"], rec["dtype"])


@pytest.mark.parametrize("direction, what", [("interpolate", "both"),
                                             ("integrate", "gradients")])
def test_basis_check_catches_a_wrong_result(monkeypatch, direction, what):
    """smalltc's function returns a perturbed result: its check fails and it is not timed;
    the einsum chain passes. The plan's backend is the one asked for (auto)."""
    (case,) = [c for c in basis.cases("float64", "cpu", ps=[1], quick=True)
               if c.sizes["direction"] == direction and c.sizes["what"] == what]
    real = getattr(smalltc, direction)

    def wrong(*args, **kw):
        y = real(*args, **kw)
        y.reshape(-1)[3] += 1e-6
        return y
    monkeypatch.setattr(smalltc, direction, wrong)
    rec = basis.run_case(case, dict(bandwidth=1e10, peak=1e10), xp=np, repeats=2, warmup=0)
    st = rec["impls"]["smalltc"]
    assert st["status"] == "failed" and "relative error" in st["error"]
    assert "times_ns" not in st and st["backend"] in ("cpu", "reference")
    assert rec["impls"]["einsum"]["status"] == "ok"


def test_basis_oracle_is_the_dense_operator():
    """The suite's oracle against the Kronecker products of the 1D matrices (p = 1, 2
    elements sharing a face)."""
    from smalltc.fem import H1Space, basis_1d, box_mesh
    from smalltc.spec import BasisSpec
    sp = H1Space(box_mesh(3, (2, 1, 1)), 1)
    b = basis_1d(1, 3)
    m = sp.dof_map(np)
    x = np.random.default_rng(1).standard_normal(sp.ndofs)
    kron = [np.kron(np.kron(P, Q), R) for P, Q, R in
            ((b.B1d, b.B1d, b.B1d), (b.G1d, b.B1d, b.B1d), (b.B1d, b.G1d, b.B1d),
             (b.B1d, b.B1d, b.G1d))]
    spec = BasisSpec(dim=3, nq=3, nd=2, batch=2, dtype="float64", what="both",
                     ndofs=sp.ndofs)
    H = basis.oracle(spec, b.B1d, b.G1d, x, m, np.arange(2))
    want = np.stack([[K @ x[m[e].ravel()] for K in kron] for e in range(2)])
    np.testing.assert_allclose(H.reshape(2, 4, 27), want, atol=1e-13)
    t = BasisSpec(dim=3, nq=3, nd=2, batch=2, dtype="float64", what="both", transpose=True,
                  ndofs=sp.ndofs)
    y = basis.oracle(t, b.B1d, b.G1d, want.reshape(2, 4, 3, 3, 3), m)
    want_y = np.zeros(sp.ndofs)
    for e in range(2):
        np.add.at(want_y, m[e].ravel(), sum(K.T @ want[e, j] for j, K in enumerate(kron)))
    np.testing.assert_allclose(y, want_y, atol=1e-12)
