"""NCCL through CuPy (``cupy.cuda.nccl``): the device-to-device path of the distributed solve.

One :class:`NcclComm` per MPI communicator: rank 0 makes NCCL's unique id, MPI
broadcasts it, every rank joins with its rank (``ncclCommInitRank``). Two operations,
both queued on CUDA streams (the host does not wait):

* :meth:`NcclComm.allreduce`: ``a`` replaced by its sum over the ranks, in place, on
  the current stream (so it is ordered with the kernels around it);
* :meth:`NcclComm.exchange`: the halo's messages, every receive and send of one
  exchange in one NCCL group, on a communication stream of its own that first waits
  for the current stream (the packed buffers are ready); :meth:`NcclComm.wait` makes
  the current stream wait for it. Between the two, kernels queued on the current
  stream (the interior elements) run while the messages travel.

Nothing here imports CuPy at module import; :func:`nccl_module` does, and says why
NCCL is not there when it is not.
"""

import numpy as np

__all__ = ["NcclComm", "nccl_module"]


def nccl_module():
    """``cupy.cuda.nccl``, or ``RuntimeError`` saying what is missing."""
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as err:
        raise RuntimeError(f"NCCL is not available: cupy.cuda.nccl does not import ({err}); "
                           "install CuPy with NCCL (pip install cupy-cuda12x nvidia-nccl-cu12)"
                           ) from err
    if not getattr(cupy.cuda, "nccl_enabled", True):
        raise RuntimeError("NCCL is not available: this CuPy was built without NCCL "
                           "(cupy.cuda.nccl_enabled is False)")
    return nccl


def _nccl_dtype(nccl, dtype):
    """NCCL's code of ``dtype`` (looked up once a dtype: a halo exchange asks twice)."""
    code = _CODES.get(dtype)
    if code is None:
        kinds = {"float64": nccl.NCCL_FLOAT64, "float32": nccl.NCCL_FLOAT32,
                 "int64": nccl.NCCL_INT64, "int32": nccl.NCCL_INT32}
        name = np.dtype(dtype).name
        if name not in kinds:
            raise TypeError(f"NCCL messages of dtype {name} are not supported; expected one "
                            f"of {sorted(kinds)}")
        code = _CODES[dtype] = kinds[name]
    return code


_CODES = {}


class NcclComm:
    """A NCCL communicator over the ranks of the mpi4py communicator ``comm`` (collective:
    every rank builds it, after :func:`~.comm.select_gpu` made its GPU current).

    Attributes
    ----------
    rank, size : int
    calls : int
        Operations queued so far.
    """

    def __init__(self, comm):
        import cupy
        self.nccl = nccl_module()
        self.cupy = cupy
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        uid = self.nccl.get_unique_id() if self.rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.comm = self.nccl.NcclCommunicator(self.size, uid, self.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)     # the halo's messages
        self.calls = 0

    def allreduce(self, a):
        """Replace the contiguous CuPy array ``a`` by its sum over the ranks (in place,
        queued on the current stream)."""
        stream = self.cupy.cuda.get_current_stream()
        self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, _nccl_dtype(self.nccl, a.dtype),
                            self.nccl.NCCL_SUM, stream.ptr)
        self.calls += 1
        return a

    def exchange(self, sends, recvs):
        """Queue one exchange: ``sends`` and ``recvs`` are lists of ``(peer, array)``
        (contiguous CuPy arrays), all in one NCCL group on :attr:`stream`, after the work
        queued so far on the current stream. Returns the event that marks its end."""
        cur = self.cupy.cuda.get_current_stream()
        self.stream.wait_event(cur.record())
        nccl, ptr = self.nccl, self.stream.ptr
        nccl.groupStart()
        try:
            for peer, buf in recvs:
                self.comm.recv(buf.data.ptr, buf.size, _nccl_dtype(nccl, buf.dtype), peer, ptr)
            for peer, buf in sends:
                self.comm.send(buf.data.ptr, buf.size, _nccl_dtype(nccl, buf.dtype), peer, ptr)
        finally:
            nccl.groupEnd()
        self.calls += 1
        return self.stream.record()

    def wait(self, event):
        """Make the current stream wait for an exchange (no host wait)."""
        self.cupy.cuda.get_current_stream().wait_event(event)

    def __repr__(self):
        return f"NcclComm(rank={self.rank}, size={self.size})"
