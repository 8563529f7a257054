"""L2 projection: convergence at rate p + 1, exactness, operators agree, demo."""
import numpy as np
import pytest

import fem_oracle as O
from smalltc.fem import geometry, projection
from smalltc.fem import (
    ConvergenceError,
    H1Space,
    box_mesh,
    l2_error,
    l2_project,
    load_vector,
    mass_operator,
    projection_demo,
    smooth_function,
)

# (dim, p, elements per direction on successive meshes, geometry order)
CONVERGENCE_CASES = [
    (2, 1, (4, 8, 16), 1),
    (2, 2, (4, 8, 16), 1),
    (2, 3, (2, 4, 8), 1),
    (2, 4, (2, 4, 8), 1),
    (3, 1, (2, 4, 8), 2),
    (3, 2, (4, 8), 2),
    (3, 3, (3, 6), 2),
    (3, 4, (2, 4), 2),
]


@pytest.mark.parametrize("dim, p, ns, geom_order", CONVERGENCE_CASES,
                         ids=[f"{d}d-p{p}" for d, p, _, _ in CONVERGENCE_CASES])
def test_l2_error_converges_at_rate_p_plus_1(dim, p, ns, geom_order):
    errors = []
    for n in ns:
        mesh = box_mesh(dim, n, geom_order=geom_order, distortion=0.05)
        res = l2_project(mesh, p, smooth_function, tol=1e-13)
        errors.append(res.l2_error)
    rate = np.polyfit(np.log(1.0 / np.array(ns)), np.log(errors), 1)[0]
    assert rate >= p + 1 - 0.3, f"observed rate {rate:.3f} for p={p}, errors {errors}"
    assert rate <= p + 1 + 0.5  # not suspiciously fast either


# (dim, p, n)
EXACTNESS_CASES = [(1, 1, 3), (1, 4, 2), (2, 1, 3), (2, 2, 2), (2, 4, 2), (3, 1, 2), (3, 2, 2), (3, 3, 2)]


@pytest.mark.parametrize("dim, p, n", EXACTNESS_CASES)
def test_reproduces_polynomials_of_degree_p(dim, p, n):
    # On multilinear (distorted) elements the mapped Q_p space contains all
    # polynomials of total degree p, so their projection is exact.
    coef = np.random.default_rng(dim * 10 + p).standard_normal(dim + 1)

    def f(x):
        return coef[0] + sum(coef[1 + a] * x[a] ** p for a in range(dim)) + x[0] ** (p - 1) * x[-1]

    mesh = box_mesh(dim, n, distortion=0.05)
    res = l2_project(mesh, p, f)
    assert res.relative_l2_error < 1e-11


@pytest.mark.parametrize("dim, p", [(1, 3), (2, 2), (3, 2), (3, 4)])
def test_matrix_free_and_assembled_agree(dim, p):
    mesh = box_mesh(dim, 3 if dim < 3 else 2, geom_order=2, distortion=0.08)
    mf = l2_project(mesh, p, smooth_function, operator="matrix-free", tol=1e-13)
    asm = l2_project(mesh, p, smooth_function, operator="assembled", tol=1e-13)
    np.testing.assert_allclose(mf.u, asm.u, rtol=0, atol=1e-11 * np.max(np.abs(asm.u)))
    assert mf.iterations == pytest.approx(asm.iterations, abs=2)
    assert mf.l2_error == pytest.approx(asm.l2_error, rel=1e-6)


def test_load_vector_of_one_is_mass_times_one():
    V = H1Space(box_mesh(3, 2, geom_order=2, distortion=0.05), 3)
    b = load_vector(V, 1.0)
    np.testing.assert_allclose(b, mass_operator(V)(np.ones(V.ndofs)), rtol=1e-13, atol=1e-17)
    assert b.sum() == pytest.approx(1.0, rel=1e-13)


_MESHES = O.meshes()


@pytest.mark.parametrize("name, mesh", _MESHES, ids=[m[0] for m in _MESHES])
@pytest.mark.parametrize("p", [1, 3])
def test_load_and_error_match_the_numpy_oracle(name, mesh, p):
    """load_vector and l2_error against the plain formulas: 1e-12 relative."""
    V = H1Space(mesh, p)
    f = lambda x: np.sin(2 * x[0]) * np.exp(x[-1])            # noqa: E731
    for g in (f, 1.0, 2.5):
        assert O.rel(load_vector(V, g), O.load_vector(V, g)) < 1e-12
        assert O.rel(load_vector(V, g, nq=p + 3), O.load_vector(V, g, nq=p + 3)) < 1e-12
    u = np.random.default_rng(p).standard_normal(V.ndofs)
    for g in (f, 0.0, 1.5):
        assert l2_error(V, u, g) == pytest.approx(O.l2_error(V, u, g), rel=1e-12)


def test_chunks_do_not_change_load_and_error(monkeypatch):
    V = H1Space(box_mesh(3, (2, 3, 2), distortion=0.05), 2)
    u = np.random.default_rng(0).standard_normal(V.ndofs)
    whole = load_vector(V, smooth_function), l2_error(V, u, smooth_function)
    monkeypatch.setattr(geometry, "MIN_CHUNK_ELEMENTS", 5)
    monkeypatch.setattr(geometry, "CPU_CHUNK_BYTES", 1)
    assert O.rel(load_vector(V, smooth_function), whole[0]) < 1e-14
    assert l2_error(V, u, smooth_function) == pytest.approx(whole[1], rel=1e-14)
    monkeypatch.setattr(projection, "SOLUTION_MULTIPLE", 0)     # a block a chunk
    assert O.rel(load_vector(V, smooth_function), whole[0]) < 1e-14


def test_error_holds_a_chunk_not_the_mesh(monkeypatch):
    """The error's peak memory is a chunk's: far below the mesh's points at nq = p + 4."""
    import tracemalloc
    V = H1Space(box_mesh(3, 10), 1)
    u = np.random.default_rng(0).standard_normal(V.ndofs)
    l2_error(V, u, smooth_function)                             # plans, bases: built once
    monkeypatch.setattr(geometry, "CPU_CHUNK_BYTES", 1 << 18)
    monkeypatch.setattr(geometry, "MIN_CHUNK_ELEMENTS", 1)
    tracemalloc.start()
    l2_error(V, u, smooth_function)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    points = 8 * V.nelements * 5 ** 3                          # one float a point, nq = 5
    assert peak < points / 2, (peak, points)


def test_result_fields():
    res = l2_project(box_mesh(2, 3, distortion=0.05), 2, smooth_function, precond=None, error_nq=8)
    assert res.u.shape == (res.space.ndofs,) == (49,)
    assert res.residual <= 1e-12 and res.residuals[-1] == res.residual
    assert res.residuals.size == res.iterations + 1
    assert set(res.timings) == {"setup", "solve", "error"}
    assert res.l2_norm == pytest.approx(0.5, rel=1e-6)  # ||sin(pi x) cos(pi y)|| on the unit square
    assert res.relative_l2_error == pytest.approx(res.l2_error / res.l2_norm)
    assert l2_error(res.space, res.u, smooth_function, nq=8) == pytest.approx(res.l2_error, rel=1e-14)


def test_jacobi_preconditioning_helps_on_graded_density():
    mesh = box_mesh(2, 6, distortion=0.05, upper=(1.0, 40.0))
    plain = l2_project(mesh, 3, smooth_function, precond=None)
    pre = l2_project(mesh, 3, smooth_function, precond="jacobi")
    assert pre.iterations < plain.iterations
    np.testing.assert_allclose(pre.u, plain.u, atol=1e-9)


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_projection_demo(dim):
    r = projection_demo(dim=dim, p=3, n=2)
    keys = {"dim", "p", "n", "nq", "elements", "dofs", "operator", "backend", "device", "iterations", "residual",
            "l2_error", "relative_l2_error", "time_setup_s", "time_solve_s", "time_total_s"}
    assert set(r) == keys
    assert r["elements"] == 2**dim and r["dofs"] == 7**dim
    assert 0 < r["relative_l2_error"] < 1e-2 and r["residual"] <= 1e-12
    assert all(isinstance(v, (int, float, str)) for v in r.values())


def test_projection_demo_default_is_3d():
    r = projection_demo(n=2)
    assert r["dim"] == 3 and r["p"] == 4 and r["operator"] == "matrix-free"


_MESH = box_mesh(2, 2)

ERROR_CASES = [
    (lambda: l2_project(_MESH, 2, smooth_function, operator="dense"), ValueError,
     r"operator must be one of \['assembled', 'matrix-free'\], got 'dense'"),
    (lambda: l2_project(_MESH, 2, smooth_function, precond="ilu"), ValueError,
     r"precond must be 'jacobi' or None, got 'ilu'"),
    (lambda: l2_project(_MESH, 2, smooth_function, nq=0), ValueError, r"nq must be a positive integer, got 0"),
    (lambda: l2_project(_MESH, 2, smooth_function, error_nq=2.5), ValueError,
     r"error_nq must be a positive integer, got 2.5"),
    (lambda: l2_project(_MESH, 0, smooth_function), ValueError, r"p must be an integer >= 1, got 0"),
    (lambda: l2_project(_MESH, 2, lambda x: x), ValueError, r"f\(x\) returned shape \(2, 4, 4, 4\), expected \(4, 4, 4\)"),
    (lambda: l2_project(_MESH, 2, smooth_function, maxiter=1), ConvergenceError, r"CG did not converge in 1 iterations"),
    (lambda: l2_project(box_mesh(2, 4, distortion=0.5), 2, smooth_function), ValueError, r"tangled mesh"),
    (lambda: l2_error(H1Space(_MESH, 2), np.zeros(3), smooth_function), ValueError,
     r"u has shape \(3,\), expected \(25,\)"),
    (lambda: l2_error(H1Space(_MESH, 2), np.zeros(25), smooth_function, nq=0), ValueError,
     r"nq must be a positive integer, got 0"),
    (lambda: projection_demo(dim=4), ValueError, r"dim must be 1, 2 or 3, got 4"),
]


@pytest.mark.parametrize("call, exc, match", ERROR_CASES)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
