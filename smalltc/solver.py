"""The kernels of the iterative solvers: vector updates, PCG, p-multigrid transfers, CSR, Schwarz.

What a preconditioned Krylov solve with a p-multigrid or Schwarz preconditioner runs
besides its operator, each a spec (:mod:`smalltc.spec`: :class:`~smalltc.spec.
VectorUpdateSpec`, :class:`~smalltc.spec.PcgSpec`, :class:`~smalltc.spec.TransferSpec`,
:class:`~smalltc.spec.CsrSpmvSpec`, :class:`~smalltc.spec.SchwarzSpec`), a plan and a
kernel family on each backend (:mod:`smalltc.backends.cuda.solver`,
:mod:`smalltc.backends.cpu.solver`), with the reference path
(:mod:`smalltc.backends.reference_solvers`) as their oracle:

=======================  ==================================================================
function                 what it does
=======================  ==================================================================
:func:`vector_update`    a Chebyshev smoothing step's (or a V-cycle residual's) vector
                         updates, in place, fused into one kernel on a GPU
:func:`pcg_iterate`      PCG iterations (Jacobi or any preconditioner) with the vector
                         updates fused (the scalars kept on the device on a GPU)
:func:`pmg_transfer`     a p-multigrid prolongation or restriction (gather, the sum-
                         factorised interpolation, weighted scatter-add)
:func:`csr_spmv`         ``y = A x`` for a CSR matrix
:func:`schwarz_fdm`      one application of the overlapping Schwarz preconditioner with
                         fast-diagonalisation local solves
=======================  ==================================================================

Each is a thin wrapper of a plan (:func:`plan`, also reached as ``smalltc.plan(op,
...)``) cached on the call signature; the plan's call compares the operands with its
spec and runs the backend's executor.
"""
from __future__ import annotations

import logging

import numpy as np

from . import _validate_solver as V
from ._validate import check_operands
from .backends import Unsupported, candidates
from .backends.reference_solvers import STOP_CODES
from .plan import Executed, remember
from .spec import SOLVER_OPS

__all__ = ["SolverPlan", "plan", "vector_update", "pcg_iterate", "pmg_transfer", "csr_spmv",
           "schwarz_fdm", "OPS", "STOP_CODES", "DEPENDS", "examples"]

log = logging.getLogger("smalltc")

#: the ops of this module, as :func:`smalltc.plan` names them
OPS = SOLVER_OPS
#: what each op's kernels depend on besides the dtype (:func:`smalltc.precompile` builds
#: one of each such combination): ``"size"`` the dimension and ``p`` (the transfers for
#: the p-multigrid's first coarsening from ``p``, ``ceil(p/2)``, both ways; the Schwarz
#: solve for the extended elements of ``p``, ``p + 3`` nodes a direction: overlap 1),
#: ``"index"`` the maps' dtype. The vector updates (every mode), the PCG iteration and
#: the CSR product do not depend on ``p`` or ``dim``.
DEPENDS = {"vector_update": (), "pcg": (), "pmg_transfer": ("size", "index"),
           "csr_spmv": ("index",), "schwarz_fdm": ("size", "index")}
assert set(DEPENDS) == set(OPS)

_PLANS: dict = {}
_WARNED: set = set()


class SolverPlan(Executed):
    """A solver op bound to a backend and its built kernel; call it with operands of the
    planned shapes and dtype (and the op's scalars as keywords).

    Attributes
    ----------
    spec : the frozen spec
    backend : str
    kernel, params, specialized, source : from the backend's executor
    fallbacks : the backends tried first that could not run the spec, and why
    """

    def __init__(self, spec, xp, backend, executor, fallbacks=()):
        self.spec, self.xp, self.backend, self.executor = spec, xp, backend, executor
        self.fallbacks = tuple(fallbacks)
        self._inputs = tuple((o.name, tuple(o.shape), np.dtype(o.dtype or spec.dtype))
                             for o in spec.inputs)
        self._maps = spec.op in ("pmg_transfer", "schwarz_fdm", "csr_spmv")

    def __repr__(self):
        params = ", ".join(f"{k}={v}" for k, v in self.params.items()) or "-"
        fb = "".join(f"\n  fell back: {f}" for f in self.fallbacks)
        return (f"<smalltc.SolverPlan {self.spec}\n  backend={self.backend} "
                f"arrays={self.xp.__name__}\n  kernel={self.kernel}\n  params: {params} "
                f"(source: {self.source})\n  specialized={self.specialized}{fb}>")

    def __call__(self, *operands, out=None, **scalars):
        nd = self.xp.ndarray
        if len(operands) != len(self._inputs):
            names = ", ".join(n for n, _, _ in self._inputs)
            raise TypeError(f"this plan takes {len(self._inputs)} operands ({names}), got "
                            f"{len(operands)}")
        for x, (name, shape, dt) in zip(operands, self._inputs):
            if type(x) is not nd or x.shape != shape or x.dtype != dt or \
                    not x.flags.c_contiguous:
                check_operands(self._inputs, operands, self.xp)
                raise ValueError(f"{name} is not C-contiguous; pass a contiguous array")
        if self._maps:
            V.check_maps(self.spec, operands)
        return self.executor.run(operands, out, **scalars)


def _build(spec, xp, backend, params):
    """The plan of ``spec`` on the first backend that runs it (a compiled backend's family,
    else the reference path, the fallback logged once)."""
    fallbacks = []
    for be in candidates(xp.__name__, backend):
        try:
            ex = be.build(spec) if params is None else be.build(spec, params=params)
        except Unsupported as err:
            fallbacks.append(f"{be.name}: {err}")
            key = (spec.kernel_key(), be.name)
            if key not in _WARNED:
                _WARNED.add(key)
                log.warning("smalltc: backend %r cannot run %s (%s); falling back", be.name,
                            spec, err)
            continue
        return SolverPlan(spec, xp, be.name, ex, fallbacks)
    raise RuntimeError(f"no backend can run {spec}: " + "; ".join(fallbacks))


def _spec(op, operands, mode=None, free=None):
    if op == "vector_update":
        return V.vector_update_spec(mode, operands, free)
    if op == "pcg":
        if len(operands) not in (2, 3):
            raise TypeError(f"op 'pcg' takes x, r and optionally inv; got {len(operands)} "
                            "operands")
        return V.pcg_spec(*operands)
    fns = {"pmg_transfer": (V.transfer_spec, "M, x, in_map, in_w, out_map, out_w"),
           "csr_spmv": (V.csr_spmv_spec, "indptr, indices, data, x"),
           "schwarz_fdm": (V.schwarz_spec, "S, inv, idx, r, w")}
    if op not in fns:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    fn, names = fns[op]
    if len(operands) != names.count(",") + 1:
        raise TypeError(f"op {op!r} takes {names}; got {len(operands)} operands")
    return fn(*operands)


def plan(op, *operands, mode=None, free=None, backend="auto", params=None):
    """Build a reusable plan of a solver op from example operands.

    Parameters
    ----------
    op : {"vector_update", "pcg", "pmg_transfer", "csr_spmv", "schwarz_fdm"}
        The op (the functions of this module).
    *operands : arrays
        As the op's function takes them (``vector_update``: the mode's vectors, the mask
        as ``free=``; ``pcg``: ``x, r[, inv]``).
    mode : str
        ``vector_update``'s mode ("start", "step", "residual", "last").
    free : array, optional
        ``vector_update``'s free mask.
    backend : str
        "auto", "reference", "cpu" or "cuda".
    params : dict, optional
        The kernel family's tuning parameters (``{"threads": 128}``); None: the backend's
        choice (its tuning table, else its heuristic).

    Returns
    -------
    SolverPlan

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> A = (np.array([0, 2, 3], np.int32), np.array([0, 1, 1], np.int32),
    ...      np.array([2.0, 1.0, 3.0]))
    >>> p = smalltc.plan("csr_spmv", *A, np.ones(2), backend="cpu")
    >>> p.spec.op, p.backend, p.source
    ('csr_spmv', 'cpu', 'fixed')
    >>> print(p(*A, np.array([1.0, 2.0])))
    [4. 6.]
    """
    spec, xp = _spec(op, operands, mode, free)
    if free is not None:
        operands = operands + (free,)
    p = _build(spec, xp, backend, params)
    V.check_maps(spec, operands)
    return p


def examples(op, dim, p, dtype, index_dtype, xp) -> list:
    """``[(operands, plan keywords, call keywords)]``: small problems whose plans and first
    calls build the kernels of ``op`` for ``dim``, ``p``, ``dtype`` and ``index_dtype``
    (:data:`DEPENDS` says which of them matter); what :func:`smalltc.precompile` runs.

    >>> [kw["mode"] for _, kw, _ in examples("vector_update", None, None, "float64", None,
    ...                                      np)]
    ['start', 'step', 'residual', 'last']
    """
    rng = np.random.default_rng(0)
    E, n = 2, 8

    def rand(*shape):
        return xp.asarray(rng.random(shape).astype(dtype) + 0.5)
    if op == "vector_update":
        v = [rand(n) for _ in range(7)]
        f = xp.ones(n, dtype=dtype)
        names = {"start": 2, "step": 6, "residual": 3, "last": 2}
        return [(tuple(v[:k]), dict(mode=m, free=f), dict(c0=0.5, c1=0.5))
                for m, k in names.items()]
    if op == "pcg":
        return [((rand(n), rand(n), rand(n)), {},
                 dict(apply=lambda x: x, tol=0.0, maxiter=1, bnorm=1.0, history=[1.0]))]
    if op == "csr_spmv":
        ip = xp.asarray(np.arange(n + 1, dtype=index_dtype))
        return [((ip, xp.asarray(np.arange(n, dtype=index_dtype)), rand(n), rand(n)), {}, {})]
    if op == "pmg_transfer":
        q = (p + 1) // 2
        nf, nc = p + 1, q + 1
        emap = {k: xp.asarray(np.arange(E * k ** dim, dtype=index_dtype).reshape(
            (E,) + (k,) * dim)) for k in (nc, nf)}
        ndof = {k: E * k ** dim for k in (nc, nf)}
        M = rand(nf, nc)
        MT = xp.ascontiguousarray(M.T)
        return [((M, rand(ndof[nc]), emap[nc], rand(ndof[nc]), emap[nf], rand(ndof[nf])), {},
                 {}),
                ((MT, rand(ndof[nf]), emap[nf], rand(ndof[nf]), emap[nc], rand(ndof[nc])), {},
                 {})]
    if op == "schwarz_fdm":
        if xp is np:          # the host's Schwarz keeps an intp map (numpy.bincount's index)
            index_dtype = "int64"
        k = p + 3
        ndofs = E * k ** dim
        idx = xp.asarray(np.arange(ndofs, dtype=index_dtype).reshape((E,) + (k,) * dim))
        return [((rand(E, dim, k, k), rand(E, *(k,) * dim), idx, rand(ndofs), rand(ndofs)),
                 {}, {})]
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def _cached(op, operands, mode=None, free=None, backend="auto"):
    """The plan of a call signature, built on the first call. The vector ops (every
    operand of one shape and dtype) are keyed on their first vector: the plan's call
    compares the others."""
    try:
        if op in ("vector_update", "pcg"):
            a = operands[0]
            key = (op, mode, backend, free is None, len(operands), type(a), a.shape,
                   a.dtype)
        else:
            key = (op, backend) + tuple((type(a), a.shape, a.dtype) for a in operands)
    except (AttributeError, IndexError):
        key = None
    p = _PLANS.get(key) if key is not None else None
    if p is None:
        p = plan(op, *operands, mode=mode, free=free, backend=backend)
        if key is not None:
            remember(_PLANS, key, p)
    return p


def vector_update(mode, *vectors, free=None, c0=0.0, c1=1.0, beta=1.0, xzero=False,
                  out=None, backend="auto"):
    """One vector update of a Chebyshev smoothing step or a V-cycle's residual, in place.

    With ``f`` the free mask (1 free, 0 constrained; None: all free), ``inv = 1 / diag(A_c)``
    and ``y = A(f v)`` the raw operator's result (the constrained operator is ``A_c v = f
    A(f v) + (1 - f) v``):

    * ``"start"``, vectors ``(r, inv)``: ``d = c1 inv r``, ``dm = f d``; returns ``(d, dm)``
      (``dm`` is ``d`` without a mask on the host).
    * ``"step"``, ``(y, r, x, d, dm, inv)``: ``r -= f y + (1 - f) d``; ``x = beta d``
      (``xzero``) or ``x += beta d``; ``d = c0 d + c1 inv r``; ``dm = f d``. Returns None.
    * ``"residual"``, ``(b, y, x)``: returns ``r = b - (f y + (1 - f) x)``.
    * ``"last"``, ``(d, x)``: ``x = beta d`` (``xzero``) or ``x += beta d``; returns ``(x,
      f x)``.

    Parameters
    ----------
    mode : {"start", "step", "residual", "last"}
    *vectors : arrays of shape (n,)
        The mode's vectors, in the order above.
    free : array of shape (n,), optional
        The free mask, in the vectors' dtype.
    c0, c1, beta : float
        The step's coefficients.
    xzero : bool
        ``x`` holds nothing yet (it is overwritten).
    out : array or pair of arrays, optional
        The new vectors of ``"start"`` (a pair), ``"residual"``, ``"last"`` (``xm``).
    backend : str
        As for :func:`smalltc.plan`.

    Returns
    -------
    As listed above.

    Raises
    ------
    ValueError, TypeError
        Vectors of different lengths (naming the vector), mixed dtypes or libraries, an
        unknown mode.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> d, dm = smalltc.vector_update("start", np.array([2.0, 4.0]), np.full(2, 0.5),
    ...                               free=np.array([1.0, 0.0]), c1=2.0)
    >>> print(d, dm)
    [2. 4.] [2. 0.]
    >>> print(smalltc.vector_update("residual", np.ones(2), np.array([0.5, 9.0]),
    ...                             np.array([0.0, 0.25]), free=np.array([1.0, 0.0])))
    [0.5  0.75]
    """
    p = _cached("vector_update", vectors, mode, free, backend)
    ops = vectors if free is None else vectors + (free,)
    return p(*ops, out=out, c0=c0, c1=c1, beta=beta, xzero=xzero)


def pcg_iterate(apply, x, r, inv=None, *, tol, maxiter, bnorm, history, shape=None,
                check_every=8, reducer=None, precond=None, backend="auto"):
    """Preconditioned conjugate gradients from ``x`` with residual ``r = b - A x``, the
    vector updates fused: on the host two passes an iteration besides ``p.Ap``; on a GPU
    five kernels whose scalars stay on the device, so the host queues iterations without
    waiting for them.

    Parameters
    ----------
    apply : callable
        ``p -> A p`` on arrays of ``shape``.
    x, r : arrays of shape (n,)
        The iterate and its residual, updated in place.
    inv : array of shape (n,), optional
        The Jacobi preconditioner ``1 / diag(A)``; None: ``precond``, or no
        preconditioner.
    tol : float
        Stop when ``|r| / bnorm <= tol``.
    maxiter : int
    bnorm : float
        The norm the residuals are divided by.
    history : list of float
        The relative residuals so far (its last entry the current one); one entry is
        appended an iteration.
    shape : tuple, optional
        The shape ``apply`` takes (``(ncomp, ndofs)``: a vector field); ``(n,)`` by
        default.
    check_every : int
        GPU, Jacobi or no preconditioner: iterations queued between reads of the
        device's state (kernels after the stop return at once).
    reducer : object, optional
        A distributed solve's reducer (``sums(*scalars)``, ``sum_array(a)``).
    precond : callable, optional
        Any symmetric positive definite preconditioner ``r -> z`` on arrays of ``shape``
        (e.g. a p-multigrid V-cycle), in place of ``inv``. On a GPU it should queue
        device work only: the host stays one iteration ahead of the device and reads
        each iteration's state behind it, waiting only where the residuals' rate says
        the next iteration may stop (at most one iteration is queued past the stop).
    backend : str

    Returns
    -------
    (iterations, code, value)
        ``code`` a key of :data:`STOP_CODES`, ``value`` the scalar that stopped it.

    Raises
    ------
    ValueError
        Both ``inv`` and ``precond`` given; an operator or preconditioner result of
        another shape than its argument's.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> A = np.diag([1.0, 2.0, 4.0]); x = np.zeros(3); r = np.ones(3)
    >>> it, code, _ = smalltc.pcg_iterate(lambda v: A @ v, x, r, 1 / np.diag(A),
    ...                                   tol=1e-12, maxiter=10, bnorm=np.sqrt(3),
    ...                                   history=[1.0])
    >>> it, smalltc.solver.STOP_CODES[code], bool(np.allclose(x, [1, 0.5, 0.25]))
    (1, 'converged', True)
    >>> x = np.zeros(3); r = np.ones(3)
    >>> it, code, _ = smalltc.pcg_iterate(lambda v: A @ v, x, r, precond=lambda v: v / np.diag(A),
    ...                                   tol=1e-12, maxiter=10, bnorm=np.sqrt(3),
    ...                                   history=[1.0])
    >>> it, smalltc.solver.STOP_CODES[code], bool(np.allclose(x, [1, 0.5, 0.25]))
    (1, 'converged', True)
    """
    if inv is not None and precond is not None:
        raise ValueError("pcg_iterate takes inv (Jacobi) or precond, not both")
    if precond is not None and not callable(precond):
        raise TypeError(f"precond must be a callable r -> z, got {type(precond).__name__}")
    ops = (x, r) if inv is None else (x, r, inv)
    p = _cached("pcg", ops, backend=backend)
    return p(*ops, apply=apply, tol=tol, maxiter=maxiter, bnorm=bnorm, history=history,
             shape=shape, check_every=check_every, red=reducer, precond=precond)


def pmg_transfer(M, x, in_map, in_w, out_map, out_w, *, out=None, add=False,
                 backend="auto"):
    """A p-multigrid transfer: ``y[out_map[e, i]] += out_w[out_map[e, i]] ((M x ... x M)
    (in_w x)[in_map[e, :]])[i]`` summed over the elements.

    Prolongation from order ``q`` to ``p``: ``M`` (nd_p, nd_q) the order-``q`` basis at the
    order-``p`` nodes, ``in_w`` 1 on the coarse free DoFs (0 on constrained ones),
    ``out_w`` 1 / multiplicity on the fine free DoFs; restriction: ``M^T``, the roles
    swapped (its exact transpose).

    Parameters
    ----------
    M : array, shape (nout, nin)
    x : array, shape (n_in,)
    in_map : int32 or int64 array, shape (E, nin, ..., nin)
    in_w : array, shape (n_in,)
    out_map : array of in_map's dtype, shape (E, nout, ..., nout)
    out_w : array, shape (n_out,)
    out : array of shape (n_out,), optional
        The result, overwritten (added to with ``add``).
    add : bool
    backend : str

    Returns
    -------
    y : array, shape (n_out,)

    Examples
    --------
    Linear to quadratic on one 1D element (the midpoint is the mean of the ends):

    >>> import numpy as np, smalltc
    >>> M = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    >>> y = smalltc.pmg_transfer(M, np.array([1.0, 3.0]), np.array([[0, 1]], np.int32),
    ...                          np.ones(2), np.array([[0, 1, 2]], np.int32), np.ones(3))
    >>> print(y)
    [1. 2. 3.]
    """
    ops = (M, x, in_map, in_w, out_map, out_w)
    return _cached("pmg_transfer", ops, backend=backend)(*ops, out=out, add=add)


def csr_spmv(indptr, indices, data, x, *, out=None, backend="auto"):
    """``y = A x`` for the CSR matrix ``(data, indices, indptr)`` (SciPy's arrays): each
    row's products summed in order (the same bits every run on a GPU).

    Parameters
    ----------
    indptr : int32 or int64 array, shape (nrows + 1,)
    indices : array of indptr's dtype, shape (nnz,)
    data : array, shape (nnz,)
    x : array, shape (ncols,)
    out : array of shape (nrows,), optional
    backend : str

    Returns
    -------
    y : array, shape (nrows,)

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> print(smalltc.csr_spmv(np.array([0, 2, 3], np.int32), np.array([0, 1, 1], np.int32),
    ...                        np.array([2.0, 1.0, 3.0]), np.array([1.0, 2.0])))
    [4. 6.]
    """
    ops = (indptr, indices, data, x)
    return _cached("csr_spmv", ops, backend=backend)(*ops, out=out)


def schwarz_fdm(S, inv, idx, r, w, *, out=None, backend="auto"):
    """One application of additive Schwarz with fast-diagonalisation local solves:
    ``z[i] = w[i] sum_e (K_e^-1 (w r)[idx[e, :]])[slot of i]`` with ``K_e^-1 = (S_0 x ...
    x S_{dim-1}) diag(inv[e]) (S_0 x ... x S_{dim-1})^T`` on each element's extended
    nodes (an index equal to ``len(r)`` is a pad: no DoF, read as 0, not written).

    Parameters
    ----------
    S : array, shape (E, dim, n, n)
        Each element's 1D eigenvector matrices.
    inv : array, shape (E, n, ..., n)
        The inverse eigenvalues of the local operators.
    idx : int32 or int64 array, shape (E, n, ..., n)
        The extended nodes' DoFs (``len(r)`` for none).
    r, w : arrays, shape (ndofs,)
        The residual and the weights.
    out : array of shape (ndofs,), optional
    backend : str

    Returns
    -------
    z : array, shape (ndofs,)

    Examples
    --------
    One 1D element, the identity eigenvectors, eigenvalues 2 and 4:

    >>> import numpy as np, smalltc
    >>> z = smalltc.schwarz_fdm(np.eye(2)[None, None], np.array([[0.5, 0.25]]),
    ...                         np.array([[0, 1]], np.int32), np.array([2.0, 4.0]),
    ...                         np.ones(2))
    >>> print(z)
    [1. 1.]
    """
    ops = (S, inv, idx, r, w)
    return _cached("schwarz_fdm", ops, backend=backend)(*ops, out=out)
