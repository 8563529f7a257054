"""The p-multigrid preconditioner across MPI ranks (``precond="pmg"`` of a distributed
Poisson solve).

Every rank holds every level (orders ``p, ceil(p/2), ..., 1``:
:func:`~smalltc.fem.multigrid.pmg_orders`) on its own elements: a
:class:`~.space.DistributedH1Space` of each order on the same distributed mesh, the
distributed diffusion operator of each (:class:`~.operators.DistributedOperator`)
with the level's Dirichlet DoFs made identity rows, and its Jacobi diagonal. One
V-cycle on a residual ``r`` (owner form in, owner form out):

* smoothing: Chebyshev polynomials in ``D^-1 A`` on ``[lo, hi] lambda_max`` (no inner
  products; ``lambda_max`` estimated once, at setup, by power iteration with sums
  across the ranks, from a start vector made of the DoFs' global numbers, so it does
  not depend on the rank count);
* transfers (:class:`DistributedTransfer`): the element interpolation between the
  orders on each rank's elements, weighted by the *global* multiplicity of the fine
  nodes, the input's ghosts filled first (forward exchange) and the partial sums
  at shared nodes added onto their owners after (reverse exchange);
* the coarsest level (order 1): Jacobi-CG with inner products summed across the ranks
  (to ``coarse_tol``).

The same smoothing before and after keeps the V-cycle symmetric, so the outer CG
is plain CG; its iterations barely grow with ``p`` or the mesh and do not depend on
the rank count (the same arithmetic up to rounding).
"""

import numpy as np

import smalltc

from ..basis import lagrange_basis
from ..multigrid import pmg_orders
from ..quadrature import gauss_lobatto
from ..solvers import cg, jacobi
from .comm import Reducer, collective
from .operators import distributed_diffusion_operator

__all__ = ["DistributedTransfer", "DistributedChebyshev", "DistributedPMultigrid",
           "distributed_pmg"]


def _owner(space, v, xp):
    """``v`` (a vector of ``xp``) in owner form, through the host for CuPy."""
    if xp is np:
        return space.owner_form(v)
    return space.owner_form(v, xp)


class DistributedTransfer:
    """Prolongation from the order-``q`` level to the order-``p`` level of one distributed
    mesh, and its transpose (owner form in and out; collective).

    Parameters
    ----------
    coarse, fine : DistributedH1Space
        On the same distributed mesh.
    coarse_free, fine_free : ndarray of bool
        The free DoFs of each level (local vectors).
    xp : module

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import box_mesh
    >>> from smalltc.fem.distributed import DistributedH1Space, distribute_mesh
    >>> m = distribute_mesh(box_mesh(2, 2, distortion=0.05), MPI.COMM_SELF)
    >>> Vc, Vf = DistributedH1Space(m, 1), DistributedH1Space(m, 3)
    >>> T = DistributedTransfer(Vc, Vf, np.ones(Vc.nlocal, bool), np.ones(Vf.nlocal, bool))
    >>> x1, x3 = Vc.local.dof_coordinates()[0], Vf.local.dof_coordinates()[0]
    >>> bool(np.allclose(T.prolong(x1), x3))                 # x is in both spaces
    True
    """

    def __init__(self, coarse, fine, coarse_free, fine_free, xp=np, dtype=np.float64):
        if coarse.mesh is not fine.mesh or coarse.p > fine.p:
            raise ValueError(f"a transfer goes from a lower to a higher order on one mesh, got "
                             f"p={coarse.p} -> p={fine.p}")
        self.coarse, self.fine, self.xp, self.dtype = coarse, fine, xp, np.dtype(dtype)
        I1d, _ = lagrange_basis(gauss_lobatto(coarse.nd)[0], gauss_lobatto(fine.nd)[0])
        self.I1d = xp.ascontiguousarray(xp.asarray(I1d.astype(self.dtype)))
        self.I1dT = xp.ascontiguousarray(self.I1d.T)
        # the global multiplicity of each fine node: the local counts summed on the owners
        mult = fine.local.multiplicity().astype(np.float64)
        fine.owner_form(mult)
        fine.consistent_form(mult)
        w = np.where(np.asarray(fine_free, dtype=bool), 1.0 / mult, 0.0)
        self.weights = fine.local.gather(xp.asarray(w.astype(self.dtype)))     # E-vector
        self.coarse_free = xp.asarray(np.asarray(coarse_free, dtype=self.dtype))
        self.fwd_c = coarse.make_halo(xp)
        self.fwd_f = fine.make_halo(xp)

    def prolong(self, xc):
        """``P x_coarse``: the coarse vector's ghosts filled, interpolated on each element,
        weighted, summed onto the owners."""
        xp = self.xp
        xc = xp.array(xc, dtype=self.dtype)
        self.fwd_c.forward(xc)
        xc *= self.coarse_free
        v = smalltc.interpolate(self.I1d, None, self.coarse.local.gather(xc))
        y = self.fine.local.scatter(v * self.weights)
        return self.fwd_f.reverse(y)

    def restrict(self, rf):
        """``P^T r_fine``."""
        xp = self.xp
        rf = xp.array(rf, dtype=self.dtype)
        self.fwd_f.forward(rf)
        v = smalltc.interpolate(self.I1dT, None, self.fine.local.gather(rf) * self.weights)
        rc = self.fwd_c.reverse(self.coarse.local.scatter(v))
        return rc * self.coarse_free


def _start_vector(space, xp, dtype):
    """A fixed pseudo-random vector of the DoFs' global numbers (owner form): the same
    global vector on any number of ranks."""
    g = space.local_to_global.astype(np.float64)
    v = np.sin(g * 12.9898 + 78.233) * 43758.5453
    v = v - np.floor(v) + 0.5
    v[space.ghosts] = 0.0
    return xp.asarray(v.astype(dtype))


class DistributedChebyshev:
    """Chebyshev smoothing of ``A x = b`` with ``D^-1 A`` on ``[lo, hi] * lambda_max``.

    ``lambda_max`` comes from ``iterations`` power steps (inner products summed
    across the ranks by ``red``).
    """

    def __init__(self, A, red, *, degree=3, lo=0.3, hi=1.1, iterations=12):
        self.A, self.degree = A, int(degree)
        xp = A.xp
        self.inv = 1.0 / A.diagonal()
        v = _start_vector(A.op.space, xp, A.dtype)
        diag = 1.0 / self.inv
        lam = 1.0
        for _ in range(iterations):          # power steps on D^-1 A; Rayleigh quotient in D
            Av = A(v)
            num, den = red.sums(float(xp.vdot(v, Av)), float(xp.vdot(v, v * diag)))
            lam = num / den
            w = self.inv * Av
            (nw,) = red.sums(float(xp.vdot(w, w)))
            v = w / np.sqrt(nw)
        self.lambda_max = lam
        a, b = lo * lam, hi * lam
        self.theta, self.delta = (b + a) / 2, (b - a) / 2

    def __call__(self, b, x=None):
        """``x`` after ``degree`` Chebyshev steps from ``x`` (zero when None)."""
        A, inv = self.A, self.inv
        r = b.copy() if x is None else b - A(x)
        sigma = self.theta / self.delta
        rho = 1.0 / sigma
        d = inv * r / self.theta
        x = d.copy() if x is None else x + d
        for _ in range(self.degree - 1):
            r -= A(d)
            rho_new = 1.0 / (2.0 * sigma - rho)
            d = (rho_new * rho) * d + (2.0 * rho_new / self.delta) * (inv * r)
            x += d
            rho = rho_new
        return x


class DistributedPMultigrid:
    """The V-cycle over the levels (finest first); a preconditioner for
    :func:`smalltc.fem.cg` (``z = B r``, owner form).

    Attributes
    ----------
    orders : list of int
    operators : list
        Each level's constrained operator (finest first).
    smoothers : list of DistributedChebyshev
    transfers : list of DistributedTransfer
        ``transfers[l]`` between level ``l + 1`` (coarser) and ``l``.
    coarse_iterations : list of int
        CG iterations of each coarse solve so far.
    """

    def __init__(self, operators, smoothers, transfers, red, coarse_tol=1e-6):
        self.operators, self.smoothers, self.transfers = operators, smoothers, transfers
        self.orders = [A.op.space.p for A in operators]
        self.red, self.coarse_tol = red, float(coarse_tol)
        Ac = operators[-1]
        self.coarse_precond = jacobi(Ac.diagonal())
        self.coarse_iterations = []
        self.xp, self.dtype = operators[0].xp, operators[0].dtype
        self.shape = operators[0].shape

    def _coarse(self, b):
        sol = cg(self.operators[-1], b, tol=self.coarse_tol, precond=self.coarse_precond,
                 comm=self.red, raise_on_failure=False)
        self.coarse_iterations.append(sol.iterations)
        return sol.x

    def _vcycle(self, level, b):
        if level == len(self.operators) - 1:
            return self._coarse(b)
        A, S, T = self.operators[level], self.smoothers[level], self.transfers[level]
        x = S(b)
        r = b - A(x)
        x += T.prolong(self._vcycle(level + 1, T.restrict(r)))
        return S(b, x)

    def __call__(self, r):
        return self._vcycle(0, self.xp.asarray(r, dtype=self.dtype))

    def __repr__(self):
        return (f"DistributedPMultigrid(orders={self.orders}, degree="
                f"{self.smoothers[0].degree if self.smoothers else 0}, "
                f"ranks={self.operators[0].op.space.nranks})")


def distributed_pmg(A, *, dirichlet, neumann_regions=(), kappa=None, quadrature="gauss",
                    orders=None, degree=3, coarse_tol=1e-6, backend="auto"):
    """The distributed p-multigrid preconditioner of the constrained operator ``A`` (the
    finest level; collective).

    Parameters
    ----------
    A : DistributedConstrainedOperator
        :class:`~.poisson.DistributedConstrainedOperator` of a distributed diffusion
        operator (``A.op``) and its Dirichlet constraints.
    dirichlet : dict
        Region -> anything (the regions only: the coarse levels' constraints are
        homogeneous), as the problem's.
    neumann_regions : sequence of str
    kappa, quadrature, backend
        The coarse operators' (as the finest's).
    orders : list of int, optional
        The levels' orders, finest first; :func:`~smalltc.fem.multigrid.pmg_orders`.
    degree : int
        Chebyshev degree of each smoothing (3, as the serial :func:`~smalltc.fem.pmg`).
    coarse_tol : float
        The coarse CG's relative residual target (tighter targets cost coarse
        iterations and leave the outer iterations as they are).

    Returns
    -------
    DistributedPMultigrid
    """
    from .poisson import DistributedConstrainedOperator, distributed_dirichlet_bc
    from .space import DistributedH1Space
    space, xp = A.op.space, A.xp
    orders = pmg_orders(space.p) if orders is None else [int(q) for q in orders]
    if orders[0] != space.p or any(b > a for a, b in zip(orders, orders[1:])):
        raise ValueError(f"orders must start at the operator's p = {space.p} and not increase, "
                         f"got {orders}")
    red = Reducer(space.comm, device_buffers=getattr(A.op.halo, "transport", "") == "device")
    zero = {r: 0.0 for r in dirichlet}
    ops, frees = [A], [_host(A._P) > 0]
    where = "cpu" if xp is np else "gpu"
    for q in orders[1:]:
        Vq = DistributedH1Space(space.mesh, q)
        K = distributed_diffusion_operator(Vq, q + 2, kappa, quadrature=quadrature,
                                           device=where, backend=backend)
        bc = distributed_dirichlet_bc(Vq, zero, list(neumann_regions))
        Aq = DistributedConstrainedOperator(K, bc)
        free = np.ones(Vq.nlocal, dtype=bool)
        free[bc.dofs] = False
        ops.append(Aq)
        frees.append(free)
    smoothers = [collective(space.comm, DistributedChebyshev, Al, red, degree=degree,
                            what="the Chebyshev bounds") for Al in ops[:-1]]
    transfers = [DistributedTransfer(ops[k + 1].op.space, ops[k].op.space, frees[k + 1],
                                     frees[k], xp, A.dtype) for k in range(len(ops) - 1)]
    return DistributedPMultigrid(ops, smoothers, transfers, red, coarse_tol)


def _host(a):
    from .._device import to_host
    return to_host(a)
