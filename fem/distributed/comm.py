"""MPI for the distributed FEM layer: loading it, checks all ranks agree on, sums across ranks.

Nothing here imports mpi4py at module import: :func:`load_mpi` does, when a
distributed object is built, and says what is missing when it cannot.

* :func:`collective` and :func:`agree` turn a failure on some ranks into an error
  on every rank (:class:`RankError` where the rank itself was fine), so a bad
  argument never leaves the other ranks waiting in a collective call.
* :class:`Reducer` sums scalars (CG's inner products) and arrays (the fused GPU
  CG's per-block partial sums) across the ranks with ``Allreduce``, and keeps the
  time spent there.
* :func:`select_gpu` makes the node-local rank modulo the device count the
  current CuPy device; :func:`cuda_aware` says whether the MPI library takes GPU
  buffers (``MPIX_Query_cuda_support``, or ``SMALLTC_MPI_CUDA_AWARE=0/1``).
* :func:`comm_path` chooses, once per communicator, how the halo exchanges and the
  array reductions travel (:func:`decide_path`): on GPUs NCCL through CuPy where it
  imports (:mod:`.nccl`) and no two ranks share a GPU (:func:`shared_gpus`), else CUDA-aware MPI where :func:`cuda_aware` says so, else
  MPI on page-locked host copies (``"staged"``); on the CPU plain MPI on NumPy arrays
  (``"host"``). ``SMALLTC_DIST_COMM=nccl|mpi-device|staged`` forces one.
* :func:`node_first` runs a function on the first rank of each node while the node's
  other ranks wait without spinning: kernels compiled there are loaded by the others
  from the disk cache instead of being compiled again.

Examples
--------
>>> from mpi4py import MPI
>>> red = Reducer(MPI.COMM_SELF)
>>> red.sums(1.5, 2.0)                       # one rank: the values themselves
(1.5, 2.0)
>>> collective(MPI.COMM_SELF, lambda: 42)
42
"""

import ctypes
import logging
import os
import time
from dataclasses import dataclass

import numpy as np

from smalltc._arrays import is_cupy

from .nccl import NcclComm, nccl_module

__all__ = ["RankError", "Reducer", "agree", "collective", "cuda_aware", "load_mpi",
           "check_launch", "local_rank", "private_comm", "select_gpu", "spelling",
           "ENV_CUDA_AWARE", "ENV_COMM", "COMM_PATHS", "CommPath", "comm_path",
           "decide_path", "make_reducer", "node_first", "quiet_barrier"]

#: environment variable that overrides the CUDA-aware MPI query: "1" or "0"
ENV_CUDA_AWARE = "SMALLTC_MPI_CUDA_AWARE"
#: environment variable that forces the communication path of a distributed solve
ENV_COMM = "SMALLTC_DIST_COMM"
#: the communication paths :data:`ENV_COMM` can force (GPU runs; "host" is the CPU's)
COMM_PATHS = ("nccl", "mpi-device", "staged")
#: path -> the halo's transport (:data:`.halo.TRANSPORTS`)
TRANSPORT_OF = {"host": "host", "staged": "staged", "mpi-device": "device", "nccl": "nccl"}

_log = logging.getLogger("smalltc")

#: launcher variables that give the number of processes started (MPICH/Hydra, Open MPI, Slurm)
_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")


class RankError(RuntimeError):
    """Raised on a rank whose own part was fine when a check failed on another rank."""


def load_mpi():
    """``mpi4py.MPI``, or a ``RuntimeError`` saying what is missing.

    Raises
    ------
    RuntimeError
        When mpi4py is not installed, or imports but finds no MPI library.
    """
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise RuntimeError(
            "the distributed solve needs mpi4py and an MPI library, and mpi4py does not "
            "import: pip install 'smalltc[mpi]' (mpi4py and MPICH from PyPI)") from err
    except RuntimeError as err:
        raise RuntimeError(
            f"mpi4py imports but loads no MPI library ({' '.join(str(err).split())}): "
            "pip install 'smalltc[mpi]' brings MPICH, or point MPI4PY_LIBMPI at one") from err
    return MPI


def check_launch(comm):
    """Raise when the launcher started more processes than ``comm``'s world holds.

    That happens when mpi4py uses another MPI library than the ``mpiexec`` that
    started it: every process then runs alone as rank 0 of 1, and a distributed
    solve would silently be ``N`` serial ones.
    """
    MPI = load_mpi()
    world = MPI.COMM_WORLD.Get_size()
    for var in _LAUNCHER_SIZE:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1 and world == 1:
            raise RuntimeError(
                f"the launcher started {value} processes ({var}={value}) but MPI sees one: "
                f"mpi4py uses another MPI library ({MPI.Get_library_version().splitlines()[0]}) "
                "than the mpiexec that started it; use the mpiexec of that library (in the "
                "same environment as mpi4py)")
    return comm


def _describe(err):
    return f"{type(err).__name__}: {err}"


def collective(comm, fn, *args, what="setup", **kwargs):
    """``fn(*args, **kwargs)`` on every rank; if it raises anywhere, raise on every rank.

    The rank that failed raises its own exception; the others raise
    :class:`RankError` naming the failed ranks and their messages. Every rank
    takes part in one ``allgather`` either way, so none is left waiting.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> collective(MPI.COMM_SELF, int, "7")
    7
    """
    try:
        out, err = fn(*args, **kwargs), None
    except Exception as exc:      # reported to every rank, then raised again here
        out, err = None, exc
    errors = comm.allgather(None if err is None else _describe(err))
    if err is not None:
        raise err
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        ranks = ", ".join(str(r) for r, _ in failed)
        raise RankError(f"{what} failed on rank(s) {ranks} of {comm.Get_size()}: "
                        + "; ".join(f"rank {r}: {e}" for r, e in failed))
    return out


def agree(comm, values, what="arguments"):
    """Raise ``ValueError`` on every rank unless every rank passed the same ``values``.

    Parameters
    ----------
    comm : mpi4py communicator
    values : dict
        Name -> value (compared by ``repr``), e.g. the arguments of a call.
    what : str
        What the values are, for the message.

    Raises
    ------
    ValueError
        Naming each differing entry and which ranks had which value.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> agree(MPI.COMM_SELF, {"p": 2, "nq": 4})
    """
    mine = {k: repr(v) for k, v in values.items()}
    every = comm.allgather(mine)
    keys = sorted(set().union(*every))
    diffs = []
    for k in keys:
        seen = {}
        for r, vals in enumerate(every):
            seen.setdefault(vals.get(k, "<missing>"), []).append(r)
        if len(seen) > 1:
            diffs.append(f"{k} is " + ", ".join(
                f"{v} on rank{'s' if len(rs) > 1 else ''} {_ranges(rs)}" for v, rs in seen.items()))
    if diffs:
        raise ValueError(f"{what} differ across the {comm.Get_size()} ranks: " + "; ".join(diffs))


_KEYVAL = []   # the MPI attribute key under which private_comm keeps its duplicate


def private_comm(comm):
    """A duplicate of ``comm`` for smalltc's own messages, made once per communicator.

    Kept as an MPI attribute of ``comm`` (as PETSc keeps its inner communicator), so
    every space and operator built on ``comm`` shares it and MPI's limited supply of
    communicators is not used up by repeated solves. Collective the first time.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> private_comm(MPI.COMM_SELF) is private_comm(MPI.COMM_SELF)
    True
    """
    MPI = load_mpi()
    if not _KEYVAL:
        _KEYVAL.append(MPI.Comm.Create_keyval())
    inner = comm.Get_attr(_KEYVAL[0])
    if inner is None:
        inner = comm.Dup()
        comm.Set_attr(_KEYVAL[0], inner)
    return inner


def spelling(value):
    """``value`` as every rank spells it, for :func:`agree`: a callable by its module and
    qualified name (its ``repr`` holds an address that differs between processes).

    Examples
    --------
    >>> spelling(np.sin), spelling(0.05)
    ('numpy.sin', '0.05')
    >>> from smalltc.fem import Kershaw
    >>> spelling(Kershaw(0.3))                  # a callable instance: by its parameters
    'smalltc.fem.mesh.Kershaw(epsy=0.3, epsz=0.3)'

    """
    if callable(value):
        module = getattr(value, "__module__", None) or type(value).__module__
        if hasattr(value, "__qualname__"):                  # a function or a class
            return f"{module}.{value.__qualname__}"
        text = repr(value)                                  # an instance, e.g. Kershaw(...)
        return f"{module}.{text if ' at 0x' not in text else type(value).__qualname__}"
    return repr(value)


def _ranges(ranks):
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def _libmpi_candidates():
    """Shared objects of the MPI library loaded in this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if ".so" in ln and "libmpi" in ln.rsplit("/", 1)[-1]}
    except OSError:
        paths = set()
    return sorted(paths) + [None]      # None: the symbols of the whole process


def cuda_aware():
    """Whether the MPI library takes CUDA device buffers, and how that was decided.

    ``SMALLTC_MPI_CUDA_AWARE=1`` or ``0`` decides; otherwise the library is asked
    (``MPIX_Query_cuda_support``, which MPICH and Open MPI provide) after MPI is
    initialised; a library that cannot be asked is taken as not CUDA-aware.

    Returns
    -------
    (bool, str)
        The answer and where it came from.

    Examples
    --------
    >>> aware, how = cuda_aware()
    >>> isinstance(aware, bool), isinstance(how, str)
    (True, True)
    """
    env = os.environ.get(ENV_CUDA_AWARE, "").strip()
    if env in ("0", "1"):
        return env == "1", f"{ENV_CUDA_AWARE}={env}"
    load_mpi()                               # initialises MPI: the query needs it
    for path in _libmpi_candidates():
        try:
            lib = ctypes.CDLL(path)
            query = lib.MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return bool(query()), f"MPIX_Query_cuda_support() in {path or 'the process'}"
    return False, "no MPIX_Query_cuda_support in the MPI library (taken as not CUDA-aware)"


def local_rank(comm):
    """This rank's index among the ranks of ``comm`` on the same node.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> local_rank(MPI.COMM_SELF)
    0
    """
    MPI = load_mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_rank()
    finally:
        node.Free()


def select_gpu(comm):
    """Make GPU ``local_rank(comm) % device count`` CuPy's current device; returns its id.

    Call it before any CuPy allocation of the solve (a rank's arrays live on the
    device current when they are made). Ranks on one node share the GPUs round
    robin; more ranks than GPUs share a GPU.
    """
    import cupy
    count = cupy.cuda.runtime.getDeviceCount()
    dev = local_rank(comm) % count
    cupy.cuda.Device(dev).use()
    return dev


class Reducer:
    """Sums across the ranks of ``comm`` (``Allreduce``), timed.

    Parameters
    ----------
    comm : mpi4py communicator
    device_buffers : bool
        For CuPy arrays in :meth:`sum_array`: hand them to MPI as they are (a
        CUDA-aware MPI), else through host memory.
    nccl : NcclComm, optional
        For CuPy arrays in :meth:`sum_array`: NCCL's allreduce on the current stream
        (:mod:`.nccl`; no host wait). The scalars of :meth:`sums` are host floats
        already and go through MPI. On one rank nothing travels: a sum is the rank's own
        (no copy, no wait).

    Attributes
    ----------
    seconds : float
        Time spent in the reductions (host copies and the wait included).
    calls : int
    """

    def __init__(self, comm, device_buffers=False, nccl=None):
        self.MPI = load_mpi()
        self.comm = comm
        self.device_buffers = bool(device_buffers)
        self.nccl = nccl
        self.alone = comm.Get_size() == 1
        self.seconds = 0.0
        self.calls = 0
        self._host = {}

    def sums(self, *values):
        """The sum over the ranks of each of ``values`` (Python floats), in one ``Allreduce``."""
        t = time.perf_counter()
        buf = np.array(values, dtype=np.float64)
        if not self.alone:
            self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return tuple(float(v) for v in buf)

    def sum_array(self, a):
        """Replace the array ``a`` (NumPy or CuPy, contiguous) by its sum over the ranks."""
        t = time.perf_counter()
        if self.alone:
            pass                                             # the rank's own sum
        elif not is_cupy(a):
            self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM)
        elif self.nccl is not None:
            self.nccl.allreduce(a)                           # stream-ordered, no host wait
        elif self.device_buffers:
            import cupy
            cupy.cuda.get_current_stream().synchronize()     # MPI does not order with streams
            self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM)
        else:
            host = self._pinned(a.size, a.dtype)
            a.get(out=host)                                  # waits for the stream
            self.comm.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
            a.set(host)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return a

    def _pinned(self, n, dtype):
        key = (n, np.dtype(dtype).str)
        buf = self._host.get(key)
        if buf is None:
            buf = self._host[key] = pinned_empty(n, dtype)
        return buf


def pinned_empty(n, dtype):
    """A NumPy array of ``n`` entries in page-locked host memory (CuPy's pinned pool):
    copies between it and the GPU run asynchronously and at full speed."""
    import cupy
    dtype = np.dtype(dtype)
    mem = cupy.cuda.alloc_pinned_memory(max(1, n) * dtype.itemsize)
    return np.frombuffer(mem, dtype=dtype, count=n)


@dataclass
class CommPath:
    """How a distributed solve's messages travel (:func:`comm_path`).

    Attributes
    ----------
    name : str
        ``"host"`` (NumPy arrays, plain MPI), ``"staged"`` (CuPy arrays copied through
        page-locked host memory), ``"mpi-device"`` (CuPy arrays given to a CUDA-aware
        MPI), ``"nccl"`` (NCCL through CuPy).
    reason : str
        Why this path.
    nccl : NcclComm or None
        The NCCL communicator (``name == "nccl"``).
    """

    name: str
    reason: str
    nccl: object = None

    @property
    def transport(self):
        """The halo's transport name (:data:`.halo.TRANSPORTS`)."""
        return TRANSPORT_OF[self.name]

    def __str__(self):
        return f"{self.name} ({self.reason})"


def decide_path(on_gpu, forced=None, nccl=None, aware=None):
    """The communication path from what this rank found (no MPI, no CuPy: a pure rule).

    Parameters
    ----------
    on_gpu : bool
        CuPy vectors (``device="gpu"``) or NumPy ones.
    forced : str or None
        :data:`ENV_COMM`'s value (None or ``""``: choose).
    nccl : callable or None
        ``nccl() -> (available, why)``; asked only when NCCL could be chosen.
    aware : callable or None
        ``aware() -> (cuda_aware, how)`` (:func:`cuda_aware`); asked only when needed.

    Returns
    -------
    (str, str)
        The path and why. A choice made after NCCL was found missing says so in the
        reason (the callers log it).

    Raises
    ------
    ValueError
        A forced value that is not one of :data:`COMM_PATHS`.
    RuntimeError
        A forced path that is not available here, naming what is missing.

    Examples
    --------
    >>> decide_path(False)
    ('host', 'NumPy vectors: plain MPI')
    >>> decide_path(True, nccl=lambda: (False, "no NCCL"), aware=lambda: (False, "asked"))
    ('staged', 'NCCL not available (no NCCL); MPI not CUDA-aware (asked): page-locked host copies')
    >>> decide_path(True, "mpi-device", aware=lambda: (False, "asked"))
    Traceback (most recent call last):
    ...
    RuntimeError: SMALLTC_DIST_COMM=mpi-device, but the MPI library is not CUDA-aware (asked); unset it or choose one of nccl, mpi-device, staged that is available
    """
    forced = (forced or "").strip().lower() or None
    if forced is not None and forced not in COMM_PATHS:
        raise ValueError(f"{ENV_COMM} must be one of {', '.join(COMM_PATHS)} (or unset), got "
                         f"{forced!r}")
    hint = f"; unset it or choose one of {', '.join(COMM_PATHS)} that is available"
    if not on_gpu:
        if forced == "nccl":
            raise RuntimeError(f"{ENV_COMM}=nccl, but NCCL moves GPU arrays and this solve runs "
                               "on the CPU (device='cpu')" + hint)
        if forced == "staged":
            return "staged", f"{ENV_COMM}=staged (NumPy vectors through separate host buffers)"
        return "host", "NumPy vectors: plain MPI"
    if forced == "staged":
        return "staged", f"{ENV_COMM}=staged"
    notes = []
    if forced in (None, "nccl"):
        ok, why = nccl()
        if ok:
            return "nccl", (f"{ENV_COMM}=nccl" if forced else "NCCL through CuPy") + \
                f" ({why})"
        if forced == "nccl":
            raise RuntimeError(f"{ENV_COMM}=nccl, but NCCL is not available ({why})" + hint)
        notes.append(f"NCCL not available ({why})")
    ok, how = aware()
    if ok:
        return "mpi-device", "; ".join(notes + [f"CUDA-aware MPI ({how})"])
    if forced == "mpi-device":
        raise RuntimeError(f"{ENV_COMM}=mpi-device, but the MPI library is not CUDA-aware "
                           f"({how})" + hint)
    return "staged", "; ".join(notes + [f"MPI not CUDA-aware ({how}): page-locked host copies"])


def _nccl_probe():
    try:
        nccl = nccl_module()
    except RuntimeError as err:
        return False, str(err).split(": ", 1)[-1]
    try:
        version = nccl.get_version()
    except Exception:              # an old CuPy without get_version: the module imported
        version = None
    return True, f"NCCL {version}" if version else "cupy.cuda.nccl imports"


def _gpu_place():
    """``(host, PCI bus id)`` of this rank's current GPU, or None where CuPy or a GPU is
    missing (each rank asks its own)."""
    try:
        import cupy               # optional: only GPU solves get here with it
        dev = cupy.cuda.Device()
        return load_mpi().Get_processor_name(), str(getattr(dev, "pci_bus_id", dev.id))
    except Exception:
        return None


def shared_gpus(places):
    """Which ranks share a GPU, from every rank's ``(host, GPU)`` (None: no GPU), as text;
    None if every rank has a GPU of its own. NCCL refuses two ranks on one GPU.

    Examples
    --------
    >>> shared_gpus([("a", "0000:01:00.0"), ("a", "0000:02:00.0"), ("b", "0000:01:00.0")])
    >>> shared_gpus([("a", "0000:01:00.0"), ("a", "0000:01:00.0"), ("a", "0000:02:00.0")])
    'ranks 0-1 share GPU 0000:01:00.0 of host a'
    """
    by_place = {}
    for rank, place in enumerate(places):
        if place is not None:
            by_place.setdefault(tuple(place), []).append(rank)
    shared = [f"ranks {_ranges(r)} share GPU {gpu} of host {host}"
              for (host, gpu), r in by_place.items() if len(r) > 1]
    return "; ".join(shared) or None


_PATHKEY = []    # the MPI attribute key under which comm_path keeps its choice


def _alone(comm):
    """Whether ``comm`` has one rank (a solve with no messages)."""
    return comm.Get_size() == 1


def comm_path(comm, xp=np):
    """The :class:`CommPath` of ``comm`` for vectors of module ``xp``, chosen once per
    communicator and module (collective the first time: the ranks must agree, and the
    NCCL communicator is built by all of them). GPU vectors on a communicator of one
    rank take ``"staged"`` unless :data:`ENV_COMM` forces a path: nothing is sent, so
    no NCCL communicator is built.

    Raises
    ------
    ValueError, RuntimeError
        On every rank: a bad or unavailable forced path (:func:`decide_path`), or ranks
        that chose differently.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> print(comm_path(MPI.COMM_SELF))
    host (NumPy vectors: plain MPI)
    """
    MPI = load_mpi()
    if not _PATHKEY:
        _PATHKEY.append(MPI.Comm.Create_keyval())
    cache = comm.Get_attr(_PATHKEY[0])
    if cache is None:
        cache = {}
        comm.Set_attr(_PATHKEY[0], cache)
    key = xp.__name__
    if key in cache:
        return cache[key]
    on_gpu = xp is not np
    forced = os.environ.get(ENV_COMM)
    if on_gpu and not (forced or "").strip() and _alone(comm):
        # nothing will be sent: no NCCL communicator to build (half a second), no probe
        path = cache[key] = CommPath("staged", "one rank: no messages to exchange")
        return path
    probe = _nccl_probe
    shared = shared_gpus(comm.allgather(_gpu_place())) if on_gpu else None
    if shared:                     # more ranks than GPUs: NCCL would fail to start
        probe = (lambda: (False, f"it needs a GPU a rank: {shared}"))
    name, reason = collective(comm, decide_path, on_gpu, forced,
                              probe, cuda_aware, what="choosing the communication path")
    agree(comm, {"communication path": name}, "the communication paths found")
    if "NCCL not available" in reason and comm.Get_rank() == 0:
        _log.info("smalltc: the distributed solve's messages go by %s: %s", name, reason)
    nccl = None
    if name == "nccl":
        nccl = collective(comm, NcclComm, comm, what="building the NCCL communicator")
    path = cache[key] = CommPath(name, reason, nccl)
    return path


def make_reducer(comm, xp=np):
    """The :class:`Reducer` of ``comm`` on its communication path (:func:`comm_path`)."""
    path = comm_path(comm, xp)
    return Reducer(comm, device_buffers=path.name == "mpi-device", nccl=path.nccl)


def quiet_barrier(comm, poll=0.001, longest=0.05):
    """A barrier whose waiting ranks sleep between polls instead of spinning (MPI's
    blocking calls spin a core, which on a busy or oversubscribed host slows the ranks
    that still work). The sleeps grow from ``poll`` to ``longest`` seconds: a short wait
    ends soon after the last rank arrives, a long one (a compile) costs few wake-ups."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(poll)
        poll = min(2 * poll, longest)


_DONE_FIRST = set()


def node_first(comm, key, fn):
    """Run ``fn()`` on the first rank of each node, the node's other ranks waiting (asleep),
    once per process and ``key``; collective.

    For work whose result lands in a cache on disk, e.g. compiling kernels: the node's
    other ranks then load them instead of compiling the same ones at the same time.
    ``fn`` must not communicate on ``comm``. A failure in ``fn`` is reported as a
    warning and ignored (the caller's own work then builds what it needs).
    """
    if comm.Get_size() == 1:
        return
    # every rank takes the same branch, even where the keys differ (differing arguments are
    # the caller's to report, after this)
    if not any(comm.allgather(key not in _DONE_FIRST)):
        return
    _DONE_FIRST.add(key)
    MPI = load_mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        if node.Get_size() > 1:
            if node.Get_rank() == 0:
                try:
                    fn()
                except Exception as err:      # the real work will raise it where it matters
                    _log.warning("smalltc: compiling ahead on the node's first rank failed "
                                 "(%s: %s); each rank compiles its own", type(err).__name__, err)
            quiet_barrier(node)
    finally:
        node.Free()
