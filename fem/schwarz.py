"""Overlapping additive Schwarz with fast-diagonalisation (FDM) local solves.

The smoother of NekRS's and Nek5000's p-multigrid (Lottes & Fischer 2005, "Hybrid
multigrid/Schwarz algorithms for the spectral element method"), for the H1 (Gauss-Lobatto)
spaces of box meshes: every element is one subdomain, extended by ``overlap`` nodes into
each neighbour, on which the diffusion (Helmholtz) problem with homogeneous Dirichlet
conditions beyond the extension is replaced by a separable one and solved exactly.

**The local problem.** Per element and reference direction ``d`` a 1D stiffness ``A_d``
and mass ``M_d`` on the ``n = p + 1 + 2 overlap`` nodes of the extended element: the 1D
Gauss-Lobatto element matrices ``(2/h) K1`` and ``(h/2) M1`` of the element (length
``h`` = the mean length of its edges along ``d``), plus, with ``overlap=1``, the part of
the neighbour's own matrices (its length) coupling its last two nodes (the node beyond
is Dirichlet; at p = 1, where that is the neighbour's far vertex, its row is completed by
a segment of the neighbour's length beyond it, as in the assembled matrix); without a
neighbour (the domain's boundary) the extension is absent, and a face whose DoFs are all
constrained makes the element's boundary node Dirichlet. The
local operator is (3D; 2D alike) ::

    K_e = kappa (M_z x M_y x A_x + M_z x A_y x M_x + A_z x M_y x M_x) + alpha M_z x M_y x M_x

and with the generalised eigendecompositions ``A_d S_d = M_d S_d diag(lam_d)``,
``S_d^T M_d S_d = I``, its inverse is exactly ::

    K_e^-1 = (S_z x S_y x S_x) diag(1 / (kappa (lam_x + lam_y + lam_z) + alpha)) (S_z x S_y x S_x)^T

so on a mesh of equal boxes it is the inverse of the element's stiffness matrix extended
by the overlap (with ``mass="consistent"``: exact integration; ``"lumped"``: the
Gauss-Lobatto rule's diagonal mass, as Nek's collocated operators).

**The preconditioner** ``z = W^1/2 sum_e R_e^T K_e^-1 R_e W^1/2 r`` (``R_e``: restriction
to the extended element through the lattice's index map; ``W``: the inverse of each
DoF's count of subdomains with ``weights="sqrt"``, the identity with ``"none"``) is
symmetric positive definite. With constrained DoFs (free mask ``f``) it is ``f P f r +
(1 - f) r``, the identity where :class:`~smalltc.fem.multigrid.Constrained` is.

Setup on the host (batched ``numpy.linalg`` eigendecompositions), then the 1D
eigenvector matrices ``S`` (E, dim, n, n), the inverse eigenvalues (E, n, ..., n) and the
index map are moved to the array module. On the host an application is one compiled
kernel (``templates/cpu/schwarz_fdm.py.j2``) and a ``numpy.bincount``; on a GPU one kernel
(``templates/cuda/schwarz_fdm.cu.j2``: gather, the ``2 dim`` one-axis transforms and the
scale in shared memory, atomic scatter-add), so the V-cycle's CUDA graph can hold it;
elsewhere (no Numba, or an element's buffers beyond 48 KiB of shared memory) ``2 dim``
batched matrix products (``xp.matmul``, one matrix per element) and a scatter-add. No
host round trip.
"""

import numpy as np

import smalltc
from ._device import to_host
from .basis import lagrange_basis
from .chebyshev import _Preconditioner
from .quadrature import gauss_legendre, gauss_lobatto

__all__ = ["Schwarz", "schwarz", "element_lengths", "reference_matrices", "fdm_pair",
           "WEIGHTS", "MASSES"]

#: the weightings of :class:`Schwarz`
WEIGHTS = ("sqrt", "none")
#: the 1D mass matrices of :class:`Schwarz`'s local problems
MASSES = ("consistent", "lumped")


def reference_matrices(p, mass="consistent"):
    """The 1D order-``p`` Gauss-Lobatto stiffness ``K1[i, j] = int phi_i' phi_j'`` and mass
    ``M1`` on ``[-1, 1]``: exact (``"consistent"``) or the Gauss-Lobatto rule's diagonal
    (``"lumped"``).

    Examples
    --------
    >>> K1, M1 = reference_matrices(1)
    >>> print(K1, M1, sep="\\n")
    [[ 0.5 -0.5]
     [-0.5  0.5]]
    [[0.66666667 0.33333333]
     [0.33333333 0.66666667]]
    """
    if mass not in MASSES:
        raise ValueError(f"mass must be one of {list(MASSES)}, got {mass!r}")
    nodes, wl = gauss_lobatto(p + 1)
    xq, wq = gauss_legendre(p + 2)
    B, G = lagrange_basis(nodes, xq)
    K1 = G.T @ (wq[:, None] * G)
    M1 = B.T @ (wq[:, None] * B) if mass == "consistent" else np.diag(wl)
    return K1, M1


def element_lengths(mesh):
    """The mean length of each element's edges along each reference direction,
    shape (E, dim), from the vertex coordinates (the corner geometry nodes).

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> print(element_lengths(box_mesh(2, (2, 4), upper=(1.0, 2.0)))[0])
    [0.5 0.5]
    """
    nodes = np.asarray(mesh.nodes)
    dim = mesh.dim
    corners = nodes[(slice(None), slice(None)) + (slice(None, None, nodes.shape[-1] - 1),) * dim]
    out = np.empty((nodes.shape[0], dim))
    for d in range(dim):
        edge = np.diff(corners, axis=2 + d)                 # (E, dim, 2.., 1, 2..)
        out[:, d] = np.sqrt((edge ** 2).sum(axis=1)).reshape(nodes.shape[0], -1).mean(axis=1)
    return out


def fdm_pair(A, M):
    """Batched generalised eigendecomposition ``A S = M S diag(lam)``, ``S^T M S = I`` of
    symmetric ``A`` and SPD ``M`` (shape (..., n, n)); returns ``(lam, S)``.

    Examples
    --------
    >>> lam, S = fdm_pair(np.array([[2.0, -1.0], [-1.0, 2.0]]), np.eye(2))
    >>> print(np.round(lam, 12))
    [1. 3.]
    """
    L = np.linalg.cholesky(M)
    Li = np.linalg.inv(L)
    C = Li @ A @ np.swapaxes(Li, -1, -2)
    lam, Q = np.linalg.eigh(0.5 * (C + np.swapaxes(C, -1, -2)))
    return lam, np.swapaxes(Li, -1, -2) @ Q


def _local_1d(K1, M1, h, hl, hr, left, right, overlap):
    """The extended 1D matrices of every element along one direction, (E, n, n) each.

    ``h, hl, hr``: the element's and its neighbours' lengths (E,); ``left``/``right``:
    0 neighbour, 1 no neighbour (free boundary), 2 Dirichlet boundary (the element's
    boundary node decoupled)."""
    E, nd = h.size, K1.shape[0]
    p = nd - 1
    n = nd + 2
    A = np.zeros((E, n, n))
    M = np.zeros((E, n, n))
    A[:, 1:-1, 1:-1] = (2.0 / h)[:, None, None] * K1
    M[:, 1:-1, 1:-1] = (0.5 * h)[:, None, None] * M1
    for side, flag, hn in ((0, left, hl), (1, right, hr)):
        nb = flag == 0
        blk = slice(0, 2) if side == 0 else slice(n - 2, n)
        src = slice(p - 1, nd) if side == 0 else slice(0, 2)
        A[nb, blk, blk] += (2.0 / hn[nb])[:, None, None] * K1[src, src]
        M[nb, blk, blk] += (0.5 * hn[nb])[:, None, None] * M1[src, src]
        ext = 0 if side == 0 else n - 1
        if p == 1:
            # the extended node is the neighbour's far vertex: the segment beyond it (taken
            # of the neighbour's length) closes its row, as in the assembled matrix
            A[nb, ext, ext] += (2.0 / hn[nb]) * K1[0, 0]
            M[nb, ext, ext] += (0.5 * hn[nb]) * M1[0, 0]
        A[~nb, ext, :] = A[~nb, :, ext] = M[~nb, ext, :] = M[~nb, :, ext] = 0.0
        A[~nb, ext, ext] = M[~nb, ext, ext] = 1.0
        dr = flag == 2
        own = 1 if side == 0 else n - 2
        A[dr, own, :] = A[dr, :, own] = M[dr, own, :] = M[dr, :, own] = 0.0
        A[dr, own, own] = M[dr, own, own] = 1.0
    if overlap == 0:
        return A[:, 1:-1, 1:-1].copy(), M[:, 1:-1, 1:-1].copy()
    return A, M


def _numba_present():
    """Does Numba import (the host kernels available)?"""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


class Schwarz(_Preconditioner):
    """Overlapping additive Schwarz preconditioner with FDM local solves; made by
    :func:`schwarz` (see the module's docstring for the mathematics).

    Parameters
    ----------
    space : H1Space
        On a box mesh (:func:`~smalltc.fem.box_mesh`, :func:`~smalltc.fem.kershaw_mesh`):
        the extended elements are read off its lattice.
    xp : module
        NumPy or CuPy: where the vectors live.
    free : array of bool, optional
        The free (unconstrained) DoFs; None: all free.
    overlap : {1, 0}
        Nodes of the extension into each neighbour (0: the element's own nodes, Dirichlet
        at the neighbours' first interior nodes).
    weights : {"sqrt", "none"}
        ``W^1/2`` on both sides (``W``: 1 / the number of subdomains holding the DoF), or
        plain additive Schwarz.
    mass : {"consistent", "lumped"}
        The 1D mass matrices (:func:`reference_matrices`).
    kappa : float or array of shape (E,)
        Diffusion coefficient per element (1).
    alpha : float
        The mass term's factor (0: diffusion; a Helmholtz level's ``alpha``).
    dtype : dtype
    host_kernel : bool or None
        NumPy vectors: the local solves compiled with Numba
        (``templates/cpu/schwarz_fdm.py.j2``: gather, the ``2 dim`` sum-factorised
        products and the scale per element, eight elements at a time in SIMD lanes; then
        ``numpy.bincount``); False: the array path (``numpy.matmul`` with one matrix per
        element). None (default): compiled where Numba imports (one AVX2 thread, Kershaw
        3D, ~60k DoFs, one application in finest-level operator applications: p = 2..8
        1.39, 1.45, 1.33, 1.18, 1.09, 1.14, 0.96 compiled against 3.67, 3.23, 2.88, 1.95,
        1.75, 1.33, 1.55 by ``numpy.matmul``).

    Attributes
    ----------
    n : int
        DoFs. ``nloc``: nodes per direction of an extended element.
    lengths : ndarray, shape (E, dim)
        The elements' mean lengths (:func:`element_lengths`).
    applications : int
        Applications so far.

    Raises
    ------
    TypeError
        For a space that is not on a box mesh.
    ValueError
        For a bad ``overlap``, ``weights``, ``mass``, ``free`` or ``kappa`` shape, or
        a local matrix that is not positive definite.

    Examples
    --------
    >>> from smalltc import fem
    >>> V = fem.H1Space(fem.box_mesh(2, 3), p=2)
    >>> P = Schwarz(V)
    >>> P
    Schwarz(p=2, dim=2, overlap=1, weights='sqrt', mass='consistent', E=9, n=49)
    >>> x, y = np.random.default_rng(0).standard_normal((2, V.ndofs))
    >>> bool(np.isclose(x @ P(y), y @ P(x))), bool(x @ P(x) > 0)
    (True, True)
    """

    def __init__(self, space, xp=np, *, free=None, overlap=1, weights="sqrt",
                 mass="consistent", kappa=1.0, alpha=0.0, dtype=np.float64,
                 host_kernel=None):
        if getattr(space, "lattice_shape", None) is None:
            raise TypeError(f"Schwarz needs a space on a box mesh (a lattice of DoFs), got "
                            f"{type(space).__name__} on {type(space.mesh).__name__}")
        if overlap not in (0, 1) or isinstance(overlap, bool):
            raise ValueError(f"overlap must be 0 or 1, got {overlap!r}")
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {list(WEIGHTS)}, got {weights!r}")
        if mass not in MASSES:
            raise ValueError(f"mass must be one of {list(MASSES)}, got {mass!r}")
        mesh, dim, p = space.mesh, space.dim, space.p
        E = space.nelements
        self.space, self.xp, self.dtype = space, xp, np.dtype(dtype)
        self.overlap, self.weights, self.mass = int(overlap), weights, mass
        self.n = space.ndofs
        self.applications = 0
        kap = np.broadcast_to(np.asarray(kappa, dtype=np.float64), (E,)) \
            if np.ndim(kappa) in (0, 1) and np.size(kappa) in (1, E) else None
        if kap is None or not np.all(kap > 0):
            raise ValueError(f"kappa must be a positive number or an array of shape ({E},), "
                             f"got shape {np.shape(kappa)}")
        fixed = None
        if free is not None:
            fr = np.asarray(to_host(free)).astype(bool)
            if fr.shape != (self.n,):
                raise ValueError(f"free has shape {fr.shape}, expected ({self.n},)")
            fixed = ~fr
        # --- the 1D problems -------------------------------------------------------
        K1, M1 = reference_matrices(p, mass)
        self.lengths = h = element_lengths(mesh)
        shape = tuple(mesh.shape)
        multi = np.unravel_index(np.arange(E), shape)
        lat = space.elem_dofs
        nloc = p + 1 + 2 * self.overlap
        self.nloc = nloc
        lams, Ss = [], []
        for d in range(dim):
            hd = h[:, d].reshape(shape)
            hl = np.roll(hd, 1, axis=d).ravel()
            hr = np.roll(hd, -1, axis=d).ravel()
            flags = []
            for side, edge in ((0, 0), (1, shape[d] - 1)):
                f = np.where(multi[d] == edge, 1, 0)
                if fixed is not None:
                    face = np.take(lat, 0 if side == 0 else p, axis=1 + d).reshape(E, -1)
                    f = np.where((f == 1) & fixed[face].all(axis=1), 2, f)
                flags.append(f)
            # one eigendecomposition per distinct 1D problem (lengths equal to 12 digits:
            # a mapped box repeats them by layers; 245k elements of a Kershaw mesh have
            # ~5k distinct problems along x, ~100 along y and z)
            scale = float(np.abs(h).max()) or 1.0
            keys = np.column_stack([np.round(v / scale, 12) for v in (h[:, d], hl, hr)]
                                   + [flags[0], flags[1]])
            _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
            A, M = _local_1d(K1, M1, h[first, d], hl[first], hr[first], flags[0][first],
                             flags[1][first], self.overlap)
            try:
                lam, S = fdm_pair(A, M)
            except np.linalg.LinAlgError as err:
                raise ValueError(f"Schwarz: a local 1D mass matrix along direction {d} is "
                                 f"not positive definite ({err})") from err
            inverse = inverse.reshape(-1)
            lams.append(lam[inverse])
            Ss.append(S[inverse])
        D = kap.reshape((E,) + (1,) * dim) * sum(
            lams[d].reshape((E,) + tuple(nloc if a == d else 1 for a in range(dim)))
            for d in range(dim)) + float(alpha)
        if not np.all(D > 0):
            raise ValueError(f"Schwarz: a local operator is not positive definite (smallest "
                             f"eigenvalue {D.min():.3e})")
        # --- the extended index map (invalid: index n, a zero pad) -------------------
        L = np.array(space.lattice_shape)
        strides = np.cumprod(np.r_[L[1:], 1][::-1])[::-1]
        itype = np.int32 if self.n + 1 < 2**31 else np.int64
        idx = np.zeros((E,) + (nloc,) * dim, dtype=itype)
        ok = np.ones(idx.shape, dtype=bool)
        for d in range(dim):
            g = multi[d][:, None] * p + np.arange(nloc)[None, :] - self.overlap   # (E, nloc)
            bshape = [E] + [1] * dim
            bshape[1 + d] = nloc
            g = g.reshape(bshape)
            ok &= (g >= 0) & (g < L[d])
            idx += (strides[d] * g).astype(itype)
        np.putmask(idx, ~ok, self.n)
        flat = idx.reshape(-1).astype(np.intp)
        count = np.bincount(flat, minlength=self.n + 1)[:self.n].astype(np.float64)
        w = 1.0 / np.sqrt(count) if weights == "sqrt" else np.ones(self.n)
        if fixed is not None:
            w = w * ~fixed
        # the host's numpy.bincount takes intp indices (an int32 map would be converted
        # on every application)
        self.idx = xp.asarray(idx) if xp is not np else idx.astype(np.intp)
        self.S = xp.asarray(np.ascontiguousarray(np.stack(Ss, axis=1)).astype(self.dtype))
        self.ST = xp.ascontiguousarray(xp.swapaxes(self.S, -1, -2))
        self.inv_eig = xp.asarray((1.0 / D).astype(self.dtype))
        self.w = xp.asarray(w.astype(self.dtype))
        self.fixed = None if fixed is None else xp.asarray(fixed.astype(self.dtype))
        if host_kernel is None:
            host_kernel = _numba_present()
        self.host_kernel = bool(host_kernel) and xp is np
        self._device_kernel = None

    @property
    def device_kernel(self):
        """On a GPU: whether an application is one kernel (the ``schwarz_fdm`` family of
        the CUDA backend, where an element's buffers fit 48 KiB of shared memory) rather
        than the array path; settable (False: the array path). False on the host."""
        if self._device_kernel is None:
            self._device_kernel = self.xp is not np and self._plan("auto").backend == "cuda"
        return self._device_kernel

    @device_kernel.setter
    def device_kernel(self, value):
        self._device_kernel = bool(value) and self.xp is not np

    def _backend(self):
        """The compiled family where there is one (the host's Numba kernel, the GPU's
        fused kernel), else the array path (the reference backend: no Numba,
        ``host_kernel=False``, ``device_kernel = False``)."""
        if self.xp is np:
            return "auto" if self.host_kernel else "reference"
        return "auto" if self._device_kernel is not False else "reference"

    def _plan(self, backend):
        """The plan of an application (:func:`smalltc.plan`, op ``"schwarz_fdm"``)."""
        r = self.xp.zeros(self.n, dtype=self.dtype)
        return smalltc.plan("schwarz_fdm", self.S, self.inv_eig, self.idx, r, self.w,
                            backend=backend)

    def _apply_1d(self, U, MatsT):
        """``U`` (E, n, .., n) with the element's matrix ``MatsT[:, d]^T`` applied along
        each local axis ``d``: ``dim`` batched products, each contracting the slowest axis
        and leaving its result as the fastest (``(x, y, z) -> (y, z, x') -> (z, x', y')
        -> (x', y', z')``), so each is one GEMM per element on a transposed view (no
        copies, no broadcasting)."""
        E, n, dim = U.shape[0], self.nloc, self.space.dim
        xp = self.xp
        V = U
        for d in range(dim):
            V = xp.swapaxes(V.reshape(E, n, -1), 1, 2) @ MatsT[:, d]
        return V.reshape(U.shape)

    def local_solve(self, U):
        """``K_e^-1 U_e`` for every element: ``U`` of shape (E, nloc, ..., nloc).

        Examples
        --------
        >>> from smalltc import fem
        >>> P = Schwarz(fem.H1Space(fem.box_mesh(2, 2), p=1), overlap=0)
        >>> U = P.local_solve(np.ones((4, 2, 2)))
        >>> U.shape
        (4, 2, 2)
        """
        V = self._apply_1d(U, self.S)              # S^T on every axis
        V *= self.inv_eig
        return self._apply_1d(V, self.ST)

    def __call__(self, r):
        """``z = P r`` (shape (n,) -> (n,)), in r's module and this dtype."""
        xp = self.xp
        if r.shape != (self.n,):
            raise ValueError(f"r has shape {r.shape}, expected ({self.n},)")
        self.applications += 1
        rr = xp.asarray(r)
        if rr.dtype != self.dtype and not (rr.dtype == np.float64 and self.dtype == np.float32):
            rr = rr.astype(self.dtype)
        rr = xp.ascontiguousarray(rr)
        z = smalltc.schwarz_fdm(self.S, self.inv_eig, self.idx, rr, self.w,
                                backend=self._backend())
        if self.fixed is not None:
            z += self.fixed * r
        return z

    def describe(self):
        """One line for a multigrid's ``print``."""
        return (f"Schwarz (FDM, overlap {self.overlap}, weights {self.weights}, "
                f"{self.mass} mass)")

    def __repr__(self):
        return (f"Schwarz(p={self.space.p}, dim={self.space.dim}, overlap={self.overlap}, "
                f"weights={self.weights!r}, mass={self.mass!r}, E={self.space.nelements}, "
                f"n={self.n})")


def schwarz(space, xp=np, **kwargs):
    """An overlapping Schwarz preconditioner with FDM local solves on ``space`` (see
    :class:`Schwarz` for the options).

    Examples
    --------
    >>> from smalltc import fem
    >>> from smalltc.fem.multigrid import Constrained, boundary_mask
    >>> V = fem.H1Space(fem.box_mesh(3, 2), p=3)
    >>> A = fem.diffusion_operator(V)
    >>> free = ~boundary_mask(V)
    >>> P = schwarz(V, free=free)
    >>> b = np.where(free, 1.0, 0.0)
    >>> Ac = Constrained(A, A.diagonal(), free)
    >>> res = fem.cg(Ac, b, tol=1e-8, precond=P)
    >>> bool(res.converged), res.iterations < 20
    (True, True)
    """
    return Schwarz(space, xp, **kwargs)
