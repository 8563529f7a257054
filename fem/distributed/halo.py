"""The halo exchange of shared DoFs between neighbouring ranks (nonblocking mpi4py).

A rank's local vector holds its local lattice: the nodes it owns and its ghosts
(nodes on its upper interfaces, owned by a neighbour: :mod:`.partition`). Two
exchanges keep such vectors right:

* **forward** (owners -> ghosts): each ghost gets its owner's value; done on the
  operator's input before the elements that touch ghosts are applied.
* **reverse** (ghosts -> owners): each ghost's value (a partial sum, e.g. the
  contributions of this rank's elements to a shared node) is added into its
  owner's entry, and the ghost is zeroed: after it, only owners hold a node's
  value, so inner products over the whole local vector count each node once.

Both are split in ``start_*`` (pack, post ``Isend``/``Irecv``) and ``finish_*``
(wait, unpack) so that work on interior elements runs in between. All the
messages of one exchange to one neighbour go in one buffer; a rank's buffers for
all neighbours are one array, so packing is one gather, and where no owned node goes
to two neighbours the reverse exchange's unpacking is one scatter-add.

Buffers follow the vector's array module. NumPy: host buffers (``transport ==
"host"``). CuPy: the communication path of the communicator
(:func:`~.comm.comm_path`, chosen once at run time, ``SMALLTC_DIST_COMM`` forces
one): NCCL send/recv in one group on a stream of its own (``"nccl"``, :mod:`.nccl`:
no host wait, the interior kernels overlap it), the packed device buffer given to a
CUDA-aware MPI as it is (``"device"``), or copied to page-locked host memory and
back (``"staged"``). Received contributions are added in increasing
neighbour-rank order, so results do not depend on message timing.

Examples
--------
>>> from mpi4py import MPI
>>> halo = Halo(MPI.COMM_SELF, {}, {}, np)          # one rank: nothing to exchange
>>> halo.transport, halo.forward(np.ones(3)).tolist()
('host', [1.0, 1.0, 1.0])
"""

import time

import numpy as np

from .comm import comm_path, load_mpi, pinned_empty

__all__ = ["Halo", "TRANSPORTS"]

#: how buffers travel: NumPy arrays by MPI; CuPy arrays by MPI as they are; CuPy through
#: host memory; CuPy by NCCL
TRANSPORTS = ("host", "device", "staged", "nccl")

_TAG_FORWARD, _TAG_REVERSE, _TAG_SUM = 7101, 7102, 7103


def add_at(y, idx, values, xp=np):
    """``y[idx] += values`` for indices without repeats: on CuPy one scatter-add kernel
    (``cupy.add.at``; an index read-modify-write is three), the same single addition a
    node, so the same bits."""
    if xp is np:
        y[idx] += values
    else:
        xp.add.at(y, idx, values)
    return y


def set_at(y, idx, values, xp=np):
    """``y[idx] = values`` (a number or an array of ``idx``'s length); on CuPy by
    ``ndarray.put`` (one kernel, a third of the indexing assignment's host time)."""
    if xp is np:
        y[idx] = values
    else:
        y.put(idx, values)
    return y


def _concat(xp, lists, order):
    """The index lists of ``order`` (neighbour ranks) as one int64 array and their offsets."""
    parts = [np.asarray(lists[q], dtype=np.int64) for q in order]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in parts], out=offsets[1:])
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return xp.asarray(flat), [int(o) for o in offsets]


def _to_host(dev, host):
    """Copy ``dev`` into the host array ``host`` (for CuPy: after the stream's work)."""
    if isinstance(dev, np.ndarray):
        np.copyto(host, dev)
    else:
        dev.get(out=host)


def _to_device(host, dev, xp=np):
    """Copy the host array ``host`` into ``dev``; for CuPy waited for: from page-locked
    memory the copy is asynchronous, and the next exchange's receive reuses ``host``
    (one that posts no send does not wait on the stream first)."""
    if isinstance(dev, np.ndarray):
        np.copyto(dev, host)
    else:
        stream = xp.cuda.get_current_stream()
        dev.set(host, stream=stream)
        stream.synchronize()


class _Pending:
    """One exchange in flight: its requests, buffers and what to do on arrival."""

    __slots__ = ("requests", "recv_host", "recv_dev", "dtype", "t0", "event")

    def __init__(self, requests, recv_host, recv_dev, dtype, t0, event=None):
        self.requests, self.recv_host, self.recv_dev = requests, recv_host, recv_dev
        self.dtype, self.t0, self.event = dtype, t0, event


class Halo:
    """Forward and reverse exchanges of one rank's local vectors with its neighbours.

    Parameters
    ----------
    comm : mpi4py communicator
        Messages use their own tags on it (:class:`~.space.DistributedH1Space`
        passes a duplicate of the user's communicator).
    sends : dict rank -> int array
        Local indices of owned nodes that rank holds as ghosts.
    recvs : dict rank -> int array
        Local indices of this rank's ghosts that rank owns. ``sends`` of one rank
        and ``recvs`` of the other list a shared set in the same order
        (:meth:`~.partition.BlockPartition.exchange_lists`).
    xp : module
        ``numpy`` or ``cupy``: where the vectors live.
    transport : {None, "host", "device", "staged", "nccl"}
        None: the communicator's path (:func:`~.comm.comm_path`): ``"host"`` for
        NumPy; for CuPy ``"nccl"`` where NCCL imports, else ``"device"`` if MPI is
        CUDA-aware (:func:`~.comm.cuda_aware`), else ``"staged"``. With NumPy vectors
        ``"staged"`` copies through separate host buffers (its bookkeeping, tested
        without a GPU) and ``"device"`` is ``"host"``; ``"nccl"`` is for CuPy only.

    Attributes
    ----------
    transport : str
    transport_reason : str
        Why that transport (the path's reason, :class:`~.comm.CommPath`).
    seconds : dict
        Time spent in ``"pack"`` (gathering and posting), ``"wait"`` (waiting for
        messages: what overlap does not hide) and ``"unpack"``; ``calls`` counts
        exchanges.
    ghosts : xp int64 array
        Every ghost's local index (the union of ``recvs``).
    """

    def __init__(self, comm, sends, recvs, xp, transport=None, shared=None):
        self.MPI = load_mpi()
        self.comm, self.xp = comm, xp
        self.nccl = None
        if transport is None:
            path = comm_path(comm, xp)
            transport, reason, self.nccl = path.transport, path.reason, path.nccl
        else:
            reason = "asked for"
        if transport not in TRANSPORTS or (xp is not np and transport == "host") or (
                xp is np and transport == "nccl"):
            raise ValueError(f"transport must be one of {TRANSPORTS} ('device', 'staged' or "
                             f"'nccl' for CuPy vectors, not 'nccl' for NumPy ones), got "
                             f"{transport!r}")
        if transport == "nccl" and self.nccl is None:
            path = comm_path(comm, xp)
            if path.nccl is None:
                raise ValueError(f"transport='nccl' asked for, but the communicator's path is "
                                 f"{path}")
            self.nccl = path.nccl
        self.transport, self.transport_reason = transport, reason
        self.send_ranks = sorted(sends)
        self.recv_ranks = sorted(recvs)
        # forward: pack owned nodes for each holder, unpack into ghosts; reverse: the other way
        self.owned_idx, self.owned_off = _concat(xp, sends, self.send_ranks)
        self.ghost_idx, self.ghost_off = _concat(xp, recvs, self.recv_ranks)
        self.ghosts = self.ghost_idx
        self._owned_parts = [self.owned_idx[a:b] for a, b in
                             zip(self.owned_off[:-1], self.owned_off[1:])]
        # no owned node sent to two neighbours (faces of a 1D rank grid): the reverse
        # exchange's contributions go in with one scatter-add, each node's single addition
        owned = np.concatenate([np.asarray(sends[q]) for q in self.send_ranks] or [[]])
        self._one_add = np.unique(owned).size == owned.size
        self._buffers = {}
        self.seconds = {"pack": 0.0, "wait": 0.0, "unpack": 0.0}
        self.calls = 0
        self._shared(shared)

    def _shared(self, shared):
        """The neighbour sum's lists: each neighbour's shared nodes (concatenated, in
        increasing rank order), the union of those nodes, and where each neighbour's
        list sits in the union; the order of the sum (every sharer's contribution in
        increasing rank order, this rank's included)."""
        self.has_sum = shared is not None
        if not self.has_sum:
            return
        xp, me = self.xp, self.comm.Get_rank()
        self.sum_ranks = sorted(shared)
        self.sum_idx, self.sum_off = _concat(xp, shared, self.sum_ranks)
        nodes = np.unique(np.concatenate([np.asarray(shared[q]) for q in self.sum_ranks]
                                         or [np.zeros(0, dtype=np.int64)]))
        self.sum_nodes = xp.asarray(nodes.astype(np.int64))
        self._sum_order = []            # (rank, positions in the union, its slice), by rank
        for q in sorted(self.sum_ranks + [me]):
            if q == me:
                self._sum_order.append((q, None, None))
                continue
            k = self.sum_ranks.index(q)
            a, b = int(self.sum_off[k]), int(self.sum_off[k + 1])
            pos = np.searchsorted(nodes, np.asarray(shared[q]))
            self._sum_order.append((q, xp.asarray(pos.astype(np.int64)), (a, b)))

    @property
    def nghosts(self):
        return int(self.ghost_off[-1])

    def __repr__(self):
        return (f"Halo(rank={self.comm.Get_rank()}, sends_to={self.send_ranks}, "
                f"receives_from={self.recv_ranks}, ghosts={self.nghosts}, "
                f"transport={self.transport!r})")

    # ------------------------------------------------------------------ buffers
    def _buffer(self, role, n, dtype):
        """A reused buffer per role ("send_dev", "recv_dev": the vector's module;
        "send_host", "recv_host": host memory, page-locked for the staged transport)."""
        key = (role, n, np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None:
            if role.endswith("_dev"):
                buf = self.xp.empty(n, dtype=dtype)
            elif self.transport == "staged" and self.xp is not np:
                buf = pinned_empty(n, dtype)
            else:
                buf = np.empty(n, dtype=dtype)
            self._buffers[key] = buf
        return buf

    def _post(self, send, send_ranks, send_off, recv, recv_ranks, recv_off, tag):
        reqs = [self.comm.Irecv(recv[a:b], source=q, tag=tag)
                for q, a, b in zip(recv_ranks, recv_off[:-1], recv_off[1:])]
        reqs += [self.comm.Isend(send[a:b], dest=q, tag=tag)
                 for q, a, b in zip(send_ranks, send_off[:-1], send_off[1:])]
        return reqs

    def _start(self, src, pack_idx, send_ranks, send_off, recv_ranks, recv_off, tag):
        """Gather ``src[pack_idx]``, hand it to MPI, post the receives."""
        t0 = time.perf_counter()
        xp, dtype = self.xp, src.dtype
        nsend, nrecv = send_off[-1], recv_off[-1]
        send_dev = self._buffer("send_dev", nsend, dtype)
        if nsend:
            xp.take(src, pack_idx, out=send_dev)
        recv_dev = self._buffer("recv_dev", nrecv, dtype)
        if self.transport == "nccl":                        # queued: no host wait
            event = self.nccl.exchange(
                [(q, send_dev[a:b]) for q, a, b in zip(send_ranks, send_off[:-1], send_off[1:])],
                [(q, recv_dev[a:b]) for q, a, b in zip(recv_ranks, recv_off[:-1], recv_off[1:])])
            self.seconds["pack"] += time.perf_counter() - t0
            return _Pending([], None, recv_dev, dtype, t0, event)
        if self.transport != "staged":
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()  # MPI does not order with streams
            send, recv = send_dev, recv_dev
        else:
            send = self._buffer("send_host", nsend, dtype)
            if nsend:
                _to_host(send_dev, send)                    # waits for the packing
            recv = self._buffer("recv_host", nrecv, dtype)
        reqs = self._post(send, send_ranks, send_off, recv, recv_ranks, recv_off, tag)
        self.seconds["pack"] += time.perf_counter() - t0
        return _Pending(reqs, recv, recv_dev, dtype, t0)

    def _wait(self, pending):
        """Wait for an exchange; returns the received values in the vector's module."""
        t = time.perf_counter()
        if pending.event is not None:
            self.nccl.wait(pending.event)                   # the stream waits, not the host
        else:
            self.MPI.Request.Waitall(pending.requests)
        self.seconds["wait"] += time.perf_counter() - t
        if self.transport == "staged" and pending.recv_dev.size:
            _to_device(pending.recv_host, pending.recv_dev, self.xp)
        return pending.recv_dev

    # ------------------------------------------------------------------ forward
    def start_forward(self, x):
        """Post the forward exchange of ``x`` (a local vector); returns a handle."""
        return self._start(x, self.owned_idx, self.send_ranks, self.owned_off,
                           self.recv_ranks, self.ghost_off, _TAG_FORWARD)

    def finish_forward(self, pending, x):
        """Wait for the forward exchange and write the owners' values into ``x``'s ghosts."""
        recv = self._wait(pending)
        t = time.perf_counter()
        if recv.size:
            set_at(x, self.ghost_idx, recv, self.xp)
        self.seconds["unpack"] += time.perf_counter() - t
        self.calls += 1
        return x

    def forward(self, x):
        """Owners -> ghosts: every ghost of ``x`` gets its owner's value (in place)."""
        return self.finish_forward(self.start_forward(x), x)

    # ------------------------------------------------------------------ reverse
    def start_reverse(self, values, ghost_pos=None):
        """Post the reverse exchange: ``values[ghost_pos]`` are this rank's ghost values,
        in :attr:`ghosts` order (``ghost_pos`` None: ``values`` is a local vector)."""
        idx = self.ghost_idx if ghost_pos is None else ghost_pos
        return self._start(values, idx, self.recv_ranks, self.ghost_off,
                           self.send_ranks, self.owned_off, _TAG_REVERSE)

    def finish_reverse(self, pending, y):
        """Wait for the reverse exchange, add the neighbours' values into ``y``'s owned
        nodes (neighbour by neighbour, in increasing rank order), zero ``y``'s ghosts."""
        recv = self._wait(pending)
        t = time.perf_counter()
        if self._one_add:
            if recv.size:
                add_at(y, self.owned_idx, recv, self.xp)
        else:
            for part, a, b in zip(self._owned_parts, self.owned_off[:-1], self.owned_off[1:]):
                add_at(y, part, recv[a:b], self.xp)
        if self.nghosts:
            set_at(y, self.ghost_idx, 0, self.xp)
        self.seconds["unpack"] += time.perf_counter() - t
        self.calls += 1
        return y

    def reverse(self, y):
        """Ghosts -> owners: ``y``'s ghost values added to their owners, ghosts zeroed."""
        return self.finish_reverse(self.start_reverse(y), y)

    # ------------------------------------------------------------------ neighbour sum
    def start_sum(self, values, pos=None):
        """Post the neighbour sum: ``values[pos]`` are this rank's partial values of the
        shared nodes, in :attr:`sum_idx` order (``pos`` None: ``values`` is a local
        vector). Needs the shared lists (``has_sum``)."""
        idx = self.sum_idx if pos is None else pos
        return self._start(values, idx, self.sum_ranks, self.sum_off,
                           self.sum_ranks, self.sum_off, _TAG_SUM)

    def finish_sum(self, pending, y):
        """Wait for the neighbour sum and give every shared node of ``y`` the sum of all
        its holders' partial values (``y``'s own among them), added in increasing rank
        order: the same bits on every rank that holds it (a local vector summed this way
        is consistent)."""
        recv = self._wait(pending)
        t = time.perf_counter()
        xp = self.xp
        if self.sum_nodes.size:
            acc = xp.zeros(self.sum_nodes.size, dtype=y.dtype)
            for q, pos, part in self._sum_order:
                if pos is None:
                    acc += xp.take(y, self.sum_nodes)
                else:
                    acc[pos] += recv[part[0]:part[1]]
            set_at(y, self.sum_nodes, acc, xp)
        self.seconds["unpack"] += time.perf_counter() - t
        self.calls += 1
        return y

    def sum(self, y):
        """Partial values -> their sums on every holder (consistent form), in place: one
        exchange with the shared lists, else the reverse exchange then the forward one."""
        if self.has_sum:
            return self.finish_sum(self.start_sum(y), y)
        return self.forward(self.reverse(y))
