"""A NumPy/CuPy diffusion operator for the p-multigrid until the fused one lands.

``U = sum_{a,b} G_a^T (Q^{ab} * G_b V)`` with ``Q^{ab} = w |J| (J^-1 J^-T)_{ab}``
(docs/math.md section 7), applied with :func:`smalltc.fem.tensor.apply_tensor`
(one GEMM per axis) between the space's gather and scatter. It is the reference
form of the operator, kept private: :func:`smalltc.fem.multigrid.pmg` uses
``smalltc.fem.diffusion_operator`` when the package has it, and this otherwise.
"""

import numpy as np

from ._device import resolve_device
from .basis import basis_1d
from .geometry import check_jacobian, det_jacobian, jacobian
from .tensor import apply_tensor

__all__ = ["DiffusionStandin", "diffusion_q"]


def diffusion_q(mesh, nq, quadrature="gauss"):
    """``Q[e, a, b, k...] = w_k |det J| (J^-1 J^-T)_{ab}`` on the host, full (not packed)."""
    basis = basis_1d(1, nq, quadrature)
    J = jacobian(mesh, basis.qpoints)                     # (E, dim, dim, nq...)
    detJ = det_jacobian(J)
    check_jacobian(detJ, getattr(mesh, "shape", None))
    dim = mesh.dim
    Jm = np.moveaxis(np.moveaxis(J, 1, -1), 1, -1)       # (E, nq..., dim, dim)
    Jinv = np.linalg.inv(Jm)
    G = np.einsum("...ai,...bi->...ab", Jinv, Jinv)      # J^-1 J^-T (rows: reference axes)
    w = basis.qweights
    for _ in range(dim - 1):
        w = np.multiply.outer(w, basis.qweights)
    G = G * (w[None] * detJ)[..., None, None]
    return np.ascontiguousarray(np.moveaxis(np.moveaxis(G, -1, 1), -1, 1))


class DiffusionStandin:
    """``y = K x`` of the Laplacian on an H1 space (``kappa = 1``), plus ``shift * M x``.

    Parameters
    ----------
    space : H1Space
    nq : int, optional
        Gauss points per direction, ``p + 2`` by default.
    shift : float
        Adds ``shift`` times the mass operator (a Helmholtz operator) when nonzero.
    device : {"cpu", "gpu", "auto"}

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> K = DiffusionStandin(H1Space(box_mesh(2, 2, distortion=0.05), 2))
    >>> bool(abs(K(np.ones(K.shape[0]))).max() < 1e-12)    # constants: no gradient
    True
    """

    def __init__(self, space, nq=None, *, shift=0.0, device="cpu"):
        self.xp = xp = resolve_device(device)
        nq = space.p + 2 if nq is None else nq
        b = basis_1d(space.p, nq)
        self.space, self.dtype, self.shift = space, np.dtype(np.float64), float(shift)
        self.B1d, self.G1d = xp.asarray(b.B1d), xp.asarray(b.G1d)
        self.Q = xp.asarray(diffusion_q(space.mesh, nq))
        self.D = None
        if self.shift:
            from .geometry import mass_data
            self.D = xp.asarray(self.shift * mass_data(space.mesh, nq))

    @property
    def shape(self):
        return (self.space.ndofs, self.space.ndofs)

    @property
    def device(self):
        return "cpu" if self.xp is np else "gpu"

    def _mats(self, a, transpose=False):
        dim = self.space.dim
        ms = [self.G1d if c == a else self.B1d for c in range(dim)]
        return [m.T for m in ms] if transpose else ms

    def __call__(self, x):
        xp, dim = self.xp, self.space.dim
        V = self.space.gather(xp.asarray(x, dtype=self.dtype))
        g = [apply_tensor(self._mats(b), V) for b in range(dim)]
        U = 0
        for a in range(dim):
            h = sum(self.Q[:, a, b] * g[b] for b in range(dim))
            U = U + apply_tensor(self._mats(a, True), h)
        if self.D is not None:
            Bt = [self.B1d.T] * dim
            U = U + apply_tensor(Bt, self.D * apply_tensor([self.B1d] * dim, V))
        return self.space.scatter(U)

    apply = __call__

    def diagonal(self):
        """``diag(K)``: ``sum_{a,b,k} G_a[k,i] Q^{ab}[k] G_b[k,i]`` summed into the DoFs."""
        dim = self.space.dim
        U = 0
        for a in range(dim):
            for b in range(dim):
                ma, mb = self._mats(a), self._mats(b)
                U = U + apply_tensor([(ma[c] * mb[c]).T for c in range(dim)], self.Q[:, a, b])
        if self.D is not None:
            U = U + apply_tensor([(self.B1d ** 2).T] * dim, self.D)
        return self.space.scatter(U)

    def __repr__(self):
        return (f"DiffusionStandin(p={self.space.p}, ndofs={self.space.ndofs}, "
                f"shift={self.shift:g}, device={self.device!r})")
