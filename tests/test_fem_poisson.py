"""The Poisson problem's parts on the geometry core: H1 errors, Neumann loads, the one-pass
errors and the phase timings of solve_poisson, the names in its errors; against the NumPy
oracle (tests/fem_oracle.py) and, where a GPU answers, the CPU."""
import logging

import numpy as np
import pytest
from conftest import array_modules

import fem_oracle as O
from smalltc import fem
from smalltc.fem import H1Space, boundary_load, box_mesh, h1_error, l2_error, solve_poisson
from smalltc.fem._device import to_host

U = lambda x: np.sin(2 * x[0]) * np.exp(x[1]) + x[-1] ** 2         # noqa: E731


def GRAD_U(x):
    g = [2 * np.cos(2 * x[0]) * np.exp(x[1]), np.sin(2 * x[0]) * np.exp(x[1])]
    g += [0 * x[0]] * (x.shape[0] - 2)
    g[-1] = g[-1] + 2 * x[-1]
    return np.stack(g)


_MESHES = O.meshes()


@pytest.mark.parametrize("name, mesh", _MESHES, ids=[m[0] for m in _MESHES])
@pytest.mark.parametrize("p", [1, 3])
def test_h1_error_with_a_gradient_matches_the_numpy_oracle(name, mesh, p):
    """J^-T from the adjugate (closed form) against numpy.linalg.inv: 1e-12 relative."""
    V = H1Space(mesh, p)
    u = np.random.default_rng(p).standard_normal(V.ndofs)
    got = h1_error(V, u, (U, GRAD_U))
    assert got == pytest.approx(O.h1_error(V, u, GRAD_U), rel=1e-12)
    assert h1_error(V, u, (0.0, lambda x: np.zeros(x.shape))) == \
        pytest.approx(O.h1_error(V, u, lambda x: np.zeros(x.shape)), rel=1e-12)


# meshes with multilinear maps: a polynomial of degree k in x has degree k per reference axis
_LINEAR = [m for m in _MESHES if m[0] in ("box2d-g1", "box3d-g1", "rot3d-g1")]


@pytest.mark.parametrize("name, mesh", _LINEAR, ids=[m[0] for m in _LINEAR])
@pytest.mark.parametrize("p", [1, 2])
def test_h1_error_of_u_alone_differentiates_its_interpolant(caplog, name, mesh, p):
    """``exact=u``: the gradient of u's order-(p + 2) interpolant, exact for a polynomial
    of degree p + 2 on multilinear elements (so equal to exact=(u, grad_u)), close to it
    for a smooth u; logged once a call."""
    V = H1Space(mesh, p)
    u = np.random.default_rng(p).standard_normal(V.ndofs)
    k = p + 2
    poly = lambda x: x[0] ** k + x[0] * x[-1] ** (k - 1) + 1.0       # noqa: E731

    def grad(x):
        g = np.zeros(x.shape)
        g[0] = k * x[0] ** (k - 1) + x[-1] ** (k - 1)
        g[-1] += (k - 1) * x[0] * x[-1] ** (k - 2)
        return g

    with caplog.at_level(logging.INFO, logger="smalltc"):
        caplog.clear()
        got = h1_error(V, u, poly)
    notes = [r for r in caplog.records if "interpolant" in r.getMessage()]
    assert len(notes) == 1 and "exact=(u, grad_u)" in notes[0].getMessage()
    assert got == pytest.approx(O.h1_error(V, u, grad), rel=1e-12)
    assert h1_error(V, u, U) == pytest.approx(O.h1_error(V, u, GRAD_U), rel=1e-4)


@pytest.mark.parametrize("name, mesh", _MESHES, ids=[m[0] for m in _MESHES])
@pytest.mark.parametrize("p", [1, 2])
def test_boundary_load_matches_the_numpy_oracle(name, mesh, p):
    V = H1Space(mesh, p)
    for h in (1.0, lambda x: np.sin(x[0]) + x[-1] ** 2, lambda x, n: n[0] * x[-1] + 2 * n[-1]):
        assert O.rel(boundary_load(V, h), O.boundary_load(V, h)) < 1e-12
    if hasattr(mesh, "shape"):
        h = lambda x, n: n[0] * x[-1] + 1.0                        # noqa: E731
        assert O.rel(boundary_load(V, h, "xmax"), O.boundary_load(V, h, "xmax")) < 1e-12


@pytest.mark.parametrize("dim, p", [(1, 2), (2, 3), (3, 2)])
def test_boundary_load_1d_to_3d_integrates_the_flux(dim, p):
    """int_Gamma c . n = 0 (div c = 0) and int_xmax 1 = the side's measure."""
    V = H1Space(box_mesh(dim, 3, geom_order=2, distortion=0.05 if dim > 1 else 0.0,
                         upper=(2.0, 1.0, 1.0)[:dim]), p)
    c = np.array([1.0, -2.0, 0.5])[:dim]
    assert abs(boundary_load(V, lambda x, n: np.einsum("i,i...->...", c, n)).sum()) < 1e-12
    assert boundary_load(V, 1.0, "xmax").sum() == pytest.approx(1.0, rel=1e-12)


def test_solve_poisson_errors_in_one_pass_and_timings():
    mesh = box_mesh(3, 3, distortion=0.05)
    res = solve_poisson(mesh, 2, 1.0, dirichlet=U, exact=U, device="cpu")
    V = res.space
    assert res.l2_error == pytest.approx(l2_error(V, res.u, U), rel=1e-13)
    assert res.h1_error == pytest.approx(h1_error(V, res.u, U), rel=1e-13)
    assert res.l2_error == pytest.approx(O.l2_error(V, res.u, U), rel=1e-12)
    assert res.h1_error == pytest.approx(O.h1_error(V, res.u, GRAD_U), rel=1e-4)
    phases = ("space", "bc", "operator", "load", "preconditioner")
    assert set(res.timings) == {"setup", "solve", "error", *phases}
    assert all(res.timings[k] >= 0 for k in res.timings)
    assert sum(res.timings[k] for k in phases) <= res.timings["setup"]
    assert set(res.problem.timings) == set(phases)
    both = solve_poisson(mesh, 2, 1.0, dirichlet=U, exact=(U, GRAD_U), device="cpu")
    assert both.l2_error == res.l2_error
    assert both.h1_error == pytest.approx(O.h1_error(V, res.u, GRAD_U), rel=1e-12)


def test_neumann_load_enters_the_problem():
    mesh = box_mesh(2, 3, distortion=0.05)
    h = lambda x, n: np.einsum("i...,i...->...", GRAD_U(x), n)     # noqa: E731
    f = lambda x: 3 * np.sin(2 * x[0]) * np.exp(x[1]) - 2          # noqa: E731  -lap U
    prob = fem.poisson_problem(mesh, 3, f, dirichlet={"xmin": U}, neumann={"xmax": h,
                               "ymin": h, "ymax": h}, device="cpu")
    V = prob.space
    want = O.load_vector(V, f) + sum(O.boundary_load(V, h, r) for r in ("xmax", "ymin", "ymax"))
    assert O.rel(prob.load, want) < 1e-12


_M2 = box_mesh(2, 2)
_U2 = lambda x: x[0] + x[1]                                        # noqa: E731

ERROR_CASES = [
    (dict(exact=lambda x: np.ones(2)), r"exact\(x\) returned shape \(2,\), expected \(4, 5, 5\)"),
    (dict(exact=(_U2, lambda x: np.ones(2))), r"exact\[1\]\(x\) returned shape \(2,\), expected "
                                              r"\(2, 4, 5, 5\)"),
    (dict(exact=(_U2, _U2, _U2)), r"exact must be u or a pair \(u, grad_u\), got a tuple of 3"),
    (dict(exact=lambda x: x[0] / 0.0), r"exact\(x\) returned non-finite values"),
    (dict(f=lambda x: np.ones(2)), r"f\(x\) returned shape \(2,\), expected \(4, 3, 3\)"),
    (dict(kappa=lambda x: np.ones(2)), r"kappa\(x\) returned shape \(2,\)"),
    (dict(neumann={"xmax": lambda x: np.ones(2)}), r"neumann\['xmax'\]\(x\) returned shape \(2,\)"),
    (dict(neumann={"xmax": lambda x, n: x[5]}), r"neumann\['xmax'\]\(x\) failed for x of shape"),
    (dict(exact="u"), r"exact must be callable or a real number, got str"),
]


@pytest.mark.parametrize("kw, match", ERROR_CASES)
def test_errors_name_the_argument(kw, match):
    kw = dict(kw)
    f = kw.pop("f", 1.0)
    kw.setdefault("dirichlet", _U2)
    with pytest.raises((ValueError, TypeError), match=match):
        solve_poisson(_M2, 1, f, device="cpu", **kw)


@pytest.mark.parametrize("xp_name", array_modules())
def test_device_runs_the_setup_and_errors_there(caplog, xp_name):
    """On a GPU: the load vector, the Neumann load and the errors computed there agree
    with the CPU's; a function that raises on device arrays is called on host copies,
    logged once."""
    device = "gpu" if xp_name == "cupy" else "cpu"
    mesh = box_mesh(3, 3, distortion=0.05)
    V = H1Space(mesh, 2)
    host = lambda x: np.asarray(x)[0] ** 2                          # noqa: E731  host only
    for f in (U, host, 2.0):
        with caplog.at_level(logging.WARNING, logger="smalltc"):
            caplog.clear()
            b = fem.load_vector(V, f, device=device)
        assert type(b).__module__.split(".")[0] == xp_name
        assert O.rel(to_host(b), O.load_vector(V, f)) < 1e-12
        falls = [r for r in caplog.records if "host copies" in r.getMessage()]
        assert len(falls) == (1 if f is host and xp_name == "cupy" else 0)
    h = lambda x, n: n[0] * x[-1]                                   # noqa: E731
    bl = boundary_load(V, h, device=device)
    assert O.rel(to_host(bl), O.boundary_load(V, h)) < 1e-12
    kw = dict(dirichlet=U, exact=U)
    cpu = solve_poisson(mesh, 2, 1.0, device="cpu", **kw)
    res = solve_poisson(mesh, 2, 1.0, device=device, **kw)
    assert res.device == device and res.problem.load.__class__.__module__.split(".")[0] == xp_name
    np.testing.assert_allclose(res.u, cpu.u, atol=1e-10 * np.abs(cpu.u).max())
    assert res.l2_error == pytest.approx(cpu.l2_error, rel=1e-8)
    assert res.h1_error == pytest.approx(cpu.h1_error, rel=1e-8)
    if xp_name == "cupy":
        import cupy
        ud = cupy.asarray(cpu.u)
        assert fem.l2_error(V, ud, U) == pytest.approx(fem.l2_error(V, cpu.u, U), rel=1e-12)
        assert h1_error(V, ud, U) == pytest.approx(h1_error(V, cpu.u, U), rel=1e-12)


def test_phase_timings_are_for_distributed_solves():
    with pytest.raises(ValueError, match=r"timings='phases' times the phases of a distributed"):
        fem.solve_poisson(fem.box_mesh(2, 2), 1, lambda x: 1.0 + 0 * x[0], timings="phases")
