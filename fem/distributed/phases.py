"""Where a distributed solve's time goes, and kernels compiled once per node.

Per-phase timers (``timings="phases"`` of the distributed Poisson solve and L2
projection): :class:`Timed` wraps the operator and the preconditioner that CG calls
and adds the seconds of each call to a phase, after a synchronize before and after
on a GPU (a kernel's time is the device's, not the launch's). That synchronize
stops the host from queueing ahead, so the timers are on only when asked; without
them the solve runs as it always does, and only the exchanges' and reductions'
own counters (:class:`~.halo.Halo`, :class:`~.comm.Reducer`) are read.

:func:`compile_ahead`: the kernels a distributed solve needs built by the first rank
of each node on a tiny problem of the same kinds (the same operators, orders,
quadrature, dimension, geometry order, preconditioner) on ``MPI.COMM_SELF``, the
node's other ranks waiting asleep (:func:`~.comm.node_first`); they then load the
kernels from the disk cache instead of compiling the same ones at the same time.
Once per process and kind of problem.
"""

import time
from contextlib import contextmanager

from .._device import synchronize
from ..mesh import box_mesh
from .comm import load_mpi, node_first

__all__ = ["Timed", "TIMINGS", "check_timings", "halos_of", "reducers_of", "distribution",
           "compile_ahead", "ahead_done"]

#: the ``timings`` choices: None (the phases of setup, the solve and its exchanges'
#: and reductions' counters), "phases" (also the operator's and the preconditioner's
#: applications in CG, synchronised)
TIMINGS = (None, "phases")


def check_timings(timings):
    """``timings`` if it is one of :data:`TIMINGS`, else ValueError."""
    if timings not in TIMINGS:
        raise ValueError(f"timings must be None or 'phases', got {timings!r}")
    return timings


class Timed:
    """``fn(x)``, the seconds of each call added to ``seconds[name]`` (synchronised on
    the device of ``xp`` before and after).

    Examples
    --------
    >>> import numpy as np
    >>> seconds = {}
    >>> double = Timed(lambda x: 2 * x, seconds, "apply", np)
    >>> double(np.ones(2)).tolist(), sorted(seconds), double.calls
    ([2.0, 2.0], ['apply'], 1)
    """

    def __init__(self, fn, seconds, name, xp):
        self.fn, self.seconds, self.name, self.xp = fn, seconds, name, xp
        self.calls = 0
        seconds.setdefault(name, 0.0)

    def __call__(self, x):
        synchronize(self.xp)
        t = time.perf_counter()
        y = self.fn(x)
        synchronize(self.xp)
        self.seconds[self.name] += time.perf_counter() - t
        self.calls += 1
        return y


def halos_of(operator, precond=None):
    """Every distinct :class:`~.halo.Halo` a solve exchanges through: the operator's, and
    a p-multigrid's levels' and transfers'."""
    out = [operator.halo]
    for A in getattr(precond, "operators", ()):
        out.append(A.op.halo)
    for T in getattr(precond, "transfers", ()):
        out += [T.fwd_c, T.fwd_f]
    seen, unique = set(), []
    for h in out:
        if id(h) not in seen:
            seen.add(id(h))
            unique.append(h)
    return unique


def reducers_of(red, precond=None):
    """The distinct reducers of a solve: CG's and a p-multigrid's."""
    out = [red]
    other = getattr(precond, "red", None)
    if other is not None and other is not red:
        out.append(other)
    return out


class Counters:
    """The exchanges' and reductions' seconds so far; :meth:`since` their growth."""

    def __init__(self, halos, reducers):
        self.halos, self.reducers = halos, reducers
        self.start = self._now()

    def _now(self):
        halo = {k: sum(h.seconds[k] for h in self.halos) for k in ("pack", "wait", "unpack")}
        return halo, sum(r.seconds for r in self.reducers)

    def since(self):
        """``{"halo", "halo_wait", "allreduce"}``: seconds since construction."""
        (h1, r1), (h0, r0) = self._now(), self.start
        halo = {k: h1[k] - h0[k] for k in h1}
        return {"halo": sum(halo.values()), "halo_wait": halo["wait"], "allreduce": r1 - r0}


def distribution(space, halo, gpu, path):
    """What this rank held in a distributed solve (its result's ``distribution``): its
    rank, the ranks, the partition's grid (empty for METIS parts), its owned and local
    DoFs, the global DoFs, its elements, the transport of the operator's ``halo`` and
    why, its ``gpu`` (None on the host) and the communication ``path``
    (:func:`~.comm.comm_path`) and why."""
    return {
        "rank": space.rank, "ranks": space.nranks,
        "grid": tuple(getattr(space.partition, "grid", ())),
        "owned_dofs": space.nowned, "local_dofs": space.nlocal, "global_dofs": space.ndofs,
        "elements": space.nelements, "transport": halo.transport,
        "transport_reason": halo.transport_reason, "gpu": gpu,
        "comm_path": path.name, "comm_path_reason": path.reason}


_BOX = ("BoxMesh", "BlockMesh")


def _box_kind(mesh):
    """``(dim, geom_order)`` of a box-like mesh (a BoxMesh or a block of one), else None."""
    local = getattr(mesh, "local", mesh)
    if type(local).__name__ not in _BOX:
        return None
    return int(local.dim), int(local.geom_order)


_INSIDE = [0]      # > 0 inside ahead_done(): the enclosing solve compiled ahead already


@contextmanager
def ahead_done():
    """Within it, :func:`compile_ahead` does nothing (the pieces of a solve that compiled
    its kernels ahead as a whole: its operators, its multigrid levels)."""
    _INSIDE[0] += 1
    try:
        yield
    finally:
        _INSIDE[0] -= 1


def compile_ahead(comm, mesh, what, run, **kind):
    """Compile a solve's kernels on the first rank of each node before the collective
    work (collective; see the module's docstring).

    Parameters
    ----------
    comm : mpi4py communicator
    mesh : the solve's mesh (a box mesh, a distributed block mesh: others are skipped)
    what : str
        A name for the kind of solve (part of the once-per-process key).
    run : callable
        ``run(tiny_mesh, MPI.COMM_SELF)``: the same solve on a tiny mesh on one rank.
    **kind
        What the kernels depend on (orders, quadrature, device, ...), as plain values.
    """
    box = _box_kind(mesh)
    if box is None or _INSIDE[0]:
        return
    key = (what, box) + tuple(sorted((k, repr(v)) for k, v in kind.items()))
    MPI = load_mpi()

    def tiny():
        run(box_mesh(box[0], 2, geom_order=box[1], distortion=0.05), MPI.COMM_SELF)
    node_first(comm, key, tiny)
