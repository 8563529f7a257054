"""Plans: validate and choose a kernel once, then run it many times.

:func:`plan` builds a :class:`Plan` from example operands. The public
operations (``smalltc.batched_contract`` and friends) share one cache of
plans keyed on their call signature (:func:`cached_plan`), so a repeated call
costs a dictionary lookup, the plan's comparisons and the kernel.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
from functools import partial

import numpy as np

from . import _interop, _memory, _validate
from ._arrays import is_array
from .maps import map_info
from .ops import OPS
from .backends import Unsupported, candidates
from .pairwise import PairwiseExecutor
from .spec import SOLVER_OPS

__all__ = ["Plan", "plan", "build_plan", "cached_plan", "call", "evaluation_job"]

log = logging.getLogger("smalltc")

_METHODS = ("auto", "fused", "pairwise")
_REAL = (float, int, np.float64, np.float32)     # scalars a call takes without conversion
_WARNED: set = set()

#: the public operations' plans: call signature -> Plan. A signature is the operation,
#: its spec-choosing flags (GEMM trans flags and beta == 0, contract kind and extents,
#: backend, method) and each operand's type, shape and dtype; operands that are not
#: arrays are keyed by the spec they convert to. Oldest entry dropped beyond _MAX_PLANS.
_PLANS: dict = {}
_MAX_PLANS = 256


class Executed:
    """What a plan runs, read from its executor (shared by :class:`Plan` and
    :class:`smalltc.solver.SolverPlan`): the kernel, its parameters, whether it is
    specialised, where the parameters came from, and the output's shape."""

    kernel = property(lambda self: self.executor.kernel)
    params = property(lambda self: dict(self.executor.params))
    specialized = property(lambda self: self.executor.specialized)
    source = property(lambda self: self.executor.source)

    @property
    def out_shape(self):
        return self.spec.out_shape


class Plan(Executed):
    """A validated operation bound to a backend and a built kernel.

    Call it with operands of the planned shapes and dtype. Keyword
    arguments at call time: ``out=`` (a preallocated result array),
    ``stream=`` (a CuPy stream; None is the current stream) and, for GEMM,
    ``alpha``/``beta``.

    A call compares each operand with the spec (exact array type, shape,
    dtype, C-contiguous; for NumPy also aligned and writeable), ``out`` as
    planned and apart from the inputs (``out=C`` is the GEMM's in-place
    update), and finite real scalars whose ``beta == 0`` is the planned one.
    When a comparison fails, arrays of another library (torch, JAX: any DLPack
    producer) run through NumPy/CuPy views of them and the result comes back in
    their library (:mod:`smalltc._interop`; ``stream=`` may then be a
    ``torch.cuda.Stream``); otherwise the full checks run: an operand that is not
    C-contiguous (or a read-only NumPy array) is copied, a contraction planned
    with ``extents`` reshapes its operands, and anything else raises the error
    that names the operand.

    Attributes
    ----------
    spec : the frozen spec (sizes, dtype, layout)
    backend : str
    method : "fused" or "pairwise"
    kernel, params, specialized, source : from the backend's executor (``source``: where
        the tuning parameters came from; ``executor.table``: the tuning table's file
        when one answered)
    fallbacks : the backends tried first that could not run the spec, and why
    """

    def __init__(self, spec, xp, backend, method, executor, fallbacks=(),
                 reshape_inputs=False):
        self.spec, self.xp, self.backend, self.method = spec, xp, backend, method
        self.executor = executor
        self.fallbacks = tuple(fallbacks)
        self.reshape_inputs = reshape_inputs
        dtype = np.dtype(spec.dtype)
        # what a call compares, precomputed
        self._inputs = tuple((o.name, tuple(o.shape), np.dtype(o.dtype or spec.dtype))
                             for o in spec.inputs)
        self._sig = tuple((shape, dt) for _, shape, dt in self._inputs)
        # the element-to-DoF map of the FEM operators: its range is checked on first use
        self._map = next((i for i, o in enumerate(spec.inputs) if o.name == "elem_dofs"), None)
        self._nargs = len(self._inputs)
        self._out_shape, self._dtype = tuple(spec.out_shape), dtype
        self._no_work = math.prod(self._out_shape) == 0
        self._gemm = spec.op == "gemm"
        self._beta_zero = self._gemm and spec.beta_zero
        self._in_place = self._gemm and not spec.beta_zero      # out=C may be given
        self._pad = (None,) if self._beta_zero else ()          # GEMM executors take C or None
        self._on_gpu = xp.__name__ == "cupy"
        self._array_type, self._alloc = xp.ndarray, xp.empty
        # a result from 64 MiB on is checked against the free memory before each allocation
        self._big = math.prod(self._out_shape) * dtype.itemsize >= _memory.MIN_BYTES
        # True once the public operations' cache holds this plan under a call signature
        # whose types, shapes and dtypes are exactly the planned ones (:meth:`_matches`)
        self._signed = False

    def __repr__(self):
        params = ", ".join(f"{k}={v}" for k, v in self.params.items()) or "-"
        fb = "".join(f"\n  fell back: {f}" for f in self.fallbacks)
        table = getattr(self.executor, "table", None)
        source = f"{self.source}, {table}" if table else self.source
        return (f"<smalltc.Plan {self.spec}\n  backend={self.backend} method={self.method} "
                f"arrays={self.xp.__name__}\n  kernel={self.kernel}\n"
                f"  params: {params} (source: {source})\n"
                f"  specialized={self.specialized}{fb}>")

    def __call__(self, *operands, out=None, stream=None, alpha=1.0, beta=0.0):
        if stream is not None:
            if not self._on_gpu:
                raise TypeError("stream= is for CuPy arrays; NumPy work runs on the host")
            if type(operands[0]) is not self._array_type or not _interop.is_cupy_stream(stream):
                return _interop.call_plan(self, operands, out, stream, alpha, beta)
            with stream:
                return self(*operands, out=out, alpha=alpha, beta=beta)
        if self.reshape_inputs:             # a contraction planned with extents: views
            operands = tuple(_validate.reshape_like(name, x, shape)
                             for (name, shape, _), x in zip(self._inputs, operands))
        # Plain comparisons, inline (small calls are host-bound); _checked if one fails.
        nd, dtype = self._array_type, self._dtype
        ok = len(operands) == self._nargs
        if ok and out is not None:
            ok = type(out) is nd and out.shape == self._out_shape and out.dtype == dtype
            # out must be apart from the inputs, but out=C is the GEMM's in-place update
            inputs = operands[:2] if self._in_place and operands[2] is out else operands
        if ok and self._on_gpu:     # CuPy: _c_contiguous (its flags object is built per access)
            for x, (shape, dt) in zip(operands, self._sig):
                if (type(x) is not nd or not x._c_contiguous or x.shape != shape
                        or x.dtype != dt):
                    ok = False
                    break
            if ok and out is not None:
                ok = out._c_contiguous
                lo = out.data.ptr
                hi = lo + out.nbytes
                for x in inputs:
                    p = x.data.ptr
                    if p < hi and lo < p + x.nbytes:
                        ok = False
                        break
        elif ok:                    # NumPy: flags.carray (C-contiguous, aligned, writeable)
            for x, (shape, dt) in zip(operands, self._sig):
                if (type(x) is not nd or not x.flags.carray or x.shape != shape
                        or x.dtype != dt):
                    ok = False
                    break
            if ok and out is not None:
                ok = out.flags.carray
                for x in inputs:
                    if np.may_share_memory(out, x):      # bounds check, in C
                        ok = False
                        break
        if self._gemm:
            if ok and type(alpha) in _REAL and type(beta) in _REAL:
                alpha, beta = float(alpha), float(beta)
                ok = alpha - alpha == 0.0 and beta - beta == 0.0 and (
                    beta == 0.0) == self._beta_zero          # finite; the planned beta == 0
            else:
                ok = False
        elif alpha != 1.0 or beta != 0.0:
            ok = False
        if not ok:
            if _interop.any_foreign(*operands, out):        # torch, JAX, ...: DLPack views
                return _interop.call_plan(self, operands, out, None, alpha, beta)
            operands, alpha, beta = self._checked(operands, out, alpha, beta)
        if self._map is not None:
            map_info(operands[self._map], self.spec.ndofs)      # the range, once per map
        if out is None:
            if self._big:
                _memory.guard(self.spec.op, self._out_shape, dtype, on_gpu=self._on_gpu)
            out = self._alloc(self._out_shape, dtype=dtype)
        if self._no_work:
            return out
        if self._gemm:
            self.executor.run(operands + self._pad, out, alpha=alpha, beta=beta)
        else:
            self.executor.run(operands, out)
        return out

    def _matches(self, operands):
        """Whether ``operands`` have exactly the planned types, shapes and dtypes, so that
        a call keyed on their signature may skip comparing them (:meth:`_signed_call`):
        NumPy plans without scalars or reshaped operands."""
        if self._on_gpu or self._gemm or self.reshape_inputs or len(operands) != self._nargs:
            return False
        return all(type(x) is self._array_type and x.shape == shape and x.dtype == dt
                   for x, (shape, dt) in zip(operands, self._sig))

    def _signed_call(self, operands, out):
        """The call of :func:`call` when the cache key has vouched for the operands' types,
        shapes and dtypes (``_signed``): what the key does not hold (contiguity, ``out``)
        is compared here, and anything unusual takes :meth:`__call__`."""
        for x in operands:
            if not x.flags.carray:
                return self(*operands, out=out)
        if out is None:
            if self._big:
                _memory.guard(self.spec.op, self._out_shape, self._dtype, on_gpu=False)
            out = self._alloc(self._out_shape, dtype=self._dtype)
        elif type(out) is not self._array_type or out.shape != self._out_shape \
                or out.dtype != self._dtype or not out.flags.carray:
            return self(*operands, out=out)
        else:
            for x in operands:
                if np.may_share_memory(out, x):
                    return self(*operands, out=out)
        if self._map is not None:
            map_info(operands[self._map], self.spec.ndofs)      # the range, once per map
        if not self._no_work:
            self.executor.run(operands, out)
        return out

    def _checked(self, operands, out, alpha, beta):
        """The call's checks in full, after a comparison failed: returns the operands
        to run (copied where the class says so) and the scalars as floats, or raises the
        error that names what is wrong."""
        n = len(operands)
        if self._beta_zero and n == 3:
            operands = operands[:2]                 # C is not read when beta == 0
        elif self._in_place and n == 2:
            raise ValueError("C is missing: this plan was built for beta != 0, which "
                             "reads C (pass C, or out=C for the in-place update)")
        elif n != self._nargs:
            kept = tuple(x for x in operands if x is not None)   # B1d=None (collocated)
            if len(kept) != self._nargs:
                names = ", ".join(name for name, _, _ in self._inputs)
                raise TypeError(f"this plan takes {self._nargs} operands ({names}), got {n}")
            operands = kept
        _validate.check_operands(self._inputs, operands, self.xp)
        if self._gemm:
            alpha = _validate.check_scalar("alpha", alpha)
            beta = _validate.check_scalar("beta", beta)
            if (beta == 0.0) != self._beta_zero:
                built = "beta==0" if self._beta_zero else "beta!=0"
                raise ValueError(f"this plan was built for {built}, got beta={beta}")
        elif alpha != 1.0 or beta != 0.0:
            raise TypeError(f"alpha and beta are GEMM options; this plan runs {self.spec}")
        if out is not None:
            named = [(name, x) for (name, _, _), x in zip(self._inputs, operands)]
            if self._in_place and operands[2] is out:
                named = named[:2]
            _validate.check_out(out, self._out_shape, self._dtype, self.xp, named)
        return tuple(_validate.as_usable(self.xp, x) for x in operands), alpha, beta


#: One-shot evaluations on the CPU (``interpolate``/``integrate``, ``geometry_data``: the
#: geometry, loads and errors of a setup) run NumPy's reference path when the backend is
#: "auto" and the job is small: it takes milliseconds there, and compiling a CPU kernel for
#: it takes seconds (notes/cpu.md, "Small evaluations"). A job evaluated chunk by chunk
#: inside :func:`evaluation_job` is small when its points in all are at most SMALL_JOB;
#: a call outside one is small when it has fewer than SMALL_ELEMENTS elements and at most
#: SMALL_EVALUATION point values (a large job's chunks hold at least SMALL_ELEMENTS, so
#: they compile). The operators, applied many times, always compile.
#: ``SMALLTC_SMALL_EVALUATION`` sets both point limits (0: always compile);
#: ``backend="cpu"`` compiles whatever the size.
SMALL_EVALUATION = 1 << 17
SMALL_ELEMENTS = 64
SMALL_JOB = 1 << 20

_JOB: contextvars.ContextVar = contextvars.ContextVar("smalltc_evaluation_job", default=None)


@contextlib.contextmanager
def evaluation_job(points):
    """The one-shot evaluations inside are the chunks of one job of ``points`` point
    values in all.

    ``interpolate``, ``integrate`` and ``geometry_data`` on NumPy arrays with the backend
    "auto" then decide by the job's size, not the chunk's: a job of at most 2^20 points
    (``SMALLTC_SMALL_EVALUATION`` sets the limit) runs NumPy's reference path in every
    chunk (milliseconds; a kernel's first compile takes seconds), a larger one compiles
    the kernels for every chunk. The FEM layer's setup and error passes run in one.

    Parameters
    ----------
    points : int
        Point values of the whole job (elements x points an element x components).

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B = np.random.default_rng(0).standard_normal((4, 3))
    >>> x = np.ones((200, 3, 3))                    # 200 elements: a chunk of a job
    >>> with smalltc.evaluation_job(points=200 * 16):
    ...     smalltc.plan("interpolate", B, None, x).backend
    'reference'
    """
    points = int(points)
    if points < 0:
        raise ValueError(f"points must be a number of point values >= 0, got {points}")
    token = _JOB.set(points)
    try:
        yield
    finally:
        try:
            _JOB.reset(token)
        except ValueError:      # a generator that holds the job, closed from another context
            pass


def _limit():
    """``SMALLTC_SMALL_EVALUATION`` as a number, None where it is not set."""
    text = os.environ.get("SMALLTC_SMALL_EVALUATION", "")
    try:
        return int(text) if text.strip() else None
    except ValueError:
        raise ValueError(f"SMALLTC_SMALL_EVALUATION must be a whole number of point values "
                         f"(0: always compile), got {text!r}") from None


def _small_job(job) -> bool:
    limit = _limit()
    return job <= (SMALL_JOB if limit is None else limit)


def _small_evaluation(spec, xp) -> bool:
    if xp is not np or spec.op not in ("basis", "geometry"):
        return False
    job = _JOB.get()
    if job is not None:
        return _small_job(job)
    limit = _limit()
    return (spec.batch < SMALL_ELEMENTS
            and spec.batch * spec.nq ** spec.dim * getattr(spec, "ncomp", 1)
            <= (SMALL_EVALUATION if limit is None else limit))


def build_plan(spec, xp, backend="auto", method="auto", params=None, reshape_inputs=False):
    """A new plan for ``spec`` on arrays of module ``xp`` (the kernels underneath are
    cached by the backends). ``params``: see :func:`plan`."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if backend == "auto" and params is None and _small_evaluation(spec, xp):
        if ("small", spec.op) not in _WARNED:
            _WARNED.add(("small", spec.op))
            log.info("smalltc: %s of %d elements runs the NumPy reference path (a small "
                     "one-shot evaluation: no kernel compile; backend='cpu' compiles one)",
                     spec.op, spec.batch)
        backend = "reference"
    pairwise = method == "pairwise"
    if pairwise and spec.op not in ("action", "assembly"):
        raise ValueError(f"method='pairwise' applies to the action and assembly, not {spec.op}")
    if pairwise and getattr(spec, "qfunc", "mass") != "mass":
        raise ValueError(f"method='pairwise' runs the mass action and assembly only, not "
                         f"{spec}")
    if pairwise and params is not None:
        raise ValueError("params choose the fused kernel's tuning; method='pairwise' runs "
                         "the contraction kernels with their own")
    fallbacks = []
    for be in candidates(xp.__name__, backend):
        try:
            if pairwise:
                ex = PairwiseExecutor(be, spec)
            elif params is None:
                ex = be.build(spec)
            else:
                ex = be.build(spec, params=params)
        except Unsupported as err:
            fallbacks.append(f"{be.name}: {err}")
            _warn_once((spec.kernel_key(), be.name),
                       "smalltc: backend %r cannot run %s (%s); falling back", be.name, spec, err)
            continue
        if not ex.specialized:
            _warn_once((spec.kernel_key(), be.name, "generic"),
                       "smalltc: no size-specialised %s kernel for %s; using the generic "
                       "kernel %s", be.name, spec, ex.kernel)
        return Plan(spec, xp, be.name, "pairwise" if pairwise else "fused", ex, fallbacks,
                    reshape_inputs)
    raise RuntimeError(f"no backend can run {spec}: " + "; ".join(fallbacks))


def cached_plan(key, given, spec, xp, backend, method, reshape_inputs=False):
    """The public operations' plan for call signature ``key``, built on the first request.

    ``given`` are the caller's operands: where one is not an array (it was converted
    on the way to ``spec``), or ``key`` is None (no signature could be made), the spec
    keys the plan instead.
    """
    if key is None or not all(map(is_array, given)):
        key = (spec, xp.__name__, backend, method, reshape_inputs)
    p = _PLANS.get(key)
    if p is None:
        p = build_plan(spec, xp, backend, method, reshape_inputs=reshape_inputs)
        remember(_PLANS, key, p)
    return p


def remember(cache, key, plan):
    """Keep ``plan`` in ``cache`` under ``key``, the oldest entry dropped beyond
    ``_MAX_PLANS`` (the public operations' and the solver operations' plan caches)."""
    if len(cache) >= _MAX_PLANS:
        del cache[next(iter(cache))]
    cache[key] = plan


def _warn_once(key, msg, *args):
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg, *args)


def call(op, operands, options=(), out=None, stream=None, backend="auto", method="auto",
         scalars=None):
    """Run registered operation ``op`` (:class:`smalltc.ops.Op`) on ``operands`` (in the
    entry's order, ``None`` for one left out) with ``options`` (values in the entry's
    ``options`` order): what every public operation does.

    The plan comes from the cache of call signatures (the entry, ``backend``,
    ``method``, ``options`` and each operand's type, shape and dtype), built on a miss
    (:func:`cached_plan`); operands of another library (torch, JAX) run through NumPy/CuPy
    views of them (:mod:`smalltc._interop`). ``scalars``: GEMM's ``(alpha, beta)``.
    """
    # inside an evaluation job, whether it is small is part of the signature
    job = _JOB.get()
    bk = backend if job is None else (backend, _small_job(job))
    try:
        # the signature, flat; spelled out for the usual operand counts (a host-bound call
        # of a few microseconds feels every step), a comprehension for the others
        if op.omits or not 2 <= len(operands) <= 4:
            key = (op, bk, method, options,
                   *[None if x is None else (type(x), x.shape, x.dtype) for x in operands])
        elif len(operands) == 3:
            a, b, c = operands
            key = (op, bk, method, options, type(a), a.shape, a.dtype, type(b), b.shape,
                   b.dtype, type(c), c.shape, c.dtype)
        elif len(operands) == 4:
            a, b, c, d = operands
            key = (op, bk, method, options, type(a), a.shape, a.dtype, type(b), b.shape,
                   b.dtype, type(c), c.shape, c.dtype, type(d), d.shape, d.dtype)
        else:
            a, b = operands
            key = (op, bk, method, options, type(a), a.shape, a.dtype, type(b), b.shape,
                   b.dtype)
        p = _PLANS.get(key)
    except (AttributeError, TypeError, ValueError):   # not arrays, an unhashable option
        key = p = None
    if p is None:
        return _miss(op, key, operands, options, out, stream, backend, method, scalars)
    if op.omits:
        operands = tuple([x for x in operands if x is not None])
    if p._signed and stream is None:
        return p._signed_call(operands, out)
    if scalars is None:
        return p(*operands, out=out, stream=stream)
    return p(*operands, out=out, stream=stream, alpha=scalars[0], beta=scalars[1])


def _miss(op, key, operands, options, out, stream, backend, method, scalars):
    """:func:`call` without a cached plan: other libraries' arrays through their views,
    else the spec (which checks the operands) and a new plan."""
    if _interop.any_foreign(*operands, out):
        return _interop.call(partial(_in_views, op, options, backend, method, scalars),
                             op.operand_names(operands), operands, out, stream)
    named = dict(zip(op.options, options))
    if scalars is not None:
        named.update(alpha=scalars[0], beta=scalars[1])
    spec, xp, ops = op.spec(*operands, **named)
    given = [x for x in operands if x is not None]
    p = cached_plan(key, given, spec, xp, backend, method,
                    op.reshape is not None and op.reshape(options))
    if key is not None and not p._signed:
        p._signed = p._matches(given)
    if scalars is None:
        return p(*ops, out=out, stream=stream)
    return p(*ops, out=out, stream=stream, alpha=scalars[0], beta=scalars[1])


def _in_views(op, options, backend, method, scalars, *arrays, out):
    return call(op, arrays, options, out, None, backend, method, scalars)


#: keywords :func:`plan` took for every op before the entries declared theirs, and their
#: defaults: accepted (and ignored) at these values by an op that has no such option
_ANY_OP = dict(alpha=1.0, beta=0.0, trans_a=False, trans_b=False, kind=None, extents=None,
               deterministic=False, ndofs=None, what="values", dim=None)


def plan(op, *operands, backend="auto", method="auto", params=None, **options):
    """Build a reusable plan for ``op`` from example operands.

    Every call builds a new :class:`Plan` (compiled kernels are cached
    underneath, so a second plan of the same sizes compiles nothing).

    Parameters
    ----------
    op : str
        A registered operation (:data:`smalltc.ops.OPS`): "action", "assembly", "gemm",
        "contract", "mass_apply" or "mass_diagonal" (``batched_contract``,
        ``assemble_mass``, ``batched_gemm``, ``contract``, ``mass_apply``,
        ``mass_diagonal``); for the diffusion and Helmholtz operators
        ``"<qfunc>_<level>"``, qfunc "diffusion" or "helmholtz", level "action", "apply",
        "diagonal" or "assembly" (``diffusion_action``, ``diffusion_apply``,
        ``diffusion_diagonal``, ``assemble_diffusion``); with the point data recomputed
        from the element vertices (``vertices=``), ``"<qfunc>_<level>_vertices"``, qfunc
        "mass" or "diffusion", level "action" or "apply" (operands ``(B1d, G1d, X, coef,
        ...)``, ``coef`` an (E,) array); the corner force "force_apply"
        and "force_apply_transpose"; the general operator of mixed spaces "mixed_action"
        and "mixed_apply"; the basis application "interpolate" and "integrate"; the pointwise
        geometry "geometry" (:func:`smalltc.geometry_data`: operands ``(J[, weights, coef,
        jmin])``, the tensor weights as the plan takes them; options ``what``, ``absdet``,
        ``dtype``); the solver kernels "vector_update" (options ``mode``, ``free``), "pcg",
        "pmg_transfer", "csr_spmv", "schwarz_fdm" (:func:`smalltc.solver.plan`: a
        :class:`smalltc.solver.SolverPlan`).
    *operands : arrays
        Examples with the shapes and dtype of later calls, in the entry's order (its
        ``operands``; ``smalltc.ops.OPS[op].describe()``): ``(B1d, D, V)``,
        ``(B1d, D)``, ``(A, B[, C])``, ``(X, Y)``, ``(B1d, D, x, elem_dofs)``,
        ``(B1d, D, elem_dofs)``; for the operators ``(B1d, G1d, Q, ...)`` and
        ``(B1d, G1d, D, Q, ...)`` (Helmholtz) with the level's operands, ``B1d``
        None for the collocated form (the plan is then called with or without it);
        ``(B_l2, B1d, G1d, A, e or w[, elem_dofs])`` for the corner force;
        ``(B1d, G1d or None, x or H[, elem_dofs])`` for the basis application; for the
        mixed operators ``(B_in, B_out, Q, V or x)`` as the public function takes them,
        ``G_in``, ``G_out``, ``elem_dofs_in`` and ``elem_dofs_out`` by keyword (the plan
        is called with the given ones in the order ``B_in, G_in, B_out, G_out, Q, x,
        elem_dofs_in, elem_dofs_out``).
    backend : str
        "auto", "reference", "cpu" or "cuda".
    method : {"auto", "fused", "pairwise"}
        For the action and assembly: one fused kernel ("auto"), or the
        catalogue's pairwise steps.
    options : keyword arguments (``**options``)
        The entry's options (``smalltc.ops.OPS[op].options``), named as in the public
        function, and operands the public function takes by keyword: ``alpha``, ``beta``, ``trans_a``, ``trans_b`` (GEMM; ``beta != 0``
        needs C); ``kind`` ("8a", "8b" or "9") and ``extents`` (dict i, s, j, k, l) for
        ``op="contract"``; ``deterministic`` and ``ndofs`` for the FEM operators
        (additions in a fixed order, see :func:`smalltc.mass_apply`; the global vector's
        length for ``"mass_diagonal"``, the diagonals, the fused corner force and
        ``"integrate"``); ``eval_in``, ``eval_out`` and ``ndofs_out`` for the mixed
        operators; ``what`` ("values", "gradients" or "both") and ``dim`` for the basis
        application.
    params : dict, optional
        Tuning parameters of the kernel family (tile and thread-block shapes,
        items per block, ...), passed to the backend's ``build``: for experts
        and tests. Parameters that do not fit raise ``ValueError``. None (the
        default): the backend chooses (its tuning table, else its heuristic).

    Returns
    -------
    Plan
        Call it as ``p(*operands, out=None, stream=None)``.

    Raises
    ------
    ValueError, TypeError
        Operands that do not fit together (the message names the operand), an
        unknown ``op``, option, ``method`` or backend, ``params`` that do not fit, too
        few or too many operands.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.random.rand(4, 3); D = np.random.rand(10, 4, 4, 4)
    >>> V = np.random.rand(10, 3, 3, 3)
    >>> p = smalltc.plan("action", B1d, D, V, backend="reference")
    >>> p.spec.dim, p.spec.nd, p.spec.nq, p.backend
    (3, 3, 4, 'reference')
    >>> U = p(B1d, D, V)
    >>> U.shape
    (10, 3, 3, 3)
    >>> smalltc.plan("action", B1d, D, V, backend="reference", params={"T": 4})
    Traceback (most recent call last):
    ...
    ValueError: the reference backend has no tuning parameters; got params {'T': 4}

    The plan :func:`smalltc.interpolate` runs for the same operands:

    >>> m = np.arange(8, dtype=np.int32).reshape(1, 2, 2, 2)
    >>> q = smalltc.plan("interpolate", np.ones((3, 2)), None, np.ones(8), m)
    >>> str(q.spec), q.out_shape
    ('interp_3d p=1 nq=3 values E=1 ndofs=8 float64', (1, 3, 3, 3))
    """
    if op in SOLVER_OPS:                 # the solver kernels' plans (smalltc.solver)
        from . import solver  # cycle: smalltc.solver imports this module
        return solver.plan(op, *operands, backend=backend, params=params, **options)
    entry = OPS.get(op) if isinstance(op, str) else None
    if entry is None:
        first = ", ".join(repr(n) for n in list(OPS)[:5])
        raise ValueError(f"op must be {first} or {list(OPS)[5]!r}, or one of "
                         f"{', '.join(repr(n) for n in list(OPS)[6:])}, got {op!r}")
    operands, opts = entry.bind(operands, options)
    named = dict(zip(entry.options, opts))
    if entry.scalars:
        named.update(alpha=options.pop("alpha", 1.0), beta=options.pop("beta", 0.0))
    for name, value in options.items():
        if name not in _ANY_OP:
            raise TypeError(f"plan() got an unexpected keyword {name!r} (op {op!r} takes "
                            f"{', '.join(entry.options) or 'no options'})")
        if value != _ANY_OP[name]:
            raise TypeError(f"op {op!r} takes no option {name!r} (its options: "
                            f"{', '.join(entry.options) or 'none'})")
    spec, xp, _ = entry.spec(*operands, **named)
    return build_plan(spec, xp, backend, method, params,
                      reshape_inputs=entry.reshape is not None and entry.reshape(opts))
