"""Frozen, hashable descriptions of one batched operation (a "spec").

A spec holds everything that determines the computation except the data:
sizes, dtype, which operands are shared by the whole batch. Every cache in
smalltc is keyed on ``spec.kernel_key()`` (the spec without the batch
count, so one compiled kernel serves any number of elements) plus the device
and the tuning parameters.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["GemmSpec", "ContractSpec", "ActionSpec", "AssemblySpec",
           "CONTRACT_KINDS"]

#: kernels (8a), (8b), (9) of SPEC section 3: output axis order per kind.
CONTRACT_KINDS = {
    "8a": "A[i,j,k,l] = sum_s X[i,s,j] Y[k,s,l]",
    "8b": "A[i,k,l,j] = sum_s X[i,s,j] Y[k,s,l]",
    "9": "A[k,i,l,j] = sum_s B[s,i] B[s,j] C[k,s,l]",
}


class _Spec:
    """Common behaviour: the kernel key drops the batch count."""

    op: str

    def kernel_key(self):
        return (self.op,) + tuple(
            v for k, v in self.__dict__.items() if k not in ("batch", "comp_axis"))

    def with_batch(self, batch: int):
        return replace(self, batch=batch)


@dataclass(frozen=True)
class GemmSpec(_Spec):
    """``C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]`` for ``b < batch``.

    ``op(A)`` is ``m x k``, ``op(B)`` is ``k x n``. A shared operand (2D
    array) has batch stride 0. ``beta_zero`` means C is not read.
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

    def __str__(self):
        return (f"contract ({self.kind}) i={self.i} s={self.s} j={self.j} k={self.k} "
                f"l={self.l} batch={self.batch} {self.dtype}")


@dataclass(frozen=True)
class ActionSpec(_Spec):
    """Partial-assembly mass action ``U_e = B^T D_e B V_e`` (SPEC section 2)."""

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
    def p(self):
        return self.nd - 1

    def __str__(self):
        comp = f" ncomp={self.ncomp}" if self.comp_axis else ""
        return (f"mass_apply_{self.dim}d p={self.p} nq={self.nq}{comp} "
                f"E={self.batch} {self.dtype}")


@dataclass(frozen=True)
class AssemblySpec(_Spec):
    """Element mass matrices ``M_e = B^T D_e B`` (SPEC section 2)."""

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
    def p(self):
        return self.nd - 1

    def __str__(self):
        return f"mass_assemble_{self.dim}d p={self.p} nq={self.nq} E={self.batch} {self.dtype}"
