"""Arrays of other libraries on the CPU: torch tensors, JAX arrays, any DLPack producer.

Every public operation (the table in :mod:`interop_cases`) with torch CPU tensors
and JAX CPU arrays against the float64 einsum oracle, the result in the caller's
library; plans; ``out=``; every error path (mixed libraries and devices, grad,
immutable ``out``, traced values, devices smalltc does not run on); the documented
copies (non-contiguous, negatively strided). torch and JAX are optional: their
tests skip without them, and a small DLPack producer defined here stands in for
"any library" (it runs everywhere).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import smalltc
from smalltc import _interop

from interop_cases import CASES, TOL, rel_err

try:
    import torch
except ImportError:
    torch = None
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX with a GPU: share it
try:
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = jnp = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
needs_jax = pytest.mark.skipif(jax is None, reason="jax is not installed")


class Producer:
    """Any DLPack producer: a NumPy array behind ``__dlpack__``, reporting ``device``
    (a DLPack ``(type, id)``) if given; no ``__array_namespace__``, so results come
    back as NumPy arrays."""

    def __init__(self, a, device=None):
        self.a, self.device = a, device
        self.shape, self.dtype = a.shape, a.dtype

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device or self.a.__dlpack_device__()


def _torch(ops):
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in ops]


def _jax(ops):
    cpu = jax.devices("cpu")[0]                  # (the device machine's JAX has a GPU too)
    return [jax.device_put(a, cpu) for a in ops]


# ---- every operation, every library ---------------------------------------------------

@needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_cpu_every_operation(case, dtype):
    make, call, ref = CASES[case]
    ops = make(dtype)
    res = call(*_torch(ops))
    assert isinstance(res, torch.Tensor) and res.device.type == "cpu"
    assert res.dtype == getattr(torch, dtype)
    assert rel_err(res.numpy(), ref(*ops)) <= TOL[dtype]
    out = torch.full(tuple(res.shape), float("nan"), dtype=res.dtype)
    assert call(*_torch(ops), out=out) is out                   # written in place
    assert rel_err(out.numpy(), ref(*ops)) <= TOL[dtype]


@needs_jax
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_jax_cpu_every_operation(case, dtype):
    make, call, ref = CASES[case]
    ops = make(dtype)
    with jax.enable_x64(True):                   # JAX keeps float64 only with x64 on
        res = call(*_jax(ops))
        assert isinstance(res, jax.Array) and res.dtype == np.dtype(dtype)
        assert {d.platform for d in res.devices()} == {"cpu"}
        assert rel_err(np.asarray(res), ref(*ops)) <= TOL[dtype]


@pytest.mark.parametrize("case", list(CASES))
def test_any_dlpack_producer_gives_numpy(case):
    """A library without ``__array_namespace__`` gets NumPy arrays back."""
    make, call, ref = CASES[case]
    ops = make("float64")
    res = call(*[Producer(a) for a in ops])
    assert type(res) is np.ndarray
    assert rel_err(res, ref(*ops)) <= TOL["float64"]


@needs_torch
def test_torch_plan_and_zero_copy():
    """A plan built from torch tensors runs torch tensors (and NumPy arrays); inputs are
    read in place (a change to a tensor is seen), out is the caller's tensor."""
    make, _, ref = CASES["action-3d"]
    ops = make("float64")
    B1d, D, V = (torch.tensor(a) for a in ops)
    r = ref(*ops)
    p = smalltc.plan("action", B1d, D, V)
    assert p.xp is np
    U = p(B1d, D, V)
    assert isinstance(U, torch.Tensor) and rel_err(U.numpy(), r) <= 1e-12
    V.mul_(2.0)                                    # the view sees it: no copy was kept
    assert rel_err(p(B1d, D, V).numpy(), 2 * r) <= 1e-12
    assert type(p(*ops)) is np.ndarray
    out = torch.empty_like(V)
    assert p(B1d, D, V, out=out) is out


@needs_torch
def test_torch_noncontiguous_is_copied():
    """Transposed or sliced tensors: the documented copy, the same answer."""
    make, call, ref = CASES["gemm"]
    A, B, C = make("float64")
    At = torch.from_numpy(np.ascontiguousarray(A.transpose(0, 2, 1))).transpose(1, 2)
    assert not At.is_contiguous()
    res = call(At, *_torch([B, C]))
    assert rel_err(res.numpy(), ref(A, B, C)) <= 1e-12
    big = torch.from_numpy(np.repeat(B, 2, axis=0))[::2]             # every other matrix
    assert rel_err(call(*_torch([A]), big, *_torch([C])).numpy(), ref(A, B, C)) <= 1e-12


def test_negative_strides_are_copied():
    make, call, ref = CASES["action-1d"]
    B1d, D, V = make("float64")
    Vr = Producer(np.ascontiguousarray(V[::-1])[::-1])              # strides < 0
    assert np.from_dlpack(Vr).strides[0] < 0
    assert rel_err(call(Producer(B1d), Producer(D), Vr), ref(B1d, D, V)) <= 1e-12


@needs_torch
def test_torch_map_view_is_kept_until_the_storage_changes():
    """smalltc.maps checks a map once per object: the view of a torch map is kept per
    tensor, and made anew when the tensor's storage or shape changes."""
    m = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    a = _interop.import_array("elem_dofs", m, keep=True)
    assert _interop.import_array("elem_dofs", m, keep=True) is a
    m.set_(torch.arange(12, dtype=torch.int64).reshape(3, 4) + 1)
    b = _interop.import_array("elem_dofs", m, keep=True)
    assert b is not a and int(b[0, 0]) == 1


def test_torch_and_jax_are_not_imported():
    """Neither is a dependency: NumPy calls (and importing smalltc) leave them out."""
    code = ("import sys, numpy as np, smalltc; "
            "smalltc.batched_contract(np.ones((3, 2)), np.ones((4, 3)), np.ones((4, 2)), "
            "backend='reference'); "
            "print(sorted(m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# ---- errors --------------------------------------------------------------------------

def _ops(case="action-1d", dtype="float64"):
    return CASES[case][0](dtype)


def _foreign_errors():
    """(id, call, exception, pattern) without torch or JAX: the stand-in producer."""
    B1d, D, V = _ops()
    cuda = (2, 0)
    return [
        ("producer-and-numpy", lambda: smalltc.batched_contract(Producer(B1d), D, V),
         TypeError, r"different array libraries: B1d is a test_interop array, D is a "
                    r"numpy array"),
        ("producer-and-list", lambda: smalltc.batched_contract(Producer(B1d), D.tolist(),
                                                               Producer(V)),
         TypeError, r"different array libraries: B1d is a test_interop array, D is a list"),
        ("numpy-and-producer-out", lambda: smalltc.batched_contract(
            B1d, D, V, out=Producer(np.empty_like(V))),
         TypeError, r"B1d is a numpy array, out is a test_interop array"),
        ("two-devices", lambda: smalltc.batched_contract(Producer(B1d), Producer(D, cuda),
                                                         Producer(V)),
         ValueError, r"D is on cuda:0 but B1d is on the CPU; move them to one device"),
        ("metal", lambda: smalltc.batched_contract(*[Producer(a, (8, 0)) for a in (B1d, D, V)]),
         TypeError, r"B1d is a test_interop array on a metal device; smalltc runs on the CPU"),
        ("broken-device", lambda: smalltc.batched_contract(
            *[Producer(a, "bad") for a in (B1d, D, V)]),
         TypeError, r"B1d is a test_interop array whose __dlpack_device__\(\) failed"),
        ("stream-on-cpu", lambda: smalltc.batched_contract(
            *[Producer(a) for a in (B1d, D, V)], stream=object()),
         TypeError, r"stream= is for arrays on a CUDA device; B1d is on the CPU"),
        ("out-not-contiguous", lambda: smalltc.batched_contract(
            *[Producer(a) for a in (B1d, D, V)], out=Producer(np.empty((4, 5)).T)),
         ValueError, r"out must be C-contiguous"),
        ("out-shape", lambda: smalltc.batched_contract(
            *[Producer(a) for a in (B1d, D, V)], out=Producer(np.empty((5, 3)))),
         ValueError, r"out has shape \(5, 3\), expected \(5, 4\)"),
        ("out-overlaps", lambda: smalltc.batched_contract(
            *[Producer(a) for a in (B1d, D)], Producer(V), out=Producer(V)),
         ValueError, r"out overlaps the input V"),
        ("shape", lambda: smalltc.batched_contract(*[Producer(a) for a in (B1d, D, V[:, :3])]),
         ValueError, r"V has shape \(5, 3\), expected \(5, 4\)"),
        ("dtype", lambda: smalltc.batched_contract(
            *[Producer(a) for a in (B1d, D, V.astype(np.float16))]),
         TypeError, r"V has dtype float16; smalltc supports float32 and float64"),
        ("mixed-dtypes", lambda: smalltc.batched_contract(
            *[Producer(a) for a in (B1d.astype(np.float32), D, V)]),
         TypeError, r"mixed dtypes \(B1d is float32, D is float64"),
        ("map-dtype", lambda: smalltc.mass_apply(*[Producer(a) for a in _fem_ops(np.float64)]),
         TypeError, r"elem_dofs has dtype float64, expected int32 or int64"),
        ("map-range", lambda: smalltc.mass_apply(*[Producer(a) for a in _fem_ops(np.int64, 99)]),
         ValueError, r"elem_dofs holds indices .* outside \[0, 25\)"),
    ]


def _fem_ops(map_dtype, shift=0):
    B1d, D, x, m = CASES["mass_apply-2d"][0]("float64")
    return B1d, D, x, (m + shift).astype(map_dtype)


@pytest.mark.parametrize("fn,exc,match", [pytest.param(*c[1:], id=c[0])
                                          for c in _foreign_errors()])
def test_foreign_errors(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_cuda_memory_without_a_gpu():
    from smalltc._arrays import gpu_available
    if gpu_available():
        pytest.skip("a GPU answers here (tests/test_interop_gpu.py runs CUDA tensors)")
    B1d, D, V = _ops()
    with pytest.raises(TypeError, match=r"B1d is a test_interop array on cuda:0, but "
                                        r"(CuPy is not installed|no CUDA device answers)"):
        smalltc.batched_contract(*[Producer(a, (2, 0)) for a in (B1d, D, V)])


def test_plan_device_mismatch():
    """A plan for NumPy arrays called with (stand-in) CUDA memory: the plan says what it
    was built for."""
    B1d, D, V = _ops()
    p = smalltc.plan("action", B1d, D, V)
    with pytest.raises(TypeError, match=r"B1d is a test_interop array on cuda:0, but this "
                                        r"plan was built for NumPy arrays \(the CPU\)"):
        p(*[Producer(a, (2, 0)) for a in (B1d, D, V)])
    with pytest.raises(TypeError, match=r"different array libraries"):
        p(Producer(B1d), D, V)


@needs_torch
def test_torch_errors():
    B1d, D, V = _torch(_ops())
    with pytest.raises(TypeError, match=r"different array libraries: B1d is a torch array, "
                                        r"D is a numpy array"):
        smalltc.batched_contract(B1d, D.numpy(), V)
    with pytest.raises(TypeError, match=r"B1d is a numpy array, out is a torch array"):
        smalltc.batched_contract(B1d.numpy(), D.numpy(), V.numpy(), out=torch.empty_like(V))
    with pytest.raises(TypeError, match=r"V requires grad: smalltc's operations do not "
                                        r"record gradients; pass V.detach\(\)"):
        smalltc.batched_contract(B1d, D, V.clone().requires_grad_())
    with pytest.raises(TypeError, match=r"D requires grad"):
        smalltc.plan("action", B1d, D.clone().requires_grad_(), V)
    with pytest.raises(TypeError, match=r"V is a torch array that cannot be read through "
                                        r"DLPack"):
        smalltc.batched_contract(B1d, D, V.to(torch.bfloat16))       # NumPy has no bf16
    with pytest.raises(TypeError, match=r"V has dtype float16; smalltc supports"):
        smalltc.batched_contract(B1d, D, V.half())
    with pytest.raises(ValueError, match=r"out must be C-contiguous"):
        smalltc.batched_contract(B1d, D, V, out=torch.empty(4, 5, dtype=torch.float64).T)
    with pytest.raises(TypeError, match=r"stream= is for arrays on a CUDA device"):
        smalltc.batched_contract(B1d, D, V, stream=object())
    with pytest.raises(TypeError, match=r"stream= is for CuPy arrays"):
        smalltc.plan("action", B1d, D, V)(B1d, D, V, stream=object())


@needs_jax
def test_jax_errors():
    B1d, D, V = _jax(_ops("action-1d", "float32"))
    with pytest.raises(TypeError, match=r"out is a jax array: JAX arrays are immutable, "
                                        r"smalltc cannot write out; call without out="):
        smalltc.batched_contract(B1d, D, V, out=jnp.zeros_like(V))
    with pytest.raises(TypeError, match=r"V is a jax array that cannot be read through "
                                        r"DLPack \(a traced JAX value inside jax.jit"):
        jax.jit(lambda v: smalltc.batched_contract(B1d, D, v))(V)
    if torch is not None:
        with pytest.raises(TypeError, match=r"B1d is a jax array, D is a torch array"):
            smalltc.batched_contract(B1d, torch.tensor(np.asarray(D)), V)


def test_library_names():
    assert _interop.library(Producer(np.ones(1))) == "test_interop"
    assert not _interop.is_foreign(np.ones(1)) and not _interop.is_foreign([1.0])
    assert _interop.is_foreign(Producer(np.ones(1)))
    with pytest.raises(TypeError, match=r"stream must be a CuPy stream or a "
                                        r"torch.cuda.Stream, got object"):
        _interop.cupy_stream(object())


@needs_torch
def test_docs_torch_example_runs():
    """The interoperability page's torch block (marked ``<!-- requires: torch -->``: the
    docs test runs it only where torch imports)."""
    import re
    from pathlib import Path
    page = Path(__file__).resolve().parents[1] / "docs" / "guide" / "interop.md"
    blocks = re.findall(r"<!-- requires: torch -->\n```python\n(.*?)```", page.read_text(),
                        flags=re.S)
    assert blocks, "docs/guide/interop.md has no torch example"
    for code in blocks:
        exec(compile(code, str(page), "exec"), {})

