"""Safety: maps changed after their first use, size guards, and the checks of the solvers.

A map is range-checked on the host the first time a call sees it; the kernels that read it
check every index again, so a map changed in place afterwards raises the same
``ValueError`` (naming ``elem_dofs``, the index and the range) instead of reading or
writing outside the vectors, and the process (and on a GPU the CUDA context) stays usable.
"""
import numpy as np
import pytest

import smalltc
from smalltc import maps
from smalltc._arrays import gpu_available
from smalltc.fem import H1Space, box_mesh

from conftest import backend_params


def _problem(xp, dim=3, p=2, nq=3, n=2, index_dtype="int32", ncomp=1):
    space = H1Space(box_mesh(dim, n), p)
    rng = np.random.default_rng(1)
    B1d = rng.standard_normal((nq, p + 1))
    D = rng.random((space.nelements,) + (nq,) * dim) + 0.5
    x = rng.standard_normal((ncomp, space.ndofs) if ncomp > 1 else (space.ndofs,))
    m = np.array(space.elem_dofs, dtype=index_dtype)
    return tuple(xp.asarray(a) for a in (B1d, D, x, m)) + (space.ndofs,)


def _backends():
    out = [pytest.param("cpu", "numpy", id="cpu")]
    out.append(pytest.param("cuda", "cupy", id="cuda", marks=pytest.mark.skipif(
        not gpu_available(), reason="no CUDA device")))
    return out


# (dimension, the bad value: a large index, ndofs itself, -1), deterministic, index dtype
MUTATIONS = [
    (3, 10 ** 9, False, "int64"),
    (3, "ndofs", False, "int32"),
    (3, -1, True, "int32"),
    (2, "ndofs", True, "int64"),
]


@pytest.mark.parametrize("backend,module", _backends())
@pytest.mark.parametrize("dim,bad,deterministic,index_dtype", MUTATIONS)
def test_map_changed_after_first_use_raises(backend, module, dim, bad, deterministic,
                                            index_dtype):
    xp = pytest.importorskip(module)
    B1d, D, x, m, ndofs = _problem(xp, dim=dim, index_dtype=index_dtype)
    good = smalltc.mass_apply(B1d, D, x, m, backend=backend, deterministic=deterministic)
    diag = smalltc.mass_diagonal(B1d, D, m, ndofs, backend=backend,
                                 deterministic=deterministic)
    keep = int(m.reshape(-1)[5])
    value = ndofs if bad == "ndofs" else bad
    m.reshape(-1)[5] = value                       # in place, after the first use
    for call in (lambda: smalltc.mass_apply(B1d, D, x, m, backend=backend,
                                            deterministic=deterministic),
                 lambda: smalltc.mass_diagonal(B1d, D, m, ndofs, backend=backend,
                                               deterministic=deterministic)):
        with pytest.raises(ValueError, match=rf"elem_dofs holds indices \S*{value}\S*, "
                                             rf"outside \[0, {ndofs}\)"):
            call()
            smalltc.check_errors()                 # a GPU reports at its next read
    m.reshape(-1)[5] = keep                        # usable again, same results
    again = smalltc.mass_apply(B1d, D, x, m, backend=backend, deterministic=deterministic)
    assert float(abs(again - good).max()) <= 1e-12 * float(abs(good).max())
    d2 = smalltc.mass_diagonal(B1d, D, m, ndofs, backend=backend, deterministic=deterministic)
    assert float(abs(d2 - diag).max()) <= 1e-12 * float(abs(diag).max())


def test_map_mutation_in_a_fresh_process_does_not_crash(tmp_path):
    """A reported crash, reproduced: 10^9 then ndofs in a map already used, in a child process
    (a crash there would be exit 139, not a failed assertion here)."""
    import subprocess
    import sys
    code = (
        "import numpy as np, smalltc\n"
        "from smalltc.fem import H1Space, box_mesh\n"
        "s = H1Space(box_mesh(3, 2), 2); m = s.elem_dofs.copy()\n"
        "B = np.random.rand(3, 3); D = np.random.rand(s.nelements, 3, 3, 3)\n"
        "x = np.random.rand(s.ndofs); keep = m[0, 0, 0, 1]\n"
        "for bad in (10**9, s.ndofs):\n"
        "    m[0, 0, 0, 1] = keep\n"
        "    smalltc.mass_apply(B, D, x, m, backend='cpu')\n"
        "    m[0, 0, 0, 1] = bad\n"
        "    try:\n"
        "        smalltc.mass_apply(B, D, x, m, backend='cpu')\n"
        "    except ValueError as e:\n"
        "        print('raised', e)\n"
        "print('alive')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("raised") == 2 and "alive" in r.stdout
    assert r.stdout.count("a kernel read index") == 2, r.stdout    # the kernel's own check


def test_blas_policy():
    from smalltc.backends.cpu.threads import blas_policy
    assert blas_policy({}, 2) == 1 and blas_policy({}, 1) is None
    assert blas_policy({"SMALLTC_BLAS_THREADS": "keep"}, 4) is None
    assert blas_policy({"SMALLTC_BLAS_THREADS": "3"}, 4) == 3
    with pytest.raises(ValueError, match="SMALLTC_BLAS_THREADS"):
        blas_policy({"SMALLTC_BLAS_THREADS": "many"}, 2)


@pytest.mark.parametrize("env,expect", [({}, 1), ({"SMALLTC_BLAS_THREADS": "keep"}, 2)])
def test_blas_threads_limited_while_the_cpu_kernels_use_several(env, expect):
    """With two Numba threads, building a CPU kernel leaves the process's BLAS with one
    thread (its spinning workers made the kernels up to 10x slower), unless told to keep.
    Only the libraries loaded before the build count (on the GPU machine a BLAS that
    loads later, with the machine's 16 threads, is none of this test's business)."""
    import os
    import subprocess
    import sys
    code = ("import numpy as np, smalltc\n"
            "from smalltc.backends.cpu import threads\n"
            "from threadpoolctl import ThreadpoolController\n"
            "ThreadpoolController().limit(limits=2, user_api='blas')\n"
            "B = np.random.rand(3, 2); D = np.random.rand(8, 3, 3); V = np.random.rand(8, 2, 2)\n"
            "before = threads.blas_threads()\n"
            "smalltc.batched_contract(B, D, V, backend='cpu')\n"
            "after = threads.blas_threads()\n"
            "print(sorted(set(after[k] for k in before)))\n")
    full = dict(os.environ, NUMBA_NUM_THREADS="2", **env)
    full.pop("SMALLTC_NUM_THREADS", None)
    if "SMALLTC_BLAS_THREADS" not in env:
        full.pop("SMALLTC_BLAS_THREADS", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=full, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == str([expect])


def test_size_guard_raises_before_allocating(monkeypatch):
    """A result larger than the free memory: MemoryError naming the operation, the shape and
    the bytes, before anything is allocated; above half of it a warning."""
    from smalltc import _memory
    B1d = np.random.rand(4, 3)
    D = np.empty((2 ** 20, 4, 4, 4))                 # 1M elements (pages never touched)
    p = smalltc.plan("assembly", B1d, np.random.rand(1, 4, 4, 4), backend="reference")
    big = smalltc.plan("assembly", B1d, D, backend="reference")
    monkeypatch.setattr(_memory, "free_bytes", lambda on_gpu=False: 2 ** 30)
    with pytest.raises(MemoryError, match=r"assembly: the result of shape \(1048576, 27, 27\) "
                                          r"\(float64\) needs 6,115,295,232 bytes .* free on "
                                          r"the host"):
        big(B1d, D)
    monkeypatch.setattr(_memory, "free_bytes", lambda on_gpu=False: 8 * 2 ** 30)
    with pytest.warns(ResourceWarning, match="needs 6,115,295,232 bytes"):
        with pytest.raises(MemoryError):               # the allocation itself, faked
            monkeypatch.setattr(big, "_alloc", _refuse)
            big(B1d, D)
    assert p(B1d, np.random.rand(1, 4, 4, 4)).shape == (1, 27, 27)   # small: unchecked


def _refuse(shape, dtype):
    raise MemoryError("not allocated in the test")


def test_free_bytes_reads_the_host():
    from smalltc import _memory
    n = _memory.free_bytes()
    assert n is None or n > 0


# ---- the solvers' checks -------------------------------------------------------------------

@pytest.mark.parametrize("fused", [True, False])
def test_cg_vector_operator_takes_a_scalar_jacobi_diagonal(fused):
    """A (3, n) problem with the diagonal of one component: broadcast, no hand work."""
    from smalltc import fem
    d = np.linspace(1.0, 3.0, 20)
    b = np.random.default_rng(0).random((3, 20))
    res = fem.cg(lambda v: v * d, b, tol=1e-12, precond=fem.jacobi(d), fused=fused)
    assert res.converged and np.allclose(res.x, b / d)


def test_cg_jacobi_of_the_wrong_size_names_both():
    from smalltc import fem
    with pytest.raises(ValueError, match=r"Jacobi preconditioner has 7 entries, b has shape "
                                         r"\(3, 20\)"):
        fem.cg(lambda v: v, np.ones((3, 20)), precond=fem.jacobi(np.ones(7)))


@pytest.mark.parametrize("fused", [True, False])
def test_cg_operator_of_the_wrong_shape(fused):
    from smalltc import fem
    with pytest.raises(ValueError, match=r"operator returned an array of shape \(9,\) for a "
                                         r"vector of shape \(10,\)"):
        fem.cg(lambda v: v[:9], np.ones(10), fused=fused)


@pytest.mark.parametrize("fused", [True, False])
def test_cg_non_symmetric_operator_is_named(fused):
    from smalltc import fem
    rng = np.random.default_rng(3)
    A = np.eye(30) * 4 + np.triu(rng.random((30, 30)), 1) * 3     # not symmetric
    b = rng.random(30)
    with pytest.raises(fem.ConvergenceError, match="not symmetric .*symmetric positive "
                                                   "definite"):
        fem.cg(lambda v: A @ v, b, tol=1e-14, maxiter=5, fused=fused)
    with pytest.warns(RuntimeWarning, match="not symmetric"):
        r = fem.cg(lambda v: A @ v, b, tol=1e-14, maxiter=5, fused=fused,
                   raise_on_failure=False)
    assert not r.converged
    S = A + A.T                                                     # symmetric: no note
    with pytest.raises(fem.ConvergenceError) as e:
        fem.cg(lambda v: S @ v, b, tol=1e-30, maxiter=2, fused=fused)
    assert "symmetric" not in str(e.value)


def test_version_flag(capsys):
    from smalltc.app.cli import main
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"smalltc {smalltc.__version__} (python ")


def test_print_plan_of_the_action_names_the_action():
    B1d, D, V = np.random.rand(3, 2), np.random.rand(4, 3, 3, 3), np.random.rand(4, 2, 2, 2)
    text = str(smalltc.plan("action", B1d, D, V, backend="reference"))
    assert "action_3d p=1 nq=3" in text and "mass_apply" not in text


@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
def test_gpu_cg_reports_a_map_mutated_mid_solve():
    """fem.cg on the GPU reads the error flag where it reads the iteration's state: a map
    made bad after its first use raises there, and the context stays usable."""
    cp = pytest.importorskip("cupy")
    from smalltc import fem
    B1d, D, x, m, ndofs = _problem(cp, dim=3, p=2, nq=4)
    b = smalltc.mass_apply(B1d, D, x, m)
    op = lambda v: smalltc.mass_apply(B1d, D, v, m)                         # noqa: E731
    assert fem.cg(op, b, tol=1e-10).converged
    m.reshape(-1)[3] = ndofs + 5
    with pytest.raises(ValueError, match=r"elem_dofs holds indices .*outside \[0, "):
        fem.cg(op, b, tol=1e-10, check_every=4)
        smalltc.check_errors()
    m.reshape(-1)[3] = 0
    smalltc.maps.forget(m)
    assert float(cp.ones(3).sum()) == 3.0                                   # context alive


def test_unchecked_executor_gives_the_same_result():
    """The bench's unchecked variant computes the same thing (it only drops the check)."""
    import copy
    B1d, D, x, m, ndofs = _problem(np, dim=3, p=2, nq=4)
    p = smalltc.plan("mass_apply", B1d, D, x, m, backend="cpu")
    bare = copy.copy(p)
    bare.executor = p.executor.unchecked()
    assert bare.executor.kernel.endswith("_unchecked")
    # to round-off, not bit for bit: the two are separate LLVM compiles, whose choices of
    # fused multiply-adds may differ (a cold-cache run here differed in the last bits)
    got, ref = bare(B1d, D, x, m), p(B1d, D, x, m)
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-13 * float(np.abs(ref).max()))


@pytest.mark.parametrize("env,expect", [({}, "passive"), ({"OMP_WAIT_POLICY": "active"}, "active"),
                                        ({"SMALLTC_OMP_WAIT_POLICY": "keep"}, "None")])
def test_openmp_waits_passively(env, expect):
    """Numba's OpenMP workers spin-waiting between kernels took the calling thread's core
    on a busy machine (12 ms a parallel region): smalltc asks for passive waiting."""
    import os
    import subprocess
    import sys
    code = ("import os, numpy as np, smalltc\n"
            "smalltc.batched_contract(np.random.rand(3, 2), np.random.rand(4, 3, 3),\n"
            "                         np.random.rand(4, 2, 2), backend='cpu')\n"
            "print(os.environ.get('OMP_WAIT_POLICY'))\n")
    full = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SMALLTC_OMP_WAIT_POLICY")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(full, **env), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == expect


# the operator family's other instances through the same checked gather/scatter:
# (qfunc, collocated, dimension, deterministic)
QFUNC_MUTATIONS = [
    ("diffusion", False, 2, False),
    ("diffusion", True, 2, True),
    ("helmholtz", False, 3, True),
    ("helmholtz", True, 2, False),
]


@pytest.mark.parametrize("backend,module", _backends())
@pytest.mark.parametrize("qfunc,collocated,dim,deterministic", QFUNC_MUTATIONS)
def test_qfunc_map_changed_after_first_use_raises(backend, module, qfunc, collocated, dim,
                                                  deterministic):
    """Diffusion and Helmholtz, Gauss or collocated: the fused apply and the diagonal check
    the map in the kernel as the mass instance does (a bad entry raises, the process stays
    usable, the results are the same afterwards)."""
    xp = pytest.importorskip(module)
    p = 2
    nq = p + 1 if collocated else p + 2
    space = H1Space(box_mesh(dim, 2), p)
    rng = np.random.default_rng(2)
    E, nsym = space.nelements, dim * (dim + 1) // 2
    B1d = None if collocated else xp.asarray(rng.standard_normal((nq, p + 1)))
    G1d = xp.asarray(rng.standard_normal((nq, p + 1)))
    Q = xp.asarray(rng.random((E, nsym) + (nq,) * dim))
    D = xp.asarray(rng.random((E,) + (nq,) * dim) + 0.5)
    data = Q if qfunc == "diffusion" else (D, Q)
    x = xp.asarray(rng.standard_normal(space.ndofs))
    m = xp.asarray(np.array(space.elem_dofs, dtype="int32"))
    ndofs = space.ndofs

    def apply():
        return smalltc.operator_apply(qfunc, B1d, G1d, data, x, m, backend=backend,
                                      deterministic=deterministic)

    def diagonal():
        return smalltc.operator_diagonal(qfunc, B1d, G1d, data, m, ndofs, backend=backend,
                                         deterministic=deterministic)
    good, diag = apply(), diagonal()
    keep = int(m.reshape(-1)[3])
    for value in (ndofs, -1):
        for call in (apply, diagonal):
            m.reshape(-1)[3] = keep
            call()                                 # the map seen (a raise forgets it)
            m.reshape(-1)[3] = value               # in place, after the first use
            with pytest.raises(ValueError, match=rf"elem_dofs holds indices \S*{value}\S*, "
                                                 rf"outside \[0, {ndofs}\)") as info:
                call()
                smalltc.check_errors()             # a GPU reports at its next read
            if backend == "cpu":                   # the kernel's own check, not a fallback
                assert "a kernel read index" in str(info.value), str(info.value)
    m.reshape(-1)[3] = keep
    assert float(abs(apply() - good).max()) <= 1e-12 * float(abs(good).max())
    assert float(abs(diagonal() - diag).max()) <= 1e-12 * float(abs(diag).max())
