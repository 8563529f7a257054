"""The CUDA kernels of the operator family (diffusion and helmholtz, Gauss and collocated):
every form forced through the backend (the shared-memory form, the 3D line form; the fused
map form atomic and deterministic; the diagonal atomic and per colour), each output
poisoned with NaN first, against the dense float64 oracle of ``tests/oracle.py``.
Skips without a GPU (the kernels' compile tests run everywhere: test_cuda_templates.py).
"""
import numpy as np
import pytest

import oracle
from smalltc._arrays import gpu_available
from smalltc.spec import ActionSpec, MassApplySpec, MassDiagonalSpec

from conftest import TOL, rel_err

gpu = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="no CUDA device")]
H100 = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)


@pytest.mark.parametrize("op", ["action", "mass_apply", "mass_diagonal"])
@pytest.mark.parametrize("qfunc,co", [("diffusion", False), ("helmholtz", False),
                                      ("diffusion", True), ("helmholtz", True)])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_choices_without_a_gpu(op, qfunc, co, dim):
    """Every instance gets a specialised kernel of its own name (the heuristic, or the
    shipped table where it holds the instance: the fused operator in 3D);
    3D the line form, 1D/2D the shared-memory form; the assembly's is the assembly family's
    stiffness instance (tests/test_cuda_assembly_stiffness.py)."""
    from smalltc.backends.cuda import choose, family_of
    from smalltc.spec import AssemblySpec
    p = 3
    nd, nq = p + 1, p + 1 if co else p + 2
    kw = dict(dim=dim, nq=nq, nd=nd, batch=64, dtype="float64", qfunc=qfunc, collocated=co)
    spec = {"action": lambda: ActionSpec(**kw),
            "mass_apply": lambda: MassApplySpec(ndofs=100, **kw),
            "mass_diagonal": lambda: MassDiagonalSpec(ndofs=100, **kw)}[op]()
    c = choose(spec, H100)
    # the H100 table holds the fused operator's 3D diffusion, collocated diffusion and
    # Gauss helmholtz sizes
    tabled = op == "mass_apply" and dim == 3 and (qfunc == "diffusion" or not co)
    assert (c.source.startswith("table") if tabled else c.source == "heuristic")
    assert c.entry.startswith(f"stc_{qfunc}_")
    assert ("_co" in c.entry) == co and c.ctx["qfunc"] == qfunc
    if op != "mass_diagonal":
        assert c.template == ("action_line.cu.j2" if dim == 3 else "action.cu.j2")
    asm = AssemblySpec(dim=dim, nq=nq, nd=nd, batch=4, dtype="float64", qfunc=qfunc,
                       collocated=co)
    assert family_of(asm).name == "assembly"
    assert choose(asm, H100).entry == (f"stc_{qfunc}_assemble_{dim}d_f64_nd{nd}nq{nq}"
                                       f"{'_co' if co else ''}")

# (qfunc, collocated, dim, p, dtype, ncomp, line): nq = p + 1 collocated, else p + 2
CASES = [
    ("diffusion", False, 1, 3, "float64", 1, 0),
    ("helmholtz", False, 1, 2, "float32", 2, 0),
    ("diffusion", True, 1, 4, "float64", 1, 0),
    ("diffusion", False, 2, 3, "float64", 1, 0),
    ("helmholtz", False, 2, 2, "float64", 3, 0),
    ("diffusion", True, 2, 3, "float32", 1, 0),
    ("helmholtz", True, 2, 4, "float64", 1, 0),
    ("diffusion", False, 3, 1, "float64", 1, 0),
    ("diffusion", False, 3, 2, "float64", 3, 0),
    ("helmholtz", False, 3, 3, "float32", 1, 0),
    ("diffusion", True, 3, 3, "float64", 1, 0),
    ("helmholtz", True, 3, 2, "float64", 3, 0),
    ("diffusion", False, 3, 1, "float64", 1, 1),
    ("diffusion", False, 3, 4, "float64", 1, 1),
    ("diffusion", False, 3, 3, "float32", 3, 1),
    ("helmholtz", False, 3, 4, "float64", 1, 1),
    ("diffusion", True, 3, 4, "float64", 1, 1),
    ("diffusion", True, 3, 6, "float32", 1, 1),
    ("helmholtz", True, 3, 3, "float64", 3, 1),
    ("diffusion", False, 3, 7, "float64", 1, 1),
    ("diffusion", True, 3, 7, "float64", 1, 1),
]
IDS = ["{}{}-{}d-p{}-{}-c{}{}".format(q, "+co" if co else "", d, p, dt, c, "-line" if ln else "")
       for q, co, d, p, dt, c, ln in CASES]


def _backend():
    from smalltc.backends.cuda import CudaBackend
    return CudaBackend()


def _data(case, E, seed=0):
    qfunc, co, dim, p, dtype, ncomp, line = case
    nd, nq = p + 1, p + 1 if co else p + 2
    rng = np.random.default_rng(seed + 100 * dim + p)
    rd = (lambda a: None if a is None else a.astype(dtype).astype(np.float64))
    B1d = None if co else rng.standard_normal((nq, nd))
    G1d = rng.standard_normal((nq, nd))
    Q = rng.standard_normal((E, dim * (dim + 1) // 2) + (nq,) * dim)
    D = rng.random((E,) + (nq,) * dim) + 0.5 if qfunc == "helmholtz" else None
    return nd, nq, rd(B1d), rd(G1d), rd(D), rd(Q)


def _dev(dtype, *arrays):
    import cupy as cp
    return [None if a is None else cp.asarray(a.astype(dtype) if a.dtype.kind == "f" else a)
            for a in arrays]


def _tol(dtype, p):
    return TOL[dtype] * (20 if dtype == "float32" else 10) * (4 if p >= 4 else 1)


def _forms(line, ncomp):
    """The heuristic (None), then the case's form; the line form with each ``qmode`` (where
    the z step reads Q: "smem" for ncomp 1 only)."""
    base = dict(per_block=2, min_blocks=0, rb=1, line=line, prefetch=0, stages=0)
    if not line:
        return [None, base]
    return [None] + [dict(base, qmode=m) for m in ("global", "regs", "smem")
                     if m != "smem" or ncomp == 1]


@pytest.mark.parametrize("case", [pytest.param(c, marks=gpu) for c in CASES], ids=IDS)
def test_action(case):
    import cupy as cp
    qfunc, co, dim, p, dtype, ncomp, line = case
    E = 7
    nd, nq, B1d, G1d, D, Q = _data(case, E)
    V = np.random.default_rng(1).standard_normal(
        (E,) + ((ncomp,) if ncomp > 1 else ()) + (nd,) * dim).astype(dtype).astype(np.float64)
    ref = oracle.operator_action(qfunc, B1d, G1d, D, Q, V, dim)
    spec = ActionSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, ncomp=ncomp,
                      comp_axis=ncomp > 1, qfunc=qfunc, collocated=co)
    for params in _forms(line, ncomp):
        ex = _backend().build(spec, params)
        assert ex.specialized and qfunc in ex.kernel, ex.kernel
        ops = [a for a in _dev(dtype, B1d, G1d, D, Q, V) if a is not None]
        out = cp.full(V.shape, np.nan, dtype=dtype)
        ex.run(ops, out)
        assert rel_err(out, ref) <= _tol(dtype, p), (ex.kernel, rel_err(out, ref))


@pytest.mark.parametrize("case", [pytest.param(c, marks=gpu) for c in CASES], ids=IDS)
def test_fused_apply_and_diagonal(case):
    import cupy as cp
    from smalltc.fem import H1Space, box_mesh
    qfunc, co, dim, p, dtype, ncomp, line = case
    space = H1Space(box_mesh(dim, {1: 6, 2: 3, 3: 2}[dim]), p)
    E = space.nelements
    nd, nq, B1d, G1d, D, Q = _data(case, E, seed=5)
    rng = np.random.default_rng(3)
    it = np.int64 if p % 2 else np.int32
    m = rng.permutation(space.ndofs)[space.elem_dofs].astype(it)
    x = rng.standard_normal((ncomp, space.ndofs) if ncomp > 1 else (space.ndofs,))
    x = x.astype(dtype).astype(np.float64)
    ref = oracle.operator_apply(qfunc, B1d, G1d, D, Q, x, m, dim)
    b, g, d, q, xx, mm = _dev(dtype, B1d, G1d, D, Q, x, m)
    for det in (False, True):
        spec = MassApplySpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, ndofs=space.ndofs,
                             ncomp=ncomp, comp_axis=ncomp > 1, index_dtype=np.dtype(it).name,
                             deterministic=det, qfunc=qfunc, collocated=co)
        for params in _forms(line, ncomp):
            ex = _backend().build(spec, params)
            assert ex.specialized and qfunc in ex.kernel, ex.kernel
            out = cp.full(x.shape, np.nan, dtype=dtype)
            ex.run([a for a in (b, g, d, q, xx, mm) if a is not None], out)
            assert rel_err(out, ref) <= _tol(dtype, p), (ex.kernel, det, rel_err(out, ref))
    d_ref = oracle.operator_diagonal(qfunc, B1d, G1d, D, Q, m, space.ndofs, dim)
    for det in (False, True):
        spec = MassDiagonalSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype,
                                ndofs=space.ndofs, index_dtype=np.dtype(it).name,
                                deterministic=det, qfunc=qfunc, collocated=co)
        ex = _backend().build(spec)
        assert ex.specialized and qfunc in ex.kernel, ex.kernel
        out = cp.full((space.ndofs,), np.nan, dtype=dtype)
        ex.run([a for a in (b, g, d, q, mm) if a is not None], out)
        assert rel_err(out, d_ref) <= _tol(dtype, p), (ex.kernel, det, rel_err(out, d_ref))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
def test_public_api_runs_the_kernels():
    """``smalltc.plan`` of a diffusion apply on CuPy arrays picks the specialised kernel."""
    import cupy as cp
    import smalltc
    from smalltc.fem import H1Space, box_mesh
    space = H1Space(box_mesh(3, 2), 3)
    rng = np.random.default_rng(0)
    B1d, G1d = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    Q = rng.standard_normal((space.nelements, 6, 5, 5, 5))
    x = rng.standard_normal(space.ndofs)
    m = space.elem_dofs.astype(np.int32)
    ref = oracle.operator_apply("diffusion", B1d, G1d, None, Q, x, m, 3)
    y = smalltc.diffusion_apply(*_dev("float64", B1d, G1d, Q, x, m))
    assert rel_err(y, ref) <= 1e-12
    pl = smalltc.plan("diffusion_apply", *_dev("float64", B1d, G1d, Q, x, m))
    assert pl.specialized, str(pl)
