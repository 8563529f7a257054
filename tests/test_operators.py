"""The operator family (docs/math.md section 7): diffusion, Helmholtz, collocated, ncomp.

Every case of the table runs every level (element action, assembly, fused apply
through a map, diagonal) on every backend for NumPy arrays (and CuPy arrays where a
GPU answers), outputs poisoned with NaN first, against the dense float64 oracle of
``tests/oracle.py`` (Kronecker gradient matrices, written from the definition, not
sum-factorised). B1d and G1d are random matrices, so a kernel that used a derived
matrix or assumed a nodal basis would fail. Then the identities, the mass instance
against the mass functions, the keys, the fallback and every error path.
"""
import logging

import numpy as np
import pytest

import oracle
import smalltc
from smalltc._arrays import gpu_available
from smalltc.fem import H1Space, box_mesh
from smalltc.spec import ActionSpec, AssemblySpec, MassApplySpec, MassDiagonalSpec

from conftest import FULL, TOL, backend_params, rel_err, to_numpy, xp_of

BACKENDS = backend_params()

# (qfunc, collocated, dim, p, nq, dtype, ncomp)
CASES = [
    ("diffusion", False, 1, 3, 5, "float64", 1),
    ("diffusion", False, 2, 2, 4, "float64", 1),
    ("diffusion", True, 2, 3, 4, "float32", 1),
    ("diffusion", False, 3, 1, 3, "float64", 1),
    ("diffusion", False, 3, 2, 4, "float64", 3),
    ("diffusion", False, 3, 3, 5, "float32", 1),
    ("diffusion", True, 3, 3, 4, "float64", 1),
    ("diffusion", True, 3, 2, 3, "float64", 3),
    ("diffusion", False, 3, 4, 6, "float64", 1),
    ("helmholtz", False, 1, 2, 4, "float64", 2),
    ("helmholtz", False, 2, 3, 5, "float32", 1),
    ("helmholtz", True, 3, 2, 3, "float64", 1),
    ("helmholtz", False, 3, 3, 5, "float64", 1),
]
#: the cases a compiled backend runs by default (its compiles are the cost; the rest with
#: SMALLTC_TEST_FULL=1, and always on the reference backend)
CORE = {("diffusion", False, 3, 2, 4, "float64", 3), ("diffusion", True, 3, 3, 4, "float64", 1),
        ("helmholtz", False, 2, 3, 5, "float32", 1)}
IDS = ["{}{}-{}d-p{}-nq{}-{}-c{}".format(q, "+co" if co else "", d, p, nq, dt, c)
       for q, co, d, p, nq, dt, c in CASES]


def _data(case, seed=0):
    """(B1d or None, G1d, D or None, Q or None, E, space) in float64, representable in the
    case's dtype; Q symmetric positive definite per point (random), D positive."""
    qfunc, co, dim, p, nq, dtype, ncomp = case
    rng = np.random.default_rng(seed + 1000 * dim + 10 * p + nq)
    n = {1: 5, 2: 3, 3: 2}[dim]
    space = H1Space(box_mesh(dim, n), p)
    E = space.nelements
    B1d = None if co else rng.standard_normal((nq, p + 1))
    G1d = rng.standard_normal((nq, p + 1))
    Q = rng.standard_normal((E, dim * (dim + 1) // 2) + (nq,) * dim)
    for c, (a, b) in enumerate(oracle.sym_pairs(dim)):
        if a == b:
            Q[:, c] = np.abs(Q[:, c]) + dim
    D = rng.random((E,) + (nq,) * dim) + 0.5 if qfunc == "helmholtz" else None
    rd = (lambda a: None if a is None else a.astype(dtype).astype(np.float64))
    return rd(B1d), rd(G1d), rd(D), rd(Q), space


def _skip_non_core(backend, case):
    if backend != "reference" and case not in CORE and not FULL:
        pytest.skip("non-core case on a compiled backend (set SMALLTC_TEST_FULL=1)")


def _on(xp, dtype, *arrays):
    return tuple(None if a is None else xp.asarray(a.astype(dtype) if a.dtype.kind == "f"
                                                   else a) for a in arrays)


def _data_arg(qfunc, D, Q):
    return (D, Q) if qfunc == "helmholtz" else Q


def _tol(dtype, p):
    return TOL[dtype] * (20 if dtype == "float32" else 10) * (4 if p >= 4 else 1)


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_element_action_and_assembly(xp_name, backend, case):
    _skip_non_core(backend, case)
    qfunc, co, dim, p, nq, dtype, ncomp = case
    xp = xp_of(xp_name)
    B1d, G1d, D, Q, space = _data(case)
    E = space.nelements
    rng = np.random.default_rng(7)
    V = rng.standard_normal((E,) + ((ncomp,) if ncomp > 1 else ()) + (p + 1,) * dim)
    V = V.astype(dtype).astype(np.float64)
    ref = oracle.operator_action(qfunc, B1d, G1d, D, Q, V, dim)
    b, g, d, q, v = _on(xp, dtype, B1d, G1d, D, Q, V)
    out = xp.full(V.shape, np.nan, dtype=dtype)
    U = smalltc.operator_action(qfunc, b, g, _data_arg(qfunc, d, q), v, out=out,
                                backend=backend)
    assert U is out and rel_err(U, ref) <= _tol(dtype, p)
    if qfunc == "diffusion":
        U2 = smalltc.diffusion_action(b, g, q, v, backend=backend)
        assert np.array_equal(to_numpy(U2), to_numpy(U))
    # assembly: the oracle's matrices, and K @ V == U
    n = (p + 1) ** dim
    K_ref = oracle.operator_matrices(qfunc, B1d, G1d, D, Q, dim)
    Kout = xp.full((E, n, n), np.nan, dtype=dtype)
    K = smalltc.assemble_operator(qfunc, b, g, _data_arg(qfunc, d, q), out=Kout,
                                  backend=backend)
    assert K is Kout and rel_err(K, K_ref) <= _tol(dtype, p)
    KV = np.einsum("eij,ecj->eci", to_numpy(K).astype(np.float64), V.reshape(E, -1, n))
    assert rel_err(U, KV.reshape(V.shape)) <= _tol(dtype, p)


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fused_apply_and_diagonal(xp_name, backend, case):
    _skip_non_core(backend, case)
    qfunc, co, dim, p, nq, dtype, ncomp = case
    xp = xp_of(xp_name)
    B1d, G1d, D, Q, space = _data(case, seed=1)
    rng = np.random.default_rng(3)
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(np.int64 if p % 2 else np.int32)
    x = rng.standard_normal((ncomp, space.ndofs) if ncomp > 1 else (space.ndofs,))
    x = x.astype(dtype).astype(np.float64)
    ref = oracle.operator_apply(qfunc, B1d, G1d, D, Q, x, m, dim)
    b, g, d, q, xx, mm = _on(xp, dtype, B1d, G1d, D, Q, x, m)
    for det in (False, True):
        out = xp.full(x.shape, np.nan, dtype=dtype)
        y = smalltc.operator_apply(qfunc, b, g, _data_arg(qfunc, d, q), xx, mm, out=out,
                                   deterministic=det, backend=backend)
        assert y is out and rel_err(y, ref) <= _tol(dtype, p)
    d_ref = oracle.operator_diagonal(qfunc, B1d, G1d, D, Q, m, space.ndofs, dim)
    out = xp.full((space.ndofs,), np.nan, dtype=dtype)
    diag = smalltc.operator_diagonal(qfunc, b, g, _data_arg(qfunc, d, q), mm, space.ndofs,
                                     out=out, backend=backend)
    assert diag is out and rel_err(diag, d_ref) <= _tol(dtype, p)
    if qfunc == "diffusion":
        y2 = smalltc.diffusion_apply(b, g, q, xx, mm, backend=backend)
        assert rel_err(y2, ref) <= _tol(dtype, p)
        d2 = smalltc.diffusion_diagonal(b, g, q, mm, space.ndofs, backend=backend)
        assert rel_err(d2, d_ref) <= _tol(dtype, p)


def test_mass_is_one_instance():
    """``operator_*("mass", ...)`` is the mass functions: the same results and plans."""
    rng = np.random.default_rng(0)
    B1d, D = rng.random((4, 3)), rng.random((6, 4, 4)) + 0.5
    V = rng.random((6, 3, 3))
    assert np.array_equal(smalltc.operator_action("mass", B1d, None, D, V),
                          smalltc.batched_contract(B1d, D, V))
    assert np.array_equal(smalltc.assemble_operator("mass", B1d, None, D),
                          smalltc.assemble_mass(B1d, D))
    space = H1Space(box_mesh(2, 3), 2)
    x, m = rng.random(space.ndofs), space.dof_map()
    D = rng.random((space.nelements, 4, 4)) + 0.5
    assert np.array_equal(smalltc.operator_apply("mass", B1d, None, D, x, m),
                          smalltc.mass_apply(B1d, D, x, m))
    assert np.array_equal(smalltc.operator_diagonal("mass", B1d, None, D, m, space.ndofs),
                          smalltc.mass_diagonal(B1d, D, m, space.ndofs))


def test_keys_names_and_operands():
    """Mass keys as they always were; the other instances' own keys and names."""
    m = ActionSpec(dim=3, nq=5, nd=4, batch=10, dtype="float64")
    assert m.size_key == "action/3d/nd4nq5c1" and "qfunc" not in m.as_dict()
    assert m.kernel_key() == ("action", 3, 5, 4, "float64", 1)
    d = ActionSpec(dim=3, nq=6, nd=5, batch=10, dtype="float64", qfunc="diffusion")
    assert d.size_key == "diffusion/action/3d/nd5nq6c1"
    assert str(d) == "diffusion_action_3d p=4 nq=6 E=10 float64"
    assert d.kernel_key()[-1] == ("qfunc", "diffusion")
    co = MassApplySpec(dim=3, nq=5, nd=5, batch=8, dtype="float64", ndofs=100,
                       qfunc="diffusion", collocated=True)
    assert co.size_key == "diffusion/mass_apply/3d/nd5nq5c1+co"
    assert [o.name for o in co.inputs] == ["G1d", "Q", "x", "elem_dofs"]
    h = MassDiagonalSpec(dim=2, nq=4, nd=3, batch=8, dtype="float32", ndofs=50,
                         qfunc="helmholtz")
    assert [(o.name, o.shape) for o in h.inputs] == [
        ("B1d", (4, 3)), ("G1d", (4, 3)), ("D", (8, 4, 4)), ("Q", (8, 3, 4, 4)),
        ("elem_dofs", (8, 3, 3))]
    assert str(h).startswith("helmholtz_diagonal_2d p=2 nq=4")
    a = AssemblySpec(dim=1, nq=3, nd=3, batch=2, dtype="float64", qfunc="diffusion",
                     collocated=True)
    from smalltc.spec import spec_from_dict
    assert spec_from_dict(a.as_dict()) == a and a.size_key == "diffusion/assembly/1d/nd3nq3+co"


@pytest.mark.parametrize("kwargs,match", [
    (dict(qfunc="stokes"), r"qfunc must be one of \('mass', 'diffusion', 'helmholtz'\)"),
    (dict(qfunc="mass", collocated=True), r"collocated=True is for qfunc 'diffusion'"),
    (dict(qfunc="diffusion", collocated=True, nq=5), r"collocated=True needs nq == nd"),
])
def test_spec_errors(kwargs, match):
    args = dict(dim=2, nq=4, nd=4, batch=3, dtype="float64")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ActionSpec(**args)


def _err_args():
    rng = np.random.default_rng(0)
    B, G = rng.random((4, 3)), rng.random((4, 3))
    Q, D = rng.random((5, 3, 4, 4)), rng.random((5, 4, 4))
    V = rng.random((5, 3, 3))
    return B, G, Q, D, V


_M = np.zeros((5, 3, 3), dtype=np.int32)
ERRORS = [
    (lambda B, G, Q, D, V: smalltc.operator_action("stokes", B, G, Q, V), ValueError,
     r"qfunc must be one of"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B, None, Q, V), ValueError,
     r"G1d is None; qfunc 'diffusion' needs the 1D derivative matrix G1d"),
    (lambda B, G, Q, D, V: smalltc.operator_action("mass", B, G, D, V), ValueError,
     r"G1d is for qfunc 'diffusion' or 'helmholtz'; the mass operator takes G1d=None"),
    (lambda B, G, Q, D, V: smalltc.operator_action("mass", None, None, D, V), ValueError,
     r"B1d is None, but the mass operator has no collocated form"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(None, G, Q, V), ValueError,
     r"B1d is None \(the collocated form\) but G1d has shape \(4, 3\): collocated needs "
     r"nq == nd"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B[:3], G, Q, V), ValueError,
     r"B1d has shape \(3, 3\), expected \(4, 3\) \(G1d's shape"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B, G, Q[:, :2], V), ValueError,
     r"Q has shape \(5, 2, 4, 4\), expected \(E, nsym, nq, ...\)"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B, G, Q[..., :3], V), ValueError,
     r"Q has shape \(5, 3, 4, 3\), expected \(5, 3, 4, 4\) for nq=4, dim=2"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B, G, Q, V[:4]), ValueError,
     r"V has shape \(4, 3, 3\), expected \(5, 3, 3\)"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B, G, Q, V[..., None]), ValueError,
     r"V has shape \(5, 3, 3, 1\), expected \(5, 3, 3, 3\)"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B, G.astype(np.float32), Q, V), TypeError,
     r"mixed dtypes \(.*G1d is float32"),
    (lambda B, G, Q, D, V: smalltc.operator_action("helmholtz", B, G, Q, V), TypeError,
     r"data for qfunc 'helmholtz' is the pair \(D, Q\)"),
    (lambda B, G, Q, D, V: smalltc.operator_action("diffusion", B, G, (D, Q), V), TypeError,
     r"data for qfunc 'diffusion' is one array Q"),
    (lambda B, G, Q, D, V: smalltc.operator_action("helmholtz", B, G, (D[:2], Q), V),
     ValueError, r"D has shape \(2, 4, 4\), expected \(5, 4, 4\)"),
    (lambda B, G, Q, D, V: smalltc.diffusion_apply(B, G, Q, np.zeros(20), _M[:, :2]),
     ValueError, r"elem_dofs has shape \(5, 2, 3\), expected \(5, 3, 3\) .*E from Q"),
    (lambda B, G, Q, D, V: smalltc.diffusion_apply(B, G, Q, np.zeros((1, 1, 20)), _M),
     ValueError, r"x has shape \(1, 1, 20\), expected \(ndofs,\)"),
    (lambda B, G, Q, D, V: smalltc.diffusion_apply(B, G, Q, np.zeros(20), _M.astype(float)),
     TypeError, r"elem_dofs has dtype float64, expected int32 or int64"),
    (lambda B, G, Q, D, V: smalltc.diffusion_apply(B, G, Q, np.zeros(20), _M + 20),
     ValueError, r"elem_dofs holds indices 20..20, outside \[0, 20\)"),
    (lambda B, G, Q, D, V: smalltc.diffusion_diagonal(B, G, Q, _M, 0), ValueError,
     r"ndofs must be a positive integer"),
    (lambda B, G, Q, D, V: smalltc.diffusion_action(B, G, Q, V, out=np.empty((5, 3))),
     ValueError, r"out has shape \(5, 3\), expected \(5, 3, 3\)"),
    (lambda B, G, Q, D, V: smalltc.assemble_diffusion(B, G, Q, out=np.empty((5, 9, 9),
                                                                          np.float32)),
     TypeError, r"out has dtype float32, expected float64"),
    (lambda B, G, Q, D, V: smalltc.plan("diffusion_apply", B, G), TypeError,
     r"op 'diffusion_apply' takes B1d \(or None\), G1d, Q"),
    (lambda B, G, Q, D, V: smalltc.plan("diffusion_action", B, G, Q, V, method="pairwise"),
     ValueError, r"method='pairwise' runs the mass action and assembly only"),
    (lambda B, G, Q, D, V: smalltc.plan("diffusion_action", B, G, Q, V)(B, G, Q), TypeError,
     r"this plan takes 4 operands \(B1d, G1d, Q, V\), got 3"),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_name_the_operand(i):
    fn, exc, match = ERRORS[i]
    with pytest.raises(exc, match=match):
        fn(*_err_args())


def test_plan_of_the_collocated_form_is_called_with_or_without_b1d():
    rng = np.random.default_rng(0)
    G, Q, V = rng.random((3, 3)), rng.random((4, 3, 3, 3)), rng.random((4, 3, 3))
    p = smalltc.plan("diffusion_action", None, G, Q, V)
    assert p.spec.collocated and [o.name for o in p.spec.inputs] == ["G1d", "Q", "V"]
    assert np.array_equal(p(None, G, Q, V), p(G, Q, V))


def test_an_instance_without_a_kernel_falls_back_and_says_so(caplog):
    """A compiled backend without a kernel for an instance (here: a Helmholtz assembly
    beyond every CPU kernel's sizes) runs the reference einsum path and says so:
    ``specialized == False``, the kernel's name and a log line."""
    rng = np.random.default_rng(0)
    nd = 15
    B, G = rng.random((nd, nd)), rng.random((nd, nd))
    Q, D = rng.random((2, 1, nd)), rng.random((2, nd))
    with caplog.at_level(logging.WARNING, logger="smalltc"):
        p = smalltc.plan("helmholtz_assembly", B, G, D, Q)
    if p.backend != "reference":
        assert not p.specialized and "no cpu kernel for this instance" in p.kernel
        assert any("no size-specialised" in r.getMessage() for r in caplog.records)
    ref = oracle.operator_matrices("helmholtz", B, G, D, Q, 1)
    assert rel_err(p(B, G, D, Q), ref) <= 1e-12


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
def test_cupy_arrays_run_every_instance():
    cp = xp_of("cupy")
    case = ("diffusion", True, 3, 3, 4, "float64", 1)
    B1d, G1d, D, Q, space = _data(case)
    x = np.random.default_rng(0).standard_normal(space.ndofs)
    ref = oracle.operator_apply("diffusion", None, G1d, None, Q, x, space.elem_dofs, 3)
    y = smalltc.diffusion_apply(None, cp.asarray(G1d), cp.asarray(Q), cp.asarray(x),
                                cp.asarray(space.elem_dofs))
    assert isinstance(y, cp.ndarray) and rel_err(y, ref) <= 1e-12


@pytest.mark.parametrize("xp_name", ["numpy", pytest.param("cupy", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="no CUDA device")])])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_dense_gemm_assembly_matches_the_oracle(xp_name, case):
    """The compiled backends' fallback assembly for low orders (one GEMM of Q with the
    dense gradients' products), every case of the table."""
    from smalltc.backends.reference import operator_assembly_gemm
    qfunc, co, dim, p, nq, dtype, ncomp = case
    xp = xp_of(xp_name)
    B1d, G1d, D, Q, space = _data(case)
    K_ref = oracle.operator_matrices(qfunc, B1d, G1d, D, Q, dim)
    b, g, d, q = _on(xp, dtype, B1d, G1d, D, Q)
    K = operator_assembly_gemm(qfunc, b, g, d, q, dim)
    assert K.dtype == np.dtype(dtype) and rel_err(K, K_ref) <= _tol(dtype, p)
