"""Size guards: a result or workspace larger than its device's free memory is refused.

Before smalltc allocates a result (a plan called without ``out=``) or a workspace of at
least :data:`MIN_BYTES`, :func:`guard` compares its size with the memory free on its
device: on the host ``MemAvailable`` of ``/proc/meminfo`` (elsewhere the available
physical pages, ``os.sysconf``), on a GPU ``cudaMemGetInfo``'s free bytes plus what
CuPy's memory pool holds unused. More than that raises ``MemoryError`` naming the
operation, the shape and the bytes, before anything is allocated (``assemble_mass`` at
p = 30 with two elements asked for 14 GB and ran for minutes); more than
:data:`WARN_FRACTION` of it warns (``ResourceWarning``). Smaller buffers are not checked
(reading the free memory costs microseconds).

Examples
--------
>>> import numpy as np
>>> guard("assemble_mass", (2, 29791, 29791), np.float64, free=8 * 2**30)
Traceback (most recent call last):
...
MemoryError: assemble_mass: the result of shape (2, 29791, 29791) (float64) needs 14,200,058,896 bytes (13.2 GiB), more than the 8,589,934,592 bytes (8.0 GiB) free on the host
>>> guard("mass_apply", (1000,), np.float64)             # small: not checked
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np

__all__ = ["guard", "free_bytes", "MIN_BYTES", "WARN_FRACTION"]

#: buffers from this size on are checked
MIN_BYTES = 64 * 2 ** 20
#: a buffer above this fraction of the free memory warns
WARN_FRACTION = 0.5


def free_bytes(on_gpu: bool = False) -> int | None:
    """Bytes free for a new buffer on the host or the current GPU (None: unknown)."""
    if on_gpu:
        try:
            import cupy
            free = cupy.cuda.runtime.memGetInfo()[0]
            return int(free + cupy.get_default_memory_pool().free_bytes())
        except Exception:                          # pragma: no cover - no GPU here
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return None


def _human(n):
    return f"{n:,} bytes ({n / 2 ** 30:.1f} GiB)" if n >= 2 ** 30 else \
        f"{n:,} bytes ({n / 2 ** 20:.1f} MiB)"


def guard(op: str, shape, dtype, *, on_gpu: bool = False, what: str = "result",
          free: int | None = None) -> None:
    """Raise ``MemoryError`` when a buffer of ``shape`` and ``dtype`` exceeds the free
    memory of its device (``free``: that amount instead of asking), warn above
    :data:`WARN_FRACTION` of it; buffers under :data:`MIN_BYTES` pass unchecked."""
    nbytes = math.prod(int(s) for s in shape) * np.dtype(dtype).itemsize
    if nbytes < MIN_BYTES:
        return
    if free is None:
        free = free_bytes(on_gpu)
    if free is None:
        return
    where = "the GPU" if on_gpu else "the host"
    desc = (f"{op}: the {what} of shape {tuple(int(s) for s in shape)} "
            f"({np.dtype(dtype).name}) needs {_human(nbytes)}")
    if nbytes > free:
        raise MemoryError(f"{desc}, more than the {_human(free)} free on {where}")
    if nbytes > WARN_FRACTION * free:
        warnings.warn(f"{desc}, {100 * nbytes / free:.0f}% of the {_human(free)} free on "
                      f"{where}", ResourceWarning, stacklevel=3)
