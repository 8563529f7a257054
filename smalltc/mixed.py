"""The operators of mixed spaces (docs/math.md section 7): BLAST's corner force between
H1^d and L2 (:func:`force_apply`, :func:`force_apply_transpose`: size-specialised
kernels) and the general operator ``E_out^T (Q . E_in V)`` (:func:`mixed_action`,
:func:`mixed_apply`: the general sum-factorised path).

Thin wrappers, as those of :mod:`smalltc.api`: each runs its entry of :mod:`smalltc.ops`
through :func:`smalltc.plan.call`.
"""
from __future__ import annotations

from .ops import FORCE, FORCE_T, MIXED_ACTION, MIXED_APPLY
from .plan import call

__all__ = ["force_apply", "force_apply_transpose", "mixed_action", "mixed_apply"]


def force_apply(B_l2, B1d, G1d, A, e, *, elem_dofs=None, ndofs=None, out=None,
                deterministic=False, backend="auto", stream=None):
    """BLAST's corner force ``F e`` (H1^d <- L2; Laghos' ``ForceMult``), matrix-free.

    Per element and kinematic component ``c`` (docs/math.md section 7):
    ``(F e)_c = sum_a G_a^T (A[c, a] * (B_L2 e))``, with ``B_L2 e`` the thermodynamic
    (L2, order ``p - 1``) field at the quadrature points (``B_l2`` on every axis) and
    ``G_a`` the reference gradient of the kinematic (H1, order ``p``) basis along tensor
    axis ``a`` (``G1d`` on axis ``a``, ``B1d`` on the others). With ``elem_dofs`` the
    kinematic side is global: the element results are added into ``y`` of shape
    ``(d, ndofs)`` through the map (as :func:`mass_apply`); the L2 side is always per
    element (discontinuous).

    Parameters
    ----------
    B_l2 : array, shape (nq, p)
        The L2 basis (order ``p - 1``) at the quadrature points.
    B1d, G1d : arrays, shape (nq, p + 1)
        The H1 basis (order ``p``) and its derivative on [-1, 1].
    A : array, shape (E, d, d, nq, ..., nq)
        ``A[e, c, a, k...]``: the ``d x d`` matrix of each quadrature point (in BLAST
        ``w |J| sigma J^-T``; not symmetric). Its rank sets the dimension d (1 to 3).
    e : array, shape (E, p, ..., p)
        The thermodynamic field per element.
    elem_dofs : int32 or int64 array, shape (E, p + 1, ..., p + 1), optional
        The kinematic element-to-DoF map (per component; every index in ``[0, ndofs)``).
    ndofs : int, optional
        With ``elem_dofs``: the global vector's length per component (or given by
        ``out``'s shape).
    out : array, optional
        The result buffer (overwritten, not added to).
    deterministic : bool
        With ``elem_dofs``: the additions in a fixed order (see :func:`mass_apply`).
    backend, stream : as for :func:`batched_contract`.

    Returns
    -------
    array, shape (E, d, p + 1, ..., p + 1), or (d, ndofs) with ``elem_dofs``

    Raises
    ------
    ValueError
        Shapes that do not fit together (the message names the operand and the expected
        shape), an index of ``elem_dofs`` out of range, ``ndofs`` missing with
        ``elem_dofs``.
    TypeError
        Mixed dtypes or array libraries, ``elem_dofs`` not int32/int64.

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> from smalltc import fem
    >>> p, nq = 2, 4
    >>> h1, l2 = fem.basis_1d(p, nq), fem.basis_1d(p - 1, nq)    # Gauss points, nq = 2p
    >>> rng = np.random.default_rng(0)
    >>> A = rng.random((5, 2, 2, nq, nq)); e = rng.random((5, p, p))
    >>> Fe = smalltc.force_apply(l2.B1d, h1.B1d, h1.G1d, A, e)
    >>> Fe.shape
    (5, 2, 3, 3)
    >>> w = rng.random(Fe.shape)                                  # W . (F e) == (F^T W) . e
    >>> FTw = smalltc.force_apply_transpose(l2.B1d, h1.B1d, h1.G1d, A, w)
    >>> bool(np.isclose(np.vdot(w, Fe), np.vdot(FTw, e)))
    True
    """
    if elem_dofs is not None and ndofs is None and out is not None:
        ndofs = getattr(out, "shape", (None,))[-1]          # y's length from out
    return call(FORCE, (B_l2, B1d, G1d, A, e, elem_dofs), (ndofs, bool(deterministic)), out,
                stream, backend)


def force_apply_transpose(B_l2, B1d, G1d, A, w, *, elem_dofs=None, out=None,
                          backend="auto", stream=None):
    """The transposed corner force ``F^T w`` (L2 <- H1^d; Laghos' ``ForceMultTranspose``).

    Per element: ``F^T w = B_L2^T (sum_{c,a} A[c, a] * (G_a w_c))`` (docs/math.md section
    7; operands as for :func:`force_apply`). With ``elem_dofs``, ``w`` is the global
    kinematic vector ``(d, ndofs)`` and each element's values are gathered through the map
    (the element vectors never reach memory in the fused kernels).

    Parameters
    ----------
    B_l2, B1d, G1d, A : as for :func:`force_apply`.
    w : array, shape (E, d, p + 1, ..., p + 1), or (d, ndofs) with ``elem_dofs``
    elem_dofs : int32 or int64 array, shape (E, p + 1, ..., p + 1), optional
    out, backend, stream : as for :func:`batched_contract`.

    Returns
    -------
    array, shape (E, p, ..., p)

    Examples
    --------
    >>> import numpy as np, smalltc
    >>> from smalltc import fem
    >>> space = fem.H1Space(fem.box_mesh(2, 2), p=2)             # 4 elements, 25 DoFs
    >>> h1, l2 = fem.basis_1d(2, 4), fem.basis_1d(1, 4)
    >>> A = np.random.default_rng(1).random((4, 2, 2, 4, 4))
    >>> ones = np.ones((2, space.ndofs))          # a constant velocity has no gradient
    >>> r = smalltc.force_apply_transpose(l2.B1d, h1.B1d, h1.G1d, A, ones,
    ...                                   elem_dofs=space.dof_map())
    >>> r.shape, float(abs(r).max()) < 1e-12
    ((4, 2, 2), True)
    """
    return call(FORCE_T, (B_l2, B1d, G1d, A, w, elem_dofs), (None, False), out, stream,
                backend)


# --- the general operator of mixed spaces (docs/math.md section 7) ---------------------------

def mixed_action(B_in, B_out, Q, V, *, G_in=None, G_out=None, eval_in="value",
                 eval_out="value", out=None, backend="auto", stream=None):
    """The general linear operator of mixed spaces on element vectors,
    ``U_e = E_out^T (Q_e . E_in V_e)`` (docs/math.md section 7).

    The input field has its own basis (``B_in``, ``G_in``: ``nq x nd_in``), the output
    field another (``B_out``, ``G_out``: ``nq x nd_out``), at a common quadrature of nq
    points per axis. ``E_in`` evaluates, for each of the ``ncomp_in`` input components,
    what ``eval_in`` selects at every point: its value (``B_in`` on every axis) and/or its
    ``dim`` reference derivatives ``d/dxi_a`` (``G_in`` on axis ``a``, ``B_in`` on the
    others); these are the input *slots*. ``Q[e, r, s, k1, ..., kd]`` couples output slot
    ``r`` with input slot ``s`` at each point, and ``E_out^T`` applies the transposed
    output evaluations (``B_out^T``, ``G_out^T``) and sums over the output slots:

        U[e, c', i] = sum_{r(c', j'), s, k} E_out[j'][k, i] Q[e, r, s, k] (E_in V_e)[s, k]

    Slots are component-major: slot ``c * nper + j``, ``nper`` evaluations a component in
    the order value (if selected), then ``d/dxi_1, ..., d/dxi_dim`` (if selected), so
    ``nper`` is 1 (``"value"``), ``dim`` (``"grad"``) or ``1 + dim`` (``"both"``). Q has
    ``ncomp_out * nper_out`` rows and ``ncomp_in * nper_in`` columns a point; the
    component counts are read from them. The derivatives are reference ones (on
    [-1, 1]^dim): the geometry (``J^-1``, ``|J|``, weights) belongs in Q.

    Instances: the mass operator is value/value with ``Q[e, 0, 0] = D`` and diffusion
    grad/grad with ``Q[e, a, b] = Q^{ab}``, both with ``B_in = B_out``
    (:func:`operator_action` runs them with size-specialised kernels); BLAST's corner force
    ``F`` is value (L2, 1 component) to grad (H1, ``dim`` components) with ``Q[e, c*dim+a,
    0] = A[e, c, a]`` and ``F^T`` its transpose (:func:`force_apply`,
    :func:`force_apply_transpose`: specialised kernels). This function is the general
    path: sum-factorised one-axis contractions (one GEMM each on the whole batch: BLAS on
    the host, cuBLAS on a GPU; evaluations share partial sums), the pointwise Q product,
    then the transposed contractions; never a dense element matrix, and no size-specialised
    kernel on any backend (``plan.specialized`` is False and the plan logs it).

    Parameters
    ----------
    B_in : array, shape (nq, nd_in)
        The input basis at the quadrature points, ``B_in[k, j] = phi_j(x_k)``.
    B_out : array, shape (nq, nd_out)
        The output basis at the same points.
    Q : array, shape (E, nslots_out, nslots_in, nq, ..., nq)
        The coupling per element and point; its rank sets the dimension (1 to 3).
    V : array, shape (E, nd_in, ..., nd_in) or (E, ncomp_in, nd_in, ..., nd_in)
        The input element vectors (the axis may be left out for one component).
    G_in, G_out : arrays, shape (nq, nd_in) and (nq, nd_out)
        The bases' derivatives on [-1, 1], needed exactly where the side evaluates
        gradients (given with ``"value"``: an error).
    eval_in, eval_out : {"value", "grad", "both"}
        What each side evaluates of each component.
    out : array, optional
        The result buffer (overwritten), shape as returned.
    backend, stream : as for :func:`batched_contract`.

    Returns
    -------
    U : array, shape (E, ncomp_out, nd_out, ..., nd_out), or (E, nd_out, ..., nd_out) for
        one output component

    Raises
    ------
    ValueError
        Shapes that do not fit together (the message names the operand, its shape and the
        expected one), an unknown ``eval_in``/``eval_out``, a ``G`` missing or not wanted.
    TypeError
        Mixed dtypes or array libraries.

    Examples
    --------
    The corner force ``F e`` (H1^2 <- L2) as the general operator:

    >>> import numpy as np, smalltc
    >>> from smalltc import fem
    >>> h1, l2 = fem.basis_1d(2, 4), fem.basis_1d(1, 4)           # p = 2, nq = 2p
    >>> rng = np.random.default_rng(0)
    >>> A = rng.random((5, 2, 2, 4, 4)); e = rng.random((5, 2, 2))
    >>> Fe = smalltc.mixed_action(l2.B1d, h1.B1d, A.reshape(5, 4, 1, 4, 4), e,
    ...                           G_out=h1.G1d, eval_out="grad")
    >>> Fe.shape
    (5, 2, 3, 3)
    >>> bool(np.allclose(Fe, smalltc.force_apply(l2.B1d, h1.B1d, h1.G1d, A, e)))
    True
    """
    return call(MIXED_ACTION, (B_in, G_in, B_out, G_out, Q, V), (eval_in, eval_out), out,
                stream, backend)


def mixed_apply(B_in, B_out, Q, x, *, G_in=None, G_out=None, eval_in="value",
                eval_out="value", elem_dofs_in=None, elem_dofs_out=None, ndofs_out=None,
                out=None, backend="auto", stream=None):
    """The general operator of mixed spaces between global vectors,
    ``y = sum_e R_out,e^T E_out^T (Q_e . E_in R_in,e x)``; either side may instead be
    element-local (discontinuous, L2: no map).

    ``R_in,e`` gathers element ``e``'s input values from ``x`` through ``elem_dofs_in``
    (``x[..., elem_dofs_in[e]]``), the element action is :func:`mixed_action`'s (``B_in``,
    ``B_out``, ``Q``, ``G_in``, ``G_out``, ``eval_in``, ``eval_out`` as there, and the same
    slot convention), and ``R_out,e^T`` adds the element results into ``y`` through
    ``elem_dofs_out``. Without ``elem_dofs_in``, ``x`` is the input element vectors (E,
    [ncomp_in,] nd_in, ...); without ``elem_dofs_out`` the result is per element (as
    :func:`mixed_action`). The general path: gather, the sum-factorised action, scatter-add
    (float64 sums per DoF), not a fused kernel.

    Parameters
    ----------
    B_in, B_out, Q : as for :func:`mixed_action`.
    x : array, shape (ndofs_in,) or (ncomp_in, ndofs_in) with ``elem_dofs_in``, else the
        element vectors (E, [ncomp_in,] nd_in, ..., nd_in)
    G_in, G_out, eval_in, eval_out : as for :func:`mixed_action`.
    elem_dofs_in : int32 or int64 array, shape (E, nd_in, ..., nd_in), optional
        The input side's element-to-DoF map (every index in ``[0, ndofs_in)``).
    elem_dofs_out : int32 or int64 array, shape (E, nd_out, ..., nd_out), optional
        The output side's map (every index in ``[0, ndofs_out)``); for a square operator
        pass the same map on both sides.
    ndofs_out : int, optional
        With ``elem_dofs_out``: the length of ``y`` per component (or given by ``out``).
    out : array, optional
        ``y``, overwritten (not added to).
    backend, stream : as for :func:`batched_contract`.

    Returns
    -------
    y : array, shape (ndofs_out,) or (ncomp_out, ndofs_out) with ``elem_dofs_out``, else
        as :func:`mixed_action` returns

    Raises
    ------
    ValueError
        As :func:`mixed_action`; a map of the wrong shape, or an index outside its vector
        (the message names ``elem_dofs_in`` or ``elem_dofs_out``; every call checks it);
        ``ndofs_out`` missing with ``elem_dofs_out`` or given without it.
    TypeError
        Mixed dtypes or array libraries, a map not int32/int64.

    Examples
    --------
    The 1D stiffness matrix of two linear elements, ``y = K x``, as grad/grad:

    >>> import numpy as np, smalltc
    >>> B = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])       # P1 at 3 points
    >>> G = np.array([[-0.5, 0.5]] * 3)                          # d phi / d xi
    >>> Q = np.full((2, 1, 1, 3), 2 / 3) * np.array([1, 4, 1])   # w / J, J = 1/2
    >>> m = np.array([[0, 1], [1, 2]], dtype=np.int32)
    >>> print(smalltc.mixed_apply(B, B, Q, np.array([0., 1., 0.]), G_in=G, G_out=G,
    ...       eval_in="grad", eval_out="grad", elem_dofs_in=m, elem_dofs_out=m, ndofs_out=3))
    [-1.  2. -1.]
    """
    if elem_dofs_out is not None and ndofs_out is None and out is not None:
        ndofs_out = getattr(out, "shape", (None,))[-1]        # y's length from out
    return call(MIXED_APPLY, (B_in, G_in, B_out, G_out, Q, x, elem_dofs_in, elem_dofs_out),
                (eval_in, eval_out, ndofs_out), out, stream, backend)


