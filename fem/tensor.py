"""Sum-factorised application of 1D matrices to tensor-product E-vectors.

The FEM layer needs a few tensor-product operations besides the mass
operator of the core (interpolating geometry, derivatives, right-hand
sides). They are done here with NumPy, one ``tensordot`` (a BLAS GEMM) per
axis: ``Y[..., i1, i2, i3] = sum_j A1[i1, j1] A2[i2, j2] A3[i3, j3]
X[..., j1, j2, j3]``. The tensor axes are always the trailing ``dim`` axes,
so leading element and component axes pass through untouched.

The functions are array-module generic: with a CuPy ``X`` they run on the
GPU (``cupy.tensordot`` is a cuBLAS GEMM), the small 1D matrices following
``X`` to the device.
"""

import numpy as np

from smalltc._arrays import array_module

__all__ = ["apply_tensor", "interp", "interp_t"]


def apply_tensor(mats, X):
    """Apply one 1D matrix per trailing axis of ``X``.

    Parameters
    ----------
    mats : sequence of (array_like or None)
        ``mats[a]`` has shape ``(m_a, n_a)`` and acts on tensor axis ``a``
        (the ``len(mats)`` trailing axes of ``X``, in order); ``None`` leaves
        that axis alone.
    X : ndarray, shape (..., n_1, ..., n_dim)
        NumPy or CuPy; the matrices are moved to the module of ``X``.

    Returns
    -------
    ndarray, shape (..., m_1, ..., m_dim)
        C-contiguous, same array module as ``X``.

    Raises
    ------
    ValueError
        If ``X`` has fewer than ``len(mats)`` axes, a matrix is not 2D, or
        a matrix's column count does not match its axis of ``X``.

    Examples
    --------
    >>> X = np.arange(4.0).reshape(1, 2, 2)
    >>> A = np.array([[1.0, 1.0]])          # sums an axis
    >>> print(apply_tensor([A, None], X))   # sum over the first tensor axis
    [[[2. 4.]]]
    """
    xp = array_module(X)
    X = xp.asarray(X)
    dim = len(mats)
    if X.ndim < dim:
        raise ValueError(f"X has shape {X.shape}, expected at least {dim} trailing tensor axes")
    for a, A in enumerate(mats):
        if A is None:
            continue
        A = xp.asarray(A)
        ax = X.ndim - dim + a
        if A.ndim != 2 or A.shape[1] != X.shape[ax]:
            raise ValueError(
                f"matrix {a} has shape {A.shape}, expected (m, {X.shape[ax]}) "
                f"to act on axis {ax} of X with shape {X.shape}"
            )
        X = xp.moveaxis(xp.tensordot(X, A, axes=([ax], [1])), -1, ax)
    return xp.ascontiguousarray(X)


def interp(B1d, X, dim):
    """Interpolate nodal values to quadrature points: ``(B (x) ... (x) B) X``.

    Parameters
    ----------
    B1d : array_like, shape (nq, nd)
    X : ndarray, shape (..., nd, ..., nd)
        ``dim`` trailing tensor axes.
    dim : int

    Returns
    -------
    ndarray, shape (..., nq, ..., nq)

    Examples
    --------
    >>> B = np.array([[0.5, 0.5]])          # midpoint of a linear element
    >>> print(interp(B, np.array([[[0.0, 1.0], [2.0, 3.0]]]), 2))
    [[[1.5]]]
    """
    return apply_tensor([B1d] * dim, X)


def interp_t(B1d, Y, dim):
    """Transpose of :func:`interp`: ``(B^T (x) ... (x) B^T) Y``.

    Parameters
    ----------
    B1d : array_like, shape (nq, nd)
    Y : ndarray, shape (..., nq, ..., nq)
    dim : int

    Returns
    -------
    ndarray, shape (..., nd, ..., nd)

    Examples
    --------
    >>> B = np.array([[0.5, 0.5]])
    >>> print(interp_t(B, np.array([[4.0]]), 1))
    [[2. 2.]]
    """
    return apply_tensor([array_module(B1d).asarray(B1d).T] * dim, Y)
