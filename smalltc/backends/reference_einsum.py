"""The reference code of the contractions and the FEM operators, read through
:mod:`smalltc.backends.reference`: readable ``einsum`` chains for the batched
contractions, the mass action and matrices, the generalised operators (mass, diffusion,
Helmholtz; docs/math.md section 7), their unfused global forms (gather, element action,
scatter-add) and the corner force.

Works on NumPy and CuPy arrays alike. Not fast; exact semantics.
"""
from __future__ import annotations

import string

import numpy as np

from .._arrays import array_module

__all__ = ["action_einsum", "assembly_einsum", "contract_einsum", "operator_assembly_gemm",
           "mass_apply_unfused", "mass_diagonal_unfused", "operator_action_einsum",
           "operator_assembly_einsum", "operator_diagonal_einsum", "operator_apply_unfused",
           "operator_diagonal_unfused", "sym_index", "force_einsum", "force_t_einsum",
           "force_apply_unfused", "force_t_apply_unfused", "GEMM_ASSEMBLY_MAX_ND"]


def _xp(x):
    return array_module(x)


def action_einsum(B1d, D, V, dim):
    """``U = B^T D B V`` as a sum-factorised einsum chain (``...`` = batch, comp)."""
    xp = _xp(V)
    comp = V.ndim - 1 - dim  # 0 or 1
    t = V
    # B applied along each of the last dim axes (interpolate to quadrature points)
    for ax in range(dim):
        t = _apply_axis(xp, B1d, t, V.ndim - dim + ax, transpose=False)
    t = t * (D[:, None] if comp else D)
    for ax in range(dim):
        t = _apply_axis(xp, B1d, t, V.ndim - dim + ax, transpose=True)
    return t


def _apply_axis(xp, B1d, t, axis, transpose):
    letters = string.ascii_lowercase[:t.ndim]
    src = letters[axis]
    new = "z"
    b = (new + src) if not transpose else (src + new)   # B[k, j] or B^T: B[k, i]
    out = letters[:axis] + new + letters[axis + 1:]
    return xp.einsum(f"{b},{letters}->{out}", B1d, t)


def assembly_einsum(B1d, D, dim):
    """``M_e = B^T D_e B``, flattened in C order."""
    xp = _xp(D)
    E, nq = D.shape[0], B1d.shape[0]
    nd = B1d.shape[1]
    ks, i_s, js = "abc"[:dim], "ikm"[:dim], "jln"[:dim]
    terms = [f"{k}{i}" for k, i in zip(ks, i_s)] + [f"{k}{j}" for k, j in zip(ks, js)]
    expr = ",".join(terms) + f",e{ks}->e{i_s}{js}"
    M = xp.einsum(expr, *([B1d] * (2 * dim)), D, optimize=True)
    return M.reshape(E, nd ** dim, nd ** dim)


def contract_einsum(kind, X, Y):
    """Kernels (8a), (8b), (9); a 2D/3D operand without batch axis is shared."""
    xp = _xp(Y)
    if kind == "9":
        return xp.einsum("si,sj,...ksl->...kilj", X, X, Y, optimize=True)
    out = "...ijkl" if kind == "8a" else "...iklj"
    return xp.einsum(f"...isj,...ksl->{out}", X, Y)


def _scatter_add(xp, emap, v, ndofs):
    """``y[c, d] = sum of v[e, c, i] over the (e, i) with emap[e, i] == d``, float64 sums
    (``bincount``) whatever ``v``'s dtype, so the oracle's own rounding stays small. On
    the host (NumPy's ``bincount`` adds in a fixed order: the same bits every run; CuPy's
    uses atomics, so CuPy arrays are summed on the host and copied back)."""
    to_host = (lambda a: a.get()) if xp.__name__ == "cupy" else (lambda a: a)
    flat = to_host(emap.reshape(-1))
    out = np.empty((v.shape[1], ndofs), dtype=v.dtype)
    for c in range(v.shape[1]):
        w = to_host(v[:, c].reshape(-1)).astype(np.float64)
        out[c] = np.bincount(flat, weights=w, minlength=ndofs).astype(v.dtype)
    return xp.asarray(out)


def _apply_unfused(action, x, elem_dofs):
    """``y = sum_e R_e^T action(R_e x)``: gather (fancy indexing), ``action`` on the element
    vectors ``(E, ncomp, nd, ...)``, scatter-add (``bincount``). ``x`` is ``(ndofs,)`` or
    ``(ncomp, ndofs)``."""
    xp = _xp(x)
    ndofs = x.shape[-1]
    xc = x.reshape(-1, ndofs)
    E = elem_dofs.shape[0]
    V = xp.moveaxis(xc[:, elem_dofs], 0, 1)                # (E, ncomp, nd, ...)
    U = action(V).reshape(E, xc.shape[0], -1)
    return _scatter_add(xp, elem_dofs.reshape(E, -1), U, ndofs).reshape(x.shape)


def _scatter_diagonal(xp, elem_dofs, t, ndofs):
    """``sum_e R_e^T t_e``: the element diagonals ``t`` ``(E, nd, ...)`` added into a
    vector of ``ndofs``."""
    E = elem_dofs.shape[0]
    return _scatter_add(xp, elem_dofs.reshape(E, -1), t.reshape(E, 1, -1), ndofs)[0]


def mass_apply_unfused(B1d, D, x, elem_dofs, dim):
    """``y = sum_e R_e^T B^T D_e B R_e x``: gather (fancy indexing), the einsum chain,
    scatter-add (``bincount``). ``x`` is ``(ndofs,)`` or ``(ncomp, ndofs)``."""
    return _apply_unfused(lambda V: action_einsum(B1d, D, V, dim), x, elem_dofs)


def mass_diagonal_unfused(B1d, D, elem_dofs, ndofs, dim):
    """The global mass matrix's diagonal: ``sum_k prod_a B[k_a, i_a]^2 D_e[k]`` per element
    entry (the transposed half of the action with B squared), scatter-added."""
    xp = _xp(D)
    t = D
    for ax in range(dim):
        t = _apply_axis(xp, B1d * B1d, t, 1 + ax, transpose=True)
    return _scatter_diagonal(xp, elem_dofs, t, ndofs)


# --- the generalised operators (docs/math.md section 7) -----------------------------------

def sym_index(dim):
    """``idx[a][b]``: the packed entry of ``Q^{ab}`` (upper triangle, row by row).

    >>> sym_index(3)
    [[0, 1, 2], [1, 3, 4], [2, 4, 5]]
    """
    idx = [[0] * dim for _ in range(dim)]
    c = 0
    for a in range(dim):
        for b in range(a, dim):
            idx[a][b] = idx[b][a] = c
            c += 1
    return idx


def _per_axis(xp, mats, t, first_axis, transpose):
    """Apply ``mats[d]`` (or its transpose) along axis ``first_axis + d``; ``None`` is the
    identity (the collocated B1d)."""
    for d, m in enumerate(mats):
        if m is not None:
            t = _apply_axis(xp, m, t, first_axis + d, transpose)
    return t


def _expand(data, comp):
    return data[:, None] if comp else data


def operator_action_einsum(qfunc, B1d, G1d, D, Q, V, dim):
    """The element action of ``qfunc`` as einsum chains, one per reference gradient
    (``...`` = batch, component): ``sum_ab G_a^T (Q^ab G_b V)`` for diffusion, plus
    ``B^T D B V`` for Helmholtz; ``B1d=None`` is the identity (collocated)."""
    xp = _xp(V)
    if qfunc == "mass":
        return action_einsum(B1d, D, V, dim)
    comp = V.ndim - 1 - dim
    first = V.ndim - dim
    basis = [B1d] * dim
    grads = [_per_axis(xp, [G1d if d == a else B1d for d in range(dim)], V, first, False)
             for a in range(dim)]
    idx = sym_index(dim)
    U = None
    for a in range(dim):
        h = sum(_expand(Q[:, idx[a][b]], comp) * grads[b] for b in range(dim))
        t = _per_axis(xp, [G1d if d == a else B1d for d in range(dim)], h, first, True)
        U = t if U is None else U + t
    if qfunc == "helmholtz":
        mass = _expand(D, comp) * _per_axis(xp, basis, V, first, False)
        U = U + _per_axis(xp, basis, mass, first, True)
    return U


def _eye_if_none(xp, B1d, G1d):
    return xp.eye(G1d.shape[1], dtype=G1d.dtype) if B1d is None else B1d


def operator_diagonal_einsum(qfunc, B1d, G1d, D, Q, dim):
    """The element matrices' diagonals ``(E, nd, ..., nd)``: for each pair (a, b) the
    transposed half of the action with the products of the per-axis 1D matrices."""
    xp = _xp(Q if Q is not None else D)
    B = _eye_if_none(xp, B1d, G1d) if qfunc != "mass" else B1d
    out = None
    if qfunc in ("diffusion", "helmholtz"):
        idx = sym_index(dim)
        for a in range(dim):
            for b in range(dim):
                mats = [(G1d if d == a else B) * (G1d if d == b else B) for d in range(dim)]
                t = _per_axis(xp, mats, Q[:, idx[a][b]], 1, True)
                out = t if out is None else out + t
    if qfunc in ("mass", "helmholtz"):
        t = _per_axis(xp, [B * B] * dim, D, 1, True)
        out = t if out is None else out + t
    return out


def operator_assembly_einsum(qfunc, B1d, G1d, D, Q, dim):
    """Element matrices ``(E, nd**dim, nd**dim)``, C-order multi-indices: one einsum per
    pair (a, b) with left 1D matrices ``G`` on axis a and right ``G`` on axis b."""
    xp = _xp(Q if Q is not None else D)
    if qfunc == "mass":
        return assembly_einsum(B1d, D, dim)
    B = _eye_if_none(xp, B1d, G1d)
    E, nd = Q.shape[0], G1d.shape[1]
    ks, i_s, js = "abc"[:dim], "ikm"[:dim], "jln"[:dim]
    expr = ",".join([f"{k}{i}" for k, i in zip(ks, i_s)] + [f"{k}{j}" for k, j in zip(ks, js)])
    expr += f",e{ks}->e{i_s}{js}"
    idx = sym_index(dim)
    K = None
    for a in range(dim):
        for b in range(dim):
            mats = ([G1d if d == a else B for d in range(dim)]
                    + [G1d if d == b else B for d in range(dim)])
            t = xp.einsum(expr, *mats, Q[:, idx[a][b]], optimize=True)
            K = t if K is None else K + t
    if qfunc == "helmholtz":
        K = K + xp.einsum(expr, *([B] * (2 * dim)), D, optimize=True)
    return K.reshape(E, nd ** dim, nd ** dim)


#: the dense assembly (:func:`operator_assembly_gemm`) runs up to this many entries per
#: element row (nd^dim: 3D p <= 2, 2D p <= 4); beyond, its GEMM (``nd^2dim`` columns)
#: outgrows the einsum chains
GEMM_ASSEMBLY_MAX_ND = 27


def operator_assembly_gemm(qfunc, B1d, G1d, D, Q, dim):
    """Element matrices as :func:`operator_assembly_einsum`, as one GEMM of the packed
    quadrature data with the products of dense gradients: with ``G_a`` the Kronecker
    products (``nq^dim x nd^dim``; ``G1d`` on axis a, ``B1d`` on the others),
    ``P_c[k, i, j] = G_a[k, i] G_b[k, j]`` (plus its transpose for a != b) for the packed
    pair ``c = (a, b)``, and ``K_e = sum_{c, k} Q_e[c, k] P_c[k]``: ``Q`` reshaped to
    ``(E, nsym nq^dim)`` times ``P`` ``(nsym nq^dim, nd^2dim)``, written straight into
    the ``(E, nd^dim, nd^dim)`` result (Helmholtz: a second GEMM of ``D`` with the
    products of ``B``). ``2 nsym nq^dim nd^2dim`` flops per element: for low orders (the
    p = 1 matrices of a p-multigrid), where the einsum chains are many small
    contractions; NumPy or CuPy (a cuBLAS GEMM).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> B, G, Q = rng.random((3, 2)), rng.random((3, 2)), rng.random((4, 6, 3, 3, 3))
    >>> K = operator_assembly_gemm("diffusion", B, G, None, Q, 3)
    >>> K.shape, bool(np.allclose(K, operator_assembly_einsum("diffusion", B, G, None, Q, 3)))
    ((4, 8, 8), True)
    """
    xp = _xp(Q)
    B = _eye_if_none(xp, B1d, G1d)
    E, (nq, nd) = Q.shape[0], G1d.shape
    K, N = nq ** dim, nd ** dim

    def kron(mats):
        out = mats[0]
        for m in mats[1:]:
            out = xp.kron(out, m)
        return out
    grads = [kron([G1d if d == a else B for d in range(dim)]) for a in range(dim)]
    pairs = [(a, b) for a in range(dim) for b in range(a, dim)]       # the packing order
    P = xp.empty((len(pairs), K, N, N), dtype=Q.dtype)
    for c, (a, b) in enumerate(pairs):
        P[c] = grads[a][:, :, None] * grads[b][:, None, :]
        if a != b:
            P[c] += grads[b][:, :, None] * grads[a][:, None, :]
    out = xp.matmul(Q.reshape(E, len(pairs) * K), P.reshape(-1, N * N))
    if qfunc == "helmholtz":
        Ball = kron([B] * dim)
        out += xp.matmul(D.reshape(E, K), (Ball[:, :, None] * Ball[:, None, :]).reshape(K, -1))
    return out.reshape(E, N, N)


def operator_apply_unfused(qfunc, B1d, G1d, D, Q, x, elem_dofs, dim):
    """``y = sum_e R_e^T A_e R_e x`` for the element action of ``qfunc``: gather, the
    einsum chains, scatter-add (as :func:`mass_apply_unfused`)."""
    return _apply_unfused(lambda V: operator_action_einsum(qfunc, B1d, G1d, D, Q, V, dim), x,
                          elem_dofs)


def operator_diagonal_unfused(qfunc, B1d, G1d, D, Q, elem_dofs, ndofs, dim):
    """The global matrix's diagonal for ``qfunc``, scatter-added."""
    t = operator_diagonal_einsum(qfunc, B1d, G1d, D, Q, dim)
    return _scatter_diagonal(_xp(elem_dofs), elem_dofs, t, ndofs)


# --- the corner force (mixed spaces H1^d and L2; docs/math.md section 7) -------------------

def _grad_mats(B1d, G1d, dim, a):
    return [G1d if d == a else B1d for d in range(dim)]


def force_einsum(B_l2, B1d, G1d, A, e, dim):
    """``(F e)_c = sum_a G_a^T (A[c, a] * (B_L2 e))``: ``e`` (E, p, ..., p) -> (E, dim,
    p+1, ..., p+1), einsum chains (the L2 field interpolated once, one chain per (c, a))."""
    xp = _xp(e)
    u = _per_axis(xp, [B_l2] * dim, e, 1, False)
    comps = []
    for c in range(dim):
        U = None
        for a in range(dim):
            t = _per_axis(xp, _grad_mats(B1d, G1d, dim, a), A[:, c, a] * u, 1, True)
            U = t if U is None else U + t
        comps.append(U)
    return xp.stack(comps, axis=1)


def force_t_einsum(B_l2, B1d, G1d, A, w, dim):
    """``F^T w = B_L2^T (sum_{c,a} A[c, a] * (G_a w_c))``: ``w`` (E, dim, p+1, ...) ->
    (E, p, ..., p), einsum chains (one reference gradient per (c, a))."""
    xp = _xp(w)
    s = None
    for c in range(dim):
        for a in range(dim):
            t = A[:, c, a] * _per_axis(xp, _grad_mats(B1d, G1d, dim, a), w[:, c], 1, False)
            s = t if s is None else s + t
    return _per_axis(xp, [B_l2] * dim, s, 1, True)


def force_apply_unfused(B_l2, B1d, G1d, A, e, elem_dofs, ndofs, dim):
    """``y = sum_e R_e^T (F e)_e``, ``y`` (dim, ndofs): the element force, scatter-added."""
    xp = _xp(e)
    E = e.shape[0]
    U = force_einsum(B_l2, B1d, G1d, A, e, dim).reshape(E, dim, -1)
    return _scatter_add(xp, elem_dofs.reshape(E, -1), U, ndofs)


def force_t_apply_unfused(B_l2, B1d, G1d, A, w, elem_dofs, dim):
    """``F^T (R_e w)`` per element, ``w`` (dim, ndofs) gathered through ``elem_dofs``."""
    xp = _xp(w)
    W = xp.moveaxis(w[:, elem_dofs], 0, 1)                  # (E, dim, p+1, ...)
    return force_t_einsum(B_l2, B1d, G1d, A, W, dim)
