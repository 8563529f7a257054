"""Frozen, hashable descriptions of one batched operation (a "spec").

A spec holds everything that determines the computation except the data:
sizes, dtype, which operands are shared by the whole batch. It also answers
what every consumer asks of an operation, so none of them needs to know
which kind of spec it holds:

==================  =========================================================
``spec.op``         "gemm", "contract", "action" or "assembly"
``spec.inputs``     the operands a call takes, in order (:class:`Operand`:
                    name, shape, whether it carries the batch axis)
``spec.out_shape``  the result's shape
``spec.items``      the batch count (elements, matrices)
``spec.size_key``   the name of the size in a tuning table
                    (``"action/3d/nd4nq5c1"``; no batch count, no dtype)
``spec.sizes()``    the sizes the roofline formulas take
``str(spec)``       a readable one-liner (``action_3d p=3 nq=5 E=10 float64``)
==================  =========================================================

Every cache in smalltc is keyed on ``spec.kernel_key()`` (the spec without
the batch count, so one compiled kernel serves any number of elements) plus
the device and the tuning parameters.

Examples
--------
>>> s = ActionSpec(dim=3, nq=5, nd=4, batch=10, dtype="float64")
>>> [(o.name, o.shape) for o in s.inputs]
[('B1d', (5, 4)), ('D', (10, 5, 5, 5)), ('V', (10, 4, 4, 4))]
>>> s.size_key, s.items, str(s)
('action/3d/nd4nq5c1', 10, 'action_3d p=3 nq=5 E=10 float64')
>>> GemmSpec(batch=3, m=2, n=2, k=2, dtype="float32", beta_zero=False).size_key
'gemm/nn+beta/m2n2k2'
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

__all__ = ["Operand", "GemmSpec", "ContractSpec", "ActionSpec", "AssemblySpec",
           "MassApplySpec", "MassDiagonalSpec", "CONTRACT_KINDS", "SPEC_TYPES",
           "spec_from_dict"]

#: kernels (8a), (8b), (9) of docs/math.md section 3: output axis order per kind.
CONTRACT_KINDS = {
    "8a": "A[i,j,k,l] = sum_s X[i,s,j] Y[k,s,l]",
    "8b": "A[i,k,l,j] = sum_s X[i,s,j] Y[k,s,l]",
    "9": "A[k,i,l,j] = sum_s B[s,i] B[s,j] C[k,s,l]",
}


class Operand(NamedTuple):
    """One input of an operation: its name in messages, its shape, whether it has the
    batch axis (False: one array shared by the whole batch), whether its values are
    positive by nature (``D = w * rho * |J|``: tests and measurements draw it so), and
    its dtype when it is not the operation's (the integer element-to-DoF map)."""

    name: str
    shape: tuple
    batched: bool
    positive: bool = False
    dtype: str | None = None


class _Spec:
    """Common behaviour: the kernel key drops the batch count."""

    op: str

    def kernel_key(self):
        return (self.op,) + tuple(
            v for k, v in self.__dict__.items() if k not in ("batch", "comp_axis"))

    def with_batch(self, batch: int):
        return replace(self, batch=batch)

    @property
    def items(self) -> int:
        """The batch count: elements for the FEM operations, matrices for the GEMM."""
        return self.batch

    def as_dict(self) -> dict:
        """``op`` and the fields: what a tuning table stores (:func:`spec_from_dict`)."""
        return dict(op=self.op, **{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True)
class GemmSpec(_Spec):
    """``C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]`` for ``b < batch``.

    ``op(A)`` is ``m x k``, ``op(B)`` is ``k x n``. A shared operand (2D
    array) has batch stride 0. ``beta_zero`` means C is not read (and is not
    among the inputs).
    """

    batch: int
    m: int
    n: int
    k: int
    dtype: str
    trans_a: bool = False
    trans_b: bool = False
    shared_a: bool = False
    shared_b: bool = False
    beta_zero: bool = True
    op = "gemm"

    @property
    def a_shape(self):
        core = (self.k, self.m) if self.trans_a else (self.m, self.k)
        return core if self.shared_a else (self.batch,) + core

    @property
    def b_shape(self):
        core = (self.n, self.k) if self.trans_b else (self.k, self.n)
        return core if self.shared_b else (self.batch,) + core

    @property
    def out_shape(self):
        return (self.batch, self.m, self.n)

    @property
    def inputs(self):
        ops = (Operand("A", self.a_shape, not self.shared_a),
               Operand("B", self.b_shape, not self.shared_b))
        return ops if self.beta_zero else ops + (Operand("C", self.out_shape, True),)

    @property
    def size_key(self):
        t = ("t" if self.trans_a else "n") + ("t" if self.trans_b else "n")
        flags = (("+sa" if self.shared_a else "") + ("+sb" if self.shared_b else "")
                 + ("" if self.beta_zero else "+beta"))
        return f"gemm/{t}{flags}/m{self.m}n{self.n}k{self.k}"

    def sizes(self):
        return dict(m=self.m, n=self.n, k=self.k, batch=self.batch, shared_a=self.shared_a,
                    shared_b=self.shared_b, beta_zero=self.beta_zero)

    def __str__(self):
        t = ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")
        return (f"gemm_{t.lower()} m={self.m} n={self.n} k={self.k} batch={self.batch} "
                f"{self.dtype}{' shared A' if self.shared_a else ''}"
                f"{' shared B' if self.shared_b else ''}{'' if self.beta_zero else ' beta!=0'}")


@dataclass(frozen=True)
class ContractSpec(_Spec):
    """One reshaping-layout contraction, kernel (8a), (8b) or (9).

    Extents ``i, s, j`` belong to X (seen as ``X[i,s,j]``) and ``k, s, l`` to
    Y (``Y[k,s,l]``). For kind ``"9"`` X is ``B[s,n]`` with ``i == j == n``
    and Y is ``C[k,s,l]``.
    """

    kind: str
    batch: int
    i: int
    s: int
    j: int
    k: int
    l: int
    dtype: str
    shared_x: bool = False
    shared_y: bool = False
    op = "contract"

    @property
    def x_shape(self):
        core = (self.s, self.i) if self.kind == "9" else (self.i, self.s, self.j)
        return core if self.shared_x else (self.batch,) + core

    @property
    def y_shape(self):
        core = (self.k, self.s, self.l)
        return core if self.shared_y else (self.batch,) + core

    @property
    def out_shape(self):
        i, j, k, l = self.i, self.j, self.k, self.l
        core = {"8a": (i, j, k, l), "8b": (i, k, l, j), "9": (k, i, l, j)}[self.kind]
        return (self.batch,) + core

    @property
    def inputs(self):
        return (Operand("X", self.x_shape, not self.shared_x),
                Operand("Y", self.y_shape, not self.shared_y))

    @property
    def size_key(self):
        flags = ("+sx" if self.shared_x else "") + ("+sy" if self.shared_y else "")
        return f"contract{self.kind}{flags}/i{self.i}s{self.s}j{self.j}k{self.k}l{self.l}"

    def sizes(self):
        return dict(kind=self.kind, i=self.i, s=self.s, j=self.j, k=self.k, l=self.l,
                    batch=self.batch, shared_x=self.shared_x, shared_y=self.shared_y)

    def __str__(self):
        return (f"contract ({self.kind}) i={self.i} s={self.s} j={self.j} k={self.k} "
                f"l={self.l} batch={self.batch} {self.dtype}")


@dataclass(frozen=True)
class ActionSpec(_Spec):
    """Partial-assembly mass action ``U_e = B^T D_e B V_e`` (docs/math.md section 2)."""

    dim: int
    nq: int
    nd: int
    batch: int
    dtype: str
    ncomp: int = 1
    comp_axis: bool = False
    op = "action"

    def __post_init__(self):
        # V is (batch, ncomp, nd, ...) for ncomp > 1; without the axis its shape would
        # hold 1/ncomp of the items the kernels process (the tuner made such specs once)
        if self.ncomp > 1 and not self.comp_axis:
            raise ValueError(f"ncomp={self.ncomp} needs comp_axis=True (V has a component axis)")

    @property
    def b_shape(self):
        return (self.nq, self.nd)

    @property
    def d_shape(self):
        return (self.batch,) + (self.nq,) * self.dim

    @property
    def v_shape(self):
        comp = (self.ncomp,) if self.comp_axis else ()
        return (self.batch,) + comp + (self.nd,) * self.dim

    out_shape = v_shape

    @property
    def inputs(self):
        return (Operand("B1d", self.b_shape, False), Operand("D", self.d_shape, True, True),
                Operand("V", self.v_shape, True))

    @property
    def p(self):
        return self.nd - 1

    @property
    def size_key(self):
        return f"action/{self.dim}d/nd{self.nd}nq{self.nq}c{self.ncomp}"

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch, ncomp=self.ncomp)

    def __str__(self):
        comp = f" ncomp={self.ncomp}" if self.comp_axis else ""
        return (f"action_{self.dim}d p={self.p} nq={self.nq}{comp} "
                f"E={self.batch} {self.dtype}")


@dataclass(frozen=True)
class AssemblySpec(_Spec):
    """Element mass matrices ``M_e = B^T D_e B`` (docs/math.md section 2)."""

    dim: int
    nq: int
    nd: int
    batch: int
    dtype: str
    op = "assembly"

    @property
    def b_shape(self):
        return (self.nq, self.nd)

    @property
    def d_shape(self):
        return (self.batch,) + (self.nq,) * self.dim

    @property
    def out_shape(self):
        n = self.nd ** self.dim
        return (self.batch, n, n)

    @property
    def inputs(self):
        return (Operand("B1d", self.b_shape, False), Operand("D", self.d_shape, True, True))

    @property
    def p(self):
        return self.nd - 1

    @property
    def size_key(self):
        return f"assembly/{self.dim}d/nd{self.nd}nq{self.nq}"

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch)

    def __str__(self):
        return f"mass_assemble_{self.dim}d p={self.p} nq={self.nq} E={self.batch} {self.dtype}"


INDEX_DTYPES = ("int32", "int64")


@dataclass(frozen=True)
class MassApplySpec(_Spec):
    """The global mass operator ``y = sum_e R_e^T B^T D_e B R_e x``, fused: each element's
    values gathered from the global vector ``x`` through the element-to-DoF map
    ``elem_dofs`` (``R_e``), the action applied, the result added into ``y``.

    ``batch`` is the element count E; ``ndofs`` the global vector's length (per
    component: ``x`` is ``(ndofs,)``, or ``(ncomp, ndofs)`` with ``comp_axis``);
    ``index_dtype`` the map's; ``deterministic``: the additions into ``y`` in a fixed
    order (element colours) instead of atomics, the same bits every run.

    >>> s = MassApplySpec(dim=2, nq=4, nd=3, batch=6, dtype="float64", ndofs=35)
    >>> [(o.name, o.shape, o.dtype) for o in s.inputs]
    [('B1d', (4, 3), None), ('D', (6, 4, 4), None), ('x', (35,), None), ('elem_dofs', (6, 3, 3), 'int32')]
    >>> s.out_shape, s.size_key
    ((35,), 'mass_apply/2d/nd3nq4c1')
    """

    dim: int
    nq: int
    nd: int
    batch: int
    dtype: str
    ndofs: int
    ncomp: int = 1
    comp_axis: bool = False
    index_dtype: str = "int32"
    deterministic: bool = False
    op = "mass_apply"

    def __post_init__(self):
        if self.ncomp > 1 and not self.comp_axis:
            raise ValueError(f"ncomp={self.ncomp} needs comp_axis=True (x has a component axis)")
        if self.index_dtype not in INDEX_DTYPES:
            raise ValueError(f"index_dtype must be one of {INDEX_DTYPES}, got {self.index_dtype!r}")

    def kernel_key(self):
        """No batch count and no vector length: one kernel serves every mesh."""
        return (self.op, self.dim, self.nq, self.nd, self.dtype, self.ncomp, self.index_dtype,
                self.deterministic)

    @property
    def x_shape(self):
        return ((self.ncomp,) if self.comp_axis else ()) + (self.ndofs,)

    out_shape = x_shape

    @property
    def inputs(self):
        return (Operand("B1d", (self.nq, self.nd), False),
                Operand("D", (self.batch,) + (self.nq,) * self.dim, True, True),
                Operand("x", self.x_shape, False),
                Operand("elem_dofs", (self.batch,) + (self.nd,) * self.dim, True, False,
                        self.index_dtype))

    @property
    def p(self):
        return self.nd - 1

    @property
    def size_key(self):
        return f"mass_apply/{self.dim}d/nd{self.nd}nq{self.nq}c{self.ncomp}"

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch, ncomp=self.ncomp,
                    ndofs=self.ndofs, index_bytes=int(self.index_dtype[3:]) // 8)

    def __str__(self):
        comp = f" ncomp={self.ncomp}" if self.comp_axis else ""
        det = " deterministic" if self.deterministic else ""
        return (f"mass_operator_{self.dim}d p={self.p} nq={self.nq}{comp} E={self.batch} "
                f"ndofs={self.ndofs} {self.dtype} {self.index_dtype}{det}")


@dataclass(frozen=True)
class MassDiagonalSpec(_Spec):
    """The diagonal of the global mass matrix, ``y = sum_e R_e^T diag(B^T D_e B)``, with
    the element diagonals ``sum_k prod_a B[k_a, i_a]^2 D_e[k]`` added into ``y`` through
    the element-to-DoF map (the Jacobi preconditioner of the mass operator).

    >>> MassDiagonalSpec(dim=3, nq=5, nd=4, batch=8, dtype="float32", ndofs=125).out_shape
    (125,)
    """

    dim: int
    nq: int
    nd: int
    batch: int
    dtype: str
    ndofs: int
    index_dtype: str = "int32"
    deterministic: bool = False
    op = "mass_diagonal"

    def __post_init__(self):
        if self.index_dtype not in INDEX_DTYPES:
            raise ValueError(f"index_dtype must be one of {INDEX_DTYPES}, got {self.index_dtype!r}")

    def kernel_key(self):
        return (self.op, self.dim, self.nq, self.nd, self.dtype, self.index_dtype,
                self.deterministic)

    @property
    def out_shape(self):
        return (self.ndofs,)

    @property
    def inputs(self):
        return (Operand("B1d", (self.nq, self.nd), False),
                Operand("D", (self.batch,) + (self.nq,) * self.dim, True, True),
                Operand("elem_dofs", (self.batch,) + (self.nd,) * self.dim, True, False,
                        self.index_dtype))

    @property
    def p(self):
        return self.nd - 1

    @property
    def size_key(self):
        return f"mass_diagonal/{self.dim}d/nd{self.nd}nq{self.nq}"

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch, ndofs=self.ndofs,
                    index_bytes=int(self.index_dtype[3:]) // 8)

    def __str__(self):
        det = " deterministic" if self.deterministic else ""
        return (f"mass_diagonal_{self.dim}d p={self.p} nq={self.nq} E={self.batch} "
                f"ndofs={self.ndofs} {self.dtype} {self.index_dtype}{det}")


#: op name -> spec class
SPEC_TYPES = {c.op: c for c in (GemmSpec, ContractSpec, ActionSpec, AssemblySpec,
                                MassApplySpec, MassDiagonalSpec)}


def spec_from_dict(d: dict):
    """The spec of ``d`` (``op`` and the fields, as :meth:`as_dict` writes them).

    >>> s = AssemblySpec(dim=2, nq=3, nd=2, batch=5, dtype="float32")
    >>> spec_from_dict(s.as_dict()) == s
    True
    """
    d = dict(d)
    op = d.pop("op", None)
    if op not in SPEC_TYPES:
        raise ValueError(f"not a spec: op {op!r} (expected one of {sorted(SPEC_TYPES)})")
    return SPEC_TYPES[op](**d)
