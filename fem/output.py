"""Results to look at: a space and its fields as high-order VTK (ParaView) or gmsh cells.

:func:`write_vtu` writes an order-``p`` field as ``VTK_LAGRANGE_QUADRILATERAL`` /
``VTK_LAGRANGE_HEXAHEDRON`` cells through meshio, so ParaView draws the
polynomial itself (raise its "Nonlinear Subdivision Level" to see the curvature
of the elements and the field inside them). VTK's Lagrange cells place their
nodes at *equispaced* reference positions while smalltc's DoFs sit at
Gauss-Lobatto nodes, so the writer evaluates the element maps and the fields at
the equispaced nodes of order ``p``: the same polynomials, sampled where VTK
expects them. Those nodes are numbered as the space's DoFs (the global
numbering does not depend on where the nodes sit in an element), so the file
has one point per DoF and its point data are the fields' values there.

:func:`to_meshio` returns the ``meshio.Mesh`` without writing it, in VTK's or
gmsh's node order (``cells="gmsh"`` also adds the boundary regions as facet
cells with physical tags, for a ``.msh`` file that :func:`~smalltc.fem.read_mesh`
reads back with its regions).
"""

import os

import numpy as np

import smalltc
from smalltc._arrays import array_module

from ._device import to_host
from ._ordering import HEX_TYPES, QUAD_TYPES, gmsh_reference, meshio_reference, to_tensor_permutation
from .basis import lagrange_basis
from .quadrature import gauss_lobatto
from .space import H1Space

__all__ = ["to_meshio", "write_vtu"]

# VTK's cell type ids of the Lagrange cells, and the XML names of the array types written
_VTK_CELL_IDS = {"VTK_LAGRANGE_QUADRILATERAL": 70, "VTK_LAGRANGE_HEXAHEDRON": 72}
_VTK_TYPES = {np.dtype(np.float64): "Float64", np.dtype(np.float32): "Float32",
              np.dtype(np.int64): "Int64", np.dtype(np.uint8): "UInt8"}


def _cell_order(ref, p):
    """``order`` with ``cell_nodes = tensor_nodes[order]``."""
    # tensor node t is cell node perm[t], so cell node k is tensor node argsort(perm)[k]
    return np.argsort(to_tensor_permutation(ref, p))


def _type_name(dim, p, cells):
    if cells == "vtk":
        return "VTK_LAGRANGE_QUADRILATERAL" if dim == 2 else "VTK_LAGRANGE_HEXAHEDRON"
    table = QUAD_TYPES if dim == 2 else HEX_TYPES
    for name, o in table.items():
        if o == p:
            return name
    raise ValueError(f"meshio has no gmsh {dim}D cell of order {p}")


def _line_name(p):
    return "line" if p == 1 else f"line{p + 1}"


def _check_field(name, u, space, xp):
    u = xp.asarray(u, dtype=np.float64)
    if u.ndim not in (1, 2) or u.shape[-1] != space.ndofs:
        raise ValueError(f"field {name!r} has shape {u.shape}, expected ({space.ndofs},) or "
                         f"(ncomp, {space.ndofs}) for this space")
    return xp.ascontiguousarray(u)


def _sampling_module(fields):
    """Where the fields are sampled: the device of the first CuPy field, else the host."""
    for u in fields.values():
        if array_module(u) is not np:
            return array_module(u)
    return np


def _cells_and_fields(space, cells, fields):
    """The space (a mesh gets its geometry space), the points (ndofs, 3), the fields at
    them, the cell type's name and the cells' node lists in that type's order (NumPy).

    With a field on a GPU, the points, the fields and the node lists are made there (a
    box mesh's nodes and map placed on the device) and only they are copied back."""
    if not hasattr(type(space), "dof_map"):      # a mesh (asking for a map would make it)
        if fields:
            raise ValueError("fields need a space (pass an H1Space, not a mesh)")
        space = H1Space(space, space.geom_order)
    dim, p, nd = space.dim, space.p, space.nd
    if dim not in (2, 3):
        raise ValueError(f"only 2D and 3D meshes are written, got dim={dim}")
    xp = _sampling_module(fields)
    fields = {name: _check_field(name, u, space, xp) for name, u in fields.items()}
    eq = np.linspace(-1.0, 1.0, nd)
    points = np.zeros((space.ndofs, 3))
    points[:, :dim] = to_host(space.map_nodes(eq, xp)).T
    gll, _ = gauss_lobatto(nd)
    Bu = xp.asarray(lagrange_basis(gll, eq)[0])
    data = {}
    for name, u in fields.items():
        # the field at the equispaced nodes, gathered through the map in the same call
        with smalltc.evaluation_job(u.size // space.ndofs * space.nelements * nd ** dim):
            ue = smalltc.interpolate(Bu, None, u, space.dof_map(xp))
        data[name] = np.ascontiguousarray(to_host(space.assign(ue)).T)
    ctype = _type_name(dim, p, cells)
    ref = meshio_reference(ctype, nd ** dim)
    order = _cell_order(ref, p)
    if xp is np:
        conn = space.elem_dofs.reshape(space.nelements, -1)[:, order]
    else:
        rows = space.dof_map(xp).reshape(space.nelements, -1)
        conn = to_host(xp.take(rows, xp.asarray(order), axis=1)).astype(np.int64, copy=False)
    return space, points, data, ctype, conn


def to_meshio(space, *, cells="vtk", **fields):
    """A space (or a mesh) and global fields of it as a ``meshio.Mesh`` of order-``p`` cells.

    Parameters
    ----------
    space : H1Space, BoxMesh or UnstructuredMesh
        A mesh is written with its geometry order.
    cells : {"vtk", "gmsh"}
        VTK Lagrange cells (for ``.vtu``) or gmsh's cells (for ``.msh``;
        facet cells with ``gmsh:physical`` tags carry the boundary regions).
    **fields : array, shape (ndofs,) or (ncomp, ndofs)
        Global vectors of ``space`` (NumPy or CuPy); written as point data.

    Returns
    -------
    meshio.Mesh

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> V = H1Space(box_mesh(2, 2), p=3)
    >>> m = to_meshio(V, u=np.arange(V.ndofs, dtype=float))
    >>> m.cells[0].type, m.cells[0].data.shape, m.points.shape
    ('VTK_LAGRANGE_QUADRILATERAL', (4, 16), (49, 3))
    """
    import meshio

    if cells not in ("vtk", "gmsh"):
        raise ValueError(f"cells must be 'vtk' or 'gmsh', got {cells!r}")
    space, points, data, ctype, conn = _cells_and_fields(space, cells, fields)
    mesh, dim, p = space.mesh, space.dim, space.p
    blocks = [(ctype, conn)]
    cell_data = {}
    field_data = {}
    if cells == "gmsh":
        tags = [np.zeros(space.nelements, dtype=np.int64)]
        names = list(getattr(mesh, "boundary_regions", ()))
        fdim = dim - 1
        fname = _line_name(p) if dim == 2 else _type_name(2, p, "gmsh")
        fref = gmsh_reference(fdim, p) if dim == 2 else meshio_reference(fname)
        forder = _cell_order(fref, p)
        for k, rname in enumerate(names, start=1):
            rows = space.facet_dofs(*mesh.boundary_facets(rname))[:, forder]
            if rows.shape[0]:
                blocks.append((fname, rows))
                tags.append(np.full(rows.shape[0], k, dtype=np.int64))
                field_data[rname] = np.array([k, fdim])
        vol = getattr(mesh, "volume_regions", {}) or {}
        for k, (rname, elems) in enumerate(vol.items(), start=len(names) + 1):
            tags[0][np.asarray(elems)] = k
            field_data[rname] = np.array([k, dim])
        cell_data = {"gmsh:physical": tags, "gmsh:geometrical": [t.copy() for t in tags]}
    return meshio.Mesh(points, blocks, point_data=data, cell_data=cell_data,
                       field_data=field_data)


def _write_raw_vtu(path, points, ctype, conn, data):
    """An unstructured-grid ``.vtu`` file with its arrays appended as raw bytes.

    VTK's XML format with ``<AppendedData encoding="raw">``: each array is an 8-byte
    length followed by its bytes, written straight from the arrays (no base64 text, no
    copy into the XML tree), which VTK, ParaView and meshio read.
    """
    ncells, nper = conn.shape
    arrays = [("Points", np.ascontiguousarray(points, dtype=np.float64), 3),
              ("connectivity", np.ascontiguousarray(conn, dtype=np.int64), 1),
              ("offsets", np.arange(nper, ncells * nper + 1, nper, dtype=np.int64), 1),
              ("types", np.full(ncells, _VTK_CELL_IDS[ctype], dtype=np.uint8), 1)]
    for name, u in data.items():
        u = np.ascontiguousarray(u)
        arrays.append((name, u, 1 if u.ndim == 1 else u.shape[1]))
    tags, offset = [], 0
    for name, a, ncomp in arrays:
        comps = f' NumberOfComponents="{ncomp}"' if a.ndim > 1 else ""   # a scalar: none
        tags.append(f'<DataArray type="{_VTK_TYPES[a.dtype]}" Name="{name}"{comps} '
                    f'format="appended" offset="{offset}"/>')
        offset += 8 + a.nbytes
    point_data = "".join(tags[4:])
    head = ('<?xml version="1.0"?>\n'
            '<VTKFile type="UnstructuredGrid" version="1.0" byte_order="LittleEndian" '
            'header_type="UInt64">\n<UnstructuredGrid>\n'
            f'<Piece NumberOfPoints="{points.shape[0]}" NumberOfCells="{ncells}">\n'
            f'<Points>{tags[0]}</Points>\n<Cells>{"".join(tags[1:4])}</Cells>\n'
            f'<PointData>{point_data}</PointData>\n</Piece>\n</UnstructuredGrid>\n'
            '<AppendedData encoding="raw">\n_')
    with open(path, "wb") as f:
        f.write(head.encode())
        for _, a, _ in arrays:
            f.write(np.uint64(a.nbytes).astype("<u8").tobytes())
            f.write(memoryview(a.astype(a.dtype.newbyteorder("<"), copy=False)).cast("B"))
        f.write(b"\n</AppendedData>\n</VTKFile>\n")


def write_vtu(path, space, *, compression=None, **fields):
    """Write a space's mesh and fields as a ``.vtu`` file of VTK Lagrange cells.

    Parameters
    ----------
    path : str or os.PathLike
        The file (``.vtu``).
    space : H1Space
    compression : {None, "zlib", "lzma"}
        The binary arrays as they are, appended raw to the XML (the default, written
        straight from the arrays) or base64 and compressed by meshio, about 3x smaller and
        many times slower to write (zlib on one host core).
    **fields : array, shape (ndofs,) or (ncomp, ndofs)
        Global vectors of ``space``, e.g. ``u=result.u``; NumPy or CuPy. With a CuPy
        field the points and fields are sampled on its GPU (a box mesh's nodes and DoF
        map made there) and only the samples and the cells' node lists are copied to
        the host.

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        For a field of the wrong length, a path not ending in ``.vtu``, or an unknown
        ``compression``.

    Examples
    --------
    >>> import os, tempfile, meshio
    >>> from smalltc.fem import H1Space, box_mesh
    >>> V = H1Space(box_mesh(3, 1), p=2)
    >>> x = V.dof_coordinates()
    >>> path = write_vtu(os.path.join(tempfile.mkdtemp(), "u.vtu"), V, u=x[0] ** 2)
    >>> m = meshio.read(path)
    >>> m.cells[0].type, bool(np.allclose(m.point_data["u"], m.points[:, 0] ** 2))
    ('VTK_LAGRANGE_HEXAHEDRON', True)
    """
    path = os.fspath(path)
    if not path.endswith(".vtu"):
        raise ValueError(f"path must end in .vtu, got {path!r}")
    if compression not in (None, "zlib", "lzma"):
        raise ValueError(f"compression must be None, 'zlib' or 'lzma', got {compression!r}")
    if compression is None:
        _, points, data, ctype, conn = _cells_and_fields(space, "vtk", fields)
        _write_raw_vtu(path, points, ctype, conn, data)
    else:
        to_meshio(space, cells="vtk", **fields).write(path, file_format="vtu",
                                                      compression=compression)
    return path
