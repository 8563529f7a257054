"""The operation tables: every case against a float64 einsum oracle.

Each case runs on every available backend, with NumPy arrays and (when a
GPU answers) CuPy arrays, for both methods. Outputs are poisoned with NaN
first, so an unwritten entry fails. Compiled backends run a representative
subset by default (compiles are the cost); ``SMALLTC_TEST_FULL=1`` runs the
whole table on them too.
"""

import numpy as np
import pytest

import smalltc

import oracle
from conftest import FULL, TOL, backend_params, rel_err, to_numpy, xp_of


BACKENDS = backend_params()
METHODS = ["fused", "pairwise"]

# (dim, p, nq, dtype, ncomp, core): core cases also run on compiled backends
# by default; the rest only with SMALLTC_TEST_FULL=1 (and always on reference).
# The core set bounds cold-cache compile time (one kernel per case on the CPU):
# every p in 3D float64, a spread of p in 1D/2D, float32 at a few p.
_SPREAD = (1, 3, 8)
ACTION_CASES = []
for dim in (1, 2, 3):
    for p in range(1, 9):
        for nq in (p + 1, p + 2, p + 3):
            for dtype in ("float64", "float32"):
                core = nq == p + 2 and (dim == 3 or p in _SPREAD) and (
                    dtype == "float64" or p in (1, 4, 8) and (dim == 3 or p != 4))
                ACTION_CASES.append((dim, p, nq, dtype, 1, core))
                if nq == p + 2:
                    ACTION_CASES.append((dim, p, nq, dtype, 3, core and p in (1, 3, 8)))
for p in (12, 16):
    for nq in (p + 1, p + 2):
        for dtype in ("float64", "float32"):
            ACTION_CASES.append((3, p, nq, dtype, 1, nq == p + 2 and dtype == "float64"))

ASSEMBLY_CASES = []
for dim in (1, 2, 3):
    for p in range(1, 9 if dim < 3 else 7):
        for nq in (p + 1, p + 2, p + 3):
            for dtype in ("float64", "float32"):
                ASSEMBLY_CASES.append((dim, p, nq, dtype, nq == p + 2 and (
                    (dtype == "float64" and (dim == 3 or p in (1, 5, 8))) or p == 3)))


def _ids(c):
    dim, p, nq, dtype, *rest = c
    comp = f"-c{rest[0]}" if len(rest) == 2 and rest[0] != 1 else ""
    return f"{dim}d-p{p}-nq{nq}-{dtype[-2:]}{comp}"


def _skip_noncore(backend, core):
    if backend != "reference" and not core and not FULL:
        pytest.skip("non-core case on a compiled backend (set SMALLTC_TEST_FULL=1)")


def _inputs(xp, rng, dtype, *shapes):
    return [xp.asarray(rng.standard_normal(s).astype(dtype)) for s in shapes]


E = 13   # odd, so chunked kernels see a remainder


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", ACTION_CASES, ids=_ids)
def test_action(case, method, xp_name, backend):
    dim, p, nq, dtype, ncomp, core = case
    _skip_noncore(backend, core)
    xp, nd = xp_of(xp_name), p + 1
    rng = np.random.default_rng(hash(case) % 2**32)
    comp = (ncomp,) if ncomp != 1 else ()
    B1d, D, V = _inputs(xp, rng, dtype, (nq, nd), (E,) + (nq,) * dim, (E,) + comp + (nd,) * dim)
    out = xp.full(V.shape, np.nan, dtype=dtype)
    U = smalltc.batched_contract(B1d, D, V, out=out, backend=backend, method=method)
    assert U is out
    ref = oracle.action(to_numpy(B1d), to_numpy(D), to_numpy(V))
    assert rel_err(U, ref) <= TOL[dtype]


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", ASSEMBLY_CASES, ids=_ids)
def test_assembly(case, method, xp_name, backend):
    dim, p, nq, dtype, core = case
    _skip_noncore(backend, core)
    xp, nd = xp_of(xp_name), p + 1
    rng = np.random.default_rng(hash(case) % 2**32)
    B1d, D = _inputs(xp, rng, dtype, (nq, nd), (E,) + (nq,) * dim)
    out = xp.full((E, nd ** dim, nd ** dim), np.nan, dtype=dtype)
    M = smalltc.assemble_mass(B1d, D, out=out, backend=backend, method=method)
    ref = oracle.assembly(to_numpy(B1d), to_numpy(D))
    assert rel_err(M, ref) <= TOL[dtype]


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("dim,p,nq", [(1, 3, 5), (2, 2, 3), (2, 4, 6), (3, 1, 2), (3, 3, 5)])
def test_assembly_consistent_with_action(dim, p, nq, xp_name, backend):
    """Invariant of docs/math.md section 2: M @ V == batched_contract(B1d, D, V), for any V."""
    xp, nd = xp_of(xp_name), p + 1
    rng = np.random.default_rng(7)
    B1d, D, V = _inputs(xp, rng, "float64", (nq, nd), (E,) + (nq,) * dim, (E,) + (nd,) * dim)
    M = smalltc.assemble_mass(B1d, D, backend=backend)
    U = smalltc.batched_contract(B1d, D, V, backend=backend)
    MV = xp.matmul(M, V.reshape(E, -1, 1)).reshape(U.shape)
    assert rel_err(MV, to_numpy(U)) <= 1e-12


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("dim,p", [(1, 4), (2, 3), (3, 2), (3, 4)])
def test_mass_matrix_spd_and_volume(dim, p, xp_name, backend):
    """Positive D and a partition-of-unity basis: M symmetric positive definite,
    entries summing to the element volume (the sum of D)."""
    xp, nd, nq = xp_of(xp_name), p + 1, p + 2
    rng = np.random.default_rng(3)
    B = rng.random((nq, nd)) + 0.1
    B /= B.sum(axis=1, keepdims=True)               # sum_i B[k, i] = 1
    D = rng.random((E,) + (nq,) * dim) + 0.5
    M = to_numpy(smalltc.assemble_mass(xp.asarray(B), xp.asarray(D), backend=backend))
    assert np.allclose(M, np.swapaxes(M, 1, 2), rtol=1e-13, atol=1e-15)
    assert (np.linalg.eigvalsh(M) > 0).all()
    vol = D.reshape(E, -1).sum(axis=1)
    assert np.allclose(M.sum(axis=(1, 2)), vol, rtol=1e-12)


GEMM_CASES = [  # (m, n, k, trans_a, trans_b, shared, beta, dtype); core: n in (5, 33) and the extras
    (n, n, n, ta, tb, sh, beta, dt)
    for n in (2, 5, 8, 16, 33)
    for ta in (False, True) for tb in (False, True)
    for sh, beta, dt in (("none", 0.0, "float64"), ("A", 0.5, "float64"),
                         ("B", 0.0, "float32"))
] + [(3, 7, 4, False, False, "none", 1.0, "float64"), (9, 2, 5, True, False, "B", 0.0, "float64"),
     (1, 1, 1, False, True, "A", 2.0, "float32"), (24, 6, 17, False, True, "none", 0.0, "float64"),
     (2, 2, 2, False, False, "none", 0.0, "float64"), (16, 16, 16, True, True, "B", 1.0, "float64"),
     (8, 8, 8, False, True, "A", 0.0, "float32")]


def _gemm_core(case):
    m, n, k, ta, tb, shared, beta, dtype = case
    return not (m == n == k and n in (2, 8, 16)) or case in GEMM_CASES[-3:]


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: "m{}n{}k{}-{}{}-sh{}-b{}-{}".format(
    c[0], c[1], c[2], "T" if c[3] else "N", "T" if c[4] else "N", c[5], c[6], c[7][-2:]))
def test_gemm(case, xp_name, backend):
    m, n, k, ta, tb, shared, beta, dtype = case
    _skip_noncore(backend, _gemm_core(case))
    xp, batch = xp_of(xp_name), 11
    rng = np.random.default_rng(5)
    a_core = (k, m) if ta else (m, k)
    b_core = (n, k) if tb else (k, n)
    A, B, C = _inputs(xp, rng, dtype, a_core if shared == "A" else (batch,) + a_core,
                      b_core if shared == "B" else (batch,) + b_core, (batch, m, n))
    out = xp.full((batch, m, n), np.nan, dtype=dtype)
    r = smalltc.batched_gemm(A, B, C if beta else None, alpha=1.5, beta=beta, trans_a=ta,
                             trans_b=tb, out=out, backend=backend)
    ref = oracle.gemm(to_numpy(A), to_numpy(B), to_numpy(C), 1.5, beta, ta, tb)
    assert rel_err(r, ref) <= TOL[dtype]


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
def test_gemm_in_place_update_and_nan_c_unread(xp_name, backend):
    xp = xp_of(xp_name)
    rng = np.random.default_rng(1)
    A, B, C = _inputs(xp, rng, "float64", (6, 4, 3), (6, 3, 5), (6, 4, 5))
    ref = oracle.gemm(to_numpy(A), to_numpy(B), to_numpy(C), 2.0, -1.0, False, False)
    r = smalltc.batched_gemm(A, B, C, alpha=2.0, beta=-1.0, out=C, backend=backend)
    assert r is C and rel_err(C, ref) <= 1e-12
    Cnan = xp.full((6, 4, 5), np.nan)                 # beta == 0: C must not be read
    r = smalltc.batched_gemm(A, B, Cnan, beta=0.0, backend=backend)
    assert rel_err(r, oracle.gemm(to_numpy(A), to_numpy(B), None, 1.0, 0, False, False)) <= 1e-12


CONTRACT_CASES = [  # (kind, i, s, j, k, l, shared_x, shared_y, dtype)
    ("8a", 4, 3, 1, 5, 1, False, True, "float64"),
    ("8a", 5, 3, 1, 1, 25, True, False, "float64"),
    ("8a", 1, 6, 4, 1, 16, True, False, "float32"),
    ("8a", 3, 2, 5, 4, 3, False, False, "float64"),
    ("8b", 3, 3, 4, 4, 1, False, True, "float64"),
    ("8b", 5, 5, 3, 1, 3, False, True, "float32"),
    ("8b", 2, 3, 4, 5, 6, False, False, "float64"),
    ("9", 3, 4, 3, 1, 4, True, False, "float64"),
    ("9", 4, 5, 4, 4, 20, True, False, "float64"),
    ("9", 2, 3, 2, 4, 4, True, False, "float32"),
]


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("case", CONTRACT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_contract(case, xp_name, backend):
    kind, i, s, j, k, l, sx, sy, dtype = case
    xp, batch = xp_of(xp_name), 9
    rng = np.random.default_rng(11)
    xs = (s, i) if kind == "9" else (i, s, j)
    X, Y = _inputs(xp, rng, dtype, xs if sx else (batch,) + xs, (k, s, l) if sy else (batch, k, s, l))
    A = smalltc.contract(kind, X, Y, backend=backend)
    assert rel_err(A, oracle.contract(kind, to_numpy(X), to_numpy(Y))) <= TOL[dtype]
    # the same through explicit extents on flat storage
    flat = smalltc.contract(kind, X.reshape(-1), Y.reshape(-1) if not sy else Y,
                            extents=dict(i=i, s=s, j=j, k=k, l=l), backend=backend)
    assert rel_err(flat, to_numpy(A)) <= TOL[dtype] if not sx else True


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_noncontiguous_inputs_same_answer(method, xp_name, backend):
    xp = xp_of(xp_name)
    rng = np.random.default_rng(2)
    B1d, D, V = _inputs(xp, rng, "float64", (6, 4), (8, 6, 6, 6), (8, 4, 4, 4))
    U = smalltc.batched_contract(B1d, D, V, backend=backend, method=method)
    Bt = xp.asfortranarray(B1d)
    D2 = xp.stack([D, D], axis=1)[:, 0]                # strided batch
    V2 = xp.ascontiguousarray(xp.swapaxes(V, 1, 3)).swapaxes(1, 3)
    assert not D2.flags.c_contiguous and not V2.flags.c_contiguous
    U2 = smalltc.batched_contract(Bt, D2, V2, backend=backend, method=method)
    assert rel_err(U2, to_numpy(U)) == 0.0 or rel_err(U2, to_numpy(U)) <= 1e-14


STRIDED = [  # (operand shapes, the call): every operation with strided operands (sizes
    # whose kernels the tables above compile already)
    ([(8, 3, 4), (8, 4, 7), (8, 3, 7)],
     lambda A, B, C, **kw: smalltc.batched_gemm(A, B, C, alpha=0.5, beta=2.0, **kw)),
    ([(5, 4), (8, 5)], lambda B1d, D, **kw: smalltc.assemble_mass(B1d, D, **kw)),
    ([(8, 3, 4, 2), (5, 4, 3)], lambda X, Y, **kw: smalltc.contract("8b", X, Y, **kw)),
    ([(4, 3), (8, 3, 4, 2)], lambda X, Y, **kw: smalltc.contract("9", X, Y, **kw)),
]


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
@pytest.mark.parametrize("shapes,call", STRIDED, ids=["gemm", "assembly", "8b", "9"])
def test_noncontiguous_operands_every_operation(shapes, call, xp_name, backend):
    """Each operand in turn a view that is not C-contiguous (a transposed copy seen
    through its transpose): copied by the call, the same answer."""
    xp = xp_of(xp_name)
    ops = _inputs(xp, np.random.default_rng(4), "float64", *shapes)
    want = to_numpy(call(*ops, backend=backend))
    for i, x in enumerate(ops):
        view = xp.ascontiguousarray(x.T).T
        assert not view.flags.c_contiguous
        got = call(*ops[:i], view, *ops[i + 1:], backend=backend)
        assert rel_err(got, want) <= 1e-15


@pytest.mark.parametrize("xp_name,backend", BACKENDS)
def test_empty_batch(xp_name, backend):
    xp = xp_of(xp_name)
    B1d = xp.ones((3, 2))
    U = smalltc.batched_contract(B1d, xp.ones((0, 3, 3)), xp.ones((0, 2, 2)), backend=backend)
    assert U.shape == (0, 2, 2)
    M = smalltc.assemble_mass(B1d, xp.ones((0, 3, 3, 3)), backend=backend)
    assert M.shape == (0, 8, 8)
    G = smalltc.batched_gemm(xp.ones((0, 2, 3)), xp.ones((3, 4)), backend=backend)
    assert G.shape == (0, 2, 4)
