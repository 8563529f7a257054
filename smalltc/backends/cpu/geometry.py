"""The pointwise geometry family: :func:`smalltc.geometry_data` on the host.

``geometry.py.j2`` runs one element at a time (the elements split statically over the
threads), its ``K = nq^dim`` points a plain loop that the loop vectoriser packs: the
entries of ``J`` read once, the adjugate by the cofactor table
(:func:`smalltc.backends.reference.cofactors`), ``|J|`` by the first row's cofactors, and
what the spec asks written once (:class:`smalltc.spec.GeometrySpec`); a second loop over
the element's ``|J|`` (a buffer of ``K``) takes its smallest into ``jmin``. Every size is
a constant (one kernel a ``dim``, ``nq``, ``what`` and dtype pair); nothing to tune.

==============================  =================================================
spec                            entry point (example)
==============================  =================================================
3D Q with a coefficient         ``stc_geometry_diffusion_3d_f64_nq6_c``
2D D, float32 out, |det J|      ``stc_geometry_mass_2d_f32_nq4_abs``
==============================  =================================================

Examples
--------
>>> from smalltc.spec import GeometrySpec
>>> s = GeometrySpec(dim=3, nq=6, batch=10, dtype="float64", what="diffusion", coef=True)
>>> c = GEOMETRY.context(s)
>>> GEOMETRY.entry(s, c), c["render"]["K"], c["render"]["nslots"]
('stc_geometry_diffusion_3d_f64_nq6_c', 216, 6)
"""
from __future__ import annotations

import numpy as np

from ..reference import cofactors
from .family import CpuExecutor, Family
from .runtime import NB_TYPES, SHORT
from .target import resolve

__all__ = ["GEOMETRY", "GeometryFamily", "GeometryExecutor"]


class GeometryFamily(Family):
    """The pointwise geometry (``geometry.py.j2``); see the module docstring."""

    name = "geometry"
    templates = ("geometry.py.j2",)
    params = ()

    def claims(self, spec):
        return spec.op == "geometry"

    def supports(self, spec):
        return True

    def context(self, spec, params=None, target=None):
        if params:
            return None
        target = resolve(target)
        render = dict(dtype=spec.dtype, dim=spec.dim, K=spec.nq ** spec.dim, what=spec.what,
                      weighted=int(spec.weighted), coef=int(spec.coef),
                      absdet=int(spec.absdet), nslots=spec.nslots, cof=cofactors(spec.dim),
                      vbits=target.vector_bits, signature=self.signature(spec), inline_body=True)
        return dict(dtype=spec.dtype, specialized=True, slp=False, render=render)

    def signature(self, spec):
        j, o = f"{NB_TYPES[spec.jdtype]}[:, ::1]", f"{NB_TYPES[spec.dtype]}[:, ::1]"
        f = "float64[:, ::1]"
        args = [j] + [f] * spec.weighted + [j] * spec.coef + [f, o, "int64", "int64"]
        return f"void({', '.join(args)})"

    def entry(self, spec, ctx):
        """``stc_geometry_<what>_<dim>d_<out dtype>_nq<nq>`` with ``_c`` (a coefficient
        array), ``_abs`` (|det J|), ``_j32`` (float32 J)."""
        return (f"stc_geometry_{spec.what}_{spec.dim}d_{SHORT[spec.dtype]}_nq{spec.nq}"
                + ("_c" if spec.coef else "") + ("_abs" if spec.absdet else "")
                + ("_j32" if spec.jdtype == "float32" else ""))

    def executor(self, choice):
        return GeometryExecutor(choice)

    def space(self, spec, target=None):
        yield {}, None


GEOMETRY = GeometryFamily()


class GeometryExecutor(CpuExecutor):
    """One kernel call over the elements, split statically over the threads."""

    def __init__(self, choice):
        super().__init__(choice)
        self._names = [o.name for o in choice.spec.inputs]

    def run(self, operands, out, **_):
        E = self.spec.batch
        if E == 0:
            return
        args = [x.reshape(1, -1) if name == "weights" else x.reshape(E, -1)
                for name, x in zip(self._names, operands)]      # J, [W], [C], JMIN
        self.fn(*args, out.reshape(E, -1), E, self.nparts(E))
