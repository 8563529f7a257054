"""What every CUDA kernel family has: the CUDA :class:`Family` base and the executor base.

A *family* is one kernel design and everything about it, in one module beside
its templates (:mod:`.layout`, :mod:`.contract9`, :mod:`.action`,
:mod:`.assembly`, ...); the interface, :class:`Choice` and the choice among the
families are the backends' common ones (:mod:`smalltc.backends.family`). Here:
contexts are made for a device, and carry the launch (``threads``, ``per_block``,
``smem_bytes``) besides the compile-time sizes and parameters; the parameters an
executor reports include that geometry (``public_keys``); a table entry's
parameters are carried to another size by each family's ``carry``.

The backend (:mod:`smalltc.backends.cuda`) asks the families in turn and
builds what the first one that claims a spec chooses; the tuner
(:mod:`smalltc.tuning`) walks ``space``, compiles and times. Nothing outside a
family repeats its rules.

A *device* here is the dict of :func:`.runtime.device_info` (``name``, ``cc``,
``sms``, ``smem_optin``); :data:`DEFAULT_DEVICE` stands in where there is none
(rendering and tuning without a GPU).
"""
from __future__ import annotations

import math

import numpy as np

from ..base import Executor
from ..family import Choice, Family as _Family
from . import runtime as RT

__all__ = ["Family", "Choice", "KernelExecutor", "DEFAULT_DEVICE", "ITEMSIZE", "DT",
           "SCALAR_FMT", "SMEM_TARGET", "THREADS", "MAX_THREADS", "MIN_THREADS",
           "SM_THREADS", "SM_REGISTERS", "MAX_LOCAL_BYTES", "POW2", "even"]

ITEMSIZE = {"float64": 8, "float32": 4}
DT = {"float64": "f64", "float32": "f32"}             # in entry names
SCALAR_FMT = {"float64": "d", "float32": "f"}        # struct formats of the kernel scalars
#: shared memory a block aims to stay under (several blocks per multiprocessor)
SMEM_TARGET = 48 * 1024
THREADS = 256           # the default block of the kernels that stride over their outputs
MAX_THREADS = 1024      # per block, every CUDA architecture
MIN_THREADS = 64        # 32 resident blocks x 64 threads = 2048: a full SM is possible
SM_THREADS = 2048       # resident threads per multiprocessor (sm_80, sm_90)
SM_REGISTERS = 65536    # 32-bit registers per multiprocessor (and per block)
#: local memory (bytes per thread) a kernel may use: more is a spill that cost 10-20
#: points of the bound (notes/cuda.md); the action's heuristic relaxes its register cap
#: until under it, and the tuner does not time variants above it
MAX_LOCAL_BYTES = 256
POW2 = tuple(2 ** i for i in range(11))
#: the device assumed where none is at hand (an H100's opt-in shared memory per block)
DEFAULT_DEVICE = dict(name=None, cc="90", sms=132, smem_optin=227 * 1024)


def even(n):
    return n + (n % 2)


class Family(_Family):
    """Base of the CUDA kernel families: contexts on a device dict (default
    :data:`DEFAULT_DEVICE`), the launch geometry among the parameters an executor reports;
    see :mod:`smalltc.backends.family` for the interface."""

    public_keys = ("BLK_M", "BLK_N", "BLK_K", "dim_x", "dim_y", "thr_m", "thr_n", "T",
                   "per_block", "threads", "smem_bytes", "min_blocks", "rows", "pad", "rb",
                   "line", "prefetch", "stages")

    def resolve(self, where):
        return DEFAULT_DEVICE if where is None else where

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        raise NotImplementedError

    def executor(self, choice, device):
        raise NotImplementedError

    def space(self, spec):
        raise NotImplementedError

    def adapt(self, spec, entry_spec, params, device=DEFAULT_DEVICE):
        """Parameters tuned for ``entry_spec`` carried over to ``spec``, or None.

        The entry's own size takes them as they are (an optional parameter it
        lacks means the family's default); another size gets :meth:`carry`'s.
        """
        if spec == entry_spec.with_batch(spec.batch):
            if self.context(spec, params, device) is None:
                return None
            return {**self.optional, **params}
        return self.carry(spec, entry_spec, params, device)

    def carry(self, spec, entry_spec, params, device):
        raise NotImplementedError

    def first_valid(self, spec, params, device, shrink="per_block"):
        """``params``, or with ``shrink`` lowered until they fit; None if never."""
        p = dict(params)
        while p[shrink] >= 1:
            if self.context(spec, p, device) is not None:
                return p
            p[shrink] -= 1
        return None


class KernelExecutor(Executor):
    """One compiled kernel of a :class:`Choice` and its launch geometry.

    The kernel compiles on first use on each device (this one at construction,
    to read its registers and local memory). A context with ``prefetch`` set
    overlaps one group's loads with the previous group's work, which needs blocks
    that loop over several groups: its grid is capped at the blocks resident at
    once (``max_blocks``).
    """

    def __init__(self, choice, device, specialized=True):
        ctx = choice.ctx
        self.choice, self.template, self.ctx = choice, choice.template, ctx
        self.kernel, self.source, self.table = choice.entry, choice.source, choice.table
        self.specialized = specialized
        self.params = choice.family.public(ctx)
        self.threads, self.smem = ctx["threads"], ctx["smem_bytes"]
        self.per_block = ctx["per_block"]
        self.np_dtype = np.dtype(ctx["dtype"])
        self._fns = {}                       # device id -> compiled kernel
        self._geoms = {}                     # (items, groups) -> (groups, items as int64)
        self._launchers = {}                 # (device, items, grid cap) -> Launcher or None
        attrs = self._kernel_here().attributes
        self.local_bytes = attrs.get("local_size_bytes", 0)
        self.params.update(registers=attrs.get("num_regs"), local_bytes=self.local_bytes)
        self.max_blocks = None
        if ctx.get("prefetch"):
            self.max_blocks = device["sms"] * RT.resident_blocks(self._kernel_here(),
                                                                 self.threads, self.smem)

    def _kernel_here(self):
        """The kernel for the current device (compiled there on first use)."""
        dev = RT.current_device_id()
        fn = self._fns.get(dev)
        if fn is None:
            fn = self._fns[dev] = RT.get_kernel(self.template, self.kernel, self.ctx, self.smem)
        return fn

    def _direct(self, fmt, nitems):
        """This kernel's :class:`.runtime.Launcher` over ``nitems`` items on the current
        device (built on first use), or None: launch through ``RawKernel`` (``_launch``)."""
        key = (RT.current_device_id(), nitems, self.max_blocks)
        d = self._launchers.get(key, False)
        if d is False:
            d = self._launchers[key] = RT.direct_launcher(
                self._kernel_here(), fmt, math.ceil(nitems / self.per_block), self.threads,
                self.smem, self.max_blocks)
        return d

    def _run_arrays(self, nitems, arrays):
        """Launch over ``nitems`` items with the kernel's array parameters ``arrays``
        (then the item count): through the driver where it can, else RawKernel."""
        d = self._direct("P" * len(arrays) + "q", nitems)
        if d is None:
            self._launch(nitems, arrays)
        else:
            d(*[a.data.ptr for a in arrays], nitems)

    def _launch(self, nitems, args, ngroups=None):
        geom = self._geoms.get((nitems, ngroups))
        if geom is None:                     # once per batch count: ceil, int64 box
            geom = self._geoms[(nitems, ngroups)] = (
                math.ceil(nitems / self.per_block) if ngroups is None else ngroups,
                np.int64(nitems))
        RT.launch(self._kernel_here(), geom[0], self.threads, args + (geom[1],),
                  self.smem, max_blocks=self.max_blocks)

    def _scal(self, v):
        return self.np_dtype.type(v)
