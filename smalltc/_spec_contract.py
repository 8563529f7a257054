"""The specs of the batched GEMM and the reshaping-layout contractions (8a), (8b), (9)
of docs/math.md section 3 (:mod:`smalltc.spec`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ._spec_base import Operand, _Spec

__all__ = ["CONTRACT_KINDS", "GemmSpec", "ContractSpec"]

#: kernels (8a), (8b), (9) of docs/math.md section 3: output axis order per kind.
CONTRACT_KINDS = {
    "8a": "A[i,j,k,l] = sum_s X[i,s,j] Y[k,s,l]",
    "8b": "A[i,k,l,j] = sum_s X[i,s,j] Y[k,s,l]",
    "9": "A[k,i,l,j] = sum_s B[s,i] B[s,j] C[k,s,l]",
}


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
