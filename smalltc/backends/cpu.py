"""The CPU backend: size-specialised Numba kernels generated from templates.

Every spec becomes one kernel rendered from ``templates/cpu/`` (see
:mod:`smalltc.backends._cpu_codegen`): the action, the assembly and small
GEMMs vectorise across elements or across a row of the product, every size
a constant; the batch is split statically over ``numba.get_num_threads()``
threads (``SMALLTC_NUM_THREADS`` sets it at import, :func:`set_num_threads`
later). Sizes without a specialised kernel run a generic kernel with
run-time sizes, and the plan reports ``specialized=False``.

Examples
--------
>>> import numpy as np, smalltc
>>> B1d = np.random.rand(3, 2); D = np.random.rand(20, 3, 3); V = np.random.rand(20, 2, 2)
>>> p = smalltc.plan("action", B1d, D, V, backend="cpu")
>>> p.kernel, p.specialized
('stc_mass_apply_2d_f64_nd2_nq3', True)
>>> bool(np.allclose(p(B1d, D, V), smalltc.batched_contract(B1d, D, V, backend="reference")))
True
"""
from __future__ import annotations

import os

from ..spec import SPEC_TYPES
from . import register
from ._cpu_kernels import KERNEL_BUILDERS
from .base import Backend, Unsupported

__all__ = ["CpuBackend", "set_num_threads"]

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency
    numba = None


def set_num_threads(n: int):
    """Threads the CPU kernels use from now on (at most the cores Numba saw)."""
    numba.set_num_threads(int(n))


class CpuBackend(Backend):
    name = "cpu"
    array_modules = ("numpy",)
    priority = 10

    def available(self) -> bool:
        return numba is not None

    def describe(self) -> str:
        if numba is None:
            return "cpu: numba is not installed"
        import llvmlite.binding as ll
        return (f"cpu: Numba {numba.__version__}, LLVM target {ll.get_host_cpu_name()}, "
                f"{numba.get_num_threads()} threads")

    def build(self, spec, params=None):
        if params not in (None, "heuristic"):
            raise ValueError(f"the cpu backend has no tuning parameters yet; got params "
                             f"{params}")
        builder = _BUILDERS.get(spec.op)
        if builder is None:
            raise Unsupported(f"cpu backend has no kernel for {spec}")
        return builder(spec)


if numba is not None and os.environ.get("SMALLTC_NUM_THREADS"):
    set_num_threads(int(os.environ["SMALLTC_NUM_THREADS"]))

#: op -> the executor builder of its specs
_BUILDERS = {kind.op: builder for kind, builder in KERNEL_BUILDERS}
assert set(_BUILDERS) <= set(SPEC_TYPES)

register(CpuBackend())
