"""Fuzz the public functions that take maps and arrays; run by tests/test_fuzz.py.

``python tests/fuzz_public.py SEED TRIALS [BACKEND [DENSE_BACKEND]]`` calls smalltc's public operations
(``batched_contract``, ``assemble_mass``, ``batched_gemm``, ``contract``, ``mass_apply``,
``mass_diagonal``, ``plan`` and its calls, ``fem.jacobi``, ``fem.cg``) with random
arguments built from valid ones by one or two perturbations: a wrong shape or rank, another
dtype (integer, bool, complex, float16, object), NaN/Inf entries, map indices out of range
(negative, ``ndofs``, 2^31, 10^12), a non-contiguous or read-only operand, ``out`` aliasing
an input, a map mutated after a call planned it. Sizes stay small and few (p <= 2), so the
compiled backend builds a bounded set of kernels.

Every call must return or raise a Python exception of an expected type whose message names
an operand; anything else is printed as ``BAD ...`` and the script exits 1.
``BACKEND`` (default ``cpu``) runs the operations that take a map, ``DENSE_BACKEND``
(default: the same) the others: the CI runs the dense ones on ``reference`` to bound the
kernels compiled (their argument checks are the same code). A crash
(segfault, heap corruption) or a hang is caught by the test that runs this script in a
subprocess under a timeout. The last line is ``fuzz: N calls, K raised, 0 bad``.
"""
import sys
import traceback

import numpy as np

import smalltc
from smalltc import fem

EXPECTED = (ValueError, TypeError, MemoryError, IndexError)
NAMES = ("B1d", "D", "V", "x", "elem_dofs", "ndofs", "out", "A", "B", "C", "X", "Y", "kind",
         "extents", "M", "b", "diagonal", "x0", "tol", "maxiter", "operand", "operator",
         "alpha", "beta", "op", "backend", "deterministic", "Jacobi", "precond", "shape",
         "dtype", "array", "ncomp", "apply", "elements", "batch", "contiguous")


def _rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _perturb_array(rng, a):
    """One random change of an array operand (or the array itself)."""
    k = rng.integers(0, 12)
    if k == 0 and a.ndim:
        return a[..., :-1] if a.shape[-1] > 1 else a[..., None]      # wrong last extent
    if k == 1:
        return a[None]                                               # wrong rank
    if k == 2 and a.ndim:
        return a.reshape(-1)                                         # flattened
    if k == 3:
        return a.astype(rng.choice([np.int32, np.int64, np.bool_, np.complex128, np.float16,
                                    np.float32]))
    if k == 4:
        return a.astype(object)
    if k == 5 and a.size and a.dtype.kind == "f":
        b = a.copy()
        b.flat[rng.integers(0, b.size)] = rng.choice([np.nan, np.inf, -np.inf])
        return b
    if k == 6 and a.ndim and a.shape[0] > 1:
        return a[::2]                                                # non-contiguous
    if k == 7:
        b = a.copy()
        b.flags.writeable = False
        return b
    if k == 8:
        return np.asfortranarray(a) if a.ndim > 1 else a
    if k == 9:
        return a[:0]                                                 # empty batch
    if k == 10:
        return a.tolist() if a.size < 64 else a                      # a list
    return a


def _problem(rng):
    dim = int(rng.integers(1, 4))
    p = int(rng.integers(1, 3))
    nq = p + 1
    n = {1: 3, 2: 2, 3: 2}[dim]
    space = fem.H1Space(fem.box_mesh(dim, n), p)
    B1d = _rand(rng, (nq, p + 1))
    D = rng.random((space.nelements,) + (nq,) * dim) + 0.5
    m = space.elem_dofs.astype(rng.choice([np.int32, np.int64]))
    ncomp = int(rng.choice([1, 1, 3]))
    x = _rand(rng, (space.ndofs,) if ncomp == 1 else (ncomp, space.ndofs))
    V = _rand(rng, (space.nelements,) + (p + 1,) * dim)
    return dict(dim=dim, p=p, nq=nq, B1d=B1d, D=D, m=m, x=x, V=V, ndofs=space.ndofs)


def _bad_map(rng, m, ndofs):
    m = m.copy()
    if m.size:
        m.flat[rng.integers(0, m.size)] = rng.choice([-1, ndofs, ndofs + 7, -2 ** 31,
                                                      2 ** 31 - 1, 10 ** 12]
                                                     if m.dtype == np.int64 else
                                                     [-1, ndofs, -2 ** 31, 2 ** 31 - 1])
    return m


def _maybe(rng, a, prob=0.35):
    return _perturb_array(rng, a) if rng.random() < prob else a


def trial(rng, backend, dense_backend, xp=np):
    """One random call; returns (name, callable). ``backend`` runs the operations that take
    a map, ``dense_backend`` the others; ``xp`` cupy: the map operations' operands on the
    GPU, then :func:`smalltc.check_errors` (where a GPU reports a bad index)."""
    P = _problem(rng)
    B1d, D, m, x, V, ndofs = P["B1d"], P["D"], P["m"], P["x"], P["V"], P["ndofs"]
    kind = rng.integers(0, 10)
    if xp is not np and kind in (4, 5, 6, 7):
        name, call = trial_gpu(rng, kind, backend, P, xp)
        return name, call
    kw = dict(backend=backend if kind in (4, 5, 6) else dense_backend)
    if kind == 0:
        args = [_maybe(rng, B1d), _maybe(rng, D), _maybe(rng, V)]
        out = None
        if rng.random() < 0.3:
            out = [args[2], np.empty_like(V), np.empty(3)][rng.integers(0, 3)] \
                if isinstance(args[2], np.ndarray) else None
        return "batched_contract", lambda: smalltc.batched_contract(*args, out=out, **kw)
    if kind == 1:
        args = [_maybe(rng, B1d), _maybe(rng, D)]
        return "assemble_mass", lambda: smalltc.assemble_mass(*args, **kw)
    if kind == 2:
        n = int(rng.integers(1, 6))
        A, B, C = (_maybe(rng, _rand(rng, (4, n, n))) for _ in range(3))
        beta = float(rng.choice([0.0, 1.0, np.nan]))
        return "batched_gemm", lambda: smalltc.batched_gemm(
            A, B, C, alpha=1.0, beta=beta, trans_a=bool(rng.integers(0, 2)), **kw)
    if kind == 3:
        X, Y = _maybe(rng, _rand(rng, (3, 2, 4, 2))), _maybe(rng, _rand(rng, (3, 2, 4, 2)))
        k = str(rng.choice(["8a", "8b", "9", "7", ""]))
        return "contract", lambda: smalltc.contract(k, X, Y, **kw)
    if kind in (4, 5):
        mm = _bad_map(rng, m, ndofs) if rng.random() < 0.4 else _maybe(rng, m, 0.2)
        args = [_maybe(rng, B1d, 0.15), _maybe(rng, D, 0.15), _maybe(rng, x, 0.2), mm]
        det = bool(rng.integers(0, 2))
        out = None
        if rng.random() < 0.2 and isinstance(args[2], np.ndarray):
            out = [args[2], np.empty_like(x), np.empty(2)][rng.integers(0, 3)]
        return "mass_apply", lambda: smalltc.mass_apply(*args, out=out, deterministic=det, **kw)
    if kind == 6:
        mm = _bad_map(rng, m, ndofs) if rng.random() < 0.4 else _maybe(rng, m, 0.2)
        nd_ = int(rng.choice([ndofs, ndofs, ndofs - 1, 0, -3]))
        args = [_maybe(rng, B1d, 0.15), _maybe(rng, D, 0.15), mm]
        return "mass_diagonal", lambda: smalltc.mass_diagonal(*args, nd_, **kw)
    if kind == 7:                    # mutate the map after the plan's first call
        def mutate():
            mm = m.copy()
            xx = np.ascontiguousarray(x)
            p = smalltc.plan("mass_apply", B1d, D, xx, mm, backend=backend)
            p(B1d, D, xx, mm)
            mm.flat[rng.integers(0, mm.size)] = int(rng.choice([-1, ndofs, 10 ** 9
                                                                 if mm.dtype == np.int64
                                                                 else 2 ** 31 - 1]))
            return p(B1d, D, xx, mm)
        return "plan(mass_apply) after mutation", mutate
    if kind == 8:
        d = _maybe(rng, np.abs(_rand(rng, (ndofs,))) + 1, 0.5)
        return "fem.jacobi", lambda: fem.jacobi(d)
    # fem.cg with a wrong-shape or non-finite operator or right-hand side
    b = _maybe(rng, _rand(rng, (5,)), 0.4)
    Amat = np.eye(5) * 3 + 0.1

    def op(v):
        r = Amat @ np.asarray(v).reshape(-1)
        return r[: int(rng.choice([5, 5, 4]))]
    return "fem.cg", lambda: fem.cg(op, b, tol=1e-8, maxiter=int(rng.integers(0, 20)),
                                    fused=bool(rng.integers(0, 2)), raise_on_failure=False)


def trial_gpu(rng, kind, backend, P, xp):
    """The map operations on CuPy operands: a bad or mutated map raises at
    :func:`smalltc.check_errors` at the latest, and the context stays usable."""
    B1d, D, x = (xp.asarray(P[k]) for k in ("B1d", "D", "x"))
    m, ndofs = P["m"], P["ndofs"]
    bad = _bad_map(rng, m, ndofs)
    det = bool(rng.integers(0, 2))

    def call():
        mm = xp.asarray(m)
        if kind == 6:
            smalltc.mass_diagonal(B1d, D, mm, ndofs, backend=backend, deterministic=det)
        else:
            smalltc.mass_apply(B1d, D, x, mm, backend=backend, deterministic=det)
        mm[...] = xp.asarray(bad)                      # mutated after its first use
        try:
            if kind == 6:
                smalltc.mass_diagonal(B1d, D, mm, ndofs, backend=backend, deterministic=det)
            else:
                smalltc.mass_apply(B1d, D, x, mm, backend=backend, deterministic=det)
        finally:
            smalltc.check_errors()
    return "gpu map mutated", call


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    backend = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    dense_backend = sys.argv[4] if len(sys.argv) > 4 else backend
    xp = np
    if len(sys.argv) > 5 and sys.argv[5] == "cupy":
        import cupy as xp
    rng = np.random.default_rng(seed)
    raised = bad = 0
    for t in range(trials):
        name, call = trial(rng, backend, dense_backend, xp)
        try:
            call()
        except EXPECTED as err:
            raised += 1
            msg = str(err)
            if not any(n in msg for n in NAMES):
                bad += 1
                print(f"BAD {t} {name}: {type(err).__name__} names no operand: {msg}")
        except Exception as err:                          # noqa: BLE001 - what the fuzz is for
            if isinstance(err, RuntimeError) and "did not converge" in str(err):
                continue
            bad += 1
            print(f"BAD {t} {name}: unexpected {type(err).__name__}: {err}")
            traceback.print_exc(limit=-3)
    if xp is not np:                       # the context is still usable
        assert float(xp.ones(4).sum()) == 4.0
        smalltc.check_errors()
    print(f"fuzz: {trials} calls, {raised} raised, {bad} bad", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
