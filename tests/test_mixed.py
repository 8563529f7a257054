"""The general operator of mixed spaces (docs/math.md section 7), ``smalltc.mixed_action``
and ``smalltc.mixed_apply``: against a dense float64 oracle (Kronecker products of the 1D
matrices, independent of the sum-factorised code) with the output poisoned with NaN first,
for every pair of evaluations, 1D-3D, one and three components a side; the identities with
the specialised instances (mass, diffusion, the corner force and its transpose, fused and
not); the transpose identity; constants in the kernel of a gradient input; the general path
reported as such; errors naming the operand. GPU cases skip without a CUDA device.
"""
import itertools
import logging
from functools import reduce

import numpy as np
import pytest

import smalltc
from smalltc import _validate, fem
from smalltc._arrays import cupy_or_none, gpu_available
from smalltc.backends.reference import sym_index
from smalltc.plan import build_plan

from conftest import TOL, array_modules, rel_err, xp_of

EVALS = ("value", "grad", "both")
E = 3

# (dim, nd_in, nd_out, nq): in and out bases of different sizes
SIZES = {1: (3, 2, 4), 2: (2, 3, 4), 3: (3, 2, 3)}
# every pair of evaluations, 1D-3D, with (ncomp_in, ncomp_out) in {1, 3}^2
CASES = [(dim, ei, eo, ci, co) for dim in (1, 2, 3)
         for ei, eo in itertools.product(EVALS, EVALS)
         for ci, co in ((1, 1), (3, 1), (1, 3), (3, 3))]


def nper(ev, dim):
    return (ev != "grad") + (dim if ev != "value" else 0)


def operands(dim, ei, eo, ci, co, dtype="float64", seed=0, E=E):
    """Random bases (any matrices: the operator is exact for all), Q and V."""
    nd_in, nd_out, nq = SIZES[dim]
    rng = np.random.default_rng(seed)
    Bi, Gi = rng.standard_normal((2, nq, nd_in))
    Bo, Go = rng.standard_normal((2, nq, nd_out))
    Q = rng.standard_normal((E, co * nper(eo, dim), ci * nper(ei, dim)) + (nq,) * dim)
    V = rng.standard_normal((E, ci) + (nd_in,) * dim)
    return tuple(x.astype(dtype) for x in (Bi, Gi, Bo, Go, Q, V))


def dense_evals(B, G, ev, dim):
    """The dense evaluation matrices (nq^d x nd^d) of one side, in slot order."""
    B, G = np.asarray(B, np.float64), np.asarray(G, np.float64)
    mats = [reduce(np.kron, [B] * dim)] if ev != "grad" else []
    if ev != "value":
        mats += [reduce(np.kron, [G if d == a else B for d in range(dim)]) for a in range(dim)]
    return mats


def oracle(Bi, Gi, Bo, Go, Q, V, ei, eo):
    """``U[e, c', :] = sum_j' Eout_j'^T (sum_s Q[e, c' nper + j', s] X[e, s])``, float64,
    ``X[e, c nper + j] = Ein_j V[e, c]``; U (E, ncomp_out, nd_out^dim) flattened."""
    dim = Q.ndim - 3
    Ein, Eout = dense_evals(Bi, Gi, ei, dim), dense_evals(Bo, Go, eo, dim)
    E_, R, S = Q.shape[:3]
    Qf = np.asarray(Q, np.float64).reshape(E_, R, S, -1)
    Vf = np.asarray(V, np.float64).reshape(E_, S // len(Ein), -1)
    X = np.stack([Vf[:, c] @ M.T for c in range(Vf.shape[1]) for M in Ein], axis=1)
    H = np.einsum("ersk,esk->erk", Qf, X)
    co = R // len(Eout)
    return np.stack([sum(H[:, c * len(Eout) + j] @ M for j, M in enumerate(Eout))
                     for c in range(co)], axis=1)


def kw(Gi, Go, ei, eo):
    return dict(G_in=Gi if ei != "value" else None, G_out=Go if eo != "value" else None,
                eval_in=ei, eval_out=eo)


def out_shape(E_, co, nd, dim):
    return (E_,) + ((co,) if co > 1 else ()) + (nd,) * dim


@pytest.mark.parametrize("dim,ei,eo,ci,co", CASES)
def test_action_against_dense(dim, ei, eo, ci, co):
    Bi, Gi, Bo, Go, Q, V = operands(dim, ei, eo, ci, co)
    out = np.full(out_shape(E, co, Bo.shape[1], dim), np.nan)
    U = smalltc.mixed_action(Bi, Bo, Q, V if ci > 1 else V[:, 0], out=out,
                             **kw(Gi, Go, ei, eo))
    assert U is out
    assert rel_err(U.reshape(E, co, -1), oracle(Bi, Gi, Bo, Go, Q, V, ei, eo)) < TOL["float64"]


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dim,ei,eo", [(1, "both", "grad"), (2, "grad", "both"),
                                       (3, "both", "both"), (3, "value", "grad")])
def test_action_dtypes_and_modules(xp_name, dtype, dim, ei, eo):
    xp = xp_of(xp_name)
    ops = operands(dim, ei, eo, 3, 3, dtype=dtype, seed=1)
    Bi, Gi, Bo, Go, Q, V = (xp.asarray(x) for x in ops)
    out = xp.full(out_shape(E, 3, Bo.shape[1], dim), xp.nan, dtype=dtype)
    U = smalltc.mixed_action(Bi, Bo, Q, V, out=out, **kw(Gi, Go, ei, eo))
    assert U is out and U.dtype == np.dtype(dtype)
    assert rel_err(U.reshape(E, 3, -1), oracle(*ops, ei, eo)) < TOL[dtype]


def test_element_blocks():
    """More elements than one block of the host path (the last block partial)."""
    from smalltc.backends.reference import MIXED_BLOCK_VALUES
    Bi, Gi, Bo, Go, Q, V = operands(3, "both", "grad", 3, 3, E=250, seed=12)
    assert 250 > MIXED_BLOCK_VALUES["numpy"] // (Q[0, 0, 0].size * max(Q.shape[1:3])) > 60
    out = np.full((250, 3) + (Bo.shape[1],) * 3, np.nan)
    U = smalltc.mixed_action(Bi, Bo, Q, V, out=out, **kw(Gi, Go, "both", "grad"))
    assert rel_err(U.reshape(250, 3, -1), oracle(Bi, Gi, Bo, Go, Q, V, "both", "grad")) < 1e-12


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("dim,ei,eo,ci,co", [(1, "value", "grad", 1, 3),
                                             (2, "both", "value", 3, 1),
                                             (3, "grad", "grad", 3, 3),
                                             (2, "value", "both", 1, 1)])
@pytest.mark.parametrize("side", ["in", "out", "both"])
def test_apply_against_dense(xp_name, dim, ei, eo, ci, co, side):
    """Global vectors through the maps (either side or both), against the gathered and
    scattered dense oracle."""
    xp = xp_of(xp_name)
    Bi, Gi, Bo, Go, Q, V = operands(dim, ei, eo, ci, co, seed=2)
    nd_in, nd_out = Bi.shape[1], Bo.shape[1]
    rng = np.random.default_rng(3)
    n_in, n_out = 11, 7
    m_in = rng.integers(0, n_in, (E,) + (nd_in,) * dim).astype(np.int32)
    m_out = rng.integers(0, n_out, (E,) + (nd_out,) * dim).astype(np.int64)
    x = rng.standard_normal((ci, n_in))
    args = {}
    if side in ("in", "both"):
        field = x if ci > 1 else x[0]
        V = np.moveaxis(x[:, m_in], 0, 1)
        args["elem_dofs_in"] = xp.asarray(m_in)
    else:
        field = V
    ref = oracle(Bi, Gi, Bo, Go, Q, V, ei, eo)
    if side in ("out", "both"):
        args.update(elem_dofs_out=xp.asarray(m_out), ndofs_out=n_out)
        y_ref = np.stack([np.bincount(m_out.reshape(-1), ref[:, c].reshape(-1), n_out)
                          for c in range(co)])
        shape = (co, n_out) if co > 1 else (n_out,)
    else:
        y_ref, shape = ref, out_shape(E, co, nd_out, dim)
    out = xp.full(shape, xp.nan)
    y = smalltc.mixed_apply(*(xp.asarray(a) for a in (Bi, Bo, Q, field)), out=out,
                            **kw(xp.asarray(Gi), xp.asarray(Go), ei, eo), **args)
    assert y is out
    assert rel_err(y.reshape(y_ref.shape), y_ref) < TOL["float64"]


def test_apply_float32_and_ndofs_from_out():
    """float32 through both maps; ``ndofs_out`` read from ``out``; the plan reused."""
    Bi, Gi, Bo, Go, Q, V = operands(2, "grad", "both", 1, 3, dtype="float32", seed=14)
    rng = np.random.default_rng(15)
    m_in = rng.integers(0, 9, (E, 2, 2)).astype(np.int32)
    m_out = rng.integers(0, 6, (E, 3, 3)).astype(np.int32)
    x = rng.standard_normal(9).astype(np.float32)
    ref = oracle(Bi, Gi, Bo, Go, Q, x[m_in][:, None], "grad", "both")
    y_ref = np.stack([np.bincount(m_out.reshape(-1), ref[:, c].reshape(-1), 6)
                      for c in range(3)])
    for _ in range(2):
        out = np.full((3, 6), np.nan, np.float32)
        y = smalltc.mixed_apply(Bi, Bo, Q, x, out=out, elem_dofs_in=m_in, elem_dofs_out=m_out,
                                **kw(Gi, Go, "grad", "both"))
        assert y is out and rel_err(y, y_ref) < TOL["float32"]


def test_no_elements():
    """E = 0: an empty element result; a global output of zeros."""
    B = np.random.default_rng(17).random((3, 2))
    Q, m = np.zeros((0, 1, 1, 3, 3)), np.zeros((0, 2, 2), np.int64)
    y = smalltc.mixed_apply(B, B, Q, np.ones(4), elem_dofs_in=m, elem_dofs_out=m,
                            ndofs_out=4, out=np.full(4, np.nan))
    assert y.tolist() == [0.0] * 4
    assert smalltc.mixed_action(B, B, Q, np.ones((0, 2, 2))).shape == (0, 2, 2)


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("ncomp", [1, 3])
def test_mass_identity(dim, ncomp):
    """value/value, B_in = B_out, Q = D on the component diagonal: the mass action."""
    b = fem.basis_1d(3, 5)
    rng = np.random.default_rng(4)
    D = rng.random((E,) + (5,) * dim)
    V = rng.standard_normal((E, ncomp) + (4,) * dim)
    Q = np.zeros((E, ncomp, ncomp) + (5,) * dim)
    for c in range(ncomp):
        Q[:, c, c] = D
    U = smalltc.mixed_action(b.B1d, b.B1d, Q, V)
    ref = smalltc.operator_action("mass", b.B1d, None, D, V)
    assert rel_err(U.reshape(V.shape), ref) < TOL["float64"]


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_diffusion_identity(dim):
    """grad/grad with the symmetric Q: the diffusion action (element and fused)."""
    b = fem.basis_1d(2, 4)
    rng = np.random.default_rng(5)
    Qp = rng.standard_normal((E, dim * (dim + 1) // 2) + (4,) * dim)
    idx = sym_index(dim)
    Q = np.stack([np.stack([Qp[:, idx[a][bb]] for bb in range(dim)], 1) for a in range(dim)], 1)
    V = rng.standard_normal((E,) + (3,) * dim)
    g = dict(G_in=b.G1d, G_out=b.G1d, eval_in="grad", eval_out="grad")
    U = smalltc.mixed_action(b.B1d, b.B1d, Q, V, **g)
    assert rel_err(U, smalltc.operator_action("diffusion", b.B1d, b.G1d, Qp, V)) < 1e-12
    space = fem.H1Space(fem.box_mesh(dim, 2), p=2)
    Qp = rng.standard_normal((space.nelements,) + Qp.shape[1:])
    Q = np.stack([np.stack([Qp[:, idx[a][bb]] for bb in range(dim)], 1) for a in range(dim)], 1)
    x, m = rng.standard_normal(space.ndofs), space.dof_map()
    y = smalltc.mixed_apply(b.B1d, b.B1d, Q, x, elem_dofs_in=m, elem_dofs_out=m,
                            ndofs_out=space.ndofs, **g)
    assert rel_err(y, smalltc.operator_apply("diffusion", b.B1d, b.G1d, Qp, x, m)) < 1e-12


@pytest.mark.parametrize("dim", [2, 3])
def test_helmholtz_identity(dim):
    """both/both, Q[0, 0] = D, Q[1 + a, 1 + b] = Q^{ab}, zeros elsewhere: Helmholtz."""
    b = fem.basis_1d(2, 4)
    rng = np.random.default_rng(13)
    D = rng.random((E,) + (4,) * dim)
    Qp = rng.standard_normal((E, dim * (dim + 1) // 2) + (4,) * dim)
    idx = sym_index(dim)
    Q = np.zeros((E, 1 + dim, 1 + dim) + (4,) * dim)
    Q[:, 0, 0] = D
    for a in range(dim):
        for c in range(dim):
            Q[:, 1 + a, 1 + c] = Qp[:, idx[a][c]]
    V = rng.standard_normal((E,) + (3,) * dim)
    U = smalltc.mixed_action(b.B1d, b.B1d, Q, V, G_in=b.G1d, G_out=b.G1d, eval_in="both",
                             eval_out="both")
    ref = smalltc.operator_action("helmholtz", b.B1d, b.G1d, (D, Qp), V)
    assert rel_err(U, ref) < 1e-12


@pytest.mark.parametrize("dim,p", [(1, 2), (2, 2), (3, 2), (2, 3)])
def test_force_identity(dim, p):
    """``F``: value (L2) to grad (H1^d), Q[e, c d + a, 0] = A[e, c, a]; ``F^T``: grad (H1^d)
    to value (L2), Q[e, 0, c d + a] = A[e, c, a]; element level and through the map."""
    nq = 2 * p
    h1, l2 = fem.basis_1d(p, nq), fem.basis_1d(p - 1, nq)
    rng = np.random.default_rng(6)
    space = fem.H1Space(fem.box_mesh(dim, 2), p=p)
    En, m = space.nelements, space.dof_map()
    A = rng.standard_normal((En, dim, dim) + (nq,) * dim)
    e = rng.standard_normal((En,) + (p,) * dim)
    w = rng.standard_normal((En, dim) + (p + 1,) * dim)
    QF = A.reshape((En, dim * dim, 1) + (nq,) * dim)
    QT = A.reshape((En, 1, dim * dim) + (nq,) * dim)
    F = dict(G_out=h1.G1d, eval_out="grad")
    T = dict(G_in=h1.G1d, eval_in="grad")
    args = (l2.B1d, h1.B1d, h1.G1d, A)
    Fe = smalltc.mixed_action(l2.B1d, h1.B1d, QF, e, **F)
    ref = smalltc.force_apply(*args, e)
    assert rel_err(Fe.reshape(En, dim, -1), ref.reshape(En, dim, -1)) < 1e-12
    FTw = smalltc.mixed_action(h1.B1d, l2.B1d, QT, w, **T)
    assert rel_err(FTw, smalltc.force_apply_transpose(*args, w)) < 1e-12
    y = smalltc.mixed_apply(l2.B1d, h1.B1d, QF, e, elem_dofs_out=m, ndofs_out=space.ndofs, **F)
    ref = smalltc.force_apply(*args, e, elem_dofs=m, ndofs=space.ndofs)
    assert rel_err(y.reshape(ref.shape), ref) < 1e-12
    wg = rng.standard_normal((dim, space.ndofs))
    r = smalltc.mixed_apply(h1.B1d, l2.B1d, QT, wg if dim > 1 else wg[0], elem_dofs_in=m, **T)
    assert rel_err(r, smalltc.force_apply_transpose(*args, wg, elem_dofs=m)) < 1e-12


@pytest.mark.parametrize("dim,ei,eo,ci,co",
                         [c for c in CASES if c[3] != c[4] or c[1] != c[2]][::3])
def test_transpose_identity(dim, ei, eo, ci, co):
    """``W . A(Q) V == A(Q^T) W . V``, A(Q^T) with the bases, evaluations and slots
    swapped and Q's r and s transposed."""
    Bi, Gi, Bo, Go, Q, V = operands(dim, ei, eo, ci, co, seed=7)
    W = np.random.default_rng(8).standard_normal((E, co) + (Bo.shape[1],) * dim)
    AV = smalltc.mixed_action(Bi, Bo, Q, V, **kw(Gi, Go, ei, eo))
    ATW = smalltc.mixed_action(Bo, Bi, np.ascontiguousarray(np.swapaxes(Q, 1, 2)), W,
                               **kw(Go, Gi, eo, ei))
    lhs, rhs = np.vdot(W.reshape(-1), AV.reshape(-1)), np.vdot(ATW.reshape(-1), V.reshape(-1))
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + np.abs(W).sum() * np.abs(AV).max())


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_constants_in_kernel_of_grad_input(dim):
    """A constant field has no gradient: a grad input sees zero whatever Q and the output."""
    b, bo = fem.basis_1d(3, 5), fem.basis_1d(2, 5)
    rng = np.random.default_rng(9)
    Q = rng.standard_normal((E, 3 * (1 + dim), 2 * dim) + (5,) * dim)
    V = np.ones((E, 2) + (4,) * dim) * np.array([1.5, -2.0]).reshape(1, 2, *[1] * dim)
    U = smalltc.mixed_action(b.B1d, bo.B1d, Q, V, G_in=b.G1d, G_out=bo.G1d, eval_in="grad",
                             eval_out="both")
    assert U.shape == (E, 3) + (3,) * dim and float(abs(U).max()) < 1e-12


@pytest.mark.parametrize("ev,n", [("value", 3), ("grad", 8), ("both", 9)])
def test_sum_factorised_contraction_counts(monkeypatch, ev, n):
    """3D: one-axis contractions with shared partial sums, ``n`` forward and ``n`` back (one
    block of elements): 3 for values, 8 for gradients (as the diffusion kernels), 9 both."""
    from smalltc.backends import reference as R
    calls = {"fwd": 0, "back": 0}
    last, first = R._last_axis, R._first_axis

    def count(kind, f):
        def g(M, t):
            calls[kind] += 1
            return f(M, t)
        return g
    monkeypatch.setattr(R, "_last_axis", count("fwd", last))
    monkeypatch.setattr(R, "_first_axis", count("back", first))
    Bi, Gi, Bo, Go, Q, V = operands(3, ev, ev, 1, 1, seed=16)
    U = R.mixed_action_sumfac(Bi, Gi, Bo, Go, Q, V, 3, _evals(ev), _evals(ev), 1)
    assert calls == {"fwd": n, "back": n}
    assert rel_err(U.reshape(E, 1, -1), oracle(Bi, Gi, Bo, Go, Q, V, ev, ev)) < 1e-12


def _evals(ev, dim=3):
    return ((-1,) if ev != "grad" else ()) + (tuple(range(dim)) if ev != "value" else ())


def test_reported_as_general_path(caplog):
    """Every backend runs it as the general path: ``specialized=False`` and the log line."""
    rng = np.random.default_rng(10)          # sizes no other test plans (a log line once)
    Bi, Gi, Bo = rng.standard_normal((3, 7, 5))
    Q, V = rng.standard_normal((2, 1, 3, 7, 7)), rng.standard_normal((2, 5, 5))
    spec, xp, ops = _validate.mixed_spec(Bi, Bo, Q, V, G_in=Gi, eval_in="both")
    with caplog.at_level(logging.WARNING, logger="smalltc"):
        p = build_plan(spec, np)
    assert p.specialized is False and p.kernel.startswith("reference mixed: ")
    assert p.backend == "cpu" and "no size-specialised cpu kernel" in caplog.text
    ref = build_plan(spec, np, backend="reference")
    assert np.allclose(p(*ops), ref(*ops))
    assert "sum-factorised" in repr(p)


# --- errors name the operand ---------------------------------------------------------------

def _err_args():
    Bi, Gi, Bo, Go, Q, V = operands(2, "both", "grad", 1, 3, seed=11)
    return dict(B_in=Bi, B_out=Bo, Q=Q, V=V[:, 0], G_in=Gi, G_out=Go, eval_in="both",
                eval_out="grad")


def _call(**over):
    a = dict(_err_args(), **over)
    return smalltc.mixed_action(a.pop("B_in"), a.pop("B_out"), a.pop("Q"), a.pop("V"), **a)


@pytest.mark.parametrize("over,exc,match", [
    (dict(B_out=np.zeros((3, 3))), ValueError, r"B_out has shape \(3, 3\), expected \(nq, nd_out\) with nq=4"),
    (dict(B_in=np.zeros(4)), ValueError, r"B_in has shape \(4,\), expected \(nq, nd_in\)"),
    (dict(G_in=np.zeros((4, 3))), ValueError, r"G_in has shape \(4, 3\), expected \(4, 2\)"),
    (dict(Q=np.zeros((3, 6, 4, 4, 4))), ValueError, r"Q has shape \(3, 6, 4, 4, 4\): axis 2 \(input slots\) has 4 entries, expected a positive multiple of 3"),
    (dict(Q=np.zeros((3, 5, 3, 4, 4))), ValueError, r"Q has shape \(3, 5, 3, 4, 4\): axis 1 \(output slots\)"),
    (dict(Q=np.zeros((3, 6, 3, 4, 5))), ValueError, r"Q has shape \(3, 6, 3, 4, 5\), expected \(E, nslots_out"),
    (dict(V=np.zeros((3, 3, 3))), ValueError, r"V has shape \(3, 3, 3\), expected \(3, 2, 2\)"),
    (dict(V=np.zeros((3, 2, 2), np.float32)), TypeError, r"mixed dtypes \(.*V is float32"),
    (dict(V=np.zeros((3, 2, 2), np.int64)), TypeError, r"V has dtype int64"),
    (dict(eval_in="values"), ValueError, r"eval_in must be one of"),
    (dict(G_in=None), ValueError, r"eval_in='both' needs G_in"),
    (dict(eval_out="value"), ValueError, r"G_out is given but eval_out='value'"),
    (dict(out=np.zeros((3, 3, 3))), ValueError, r"out has shape \(3, 3, 3\), expected \(3, 3, 3, 3\)"),
])
def test_errors(over, exc, match):
    with pytest.raises(exc, match=match):
        _call(**over)


def test_map_errors():
    a = _err_args()
    base = (a["B_in"], a["B_out"], a["Q"])
    g = dict(G_in=a["G_in"], G_out=a["G_out"], eval_in="both", eval_out="grad")
    m_in = np.zeros((3, 2, 2), np.int32)
    m_out = np.zeros((3, 3, 3), np.int32)
    x = np.zeros(5)
    with pytest.raises(ValueError, match=r"elem_dofs_in has shape \(3, 3, 3\), expected \(3, 2, 2\)"):
        smalltc.mixed_apply(*base, x, elem_dofs_in=m_out, **g)
    with pytest.raises(TypeError, match=r"elem_dofs_out has dtype float64"):
        smalltc.mixed_apply(*base, a["V"], elem_dofs_out=m_out.astype(float), ndofs_out=4, **g)
    with pytest.raises(ValueError, match=r"ndofs_out must be a positive integer"):
        smalltc.mixed_apply(*base, a["V"], elem_dofs_out=m_out, **g)
    with pytest.raises(ValueError, match=r"ndofs_out is for a global output"):
        smalltc.mixed_apply(*base, a["V"], ndofs_out=4, **g)
    with pytest.raises(ValueError, match=r"x has shape \(2, 5\), expected \(ndofs_in,\)"):
        smalltc.mixed_apply(*base, np.zeros((2, 5)), elem_dofs_in=m_in, **g)
    bad = m_in.copy()
    bad[1, 0, 1] = 5
    with pytest.raises(ValueError, match=r"elem_dofs_in holds indices 0..5, outside \[0, 5\)"):
        smalltc.mixed_apply(*base, x, elem_dofs_in=bad, **g)
    bad[1, 0, 0] = -1                   # a negative index would wrap in NumPy: refused
    with pytest.raises(ValueError, match=r"elem_dofs_in holds indices -1..5"):
        smalltc.mixed_apply(*base, x, elem_dofs_in=bad, **g)
    good = m_out.copy()
    y = smalltc.mixed_apply(*base, x, elem_dofs_in=m_in, elem_dofs_out=good, ndofs_out=4, **g)
    assert y.shape == (3, 4)
    good[2, 1, 2] = 4                   # changed in place after a first use: still caught
    with pytest.raises(ValueError, match=r"elem_dofs_out holds indices 0..4, outside \[0, 4\) "
                                         r"for ndofs=4 \(y has"):
        smalltc.mixed_apply(*base, x, elem_dofs_in=m_in, elem_dofs_out=good, ndofs_out=4, **g)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
def test_mixed_array_modules():
    cp = cupy_or_none()
    a = _err_args()
    with pytest.raises(TypeError, match="cupy|numpy"):
        smalltc.mixed_action(a["B_in"], a["B_out"], a["Q"], cp.asarray(a["V"]),
                             G_in=a["G_in"], G_out=a["G_out"], eval_in="both", eval_out="grad")
