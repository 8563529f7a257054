"""CUDA backend on a GPU: each kernel against a float64 NumPy reference.

Skipped cleanly without a CUDA device. Outputs are poisoned with NaN before
each run, so an unwritten entry fails. Also: batches above 2^31 data
elements, non-default streams, the generic path and the compile error.
"""
import numpy as np
import pytest

import smalltc
from smalltc._arrays import cupy_or_none, gpu_available
from smalltc.backends import reference as R

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device")]

TOL = {"float64": 1e-12, "float32": 1e-5}
rng = np.random.default_rng(5)


def cp():
    return cupy_or_none()


def rel(out, ref):
    out = cp().asnumpy(out).astype(np.float64)
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite entries in the output"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def dev(a, dtype):
    return cp().asarray(a.astype(dtype))


def poisoned(shape, dtype):
    return cp().full(shape, np.nan, dtype=dtype)


# ---------------------------------------------------------------- GEMM
GEMM_CASES = [(m, n, k, ta, tb, sa, sb, bz, dt)
              for (m, n, k) in ((2, 2, 2), (3, 5, 4), (8, 8, 8), (16, 16, 16), (32, 32, 32),
                                (7, 33, 9), (150, 3, 4))
              for ta in (False, True) for tb in (False, True)
              for (sa, sb) in ((False, False), (True, False), (False, True))
              for bz in (True, False) for dt in ("float64", "float32")
              if (m, n, k) in ((3, 5, 4), (8, 8, 8)) or (ta == tb and sa == sb == False)]


@pytest.mark.parametrize("m,n,k,ta,tb,sa,sb,bz,dt", GEMM_CASES)
def test_gemm(m, n, k, ta, tb, sa, sb, bz, dt):
    batch = 301
    A = rng.standard_normal(((k, m) if ta else (m, k)) if sa else (batch,) + ((k, m) if ta else (m, k)))
    B = rng.standard_normal(((n, k) if tb else (k, n)) if sb else (batch,) + ((n, k) if tb else (k, n)))
    C = rng.standard_normal((batch, m, n))
    alpha, beta = 1.5, (0.0 if bz else -0.75)
    a = np.swapaxes(A, -1, -2) if ta else A
    b = np.swapaxes(B, -1, -2) if tb else B
    ref = alpha * np.matmul(a, b) + beta * C
    Ad, Bd, Cd = dev(A, dt), dev(B, dt), dev(C, dt)
    p = smalltc.plan("gemm", Ad, Bd, Cd, backend="cuda", alpha=alpha, beta=beta,
                     trans_a=ta, trans_b=tb)
    assert p.backend == "cuda"
    assert p.specialized == (max(m, n, k) <= 128)
    out = poisoned((batch, m, n), dt) if bz else Cd
    res = p(Ad, Bd, Cd, out=out, alpha=alpha, beta=beta)
    assert rel(res, ref) < TOL[dt]


# ---------------------------------------------------------------- contract 8a/8b/9
CONTRACT_CASES = [("8a", dict(i=9, s=3, j=1, k=4, l=1), False, True),
                  ("8b", dict(i=3, s=3, j=4, k=4, l=1), False, True),
                  ("8a", dict(i=1, s=3, j=1, k=4, l=16), True, False),
                  ("8b", dict(i=2, s=3, j=5, k=2, l=3), False, False),
                  ("9", dict(i=3, s=4, j=3, k=1, l=16), True, False),
                  ("9", dict(i=3, s=4, j=3, k=12, l=9), True, False),
                  ("9", dict(i=5, s=6, j=5, k=25, l=25), True, False),   # K folded into the batch
                  ("9", dict(i=4, s=5, j=4, k=30, l=20), True, False),   # (step (2c) shapes)
                  ("8a", dict(i=200, s=3, j=1, k=4, l=1), False, True)]   # generic (i > 128)


@pytest.mark.parametrize("dt", ["float64", "float32"])
@pytest.mark.parametrize("kind,e,sx,sy", CONTRACT_CASES)
def test_contract(kind, e, sx, sy, dt):
    batch = 77
    xc = (e["s"], e["i"]) if kind == "9" else (e["i"], e["s"], e["j"])
    yc = (e["k"], e["s"], e["l"])
    X = rng.standard_normal(xc if sx else (batch,) + xc)
    Y = rng.standard_normal(yc if sy else (batch,) + yc)
    ref = R.contract_einsum(kind, X, Y)
    if ref.ndim == 4:
        ref = np.broadcast_to(ref, (batch,) + ref.shape)
    Xd, Yd = dev(X, dt), dev(Y, dt)
    p = smalltc.plan("contract", Xd, Yd, kind=kind, backend="cuda")
    if kind == "9" and sx and not sy:           # kernel (9) for every size, folded or not
        assert p.specialized and p.kernel.startswith("stc_contract9"), p.kernel
    out = poisoned(p.out_shape, dt)
    assert rel(p(Xd, Yd, out=out), ref) < TOL[dt]


# ---------------------------------------------------------------- action / assembly
ACTION_CASES = [(dim, p, nq, nc, dt) for dim in (1, 2, 3) for (p, nq) in
                ((1, 2), (2, 4), (4, 5), (7, 9), (8, 10)) for nc in (1, 3)
                for dt in ("float64", "float32") if nc == 1 or p in (2, 8)]
ACTION_CASES += [(3, 16, 18, 1, "float64"), (3, 16, 17, 1, "float32"), (3, 3, 2, 1, "float64")]


def _action_inputs(dim, p, nq, nc, E):
    nd = p + 1
    B1d = rng.standard_normal((nq, nd))
    D = rng.random((E,) + (nq,) * dim) + 0.5
    V = rng.standard_normal((E,) + ((nc,) if nc > 1 else ()) + (nd,) * dim)
    return B1d, D, V


@pytest.mark.parametrize("method", ["fused", "pairwise"])
@pytest.mark.parametrize("dim,p,nq,nc,dt", ACTION_CASES)
def test_action(dim, p, nq, nc, dt, method):
    if method == "pairwise" and p == 16:
        pytest.skip("p=16 pairwise covered by the generic fallback")
    E = 1003
    B1d, D, V = _action_inputs(dim, p, nq, nc, E)
    ref = R.action_einsum(B1d, D, V, dim)
    args = [dev(a, dt) for a in (B1d, D, V)]
    pl = smalltc.plan("action", *args, backend="cuda", method=method)
    assert pl.backend == "cuda"
    out = poisoned(V.shape, dt)
    assert rel(pl(*args, out=out), ref) < TOL[dt] * (10 if p >= 8 else 1)


# register-blocked action (action_rb.cu.j2): rb outputs per thread, forced through the
# tuning-table hook; (dim, p, nq, ncomp, rb, per_block, min_blocks, dtype)
ACTION_RB_CASES = [(3, p, nq, 1, rb, 2, 0, "float64") for p in (1, 2, 4, 5, 6, 7, 8)
                   for nq in (p + 1, p + 2) for rb in (2, 3)]
ACTION_RB_CASES += [(3, 3, 2, 1, 2, 3, 0, "float64"), (3, 4, 5, 1, 4, 5, 0, "float64"),
                    (3, 8, 10, 1, 4, 1, 0, "float64"), (3, 5, 6, 1, 2, 7, 4, "float64"),
                    (3, 2, 4, 3, 2, 4, 0, "float64"), (3, 8, 10, 3, 2, 2, 0, "float32"),
                    (3, 4, 6, 1, 3, 5, 0, "float32"), (3, 16, 18, 1, 2, 1, 0, "float64")]
ACTION_RB_CASES += [(2, p, nq, nc, rb, 8, 0, dt) for (p, nq) in ((1, 2), (4, 5), (8, 10))
                    for rb in (2, 3, 4) for nc in (1, 3) for dt in ("float64", "float32")
                    if nc == 1 or (rb == 2 and dt == "float64")]


@pytest.mark.parametrize("dim,p,nq,nc,rb,per_block,min_blocks,dt", ACTION_RB_CASES)
def test_action_register_blocked(dim, p, nq, nc, rb, per_block, min_blocks, dt):
    from smalltc.backends.cuda.action import action_ctx
    from smalltc.spec import ActionSpec
    E = 1003                                   # many groups, a partial last one
    B1d, D, V = _action_inputs(dim, p, nq, nc, E)
    ref = R.action_einsum(B1d, D, V, dim)
    spec = ActionSpec(dim=dim, nq=nq, nd=p + 1, batch=E, dtype=dt, ncomp=nc,
                      comp_axis=nc > 1)
    params = dict(per_block=per_block, min_blocks=min_blocks, rb=rb)
    want = action_ctx(dim, p + 1, nq, nc, dt, params=params)
    ex = _build_forced(spec, params)
    assert ex.source == "params" and ex.template == "action_rb.cu.j2"
    assert ex.params["rb"] == want["rb"] > 1 and ex.threads == want["threads"]
    out = poisoned(V.shape, dt)
    ex.run(tuple(dev(a, dt) for a in (B1d, D, V)), out)
    assert rel(out, ref) < TOL[dt] * (10 if p >= 8 else 1)


# the line form of the 3D action (action_line.cu.j2, B1d in the constant bank), chosen
# by passing its parameters; (p, nq, ncomp, per_block, min_blocks, dtype)
ACTION_LINE_CASES = [(p, nq, 1, pb, 0, "float64") for p in (1, 2, 3, 4, 5, 6, 7, 8)
                     for nq in (p + 1, p + 2) for pb in (1, 3)]
ACTION_LINE_CASES += [(2, 4, 3, 2, 0, "float64"), (8, 10, 3, 2, 0, "float32"),
                      (5, 6, 1, 4, 2, "float32"), (3, 2, 1, 5, 0, "float64"),
                      (16, 18, 1, 1, 0, "float64"), (16, 17, 1, 1, 0, "float32")]


def _build_forced(spec, params):
    """The CUDA executor of ``spec`` with these tuning parameters (not the table's)."""
    from smalltc.backends import get
    return get("cuda").build(spec, params=params)


@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize("p,nq,nc,per_block,min_blocks,dt", ACTION_LINE_CASES)
def test_action_line(p, nq, nc, per_block, min_blocks, dt, prefetch):
    from smalltc.spec import ActionSpec
    E = 1003                                   # many groups, a partial last one
    B1d, D, V = _action_inputs(3, p, nq, nc, E)
    ref = R.action_einsum(B1d, D, V, 3)
    spec = ActionSpec(dim=3, nq=nq, nd=p + 1, batch=E, dtype=dt, ncomp=nc, comp_axis=nc > 1)
    ex = _build_forced(spec, dict(per_block=per_block, min_blocks=min_blocks, line=1,
                                  prefetch=prefetch))
    assert ex.source == "params" and ex.template == "action_line.cu.j2"
    assert ex.kernel.endswith("_line") and ex.params["line"] == 1
    assert ex.params["prefetch"] == prefetch and (ex.max_blocks is None) == (not prefetch)
    if prefetch:
        ex.max_blocks = 7                    # each block loops over many groups: the prefetch
                                             # of the next group's V and D is exercised
    out = poisoned(V.shape, dt)
    ex.run(tuple(dev(a, dt) for a in (B1d, D, V)), out)
    assert rel(out, ref) < TOL[dt] * (10 if p >= 8 else 1)
    # a second call with another B1d: the constant bank is refilled
    B2 = rng.standard_normal(B1d.shape)
    out2 = poisoned(V.shape, dt)
    ex.run((dev(B2, dt), dev(D, dt), dev(V, dt)), out2)
    assert rel(out2, R.action_einsum(B2, D, V, 3)) < TOL[dt] * (10 if p >= 8 else 1)


def test_action_line_streams_with_different_b1d():
    """Two non-blocking streams, each with its own B1d, alternating: the constant-bank copy
    of one stream must not land while the other's kernel still reads it."""
    from smalltc.spec import ActionSpec
    E, p, nq = 60000, 5, 7
    Bs = [rng.standard_normal((nq, p + 1)) for _ in range(2)]
    _, D, V = _action_inputs(3, p, nq, 1, E)
    refs = [R.action_einsum(B, D, V, 3) for B in Bs]
    spec = ActionSpec(dim=3, nq=nq, nd=p + 1, batch=E, dtype="float64")
    ex = _build_forced(spec, dict(per_block=2, min_blocks=0, line=1))
    streams = [cp().cuda.Stream(non_blocking=True) for _ in range(2)]
    with streams[0]:
        Dd, Vd = dev(D, "float64"), dev(V, "float64")
        Bd = [dev(B, "float64") for B in Bs]
        outs = [[poisoned(V.shape, "float64") for _ in range(3)] for _ in range(2)]
    streams[0].synchronize()
    for r in range(3):
        for i, s in enumerate(streams):
            with s:
                ex.run((Bd[i], Dd, Vd), outs[i][r])
    for s in streams:
        s.synchronize()
    for i in range(2):
        for r in range(3):
            assert rel(outs[i][r], refs[i]) < 1e-12, (i, r)
    # two executors of one kernel (plans for two batch counts share its module and so its
    # constant bank): the ordering is per module, not per executor
    half = _build_forced(spec.with_batch(E // 2), dict(per_block=2, min_blocks=0, line=1))
    assert half.kernel == ex.kernel
    with streams[0]:
        o_full, o_half = poisoned(V.shape, "float64"), poisoned((E // 2,) + V.shape[1:], "float64")
    streams[0].synchronize()
    for r in range(3):
        with streams[0]:
            ex.run((Bd[0], Dd, Vd), o_full)
        with streams[1]:
            half.run((Bd[1], Dd[:E // 2], Vd[:E // 2]), o_half)
    for s in streams:
        s.synchronize()
    assert rel(o_full, refs[0]) < 1e-12 and rel(o_half, refs[1][:E // 2]) < 1e-12


def _bulk_per_block(spec, per_block, stages=2):
    """The line form's bulk parameters (prefetch 3) at the first item count from
    ``per_block`` on whose slabs are whole 16-byte multiples, or None."""
    from smalltc.backends.cuda.action import ACTION
    from smalltc.backends.cuda.runtime import current_device
    for n in range(per_block, 1025):
        params = dict(per_block=n, min_blocks=0, line=1, prefetch=3, stages=stages)
        if ACTION.context(spec, params, current_device()[1]) is not None:
            return params
    return None


def _bulk_or_why(spec, per_block, stages=2):
    """The bulk parameters, or the test's assertion that none fit: building them fails."""
    if current_cc() < 90:
        pytest.skip("the bulk form (cp.async.bulk) needs compute capability 9.0")
    params = _bulk_per_block(spec, per_block, stages)
    if params is None:
        with pytest.raises(ValueError, match="do not fit"):
            _build_forced(spec, dict(per_block=per_block, min_blocks=0, line=1, prefetch=3))
    return params


def current_cc():
    from smalltc.backends.cuda.runtime import current_device
    return int(current_device()[1]["cc"])


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("p,nq,nc,per_block,min_blocks,dt", ACTION_LINE_CASES)
def test_action_line_bulk(p, nq, nc, per_block, min_blocks, dt, stages):
    """The bulk form (prefetch 3: V and D slabs by cp.async.bulk into STAGES slots), blocks
    looping over many groups, a partial last group whose slabs end off 16 bytes (its tail
    loaded by the threads), odd and even ND (V read in its slot, or copied to the padded
    layout first)."""
    from smalltc.spec import ActionSpec
    E = 1003
    spec = ActionSpec(dim=3, nq=nq, nd=p + 1, batch=E, dtype=dt, ncomp=nc, comp_axis=nc > 1)
    params = _bulk_or_why(spec, per_block, stages)
    if params is None:
        return
    B1d, D, V = _action_inputs(3, p, nq, nc, E)
    ref = R.action_einsum(B1d, D, V, 3)
    ex = _build_forced(spec, params)
    assert ex.params["prefetch"] == 3 and ex.params["stages"] == stages
    assert ex.ctx["direct"] == (p + 1) % 2 and ex.max_blocks is not None
    ex.max_blocks = 5                        # every block loops over many groups and slots
    out = poisoned(V.shape, dt)
    ex.run(tuple(dev(a, dt) for a in (B1d, D, V)), out)
    assert rel(out, ref) < TOL[dt] * (10 if p >= 8 else 1)
    assert ex.unaligned is None


def test_action_line_bulk_unaligned_operands():
    """V or D starting off 16 bytes (a view one element in) cannot be copied by slabs: the
    bulk executor runs the register-prefetch kernel for that call, with the right result."""
    from smalltc.spec import ActionSpec
    p, nq, E, dt = 4, 5, 501, "float64"        # an element: 125 doubles, 1000 bytes
    spec = ActionSpec(dim=3, nq=nq, nd=p + 1, batch=E, dtype=dt)
    params = _bulk_or_why(spec, 2)
    B1d, D, V = _action_inputs(3, p, nq, 1, E + 1)
    ex = _build_forced(spec, params)
    Dd, Vd = dev(D, dt), dev(V, dt)
    for d_off, v_off in ((1, 0), (0, 1)):
        out = poisoned(V[1:].shape, dt)
        ex.run((dev(B1d, dt), Dd[d_off:d_off + E], Vd[v_off:v_off + E]), out)
        assert rel(out, R.action_einsum(B1d, D[d_off:d_off + E], V[v_off:v_off + E], 3)) < 1e-12
    assert ex.unaligned is not None and ex.unaligned.params["prefetch"] == 1
    assert ex.unaligned.kernel == ex.kernel            # the same entry name, other module
    out = poisoned(V[1:].shape, dt)                    # aligned again: the bulk kernel
    ex.run((dev(B1d, dt), Dd[:E], Vd[:E]), out)
    assert rel(out, R.action_einsum(B1d, D[:E], V[:E], 3)) < 1e-12


@pytest.mark.parametrize("method", ["fused", "pairwise"])
@pytest.mark.parametrize("dim,p,nq,dt", [(d, p, nq, dt) for d in (1, 2, 3)
                                        for (p, nq) in ((1, 2), (2, 4), (3, 5), (6, 8))
                                        for dt in ("float64", "float32")])
def test_assembly(dim, p, nq, dt, method):
    E = 37 if dim == 3 else 301
    nd = p + 1
    B1d = rng.standard_normal((nq, nd))
    D = rng.random((E,) + (nq,) * dim) + 0.5
    ref = R.assembly_einsum(B1d, D, dim)
    args = [dev(a, dt) for a in (B1d, D)]
    pl = smalltc.plan("assembly", *args, backend="cuda", method=method)
    out = poisoned(ref.shape, dt)
    assert rel(pl(*args, out=out), ref) < TOL[dt]


# ---------------------------------------------------------------- streams, big batches, errors
def test_non_default_stream():
    # Every operand is made on the non-blocking stream s, which does not wait for the
    # default stream: the result is right only if the kernel is ordered on s too. (Operands
    # made on the default stream would race the launch: a pageable host-to-device copy may
    # still be in flight when cudaMemcpy returns.)
    E = 20000
    B1d, D, V = _action_inputs(3, 3, 5, 1, E)
    ref = R.action_einsum(B1d, D, V, 3)
    s = cp().cuda.Stream(non_blocking=True)
    with s:
        args = [dev(a, "float64") for a in (B1d, D, V)]
        out = poisoned(V.shape, "float64")
    pl = smalltc.plan("action", *args, backend="cuda")
    pl(*args, out=out, stream=s)
    s.synchronize()
    assert rel(out, ref) < 1e-12
    A = rng.standard_normal((5000, 8, 8))
    Bm = rng.standard_normal((8, 8))
    with s:
        Ad, Bd = dev(A, "float32"), dev(Bm, "float32")
        o = poisoned((5000, 8, 8), "float32")
    g = smalltc.plan("gemm", Ad, Bd, backend="cuda")
    g(Ad, Bd, out=o, stream=s)
    s.synchronize()
    assert rel(o, A @ Bm) < 1e-5


def _free_bytes():
    free, _ = cp().cuda.runtime.memGetInfo()
    return free


@pytest.mark.slow
def test_action_batch_past_2_31_elements():
    """3D action, float32, p=3 nq=4: E * nd^3 > 2^31 (about 26 GB on the device)."""
    x = cp()
    dim, nd, nq = 3, 4, 4
    E = 2 ** 31 // nd ** 3 + 4099
    need = 4 * E * (2 * nd ** 3 + nq ** 3)
    if _free_bytes() < need * 1.1:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of device memory")
    B1d = x.asarray(rng.standard_normal((nq, nd)), dtype=x.float32)
    D = x.random.random((E, nq, nq, nq), dtype=x.float32) + 0.5
    V = x.random.standard_normal((E, nd, nd, nd), dtype=x.float32)
    U = x.full(V.shape, np.nan, dtype=x.float32)
    smalltc.batched_contract(B1d, D, V, out=U, backend="cuda")
    for sl in (slice(0, 1000), slice(E - 3000, E)):
        ref = R.action_einsum(x.asnumpy(B1d).astype(np.float64), x.asnumpy(D[sl]).astype(np.float64),
                              x.asnumpy(V[sl]).astype(np.float64), 3)
        assert rel(U[sl], ref) < 1e-5
    assert not bool(x.isnan(U).any())


@pytest.mark.slow
def test_gemm_batch_past_2_31_elements():
    """Batched 4x4 float32 GEMM with shared B, batch * 16 > 2^31."""
    x = cp()
    batch = 2 ** 31 // 16 + 1031
    need = 4 * batch * 32
    if _free_bytes() < need * 1.1:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of device memory")
    A = x.random.standard_normal((batch, 4, 4), dtype=x.float32)
    Bm = x.asarray(rng.standard_normal((4, 4)), dtype=x.float32)
    C = x.full((batch, 4, 4), np.nan, dtype=x.float32)
    smalltc.batched_gemm(A, Bm, out=C, backend="cuda")
    for sl in (slice(0, 1000), slice(batch - 1000, batch)):
        ref = x.asnumpy(A[sl]).astype(np.float64) @ x.asnumpy(Bm).astype(np.float64)
        assert rel(C[sl], ref) < 1e-5
    assert not bool(x.isnan(C).any())


def test_compile_error_carries_source():
    from smalltc.backends.cuda.layout import layout_ctx
    from smalltc.backends.cuda.runtime import SmalltcCompileError, get_kernel
    ctx = dict(layout_ctx("8a", 4, 4, 1, 1, 4, "float64", False, False), threads=7)
    with pytest.raises(SmalltcCompileError, match="static assertion|static_assert") as info:
        get_kernel("gemm.cu.j2", "stc_broken", ctx)
    assert 'extern "C"' in info.value.source and "-std=c++17" in info.value.options


def test_backend_describes_device():
    from smalltc import backends
    be = backends.get("cuda")
    assert be.available() and "sm_" in be.describe()
    assert backends.candidates("cupy")[0].name == "cuda"


# ---------------------------------------------------------------- layout prefetch form
LAYOUT_PREFETCH_CASES = [(m, n, k, sa, sb, bz, dt)
                         for (m, n, k, sa, sb) in ((8, 8, 8, False, False), (20, 20, 20, False, False),
                                                   (32, 32, 32, False, False), (9, 9, 9, True, False),
                                                   (7, 33, 9, False, True))
                         for bz in (True, False) for dt in ("float64", "float32")]


@pytest.mark.parametrize("m,n,k,sa,sb,bz,dt", LAYOUT_PREFETCH_CASES)
def test_gemm_prefetch(m, n, k, sa, sb, bz, dt):
    """The layout kernel's cp.async form (prefetch = 1): blocks loop over groups, each
    group's operands copied in while the previous group computes; a partial last group."""
    from smalltc.backends.cuda.layout import LAYOUT
    from smalltc.spec import GemmSpec
    batch = 1003
    spec = GemmSpec(batch=batch, m=m, n=n, k=k, dtype=dt, shared_a=sa, shared_b=sb,
                    beta_zero=bz)
    heur = LAYOUT.context(spec)
    params = dict(dim_x=heur["dim_x"], dim_y=heur["dim_y"], per_block=3, prefetch=1)
    ex = _build_forced(spec, params)
    assert ex.params["prefetch"] == 1 and ex.max_blocks is not None
    A = rng.standard_normal((m, k) if sa else (batch, m, k))
    B = rng.standard_normal((k, n) if sb else (batch, k, n))
    C = rng.standard_normal((batch, m, n))
    beta = 0.0 if bz else -0.75
    ref = 1.5 * np.matmul(A, B) + beta * C
    for cap in (ex.max_blocks, 7):           # the occupancy cap, and many groups per block
        ex.max_blocks = cap
        out = poisoned((batch, m, n), dt)
        ex.run((dev(A, dt), dev(B, dt), dev(C, dt)), out, alpha=1.5, beta=beta)
        assert rel(out, ref) < TOL[dt]
