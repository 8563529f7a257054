"""The CPU backend's basis application (``smalltc.backends.cpu.basis``): what only it promises
beyond tests/test_evaluation.py (which runs every backend against the dense oracle): the
family's choice and its generic fallback, both forms (lanes of elements, one element at a
time) and their register blocks, float32 and int64 maps, full chunks and a partial one,
every map entry checked in the kernel, and the scatter's sums with several threads."""
import threading

import numpy as np
import pytest

import smalltc
from smalltc import _validate
from smalltc.backends import get
from smalltc.fem import H1Space, box_mesh
from smalltc.plan import build_plan

import oracle

numba = pytest.importorskip("numba")

from smalltc.backends.cpu import basis as cpu_basis, choose, family_of  # noqa: E402
from smalltc.backends.cpu.target import host  # noqa: E402
from smalltc.spec import BasisSpec  # noqa: E402

TOL = {"float64": 1e-12, "float32": 1e-5}

# (dim, nd, nq, what, ncomp, dtype, index dtype, params): None is the heuristic (one
# vector of elements); lanes 1 is one element at a time; nd 18 is beyond the specialised
# kernels (the generic kernel, sizes at run time). Every distinct row compiles 4 kernels.
CASES = [
    (3, 3, 5, "both", 2, "float64", "int32", None),
    (3, 5, 6, "gradients", 1, "float64", "int64", dict(lanes=1, kb=2)),
    (2, 4, 6, "values", 3, "float32", "int32", None),
    (1, 3, 4, "both", 1, "float64", "int64", dict(lanes=1, kb=1)),
    (2, 18, 25, "gradients", 1, "float64", "int32", None),
]


dense = oracle.basis_matrices


def _problem(dim, nd, nq, what, ncomp, dtype, index, E, seed=0):
    """A map with shared DoFs in random order (every DoF used), the field, point values."""
    rng = np.random.default_rng(seed)
    ndofs = max(4, E * nd ** dim // 3)
    m = rng.integers(0, ndofs, size=(E,) + (nd,) * dim)
    m.reshape(-1)[:ndofs] = rng.permutation(ndofs)
    B, G = rng.standard_normal((2, nq, nd)).astype(dtype)
    x = rng.standard_normal((ncomp, ndofs)).astype(dtype)
    S = {"values": 1, "gradients": dim, "both": 1 + dim}[what]
    comp = (ncomp,) if ncomp > 1 else ()
    H = rng.standard_normal((E,) + comp + ((S,) if what != "values" else ())
                            + (nq,) * dim).astype(dtype)
    return B, (None if what == "values" else G), G, x, m.astype(index), ndofs, H


def _executor(spec, params):
    return get("cpu").build(spec, params=params)


@pytest.mark.parametrize("dim,nd,nq,what,ncomp,dtype,index,params", CASES)
def test_kernels_match_the_dense_oracle(dim, nd, nq, what, ncomp, dtype, index, params):
    W = (params or {}).get("lanes", host().lanes(dtype))
    E = 2 * W + 5                       # full chunks and a partial one
    B, Gop, G, x, m, ndofs, H = _problem(dim, nd, nq, what, ncomp, dtype, index, E)
    mats = dense(B, G, what, dim)
    xf = x if ncomp > 1 else x[0]
    V = np.moveaxis(x[:, m], 0, 1)                              # (E, ncomp, nd, ...)
    Vf = V if ncomp > 1 else V[:, 0]
    Vref = V.reshape(E, ncomp, -1).astype(np.float64)
    Href = np.stack([Vref @ M.T for M in mats], axis=2).reshape(H.shape)
    Hh = H.reshape(E, ncomp, len(mats), -1).astype(np.float64)
    Uref = sum(Hh[:, :, s] @ M for s, M in enumerate(mats))     # (E, ncomp, nd^dim)
    yref = np.zeros((ncomp, ndofs))
    for c in range(ncomp):
        np.add.at(yref[c], m.reshape(-1), Uref[:, c].reshape(-1))
    runs = [(dict(elem_dofs=m), xf, False, Href),
            (dict(dim=dim), Vf, False, Href),
            (dict(elem_dofs=m, ndofs=ndofs), H, True, yref.reshape(xf.shape)),
            (dict(dim=dim), H, True, Uref.reshape(Vf.shape))]
    for kw, field, transpose, ref in runs:
        spec, _, ops = _validate.basis_spec(B, Gop, field, what=what, transpose=transpose,
                                            **kw)
        ex = _executor(spec, params)
        assert ex.specialized == (nd <= cpu_basis.MAX_ND)
        assert ("generic" in ex.kernel) != ex.specialized
        out = np.full(spec.out_shape, np.nan, dtype=dtype)
        ex.run(ops, out)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < TOL[dtype], (ex.kernel, err)


def test_the_family_claims_the_basis_specs_and_reports_its_fallback(caplog):
    s = BasisSpec(dim=3, nq=6, nd=5, batch=10, dtype="float64", what="both", ndofs=90)
    assert family_of(s) is cpu_basis.BASIS
    c = choose(s)
    assert (c.entry, c.source) == ("stc_basis_interp_both_3d_f64_nd5nq6_i32", "heuristic")
    assert c.ctx["lanes"] == host().lanes("float64")
    t = BasisSpec(dim=2, nq=9, nd=8, batch=10, dtype="float32", what="values",
                  transpose=True, index_dtype="int64", ndofs=90)
    assert choose(t).entry == "stc_basis_interp_t_values_2d_f32_nd8nq9_i64"
    assert choose(t).ctx["kb"] == 2              # nq >= 8: two outputs a register block
    big = BasisSpec(dim=3, nq=20, nd=cpu_basis.MAX_ND + 1, batch=10, dtype="float64",
                    what="gradients")
    g = choose(big)
    assert (g.entry, g.source, g.ctx["specialized"]) == (
        "stc_basis_interp_gradients_3d_f64_generic", "generic", False)
    assert choose(s, params=dict(lanes=1, kb=3)).source == "params"
    for bad in (dict(lanes=3, kb=1), dict(lanes=1, kb=9), dict(lanes=1, kb=1, rb=2)):
        with pytest.raises(ValueError, match=r"do not fit .*basis family"):
            choose(s, params=bad)
    with pytest.raises(ValueError, match=r"do not fit .*basis family"):
        choose(big, params=dict(lanes=host().lanes("float64"), kb=1))
    assert all(cpu_basis.BASIS.context(s, p) is not None
               for p, why in cpu_basis.BASIS.space(s))
    rng = np.random.default_rng(0)
    B, G = rng.standard_normal((2, 25, 18))            # the generic kernel of CASES
    caplog.set_level("WARNING", logger="smalltc")
    spec, xp, _ = _validate.basis_spec(B, G, rng.standard_normal((3, 18, 18)),
                                       what="gradients")
    p = build_plan(spec, xp, "cpu")
    assert not p.specialized and "generic" in p.kernel
    assert any("no size-specialised cpu kernel" in r.message for r in caplog.records)


@pytest.mark.parametrize("transpose", [False, True], ids=["interpolate", "integrate"])
@pytest.mark.parametrize("bad", [-1, 10 ** 6])
def test_an_out_of_range_map_entry_raises_naming_elem_dofs(transpose, bad):
    """The plan checks a map once; an entry changed in place afterwards is caught by the
    kernel (read and written nowhere), and the call raises."""
    B, Gop, G, x, m, ndofs, H = _problem(3, 3, 5, "both", 2, "float64", "int32", 21)
    if transpose:
        def call():
            return smalltc.integrate(B, Gop, H, m, what="both", ndofs=ndofs, backend="cpu")
    else:
        def call():
            return smalltc.interpolate(B, Gop, x, m, what="both", backend="cpu")
    call()
    m[17, 1, 2, 0] = bad
    with pytest.raises(ValueError, match=rf"elem_dofs .*outside \[0, {ndofs}\).* index {bad}"):
        call()


def _structured(p, n, dtype="float64"):
    """A 3D box mesh (each vertex DoF shared by 8 elements) with its DoFs renumbered."""
    rng = np.random.default_rng(3)
    space = H1Space(box_mesh(3, n), p)
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(np.int32)
    B, G = rng.standard_normal((2, p + 2, p + 1)).astype(dtype)
    H = rng.standard_normal((m.shape[0], 4) + (p + 2,) * 3).astype(dtype)
    return B, G, H, m, space.ndofs


def test_the_scatter_sums_with_several_threads():
    """Two kernel threads add into shared DoFs (the colours keep them apart): the oracle's
    sums, the same bits as one thread; and two Python threads calling at once."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread only")
    from smalltc.backends.cpu import set_num_threads
    B, G, H, m, ndofs = _structured(2, 6)
    U = sum(H[:, s].reshape(len(m), -1) @ M for s, M in enumerate(dense(B, G, "both", 3)))
    yref = np.zeros(ndofs)
    np.add.at(yref, m.reshape(-1), U.reshape(-1))
    old = numba.get_num_threads()
    runs = []
    try:
        for threads in (2, 1):
            set_num_threads(threads)
            runs.append(smalltc.integrate(B, G, H, m, what="both", ndofs=ndofs, backend="cpu"))
    finally:
        set_num_threads(old)
    assert np.linalg.norm(runs[0] - yref) <= TOL["float64"] * np.linalg.norm(yref)
    assert np.array_equal(runs[0], runs[1])
    outs = [np.full(ndofs, np.nan) for _ in range(2)]
    Hs = [H, 2 * H]

    def work(i):
        for _ in range(5):
            smalltc.integrate(B, G, Hs[i], m, what="both", ndofs=ndofs, backend="cpu",
                              out=outs[i])
    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.array_equal(outs[0], runs[0])
    assert np.linalg.norm(outs[1] - 2 * yref) <= TOL["float64"] * np.linalg.norm(yref)


def test_a_map_too_shared_to_colour_is_summed_per_dof(caplog):
    """DoF 0 in all 70 elements (more than 64 colours): the element vectors, summed per DoF
    by bincount, said once; a bad entry still raises."""
    rng = np.random.default_rng(4)
    E, ndofs = 70, 200
    m = rng.integers(1, ndofs, (E, 3)).astype(np.int64)
    m[:, 0] = 0
    B, G = rng.standard_normal((2, 4, 3))
    H = rng.standard_normal((E, 2, 4))
    U = sum(H[:, s] @ M for s, M in enumerate(dense(B, G, "both", 1)))
    yref = np.zeros(ndofs)
    np.add.at(yref, m.reshape(-1), U.reshape(-1))
    caplog.set_level("WARNING", logger="smalltc")
    for _ in range(2):
        out = np.full(ndofs, np.nan)
        smalltc.integrate(B, G, H, m, what="both", ndofs=ndofs, backend="cpu", out=out)
        assert np.linalg.norm(out - yref) <= TOL["float64"] * np.linalg.norm(yref)
    assert sum("more than 64 element colours" in r.message for r in caplog.records) == 1
    m[5, 1] = ndofs
    with pytest.raises(ValueError, match="elem_dofs holds indices"):
        smalltc.integrate(B, G, H, m, what="both", ndofs=ndofs, backend="cpu")
