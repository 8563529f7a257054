"""Where candidates run on the CPU: ``smalltc tune --device cpu``.

:class:`CpuDevice` answers the search's calls (:mod:`.measure` describes them)
for the CPU backend's kernel families (:mod:`smalltc.backends.cpu`) on the
target Numba compiles for (:func:`smalltc.backends.cpu.target.host`: the ISA
decides the table, ``cpu-avx512-float64.json``). Compiling is
:func:`.compile.compile_cpu`: a worker process builds the candidate through the backend,
which leaves the compiled kernel in Numba's disk cache, where the parent then
loads it in milliseconds. Timing: ``perf_counter_ns`` around each call, after a
warm-up, on operands of ``footprint`` bytes (default 256 MiB, beyond any L2),
with the output buffer given (no allocation in the timed call). Forms: the
timed batch and twice it (a GPU's ``small`` and ``inplace`` forms are about
launches and graphs; a CPU call has neither).

Examples
--------
>>> from smalltc.backends.cpu.target import host
>>> CpuDevice("float64").info()["arch"] == host().arch
True
"""
from __future__ import annotations

import math
import os

import numba
import numpy as np

from smalltc import _timing, roofline
from smalltc.backends import get
from smalltc.backends.cpu import family_of
from smalltc.backends.cpu.target import host

from .measure import FOOTPRINT, _Built, _Device, _is_index, _reference, _seen, box_map, \
    rel_err

__all__ = ["CpuDevice"]


class CpuDevice(_Device):
    """This machine's CPU through the CPU backend (NumPy arrays)."""

    dry_run = False
    compiler = "cpu"
    family_of = staticmethod(family_of)
    _xp = np
    _host = staticmethod(np.asarray)

    def __init__(self, dtype, repeats=20, warmup=3, footprint=FOOTPRINT):
        self.backend = get("cpu")
        self.dtype, self.repeats, self.warmup, self.footprint = dtype, repeats, warmup, footprint
        self.target = host()
        self._bw = self._peak = None

    def info(self) -> dict:
        if self._bw is None:
            self._bw = roofline.bandwidth("cpu")
            self._peak = roofline.peak(self.dtype, "cpu")
        t = self.target
        return dict(name=roofline.device_name("cpu"), cc=None, arch=t.arch, isa=t.isa,
                    llvm_cpu=t.llvm_cpu, vector_bytes=t.vector_bytes,
                    vector_bits=t.vector_bits, cores=os.cpu_count(),
                    threads=numba.get_num_threads(), numba=numba.__version__,
                    bandwidth=self._bw, peak=self._peak, smem_optin=None)

    def forms(self, spec):
        return ("separate", "double")

    def _operands(self, spec, seed=1000):
        rng = np.random.default_rng(seed)
        return [box_map(spec) if _is_index(o) else
                (rng.random(o.shape) + 0.5 if o.positive else rng.random(o.shape) - 0.5)
                .astype(o.dtype or spec.dtype) for o in spec.inputs]

    def build(self, spec, params):
        big = self._build(spec, params)
        return _Built(big, big, params)          # a CPU executor serves any batch count

    def verify_big(self, problem, ex) -> float:
        problem.out.fill(math.nan)
        self._run(ex.big, problem.spec, problem.big, problem.out)
        if problem.spec.op == "mass_apply":      # every DoF sums several elements: all of it
            if problem.big_ref is None:
                problem.big_ref = _reference(problem.spec, _seen(problem.spec, problem.big))
            return rel_err(problem.out, problem.big_ref)
        idx = problem.samples
        spec = problem.spec.with_batch(len(idx))
        host64 = [(a[idx] if o.batched else a).astype(np.float64)
                  for o, a in zip(problem.spec.inputs, problem.big)]
        return rel_err(problem.out[idx], _reference(spec, host64))

    def time(self, problem, ex, form="separate") -> list:
        spec, ops, out = problem.spec, problem.big, problem.out
        if form == "double":
            spec = spec.with_batch(2 * spec.batch)
            if problem.double is None:
                problem.double = (self._operands(spec, seed=2000),
                                  np.empty(spec.out_shape, dtype=spec.dtype))
            ops, out = problem.double
        elif form != "separate":
            raise ValueError(f"unknown CPU timing form {form!r}")
        return _timing.time_calls(lambda: self._run(ex.big, spec, ops, out), repeats=self.repeats,
                          warmup=self.warmup)

