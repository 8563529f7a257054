"""The stiffness instances of the CUDA assembly family: element matrices
``K_e = sum_ab G_a^T Q_e^ab G_b`` (diffusion), plus ``B^T D_e B`` (Helmholtz), Gauss and
collocated, from ``assembly.cu.j2``.

The choice tests run everywhere (no GPU: the device is an H100's numbers); the GPU tests
(marked ``gpu``, skipped without a CUDA device) run every instance at 2D and 3D p = 1..6 in
both dtypes through the backend's heuristic, forced forms of the final stage, the fallback
of a size that does not fit, the public functions and the FEM layer's assembled diffusion
operator, each output poisoned with NaN first, against the float64 einsum reference. The
kernels' compile test is test_cuda_templates.py.
"""
import numpy as np
import pytest

from smalltc._arrays import gpu_available
from smalltc.backends.cuda import choose, family_of
from smalltc.backends.cuda.assembly import ASSEMBLY, assembly_ctx
from smalltc.backends.reference import operator_assembly_einsum
from smalltc.spec import AssemblySpec

from conftest import TOL, rel_err

gpu = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="no CUDA device")]
H100 = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)
INSTANCES = [("diffusion", False), ("helmholtz", False), ("diffusion", True),
             ("helmholtz", True)]


def _spec(qfunc, co, dim, p, dtype="float64", E=5):
    nd = p + 1
    return AssemblySpec(dim=dim, nq=nd if co else nd + 1, nd=nd, batch=E, dtype=dtype,
                        qfunc=qfunc, collocated=co)


# --- choices (no GPU) ------------------------------------------------------------------

@pytest.mark.parametrize("qfunc,co", INSTANCES)
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_every_instance_gets_its_kernel(qfunc, co, dim):
    spec = _spec(qfunc, co, dim, 3)
    c = choose(spec, H100)
    assert family_of(spec).name == "assembly" and c.source == "heuristic"
    assert c.template == "assembly.cu.j2" and c.ctx["stiff"] == 1
    assert c.entry == (f"stc_{qfunc}_assemble_{dim}d_f64_nd{spec.nd}nq{spec.nq}"
                       f"{'_co' if co else ''}")
    assert c.ctx["rows"] == (0 if dim == 1 else c.ctx["rows"]) and c.ctx["threads"] <= 1024
    assert spec.size_key == f"{qfunc}/assembly/{dim}d/nd4nq{spec.nq}{'+co' if co else ''}"


def test_mass_is_unchanged():
    spec = AssemblySpec(dim=3, nq=4, nd=3, batch=5, dtype="float64")
    c = choose(spec, H100, "heuristic")
    assert c.entry == "stc_mass_assemble_3d_f64_nd3nq4" and "stiff" not in c.ctx
    assert c.ctx == assembly_ctx(3, 3, 4, "float64", H100["smem_optin"])
    assert spec.size_key == "assembly/3d/nd3nq4" and spec.kernel_key()[-1] == "float64"


def test_stiffness_needs_more_shared_memory_and_falls_back_past_it():
    # 3D: 4 product tables, 9 A1 and 4 A2 an unit against the mass's 1, 1 and 1
    m = assembly_ctx(3, 5, 6, "float64", params=dict(per_block=1, rows=1, pad=0))
    k = assembly_ctx(3, 5, 6, "float64", params=dict(per_block=1, rows=1, pad=0),
                     qfunc="diffusion")
    assert k["smem_bytes"] == 8 * (4 * 5 * 5 * 6 + 9 * 5 * 36 + 4 * 125 * 6)
    assert m["smem_bytes"] == 8 * (5 * 5 * 6 + 5 * 36 + 125 * 6)
    # 3D p = 8 in float64 (350 KB an unit) has no kernel: the einsum path runs it
    assert choose(_spec("diffusion", False, 3, 7), H100).ctx["smem_bytes"] == 212544
    assert choose(_spec("diffusion", False, 3, 8), H100) is None
    assert choose(_spec("diffusion", False, 3, 8, "float32"), H100) is not None
    with pytest.raises(ValueError, match="do not fit"):
        choose(_spec("diffusion", False, 3, 4), H100, dict(per_block=64, rows=0, pad=0))


def test_space_and_no_tables_yet():
    spec = _spec("helmholtz", False, 3, 2)
    fits = [p for p, why in ASSEMBLY.space(spec)
            if why is None and ASSEMBLY.context(spec, p, H100) is not None]
    assert len(fits) > 20 and any(p["rows"] for p in fits) and any(p["pad"] for p in fits)
    mass = AssemblySpec(dim=3, nq=4, nd=3, batch=5, dtype="float64")
    assert ASSEMBLY.carry(spec, mass, dict(per_block=8, rows=4, pad=1), H100) is None


# --- on a GPU --------------------------------------------------------------------------

def _data(spec, seed=0):
    """B1d (None when collocated), G1d, D (helmholtz), Q: random, rounded to the dtype."""
    rng = np.random.default_rng(seed + 10 * spec.dim + spec.nd)
    rd = (lambda a: None if a is None else a.astype(spec.dtype).astype(np.float64))
    nq, nd, E, dim = spec.nq, spec.nd, spec.batch, spec.dim
    B1d = None if spec.collocated else rng.standard_normal((nq, nd))
    G1d = rng.standard_normal((nq, nd))
    D = rng.random((E,) + (nq,) * dim) + 0.5 if spec.qfunc == "helmholtz" else None
    Q = rng.standard_normal((E, dim * (dim + 1) // 2) + (nq,) * dim)
    return rd(B1d), rd(G1d), rd(D), rd(Q)


def _tol(spec):
    return TOL[spec.dtype] * (20 if spec.dtype == "float32" else 10) * (4 if spec.p >= 4 else 1)


def _run(spec, params=None):
    """(executor, result, reference) of the backend's kernel for ``spec``."""
    import cupy as cp

    from smalltc.backends.cuda import CudaBackend
    B1d, G1d, D, Q = _data(spec)
    ref = operator_assembly_einsum(spec.qfunc, B1d, G1d, D, Q, spec.dim)
    ex = CudaBackend().build(spec, params)
    ops = [cp.asarray(a.astype(spec.dtype)) for a in (B1d, G1d, D, Q) if a is not None]
    out = cp.full(spec.out_shape, np.nan, dtype=spec.dtype)
    ex.run(ops, out)
    return ex, out, ref


CASES = [(q, co, dim, p, dt) for q, co in INSTANCES for dim in (2, 3) for p in range(1, 7)
         for dt in ("float64", "float32")] + [
    ("diffusion", False, 1, 3, "float64"), ("helmholtz", True, 1, 4, "float32")]


@pytest.mark.parametrize("case", [pytest.param(c, marks=gpu) for c in CASES],
                         ids=["{}{}-{}d-p{}-{}".format(q, "+co" if co else "", d, p, dt)
                              for q, co, d, p, dt in CASES])
def test_heuristic_kernel_matches_einsum(case):
    spec = _spec(*case)
    ex, out, ref = _run(spec)
    assert ex.specialized and ex.kernel.startswith(f"stc_{spec.qfunc}_assemble"), ex.kernel
    assert rel_err(out, ref) <= _tol(spec), (ex.kernel, ex.params, rel_err(out, ref))


# forced forms of the final stage: flat (rows 0), rows 1/2/4, padded rows (even nq)
FORMS = [("diffusion", False, 3, 2, dict(per_block=2, rows=0, pad=1)),
         ("helmholtz", False, 3, 2, dict(per_block=3, rows=2, pad=1)),
         ("diffusion", True, 3, 3, dict(per_block=1, rows=1, pad=1)),
         ("helmholtz", False, 3, 3, dict(per_block=4, rows=0, pad=0)),
         ("diffusion", False, 2, 2, dict(per_block=3, rows=0, pad=1)),
         ("diffusion", True, 2, 4, dict(per_block=5, rows=4, pad=0)),
         ("helmholtz", True, 2, 3, dict(per_block=2, rows=1, pad=1))]


@pytest.mark.parametrize("case", [pytest.param(c, marks=gpu) for c in FORMS])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_forced_forms_match_einsum(case, dtype):
    qfunc, co, dim, p, params = case
    spec = _spec(qfunc, co, dim, p, dtype, E=7)
    ex, out, ref = _run(spec, params)
    assert ex.params["per_block"] == params["per_block"] and ex.params["rows"] == params["rows"]
    assert rel_err(out, ref) <= _tol(spec), (ex.kernel, params, rel_err(out, ref))


@pytest.mark.parametrize("dtype", [pytest.param("float64", marks=gpu)])
def test_size_without_a_kernel_runs_the_einsum_and_says_so(dtype):
    spec = _spec("diffusion", False, 3, 8, dtype, E=2)
    ex, out, ref = _run(spec)
    assert not ex.specialized and "does not fit in shared memory" in ex.kernel, ex.kernel
    assert rel_err(out, ref) <= _tol(spec)


@pytest.mark.parametrize("qfunc,co", [pytest.param(*c, marks=gpu) for c in INSTANCES])
def test_public_functions_on_cupy(qfunc, co):
    import cupy as cp

    import smalltc
    spec = _spec(qfunc, co, 3, 2, E=6)
    B1d, G1d, D, Q = _data(spec, seed=3)
    ref = operator_assembly_einsum(qfunc, B1d, G1d, D, Q, 3)
    dev = [None if a is None else cp.asarray(a) for a in (B1d, G1d, D, Q)]
    data = dev[3] if qfunc == "diffusion" else (dev[2], dev[3])
    out = cp.full(ref.shape, np.nan)
    got = smalltc.assemble_operator(qfunc, dev[0], dev[1], data, out=out)
    assert got is out and rel_err(out, ref) <= 1e-12
    p = smalltc.plan(f"{qfunc}_assembly", *dev[:2], *((data,) if qfunc == "diffusion"
                                                       else data))
    assert p.specialized and p.backend == "cuda" and "assemble" in str(p.kernel)
    if qfunc == "diffusion":
        K = smalltc.assemble_diffusion(dev[0], dev[1], dev[3])
        assert rel_err(K, ref) <= 1e-12


@pytest.mark.parametrize("quadrature", [pytest.param(q, marks=gpu) for q in ("gauss", "gll")])
@pytest.mark.parametrize("dim,p", [(2, 3), (3, 2)])
def test_fem_assembled_diffusion_on_the_gpu(quadrature, dim, p):
    from smalltc.fem import H1Space, box_mesh, diffusion_operator
    from smalltc.fem._device import to_host
    space = H1Space(box_mesh(dim, 3 if dim == 2 else 2, distortion=0.05), p)
    host = diffusion_operator(space, assembled=True, quadrature=quadrature, device="cpu")
    dev = diffusion_operator(space, assembled=True, quadrature=quadrature, device="gpu")
    m = to_host(dev.matrices)
    assert rel_err(m, host.matrices) <= 1e-12
    x = np.random.default_rng(p).standard_normal(space.ndofs)
    np.testing.assert_allclose(to_host(dev(x)), host(x), rtol=0,
                               atol=1e-12 * np.abs(host(x)).max())
    assert abs(to_host(dev(np.ones(space.ndofs)))).max() < 1e-10     # K annihilates constants


def test_tuning_sizes_name_the_stiffness_forms():
    from smalltc.tuning.sizes import parse
    specs = parse("assembly", ["3:1-2:p+2:diffusion", "2:3:p+1:helmholtz+co"], "float32")
    assert [s.size_key for s in specs] == ["diffusion/assembly/3d/nd2nq3",
                                           "diffusion/assembly/3d/nd3nq4",
                                           "helmholtz/assembly/2d/nd4nq4+co"]
    with pytest.raises(ValueError, match="collocated=True needs nq == nd"):
        parse("assembly", ["3:2:p+2:diffusion+co"], "float64")
    with pytest.raises(ValueError, match="must be one of"):
        parse("assembly", ["3:2:p+2:stokes"], "float64")


def test_bench_assembly_cases_of_the_stiffness():
    """``smalltc bench --suite assembly --qfunc ...``: the case, its operands, reference,
    smalltc plan and baselines agree (here on NumPy with the reference backend)."""
    from smalltc.bench.baselines import baselines
    from smalltc.bench.cases import case_spec, make_inputs, reference, smalltc_impl
    from smalltc.bench.suites import cases
    (c,) = cases("assembly", "float64", "cpu", ps=[1], dims=[2], quick=True,
                 qfuncs=["helmholtz+co"])
    assert c.id == "assembly dim=2 p=1 nq=2 qfunc=helmholtz collocated float64"
    c.sizes["batch"] = 3
    spec = case_spec(c)
    assert (spec.qfunc, spec.collocated, [o.name for o in spec.inputs]) == (
        "helmholtz", True, ["G1d", "D", "Q"])
    ops = make_inputs(c, np)
    ref = reference(c, ops)
    impl = smalltc_impl(c, ops, np, backend="reference")
    assert rel_err(impl.fn(), ref) <= 1e-14
    found = baselines(c, ops, np)
    assert [b.name for b in found] == ["numpy.einsum", "numpy.matmul"]
    for b in found:
        assert rel_err(b.fn(), ref) <= 1e-14
    with pytest.raises(ValueError, match="assembly forms are"):
        cases("assembly", "float64", "cpu", ps=[1], dims=[2], qfuncs=["stokes"])
