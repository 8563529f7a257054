"""A GPU function of one vector replayed as a CUDA graph.

The p-multigrid V-cycles (:class:`smalltc.fem.multigrid.PMultigrid`, the distributed
:class:`~smalltc.fem.distributed.multigrid.DistributedPMultigrid`) and the AMG cycle of
the gathered coarse solve are hundreds of short launches each: on coarse levels the host's
launch cost, not the GPU, sets their time. :class:`GraphReplay` runs such a function
eagerly on its first call for an input dtype and shape (the kernels then exist, the
buffers its objects keep are made), captures the same call, unexecuted, on a side stream
(CuPy stream capture, its temporaries in a memory pool of the graph's own: their
addresses are fixed in it), and replays the graph on later calls: one launch.

What a captured function may do: queue work on the current stream (and on streams that
join it through events: the NCCL exchanges of :mod:`.distributed.nccl` do), nothing that
waits on the host (a ``.get()``, a ``bool`` of a device array, MPI on device data, a
stream synchronisation). A capture that fails is logged once and the function runs
launch by launch from then on; it is not retried. Every rank of a distributed V-cycle
captures the same sequence of NCCL operations, so a rank that replays and one that runs
eagerly still agree message for message.
"""

import logging

from smalltc._errors import raise_pending

__all__ = ["GraphReplay", "GRAPH_CHOICES"]

#: the ``graph`` choices of the V-cycles
GRAPH_CHOICES = ("auto", True, False)


class GraphReplay:
    """``fn(r)`` (CuPy vectors in and out) replayed as a CUDA graph.

    Parameters
    ----------
    fn : callable
        ``r -> z``: queues device work only (see the module's docstring).
    xp : module
        CuPy.
    what : str
        The function's name in the log line and the error.
    required : bool
        Raise (``RuntimeError``) where the capture fails, instead of logging and
        running launch by launch.

    Attributes
    ----------
    replays : int
        Calls answered by a graph launch.

    Examples
    --------
    On a GPU (``cupy`` the module)::

        replay = GraphReplay(lambda r: 2.0 * r + 1.0, cupy, "an update")
        replay(x)          # eager, then captured
        replay(x)          # one graph launch
    """

    def __init__(self, fn, xp, what, required=False):
        self.fn, self.xp, self.what, self.required = fn, xp, what, bool(required)
        self._graphs = {}               # (dtype, shape) -> (input, output, Graph, pool) or False
        self.replays = 0

    def captured(self, r):
        """Whether calls on inputs like ``r`` replay a graph (False before the first)."""
        return bool(self._graphs.get((r.dtype.str, r.shape)))

    def __call__(self, r):
        xp = self.xp
        key = (r.dtype.str, r.shape)
        hit = self._graphs.get(key)
        if hit is None:
            z = self.fn(r)                          # eager: the kernels and buffers made
            self._graphs[key] = self._capture(r)
            return z
        if hit is False:
            return self.fn(r)
        gin, gout, graph, _ = hit
        raise_pending(xp.cuda.Device().id)          # a map error of an earlier launch
        gin[...] = r
        graph.launch()
        self.replays += 1
        return gout.copy()

    def _capture(self, r):
        """``(input, output, Graph, pool)`` of ``fn`` on inputs like ``r``, or False (logged)
        where CuPy or the driver refuses the capture."""
        xp = self.xp
        try:
            gin = xp.empty_like(r)
            gin[...] = r
            pool = xp.cuda.MemoryPool()
            side = xp.cuda.Stream(non_blocking=True)
            xp.cuda.get_current_stream().synchronize()
            with xp.cuda.using_allocator(pool.malloc), side:
                mode = getattr(xp.cuda.runtime, "streamCaptureModeRelaxed", None)
                side.begin_capture() if mode is None else side.begin_capture(mode)
                try:
                    gout = self.fn(gin)
                finally:
                    graph = side.end_capture()
            return gin, gout, graph, pool
        except Exception as err:                # noqa: BLE001 - any refusal: run eagerly
            if self.required:
                raise RuntimeError(f"{self.what} could not be captured as a CUDA graph: "
                                   f"{err}") from err
            logging.getLogger("smalltc").warning(
                "smalltc: %s could not be captured as a CUDA graph (%s); it runs launch by "
                "launch", self.what, err)
            return False
