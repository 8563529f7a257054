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
"""
from __future__ import annotations

import math
import traceback

import numpy as np

from .. import roofline
from .._timing import median, time_calls, time_once
from .baselines import baselines as make_baselines
from .cases import batched_flags, footprint, make_inputs, reference, smalltc_impl

__all__ = ["TOLERANCE", "run_case", "check", "blas_call"]

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
    reference of batch entries ``idx``)."""
    finite = bool(xp.isfinite(res).all())
    part = res if len(idx) == res.shape[0] else res[xp.asarray(idx)]
    got = _to_host(part).astype(np.float64)
    nref = np.linalg.norm(ref)
    err = float(np.linalg.norm(got - ref) / (nref if nref > 0 else 1.0))
    return finite, err


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
