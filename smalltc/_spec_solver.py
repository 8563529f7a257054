"""The specs of the solver kernels: vector updates, p-multigrid transfers, CSR product,
Schwarz (:mod:`smalltc.spec`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ._spec_base import (INDEX_DTYPES, Operand, _check_choice, _check_dim, _check_float,
                         _map_operand, _Spec)

__all__ = ["VECTOR_MODES", "SOLVER_OPS", "VectorUpdateSpec", "PcgSpec", "TransferSpec",
           "CsrSpmvSpec", "SchwarzSpec"]


#: the Chebyshev smoother's and V-cycle's vector updates (:class:`VectorUpdateSpec`)
VECTOR_MODES = ("start", "step", "residual", "last")
#: the solver specs' ops
SOLVER_OPS = ("vector_update", "pcg", "pmg_transfer", "csr_spmv", "schwarz_fdm")


def _check_common(spec):
    """The solver specs' checks: the dtype, the index dtype and ``dim`` where the spec has
    them, a batch count >= 0."""
    _check_float("dtype", spec.dtype)
    idt = getattr(spec, "index_dtype", None)
    if idt is not None:
        _check_choice("index_dtype", idt, INDEX_DTYPES)
    if spec.batch < 0:
        raise ValueError(f"batch must be >= 0, got {spec.batch}")
    if hasattr(spec, "dim"):
        _check_dim(spec.dim)


class _Vectors(_Spec):
    """The specs on vectors of length ``batch``: the operands :meth:`_names` lists, each a
    vector; the result a vector."""

    def __post_init__(self):
        _check_common(self)

    @property
    def inputs(self):
        return tuple(Operand(n, (self.batch,), True) for n in self._names())

    @property
    def out_shape(self):
        return (self.batch,)

    def sizes(self):
        return dict(n=self.batch)


@dataclass(frozen=True)
class VectorUpdateSpec(_Vectors):
    """One vector update of a Chebyshev smoothing step or of a V-cycle's residual, on
    vectors of length ``batch``, in place (``f`` the free mask, 1 free and 0 constrained;
    ``y = A(f v)`` the raw operator's result; ``inv = 1 / diag(A_c)``):

    ===========  ==========================================  =================================
    mode         operands                                    effect
    ===========  ==========================================  =================================
    "start"      r, inv, [f]                                 ``d = c1 inv r``, ``dm = f d``
    "step"       y, r, x, d, dm, inv, [f]                    ``r -= f y + (1 - f) d``; ``x =
                                                             beta d`` (xzero) or ``x += beta
                                                             d``; ``d = c0 d + c1 inv r``;
                                                             ``dm = f d``
    "residual"   b, y, x, [f]                                ``r = b - (f y + (1 - f) x)``
    "last"       d, x, [f]                                   ``x = beta d`` or ``x += beta
                                                             d``; ``xm = f x``
    ===========  ==========================================  =================================

    ``masked`` False: no ``f`` (every DoF free).

    >>> s = VectorUpdateSpec(mode="step", batch=10, dtype="float64")
    >>> [o.name for o in s.inputs], s.size_key, str(s)
    (['y', 'r', 'x', 'd', 'dm', 'inv', 'f'], 'vector/step/n10', 'vector_step n=10 float64')
    """

    mode: str
    batch: int
    dtype: str
    masked: bool = True
    op = "vector_update"

    def __post_init__(self):
        _check_choice("mode", self.mode, VECTOR_MODES)
        super().__post_init__()

    #: the vectors of each mode, in order (the mask ``f`` follows where ``masked``)
    OPERANDS = {"start": ("r", "inv"), "step": ("y", "r", "x", "d", "dm", "inv"),
                "residual": ("b", "y", "x"), "last": ("d", "x")}

    def _names(self):
        return self.OPERANDS[self.mode] + (("f",) if self.masked else ())

    @property
    def size_key(self):
        return f"vector/{self.mode}{'' if self.masked else '+nomask'}/n{self.batch}"

    def __str__(self):
        return (f"vector_{self.mode} n={self.batch} {self.dtype}"
                + ("" if self.masked else " unmasked"))


@dataclass(frozen=True)
class PcgSpec(_Vectors):
    """The fused vector updates of preconditioned conjugate gradients on vectors of length
    ``batch``: ``p.Ap``; ``x += alpha p``, ``r -= alpha Ap`` with ``r.r`` and ``r.z``
    (``z = inv r`` when ``jacobi``, else ``z = r``); ``p = z + beta p``.

    >>> s = PcgSpec(batch=100, dtype="float64", jacobi=True)
    >>> [o.name for o in s.inputs], s.size_key, str(s)
    (['x', 'r', 'inv'], 'pcg/jacobi/n100', 'pcg n=100 jacobi float64')
    """

    batch: int
    dtype: str
    jacobi: bool = True
    op = "pcg"

    def _names(self):
        return ("x", "r") + (("inv",) if self.jacobi else ())

    @property
    def size_key(self):
        return f"pcg/{'jacobi' if self.jacobi else 'none'}/n{self.batch}"

    def __str__(self):
        return f"pcg n={self.batch}{' jacobi' if self.jacobi else ''} {self.dtype}"


@dataclass(frozen=True)
class TransferSpec(_Spec):
    """A p-multigrid transfer: ``y[out_map[e, i]] += out_w[out_map[e, i]] ((M x ... x M)
    (in_w x)[in_map[e, :]])[i]`` over the ``batch`` elements, ``M`` of shape ``(nout,
    nin)`` on each of the ``dim`` axes. Prolongation: ``in`` the coarse space, ``M`` the
    coarse basis at the fine nodes; restriction: ``in`` the fine space, ``M`` its
    transpose. ``y`` (``n_out``) is overwritten, or added to with ``add``.

    >>> s = TransferSpec(dim=2, nin=2, nout=3, batch=4, dtype="float64", n_in=9, n_out=25)
    >>> [(o.name, o.shape) for o in s.inputs][:3], s.out_shape
    ([('M', (3, 2)), ('x', (9,)), ('in_map', (4, 2, 2))], (25,))
    >>> s.size_key, str(s)
    ('pmg_transfer/2d/nin2nout3', 'pmg_transfer_2d 2->3 E=4 float64')
    """

    dim: int
    nin: int
    nout: int
    batch: int
    dtype: str
    n_in: int
    n_out: int
    index_dtype: str = "int32"
    op = "pmg_transfer"

    def __post_init__(self):
        _check_common(self)
        if self.nin < 1 or self.nout < 1:
            raise ValueError(f"nin and nout must be >= 1, got {self.nin}, {self.nout}")

    @property
    def inputs(self):
        E, d, it = self.batch, self.dim, self.index_dtype
        return (Operand("M", (self.nout, self.nin), False),
                Operand("x", (self.n_in,), False),
                _map_operand("in_map", E, self.nin, d, it),
                Operand("in_w", (self.n_in,), False),
                _map_operand("out_map", E, self.nout, d, it),
                Operand("out_w", (self.n_out,), False))

    @property
    def out_shape(self):
        return (self.n_out,)

    def kernel_key(self):
        return (self.op, self.dim, self.nin, self.nout, self.dtype, self.index_dtype)

    @property
    def size_key(self):
        return f"pmg_transfer/{self.dim}d/nin{self.nin}nout{self.nout}"

    def sizes(self):
        return dict(dim=self.dim, nin=self.nin, nout=self.nout, batch=self.batch)

    def __str__(self):
        return (f"pmg_transfer_{self.dim}d {self.nin}->{self.nout} E={self.batch} "
                f"{self.dtype}")


@dataclass(frozen=True)
class CsrSpmvSpec(_Spec):
    """``y = A x`` for a CSR matrix of ``batch`` rows, ``ncols`` columns and ``nnz``
    entries (``indptr``, ``indices`` of ``index_dtype``, ``data``).

    >>> s = CsrSpmvSpec(batch=3, ncols=3, nnz=7, dtype="float64")
    >>> [(o.name, o.shape) for o in s.inputs], s.size_key
    ([('indptr', (4,)), ('indices', (7,)), ('data', (7,)), ('x', (3,))], 'csr_spmv/n3')
    """

    batch: int
    ncols: int
    nnz: int
    dtype: str
    index_dtype: str = "int32"
    op = "csr_spmv"

    def __post_init__(self):
        _check_common(self)

    @property
    def inputs(self):
        it = self.index_dtype
        return (Operand("indptr", (self.batch + 1,), False, False, it),
                Operand("indices", (self.nnz,), False, False, it),
                Operand("data", (self.nnz,), False),
                Operand("x", (self.ncols,), False))

    @property
    def out_shape(self):
        return (self.batch,)

    def kernel_key(self):
        return (self.op, self.dtype, self.index_dtype)

    @property
    def size_key(self):
        return f"csr_spmv/n{self.batch}"

    def sizes(self):
        return dict(n=self.batch, nnz=self.nnz)

    def __str__(self):
        return f"csr_spmv n={self.batch} nnz={self.nnz} {self.dtype}"


@dataclass(frozen=True)
class SchwarzSpec(_Spec):
    """One application of the overlapping Schwarz preconditioner with fast-diagonalisation
    local solves: ``z[i] = w[i] sum_e (K_e^-1 (w r)[idx[e, :]])[slot of i]``, ``K_e^-1 =
    (S_0 x ... x S_{dim-1}) diag(inv[e]) (S_0 x ... x S_{dim-1})^T`` on the ``n^dim``
    extended nodes of each of the ``batch`` elements (an index ``ndofs`` is a pad: no
    DoF). ``rdtype``: the residual's dtype where it is not ``dtype`` (float64 residuals of
    float32 local solves: ``w r`` is formed in float64, then rounded).

    >>> s = SchwarzSpec(dim=2, n=4, batch=3, dtype="float64", ndofs=20)
    >>> [(o.name, o.shape) for o in s.inputs][:3], s.out_shape, s.size_key
    ([('S', (3, 2, 4, 4)), ('inv', (3, 4, 4)), ('idx', (3, 4, 4))], (20,), 'schwarz_fdm/2d/n4')
    """

    dim: int
    n: int
    batch: int
    dtype: str
    ndofs: int
    index_dtype: str = "int32"
    rdtype: str | None = None
    op = "schwarz_fdm"

    def __post_init__(self):
        _check_common(self)
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.rdtype not in (None, "float64"):
            raise ValueError(f"rdtype must be None or 'float64', got {self.rdtype!r}")

    @property
    def inputs(self):
        E, n, d = self.batch, self.n, self.dim
        return (Operand("S", (E, d, n, n), True),
                Operand("inv", (E,) + (n,) * d, True),
                _map_operand("idx", E, n, d, self.index_dtype),
                Operand("r", (self.ndofs,), False, False, self.rdtype),
                Operand("w", (self.ndofs,), False))

    @property
    def out_shape(self):
        return (self.ndofs,)

    def kernel_key(self):
        return (self.op, self.dim, self.n, self.dtype, self.index_dtype, self.rdtype)

    @property
    def size_key(self):
        return f"schwarz_fdm/{self.dim}d/n{self.n}" + ("+r64" if self.rdtype else "")

    def sizes(self):
        return dict(dim=self.dim, n=self.n, batch=self.batch, ndofs=self.ndofs)

    def __str__(self):
        return f"schwarz_fdm_{self.dim}d n={self.n} E={self.batch} {self.dtype}"
