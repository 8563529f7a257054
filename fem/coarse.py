"""The coarse solve of the p-multigrid: assembly of a low-order operator and AMG.

* :func:`assemble_csr`: any operator of an order-``p`` H1 space on a box mesh as a
  SciPy CSR matrix, from one application per colour of probe vectors (the DoFs of
  one colour share no row: each column is read off exactly): on a box mesh's lattice
  ``i_d mod (2p + 1)`` in every direction, 27 applications at ``p = 1`` in 3D; on an
  unstructured mesh a distance-2 colouring of the element graph. An operator with
  ``to_csr()`` (assembled forms) is taken as it is.
* :class:`AMGSolver`: the algebraic multigrid of the assembled matrix. ``pyamg``
  builds the smoothed-aggregation hierarchy on the host (an optional dependency,
  ``pip install smalltc[amg]``, imported here). The solve phase is either pyamg's own
  V-cycle (``cycle="pyamg"``, CPU: symmetric Gauss-Seidel) or a portable V-cycle
  written with the array module of the vectors (``cycle="portable"``, the GPU's: the
  level matrices as ``cupyx.scipy.sparse`` CSR, Chebyshev-Jacobi smoothing of degree
  2 (:class:`~smalltc.fem.chebyshev.Chebyshev`), a dense solve on the coarsest level;
  no host round trip per cycle). One V-cycle per application: a symmetric positive
  definite preconditioner.
* :class:`CGSolver`: Jacobi-CG on the matrix-free operator to a relative tolerance
  (the plain alternative).
"""

import logging

import numpy as np

import smalltc
from smalltc._arrays import array_module

from ._device import to_device_many, to_host
from .chebyshev import Chebyshev, _Preconditioner
from .solvers import cg, jacobi

__all__ = ["assemble_csr", "element_csr", "constrained_csr", "AMGSolver", "CGSolver",
           "COARSE_SOLVERS"]

#: the coarse solvers :func:`smalltc.fem.pmg` takes by name
COARSE_SOLVERS = ("amg", "cg")


def assemble_csr(operator, space):
    """The global matrix of ``operator`` on ``space`` as ``scipy.sparse.csr_matrix``.

    Parameters
    ----------
    operator : callable
        ``x -> A x`` for vectors of ``space`` (NumPy or CuPy results); an object
        with ``to_csr()`` returning ``(indptr, indices, data)`` is used directly, and
        so is one wrapped by :class:`smalltc.fem.multigrid.Constrained`.
    space : H1Space
        Its lattice numbering gives the colouring of the probes.

    Returns
    -------
    scipy.sparse.csr_matrix
        ``(ndofs, ndofs)``, float64, on the host; explicit zeros of the pattern kept.

    Examples
    --------
    >>> from smalltc import fem
    >>> V = fem.H1Space(fem.box_mesh(1, 2), p=1)
    >>> A = assemble_csr(fem.mass_operator(V, nq=2), V)
    >>> print(np.round(A.toarray() * 12, 12))
    [[2. 1. 0.]
     [1. 4. 1.]
     [0. 1. 2.]]
    """
    import scipy.sparse as sp
    n = space.ndofs
    if getattr(operator, "matrices", None) is not None and getattr(operator, "space", None) \
            is space:
        return _csr_from_elements(operator.matrices, space)
    if hasattr(operator, "to_csr"):
        indptr, indices, data = operator.to_csr()
        return sp.csr_matrix((to_host(data), to_host(indices), to_host(indptr)), shape=(n, n))
    inner = getattr(operator, "operator", None)
    if hasattr(inner, "to_csr") and hasattr(operator, "free"):
        # a constrained assembled operator (multigrid.Constrained): F A F + C
        A = assemble_csr(inner, space)
        if operator.free is None:
            return A
        return constrained_csr(A, to_host(operator.free))
    xp = getattr(operator, "xp", np)
    dtype = getattr(operator, "dtype", np.float64)
    pattern = _pattern(space)                     # A[i, j] may be nonzero: share an element
    rows, cols, vals = [], [], []
    for sel in _colours(space, pattern):
        probe = np.zeros(n, dtype=dtype)
        probe[sel] = 1
        y = to_host(operator(xp.asarray(probe)))
        sub = pattern[:, sel].tocoo()             # rows of the chosen columns
        rows.append(sub.row)
        cols.append(sel[sub.col])
        vals.append(y[sub.row])
    return sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(n, n)).tocsr()


def _csr_from_elements(matrices, space):
    """The sum of element matrices ``(E, n, n)`` into the global CSR matrix (SciPy, float64,
    on the host): :func:`element_csr` of the space's DoF map, on the matrices' device."""
    xp = array_module(matrices)
    E, m = matrices.shape[:2]
    dofs = space.dof_map(xp).reshape(E, m) if xp is not np else \
        np.asarray(space.elem_dofs).reshape(E, m)
    return element_csr(matrices, dofs, space.ndofs)


def element_csr(matrices, dofs, n):
    """The element matrices ``(E, m, m)`` summed into an ``n x n`` CSR matrix (SciPy,
    float64, on the host, canonical: sorted, no duplicates): a COO triple summed by
    ``tocsr`` (linear time; no global sort), on the device where the matrices are
    (``cupyx.scipy.sparse``; ``dofs`` ``(E, m)`` there too), then copied to the host.

    Examples
    --------
    >>> A = element_csr(np.ones((2, 2, 2)), np.array([[0, 1], [1, 2]]), 3)
    >>> print(A.toarray())
    [[1. 1. 0.]
     [1. 2. 1.]
     [0. 1. 1.]]
    """
    import scipy.sparse as sp
    xp = array_module(matrices)
    E, m = matrices.shape[:2]
    rows = xp.repeat(dofs, m, axis=1).ravel()
    cols = xp.tile(dofs, (1, m)).ravel()
    vals = matrices.reshape(-1).astype(np.float64, copy=False)
    if xp is np:
        A = sp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
        A.sum_duplicates()
        return A
    import cupyx.scipy.sparse as csp
    A = csp.coo_matrix((vals, (rows.astype(np.int32), cols.astype(np.int32))),
                       shape=(n, n)).tocsr()
    A.sum_duplicates()
    return sp.csr_matrix((A.data.get(), A.indices.get(), A.indptr.get()), shape=(n, n))


def constrained_csr(A, free):
    """``F A F + (I - F)`` of the CSR matrix ``A`` for the free mask ``f`` (``F = diag(f)``,
    1 free, 0 constrained): the rows and columns of the constrained DoFs zeroed, their
    diagonal 1, the zeros dropped (as SciPy's products drop them), indices sorted. A copy;
    the free entries' values exactly ``A``'s.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[2.0, -1, 0], [-1, 2, -1], [0, -1, 2]]))
    >>> print(constrained_csr(A, np.array([True, True, False])).toarray())
    [[ 2. -1.  0.]
     [-1.  2.  0.]
     [ 0.  0.  1.]]
    """
    import scipy.sparse as sp
    A = sp.csr_matrix(A, copy=True)
    A.sum_duplicates()
    n = A.shape[0]
    fixed = ~np.asarray(free, dtype=bool).reshape(-1)
    rows = np.repeat(np.arange(n, dtype=A.indices.dtype), np.diff(A.indptr))
    A.data[fixed[rows] | fixed[A.indices]] = 0.0
    diag = fixed[rows] & (rows == A.indices)
    A.data[diag] = 1.0
    if int(np.count_nonzero(diag)) != int(np.count_nonzero(fixed)):   # a missing diagonal
        A = A + sp.diags(np.where(fixed & (A.diagonal() == 0), 1.0, 0.0))
    A.eliminate_zeros()
    A.sort_indices()
    return A


def _pattern(space):
    """The DoFs that share an element, as a CSR pattern (``ndofs x ndofs``, ones)."""
    import scipy.sparse as sp
    E = space.nelements
    dofs = np.asarray(space.elem_dofs).reshape(E, -1)
    inc = sp.csr_matrix((np.ones(dofs.size), (np.repeat(np.arange(E), dofs.shape[1]),
                                              dofs.ravel())), shape=(E, space.ndofs))
    C = (inc.T @ inc).tocsr()
    C.data[:] = 1.0
    return C


def _colours(space, pattern):
    """Sets of DoFs (index arrays) no two of which share a row of ``pattern``: on a box
    lattice the residues ``i_d mod (2p + 1)``; otherwise a distance-2 colouring of the
    pattern's graph, one maximal independent set of ``pattern @ pattern`` per colour
    (Luby's rule with fixed random weights)."""
    if getattr(space, "lattice_shape", None) is not None:
        L = np.array(space.lattice_shape)
        m = 2 * space.p + 1
        idx = np.indices(tuple(L)).reshape(space.dim, -1) % m
        key = np.ravel_multi_index(tuple(idx), (m,) * space.dim)
        order = np.argsort(key, kind="stable")
        bounds = np.searchsorted(key[order], np.arange(m ** space.dim + 1))
        return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    G = (pattern @ pattern).tocsr()
    G.setdiag(0)
    G.eliminate_zeros()
    G.data[:] = 1.0
    w = np.random.default_rng(0).permutation(space.ndofs).astype(np.float64) + 1.0
    uncoloured = np.ones(space.ndofs, dtype=bool)
    out = []
    while uncoloured.any():
        cand = uncoloured.copy()
        chosen = np.zeros(space.ndofs, dtype=bool)
        while cand.any():
            wc = np.where(cand, w, 0.0)
            nbr_max = G.multiply(wc[None, :]).max(axis=1).toarray().ravel()
            pick = cand & (wc > nbr_max)
            chosen |= pick
            cand &= ~pick
            cand &= ~(G @ pick.astype(np.float64) > 0)
        out.append(np.flatnonzero(chosen))
        uncoloured &= ~chosen
    return out


def _pyamg():
    try:
        import pyamg
    except ImportError as err:
        raise ImportError("the AMG coarse solve needs pyamg (pip install 'smalltc[amg]' or "
                          "pip install pyamg); or pass coarse='cg'") from err
    return pyamg


def _pyamg_present():
    """Does pyamg import (the AMG coarse solve available)?"""
    try:
        import pyamg  # noqa: F401
    except ImportError:
        return False
    return True


class _SparseLevel:
    """A level matrix of the portable cycle: ``A @ x`` and its diagonal, in ``xp``. On
    the GPU the product is one launch of :func:`smalltc.csr_spmv`
    (``templates/cuda/csr_spmv.cu.j2``; ``kernel`` True) or cupyx's (cuSPARSE, with its
    host set-up on every call)."""

    def __init__(self, A, xp, kernel=False, arrays=None):
        A = A.tocsr()
        self._diag = np.asarray(A.diagonal())   # on the host: cupyx's diagonal() compiles
        if xp is np:                            # kernels on its first call (seconds)
            self.A = A
        else:       # from the arrays (SciPy's csr_array or csr_matrix alike)
            import cupyx.scipy.sparse as csp
            data, indices, indptr = arrays if arrays is not None else \
                to_device_many((A.data, A.indices, A.indptr), xp)
            self.A = csp.csr_matrix((data, indices, indptr), shape=A.shape)
        self.xp = xp
        self.n = A.shape[0]
        self.dtype = np.dtype(A.dtype)
        self.kernel = None
        if kernel and xp is not np:
            self.kernel = self._spmv_kernel()

    def _spmv_kernel(self):
        """``x -> A x`` by :func:`smalltc.csr_spmv` (None where the index arrays' dtypes
        differ)."""
        A = self.A
        if A.indptr.dtype != A.indices.dtype:
            return None
        ops = (A.indptr, A.indices, A.data)

        def mv(x):
            return smalltc.csr_spmv(*ops, self.xp.ascontiguousarray(x), backend="cuda")
        return mv

    def __matmul__(self, x):
        return self.kernel(x) if self.kernel is not None else self.A @ x

    def __call__(self, x):
        return self @ x

    def diagonal(self):
        return self.xp.asarray(self._diag)


class AMGSolver(_Preconditioner):
    """One AMG V-cycle of the assembled coarse matrix per application.

    Parameters
    ----------
    A : scipy.sparse matrix
        Symmetric positive definite, on the host.
    xp : module
        ``numpy`` or ``cupy``: where the vectors live.
    cycle : {"auto", "pyamg", "portable"}
        ``"auto"``: pyamg's cycle for NumPy, the portable one for CuPy.
    max_coarse : int, optional
        pyamg's ``max_coarse`` (the coarsest level is solved densely; 200 by default).
        1000 gave the same pmg iterations at p = 2, 4, 6 with a level fewer (launches
        on a GPU), but its dense inverse costs 0.1-0.3 s of setup on the host against
        ~1 ms saved a solve: not the default.
    smoother_degree : int
        Portable cycle: degree of the Chebyshev-Jacobi smoother on each level.
    spmv : {"auto", "kernel", "cupyx"}
        Portable cycle on the GPU: the level products by ``templates/cuda/csr_spmv.cu.j2``
        (``"auto"``/``"kernel"``: one launch each; checked against cupyx's at setup, and
        cupyx's taken, with a warning, should they disagree) or by cupyx (cuSPARSE).
    **setup
        More keyword arguments of ``pyamg.smoothed_aggregation_solver``. Its prolongation
        smoother is ``("jacobi", {"omega": 4/3, "weighting": "local"})`` unless ``smooth=``
        is given: pyamg's default weighting (``"diagonal"``) estimates a spectral radius
        per level by Arnoldi iterations, 88% of its setup on the order-1 matrix of a
        31^3 box (0.52 s against 0.065 s on this project's 2-core CPU), for one more CG
        iteration of the AMG alone and the same p-multigrid iterations.

    Attributes
    ----------
    ml : pyamg.MultilevelSolver
        The hierarchy (setup on the host).

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(50, 50), format="csr")
    >>> S = AMGSolver(A, cycle="portable")
    >>> x = S(np.ones(50))
    >>> bool(np.linalg.norm(A @ x - 1) < 0.5 * np.sqrt(50))
    True
    """

    def __init__(self, A, xp=np, *, cycle="auto", max_coarse=None, smoother_degree=2,
                 spmv="auto", **setup):
        pyamg = _pyamg()
        if cycle not in ("auto", "pyamg", "portable"):
            raise ValueError(f"cycle must be 'auto', 'pyamg' or 'portable', got {cycle!r}")
        if cycle == "auto":
            cycle = "pyamg" if xp is np else "portable"
        if cycle == "pyamg" and xp is not np:
            raise ValueError("cycle='pyamg' runs on the host; CuPy vectors need cycle='portable'")
        A = A.tocsr().astype(np.float64)
        if max_coarse is None:
            max_coarse = 200
        # pyamg draws the start vectors of its spectral radius estimates from NumPy's global
        # generator: seeded here (and the caller's state restored), the same matrix gives the
        # same hierarchy, so the same bits, every time
        state = np.random.get_state()
        try:
            np.random.seed(0)
            setup.setdefault("smooth", ("jacobi", {"omega": 4.0 / 3.0, "weighting": "local"}))
            self.ml = pyamg.smoothed_aggregation_solver(A, max_coarse=max_coarse, **setup)
        finally:
            np.random.set_state(state)
        self.cycle, self.xp = cycle, xp
        self.n, self.dtype = A.shape[0], np.dtype(np.float64)
        self.nnz = A.nnz
        if cycle == "pyamg":
            self._M = self.ml.aspreconditioner(cycle="V")
            return
        if spmv not in ("auto", "kernel", "cupyx"):
            raise ValueError(f"spmv must be 'auto', 'kernel' or 'cupyx', got {spmv!r}")
        self.spmv = "host" if xp is np else ("cupyx" if spmv == "cupyx" else "kernel")
        self.levels = self._levels(xp, smoother_degree, self.spmv == "kernel")
        if self.spmv == "kernel" and not self._kernel_agrees():
            logging.getLogger("smalltc").warning(
                "smalltc: the CSR product kernel disagreed with cupyx's on the AMG levels; "
                "using cupyx's")
            self.spmv = "cupyx"
            self.levels = self._levels(xp, smoother_degree, False)
        Ac = self.ml.levels[-1].A.toarray()
        inv = np.linalg.pinv(Ac, hermitian=True)                            # symmetric
        import scipy.sparse as sp
        # on the GPU the dense product runs in the CSR kernel (no cuBLAS call: the V-cycle
        # can be captured as a CUDA graph, which CuPy's cuBLAS calls refuse)
        self.coarse_inv = (xp.asarray(inv) if self.spmv != "kernel" else
                           _SparseLevel(sp.csr_matrix(inv), xp, kernel=True))

    def _levels(self, xp, degree, kernel):
        mats = [M.tocsr() for lev in self.ml.levels[:-1]
                for M in (lev.A, lev.P, lev.P.T.tocsr())]
        dev = to_device_many([a for M in mats for a in (M.data, M.indices, M.indptr)], xp)
        sparse = [_SparseLevel(M, xp, kernel, arrays=dev[3 * i:3 * i + 3])
                  for i, M in enumerate(mats)]
        return [(Al, P, R, Chebyshev(Al, degree=degree))
                for Al, P, R in zip(sparse[0::3], sparse[1::3], sparse[2::3])]

    def _kernel_agrees(self):
        """The kernel's products against SciPy's on the host, a random vector, every
        matrix (once, at setup; False also where a kernel could not be made). On the host:
        cupyx's product would compile its canonical-format checks inside the setup."""
        rng = np.random.default_rng(0)
        for lev, mats in zip(self.ml.levels, self.levels):
            for M, host in zip(mats[:3], (lev.A, lev.P, lev.P.T)):
                if M.kernel is None:
                    return False
                x = rng.standard_normal(host.shape[1])
                ref = host @ x
                err = float(np.abs(to_host(M.kernel(self.xp.asarray(x))) - ref).max())
                if not err <= 1e-12 * max(1.0, float(np.abs(ref).max())):
                    return False
        return True

    def __call__(self, b):
        """One V-cycle on ``A x = b`` from zero (float64 inside; ``x`` in b's dtype)."""
        if self.cycle == "pyamg":
            return self._M.matvec(to_host(b).astype(np.float64)).astype(b.dtype, copy=False)
        return self._vcycle(0, b.astype(np.float64, copy=False)).astype(b.dtype, copy=False)

    def _vcycle(self, level, b):
        if level == len(self.levels):
            return self.coarse_inv @ b
        A, P, R, S = self.levels[level]
        x, _ = S._smooth(b.copy())                  # fused steps on the GPU (VectorOps)
        r = b - A(x)
        x += P @ self._vcycle(level + 1, R @ r)
        x, _ = S._smooth(b - A(x), x)
        return x

    def describe(self):
        """One line: levels, unknowns, operator complexity, cycle."""
        sizes = "/".join(str(lev.A.shape[0]) for lev in self.ml.levels)
        return (f"AMG (pyamg smoothed aggregation, {self.cycle} V-cycle): {len(self.ml.levels)} "
                f"levels, {sizes} unknowns, operator complexity "
                f"{self.ml.operator_complexity():.2f}")

    def __repr__(self):
        return f"AMGSolver({self.describe()})"


class CGSolver(_Preconditioner):
    """Jacobi-CG on ``operator`` to relative tolerance ``tol`` per application.

    Examples
    --------
    >>> A = np.diag([1.0, 2.0, 4.0])
    >>> S = CGSolver(lambda x: A @ x, np.diag(A).copy(), tol=1e-12)
    >>> print(np.round(S(np.ones(3)), 6))
    [1.   0.5  0.25]
    """

    def __init__(self, operator, diagonal, *, tol=1e-10, maxiter=None):
        self.operator, self.P = operator, jacobi(diagonal)
        self.xp = array_module(self.P.inv)
        self.n, self.dtype = int(self.P.inv.size), self.P.inv.dtype
        self.tol, self.maxiter = float(tol), maxiter
        self.iterations = []            # of each application (the last 100)

    def __call__(self, b):
        res = cg(self.operator, b, tol=self.tol, maxiter=self.maxiter, precond=self.P)
        self.iterations = (self.iterations + [res.iterations])[-100:]
        return res.x

    def describe(self):
        return f"Jacobi-CG to relative residual {self.tol:g}"

    def __repr__(self):
        return f"CGSolver({self.describe()})"
