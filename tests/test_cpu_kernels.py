"""CPU backend specifics: GEMM variants, generic vs specialised kernels, caches, threads.

The operation tables (tests/test_operations.py) run this backend too; here
are the cases only it has. Compiles are the cost, so the number of distinct
kernels is kept small: the generic kernels take the many-sizes cases, a few
specialised ones cover each template branch.
"""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import smalltc
from smalltc.backends import get
from smalltc.backends.cpu import contract as cpu_contract
from smalltc.backends.cpu import runtime
from smalltc.backends.cpu.contract import generic_executor
from smalltc.backends.reference import action_einsum, assembly_einsum, contract_einsum
from smalltc.spec import ActionSpec, AssemblySpec, GemmSpec
from conftest import full_only

pytest.importorskip("numba")

TOL = {"float64": 1e-12, "float32": 1e-5}
E = 13   # not a multiple of the SIMD lane count: chunked kernels see a tail


def rel(out, ref):
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def poisoned(shape, dtype):
    return np.full(shape, np.nan, dtype=dtype)


def _gemm_operands(rng, m, n, k, ta, tb, shared, dtype):
    a_core = (k, m) if ta else (m, k)
    b_core = (n, k) if tb else (k, n)
    A = rng.standard_normal(a_core if shared == "A" else (E,) + a_core).astype(dtype)
    B = rng.standard_normal(b_core if shared == "B" else (E,) + b_core).astype(dtype)
    C = rng.standard_normal((E, m, n)).astype(dtype)
    return A, B, C


def _gemm_ref(A, B, C, ta, tb, alpha, beta):
    a = np.swapaxes(A, -1, -2) if ta else A
    b = np.swapaxes(B, -1, -2) if tb else B
    return alpha * np.matmul(a.astype(np.float64), b.astype(np.float64)) + beta * C


def _check_gemm(rng, m, n, k, ta, tb, shared, beta, dtype="float64", generic=False,
                params=None):
    A, B, C = _gemm_operands(rng, m, n, k, ta, tb, shared, dtype)
    p = smalltc.plan("gemm", A, B, C if beta else None, beta=beta, trans_a=ta,
                     trans_b=tb, backend="cpu", params=params)
    out = poisoned((E, m, n), dtype)
    if generic:                     # the run-time-sized kernel of the same spec
        ex = generic_executor(p.spec)
        assert ex.specialized is False and "generic" in ex.kernel
        ex.run((A, B, C if beta else None), out, alpha=1.5, beta=beta)
    else:
        p(A, B, C if beta else None, alpha=1.5, beta=beta, out=out)
    assert rel(out, _gemm_ref(A, B, C, ta, tb, 1.5, beta)) < TOL[dtype]
    return p


# every transpose x shared x beta combination, on the generic kernel
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("shared", [None, "A", "B"])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_gemm_generic_all_combinations(ta, tb, shared, beta):
    _check_gemm(np.random.default_rng(1), 3, 5, 4, ta, tb, shared, beta, generic=True)


def test_gemm_beyond_the_specialised_limit_runs_generic(caplog):
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((3, 65, 2)), rng.standard_normal((3, 2, 3))
    with caplog.at_level("WARNING", logger="smalltc"):
        p = smalltc.plan("gemm", A, B, backend="cpu")
    assert p.specialized is False and p.kernel == "stc_gemm_generic_f64"
    assert "generic" in caplog.text
    assert rel(p(A, B), A @ B) < 1e-12


# a covering set on the specialised kernels: each flag value in each form
GEMM_SPECIALISED = [  # (m, n, k, ta, tb, shared, beta)
    (2, 2, 2, False, False, None, 0.0),
    (3, 4, 2, True, False, "A", 1.0),
    (4, 3, 5, False, True, "B", 0.0),
    (3, 2, 4, True, True, None, -2.0),
    (8, 8, 8, False, False, None, 1.0),
    (6, 9, 7, True, False, "B", 0.0),
    (9, 5, 7, False, True, "A", 0.5),
    (12, 10, 9, True, True, None, 0.0),
]


@pytest.mark.parametrize("case", GEMM_SPECIALISED, ids=str)
def test_gemm_specialised(case):
    m, n, k, ta, tb, shared, beta = case
    p = _check_gemm(np.random.default_rng(2), m, n, k, ta, tb, shared, beta,
                    params="heuristic")
    assert p.specialized and p.backend == "cpu"
    assert p.params["form"] == ("full" if m * n * k <= 125 else "rows")


@pytest.mark.parametrize("params", [dict(form="rows", rb=1), dict(form="rows", rb=3),
                                    dict(form="full", rb=0)], ids=str)
def test_gemm_forms_by_parameters(params):
    p = _check_gemm(np.random.default_rng(2), 6, 5, 4, False, True, None, 1.0, params=params)
    assert {k: p.params[k] for k in params} == params and p.source == "params"


def test_gemm_float32_and_in_place():
    rng = np.random.default_rng(3)
    A, B, C = _gemm_operands(rng, 4, 4, 4, False, False, None, "float32")
    ref = _gemm_ref(A, B, C, False, False, 1.0, 1.0)
    smalltc.batched_gemm(A, B, C, beta=1.0, out=C)      # the classic C += A B
    assert rel(C, ref) < TOL["float32"]


def test_gemm_beta_zero_does_not_read_c():
    rng = np.random.default_rng(4)
    A, B, _ = _gemm_operands(rng, 3, 3, 3, False, False, None, "float64")
    out = poisoned((E, 3, 3), "float64")     # NaN would poison alpha*AB + 0*C
    smalltc.batched_gemm(A, B, out=out)
    assert np.isfinite(out).all()


def _action_inputs(rng, dim, p, nq, dtype, ncomp=None):
    nd = p + 1
    B1d = rng.standard_normal((nq, nd)).astype(dtype)
    D = rng.standard_normal((E,) + (nq,) * dim).astype(dtype)
    comp = (ncomp,) if ncomp else ()
    V = rng.standard_normal((E,) + comp + (nd,) * dim).astype(dtype)
    return B1d, D, V


@pytest.mark.parametrize("dim,p,nq", [(1, 3, 4), (2, 2, 4), (3, 2, 3)])
def test_action_generic_matches_specialised(dim, p, nq):
    B1d, D, V = _action_inputs(np.random.default_rng(5), dim, p, nq, "float64", ncomp=2)
    ref = action_einsum(B1d, D, V, dim)
    fast = smalltc.plan("action", B1d, D, V, backend="cpu")
    assert fast.specialized and fast.kernel.startswith(f"stc_mass_action_{dim}d_f64")
    slow = generic_executor(fast.spec)
    assert slow.specialized is False
    u_fast, u_slow = poisoned(V.shape, V.dtype), poisoned(V.shape, V.dtype)
    fast.executor.run((B1d, D, V), u_fast)
    slow.run((B1d, D, V), u_slow)
    assert rel(u_fast, ref) < 1e-12 and rel(u_slow, ref) < 1e-12
    assert rel(u_fast, u_slow) < 1e-13


@pytest.mark.parametrize("p,nq,ncomp,dtype", [(2, 4, None, "float64"), (1, 4, 3, "float32")])
def test_action_with_its_body_inlined(p, nq, ncomp, dtype):
    """The 3D lanes action whose D moves into the lanes by scalar copies runs its body
    inlined into the parallel loop (its entry point the driver itself); E = 13: a partial
    last chunk."""
    from smalltc.backends.cpu import ACTION
    B1d, D, V = _action_inputs(np.random.default_rng(15), 3, p, nq, dtype, ncomp=ncomp)
    spec = smalltc.plan("action", B1d, D, V, backend="reference").spec
    from smalltc.backends.cpu.target import host
    t = host()
    lanes = dict(lanes=t.lanes(dtype), rb=1, tr=0, vbits=t.vector_bits)
    assert ACTION.context(spec, lanes, t)["render"]["inline_body"]
    assert not ACTION.context(spec, dict(lanes, tr=1), t)["render"]["inline_body"]
    ex = get("cpu").build(spec, params=lanes)
    out = poisoned(V.shape, dtype)
    ex.run((B1d, D, V), out)
    ref = action_einsum(B1d.astype(float), D.astype(float), V.astype(float), 3)
    assert rel(out, ref) < TOL[dtype]


def test_fallback_is_reported(caplog):
    B1d, D, V = _action_inputs(np.random.default_rng(6), 1, 17, 25, "float32")   # nq > 24
    with caplog.at_level("WARNING", logger="smalltc"):
        p = smalltc.plan("action", B1d, D, V, backend="cpu")
    assert p.specialized is False and "generic" in p.kernel
    assert "generic" in caplog.text
    out = p(B1d, D, V, out=poisoned(V.shape, V.dtype))
    assert rel(out, action_einsum(B1d.astype(float), D.astype(float), V.astype(float), 1)) \
        < TOL["float32"]


def test_action_p16_3d():
    """The largest specialised size: p = 16 (nd = 17), nq = 18."""
    B1d, D, V = _action_inputs(np.random.default_rng(7), 3, 16, 18, "float64")
    p = smalltc.plan("action", B1d, D, V, backend="cpu")
    assert p.specialized and p.kernel == "stc_mass_action_3d_f64_nd17_nq18"
    out = p(B1d, D, V, out=poisoned(V.shape, V.dtype))
    assert rel(out, action_einsum(B1d, D, V, 3)) < 1e-12


# the action's inner form (SIMD within the element) by explicit parameters: 1D/2D/3D,
# odd and even nd, nq = p + 1 and p + 2, one and three components, both dtypes, both
# vector widths where the host has two (E = 13 elements: a partial last part); by default
# a subset that still takes every value of each parameter (rb, jb, pf, vbits, dtype, dim)
INNER_CASES = [  # (dim, p, nq, dtype, ncomp, params)
    (3, 2, 4, "float64", None, dict(rb=1, jb=2, pf=0, vbits=256)),
    full_only((3, 3, 4, "float64", 3, dict(rb=2, jb=1, pf=1, vbits=512))),
    full_only((3, 6, 8, "float64", None, dict(rb=3, jb=1, pf=1, vbits=512))),
    full_only((3, 4, 5, "float32", None, dict(rb=2, jb=1, pf=1, vbits=256))),
    (3, 3, 5, "float32", 3, dict(rb=1, jb=2, pf=2, vbits=512)),
    (2, 3, 5, "float64", None, dict(rb=2, jb=1, pf=1, vbits=512)),
    (2, 4, 5, "float64", 3, dict(rb=3, jb=2, pf=1, vbits=256)),
    full_only((2, 5, 7, "float32", None, dict(rb=2, jb=1, pf=1, vbits=512))),
    (1, 3, 5, "float64", 2, dict(rb=2, jb=1, pf=1, vbits=256)),
    full_only((3, 5, 7, "float32", 3, dict(rb=1, jb=2, pf=2, vbits=512))),
]


def _host_params(params):
    """``params`` with the vector width this host can be asked for (0 without AVX-512)."""
    from smalltc.backends.cpu.target import host
    return dict(params, form="inner", vbits=params["vbits"] if host().isa == "avx512" else 0)


@pytest.mark.parametrize("case", INNER_CASES, ids=str)
def test_action_inner_form(case):
    dim, p, nq, dtype, ncomp, params = case
    B1d, D, V = _action_inputs(np.random.default_rng(13), dim, p, nq, dtype, ncomp=ncomp)
    spec = smalltc.plan("action", B1d, D, V, backend="reference").spec
    params = _host_params(params)
    ex = get("cpu").build(spec, params=params)
    assert ex.source == "params" and {k: ex.params[k] for k in params} == params
    out = poisoned(V.shape, dtype)
    ex.run((B1d, D, V), out)
    ref = action_einsum(B1d.astype(float), D.astype(float), V.astype(float), dim)
    assert rel(out, ref) < TOL[dtype]


def test_action_inner_form_in_place_and_one_element():
    """U may be V (each element's V is read before its U is written); one element."""
    B1d, D, V = _action_inputs(np.random.default_rng(14), 3, 2, 4, "float64", ncomp=2)
    ref = action_einsum(B1d, D, V, 3)
    ex = get("cpu").build(smalltc.plan("action", B1d, D, V, backend="reference").spec,
                          params=_host_params(dict(rb=1, jb=2, pf=0, vbits=256)))
    U = V.copy()
    ex.run((B1d, D, U), U)
    assert rel(U, ref) < 1e-12
    one = poisoned(V[:1].shape, V.dtype)
    ex.run((B1d, D[:1], V[:1]), one)
    assert rel(one, ref[:1]) < 1e-12


def test_action_forms_parameters():
    """The family's parameters: entries without ``form`` are the lanes form (older
    tables); the inner form takes ``rb``, ``jb``, ``pf``, ``vbits`` and not the lanes'."""
    from smalltc.backends.cpu import ACTION
    from smalltc.backends.cpu.target import host
    spec = ActionSpec(dim=3, nq=6, nd=5, batch=5, dtype="float64")
    t = host()
    vb = 256 if t.isa == "avx512" else 0
    lanes = dict(lanes=t.lanes("float64"), rb=2, tr=0, vbits=vb)
    assert ACTION.adapt(spec, spec, lanes, None) == dict(lanes, form="lanes", jb=0, pf=0)
    assert ACTION.public(ACTION.context(spec, lanes, t)) == dict(lanes, form="lanes", jb=0,
                                                                  pf=0)
    inner = dict(form="inner", rb=2, jb=1, pf=1, vbits=vb)
    assert ACTION.public(ACTION.context(spec, inner, t)) == dict(inner, lanes=1, tr=0)
    for bad in (dict(inner, tr=1), dict(inner, rb=5), dict(inner, jb=3), dict(lanes, jb=1),
                dict(lanes, pf=1), dict(inner, form="other")):
        assert ACTION.context(spec, bad, t) is None, bad
    with pytest.raises(ValueError, match="do not fit .*form, lanes, rb, tr, vbits, jb, pf"):
        get("cpu").build(spec, params=dict(inner, lanes=4))
    forms = {p["form"] for p, why in ACTION.space(spec, t) if why is None}
    assert forms == {"lanes", "inner"}
    assert all(ACTION.context(spec, p, t) is not None for p, why in ACTION.space(spec, t)
               if why is None)


@pytest.mark.parametrize("dim,p,nq,dtype", [(2, 2, 3, "float64"), (3, 1, 3, "float32")])
def test_assembly_generic_matches_specialised(dim, p, nq, dtype):
    rng = np.random.default_rng(8)
    B1d, D, _ = _action_inputs(rng, dim, p, nq, dtype)
    ref = assembly_einsum(B1d.astype(float), D.astype(float), dim)
    fast = smalltc.plan("assembly", B1d, D, backend="cpu")
    assert fast.specialized
    slow = generic_executor(fast.spec)
    assert slow.specialized is False
    m_fast, m_slow = poisoned(fast.out_shape, dtype), poisoned(fast.out_shape, dtype)
    fast.executor.run((B1d, D), m_fast)
    slow.run((B1d, D), m_slow)
    assert rel(m_fast, ref) < TOL[dtype] and rel(m_slow, ref) < TOL[dtype]


@pytest.mark.parametrize("kind,xs,ys", [
    ("8a", (E, 4, 3, 2), (5, 3, 1)),       # X batched, Y shared
    ("8b", (2, 3, 4), (E, 2, 3, 5)),       # X shared, Y batched
    ("9", (4, 3), (E, 2, 4, 5)),           # B shared, C batched
])
@pytest.mark.parametrize("generic", [False, True])
def test_contract_kernels(monkeypatch, kind, xs, ys, generic):
    monkeypatch.setattr(cpu_contract, "SPECIALIZE_CONTRACT", True)
    if generic:
        monkeypatch.setattr(cpu_contract, "MAX_CONTRACT", 0)
    rng = np.random.default_rng(9)
    X, Y = rng.standard_normal(xs), rng.standard_normal(ys)
    spec = smalltc.plan("contract", X, Y, kind=kind, backend="reference").spec
    ex = get("cpu").build(spec)
    assert ex.specialized is not generic
    out = poisoned(spec.out_shape, "float64")
    ex.run((X, Y), out)
    assert rel(out, contract_einsum(kind, X, Y)) < 1e-12


def test_pairwise_runs_on_cpu_kernels():
    B1d, D, V = _action_inputs(np.random.default_rng(10), 3, 2, 4, "float64")
    p = smalltc.plan("action", B1d, D, V, backend="cpu", method="pairwise")
    assert p.kernel.startswith("pairwise (4a):stc_contract8a_generic_f64")
    out = p(B1d, D, V, out=poisoned(V.shape, V.dtype))
    assert rel(out, action_einsum(B1d, D, V, 3)) < 1e-12


def test_in_process_cache_hit():
    spec = ActionSpec(dim=2, nq=3, nd=2, batch=5, dtype="float64")
    first = get("cpu").build(spec)
    second = get("cpu").build(spec.with_batch(99))
    assert second.fn is first.fn and second.compile_s == 0.0
    p1 = smalltc.plan("gemm", np.ones((4, 2, 2)), np.ones((4, 2, 2)), backend="cpu")
    p2 = smalltc.plan("gemm", np.ones((4, 2, 2)), np.ones((4, 2, 2)), backend="cpu")
    assert p1 is not p2 and p1.executor.fn is p2.executor.fn    # a new plan, the same kernel
    assert p2.executor.compile_s == 0.0


def test_disk_cache_in_fresh_processes(tmp_path):
    """A kernel compiled by one process loads from the disk cache in the next, without
    Numba's context refresh (its library of lowerings, numba.np.linalg among them, is
    not imported); a new kernel compiles after such a load, and another module's cached
    Numba function still loads with the refresh."""
    (tmp_path / "other_numba.py").write_text(textwrap.dedent("""
        import numba
        @numba.njit(cache=True)
        def total(x):
            return x.sum()
    """))
    code = textwrap.dedent("""
        import sys, numpy as np, smalltc
        sys.path.insert(0, sys.argv[1])
        then = sys.argv[2]
        rng = np.random.default_rng(5)
        def gemm(m, n, k):
            A, B = rng.standard_normal((3, m, k)), rng.standard_normal((3, k, n))
            p = smalltc.plan("gemm", A, B, backend="cpu")
            fn = p.executor.fn
            return (np.allclose(p(A, B), A @ B, rtol=1e-13, atol=1e-13),
                    sum(fn.stats.cache_hits.values()), sum(fn.stats.cache_misses.values()))
        first = gemm(2, 2, 3)
        lean = "numba.np.linalg" not in sys.modules
        if then == "compile":
            second = gemm(2, 3, 2)
        else:
            import other_numba
            second = (other_numba.total(np.ones(3)) == 3.0,)
        print(first, lean, second, "numba.np.linalg" in sys.modules)
    """)
    env = dict(os.environ, SMALLTC_CACHE_DIR=str(tmp_path))
    env.pop("SMALLTC_COMPILE_PROCESS", None)    # compiled in the first process itself
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path), then], env=env,
                           capture_output=True, text=True, check=True).stdout.splitlines()[-1]
            for then in ("other", "compile", "other")]
    assert runs == ["(True, 0, 1) False (True,) True",          # compiled: refreshed
                    "(True, 1, 0) True (True, 0, 1) True",      # loaded, then compiled
                    "(True, 1, 0) True (True,) True"]           # loaded; the other refreshes
    assert list((tmp_path / "cpu").glob("stc_gemm_nn_f64_m2n2k3_*.py"))


def test_processes_asking_for_one_kernel_at_once_compile_it_once(tmp_path):
    """Two processes (say MPI ranks of one node) need the same new kernel at the same
    moment: one compiles it under the kernel's lock file, the other waits and loads it."""
    code = textwrap.dedent("""
        import os, sys, time, numpy as np, smalltc
        from pathlib import Path
        gate = Path(sys.argv[1])
        (gate / f"ready-{os.getpid()}").touch()
        while len(list(gate.glob("ready-*"))) < 2:      # start together
            time.sleep(0.01)
        A, B = np.ones((3, 7, 6)), np.ones((3, 6, 5))
        p = smalltc.plan("gemm", A, B, backend="cpu")
        print(sum(p.executor.fn.stats.cache_hits.values()))
    """)
    env = dict(os.environ, SMALLTC_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("SMALLTC_COMPILE_PROCESS", None)
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(gate)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    hits = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        hits.append(out.split()[-1])
    assert sorted(hits) == ["0", "1"]               # one compiled, one loaded
    assert list((tmp_path / "cache" / "cpu").glob("stc_gemm_nn_f64_m7n5k6_*.lock"))


def test_a_kernel_compiled_by_the_compile_process_under_the_callers_lock(tmp_path):
    """SMALLTC_COMPILE_PROCESS on an empty cache: the caller holds the kernel's lock file
    while its compile process builds the kernel (the child does not wait for that lock),
    then loads it from Numba's disk cache."""
    code = textwrap.dedent("""
        import numpy as np, smalltc
        A, B = np.ones((3, 4, 6)), np.ones((3, 6, 5))
        p = smalltc.plan("gemm", A, B, backend="cpu")
        print(sum(p.executor.fn.stats.cache_hits.values()),
              sum(p.executor.fn.stats.cache_misses.values()))
    """)
    env = dict(os.environ, SMALLTC_CACHE_DIR=str(tmp_path / "cache"),
               SMALLTC_COMPILE_PROCESS="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert out.split()[-2:] == ["1", "0"]           # loaded, not compiled, in the caller


def test_thread_count_setting():
    import numba
    from smalltc.backends.cpu import set_num_threads
    B1d, D, V = _action_inputs(np.random.default_rng(11), 2, 2, 4, "float64")
    old = numba.get_num_threads()
    try:
        set_num_threads(1)
        assert "1 threads" in get("cpu").describe()
        one = smalltc.batched_contract(B1d, D, V, backend="cpu")
    finally:
        set_num_threads(old)
    assert np.array_equal(one, smalltc.batched_contract(B1d, D, V, backend="cpu"))


def test_thread_count_env_var():
    code = "from smalltc.backends import get; print(get('cpu').describe())"
    env = dict(os.environ, SMALLTC_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip().endswith(", 1 threads")


def test_auto_picks_cpu_for_numpy():
    B1d, D, V = _action_inputs(np.random.default_rng(12), 1, 2, 3, "float64")
    assert smalltc.plan("action", B1d, D, V).backend == "cpu"


UNFIT = [  # (spec, params that do not fit it, what the message names)
    (ActionSpec(dim=2, nq=3, nd=2, batch=5, dtype="float64"), {"W": 8}, "action family"),
    (ActionSpec(dim=2, nq=3, nd=2, batch=5, dtype="float64"), dict(lanes=3, rb=1, tr=0),
     "lanes, rb, tr"),
    (AssemblySpec(dim=2, nq=3, nd=2, batch=5, dtype="float32"), dict(lanes=16, tr=2),
     "assembly family"),
    (GemmSpec(batch=5, m=6, n=6, k=6, dtype="float64"), dict(form="rows", rb=4), "form, rb"),
]


@pytest.mark.parametrize("spec,params,names", UNFIT, ids=lambda v: str(v)[:30])
def test_params_that_do_not_fit_raise(spec, params, names):
    """``build(spec, params)`` with parameters the family rejects raises ``ValueError``
    naming them and the family's parameters; ``smalltc.plan(..., params=)`` reaches it."""
    with pytest.raises(ValueError, match=rf"params {re.escape(str(params))} do not fit .*"
                                          rf"{names}"):
        get("cpu").build(spec, params=params)
    rng = np.random.default_rng(12)
    if spec.op == "action":
        B1d, D, V = _action_inputs(rng, 2, 1, 3, "float64")
        with pytest.raises(ValueError, match="do not fit"):
            smalltc.plan("action", B1d, D, V, backend="cpu", params=params)


def test_templates_reject_missing_parameters():
    import jinja2
    with pytest.raises(jinja2.UndefinedError, match="is undefined"):
        runtime.render("action.py.j2", entry="x", signature="void()", dtype="float64")


@pytest.mark.parametrize("dtype,L", [("float64", 8), ("float64", 4), ("float32", 16),
                                     ("float32", 8), ("float64", 2)])
def test_tr_block_moves_one_transposed_block(dtype, L):
    import numba
    from smalltc.backends.cpu.simd import tr_block, tr_rows

    @numba.njit
    def move(dst, src, rows):
        tr_block(dst, 3, 5, src, 7, 11, L)
        tr_rows(dst, 3 + L, 5, src, rows, 1, 11, L)

    src = np.random.default_rng(10).standard_normal((40, 50)).astype(dtype)
    rows = np.array([0, 30, 2, 9, 4, 25, 6, 33, 8, 1, 10, 11, 12, 13, 14, 15, 16, 39],
                    dtype=np.int32)
    dst = np.zeros((3 + 2 * L, 45), dtype)
    move(dst, src, rows)
    ref = np.zeros_like(dst)
    ref[3:3 + L, 5:5 + L] = src[7:7 + L, 11:11 + L].T
    ref[3 + L:3 + 2 * L, 5:5 + L] = src[rows[1:1 + L], 11:11 + L].T
    assert np.array_equal(dst, ref)


@pytest.mark.parametrize("dtype,L,R,S,scale,acc", [
    ("float64", 8, 3, 7, False, 0), ("float64", 4, 1, 1, True, 0), ("float32", 16, 2, 5, True, 1),
    ("float64", 2, 2, 3, False, 1), ("float32", 8, 4, 10, False, 0)])
def test_lane_sums_is_one_register_block_of_a_step(dtype, L, R, S, scale, acc):
    """simd.lane_sums against the float64 sums of the rows it names: R outputs from S
    rows, times a scale row or not, added into dst or overwriting it; the rest of dst
    untouched (its NaN stays)."""
    import numba
    from smalltc.backends.cpu.simd import lane_sums

    rng = np.random.default_rng(12)
    src = rng.standard_normal((12, L + 3)).astype(dtype)
    sc = rng.standard_normal((9, L + 1)).astype(dtype)
    drows = tuple(int(r) for r in rng.permutation(9)[:R])
    srows = tuple(int(r) for r in rng.integers(0, 12, S))
    coefs = tuple(tuple(float(c) for c in row) for row in rng.standard_normal((R, S)))
    dst = np.full((9, L + 1), np.nan, dtype)
    for r in drows:
        dst[r, :L] = rng.standard_normal(L)
    ref = dst.astype(np.float64)
    for r, d in enumerate(drows):
        x = sum(coefs[r][s] * src[srows[s], :L].astype(np.float64) for s in range(S))
        x = x * sc[d, :L] if scale else x
        ref[d, :L] = ref[d, :L] + x if acc else x

    @numba.njit
    def run(dst, src, sc, drows, srows, coefs):
        if scale:
            lane_sums(dst, drows, src, srows, coefs, sc, acc, L)
        else:
            lane_sums(dst, drows, src, srows, coefs, None, acc, L)

    run(dst, src, sc, drows, srows, coefs)
    assert np.array_equal(np.isnan(dst), np.isnan(ref))
    ok = ~np.isnan(ref)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert np.allclose(dst[ok], ref[ok], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,L,S", [("float64", 8, 11), ("float32", 16, 3),
                                        ("float64", 4, 1)])
def test_lane_dots_is_one_output_row_of_lane_products(dtype, L, S):
    """simd.lane_dots against the float64 sums of the row products it names; the rest of
    dst untouched (its NaN stays)."""
    import numba
    from smalltc.backends.cpu.simd import lane_dots

    rng = np.random.default_rng(13)
    a = rng.standard_normal((12, L + 3)).astype(dtype)
    b = rng.standard_normal((10, L + 2)).astype(dtype)
    arows = tuple(int(r) for r in rng.integers(0, 12, S))
    brows = tuple(int(r) for r in rng.integers(0, 10, S))
    dst = np.full((5, L + 1), np.nan, dtype)
    ref = dst.astype(np.float64)
    ref[3, :L] = sum(a[i, :L].astype(np.float64) * b[j, :L] for i, j in zip(arows, brows))

    @numba.njit
    def run(dst, a, b, arows, brows):
        lane_dots(dst, 3, a, arows, b, brows, L)

    run(dst, a, b, arows, brows)
    assert np.array_equal(np.isnan(dst), np.isnan(ref))
    ok = ~np.isnan(ref)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert np.allclose(dst[ok], ref[ok], rtol=tol, atol=tol)


def test_a_kernel_compiled_in_the_compile_process_loads_from_the_disk_cache(
        tmp_path, monkeypatch):
    """SMALLTC_COMPILE_PROCESS: the child builds the kernel into Numba's disk cache and
    this process loads it from there (a cache hit, not a compile); a kernel the child
    cannot build comes back as the error's text, and a new child takes the next one."""
    from smalltc.backends.cpu.compile_process import CompileProcess
    from smalltc.spec import ActionSpec
    monkeypatch.setenv("SMALLTC_CACHE_DIR", str(tmp_path))
    from smalltc.backends.cpu import ACTION
    ctx = ACTION.context(ActionSpec(dim=2, nq=3, nd=2, batch=1, dtype="float64"))
    helper = CompileProcess(tasks=1)
    try:
        assert helper.compile("action.py.j2", "stc_isolated_2d", True, ctx["render"]) is None
        assert helper.proc is None                  # one task each: the child was replaced
        err = helper.compile("action.py.j2", "stc_isolated_bad", True, {})
        assert "undefined" in err
    finally:
        helper.close()
    monkeypatch.setenv("SMALLTC_COMPILE_PROCESS", "5")
    monkeypatch.setattr(runtime, "_HELPER", None)
    fn, _ = runtime.load_kernel("action.py.j2", "stc_isolated_2d", **ctx["render"])
    assert sum(fn.stats.cache_hits.values()) == 1 and not fn.stats.cache_misses
    assert runtime._HELPER is None          # in the disk cache already: no compile process
    rng = np.random.default_rng(13)
    B, D, V = rng.standard_normal((3, 2)), rng.standard_normal((5, 9)), rng.standard_normal((5, 4))
    U = np.full_like(V, np.nan)
    fn(B, D, V, U, 5, 1, -(-5 // ctx["lanes"]), 1)
    Bk = np.kron(B, B)
    assert np.allclose(U, np.einsum("qi,eq,qj,ej->ei", Bk, D, Bk, V), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rb", [1, 2, 3])
def test_action_register_blocks(rb):
    """Every register-block size (with a remainder block: nd = 3, nq = 4),
    with the block transposes (27 entries: the last block overlaps)."""
    rng = np.random.default_rng(11)
    B1d = rng.standard_normal((4, 3))
    D, V = rng.standard_normal((21, 4, 4, 4)), rng.standard_normal((21, 2, 3, 3, 3))
    spec = smalltc.plan("action", B1d, D, V, backend="cpu").spec
    from smalltc.backends.cpu.target import host
    lanes = host().lanes(spec.dtype)        # one vector of elements: the lanes form
    ex = get("cpu").build(spec, params=dict(lanes=lanes, rb=rb, tr=1))
    assert ex.params["rb"] == rb and ex.params["tr"] and ex.source == "params"
    out = poisoned(V.shape, V.dtype)
    ex.run((B1d, D, V), out)
    assert rel(out, action_einsum(B1d, D, V, 3)) < 1e-12


def test_assembly_row_blocks_with_overlapping_tail():
    """3D p = 2: rows of 27 entries leave the last W x W block overlapping."""
    rng = np.random.default_rng(12)
    B1d, D = rng.standard_normal((4, 3)), rng.standard_normal((21, 4, 4, 4))
    p = smalltc.plan("assembly", B1d, D, backend="cpu")
    out = p(B1d, D, out=poisoned(p.out_shape, D.dtype))
    assert rel(out, assembly_einsum(B1d, D, 3)) < 1e-12
