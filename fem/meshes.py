"""Meshes made with gmsh's Python API (the optional ``gmsh`` extra), and the shipped one.

:func:`make_demo_mesh` makes the curved mesh of the demo: a quarter of the
annulus ``0.5 <= r <= 1`` (2D; in 3D extruded to a slab of height 0.5), meshed
with structured quadrilaterals (hexahedra) whose high-order nodes lie on the
arcs. Physical groups name its boundary: ``"inner"`` and ``"outer"`` (the arcs),
``"bottom"`` (``y = 0``), ``"left"`` (``x = 0``), and in 3D ``"front"``
(``z = 0``) and ``"back"``; the cells are ``"domain"``.

The file the demo reads ships in the package, made by this function:
:func:`demo_mesh_path`.
"""

import os

__all__ = ["make_demo_mesh", "demo_mesh_path"]

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def demo_mesh_path(dim=2):
    """Path of the shipped demo mesh (``fem/data/annulus2d.msh`` or ``annulus3d.msh``).

    Examples
    --------
    >>> os.path.basename(demo_mesh_path())
    'annulus2d.msh'
    """
    return os.path.join(_DATA, f"annulus{int(dim)}d.msh")


def make_demo_mesh(path, *, dim=2, n=4, order=2, nz=2):
    """Write the quarter-annulus mesh with gmsh (imported here; ``pip install gmsh``).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.msh`` file to write (MSH 4.1, ASCII).
    dim : int
        2 (quadrilaterals) or 3 (hexahedra, ``nz`` layers in z).
    n : int
        Elements along each arc and across the annulus.
    order : int
        Order of the element maps (2: 9/27-node cells; higher: gmsh's
        Lagrange cells).
    nz : int
        Layers in z (3D).

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    ImportError
        Without gmsh.

    Examples
    --------
    >>> import tempfile
    >>> from smalltc.fem import read_mesh
    >>> try:
    ...     m = read_mesh(make_demo_mesh(os.path.join(tempfile.mkdtemp(), "a.msh"), n=2))
    ...     regions = sorted(m.boundary_regions)
    ... except ImportError:                     # no gmsh here
    ...     regions = ["bottom", "inner", "left", "outer"]
    >>> regions
    ['bottom', 'inner', 'left', 'outer']
    """
    import gmsh

    path = os.fspath(path)
    if dim not in (2, 3):
        raise ValueError(f"dim must be 2 or 3, got {dim!r}")
    was = gmsh.isInitialized()
    if not was:
        gmsh.initialize(interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("annulus")
        occ = gmsh.model.geo
        c = occ.addPoint(0, 0, 0)
        p1, p2 = occ.addPoint(0.5, 0, 0), occ.addPoint(1, 0, 0)
        p3, p4 = occ.addPoint(0, 1, 0), occ.addPoint(0, 0.5, 0)
        bottom = occ.addLine(p1, p2)
        outer = occ.addCircleArc(p2, c, p3)
        left = occ.addLine(p3, p4)
        inner = occ.addCircleArc(p4, c, p1)
        loop = occ.addCurveLoop([bottom, outer, left, inner])
        surf = occ.addPlaneSurface([loop])
        for ln in (bottom, outer, left, inner):
            occ.mesh.setTransfiniteCurve(ln, n + 1)
        occ.mesh.setTransfiniteSurface(surf)
        occ.mesh.setRecombine(2, surf)
        if dim == 2:
            occ.synchronize()
            for name, tag in (("bottom", bottom), ("outer", outer), ("left", left),
                              ("inner", inner)):
                gmsh.model.setPhysicalName(1, gmsh.model.addPhysicalGroup(1, [tag]), name)
            gmsh.model.setPhysicalName(2, gmsh.model.addPhysicalGroup(2, [surf]), "domain")
        else:
            out = occ.extrude([(2, surf)], 0, 0, 0.5, numElements=[nz], recombine=True)
            occ.synchronize()
            # extrude returns: top surface, the volume, then the lateral surfaces in the
            # order of the loop's curves (bottom, outer, left, inner)
            top, vol = out[0][1], out[1][1]
            lateral = [t for d, t in out[2:] if d == 2]
            for name, tag in zip(("bottom", "outer", "left", "inner"), lateral):
                gmsh.model.setPhysicalName(2, gmsh.model.addPhysicalGroup(2, [tag]), name)
            gmsh.model.setPhysicalName(2, gmsh.model.addPhysicalGroup(2, [surf]), "front")
            gmsh.model.setPhysicalName(2, gmsh.model.addPhysicalGroup(2, [top]), "back")
            gmsh.model.setPhysicalName(3, gmsh.model.addPhysicalGroup(3, [vol]), "domain")
        gmsh.model.mesh.generate(dim)
        gmsh.model.mesh.setOrder(order)
        gmsh.option.setNumber("Mesh.MshFileVersion", 4.1)
        gmsh.option.setNumber("Mesh.Binary", 0)
        gmsh.write(path)
        gmsh.model.remove()
    finally:
        if not was:
            gmsh.finalize()
    return path
