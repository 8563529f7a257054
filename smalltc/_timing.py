"""Timing helpers shared by the roofline probes, ``smalltc bench`` and the demo.

SPEC section 5: warm-up first, then each call timed on its own, with CUDA
events around the call on a GPU (CuPy arrays) and ``perf_counter_ns`` on the
host; the median of the repeats is the figure reported.

Examples
--------
>>> import numpy as np
>>> x = np.ones(1000)
>>> t = time_calls(lambda: x.sum(), repeats=3, warmup=1)
>>> len(t), all(v > 0 for v in t)
(3, True)
"""
from __future__ import annotations

import statistics
import time

__all__ = ["synchronize", "time_calls", "time_once", "median"]


def synchronize(on_gpu: bool) -> None:
    """Wait for all GPU work (a no-op on the host)."""
    if on_gpu:
        import cupy
        cupy.cuda.runtime.deviceSynchronize()


def time_calls(fn, *, repeats: int = 20, warmup: int = 2, on_gpu: bool = False) -> list:
    """Run ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed.

    Returns
    -------
    list of int
        Nanoseconds per call. On a GPU each call sits between two CUDA events
        recorded on the current stream (the time the device spent, without
        launch gaps before the first event); on the host ``perf_counter_ns``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    synchronize(on_gpu)
    times = []
    if on_gpu:
        import cupy
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        for _ in range(repeats):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(int(round(cupy.cuda.get_elapsed_time(start, end) * 1e6)))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
    return times


def time_once(fn, *, on_gpu: bool = False):
    """``(result, seconds)`` of one call, synchronised (wall clock, host side).

    Used for first-call (plan + compile) times, which include host work.
    """
    synchronize(on_gpu)
    t0 = time.perf_counter_ns()
    res = fn()
    synchronize(on_gpu)
    return res, (time.perf_counter_ns() - t0) * 1e-9


def median(times_ns) -> float:
    """Median of nanosecond times, in seconds."""
    return statistics.median(times_ns) * 1e-9
