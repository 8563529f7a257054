"""Global operators on an H1 space (mass, diffusion, Helmholtz), matrix-free and assembled.

Both forms compute ``y = sum_e P_e^T A_e P_e x`` with ``P_e`` the gather of
element ``e`` (:meth:`~smalltc.fem.space.H1Space.gather`) and ``A_e`` the
element matrix of the operator's quadrature function ``qfunc`` (docs/math.md
sections 2 and 7): ``M_e = B^T D_e B`` (mass), ``K_e = sum_ab G_a^T Q_e^ab G_b``
(diffusion) or ``M_e + K_e`` (Helmholtz). One class per level of assembly,
parametrised by ``qfunc`` and its data (:class:`Operator`,
:class:`AssembledOperator`); :class:`MassOperator` and
:class:`AssembledMassOperator` are the mass instances with the mass signature
``(space, D, B1d)``. For the mass operator:

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
from smalltc import vertices
from smalltc._arrays import cupy_or_none, is_cupy
from smalltc._validate import check_scalar

from ._device import resolve_device, to_host
from .basis import basis_1d
from .geometry import diffusion_data, mass_data
from .quadrature import RULES

__all__ = ["Operator", "AssembledOperator", "MassOperator", "AssembledMassOperator",
           "mass_operator", "diffusion_operator", "helmholtz_operator", "linear_operator",
           "Float32DataOperator", "VertexOperator"]


class _SpaceOperator:
    """Shared checks and bookkeeping of the global operators.

    ``data`` is ``D`` (qfunc "mass"), ``Q`` ("diffusion") or ``(D, Q)`` ("helmholtz");
    ``B1d`` None is the collocated form (``G1d`` square), not for mass."""

    def __init__(self, space, data, B1d, backend, qfunc="mass", G1d=None):
        if qfunc not in ("mass", "diffusion", "helmholtz"):
            raise ValueError(f"qfunc must be 'mass', 'diffusion' or 'helmholtz', got {qfunc!r}")
        pair = qfunc == "helmholtz"
        if pair and (not isinstance(data, (tuple, list)) or len(data) != 2):
            raise TypeError("data of a Helmholtz operator is the pair (D, Q)")
        D = data[0] if pair else (data if qfunc == "mass" else None)
        Q = data[1] if pair else (data if qfunc == "diffusion" else None)
        if qfunc == "mass" and G1d is not None:
            raise ValueError("G1d is for the diffusion and Helmholtz operators; the mass "
                             "operator takes none")
        if qfunc != "mass" and G1d is None:
            raise ValueError(f"the {qfunc} operator needs G1d (nq, nd)")
        if qfunc == "mass" and B1d is None:
            raise ValueError("B1d is None, but the mass operator has no collocated form")
        xp = _module_of(*(a for a in (D, Q, B1d, G1d) if a is not None))
        D = None if D is None else xp.asarray(D)
        Q = None if Q is None else xp.asarray(Q)
        first = D if D is not None else Q
        name = "D" if D is not None else "Q"
        if first.dtype not in (np.float32, np.float64):
            raise ValueError(f"{name} has dtype {first.dtype}, expected float64 or float32")
        basis = xp.asarray(B1d if B1d is not None else G1d)
        bname = "B1d" if B1d is not None else "G1d"
        if basis.ndim != 2 or basis.shape[1] != space.nd:
            raise ValueError(f"{bname} has shape {basis.shape}, expected (nq, {space.nd}) for "
                             f"p={space.p}")
        nq = basis.shape[0]
        if G1d is not None and tuple(xp.asarray(G1d).shape) != tuple(basis.shape):
            raise ValueError(f"G1d has shape {tuple(G1d.shape)}, expected {tuple(basis.shape)}"
                             f" (B1d's)")
        if B1d is None and nq != space.nd:
            raise ValueError(f"B1d is None (collocated) but G1d has shape {basis.shape}: "
                             f"collocated needs nq == nd = {space.nd}")
        expected = (space.nelements,) + (nq,) * space.dim
        if D is not None and D.shape != expected:
            raise ValueError(
                f"D has shape {D.shape}, expected {expected} for E={space.nelements}, "
                f"nq={nq}, dim={space.dim}"
            )
        nsym = space.dim * (space.dim + 1) // 2
        q_expected = (space.nelements, nsym) + (nq,) * space.dim
        if Q is not None and Q.shape != q_expected:
            raise ValueError(
                f"Q has shape {Q.shape}, expected {q_expected} for E={space.nelements}, "
                f"nsym={nsym}, nq={nq}, dim={space.dim}"
            )
        dt = first.dtype
        self.space = space
        self.xp = xp
        self.qfunc = qfunc
        self.D = None if D is None else xp.ascontiguousarray(D, dtype=dt)
        self.Q = None if Q is None else xp.ascontiguousarray(Q, dtype=dt)
        self.B1d = None if B1d is None else xp.ascontiguousarray(B1d, dtype=dt)
        self.G1d = None if G1d is None else xp.ascontiguousarray(G1d, dtype=dt)
        self.nq = nq
        self.backend = backend
        self.dtype = dt

    @property
    def data(self):
        """What the core's operator functions take: ``D``, ``Q`` or ``(D, Q)``."""
        return {"mass": self.D, "diffusion": self.Q}.get(self.qfunc, (self.D, self.Q))

    @property
    def collocated(self):
        """True when ``B1d`` is the identity (Gauss-Lobatto points on the nodes)."""
        return self.B1d is None

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

    #: every operator of the family is symmetric (and real): its adjoint is itself
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
        q = "" if self.qfunc == "mass" else f"qfunc={self.qfunc!r}, "
        co = ", collocated" if self.collocated else ""
        return (
            f"{type(self).__name__}({q}dim={s.dim}, p={s.p}, nq={self.nq}, E={s.nelements}, "
            f"ndofs={s.ndofs}, dtype={self.dtype}, backend={self.backend!r}{where}{co})"
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


class Operator(_SpaceOperator):
    """Matrix-free global operator of the family (partial assembly).

    Parameters
    ----------
    space : H1Space
    data : ndarray or pair of ndarrays
        ``D`` (E, nq, ..., nq) for ``qfunc="mass"`` (:func:`~smalltc.fem.geometry.mass_data`),
        ``Q`` (E, nsym, nq, ..., nq) for ``"diffusion"``
        (:func:`~smalltc.fem.geometry.diffusion_data`), ``(D, Q)`` for ``"helmholtz"``.
        NumPy or CuPy; CuPy data put the operator on the GPU.
    B1d : ndarray, shape (nq, nd), or None
        1D basis at the quadrature points (same rule as the data); None: collocated
        (nq == nd, Gauss-Lobatto points on the nodes; not for mass).
    G1d : ndarray, shape (nq, nd), optional
        1D basis derivatives; needed by diffusion and Helmholtz.
    qfunc : {"mass", "diffusion", "helmholtz"}
    backend : str
        Passed to :func:`smalltc.operator_apply` (or :func:`smalltc.operator_action`).
    fused : bool
        True (default): :func:`smalltc.operator_apply` (one kernel on a GPU); False:
        gather, :func:`smalltc.operator_action`, scatter-add, apart.
    deterministic : bool
        For the fused operator: additions in a fixed order, the same bits every
        run (see :func:`smalltc.mass_apply`); the unfused path always is.

    Attributes
    ----------
    xp : module
        ``numpy`` or ``cupy``: where the data and the results live.
    qfunc, D, Q, B1d, G1d : as given (None where absent)

    Raises
    ------
    ValueError
        If the data or the bases do not match the space (naming the operand).
    TypeError
        When applied to a CuPy vector while the operator is on the host.

    Examples
    --------
    >>> from smalltc.fem import H1Space, basis_1d, box_mesh, diffusion_data
    >>> mesh = box_mesh(2, 3, distortion=0.05)
    >>> V = H1Space(mesh, p=2)
    >>> b = basis_1d(2, 4)
    >>> K = Operator(V, diffusion_data(mesh, 4), b.B1d, b.G1d, qfunc="diffusion")
    >>> float(abs(K(np.ones(V.ndofs))).max()) < 1e-12          # K 1 = 0
    True
    """

    def __init__(self, space, data, B1d, G1d=None, *, qfunc="mass", backend="auto",
                 fused=True, deterministic=False):
        super().__init__(space, data, B1d, backend, qfunc, G1d)
        self.fused, self.deterministic = bool(fused), bool(deterministic)
        self.dof_map = space.dof_map(self.xp) if self.fused else None

    def apply(self, x, out=None):
        """``y = A x`` for ``x`` of shape ``(ndofs,)`` or ``(ncomp, ndofs)``; ``out``: the
        buffer for ``y`` (fused path)."""
        mass = self.qfunc == "mass"          # the mass functions: the shortest call path
        if not self.fused:
            v = self._gather(x)
            u = (smalltc.batched_contract(self.B1d, self.D, v, backend=self.backend) if mass
                 else smalltc.operator_action(self.qfunc, self.B1d, self.G1d, self.data, v,
                                              backend=self.backend))
            return self.space.scatter(u)
        x = self._vector(x)
        if mass:
            return smalltc.mass_apply(self.B1d, self.D, x, self.dof_map, out=out,
                                      deterministic=self.deterministic, backend=self.backend)
        return smalltc.operator_apply(self.qfunc, self.B1d, self.G1d, self.data, x,
                                      self.dof_map, out=out, deterministic=self.deterministic,
                                      backend=self.backend)

    def diagonal(self):
        """Diagonal of the global matrix, computed without forming it.

        For mass ``diag(M_e)[i] = sum_k prod_a B[k_a, i_a]^2 D_e[k]``; for diffusion the
        same with the products of the per-axis 1D matrices of each pair (a, b); added
        into the global vector through the DoF map (:func:`smalltc.operator_diagonal`;
        unfused: the element diagonals, then scatter-add).

        Returns
        -------
        ndarray, shape (ndofs,)
            In the operator's array module.
        """
        if not self.fused:
            if self.qfunc == "mass":
                return self.space.scatter(smalltc.integrate(self.B1d**2, None, self.D))
            return smalltc.operator_diagonal(self.qfunc, self.B1d, self.G1d, self.data,
                                             self.space.dof_map(self.xp), self.space.ndofs,
                                             backend="reference")
        if self.qfunc == "mass":
            return smalltc.mass_diagonal(self.B1d, self.D, self.dof_map, self.space.ndofs,
                                         deterministic=self.deterministic,
                                         backend=self.backend)
        return smalltc.operator_diagonal(self.qfunc, self.B1d, self.G1d, self.data,
                                         self.dof_map, self.space.ndofs,
                                         deterministic=self.deterministic,
                                         backend=self.backend)


class Float32DataOperator(Operator):
    """:class:`Operator` whose point data ``D``/``Q`` are stored in float32 while its bases
    and vectors are float64: the kernels read float32 and compute in float64 (half the
    point-data bytes; docs/math.md section 8). Built by :func:`mass_operator` and
    :func:`diffusion_operator` with ``point_data="float32"``; the diagonal is computed
    from the float32 data upcast (once, at the call)."""

    def __init__(self, space, data, B1d, G1d=None, **kw):
        super().__init__(space, data, B1d, G1d, **kw)
        if self.dtype != np.float64:
            raise ValueError(f"point_data='float32' is for float64 operators, got "
                             f"{self.dtype}")
        self.D = None if self.D is None else self.D.astype(np.float32)
        self.Q = None if self.Q is None else self.Q.astype(np.float32)

    def diagonal(self):
        D, Q = self.D, self.Q
        try:
            self.D = None if D is None else D.astype(self.dtype)
            self.Q = None if Q is None else Q.astype(self.dtype)
            return super().diagonal()
        finally:
            self.D, self.Q = D, Q


class VertexOperator(Operator):
    """:class:`Operator` whose point data are recomputed in the kernel from the element
    vertices ``X`` (E, 2^dim, dim) and a coefficient ``coef`` (E,) (docs/math.md section
    8): no ``D``/``Q`` in memory, 2^dim dim + 1 values an element read. Mass and diffusion,
    fused only; order-1 (multilinear) geometry. Built by :func:`mass_operator` and
    :func:`diffusion_operator` with ``point_data="vertices"``.

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> space = H1Space(box_mesh(2, 3, distortion=0.05), p=2)
    >>> K = diffusion_operator(space, point_data="vertices")
    >>> K0 = diffusion_operator(space)
    >>> x = np.random.default_rng(0).random(space.ndofs)
    >>> bool(np.allclose(K(x), K0(x), rtol=1e-12, atol=1e-12))
    True
    """

    def __init__(self, space, X, coef, B1d, G1d=None, *, qfunc="mass", backend="auto",
                 deterministic=False, dtype=np.float64):
        if qfunc not in ("mass", "diffusion"):
            raise ValueError(f"point_data='vertices' is for the mass and diffusion "
                             f"operators, got qfunc {qfunc!r}")
        xp = _module_of(*(a for a in (X, B1d, G1d) if a is not None))
        self.space, self.xp, self.qfunc = space, xp, qfunc
        self.dtype = np.dtype(dtype)
        self.X = xp.ascontiguousarray(xp.asarray(X), dtype=self.dtype)
        self.coef = xp.ascontiguousarray(xp.asarray(coef), dtype=self.dtype)
        self.B1d = None if B1d is None else xp.ascontiguousarray(B1d, dtype=self.dtype)
        self.G1d = None if G1d is None else xp.ascontiguousarray(G1d, dtype=self.dtype)
        self.nq = (B1d if B1d is not None else G1d).shape[0]
        self.D = self.Q = None
        self.backend = backend
        self.fused, self.deterministic = True, bool(deterministic)
        self.dof_map = space.dof_map(xp)

    def point_data(self):
        """The stored form's D or Q of this operator (:func:`smalltc.vertices.point_data`)."""
        return vertices.point_data(self.qfunc, self.X, self.coef, self.nq, self.collocated)

    def apply(self, x, out=None):
        """``y = A x``, the point data recomputed in the kernel."""
        x = self._vector(x)
        return smalltc.operator_apply(self.qfunc, self.B1d, self.G1d, None, x, self.dof_map,
                                      out=out, deterministic=self.deterministic,
                                      backend=self.backend, vertices=self.X, coef=self.coef)

    def diagonal(self):
        """The diagonal, from the point data computed once at the call."""
        data = self.point_data()
        if self.qfunc == "mass":
            return smalltc.mass_diagonal(self.B1d, data, self.dof_map, self.space.ndofs,
                                         deterministic=self.deterministic,
                                         backend=self.backend)
        return smalltc.operator_diagonal(self.qfunc, self.B1d, self.G1d, data, self.dof_map,
                                         self.space.ndofs, deterministic=self.deterministic,
                                         backend=self.backend)


def _coefficient(value, space, name):
    """A vertex operator's coefficient: None (1), a number, or an (E,) array of
    per-element values; a function of x needs the stored point data."""
    E = space.nelements
    if value is None:
        return np.ones(E)
    if callable(value):
        raise ValueError(f"point_data='vertices' takes {name} as a number or an (E,) array of "
                         f"per-element values, not a function of x (use the stored point "
                         "data for a varying coefficient)")
    a = np.asarray(to_host(value) if is_cupy(value) else value, dtype=np.float64)
    if a.ndim == 0:
        return np.full(E, float(a))
    if a.shape != (E,):
        raise ValueError(f"{name} has shape {a.shape}, expected a number or ({E},) for "
                         "point_data='vertices' (one value an element)")
    return a


def _point_data_operator(point_data, space, qfunc, data_fn, coefficient, name, nq, quadrature,
                         B1d, G1d, assembled, backend, fused, deterministic, dtype, xp):
    """The non-stored forms of :func:`mass_operator` and :func:`diffusion_operator`."""
    if point_data not in ("float32", "vertices"):
        raise ValueError(f"point_data must be 'stored', 'float32' or 'vertices', got "
                         f"{point_data!r}")
    if assembled or not fused:
        raise ValueError(f"point_data={point_data!r} is for the fused matrix-free operator "
                         "(assembled=False, fused=True)")
    if np.dtype(dtype) != np.float64:
        raise ValueError(f"point_data={point_data!r} is for float64 operators, got dtype "
                         f"{np.dtype(dtype)}")
    if point_data == "float32":
        data = data_fn()
        return Float32DataOperator(space, xp.asarray(data), B1d, G1d, qfunc=qfunc,
                                   backend=backend, fused=True, deterministic=deterministic)
    X = vertices.vertices_of_mesh(space.mesh, check_nq=nq)
    coef = _coefficient(coefficient, space, name)
    return VertexOperator(space, xp.asarray(X), xp.asarray(coef), B1d, G1d, qfunc=qfunc,
                          backend=backend, deterministic=deterministic)


class MassOperator(Operator):
    """Matrix-free global mass operator: :class:`Operator` with ``qfunc="mass"``.

    Parameters
    ----------
    space : H1Space
    D : ndarray, shape (E, nq, ..., nq)
        Quadrature data, e.g. from :func:`smalltc.fem.geometry.mass_data`.
        NumPy or CuPy; a CuPy ``D`` or ``B1d`` puts the operator on the GPU.
    B1d : ndarray, shape (nq, nd)
        1D basis at the quadrature points (same rule as ``D``).
    backend, fused, deterministic : as for :class:`Operator`
        (:func:`smalltc.mass_apply` when fused).

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
        super().__init__(space, D, B1d, backend=backend, fused=fused,
                         deterministic=deterministic)


class AssembledOperator(_SpaceOperator):
    """Global operator of the family from assembled element matrices.

    Parameters
    ----------
    space, data, B1d, G1d, qfunc, backend
        As for :class:`Operator`; ``backend`` goes to
        :func:`smalltc.assemble_operator`.

    Attributes
    ----------
    matrices : ndarray, shape (E, nd**dim, nd**dim)
        Element matrices, multi-index flattened in C order, in the
        operator's array module. :meth:`to_csr` and :meth:`to_dense` are
        built on the host.

    Examples
    --------
    >>> from smalltc.fem import H1Space, basis_1d, box_mesh, diffusion_data
    >>> mesh = box_mesh(1, 2)
    >>> b = basis_1d(1, 2)
    >>> K = AssembledOperator(H1Space(mesh, p=1), diffusion_data(mesh, 2), b.B1d, b.G1d,
    ...                       qfunc="diffusion")
    >>> print(np.round(K.to_dense() / 2, 12))        # 1 / h = 2
    [[ 1. -1.  0.]
     [-1.  2. -1.]
     [ 0. -1.  1.]]
    """

    def __init__(self, space, data, B1d, G1d=None, *, qfunc="mass", backend="auto"):
        super().__init__(space, data, B1d, backend, qfunc, G1d)
        self.matrices = smalltc.assemble_operator(self.qfunc, self.B1d, self.G1d, self.data,
                                                  backend=backend)
        n = space.nd**space.dim
        if self.matrices.shape != (space.nelements, n, n):
            raise RuntimeError(
                f"smalltc.assemble_operator returned shape {self.matrices.shape}, "
                f"expected {(space.nelements, n, n)}"
            )

    def apply(self, x):
        """``y = A x`` for ``x`` of shape ``(ndofs,)`` or ``(ncomp, ndofs)``."""
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


class AssembledMassOperator(AssembledOperator):
    """Global mass operator from assembled element matrices: :class:`AssembledOperator`
    with ``qfunc="mass"`` (:func:`smalltc.assemble_mass`).

    Parameters
    ----------
    space, D, B1d, backend
        As for :class:`MassOperator`.

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
        super().__init__(space, D, B1d, backend=backend)


def mass_operator(space, nq=None, rho=None, *, assembled=False, quadrature="gauss",
                  dtype=np.float64, backend="auto", device="cpu", fused=True,
                  deterministic=False, point_data="stored"):
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
    point_data : {"stored", "float32", "vertices"}
        Where the point data ``D`` come from (docs/math.md section 8): stored in the
        operator's dtype (default); stored in float32 with float64 vectors
        (:class:`Float32DataOperator`); or recomputed in the kernel from the element
        vertices (:class:`VertexOperator`: order-1 geometry, ``rho`` a number or one value
        an element; a curved mesh raises ValueError). Both for the fused float64
        operator only.

    Returns
    -------
    MassOperator, AssembledMassOperator, Float32DataOperator or VertexOperator

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
    xp = resolve_device(device)
    nq = space.p + 2 if nq is None else nq
    if point_data != "stored":
        return _point_data_operator(
            point_data, space, "mass",
            lambda: mass_data(space.mesh, nq, rho, quadrature=quadrature, dtype=np.float64),
            rho, "rho", nq, quadrature, xp.asarray(basis_1d(space.p, nq, quadrature).B1d),
            None, assembled, backend, fused, deterministic, dtype, xp)
    D = mass_data(space.mesh, nq, rho, quadrature=quadrature, dtype=dtype,
                  device="cpu" if xp is np else "gpu")
    B1d = basis_1d(space.p, nq, quadrature).B1d
    if assembled:
        return AssembledMassOperator(space, xp.asarray(D), xp.asarray(B1d), backend=backend)
    return MassOperator(space, xp.asarray(D), xp.asarray(B1d), backend=backend, fused=fused,
                        deterministic=deterministic)


def _operator_basis(space, nq, quadrature, xp):
    """(B1d or None, G1d, nq): the collocated form (B1d None) where the rule's points are
    the nodes (Gauss-Lobatto with nq = p + 1)."""
    b = basis_1d(space.p, nq, quadrature)
    collocated = RULES.get(quadrature) == "lobatto" and nq == space.p + 1
    return (None if collocated else xp.asarray(b.B1d)), xp.asarray(b.G1d)


def _build(space, qfunc, data, B1d, G1d, assembled, backend, fused, deterministic):
    if assembled:
        return AssembledOperator(space, data, B1d, G1d, qfunc=qfunc, backend=backend)
    return Operator(space, data, B1d, G1d, qfunc=qfunc, backend=backend, fused=fused,
                    deterministic=deterministic)


def diffusion_operator(space, nq=None, kappa=None, *, assembled=False, quadrature="gauss",
                       dtype=np.float64, backend="auto", device="cpu", fused=True,
                       deterministic=False, point_data="stored"):
    """Build the diffusion (stiffness) operator ``K`` of an H1 space in one call:
    ``u^T K v = int kappa grad u . grad v`` (CEED BP3; BP5 collocated).

    Parameters
    ----------
    space : H1Space
    nq : int, optional
        Quadrature points per direction; ``p + 2`` by default (``p + 1`` for
        ``quadrature="gll"``).
    kappa : callable or float, optional
        Diffusion coefficient, see :func:`smalltc.fem.geometry.diffusion_data`.
    assembled : bool
        :class:`AssembledOperator` (with :meth:`~AssembledOperator.to_csr`) if true,
        else the matrix-free :class:`Operator`.
    quadrature : str
        Rule name; ``"gll"`` with ``nq = p + 1`` is the collocated form (Gauss-Lobatto
        points on the nodes: ``B1d`` the identity, not applied).
    dtype, backend, device, fused, deterministic : as for :func:`mass_operator`.
    point_data : {"stored", "float32", "vertices"}
        As for :func:`mass_operator` (``Q`` in float32, or recomputed from the vertices
        with ``kappa`` a number or one value an element).

    Returns
    -------
    Operator, AssembledOperator, Float32DataOperator or VertexOperator

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> space = H1Space(box_mesh(3, 2, distortion=0.05), p=2)
    >>> K = diffusion_operator(space, quadrature="gll")     # collocated (BP5)
    >>> K.collocated, K.shape
    (True, (125, 125))
    >>> float(abs(K(np.ones(space.ndofs))).max()) < 1e-12
    True
    """
    xp = resolve_device(device)
    nq = (space.p + (1 if quadrature in ("gll", "lobatto", "gauss-lobatto") else 2)
          if nq is None else nq)
    if point_data != "stored":
        B1d, G1d = _operator_basis(space, nq, quadrature, xp)
        return _point_data_operator(
            point_data, space, "diffusion",
            lambda: diffusion_data(space.mesh, nq, kappa, quadrature=quadrature,
                                   dtype=np.float64),
            kappa, "kappa", nq, quadrature, B1d, G1d, assembled, backend, fused,
            deterministic, dtype, xp)
    Q = diffusion_data(space.mesh, nq, kappa, quadrature=quadrature, dtype=dtype,
                       device="cpu" if xp is np else "gpu")
    B1d, G1d = _operator_basis(space, nq, quadrature, xp)
    return _build(space, "diffusion", Q, B1d, G1d, assembled, backend, fused, deterministic)


def helmholtz_operator(space, alpha, nq=None, kappa=None, *, assembled=False,
                       quadrature="gauss", dtype=np.float64, backend="auto", device="cpu",
                       fused=True, deterministic=False):
    """Build ``alpha M + K`` (mass plus diffusion) of an H1 space in one call: one fused
    operator (``qfunc="helmholtz"``), not two applications.

    Parameters
    ----------
    space : H1Space
    alpha : float
        The mass term's factor (``D = alpha * w * |J|``).
    nq, kappa, assembled, quadrature, dtype, backend, device, fused, deterministic :
        as for :func:`diffusion_operator`.

    Returns
    -------
    Operator or AssembledOperator

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh, cg, jacobi
    >>> space = H1Space(box_mesh(2, 3, distortion=0.05), p=3)
    >>> A = helmholtz_operator(space, 1.0)
    >>> x = np.random.default_rng(0).random(space.ndofs)
    >>> sol = cg(A, A(x), tol=1e-12, precond=jacobi(A.diagonal()))
    >>> bool(np.abs(sol.x - x).max() < 1e-8)
    True
    """
    alpha = check_scalar("alpha", alpha)
    xp = resolve_device(device)
    nq = (space.p + (1 if quadrature in ("gll", "lobatto", "gauss-lobatto") else 2)
          if nq is None else nq)
    where = "cpu" if xp is np else "gpu"
    D = mass_data(space.mesh, nq, alpha, quadrature=quadrature, dtype=dtype, device=where)
    Q = diffusion_data(space.mesh, nq, kappa, quadrature=quadrature, dtype=dtype, device=where)
    B1d, G1d = _operator_basis(space, nq, quadrature, xp)
    return _build(space, "helmholtz", (D, Q), B1d, G1d, assembled, backend, fused,
                  deterministic)
