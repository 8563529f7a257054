"""Repeated plan calls: the CuPy fast path (``Plan._call_fast``) and the driver launch
(``Launcher``) give the same results and the same errors as the checked path.

Each call is checked against a float64 NumPy reference with the output poisoned
first; the error cases are the ones the fast path must hand to the general path.
"""
import ctypes
import struct

import numpy as np
import pytest

import smalltc
from smalltc.backends import _cuda_runtime as RT
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
    """Valid calls the fast path does not take: converted by the checked path."""
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
