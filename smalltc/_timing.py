"""Timing functions shared by ``smalltc bench`` (and the demo), the tuner and the FEM
layer's phase timings.

docs/math.md section 5: warm-up first, then each call timed on its own, with CUDA
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

import math
import statistics
import time

__all__ = ["synchronize", "time_calls", "graph_times", "time_once", "median"]


def synchronize(on_gpu: bool) -> None:
    """Wait for all GPU work (a no-op on the host)."""
    if on_gpu:
        import cupy
        cupy.cuda.runtime.deviceSynchronize()


def time_calls(fn, *, repeats: int = 20, warmup: int = 2, on_gpu: bool = False,
               min_region_s: float = 1e-3, max_inner: int = 10, between=None) -> list:
    """Run ``fn()`` ``warmup`` times untimed, then ``repeats`` samples timed.

    Returns
    -------
    list of int
        Nanoseconds per call, one entry per sample. On the host each sample
        is one call timed with ``perf_counter_ns``. On a GPU a sample is
        ``inner`` back-to-back calls between two CUDA events on the current
        stream, divided by ``inner``: ``inner`` (1 to ``max_inner``) is chosen
        from one warm call so that a sample lasts about ``min_region_s``, so
        short kernels are timed as a stream of calls (the device's time, not
        the gap while the host prepares a lone launch). A call whose host
        work outlasts its kernel still shows that cost. ``between`` (host only):
        called untimed before each sample, e.g. :func:`smalltc.bench.runner.blas_call`,
        the realistic case of a program that calls NumPy between smalltc's calls.
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
        start.record()
        fn()
        end.record()
        end.synchronize()
        one = cupy.cuda.get_elapsed_time(start, end) * 1e-3
        inner = int(min(max_inner, max(1, math.ceil(min_region_s / max(one, 1e-9)))))
        for _ in range(repeats):
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(int(round(cupy.cuda.get_elapsed_time(start, end) * 1e6 / inner)))
    else:
        for _ in range(repeats):
            if between is not None:
                between()
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
    return times


def graph_times(fn, *, repeats: int = 20, warmup: int = 3, calls: int = 50, cp=None) -> list:
    """Nanoseconds per call of ``fn`` on the device alone: ``fn`` is captured ``calls``
    times into a CUDA graph on a non-blocking stream, and each of ``repeats`` samples is
    one replay between two CUDA events, divided by ``calls`` (after ``warmup`` replays).
    For calls whose host launch cost hides the device time (``time_calls`` then times
    the host). ``cp``: the CuPy module (default: imported). Raises where capture fails.
    """
    if cp is None:
        import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn()
        s.synchronize()
        s.begin_capture()
        for _ in range(calls):
            fn()
        g = s.end_capture()
        for _ in range(warmup):
            g.launch(s)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        out = []
        for _ in range(repeats):
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            out.append(int(cp.cuda.get_elapsed_time(e0, e1) * 1e6 / calls))
    return out


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
