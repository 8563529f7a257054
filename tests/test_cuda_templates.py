"""Every CUDA template renders and compiles (nvcc, sm_80 and sm_90) — no GPU needed.

A grid of configurations per template, drawn from the same parameter
heuristics the backend uses, is rendered with StrictUndefined; the sources of
one template are compiled together as one translation unit per architecture
(each configuration in its own namespace), so CI pays a few nvcc starts, not
hundreds. sm_90 (the H100/H200) is compiled to machine code (ptxas: register
limits, spills); sm_80 to PTX, which checks the source and its architecture guards
for half the cost (to machine code too with ``SMALLTC_TEST_FULL=1``). Skips cleanly when
``nvcc`` is not on the PATH.
"""
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import jinja2
import pytest

from smalltc.backends.cuda.action import ACTION, action_ctx
from smalltc.backends.cuda.assembly import ASSEMBLY, assembly_ctx
from smalltc.backends.cuda.basis import BASIS
from smalltc.backends.cuda.contract9 import contract9_ctx
from smalltc.backends.cuda.force import FORCE
from smalltc.backends.cuda.geometry import GEOMETRY
from smalltc.backends.cuda.layout import generic_ctx, layout_ctx
from smalltc.backends.cuda.mass_apply import MASS_APPLY, MASS_DIAGONAL
from smalltc.spec import (ActionSpec, AssemblySpec, BasisSpec, GeometrySpec, MassApplySpec,
                          MassDiagonalSpec)
from smalltc.backends.cuda.runtime import SmalltcCompileError, render, template_names

from conftest import FULL

NVCC = shutil.which("nvcc")
ARCHS = ("sm_80", "sm_90")


def _configs():
    """(template, entry, ctx) for a grid of sizes, dtypes and flags."""
    out = []
    for dt in ("float64", "float32"):
        for n in (2, 3, 8, 16, 32):
            for ta in (False, True):
                spec_e = dict(I=1, S=n, J=n) if ta else dict(I=n, S=n, J=1)
                for sb, bz in ((False, True), (True, False)):
                    ctx = layout_ctx("8a", **spec_e, K=1, L=n, dtype=dt, shared_x=False,
                                       shared_y=sb, beta_zero=bz)
                    out.append(("gemm.cu.j2", ctx))
        # the cp.async form (prefetch = 1): both operands per item, and one shared
        for n, sx, sy, bz in ((16, False, False, False), (9, False, True, True), (8, True, False, False)):
            out.append(("gemm.cu.j2", layout_ctx("8a", n, n, 1, 1, n, dt, sx, sy, beta_zero=bz,
                                                   params=dict(dim_x=n // 2, dim_y=n, per_block=2,
                                                               prefetch=1))))
        out.append(("gemm.cu.j2", layout_ctx("8b", 3, 3, 4, 4, 3, dt, False, False,
                                               params=dict(dim_x=12, dim_y=6, per_block=2,
                                                           prefetch=1))))
        # pairwise steps (4b), (4e) are 8b; (1a)-(2c) are 9
        out.append(("gemm.cu.j2", layout_ctx("8b", 3, 3, 4, 4, 3, dt, False, False)))
        out.append(("gemm.cu.j2", layout_ctx("8b", 9, 10, 10, 10, 1, dt, False, True)))
        out.append(("gemm.cu.j2", layout_ctx("8a", 10, 9, 1, 1, 81, dt, True, False)))
        for (s, nn, k, ll) in ((4, 3, 1, 16), (5, 4, 4, 20), (8, 7, 1, 49), (8, 7, 7, 8), (16, 15, 1, 16)):
            out.append(("contract9.cu.j2", contract9_ctx(s, nn, k, ll, dt)))
        for kind in ("8a", "8b", "9"):
            for bz in (True, False):
                out.append(("generic.cu.j2", generic_ctx(kind, dt, bz)))
        for dim in (1, 2, 3):
            for p in (1, 2, 4, 8, 16):
                for ncomp in (1, 3):
                    ctx = action_ctx(dim, p + 1, p + 2, ncomp, dt)
                    if ctx is not None:
                        out.append((ACTION.template(ctx), ctx))
            # 3D: the line form below T = 5 with each prefetch form (0: none, 1: registers,
            # 2: cp.async) and the rb = 1 form above (neither is the heuristic's choice)
            for p, pf, nc in ((1, 0, 1), (1, 2, 3), (2, 1, 3), (4, 2, 1)) if dim == 3 else ():
                ctx = action_ctx(dim, p + 1, p + 2, nc, dt, params=dict(
                    per_block=2, min_blocks=0, line=1, prefetch=pf))
                out.append((ACTION.template(ctx), ctx))
            # the bulk form (prefetch 3, sm_90 only): odd and even ND, 2 and 3 stages, ncomp
            for p, nc, pb, st in ((8, 1, 2, 2), (7, 1, 2, 3), (5, 3, 6, 2), (2, 1, 4, 3)) \
                    if dim == 3 else ():
                pb *= 2 if dt == "float32" else 1        # slabs of 16-byte multiples
                ctx = action_ctx(dim, p + 1, p + 2, nc, dt, params=dict(
                    per_block=pb, min_blocks=0, line=1, prefetch=3, stages=st))
                assert ctx is not None, (p, nc, pb, dt)
                out.append((ACTION.template(ctx), ctx))
            for p in (4, 8) if dim == 3 else ():
                ctx = action_ctx(dim, p + 1, p + 2, 1, dt,
                                   params=dict(per_block=2, min_blocks=0, rb=1, line=0))
                out.append((ACTION.template(ctx), ctx))
            # register-blocked variants (action_rb.cu.j2): rb 2 and 4, float32 once
            for p, rb in ((1, 2), (4, 2), (4, 4), (8, 2), (8, 3)) if dim > 1 else ():
                for ncomp in (1, 3) if (p, rb) == (4, 2) else (1,):
                    if dt == "float64" or (p, rb) == (4, 4):
                        out.append(("action_rb.cu.j2", action_ctx(
                            dim, p + 1, p + 2, ncomp, dt,
                            params=dict(per_block=2, min_blocks=0, rb=rb))))
            for p in (1, 3, 6) if dim == 3 else (1, 4, 8):
                ctx = assembly_ctx(dim, p + 1, p + 2, dt)
                if ctx is not None:
                    out.append(("assembly.cu.j2", ctx))
            # the rows form and the padded rows (even nq) of the assembly, 2D and 3D
            for p, rows, pad in ((2, 1, 1), (4, 2, 0), (6, 1, 1)) if dim > 1 else ():
                out.append(("assembly.cu.j2", assembly_ctx(
                    dim, p + 1, p + 2, dt, params=dict(per_block=2, rows=rows, pad=pad))))
            if dim == 2:
                out.append(("assembly.cu.j2", assembly_ctx(
                    dim, 7, 8, dt, params=dict(per_block=4, rows=0, pad=1))))
        # the stiffness instances of the assembly: diffusion and helmholtz, Gauss
        # and collocated, 1D-3D; the heuristic (the rows form in 2D and 3D) and forced
        # flat, padded and rows forms
        for qf, co, dim, p, prm in (
                ("diffusion", False, 1, 3, None), ("helmholtz", True, 1, 2, None),
                ("diffusion", False, 2, 4, None),
                ("helmholtz", False, 2, 2, dict(per_block=3, rows=0, pad=1)),
                ("diffusion", True, 2, 5, dict(per_block=2, rows=2, pad=1)),
                ("diffusion", False, 3, 1, None), ("diffusion", False, 3, 4, None),
                ("helmholtz", False, 3, 2, dict(per_block=2, rows=0, pad=1)),
                ("diffusion", True, 3, 3, None), ("helmholtz", True, 3, 5, None),
                ("diffusion", False, 3, 6, None)):
            nd, nq = p + 1, p + 1 if co else p + 2
            ctx = ASSEMBLY.context(AssemblySpec(dim=dim, nq=nq, nd=nd, batch=1, dtype=dt,
                                                qfunc=qf, collocated=co), prm)
            assert ctx is not None and ctx["stiff"], (qf, co, dim, p, prm)
            out.append(("assembly.cu.j2", ctx))
        # the fused FEM operator: the action templates with gather (atomic and per-colour,
        # ncomp, both index types, the line form with and without prefetch) and the diagonal
        for dim, p, nc, it, det in ((1, 3, 1, "int32", False), (2, 2, 3, "int64", True),
                                    (2, 7, 1, "int32", False), (3, 1, 1, "int32", True),
                                    (3, 4, 3, "int64", False), (3, 7, 1, "int32", True)):
            s = MassApplySpec(dim=dim, nq=p + 2, nd=p + 1, batch=1, dtype=dt, ndofs=1, ncomp=nc,
                              comp_axis=nc > 1, index_dtype=it, deterministic=det)
            for params in (None,) + ((dict(per_block=2, line=1, prefetch=0),) if dim == 3 else ()):
                ctx = MASS_APPLY.context(s, params)
                out.append((MASS_APPLY.template(ctx), ctx))
            if p == 4:      # the bench's variant without the map's bounds check
                out.append((MASS_APPLY.template(ctx), dict(ctx, bounds_check=0)))
            d = MassDiagonalSpec(dim=dim, nq=p + 2, nd=p + 1, batch=1, dtype=dt, ndofs=1,
                                 index_dtype=it, deterministic=det)
            out.append(("mass_diagonal.cu.j2", MASS_DIAGONAL.context(d)))
        # the operator family's diffusion and helmholtz instances: Gauss and
        # collocated, the shared-memory form 1D-3D and the 3D line form, element level, the
        # fused map form (atomic, deterministic, ncomp, both index types) and the diagonal
        for qf, co, dim, p, nc, line, it, det in (
                ("diffusion", False, 1, 3, 1, 0, "int32", False),
                ("helmholtz", True, 1, 2, 2, 0, "int64", True),
                ("diffusion", True, 2, 3, 1, 0, "int32", True),
                ("helmholtz", False, 2, 2, 3, 0, "int64", False),
                ("helmholtz", True, 3, 2, 1, 0, "int32", False),
                ("diffusion", False, 3, 3, 3, 0, "int64", True),
                ("diffusion", False, 3, 4, 1, 1, "int32", False),
                ("diffusion", True, 3, 4, 1, 1, "int32", True),
                ("helmholtz", False, 3, 7, 3, 1, "int64", False),
                ("diffusion", True, 3, 7, 1, 1, "int32", False),
                ("diffusion", False, 3, 8, 1, 1, "int32", False)):
            nd, nq = p + 1, p + 1 if co else p + 2
            params = dict(per_block=2, min_blocks=0, line=line)
            a = ActionSpec(dim=dim, nq=nq, nd=nd, batch=1, dtype=dt, ncomp=nc,
                           comp_axis=nc > 1, qfunc=qf, collocated=co)
            for fam, sp in ((ACTION, a), (MASS_APPLY, MassApplySpec(
                    dim=dim, nq=nq, nd=nd, batch=1, dtype=dt, ndofs=1, ncomp=nc,
                    comp_axis=nc > 1, index_dtype=it, deterministic=det, qfunc=qf,
                    collocated=co))):
                for prm in (None, params):
                    ctx = fam.context(sp, prm)
                    out.append((fam.template(ctx), ctx))
            d = MassDiagonalSpec(dim=dim, nq=nq, nd=nd, batch=1, dtype=dt, ndofs=1,
                                 index_dtype=it, deterministic=det, qfunc=qf, collocated=co)
            out.append(("mass_diagonal.cu.j2", MASS_DIAGONAL.context(d)))
    # the corner force: both directions, element level, fused (atomic and the
    # deterministic form's element kernel), both index types, 1D-3D, the bound check off once
    for dim, p, q, dt, op, it, det in ((3, 1, "force", "float64", "action", None, False),
                                       (3, 2, "force_t", "float64", "mass_apply", "int32", False),
                                       (3, 4, "force", "float64", "mass_apply", "int64", False),
                                       (3, 4, "force_t", "float32", "action", None, False),
                                       (3, 8, "force", "float64", "action", None, False),
                                       (2, 5, "force", "float32", "mass_apply", "int32", True),
                                       (2, 3, "force_t", "float64", "mass_apply", "int64", False),
                                       (1, 3, "force", "float64", "action", None, False)):
        kw = dict(dim=dim, nq=2 * p, nd=p + 1, batch=1, dtype=dt, ncomp=dim, comp_axis=True,
                  qfunc=q)
        sp = ActionSpec(**kw) if op == "action" else MassApplySpec(
            ndofs=1, index_dtype=it, deterministic=det, **kw)
        ctx = FORCE.context(sp)
        out.append(("force.cu.j2", ctx))
        if (dim, p) == (3, 2):
            out.append(("force.cu.j2", dict(ctx, bounds_check=0)))
        # every variant besides the heuristic's: the shared-memory form (warp and block
        # barriers), the line form (A one component ahead or not, other items a block)
        small = dict(tpi=8, per_block=4) if p <= 3 else dict(tpi=128, per_block=1)
        for prm in ((dict(line=0), dict(line=0, **small)) if dim > 1 else ()) + (
                (dict(line=1, apre=1 - ctx["apre"]), dict(line=1, per_block=3 if p < 8 else 2))
                if dim > 1 else ()):
            out.append(("force.cu.j2", dict(FORCE.context(sp, prm), forced=1)))
    # the basis application (tests/test_cuda_basis.py compiles its own table for sm_90):
    # evaluation and transpose, through the map (both index types) and on element vectors
    for dim, p, what, tr, nc, it, dt in ((1, 3, "both", False, 1, "int32", "float32"),
                                         (2, 4, "values", True, 2, None, "float64"),
                                         (3, 2, "gradients", False, 3, "int64", "float64"),
                                         (3, 4, "both", True, 1, "int32", "float64")):
        b = BasisSpec(dim=dim, nq=p + 2, nd=p + 1, batch=1, dtype=dt, what=what, transpose=tr,
                      ncomp=nc, comp_axis=nc > 1, ndofs=None if it is None else 1,
                      index_dtype=it or "int32")
        out.append(("basis.cu.j2", BASIS.context(b)))
    # the pointwise geometry: 1D-3D, every output, a coefficient, float32 out and J, |det J|
    for dim, nq, what, coef, dt, jdt, ab in ((1, 3, "mass", True, "float64", "float64", False),
                                             (2, 4, "inverse", False, "float32", "float64",
                                              False),
                                             (3, 4, "diffusion", True, "float64", "float64",
                                              False),
                                             (3, 6, "both", False, "float32", "float32", True)):
        out.append(("geometry.cu.j2", GEOMETRY.context(GeometrySpec(
            dim=dim, nq=nq, batch=1, dtype=dt, what=what, coef=coef, jdtype=jdt,
            absdet=ab))))
    # device CG (fixed entry names with C linkage: one configuration in the translation unit)
    out.insert(20, ("cg.cu.j2", dict(dtype="float64", threads=256, blocks=1024, jacobi=1)))
    # the deterministic FEM operator's sum through the transposed map
    for i, (nc, ndd, pt) in enumerate(((1, 125, "int"), (3, 27, "long long"))):
        out.insert(21 + i, ("scatter_sum.cu.j2", dict(dtype="float64", ncomp=nc, ndd=ndd,
                                                      threads=256, pos_t=pt, min_blocks=0)))
    # the p-multigrid transfers (both directions are the one template: in -> out sizes)
    for i, (dim, nin, nout, dt, it) in enumerate(((3, 2, 5, "float64", "int"),
                                                   (3, 9, 5, "float64", "long long"),
                                                   (2, 3, 8, "float32", "int"),
                                                   (1, 4, 2, "float64", "int"))):
        out.insert(23 + i, ("pmg_transfer.cu.j2", dict(dtype=dt, dim=dim, nin=nin, nout=nout,
                                                        threads=128, min_blocks=0,
                                                        index_t=it)))
    # the AMG levels' CSR products (p-multigrid coarse solve on the GPU)
    for i, (dt, it) in enumerate((("float64", "int"), ("float32", "long long"))):
        out.insert(27 + i, ("csr_spmv.cu.j2", dict(dtype=dt, index_t=it, threads=256,
                                                    min_blocks=0)))
    # the p-multigrid's fused vector updates (Chebyshev steps, residual)
    for i, (mode, dt) in enumerate((("start", "float64"), ("step", "float64"),
                                    ("residual", "float32"), ("last", "float64"))):
        out.insert(27 + i, ("pmg_vector.cu.j2", dict(dtype=dt, mode=mode, threads=256,
                                                      min_blocks=0)))
    # the Schwarz smoother's fused application (FDM local solves)
    for i, (dim, n, dt, it) in enumerate(((3, 5, "float64", "int"), (3, 11, "float64", "int"),
                                          (2, 6, "float32", "long long"))):
        out.insert(31 + i, ("schwarz_fdm.cu.j2", dict(dtype=dt, dim=dim, n=n, threads=128,
                                                       min_blocks=0, index_t=it)))
    return [(t, f"stc_test_{t.split('.')[0]}_{i}", c) for i, (t, c) in enumerate(out)
            if c is not None]


CONFIGS = _configs()


def test_grid_covers_every_template():
    assert {t for t, _, _ in CONFIGS} == set(template_names())


@pytest.mark.parametrize("template,entry,ctx", CONFIGS[:12] + CONFIGS[-12:],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_renders_with_constants(template, entry, ctx):
    src = render(template, dict(ctx, entry=entry))
    bounds = f'{ctx["threads"]}, {ctx["min_blocks"]}' if ctx["min_blocks"] else f'{ctx["threads"]}'
    assert f'extern "C" __global__ void __launch_bounds__({bounds})' in src
    assert f"\n{entry}(" in src
    assert "{{" not in src and "{%" not in src


def test_missing_parameter_is_an_error():
    ctx = dict(action_ctx(3, 3, 4, 1, "float64"), entry="stc_x")
    del ctx["nq"]
    with pytest.raises(jinja2.UndefinedError, match="nq"):
        render("action.cu.j2", ctx)


def test_compile_error_carries_source_options_log():
    err = SmalltcCompileError("stc_x", "int main() {\n  oops\n}", ("-std=c++17",),
                              "line 2: error: identifier oops is undefined")
    assert err.source.startswith("int main") and err.options == ("-std=c++17",)
    assert "oops is undefined" in str(err) and "   2   oops" in str(err)


def _translation_unit(template, arch):
    parts = []
    for t, entry, ctx in CONFIGS:
        if t == template and (arch >= "sm_90" or ctx.get("prefetch") != 3 or "stages" not in ctx):
            parts.append(f"namespace {entry}_ns {{\n{render(t, dict(ctx, entry=entry))}\n}}\n")
    return "".join(parts)


def _nvcc(args):
    src, arch, path = args
    path.write_text(src)
    stage = "-cubin" if arch == "sm_90" or FULL else "-ptx"
    res = subprocess.run([NVCC, f"-arch={arch}", "-std=c++17", stage, "-o", "/dev/null",
                          str(path)], capture_output=True, text=True)
    return arch, path.name, res.returncode, res.stdout + res.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_every_template_compiles_with_nvcc(tmp_path):
    jobs = []
    for template in template_names():
        for arch in ARCHS:          # the bulk form (cp.async.bulk) only for sm_90
            jobs.append((_translation_unit(template, arch), arch,
                         tmp_path / f"{template.split('.')[0]}_{arch}.cu"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(_nvcc, jobs))
    failed = [f"{name} ({arch}):\n{log}" for arch, name, rc, log in results if rc != 0]
    assert not failed, "\n\n".join(failed)
    warned = [f"{name} ({arch}): {line}" for arch, name, _, log in results
              for line in log.splitlines() if re.search(r"warning|spill", line)]
    assert not warned, "\n".join(warned)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_force_kernels_do_not_spill(tmp_path):
    """Every corner-force configuration of the grid (both forms, every variant) compiles for
    sm_90 without local memory: ptxas reports 0 bytes of spill stores for each kernel (the
    line form's components are a rolled loop for this: notes/cuda.md, "The corner force")."""
    path = tmp_path / "force_sm_90.cu"
    path.write_text(_translation_unit("force.cu.j2", "sm_90"))
    res = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-cubin", "-o", "/dev/null",
                          "-Xptxas", "-v", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    log = res.stdout + res.stderr
    spills = dict(re.findall(r"Function properties for (\w+)\n\s+\d+ bytes stack frame, "
                             r"(\d+) bytes spill stores", log))
    force = {e: c for t, e, c in CONFIGS if t == "force.cu.j2"}
    assert set(spills) == set(force)
    # ptxas trades a few bytes of spill for an occupancy step in two forced variants (3D p = 1
    # shared form at tpi 8, 3D p = 4 float32 F^T line form at 3 a block); none elsewhere
    bad = {e: n for e, n in spills.items() if int(n) > (8 if force[e].get("forced") else 0)}
    assert not bad, log
