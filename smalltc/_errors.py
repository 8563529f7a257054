"""Errors the kernels find while they run: the element-to-DoF map's bounds check.

Every kernel that reads an element-to-DoF map checks each index it reads
against ``[0, ndofs)``; an index outside reads and writes nothing outside the
vectors (on a GPU the thread clamps it into the range, so no address outside them is
formed) and sets an error flag. The call then raises the ``ValueError`` of the host's
first check (:func:`smalltc.maps.out_of_range`: ``elem_dofs``, the index, the
range), so a map changed in place after its first use never crashes the
process, corrupts its heap, or ends a CUDA context.

Where the flag is read:

* CPU: the flag is an argument of the kernel; the executor raises when the
  kernel returns (the call itself raises).
* GPU: one flag per device, three ``int64`` words ``(set, index, ndofs)`` in
  mapped pinned host memory (``cudaHostAlloc``, portable and mapped: with
  unified addressing the kernel writes it through the host pointer), zeroed
  once. A thread keeps the largest entry it read in a register (a thread that read a
  bad entry skips its vector accesses through the map, or the entry is clamped into
  range) and, after its last group, if that entry is out of range and the flag is
  still clear, stores it and ``ndofs``, then the set word with a release store: no
  branch, store or synchronisation on the hot path (``templates/cuda/fem_io.cuh.j2``).
  The host reads the flag (a read of host memory, no synchronisation) at the
  next point where it reads device state: at the start of the next call that
  reads a map on that device (it reports the kernels that have finished), where
  :func:`smalltc.fem.cg` reads the iteration's state (every ``check_every``
  iterations on a GPU, every iteration on the host), and in
  :func:`check_errors`, which synchronises the device first: call it before
  trusting a GPU result computed from a map you changed. Raising clears the
  flag: the process and the CUDA context stay usable.

Examples
--------
>>> import smalltc
>>> smalltc.check_errors()            # nothing pending (and no GPU needed)
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

from .maps import out_of_range

__all__ = ["check_errors", "device_flag", "raise_pending", "record_map"]

_FLAGS: dict = {}              # device id -> (numpy view of the 3 words, host pointer)
_LAST: dict = {}               # device id -> (weakref to the last map launched, ndofs)
_LOCK = threading.Lock()
_HOST_ALLOC_PORTABLE, _HOST_ALLOC_MAPPED = 1, 2


def device_flag(device: int):
    """``(view, pointer)``: the flag of CUDA device ``device`` (made on first use), the
    pointer to pass to the kernels."""
    hit = _FLAGS.get(device)
    if hit is not None:
        return hit
    import cupy
    with _LOCK:
        hit = _FLAGS.get(device)
        if hit is None:
            with cupy.cuda.Device(device):
                ptr = cupy.cuda.runtime.hostAlloc(
                    24, _HOST_ALLOC_PORTABLE | _HOST_ALLOC_MAPPED)
            view = np.ctypeslib.as_array((ctypes.c_int64 * 3).from_address(ptr))
            view[:] = 0
            hit = _FLAGS[device] = (view, int(ptr))
    return hit


def record_map(device: int, elem_dofs, ndofs: int):
    """Remember the map a launch on ``device`` reads (for the message of a later report)."""
    try:
        _LAST[device] = (weakref.ref(elem_dofs), int(ndofs))
    except TypeError:                      # an array type without weak references
        _LAST[device] = (lambda: None, int(ndofs))


def raise_pending(device: int | None = None, elem_dofs=None):
    """Raise the ``ValueError`` of a bad map index a GPU kernel reported (without
    synchronising: the kernels that have finished), and clear the flag; ``elem_dofs``:
    the map of the call asking, used for the message when the report is about it."""
    devices = list(_FLAGS) if device is None else [device]
    for dev in devices:
        hit = _FLAGS.get(dev)
        if hit is None or not hit[0][0]:
            continue
        view = hit[0]
        index, ndofs = int(view[1]), int(view[2])
        view[:] = 0
        ref, last_n = _LAST.get(dev, (lambda: None, ndofs))
        m = ref()
        if m is None and elem_dofs is not None:
            m = elem_dofs
        if m is not None and last_n == ndofs:
            out_of_range(m, ndofs, index)
        raise ValueError(f"elem_dofs held index {index}, outside [0, {ndofs}) for "
                         f"ndofs={ndofs}, when a kernel on GPU {dev} read it")


def check_errors():
    """Raise any error a GPU kernel has reported: synchronises each device that holds a
    flag, then reads it (the CPU kernels raise at once, so on the host this does nothing).

    Raises
    ------
    ValueError
        A map index outside ``[0, ndofs)`` read by a kernel (a map changed in place
        after its first use), as :func:`smalltc.maps.check_range` words it.

    Examples
    --------
    >>> import smalltc
    >>> smalltc.check_errors()
    """
    if not _FLAGS:
        return
    import cupy
    for dev in list(_FLAGS):
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.deviceSynchronize()
        raise_pending(dev)
