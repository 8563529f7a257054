"""Less point data (docs/math.md section 8): float32 point data with float64 vectors, and the
vertex geometry recomputed in the kernel.

float32 point data: D and Q given as float32 while B1d, G1d, x (V) are float64; the kernels
read float32 and compute in float64. Each kernel's output is poisoned with NaN first and
must equal the float64 operator applied to the float32-rounded data (the reference einsum
path) to float64 round-off. CPU kernels here; the CUDA forms forced one by one on a GPU
(skipped without one); the CUDA sources compile with nvcc (skipped without nvcc).
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

import smalltc
from smalltc._arrays import gpu_available
from smalltc.roofline import counts
from smalltc.spec import ActionSpec, MassApplySpec
from smalltc import fem

gpu = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="no CUDA device")]
NVCC = shutil.which("nvcc")
TOL64 = 1e-13


def rel_err(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _data(qfunc, dim, nq, E, rng):
    """float32 point data: D positive, Q symmetric positive definite per point."""
    q = (E,) + (nq,) * dim
    D = (rng.random(q) + 0.5).astype(np.float32) if qfunc != "diffusion" else None
    Q = None
    if qfunc != "mass":
        A = rng.standard_normal(q + (dim, dim))
        M = np.einsum("...ij,...kj->...ik", A, A) + dim * np.eye(dim)
        iu = np.triu_indices(dim)
        Q = np.moveaxis(M[..., iu[0], iu[1]], -1, 1).astype(np.float32)
    return D, Q


def _pack(qfunc, D, Q):
    return {"mass": D, "diffusion": Q, "helmholtz": (D, Q)}[qfunc]


def _up(data):
    if isinstance(data, tuple):
        return tuple(_up(d) for d in data)
    return data.astype(np.float64)


# (qfunc, dim, p, collocated): CPU lanes kernels (each compiles in seconds: kept few)
CPU_CASES = [("mass", 3, 2, False), ("diffusion", 3, 3, True), ("helmholtz", 2, 2, False)]
CPU_IDS = ["{}-{}d-p{}{}".format(q, d, p, "-co" if co else "") for q, d, p, co in CPU_CASES]


def _basis(p, co):
    b = fem.basis_1d(p, p + 1, quadrature="gll") if co else fem.basis_1d(p, p + 2)
    return (None if co else b.B1d), b.G1d, b.B1d.shape[0]


@pytest.mark.parametrize("case", CPU_CASES, ids=CPU_IDS)
def test_float32_point_data_cpu(case):
    qfunc, dim, p, co = case
    rng = np.random.default_rng(7 * dim + p)
    B1d, G1d, nq = _basis(p, co)
    if co:
        B1d_ = None
    else:
        B1d_ = B1d
    space = fem.H1Space(fem.box_mesh(dim, 3 if dim == 2 else 2), p)
    E = space.nelements
    D, Q = _data(qfunc, dim, nq, E, rng)
    data = _pack(qfunc, D, Q)
    G = None if qfunc == "mass" else G1d
    # element level
    V = rng.standard_normal((E,) + (p + 1,) * dim)
    ref = smalltc.operator_action(qfunc, B1d_, G, _up(data), V, backend="reference")
    out = np.full(V.shape, np.nan)
    U = smalltc.operator_action(qfunc, B1d_, G, data, V, out=out, backend="cpu")
    assert U is out and rel_err(U, ref) <= TOL64
    # fused apply through a permuted map
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(np.int32)
    x = rng.standard_normal(space.ndofs)
    ref = smalltc.operator_apply(qfunc, B1d_, G, _up(data), x, m, backend="reference")
    y = np.full(x.shape, np.nan)
    smalltc.operator_apply(qfunc, B1d_, G, data, x, m, out=y, backend="cpu")
    assert rel_err(y, ref) <= TOL64
    # and it is not the float64 data's result (the data did lose bits)
    full = smalltc.operator_apply(qfunc, B1d_, G, _up(data), x, m, backend="reference")
    assert np.array_equal(full, ref)


def test_float32_point_data_public_functions_and_plans():
    """mass_apply, batched_contract, diffusion_apply take float32 D/Q with float64 vectors;
    the plan's spec says so; its kernel is its own (entry suffix ``_q32``)."""
    rng = np.random.default_rng(1)
    b = fem.basis_1d(2, 4)
    space = fem.H1Space(fem.box_mesh(2, 3), 2)
    E, m = space.nelements, space.dof_map()
    D, Q = _data("helmholtz", 2, 4, E, rng)
    x = rng.standard_normal(space.ndofs)
    y = smalltc.mass_apply(b.B1d, D, x, m, backend="reference")
    assert y.dtype == np.float64
    assert rel_err(y, smalltc.mass_apply(b.B1d, D.astype(np.float64), x, m,
                                         backend="reference")) <= TOL64
    p = smalltc.plan("mass_apply", b.B1d, D, x, m, backend="reference")
    assert p.spec.qdtype == "float32" and p.spec.size_key == "mass_apply/2d/nd3nq4c1+q32"
    y2 = smalltc.diffusion_apply(b.B1d, b.G1d, Q, x, m, backend="reference")
    assert rel_err(y2, smalltc.diffusion_apply(b.B1d, b.G1d, Q.astype(np.float64), x, m,
                                               backend="reference")) <= TOL64


def test_float32_point_data_errors_and_keys():
    rng = np.random.default_rng(2)
    b = fem.basis_1d(2, 4)
    D, Q = _data("helmholtz", 2, 4, 5, rng)
    V = rng.standard_normal((5, 3, 3))
    # float32 data needs float64 vectors and bases: other mixes stay errors
    with pytest.raises(TypeError, match="mixed dtypes"):
        smalltc.batched_contract(b.B1d.astype(np.float32), D.astype(np.float64), V)
    with pytest.raises(TypeError, match="mixed dtypes"):     # float32 vectors, float64 data
        smalltc.batched_contract(b.B1d.astype(np.float32), D.astype(np.float64),
                                 V.astype(np.float32))
    # the diagonal and the assembly take one dtype (their data are read once)
    with pytest.raises(TypeError, match="mixed dtypes"):
        smalltc.assemble_diffusion(b.B1d, b.G1d, Q)
    with pytest.raises(ValueError, match="qdtype='float32' is for float64 vectors"):
        ActionSpec(dim=2, nq=4, nd=3, batch=5, dtype="float32", qdtype="float32")
    with pytest.raises(ValueError, match="qdtype must be one of"):
        ActionSpec(dim=2, nq=4, nd=3, batch=5, dtype="float64", qdtype="float16")
    # default: every key as before; float32 data: keys of their own
    s = MassApplySpec(dim=3, nq=4, nd=3, batch=5, dtype="float64", ndofs=10)
    s32 = MassApplySpec(dim=3, nq=4, nd=3, batch=5, dtype="float64", ndofs=10,
                        qdtype="float32")
    assert s.kernel_key() == ("mass_apply", 3, 4, 3, "float64", 1, "int32", False)
    assert "qdtype" not in s.as_dict() and s32.as_dict()["qdtype"] == "float32"
    assert s32.kernel_key() != s.kernel_key() and s32.size_key.endswith("+q32")
    assert [o.dtype for o in s32.inputs][:2] == [None, "float32"]
    assert "float32-data" in str(s32)


def test_float32_point_data_bytes():
    """The bound reads 4 bytes a point value (BP3 3D p = 2: Q is 6 nq^3 doubles an
    element, 92% of the stored form's bytes; 46% less traffic with float32)."""
    kw = dict(dim=3, nq=4, nd=3, batch=1000, dtype="float64", ndofs=9261, qfunc="diffusion")
    c64 = counts(MassApplySpec(**kw))
    c32 = counts(MassApplySpec(qdtype="float32", **kw))
    q = 1000 * 6 * 64
    assert c64.bytes - c32.bytes == 4 * q and c64.flops == c32.flops


# --- CUDA -------------------------------------------------------------------------------

CUDA_CASES = [("mass", 2, 3, False), ("mass", 3, 2, False), ("mass", 3, 5, False),
              ("diffusion", 2, 2, False), ("diffusion", 3, 2, False),
              ("diffusion", 3, 4, True), ("helmholtz", 3, 3, False)]


def _cuda_forms(qfunc, dim):
    """The heuristic (None), then every form that reads the data through pointers."""
    if dim != 3:
        return [None, dict(per_block=2, min_blocks=0, rb=1, line=0, prefetch=0, stages=0)]
    if qfunc == "mass":
        return [None] + [dict(per_block=2, min_blocks=0, rb=1, line=ln, prefetch=pf, stages=0)
                         for ln, pf in ((0, 0), (1, 0), (1, 1), (1, 2))]
    return [None, dict(per_block=2, min_blocks=0, rb=1, line=0, prefetch=0, stages=0)] + [
        dict(per_block=2, min_blocks=0, rb=1, line=1, prefetch=0, stages=0, qmode=m)
        for m in ("global", "regs")]


def _q32_specs(qfunc, dim, p, co, E, ndofs):
    nd, nq = p + 1, p + 1 if co else p + 2
    kw = dict(dim=dim, nq=nq, nd=nd, batch=E, dtype="float64", qfunc=qfunc, collocated=co,
              qdtype="float32")
    return ActionSpec(**kw), MassApplySpec(ndofs=ndofs, **kw)


def test_cuda_float32_data_choices_without_a_gpu():
    """The heuristic of every case reads through pointers (no bulk or Q-in-shared form),
    names its kernel ``..._q32``; a form that copies raw slabs is refused as parameters."""
    from smalltc.backends.cuda import choose
    from smalltc.backends.cuda.action import ACTION
    H100 = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)
    for qfunc, dim, p, co in CUDA_CASES:
        for spec in _q32_specs(qfunc, dim, p, co, 64, 100):
            c = choose(spec, H100)
            assert c.entry.endswith("_q32") and c.ctx["qt"] == "float", c.entry
            assert c.ctx.get("prefetch", 0) != 3 and not c.ctx.get("qsmem")
            assert c.ctx.get("rb", 1) == 1
    a, _ = _q32_specs("mass", 3, 7, False, 64, 100)
    assert ACTION.context(a, dict(per_block=2, min_blocks=0, rb=1, line=1, prefetch=3,
                                  stages=2), H100) is None
    d, _ = _q32_specs("diffusion", 3, 3, False, 64, 100)
    assert ACTION.context(d, dict(per_block=2, min_blocks=0, line=1, qmode="smem"),
                          H100) is None


def _compile_all(parts, tmp_path):
    """nvcc (sm_90) each template's rendered sources, one translation unit a template."""
    for t, srcs in parts.items():
        path = tmp_path / f"{t}.cu"
        path.write_text("".join(srcs))
        r = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-cubin", "-o", "/dev/null",
                            str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_cuda_float32_data_sources_compile(tmp_path):
    from smalltc.backends.cuda.action import ACTION
    from smalltc.backends.cuda.mass_apply import MASS_APPLY
    from smalltc.backends.cuda.runtime import render
    parts = {}
    i = 0
    for qfunc, dim, p, co in CUDA_CASES:
        for fam, spec in zip((ACTION, MASS_APPLY), _q32_specs(qfunc, dim, p, co, 1, 1)):
            for prm in _cuda_forms(qfunc, dim):
                if prm is not None and fam is MASS_APPLY:
                    prm = {k: v for k, v in prm.items() if k in fam.params or k == "qmode"}
                    if prm.get("prefetch", 0) > 1:
                        continue
                ctx = fam.context(spec, prm)
                assert ctx is not None, (qfunc, dim, p, prm)
                src = render(fam.template(ctx), dict(ctx, entry=f"{fam.entry(spec, ctx)}_{i}"))
                assert "const float* __restrict__" in src
                parts.setdefault(fam.template(ctx), []).append(
                    f"namespace n{i} {{\n{src}\n}}\n")
                i += 1
    _compile_all(parts, tmp_path)


@pytest.mark.parametrize("case", [pytest.param(c, marks=gpu) for c in CUDA_CASES],
                         ids=["{}-{}d-p{}{}".format(q, d, p, "-co" if co else "")
                              for q, d, p, co in CUDA_CASES])
def test_cuda_float32_point_data(case):
    import cupy as cp
    from smalltc.backends.cuda import CudaBackend
    qfunc, dim, p, co = case
    rng = np.random.default_rng(11 * dim + p)
    B1d, G1d, nq = _basis(p, co)
    space = fem.H1Space(fem.box_mesh(dim, 3 if dim == 2 else 2), p)
    E = space.nelements
    D, Q = _data(qfunc, dim, nq, E, rng)
    V = rng.standard_normal((E,) + (p + 1,) * dim)
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(np.int32)
    x = rng.standard_normal(space.ndofs)
    G = None if qfunc == "mass" else G1d
    data = _pack(qfunc, D, Q)
    ref_u = smalltc.operator_action(qfunc, B1d, G, _up(data), V, backend="reference")
    ref_y = smalltc.operator_apply(qfunc, B1d, G, _up(data), x, m, backend="reference")
    a, s = _q32_specs(qfunc, dim, p, co, E, space.ndofs)
    dev = lambda *arrs: [cp.asarray(z) for z in arrs if z is not None]   # noqa: E731
    datas = [D, Q] if qfunc == "helmholtz" else [D if qfunc == "mass" else Q]
    for prm in _cuda_forms(qfunc, dim):
        ex = CudaBackend().build(a, prm)
        assert ex.specialized and "_q32" in ex.kernel, ex.kernel
        out = cp.full(V.shape, np.nan)
        ex.run(dev(B1d, G, *datas, V), out)
        assert rel_err(out.get(), ref_u) <= TOL64, (ex.kernel, prm)
        if prm is not None and prm.get("prefetch", 0) > 1:
            continue
        prm2 = None if prm is None else {k: v for k, v in prm.items() if k != "rb"
                                         and k != "stages"}
        ex = CudaBackend().build(s, prm2)
        y = cp.full(x.shape, np.nan)
        ex.run(dev(B1d, G, *datas, x, m), y)
        assert rel_err(y.get(), ref_y) <= TOL64, (ex.kernel, prm)


# --- vertex geometry ----------------------------------------------------------------------

from smalltc.vertices import point_data, vertices_of_mesh  # noqa: E402

# (qfunc, dim, p, collocated)
VX_CASES = [(q, d, p, co) for q in ("mass", "diffusion") for d in (2, 3) for p in (1, 2, 3, 4)
            for co in (False, True) if not (co and q == "mass")]


def _vx_setup(qfunc, dim, p, co, seed=0):
    mesh = fem.box_mesh(dim, 2, distortion=0.08)
    space = fem.H1Space(mesh, p)
    nq = p + 1 if co else p + 2
    quad = "gll" if co else "gauss"
    b = fem.basis_1d(p, nq, quad)
    X = vertices_of_mesh(mesh, check_nq=nq)
    coef = np.random.default_rng(seed).random(space.nelements) + 0.5
    return mesh, space, nq, quad, (None if co else b.B1d), b.G1d, X, coef


@pytest.mark.parametrize("case", VX_CASES, ids=["{}-{}d-p{}{}".format(
    q, d, p, "-co" if co else "") for q, d, p, co in VX_CASES])
def test_vertex_geometry_reference(case):
    """The vertex form equals the stored float64 form with the FEM layer's D/Q (times the
    per-element coefficient), element level and fused, outputs poisoned."""
    qfunc, dim, p, co = case
    mesh, space, nq, quad, B1d, G1d, X, coef = _vx_setup(qfunc, dim, p, co)
    E = space.nelements
    cs = coef.reshape((E,) + (1,) * (dim + (qfunc == "diffusion")))
    data = (fem.mass_data(mesh, nq, quadrature=quad) if qfunc == "mass" else
            fem.diffusion_data(mesh, nq, quadrature=quad)) * cs
    assert rel_err(point_data(qfunc, X, coef, nq, co), data) <= TOL64
    G = None if qfunc == "mass" else G1d
    rng = np.random.default_rng(3)
    V = rng.standard_normal((E,) + (p + 1,) * dim)
    ref = smalltc.operator_action(qfunc, B1d, G, data, V, backend="reference")
    out = np.full(V.shape, np.nan)
    U = smalltc.operator_action(qfunc, B1d, G, None, V, out=out, vertices=X, coef=coef,
                                backend="reference")
    assert U is out and rel_err(U, ref) <= TOL64
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(np.int64 if p % 2 else np.int32)
    x = rng.standard_normal(space.ndofs)
    ref = smalltc.operator_apply(qfunc, B1d, G, data, x, m, backend="reference")
    y = np.full(x.shape, np.nan)
    smalltc.operator_apply(qfunc, B1d, G, None, x, m, out=y, vertices=X, coef=coef,
                           backend="reference")
    assert rel_err(y, ref) <= TOL64


VX_CPU = [("diffusion", 3, 2, False), ("mass", 2, 2, False), ("diffusion", 2, 3, True)]


@pytest.mark.parametrize("case", VX_CPU, ids=["{}-{}d-p{}{}".format(
    q, d, p, "-co" if co else "") for q, d, p, co in VX_CPU])
def test_vertex_geometry_cpu(case):
    """The CPU lanes kernels with the point data computed from XV and CF in the lanes:
    element level and fused, against the stored float64 path, outputs poisoned."""
    qfunc, dim, p, co = case
    mesh, space, nq, quad, B1d, G1d, X, coef = _vx_setup(qfunc, dim, p, co, seed=2)
    G = None if qfunc == "mass" else G1d
    data = point_data(qfunc, X, coef, nq, co)
    rng = np.random.default_rng(6)
    V = rng.standard_normal((space.nelements,) + (p + 1,) * dim)
    out = np.full(V.shape, np.nan)
    smalltc.operator_action(qfunc, B1d, G, None, V, out=out, vertices=X, coef=coef,
                            backend="cpu")
    ref = smalltc.operator_action(qfunc, B1d, G, data, V, backend="reference")
    assert rel_err(out, ref) <= TOL64
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(np.int32)
    x = rng.standard_normal(space.ndofs)
    y = np.full(x.shape, np.nan)
    smalltc.operator_apply(qfunc, B1d, G, None, x, m, out=y, vertices=X, coef=coef,
                           backend="cpu")
    assert rel_err(y, smalltc.operator_apply(qfunc, B1d, G, data, x, m,
                                             backend="reference")) <= TOL64


def test_vertex_geometry_public_functions():
    """mass_apply and diffusion_apply with vertices= (a scalar coef is a constant); the
    auto backend without a vertex kernel runs the reference path and says so."""
    mesh, space, nq, quad, B1d, G1d, X, _ = _vx_setup("diffusion", 2, 2, False)
    x = np.random.default_rng(4).standard_normal(space.ndofs)
    m = space.dof_map()
    y = smalltc.diffusion_apply(B1d, G1d, None, x, m, vertices=X, coef=2.0)
    ref = smalltc.diffusion_apply(B1d, G1d, fem.diffusion_data(mesh, nq, 2.0), x, m,
                                  backend="reference")
    assert rel_err(y, ref) <= TOL64
    y = smalltc.mass_apply(B1d, None, x, m, vertices=X)
    assert rel_err(y, smalltc.mass_apply(B1d, fem.mass_data(mesh, nq), x, m)) <= TOL64
    U = smalltc.diffusion_action(B1d, G1d, None, np.ones((space.nelements, 3, 3)),
                                 vertices=X)
    assert float(abs(U).max()) < 1e-12                       # constants: no gradient
    s = MassApplySpec(dim=3, nq=4, nd=3, batch=5, dtype="float64", ndofs=10,
                      qfunc="diffusion", geometry="vertices")
    assert [(o.name, o.shape) for o in s.inputs] == [
        ("B1d", (4, 3)), ("G1d", (4, 3)), ("X", (5, 8, 3)), ("coef", (5,)), ("x", (10,)),
        ("elem_dofs", (5, 3, 3, 3))]
    assert s.size_key == "diffusion/mass_apply/3d/nd3nq4c1+vx" and "vertex" in str(s)


VX_ERRORS = [     # the mesh has 4 elements
    (dict(vertices=np.zeros((4, 4, 3))), ValueError, r"X \(vertices\) has shape \(4, 4, 3\), "
     r"expected \(E, 2\^dim, dim\)"),
    (dict(vertices=np.zeros((3, 4, 2))), ValueError, r"coef has shape \(4,\), expected "
     r"\(3,\).*E from X"),
    (dict(vertices=np.zeros((3, 4, 2)), coef=np.ones(3)), ValueError,
     r"elem_dofs has shape \(4, 3, 3\), expected \(3, 3, 3\)"),
    (dict(vertices=np.zeros((4, 8, 3))), ValueError, r"elem_dofs has shape"),
    (dict(vertices=np.zeros((4, 4, 2), dtype=np.float32)), TypeError, r"mixed dtypes"),
    (dict(coef=np.ones(8)), ValueError, r"coef has shape \(8,\), expected \(4,\)"),
    (dict(vertices=[[0.0]]), TypeError, r"vertices must be an array"),
    (dict(Q="data"), TypeError, r"not both"),
    (dict(vertices=None, coef=2.0), TypeError, r"coef= goes with vertices="),
]


@pytest.mark.parametrize("kw,exc,match", VX_ERRORS)
def test_vertex_geometry_errors(kw, exc, match):
    mesh, space, nq, quad, B1d, G1d, X, coef = _vx_setup("diffusion", 2, 2, False)
    args = dict(vertices=X, coef=coef, Q=None)
    args.update(kw)
    if isinstance(args["Q"], str):
        args["Q"] = fem.diffusion_data(mesh, nq)
    with pytest.raises(exc, match=match):
        smalltc.diffusion_apply(B1d, G1d, args["Q"], np.ones(space.ndofs), space.dof_map(),
                                vertices=args["vertices"], coef=args["coef"],
                                backend="reference")


def test_vertex_geometry_errors_levels_and_qfuncs():
    mesh, space, nq, quad, B1d, G1d, X, coef = _vx_setup("diffusion", 2, 2, False)
    with pytest.raises(ValueError, match="vertices= is for qfunc 'mass' or 'diffusion'"):
        smalltc.operator_apply("helmholtz", B1d, G1d, None, np.ones(space.ndofs),
                               space.dof_map(), vertices=X)
    with pytest.raises(ValueError, match="helmholtz"):
        MassApplySpec(dim=3, nq=4, nd=3, batch=5, dtype="float64", ndofs=10,
                      qfunc="helmholtz", geometry="vertices")
    with pytest.raises(ValueError, match="exclude each other"):
        MassApplySpec(dim=3, nq=4, nd=3, batch=5, dtype="float64", ndofs=10,
                      qdtype="float32", geometry="vertices")


@pytest.mark.parametrize("qfunc", ["mass", "diffusion"])
@pytest.mark.parametrize("point", ["float32", "vertices"])
def test_fem_operators_point_data(qfunc, point):
    """fem.mass_operator / fem.diffusion_operator with point_data=: the stored operator's
    result (float32: to the data's rounding), its diagonal; errors for curved geometry, a
    function coefficient, the assembled form."""
    make = fem.mass_operator if qfunc == "mass" else fem.diffusion_operator
    kw = {"rho" if qfunc == "mass" else "kappa": 1.5}
    space = fem.H1Space(fem.box_mesh(2, 3, distortion=0.08), 2)
    # the reference backend: the FEM layer's logic here, the kernels in the tests above
    A, B = (make(space, backend="reference", **kw),
            make(space, point_data=point, backend="reference", **kw))
    x = np.random.default_rng(5).standard_normal(space.ndofs)
    tol = 1e-6 if point == "float32" else TOL64
    assert rel_err(B(x), A(x)) <= tol and rel_err(B.diagonal(), A.diagonal()) <= tol
    if point == "float32":
        assert (B.D if qfunc == "mass" else B.Q).dtype == np.float32
        return
    with pytest.raises(ValueError, match="not the multilinear map of its vertices"):
        make(fem.H1Space(fem.box_mesh(2, 2, geom_order=2, distortion=0.1), 2),
             point_data=point)
    with pytest.raises(ValueError, match="not a function of x"):
        make(space, point_data=point, **{k: (lambda z: z[0]) for k in kw})
    with pytest.raises(ValueError, match="fused matrix-free"):
        make(space, point_data=point, assembled=True)


def test_vertex_geometry_bytes():
    """The bound of the vertex form: x, y, the map once and 2^dim dim + 1 values an element
    (3D: 25 doubles against Q's 6 nq^3)."""
    kw = dict(dim=3, nq=4, nd=3, batch=1000, dtype="float64", ndofs=9261, qfunc="diffusion")
    c = counts(MassApplySpec(geometry="vertices", **kw))
    assert c.bytes == 8 * (2 * 9261 + 2 * 12) + 1000 * 8 * 25 + 4 * 1000 * 27
    assert c.flops > counts(MassApplySpec(**kw)).flops


# --- the CUDA vertex geometry: its device functions checked on the host, its kernels ------

CXX = shutil.which("g++") or shutil.which("c++")
_HOST = r"""
#include <cmath>
#include <cstdio>
typedef double real_t; typedef long long idx_t;
#define __constant__ static const
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __ldg(p) (*(p))
#define STC_MIN(a, b) ((a) < (b) ? (a) : (b))
using std::fma; using std::fabs;
%s
int main() {
    const int E = %d, NQ = %d, DIM = %d, NV = 1 << DIM;
    static real_t X[E * NV * DIM], CFv[E];
    for (int t = 0; t < E * NV * DIM; ++t) if (scanf("%%lf", &X[t]) != 1) return 1;
    for (int t = 0; t < E; ++t) if (scanf("%%lf", &CFv[t]) != 1) return 1;
    for (int e = 0; e < E; ++e)
        for (int k = 0; k < (DIM == 3 ? NQ * NQ * NQ : NQ * NQ); ++k) {
            real_t f[STC_VXF], q[6];
            const int kx = k %% NQ, ky = (k / NQ) %% NQ, kz = k / (NQ * NQ);
            DIM == 3 ? SETUP3 : SETUP2;
            const int slow = DIM == 3 ? kz : ky;
            stc_vx_q(f, slow, q);
            printf("%%.17g", stc_vx_d(f, slow));
            for (int c = 0; c < DIM * (DIM + 1) / 2; ++c) printf(" %%.17g", q[c]);
            printf("\n");
        }
    return 0;
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
@pytest.mark.parametrize("dim,nq,co", [(2, 3, False), (3, 4, False), (3, 3, True)])
def test_cuda_vertex_device_functions_on_the_host(tmp_path, dim, nq, co):
    """vertex.cuh.j2's stc_vx_setup / stc_vx_d / stc_vx_q, compiled as host C++, give the
    D and Q of :func:`smalltc.vertices.point_data` (distorted elements, random coef)."""
    from smalltc.backends.cuda import runtime as RT
    from smalltc.backends.cuda.action import vertex_ctx
    spec = ActionSpec(dim=dim, nq=nq, nd=nq if co else nq - 1, batch=3, dtype="float64",
                      qfunc="diffusion", collocated=co, geometry="vertices")
    ctx = vertex_ctx(dict(rb=1, prefetch=0), spec, None)
    mod = RT._env().get_template("vertex.cuh.j2").make_module(
        dict(ctx, dim=dim, nq=nq, dtype="float64", real="double"))
    setup3 = "stc_vx_setup(X + e * NV * DIM, CFv[e], ky, kx, f)" if dim == 3 else "(void)0"
    setup2 = "stc_vx_setup(X + e * NV * DIM, CFv[e], kx, f)" if dim == 2 else "(void)0"
    src = (_HOST % (mod.helpers(), 3, nq, dim)).replace("SETUP3", setup3).replace(
        "SETUP2", setup2)
    (tmp_path / "vx.cpp").write_text(src)
    r = subprocess.run([CXX, "-O1", "-Wno-unknown-pragmas", "-o", str(tmp_path / "vx"),
                        str(tmp_path / "vx.cpp")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    mesh = fem.box_mesh(dim, {2: (3, 1), 3: (3, 1, 1)}[dim], distortion=0.1)
    X = vertices_of_mesh(mesh)
    coef = np.random.default_rng(1).random(3) + 0.5
    stdin = " ".join(repr(float(v)) for v in np.concatenate([X.ravel(), coef]))
    r = subprocess.run([str(tmp_path / "vx")], input=stdin, capture_output=True, text=True)
    assert r.returncode == 0
    got = np.array([[float(t) for t in line.split()] for line in r.stdout.splitlines()])
    D = point_data("mass", X, coef, nq, co).reshape(-1)
    Q = point_data("diffusion", X, coef, nq, co)
    Q = np.moveaxis(Q, 1, -1).reshape(-1, dim * (dim + 1) // 2)
    assert rel_err(got[:, 0], D) <= TOL64 and rel_err(got[:, 1:], Q) <= TOL64


VX_CUDA = [("mass", 2, 3, False), ("mass", 3, 2, False), ("mass", 3, 5, False),
           ("diffusion", 2, 2, False), ("diffusion", 2, 3, True), ("diffusion", 3, 1, False),
           ("diffusion", 3, 3, False), ("diffusion", 3, 4, True)]


def _vx_forms(qfunc, dim):
    """The heuristic (None), the shared-memory form, and in 3D the line form (diffusion:
    Q computed at each point, "global", and into shared memory at the group's start,
    "smem")."""
    base = dict(per_block=2, min_blocks=0, rb=1, line=0, prefetch=0, stages=0)
    forms = [None, base]
    if dim == 3 and qfunc == "mass":
        forms.append(dict(base, line=1))
    elif dim == 3:
        forms += [dict(base, line=1, qmode=m) for m in ("global", "smem")]
    return forms


def test_cuda_vertex_choices_without_a_gpu():
    """Every VX_CUDA case has a vertex kernel (``_vx``) for each form; the forms that read
    stored data elsewhere are refused as parameters."""
    from smalltc.backends.cuda import choose
    from smalltc.backends.cuda.action import ACTION
    H100 = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)
    for qfunc, dim, p, co in VX_CUDA:
        nd, nq = p + 1, p + 1 if co else p + 2
        kw = dict(dim=dim, nq=nq, nd=nd, batch=64, dtype="float64", qfunc=qfunc,
                  collocated=co, geometry="vertices")
        for spec in (ActionSpec(**kw), MassApplySpec(ndofs=100, **kw)):
            c = choose(spec, H100)
            assert c is not None and c.entry.endswith("_vx") and c.ctx["geometry"] == 1
    a = ActionSpec(dim=3, nq=5, nd=4, batch=8, dtype="float64", qfunc="diffusion",
                   geometry="vertices")
    assert ACTION.context(a, dict(per_block=2, min_blocks=0, line=1, qmode="regs"),
                          H100) is None
    # the heuristic's line form computes Q into shared memory (the geometry's registers not
    # live in the steps); with components the slab form does not exist: Q at the point
    for ncomp, want in ((1, 1), (3, 0)):
        c = choose(ActionSpec(dim=3, nq=4, nd=3, batch=64, dtype="float64", qfunc="diffusion",
                              ncomp=ncomp, comp_axis=ncomp > 1, geometry="vertices"), H100)
        assert c.ctx["line"] == 1 and c.ctx["qsmem"] == want, (ncomp, c.ctx)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_cuda_vertex_sources_compile(tmp_path):
    from smalltc.backends.cuda.action import ACTION
    from smalltc.backends.cuda.mass_apply import MASS_APPLY
    from smalltc.backends.cuda.runtime import render
    parts, i = {}, 0
    for qfunc, dim, p, co in VX_CUDA:
        nd, nq = p + 1, p + 1 if co else p + 2
        kw = dict(dim=dim, nq=nq, nd=nd, batch=1, dtype="float64", qfunc=qfunc,
                  collocated=co, geometry="vertices")
        for fam, spec in ((ACTION, ActionSpec(**kw)), (MASS_APPLY, MassApplySpec(ndofs=1, **kw))):
            for prm in _vx_forms(qfunc, dim):
                if prm is not None and fam is MASS_APPLY:
                    prm = {k: v for k, v in prm.items() if k not in ("rb", "stages")}
                ctx = fam.context(spec, prm)
                assert ctx is not None, (qfunc, dim, p, prm)
                src = render(fam.template(ctx), dict(ctx, entry=f"{fam.entry(spec, ctx)}_{i}"))
                assert "stc_vx_setup(XV" in src and "__ldg(D" not in src
                assert re.search(r"\bQ(e)?\s*\+", src) is None, (qfunc, dim, p, prm)
                parts.setdefault(fam.template(ctx), []).append(f"namespace n{i} {{\n{src}\n}}\n")
                i += 1
    _compile_all(parts, tmp_path)


@pytest.mark.parametrize("case", [pytest.param(c, marks=gpu) for c in VX_CUDA],
                         ids=["{}-{}d-p{}{}".format(q, d, p, "-co" if co else "")
                              for q, d, p, co in VX_CUDA])
def test_cuda_vertex_geometry(case):
    """Each CUDA form of the vertex geometry (element level and fused) against the stored
    float64 path, outputs poisoned."""
    import cupy as cp
    from smalltc.backends.cuda import CudaBackend
    qfunc, dim, p, co = case
    mesh, space, nq, quad, B1d, G1d, X, coef = _vx_setup(qfunc, dim, p, co, seed=9)
    E = space.nelements
    G = None if qfunc == "mass" else G1d
    data = point_data(qfunc, X, coef, nq, co)
    rng = np.random.default_rng(10)
    V = rng.standard_normal((E,) + (p + 1,) * dim)
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(np.int32)
    x = rng.standard_normal(space.ndofs)
    ref_u = smalltc.operator_action(qfunc, B1d, G, data, V, backend="reference")
    ref_y = smalltc.operator_apply(qfunc, B1d, G, data, x, m, backend="reference")
    kw = dict(dim=dim, nq=nq, nd=p + 1, batch=E, dtype="float64", qfunc=qfunc, collocated=co,
              geometry="vertices")
    dev = lambda *arrs: [cp.asarray(z) for z in arrs if z is not None]   # noqa: E731
    for prm in _vx_forms(qfunc, dim):
        ex = CudaBackend().build(ActionSpec(**kw), prm)
        assert ex.specialized and "_vx" in ex.kernel, ex.kernel
        out = cp.full(V.shape, np.nan)
        ex.run(dev(B1d, G, X, coef, V), out)
        assert rel_err(out.get(), ref_u) <= TOL64, (ex.kernel, prm)
        prm2 = None if prm is None else {k: v for k, v in prm.items()
                                         if k not in ("rb", "stages")}
        ex = CudaBackend().build(MassApplySpec(ndofs=space.ndofs, **kw), prm2)
        y = cp.full(x.shape, np.nan)
        ex.run(dev(B1d, G, X, coef, x, m), y)
        assert rel_err(y.get(), ref_y) <= TOL64, (ex.kernel, prm)
    # the public function on CuPy arrays takes the kernel
    y = smalltc.operator_apply(qfunc, *[None if a is None else cp.asarray(a) for a in (B1d, G)],
                               None, cp.asarray(x), cp.asarray(m), vertices=cp.asarray(X),
                               coef=cp.asarray(coef))
    assert rel_err(y.get(), ref_y) <= TOL64
