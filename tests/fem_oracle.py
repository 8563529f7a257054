"""NumPy oracles of the FEM layer's geometry, load vectors, errors and Neumann loads: the
plain formulas (one ``tensordot`` per axis on the whole mesh, ``numpy.linalg.det`` and
``numpy.linalg.inv`` at every point), independent of :func:`smalltc.interpolate` and of the
closed-form adjugate the package uses, and the meshes the tests compare them on."""
import itertools

import numpy as np

from smalltc import fem
from smalltc.fem.basis import lagrange_basis
from smalltc.fem.quadrature import gauss_lobatto, quadrature_rule
from smalltc.fem.topology import facet_slices


def apply_tensor(mats, X):
    """``mats[a]`` applied to the ``a``-th of the ``len(mats)`` trailing axes of ``X``."""
    dim = len(mats)
    for a, A in enumerate(mats):
        ax = X.ndim - dim + a
        X = np.moveaxis(np.tensordot(X, A, axes=([ax], [1])), -1, ax)
    return np.ascontiguousarray(X)


def tensor_weights(w, dim):
    out = np.ones(())
    for _ in range(dim):
        out = np.multiply.outer(out, w)
    return out


def map_points(mesh, pts):
    """(E, dim, q...)"""
    Bg, _ = lagrange_basis(mesh.geom_nodes, pts)
    return apply_tensor([Bg] * mesh.dim, mesh.nodes)


def jacobian(mesh, pts):
    """(E, dim, dim, q...), ``J[e, a, b] = dx_a/dxi_b``."""
    Bg, Gg = lagrange_basis(mesh.geom_nodes, pts)
    dim = mesh.dim
    return np.stack([apply_tensor([Gg if a == b else Bg for a in range(dim)], mesh.nodes)
                     for b in range(dim)], axis=2)


def _pointwise(J):
    """``(|J|, J^-1)`` at every point: J^-1 as (E, q..., dim, dim)."""
    Jt = np.moveaxis(J, (1, 2), (-2, -1))
    return np.linalg.det(Jt), np.linalg.inv(Jt)


def quadrature_data(mesh, nq, quadrature="gauss"):
    """(x (dim, E, q...), |J|, w |J|)"""
    pts, w = quadrature_rule(nq, quadrature)
    detJ, _ = _pointwise(jacobian(mesh, pts))
    return np.moveaxis(map_points(mesh, pts), 1, 0), detJ, tensor_weights(w, mesh.dim) * detJ


def field(func, x):
    if callable(func):
        return np.broadcast_to(np.asarray(func(x), dtype=np.float64), x.shape[1:])
    return np.full(x.shape[1:], float(func))


def mass_data(mesh, nq, rho=1.0, quadrature="gauss"):
    x, _, wdetJ = quadrature_data(mesh, nq, quadrature)
    return wdetJ * field(rho, x)


def diffusion_data(mesh, nq, kappa=1.0, quadrature="gauss"):
    """Packed ``Q = w kappa |J| J^-1 J^-T`` (upper triangle, row by row, on axis 1)."""
    pts, w = quadrature_rule(nq, quadrature)
    dim = mesh.dim
    detJ, inv = _pointwise(jacobian(mesh, pts))
    G = np.einsum("...ai,...bi->...ab", inv, inv)
    scale = tensor_weights(w, dim) * detJ * field(kappa, np.moveaxis(map_points(mesh, pts), 1, 0))
    return np.stack([G[..., a, b] * scale for a in range(dim) for b in range(a, dim)], axis=1)


def scatter(space, v):
    out = np.zeros(space.ndofs)
    np.add.at(out, space.elem_dofs.ravel(), v.ravel())
    return out


def load_vector(space, f, nq=None, quadrature="gauss"):
    nq = space.p + 2 if nq is None else nq
    x, _, wdetJ = quadrature_data(space.mesh, nq, quadrature)
    B = fem.basis_1d(space.p, nq, quadrature).B1d
    return scatter(space, apply_tensor([B.T] * space.dim, wdetJ * field(f, x)))


def l2_error(space, u, f, nq=None, quadrature="gauss"):
    nq = space.p + 4 if nq is None else nq
    x, _, wdetJ = quadrature_data(space.mesh, nq, quadrature)
    B = fem.basis_1d(space.p, nq, quadrature).B1d
    d = apply_tensor([B] * space.dim, u[space.elem_dofs]) - field(f, x)
    return float(np.sqrt(np.sum(wdetJ * d * d)))


def h1_error(space, u, grad, nq=None, quadrature="gauss"):
    """``|u_h - u|_1`` with the exact gradient ``grad(x)`` (dim, ...)."""
    nq = space.p + 4 if nq is None else nq
    pts, _ = quadrature_rule(nq, quadrature)
    x, _, wdetJ = quadrature_data(space.mesh, nq, quadrature)
    b = fem.basis_1d(space.p, nq, quadrature)
    dim, ue = space.dim, u[space.elem_dofs]
    ref = np.stack([apply_tensor([b.G1d if c == a else b.B1d for c in range(dim)], ue)
                    for a in range(dim)], axis=1)
    _, inv = _pointwise(jacobian(space.mesh, pts))
    phys = np.einsum("e...bi,eb...->ie...", inv, ref)
    d = phys - np.broadcast_to(grad(x), phys.shape)
    return float(np.sqrt(np.sum(wdetJ * np.sum(d * d, axis=0))))


def boundary_load(space, h, region=None, nq=None):
    """``int_Gamma h phi_i ds``, ``h(x)`` or ``h(x, n)`` (``with_normal``)."""
    import inspect
    nq = space.p + 2 if nq is None else nq
    dim, mesh = space.dim, space.mesh
    pts, wts = quadrature_rule(nq, "gauss")
    Bg, Gg = lagrange_basis(mesh.geom_nodes, pts)
    B1d, _ = lagrange_basis(gauss_lobatto(space.nd)[0], pts)
    with_normal = callable(h) and len(inspect.signature(h).parameters) >= 2
    out = np.zeros(space.ndofs)
    elems, facets = mesh.boundary_facets(region)
    for f in np.unique(facets):
        a, side = divmod(int(f), 2)
        sel = elems[facets == f]
        Be, Ge = lagrange_basis(mesh.geom_nodes, [1.0 if side else -1.0])
        X = mesh.nodes[sel]
        geo = [Be if b == a else Bg for b in range(dim)]
        x = np.squeeze(apply_tensor(geo, X), axis=2 + a)
        J = np.stack([apply_tensor([(Ge if b == a else Gg) if b == c else geo[b]
                                    for b in range(dim)], X) for c in range(dim)], axis=2)
        detJ, inv = _pointwise(np.squeeze(J, axis=3 + a))
        nrm = inv[..., a, :] * (1.0 if side else -1.0)
        length = np.linalg.norm(nrm, axis=-1)
        normal = np.moveaxis(nrm / length[..., None], -1, 0)
        xx = np.moveaxis(x, 1, 0)
        vals = field((lambda y: h(y, normal)) if with_normal else h, xx)
        q = tensor_weights(wts, dim - 1) * np.abs(detJ) * length * vals
        be = apply_tensor([B1d.T] * (dim - 1), q) if dim > 1 else q
        idx = space.elem_dofs[sel][(slice(None),) + facet_slices(dim, space.nd, f)]
        np.add.at(out, idx.ravel(), be.ravel())
    return out


# --- meshes -----------------------------------------------------------------------------------

def rotations(dim):
    """Orientation-preserving symmetries of the reference cell: (axis permutation, flips)."""
    out = []
    for perm in itertools.permutations(range(dim)):
        sign = np.linalg.det(np.eye(dim)[list(perm)])
        for flips in itertools.product((False, True), repeat=dim):
            if sign * (-1) ** sum(flips) > 0:
                out.append((perm, flips))
    return out


def oriented(X, rotation):
    """An element's nodes ``X`` (dim, n, ..., n) with its local numbering turned by
    ``rotation``, a ``(perm, flips)`` of :func:`rotations`."""
    perm, flips = rotation
    X = np.transpose(X, (0,) + tuple(1 + a for a in perm))
    for a, fl in enumerate(flips):
        if fl:
            X = np.flip(X, axis=1 + a)
    return X


def rotated_mesh(bm):
    """An unstructured mesh of the box mesh's elements, every other one with its local
    numbering turned a quarter (and every third a half) in the (xi_0, xi_1) plane."""
    nodes = []
    for e in range(bm.nelements):
        X = bm.nodes[e]
        for _ in range((e % 2) + (e % 3 == 2)):
            X = np.flip(np.swapaxes(X, 1, 2), axis=1)
        nodes.append(X)
    return fem.from_elements(np.array(nodes))


def meshes():
    """``(name, mesh)``: distorted box meshes (2D, 3D, curved maps) and unstructured ones
    with rotated local numberings (2D, 3D)."""
    return [
        ("box2d-g1", fem.box_mesh(2, (3, 4), distortion=0.1)),
        ("box2d-g3", fem.box_mesh(2, 3, geom_order=3, distortion=0.1)),
        ("box3d-g1", fem.box_mesh(3, (2, 3, 2), distortion=0.05)),
        ("box3d-g2", fem.box_mesh(3, 2, geom_order=2, distortion=0.08)),
        ("rot2d-g2", rotated_mesh(fem.box_mesh(2, 3, geom_order=2, distortion=0.1))),
        ("rot3d-g1", rotated_mesh(fem.box_mesh(3, 2, distortion=0.05))),
    ]


def rel(a, b):
    """``max |a - b| / max |b|``."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))
