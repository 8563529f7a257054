"""The pairwise contractions (1a)-(4f) of docs/math.md section 3, as one data table.

Each step is one launch of a reshaping-layout kernel, (8a), (8b) or (9).
Operands are read through views of the same storage with other extents;
nothing is transposed. An extent is written ``(a, b)``, meaning
``nd**a * nq**b``. Operand names: ``B`` is ``B1d`` (shared by the batch),
``V`` the input, ``D`` the quadrature data, ``C`` the previous step's output.

Steps ``(0a)`` (1D assembly) and ``(5a)-(5b)`` (1D action) extend the
paper's table the obvious way.

Examples
--------
>>> [s.label for s in steps("action", 2)]
['(3a)', '(3b)', '(3c)', '(3d)']
>>> step = steps("action", 3)[0]
>>> step.kernel, step.x_extents(nd=3, nq=4), step.y_extents(nd=3, nq=4)
('8a', (9, 3, 1), (4, 3, 1))
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Step", "STEPS", "steps"]

_1 = (0, 0)
ND, NQ, ND2, NQ2, NDNQ = (1, 0), (0, 1), (2, 0), (0, 2), (1, 1)
B_ND = ("B", (NQ, ND, _1))    # B1d[k, j] seen as [nq, nd, 1]: contract over nd
B_NQ = ("B", (_1, NQ, ND))    # B1d[k, i] seen as [1, nq, nd]: contract over nq
B_9 = ("B", (NQ, ND))         # kernel (9) reads B1d as B[s, n]


class Step(NamedTuple):
    label: str
    op: str            # "action" or "assembly"
    dim: int
    kernel: str        # "8a", "8b" or "9"
    x: tuple           # (operand, extents of X[i,s,j]) or B[s,n] for kernel 9
    y: tuple           # (operand, extents of Y[k,s,l]) or C[k,s,l] for kernel 9
    scale: bool        # multiply the result pointwise by D afterwards
    formula: str

    @staticmethod
    def _ext(ext, nd, nq):
        return tuple(nd ** a * nq ** b for a, b in ext)

    def x_extents(self, nd, nq):
        return self._ext(self.x[1], nd, nq)

    def y_extents(self, nd, nq):
        return self._ext(self.y[1], nd, nq)

    def extents(self, nd, nq):
        """``dict(i, s, j, k, l)`` of the reshaped kernel for sizes nd, nq."""
        xe, (k, s, l) = self.x_extents(nd, nq), self.y_extents(nd, nq)
        if self.kernel == "9":
            s_x, n = xe
            return dict(i=n, s=s_x, j=n, k=k, l=l)
        i, _, j = xe
        return dict(i=i, s=s, j=j, k=k, l=l)


S = Step
STEPS = (
    # label   op          dim kernel X                        Y                        scale
    S("(0a)", "assembly", 1, "9", B_9, ("D", (_1, NQ, _1)), False,
      "M[i1,j1] = sum_k1 B[k1,i1] B[k1,j1] D[k1]"),
    S("(1a)", "assembly", 2, "9", B_9, ("D", (_1, NQ, NQ)), False,
      "A[i1,k2,j1] = sum_k1 B[k1,i1] B[k1,j1] D[k1,k2]"),
    S("(1b)", "assembly", 2, "9", B_9, ("C", (ND, NQ, ND)), False,
      "M[i1,i2,j1,j2] = sum_k2 B[k2,i2] B[k2,j2] C[i1,k2,j1]"),
    S("(2a)", "assembly", 3, "9", B_9, ("D", (_1, NQ, NQ2)), False,
      "A[i1,k2,k3,j1] = sum_k1 B[k1,i1] B[k1,j1] D[k1,k2,k3]"),
    S("(2b)", "assembly", 3, "9", B_9, ("C", (ND, NQ, NDNQ)), False,
      "A[i1,i2,k3,j1,j2] = sum_k2 B[k2,i2] B[k2,j2] C[i1,k2,k3,j1]"),
    S("(2c)", "assembly", 3, "9", B_9, ("C", (ND2, NQ, ND2)), False,
      "M[i1,i2,i3,j1,j2,j3] = sum_k3 B[k3,i3] B[k3,j3] C[i1,i2,k3,j1,j2]"),
    S("(3a)", "action", 2, "8a", ("V", (ND, ND, _1)), B_ND, False,
      "A[j1,k2] = sum_j2 B[k2,j2] V[j1,j2]"),
    S("(3b)", "action", 2, "8a", B_ND, ("C", (_1, ND, NQ)), True,
      "A[k1,k2] = sum_j1 B[k1,j1] C[j1,k2]; C = D * A"),
    S("(3c)", "action", 2, "8a", ("C", (NQ, NQ, _1)), B_NQ, False,
      "A[k1,i2] = sum_k2 B[k2,i2] C[k1,k2]"),
    S("(3d)", "action", 2, "8a", B_NQ, ("C", (_1, NQ, ND)), False,
      "U[i1,i2] = sum_k1 B[k1,i1] C[k1,i2]"),
    S("(4a)", "action", 3, "8a", ("V", (ND2, ND, _1)), B_ND, False,
      "A[j1,j2,k3] = sum_j3 B[k3,j3] V[j1,j2,j3]"),
    S("(4b)", "action", 3, "8b", ("C", (ND, ND, NQ)), B_ND, False,
      "A[j1,k2,k3] = sum_j2 B[k2,j2] C[j1,j2,k3]"),
    S("(4c)", "action", 3, "8a", B_ND, ("C", (_1, ND, NQ2)), True,
      "A[k1,k2,k3] = sum_j1 B[k1,j1] C[j1,k2,k3]; C = D * A"),
    S("(4d)", "action", 3, "8a", ("C", (NQ2, NQ, _1)), B_NQ, False,
      "A[k1,k2,i3] = sum_k3 B[k3,i3] C[k1,k2,k3]"),
    S("(4e)", "action", 3, "8b", ("C", (NQ, NQ, ND)), B_NQ, False,
      "A[k1,i2,i3] = sum_k2 B[k2,i2] C[k1,k2,i3]"),
    S("(4f)", "action", 3, "8a", B_NQ, ("C", (_1, NQ, ND2)), False,
      "U[i1,i2,i3] = sum_k1 B[k1,i1] C[k1,i2,i3]"),
    S("(5a)", "action", 1, "8a", B_ND, ("V", (_1, ND, _1)), True,
      "A[k1] = sum_j1 B[k1,j1] V[j1]; C = D * A"),
    S("(5b)", "action", 1, "8a", B_NQ, ("C", (_1, NQ, _1)), False,
      "U[i1] = sum_k1 B[k1,i1] C[k1]"),
)
del S


def steps(op: str, dim: int) -> tuple:
    """The steps of ``op`` ("action" or "assembly") in ``dim`` dimensions, in order."""
    found = tuple(s for s in STEPS if s.op == op and s.dim == dim)
    if not found:
        raise ValueError(f"no pairwise steps for op={op!r}, dim={dim}")
    return found
