"""The basis application, ``smalltc.interpolate`` and ``smalltc.integrate``: against a dense
float64 oracle (Kronecker products of the 1D matrices, independent of the sum-factorised
code) with the output poisoned with NaN first, 1D-3D, every ``what``, one and two
components, through the map and on element vectors, on every backend of the arrays (on the
cuda and cpu backends the basis family's kernels: a call whose plan falls back fails); the
transpose identity; errors naming the operand. GPU cases skip without a CUDA device.
"""
import itertools

import numpy as np
import pytest

import smalltc
from smalltc import _validate

import oracle
from conftest import FULL, TOL, backend_params, rel_err, to_numpy, xp_of

WHATS = ("values", "gradients", "both")
# (dim, nd, nq): p = 1..4 in 1D-3D
SIZES = [(1, 3, 4), (2, 2, 3), (2, 4, 6), (3, 2, 3), (3, 3, 5), (3, 5, 6)]
CASES = [(dim, nd, nq, what, ncomp) for (dim, nd, nq), what, ncomp
         in itertools.product(SIZES, WHATS, (1, 2))]


#: the cases the CPU backend runs by default, each a Numba compile of seconds: one size a
#: dimension, every evaluation, the map and E-vector forms in each dimension, and two
#: components once; (dim, nd, nq, what) -> mapped. The other backends run every case, and
#: so does the CPU backend with ``SMALLTC_TEST_FULL=1``.
CPU_CORE = {(1, 3, 4, "values"): True, (1, 3, 4, "gradients"): False,
            (1, 3, 4, "both"): False,
            (2, 4, 6, "values"): False, (2, 4, 6, "gradients"): True, (2, 4, 6, "both"): True,
            (3, 3, 5, "values"): True, (3, 3, 5, "gradients"): False, (3, 3, 5, "both"): True}


def core_case(dim, nd, nq, what, ncomp, mapped):
    """Whether the CPU backend runs this case by default (``CPU_CORE``; two components on
    the mapped 3D "both")."""
    if ncomp == 2:
        return (dim, nd, nq, what) == (3, 3, 5, "both") and mapped
    return CPU_CORE.get((dim, nd, nq, what)) == mapped


dense = oracle.basis_matrices


def mesh_map(dim, nd, E, rng):
    """A map with shared DoFs (each element shares nodes with others) in random order."""
    ndofs = max(4, (E * nd ** dim) // 2)
    m = rng.integers(0, ndofs, size=(E,) + (nd,) * dim)
    m.reshape(-1)[:ndofs] = rng.permutation(ndofs)      # every DoF used
    return m.astype(np.int32), ndofs


def interp_oracle(B, G, V, what, dim):
    """(E, nc, nslots, nq^d) of V (E, nc, nd^d), float64."""
    V = np.asarray(V, np.float64)
    return np.stack([V @ M.T for M in dense(B, G, what, dim)], axis=2)


def integrate_oracle(B, G, H, what, dim):
    """(E, nc, nd^d) of H (E, nc, nslots, nq^d), float64."""
    H = np.asarray(H, np.float64)
    return sum(H[:, :, s] @ M for s, M in enumerate(dense(B, G, what, dim)))


def _on_the_kernel(backend, op, *operands, **kw):
    """On the cuda and cpu backends, the call's plan runs the basis family's kernel (not
    the reference path a backend falls back to)."""
    if backend in ("cuda", "cpu"):
        p = smalltc.plan(op, *operands, backend=backend, **kw)
        assert p.specialized and p.kernel.startswith("stc_basis_interp"), p


def _shape(E, nc, what, dim, n):
    return (E,) + ((nc,) if nc > 1 else ()) + ((1 + dim if what == "both" else dim,)
                                               if what != "values" else ()) + (n,) * dim


@pytest.mark.parametrize("xp_name,backend", backend_params())
@pytest.mark.parametrize("dim,nd,nq,what,ncomp", CASES)
@pytest.mark.parametrize("mapped", [True, False], ids=["map", "evec"])
def test_interpolate_and_integrate_match_the_dense_oracle(xp_name, backend, dim, nd, nq, what,
                                                          ncomp, mapped):
    if backend == "cpu" and not FULL and not core_case(dim, nd, nq, what, ncomp, mapped):
        pytest.skip("non-core case on the CPU backend, a Numba compile each "
                    "(set SMALLTC_TEST_FULL=1)")
    xp = xp_of(xp_name)
    rng = np.random.default_rng(dim * 100 + nd * 10 + nq)
    E = 7
    B, G = rng.standard_normal((2, nq, nd))
    Gop = None if what == "values" else xp.asarray(G)
    m, ndofs = mesh_map(dim, nd, E, rng)
    x = rng.standard_normal((ncomp, ndofs))
    V = np.moveaxis(x[:, m], 0, 1).reshape(E, ncomp, -1)
    ref = interp_oracle(B, G, V, what, dim)
    shape = _shape(E, ncomp, what, dim, nq)
    out = xp.full(shape, np.nan)
    kw = dict(what=what, backend=backend, out=out)
    if mapped:
        args = (xp.asarray(B), Gop, xp.asarray(x[0] if ncomp == 1 else x), xp.asarray(m))
        H = smalltc.interpolate(*args, **kw)
        _on_the_kernel(backend, "interpolate", *args, what=what)
    else:
        Vin = V.reshape((E,) + ((ncomp,) if ncomp > 1 else ()) + (nd,) * dim)
        args = (xp.asarray(B), Gop, xp.asarray(Vin))
        H = smalltc.interpolate(*args, dim=dim if ncomp > 1 else None, **kw)
        _on_the_kernel(backend, "interpolate", *args, what=what,
                       dim=dim if ncomp > 1 else None)
    assert H is out and H.shape == shape
    assert rel_err(H, ref.reshape(shape)) < TOL["float64"]

    Hin = rng.standard_normal(shape)
    U = integrate_oracle(B, G, Hin.reshape(E, ncomp, -1, nq ** dim), what, dim)
    if mapped:
        yref = np.zeros((ncomp, ndofs))
        for c in range(ncomp):
            np.add.at(yref[c], m.reshape(-1), U[:, c].reshape(-1))
        yshape = (ndofs,) if ncomp == 1 else (ncomp, ndofs)
        out = xp.full(yshape, np.nan)
        args = (xp.asarray(B), Gop, xp.asarray(Hin), xp.asarray(m))
        y = smalltc.integrate(*args, what=what, ndofs=ndofs, backend=backend, out=out)
        _on_the_kernel(backend, "integrate", *args, what=what, ndofs=ndofs)
        assert y is out
        assert rel_err(y, yref.reshape(yshape)) < TOL["float64"]
    else:
        ushape = (E,) + ((ncomp,) if ncomp > 1 else ()) + (nd,) * dim
        out = xp.full(ushape, np.nan)
        args = (xp.asarray(B), Gop, xp.asarray(Hin))
        y = smalltc.integrate(*args, what=what, dim=dim if ncomp > 1 else None,
                              backend=backend, out=out)
        _on_the_kernel(backend, "integrate", *args, what=what, dim=dim if ncomp > 1 else None)
        assert y is out
        assert rel_err(y, U.reshape(ushape)) < TOL["float64"]


@pytest.mark.parametrize("xp_name,backend", backend_params())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_integrate_is_the_transpose_of_interpolate(xp_name, backend, dtype):
    """``<H, interp(x)> == <integrate(H), x>`` through the map, float32 and float64."""
    xp = xp_of(xp_name)
    rng = np.random.default_rng(5)
    dim, nd, nq, E = 3, 3, 5, 11          # the size of a CPU core case (its kernel)
    B, G = rng.standard_normal((2, nq, nd)).astype(dtype)
    m, ndofs = mesh_map(dim, nd, E, rng)
    x = rng.standard_normal(ndofs).astype(dtype)
    H = rng.standard_normal((E, 1 + dim) + (nq,) * dim).astype(dtype)
    args = [xp.asarray(a) for a in (B, G)]
    Ix = to_numpy(smalltc.interpolate(*args, xp.asarray(x), xp.asarray(m), what="both",
                                      backend=backend)).astype(np.float64)
    ItH = to_numpy(smalltc.integrate(*args, xp.asarray(H), xp.asarray(m), what="both",
                                     ndofs=ndofs, backend=backend)).astype(np.float64)
    lhs, rhs = float(np.sum(H * Ix)), float(np.dot(ItH, x))
    assert abs(lhs - rhs) <= TOL[dtype] * 10 * np.sqrt(np.sum(H.astype(np.float64) ** 2)
                                                      * np.sum(Ix ** 2))


def test_a_polynomial_is_interpolated_exactly():
    """On [-1, 1]^2 with the basis of fem: x^2 y at the points, and its gradient."""
    from smalltc import fem
    space = fem.H1Space(fem.box_mesh(2, 2), 2)
    b = fem.basis_1d(2, 4)
    X = space.dof_coordinates()
    H = smalltc.interpolate(b.B1d, b.G1d, X[0] ** 2 * X[1], space.elem_dofs, what="both")
    Xq = smalltc.interpolate(b.B1d, None, X, space.elem_dofs)           # (E, 2, nq, nq)
    xq, yq = Xq[:, 0], Xq[:, 1]
    np.testing.assert_allclose(H[:, 0], xq ** 2 * yq, atol=1e-13)
    # the mesh is uniform with 2 x 2 squares of side 1/2: d/dxi = (1/4) d/dx
    np.testing.assert_allclose(H[:, 1], 0.25 * 2 * xq * yq, atol=1e-13)
    np.testing.assert_allclose(H[:, 2], 0.25 * xq ** 2, atol=1e-13)


B3, G3 = np.ones((3, 2)), np.ones((3, 2))
M2 = np.zeros((4, 2, 2), dtype=np.int32)


@pytest.mark.parametrize("call,match", [
    (lambda: smalltc.interpolate(B3, None, np.ones(5), M2, what="grad"), "what must be one"),
    (lambda: smalltc.interpolate(B3, None, np.ones(5), M2, what="both"), "needs G1d"),
    (lambda: smalltc.interpolate(B3, G3, np.ones(5), M2), "G1d is given but"),
    (lambda: smalltc.interpolate(B3, np.ones((3, 3)), np.ones(5), M2, what="both"),
     r"G1d has shape \(3, 3\), expected \(3, 2\)"),
    (lambda: smalltc.interpolate(B3, None, np.ones(5), np.zeros((4, 3, 3), np.int32)),
     r"elem_dofs has shape \(4, 3, 3\), expected \(4, 2, 2\)"),
    (lambda: smalltc.interpolate(B3, None, np.ones(5), M2 + 5), r"elem_dofs holds indices"),
    (lambda: smalltc.interpolate(B3, None, np.ones((4, 3, 3))), r"V has shape \(4, 3, 3\)"),
    (lambda: smalltc.interpolate(B3, None, np.ones((4, 2, 2)), dim=4), "dim must be 1, 2 or 3"),
    (lambda: smalltc.integrate(B3, None, np.ones((4, 3, 3)), M2), "ndofs is needed"),
    (lambda: smalltc.integrate(B3, None, np.ones((4, 2, 2)), M2, ndofs=5),
     r"H has shape \(4, 2, 2\), expected \(4, 3, 3\)"),
    (lambda: smalltc.integrate(B3, G3, np.ones((4, 3, 3)), M2, ndofs=5, what="both"),
     r"H has shape \(4, 3, 3\), expected \(4, 3, 3, 3\)"),
    (lambda: smalltc.interpolate(B3, None, np.ones(5), M2, out=np.ones((4, 3))),
     r"out has shape \(4, 3\)"),
])
def test_bad_operands_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_float_map_is_a_type_error():
    with pytest.raises(TypeError, match="elem_dofs has dtype float64"):
        smalltc.interpolate(B3, None, np.ones(5), M2.astype(np.float64))


def test_the_spec_describes_the_call():
    spec, _, ops = _validate.basis_spec(B3, G3, np.ones((2, 5)), M2, what="gradients")
    assert (spec.dim, spec.nq, spec.nd, spec.ncomp, spec.nslots) == (2, 3, 2, 2, 2)
    assert spec.out_shape == (4, 2, 2, 3, 3)
    assert [o.name for o in spec.inputs] == ["B1d", "G1d", "x", "elem_dofs"]
    assert len(ops) == 4


def test_a_small_one_shot_evaluation_on_the_cpu_runs_the_reference_path(monkeypatch):
    """backend="auto" with NumPy arrays: a few elements run NumPy's reference path (no
    compile of seconds for milliseconds of work); SMALLTC_SMALL_EVALUATION=0 or
    backend="cpu" compile the kernel."""
    if not any(b.name == "cpu" for b in smalltc.backends.candidates("numpy")):
        pytest.skip("no CPU backend")
    B, G = np.random.default_rng(3).standard_normal((2, 4, 3))
    V = np.ones((2, 3))
    assert smalltc.plan("interpolate", B, G, V, what="both").backend == "reference"
    assert smalltc.plan("geometry", np.ones((2, 1, 1, 4)), np.ones(4), None,
                        np.ones(2)).backend == "reference"
    monkeypatch.setenv("SMALLTC_SMALL_EVALUATION", "many")
    with pytest.raises(ValueError, match="SMALLTC_SMALL_EVALUATION must be a whole number"):
        smalltc.plan("interpolate", B, G, V, what="both")
    monkeypatch.setenv("SMALLTC_SMALL_EVALUATION", "0")
    assert smalltc.plan("interpolate", B, G, V, what="both").backend == "cpu"


def test_an_evaluation_job_decides_by_its_size(monkeypatch):
    """Inside ``evaluation_job``, a chunk runs NumPy's reference path when the job is small
    (whatever the chunk's size) and the kernel when the job is large (however small the
    chunk); the public functions' plan cache tells the two apart."""
    if not any(b.name == "cpu" for b in smalltc.backends.candidates("numpy")):
        pytest.skip("no CPU backend")
    monkeypatch.delenv("SMALLTC_SMALL_EVALUATION", raising=False)
    rng = np.random.default_rng(4)
    B, G = rng.standard_normal((2, 4, 3))
    big = rng.standard_normal((300, 3))                       # 300 elements: not small alone
    small = big[:2]
    assert smalltc.plan("interpolate", B, G, big, what="both").backend == "cpu"
    with smalltc.evaluation_job(points=300 * 4 * 2):
        assert smalltc.plan("interpolate", B, G, big, what="both").backend == "reference"
    from smalltc.plan import SMALL_JOB
    with smalltc.evaluation_job(points=SMALL_JOB + 1):
        assert smalltc.plan("interpolate", B, G, small, what="both").backend == "cpu"
    ref = interp_oracle(B, G, small.reshape(2, 1, 3), "both", 1).reshape(2, 2, 4)
    for job in (10, 1 << 30):                       # the cached plan of each: both correct
        with smalltc.evaluation_job(points=job):
            out = np.full((2, 2, 4), np.nan)
            smalltc.interpolate(B, G, small, what="both", out=out)
            assert rel_err(out, ref) < TOL["float64"]
    monkeypatch.setenv("SMALLTC_SMALL_EVALUATION", "100")
    with smalltc.evaluation_job(points=300 * 4 * 2):
        assert smalltc.plan("interpolate", B, G, big, what="both").backend == "cpu"
    with pytest.raises(ValueError, match="points must be a number of point values >= 0"):
        with smalltc.evaluation_job(points=-1):
            pass
