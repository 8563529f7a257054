"""Every bad input gets a clear error that names the operand."""
import inspect
import re

import numpy as np
import pytest

import smalltc
from smalltc import backends

rng = np.random.default_rng(0)
B1d = rng.random((5, 4))
D3 = rng.random((10, 5, 5, 5))
V3 = rng.random((10, 4, 4, 4))

ACTION_ERRORS = [  # (B1d, D, V, exception, message pattern)
    (rng.random(5), D3, V3, ValueError, r"B1d has shape \(5,\), expected \(nq, nd\)"),
    (B1d, rng.random((10, 4, 4)), V3, ValueError,
     r"D has shape \(10, 4, 4\), expected \(10, 5, 5\) for nq=5, dim=2"),
    (B1d, rng.random((10, 5, 5, 5, 5)), V3, ValueError, r"D has shape \(10, 5, 5, 5, 5\)"),
    (B1d, D3, rng.random((10, 3, 3, 3)), ValueError,
     r"V has shape \(10, 3, 3, 3\), expected \(10, 4, 4, 4\)"),
    (B1d, D3, rng.random((9, 4, 4, 4)), ValueError, r"V has shape \(9, 4, 4, 4\).*E from D"),
    (B1d, D3, rng.random((10, 4, 4)), ValueError, r"V has shape \(10, 4, 4\)"),
    (B1d.astype(np.float32), D3, V3, TypeError, r"mixed dtypes \(B1d is float32, D is float64"),
    (B1d, D3.astype(np.int64), V3, TypeError, r"D has dtype int64; smalltc supports"),
    (B1d, D3, V3.astype(np.complex128), TypeError, r"V has dtype complex128"),
    (None, D3, V3, TypeError, r"B1d is None"),
]


@pytest.mark.parametrize("B,D,V,exc,match", ACTION_ERRORS)
def test_action_errors(B, D, V, exc, match):
    with pytest.raises(exc, match=match):
        smalltc.batched_contract(B, D, V)


def test_assembly_errors():
    with pytest.raises(ValueError, match=r"D has shape \(10, 4, 4, 4\), expected \(10, 5, 5, 5\)"):
        smalltc.assemble_mass(B1d, rng.random((10, 4, 4, 4)))
    with pytest.raises(TypeError, match=r"mixed dtypes"):
        smalltc.assemble_mass(B1d, D3.astype(np.float32))


def _read_only(shape):
    x = np.empty(shape)
    x.flags.writeable = False
    return x


OUT_ERRORS = [
    (np.empty((10, 4, 4, 3)), ValueError, r"out has shape \(10, 4, 4, 3\), expected \(10, 4, 4, 4\)"),
    (np.empty((10, 4, 4, 4), np.float32), TypeError, r"out has dtype float32, expected float64"),
    (np.empty((10, 4, 4, 4), order="F"), ValueError, r"out must be C-contiguous"),
    (V3, ValueError, r"out overlaps the input V"),
    (_read_only((10, 4, 4, 4)), ValueError, r"out is read-only \(its writeable flag is False\)"),
    (np.broadcast_to(np.empty((4, 4, 4)), (10, 4, 4, 4)), ValueError, r"out must be C-contiguous"),
    ([[0.0]], TypeError, r"out must be a numpy array of shape \(10, 4, 4, 4\), got list"),
    (np.empty((10, 4, 4, 4)).tolist(), TypeError, r"out must be a numpy array .* got list"),
    (3.0, TypeError, r"out must be a numpy array .* got float"),
]


@pytest.mark.parametrize("backend", [b.name for b in backends.candidates("numpy")])
@pytest.mark.parametrize("out,exc,match", OUT_ERRORS)
def test_out_errors(out, exc, match, backend):
    """An unusable out gets an error naming it, on every NumPy backend, on the first
    call (plan built) and on a repeated one (plan cached)."""
    smalltc.batched_contract(B1d, D3, V3, backend=backend)
    for _ in range(2):
        with pytest.raises(exc, match=match):
            smalltc.batched_contract(B1d, D3, V3, out=out, backend=backend)


OUT_ERRORS_EVERY_OP = [  # (the call with out=, pattern): read-only and non-array out
    (lambda out: smalltc.assemble_mass(B1d, D3, out=out), (10, 64, 64)),
    (lambda out: smalltc.batched_gemm(rng.random((3, 2, 2)), rng.random((2, 2)), out=out),
     (3, 2, 2)),
    (lambda out: smalltc.contract("8a", rng.random((3, 2, 1)), rng.random((5, 4, 2, 1)),
                                  out=out), (5, 3, 1, 4, 1)),
]


@pytest.mark.parametrize("call,shape", OUT_ERRORS_EVERY_OP)
def test_out_errors_every_operation(call, shape):
    with pytest.raises(ValueError, match="out is read-only"):
        call(_read_only(shape))
    with pytest.raises(TypeError, match=r"out must be a numpy array of shape"):
        call(np.zeros(shape).tolist())


def test_out_overlapping_a_slice_of_input():
    buf = np.zeros((20, 4, 4, 4))
    V = buf[:10]
    V[...] = V3
    with pytest.raises(ValueError, match="out overlaps the input V"):
        smalltc.batched_contract(B1d, D3, V, out=buf[5:15])
    U = smalltc.batched_contract(B1d, D3, V, out=buf[10:])      # adjacent, no overlap
    assert np.allclose(U, smalltc.batched_contract(B1d, D3, V3))


GEMM_ERRORS = [  # (kwargs, exception, pattern)
    (dict(A=rng.random((4, 2, 3)), B=rng.random((4, 4, 5))), ValueError,
     r"inner dimensions differ: op\(A\) is 2 x 3 \(A has shape \(4, 2, 3\)"),
    (dict(A=rng.random((4, 2, 3)), B=rng.random((5, 3, 5))), ValueError, r"batch counts differ"),
    (dict(A=rng.random((2, 3)), B=rng.random((3, 5))), ValueError, r"both 2D"),
    (dict(A=rng.random((4, 2, 3)), B=rng.random((3, 5)), alpha=np.nan), ValueError,
     r"alpha must be finite, got nan"),
    (dict(A=rng.random((4, 2, 3)), B=rng.random((3, 5)), beta=np.inf, C=rng.random((4, 2, 5))),
     ValueError, r"beta must be finite, got inf"),
    (dict(A=rng.random((4, 2, 3)), B=rng.random((3, 5)), beta=1.0), ValueError, r"beta=1.0 needs C"),
    (dict(A=rng.random((4, 2, 3)), B=rng.random((3, 5)), beta=1.0, C=rng.random((4, 5, 2))),
     ValueError, r"C has shape \(4, 5, 2\), expected \(4, 2, 5\)"),
    (dict(A=rng.random((4, 2, 3)), B=rng.random((3, 5)).astype(np.float32)), TypeError,
     r"mixed dtypes \(A is float64, B is float32\)"),
    (dict(A=rng.random((4, 2, 3, 1)), B=rng.random((3, 5))), ValueError,
     r"A has shape \(4, 2, 3, 1\), expected \(batch, rows, cols\)"),
    (dict(A=rng.random((4, 2, 3)), B=rng.random((3, 5)), alpha="x"), TypeError,
     r"alpha must be a real number"),
]


@pytest.mark.parametrize("kw,exc,match", GEMM_ERRORS)
def test_gemm_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        smalltc.batched_gemm(**kw)


CONTRACT_ERRORS = [
    (("8c", rng.random((3, 2, 1)), rng.random((4, 3, 2, 1))), {}, ValueError, r"kind must be"),
    (("8a", rng.random((3, 2, 1)), rng.random((4, 3, 3, 1))), {}, ValueError,
     r"contracted extents differ"),
    (("8a", rng.random((3, 2, 1)), rng.random((3, 2, 1))), {}, ValueError,
     r"exactly one batch count"),
    (("9", rng.random((4, 3, 2)), rng.random((4, 3, 3, 1))), {}, ValueError,
     r"X \(B\) has shape \(4, 3, 2\); kernel '9' takes one B\[s, n\]"),
    (("9", rng.random((4, 3, 2, 1)), rng.random((4, 3, 2, 1))), {}, ValueError,
     r"X has shape \(4, 3, 2, 1\), expected \[s, n\]"),
    (("8a", rng.random(10), rng.random(12)), dict(extents=dict(i=2, s=3, j=1, k=2, l=2)),
     ValueError, r"X has shape \(10,\) \(10 entries\), which cannot be seen as \(2, 3, 1\)"),
    (("8a", rng.random(6), rng.random(12)), dict(extents=dict(i=2, s=3, j=1)), ValueError,
     r"extents lacks \['k', 'l'\]"),
    (("9", rng.random((3, 2)), rng.random((4, 3, 2))), dict(extents=dict(i=2, s=3, j=3, k=4, l=2)),
     ValueError, r"kind '9' needs i == j"),
]


@pytest.mark.parametrize("args,kw,exc,match", CONTRACT_ERRORS)
def test_contract_errors(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        smalltc.contract(*args, **kw)


def test_plan_errors():
    with pytest.raises(ValueError, match=r"op must be 'action', 'assembly', 'gemm', 'contract', 'mass_apply' or 'mass_diagonal'"):
        smalltc.plan("mass", B1d, D3)
    with pytest.raises(ValueError, match=r"method must be one of"):
        smalltc.batched_contract(B1d, D3, V3, method="fast")
    with pytest.raises(ValueError, match=r"method='pairwise' applies to the action and assembly"):
        smalltc.plan("gemm", rng.random((2, 2, 2)), rng.random((2, 2)), method="pairwise")
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'"):
        smalltc.batched_contract(B1d, D3, V3, backend="tpu")
    p = smalltc.plan("action", B1d, D3, V3)
    with pytest.raises(ValueError, match=r"V has shape \(10, 3, 3, 3\), but this plan was built for"):
        p(B1d, D3, rng.random((10, 3, 3, 3)))
    with pytest.raises(TypeError, match=r"V has dtype float32, but this plan was built for float64"):
        p(B1d, D3, V3.astype(np.float32))
    with pytest.raises(TypeError, match=r"stream= is for CuPy arrays"):
        p(B1d, D3, V3, stream=object())
    g = smalltc.plan("gemm", rng.random((2, 2, 2)), rng.random((2, 2)))
    with pytest.raises(ValueError, match=r"built for beta==0, got beta=1.0"):
        g(rng.random((2, 2, 2)), rng.random((2, 2)), rng.random((2, 2, 2)), beta=1.0)


def test_backend_wrong_array_module():
    with pytest.raises(TypeError, match=r"backend 'cuda' takes cupy arrays, got numpy arrays"):
        smalltc.batched_contract(B1d, D3, V3, backend="cuda")


def test_mixing_numpy_and_cupy():
    from smalltc._arrays import cupy_or_none, gpu_available
    cp = cupy_or_none()
    if cp is None or not gpu_available():
        pytest.skip("needs a CUDA device")
    with pytest.raises(TypeError, match=r"mix NumPy and CuPy arrays"):
        smalltc.batched_contract(cp.asarray(B1d), D3, V3)


def test_batched_gemm_repeat_calls_stay_checked():
    """A cached plan (a repeated call signature) still checks what varies between
    calls: out, scalars, and a new signature in full."""
    rng = np.random.default_rng(3)
    A, B, C = (rng.standard_normal((5, 3, 3)) for _ in range(3))
    for _ in range(2):                                   # the second call: the cached plan
        assert np.allclose(smalltc.batched_gemm(A, B, C, beta=0.5), A @ B + 0.5 * C)
    with pytest.raises(ValueError, match="out has shape"):
        smalltc.batched_gemm(A, B, C, beta=0.5, out=np.empty((5, 3, 4)))
    with pytest.raises(ValueError, match="finite"):
        smalltc.batched_gemm(A, B, C, beta=float("inf"))
    with pytest.raises(ValueError, match="needs C"):
        smalltc.batched_gemm(A, B, beta=0.5)
    with pytest.raises(ValueError, match="inner dimensions"):
        smalltc.batched_gemm(A, rng.standard_normal((5, 4, 3)))
    with pytest.raises(TypeError, match="mixed dtypes"):
        smalltc.batched_gemm(A, B.astype(np.float32))
    with pytest.raises(TypeError, match="beta must be a real number"):
        smalltc.batched_gemm(A, B, C, beta=np.ones(2))
    assert np.allclose(smalltc.batched_gemm([[1.0, 2.0]], [[[3.0], [4.0]]]), [[[11.0]]])


# The public parameter names: each function's signature, as its docstring documents it.
PUBLIC = [
    (smalltc.batched_contract, dict(B1d=B1d, D=D3, V=V3)),
    (smalltc.assemble_mass, dict(B1d=B1d, D=D3)),
    (smalltc.batched_gemm, dict(A=rng.random((3, 2, 4)), B=rng.random((4, 5)),
                                C=rng.random((3, 2, 5)), beta=1.0)),
    (smalltc.contract, dict(kind="8b", X=rng.random((3, 2, 1)), Y=rng.random((4, 3, 2, 1)))),
    (smalltc.plan, dict(op="assembly")),
]


def _documented(fn):
    """Names in the docstring's Parameters section (``a, b : ...`` lines)."""
    doc = inspect.getdoc(fn)
    section = doc.split("Parameters\n----------\n", 1)[1].split("\n\n", 1)[0]
    section = re.split(r"\n(?:Returns|Raises)\n", section)[0]
    names = set()
    for line in section.splitlines():
        m = re.match(r"^\*?(\w+(?:, \w+)*) :", line)
        if m:
            names.update(m.group(1).split(", "))
    return names


@pytest.mark.parametrize("fn,kw", PUBLIC, ids=lambda x: getattr(x, "__name__", ""))
def test_public_parameter_names_as_documented(fn, kw):
    sig = inspect.signature(fn).parameters
    assert set(sig) - {"operands"} == _documented(fn) - {"operands"}
    if fn is not smalltc.plan:
        positional = [v for n, v in kw.items() if sig[n].kind is sig[n].POSITIONAL_OR_KEYWORD]
        keywords = {n: v for n, v in kw.items() if sig[n].kind is sig[n].KEYWORD_ONLY}
        ref = fn(*positional, **keywords, backend="reference")
        assert np.allclose(fn(**kw, backend="reference"), ref)    # every operand by name


PLAN_CALL_ERRORS = [  # (plan call, exception, pattern)
    (lambda p: p(B1d, D3), TypeError, r"this plan takes 3 operands \(B1d, D, V\), got 2"),
    (lambda p: p(B1d, D3, V3.tolist()), TypeError,
     r"V is a list, but this plan was built for numpy arrays"),
    (lambda p: p(B1d, None, V3), TypeError, r"D is None; expected an array"),
    (lambda p: p(B1d, D3, V3, alpha=2.0), TypeError,
     r"alpha and beta are GEMM options; this plan runs action_3d p=3 nq=5 E=10"),
    (lambda p: p(B1d, D3, V3, beta=1.0), TypeError, r"alpha and beta are GEMM options"),
]


@pytest.mark.parametrize("call,exc,match", PLAN_CALL_ERRORS)
def test_plan_call_errors(call, exc, match):
    p = smalltc.plan("action", B1d, D3, V3)
    with pytest.raises(exc, match=match):
        call(p)


def test_out_from_the_other_library():
    from smalltc._arrays import cupy_or_none, gpu_available
    cp = cupy_or_none()
    if cp is None or not gpu_available():
        pytest.skip("needs a CUDA device")
    with pytest.raises(TypeError, match=r"out is a cupy array but the operands are numpy"):
        smalltc.batched_contract(B1d, D3, V3, out=cp.empty(V3.shape))
    dB, dD, dV = (cp.asarray(x) for x in (B1d, D3, V3))
    with pytest.raises(TypeError, match=r"out is a numpy array but the operands are cupy"):
        smalltc.batched_contract(dB, dD, dV, out=np.empty(V3.shape))
    p = smalltc.plan("action", B1d, D3, V3)
    with pytest.raises(TypeError, match=r"V is a cupy array, but this plan was built for "
                                        r"numpy arrays"):
        p(B1d, D3, dV)
