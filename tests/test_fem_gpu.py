"""The FEM solve path on the GPU: CuPy gather/scatter, operators, CG, L2 projection.

GPU cases are marked ``gpu`` and skip cleanly without a CUDA device (run
them on one: ``pytest -m gpu tests/test_fem_gpu.py``). The table-driven
cases also run their body with NumPy arrays, and the ``device`` choice and
its errors are checked everywhere.
"""
import numpy as np
import pytest

import smalltc.fem._device as fem_device
from smalltc._arrays import array_module, gpu_available
from smalltc.fem import (
    H1Space,
    MassOperator,
    basis_1d,
    box_mesh,
    cg,
    jacobi,
    l2_project,
    mass_data,
    mass_operator,
    projection_demo,
    smooth_function,
)

from conftest import array_modules, to_numpy, xp_of

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")

# (dim, n, p, ncomp)
SPACE_CASES = [
    (1, 5, 3, None),
    (2, (3, 2), 2, None),
    (2, 3, 4, 2),
    (3, 2, 1, None),
    (3, (2, 3, 1), 3, None),
    (3, 2, 4, 3),
]


@pytest.mark.parametrize("dim, n, p, ncomp", SPACE_CASES, ids=[str(c) for c in SPACE_CASES])
@pytest.mark.parametrize("xp_name", array_modules())
def test_gather_scatter_adjoint_on_device(xp_name, dim, n, p, ncomp):
    xp = xp_of(xp_name)
    V = H1Space(box_mesh(dim, n, distortion=0.05), p)
    rng = np.random.default_rng(dim * 100 + p)
    gshape = (V.ndofs,) if ncomp is None else (ncomp, V.ndofs)
    eshape = V.evector_shape if ncomp is None else (V.nelements, ncomp) + V.evector_shape[1:]
    x_h, y_h = rng.standard_normal(gshape), rng.standard_normal(eshape)
    x, y = xp.asarray(x_h), xp.asarray(y_h)
    gx, sy = V.gather(x), V.scatter(y)
    assert array_module(gx) is xp and array_module(sy) is xp
    assert gx.shape == eshape and gx.flags.c_contiguous and sy.shape == gshape
    np.testing.assert_array_equal(to_numpy(gx), V.gather(x_h))  # a gather is a copy
    np.testing.assert_allclose(to_numpy(sy), V.scatter(y_h), rtol=0, atol=1e-14 * np.abs(y_h).max())
    lhs, rhs = float(xp.vdot(gx.ravel(), y.ravel())), float(xp.vdot(x.ravel(), sy.ravel()))
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + 1.0)
    assert bool(xp.all(V.scatter(y) == sy))  # same bits every run (no atomics)


# (dim, n, p, assembled)
OPERATOR_CASES = [(1, 4, 3, False), (2, 3, 2, False), (2, 3, 2, True), (3, 2, 3, False), (3, 2, 2, True)]


@pytest.mark.parametrize("dim, n, p, assembled", OPERATOR_CASES, ids=[str(c) for c in OPERATOR_CASES])
@pytest.mark.parametrize("xp_name", array_modules())
def test_operator_on_device_matches_host(xp_name, dim, n, p, assembled):
    xp = xp_of(xp_name)
    V = H1Space(box_mesh(dim, n, geom_order=2, distortion=0.05), p)
    host = mass_operator(V, assembled=assembled, device="cpu")
    dev = mass_operator(V, assembled=assembled, device="cpu" if xp is np else "gpu")
    assert dev.xp is xp and dev.device == ("cpu" if xp is np else "gpu")
    X = np.random.default_rng(p).standard_normal((2, V.ndofs))
    ref = host(X)
    for x in (X, xp.asarray(X), xp.asarray(X[0])):  # host input is copied over
        y = dev(x)
        assert array_module(y) is xp and y.shape == x.shape
        np.testing.assert_allclose(to_numpy(y), ref if x.ndim == 2 else ref[0],
                                   rtol=0, atol=1e-13 * np.abs(ref).max())
    d = dev.diagonal()
    assert array_module(d) is xp
    np.testing.assert_allclose(to_numpy(d), host.diagonal(), rtol=1e-13)


@pytest.mark.parametrize("xp_name", array_modules())
def test_cg_with_jacobi_on_device(xp_name):
    xp = xp_of(xp_name)
    rng = np.random.default_rng(7)
    Q, _ = np.linalg.qr(rng.standard_normal((40, 40)))
    s = np.logspace(0, 3, 40)
    A = s[:, None] * (Q @ np.diag(np.linspace(1.0, 10.0, 40)) @ Q.T) * s[None, :]
    b = rng.standard_normal(40)
    ref = cg(lambda v: A @ v, b, tol=1e-12, precond=jacobi(np.diag(A)))
    A_d = xp.asarray(A)
    res = cg(lambda v: A_d @ v, xp.asarray(b), tol=1e-12, precond=jacobi(xp.asarray(np.diag(A))))
    assert array_module(res.x) is xp and isinstance(res.residuals, np.ndarray)
    assert res.converged and isinstance(res.true_residual, float) and res.true_residual <= 1e-10
    assert res.iterations == pytest.approx(ref.iterations, abs=2)
    np.testing.assert_allclose(to_numpy(res.x), np.linalg.solve(A, b), rtol=1e-8)


@pytest.mark.gpu
@needs_gpu
def test_jacobi_on_device_names_bad_entry():
    import cupy
    with pytest.raises(ValueError, match=r"entry \(1,\) is 0.0 \(2 bad entries\)"):
        jacobi(cupy.asarray([1.0, 0.0, -2.0]))
    with pytest.raises(ValueError, match=r"entry \(2,\) is nan \(1 bad entries\)"):
        jacobi(cupy.asarray([1.0, 3.0, np.nan], dtype=cupy.float32))
    P = jacobi(cupy.asarray([2.0, 4.0]))         # checked on the device, kept there
    assert isinstance(P.inv, cupy.ndarray) and P.inv.tolist() == [0.5, 0.25]


# (dim, p, n): matrix-free and assembled CG on the GPU against the CPU solution
PROJECTION_CASES = [(1, 4, 3), (2, 2, 3), (3, 2, 2), (3, 4, 2)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("operator", ["matrix-free", "assembled"])
@pytest.mark.parametrize("dim, p, n", PROJECTION_CASES, ids=[str(c) for c in PROJECTION_CASES])
def test_projection_on_gpu_matches_cpu(dim, p, n, operator):
    mesh = box_mesh(dim, n, geom_order=2, distortion=0.08)
    cpu = l2_project(mesh, p, smooth_function, operator="matrix-free", tol=1e-13, device="cpu")
    gpu = l2_project(mesh, p, smooth_function, operator=operator, tol=1e-13, device="gpu")
    assert cpu.device == "cpu" and gpu.device == "gpu"
    assert isinstance(gpu.u, np.ndarray) and isinstance(gpu.residuals, np.ndarray)
    assert all(isinstance(v, float) for v in (gpu.residual, gpu.l2_error, gpu.l2_norm))
    np.testing.assert_allclose(gpu.u, cpu.u, rtol=0, atol=1e-10 * np.abs(cpu.u).max())
    assert gpu.iterations == pytest.approx(cpu.iterations, abs=2)
    assert gpu.l2_error == pytest.approx(cpu.l2_error, rel=1e-6)
    assert gpu.residual <= 1e-13


@pytest.mark.gpu
@needs_gpu
def test_l2_error_converges_at_rate_p_plus_1_on_gpu():
    p, ns = 3, (3, 6)
    errors = [l2_project(box_mesh(3, n, geom_order=2, distortion=0.05), p, smooth_function,
                         tol=1e-13, device="gpu").l2_error for n in ns]
    rate = np.polyfit(np.log(1.0 / np.array(ns)), np.log(errors), 1)[0]
    assert p + 1 - 0.3 <= rate <= p + 1 + 0.5, f"observed rate {rate:.3f} for p={p}, errors {errors}"


@pytest.mark.gpu
@needs_gpu
def test_projection_demo_on_gpu():
    r = projection_demo(dim=3, p=3, n=2, device="gpu")
    assert r["device"] == "gpu" and r["dofs"] == 7**3
    assert 0 < r["relative_l2_error"] < 1e-2 and r["residual"] <= 1e-12
    assert all(isinstance(v, (int, float, str)) for v in r.values())


@pytest.mark.gpu
@needs_gpu
def test_large_arrays_go_to_the_device_through_the_staging_buffer(monkeypatch):
    """Below the threshold a plain copy; above it the page-locked buffer, in pieces when
    larger than the buffer (made small here): the same arrays, any dtype and shape."""
    import cupy
    monkeypatch.setattr(fem_device, "STAGE_BYTES", 1 << 20)
    monkeypatch.setattr(fem_device, "STAGED_BYTES", 1 << 16)
    monkeypatch.setattr(fem_device, "_STAGE", [])
    rng = np.random.default_rng(0)
    for a in (rng.random(100), rng.random((3, 700, 111)),
              rng.integers(0, 2**31 - 1, (5000, 125), dtype=np.int32),
              np.asfortranarray(rng.random((400, 300)))):
        d = fem_device.to_device(a, cupy)
        assert isinstance(d, cupy.ndarray) and d.shape == a.shape and d.dtype == a.dtype
        np.testing.assert_array_equal(cupy.asnumpy(d), a)
    assert fem_device._STAGE and fem_device._STAGE[0][1].size == 1 << 20


@pytest.mark.gpu
@needs_gpu
def test_many_small_arrays_go_to_the_device_in_one_buffer():
    """Packed at aligned offsets of one device buffer: every array back with its dtype,
    shape and values (odd sizes between them), each usable on its own."""
    import cupy
    rng = np.random.default_rng(1)
    arrays = [rng.random(7), rng.integers(0, 99, 5, dtype=np.int32), np.zeros(0),
              rng.random((3, 5)).astype(np.float32), np.arange(9, dtype=np.int64),
              np.array([True, False, True])]
    got = fem_device.to_device_many(arrays, cupy)
    for a, d in zip(arrays, got):
        assert isinstance(d, cupy.ndarray) and d.shape == a.shape and d.dtype == a.dtype
        np.testing.assert_array_equal(cupy.asnumpy(d), a)
    assert float((got[1] * 2).sum()) == float(arrays[1].sum() * 2)


@pytest.mark.gpu
@needs_gpu
def test_host_operator_rejects_device_vector():
    import cupy
    V = H1Space(box_mesh(2, 2), 2)
    M = MassOperator(V, mass_data(V.mesh, 4), basis_1d(2, 4).B1d)
    with pytest.raises(TypeError, match=r"x is a CuPy array but this operator's data are on the host"):
        M(cupy.ones(V.ndofs))
    assert "device='gpu'" in repr(mass_operator(V, device="gpu"))


# The device choice, everywhere (a GPU machine is made to look GPU-less).

_MESH = box_mesh(2, 2)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(fem_device, "gpu_available", lambda: False)


@pytest.mark.parametrize("call", [
    lambda: l2_project(_MESH, 2, smooth_function, device="gpu"),
    lambda: projection_demo(dim=2, p=1, n=2, device="gpu"),
    lambda: mass_operator(H1Space(_MESH, 1), device="gpu"),
], ids=["l2_project", "projection_demo", "mass_operator"])
def test_gpu_without_gpu_raises(no_gpu, call):
    with pytest.raises(RuntimeError, match=r"device='gpu' was requested but no GPU is available \(CuPy "):
        call()


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")
def test_gpu_without_gpu_raises_here():
    with pytest.raises(RuntimeError, match=r"device='gpu' was requested but no GPU is available"):
        l2_project(_MESH, 2, smooth_function, device="gpu")


def test_auto_without_gpu_is_cpu(no_gpu):
    res = l2_project(_MESH, 2, smooth_function, device="auto")
    assert res.device == "cpu" and isinstance(res.u, np.ndarray)
    assert projection_demo(dim=2, p=1, n=2)["device"] == "cpu"


def test_auto_is_gpu_when_available():
    assert l2_project(_MESH, 2, smooth_function).device == ("gpu" if gpu_available() else "cpu")


def test_bad_device():
    with pytest.raises(ValueError, match=r"device must be one of \['auto', 'cpu', 'gpu'\], got 'tpu'"):
        l2_project(_MESH, 2, smooth_function, device="tpu")
