"""The CUDA backend: size-specialised Jinja2 kernels compiled through CuPy (NVRTC).

Walk from a spec to its kernel: :meth:`CudaBackend.build` asks the kernel
families in :data:`FAMILIES` which one claims the spec; :func:`choose` takes
that family's parameters (a tuning table's, else its measured heuristic) and
its rendering context; the family's executor compiles the kernel on the
current device and launches it on the current CuPy stream.

===============  ===============================  =========================================
family           module                           templates
===============  ===============================  =========================================
``layout``       :mod:`.layout`                   ``gemm.cu.j2`` (GEMM, kernels 8a/8b),
                                                  ``generic.cu.j2`` (run-time sizes)
``contract9``    :mod:`.contract9`                ``contract9.cu.j2`` (kernel 9)
``action``       :mod:`.action`                   ``action.cu.j2``, ``action_rb.cu.j2``,
                                                  ``action_line.cu.j2``
``assembly``     :mod:`.assembly`                 ``assembly.cu.j2`` (mass, diffusion, Helmholtz)
``mass_apply``   :mod:`.mass_apply`               the action templates with ``gather``: the
                                                  fused FEM operator (map, action, scatter)
``mass_diagonal``  :mod:`.mass_apply`             ``mass_diagonal.cu.j2`` (Jacobi)
``basis``        :mod:`.basis`                    ``basis.cu.j2`` (``smalltc.interpolate``,
                                                  ``smalltc.integrate``)
``geometry``     :mod:`.geometry`                 ``geometry.cu.j2`` (``smalltc.geometry_data``)
solver kernels   :mod:`.solver`                   ``pmg_vector.cu.j2``, ``cg.cu.j2``,
                                                  ``pmg_transfer.cu.j2``, ``csr_spmv.cu.j2``,
                                                  ``schwarz_fdm.cu.j2`` (:mod:`smalltc.solver`)
===============  ===============================  =========================================

What no family fits runs a generic path and says so (``specialized=False``):
the generic layout kernel for a GEMM or contraction, the pairwise steps on
this backend's kernels for an action or assembly. :mod:`.runtime` renders,
compiles, caches and launches. Importing this package touches no device.

Examples
--------
>>> from smalltc.backends.cuda import choose, family_of
>>> from smalltc.spec import ActionSpec
>>> spec = ActionSpec(dim=3, nq=7, nd=6, batch=1000, dtype="float64")
>>> family_of(spec).name
'action'
>>> c = choose(spec, dict(name=None, cc="0", sms=132, smem_optin=232448))
>>> c.template, c.entry, c.source
('action_line.cu.j2', 'stc_mass_action_3d_f64_nd6nq7c1_line', 'heuristic')
"""
from __future__ import annotations

from ... import tables
from ...pairwise import PairwiseExecutor
from ..._arrays import gpu_available
from .. import register
from ..base import Backend, Executor, Unsupported
from ..family import Kernels
from ..reference import einsum_executor
from . import runtime as RT
from .action import ACTION, qfunc_of
from .assembly import ASSEMBLY
from .basis import BASIS, MAX_EXTENT as BASIS_MAX_EXTENT
from .contract9 import CONTRACT9
from .force import FORCE
from .geometry import GEOMETRY
from .layout import LAYOUT, generic_executor
from .mass_apply import MASS_APPLY, MASS_DIAGONAL
from .runtime import SmalltcCompileError
from .solver import SOLVER_FAMILIES

__all__ = ["CudaBackend", "SmalltcCompileError", "FAMILIES", "KERNELS", "family_of", "choose"]

#: the kernel families, in the order they are asked
FAMILIES = (LAYOUT, CONTRACT9, FORCE, ACTION, ASSEMBLY, MASS_APPLY, MASS_DIAGONAL, BASIS,
            GEOMETRY) + SOLVER_FAMILIES


class CudaKernels(Kernels):
    """The CUDA backend's choice (:class:`smalltc.backends.family.Kernels`): on a device
    dict (:func:`.runtime.device_info`), the device's tuning tables."""

    name = "cuda"

    def lookup(self, fam, spec, device):
        # the operator family's instances (mass, diffusion, helmholtz, collocated) and the
        # corner force each have their own keys (``diffusion/action/3d/nd5nq6c1``,
        # ``force/mass_apply/2d/nd6nq10c2``); a family's carry keeps to one instance, so a
        # mass entry never answers for a diffusion spec or the reverse
        if qfunc_of(spec) == ("mass", False) or fam in (ACTION, ASSEMBLY, MASS_APPLY, FORCE,
                                                        BASIS):
            return tables.lookup(spec, fam, f"sm{device['cc']}", device.get("name"))
        return None


KERNELS = CudaKernels(FAMILIES)
#: the family whose specialised kernel runs a spec, or None (only a generic path)
family_of = KERNELS.family_of
#: ``choose(spec, device, params=None)``: what :meth:`CudaBackend.build` builds for
#: ``spec`` on ``device`` (a :func:`.runtime.device_info` dict), decided without
#: compiling: a :class:`.family.Choice`, or None when only a generic path runs it
#: (:meth:`smalltc.backends.family.Kernels.choose`)
choose = KERNELS.choose


class _PairwiseFallback(Executor):
    """The generic path of the action/assembly: the pairwise steps on this backend's kernels."""

    def __init__(self, backend, spec, why):
        self._inner = PairwiseExecutor(backend, spec)
        self.kernel = f"{self._inner.kernel} (no fused kernel: {why})"
        self.params, self.specialized, self.source = {}, False, "generic"

    def run(self, operands, out, **scalars):
        self._inner.run(operands, out, **scalars)


class CudaBackend(Backend):
    """NVIDIA GPUs through CuPy: fused action and assembly, layout-reading GEMM."""

    name = "cuda"
    array_modules = ("cupy",)
    priority = 10

    def available(self) -> bool:
        return gpu_available()

    def describe(self) -> str:
        if not gpu_available():
            return "cuda: no CUDA device (CuPy device query failed)"
        dev, info = RT.current_device()
        return f"cuda: device {dev} {info['name']} (sm_{info['cc']}, {info['sms']} SMs)"

    def build(self, spec, params=None) -> Executor:
        _, device = RT.current_device()
        choice = choose(spec, device, params)
        if choice is not None:
            return choice.family.executor(choice, device)
        if spec.op in ("gemm", "contract"):
            return generic_executor(spec, device)
        if getattr(spec, "qfunc", "mass") != "mass" or getattr(spec, "qdtype", None) \
                or getattr(spec, "geometry", None):     # an instance without a kernel here
            ex = einsum_executor(spec, "cuda")
            if spec.op == "assembly" and family_of(spec) is not None:   # a stiffness size
                ex.kernel = ex.kernel.replace("no cuda kernel for this instance",
                                              "no fused kernel: a unit does not fit in "
                                              "shared memory")
            elif spec.op == "basis":       # the basis family claims every size it can hold
                ex.kernel = ex.kernel.replace("no cuda kernel for this instance",
                                              "no basis kernel for this size: an item does "
                                              "not fit in shared memory or nd, nq above "
                                              f"{BASIS_MAX_EXTENT}")
            return ex
        if spec.op in ("action", "assembly"):
            return _PairwiseFallback(self, spec, "an element does not fit in shared memory"
                                     if spec.op == "action" else
                                     "a unit does not fit in shared memory")
        raise Unsupported(f"cuda backend has no kernel for {spec}")


register(CudaBackend())
