"""Element maps at quadrature points: Jacobians, |J|, and the mass data D."""
import numpy as np
import pytest
from conftest import array_modules

import fem_oracle as O
from smalltc.fem import geometry
from smalltc.fem import (
    box_mesh,
    check_jacobian,
    det_jacobian,
    diffusion_data,
    evaluate_field,
    jacobian,
    map_points,
    mass_data,
    quadrature_data,
    quadrature_rule,
)

# (dim, n, geom_order, distortion)
GEOMETRY_CASES = [
    (1, 3, 1, 0.0),
    (1, 3, 3, 0.2),
    (2, (2, 3), 1, 0.0),
    (2, 3, 1, 0.1),
    (2, 3, 3, 0.2),
    (3, (1, 2, 3), 1, 0.0),
    (3, 2, 1, 0.05),
    (3, 2, 2, 0.1),
]


def _ids(cases):
    return ["-".join(str(c) for c in case) for case in cases]


def _exact_nq(dim, geom_order):
    # x o F has degree g and |J| degree dim*g per direction: (dim+1)*g in all.
    return ((dim + 1) * geom_order) // 2 + 1


@pytest.mark.parametrize("dim, n", [(1, 4), (2, (2, 5)), (3, (3, 1, 2))])
def test_uniform_box_jacobian_is_element_scaling(dim, n):
    upper = np.array([2.0, 3.0, 0.5])[:dim]
    mesh = box_mesh(dim, n, lower=0.0, upper=upper)
    h = upper / np.array(mesh.shape)
    pts = quadrature_rule(3)[0]
    J = jacobian(mesh, pts)
    assert J.shape == (mesh.nelements, dim, dim) + (3,) * dim
    expected = np.diag(h / 2).reshape((1, dim, dim) + (1,) * dim)
    np.testing.assert_allclose(J, np.broadcast_to(expected, J.shape), rtol=0, atol=1e-15)
    detJ = det_jacobian(J)
    np.testing.assert_allclose(detJ, np.prod(h) / 2**dim, rtol=1e-14)


@pytest.mark.parametrize("dim, n, geom_order, distortion", GEOMETRY_CASES, ids=_ids(GEOMETRY_CASES))
def test_mass_data_integrates_volume_and_moments(dim, n, geom_order, distortion):
    mesh = box_mesh(dim, n, geom_order=geom_order, distortion=distortion)
    nq = _exact_nq(dim, geom_order)
    D = mass_data(mesh, nq)
    assert D.shape == (mesh.nelements,) + (nq,) * dim and D.dtype == np.float64
    assert np.all(D > 0)
    assert D.sum() == pytest.approx(1.0, rel=1e-13)
    # int x_a over the unit box is 1/2 for every coordinate, int x_0^2 is 1/3 when exact
    for a in range(dim):
        Da = mass_data(mesh, nq + 1, rho=lambda x: x[a])
        assert Da.sum() == pytest.approx(0.5, rel=1e-13)
    D2 = mass_data(mesh, nq + 1, rho=3.0)
    assert D2.sum() == pytest.approx(3.0, rel=1e-13)


@pytest.mark.parametrize("dim, n, geom_order, distortion", GEOMETRY_CASES, ids=_ids(GEOMETRY_CASES))
@pytest.mark.parametrize("t", [-0.6, 0.1, 0.7])
def test_jacobian_matches_finite_differences(dim, n, geom_order, distortion, t):
    # On the 1D point set (t - h, t, t + h), the central difference along
    # axis b at the middle point (t, ..., t) is column b of J there.
    mesh = box_mesh(dim, n, geom_order=geom_order, distortion=distortion)
    h = 1e-5
    X = map_points(mesh, [t - h, t, t + h])  # (E, dim, 3, ..., 3)
    J = jacobian(mesh, [t])[(Ellipsis,) + (0,) * dim]  # (E, dim, dim)
    for b in range(dim):
        hi = [1] * dim
        lo = [1] * dim
        hi[b], lo[b] = 2, 0
        fd = (X[(Ellipsis,) + tuple(hi)] - X[(Ellipsis,) + tuple(lo)]) / (2 * h)
        np.testing.assert_allclose(J[:, :, b], fd, rtol=0, atol=1e-8)


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_high_order_geometry_converges_to_exact_map(dim):
    a = 0.08
    mesh = box_mesh(dim, 2, geom_order=8, distortion=a)
    qd = quadrature_data(mesh, 4)
    # the exact |J| of x = xhat + a s(xhat) (1, ..., 1) is 1 + a sum_b d_b s,
    # times (h/2)^dim for the element scaling; evaluate at the reference
    # points, which high-order geometry reproduces closely
    pts = quadrature_rule(4)[0]
    xhat = np.moveaxis(map_points(box_mesh(dim, 2), pts), 1, 0)
    s_grad = np.zeros(xhat.shape[1:])
    for b in range(dim):
        term = np.pi * np.cos(np.pi * xhat[b])
        for c in range(dim):
            if c != b:
                term = term * np.sin(np.pi * xhat[c])
        s_grad += term
    exact = (1.0 + a * s_grad) * (0.25**dim)
    np.testing.assert_allclose(qd.detJ, exact, rtol=1e-6)


def test_float32_mass_data():
    mesh = box_mesh(3, 2, distortion=0.05)
    D64 = mass_data(mesh, 3)
    D32 = mass_data(mesh, 3, dtype=np.float32)
    assert D32.dtype == np.float32 and D32.flags.c_contiguous
    np.testing.assert_allclose(D32, D64, rtol=1e-6)


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("dim, geom_order", [(2, 2), (3, 1), (3, 2)])
def test_diffusion_data_paths_agree(xp_name, dim, geom_order):
    """A constant kappa (computed chunk by chunk where Q is returned: on a GPU, there)
    against a callable one (on the host): the same Q to round-off, in both dtypes."""
    from smalltc.fem._device import to_host
    mesh = box_mesh(dim, 3, geom_order=geom_order, distortion=0.1)
    device = "gpu" if xp_name == "cupy" else "cpu"
    ref = diffusion_data(mesh, 4, lambda x: np.full(x.shape[1:], 2.5))
    for dtype in (np.float64, np.float32):
        Q = diffusion_data(mesh, 4, 2.5, dtype=dtype, device=device)
        assert Q.dtype == dtype and Q.flags.c_contiguous and type(Q).__module__.startswith(xp_name)
        np.testing.assert_allclose(to_host(Q), ref, rtol=1e-6 if dtype == np.float32 else 1e-13,
                                   atol=1e-12 * abs(ref).max())
    with pytest.raises(ValueError, match="tangled mesh"):
        diffusion_data(box_mesh(dim, 4, distortion=0.5), 3, 1.0, device=device)


@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_tangled_mesh_names_element(monkeypatch, chunk):
    """The first bad element and the count of all of them, whatever the chunks."""
    if chunk is not None:
        _chunks_of(monkeypatch, chunk)
    mesh = box_mesh(2, 4, distortion=0.5)
    for call in (lambda: mass_data(mesh, 3), lambda: diffusion_data(mesh, 3, lambda x: x[0] + 1),
                 lambda: quadrature_data(mesh, 2)):
        with pytest.raises(ValueError, match=r"tangled mesh: \|J\| <= 0 at \d+ quadrature point\(s\) of element 7 "
                                             r"\(multi-index \(1, 3\)\) \(min \|J\| = -[0-9.e-]+\); 6 bad element\(s\) in all"):
            call()


def _chunks_of(monkeypatch, n):
    """Chunks of ``n`` elements (on the CPU, for float64 points of 64 values or fewer)."""
    monkeypatch.setattr(geometry, "MIN_CHUNK_ELEMENTS", n)
    monkeypatch.setattr(geometry, "CPU_CHUNK_BYTES", 1)


_MESHES = O.meshes()


@pytest.mark.parametrize("name, mesh", _MESHES, ids=[m[0] for m in _MESHES])
@pytest.mark.parametrize("nq", [2, 4])
def test_geometry_matches_the_numpy_oracle(name, mesh, nq):
    """x, J, |J|, D and Q against the plain formulas (a tensordot per axis on the whole
    mesh, numpy.linalg.det and inv at every point): 1e-12 relative."""
    pts = quadrature_rule(nq)[0]
    assert O.rel(map_points(mesh, pts), O.map_points(mesh, pts)) < 1e-13
    assert O.rel(jacobian(mesh, pts), O.jacobian(mesh, pts)) < 1e-13
    qd = quadrature_data(mesh, nq)
    for got, want in zip((qd.x, qd.detJ, qd.wdetJ), O.quadrature_data(mesh, nq)):
        assert O.rel(got, want) < 1e-12
    rho = lambda x: 1.5 + x[0] * x[-1]                        # noqa: E731
    for r in (None, 2.5, rho):
        assert O.rel(mass_data(mesh, nq, r), O.mass_data(mesh, nq, 1.0 if r is None else r)) < 1e-12
        Q = diffusion_data(mesh, nq, r)
        assert Q.shape == (mesh.nelements, mesh.dim * (mesh.dim + 1) // 2) + (nq,) * mesh.dim
        assert O.rel(Q, O.diffusion_data(mesh, nq, 1.0 if r is None else r)) < 1e-12
    Q32 = diffusion_data(mesh, nq, rho, dtype=np.float32)
    assert Q32.dtype == np.float32 and O.rel(Q32, O.diffusion_data(mesh, nq, rho)) < 1e-6


@pytest.mark.parametrize("chunk", [1, 3])
def test_chunks_do_not_change_the_geometry(monkeypatch, chunk):
    mesh = box_mesh(3, (2, 3, 2), geom_order=2, distortion=0.05)
    kappa = lambda x: 1 + x[1] ** 2                            # noqa: E731
    whole = diffusion_data(mesh, 3, kappa), mass_data(mesh, 3, kappa), quadrature_data(mesh, 3).x
    _chunks_of(monkeypatch, chunk)
    calls = []
    counted = lambda x: calls.append(x.shape[1]) or kappa(x)    # noqa: E731
    parts = diffusion_data(mesh, 3, counted), mass_data(mesh, 3, kappa), quadrature_data(mesh, 3).x
    assert calls == [chunk] * (12 // chunk)                  # kappa once a chunk
    for a, b in zip(parts, whole):
        assert O.rel(a, b) < 1e-15


def test_chunk_size_follows_the_budget(monkeypatch):
    monkeypatch.setattr(geometry, "CPU_CHUNK_BYTES", 8000 * 100)
    monkeypatch.setattr(geometry, "MIN_CHUNK_ELEMENTS", 7)
    assert geometry._chunk_elements(np, 10**6, 100) == 1000
    assert geometry._chunk_elements(np, 10**6, 10**6) == 7       # never below the floor
    assert geometry._chunk_elements(np, 5, 100) == 5                # never above the mesh


def test_evaluate_field_broadcasts():
    x = np.zeros((2, 3, 4, 4))
    assert evaluate_field(2.5, x).shape == (3, 4, 4)
    assert evaluate_field(lambda x: np.ones((4, 4)), x).shape == (3, 4, 4)


_MESH = box_mesh(2, 2)
_X = np.zeros((2, 4, 3, 3))

ERROR_CASES = [
    (lambda: mass_data(_MESH, 3, dtype=np.int32), ValueError, r"dtype must be float64 or float32, got int32"),
    (lambda: mass_data(_MESH, 0), ValueError, r"n must be >= 1 for Gauss-Legendre"),
    (lambda: mass_data(_MESH, 3, rho=lambda x: x[0][:, :2]), ValueError,
     r"rho\(x\) returned shape \(4, 2, 3\), expected \(4, 3, 3\) for x of shape \(2, 4, 3, 3\)"),
    (lambda: mass_data(_MESH, 3, rho=lambda x: x[5]), ValueError, r"rho\(x\) failed for x of shape \(2, 4, 3, 3\)"),
    (lambda: mass_data(_MESH, 3, rho=lambda x: x[0] / 0.0), ValueError, r"rho\(x\) returned non-finite values"),
    (lambda: mass_data(_MESH, 3, rho="dense"), TypeError, r"rho must be callable or a real number, got str"),
    (lambda: evaluate_field(True, _X), TypeError, r"f must be callable or a real number, got bool"),
    (lambda: diffusion_data(_MESH, 3, kappa=lambda x: np.ones(2)), ValueError,
     r"kappa\(x\) returned shape \(2,\), expected \(4, 3, 3\)"),
    (lambda: diffusion_data(_MESH, 3, kappa=float("nan")), ValueError, r"kappa\(x\) returned non-finite values"),
    (lambda: mass_data(_MESH, 3, rho=np.inf), ValueError, r"rho\(x\) returned non-finite values"),
    (lambda: map_points(_MESH, [[0.0]]), ValueError, r"points must be a non-empty 1D array"),
    (lambda: det_jacobian(np.zeros((3, 2, 3))), ValueError, r"J has shape \(3, 2, 3\), expected \(E, dim, dim, ...\)"),
    (lambda: det_jacobian(np.zeros((3, 4, 4))), ValueError, r"J has shape \(3, 4, 4\)"),
    (lambda: check_jacobian(np.array([[1.0, np.nan]])), ValueError, r"\|J\| <= 0 at 1 quadrature point\(s\) of element 0"),
]


@pytest.mark.parametrize("call, exc, match", ERROR_CASES)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
