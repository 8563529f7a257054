"""The parts of a p-multigrid level (:mod:`smalltc.fem.multigrid`): the boundary mask, the
transfers between two orders on one mesh (:class:`Transfer`), the constrained level
operator (:class:`Constrained`), the coarse DoFs a constraint reaches.
"""

import numpy as np

import smalltc
from smalltc._arrays import array_module

from ._device import to_host
from .basis import lagrange_basis
from .quadrature import gauss_lobatto
from .schwarz import _numba_present

__all__ = ["Transfer", "Constrained", "boundary_mask"]


def boundary_mask(space, region=None):
    """Boolean mask of the DoFs on the boundary (or on a region of it), shape (ndofs,).

    From ``space.boundary_dofs(region)`` where the space has it; else (a box mesh's
    lattice) the whole boundary of the box.

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> print(boundary_mask(H1Space(box_mesh(1, 2), p=1)))
    [ True False  True]
    """
    if hasattr(space, "boundary_dofs"):
        mask = np.zeros(space.ndofs, dtype=bool)
        mask[space.boundary_dofs(region)] = True
        return mask
    if region is not None:
        raise ValueError(f"this space has no boundary regions (region={region!r})")
    L = np.array(space.lattice_shape)
    idx = np.indices(tuple(L)).reshape(space.dim, -1)
    return np.any((idx == 0) | (idx == (L - 1)[:, None]), axis=0)


class Transfer:
    """Prolongation from an order-``q`` space to an order-``p`` space on the same mesh,
    and its transpose.

    Parameters
    ----------
    coarse, fine : H1Space
        On the same mesh, ``coarse.p <= fine.p``.
    xp : module
        Where the vectors live (NumPy or CuPy).
    coarse_free, fine_free : array of bool, optional
        The free (unconstrained) DoFs of each space; None: all free.
    dtype : dtype
        Of the vectors.
    fused : bool or None
        CuPy vectors: one kernel each way (:func:`smalltc.pmg_transfer`,
        ``templates/cuda/pmg_transfer.cu.j2``: gather,
        the sum-factorised interpolation in shared memory, weighted atomic scatter-add);
        False: the same with :func:`smalltc.interpolate` (gather, sum-factorised GEMMs,
        strided adds).
        None (default): fused on the GPU.
    host_kernel : bool or None
        NumPy vectors: :func:`smalltc.pmg_transfer`, the element part compiled with
        Numba (``templates/cpu/pmg_transfer.py.j2``: gather, the sum-factorised interpolation,
        the weights; then ``numpy.bincount``), 3-10x faster than the array path
        (:func:`smalltc.interpolate` on the gathered E-vectors); False: the array path.
        None (default): compiled where Numba imports.

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> mesh = box_mesh(2, 2, distortion=0.05)
    >>> T = Transfer(H1Space(mesh, 1), H1Space(mesh, 3))
    >>> xc = H1Space(mesh, 1).dof_coordinates()[0]          # x is in both spaces
    >>> bool(np.allclose(T.prolong(xc), H1Space(mesh, 3).dof_coordinates()[0]))
    True
    """

    def __init__(self, coarse, fine, xp=np, *, coarse_free=None, fine_free=None,
                 dtype=np.float64, fused=None, host_kernel=None):
        if coarse.mesh is not fine.mesh:
            raise ValueError("coarse and fine spaces must be on the same mesh object")
        if coarse.p > fine.p:
            raise ValueError(f"coarse order {coarse.p} is above fine order {fine.p}")
        self.coarse, self.fine, self.xp, self.dtype = coarse, fine, xp, np.dtype(dtype)
        I1d, _ = lagrange_basis(gauss_lobatto(coarse.nd)[0], gauss_lobatto(fine.nd)[0])
        self.I1d = xp.asarray(I1d.astype(self.dtype))        # (nd_fine, nd_coarse)
        self.I1dT = xp.ascontiguousarray(self.I1d.T)
        self.I1d = xp.ascontiguousarray(self.I1d)
        w = 1.0 / fine.multiplicity(xp)                      # made where the vectors are
        if fine_free is not None:
            w = w * xp.asarray(fine_free, dtype=bool)
        w = w.astype(self.dtype)
        self.weights = fine.gather(w)                         # E-vector
        self.coarse_free = None if coarse_free is None else \
            xp.asarray(np.asarray(to_host(coarse_free), dtype=self.dtype))
        self.fused = (xp is not np) if fused is None else bool(fused) and xp is not np
        self.host_kernel = _numba_present() if host_kernel is None else bool(host_kernel)
        self._w = None
        if self.fused:                   # weights per DoF: the coarse, the fine
            self._w = ((xp.ones(coarse.ndofs, dtype=self.dtype) if self.coarse_free is None
                        else self.coarse_free), w)
        elif xp is np and self.host_kernel:
            cw = (np.ones(coarse.ndofs, dtype=self.dtype) if self.coarse_free is None
                  else self.coarse_free)
            fw = self.fine.scatter(self.weights) / self.fine.multiplicity()
            self._w = (cw, np.ascontiguousarray(fw.astype(self.dtype)))

    def _maps(self):
        """The element-to-DoF maps of both spaces, shaped (E, nd, ..., nd): made once and
        kept (the transfers' range checks are once per map object)."""
        if "_map_views" not in self.__dict__:
            E, dim = self.fine.nelements, self.fine.dim
            self._map_views = tuple(s.dof_map(self.xp).reshape((E,) + (s.nd,) * dim)
                                    for s in (self.coarse, self.fine))
        return self._map_views

    def _transfer(self, forward, x, out=None):
        """The transfer as one :func:`smalltc.pmg_transfer` (the ``pmg_transfer`` kernel
        family: fused on the GPU, the compiled element part and ``numpy.bincount`` on the
        host); ``out``: added to."""
        xp = self.xp
        x = xp.ascontiguousarray(xp.asarray(x, dtype=self.dtype))
        (cmap, fmap), (cw, fw) = self._maps(), self._w
        if forward:
            ops = (self.I1d, x, cmap, cw, fmap, fw)
        else:
            ops = (self.I1dT, x, fmap, fw, cmap, cw)
        return smalltc.pmg_transfer(*ops, out=out, add=out is not None)

    def prolong(self, xc):
        """``x_fine = P x_coarse`` (shape (ndofs_coarse,) -> (ndofs_fine,))."""
        if self._w is not None:
            return self._transfer(True, xc)
        if self.coarse_free is not None:
            xc = xc * self.coarse_free
        v = smalltc.interpolate(self.I1d, None, self.coarse.gather(
            self.xp.asarray(xc, dtype=self.dtype)))
        return self.fine.scatter(v * self.weights)

    def prolong_add(self, xc, x):
        """``x += P x_coarse`` in place (the fused kernel adds into ``x`` directly);
        returns ``x``."""
        if self.fused and x.dtype == self.dtype and x.flags.c_contiguous:
            return self._transfer(True, xc, out=x)
        x += self.prolong(xc)
        return x

    def restrict(self, rf):
        """``r_coarse = P^T r_fine`` (shape (ndofs_fine,) -> (ndofs_coarse,))."""
        if self._w is not None:
            return self._transfer(False, rf)
        v = smalltc.interpolate(self.I1dT, None, self.fine.gather(
            self.xp.asarray(rf, dtype=self.dtype)) * self.weights)
        rc = self.coarse.scatter(v)
        return rc if self.coarse_free is None else rc * self.coarse_free

    def __repr__(self):
        return f"Transfer(p={self.coarse.p} -> {self.fine.p})"


class Constrained:
    """``A_c = F A F + C``: ``operator`` with the constrained DoFs made identity rows and
    columns (``free``: boolean mask of the others; None passes ``A`` through).

    Examples
    --------
    >>> A = np.array([[2.0, -1.0], [-1.0, 2.0]])
    >>> Ac = Constrained(lambda x: A @ x, np.diag(A), np.array([True, False]))
    >>> print(Ac(np.array([1.0, 1.0])), Ac.diagonal())
    [2. 1.] [2. 1.]
    """

    def __init__(self, operator, diagonal, free=None):
        self.operator = operator
        xp = array_module(diagonal)
        self.xp, self.dtype = xp, diagonal.dtype
        self.n = int(diagonal.size)
        if free is None:
            self.free = None
            self._diag = diagonal
        else:
            # the mask crosses as bytes (a GPU: an eighth of the float64 copy), cast there
            self.free = xp.asarray(to_host(free) if xp is np else free,
                                   dtype=bool).astype(diagonal.dtype)
            self.fixed = 1 - self.free
            self._diag = diagonal * self.free + self.fixed

    @property
    def shape(self):
        return (self.n, self.n)

    def __call__(self, x):
        if self.free is None:
            return self.operator(x)
        return self.operator(x * self.free) * self.free + x * self.fixed

    def diagonal(self):
        return self._diag


class _Level:
    """One level: its space, (constrained) operator, smoother, free mask."""

    def __init__(self, space, operator, free, xp):
        self.space, self.raw, self.free = space, operator, free
        self.A = Constrained(operator, xp.asarray(operator.diagonal()), free)
        self.smoother = None
        self.applications = 0


def _touches(coarse, fine, fine_fixed, xp=np):
    """Coarse DoFs whose basis function is nonzero at some fine DoF of ``fine_fixed``:
    ``|P|^T`` applied to the mask, computed on module ``xp`` (the levels' device), returned
    on the host (bool)."""
    I1d, _ = lagrange_basis(gauss_lobatto(coarse.nd)[0], gauss_lobatto(fine.nd)[0])
    absI = xp.asarray(np.abs(I1d).T)
    v = fine.gather(xp.asarray(to_host(fine_fixed) if xp is np else fine_fixed,
                               dtype=bool).astype(np.float64))
    with smalltc.evaluation_job(v.size // fine.nd ** fine.dim * coarse.nd ** coarse.dim):
        rc = coarse.scatter(smalltc.interpolate(absI, None, v))
    return np.asarray(to_host(rc > 1e-12))
