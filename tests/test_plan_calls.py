"""Repeated plan calls: the plan's comparisons (``Plan.__call__``), the slow path they
hand a failing call to (``Plan._checked``: converts, or raises the error that names the
operand), the plan cache the public operations share, and the driver launch
(``Launcher``): the same results and the same errors whichever path a call takes.

Each call is checked against a float64 NumPy reference with the output poisoned
first. On the GPU a poisoned ``out`` is filled on the null stream: before a call on
a non-blocking stream the device is synchronised, or the fill races the kernel.
"""
import ctypes
import importlib
import struct

import numpy as np
import pytest

import smalltc
from smalltc import backends
from smalltc.backends.reference import ReferenceBackend
from smalltc.plan import _PLANS
import oracle
from conftest import array_modules, rel_err, to_numpy, xp_of

rng = np.random.default_rng(11)


def _poisoned(xp, shape, dtype="float64"):
    return xp.full(shape, np.nan, dtype=dtype)


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_gemm_repeated_calls(xp_name, beta):
    xp = xp_of(xp_name)
    A, B, C = (rng.standard_normal((300, 5, 5)) for _ in range(3))
    dA, dB, dC = (xp.array(x) for x in (A, B, C))        # copies: C is updated in place
    ops = (dA, dB) + ((dC,) if beta else ())
    pl = smalltc.plan("gemm", *ops, alpha=2.0, beta=beta)
    for alpha in (2.0, -1.0, 3):                        # a new alpha each call; an int too
        out = _poisoned(xp, (300, 5, 5))
        assert pl(*ops, out=out, alpha=alpha, beta=beta) is out
        assert rel_err(out, alpha * A @ B + beta * C) < 1e-12
        res = pl(*ops, alpha=alpha, beta=beta)           # allocated by the call
        assert rel_err(res, alpha * A @ B + beta * C) < 1e-12
    if beta:                                             # out=C: the in-place update
        pl(dA, dB, dC, out=dC, alpha=1.0, beta=beta)
        assert rel_err(dC, A @ B + beta * C) < 1e-12


@pytest.mark.parametrize("xp_name", array_modules())
def test_action_and_assembly_repeated_calls(xp_name):
    xp = xp_of(xp_name)
    B1d, D, V = rng.random((4, 3)), rng.random((50, 4, 4, 4)), rng.random((50, 3, 3, 3))
    dB, dD, dV = (xp.asarray(x) for x in (B1d, D, V))
    pa = smalltc.plan("action", dB, dD, dV)
    pm = smalltc.plan("assembly", dB, dD)
    for _ in range(2):
        out = _poisoned(xp, V.shape)
        pa(dB, dD, dV, out=out)
        assert rel_err(out, oracle.action(B1d, D, V)) < 1e-12
        M = _poisoned(xp, (50, 27, 27))
        pm(dB, dD, out=M)
        assert rel_err(M, oracle.assembly(B1d, D)) < 1e-12


@pytest.mark.parametrize("xp_name", array_modules())
def test_calls_that_leave_the_fast_path(xp_name):
    """Valid calls whose comparisons fail: converted by the checked path."""
    xp = xp_of(xp_name)
    A, B = rng.standard_normal((40, 4, 6)), rng.standard_normal((40, 6, 4))
    pl = smalltc.plan("gemm", xp.asarray(A), xp.asarray(B))
    At = xp.asarray(np.ascontiguousarray(A.transpose(0, 2, 1))).transpose(0, 2, 1)
    assert not At.flags.c_contiguous                      # a strided view: copied
    assert rel_err(pl(At, xp.asarray(B)), A @ B) < 1e-12
    x = xp.asarray(A[:2])                                 # another batch count
    with pytest.raises(ValueError, match=r"A has shape \(2, 4, 6\), but this plan"):
        pl(x, xp.asarray(B))
    if xp_name == "cupy":
        s = xp.cuda.Stream(non_blocking=True)
        dA, dB, out = xp.asarray(A), xp.asarray(B), _poisoned(xp, (40, 4, 4))
        xp.cuda.Device().synchronize()       # s does not wait for the null stream's fill
        pl(dA, dB, out=out, stream=s)
        s.synchronize()
        assert rel_err(out, A @ B) < 1e-12


@pytest.mark.parametrize("xp_name", array_modules())
def test_errors_on_repeated_calls(xp_name):
    xp = xp_of(xp_name)
    A, B, C = (xp.asarray(rng.standard_normal((30, 3, 3))) for _ in range(3))
    pl = smalltc.plan("gemm", A, B, C, beta=1.0)
    pl(A, B, C, beta=1.0)                                 # warm
    with pytest.raises(ValueError, match="out overlaps the input A"):
        pl(A, B, C, out=A, beta=1.0)
    with pytest.raises(ValueError, match="out overlaps the input A"):
        pl(C, B, C, out=C, beta=1.0)                     # out=C, but C is A too
    buf = xp.empty((60, 3, 3))
    buf[:30] = B
    with pytest.raises(ValueError, match="out overlaps the input B"):
        pl(A, buf[:30], C, out=buf[15:45], beta=1.0)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        pl(A, B, C, out=xp.empty((3, 3, 30)).transpose(2, 1, 0), beta=1.0)
    with pytest.raises(TypeError, match="out has dtype float32"):
        pl(A, B, C, out=xp.empty((30, 3, 3), dtype=np.float32), beta=1.0)
    with pytest.raises(ValueError, match="beta must be finite"):
        pl(A, B, C, beta=float("nan"))
    with pytest.raises(ValueError, match="alpha must be finite"):
        pl(A, B, C, alpha=float("inf"), beta=1.0)
    with pytest.raises(ValueError, match=r"built for beta!=0, got beta=0"):
        pl(A, B, C, beta=0.0)
    with pytest.raises(ValueError, match="C is missing"):
        pl(A, B, beta=1.0)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        pl(A, B, C, alpha="2", beta=1.0)
    if xp_name == "cupy":
        with pytest.raises(TypeError, match="out is a numpy array"):
            pl(A, B, C, out=np.empty((30, 3, 3)), beta=1.0)


# (id, operand shapes, the public call, its float64 reference): one case per operation, at
# sizes whose CPU kernels tests/test_operations.py compiles anyway
OPERATIONS = [
    ("action", [(4, 3), (20, 4, 4, 4), (20, 3, 3, 3)],
     lambda B1d, D, V, **kw: smalltc.batched_contract(B1d, D, V, **kw), oracle.action),
    ("assembly", [(4, 3), (20, 4, 4, 4)],
     lambda B1d, D, **kw: smalltc.assemble_mass(B1d, D, **kw), oracle.assembly),
    ("gemm", [(5, 5), (20, 5, 5), (20, 5, 5)],
     lambda A, B, C, **kw: smalltc.batched_gemm(A, B, C, alpha=2.0, beta=0.5, **kw),
     lambda A, B, C: oracle.gemm(A, B, C, 2.0, 0.5, False, False)),
    ("gemm-beta0", [(20, 5, 5), (20, 5, 5)],
     lambda A, B, **kw: smalltc.batched_gemm(A, B, **kw),
     lambda A, B: oracle.gemm(A, B, None, 1.0, 0.0, False, False)),
    ("contract", [(20, 3, 2, 4), (5, 2, 6)],
     lambda X, Y, **kw: smalltc.contract("8b", X, Y, **kw),
     lambda X, Y: oracle.contract("8b", X, Y)),
]
OP_IDS = [c[0] for c in OPERATIONS]


def _strided(xp, x):
    """``x``'s values in a view that is not C-contiguous (every other entry of a
    buffer twice as long in its last axis)."""
    buf = xp.empty(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype)
    view = buf[..., ::2]
    view[...] = x
    return view


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("case", OPERATIONS, ids=OP_IDS)
def test_every_operation_repeated_calls(case, xp_name):
    """Each public operation, called again and again (its cached plan): with ``out``,
    without, with each operand in turn a strided view (copied: the same answer), and on
    the GPU on a non-blocking stream."""
    _, shapes, call, ref = case
    xp = xp_of(xp_name)
    host = [rng.random(sh) for sh in shapes]
    ops = [xp.asarray(x) for x in host]
    want = ref(*host)
    for _ in range(3):
        out = _poisoned(xp, want.shape)
        assert call(*ops, out=out) is out
        assert rel_err(out, want) < 1e-12
        assert rel_err(call(*ops), want) < 1e-12
    for i in range(len(ops)):
        strided = list(ops)
        strided[i] = _strided(xp, ops[i])
        assert not strided[i].flags.c_contiguous
        out = _poisoned(xp, want.shape)
        assert call(*strided, out=out) is out
        assert rel_err(out, want) < 1e-12
    if xp_name == "cupy":
        s = xp.cuda.Stream(non_blocking=True)
        out = _poisoned(xp, want.shape)
        xp.cuda.Device().synchronize()          # s does not wait for the null stream's fill
        assert call(*ops, out=out, stream=s) is out
        res = call(*ops, stream=s)              # allocated on s
        s.synchronize()
        assert rel_err(out, want) < 1e-12 and rel_err(res, want) < 1e-12


@pytest.mark.parametrize("xp_name", array_modules())
def test_contract_with_extents_repeated_calls(xp_name):
    """A contraction planned with extents reads each call's operands as views of those
    extents (step (4a): V[e, j1, j2, j3] as [j1 j2, j3, 1], B1d as [k3, j3, 1])."""
    xp = xp_of(xp_name)
    V, B1d = rng.random((7, 3, 3, 3)), rng.random((4, 3))
    want = np.einsum("kc,eabc->eabk", B1d, V)
    dV, dB = xp.asarray(V), xp.asarray(B1d)
    ext = dict(i=9, s=3, j=1, k=4, l=1)
    p = smalltc.plan("contract", dV, dB, kind="8a", extents=ext)
    for call in (lambda **kw: smalltc.contract("8a", dV, dB, extents=ext, **kw),
                 lambda **kw: p(dV, dB, **kw)):
        for _ in range(2):
            out = _poisoned(xp, (7, 9, 1, 4, 1))
            assert call(out=out) is out
            assert rel_err(out.reshape(7, 3, 3, 4), want) < 1e-12
    with pytest.raises(ValueError, match=r"X has shape \(6, 3, 3, 3\), but this plan was built "
                                         r"for \(7, 9, 3, 1\)"):
        p(dV[:6], dB)


@pytest.mark.parametrize("case", OPERATIONS, ids=OP_IDS)
def test_read_only_operands_are_copied(case):
    """A read-only NumPy operand (the CPU kernels take writeable arrays) gives the
    same answer, on every NumPy backend."""
    _, shapes, call, ref = case
    host = [rng.random(sh) for sh in shapes]
    want = ref(*host)
    for x in host:
        x.flags.writeable = False
    for be in [b.name for b in backends.candidates("numpy")]:
        assert rel_err(call(*host, backend=be), want) < 1e-12, be


@pytest.mark.parametrize("xp_name", array_modules())
def test_one_plan_cache_for_every_operation(xp_name):
    """The four public operations share one cache keyed on the call signature: a
    repeated signature reuses its plan object; a flag that chooses another spec (GEMM
    transposes, beta == 0, contraction extents, backend) gets its own entry."""
    xp = xp_of(xp_name)
    _PLANS.clear()
    cases = [(call, [xp.asarray(rng.random(sh)) for sh in shapes])
             for _, shapes, call, _ in OPERATIONS]
    for n, (call, ops) in enumerate(cases, 1):
        call(*ops)
        assert len(_PLANS) == n
    first = dict(_PLANS)
    for call, ops in cases:
        call(*ops)
        call(*[x.copy() for x in ops])                  # other arrays, same signature
    assert list(_PLANS) == list(first) and all(_PLANS[k] is p for k, p in first.items())
    assert {p.spec.op for p in _PLANS.values()} == {"action", "assembly", "gemm", "contract"}
    A, B, C = (xp.asarray(rng.random((6, 5, 5))) for _ in range(3))
    A2 = xp.asarray(rng.random((5, 5)))                  # shared by the batch
    X, Y = xp.asarray(rng.random((6, 3, 3, 1))), xp.asarray(rng.random((2, 3, 4)))
    variants = [lambda: smalltc.batched_gemm(A, B),
                lambda: smalltc.batched_gemm(A, B, C),          # beta == 0: C not an operand
                lambda: smalltc.batched_gemm(A, B, trans_a=True),
                lambda: smalltc.batched_gemm(A2, B, C, beta=1.0),
                lambda: smalltc.batched_gemm(A2, B, C, beta=-2.0),  # beta != 0 again
                lambda: smalltc.batched_gemm(A, B, backend="reference"),
                lambda: smalltc.contract("8a", X, Y),
                lambda: smalltc.contract("8a", X, Y, extents=dict(i=6, s=3, j=1, k=2, l=4))]
    new = [len(_PLANS)]
    for v in variants:
        v()
        new.append(len(_PLANS))
    assert [b - a for a, b in zip(new, new[1:])] == [1, 0, 1, 1, 0, 1, 1, 1]


def test_plan_cache_drops_the_oldest(monkeypatch):
    P = importlib.import_module("smalltc.plan")
    monkeypatch.setattr(P, "_MAX_PLANS", 2)
    _PLANS.clear()
    A = rng.random((3, 2, 2))
    for n in (2, 3, 4):
        smalltc.batched_gemm(A, rng.random((2, n)), backend="reference")
    assert [p.spec.n for p in _PLANS.values()] == [3, 4]


def test_operands_that_are_not_arrays_are_keyed_by_their_spec():
    """Lists (and objects with a shape that are not NumPy arrays) are converted on every
    call; their plan is cached under the spec they convert to."""
    _PLANS.clear()
    for _ in range(3):
        assert np.allclose(smalltc.batched_gemm([[1.0, 2.0]], [[[3.0], [4.0]]]), [[[11.0]]])
    assert len(_PLANS) == 1
    (key,) = _PLANS
    assert key[0] == next(iter(_PLANS.values())).spec


def test_plan_builds_a_new_plan_each_time():
    """``smalltc.plan`` returns a new Plan on every call and leaves the cache alone."""
    A, B = rng.random((5, 2, 2)), rng.random((5, 2, 2))
    _PLANS.clear()
    p, q = (smalltc.plan("gemm", A, B, backend="cpu") for _ in range(2))
    assert p is not q and p.kernel == q.kernel and not _PLANS
    assert rel_err(p(A, B), A @ B) < 1e-12 and rel_err(q(A, B), A @ B) < 1e-12


class _Recording(ReferenceBackend):
    """The reference backend under another name, recording how ``build`` is called."""

    name = "recording"
    priority = -1

    def __init__(self):
        self.calls = []

    def build(self, spec, *args, **kwargs):
        self.calls.append((spec.op, args, kwargs))
        return super().build(spec)


def test_params_reach_the_backend(monkeypatch):
    """``plan(..., params=)`` reaches ``build(spec, params=...)`` as a keyword; without
    params the backend is called as ``build(spec)`` (it chooses)."""
    stub = _Recording()
    monkeypatch.setitem(backends._REGISTRY, stub.name, stub)
    A, B = rng.random((5, 2, 3)), rng.random((5, 3, 2))
    p = smalltc.plan("gemm", A, B, backend="recording", params={"BLK_M": 2, "dim_x": 4})
    assert rel_err(p(A, B), A @ B) < 1e-12 and p.backend == "recording"
    smalltc.plan("gemm", A, B, backend="recording")
    smalltc.batched_gemm(A, B, backend="recording")
    assert stub.calls == [("gemm", (), {"params": {"BLK_M": 2, "dim_x": 4}}),
                          ("gemm", (), {}), ("gemm", (), {})]


PARAMS_ERRORS = [  # (plan keywords, exception, pattern)
    (dict(backend="reference", params={"T": 4}), ValueError,
     r"the reference backend has no tuning parameters; got params \{'T': 4\}"),
    (dict(backend="reference", params={}), ValueError, r"reference backend .* got params \{\}"),
    (dict(backend="cpu", params={"W": 8}), ValueError,
     r"params \{'W': 8\} do not fit .* on the cpu backend \(action family"),
    (dict(method="pairwise", params={"T": 4}), ValueError,
     r"params choose the fused kernel's tuning; method='pairwise'"),
]


@pytest.mark.parametrize("kw,exc,match", PARAMS_ERRORS)
def test_params_that_do_not_fit(kw, exc, match):
    B1d, D, V = rng.random((4, 3)), rng.random((5, 4, 4)), rng.random((5, 3, 3))
    with pytest.raises(exc, match=match):
        smalltc.plan("action", B1d, D, V, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("xp_name", [p for p in array_modules() if p.id == "cupy"])
def test_float32_scalar_beyond_range(xp_name):
    """A float32 alpha beyond float32's range: inf, as NumPy's float32 gives (``struct``
    packs it as inf or raises OverflowError, and then the RawKernel launch converts it)."""
    cp = xp_of(xp_name)
    A = cp.ones((8, 2, 2), dtype=np.float32)
    out = smalltc.batched_gemm(A, A, alpha=1e40)
    assert np.isinf(to_numpy(out)).all()


def test_launcher_packs_parameters(monkeypatch):
    """The driver launch gets one pointer per parameter, each at its value (C padding)."""
    pytest.importorskip("cupy")
    from smalltc.backends.cuda import runtime as RT
    seen = {}

    class Drv:
        CUDADriverError = RuntimeError

        @staticmethod
        def launchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            ptrs = (ctypes.c_void_p * 4).from_address(params)
            seen.update(f=f, grid=(gx, gy, gz), block=(bx, by, bz), smem=smem, extra=extra,
                        p=ctypes.c_uint64.from_address(ptrs[0]).value,
                        a=ctypes.c_float.from_address(ptrs[1]).value,
                        q=ctypes.c_int64.from_address(ptrs[2]).value,
                        d=ctypes.c_double.from_address(ptrs[3]).value)

    class Kern:
        kernel = type("F", (), {"ptr": 1234})()

    L = RT.Launcher(Kern(), "Pfqd", 7, 128, 4096)
    monkeypatch.setattr(L, "_drv", Drv)
    monkeypatch.setattr(L, "_stream", lambda: type("S", (), {"ptr": 0})())
    L(0xDEADBEEF, 1.5, -(2 ** 40), 2.25)
    assert seen == dict(f=1234, grid=(7, 1, 1), block=(128, 1, 1), smem=4096, extra=0,
                        p=0xDEADBEEF, a=1.5, q=-(2 ** 40), d=2.25)
    assert struct.calcsize("Pfqd") == 32
    assert RT.direct_launcher(Kern(), "Pq", 0, 128, 0) is None      # nothing to launch


@pytest.mark.gpu
@pytest.mark.parametrize("xp_name", [p for p in array_modules() if p.id == "cupy"])
def test_calls_captured_in_a_cuda_graph(xp_name):
    """The recipe for calls shorter than their launch: capture plan calls on a stream
    into a CUDA graph and replay it; each replay reads the arrays' current contents."""
    cp = xp_of(xp_name)
    A, B, C = (cp.asarray(rng.standard_normal((1000, 3, 3))) for _ in range(3))
    B1d, D, V = (cp.asarray(x) for x in (rng.random((4, 3)), rng.random((50, 4, 4, 4)),
                                         rng.random((50, 3, 3, 3))))
    g = smalltc.plan("gemm", A, B, C, beta=1.0)
    a = smalltc.plan("action", B1d, D, V)
    out, U = _poisoned(cp, (1000, 3, 3)), _poisoned(cp, (50, 3, 3, 3))
    cp.cuda.Device().synchronize()       # s does not wait for the null stream's copies
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        g(A, B, C, out=out, beta=1.0)                    # warm (compiles) before capturing
        a(B1d, D, V, out=U)
        s.synchronize()
        s.begin_capture()
        g(A, B, C, out=out, beta=1.0)
        a(B1d, D, V, out=U)
        graph = s.end_capture()
    for _ in range(2):
        with s:                                          # the same stream as the replay
            A += 1.0                                     # new contents, same buffers
            V *= 2.0
            out.fill(np.nan)
            U.fill(np.nan)
            graph.launch(s)
        s.synchronize()
        hA, hB, hC = (to_numpy(x) for x in (A, B, C))
        assert rel_err(out, hA @ hB + hC) < 1e-12
        assert rel_err(U, oracle.action(to_numpy(B1d), to_numpy(D), to_numpy(V))) < 1e-12


@pytest.mark.parametrize("op, what", [("interpolate", "values"), ("integrate", "both")])
def test_basis_plan_is_the_functions(op, what):
    """``smalltc.plan("interpolate"|"integrate", B1d, G1d, field, elem_dofs)``: the spec and
    backend of the plan the public function caches, and the same result."""
    B, G = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    m = rng.integers(0, 40, size=(5, 3, 3, 3)).astype(np.int32)
    G = None if what == "values" else G
    H = rng.standard_normal((5, 4, 4, 4, 4))
    field = rng.standard_normal(40) if op == "interpolate" else H
    kw = dict(what=what) if op == "interpolate" else dict(what=what, ndofs=40)
    pl = smalltc.plan(op, B, G, field, m, **kw)
    want = getattr(smalltc, op)(B, G, field, m, **kw)
    cached = next(p for p in reversed(list(_PLANS.values())) if p.spec == pl.spec)
    assert pl.spec.transpose == (op == "integrate") and pl.spec.what == what
    assert (pl.backend, str(pl.kernel)) == (cached.backend, str(cached.kernel))
    out = _poisoned(np, pl.out_shape)
    pl(B, G, field, m, out=out)
    assert rel_err(out, want) < 1e-14
    with pytest.raises(TypeError, match="takes B1d, G1d"):
        smalltc.plan(op, B, G)
