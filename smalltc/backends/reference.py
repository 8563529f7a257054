"""The reference backend: readable ``einsum`` code, the oracle of every test.

Works on NumPy and CuPy arrays alike (the CuPy form is the "einsum chain"
baseline a Python user would write today). Not fast; exact semantics.

The einsum code of the contractions and the FEM operators is in
``smalltc.backends.reference_einsum``, that of the solver kernels in
``smalltc.backends.reference_solvers``; both are read from here too. Here: the general
sum-factorised paths (mixed spaces, the basis application, the pointwise geometry), the
paths each spec runs and the backend.
"""
from __future__ import annotations

import functools

import numpy as np

from . import register
from ..maps import check_range
from ..spec import SOLVER_OPS
from ..vertices import point_data
from .base import Backend, Executor, Unsupported
from .reference_einsum import (GEMM_ASSEMBLY_MAX_ND, _xp, action_einsum, assembly_einsum,
                               contract_einsum, force_apply_unfused, force_einsum,
                               force_t_apply_unfused, force_t_einsum, mass_apply_unfused,
                               mass_diagonal_unfused, operator_action_einsum,
                               operator_apply_unfused, operator_assembly_einsum,
                               operator_assembly_gemm, operator_diagonal_einsum,
                               operator_diagonal_unfused, sym_index)
from .reference_solvers import (csr_spmv_ref, pcg_ref, schwarz_ref, solver_executor,
                                transfer_ref, vector_update_ref)

__all__ = ["ReferenceBackend", "action_einsum", "assembly_einsum", "contract_einsum",
           "operator_assembly_gemm",
           "mass_apply_unfused", "mass_diagonal_unfused", "operator_action_einsum",
           "operator_assembly_einsum", "operator_diagonal_einsum", "operator_apply_unfused",
           "operator_diagonal_unfused", "sym_index", "einsum_executor", "force_einsum",
           "force_t_einsum", "force_apply_unfused", "force_t_apply_unfused",
           "mixed_action_sumfac", "mixed_apply_unfused", "basis_apply_unfused",
           "cofactors", "geometry_closed_form", "vector_update_ref", "pcg_ref", "transfer_ref",
           "csr_spmv_ref", "schwarz_ref", "solver_executor"]


# --- the general operator of mixed spaces (docs/math.md section 7) ---------------------------
#
# Layouts: an element tensor (E ncomp, j1, ..., jd) is contracted along its *last* axis by one
# GEMM, the new axis first (``M @ t.reshape(-1, n).T``), so after the d axes the values at the
# points lie as (k1, ..., kd, E ncomp) with no transposition; the transposed contractions take
# the *first* axis, the new one last (``t.reshape(n, -1).T @ M``), and bring (k1, ..., kd, E
# ncomp) back to (E ncomp, i1, ..., id). Each is one BLAS (cuBLAS) call on a block of elements.

def _last_axis(M, t):
    """``out[m, rest] = sum_n M[m, n] t[rest, n]``: the last axis of ``t`` contracted, the
    new axis first (one GEMM; a transposed operand, no copy)."""
    n = t.shape[-1]
    return (M @ t.reshape(-1, n).T).reshape((M.shape[0],) + t.shape[:-1])


def _first_axis(M, t):
    """``out[rest, i] = sum_k M[k, i] t[k, rest]``: the first axis of ``t`` contracted with
    ``M`` (M^T applied), the new axis last (one GEMM)."""
    k = t.shape[0]
    return (t.reshape(k, -1).T @ M).reshape(t.shape[1:] + (M.shape[1],))


def _patterns(evals, dim):
    """Per evaluation (-1 the value, a the derivative along axis a) the 1D matrix on each
    axis: "B" or "G"."""
    return [tuple("G" if d == a else "B" for d in range(dim)) for a in evals]


def mixed_interp(B, G, V, dim, evals):
    """The evaluations ``evals`` of element tensors ``V`` (N, nd, ..., nd) at the points:
    a list of (nq, ..., nq, N) arrays, sum-factorised with shared partial sums (the last
    axis first; evaluations that agree on axes a..d share the contractions there)."""
    mats = {"B": B, "G": G}
    pats = _patterns(evals, dim)
    nodes = {(): V}
    for a in range(dim - 1, -1, -1):             # suffixes of length dim - a
        for pat in pats:
            key = pat[a:]
            if key not in nodes:
                nodes[key] = _last_axis(mats[pat[a]], nodes[key[1:]])
    return [nodes[p] for p in pats]


def mixed_interp_t(B, G, H, dim, evals):
    """The transpose of :func:`mixed_interp`: ``sum_j E_j^T H[j]`` for ``H[j]`` (nq, ...,
    nq, N), as (N, nd, ..., nd); terms whose remaining 1D matrices agree are added before
    they are contracted further (the first axis first)."""
    mats = {"B": B, "G": G}
    terms = {}
    for pat, h in zip(_patterns(evals, dim), H):
        terms[pat] = h if pat not in terms else terms[pat] + h
    for a in range(dim):
        nxt = {}
        for pat, t in terms.items():
            r = _first_axis(mats[pat[0]], t)
            nxt[pat[1:]] = r if pat[1:] not in nxt else nxt[pat[1:]] + r
        terms = nxt
    return terms[()]


#: the general path runs blocks of elements whose intermediates hold about this many
#: values each: on the host they stay in the caches and reuse their memory (2^15, measured
#: best of 2^13..2^18 at 3D p = 4 on a 2-core EPYC: 12x faster than one block of 2,000); on a
#: GPU, blocks of up to 2^24 values (few launches, bounded workspace)
MIXED_BLOCK_VALUES = {"numpy": 1 << 15, "cupy": 1 << 24}


def mixed_action_sumfac(B_in, G_in, B_out, G_out, Q, V, dim, evals_in, evals_out, ncomp_out,
                        out=None):
    """``U = E_out^T (Q . E_in V)`` per element: ``V`` (E, [ncomp_in,] nd_in, ...) to ``U``
    (E, ncomp_out, nd_out, ...), written into ``out`` when given. The input evaluations at
    the points (:func:`mixed_interp`), ``H[e, r, k] = sum_s Q[e, r, s, k] X[e, s, k]`` over
    the slots (component-major: ``s = c * len(evals_in) + j``), the transposed output
    evaluations (:func:`mixed_interp_t`); by blocks of elements
    (:data:`MIXED_BLOCK_VALUES`)."""
    xp = _xp(V)
    E, R, S = Q.shape[:3]
    nq, nd_in, nd_out = B_in.shape[0], B_in.shape[1], B_out.shape[1]
    K = nq ** dim
    if out is None:
        out = xp.empty((E, ncomp_out) + (nd_out,) * dim, dtype=V.dtype)
    U = out.reshape(E, ncomp_out * nd_out ** dim)
    V = V.reshape(E, -1) if E else V
    Qf = Q.reshape(E, R, S, K)
    nin, nout = S // len(evals_in), len(evals_out)
    step = max(1, MIXED_BLOCK_VALUES.get(xp.__name__, 1 << 24) // (K * max(R, S, 1)))
    for e0 in range(0, E, step):
        e1 = min(E, e0 + step)
        n = e1 - e0
        t = V[e0:e1].reshape((n * nin,) + (nd_in,) * dim)
        X = mixed_interp(B_in, G_in, t, dim, evals_in)          # each (k..., n nin)
        # slots component-major: (K, n, nin, nj) -> (n, S, K)
        X = xp.stack([x.reshape(K, n, nin) for x in X], axis=-1).reshape(K, n, S)
        X = xp.ascontiguousarray(X.transpose(1, 2, 0))
        H = xp.einsum("ersk,esk->erk", Qf[e0:e1], X)            # (n, R, K)
        H = H.reshape(n, ncomp_out, nout, K).transpose(2, 3, 0, 1)   # (nout, K, n, ncomp)
        H = [h.reshape((nq,) * dim + (n * ncomp_out,)) for h in H]
        U[e0:e1] = mixed_interp_t(B_out, G_out, H, dim, evals_out).reshape(n, -1)
    return out


def mixed_apply_unfused(spec, *operands, out=None):
    """The operator of a :class:`smalltc.spec.MixedSpec` on its operands (``spec.inputs``'
    order): the input gathered through ``elem_dofs_in`` (or taken as element vectors), the
    action (:func:`mixed_action_sumfac`), the result added into the global ``y`` through
    ``elem_dofs_out`` (or returned per element). Each map's range is checked on every call,
    before it is used (an index outside the vector raises ``ValueError`` naming the map)."""
    a = dict(zip((o.name for o in spec.inputs), operands))
    dim = spec.dim
    for side, vec in (("in", "x"), ("out", "y")):
        if getattr(spec, f"ndofs_{side}") is not None:
            check_range(a[f"elem_dofs_{side}"], getattr(spec, f"ndofs_{side}"),
                        name=f"elem_dofs_{side}", vector=vec)
    if spec.ndofs_in is None:
        V = a["V"]
    else:
        m = a["elem_dofs_in"]
        x = a["x"].reshape(-1, spec.ndofs_in)
        V = _xp(x).moveaxis(x[:, m], 0, 1)                 # (E, ncomp_in, nd_in, ...)
    args = (a["B_in"], a.get("G_in"), a["B_out"], a.get("G_out"), a["Q"], V, dim,
            spec.evals("in"), spec.evals("out"), spec.ncomp_out)
    if spec.ndofs_out is None:
        return mixed_action_sumfac(*args, out=out)
    U = mixed_action_sumfac(*args)
    m = a["elem_dofs_out"]
    xp, E, flat = _xp(U), spec.batch, m.reshape(-1)
    U = U.reshape(E, spec.ncomp_out, spec.nd_out ** spec.dim)
    if out is None:
        out = xp.empty(spec.out_shape, dtype=U.dtype)
    y = out.reshape(spec.ncomp_out, spec.ndofs_out)
    # float64 sums per component (bincount: a fixed order on the host, atomics on a GPU)
    for c in range(spec.ncomp_out):
        y[c] = xp.bincount(flat, weights=U[:, c].reshape(-1), minlength=spec.ndofs_out)
    return out


def _mixed_path(spec):
    """(kernel text, function of the operands) for a :class:`smalltc.spec.MixedSpec`."""
    sides = ("gather, " if spec.ndofs_in is not None else "") + \
        "one-axis GEMMs (sum-factorised, shared partial sums), Q per point (einsum), " + \
        "transposed one-axis GEMMs" + (", scatter-add" if spec.ndofs_out is not None else "")
    return f"mixed: {sides}", _Into(mixed_apply_unfused, spec)


# --- the basis application: evaluation at the points and its transpose --------------------

def basis_apply_unfused(spec, *operands, out=None):
    """The basis application of a :class:`smalltc.spec.BasisSpec` on its operands
    (``spec.inputs``' order), sum-factorised one-axis GEMMs by blocks of elements
    (:func:`mixed_interp`, :func:`mixed_interp_t`): the field gathered through
    ``elem_dofs`` (or element vectors) evaluated at the points, or (``transpose``) the
    point values integrated against the basis and summed into the global vector through
    ``elem_dofs`` (float64 sums per DoF), or returned per element. The map's range is
    checked on every call."""
    a = dict(zip((o.name for o in spec.inputs), operands))
    xp = _xp(operands[-1])
    dim, nq, nd, E, nc = spec.dim, spec.nq, spec.nd, spec.batch, spec.ncomp
    S, K, N = spec.nslots, nq ** dim, nd ** dim
    B, G, evals = a["B1d"], a.get("G1d"), spec.evals()
    if spec.ndofs is not None:
        check_range(a["elem_dofs"], spec.ndofs)
    if out is None:
        out = xp.empty(spec.out_shape, dtype=spec.dtype)
    step = max(1, MIXED_BLOCK_VALUES.get(xp.__name__, 1 << 24) // (max(K, N) * nc * S))
    if not spec.transpose:
        if spec.ndofs is None:
            V = a["V"].reshape(E * nc, N)
        else:
            x = a["x"].reshape(nc, spec.ndofs)
            V = xp.moveaxis(x[:, a["elem_dofs"].reshape(E, N)], 0, 1).reshape(E * nc, N)
        H = out.reshape(E, nc, S, K)
        for e0 in range(0, E, step):
            e1 = min(E, e0 + step)
            t = V[e0 * nc:e1 * nc].reshape((-1,) + (nd,) * dim)
            X = mixed_interp(B, G, t, dim, evals)              # each (k..., n nc)
            H[e0:e1] = xp.stack([x.reshape(K, e1 - e0, nc) for x in X], axis=0) \
                .transpose(2, 3, 0, 1)
        return out
    Hf = a["H"].reshape(E, nc, S, K)
    glob = spec.ndofs is not None
    U = xp.empty((E, nc, N), dtype=spec.dtype) if glob else out.reshape(E, nc, N)
    for e0 in range(0, E, step):
        e1 = min(E, e0 + step)
        h = Hf[e0:e1].transpose(2, 3, 0, 1)                    # (S, K, n, nc)
        Hs = [h[j].reshape((nq,) * dim + ((e1 - e0) * nc,)) for j in range(S)]
        U[e0:e1] = mixed_interp_t(B, G, Hs, dim, evals).reshape(e1 - e0, nc, N)
    if glob:
        y = out.reshape(nc, spec.ndofs)
        flat = a["elem_dofs"].reshape(-1)
        for c in range(nc):
            y[c] = xp.bincount(flat, weights=U[:, c].reshape(-1).astype(np.float64),
                               minlength=spec.ndofs)
    return out


def _basis_path(spec):
    """(kernel text, function of the operands) for a :class:`smalltc.spec.BasisSpec`."""
    if spec.transpose:
        what = "transposed one-axis GEMMs (sum-factorised)" + (
            ", scatter-add" if spec.ndofs is not None else "")
    else:
        what = ("gather, " if spec.ndofs is not None else "") + \
            "one-axis GEMMs (sum-factorised, shared partial sums)"
    return f"basis ({spec.what}): {what}", _Into(basis_apply_unfused, spec)


# --- the pointwise geometry: |J|, adj J, D and Q in closed form ----------------------------

def cofactors(dim):
    """``adj[a][i]`` (the cofactor of ``J[i][a]``, ``J adj(J) = |J| I``) as products of
    entries of ``J``: ``((r0, c0), (r1, c1), (r2, c2), (r3, c3))`` for ``J[r0][c0] J[r1][c1]
    - J[r2][c2] J[r3][c3]`` (3D), ``((r, c), sign)`` for ``sign J[r][c]`` (2D; ``sign``
    -1 written ``0 - J[r][c]``, a zero entry +0), ``None`` for the 1 of 1D. The order of
    every kernel and of the oracle.

    >>> cofactors(2)[0][1]
    ((0, 1), -1)
    >>> cofactors(3)[1][0]          # adj[1][0] = J[1][2] J[2][0] - J[1][0] J[2][2]
    ((1, 2), (2, 0), (1, 0), (2, 2))
    """
    if dim == 1:
        return [[None]]
    if dim == 2:
        return [[((1, 1), 1), ((0, 1), -1)], [((1, 0), -1), ((0, 0), 1)]]
    out = [[None] * 3 for _ in range(3)]
    for i in range(3):
        r = [k for k in range(3) if k != i]
        for a in range(3):
            c = [k for k in range(3) if k != a]
            t, u = ((r[0], c[0]), (r[1], c[1])), ((r[0], c[1]), (r[1], c[0]))
            out[a][i] = t + u if (a + i) % 2 == 0 else u + t
    return out


def _adj_closed_form(xp, j, dim):
    """``adj[a][i]`` of the entries ``j[r][c]`` (arrays), :func:`cofactors`' formulas."""
    table = cofactors(dim)
    if dim == 1:
        return [[xp.ones_like(j[0][0])]]
    if dim == 2:
        return [[j[r][c] if s > 0 else 0.0 - j[r][c] for (r, c), s in row] for row in table]
    return [[j[p[0]][p[1]] * j[q[0]][q[1]] - j[u[0]][u[1]] * j[v[0]][v[1]]
             for p, q, u, v in row] for row in table]


def geometry_closed_form(spec, *operands, out=None):
    """The pointwise geometry of a :class:`smalltc.spec.GeometrySpec` on its operands
    (``spec.inputs``' order), elementwise on the whole batch in float64: ``|J|`` by the
    first row's cofactors, ``adj J`` by :func:`cofactors`, ``D = |J| w c``, ``Q = (w c /
    |J|) sum_i adj[a][i] adj[b][i]`` (packed upper triangle), each element's smallest
    ``|J|`` into ``jmin`` (NaN where one is NaN); the outputs rounded once to their dtype.
    NumPy or CuPy; the oracle of the kernels and their fallback."""
    a = dict(zip((o.name for o in spec.inputs), operands))
    J, jmin = a["J"], a["jmin"]
    xp = _xp(J)
    dim, E, K = spec.dim, spec.batch, spec.nq ** spec.dim
    if out is None:
        out = xp.empty(spec.out_shape, dtype=spec.dtype)
    if E == 0:
        return out
    Jf = J.reshape(E, dim, dim, K).astype(np.float64, copy=False)
    j = [[Jf[:, r, c] for c in range(dim)] for r in range(dim)]
    adj = _adj_closed_form(xp, j, dim)
    det = j[0][0] * adj[0][0]
    for c in range(1, dim):
        det = det + j[0][c] * adj[c][0]
    jmin[...] = det.min(axis=1)                     # NaN propagates
    res = out.reshape(E, spec.nslots, K)
    if spec.what in ("det", "adjugate", "inverse"):
        res[:, 0] = det
        for r in range(dim if spec.what != "det" else 0):
            for c in range(dim):
                res[:, 1 + r * dim + c] = adj[r][c] if spec.what == "adjugate" else \
                    adj[r][c] / det
        return out
    scale = a["weights"].reshape(1, K) * (a["coef"].reshape(E, K).astype(np.float64, copy=False)
                               if spec.coef else 1.0)
    d = xp.abs(det) if spec.absdet else det
    slot = 0
    if spec.what in ("mass", "both"):
        res[:, 0] = d * scale
        slot = 1
    if spec.what in ("diffusion", "both"):
        s = scale / d
        for r in range(dim):
            for c in range(r, dim):
                acc = adj[r][0] * adj[c][0]
                for i in range(1, dim):
                    acc = acc + adj[r][i] * adj[c][i]
                res[:, slot] = acc * s
                slot += 1
    return out


def _pointwise_geometry_path(spec):
    """(kernel text, function of the operands) for a :class:`smalltc.spec.GeometrySpec`."""
    return (f"geometry ({spec.what}): closed-form |J| and adjugate, elementwise passes",
            _Into(geometry_closed_form, spec))


def _force_path(spec):
    """(kernel text, function of the operands) for a corner-force ``spec``."""
    dim, t = spec.dim, spec.qfunc == "force_t"
    if spec.op == "action":
        def fn(L, B, G, A, f):
            return (force_t_einsum if t else force_einsum)(L, B, G, A, f, dim)
        kernel = "einsum chains (sum-factorised, one per (c, a))"
    elif t:
        def fn(L, B, G, A, w, m):
            return force_t_apply_unfused(L, B, G, A, w, m, dim)
        kernel = "gather, einsum chains (unfused)"
    else:
        def fn(L, B, G, A, e, m):
            return force_apply_unfused(L, B, G, A, e, m, spec.ndofs, dim)
        kernel = "einsum chains, scatter-add (unfused)"
    return f"{spec.qfunc}: {kernel}", fn


def _operator_path(spec):
    """(kernel text, function of the operands) for a non-mass ``spec``."""
    if spec.qfunc in ("force", "force_t"):
        return _force_path(spec)
    if spec.qfunc == "mixed":
        return _mixed_path(spec)
    if spec.qfunc == "basis":
        return _basis_path(spec)
    if spec.qfunc == "geometry":
        return _pointwise_geometry_path(spec)
    names = [o.name for o in spec.inputs]
    q, dim = spec.qfunc, spec.dim

    def parts(operands):
        a = dict(zip(names, operands))
        return a, (a.get("B1d"), a["G1d"], a.get("D"), a.get("Q"))

    if spec.op == "action":
        def fn(*ops):
            a, b = parts(ops)
            return operator_action_einsum(q, *b, a["V"], dim)
        kernel = "einsum chains (sum-factorised, one per gradient)"
    elif spec.op == "assembly":
        def fn(*ops):
            return operator_assembly_einsum(q, *parts(ops)[1], dim)
        kernel = "einsum (optimize=True), one per (a, b)"
    elif spec.op == "mass_apply":
        def fn(*ops):
            a, b = parts(ops)
            return operator_apply_unfused(q, *b, a["x"], a["elem_dofs"], dim)
        kernel = "gather, einsum chains, scatter-add (unfused)"
    else:
        def fn(*ops):
            a, b = parts(ops)
            return operator_diagonal_unfused(q, *b, a["elem_dofs"], spec.ndofs, dim)
        kernel = "einsum with products of 1D matrices, scatter-add (unfused)"
    co = ", collocated" if spec.collocated else ""
    return f"{q}: {kernel}{co}", fn


def _geometry_path(spec):
    """(kernel text, function of the operands) for a spec whose point data come from the
    element vertices (``geometry="vertices"``, docs/math.md section 8): D or Q computed
    by :func:`smalltc.vertices.point_data`, then the stored-data path."""
    names = [o.name for o in spec.inputs]
    q, dim = spec.qfunc, spec.dim

    def fn(*ops):
        a = dict(zip(names, ops))
        data = point_data(q, a["X"], a["coef"], spec.nq, spec.collocated)
        D, Q = (data, None) if q == "mass" else (None, data)
        if spec.op == "action":
            return operator_action_einsum(q, a.get("B1d"), a.get("G1d"), D, Q, a["V"], dim)
        return operator_apply_unfused(q, a.get("B1d"), a.get("G1d"), D, Q, a["x"],
                                      a["elem_dofs"], dim)
    what = "einsum chains" if spec.op == "action" else "gather, einsum chains, scatter-add"
    return f"{q}: point data from the vertices (einsum), {what}", fn


class _Into(functools.partial):
    """A path that writes its result into the ``out=`` it is given (no copy)."""


class _Run(Executor):
    def __init__(self, kernel, fn):
        self.kernel, self._fn = kernel, fn

    def run(self, operands, out, **scalars):
        if isinstance(self._fn, _Into):
            self._fn(*operands, out=out, **scalars)
            return
        res = self._fn(*operands, **scalars)
        out[...] = res.reshape(out.shape)


def _gemm(spec, A, B, C=None, alpha=1.0, beta=0.0):
    xp = _xp(A)
    a = xp.swapaxes(A, -1, -2) if spec.trans_a else A
    b = xp.swapaxes(B, -1, -2) if spec.trans_b else B
    r = xp.matmul(a, b)
    if alpha != 1.0:
        r = r * alpha
    if not spec.beta_zero:
        r = r + beta * C
    return xp.broadcast_to(r, spec.out_shape)


#: op -> (what runs, formatted with the spec; the result of (spec, *operands, **scalars))
_PATHS = {
    "action": ("einsum chain (sum-factorised)",
               lambda spec, B, D, V: action_einsum(B, D, V, spec.dim)),
    "assembly": ("einsum (optimize=True)", lambda spec, B, D: assembly_einsum(B, D, spec.dim)),
    "contract": ("einsum ({spec.kind})", lambda spec, X, Y: contract_einsum(spec.kind, X, Y)),
    "gemm": ("matmul", _gemm),
    "mass_apply": ("gather, einsum chain, scatter-add (unfused)",
                   lambda spec, B, D, x, m: mass_apply_unfused(B, D, x, m, spec.dim)),
    "mass_diagonal": ("einsum with B^2, scatter-add (unfused)",
                      lambda spec, B, D, m: mass_diagonal_unfused(B, D, m, spec.ndofs, spec.dim)),
}


def einsum_executor(spec, backend):
    """The einsum path of an operator instance that a compiled ``backend`` has no kernel
    for (docs/math.md section 7): runs the reference code on the same arrays, reported as
    a generic path (``specialized=False``; the plan logs it)."""
    geo = getattr(spec, "geometry", None)
    kernel, fn = (_geometry_path(spec) if geo else
                  _operator_path(spec) if getattr(spec, "qfunc", "mass") != "mass" else
                  _PATHS[spec.op])
    if spec.op == "assembly" and spec.qfunc != "mass" and \
            spec.nd ** spec.dim <= GEMM_ASSEMBLY_MAX_ND:
        names = [o.name for o in spec.inputs]

        def fn(*ops):
            a = dict(zip(names, ops))
            return operator_assembly_gemm(spec.qfunc, a.get("B1d"), a["G1d"], a.get("D"),
                                          a.get("Q"), spec.dim)
        kernel = (f"{spec.qfunc}: one GEMM of Q with the dense gradients' products"
                  f"{', collocated' if spec.collocated else ''}")
    ex = _Run(f"reference {kernel.format(spec=spec)} (no {backend} kernel for this "
              "instance)", functools.partial(fn, spec) if spec.qfunc == "mass" and not geo
              else fn)
    ex.specialized, ex.source = False, "generic"
    return ex


class ReferenceBackend(Backend):
    """NumPy/CuPy ``einsum`` and ``matmul``: every spec, no tuning parameters."""

    name = "reference"
    array_modules = ("numpy", "cupy")
    priority = 0

    def build(self, spec, params=None):
        if params not in (None, "heuristic"):
            raise ValueError(f"the reference backend has no tuning parameters; got params "
                             f"{params}")
        if spec.op in SOLVER_OPS:
            return solver_executor(spec)
        if getattr(spec, "geometry", None):
            return _Run(*_geometry_path(spec))
        if getattr(spec, "qfunc", "mass") != "mass":
            kernel, fn = _operator_path(spec)
            return _Run(kernel, fn)
        path = _PATHS.get(spec.op)
        if path is None:
            raise Unsupported(f"reference backend has no path for {spec}")
        kernel, fn = path
        return _Run(kernel.format(spec=spec), functools.partial(fn, spec))


register(ReferenceBackend())
