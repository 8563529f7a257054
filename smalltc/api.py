"""The public operations: thin wrappers that run their entry of :mod:`smalltc.ops`.

The mass operator and the layouts (:func:`batched_contract` to :func:`mass_diagonal`),
the family of operators of one space (mass, diffusion, Helmholtz: :func:`operator_apply`
and friends); the operators of mixed spaces are in :mod:`smalltc.mixed`, the basis
application in :mod:`smalltc.evaluation`.

Each hands its operands and the options that choose its spec to
:func:`smalltc.plan.call`, which keys the plan cache (:func:`smalltc.plan.cached_plan`)
on the call signature: the operation, its options, and each operand's type, shape and
dtype. A repeated call is a dictionary lookup and the plan's call, whose plain
comparisons recheck everything a signature leaves out (contiguity, ``out``, scalars).
A miss, or operands that are not arrays, goes through the entry's spec function
(:mod:`smalltc._validate`) first; arrays of another library (torch, JAX: any DLPack
producer) go through :mod:`smalltc._interop`, which runs the same call with NumPy/CuPy
views of them and returns the result in their library.
"""
from __future__ import annotations

from functools import partial

from . import _interop, _validate
from ._arrays import array_module
from .ops import (ACTION, ASSEMBLY, CONTRACT, GEMM, MASS_APPLY, MASS_DIAGONAL, OPERATORS,
                  VERTEX_OPERATORS, Extents)
from .plan import call

__all__ = ["batched_contract", "assemble_mass", "batched_gemm", "contract", "mass_apply",
           "mass_diagonal", "diffusion_action", "diffusion_apply", "diffusion_diagonal",
           "assemble_diffusion", "operator_action", "operator_apply", "operator_diagonal",
           "assemble_operator"]


def _is_zero(beta):
    """``beta == 0`` for GEMM's choice of operands (False for what is not a number: the
    spec function says what is wrong)."""
    try:
        return bool(beta == 0)
    except (TypeError, ValueError):
        return False


def batched_contract(B1d, D, V, *, out=None, backend="auto", method="auto", stream=None):
    """Partial-assembly mass action ``U_e = B^T D_e B V_e`` for every element.

    In 3D, ``U[e,i1,i2,i3] = sum_{k,j} B[k1,i1] B[k2,i2] B[k3,i3] D[e,k1,k2,k3]
    B[k1,j1] B[k2,j2] B[k3,j3] V[e,j1,j2,j3]`` with ``B = B1d``; 2D and 1D drop
    the missing indices. The Kronecker matrix is never formed.

    Parameters
    ----------
    B1d : array, shape (nq, nd)
        ``B1d[k, i] = phi_i(x_k)``, shared by all elements.
    D : array, shape (E, nq), (E, nq, nq) or (E, nq, nq, nq)
        Quadrature data per element; its rank sets the dimension.
    V : array, shape (E, nd, ...) or (E, ncomp, nd, ...)
        Element degrees of freedom, optionally with a component axis (the
        same operator applied to each component).
    out : array, optional
        Result buffer: an array of the operands' library, V's shape and
        dtype, C-contiguous, writeable, not overlapping the inputs.
    backend : {"auto", "reference", "cpu", "cuda"}
        "auto" picks the fastest available one for the arrays' device.
    method : {"auto", "fused", "pairwise"}
        One fused kernel ("auto"), or the catalogue's steps (3a)-(4f).
    stream : cupy.cuda.Stream or torch.cuda.Stream, optional
        For arrays on a GPU; default the current stream (torch's current stream for
        torch CUDA tensors, CuPy's for the others).

    Operands that are not C-contiguous (and read-only NumPy arrays) are
    copied first; the answer is the same.

    Arrays of other libraries that implement DLPack (torch tensors, JAX
    arrays, on the CPU or a CUDA GPU) are read without a copy and the result
    is returned in their library (an ``out`` tensor is written in place); see
    :mod:`smalltc._interop` for the rules (streams, errors, copies).

    Returns
    -------
    U : array, V's shape and dtype

    Raises
    ------
    ValueError
        Shapes that do not fit together (the message names the operand); an
        ``out`` of the wrong shape, not C-contiguous, read-only or
        overlapping an input.
    TypeError
        Unsupported or mixed dtypes, arrays of different libraries (NumPy with
        CuPy, torch with NumPy, ...), an ``out`` that is not an array of the
        operands' library, a torch tensor that requires grad.

    Examples
    --------
    >>> import torch, smalltc                                  # doctest: +SKIP
    >>> U = smalltc.batched_contract(torch.rand(5, 4, dtype=torch.float64),
    ...     torch.rand(100, 5, 5, 5, dtype=torch.float64),
    ...     torch.rand(100, 4, 4, 4, dtype=torch.float64))      # doctest: +SKIP
    >>> type(U).__name__                                       # doctest: +SKIP
    'Tensor'

    >>> import numpy as np, smalltc
    >>> rng = np.random.default_rng(0)
    >>> B1d = rng.random((5, 4)); D = rng.random((100, 5, 5, 5))
    >>> V = rng.random((100, 4, 4, 4))
    >>> U = smalltc.batched_contract(B1d, D, V)
    >>> U.shape
    (100, 4, 4, 4)
    >>> M = smalltc.assemble_mass(B1d, D)
    >>> bool(np.allclose(M @ V.reshape(100, -1, 1), U.reshape(100, -1, 1)))
    True
    """
    return call(ACTION, (B1d, D, V), (), out, stream, backend, method)


def assemble_mass(B1d, D, *, out=None, backend="auto", method="auto", stream=None):
    """Element mass matrices ``M_e = B^T D_e B``, shape ``(E, nd**dim, nd**dim)``.

    ``M[e, (i1,i2,i3), (j1,j2,j3)] = sum_k B[k1,i1] B[k1,j1] B[k2,i2] B[k2,j2]
    B[k3,i3] B[k3,j3] D[e,k1,k2,k3]`` with the multi-index flattened in C order
    (``i = (i1*nd + i2)*nd + i3``).

    Parameters
    ----------
    B1d : array, shape (nq, nd)
    D : array, shape (E, nq), (E, nq, nq) or (E, nq, nq, nq)
    out, backend, method, stream : as for :func:`batched_contract`.

    Returns
    -------
    M : array, shape (E, nd**dim, nd**dim)

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])   # nq=3, nd=2
    >>> D = np.ones((1, 3))
    >>> smalltc.assemble_mass(B1d, D)[0]
    array([[1.25, 0.25],
           [0.25, 1.25]])
    """
    return call(ASSEMBLY, (B1d, D), (), out, stream, backend, method)


def batched_gemm(A, B, C=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                 out=None, backend="auto", stream=None):
    """Batched ``out[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]``.

    Parameters
    ----------
    A : array, shape (batch, m, k) or (m, k); (.., k, m) with ``trans_a``
        A 2D operand is shared by the whole batch (batch stride 0).
    B : array, shape (batch, k, n) or (k, n); (.., n, k) with ``trans_b``
    C : array, shape (batch, m, n), optional
        Read only when ``beta != 0``. ``out=C`` updates C in place.
    alpha, beta : finite floats
        ``beta == 0`` means C is not read (it may hold anything, NaN included).
    trans_a, trans_b : bool
        ``op(A) = A^T`` (``op(B) = B^T``): the operand is read transposed, in
        place (no copy).
    out, backend, stream : as for :func:`batched_contract`.

    Returns
    -------
    array, shape (batch, m, n)

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> A = np.arange(8.0).reshape(2, 2, 2); B = np.eye(2)
    >>> smalltc.batched_gemm(A, B, alpha=2.0)[1]
    array([[ 8., 10.],
           [12., 14.]])
    """
    given = (A, B) if _is_zero(beta) else (A, B, C)      # C is read when beta != 0
    return call(GEMM, given, (trans_a, trans_b), out, stream, backend, "auto", (alpha, beta))


def contract(kind, X, Y, *, extents=None, out=None, backend="auto", stream=None):
    """A reshaping-layout kernel of docs/math.md section 3, batched.

    - ``"8a"``: ``A[i,j,k,l] = sum_s X[i,s,j] Y[k,s,l]``
    - ``"8b"``: ``A[i,k,l,j] = sum_s X[i,s,j] Y[k,s,l]``
    - ``"9"``: ``A[k,i,l,j] = sum_s B[s,i] B[s,j] C[k,s,l]`` (``X`` is ``B``)

    Parameters
    ----------
    kind : {"8a", "8b", "9"}
    X : array, ``[i, s, j]`` (``[s, n]`` for "9"), with or without a leading
        batch axis; without one it is shared by the batch.
    Y : array, ``[k, s, l]``, with or without a batch axis.
    extents : dict, optional
        ``i, s, j, k, l``: read X and Y with these extents (a reshape of
        the same storage, e.g. a tensor ``[j1, j2, j3]`` as ``[j1*j2, j3, 1]``).
    out, backend, stream : as for :func:`batched_contract`.

    Returns
    -------
    array of shape ``(batch,) + `` the kind's output axes.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.random.rand(4, 3)                  # B[k3, j3]
    >>> V = np.random.rand(7, 3, 3, 3)              # V[e, j1, j2, j3]
    >>> A = smalltc.contract("8a", V, B1d, extents=dict(i=9, s=3, j=1, k=4, l=1))
    >>> A.shape                                     # (4a): A[e, j1 j2, 1, k3, 1]
    (7, 9, 1, 4, 1)
    >>> bool(np.allclose(A.reshape(7, 3, 3, 4), np.einsum('kc,eabc->eabk', B1d, V)))
    True
    """
    return call(CONTRACT, (X, Y), (kind, Extents.of(extents)), out, stream, backend)


def mass_apply(B1d, D, x, elem_dofs, *, out=None, deterministic=False, backend="auto",
               stream=None, vertices=None, coef=None):
    """The global mass operator, fused: ``y = sum_e R_e^T B^T D_e B R_e x``.

    For any FEM code with its own numbering: ``R_e`` gathers element ``e``'s
    values from the global vector ``x`` through the element-to-DoF map
    (``x[elem_dofs[e]]``), ``B^T D_e B`` is the action of
    :func:`batched_contract`, and ``R_e^T`` adds the result into ``y`` at the
    same entries. On a GPU it is one kernel (gather, action, scatter-add); the
    element vectors never reach device memory.

    Parameters
    ----------
    B1d : array, shape (nq, nd)
    D : array, shape (E, nq, ..., nq)
        Quadrature data per element (its rank sets the dimension, 1 to 3).
    x : array, shape (ndofs,) or (ncomp, ndofs)
        The global vector; with a component axis the operator acts on each
        component.
    elem_dofs : int32 or int64 array, shape (E, nd, ..., nd)
        Global index of each element DoF, multi-index in C order (as V of
        :func:`batched_contract`). Every index must be in ``[0, ndofs)``: a map
        is checked the first time a call sees it (:mod:`smalltc.maps`).
    out : array, optional
        ``y``, of x's shape and dtype, not overlapping the inputs; it is
        overwritten (not added to).
    deterministic : bool
        False (default): additions into ``y`` by atomics on a GPU (the order,
        and so the last bits, may change from run to run). True: one pass per
        element colour (elements of a colour share no DoF), the same bits every
        run. On the CPU every form is race-free.
    backend, stream : as for :func:`batched_contract`.
    vertices, coef : array (E, 2^dim, dim) and number or (E,), optional
        Instead of ``D`` (pass ``D=None``): the point data recomputed in the kernel from
        the element vertices and a density (:func:`operator_apply`; docs/math.md section
        8). ``D`` may also be float32 with float64 ``B1d`` and ``x``.

    Returns
    -------
    y : array, x's shape and dtype

    Raises
    ------
    ValueError
        Shapes that do not fit together, an index of ``elem_dofs`` out of
        range, ``out`` of the wrong shape or overlapping an input (all name the
        operand).
    TypeError
        ``elem_dofs`` not int32/int64, mixed float dtypes or array libraries.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])   # nq=3, nd=2: P1
    >>> D = np.full((2, 3), 1.0 / 6)                          # two elements of length 1
    >>> elem_dofs = np.array([[0, 1], [1, 2]], dtype=np.int32)
    >>> y = smalltc.mass_apply(B1d, D, np.ones(3), elem_dofs)   # M 1 = the lumped mass
    >>> print(y * 4)
    [1. 2. 1.]
    """
    if vertices is not None or coef is not None:
        return _operator("apply", "mass", B1d, None, D, (x, elem_dofs), out, stream, backend,
                         deterministic, vertices=vertices, coef=coef)
    return call(MASS_APPLY, (B1d, D, x, elem_dofs), (bool(deterministic),), out, stream,
                backend)


def mass_diagonal(B1d, D, elem_dofs, ndofs, *, out=None, deterministic=False,
                  backend="auto", stream=None):
    """The diagonal of the global mass matrix, ``sum_e R_e^T diag(B^T D_e B)``.

    ``diag(B^T D_e B)[i] = sum_k prod_a B[k_a, i_a]^2 D_e[k]``, added into the
    global vector through ``elem_dofs`` as in :func:`mass_apply`: the Jacobi
    preconditioner of the mass operator, without forming any matrix.

    Parameters
    ----------
    B1d, D, elem_dofs : as for :func:`mass_apply`.
    ndofs : int
        Length of the global vector.
    out, deterministic, backend, stream : as for :func:`mass_apply`.

    Returns
    -------
    array, shape (ndofs,), D's dtype

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    >>> D = np.full((2, 3), 1.0 / 6)
    >>> elem_dofs = np.array([[0, 1], [1, 2]], dtype=np.int32)
    >>> print(smalltc.mass_diagonal(B1d, D, elem_dofs, 3) * 24)
    [ 5. 10.  5.]
    """
    return call(MASS_DIAGONAL, (B1d, D, elem_dofs), (ndofs, bool(deterministic)), out, stream,
                backend)


# --- the generalised operators (docs/math.md section 7) --------------------------------------

_COEFS: dict = {}


def _coef_array(coef, X, like):
    """``coef`` as an (E,) array of ``like``'s library and dtype: an array passes through;
    a scalar (a constant coefficient) becomes a cached filled array (8 bytes an element
    read by the kernel)."""
    if hasattr(coef, "shape") and getattr(coef, "ndim", 0) > 0:
        return coef
    xp = array_module(like)
    E = X.shape[0] if getattr(X, "ndim", 0) == 3 else 0
    dev = None
    if xp.__name__ == "cupy":
        dev = xp.cuda.runtime.getDevice()
    key = (xp.__name__, dev, E, float(coef), str(like.dtype))
    a = _COEFS.get(key)
    if a is None:
        if len(_COEFS) > 64:
            _COEFS.clear()
        a = _COEFS[key] = xp.full((E,), float(coef), dtype=like.dtype)
    return a


def _entry(table, key, check):
    """The operator entry of ``key`` (qfunc, level) in ``table``; where there is none,
    ``check()`` (the spec function) raises the error that says why."""
    try:
        op = table.get(key)
    except TypeError:                            # an unhashable qfunc
        op = None
    if op is None:
        check()
        raise ValueError(f"no operator {key[0]!r} at level {key[1]!r}")
    return op


def _vertex_operator(level, qfunc, B1d, G1d, data, vertices, coef, rest, out, stream, backend,
                     deterministic):
    """The body of the operators with ``vertices=`` (docs/math.md section 8): the point
    data are recomputed from the element vertices in the kernel (the reference path:
    :func:`smalltc.vertices.point_data`, then the stored-data einsum)."""
    if data is not None:
        raise TypeError(f"pass the point data or vertices=, not both (got data of type "
                        f"{type(data).__name__} and vertices)")
    if coef is None:
        coef = 1.0
    if not hasattr(vertices, "shape"):
        raise TypeError(f"vertices must be an array (E, 2^dim, dim), got "
                        f"{type(vertices).__name__}")
    op = _entry(VERTEX_OPERATORS, (qfunc, level), partial(
        _validate.vertex_operator_spec, level, qfunc, B1d, G1d, vertices, coef, *rest,
        deterministic=deterministic))
    if _interop.any_foreign(B1d, G1d, vertices, coef, *rest, out):
        # a constant coef is made in the views' library (_coef_array), after the import
        scalar = not hasattr(coef, "shape")
        names = tuple(n for n in op.operands if not (scalar and n == "coef"))
        flat = (B1d, G1d, vertices) + (() if scalar else (coef,)) + tuple(rest)
        return _interop.call(partial(_vertex_views, level, qfunc, backend, deterministic,
                                     coef if scalar else None), names, flat, out, stream)
    coef = _coef_array(coef, vertices, rest[0])
    return call(op, (B1d, G1d, vertices, coef) + tuple(rest), (bool(deterministic),), out,
                stream, backend)


def _vertex_views(level, qfunc, backend, deterministic, coef, B1d, G1d, X, *arrays, out):
    if coef is None:
        coef, arrays = arrays[0], arrays[1:]
    return _vertex_operator(level, qfunc, B1d, G1d, None, X, coef, arrays, out, None, backend,
                            deterministic)


def _operator(level, qfunc, B1d, G1d, data, rest, out, stream, backend, deterministic=False,
              ndofs=None, vertices=None, coef=None):
    """The public operators' common body: the entry of (qfunc, level) run through
    :func:`smalltc.plan.call`; the point data ``(D, Q)`` of Helmholtz are two operands."""
    if vertices is not None or coef is not None:
        if vertices is None:
            raise TypeError("coef= goes with vertices= (the coefficient of the vertex "
                            "geometry); with stored point data it is part of D or Q")
        return _vertex_operator(level, qfunc, B1d, G1d, data, vertices, coef, rest, out,
                                stream, backend, deterministic)
    datas = tuple(data) if isinstance(data, (tuple, list)) else (data,)
    check = partial(_validate.operator_spec, level, qfunc, B1d, G1d, data, *rest,
                    deterministic=deterministic, ndofs=ndofs)
    op = _entry(OPERATORS, (qfunc, level), check)
    if len(datas) != len(op.operands) - 2 - len(rest):       # D, Q or the pair (D, Q)
        check()
        data_names = op.operands[2:len(op.operands) - len(rest)]
        raise TypeError(f"data for qfunc {qfunc!r} is {', '.join(data_names)}")
    return call(op, (B1d, G1d) + datas + tuple(rest), (bool(deterministic), ndofs), out,
                stream, backend)


def operator_action(qfunc, B1d, G1d, data, V, *, out=None, backend="auto", stream=None,
                    vertices=None, coef=None):
    """The element action of an operator of the family (docs/math.md section 7).

    ``qfunc`` picks the physics at the quadrature points:

    - ``"mass"``: ``U_e = B^T D_e B V_e`` (:func:`batched_contract`; ``G1d=None``,
      ``data=D``)
    - ``"diffusion"``: ``U_e = sum_{a,b} G_a^T (Q_e^{ab} * G_b V_e)`` (``data=Q``)
    - ``"helmholtz"``: the sum of both (``data=(D, Q)``)

    ``G_a`` is the reference gradient along tensor axis ``a``: ``G1d`` on axis ``a``,
    ``B1d`` on the others. ``Q`` is the symmetric ``dim x dim`` matrix of each
    quadrature point packed as its upper triangle, row by row (3D: 11, 12, 13, 22, 23,
    33; 2D: 11, 12, 22; 1D: 11), on axis 1: ``Q[e, c, k1, ..., kd]``.

    Parameters
    ----------
    qfunc : {"mass", "diffusion", "helmholtz"}
    B1d : array, shape (nq, nd), or None
        ``B1d[k, i] = phi_i(x_k)``. None: the collocated form (Gauss-Lobatto points on
        the nodes, nq == nd, ``B1d`` the identity; not for mass).
    G1d : array, shape (nq, nd), or None for mass
        ``G1d[k, i] = phi_i'(x_k)`` on [-1, 1].
    data : array or pair of arrays
        ``D`` (E, nq, ..., nq), ``Q`` (E, nsym, nq, ..., nq) with nsym = 1, 3, 6 in 1D,
        2D, 3D, or ``(D, Q)``.
    V : array, shape (E, nd, ..., nd) or (E, ncomp, nd, ..., nd)
        Element vectors; with a component axis the operator acts on each component.
    out, backend, stream : as for :func:`batched_contract`.

    Returns
    -------
    U : array, V's shape and dtype

    Raises
    ------
    ValueError
        An unknown ``qfunc``; shapes that do not fit together (the message names the
        operand and the expected shape); B1d and G1d of different shapes (one basis in
        and out); ``B1d=None`` with nq != nd.
    TypeError
        Mixed dtypes or array libraries; ``data`` not a pair for Helmholtz.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> from smalltc import fem
    >>> b = fem.basis_1d(2, 4)
    >>> Q = np.random.rand(5, 3, 4, 4)
    >>> U = smalltc.operator_action("diffusion", b.B1d, b.G1d, Q, np.ones((5, 3, 3)))
    >>> float(abs(U).max()) < 1e-12                     # constants have no gradient
    True
    """
    return _operator("action", qfunc, B1d, G1d, data, (V,), out, stream, backend,
                     vertices=vertices, coef=coef)


def operator_apply(qfunc, B1d, G1d, data, x, elem_dofs, *, out=None, deterministic=False,
                   backend="auto", stream=None, vertices=None, coef=None):
    """The global operator ``y = sum_e R_e^T A_e R_e x`` of the family, fused.

    ``A_e`` is the element action of :func:`operator_action` (``qfunc``, ``B1d``,
    ``G1d``, ``data`` as there); gather, action and scatter-add as in
    :func:`mass_apply` (``x``, ``elem_dofs``, ``out``, ``deterministic``, ``backend``,
    ``stream`` as there).

    Less point data (docs/math.md section 8), for mass and diffusion:

    - float32 ``data`` with float64 bases and ``x``: the kernels read float32 and compute
      in float64 (the float64 operator of the float32-rounded data);
    - ``vertices=X`` (E, 2^dim, dim), ``data=None``: the point data recomputed in the
      kernel from the vertices of multilinear (order-1) elements, in tensor order with the
      last axis fastest, and ``coef`` (a number, default 1, or one value an element: rho
      for mass, kappa for diffusion). The quadrature must be the one ``B1d``/``G1d`` are
      evaluated at: Gauss-Legendre with nq points, Gauss-Lobatto when ``B1d=None``
      (:mod:`smalltc.vertices`; what ``fem.basis_1d`` gives).

    Returns
    -------
    y : array, x's shape and dtype

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])   # P1 on two elements
    >>> G1d = np.array([[-0.5, 0.5]] * 3)                      # d phi / d xi
    >>> Q = np.full((2, 1, 3), 2 / 3) * np.array([1, 4, 1])    # w / J, J = 1/2: length 1
    >>> elem_dofs = np.array([[0, 1], [1, 2]], dtype=np.int32)
    >>> print(smalltc.operator_apply("diffusion", B1d, G1d, Q, np.array([0., 1., 0.]),
    ...                              elem_dofs))
    [-1.  2. -1.]

    The same operator from the vertices of the two elements (0 to 1/2, 1/2 to 1):

    >>> from smalltc import fem
    >>> b = fem.basis_1d(1, 2)
    >>> X = np.array([[[0.0], [0.5]], [[0.5], [1.0]]])
    >>> print(smalltc.operator_apply("diffusion", b.B1d, b.G1d, None, np.array([0., 1., 0.]),
    ...                              elem_dofs, vertices=X, coef=0.5))
    [-1.  2. -1.]
    """
    return _operator("apply", qfunc, B1d, G1d, data, (x, elem_dofs), out, stream, backend,
                     deterministic, vertices=vertices, coef=coef)


def operator_diagonal(qfunc, B1d, G1d, data, elem_dofs, ndofs, *, out=None,
                      deterministic=False, backend="auto", stream=None):
    """The diagonal of the global operator's matrix, ``sum_e R_e^T diag(A_e)``, without
    forming any matrix (the Jacobi preconditioner); arguments as for
    :func:`operator_apply` and :func:`mass_diagonal`.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    >>> G1d = np.array([[-0.5, 0.5]] * 3)
    >>> Q = np.full((2, 1, 3), 2 / 3) * np.array([1, 4, 1])
    >>> elem_dofs = np.array([[0, 1], [1, 2]], dtype=np.int32)
    >>> print(smalltc.operator_diagonal("diffusion", B1d, G1d, Q, elem_dofs, 3))
    [1. 2. 1.]
    """
    return _operator("diagonal", qfunc, B1d, G1d, data, (elem_dofs,), out, stream, backend,
                     deterministic, ndofs)


def assemble_operator(qfunc, B1d, G1d, data, *, out=None, backend="auto", stream=None):
    """Element matrices of the family, ``(E, nd**dim, nd**dim)``, C-order multi-indices
    (as :func:`assemble_mass`): for diffusion ``K[e, i, j] = sum_{a,b,k} G_a[k, i]
    Q_e^{ab}[k] G_b[k, j]``; arguments as for :func:`operator_action`. Invariant:
    ``K_e @ V_e`` is the action's ``U_e``.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    >>> G1d = np.array([[-0.5, 0.5]] * 3)
    >>> Q = np.full((1, 1, 3), 2 / 3) * np.array([1, 4, 1])
    >>> smalltc.assemble_operator("diffusion", B1d, G1d, Q)[0]
    array([[ 1., -1.],
           [-1.,  1.]])
    """
    return _operator("assembly", qfunc, B1d, G1d, data, (), out, stream, backend)


def diffusion_action(B1d, G1d, Q, V, *, out=None, backend="auto", stream=None,
                     vertices=None, coef=None):
    """The diffusion action on element vectors, ``U_e = sum_{a,b} G_a^T (Q_e^{ab} * G_b
    V_e)`` (CEED BP3, element level): :func:`operator_action` with ``"diffusion"``.

    Parameters
    ----------
    B1d : array (nq, nd), or None for the collocated form (nq == nd; BP5)
    G1d : array (nq, nd)
    Q : array (E, nsym, nq, ..., nq), the packed symmetric matrices
    V : array (E, [ncomp,] nd, ..., nd)
    out, backend, stream : as for :func:`batched_contract`.
    vertices, coef : as for :func:`operator_apply` (``Q=None``).

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> from smalltc import fem
    >>> b = fem.basis_1d(3, 4, quadrature="gll")              # collocated: nq == nd
    >>> Q = np.random.rand(2, 6, 4, 4, 4)
    >>> U = smalltc.diffusion_action(None, b.G1d, Q, np.random.rand(2, 4, 4, 4))
    >>> U.shape
    (2, 4, 4, 4)
    """
    return _operator("action", "diffusion", B1d, G1d, Q, (V,), out, stream, backend,
                     vertices=vertices, coef=coef)


def diffusion_apply(B1d, G1d, Q, x, elem_dofs, *, out=None, deterministic=False,
                    backend="auto", stream=None, vertices=None, coef=None):
    """The global diffusion operator, fused: ``y = sum_e R_e^T (sum_ab G_a^T Q_e^ab G_b)
    R_e x`` (CEED BP3; BP5 with ``B1d=None``, collocated); as :func:`mass_apply` with
    ``G1d`` and ``Q`` (:func:`operator_apply` with ``"diffusion"``). ``Q`` may be float32
    with float64 bases and ``x``; ``Q=None`` with ``vertices=X`` and ``coef`` (kappa)
    recomputes it in the kernel from the element vertices (:func:`operator_apply`).

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> from smalltc import fem
    >>> space = fem.H1Space(fem.box_mesh(2, 3), p=2)
    >>> Q = np.random.rand(space.nelements, 3, 4, 4)       # any Q: (11, 12, 22) per point
    >>> b = fem.basis_1d(2, 4)
    >>> y = smalltc.diffusion_apply(b.B1d, b.G1d, Q, np.ones(space.ndofs), space.dof_map())
    >>> float(abs(y).max()) < 1e-12                     # K 1 = 0
    True
    """
    return _operator("apply", "diffusion", B1d, G1d, Q, (x, elem_dofs), out, stream,
                     backend, deterministic, vertices=vertices, coef=coef)


def diffusion_diagonal(B1d, G1d, Q, elem_dofs, ndofs, *, out=None, deterministic=False,
                       backend="auto", stream=None):
    """The diagonal of the global stiffness matrix (Jacobi), without forming it; as
    :func:`mass_diagonal` with ``G1d`` and ``Q``.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> B1d = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    >>> G1d = np.array([[-0.5, 0.5]] * 3)
    >>> Q = np.full((2, 1, 3), 2 / 3) * np.array([1, 4, 1])
    >>> elem_dofs = np.array([[0, 1], [1, 2]], dtype=np.int64)
    >>> print(smalltc.diffusion_diagonal(B1d, G1d, Q, elem_dofs, 3))
    [1. 2. 1.]
    """
    return _operator("diagonal", "diffusion", B1d, G1d, Q, (elem_dofs,), out, stream,
                     backend, deterministic, ndofs)


def assemble_diffusion(B1d, G1d, Q, *, out=None, backend="auto", stream=None):
    """Element stiffness matrices ``K[e, i, j] = sum_{a,b,k} G_a[k, i] Q_e^{ab}[k]
    G_b[k, j]``, shape ``(E, nd**dim, nd**dim)`` (C-order multi-indices, as
    :func:`assemble_mass`); ``B1d=None`` for the collocated form.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> from smalltc import fem
    >>> b = fem.basis_1d(2, 4)
    >>> K = smalltc.assemble_diffusion(b.B1d, b.G1d, np.random.rand(3, 3, 4, 4))
    >>> K.shape, bool(np.allclose(K, K.transpose(0, 2, 1)))
    ((3, 9, 9), True)
    """
    return _operator("assembly", "diffusion", B1d, G1d, Q, (), out, stream, backend)
