"""p-multigrid: a V-cycle over the orders p -> ceil(p/2) -> ... -> 1 on one mesh.

Every level is the same kind of operator (mass, diffusion, Helmholtz: the fused
matrix-free one) on the H1 space of its order; the smoother is Chebyshev of the
Jacobi-preconditioned level operator (:class:`~smalltc.fem.chebyshev.Chebyshev`);
the order-1 level is assembled and solved by algebraic multigrid
(:mod:`smalltc.fem.coarse`), or by Jacobi-CG. One V-cycle from a zero guess is a
symmetric positive definite preconditioner (pre- and post-smoothing by the same
polynomial, ``R = P^T``, a symmetric coarse solve), so :func:`smalltc.fem.cg`,
SciPy's and CuPy's solvers take it (the LinearOperator protocol).

Transfers (:class:`Transfer`) between orders ``q < p``: on every element the order-``q``
values are interpolated to the order-``p`` Gauss-Lobatto nodes by the 1D matrix
``I1d[i, j] = phi^q_j(x^p_i)`` on each axis (sum factorised), and the element results
are summed into the global vector with the weights ``1 / multiplicity`` (the copies
of a shared node agree, so this is interpolation of the continuous function):
``P = S_p W I G_q``. The restriction is exactly its transpose, ``R = G_q^T I^T W S_p^T``.
On the CPU both are NumPy array operations (gather, one GEMM per axis, scatter-add); on
the GPU each is one kernel (``templates/cuda/pmg_transfer.cu.j2``), or the same array
operations with CuPy (``Transfer(..., fused=False)``).

Constrained (Dirichlet) DoFs: a boolean mask on the finest level (or ``"boundary"``:
every DoF on the box's boundary). Each level's operator acts as the identity there,
``A_c = F A F + C`` (``F``, ``C``: the free and constrained diagonal masks; for an
operator that is already so this changes nothing), and the transfers are ``F_p P F_q``.
A coarse DoF is constrained when its basis function is nonzero at a constrained fine
DoF: exact for constraints on whole boundary faces.

The transfers, the constrained level operators and the boundary masks are in
:mod:`smalltc.fem.levels`.
"""

import logging
import math
import time

import numpy as np

from smalltc._arrays import array_module
from smalltc._timing import median, time_calls

from . import operators as ops
from ._device import to_host
from ._graph import GRAPH_CHOICES, GraphReplay
from .chebyshev import KINDS, Chebyshev, _Preconditioner
from .coarse import COARSE_SOLVERS, AMGSolver, CGSolver, _pyamg_present, assemble_csr
# the levels' parts, in their own module; imported from here too
from .levels import Constrained, Transfer, _Level, _touches, boundary_mask
from .schwarz import Schwarz
from .schwarz import _numba_present  # noqa: F401 - imported from here (fem.distributed)
from .space import H1Space

__all__ = ["PMultigrid", "Transfer", "Constrained", "pmg", "pmg_orders", "boundary_mask"]


def pmg_orders(p):
    """The orders of the levels: ``p, ceil(p/2), ..., 1``.

    Examples
    --------
    >>> pmg_orders(7), pmg_orders(8), pmg_orders(1)
    ([7, 4, 2, 1], [8, 4, 2, 1], [1])
    """
    out = [int(p)]
    while out[-1] > 1:
        out.append(math.ceil(out[-1] / 2))
    return out


class _NoTimer:
    """The V-cycle's timer when not profiling: a context that does nothing."""

    def __call__(self, level, part):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_TIMER = _NoTimer()


class _Timer:
    """Accumulates seconds per ``(level, part)``: CUDA events on the current stream
    (read after one synchronisation at the end) or ``perf_counter`` on the host."""

    def __init__(self, on_gpu):
        self.on_gpu, self.marks, self.host = on_gpu, [], {}
        self._key = None

    def __call__(self, level, part):
        self._key = (level, part)
        return self

    def __enter__(self):
        key = self._key
        if self.on_gpu:
            import cupy
            ev = cupy.cuda.Event()
            ev.record()
            self.marks.append([key, ev, None])
        else:
            self.marks.append([key, time.perf_counter(), None])
        return self

    def __exit__(self, *exc):
        # the innermost open mark of this key (parts do not nest within one level)
        for m in reversed(self.marks):
            if m[2] is None:
                break
        if self.on_gpu:
            import cupy
            ev = cupy.cuda.Event()
            ev.record()
            m[2] = ev
        else:
            m[2] = time.perf_counter()
        return False

    def totals(self):
        out = {}
        if self.on_gpu and self.marks:
            self.marks[-1][2].synchronize()
        for key, a, b in self.marks:
            if self.on_gpu:
                import cupy
                dt = cupy.cuda.get_elapsed_time(a, b) * 1e-3
            else:
                dt = b - a
            out[key] = out.get(key, 0.0) + dt
        return out


class PMultigrid(_Preconditioner):
    """A p-multigrid V-cycle as a preconditioner; made by :func:`pmg`.

    Calling it (``z = M r``) runs one V-cycle on ``A z = r`` from a zero guess.
    ``print()`` shows the hierarchy.

    Attributes
    ----------
    levels : list
        Finest first; each has ``space``, ``A`` (the constrained operator),
        ``smoother`` (None on the coarse level) and ``free``.
    transfers : list of Transfer
        ``transfers[l]`` between ``levels[l + 1]`` (coarse) and ``levels[l]``.
    coarse : AMGSolver or CGSolver
        The solve of the order-1 (coarsest) level.
    cycles : int
        V-cycles run so far.
    setup_times : dict
        Seconds of the setup's parts (operators, transfers, assembly, eigenvalues,
        csr, amg), from :func:`pmg`.
    graph : {"auto", True, False}
        Whether a GPU V-cycle is replayed as a CUDA graph (:func:`pmg`'s ``graph``).
    """

    def __init__(self, levels, transfers, coarse, degree, kind, graph="auto",
                 relaxation="jacobi"):
        self.levels, self.transfers, self.coarse = levels, transfers, coarse
        self.degree, self.kind, self.relaxation = degree, kind, relaxation
        fine = levels[0]
        self.xp = fine.A.xp
        self.n, self.dtype = fine.space.ndofs, fine.A.dtype
        self.cycles = 0
        self.setup_times = {}
        if graph not in GRAPH_CHOICES:
            raise ValueError(f"graph must be 'auto', True or False, got {graph!r}")
        self.graph = graph
        self._replay = (None if self.xp is np else
                        GraphReplay(lambda r: self._vcycle(0, r, _NO_TIMER), self.xp,
                                    "the p-multigrid V-cycle", required=graph is True))

    @property
    def operator(self):
        """The finest level's (constrained) operator."""
        return self.levels[0].A

    def __call__(self, r):
        """One V-cycle on ``A z = r`` from ``z = 0``; ``z`` in r's dtype."""
        self.cycles += 1
        if self.graph and self._replay is not None and self._graph_ok():
            return self._replay(r).astype(r.dtype, copy=False)
        return self._vcycle(0, r, _NO_TIMER).astype(r.dtype, copy=False)

    def _graph_ok(self):
        """Whether the V-cycle can be one CUDA graph: no host synchronisation in it (the
        AMG's portable cycle, not an iterative coarse solve)."""
        return getattr(self.coarse, "cycle", None) == "portable"

    def _vcycle(self, l, b, tm):
        """The V-cycle below level ``l`` on ``A_l x = b``; ``tm(l, part)``: a context
        around each part (the profile's timer, or nothing)."""
        if l == len(self.levels) - 1:
            with tm(l, "coarse"):
                return self.coarse(b)
        lev, T = self.levels[l], self.transfers[l]
        S = lev.smoother
        ops = S.vector_ops
        with tm(l, "presmooth"):
            x, xm = S._smooth(b.copy())                 # b is the caller's: r works on a copy
        with tm(l, "residual"):
            r = ops.residual(b, lev.raw(xm), x)
        with tm(l, "restrict"):
            rc = T.restrict(r)
        ec = self._vcycle(l + 1, rc, tm)
        with tm(l, "prolong"):
            x = T.prolong_add(ec, x)
        with tm(l, "residual"):
            r = ops.residual(b, lev.raw(x if ops.free is None else x * ops.free), x)
        with tm(l, "postsmooth"):
            x, _ = S._smooth(r, x)
        return x

    def profile(self, r, repeats=3):
        """Time one V-cycle's parts per level: smoothing, residuals, transfers, the
        coarse solve (CUDA events around each part on a GPU, so only in this mode;
        ``perf_counter`` on the host); the median of ``repeats`` V-cycles after one
        untimed.

        Returns
        -------
        dict
            ``levels``: per level ``{"p", "ndofs", part: seconds, ...}`` (parts
            ``presmooth``, ``residual`` (both), ``restrict``, ``prolong``; ``coarse`` on
            the last level); ``vcycle_s``: the V-cycle timed whole; ``parts_s``: the sum
            of the parts; ``apply_s``: one application of the finest (constrained)
            operator, and ``vcycle_in_applications``.

        Examples
        --------
        >>> from smalltc import fem
        >>> M = fem.pmg(fem.H1Space(fem.box_mesh(2, 3), p=2), kind="diffusion",
        ...             constrained="boundary")
        >>> prof = M.profile(np.ones(M.n), repeats=1)
        >>> sorted(prof["levels"][0]), sorted(prof["levels"][1])
        (['ndofs', 'p', 'postsmooth', 'presmooth', 'prolong', 'residual', 'restrict'], ['coarse', 'ndofs', 'p'])
        """
        on_gpu = self.xp is not np
        self._vcycle(0, r, _NO_TIMER)
        runs = []
        for _ in range(max(1, int(repeats))):
            tm = _Timer(on_gpu)
            self._vcycle(0, r, tm)
            runs.append(tm.totals())
        out = []
        for l, lev in enumerate(self.levels):
            row = {"p": lev.space.p, "ndofs": lev.space.ndofs}
            for key in sorted({k for run in runs for (ll, k) in run if ll == l}):
                row[key] = float(np.median([run.get((l, key), 0.0) for run in runs]))
            out.append(row)
        t_cycle = median(time_calls(lambda: self._vcycle(0, r, _NO_TIMER),
                                    repeats=max(1, int(repeats)), warmup=0, on_gpu=on_gpu))
        t_apply = median(time_calls(lambda: self.operator(r), repeats=max(1, int(repeats)),
                                    warmup=1, on_gpu=on_gpu))
        parts = sum(v for row in out for k, v in row.items() if k not in ("p", "ndofs"))
        return {"levels": out, "vcycle_s": t_cycle, "parts_s": parts,
                "apply_s": t_apply, "vcycle_in_applications": t_cycle / t_apply}

    def cost(self):
        """The V-cycle's operator applications: per level, and their sum weighted by each
        level's DoFs over the finest level's (the cost in finest-level applications, by
        DoF count; the coarse solve excluded).

        Returns
        -------
        dict
            ``{"per_level": [(p, applications), ...], "fine_equivalent": float,
            "relaxations": float}``; ``relaxations``: the Schwarz applications
            (``relaxation="schwarz"``: one per Chebyshev step), weighted alike (0 for
            point Jacobi, a vector scaling).
        """
        per, total, relax = [], 0.0, 0.0
        n0 = self.levels[0].space.ndofs
        for lev in self.levels[:-1]:
            apps = 2 * lev.smoother.degree            # (k-1) + 1 residual + k
            per.append((lev.space.p, apps))
            total += apps * lev.space.ndofs / n0
            if lev.smoother.preconditioner is not None:
                relax += 2 * lev.smoother.degree * lev.space.ndofs / n0
        return {"per_level": per, "fine_equivalent": total, "relaxations": relax}

    def __repr__(self):
        relax = ("point Jacobi" if self.relaxation == "jacobi" else
                 self.levels[0].smoother.preconditioner.describe())
        lines = [f"PMultigrid: {len(self.levels)} levels, V-cycle, Chebyshev ({self.kind} "
                 f"kind, degree {self.degree}) smoothing of {relax}, device "
                 f"{'cpu' if self.xp is np else 'gpu'}"]
        lines.append(f"  {'level':>5s} {'p':>3s} {'ndofs':>10s} {'free':>10s}  operator / smoother")
        for i, lev in enumerate(self.levels):
            free = lev.space.ndofs if lev.free is None else int(np.count_nonzero(lev.free))
            what = type(lev.raw).__name__
            if getattr(lev.raw, "qfunc", None):
                what += f"({lev.raw.qfunc}{', collocated' if getattr(lev.raw, 'collocated', False) else ''})"
            if lev.smoother is not None:
                what += (f"; degree {lev.smoother.degree}, "
                         f"lambda_max={lev.smoother.lambda_max:.3g}")
            else:
                what += f"; coarse: {self.coarse.describe()}"
            lines.append(f"  {i:5d} {lev.space.p:3d} {lev.space.ndofs:10d} {free:10d}  {what}")
        c = self.cost()
        lines.append(f"  V-cycle cost: {c['fine_equivalent']:.2f} finest-level applications "
                     f"(by DoFs; {', '.join(f'p={p}: {a}' for p, a in c['per_level'])})"
                     + (f" + {c['relaxations']:.2f} Schwarz applications" if c["relaxations"]
                        else ""))
        return "\n".join(lines)


_QUADRATURES_GLL = ("gll", "lobatto", "gauss-lobatto")


def _factory(kind, operator, device, nq_offset=None, quadrature=None, coefficients=None,
             options=None, coarse_nq_offset=None):
    """``space -> operator`` of the family (:func:`~smalltc.fem.operators.mass_operator`,
    ``diffusion_operator``, ``helmholtz_operator``) for the named kind, or like ``operator``
    (its ``qfunc``, quadrature rule, ``nq - p``, dtype, backend, fused)."""
    options = dict(options or {})
    if operator is not None:
        qf = getattr(operator, "qfunc", None)
        name = type(operator).__name__.lower()
        if qf is None:
            qf = ("mass" if "mass" in name else "helmholtz" if "helmholtz" in name
                  else "diffusion" if "diffusion" in name else None)
        if kind is None:
            kind = qf
        B1d = getattr(operator, "B1d", None)
        collocated = bool(getattr(operator, "collocated", False)) or (
            B1d is None and getattr(operator, "G1d", None) is not None)
        if nq_offset is None:
            G = B1d if B1d is not None else getattr(operator, "G1d", None)
            if G is not None:
                nq_offset = int(G.shape[0]) - operator.space.p
        if quadrature is None and collocated:
            quadrature = "gll"
        for key in ("dtype", "backend", "fused", "deterministic"):
            if hasattr(operator, key) and key not in options:
                options[key] = getattr(operator, key)
        if kind is None:
            raise TypeError(f"cannot tell the kind of {type(operator).__name__}: pass "
                            f"kind='mass'|'diffusion'|'helmholtz' or operator_factory=")
    if kind not in ("mass", "diffusion", "helmholtz"):
        raise ValueError(f"kind must be 'mass', 'diffusion' or 'helmholtz', got {kind!r}")
    quadrature = quadrature or "gauss"
    if nq_offset is None:
        nq_offset = 1 if quadrature in _QUADRATURES_GLL else 2
    c = dict(coefficients or {})
    options["device"] = device
    options["quadrature"] = quadrature
    if options.get("dtype") is not None:
        options["dtype"] = np.dtype(options["dtype"])

    def make(space, assembled=False, coarse=False):
        nq = space.p + (nq_offset if not coarse or coarse_nq_offset is None
                        else coarse_nq_offset)
        kw = dict(options, assembled=assembled)
        if kind == "mass":
            return ops.mass_operator(space, nq, c.get("rho"), **kw)
        if kind == "diffusion":
            return ops.diffusion_operator(space, nq, c.get("kappa"), **kw)
        if c.get("alpha") is None:
            raise ValueError("a Helmholtz p-multigrid needs alpha= (the mass term's factor)")
        return ops.helmholtz_operator(space, c["alpha"], nq, c.get("kappa"), **kw)
    return make


def pmg(operator_or_space, *, kind=None, orders=None, degree=None, smoother="fourth",
        constrained=None, coarse="auto", coarse_tol=1e-10, amg_cycle="auto",
        operator_factory=None, device=None, nq_offset=None, coarse_nq_offset=1,
        quadrature=None, kappa=None,
        alpha=None, rho=None, lambda_steps=10, graph="auto", relaxation="jacobi",
        schwarz_options=None):
    """Build a p-multigrid preconditioner.

    Parameters
    ----------
    operator_or_space : operator or H1Space
        The finest level: an operator of the family (:func:`~smalltc.fem.diffusion_operator`,
        ...: used as it is, the other levels made alike: its ``qfunc``, quadrature rule,
        ``nq - p``, dtype, backend), a :class:`~smalltc.fem.ConstrainedOperator` (its
        constrained DoFs are then the finest level's), any operator with ``.space`` and
        ``diagonal()`` together with ``operator_factory``; or a space (then ``kind``
        says which operator to build on each level).
    kind : {"mass", "diffusion", "helmholtz"}, optional
        The operator of the levels; by default the given operator's ``qfunc``.
    orders : list of int, optional
        The levels' orders, finest first, ending in 1; ``p, ceil(p/2), ..., 1`` by
        default (:func:`pmg_orders`).
    degree : int or sequence of int, optional
        Chebyshev degree on every level but the coarsest: ``2 degree`` applications
        of the level's operator per V-cycle; a sequence gives one per level, finest
        first (its last entry repeats). By default 3, and ``[4, 3]`` (4 on the finest
        level) from p = 6 on. On a distorted 3D box, iterations and DoF-weighted
        applications per solve (degree 3 / 2 / 4 on the finest level, 3 below): p = 4:
        6, 8, 5 iterations, 46.8, 46.4, 49.0 applications; p = 6: 7, 10, 5 and 56.4,
        60.6, 50.3; p = 8: 8, 12, 6 and 63.4, 71.1, 59.5; timed on one CPU thread at
        166k DoFs, p = 6: 0.84-0.94 s against 1.13-1.19 s to solution with ``[4, 3]``
        (notes/solvers.md).
    smoother : {"fourth", "first", "fourth-opt"}
        Chebyshev kind (:mod:`smalltc.fem.chebyshev`).
    relaxation : {"jacobi", "schwarz"}
        What the Chebyshev polynomial of each level accelerates: point Jacobi
        (``D^-1 A``) or overlapping additive Schwarz with fast-diagonalisation local
        solves (``M^-1 A``, :class:`~smalltc.fem.schwarz.Schwarz`: NekRS's smoother; one
        application per Chebyshev step, on box meshes, diffusion and Helmholtz levels).
        On the Kershaw mesh (eps = 0.3) Schwarz takes far fewer iterations
        (notes/solvers.md).
    schwarz_options : dict, optional
        Keyword arguments of :class:`~smalltc.fem.schwarz.Schwarz` (``overlap``,
        ``weights``, ``mass``, ``dtype``: e.g. float32 local solves in a float64 solve,
        as NekRS's); ``kappa`` (a number) and ``alpha`` come from this function's.
    constrained : array of bool or int, "boundary", region name(s) or None
        The constrained (Dirichlet) DoFs of the finest level: a mask, indices,
        the whole boundary, or boundary regions (``space.boundary_dofs(region)``).
    coarse : {"auto", "amg", "cg"}
        The order-1 solve: one AMG V-cycle (pyamg hierarchy) or Jacobi-CG to
        ``coarse_tol``. ``"auto"`` (the default): the AMG where pyamg imports, else
        Jacobi-CG, said in one log line.
    amg_cycle : {"auto", "pyamg", "portable"}
        See :class:`smalltc.fem.coarse.AMGSolver`.
    operator_factory : callable, optional
        ``space -> operator`` for the levels below the finest (and the finest when a
        space is given); overrides ``kind``.
    device : {"cpu", "gpu", "auto"}, optional
        Where the levels built from a space live; by default the given operator's.
    nq_offset : int, optional
        The levels built here use ``nq = p + nq_offset`` points (the given operator's
        offset; else 2, 1 for Gauss-Lobatto).
    coarse_nq_offset : int or None
        The levels below the finest use ``nq = q + coarse_nq_offset`` points (1 by
        default: the order-2 level's operator on 27 points instead of 64 and the
        order-1 level's assembly on 8 instead of 27, with the same iterations on a
        distorted 3D box at p = 2, 4, 6); None: ``nq_offset``. Not for
        ``operator_factory``.
    quadrature : str, optional
        Their rule (the given operator's: ``"gll"`` when it is collocated; else
        ``"gauss"``).
    kappa, alpha, rho : optional
        The coefficients of the levels built here (as for
        :func:`~smalltc.fem.diffusion_operator`, ``helmholtz_operator``,
        ``mass_operator``): an operator holds only its quadrature data, so pass a
        variable coefficient again.
    lambda_steps : int
        Lanczos steps of each smoother's eigenvalue estimate.
    graph : {"auto", True, False}
        On a GPU with the AMG coarse solve, run the V-cycle as one CUDA graph: the first
        call (per input dtype and shape) runs it launch by launch and captures it; later
        calls replay the capture (its ~100 launches at once, with no per-launch host
        cost). The graph holds the levels' arrays as they are at the capture: build a new
        preconditioner after changing an operator's data. ``"auto"``: where the capture
        fails, a warning, and the launch-by-launch V-cycle; ``True``: an error instead;
        ``False``: never. A bad map index in a replayed V-cycle is reported by the next
        call (or :func:`smalltc.check_errors`). Ignored on the host.

    Returns
    -------
    PMultigrid

    Raises
    ------
    ValueError
        For bad orders, kinds, masks; from the smoothers (an operator that is not
        positive definite).
    ImportError
        ``coarse="amg"`` (asked for by name) without pyamg.

    Examples
    --------
    >>> from smalltc import fem
    >>> space = fem.H1Space(fem.box_mesh(2, 4, distortion=0.05), p=4)
    >>> M = fem.pmg(space, kind="diffusion", constrained="boundary")
    >>> [lev.space.p for lev in M.levels]
    [4, 2, 1]
    >>> b = M.operator(np.ones(space.ndofs))
    >>> res = fem.cg(M.operator, b, tol=1e-8, precond=M)
    >>> res.converged and res.iterations < 15
    True
    """
    bc_dofs = None
    if isinstance(operator_or_space, H1Space):
        space, fine_op = operator_or_space, None
        device = device or "cpu"
    else:
        fine_op = operator_or_space
        if hasattr(fine_op, "bc") and hasattr(fine_op, "op"):      # a ConstrainedOperator
            bc_dofs = np.asarray(fine_op.bc.dofs)
            fine_op = fine_op.op
        space = getattr(fine_op, "space", None)
        if not isinstance(space, H1Space):
            raise TypeError(f"{type(fine_op).__name__} has no .space (an H1Space): pass the "
                            f"space and kind=, or operator_factory=")
        device = device or getattr(fine_op, "device", "cpu")
    make = operator_factory or _factory(kind, fine_op, device, nq_offset, quadrature,
                                        dict(kappa=kappa, alpha=alpha, rho=rho),
                                        coarse_nq_offset=coarse_nq_offset)
    own = operator_factory is None
    if bc_dofs is not None:
        if constrained is not None:
            raise ValueError("a ConstrainedOperator brings its constrained DoFs: "
                             "leave constrained=None")
        constrained = bc_dofs
    orders = pmg_orders(space.p) if orders is None else [int(q) for q in orders]
    if orders[0] != space.p or orders[-1] != 1 or any(a <= b for a, b in zip(orders, orders[1:])):
        raise ValueError(f"orders must decrease strictly from p={space.p} to 1, got {orders}")
    if smoother not in KINDS:
        raise ValueError(f"smoother must be one of {list(KINDS)}, got {smoother!r}")
    if coarse not in COARSE_SOLVERS + ("auto",):
        raise ValueError(f"coarse must be one of {['auto', *COARSE_SOLVERS]}, got "
                         f"{coarse!r}")
    if coarse == "auto":
        coarse = "amg" if _pyamg_present() else "cg"
        if coarse == "cg":
            logging.getLogger("smalltc").warning(
                "smalltc: pyamg is not installed; the p-multigrid's coarse solve is "
                "Jacobi-CG (coarse='cg'; pip install pyamg for the AMG V-cycle)")
    if relaxation not in RELAXATIONS:
        raise ValueError(f"relaxation must be one of {list(RELAXATIONS)}, got {relaxation!r}")
    if schwarz_options is not None and relaxation != "schwarz":
        raise ValueError("schwarz_options are for relaxation='schwarz'")
    fixed = None
    if isinstance(constrained, str) or (isinstance(constrained, (list, tuple)) and constrained
                                        and isinstance(constrained[0], str)):
        fixed = boundary_mask(space, None if constrained == "boundary" else constrained)
    elif constrained is not None:
        fixed = np.asarray(to_host(constrained))
        if fixed.dtype != bool:       # an index array
            idx = fixed.astype(np.int64)
            fixed = np.zeros(space.ndofs, dtype=bool)
            fixed[idx] = True
        if fixed.shape != (space.ndofs,):
            raise ValueError(f"constrained has shape {fixed.shape}, expected ({space.ndofs},)")
    clock = _SetupClock()
    levels, transfers = [], []
    op = fine_op if fine_op is not None else make(space)
    xp = clock.xp = array_module(op.diagonal())
    dtype = np.dtype(getattr(op, "dtype", np.float64))
    free = None if fixed is None else ~fixed
    levels.append(_Level(space, op, free, xp))
    clock("operators")
    for q in orders[1:]:
        fine = levels[-1]
        cspace = H1Space(space.mesh, q)
        cfree = None
        if fine.free is not None:
            # a coarse function nonzero at a constrained fine DoF is constrained
            cfree = ~_touches(cspace, fine.space, ~fine.free, xp)
        transfers.append(Transfer(cspace, fine.space, xp, coarse_free=cfree,
                                  fine_free=fine.free, dtype=dtype))
        clock("transfers")
        last = q == orders[-1] and coarse == "amg"
        levels.append(_Level(cspace, _make_coarse(make, cspace, own) if last else
                             (make(cspace, coarse=True) if own else make(cspace)), cfree, xp))
        clock("assembly" if last else "operators")
    if degree is None:
        degree = [4, 3] if space.p >= 6 else 3
    degrees = [degree] if isinstance(degree, (int, np.integer)) else list(degree)
    if not degrees:
        raise ValueError("degree must be an integer or a non-empty sequence of integers")
    for i, lev in enumerate(levels[:-1]):
        pre = None
        if relaxation == "schwarz":
            pre = _schwarz_level(lev, xp, dtype, kind or getattr(fine_op, "qfunc", None),
                                 kappa, alpha, schwarz_options)
        lev.smoother = Chebyshev(lev.A, degree=degrees[min(i, len(degrees) - 1)],
                                 kind=smoother, steps=lambda_steps, preconditioner=pre)
    clock("eigenvalues")
    last = levels[-1]
    if coarse == "amg":
        A = assemble_csr(last.A, last.space)
        clock("csr")
        solver = AMGSolver(A, xp, cycle=amg_cycle)
        clock("amg")
    else:
        solver = CGSolver(last.A, last.A.diagonal(), tol=coarse_tol)
    M = PMultigrid(levels, transfers, solver, degree, smoother, graph=graph,
                   relaxation=relaxation)
    M.setup_times = clock.times
    return M


class _SetupClock:
    """Seconds of the setup's parts: ``clock(part)`` adds the time since the last call
    (synchronising the GPU first, so a part's kernels count in it)."""

    def __init__(self):
        self._now, self.xp = time.perf_counter, np
        self.times, self._t = {}, self._now()

    def __call__(self, part):
        if self.xp is not np:
            self.xp.cuda.runtime.deviceSynchronize()
        t = self._now()
        self.times[part] = self.times.get(part, 0.0) + (t - self._t)
        self._t = t


#: the ``relaxation`` choices of :func:`pmg`
RELAXATIONS = ("jacobi", "schwarz")


def _schwarz_level(lev, xp, dtype, kind, kappa, alpha, options):
    """The Schwarz preconditioner of one level (its space, free DoFs, coefficients)."""
    if kind == "mass":
        raise ValueError("relaxation='schwarz' is for diffusion and Helmholtz levels, not "
                         "mass: use relaxation='jacobi'")
    opts = dict(options or {})
    for key in ("kappa", "alpha", "free"):
        if key in opts:
            raise ValueError(f"schwarz_options may not set {key!r} (pmg passes it)")
    dtype = np.dtype(opts.pop("dtype", dtype))
    k = kappa if kappa is not None and np.ndim(kappa) == 0 and not callable(kappa) else 1.0
    a = float(alpha) if kind == "helmholtz" and alpha is not None else 0.0
    return Schwarz(lev.space, xp, free=lev.free, kappa=float(k), alpha=a, dtype=dtype, **opts)


def _make_coarse(make, space, own=False):
    """The order-1 level for the AMG: assembled (element matrices, ``to_csr()``) where the
    factory can (``make(space, assembled=True)``), else matrix-free (then probed);
    ``own``: pmg's own factory (the coarse levels' quadrature)."""
    if own:
        return make(space, assembled=True, coarse=True)
    try:
        return make(space, assembled=True)
    except TypeError:           # a user's factory without the keyword
        return make(space)
