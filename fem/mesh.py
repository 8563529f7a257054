"""Structured interval, quadrilateral and hexahedral meshes of a box.

A :class:`BoxMesh` splits the box ``[lower, upper]`` into ``n_0 x ... x
n_{dim-1}`` elements, numbered in C order of their multi-index ``(e_0, e_1,
e_2)`` (``e_0`` runs along the first coordinate, slowest). Each element is
the image of the reference cube ``[-1, 1]^dim`` under a polynomial map of
order ``geom_order``: its geometry nodes are the tensor-product
Gauss-Lobatto nodes of that order, placed in the undistorted box and then
moved by the distortion. Nodes shared by neighbouring elements get
bit-identical coordinates, so the mesh is conforming.

The default distortion (:func:`sine_distortion`) keeps the boundary of the
box fixed, so the meshed domain is always the box itself. So does the Kershaw
transformation of the CEED benchmarks (:class:`Kershaw`, :func:`kershaw_mesh`):
piecewise multilinear layers of strongly stretched and sheared elements.
"""

from dataclasses import dataclass, field
from numbers import Real

import numpy as np

from smalltc._arrays import array_module

from ._device import to_device
from .quadrature import gauss_lobatto

__all__ = ["BoxMesh", "box_mesh", "sine_distortion", "Kershaw", "kershaw_mesh"]

#: names of the sides of a box mesh, in local facet order (lower, upper per direction)
BOX_REGIONS = ("xmin", "xmax", "ymin", "ymax", "zmin", "zmax")


def sine_distortion(xhat, amplitude):
    """Smooth distortion of the unit box that fixes its boundary.

    ``x_a = xhat_a + amplitude * prod_b sin(pi xhat_b)`` for every
    component ``a``. Its Jacobian determinant is ``1 + amplitude * sum_b
    d_b s`` with ``s = prod_b sin(pi xhat_b)``, positive whenever
    ``|amplitude| < 1 / (dim * pi)``; larger amplitudes may tangle the map.
    The bound is for the exact map: a coarse low-order geometry only
    interpolates it and can tangle somewhat earlier. The geometry routines
    (:func:`smalltc.fem.geometry.quadrature_data`) detect either case.

    Parameters
    ----------
    xhat : ndarray, shape (dim, ...)
        Points of the unit box ``[0, 1]^dim``, coordinate axis first.
    amplitude : float

    Returns
    -------
    ndarray, same shape as ``xhat``

    Examples
    --------
    >>> xhat = np.array([[0.5, 1.0], [0.5, 0.3]])   # two 2D points
    >>> print(np.round(sine_distortion(xhat, 0.1), 6))
    [[0.6 1. ]
     [0.6 0.3]]
    """
    xhat = np.asarray(xhat, dtype=np.float64)
    bump = np.prod(np.sin(np.pi * xhat), axis=0)
    return xhat + amplitude * bump[None]


@dataclass(frozen=True, eq=False)
class BoxMesh:
    """A structured mesh of a box; build it with :func:`box_mesh`.

    Attributes
    ----------
    dim : int
        1, 2 or 3.
    shape : tuple of int
        Elements per direction.
    geom_order : int
        Polynomial order of the element maps.
    lower, upper : ndarray, shape (dim,)
        Corners of the box.
    geom_nodes : ndarray, shape (geom_order + 1,)
        Reference Gauss-Lobatto nodes on [-1, 1] of the element maps.
    nodes : ndarray, shape (E, dim, ng, ..., ng)
        Physical coordinates of each element's geometry nodes, coordinate
        axis before the ``dim`` node axes (the component layout of an
        E-vector), ``ng = geom_order + 1``. Placed on the host when first asked
        for; a GPU solve places them on the device instead (:meth:`nodes_on`).
    distortion : float or callable
        What was passed to :func:`box_mesh`.
    """

    dim: int
    shape: tuple
    geom_order: int
    lower: np.ndarray
    upper: np.ndarray
    geom_nodes: np.ndarray
    _nodes: object
    distortion: object
    #: how to place the nodes in any array module: ``xp -> nodes`` (or None)
    placement: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self._nodes is None and self.placement is None:
            raise ValueError("a BoxMesh needs its nodes or their placement")

    @property
    def nodes(self):
        if self._nodes is None:
            object.__setattr__(self, "_nodes", self.placement(np))
        return self._nodes

    @property
    def placed(self):
        """Are the nodes on the host already?"""
        return self._nodes is not None

    def nodes_on(self, xp=np):
        """:attr:`nodes` in module ``xp``: where the host has them, a copy; else placed
        there anew, not kept (a sine or Kershaw distortion, or none: the 1D coordinates
        made on the host, their products on the device: the same bits, and no copy of
        the whole mesh).

        Examples
        --------
        >>> m = box_mesh(2, 3, distortion=0.05)
        >>> m.nodes_on(np) is m.nodes
        True
        """
        if xp is np:
            return self.nodes
        if self._nodes is not None:
            return to_device(self._nodes, xp)
        return self.placement(xp)

    @property
    def nelements(self):
        """Number of elements ``E``."""
        return int(np.prod(self.shape))

    @property
    def volume(self):
        """Volume of the box (distortions keep the boundary fixed)."""
        return float(np.prod(self.upper - self.lower))

    @property
    def boundary_regions(self):
        """Names of the box's sides, ``("xmin", "xmax", "ymin", ...)``: the sides at the
        lower and upper end of each direction."""
        return BOX_REGIONS[: 2 * self.dim]

    def boundary_facets(self, region=None):
        """``(elements, facets)`` of the boundary (``region=None``) or of one side.

        Local facet ``f = 2 a + side`` is the element's side at ``xi_a = -1``
        (side 0) or ``+1`` (side 1); a region is a side of the box, ``"xmin"``
        (``f = 0`` of the elements with ``e_0 = 0``), ``"xmax"``, ``"ymin"``, ...

        Raises
        ------
        KeyError
            For an unknown region, naming the box's.

        Examples
        --------
        >>> e, f = box_mesh(2, 2).boundary_facets("ymax")
        >>> e.tolist(), f.tolist()
        ([1, 3], [3, 3])
        """
        if region is not None and region not in self.boundary_regions:
            raise KeyError(f"no boundary region {region!r} in a {self.dim}D box mesh; its "
                           f"boundary regions: {list(self.boundary_regions)}")
        sides = range(2 * self.dim) if region is None else [self.boundary_regions.index(region)]
        es, fs = [], []
        for f in sides:
            a, side = divmod(f, 2)
            # the elements with e_a at its end, in increasing order: the C-order indices
            # of the grid with axis a fixed
            sub = list(self.shape)
            sub[a] = 1
            multi = np.indices(sub).reshape(self.dim, -1)
            multi[a] = self.shape[a] - 1 if side else 0
            e = np.ravel_multi_index(tuple(multi), self.shape)
            es.append(e.astype(np.int64))
            fs.append(np.full(e.size, f, dtype=np.int64))
        return np.concatenate(es), np.concatenate(fs)

    def __repr__(self):
        return (
            f"BoxMesh(dim={self.dim}, shape={self.shape}, geom_order={self.geom_order}, "
            f"lower={self.lower.tolist()}, upper={self.upper.tolist()}, "
            f"distortion={self.distortion!r})"
        )


def element_nodes(mesh, elements, xp=np):
    """The nodes ``mesh.nodes[elements]`` in module ``xp``: a box mesh not placed on the
    host yet places them on the device (:meth:`BoxMesh.nodes_on`) and takes the rows
    there; else the host's rows are copied.

    Examples
    --------
    >>> m = box_mesh(1, 3)
    >>> element_nodes(m, np.array([2]))[0].tolist()
    [[0.6666666666666666, 1.0]]
    """
    if xp is not np and getattr(mesh, "placement", None) is not None and not mesh.placed:
        return mesh.nodes_on(xp)[xp.asarray(elements)]
    return to_device(np.ascontiguousarray(mesh.nodes[elements]), xp)


def _is_int(k):
    return isinstance(k, (int, np.integer)) and not isinstance(k, bool)


def _as_shape(n, dim):
    ns = (n,) * dim if _is_int(n) else (tuple(n) if isinstance(n, (tuple, list, np.ndarray)) else None)
    if ns is None or len(ns) != dim or not all(_is_int(k) and k >= 1 for k in ns):
        raise ValueError(
            f"n must be a positive integer or {dim} positive integers (one per direction), got {n!r}"
        )
    return tuple(int(k) for k in ns)


def _as_corner(value, dim, name):
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a finite scalar or {dim} finite numbers, got {value!r}") from err
    if arr.ndim == 0:
        arr = np.full(dim, float(arr))
    if arr.shape != (dim,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be a finite scalar or {dim} finite numbers, got {value!r}")
    return arr


def _reference_coordinates(shape, nodes1d, start=None, stop=None, box=None, xp=np):
    """Undistorted unit-box coordinates of every element's nodes, (E, dim, ng...), in
    module ``xp`` (the 1D values made on the host, the broadcast where the array lives).

    ``start``/``stop`` (element multi-indices, stop exclusive) restrict it to a
    block of the mesh, in C order within the block; the values are those the
    whole mesh has there, bit for bit (a distributed mesh builds only its block).
    ``box = (lo, hi)``: the coordinates scaled to that box instead, ``lo + (hi - lo) *
    xhat`` (the values :func:`_place` gives an undistorted mesh, bit for bit, made on
    the 1D coordinates: one pass over the nodes). The 1D values are :func:`_lattice`'s.
    """
    coords = [xp.asarray(c) for c in _lattice(shape, nodes1d, start, stop, box)]
    dim, ng = len(shape), nodes1d.size
    block = tuple(c.shape[d] for d, c in enumerate(coords))
    out = xp.empty(block + (dim,) + (ng,) * dim)
    for d, c in enumerate(coords):
        out[(slice(None),) * dim + (d,)] = c
    return out.reshape((int(np.prod(block)), dim) + (ng,) * dim)


def box_mesh(dim, n, *, geom_order=1, distortion=0.0, lower=0.0, upper=1.0):
    """Structured mesh of the box ``[lower, upper]`` with ``n`` elements per direction.

    Parameters
    ----------
    dim : int
        1 (intervals), 2 (quadrilaterals) or 3 (hexahedra).
    n : int or sequence of int
        Elements per direction.
    geom_order : int, optional
        Order of the element maps: 1 for multilinear elements, higher for
        curved elements that follow the distortion more closely.
    distortion : float or callable, optional
        A float is the amplitude of :func:`sine_distortion` (0 for a
        uniform mesh). A callable maps unit-box points ``xhat`` of shape
        ``(dim, ...)`` to points of the same shape and should keep the
        unit box's boundary in place.
    lower, upper : float or sequence of float, optional
        Box corners; the distortion acts on the unit box, which is then
        scaled to the box.

    Returns
    -------
    BoxMesh

    Raises
    ------
    ValueError
        For a bad ``dim``, ``n``, ``geom_order``, box, or distortion.

    Examples
    --------
    >>> m = box_mesh(2, (2, 3), geom_order=2, distortion=0.05)
    >>> m.nelements, m.nodes.shape
    (6, (6, 2, 3, 3))
    >>> print(box_mesh(1, 2).nodes[:, 0])
    [[0.  0.5]
     [0.5 1. ]]
    """
    if not _is_int(dim) or dim not in (1, 2, 3):
        raise ValueError(f"dim must be 1, 2 or 3, got {dim!r}")
    shape = _as_shape(n, dim)
    if not _is_int(geom_order) or geom_order < 1:
        raise ValueError(f"geom_order must be an integer >= 1, got {geom_order!r}")
    lo = _as_corner(lower, dim, "lower")
    hi = _as_corner(upper, dim, "upper")
    if np.any(hi <= lo):
        raise ValueError(f"upper must exceed lower in every direction, got lower={lo}, upper={hi}")
    if not callable(distortion) and not (isinstance(distortion, Real)
                                         and np.isfinite(distortion)):
        raise ValueError(f"distortion must be a finite amplitude or a callable, got {distortion!r}")
    nodes1d, _ = gauss_lobatto(int(geom_order) + 1)
    place = _Placement(shape, nodes1d, distortion, lo, hi)
    nodes = place(np) if callable(distortion) and not isinstance(distortion, Kershaw) else None
    return BoxMesh(dim, shape, int(geom_order), lo, hi, nodes1d, nodes, distortion,
                   placement=place)


class _Placement:
    """The nodes of a box mesh's block ``start:stop`` (the whole mesh by default) in any
    array module: ``placement(xp)``. A user's callable distortion runs on the host (when
    the mesh is made: its errors are raised there), then the nodes are copied."""

    def __init__(self, shape, nodes1d, distortion, lo, hi, start=None, stop=None):
        self.args = (shape, nodes1d, distortion, lo, hi, start, stop)

    def __call__(self, xp):
        shape, nodes1d, distortion, lo, hi, start, stop = self.args
        if isinstance(distortion, Real) and distortion == 0:
            if start is None:
                return _reference_coordinates(shape, nodes1d, box=(lo, hi), xp=xp)
            if xp is np:
                return _place(_reference_coordinates(shape, nodes1d, start, stop), 0.0, lo, hi)
            return _scaled(xp.moveaxis(_reference_coordinates(shape, nodes1d, start, stop,
                                                              xp=xp), 1, 0), lo, hi, False)
        return _placed_box(shape, nodes1d, distortion, lo, hi, start, stop, xp=xp)


def _lattice(shape, nodes1d, start=None, stop=None, box=None):
    """The coordinate of each direction at the nodes of the elements ``start:stop`` (element
    multi-indices, stop exclusive; the whole mesh by default), as 1D values shaped to
    broadcast to ``block + (ng,) * dim``: the unit box's, or with ``box = (lo, hi)``
    scaled to it (``lo + (hi - lo) * xhat``). A map of one coordinate at a time evaluated
    on them gives the bits it gives on every node."""
    dim, ng = len(shape), nodes1d.size
    start = (0,) * dim if start is None else tuple(start)
    stop = shape if stop is None else tuple(stop)
    out = []
    for d, n_d in enumerate(shape):
        # (e + (xi + 1) / 2) / n: a node shared by elements e and e + 1 gets
        # the same value from both, because (xi + 1) / 2 is exactly 0 or 1 there.
        e = np.arange(start[d], stop[d], dtype=np.float64)
        c = (e[:, None] + 0.5 * (nodes1d[None, :] + 1.0)) / n_d
        if box is not None:
            c = c * (box[1][d] - box[0][d])
            c += box[0][d]
        bshape = [1] * (2 * dim)
        bshape[d], bshape[dim + d] = stop[d] - start[d], ng
        out.append(c.reshape(bshape))
    return out


def _placed_box(shape, nodes1d, distortion, lo, hi, start=None, stop=None, xp=np):
    """:func:`_place` of :func:`_reference_coordinates` (the block ``start:stop`` of a box
    mesh), in module ``xp``. A sine amplitude and the :class:`Kershaw` map are evaluated on the 1D
    coordinates (:func:`_lattice`) and combined by broadcasting: the same operations on
    the same values, so the same bits, with the costly parts (sines, the blend's layers)
    done once a 1D coordinate instead of once a node, and no array of the undistorted
    nodes."""
    dim, ng = len(shape), nodes1d.size
    if isinstance(distortion, Real) and np.isfinite(distortion) and distortion != 0:
        coords = _lattice(shape, nodes1d, start, stop)
        bump = None                       # sine_distortion's prod over the axes, in order
        for c in coords:
            s_d = xp.asarray(np.sin(np.pi * c))          # the sines on the host: their bits
            bump = s_d if bump is None else bump * s_d
        shift = float(distortion) * bump
        moved = xp.empty((dim,) + shift.shape)
        for d, c in enumerate(coords):   # sine_distortion: xhat + amplitude * bump
            xp.add(xp.asarray(c), shift, out=moved[d])
    elif isinstance(distortion, Kershaw) and dim in (2, 3):
        moved = distortion.on_lattice(_lattice(shape, nodes1d, start, stop), xp)
    elif xp is np:
        return _place(_reference_coordinates(shape, nodes1d, start, stop), distortion, lo, hi)
    else:                                 # a callable: on the host, then copied
        return to_device(_placed_box(shape, nodes1d, distortion, lo, hi, start, stop), xp)
    E = int(np.prod(moved.shape[1:1 + dim]))
    return _scaled(moved.reshape((dim, E) + (ng,) * dim), lo, hi)


def _place(xhat, distortion, lo, hi):
    """Unit-box node coordinates ``(E, dim, ng...)`` -> distorted, scaled to ``[lo, hi]``
    (a new C-contiguous array: ``lo + (hi - lo) * moved``, each factor once per value)."""
    xhat_c = np.moveaxis(xhat, 1, 0)  # (dim, E, ng...)
    if callable(distortion):
        try:
            moved = np.asarray(distortion(xhat_c), dtype=np.float64)
        except Exception as err:
            raise ValueError(f"distortion {distortion!r} failed on points of shape {xhat_c.shape}") from err
        if moved.shape != xhat_c.shape:
            raise ValueError(
                f"distortion returned shape {moved.shape}, expected {xhat_c.shape} "
                "(the shape of its input, coordinate axis first)"
            )
    elif isinstance(distortion, Real) and np.isfinite(distortion):
        moved = sine_distortion(xhat_c, float(distortion)) if distortion != 0 else xhat_c
    else:
        raise ValueError(f"distortion must be a finite amplitude or a callable, got {distortion!r}")
    if moved is not xhat_c and not np.all(np.isfinite(moved)):
        raise ValueError("distortion produced non-finite coordinates")
    return _scaled(moved, lo, hi, check=False)


def _scaled(moved, lo, hi, check=True):
    """Distorted unit-box coordinates ``(dim, E, ng...)`` scaled to ``[lo, hi]``, as
    ``(E, dim, ng...)`` (``check``: non-finite coordinates are an error)."""
    xp = array_module(moved)
    if check and not bool(xp.all(xp.isfinite(moved))):
        raise ValueError("distortion produced non-finite coordinates")
    dim = moved.shape[0]
    bshape = (1, dim) + (1,) * (moved.ndim - 2)
    nodes = xp.multiply(xp.moveaxis(moved, 0, 1), xp.asarray((hi - lo).reshape(bshape)),
                        out=xp.empty((moved.shape[1], dim) + moved.shape[2:]))
    nodes += xp.asarray(lo.reshape(bshape))
    return nodes


def _kershaw_right(eps, t):
    """The 1D map of the right-hand layers: slope ``2 - eps`` below 1/2, ``eps`` above."""
    return np.where(t <= 0.5, (2.0 - eps) * t, 1.0 + eps * (t - 1.0))


def _kershaw_left(eps, t):
    """The mirror image of :func:`_kershaw_right`: slope ``eps`` below 1/2."""
    return 1.0 - _kershaw_right(eps, 1.0 - t)


def _smoothstep(u, smooth):
    """The transition ``0 -> 1`` on ``[0, 1]`` (clamped outside): linear (``smooth=1``),
    cubic (2) or quintic (3)."""
    u = np.clip(u, 0.0, 1.0)
    if smooth == 1:
        return u
    if smooth == 2:
        return u * u * (3.0 - 2.0 * u)
    return u * u * u * (u * (6.0 * u - 15.0) + 10.0)


class Kershaw:
    """The Kershaw transformation of the unit square or cube (Kershaw 1981; the deformed
    mesh of the CEED bake-off problems and of NekRS's BPS5, as in MFEM's
    ``miniapps/meshing`` and libCEED's examples).

    ``x`` is kept; the unit interval in ``y`` (and ``z``) is mapped by a blend of two
    piecewise linear maps with a kink at 1/2: ``left`` (slope ``eps`` on ``[0, 1/2]``,
    ``2 - eps`` above) and ``right`` (``2 - eps``, then ``eps``)::

        Y = (1 - s(x)) left(epsy, y) + s(x) right(epsy, y)      (Z alike with epsz)

    where the blend ``s`` goes over the six layers ``x in [k/6, (k+1)/6]``: 0 (left), up
    to 1, down to 1/2 and on to 0 across the two middle layers, up to 1, then 1 (right).
    With ``smooth=1`` (the benchmarks' choice) the transitions are linear, so the map is
    multilinear on every element of a box mesh whose ``x``-divisions are a multiple of 6
    and ``y``/``z``-divisions even: a ``geom_order=1`` mesh is then exactly the
    transformed mesh. ``smooth`` 2 and 3 make the transitions cubic and quintic (curved
    elements; a higher ``geom_order`` follows them better). The Jacobian determinant is
    ``dY/dy dZ/dz``, between ``eps_y eps_z`` and ``(2 - eps_y)(2 - eps_z)``: positive, and
    the box's boundary stays in place (the volume is kept). ``eps = 1`` is the identity;
    0.3 is the benchmarks' hard case (aspect ratios up to ``(2 - eps) / eps``, ~5.7).

    With ``tiles`` the map is repeated over a grid of ``tiles[0] x tiles[1] (x tiles[2])``
    equal cells of the unit box, each transformed as the whole box is without it (every
    other cell along ``x`` mirrored in ``x``, so that neighbours meet): on the box
    ``[0, tiles]`` (``upper=tiles``) every cell is then the one-cell mesh moved (or
    mirrored), the family of meshes a weak-scaling study needs (more cells, the same
    elements), where refining the unit box would flatten the elements instead.

    Parameters
    ----------
    epsy : float
        In ``(0, 1]``.
    epsz : float, optional
        In ``(0, 1]``; ``epsy`` by default.
    smooth : {1, 2, 3}
        The transitions between layers.
    tiles : int or sequence of int, optional
        Cells per direction (one number: along every direction), each >= 1; 1 (the
        default) is the map of the CEED benchmarks.

    Raises
    ------
    ValueError
        For an ``eps`` outside ``(0, 1]``, a bad ``smooth`` or ``tiles``, or 1D points
        (or points of fewer dimensions than ``tiles`` has entries).

    Examples
    --------
    >>> K = Kershaw(0.3)
    >>> xhat = np.array([[0.0, 1.0, 0.5], [0.25, 0.25, 0.5]])   # three 2D points
    >>> print(np.round(K(xhat), 6))
    [[0.    1.    0.5  ]
     [0.075 0.425 0.5  ]]
    >>> T = Kershaw(0.3, tiles=(1, 2))        # two cells along y, each mapped as above
    >>> print(np.round(T(xhat * [[1.0], [0.5]]) * [[1.0], [2.0]], 6))
    [[0.    1.    0.5  ]
     [0.075 0.425 0.5  ]]
    """

    def __init__(self, epsy=0.3, epsz=None, smooth=1, *, tiles=1):
        epsz = epsy if epsz is None else epsz
        for name, e in (("epsy", epsy), ("epsz", epsz)):
            if isinstance(e, bool) or not isinstance(e, Real) or not (0 < e <= 1):
                raise ValueError(f"Kershaw {name} must be a number in (0, 1], got {e!r}")
        if smooth not in (1, 2, 3) or isinstance(smooth, bool):
            raise ValueError(f"Kershaw smooth must be 1, 2 or 3, got {smooth!r}")
        self.epsy, self.epsz, self.smooth = float(epsy), float(epsz), int(smooth)
        self.tiles = _as_tiles(tiles)

    def tiles_of(self, dim):
        """The cells per direction of a ``dim``-dimensional box: ``tiles`` as given, or
        the one number along every direction.

        Examples
        --------
        >>> Kershaw(0.3, tiles=2).tiles_of(3), Kershaw(0.3, tiles=(1, 1, 2)).tiles_of(3)
        ((2, 2, 2), (1, 1, 2))
        """
        if len(self.tiles) == 1:
            return self.tiles * dim
        if len(self.tiles) != dim:
            raise ValueError(f"Kershaw tiles={self.tiles} has {len(self.tiles)} entries; the "
                             f"points are {dim}-dimensional")
        return self.tiles

    def _in_cells(self, coords):
        """Unit-box coordinates -> (coordinates in their cell, the cell index or None);
        along x every other cell mirrored (the blend runs from ``left`` to ``right``, so
        a cell moved along x would not meet its neighbour)."""
        out = []
        for a, (c, t) in enumerate(zip(coords, self.tiles_of(len(coords)))):
            if t == 1:
                out.append((c, None))
                continue
            scaled = t * np.asarray(c, dtype=np.float64)
            cell = np.minimum(np.floor(scaled), t - 1.0)
            local = scaled - cell
            if a == 0:
                local = np.where(cell % 2 == 1, 1.0 - local, local)
            out.append((local, cell))
        return out

    def blend(self, x):
        """The weight ``s(x)`` of the ``right`` map, ``x`` in the unit interval.

        Examples
        --------
        >>> print(Kershaw(0.3).blend(np.arange(7) / 6))
        [0.  0.  1.  0.5 0.  1.  1. ]
        """
        x = np.asarray(x, dtype=np.float64)
        layer = np.clip(np.floor(6.0 * x), 0, 5)
        lam = 6.0 * x - layer
        g = lambda u: _smoothstep(u, self.smooth)  # noqa: E731
        return np.select([layer == 0, (layer == 1) | (layer == 4), layer == 2, layer == 3],
                         [np.zeros_like(x), g(lam), 1.0 - g(0.5 * lam),
                          1.0 - g(0.5 * (1.0 + lam))], default=1.0)

    def on_lattice(self, coords, xp=np):
        """The map at the nodes of a lattice: ``coords`` the 1D coordinates of each
        direction (NumPy), shaped to broadcast together; returns ``(dim, *broadcast
        shape)`` in module ``xp`` (the 1D maps on the host, the broadcast on ``xp``),
        what :meth:`__call__` gives on the broadcast points (the same operations on the
        same values, the blend and the 1D maps once a 1D coordinate).

        Examples
        --------
        >>> K = Kershaw(0.3)
        >>> x, y = np.linspace(0, 1, 7)[:, None], np.array([[0.25, 0.75]])
        >>> pts = np.stack(np.broadcast_arrays(x, y))
        >>> bool(np.array_equal(K.on_lattice([x, y]), K(pts)))
        True
        """
        dim = len(coords)
        full = np.broadcast_shapes(*[np.shape(c) for c in coords])
        local = self._in_cells(coords)      # the 1D values on the host, the rest on xp
        s = xp.asarray(self.blend(local[0][0]))
        out = xp.empty((dim,) + full)
        out[0] = xp.asarray(coords[0])
        for a, eps in zip(range(1, dim), (self.epsy, self.epsz)):
            t, cell = local[a]
            left, right = _kershaw_left(eps, t), _kershaw_right(eps, t)
            xp.add(xp.asarray(left), s * xp.asarray(right - left), out=out[a])
            if cell is not None:
                out[a] += xp.asarray(cell)
                out[a] /= self.tiles_of(dim)[a]
        return out

    def __call__(self, xhat):
        xhat = np.asarray(xhat, dtype=np.float64)
        dim = xhat.shape[0] if xhat.ndim else 0
        if dim not in (2, 3):
            raise ValueError(f"the Kershaw transformation maps 2D or 3D points (coordinate "
                             f"axis first), got points of shape {xhat.shape}")
        local = self._in_cells(list(xhat))
        s = self.blend(local[0][0])
        out = [xhat[0]]
        for a, eps in zip(range(1, dim), (self.epsy, self.epsz)):
            t, cell = local[a]
            left, right = _kershaw_left(eps, t), _kershaw_right(eps, t)
            y = left + s * (right - left)
            if cell is not None:
                y += cell
                y /= self.tiles_of(dim)[a]
            out.append(y)
        return np.stack(out)

    def __repr__(self):
        sm = f", smooth={self.smooth}" if self.smooth != 1 else ""
        tl = f", tiles={self.tiles if len(self.tiles) > 1 else self.tiles[0]}" \
            if any(t != 1 for t in self.tiles) else ""
        return f"Kershaw(epsy={self.epsy:g}, epsz={self.epsz:g}{sm}{tl})"


def _as_tiles(tiles):
    """``tiles`` of :class:`Kershaw`, checked: a tuple of ints >= 1."""
    seq = tuple(tiles) if isinstance(tiles, (tuple, list, np.ndarray)) else (tiles,)
    if not 1 <= len(seq) <= 3 or not all(_is_int(t) and t >= 1 for t in seq):
        raise ValueError(f"Kershaw tiles must be an integer >= 1 or 2 or 3 of them (cells per "
                         f"direction), got {tiles!r}")
    return tuple(int(t) for t in seq)


def kershaw_mesh(n, eps=0.3, *, dim=3, epsz=None, smooth=1, geom_order=1, lower=0.0,
                 upper=1.0, tiles=1):
    """Box mesh deformed by the Kershaw transformation (:class:`Kershaw`): the CEED
    benchmarks' mesh (BP/BPS with ``eps = 0.3``).

    Parameters
    ----------
    n : int or sequence of int
        Elements per direction: the first (``x``) a multiple of 6, the others even, so
        that every element lies in one layer and one half of ``y`` (``z``): then the map
        is multilinear on each element and ``geom_order=1`` represents it exactly.
    eps : float
        ``epsy`` (and ``epsz`` unless given), in ``(0, 1]``; 1 is the uniform mesh.
    dim : int
        2 or 3.
    epsz : float, optional
    smooth : {1, 2, 3}
        See :class:`Kershaw`.
    geom_order, lower, upper
        As for :func:`box_mesh` (the transformation acts on the unit box, which is then
        scaled to ``[lower, upper]``).
    tiles : int or sequence of int, optional
        The map repeated over this many cells per direction (:class:`Kershaw`); ``n``
        then needs its multiples of 6 and 2 in every cell. With ``upper=tiles`` each
        cell is the one-cell mesh moved: weak scaling's meshes.

    Returns
    -------
    BoxMesh
        Its ``distortion`` is the :class:`Kershaw` instance.

    Raises
    ------
    ValueError
        For a ``dim`` other than 2 or 3, element counts that are not multiples of 6
        (``x``) and 2 (the others) in every cell, and the errors of :class:`Kershaw` and
        :func:`box_mesh`.

    Examples
    --------
    >>> m = kershaw_mesh(6, 0.3, dim=2)
    >>> m.shape, m.distortion
    ((6, 6), Kershaw(epsy=0.3, epsz=0.3))
    >>> print(np.round(m.nodes[0, 1], 3))        # first element, y of its 4 vertices
    [[0.   0.05]
     [0.   0.05]]
    >>> m2 = kershaw_mesh((6, 12), 0.3, dim=2, tiles=(1, 2), upper=(1, 2))
    >>> cells = m2.nodes.reshape((6, 2, 6) + m2.nodes.shape[1:])   # (x, cell along y, y, ...)
    >>> bool(np.allclose(cells[:, 0].reshape(m.nodes.shape), m.nodes))  # the first: m
    True
    """
    kershaw = Kershaw(eps, epsz, smooth, tiles=tiles)
    shape = _kershaw_shape(n, dim, kershaw)
    return box_mesh(dim, shape, geom_order=geom_order, distortion=kershaw,
                    lower=lower, upper=upper)


def _kershaw_shape(n, dim, kershaw=None):
    """The element counts of a Kershaw mesh (:func:`kershaw_mesh`'s ``n`` and ``dim``),
    checked (a multiple of 6 along x, even along the others, in each of the map's
    cells)."""
    if not _is_int(dim) or dim not in (2, 3):
        raise ValueError(f"a Kershaw mesh is 2D or 3D: dim must be 2 or 3, got {dim!r}")
    shape = _as_shape(n, dim)
    tiles = kershaw.tiles_of(dim) if kershaw is not None else (1,) * dim
    if any(k % t for k, t in zip(shape, tiles)) or shape[0] // tiles[0] % 6 or any(
            k // t % 2 for k, t in zip(shape[1:], tiles[1:])):
        where = "" if kershaw is None or set(tiles) == {1} else f" of each of the {tiles} cells"
        raise ValueError(
            f"a Kershaw mesh needs a multiple of 6 elements along x and an even number "
            f"along the other directions{where} (each element in one layer of the map, "
            f"which is then multilinear on it), got n={shape}")
    return shape
