"""The assembly's tuning variants: the *rows* final stage (``rows >= 1``, 2D and 3D)
and padded rows (``pad = 1``): render, compile, and on a GPU are right.

The heuristic takes the rows form in 2D and 3D; ``rows`` = 0 (asked for, or 1D) gives
the flat form.
"""
import shutil
import subprocess

import numpy as np
import pytest

from smalltc._arrays import cupy_or_none, gpu_available
from smalltc.backends.cuda.assembly import assembly_ctx
from smalltc.backends.cuda.family import THREADS
from smalltc.backends.cuda.runtime import render
from smalltc.backends.reference import assembly_einsum
from smalltc.spec import AssemblySpec

NVCC = shutil.which("nvcc")
MARK = "final stage, rows form"


def test_rows_form_by_default_in_2d_and_3d():
    # the heuristic: the rows form in 2D and 3D (~128 and ~256 threads), flat in 1D
    heur = assembly_ctx(3, 4, 5, "float64")
    assert heur["rows"] == 4 and heur["threads"] == 4 ** 3 * 4 and heur["pad"] == 0
    assert MARK in render("assembly.cu.j2", dict(heur, entry="k"))
    heur2 = assembly_ctx(2, 7, 8, "float64")
    assert heur2["rows"] == 2 and heur2["threads"] == 98 and heur2["pad"] == 1
    assert assembly_ctx(2, 7, 8, "float32")["pad"] == 0       # padding lost in float32
    flat = assembly_ctx(3, 4, 5, "float64", params=dict(per_block=8, rows=0))
    assert flat["rows"] == 0 and flat["threads"] == THREADS
    assert MARK not in render("assembly.cu.j2", dict(flat, entry="k"))
    assert assembly_ctx(1, 4, 5, "float64")["rows"] == 0
    rows = assembly_ctx(3, 4, 5, "float64", params=dict(per_block=3, rows=2))
    assert rows["threads"] == 4 ** 3 * 2 and rows["per_block"] == 3
    assert MARK in render("assembly.cu.j2", dict(rows, entry="k"))
    rows2 = assembly_ctx(2, 4, 5, "float64", params=dict(per_block=3, rows=2))
    assert rows2["threads"] == 4 ** 2 * 2 and MARK in render("assembly.cu.j2",
                                                              dict(rows2, entry="k"))
    assert assembly_ctx(1, 4, 5, "float64", params=dict(per_block=3, rows=1)) is None
    assert assembly_ctx(3, 7, 8, "float64", params=dict(per_block=1, rows=3)) is None  # 1029 threads


@pytest.mark.skipif(NVCC is None, reason="nvcc not on the PATH")
@pytest.mark.parametrize("dim,nd,nq,rows,pad,dt", [
    (3, 2, 3, 8, 0, "float64"), (3, 4, 5, 2, 0, "float64"), (3, 7, 8, 2, 1, "float64"),
    (3, 5, 6, 1, 1, "float32"), (3, 7, 8, 0, 1, "float64"), (2, 3, 4, 0, 1, "float64"),
    (1, 3, 4, 0, 1, "float32"), (2, 7, 8, 2, 1, "float64"), (2, 4, 5, 4, 0, "float32"),
    (2, 9, 10, 1, 0, "float64")])
def test_variants_compile(tmp_path, dim, nd, nq, rows, pad, dt):
    ctx = assembly_ctx(dim, nd, nq, dt, params=dict(per_block=2, rows=rows, pad=pad))
    assert ctx["pad"] == pad and ctx["nqp"] == nq + pad
    src = tmp_path / "k.cu"
    src.write_text(render("assembly.cu.j2", dict(ctx, entry="k")))
    run = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v",
                          "-o", str(tmp_path / "k.cubin"), str(src)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
@pytest.mark.parametrize("dim,nd,nq,per_block,rows,pad,dt", [
    (3, 2, 3, 5, 4, 0, "float64"), (3, 3, 5, 3, 2, 0, "float64"), (3, 4, 5, 2, 1, 0, "float64"),
    (3, 5, 7, 3, 2, 0, "float64"), (3, 7, 8, 2, 2, 0, "float64"), (3, 7, 9, 1, 1, 0, "float64"),
    (3, 4, 6, 3, 2, 0, "float32"), (3, 7, 8, 2, 2, 1, "float64"), (3, 7, 8, 1, 0, 1, "float64"),
    (3, 3, 4, 5, 0, 1, "float32"), (2, 7, 8, 9, 0, 1, "float64"), (1, 7, 8, 33, 0, 1, "float64"),
    (2, 2, 3, 7, 8, 0, "float64"), (2, 4, 6, 5, 4, 1, "float64"), (2, 4, 6, 3, 2, 0, "float32"),
    (2, 6, 7, 2, 1, 0, "float64"), (2, 7, 8, 4, 2, 1, "float64"), (2, 7, 8, 9, 16, 1, "float32"),
    (2, 9, 10, 3, 4, 1, "float64")])
def test_variants_on_gpu(dim, nd, nq, per_block, rows, pad, dt):
    cp = cupy_or_none()
    from smalltc.backends import get
    E = 37                                       # several groups, a partial one
    rng = np.random.default_rng(nd * 100 + nq)
    B1d, D = rng.standard_normal((nq, nd)), rng.random((E,) + (nq,) * dim) + 0.5
    ref = assembly_einsum(B1d, D, dim)
    spec = AssemblySpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dt)
    ex = get("cuda").build(spec, params=dict(per_block=per_block, rows=rows, pad=pad))
    assert ex.params["rows"] == rows and ex.params["pad"] == pad and ex.source == "params"
    assert ex.threads == (nd ** dim * rows if rows else THREADS)
    out = cp.full((E, nd ** dim, nd ** dim), np.nan, dtype=dt)
    ex.run((cp.asarray(B1d.astype(dt)), cp.asarray(D.astype(dt))), out)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.all(np.isfinite(got)), "unwritten (NaN) entries"
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < (1e-12 if dt == "float64" else 1e-5), err
