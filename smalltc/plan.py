"""Plans: validate and choose a kernel once, then run it many times.

``smalltc.batched_contract`` and friends are thin wrappers: they build (or
fetch from a small in-process cache) a :class:`Plan` and call it.
"""
from __future__ import annotations

import logging
import math
from collections import OrderedDict

import numpy as np

from . import _validate as V
from ._arrays import c_contiguous
from .backends import Unsupported, candidates
from .pairwise import PairwiseExecutor
from .spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec

__all__ = ["Plan", "plan", "build_plan"]

log = logging.getLogger("smalltc")

_METHODS = ("auto", "fused", "pairwise")
_REAL = (float, int, np.float64, np.float32)     # scalars the fast path takes as they are
_PLANS: OrderedDict = OrderedDict()
_MAX_PLANS = 256
_WARNED: set = set()


def clear_plans():
    """Forget the cached plans (a new tuning-table lookup chooses kernels afresh)."""
    _PLANS.clear()




class Plan:
    """A validated operation bound to a backend and a built kernel.

    Call it with operands of the planned shapes and dtype. Keyword
    arguments at call time: ``out=`` (a preallocated result array),
    ``stream=`` (a CuPy stream; None is the current stream) and, for GEMM,
    ``alpha``/``beta``.

    Attributes
    ----------
    spec : the frozen spec (sizes, dtype, layout)
    backend : str
    method : "fused" or "pairwise"
    kernel, params, specialized, source : from the backend's executor
    """

    def __init__(self, spec, xp, backend, method, executor, shapes, fallbacks=()):
        self.spec, self.xp, self.backend, self.method = spec, xp, backend, method
        self.executor = executor
        self._shapes = tuple((n, tuple(sh), np.dtype(dt)) for n, sh, dt in shapes)
        self._names = tuple(n for n, _, _ in self._shapes)
        self._on_gpu = xp.__name__ == "cupy"
        self._is_gemm = isinstance(spec, GemmSpec)
        self._out_shape, self._dtype = tuple(spec.out_shape), np.dtype(spec.dtype)
        self.fallbacks = tuple(fallbacks)
        self.reshape_inputs = False
        # the CuPy fast path's constants (see _call_fast)
        self._nd = xp.ndarray if self._on_gpu else None
        self._beta_zero = self._is_gemm and spec.beta_zero
        self._fast_ok = self._on_gpu and math.prod(self._out_shape) > 0 and all(
            math.prod(sh) > 0 for _, sh, _ in self._shapes)

    kernel = property(lambda self: self.executor.kernel)
    params = property(lambda self: dict(self.executor.params))
    specialized = property(lambda self: self.executor.specialized)
    source = property(lambda self: self.executor.source)

    @property
    def out_shape(self):
        return self.spec.out_shape

    def __repr__(self):
        params = ", ".join(f"{k}={v}" for k, v in self.params.items()) or "-"
        fb = "".join(f"\n  fell back: {f}" for f in self.fallbacks)
        return (f"<smalltc.Plan {self.spec}\n  backend={self.backend} method={self.method} "
                f"arrays={self.xp.__name__}\n  kernel={self.kernel}\n"
                f"  params: {params} (source: {self.source})\n"
                f"  specialized={self.specialized}{fb}>")

    def _call_fast(self, ops, out, alpha, beta):
        """The call for CuPy operands that are all as planned (exact type, shape, dtype,
        C-contiguous, ``out`` apart from the inputs, finite scalars): the same checks
        as the general path, as plain comparisons, and no conversions. Returns None,
        having done nothing, for anything else; the general path then converts what
        it may and raises the error that names the operand."""
        nd = self._nd
        if self._is_gemm:
            if len(ops) == 2:
                ops += (None,)
            elif len(ops) != 3:
                return None
            if self._beta_zero:
                ops = (ops[0], ops[1], None)           # C is not read when beta == 0
            elif ops[2] is None:
                return None
        elif len(ops) != len(self._shapes) or self.reshape_inputs:
            return None
        for x, (_, shape, dtype) in zip(ops, self._shapes):
            if x is not None and (type(x) is not nd or not x._c_contiguous
                                  or x.shape != shape or x.dtype != dtype):
                return None
        if out is None:
            out = self.xp.empty(self._out_shape, dtype=self._dtype)
        else:
            if (type(out) is not nd or not out._c_contiguous or out.shape != self._out_shape
                    or out.dtype != self._dtype):
                return None
            lo = out.data.ptr
            hi = lo + out.nbytes
            allow = ops[2] if self._is_gemm else None     # out=C: the in-place update
            for x in ops:
                if x is not None and x is not allow:
                    p = x.data.ptr
                    if p < hi and lo < p + x.nbytes:
                        return None
        if self._is_gemm:
            if type(alpha) not in _REAL or type(beta) not in _REAL:
                return None
            a, b = float(alpha), float(beta)
            if a - a != 0.0 or b - b != 0.0 or (b == 0.0) != self._beta_zero:
                return None                             # inf or nan; the other beta
            self.executor.run(ops, out, alpha=a, beta=b)
        else:
            self.executor.run(ops, out)
        return out

    def __call__(self, *operands, out=None, stream=None, alpha=1.0, beta=0.0):
        # A small GEMM's kernel lasts a few microseconds, so the usual call (CuPy
        # operands as planned) takes the fast path: comparisons, no conversions.
        if self._fast_ok and stream is None:
            res = self._call_fast(operands, out, alpha, beta)
            if res is not None:
                return res
        if self._is_gemm:
            operands = (operands + (None,))[:3]
            if self.spec.beta_zero:
                operands = operands[:2] + (None,)      # C is not read when beta == 0
            elif operands[2] is None:
                raise ValueError("C is missing: this plan was built for beta != 0, which "
                                 "reads C (pass C, or out=C for the in-place update)")
        elif self.reshape_inputs:
            operands = tuple(V.reshape_like(name, x, shape)
                             for (name, shape, _), x in zip(self._shapes, operands))
        V.check_operands(self._shapes, operands)
        if out is None:
            out = self.xp.empty(self._out_shape, dtype=self._dtype)
        else:
            allow = ()
            if self._is_gemm and not self.spec.beta_zero:
                allow = (operands[2],)          # out=C: the classic in-place update
            V.check_out(out, self._out_shape, self._dtype, self.xp,
                        zip(self._names, operands), allow)
        for x in operands:
            if x is not None and not c_contiguous(x):
                operands = tuple(V.as_contiguous(self.xp, x) for x in operands)
                break
        if self._is_gemm:
            a, b = V.check_scalar("alpha", alpha), V.check_scalar("beta", beta)
            if (b == 0.0) != self.spec.beta_zero:
                raise ValueError(f"this plan was built for beta{'==' if self.spec.beta_zero else '!='}0,"
                                 f" got beta={beta}")
            scalars = dict(alpha=a, beta=b)
        else:
            scalars = {}
        if out.size == 0:
            return out
        if stream is not None:
            if not self._on_gpu:
                raise TypeError("stream= is for CuPy arrays; NumPy work runs on the host")
            with stream:
                self.executor.run(operands, out, **scalars)
        else:
            self.executor.run(operands, out, **scalars)
        return out


def _shapes(spec):
    dt = spec.dtype
    if isinstance(spec, ActionSpec):
        return (("B1d", spec.b_shape, dt), ("D", spec.d_shape, dt), ("V", spec.v_shape, dt))
    if isinstance(spec, AssemblySpec):
        return (("B1d", spec.b_shape, dt), ("D", spec.d_shape, dt))
    if isinstance(spec, GemmSpec):
        c = ("C", spec.out_shape, dt)
        return (("A", spec.a_shape, dt), ("B", spec.b_shape, dt), c)
    if isinstance(spec, ContractSpec):
        return (("X", spec.x_shape, dt), ("Y", spec.y_shape, dt))
    raise TypeError(f"not a spec: {spec!r}")


def build_plan(spec, xp, backend="auto", method="auto"):
    """Build (or fetch) the plan for ``spec`` on arrays of module ``xp``."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if method == "pairwise" and not isinstance(spec, (ActionSpec, AssemblySpec)):
        raise ValueError(f"method='pairwise' applies to the action and assembly, not {spec.op}")
    key = (spec, xp.__name__, backend, method)
    hit = _PLANS.get(key)
    if hit is not None:
        _PLANS.move_to_end(key)
        return hit
    fallbacks = []
    for be in candidates(xp.__name__, backend):
        m = method
        if m == "auto":
            m = "fused" if "fused" in be.methods or not isinstance(
                spec, (ActionSpec, AssemblySpec)) else "pairwise"
        try:
            if m == "pairwise":
                ex = PairwiseExecutor(be, spec)
            else:
                ex = be.build(spec)
        except Unsupported as err:
            fallbacks.append(f"{be.name}: {err}")
            _warn_once((spec.kernel_key(), be.name),
                       "smalltc: backend %r cannot run %s (%s); falling back", be.name, spec, err)
            continue
        if not ex.specialized:
            _warn_once((spec.kernel_key(), be.name, "generic"),
                       "smalltc: no size-specialised %s kernel for %s; using the generic "
                       "kernel %s", be.name, spec, ex.kernel)
        p = Plan(spec, xp, be.name, m, ex, _shapes(spec), fallbacks)
        _PLANS[key] = p
        if len(_PLANS) > _MAX_PLANS:
            _PLANS.popitem(last=False)
        return p
    raise RuntimeError(f"no backend can run {spec}: " + "; ".join(fallbacks))


def _warn_once(key, msg, *args):
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg, *args)


def plan(op, *operands, backend="auto", method="auto", alpha=1.0, beta=0.0,
         trans_a=False, trans_b=False, kind=None, extents=None):
    """Build a reusable plan for ``op`` from example operands.

    Parameters
    ----------
    op : {"action", "assembly", "gemm", "contract"}
        What to plan: ``batched_contract``, ``assemble_mass``,
        ``batched_gemm`` or ``contract``.
    *operands : arrays
        Examples with the shapes and dtype of later calls: ``(B1d, D, V)``,
        ``(B1d, D)``, ``(A, B[, C])`` or ``(X, Y)``.
    backend : str
        "auto", "reference", "cpu" or "cuda".
    method : {"auto", "fused", "pairwise"}
        For the action and assembly: one fused kernel, or the catalogue's
        pairwise steps.
    alpha, beta, trans_a, trans_b : GEMM options (``beta != 0`` needs C).
    kind, extents : for ``op="contract"``: "8a", "8b" or "9", and optional
        reshaping extents (dict i, s, j, k, l).

    Returns
    -------
    Plan
        Call it as ``p(*operands, out=None, stream=None)``.

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
    """
    if op == "action":
        spec, xp, _ = V.action_spec(*operands)
    elif op == "assembly":
        spec, xp, _ = V.assembly_spec(*operands)
    elif op == "gemm":
        A, B, *rest = operands
        spec, xp, _ = V.gemm_spec(A, B, rest[0] if rest else None, alpha=alpha, beta=beta,
                                  trans_a=trans_a, trans_b=trans_b)
    elif op == "contract":
        spec, xp, _ = V.contract_spec(kind, *operands, extents=extents)
        p = build_plan(spec, xp, backend, method)
        p.reshape_inputs = p.reshape_inputs or extents is not None
        return p
    else:
        raise ValueError(f"op must be 'action', 'assembly', 'gemm' or 'contract', got {op!r}")
    return build_plan(spec, xp, backend, method)
