"""A NumPy stand-in for ``smalltc.fem.diffusion_operator`` (the same interface:
``diffusion_operator(space, nq=None, kappa=None, *, quadrature="gauss", device=...)``, the
LinearOperator protocol, ``diagonal()``), computed with NumPy/CuPy tensor contractions:
``K = sum_e R_e^T (sum_ab G_a^T Q^ab G_b) R_e`` with ``Q^ab = w kappa |J| (J^-1 J^-T)_ab``
(docs/math.md section 7). The Poisson tests' sweeps (p = 1..6, 2D and 3D, every local
orientation) run on it, because compiling the package's kernels for every size would cost
the suite's time budget; ``test_package_diffusion_operator_matches_the_standin_on_a_file_mesh``
checks the package's operator against it, and the remaining Poisson tests use the package's.
"""
import numpy as np

import smalltc
from smalltc.fem import basis_1d, evaluate_field, jacobian, det_jacobian, quadrature_rule
from smalltc.fem._device import resolve_device


def diffusion_data(mesh, nq, kappa=None, quadrature="gauss"):
    """Q as ``(E, dim, dim, nq, ..., nq)`` (full, symmetric)."""
    pts, w1 = quadrature_rule(nq, quadrature)
    J = jacobian(mesh, pts)
    detJ = det_jacobian(J)
    Jt = np.moveaxis(J, (1, 2), (-2, -1))
    inv = np.linalg.inv(Jt)                                    # (J^-1)[a, i]
    G = np.einsum("...ai,...bi->...ab", inv, inv)              # J^-1 J^-T
    w = np.ones(())
    for _ in range(mesh.dim):
        w = np.multiply.outer(w, w1)
    scale = w[None] * np.abs(detJ)
    if kappa is not None:
        from smalltc.fem.geometry import map_points
        x = np.moveaxis(map_points(mesh, pts), 1, 0)
        scale = scale * evaluate_field(kappa, x, "kappa")
    return np.moveaxis(G, (-2, -1), (1, 2)) * scale[:, None, None]


class DiffusionStandIn:
    def __init__(self, space, nq, kappa, quadrature, xp):
        b = basis_1d(space.p, nq, quadrature)
        self.space, self.xp = space, xp
        self.B, self.G = xp.asarray(b.B1d), xp.asarray(b.G1d)
        self.Q = xp.asarray(diffusion_data(space.mesh, nq, kappa, quadrature))
        self.dtype = np.dtype(np.float64)
        self.shape = (space.ndofs, space.ndofs)

    def _mats(self, a):
        return [self.G if c == a else self.B for c in range(self.space.dim)]

    def apply(self, x):
        xp = self.xp
        x = xp.asarray(x, dtype=np.float64)
        g = smalltc.interpolate(self.B, self.G, x, self.space.dof_map(xp), what="gradients")
        h = xp.einsum("eab...,eb...->ea...", self.Q, g)
        return smalltc.integrate(self.B, self.G, h, self.space.dof_map(xp), what="gradients",
                                 ndofs=self.space.ndofs)

    __call__ = apply

    def diagonal(self):
        dim = self.space.dim
        idx = "ijk"[:dim]
        pts = "pqr"[:dim]
        spec = ",".join(f"{q}{i}" for q, i in zip(pts, idx)) + f",e{pts}->e{idx}"
        d = 0
        for a in range(dim):
            for b in range(dim):
                mats = [m1 * m2 for m1, m2 in zip(self._mats(a), self._mats(b))]
                d = d + self.xp.einsum(spec, *mats, self.Q[:, a, b])
        return self.space.scatter(d)

    def matvec(self, x):
        return self.apply(x.reshape(-1)).reshape(x.shape)


def diffusion_operator(space, nq=None, kappa=None, *, assembled=False, quadrature="gauss",
                       device="cpu", **_):
    xp = resolve_device(device)
    nq = space.p + 2 if nq is None else nq
    return DiffusionStandIn(space, nq, kappa, quadrature, xp)
