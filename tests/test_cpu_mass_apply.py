"""The CPU backend's fused FEM operator: what only it promises beyond tests/test_mass_apply.py
(which checks every backend against the oracle): the same bits for any thread count and
either ``deterministic`` flag (one kernel, colour by colour), tuning parameters, the
fallback beyond its sizes, and no allocation of the result when ``out`` is given."""
import tracemalloc

import numpy as np
import pytest

import smalltc
from smalltc.backends import get
from smalltc.backends.reference import mass_apply_unfused
from smalltc.fem import H1Space, box_mesh

pytest.importorskip("numba")


def _problem(dim, p, nq, ncomp=1, n=3, seed=0, dtype="float64", index="int32"):
    rng = np.random.default_rng(seed)
    space = H1Space(box_mesh(dim, n), p)
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(index)   # unstructured numbers
    B1d = rng.standard_normal((nq, p + 1)).astype(dtype)
    D = (rng.random((space.nelements,) + (nq,) * dim) + 0.5).astype(dtype)
    x = rng.standard_normal((ncomp, space.ndofs) if ncomp > 1 else space.ndofs).astype(dtype)
    return B1d, D, x, m


def test_same_bits_for_any_thread_count_and_either_flag():
    import numba
    from smalltc.backends.cpu import set_num_threads
    ops = _problem(3, 3, 5, ncomp=2, n=4)
    runs = []
    old = numba.get_num_threads()
    try:
        for threads, det in ((old, False), (1, False), (old, True)):
            set_num_threads(threads)
            runs.append(smalltc.mass_apply(*ops, deterministic=det, backend="cpu"))
    finally:
        set_num_threads(old)
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert smalltc.plan("mass_apply", *ops, backend="cpu").kernel == \
        smalltc.plan("mass_apply", *ops, deterministic=True, backend="cpu").kernel


@pytest.mark.parametrize("lanes_vectors,rb,tr", [(2, 2, 1), (1, 1, 0)])
def test_tuning_parameters(lanes_vectors, rb, tr):
    from smalltc.backends.cpu.target import host
    t = host()
    params = dict(lanes=lanes_vectors * t.lanes("float64"), rb=rb, tr=tr, vbits=t.vector_bits)
    B1d, D, x, m = _problem(2, 4, 6, ncomp=3)
    spec = smalltc.plan("mass_apply", B1d, D, x, m, backend="cpu").spec
    ex = get("cpu").build(spec, params=params)
    assert ex.source == "params" and {k: ex.params[k] for k in params} == params
    out = np.full(x.shape, np.nan)
    ex.run((B1d, D, x, m), out)
    ref = mass_apply_unfused(B1d, D, x, m, 2)
    assert np.linalg.norm(out - ref) <= 1e-13 * np.linalg.norm(ref)
    with pytest.raises(ValueError, match=r"do not fit .*mass_apply family"):
        get("cpu").build(spec, params=dict(params, rb=9))


def test_beyond_the_kernels_sizes_the_reference_runs(caplog):
    B1d, D, x, m = _problem(1, 17, 25, n=2)          # nq = 25 > 24
    with caplog.at_level("WARNING", logger="smalltc"):
        p = smalltc.plan("mass_apply", B1d, D, x, m)
    assert p.backend == "reference" and "cpu" in caplog.text
    assert np.allclose(p(B1d, D, x, m), mass_apply_unfused(B1d, D, x, m, 1))


def test_empty_mesh_gives_zeros():
    B1d, D, x, m = _problem(2, 2, 4)
    out = smalltc.plan("mass_apply", B1d, D[:0], x, m[:0], backend="cpu")(
        B1d, D[:0], x, m[:0], out=np.full(x.shape, np.nan))
    assert not out.any()


@pytest.mark.parametrize("op", ["action", "mass_apply", "mass_diagonal", "assembly"])
def test_no_allocation_of_the_result_when_out_is_given(op):
    """A call with ``out`` allocates no NumPy memory of the result's size (the kernels'
    own per-thread buffers are a few KB, outside NumPy; on the 16-core device machine a
    call's transient Python allocations peaked at 55 KB, so results are >= 280 KB)."""
    B1d, D, x, m = _problem(3, 2, 4, n=16)          # x: 35,937 entries
    if op == "action":
        ops = (B1d, D, x[m])
    elif op == "mass_apply":
        ops = (B1d, D, x, m)
    elif op == "assembly":
        ops = (B1d, D[:293])                        # a padded last chunk (293 = 36 * 8 + 5)
    else:
        ops = (B1d, D, m)
    kw = dict(ndofs=x.size) if op == "mass_diagonal" else {}
    p = smalltc.plan(op, *ops, backend="cpu", **kw)
    out = np.empty(p.out_shape)
    p(*ops, out=out)                                 # compiled, coloured, buffers made
    tracemalloc.start()
    try:
        p(*ops, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < out.nbytes // 4, (peak, out.nbytes)
