"""Global mass operators on an H1 space, matrix-free and assembled.

Both compute ``y = sum_e P_e^T M_e P_e x`` with ``P_e`` the gather of
element ``e`` (:meth:`~smalltc.fem.space.H1Space.gather`) and ``M_e =
B^T D_e B`` the element mass matrix of docs/math.md section 2:

* :class:`MassOperator` never forms ``M_e``: by default one call of
  :func:`smalltc.mass_apply` (gather through the space's DoF map, the
  partial-assembly action and scatter-add fused: one kernel on a GPU); with
  ``fused=False`` the three steps apart (gather, :func:`smalltc.batched_contract`,
  scatter-add), the path it replaces, kept for comparison.
* :class:`AssembledMassOperator` forms every ``M_e`` once with
  :func:`smalltc.assemble_mass` and applies them as a batched matrix-vector
  product; :meth:`~AssembledMassOperator.to_csr` builds the global sparse
  matrix with NumPy alone.

Global vectors have shape ``(ndofs,)`` or ``(ncomp, ndofs)`` (the operator
acts on each component).

An operator lives where its ``D`` lives: built from CuPy arrays (or with
``mass_operator(..., device="gpu")``) it keeps ``B1d`` and ``D`` on the GPU,
takes NumPy or CuPy vectors and returns CuPy ones, and its applications and
diagonal run there (the core's CUDA backend, cuBLAS, strided adds).

Both follow SciPy's ``LinearOperator`` protocol (``shape``, ``dtype``, ``matvec``,
``rmatvec``, ``matmat``, ``rmatmat``): ``scipy.sparse.linalg.cg``/``minres`` and
CuPy's ``cupyx.scipy.sparse.linalg`` solvers take them as they are, and
``aslinearoperator()`` returns the library's ``LinearOperator``
(:func:`smalltc.fem.solvers.Jacobi` does the same for the preconditioner).
"""

import numpy as np

import smalltc
from smalltc._arrays import cupy_or_none, is_cupy

from ._device import resolve_device, to_host
from .basis import basis_1d
from .geometry import mass_data
from .tensor import interp_t

__all__ = ["MassOperator", "AssembledMassOperator", "mass_operator", "linear_operator"]


class _SpaceOperator:
    """Shared checks and bookkeeping of the global mass operators."""

    def __init__(self, space, D, B1d, backend):
        xp = _module_of(D, B1d)
        D = xp.asarray(D)
        if D.dtype not in (np.float32, np.float64):
            raise ValueError(f"D has dtype {D.dtype}, expected float64 or float32")
        B1d = xp.asarray(B1d)
        if B1d.ndim != 2 or B1d.shape[1] != space.nd:
            raise ValueError(f"B1d has shape {B1d.shape}, expected (nq, {space.nd}) for p={space.p}")
        nq = B1d.shape[0]
        expected = (space.nelements,) + (nq,) * space.dim
        if D.shape != expected:
            raise ValueError(
                f"D has shape {D.shape}, expected {expected} for E={space.nelements}, "
                f"nq={nq}, dim={space.dim}"
            )
        self.space = space
        self.xp = xp
        self.D = xp.ascontiguousarray(D)
        self.B1d = xp.ascontiguousarray(B1d, dtype=D.dtype)
        self.backend = backend
        self.dtype = D.dtype

    @property
    def device(self):
        """``"gpu"`` when the operator's data are CuPy arrays, else ``"cpu"``."""
        return "cpu" if self.xp is np else "gpu"

    @property
    def shape(self):
        """``(ndofs, ndofs)``."""
        return (self.space.ndofs, self.space.ndofs)

    def __call__(self, x):
        return self.apply(x)

    # SciPy's and CuPy's LinearOperator protocol (shape, dtype, matvec, ...): their
    # solvers take the operator itself (scipy.sparse.linalg.cg(M, b)), and
    # aslinearoperator() wraps it explicitly.

    def matvec(self, x):
        """``M x`` for one vector ``x`` of shape ``(ndofs,)`` or ``(ndofs, 1)``, returned in
        x's shape and array module (NumPy in, NumPy out: a GPU operator copies ``x`` to
        the device and ``y`` back; CuPy in, CuPy out)."""
        return _like(x, self.apply(x.reshape(-1)).reshape(x.shape))

    def matmat(self, X):
        """``M X`` for ``X`` of shape ``(ndofs, k)``: one application to the ``k`` columns as
        components."""
        return _like(X, self.apply(X.T).T)

    #: the mass matrix is symmetric (and real): its adjoint is itself
    rmatvec, rmatmat = matvec, matmat

    def aslinearoperator(self):
        """This operator as a ``scipy.sparse.linalg.LinearOperator`` (a CPU operator) or a
        ``cupyx.scipy.sparse.linalg.LinearOperator`` (a GPU operator), for the Krylov
        solvers of SciPy and CuPy (``cg``, ``minres``, ...; they also take the operator
        itself). SciPy is optional: imported here, ``ImportError`` without it.

        Examples
        --------
        >>> from scipy.sparse.linalg import cg
        >>> from smalltc.fem import H1Space, box_mesh, jacobi
        >>> M = mass_operator(H1Space(box_mesh(2, 4), p=2))
        >>> A = M.aslinearoperator()
        >>> A.shape
        (81, 81)
        >>> b = M(np.ones(M.shape[0]))
        >>> x, info = cg(A, b, rtol=1e-12, M=jacobi(M.diagonal()).aslinearoperator())
        >>> info, bool(np.allclose(x, 1.0))
        (0, True)
        """
        return linear_operator(self)

    def _vector(self, x):
        """``x`` in the operator's array module and dtype (a copy only where needed)."""
        if self.xp is np and is_cupy(x):
            raise TypeError("x is a CuPy array but this operator's data are on the host; "
                            "build it with device='gpu' or pass x.get()")
        x = self.xp.asarray(x, dtype=self.dtype)
        n = self.space.ndofs
        if x.ndim not in (1, 2) or x.shape[-1] != n:
            raise ValueError(f"x has shape {x.shape}, expected ({n},) or (ncomp, {n}) for this "
                             f"space with ndofs={n}")
        return x

    def _gather(self, x):
        return self.space.gather(self._vector(x))

    def __repr__(self):
        s = self.space
        where = "" if self.xp is np else ", device='gpu'"
        return (
            f"{type(self).__name__}(dim={s.dim}, p={s.p}, nq={self.B1d.shape[0]}, E={s.nelements}, "
            f"ndofs={s.ndofs}, dtype={self.dtype}, backend={self.backend!r}{where})"
        )


def _like(x, y):
    """``y`` in the array module of ``x`` (a GPU result for a NumPy ``x`` comes back)."""
    return to_host(y) if isinstance(x, np.ndarray) and is_cupy(y) else y


def linear_operator(op):
    """``op`` (anything with ``shape``, ``dtype``, ``matvec``, ``matmat`` and ``xp``) as a
    SciPy or, for ``op.xp`` CuPy, a CuPy ``LinearOperator``; SciPy imported here."""
    if op.xp is np:
        try:
            from scipy.sparse.linalg import LinearOperator
        except ImportError as err:
            raise ImportError("aslinearoperator() needs SciPy (pip install scipy)") from err
    else:
        from cupyx.scipy.sparse.linalg import LinearOperator
    return LinearOperator(op.shape, matvec=op.matvec, rmatvec=op.matvec, matmat=op.matmat,
                          rmatmat=op.matmat, dtype=op.dtype)


def _module_of(*arrays):
    """CuPy when any of ``arrays`` is a CuPy array (the others follow it), else NumPy."""
    return cupy_or_none() if any(is_cupy(a) for a in arrays) else np


class MassOperator(_SpaceOperator):
    """Matrix-free global mass operator (partial assembly).

    Parameters
    ----------
    space : H1Space
    D : ndarray, shape (E, nq, ..., nq)
        Quadrature data, e.g. from :func:`smalltc.fem.geometry.mass_data`.
        NumPy or CuPy; a CuPy ``D`` or ``B1d`` puts the operator on the GPU.
    B1d : ndarray, shape (nq, nd)
        1D basis at the quadrature points (same rule as ``D``).
    backend : str
        Passed to :func:`smalltc.mass_apply` (or :func:`smalltc.batched_contract`).
    fused : bool
        True (default): :func:`smalltc.mass_apply`; False: gather,
        :func:`smalltc.batched_contract`, scatter-add, apart.
    deterministic : bool
        For the fused operator: additions in a fixed order, the same bits every
        run (see :func:`smalltc.mass_apply`); the unfused path always is.

    Attributes
    ----------
    xp : module
        ``numpy`` or ``cupy``: where ``D``, ``B1d`` and the results live.

    Raises
    ------
    ValueError
        If ``D`` or ``B1d`` does not match the space.
    TypeError
        When applied to a CuPy vector while the operator is on the host.

    Examples
    --------
    >>> from smalltc.fem import H1Space, basis_1d, box_mesh, mass_data
    >>> mesh = box_mesh(2, 3, distortion=0.05)
    >>> V = H1Space(mesh, p=2)
    >>> M = MassOperator(V, mass_data(mesh, 4), basis_1d(2, 4).B1d)
    >>> print(round(float(M(np.ones(V.ndofs)).sum()), 12))   # 1^T M 1 = area
    1.0
    """

    def __init__(self, space, D, B1d, *, backend="auto", fused=True, deterministic=False):
        super().__init__(space, D, B1d, backend)
        self.fused, self.deterministic = bool(fused), bool(deterministic)
        self.dof_map = space.dof_map(self.xp) if self.fused else None

    def apply(self, x, out=None):
        """``y = M x`` for ``x`` of shape ``(ndofs,)`` or ``(ncomp, ndofs)``; ``out``: the
        buffer for ``y`` (fused path)."""
        if not self.fused:
            u = smalltc.batched_contract(self.B1d, self.D, self._gather(x), backend=self.backend)
            return self.space.scatter(u)
        x = self._vector(x)
        return smalltc.mass_apply(self.B1d, self.D, x, self.dof_map, out=out,
                                  deterministic=self.deterministic, backend=self.backend)

    def diagonal(self):
        """Diagonal of the global matrix, computed without forming it.

        ``diag(M_e)[i] = sum_k prod_a B[k_a, i_a]^2 D_e[k]``, added into the global
        vector through the DoF map (:func:`smalltc.mass_diagonal`; unfused: one
        transposed interpolation with the squared basis, then scatter-add).

        Returns
        -------
        ndarray, shape (ndofs,)
            In the operator's array module.
        """
        if not self.fused:
            return self.space.scatter(interp_t(self.B1d**2, self.D, self.space.dim))
        return smalltc.mass_diagonal(self.B1d, self.D, self.dof_map, self.space.ndofs,
                                     deterministic=self.deterministic, backend=self.backend)


class AssembledMassOperator(_SpaceOperator):
    """Global mass operator from assembled element matrices.

    Parameters
    ----------
    space, D, B1d, backend
        As for :class:`MassOperator`; ``backend`` goes to
        :func:`smalltc.assemble_mass`.

    Attributes
    ----------
    matrices : ndarray, shape (E, nd**dim, nd**dim)
        Element mass matrices, multi-index flattened in C order, in the
        operator's array module. :meth:`to_csr` and :meth:`to_dense` are
        built on the host.

    Examples
    --------
    >>> from smalltc.fem import H1Space, basis_1d, box_mesh, mass_data
    >>> mesh = box_mesh(1, 2)
    >>> V = H1Space(mesh, p=1)
    >>> A = AssembledMassOperator(V, mass_data(mesh, 2), basis_1d(1, 2).B1d)
    >>> print(np.round(A.to_dense() * 12, 12))
    [[2. 1. 0.]
     [1. 4. 1.]
     [0. 1. 2.]]
    """

    def __init__(self, space, D, B1d, *, backend="auto"):
        super().__init__(space, D, B1d, backend)
        self.matrices = smalltc.assemble_mass(self.B1d, self.D, backend=backend)
        n = space.nd**space.dim
        if self.matrices.shape != (space.nelements, n, n):
            raise RuntimeError(
                f"smalltc.assemble_mass returned shape {self.matrices.shape}, "
                f"expected {(space.nelements, n, n)}"
            )

    def apply(self, x):
        """``y = M x`` for ``x`` of shape ``(ndofs,)`` or ``(ncomp, ndofs)``."""
        v = self._gather(x)
        E, n = self.matrices.shape[:2]
        flat = v.reshape(E, -1, n)  # (E, ncomp or 1, n)
        u = self.xp.matmul(flat, self.xp.swapaxes(self.matrices, 1, 2))  # u[e, c, i] = sum_j M[e, i, j] v[e, c, j]
        return self.space.scatter(u.reshape(v.shape))

    def diagonal(self):
        """Diagonal of the global matrix, shape (ndofs,), in the operator's array module."""
        d = self.xp.diagonal(self.matrices, axis1=1, axis2=2)
        return self.space.scatter(d.reshape(self.space.evector_shape))

    def to_csr(self):
        """The global matrix in compressed sparse row form, built with NumPy on the host.

        Returns
        -------
        indptr : ndarray of int64, shape (ndofs + 1,)
        indices : ndarray of int64, shape (nnz,)
            Column indices, increasing within each row.
        data : ndarray, shape (nnz,)
            Summed entries (duplicates from shared nodes merged).
        """
        E, n = self.matrices.shape[:2]
        dofs = self.space.elem_dofs.reshape(E, n)
        rows = np.repeat(dofs, n, axis=1).ravel()
        cols = np.tile(dofs, (1, n)).ravel()
        keys = rows * self.space.ndofs + cols
        uniq, inverse = np.unique(keys, return_inverse=True)
        data = np.bincount(inverse, weights=to_host(self.matrices).ravel()).astype(self.dtype, copy=False)
        r, c = np.divmod(uniq, self.space.ndofs)
        indptr = np.zeros(self.space.ndofs + 1, dtype=np.int64)
        np.cumsum(np.bincount(r, minlength=self.space.ndofs), out=indptr[1:])
        return indptr, c, data

    def to_dense(self):
        """The global matrix as a dense ``(ndofs, ndofs)`` array (small problems only)."""
        indptr, cols, data = self.to_csr()
        out = np.zeros(self.shape, dtype=self.dtype)
        rows = np.repeat(np.arange(self.space.ndofs), np.diff(indptr))
        out[rows, cols] = data
        return out


def mass_operator(space, nq=None, rho=None, *, assembled=False, quadrature="gauss",
                  dtype=np.float64, backend="auto", device="cpu", fused=True,
                  deterministic=False, comm=None):
    """Build the mass operator of an H1 space in one call.

    Parameters
    ----------
    space : H1Space
    nq : int, optional
        Quadrature points per direction; ``p + 2`` by default.
    rho : callable or float, optional
        Density, see :func:`smalltc.fem.geometry.mass_data`.
    assembled : bool
        :class:`AssembledMassOperator` if true, else :class:`MassOperator`.
    quadrature : str
        Rule name.
    dtype : numpy dtype
        float64 or float32 for ``D`` and the operator.
    backend : str
        Passed to the smalltc core.
    device : {"cpu", "gpu", "auto"}
        Where the operator lives (see :func:`smalltc.fem._device.resolve_device`);
        ``D`` is computed there (:func:`~smalltc.fem.geometry.mass_data`).
    fused : bool
        For the matrix-free operator: :func:`smalltc.mass_apply` (default), or
        gather, action and scatter apart.
    deterministic : bool
        For the fused operator: the same bits every run (see
        :func:`smalltc.mass_apply`), e.g. for reproducible CG iterates on a GPU.
    comm : mpi4py communicator, optional
        Distribute the operator over the ranks of ``comm`` (collective): the
        result is a :class:`~smalltc.fem.distributed.DistributedMassOperator` on
        this rank's block of ``space.mesh``, whose ``.space`` numbers the local
        vectors it takes. A :class:`~smalltc.fem.distributed.DistributedH1Space`
        as ``space`` brings its own communicator.

    Returns
    -------
    MassOperator or AssembledMassOperator

    Raises
    ------
    ValueError, RuntimeError
        For a bad ``device``, or ``"gpu"`` without a GPU.

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> M = mass_operator(H1Space(box_mesh(3, 2), p=1))
    >>> M.shape
    (27, 27)
    """
    if comm is not None or hasattr(space, "partition"):
        from .distributed.operators import distributed_mass_operator
        return distributed_mass_operator(space, nq, rho, assembled=assembled,
                                         quadrature=quadrature, dtype=dtype, backend=backend,
                                         device=device, fused=fused,
                                         deterministic=deterministic, comm=comm)
    xp = resolve_device(device)
    nq = space.p + 2 if nq is None else nq
    D = mass_data(space.mesh, nq, rho, quadrature=quadrature, dtype=dtype,
                  device="cpu" if xp is np else "gpu")
    B1d = basis_1d(space.p, nq, quadrature).B1d
    if assembled:
        return AssembledMassOperator(space, xp.asarray(D), xp.asarray(B1d), backend=backend)
    return MassOperator(space, xp.asarray(D), xp.asarray(B1d), backend=backend, fused=fused,
                        deterministic=deterministic)
