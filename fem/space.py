"""Continuous (H1) order-``p`` nodal spaces on box meshes and unstructured meshes.

On an :class:`~smalltc.fem.unstructured.UnstructuredMesh` the DoFs are numbered
through the mesh's topology (:func:`smalltc.fem.topology.h1_numbering`: global
vertices, edges and faces with their orientations, so that neighbours agree on
their shared nodes whatever their local orientation); the rest of this class,
and every operator, sees only the resulting map. A box mesh stays the fast
structured case below.

The global degrees of freedom of order ``p`` on a structured mesh with
``n_d`` elements along direction ``d`` form a lattice of ``n_d * p + 1``
nodes per direction, numbered in C order. Element ``e`` with multi-index
``(e_0, ..., e_{dim-1})`` owns the lattice nodes ``e_d * p + i_d``,
``i_d = 0..p``; neighbours share the nodes on their common face, which is
what makes the space continuous.

:meth:`H1Space.gather` copies global values into an E-vector of shape
``(E, nd, ..., nd)`` (the ``V`` of docs/math.md section 1); :meth:`H1Space.scatter`
is its transpose, adding element contributions into the global vector.

Both work with the array module of their input: NumPy, or CuPy on the GPU.
The index arrays are built on the host once and copied to the device on
first use. On the host the scatter-add is ``numpy.bincount``; on the device
it is done without atomics, one axis at a time (:meth:`H1Space.scatter`
explains how), so it gives the same bits on every run, which keeps CG runs
reproducible.
"""

import numpy as np

import smalltc
from smalltc._arrays import array_module

from ._device import DeviceCache, to_device, to_host
from .basis import lagrange_basis
from .mesh import element_nodes
from .quadrature import gauss_lobatto
from .topology import facet_lattice, h1_numbering

__all__ = ["H1Space"]


class H1Space:
    """Order-``p`` continuous Lagrange space on Gauss-Lobatto nodes.

    Parameters
    ----------
    mesh : BoxMesh or UnstructuredMesh
    p : int
        Polynomial order, ``p >= 1``.

    Attributes
    ----------
    mesh : BoxMesh
    p, nd, dim : int
        Order, nodes per direction in an element (``p + 1``), dimension.
    lattice_shape : tuple of int or None
        Global nodes per direction, ``n_d * p + 1`` (None on an unstructured mesh).
    ndofs : int
        Number of global degrees of freedom.
    elem_dofs : ndarray of int64, shape (E, nd, ..., nd)
        Global index of each element node.

    Raises
    ------
    ValueError
        If ``p`` is not an integer >= 1.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> V = H1Space(box_mesh(2, 2), p=2)
    >>> V.ndofs, V.elem_dofs.shape
    (25, (4, 3, 3))
    >>> print(V.elem_dofs[1])
    [[ 2  3  4]
     [ 7  8  9]
     [12 13 14]]
    """

    def __init__(self, mesh, p):
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
            raise ValueError(f"p must be an integer >= 1, got {p!r}")
        self.mesh = mesh
        self.p = int(p)
        self.nd = self.p + 1
        self.dim = mesh.dim
        self._device = DeviceCache()  # the map (and the scatter matrix) on each device
        self._coords = None
        if not hasattr(mesh, "shape"):           # unstructured: numbered through its topology
            if not hasattr(mesh, "vertices"):
                raise TypeError(f"mesh must be a BoxMesh or an UnstructuredMesh, got "
                                f"{type(mesh).__name__}")
            self.lattice_shape = None
            self._elem_dofs, self.ndofs = h1_numbering(mesh.vertices, mesh.dim, self.p)
            return
        self.lattice_shape = tuple(n_d * self.p + 1 for n_d in mesh.shape)
        self.ndofs = int(np.prod(self.lattice_shape))
        self._elem_dofs = None           # made on the host when first asked for

    @property
    def elem_dofs(self):
        """The element-to-DoF map, int64 ``(E, nd, ..., nd)`` on the host (a box mesh's
        is made on first use: a GPU solve builds its map on the device instead,
        :meth:`dof_map`)."""
        if self._elem_dofs is None:
            self._elem_dofs = self.dof_rows(None, np, np.int64)
        return self._elem_dofs

    @elem_dofs.setter
    def elem_dofs(self, value):
        self._elem_dofs = value

    @property
    def _flat(self):
        return self.elem_dofs.reshape(-1)

    def dof_rows(self, elements=None, xp=np, dtype=np.int64):
        """The map's rows of ``elements`` (all by default), made in module ``xp`` as
        ``dtype``: a box mesh's from the lattice arithmetic where they are needed (no
        host array, no copy), an unstructured mesh's taken from :attr:`elem_dofs`.

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> V = H1Space(box_mesh(2, 2), p=2)
        >>> print(V.dof_rows(np.array([1]), np, np.int32)[0])
        [[ 2  3  4]
         [ 7  8  9]
         [12 13 14]]
        """
        if elements is not None:
            elements = xp.asarray(elements)
            if elements.size and not (bool(elements.min() >= 0)
                                      and bool(elements.max() < self.nelements)):
                raise ValueError(f"elements must lie in [0, {self.nelements}), got "
                                 f"[{int(elements.min())}, {int(elements.max())}]")
        if self.lattice_shape is None:
            rows = self.elem_dofs if elements is None else self.elem_dofs[to_host(elements)]
            return to_device(np.ascontiguousarray(rows, dtype=dtype), xp)
        shape, dim, nd, p = self.mesh.shape, self.dim, self.nd, self.p
        strides = np.cumprod((self.lattice_shape[1:] + (1,))[::-1])[::-1]
        local = xp.arange(nd, dtype=dtype)
        if elements is None:                # every element: a sum of broadcast terms
            terms = []
            for d, n_d in enumerate(shape):
                g = (xp.arange(n_d, dtype=dtype)[:, None] * p + local[None, :]) * int(strides[d])
                bshape = [1] * (2 * dim)
                bshape[d], bshape[dim + d] = n_d, nd
                terms.append(g.reshape(bshape))
            idx = xp.empty(tuple(shape) + (nd,) * dim, dtype=dtype)
            if dim == 1:
                idx[...] = terms[0]
            else:                           # one pass a direction after the first two
                xp.add(terms[0], terms[1], out=idx)
                for t in terms[2:]:
                    idx += t
            return idx.reshape((self.nelements,) + (nd,) * dim)
        e = xp.asarray(elements).astype(dtype, copy=False).reshape(-1)
        idx = xp.zeros((e.size,) + (nd,) * dim, dtype=dtype)
        for d in range(dim - 1, -1, -1):    # C order: the last direction runs fastest
            e_d = e % shape[d]
            e = e // shape[d]
            bshape = [e_d.size] + [1] * dim
            bshape[1 + d] = nd
            idx += ((e_d[:, None] * p + local[None, :]) * int(strides[d])).reshape(bshape)
        return idx

    @property
    def nelements(self):
        """Number of elements ``E``."""
        return self.mesh.nelements

    @property
    def evector_shape(self):
        """Shape ``(E, nd, ..., nd)`` of a scalar E-vector."""
        return (self.nelements,) + (self.nd,) * self.dim

    def __repr__(self):
        return f"H1Space(p={self.p}, ndofs={self.ndofs}, mesh={self.mesh!r})"

    def gather(self, x):
        """Global vector -> E-vector (each element's copy of its nodal values).

        Parameters
        ----------
        x : array_like, shape (ndofs,) or (ncomp, ndofs)
            NumPy or CuPy.

        Returns
        -------
        ndarray, shape (E, nd, ..., nd) or (E, ncomp, nd, ..., nd)
            C-contiguous, dtype and array module of ``x``.

        Raises
        ------
        ValueError
            If the last axis of ``x`` is not ``ndofs`` long.

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> V = H1Space(box_mesh(1, 2), p=1)
        >>> print(V.gather(np.array([10.0, 20.0, 30.0])))
        [[10. 20.]
         [20. 30.]]
        """
        xp = array_module(x)
        x = xp.asarray(x)
        if x.ndim not in (1, 2) or x.shape[-1] != self.ndofs:
            raise ValueError(
                f"x has shape {x.shape}, expected ({self.ndofs},) or (ncomp, {self.ndofs}) "
                f"for this space with ndofs={self.ndofs}"
            )
        idx = self.dof_map(xp)
        if x.ndim == 1:
            return x[idx]
        return xp.ascontiguousarray(xp.moveaxis(x[:, idx], 0, 1))

    def dof_map(self, xp=np):
        """:attr:`elem_dofs` as :func:`smalltc.mass_apply` takes it, in module ``xp``:
        int32 (int64 from 2^31 DoFs on), copied once per module and device and kept
        (:class:`~smalltc.fem._device.DeviceCache`).

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> H1Space(box_mesh(1, 2), p=1).dof_map().dtype
        dtype('int32')
        """
        itype = np.int32 if self.ndofs < 2**31 else np.int64
        if self.lattice_shape is None or xp is np:
            return self._device.get(xp, "dof_map",
                                    lambda: to_device(self.elem_dofs.astype(itype), xp))
        return self._device.get(xp, "dof_map", lambda: self.dof_rows(None, xp, itype))

    def scatter(self, v):
        """E-vector -> global vector, adding the contributions of shared nodes.

        The transpose of :meth:`gather`: ``<gather(x), v> == <x, scatter(v)>``.
        NumPy input is summed by ``numpy.bincount``. Other modules (CuPy)
        use :meth:`_scatter_lattice`: the lattice is a tensor product, so
        the sum is done one direction at a time, each by two strided adds
        (element ``e``'s local nodes ``0..p-1`` are copied to lattice nodes
        ``e p .. e p + p - 1``, its node ``p`` added onto ``e p + p``): no
        index arrays, no atomics, a fixed order of summation.

        Parameters
        ----------
        v : array_like, shape (E, nd, ..., nd) or (E, ncomp, nd, ..., nd)
            NumPy or CuPy.

        Returns
        -------
        ndarray, shape (ndofs,) or (ncomp, ndofs)
            Floating dtype of ``v`` (float64 for integer input), array module
            of ``v``.

        Raises
        ------
        ValueError
            If ``v`` does not have an E-vector shape of this space.

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> V = H1Space(box_mesh(1, 2), p=1)
        >>> print(V.scatter(np.ones((2, 2))))
        [1. 2. 1.]
        """
        xp = array_module(v)
        v = xp.asarray(v)
        shape = self.evector_shape
        if v.shape == shape:
            comps = None
        elif v.ndim == len(shape) + 1 and v.shape[0] == shape[0] and v.shape[2:] == shape[1:]:
            comps = v.shape[1]
        else:
            raise ValueError(
                f"v has shape {v.shape}, expected {shape} or "
                f"({shape[0]}, ncomp{''.join(', ' + str(s) for s in shape[1:])}) for this space"
            )
        dtype = v.dtype if np.issubdtype(v.dtype, np.floating) else np.float64
        if xp is not np:
            if self.lattice_shape is None:
                return self._scatter_sparse(v.astype(dtype, copy=False), comps)
            return self._scatter_lattice(v.astype(dtype, copy=False), comps)
        if comps is None:
            out = np.bincount(self._flat, weights=v.ravel(), minlength=self.ndofs)
            return out.astype(dtype, copy=False)
        out = np.empty((comps, self.ndofs), dtype=dtype)
        for c in range(comps):
            out[c] = np.bincount(self._flat, weights=v[:, c].ravel(), minlength=self.ndofs)
        return out

    def _scatter_sparse(self, v, comps):
        """Scatter-add on the device for an unstructured space: a product with the 0/1
        matrix ``S`` (ndofs x E nd^dim, CSR; cuSPARSE sums each row in a fixed order)."""
        xp = array_module(v)

        def make():
            import cupyx.scipy.sparse as sp
            n = self._flat.size
            order = np.argsort(self._flat, kind="stable")
            indptr = np.zeros(self.ndofs + 1, dtype=np.int64)
            np.cumsum(np.bincount(self._flat, minlength=self.ndofs), out=indptr[1:])
            return sp.csr_matrix((xp.ones(n, dtype=v.dtype), xp.asarray(order.astype(np.int32)),
                                  xp.asarray(indptr.astype(np.int32))), shape=(self.ndofs, n))
        S = self._device.get(xp, ("S", np.dtype(v.dtype).str), make)
        if comps is None:
            return S @ v.reshape(-1)
        flat = xp.moveaxis(v, 1, 0).reshape(comps, -1)
        return xp.ascontiguousarray((S @ flat.T).T)

    def boundary_dofs(self, region=None):
        """Sorted global indices of the DoFs on the boundary, or on a named region of it.

        Parameters
        ----------
        region : str or sequence of str, optional
            A boundary region of the mesh (``mesh.boundary_regions``: the box's
            sides ``"xmin"``, ``"xmax"``, ...; a file mesh's physical groups), or
            several; the whole boundary when omitted.

        Returns
        -------
        ndarray of int64

        Raises
        ------
        KeyError
            For an unknown region, naming the mesh's regions.

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> V = H1Space(box_mesh(2, 2), p=1)
        >>> V.boundary_dofs().tolist(), V.boundary_dofs("xmin").tolist()
        ([0, 1, 2, 3, 5, 6, 7, 8], [0, 1, 2])
        """
        names = [region] if region is None or isinstance(region, str) else list(region)
        on = np.zeros(self.ndofs, dtype=bool)
        for name in names:
            on[self.facet_dofs(*self.mesh.boundary_facets(name))] = True
        return np.flatnonzero(on).astype(np.int64)

    def facet_dofs(self, elements, facets):
        """Global DoFs of the nodes of element facets, each facet's in its C order.

        Parameters
        ----------
        elements, facets : array_like of int, shape (n,)
            Element and local facet ``f = 2 a + side`` (side 0 at ``xi_a = -1``), as
            ``mesh.boundary_facets`` gives them.

        Returns
        -------
        ndarray of int64, shape (n, nd**(dim-1))

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> H1Space(box_mesh(2, 2), p=1).facet_dofs([1, 3], [3, 3]).tolist()   # ymax
        [[2, 5], [5, 8]]
        """
        elements = np.asarray(elements, dtype=np.int64).reshape(-1)
        facets = np.asarray(facets, dtype=np.int64).reshape(-1)
        if elements.shape != facets.shape:
            raise ValueError(f"elements has shape {elements.shape} and facets {facets.shape}, "
                             "expected one length")
        for name, a, n in (("elements", elements, self.nelements),
                           ("facets", facets, 2 * self.dim)):
            if a.size and (a.min() < 0 or a.max() >= n):
                raise ValueError(f"{name} must lie in [0, {n}), got [{a.min()}, {a.max()}]")
        lattice = facet_lattice(self.dim, self.nd)[facets]      # (n, nd^(dim-1))
        rows = self.dof_rows(elements, np, np.int64).reshape(elements.size, self.nd ** self.dim)
        return np.take_along_axis(rows, lattice, axis=1)

    def _scatter_lattice(self, v, comps):
        """Scatter-add by strided adds along each lattice direction (any array module).

        ``v`` has a checked E-vector shape and a floating dtype; ``comps``
        is the component count or None.
        """
        xp = array_module(v)
        dim, nd, p = self.dim, self.nd, self.p
        extra = () if comps is None else (comps,)
        # (E, [c], i_0..i_{d-1}) -> (n_0, i_0, n_1, i_1, ..., [c]): element and
        # local index of each direction side by side, the component last
        a = v.reshape(self.mesh.shape + extra + (nd,) * dim)
        ncomp_axes = len(extra)
        order = [ax for d in range(dim) for ax in (d, dim + ncomp_axes + d)]
        order += list(range(dim, dim + ncomp_axes))
        a = xp.transpose(a, order)
        for n in self.mesh.shape:
            # leading (n, nd, rest...) -> (n p + 1, rest...), then moved last
            rest = a.shape[2:]
            out = xp.empty((n * p + 1,) + rest, dtype=a.dtype)
            out[: n * p] = a[:, :p].reshape((n * p,) + rest)
            out[n * p] = 0
            out[p::p] += a[:, p]
            a = xp.moveaxis(out, 0, -1)
        # now ([c], L_0, ..., L_{dim-1}), the lattice in C order
        return xp.ascontiguousarray(a).reshape(extra + (self.ndofs,))

    def multiplicity(self, xp=np):
        """Number of elements sharing each global node, shape (ndofs,), an array of ``xp``
        (a box's made there from its lattice, without a host array).

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> print(H1Space(box_mesh(1, 2), p=2).multiplicity())
        [1 1 2 1 1]
        """
        if self.lattice_shape is None:
            m = np.bincount(self._flat, minlength=self.ndofs)
            return m if xp is np else xp.asarray(m)
        # a box: a product over the directions, 2 where a node is on an inner element face
        out = xp.ones((1,) * self.dim, dtype=np.int64)
        for d, m in enumerate(self.lattice_shape):
            i = np.arange(m)
            c = np.where((i % self.p == 0) & (i > 0) & (i < m - 1), 2, 1).astype(np.int64)
            bshape = [1] * self.dim
            bshape[d] = m
            out = out * xp.asarray(c.reshape(bshape))
        return out.reshape(-1)

    def dof_coordinates(self):
        """Physical coordinates of the global nodes, shape (dim, ndofs).

        Each node's coordinates are the element map evaluated at its
        Gauss-Lobatto reference position (taken from one of the elements
        that share it; the maps agree there): :meth:`map_nodes` of the
        Gauss-Lobatto nodes, computed on the first call and kept (each call
        returns a copy).

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> print(H1Space(box_mesh(1, 1), p=2).dof_coordinates())
        [[0.  0.5 1. ]]
        """
        return self._dof_coordinates.copy()

    @property
    def _dof_coordinates(self):
        """The kept coordinates (read-only; no copy)."""
        if self._coords is None:
            x = self.map_nodes(gauss_lobatto(self.nd)[0])
            x.flags.writeable = False
            self._coords = x
        return self._coords

    def boundary_coordinates(self, region=None, xp=np):
        """The DoFs on the boundary (or a region of it) and their coordinates, from the
        boundary elements' maps alone (the kept :meth:`dof_coordinates` where they exist).

        For Dirichlet values: a mesh of ``n^3`` elements has about ``6 n^2`` on its
        boundary, so this maps a fraction of the elements :meth:`dof_coordinates` maps.

        Parameters
        ----------
        region : str or sequence of str, optional
            As for :meth:`boundary_dofs`.
        xp : module, optional
            Where the coordinates are computed and returned: NumPy (the default) or
            CuPy (the boundary elements' geometry nodes copied to the device once, the
            map evaluated there by ``smalltc.interpolate``).

        Returns
        -------
        dofs : ndarray of int64, shape (n,)
            :meth:`boundary_dofs`' answer (sorted, NumPy).
        x : ndarray, shape (dim, n)
            Their coordinates, the values :meth:`dof_coordinates` holds there, in ``xp``.

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> dofs, x = H1Space(box_mesh(2, 2), p=1).boundary_coordinates("xmax")
        >>> dofs.tolist(), x.tolist()
        ([6, 7, 8], [[1.0, 1.0, 1.0], [0.0, 0.5, 1.0]])
        """
        dofs = self.boundary_dofs(region)
        if self._coords is not None:
            return dofs, xp.asarray(self._coords[:, dofs])
        names = [region] if region is None or isinstance(region, str) else list(region)
        elems = np.unique(np.concatenate(
            [np.asarray(self.mesh.boundary_facets(n)[0], dtype=np.int64) for n in names]))
        mesh = self.mesh
        ref = gauss_lobatto(self.nd)[0]
        nodes = element_nodes(mesh, elems, xp)
        if np.array_equal(ref, mesh.geom_nodes):
            X = nodes
        else:
            Bg = xp.asarray(lagrange_basis(mesh.geom_nodes, ref)[0])
            with smalltc.evaluation_job(elems.size * self.nd ** self.dim * self.dim):
                X = smalltc.interpolate(Bg, None, nodes, dim=self.dim)
        # each DoF's value from one of its copies (the last, as a scatter keeps)
        flat = self.dof_rows(elems, np, np.int64).reshape(-1)
        copy = np.empty(self.ndofs, dtype=np.int64)
        copy[flat] = np.arange(flat.size, dtype=np.int64)
        X = xp.moveaxis(X, 1, 0).reshape(self.dim, -1)
        return dofs, xp.take(X, xp.asarray(copy[dofs]), axis=1)

    def _one_copy(self, xp=np):
        """For each DoF the flat E-vector index of one of its copies (the last one, as a
        scatter-assignment keeps), in module ``xp``. On a box mesh it is arithmetic: the
        last element holding lattice node ``i`` has ``e_d = min(i_d // p, n_d - 1)`` in
        every direction (C order is lexicographic), its local node ``i_d - e_d p``; made
        where it is used, as the map is."""
        if self.lattice_shape is None or self._elem_dofs is not None and xp is np:
            one = np.empty(self.ndofs, dtype=np.int64)
            one[self._flat] = np.arange(self._flat.size, dtype=np.int64)
            return to_device(one, xp)
        dim, nd, p, shape = self.dim, self.nd, self.p, self.mesh.shape
        estrides = np.cumprod((tuple(shape[1:]) + (1,))[::-1])[::-1]
        out = None
        for d, m in enumerate(self.lattice_shape):
            i = np.arange(m, dtype=np.int64)
            e = np.minimum(i // p, shape[d] - 1)
            term = e * int(estrides[d]) * nd ** dim + (i - e * p) * nd ** (dim - 1 - d)
            bshape = [1] * dim
            bshape[d] = m
            term = xp.asarray(term.reshape(bshape))
            out = term if out is None else out + term
        return out.reshape(-1)

    def map_nodes(self, ref, xp=np):
        """The element maps at the lattice of 1D reference nodes ``ref``, numbered as the DoFs.

        ``smalltc.interpolate`` of the geometry nodes with the order-``geom_order``
        basis at ``ref`` (nothing to compute where ``ref`` are the geometry nodes),
        then :meth:`assign`, in module ``xp`` (a box mesh's nodes placed there).

        Parameters
        ----------
        ref : array_like, shape (nd,)
            Reference nodes on [-1, 1], as many as the space has per direction.
        xp : module, optional
            NumPy (the default) or CuPy.

        Returns
        -------
        ndarray, shape (dim, ndofs)

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> print(H1Space(box_mesh(1, 2), p=2).map_nodes([-1.0, -0.5, 1.0]))
        [[0.    0.125 0.5   0.625 1.   ]]
        """
        ref = np.asarray(ref, dtype=np.float64)
        if ref.shape != (self.nd,):
            raise ValueError(f"ref has shape {ref.shape}, expected ({self.nd},) for this space")
        mesh = self.mesh
        nodes = mesh.nodes_on(xp) if hasattr(mesh, "nodes_on") else to_device(mesh.nodes, xp)
        if np.array_equal(ref, mesh.geom_nodes):
            return self.assign(nodes)
        Bg, _ = lagrange_basis(mesh.geom_nodes, ref)
        with smalltc.evaluation_job(mesh.nelements * self.nd ** self.dim * self.dim):
            return self.assign(smalltc.interpolate(xp.asarray(Bg), None, nodes, dim=self.dim))

    def assign(self, v):
        """E-vector -> global vector, each DoF taking the value one of its elements holds.

        For a field continuous across elements (the element maps, a field sampled at
        the nodes) this is its value at the DoF; one gather through a kept index of one
        copy of each DoF (the copy a scatter-assignment would keep), no sum. NumPy or
        CuPy: the result is in the module of ``v``.

        Parameters
        ----------
        v : ndarray, shape (E, nd, ..., nd) or (E, ncomp, nd, ..., nd)

        Returns
        -------
        ndarray, shape (ndofs,) or (ncomp, ndofs)

        Examples
        --------
        >>> from smalltc.fem import box_mesh
        >>> V = H1Space(box_mesh(1, 2), p=1)
        >>> print(V.assign(np.array([[1.0, 2.0], [2.0, 3.0]])))
        [1. 2. 3.]
        """
        xp = array_module(v)
        v = xp.asarray(v)
        shape = self.evector_shape
        one = self._device.get(xp, "one_copy", lambda: self._one_copy(xp))
        if v.shape == shape:
            return v.reshape(-1)[one]
        if v.ndim == len(shape) + 1 and v.shape[0] == shape[0] and v.shape[2:] == shape[1:]:
            nc, n = v.shape[1], int(np.prod(shape[1:]))         # components, nodes an element
            flat, first = v.reshape(-1), (one // n) * (nc * n) + one % n
            out = xp.empty((nc, self.ndofs), dtype=v.dtype)
            for c in range(nc):
                out[c] = flat[first + c * n]
            return out
        raise ValueError(
            f"v has shape {v.shape}, expected {shape} or "
            f"({shape[0]}, ncomp{''.join(', ' + str(s) for s in shape[1:])}) for this space")
