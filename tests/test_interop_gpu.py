"""torch and JAX CUDA arrays on the GPU, and CuPy's solvers with smalltc.fem's operators.

Every public operation (:mod:`interop_cases`) with torch CUDA tensors on a
non-default torch stream and with JAX GPU arrays, against the float64 oracle;
the stream rule checked directly (a kernel queued on the wrong stream would be
overtaken); CuPy's ``cg`` with the GPU mass operator and Jacobi. Skipped without a
CUDA device (and each library's part without that library's CUDA support): run on
the device machine, whose image has torch and JAX with CUDA.
"""
import inspect
import os

import numpy as np
import pytest

import smalltc
from smalltc._arrays import cupy_or_none, gpu_available

from interop_cases import CASES, TOL, rel_err

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX: share the GPU

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(),
                                 reason="no CUDA device (cupy device query failed)")]


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if gpu_available() and torch.cuda.is_available() else None


def _jax_gpu():
    if not gpu_available():
        return None
    try:
        import jax
        return jax, jax.devices("gpu")[0]
    except Exception:              # no jax, or a CPU-only jaxlib
        return None


torch = _torch_cuda()
JAX = _jax_gpu()
needs_torch = pytest.mark.skipif(torch is None, reason="torch with CUDA is not installed")
needs_jax = pytest.mark.skipif(JAX is None, reason="jax with a GPU backend is not installed")


def _sleep_on_default_stream():
    """A long kernel on the legacy default stream, where work on a wrong stream (CuPy's
    default) would queue behind it; torch's own streams do not wait for it."""
    with torch.cuda.stream(torch.cuda.default_stream()):
        torch.cuda._sleep(200_000_000)


@needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_cuda_every_operation_on_a_side_stream(case, dtype):
    """On a non-default torch stream ``s``: the result is a CUDA tensor, right, and the
    work ran on ``s``: ``out`` read on ``s`` right after the call (no DLPack hand-over
    orders it) holds the answer although the default stream is busy."""
    make, call, ref = CASES[case]
    ops = make(dtype)
    want = ref(*ops)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = [torch.from_numpy(a).to("cuda") for a in ops]
        res = call(*t)
        out = torch.full(tuple(res.shape), float("nan"), dtype=res.dtype, device="cuda")
        s.synchronize()
        _sleep_on_default_stream()
        assert call(*t, out=out) is out
        seen = out.clone()                         # on s, right after
    s.synchronize()
    assert isinstance(res, torch.Tensor) and res.is_cuda and res.dtype == getattr(torch, dtype)
    assert rel_err(res.cpu().numpy(), want) <= TOL[dtype]
    assert rel_err(seen.cpu().numpy(), want) <= TOL[dtype]
    torch.cuda.synchronize()


@needs_torch
@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_torch_cuda_explicit_stream(kind):
    """``stream=`` a torch stream or a CuPy stream: the work runs there."""
    make, call, ref = CASES["action-3d"]
    ops = make("float64")
    t = [torch.from_numpy(a).to("cuda") for a in ops]
    out = torch.full(tuple(t[2].shape), float("nan"), dtype=torch.float64, device="cuda")
    ts = torch.cuda.Stream()
    stream = ts if kind == "torch" else cupy_or_none().cuda.ExternalStream(ts.cuda_stream)
    torch.cuda.synchronize()
    _sleep_on_default_stream()
    call(*t, out=out, stream=stream)
    with torch.cuda.stream(ts):
        seen = out.clone()
    ts.synchronize()
    assert rel_err(seen.cpu().numpy(), ref(*ops)) <= 1e-12
    torch.cuda.synchronize()


@needs_torch
def test_torch_cuda_plan_and_errors():
    make, _, ref = CASES["mass_apply-2d"]
    ops = make("float64")
    t = [torch.from_numpy(a).to("cuda") for a in ops]
    p = smalltc.plan("mass_apply", *t)
    assert p.xp is cupy_or_none() and p.backend == "cuda"
    y = p(*t)
    assert y.is_cuda and rel_err(y.cpu().numpy(), ref(*ops)) <= 1e-12
    cp = cupy_or_none()
    assert isinstance(p(*[cp.asarray(a) for a in ops]), cp.ndarray)
    with pytest.raises(TypeError, match=r"B1d is a torch array on the CPU, but this plan was "
                                        r"built for CuPy arrays"):
        p(*[torch.from_numpy(a) for a in ops])
    B1d, D, x, m = t
    with pytest.raises(ValueError, match=rf"D is on the CPU but B1d is on {B1d.device}; move "
                                         r"them to one device"):
        smalltc.mass_apply(B1d, D.cpu(), x, m)
    with pytest.raises(TypeError, match=r"B1d is a torch array, D is a cupy array"):
        smalltc.mass_apply(B1d, cp.asarray(ops[1]), x, m)
    with pytest.raises(TypeError, match=r"x requires grad"):
        smalltc.mass_apply(B1d, D, x.clone().requires_grad_(), m)
    with pytest.raises(ValueError, match=r"out must be C-contiguous"):
        smalltc.batched_gemm(*[torch.from_numpy(a).to("cuda") for a in CASES["gemm"][0]("float64")],
                             out=torch.empty(6, 2, 4, dtype=torch.float64,
                                             device="cuda").transpose(1, 2))


@needs_jax
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_jax_gpu_every_operation(case, dtype):
    jax, gpu = JAX
    make, call, ref = CASES[case]
    ops = make(dtype)
    with jax.enable_x64(True):
        res = call(*[jax.device_put(a, gpu) for a in ops])
        assert isinstance(res, jax.Array) and res.dtype == np.dtype(dtype)
        assert {d.platform for d in res.devices()} == {"gpu"}
        assert rel_err(np.asarray(res), ref(*ops)) <= TOL[dtype]
        doubled = np.asarray(res * 2)            # JAX's own work on the result
        assert rel_err(doubled, 2 * ref(*ops)) <= TOL[dtype]


# ---- CuPy's solvers with smalltc.fem's GPU operators -----------------------------------

def _gpu_problem():
    from smalltc.fem import H1Space, box_mesh, jacobi, mass_operator
    M = mass_operator(H1Space(box_mesh(3, 4, distortion=0.05), p=3), device="gpu")
    cp = cupy_or_none()
    b = M(cp.asarray(np.random.default_rng(0).random(M.shape[0]) + 0.5))
    return M, jacobi(M.diagonal()), b


def _rtol(fn):
    return "rtol" if "rtol" in inspect.signature(fn).parameters else "tol"


def test_cupy_cg_with_the_gpu_operator():
    """cupyx.scipy.sparse.linalg.cg on the operator (and its LinearOperator) with the
    Jacobi preconditioner: smalltc's CG's solution to 1e-10."""
    from cupyx.scipy.sparse.linalg import LinearOperator, cg as cupy_cg
    from smalltc.fem import cg
    cp = cupy_or_none()
    M, P, b = _gpu_problem()
    ours = cg(M, b, tol=1e-13, precond=P, maxiter=2000).x
    A = M.aslinearoperator()
    assert isinstance(A, LinearOperator) and isinstance(P.aslinearoperator(), LinearOperator)
    for op in (M, A):
        x, info = cupy_cg(op, b, maxiter=2000, M=P.aslinearoperator(),
                          **{_rtol(cupy_cg): 1e-13})
        assert info == 0 and isinstance(x, cp.ndarray)
        assert float(cp.linalg.norm(x - ours) / cp.linalg.norm(ours)) <= 1e-10


def test_scipy_cg_with_the_gpu_operator():
    """SciPy's CG (host vectors) with the GPU operator: matvec returns host vectors."""
    sla = pytest.importorskip("scipy.sparse.linalg")
    M, P, b = _gpu_problem()
    x, info = sla.cg(M, b.get(), rtol=1e-13, maxiter=2000, M=P)
    assert info == 0 and isinstance(x, np.ndarray)
    assert np.linalg.norm(M.matvec(x) - b.get()) <= 1e-12 * np.linalg.norm(b.get())
