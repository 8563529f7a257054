"""The pointwise geometry family: :func:`smalltc.geometry_data` in one kernel.

``geometry.cu.j2`` (:class:`smalltc.spec.GeometrySpec`): ``TPE`` threads an element (a
power of two up to a warp), ``per_block`` elements a block; each thread walks its
element's ``K = nq^dim`` points ``TPE`` apart (the lanes of a warp on consecutive points:
every read of ``J`` and the coefficient and every write coalesced), computes the adjugate
by the cofactor table (:func:`smalltc.backends.reference.cofactors`), ``|J|`` and what is
asked in double, and keeps its smallest ``|J|``; the ``TPE`` threads reduce it by warp
shuffles into ``jmin``. No shared memory. The kernel reads ``J`` once and writes each
output once: it is bandwidth-bound, so the heuristic aims at full warps on long runs
(``TPE`` the smallest power of two from ``min(K, 32)``, 256 threads a block).

==============================  =====================================================
spec                            entry point (example)
==============================  =====================================================
3D Q with a coefficient         ``stc_geometry_diffusion_3d_f64_nq6_c_t32``
2D D, float32 out, |det J|      ``stc_geometry_mass_2d_f32_nq4_abs_t16``
==============================  =====================================================

Tuning parameters ``tpe``, ``threads`` (a multiple of 32) and ``min_blocks`` (the launch bound); ``smalltc tune`` walks
:meth:`GeometryFamily.space`.

Examples
--------
>>> from smalltc.spec import GeometrySpec
>>> s = GeometrySpec(dim=2, nq=3, batch=100, dtype="float64", what="both")
>>> c = GEOMETRY.context(s)
>>> GEOMETRY.entry(s, c), c["tpe"], c["per_block"], c["threads"]
('stc_geometry_both_2d_f64_nq3_t16', 16, 16, 256)
"""
from __future__ import annotations

from ..reference import cofactors
from . import runtime as RT
from .family import DEFAULT_DEVICE, DT, MAX_THREADS, SM_THREADS, Family, KernelExecutor

__all__ = ["GEOMETRY", "GeometryFamily", "GeometryExecutor", "geometry_ctx"]

#: threads a block, the heuristic's
THREADS = 256
#: the heuristic's launch bound (blocks an SM): ptxas held the 3D diffusion kernel (nq = 4,
#: a coefficient, sm_90) at 99 registers without one (two 256-thread blocks an SM), 76
#: with 3 and no spill; 4 (64 registers) spilled 36 bytes
MIN_BLOCKS = 3
_WARP = 32


def geometry_ctx(spec, params=None, device=DEFAULT_DEVICE):
    """Context of ``geometry.cu.j2`` for a :class:`smalltc.spec.GeometrySpec`, or None
    when the parameters do not fit (``tpe`` a power of two up to 32, ``threads`` a
    multiple of 32 up to 1024).

    >>> from smalltc.spec import GeometrySpec
    >>> s = GeometrySpec(dim=3, nq=6, batch=1, dtype="float32", what="mass", coef=True)
    >>> c = geometry_ctx(s)
    >>> c["tpe"], c["per_block"], c["real"], c["jreal"]
    (32, 8, 'float', 'double')
    >>> geometry_ctx(s, dict(tpe=3, threads=96)) is None
    True
    """
    K = spec.nq ** spec.dim
    if params is None:
        tpe = 1
        while tpe < min(K, _WARP):
            tpe *= 2
        params = dict(tpe=tpe, threads=THREADS, min_blocks=MIN_BLOCKS)
    tpe, threads = params.get("tpe"), params.get("threads")
    mb = params.get("min_blocks", MIN_BLOCKS)
    if (set(params) - {"tpe", "threads", "min_blocks"} or not isinstance(tpe, int)
            or mb not in range(0, 9)
            or not isinstance(threads, int) or tpe < 1 or tpe > _WARP or tpe & (tpe - 1)
            or threads % _WARP or not _WARP <= threads <= MAX_THREADS):
        return None
    return dict(dtype=spec.dtype, real=RT.CTYPES[spec.dtype], jreal=RT.CTYPES[spec.jdtype],
                dim=spec.dim, K=K, what=spec.what, weighted=int(spec.weighted),
                coef=int(spec.coef), absdet=int(spec.absdet), nslots=spec.nslots,
                cof=cofactors(spec.dim), tpe=tpe, threads=threads,
                per_block=threads // tpe, smem_bytes=0, min_blocks=mb)


class GeometryFamily(Family):
    """The pointwise geometry; see the module docstring."""

    name = "geometry"
    templates = ("geometry.cu.j2",)
    params = ("tpe", "threads", "min_blocks")
    optional = {"min_blocks": MIN_BLOCKS}
    public_keys = Family.public_keys + ("tpe",)

    def claims(self, spec):
        return spec.op == "geometry"

    def supports(self, spec):
        return True

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return geometry_ctx(spec, params, device)

    def entry(self, spec, ctx):
        return (f"stc_geometry_{spec.what}_{spec.dim}d_{DT[spec.dtype]}_nq{spec.nq}"
                + ("_c" if spec.coef else "") + ("_abs" if spec.absdet else "")
                + ("_j32" if spec.jdtype == "float32" else "") + f"_t{ctx['tpe']}")

    def executor(self, choice, device):
        return GeometryExecutor(choice, device)

    def space(self, spec):
        """tpe 1..32 (powers of two), threads 64..1024, min_blocks 0, 2, 3, 4; pruned:
        ``points`` where an element has fewer points than threads on it, ``resident``
        where min_blocks blocks exceed an SM's threads."""
        K = spec.nq ** spec.dim
        for tpe in (1, 2, 4, 8, 16, 32):
            for nt in (64, 128, 256, 512, 1024):
                for mb in (0, 2, 3, 4):
                    why = ("points" if tpe > 2 * K else
                           "resident" if mb * nt > SM_THREADS else None)
                    yield dict(tpe=tpe, threads=nt, min_blocks=mb), why

    def carry(self, spec, entry_spec, params, device):
        return params if self.context(spec, params, device) is not None else None


GEOMETRY = GeometryFamily()


class GeometryExecutor(KernelExecutor):
    """One launch over the elements (the operands in the kernel's order, then ``out``)."""

    def run(self, operands, out, **_):
        if self.choice.spec.batch:
            self._run_arrays(self.choice.spec.batch, tuple(operands) + (out,))
