"""Shared test fixtures: array modules and backends to run every case on.

GPU tests run when a CUDA device answers a query (not merely when cupy
imports) and are skipped cleanly otherwise. ``--backend NAME`` restricts the
operation tables to one backend (like libCEED's ``--ceed``).
"""
import os

import numpy as np
import pytest

from smalltc import backends
from smalltc._arrays import cupy_or_none, gpu_available


def pytest_addoption(parser):
    parser.addoption("--backend", default=None,
                     help="run the operation tables on this backend only")


def pytest_configure(config):
    np.seterr(all="ignore")
    # the CPU kernels compile in a helper process, replaced every 20 kernels, and load
    # from Numba's disk cache here: a worker that builds hundreds of kernels stays small
    # (each kernel compiled in a process keeps 10-30 MB of it; smalltc.backends.cpu.runtime)
    os.environ.setdefault("SMALLTC_COMPILE_PROCESS", "20")


#: ``SMALLTC_TEST_FULL=1`` (``make test-full``): every case of the compiled-kernel matrices;
#: by default a representative subset of them (a CPU kernel's compile is seconds)
FULL = os.environ.get("SMALLTC_TEST_FULL", "") not in ("", "0")


def full_only(*values, id=None):
    """A ``pytest.param`` of ``values`` that runs only with ``SMALLTC_TEST_FULL=1``."""
    return pytest.param(*values, id=id, marks=pytest.mark.skipif(
        not FULL, reason="outside the default subset, a compile each (set SMALLTC_TEST_FULL=1)"))


def array_modules():
    mods = [pytest.param("numpy", id="numpy")]
    mods.append(pytest.param("cupy", id="cupy", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")]))
    return mods


def backend_params():
    """``(xp, backend)`` pytest params: every backend for NumPy arrays and, where a GPU
    answers, for CuPy arrays (marked ``gpu``); one skipped ``cupy-nogpu`` param without."""
    out = []
    for xp in ("numpy", "cupy"):
        if xp == "cupy" and not gpu_available():
            out.append(pytest.param("cupy", "-", id="cupy-nogpu", marks=[
                pytest.mark.gpu, pytest.mark.skip(reason="no CUDA device")]))
            continue
        for be in backends.candidates(xp):
            out.append(pytest.param(xp, be.name, id=f"{xp}-{be.name}",
                                    marks=[pytest.mark.gpu] if xp == "cupy" else []))
    return out


def xp_of(name):
    return np if name == "numpy" else cupy_or_none()


def to_numpy(x):
    cp = cupy_or_none()
    if cp is not None and isinstance(x, cp.ndarray):
        return cp.asnumpy(x)
    return np.asarray(x)


@pytest.fixture
def requested_backend(request):
    return request.config.getoption("--backend")


def backends_for(xp_name, requested=None):
    found = [b.name for b in backends.candidates(xp_name)]
    if requested:
        found = [n for n in found if n == requested]
    return found


def rel_err(out, ref):
    out, ref = to_numpy(out).astype(np.float64), np.asarray(ref, dtype=np.float64)
    denom = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (denom if denom else 1.0)


TOL = {"float64": 1e-12, "float32": 1e-5}
