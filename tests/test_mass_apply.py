"""The fused FEM operator ``smalltc.mass_apply`` and ``smalltc.mass_diagonal``.

Every case against the float64 oracle (gather by fancy indexing, the einsum
chain, scatter-add by ``bincount``: ``reference.mass_apply_unfused``), on
every backend for NumPy arrays and, where a GPU answers, CuPy arrays; the
output poisoned with NaN first. Maps are a structured box mesh's and the same
with the DoF numbers shuffled (an unstructured numbering: neighbours far apart
in ``x``). The deterministic form is checked to give the same bits twice.
"""
import numpy as np
import pytest

import smalltc
from smalltc import maps
from smalltc._arrays import gpu_available
from smalltc.backends.reference import mass_apply_unfused, mass_diagonal_unfused
from smalltc.fem import H1Space, box_mesh

from conftest import TOL, backend_params, rel_err, to_numpy, xp_of


BACKENDS = backend_params()


# (dim, p, nq, ncomp, dtype, index dtype, deterministic, shuffled map)
CASES = [
    (1, 3, 5, 1, "float64", "int32", False, False),
    (1, 2, 3, 3, "float32", "int64", True, True),
    (2, 1, 3, 1, "float64", "int32", True, False),
    (2, 4, 6, 1, "float64", "int64", False, True),
    (2, 3, 4, 3, "float64", "int32", True, True),
    (2, 7, 9, 1, "float32", "int32", False, False),
    (3, 1, 2, 1, "float64", "int32", False, False),
    (3, 1, 3, 1, "float64", "int32", True, True),
    (3, 2, 4, 3, "float64", "int64", False, True),
    (3, 3, 5, 1, "float32", "int32", True, False),
    (3, 4, 6, 1, "float64", "int32", False, True),      # the line form from T = 5 on
    (3, 5, 7, 1, "float64", "int64", True, True),
    (3, 6, 7, 3, "float32", "int32", False, False),
    (3, 8, 10, 1, "float64", "int32", True, False),
]


def _problem(dim, p, nq, ncomp, dtype, index_dtype, shuffled, seed=0):
    """(B1d, D, x, elem_dofs) on a small box mesh, float64 host arrays, random values."""
    rng = np.random.default_rng(seed + 100 * p + 10 * dim)
    n = {1: 7, 2: 4, 3: 3}[dim]
    space = H1Space(box_mesh(dim, n), p)
    m = space.elem_dofs
    if shuffled:
        m = rng.permutation(space.ndofs)[m]
    B1d = rng.standard_normal((nq, p + 1))
    D = rng.random((space.nelements,) + (nq,) * dim) + 0.5
    x = rng.standard_normal((ncomp, space.ndofs) if ncomp > 1 else (space.ndofs,))
    x, D, B1d = (a.astype(dtype).astype(np.float64) for a in (x, D, B1d))   # what runs
    return B1d, D, x, m.astype(index_dtype)


def _on(xp, dtype, B1d, D, x, m):
    return (xp.asarray(B1d.astype(dtype)), xp.asarray(D.astype(dtype)),
            xp.asarray(x.astype(dtype)), xp.asarray(m))


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_mass_apply_matches_the_oracle(xp_name, backend, case):
    dim, p, nq, ncomp, dtype, idt, det, shuffled = case
    xp = xp_of(xp_name)
    B1d, D, x, m = _problem(dim, p, nq, ncomp, dtype, idt, shuffled)
    ref = mass_apply_unfused(B1d, D, x, m, dim)
    ops = _on(xp, dtype, B1d, D, x, m)
    out = xp.full(x.shape, np.nan, dtype=dtype)
    y = smalltc.mass_apply(*ops, out=out, deterministic=det, backend=backend)
    assert y is out
    assert rel_err(y, ref) <= TOL[dtype] * (10 if p >= 6 else 1)
    if det:      # a fixed order of additions: the same bits again, into another buffer
        again = smalltc.mass_apply(*ops, deterministic=True, backend=backend)
        assert np.array_equal(to_numpy(again), to_numpy(y))
    d_ref = mass_diagonal_unfused(B1d, D, m, m.max() + 1 if shuffled else x.shape[-1], dim)
    ndofs = x.shape[-1]
    d = smalltc.mass_diagonal(ops[0], ops[1], ops[3], ndofs, deterministic=det,
                              backend=backend)
    assert d.shape == (ndofs,) and rel_err(d, d_ref) <= TOL[dtype]


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
def test_the_operator_is_symmetric_and_its_diagonal_is_its_diagonal(xp_name, backend):
    """``<M a, b> = <a, M b>``, and ``e_i^T M e_i`` is the diagonal's entry i."""
    xp = xp_of(xp_name)
    B1d, D, a, m = _problem(3, 2, 4, 1, "float64", "int32", True)
    b = np.random.default_rng(5).standard_normal(a.shape)
    ops = _on(xp, "float64", B1d, D, a, m)
    Ma = to_numpy(smalltc.mass_apply(*ops, backend=backend))
    Mb = to_numpy(smalltc.mass_apply(ops[0], ops[1], xp.asarray(b), ops[3], backend=backend))
    assert abs(Ma @ b - a @ Mb) <= 1e-12 * abs(Ma @ b)
    d = to_numpy(smalltc.mass_diagonal(ops[0], ops[1], ops[3], a.size, backend=backend))
    for i in (0, 7, a.size - 1):
        e = np.zeros(a.size)
        e[i] = 1.0
        Me = to_numpy(smalltc.mass_apply(ops[0], ops[1], xp.asarray(e), ops[3],
                                         backend=backend))
        assert abs(Me[i] - d[i]) <= 1e-13 * d[i]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
def test_cuda_forms_agree_and_run_one_kernel():
    """On the GPU the atomic and the deterministic (E-vector, transposed-map sum) forms agree
    to rounding; the plan names one fused kernel (no gather or scatter kernels of their own)."""
    cp = xp_of("cupy")
    B1d, D, x, m = _problem(3, 4, 6, 1, "float64", "int32", False)
    ops = _on(cp, "float64", B1d, D, x, m)
    p = smalltc.plan("mass_apply", *ops)
    assert p.backend == "cuda" and p.kernel.startswith("stc_mass_op_3d_f64_nd5nq6c1_i32")
    atomic = to_numpy(p(*ops))
    det = to_numpy(smalltc.mass_apply(*ops, deterministic=True))
    assert np.abs(atomic - det).max() <= 1e-13 * np.abs(det).max()
    assert smalltc.plan("mass_apply", *ops, deterministic=True).kernel.endswith("_ev")


def _errors():
    B1d, D, x, m = _problem(2, 2, 4, 1, "float64", "int32", False)
    bad_range = m.copy()
    bad_range[3, 1, 1] = x.size
    negative = m.copy()
    negative[0, 0, 0] = -1
    return [
        (dict(elem_dofs=m.astype(np.float64)), TypeError, r"elem_dofs has dtype float64, "
         r"expected int32 or int64"),
        (dict(elem_dofs=m[:, :2]), ValueError, r"elem_dofs has shape \(16, 2, 3\), expected "
         r"\(16, 3, 3\)"),
        (dict(elem_dofs=bad_range), ValueError, r"elem_dofs holds indices 0..81, outside "
         r"\[0, 81\)"),
        (dict(elem_dofs=negative), ValueError, r"elem_dofs holds indices -1..80"),
        (dict(x=x[None, None]), ValueError, r"x has shape \(1, 1, 81\), expected \(ndofs,\)"),
        (dict(x=x.astype(np.float32)), TypeError, r"mixed dtypes"),
        (dict(D=D[:, :3]), ValueError, r"D has shape \(16, 3, 4\)"),
        (dict(out=np.empty(80)), ValueError, r"out has shape \(80,\), expected \(81,\)"),
        (dict(out="x"), ValueError, r"out overlaps the input x"),
    ], (B1d, D, x, m)


@pytest.mark.parametrize("i", range(9))
def test_errors_name_the_operand(i):
    cases, (B1d, D, x, m) = _errors()
    change, exc, match = cases[i]
    args = dict(B1d=B1d, D=D, x=x, elem_dofs=m)
    args.update({k: v for k, v in change.items() if k != "out"})
    out = change.get("out")
    if isinstance(out, str):
        out = args["x"]                  # y overwriting x: refused
    with pytest.raises(exc, match=match):
        smalltc.mass_apply(args["B1d"], args["D"], args["x"], args["elem_dofs"], out=out)


def test_diagonal_errors():
    B1d, D, x, m = _problem(1, 2, 3, 1, "float64", "int32", False)
    with pytest.raises(ValueError, match=r"ndofs must be a positive integer"):
        smalltc.mass_diagonal(B1d, D, m, 0)
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        smalltc.mass_diagonal(B1d, D, m, 3)


def test_a_map_is_checked_once_per_object_and_again_after_forget():
    B1d, D, x, m = _problem(1, 2, 3, 1, "float64", "int32", False)
    smalltc.mass_apply(B1d, D, x, m)                      # checked, and remembered
    m[0, 0] = x.size + 5                                   # changed in place: not seen ...
    maps.forget(m)                                         # ... until forgotten
    with pytest.raises(ValueError, match=r"elem_dofs holds indices"):
        smalltc.mass_apply(B1d, D, x, m)


def test_colouring_of_structured_meshes():
    """Greedy colours: 2, 4, 8 on 1D, 2D, 3D box meshes; no colour has a shared DoF."""
    for dim, want in ((1, 2), (2, 4), (3, 8)):
        space = H1Space(box_mesh(dim, 4), 2)
        order, offsets = maps.element_colors(space.elem_dofs, space.ndofs)
        assert len(offsets) - 1 == want and sorted(order) == list(range(space.nelements))
        flat = space.elem_dofs.reshape(space.nelements, -1)
        for c in range(want):
            dofs = flat[order[offsets[c]:offsets[c + 1]]].ravel()
            assert len(np.unique(dofs)) == len(dofs)
