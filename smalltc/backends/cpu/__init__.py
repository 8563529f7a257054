"""The CPU backend: size-specialised Numba kernels generated from templates.

Walk from a spec to its kernel: :meth:`CpuBackend.build` asks the kernel
families in :data:`FAMILIES` which one claims the spec; :func:`choose` takes
that family's parameters (the ISA's tuning table, else its measured
heuristic) and its rendering context for the target Numba compiles for
(:mod:`.target`: AVX-512, AVX2, NEON); the family's executor compiles the
rendered module (:mod:`.runtime`) and runs it, the work split statically over
``numba.get_num_threads()`` threads (``SMALLTC_NUM_THREADS`` sets it at
import, :func:`set_num_threads` later).

================  ======================  ==========================================
family            module                  templates (``templates/cpu/``)
================  ======================  ==========================================
``gemm``          :mod:`.gemm`            ``gemm.py.j2``
``action``        :mod:`.action`          ``action.py.j2``, ``_lanes.j2``
``assembly``      :mod:`.assembly`        ``assembly.py.j2``, ``_lanes.j2``
``contract``      :mod:`.contract`        ``contract.py.j2`` (8a, 8b, 9)
``mass_apply``    :mod:`.mass_apply`      ``mass_apply.py.j2`` (the fused FEM operator)
``mass_diagonal``  :mod:`.mass_apply`     ``mass_diagonal.py.j2``
``force``         :mod:`.force`           ``force.py.j2``, ``_lanes.j2`` (the corner force)
``basis``         :mod:`.basis`           ``basis.py.j2`` (interpolate, integrate)
``geometry``      :mod:`.geometry`        ``geometry.py.j2`` (``smalltc.geometry_data``)
solver kernels    :mod:`.solver`          ``pmg_transfer.py.j2``, ``schwarz_fdm.py.j2``
                                          (and Numba loops, array code: :mod:`smalltc.solver`)
================  ======================  ==========================================

What no family claims (sizes beyond the specialised kernels' limits) runs
``generic.py.j2`` with every size at run time and says so
(``specialized=False``, a log line); :mod:`.simd` holds the intrinsics the
templates call (block transposes, the vector-width request).

Examples
--------
>>> import numpy as np, smalltc
>>> B1d = np.random.rand(3, 2); D = np.random.rand(20, 3, 3); V = np.random.rand(20, 2, 2)
>>> p = smalltc.plan("action", B1d, D, V, backend="cpu")
>>> p.kernel, p.specialized
('stc_mass_action_2d_f64_nd2_nq3', True)
>>> bool(np.allclose(p(B1d, D, V), smalltc.batched_contract(B1d, D, V, backend="reference")))
True
"""
from __future__ import annotations

import os

from ... import tables
from .. import register
from ..base import Backend, Unsupported
from ..family import Kernels
from ..reference import einsum_executor

__all__ = ["CpuBackend", "set_num_threads", "FAMILIES", "KERNELS", "family_of", "choose"]

from .threads import passive_openmp

passive_openmp()      # before Numba's OpenMP starts: no spin-waiting workers (.threads)

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency
    numba = None

if numba is not None:
    from .action import ACTION
    from .assembly import ASSEMBLY
    from .basis import BASIS
    from .contract import CONTRACT, generic_executor
    from .force import FORCE
    from .gemm import GEMM
    from .geometry import GEOMETRY
    from .mass_apply import MASS_APPLY, MASS_DIAGONAL
    from .solver import SOLVER_FAMILIES
    from .target import host, resolve

    #: the kernel families, in the order they are asked
    FAMILIES = (GEMM, FORCE, ACTION, ASSEMBLY, CONTRACT, MASS_APPLY, MASS_DIAGONAL,
                BASIS, GEOMETRY) + SOLVER_FAMILIES
else:  # pragma: no cover
    FAMILIES = ()

    def resolve(where):
        return where


def set_num_threads(n: int):
    """Threads the CPU kernels use from now on (at most the cores Numba saw)."""
    numba.set_num_threads(int(n))


class CpuKernels(Kernels):
    """The CPU backend's choice (:class:`smalltc.backends.family.Kernels`): on a target
    (:func:`.target.resolve`: None is the host's), the ISA's tuning tables
    (``cpu-<isa>-<dtype>.json``), parameters the family names only; a kernel with
    run-time sizes reports the source "generic", one without parameters "fixed"."""

    name = "cpu"

    def resolve(self, where):
        return resolve(where)

    def lookup(self, fam, spec, target):
        """The first hit among the ISA's tables (``cpu-avx512-float64.json``) tuned for the
        same default vector width (a table tuned where LLVM prefers 256-bit vectors, an
        Intel AVX-512 core, does not answer for a 512-bit one, AMD Zen 4/5)."""
        if not fam.params:
            return None
        for t in tables.tables_for(target.arch, None, spec.dtype):
            if t.device.get("vector_bits", target.vector_bits) != target.vector_bits:
                continue
            hit = t.lookup(spec, fam)
            if hit is not None:
                return hit
        return None

    def accepts(self, fam, params):
        return not set(params) - set(fam.params)

    def misfit(self, fam, spec, params, target):
        names = ", ".join(fam.params) or "none"
        return (f"params {params} do not fit {spec} on the cpu backend ({fam.name} family, "
                f"{target.isa}; parameters: {names})")

    def source(self, fam, ctx, source):
        if not ctx.get("specialized", True):
            return "generic"
        return source if fam.params else "fixed"

    def target(self, where):
        return where


KERNELS = CpuKernels(FAMILIES)
#: the family whose specialised kernel runs a spec, or None (only a generic path)
family_of = KERNELS.family_of
#: ``choose(spec, target=None, params=None)``: what :meth:`CpuBackend.build` builds for
#: ``spec`` on ``target`` (default: the host's), decided without compiling: a
#: :class:`.family.Choice`, or None when only a generic path runs it
#: (:meth:`smalltc.backends.family.Kernels.choose`)
choose = KERNELS.choose


class CpuBackend(Backend):
    """NumPy arrays on the host: Numba kernels for the target's ISA."""

    name = "cpu"
    array_modules = ("numpy",)
    priority = 10

    def available(self) -> bool:
        return numba is not None

    def describe(self) -> str:
        if numba is None:
            return "cpu: numba is not installed"
        t = host()
        return (f"cpu: Numba {numba.__version__}, LLVM target {t.llvm_cpu} ({t.isa}, "
                f"{t.vector_bits or t.vector_bytes * 8}-bit vectors), "
                f"{numba.get_num_threads()} threads")

    def build(self, spec, params=None):
        choice = choose(spec, None, params)
        if choice is not None:
            return choice.family.executor(choice)
        if getattr(spec, "qfunc", "mass") != "mass" or getattr(spec, "collocated", False) \
                or getattr(spec, "qdtype", None) or getattr(spec, "geometry", None):
            return einsum_executor(spec, "cpu")      # an instance without a kernel here
        ex = generic_executor(spec)
        if ex is None:
            raise Unsupported(f"cpu backend has no kernel for {spec}")
        return ex


if numba is not None and os.environ.get("SMALLTC_NUM_THREADS"):
    set_num_threads(int(os.environ["SMALLTC_NUM_THREADS"]))

register(CpuBackend())
