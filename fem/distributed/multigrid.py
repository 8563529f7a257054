"""The p-multigrid preconditioner across MPI ranks (``precond="pmg"`` of a distributed
Poisson solve).

Every rank holds every level (orders ``p, ceil(p/2), ..., 1``:
:func:`~smalltc.fem.multigrid.pmg_orders`) on its own elements: a
:class:`~.space.DistributedH1Space` of each order on the same distributed mesh, the
distributed diffusion operator of each (:class:`~.operators.DistributedOperator`)
with the level's Dirichlet DoFs made identity rows, and its Jacobi diagonal. One
V-cycle on a residual ``r`` (owner form in, owner form out):

* smoothing: the serial smoother (:class:`~smalltc.fem.chebyshev.Chebyshev`, fourth
  kind, degree 3: no inner products), its ``lambda_max`` estimated once, at setup, by
  Jacobi-PCG Lanczos steps with sums across the ranks, from a start vector made of the
  DoFs' global numbers, so it does not depend on the rank count;
* transfers (:class:`DistributedTransfer`): the element interpolation between the
  orders on each rank's elements, weighted by the *global* multiplicity of the fine
  nodes, the input's ghosts filled first (forward exchange) and the partial sums
  at shared nodes added onto their owners after (reverse exchange);
* the coarsest level (order 1, :mod:`.coarse`): by default (pyamg installed) the global
  order-1 matrix gathered to rank 0 at setup and one AMG V-cycle there per V-cycle, the
  residual gathered and the correction scattered back (:class:`~.coarse.GatheredAMG`);
  or Jacobi-CG with inner products summed across the ranks (``coarse="cg"``, to
  ``coarse_tol``).

The levels below the finest use ``q + 1`` quadrature points, as the serial
:func:`~smalltc.fem.pmg`'s; with the AMG coarse solve the V-cycle is then the serial
one, and so are the outer iterations on any number of ranks (the same arithmetic up to
rounding; the pyamg hierarchy is built on the whole mesh's numbering).

The same smoothing before and after keeps the V-cycle symmetric, so the outer CG
is plain CG; its iterations barely grow with ``p`` or the mesh and do not depend on
the rank count (the same arithmetic up to rounding).
"""

import logging

import numpy as np

import smalltc

from ..basis import lagrange_basis
from ..boundary import ConstrainedOperator
from .._device import to_host
from .._graph import GRAPH_CHOICES, GraphReplay
from ..chebyshev import Chebyshev, estimate_lambda_max, start_vector
from ..coarse import _pyamg, _pyamg_present
from ..multigrid import _numba_present, pmg_orders
from ..operators import diffusion_operator
from ..quadrature import gauss_lobatto
from .coarse import COARSE, DistributedCG, GatheredAMG
from .comm import collective, make_reducer
from .halo import set_at
from .operators import distributed_diffusion_operator
from .space import DistributedH1Space

#: how the V-cycle's vectors meet across the ranks (:func:`distributed_pmg`)
EXCHANGES = ("auto", "sum", "owner")

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
    dtype : dtype
    kernel : bool or None
        The element part by :func:`smalltc.pmg_transfer` (the serial
        :class:`~smalltc.fem.multigrid.Transfer`'s: one fused kernel each way on a GPU,
        compiled with Numba on the host); False: :func:`smalltc.interpolate` on the
        gathered element vectors, then a scatter. None: the kernel on a GPU and where
        Numba imports.

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
    >>> A = DistributedTransfer(Vc, Vf, np.ones(Vc.nlocal, bool), np.ones(Vf.nlocal, bool),
    ...                         kernel=False)
    >>> r = np.random.default_rng(0).random(Vf.nlocal)
    >>> bool(np.allclose(T.restrict(r), A.restrict(r)))     # the kernel and the arrays
    True
    """

    def __init__(self, coarse, fine, coarse_free, fine_free, xp=np, dtype=np.float64,
                 kernel=None):
        if coarse.mesh is not fine.mesh or coarse.p > fine.p:
            raise ValueError(f"a transfer goes from a lower to a higher order on one mesh, got "
                             f"p={coarse.p} -> p={fine.p}")
        self.coarse, self.fine, self.xp, self.dtype = coarse, fine, xp, np.dtype(dtype)
        I1d, _ = lagrange_basis(gauss_lobatto(coarse.nd)[0], gauss_lobatto(fine.nd)[0])
        self.I1d = xp.ascontiguousarray(xp.asarray(I1d.astype(self.dtype)))
        self.I1dT = xp.ascontiguousarray(self.I1d.T)
        # the global multiplicity of each fine node: the local counts summed on the owners
        # (made and exchanged where the vectors are; the masks cross as bytes)
        mult = fine.local.multiplicity(xp).astype(np.float64)
        fine.owner_form(mult, xp)
        fine.consistent_form(mult, xp)
        w = xp.where(xp.asarray(_host_or(fine_free, xp), dtype=bool), 1.0 / mult, 0.0)
        self.fine_w = w.astype(self.dtype)                                    # per DoF
        self.weights = fine.local.gather(self.fine_w)                         # E-vector
        self.coarse_free = xp.asarray(_host_or(coarse_free, xp), dtype=bool).astype(self.dtype)
        self.fwd_c = coarse.make_halo(xp)
        self.fwd_f = fine.make_halo(xp)
        self.kernel = (xp is not np or _numba_present()) if kernel is None else bool(kernel)
        if self.kernel:
            E, dim = fine.nelements, fine.dim
            self._maps = tuple(s.local.dof_map(xp).reshape((E,) + (s.nd,) * dim)
                               for s in (coarse, fine))

    def _prolong_local(self, xc):
        """The element part of the prolongation: ``xc`` consistent (a copy the caller
        gives up), the fine partial sums of this rank's elements."""
        if self.kernel:
            cmap, fmap = self._maps
            return smalltc.pmg_transfer(self.I1d, xc, cmap, self.coarse_free, fmap, self.fine_w)
        xc *= self.coarse_free
        v = smalltc.interpolate(self.I1d, None, self.coarse.local.gather(xc))
        return self.fine.local.scatter(v * self.weights)

    def _restrict_local(self, rf):
        """The element part of the restriction: ``rf`` consistent, the coarse partial sums
        of this rank's elements, masked by the coarse free DoFs (the mask agrees across
        the ranks, so it may come before the sum)."""
        if self.kernel:
            cmap, fmap = self._maps
            return smalltc.pmg_transfer(self.I1dT, rf, fmap, self.fine_w, cmap, self.coarse_free)
        v = smalltc.interpolate(self.I1dT, None, self.fine.local.gather(rf) * self.weights)
        return self.coarse.local.scatter(v) * self.coarse_free

    def prolong(self, xc):
        """``P x_coarse``: the coarse vector's ghosts filled, interpolated on each element,
        weighted, summed onto the owners (owner form in and out)."""
        xc = self.xp.array(xc, dtype=self.dtype)
        self.fwd_c.forward(xc)
        return self.fwd_f.reverse(self._prolong_local(xc))

    def prolong_sum(self, xc):
        """:meth:`prolong` on consistent vectors: ``xc``'s ghosts hold their owners'
        values already; the result is consistent (the neighbour sum)."""
        return self.fwd_f.sum(self._prolong_local(self.xp.array(xc, dtype=self.dtype)))

    def restrict(self, rf):
        """``P^T r_fine`` (owner form in and out)."""
        rf = self.xp.array(rf, dtype=self.dtype)
        self.fwd_f.forward(rf)
        return self.fwd_c.reverse(self._restrict_local(rf))

    def restrict_sum(self, rf):
        """:meth:`restrict` on consistent vectors (in and out)."""
        return self.fwd_c.sum(self._restrict_local(self.xp.array(rf, dtype=self.dtype)))


def _host_or(a, xp):
    """``a`` on the host for NumPy work, as it is for a GPU's."""
    return to_host(a) if xp is np else a


def _start_vector(space, xp, dtype):
    """A fixed pseudo-random vector of the DoFs' global numbers (owner form), entries in
    ``[-0.5, 0.5)``: the same global vector on any number of ranks
    (:func:`~smalltc.fem.chebyshev.start_vector`, made on the vectors' device)."""
    v = start_vector(space.local_to_global_on(xp), dtype)
    v[xp.asarray(space.ghosts)] = 0
    return v


def distributed_lambda_max(A, red, steps=10, diagonal=None):
    """The largest Ritz value of ``D^-1 A`` from ``steps`` Jacobi-PCG (Lanczos) iterations
    across the ranks: :func:`smalltc.fem.chebyshev.estimate_lambda_max` with its inner
    products summed by ``red`` and its start vector :func:`_start_vector` (rank-count
    independent). Collective.

    Raises
    ------
    ValueError
        On every rank, when ``A`` or the Lanczos matrix is seen not to be positive
        definite.
    """
    xp = A.xp
    inv = 1.0 / (A.diagonal() if diagonal is None else diagonal)
    return estimate_lambda_max(A, inv, steps=steps, start=_start_vector(A.op.space, xp, A.dtype),
                               dot=lambda a, b: red.sums(float(xp.vdot(a, b)))[0])


class DistributedChebyshev(Chebyshev):
    """The serial smoother (:class:`smalltc.fem.chebyshev.Chebyshev`, fourth kind by
    default) of a distributed constrained operator: its steps are the operator's
    applications and pointwise updates (owner form in, owner form out), and only its
    ``lambda_max`` needs sums across the ranks (:func:`distributed_lambda_max`, times
    ``safety``). ``S(b)``: ``degree`` steps from zero; ``S(b, x)``: from ``x``.
    """

    def __init__(self, A, red, *, degree=3, kind="fourth", safety=1.1, steps=10):
        diagonal = A.diagonal()                  # collective: once
        estimate = distributed_lambda_max(A, red, steps, diagonal)
        super().__init__(A, diagonal, degree=degree, kind=kind, lambda_max=safety * estimate,
                         safety=safety, check=False)
        self.estimate = estimate

    def __call__(self, b, x=None):
        """``x`` after ``degree`` steps from ``x`` (zero when None)."""
        return self.smooth(b, x)


class DistributedPMultigrid:
    """The V-cycle over the levels (finest first); a preconditioner for
    :func:`smalltc.fem.cg` (``z = B r``, owner form).

    On GPUs whose exchanges are NCCL's (or on one rank) with the gathered AMG coarse
    solve, each rank replays its V-cycle as one CUDA graph (:class:`~.._graph.GraphReplay`):
    the smoothers, transfers, halo exchanges and the coarse gather, AMG cycle and scatter
    queued by one launch, where launch by launch the host's cost of the coarse levels'
    hundreds of short launches and exchanges sets the V-cycle's time.

    Attributes
    ----------
    orders : list of int
    operators : list
        Each level's constrained operator (finest first).
    smoothers : list of DistributedChebyshev
    transfers : list of DistributedTransfer
        ``transfers[l]`` between level ``l + 1`` (coarser) and ``l``.
    coarse : GatheredAMG or DistributedCG
        The order-1 solve (:mod:`.coarse`).
    coarse_iterations : list of int
        CG iterations of each coarse solve so far (``coarse="cg"``).
    graph : {"auto", True, False}
        As :func:`distributed_pmg` was given it.
    graphed : bool
        Whether the V-cycle is replayed as a CUDA graph (``graph`` allowing it, the GPU,
        the NCCL exchanges or one rank, the AMG coarse solve on the device).
    exchanges : {"sum", "owner"}
        The V-cycle's vectors: consistent, one neighbour sum an application and transfer;
        or owner form, a forward and a reverse exchange each (:func:`distributed_pmg`).
    eager : bool
        Set (e.g. by a solve whose phases are timed) to run the V-cycle launch by launch
        for now, the graph kept.
    cycles : int
        V-cycles run so far.
    """

    def __init__(self, operators, smoothers, transfers, red, coarse, graph="auto",
                 exchanges="auto"):
        self.operators, self.smoothers, self.transfers = operators, smoothers, transfers
        self.orders = [A.op.space.p for A in operators]
        self.red, self.coarse = red, coarse
        self.xp, self.dtype = operators[0].xp, operators[0].dtype
        self.shape = operators[0].shape
        if graph not in GRAPH_CHOICES:
            raise ValueError(f"graph must be 'auto', True or False, got {graph!r}")
        if exchanges not in EXCHANGES:
            raise ValueError(f"exchanges must be one of {list(EXCHANGES)}, got {exchanges!r}")
        summable = all(A.op.halo.has_sum for A in operators)
        if exchanges == "sum" and not summable:
            raise ValueError("exchanges='sum' needs the neighbour sum's lists (a box mesh's "
                             "blocks); this mesh's partition has none")
        self.exchanges = "sum" if exchanges == "auto" and summable else (
            "owner" if exchanges == "auto" else exchanges)
        self._sum_ops = self._sum_smoothers = None
        if self.exchanges == "sum":
            self._sum_ops = [ConstrainedOperator(A.op.summed(), A.bc) for A in operators[:-1]]
            self._sum_smoothers = [
                Chebyshev(Ac, degree=S.degree, kind=S.kind, lambda_max=S.lambda_max,
                          safety=S.safety, check=False)
                for Ac, S in zip(self._sum_ops, smoothers)]
        self.graph, self.eager, self.cycles = graph, False, 0
        self.graphed = bool(graph) and self.xp is not np and getattr(coarse, "on_device", False)
        if graph is True and not self.graphed:
            raise ValueError("graph=True needs the GPU, NCCL's exchanges (or one rank) and "
                             f"the AMG coarse solve on the device; this V-cycle has "
                             f"{coarse.describe()}")
        self._replay = (GraphReplay(self._cycle, self.xp,
                                    "the distributed p-multigrid V-cycle",
                                    required=graph is True) if self.graphed else None)

    @property
    def coarse_iterations(self):
        """CG iterations of each coarse solve so far (``coarse="cg"``; empty with the AMG)."""
        return list(getattr(self.coarse, "iterations", []))

    def _coarse(self, b):
        return self.coarse(b)

    def _vcycle(self, level, b):
        if level == len(self.operators) - 1:
            return self._coarse(b)
        A, S, T = self.operators[level], self.smoothers[level], self.transfers[level]
        x = S(b)
        r = b - A(x)
        x += T.prolong(self._vcycle(level + 1, T.restrict(r)))
        return S(b, x)

    def _vcycle_sum(self, level, b):
        """The V-cycle on consistent vectors: each application and transfer ends in one
        neighbour sum instead of a forward and a reverse exchange."""
        if level == len(self.operators) - 1:
            halo = self.operators[level].op.halo
            owner = b.copy()
            if halo.nghosts:
                set_at(owner, halo.ghosts, 0, self.xp)
            return halo.forward(self._coarse(owner))
        A, S, T = self._sum_ops[level], self._sum_smoothers[level], self.transfers[level]
        x = S.smooth(b)
        r = b - A(x)
        x += T.prolong_sum(self._vcycle_sum(level + 1, T.restrict_sum(r)))
        return S.smooth(b, x)

    def _cycle(self, r):
        """``z = B r`` for ``r`` in owner form, ``z`` in owner form."""
        if self.exchanges == "owner":
            return self._vcycle(0, r)
        halo = self.operators[0].op.halo
        b = halo.forward(r.copy())                  # consistent
        z = self._vcycle_sum(0, b)
        if halo.nghosts:
            set_at(z, halo.ghosts, 0, self.xp)      # owner form
        return z

    def __call__(self, r):
        r = self.xp.asarray(r, dtype=self.dtype)
        self.cycles += 1
        if self._replay is None or self.eager:
            return self._cycle(r)
        n = self.coarse.applications
        z = self._replay(r)        # a replay calls nothing; a capture calls it once more
        self.coarse.applications = n + 1
        return z

    def __repr__(self):
        return (f"DistributedPMultigrid(orders={self.orders}, degree="
                f"{self.smoothers[0].degree if self.smoothers else 0}, "
                f"ranks={self.operators[0].op.space.nranks}, coarse={self.coarse.describe()}, "
                f"graphed={self.graphed})")


def distributed_pmg(A, *, dirichlet, neumann_regions=(), kappa=None, quadrature="gauss",
                    orders=None, degree=3, coarse="auto", coarse_tol=1e-6, backend="auto",
                    graph="auto", exchanges="auto"):
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
        The coarse operators' (as the finest's). The levels below the finest use
        ``q + 1`` quadrature points, as the serial :func:`~smalltc.fem.pmg`'s.
    orders : list of int, optional
        The levels' orders, finest first; :func:`~smalltc.fem.multigrid.pmg_orders`.
    degree : int
        Chebyshev degree of each smoothing (3, as the serial :func:`~smalltc.fem.pmg`).
    coarse : {"auto", "amg", "cg"}
        The order-1 solve (:mod:`.coarse`): ``"amg"``, the global order-1 matrix gathered
        to rank 0 once and one pyamg V-cycle there per V-cycle (the residual gathered,
        the correction scattered back; :class:`~.coarse.GatheredAMG`); ``"cg"``,
        Jacobi-CG across the ranks to ``coarse_tol``. ``"auto"``: the AMG where pyamg
        imports, else Jacobi-CG, said in one log line (as the serial pmg).
    coarse_tol : float
        The coarse CG's relative residual target (``coarse="cg"``).
    graph : {"auto", True, False}
        Replay each rank's V-cycle as a CUDA graph where it can be one (GPUs, NCCL's
        exchanges or one rank, ``coarse="amg"``; :class:`DistributedPMultigrid`):
        ``"auto"`` where it can, True to insist (an error where it cannot), False never.
    exchanges : {"auto", "sum", "owner"}
        How the V-cycle's vectors meet across the ranks. ``"sum"``: consistent vectors
        (every held node with its value), each operator application and transfer
        completed by one neighbour sum (:meth:`~.halo.Halo.sum`: the ranks that hold a
        node exchange their partial values and add them in rank order, the same bits on
        each); ``"owner"``: owner-form vectors, a forward exchange (owners to ghosts) and
        a reverse one (ghosts to owners) each. The same V-cycle up to rounding, with
        half the exchanges. ``"auto"``: ``"sum"`` where the partition gives the shared
        lists (box meshes), else ``"owner"``.

    Returns
    -------
    DistributedPMultigrid

    Raises
    ------
    ImportError
        ``coarse="amg"`` (asked for by name) without pyamg.
    """
    from .poisson import (DistributedConstrainedOperator,  # cycle: .poisson imports this
                          distributed_dirichlet_bc)
    space, xp = A.op.space, A.xp
    orders = pmg_orders(space.p) if orders is None else [int(q) for q in orders]
    if orders[0] != space.p or any(b > a for a, b in zip(orders, orders[1:])):
        raise ValueError(f"orders must start at the operator's p = {space.p} and not increase, "
                         f"got {orders}")
    if coarse not in COARSE:
        raise ValueError(f"coarse must be one of {list(COARSE)}, got {coarse!r}")
    if coarse == "auto":
        coarse = "amg" if _pyamg_present() else "cg"
        if coarse == "cg" and space.rank == 0:
            logging.getLogger("smalltc").warning(
                "smalltc: pyamg is not installed; the distributed p-multigrid's coarse solve "
                "is Jacobi-CG across the ranks (coarse='cg'; pip install pyamg for the AMG "
                "V-cycle on rank 0)")
    elif coarse == "amg":
        collective(space.comm, _pyamg, what="the AMG coarse solve")
    red = make_reducer(space.comm, xp)
    zero = {r: 0.0 for r in dirichlet}
    ops, frees = [A], [_host(A._P) > 0]
    where = "cpu" if xp is np else "gpu"
    nq_offset = 1 if len(orders) > 1 else None
    for q in orders[1:]:
        Vq = DistributedH1Space(space.mesh, q)
        K = distributed_diffusion_operator(Vq, q + nq_offset, kappa, quadrature=quadrature,
                                           device=where, backend=backend)
        bc = distributed_dirichlet_bc(Vq, zero, list(neumann_regions), where)
        Aq = DistributedConstrainedOperator(K, bc)
        free = np.ones(Vq.nlocal, dtype=bool)
        free[bc.dofs] = False
        ops.append(Aq)
        frees.append(free)
    smoothers = [collective(space.comm, DistributedChebyshev, Al, red, degree=degree,
                            what="the Chebyshev bounds") for Al in ops[:-1]]
    transfers = [DistributedTransfer(ops[k + 1].op.space, ops[k].op.space, frees[k + 1],
                                     frees[k], xp, A.dtype) for k in range(len(ops) - 1)]
    last = ops[-1]
    if coarse == "amg":
        Vc = last.op.space
        nq = Vc.p + (nq_offset or 2)
        K = collective(space.comm, diffusion_operator, Vc.local, nq, kappa, assembled=True,
                       quadrature=quadrature, device=where, what="the coarse element matrices")
        halo = A.op.halo
        solver = GatheredAMG(Vc, K.matrices, frees[-1], xp,
                             nccl=halo.nccl if halo.transport == "nccl" else None)
    else:
        solver = DistributedCG(last, red, coarse_tol)
    return DistributedPMultigrid(ops, smoothers, transfers, red, solver, graph=graph,
                                 exchanges=exchanges)


def _host(a):
    return to_host(a)
