"""Run one case: build each implementation, check it, then time it (docs/math.md section 5).

For every implementation (smalltc first, then the baselines): poison its
output buffer with NaN, run it once, require a finite result everywhere and
``||out - ref|| / ||ref||`` within tolerance on a sample of the batch (the
float64 NumPy reference is computed for the sampled elements only: elements
are independent, and a full reference of a 2^25-DoF GPU problem would cost
more than the whole run). A failed check is recorded (``status: "failed"``)
and not timed. Then warm-up and ``repeats`` timed calls; the median is the
figure reported. On the host, ``repeats`` more calls each after a NumPy matrix
product (:func:`blas_call`: the realistic case, where the BLAS's
threads are still spinning when smalltc's kernels start) give
``after_blas_median_s`` and ``after_blas_fraction`` (the table's ``%aBLAS``).

The suites with their own cases and implementations (:mod:`.basis`, :mod:`.geometry`,
:mod:`.bp1`, :mod:`.force`, :mod:`.solve`) build their records with this module's
helpers: :func:`case_record`, :func:`recorded`, :func:`measure` and :func:`ok_record`.
"""
from __future__ import annotations

import math
import traceback

import numpy as np

from .. import roofline
from .._timing import median, time_calls, time_once
from .baselines import baselines as make_baselines
from .cases import batched_flags, footprint, make_inputs, reference, smalltc_impl

__all__ = ["TOLERANCE", "run_case", "check", "blas_call", "case_record", "recorded",
           "measure", "ok_record"]

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
SAMPLE = 256          # batch entries checked against the reference

_BLAS_A = np.random.default_rng(0).random((128, 128))


def blas_call():
    """A NumPy call through BLAS (a 128 x 128 float64 matrix product: multithreaded in
    OpenBLAS), what a program does between smalltc's calls; its BLAS threads, spinning
    afterwards, are what :mod:`smalltc.backends.cpu.threads` guards against."""
    return _BLAS_A @ _BLAS_A


def _sample_indices(batch, n=SAMPLE, seed=1):
    if batch <= n:
        return np.arange(batch)
    rng = np.random.default_rng(seed)
    idx = rng.choice(batch, n - 2, replace=False)
    return np.unique(np.concatenate([[0, batch - 1], idx]))


def _to_host(x):
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)


def check(res, ref, idx, xp) -> tuple:
    """``(ok_finite, rel_err)`` of result ``res`` against ``ref`` (the
    reference of batch entries ``idx``; None: of the whole result).

    Examples
    --------
    >>> res = np.array([1.0, 2.0, np.nan])
    >>> check(res, np.array([1.0, 2.0]), [0, 1], np)
    (False, 0.0)
    """
    finite = bool(xp.isfinite(res).all())
    part = res if idx is None or len(idx) == res.shape[0] else res[xp.asarray(idx)]
    got = _to_host(part).astype(np.float64)
    nref = np.linalg.norm(ref)
    err = float(np.linalg.norm(got - ref) / (nref if nref > 0 else 1.0))
    return finite, err


def case_record(case, **extra) -> dict:
    """The JSON record of ``case`` before it runs: its id, suite, op, dtype, sizes, batch
    and note, then ``extra`` (a key of the case's given again replaces it), then an empty
    ``impls``.

    Examples
    --------
    >>> from smalltc.bench.cases import Case
    >>> rec = case_record(Case("solve", "solve", dict(p=2, batch=8), "float64"), tol=1e-8)
    >>> list(rec)
    ['id', 'suite', 'op', 'dtype', 'sizes', 'batch', 'note', 'tol', 'impls']
    """
    return {"id": case.id, "suite": case.suite, "op": case.op, "dtype": case.dtype,
            "sizes": dict(case.sizes), "batch": case.batch, "note": case.note, **extra,
            "impls": {}}


class recorded:
    """``with recorded(rec, xp):`` a case (or an implementation of one) that cannot run is
    recorded and the suite goes on: an exception of the block is kept in ``rec``
    (``error``, its repr; ``trace``, its last 8 frames) and not raised; then, with CuPy
    arrays (``xp``), the memory pool's free blocks go back to the device.

    Examples
    --------
    >>> rec = {}
    >>> with recorded(rec, np):
    ...     raise ValueError("no such mesh")
    >>> rec["error"], "ValueError" in rec["trace"]
    ("ValueError('no such mesh')", True)
    """

    def __init__(self, rec, xp=np):
        self.rec, self.xp = rec, xp

    def __enter__(self):
        return self.rec

    def __exit__(self, kind, err, tb):
        if err is not None and not isinstance(err, Exception):
            return False                       # KeyboardInterrupt, SystemExit: not a case's
        if err is not None:
            self.rec["error"] = repr(err)
            self.rec["trace"] = "".join(traceback.format_exception(kind, err, tb, limit=-8))
        if self.xp.__name__ == "cupy":
            self.xp.get_default_memory_pool().free_all_blocks()
        return True


def ok_record(b, times, what, **extra) -> dict:
    """The record of an implementation timed ``times`` (ns, one a sample) against the
    bound ``b``: the median and the fastest sample, the fraction of the bound, DoFs, bytes
    and flops per second, then ``extra``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> b = SimpleNamespace(tmin=1e-3, dofs=10 ** 6, bytes=10 ** 9, flops=2 * 10 ** 9)
    >>> r = ok_record(b, [2_000_000, 4_000_000, 3_000_000], "an apply", kernel="k")
    >>> r["median_s"], r["min_s"], r["fraction"], r["dofs_per_s"], r["kernel"]
    (0.003, 0.002, 0.3333333333333333, 333333333.3333333, 'k')
    """
    t = median(times)
    return dict(what=what, status="ok", repeats=len(times), times_ns=times, median_s=t,
                min_s=min(times) * 1e-9, fraction=b.tmin / t, dofs_per_s=b.dofs / t,
                gbytes_per_s=b.bytes / t * 1e-9, gflops=b.flops / t * 1e-9, **extra)


def measure(rec, impls, check_result, *, bound, tol, outs, on_gpu, repeats, warmup):
    """Check, then time, each implementation of a suite's case into ``rec["impls"]``.

    ``impls``: ``(label, backend, call, what)`` each, ``backend`` None for a baseline (the
    user's code: timed ``max(3, repeats // 4)`` times). The buffers ``outs`` are filled with
    NaN before each first call (``poisoned``: the result is ``outs[0]``), which is timed
    (``first_call_s``). ``check_result(res, backend)`` -> ``(finite, rel_err, extra)``:
    whether every entry of the first result is finite, its relative error, and more fields
    of the record (the plan's; more relative errors, ``*_rel_err``, held to ``tol`` too).
    A result outside ``tol`` is recorded as failed and not timed; an implementation that
    raises, as an error (:class:`recorded`)."""
    for label, be, call, what in impls:
        r = rec["impls"][label] = dict(status="error")
        with recorded(r):
            for out in outs:
                out.fill(math.nan)
            res, first = time_once(call, on_gpu=on_gpu)
            finite, err, extra = check_result(res, be)
            info = dict(rel_err=err, tolerance=tol, first_call_s=first,
                        poisoned=res is outs[0], **extra)
            del res
            err = max([err] + [v for k, v in extra.items() if k.endswith("_rel_err")])
            if not finite or not err <= tol:
                r.update(info, status="failed",
                         error="non-finite entries in the result (unwritten?)"
                         if not finite else f"relative error {err:.3e} > {tol:g}")
                continue
            times = time_calls(call, repeats=repeats if be else max(3, repeats // 4),
                               warmup=warmup, on_gpu=on_gpu)
            rec["impls"][label] = ok_record(bound, times, what, **info)


def run_case(case, bound_args, *, xp, backend="auto", method="auto", repeats=20, warmup=2,
             with_baselines=True) -> dict:
    """Measure ``case``; return its JSON record.

    ``bound_args`` are ``bandwidth``/``peak`` keywords for
    :func:`smalltc.roofline.bound` (measured once by the caller).
    """
    on_gpu = xp.__name__ == "cupy"
    rec = dict(id=case.id, suite=case.suite, op=case.op, dtype=case.dtype,
               sizes=dict(case.sizes), batch=case.batch, footprint_bytes=footprint(case),
               note=case.note, impls={})
    b = roofline.bound(case.op, case.roofline_sizes(), case.dtype, **bound_args)
    rec["bound"] = b.as_dict()
    try:
        ops = make_inputs(case, xp)
        idx = _sample_indices(case.batch)
        host = [(_to_host(o[xp.asarray(idx)]) if batched else _to_host(o)).astype(np.float64)
                for o, batched in zip(ops, batched_flags(case))]
        ref = reference(case, host)
    except Exception as err:
        rec["error"] = f"inputs/reference: {err!r}"
        return rec
    builders = [lambda: [smalltc_impl(case, ops, xp, backend, method)]]
    if with_baselines:
        builders.append(lambda: make_baselines(case, ops, xp))
    tol = TOLERANCE[case.dtype]
    for build in builders:
        try:
            impls = build()
        except Exception as err:
            name = "smalltc" if len(rec["impls"]) == 0 else "baselines"
            rec["impls"][name] = dict(status="error", error=repr(err),
                                      trace=traceback.format_exc(limit=-8))
            continue
        for impl in impls:
            rec["impls"][impl.name] = _measure(impl, ref, idx, xp, b, tol, on_gpu, repeats,
                                               warmup)
            impl.out = impl.fn = impl.prepare = None     # free buffers before the next one
    del ops
    if on_gpu:
        xp.get_default_memory_pool().free_all_blocks()
    return rec


def _measure(impl, ref, idx, xp, b, tol, on_gpu, repeats, warmup) -> dict:
    r = dict(what=impl.what, status="error", **impl.info)
    if impl.first_call_s is not None:
        r["first_call_s"] = impl.first_call_s
    try:
        if impl.prepare is not None:
            impl.prepare()
        poisoned = impl.out is not None
        if poisoned:
            impl.out.fill(math.nan)
        res, first = time_once(impl.fn, on_gpu=on_gpu)
        if impl.first_call_s is None:        # a baseline's first call (smalltc's: plan too)
            r["first_call_s"] = first
        if impl.to_array is not None:
            res = impl.to_array(res)
        finite, err = check(res, ref, idx, xp)
        r.update(rel_err=err, finite=finite, poisoned=poisoned, tolerance=tol)
        del res
        if not finite or not err <= tol:
            r["status"] = "failed"
            r["error"] = ("non-finite entries in the result (unwritten?)" if not finite
                          else f"relative error {err:.3e} > {tol:g}")
            return r
        times = time_calls(impl.fn, repeats=repeats, warmup=warmup, on_gpu=on_gpu)
        after = None if on_gpu else time_calls(impl.fn, repeats=repeats, warmup=0,
                                               between=blas_call)
    except Exception as err:
        r["error"] = repr(err)
        r["trace"] = traceback.format_exc(limit=-8)
        return r
    t = median(times)
    r.update(status="ok", repeats=len(times), times_ns=times, median_s=t,
             min_s=min(times) * 1e-9, gflops=b.flops / t * 1e-9, fraction=b.tmin / t,
             gbytes_per_s=b.bytes / t * 1e-9)
    if b.dofs:
        r["dofs_per_s"] = b.dofs / t
    if after is not None:            # host: each call after a NumPy matrix product (BLAS)
        ta = median(after)
        r.update(after_blas_times_ns=after, after_blas_median_s=ta,
                 after_blas_fraction=b.tmin / ta)
    return r
