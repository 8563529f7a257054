"""Every public operation as a table, for the framework tests (test_interop*.py).

A case makes NumPy operands, names the call on operands of any library, and the
float64 einsum oracle of the result (:mod:`oracle`; the FEM operators: gather,
einsum chain, bincount). The tests convert the operands to torch or JAX arrays,
call, and compare.
"""
import numpy as np

import smalltc
from smalltc.backends.reference import mass_apply_unfused, mass_diagonal_unfused
from smalltc.fem import H1Space, box_mesh

import oracle


def _rng(dtype, *shapes):
    rng = np.random.default_rng(7)
    return [(rng.random(s) + 0.5).astype(dtype) for s in shapes]


def _action(dim, p, nq, ncomp=1):
    def make(dtype):
        E, nd = 5, p + 1
        v = (E, ncomp) + (nd,) * dim if ncomp > 1 else (E,) + (nd,) * dim
        return _rng(dtype, (nq, nd), (E,) + (nq,) * dim, v)
    return make, lambda B1d, D, V, **kw: smalltc.batched_contract(B1d, D, V, **kw), \
        oracle.action


def _fem(dim, p, nq, ncomp=1, deterministic=False):
    space = H1Space(box_mesh(dim, 2), p)

    def make(dtype):
        B1d, D = _rng(dtype, (nq, p + 1), (space.nelements,) + (nq,) * dim)
        shape = (ncomp, space.ndofs) if ncomp > 1 else (space.ndofs,)
        (x,) = _rng(dtype, shape)
        return [B1d, D, x, space.elem_dofs.astype(np.int64)]

    def ref(B1d, D, x, m):
        return mass_apply_unfused(*(a.astype(np.float64) for a in (B1d, D, x)), m, dim)
    return make, lambda B1d, D, x, m, **kw: smalltc.mass_apply(
        B1d, D, x, m, deterministic=deterministic, **kw), ref


def _diagonal(dim, p, nq):
    space = H1Space(box_mesh(dim, 2), p)

    def make(dtype):
        B1d, D = _rng(dtype, (nq, p + 1), (space.nelements,) + (nq,) * dim)
        return [B1d, D, space.elem_dofs.astype(np.int32)]

    def ref(B1d, D, m):
        return mass_diagonal_unfused(B1d.astype(np.float64), D.astype(np.float64), m,
                                     space.ndofs, dim)
    return make, lambda B1d, D, m, **kw: smalltc.mass_diagonal(B1d, D, m, space.ndofs,
                                                               **kw), ref


def _gemm(trans_a=False, trans_b=False, beta=0.0, shared_b=False):
    def make(dtype):
        a = (6, 3, 4) if trans_a else (6, 4, 3)
        b = (2, 3) if trans_b else (3, 2)
        return _rng(dtype, a, b if shared_b else (6,) + b, (6, 4, 2))

    def call(A, B, C, **kw):
        return smalltc.batched_gemm(A, B, C, alpha=1.5, beta=beta, trans_a=trans_a,
                                    trans_b=trans_b, **kw)
    return make, call, lambda A, B, C: oracle.gemm(A, B, C, 1.5, beta, trans_a, trans_b)


def _contract(kind, shapes, extents=None):
    def make(dtype):
        return _rng(dtype, *shapes)

    def call(X, Y, **kw):
        return smalltc.contract(kind, X, Y, extents=extents, **kw)

    def ref(X, Y):
        if extents is None:
            return oracle.contract(kind, X, Y)
        e = extents
        x = X.reshape((e["s"], e["i"]) if kind == "9" else (-1, e["i"], e["s"], e["j"]))
        return oracle.contract(kind, x, Y.reshape(-1, e["k"], e["s"], e["l"]))
    return make, call, ref


#: id -> (make(dtype) -> NumPy operands, call(*operands, out=, stream=), oracle)
CASES = {
    "action-1d": _action(1, 3, 5),
    "action-2d-ncomp": _action(2, 2, 4, ncomp=3),
    "action-3d": _action(3, 2, 3),
    "assembly-2d": (lambda dt: _rng(dt, (4, 3), (5, 4, 4)),
                    lambda B1d, D, **kw: smalltc.assemble_mass(B1d, D, **kw), oracle.assembly),
    "gemm": _gemm(),
    "gemm-beta-trans-shared": _gemm(trans_a=True, trans_b=True, beta=0.5, shared_b=True),
    "contract-8a": _contract("8a", [(3, 4, 2, 5), (3, 6, 2, 1)]),
    "contract-8b-extents": _contract("8b", [(4, 3, 3, 3), (3, 3)],
                                     dict(i=9, s=3, j=1, k=3, l=1)),
    "contract-9": _contract("9", [(3, 2), (4, 2, 3, 2)]),
    "mass_apply-2d": _fem(2, 2, 4),
    "mass_apply-3d-ncomp-det": _fem(3, 1, 3, ncomp=2, deterministic=True),
    "mass_diagonal-2d": _diagonal(2, 2, 4),
}

TOL = {"float64": 1e-12, "float32": 1e-5}


def rel_err(out, ref):
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
