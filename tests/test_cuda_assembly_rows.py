"""The assembly's *rows* final stage (``params["rows"] >= 1``, 3D): renders, compiles, and on a GPU is right.

The rows form is a tuning choice (``smalltc tune --op assembly`` times it); the
heuristic keeps the flat form, whose source it must leave unchanged.
"""
import shutil
import subprocess

import numpy as np
import pytest

from smalltc._arrays import cupy_or_none, gpu_available
from smalltc.backends import _cuda_params as P
from smalltc.backends._cuda_runtime import render
from smalltc.backends.reference import assembly_einsum
from smalltc.spec import AssemblySpec

NVCC = shutil.which("nvcc")
MARK = "final stage, rows form"


def test_rows_form_only_when_asked():
    flat = P.assembly_ctx(3, 4, 5, "float64")
    assert flat["rows"] == 0 and flat["threads"] == P.THREADS
    assert MARK not in render("assembly.cu.j2", dict(flat, entry="k"))
    rows = P.assembly_ctx(3, 4, 5, "float64", params=dict(per_block=3, rows=2))
    assert rows["threads"] == 4 ** 3 * 2 and rows["per_block"] == 3
    assert MARK in render("assembly.cu.j2", dict(rows, entry="k"))
    assert P.assembly_ctx(2, 4, 5, "float64", params=dict(per_block=3, rows=2)) is None
    assert P.assembly_ctx(1, 4, 5, "float64", params=dict(per_block=3, rows=1)) is None
    assert P.assembly_ctx(3, 7, 8, "float64", params=dict(per_block=1, rows=3)) is None  # 1029 threads


@pytest.mark.skipif(NVCC is None, reason="nvcc not on the PATH")
@pytest.mark.parametrize("nd,rows,dt", [(2, 8, "float64"), (4, 2, "float64"), (7, 2, "float64"),
                                        (5, 1, "float32")])
def test_rows_form_compiles(tmp_path, nd, rows, dt):
    ctx = P.assembly_ctx(3, nd, nd + 1, dt, params=dict(per_block=2, rows=rows))
    src = tmp_path / "k.cu"
    src.write_text(render("assembly.cu.j2", dict(ctx, entry="k")))
    run = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v",
                          "-o", str(tmp_path / "k.cubin"), str(src)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
@pytest.mark.parametrize("nd,nq,per_block,rows,dt", [
    (2, 3, 5, 4, "float64"), (3, 5, 3, 2, "float64"), (4, 5, 2, 1, "float64"),
    (5, 7, 3, 2, "float64"), (7, 8, 2, 2, "float64"), (7, 9, 1, 1, "float64"),
    (4, 6, 3, 2, "float32")])
def test_rows_form_on_gpu(nd, nq, per_block, rows, dt):
    cp = cupy_or_none()
    from smalltc.backends import get
    E = 37                                       # units 37 * nd: several groups, a partial one
    rng = np.random.default_rng(nd * 100 + nq)
    B1d, D = rng.standard_normal((nq, nd)), rng.random((E, nq, nq, nq)) + 0.5
    ref = assembly_einsum(B1d, D, 3)
    spec = AssemblySpec(dim=3, nq=nq, nd=nd, batch=E, dtype=dt)
    before = P.get_table_lookup()
    P.set_table_lookup(lambda spec, cc: dict(per_block=per_block, rows=rows, _source="test"))
    try:
        ex = get("cuda").build(spec)
    finally:
        P.set_table_lookup(before)
    assert ex.params["rows"] == rows and ex.threads == nd ** 3 * rows
    out = cp.full((E, nd ** 3, nd ** 3), np.nan, dtype=dt)
    ex.run((cp.asarray(B1d.astype(dt)), cp.asarray(D.astype(dt))), out)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.all(np.isfinite(got)), "unwritten (NaN) entries"
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < (1e-12 if dt == "float64" else 1e-5), err
