"""Operand checks of the evaluation at the points (:mod:`smalltc._validate`): the basis
application (``smalltc.interpolate``, ``smalltc.integrate``) and the pointwise geometry
(``smalltc.geometry_data``); each returns ``(spec, xp, ops)`` or raises an error naming
the operand, its shape and the expected one.
"""
from __future__ import annotations

import numpy as np

from ._arrays import array_module
from ._validate_arrays import _as_array, _check_b1d, _check_map, _dtype, _positive_int
from .spec import BASIS_WHATS, GEOMETRY_WHATS, BasisSpec, GeometrySpec

__all__ = ["basis_spec", "geometry_spec"]


def basis_spec(B1d, G1d, field, elem_dofs=None, *, what="values", transpose=False,
               ndofs=None, dim=None):
    """Check the operands of the basis application (``smalltc.interpolate``,
    ``smalltc.integrate``); return ``(spec, xp, ops)`` with ``ops`` in ``spec.inputs``'
    order (:class:`smalltc.spec.BasisSpec`).

    ``field`` is the global ``x`` with ``elem_dofs``, the element vectors ``V`` without
    (evaluation), or the point values ``H`` (``transpose``). The dimension comes from the
    map's rank, else from ``dim``, else from the field's rank without a component axis.
    """
    if not isinstance(what, str) or what not in BASIS_WHATS:
        raise ValueError(f"what must be one of {BASIS_WHATS}, got {what!r}")
    fname = "H" if transpose else ("V" if elem_dofs is None else "x")
    named = {"B1d": _as_array("B1d", B1d)}
    if what == "values" and G1d is not None:
        raise ValueError("G1d is given but what='values' evaluates no gradient (pass "
                         "what='gradients' or 'both', or G1d=None)")
    if what != "values":
        if G1d is None:
            raise ValueError(f"what={what!r} needs G1d, the derivative of the basis (nq, nd)")
        named["G1d"] = _as_array("G1d", G1d)
    named[fname] = _as_array(fname, field)
    maps = {} if elem_dofs is None else {"elem_dofs": _as_array("elem_dofs", elem_dofs)}
    xp = array_module(*named.values(), *maps.values())
    dtype = _dtype(named)
    nq, nd = _check_b1d(named["B1d"])
    G = named.get("G1d")
    if G is not None and tuple(G.shape) != (nq, nd):
        raise ValueError(f"G1d has shape {tuple(G.shape)}, expected {(nq, nd)} (B1d's shape)")
    f = named[fname]
    if dim is not None and (isinstance(dim, bool) or dim not in (1, 2, 3)):
        raise ValueError(f"dim must be 1, 2 or 3, got {dim!r}")
    if maps:
        m = maps["elem_dofs"]
        if m.ndim - 1 not in (1, 2, 3):
            raise ValueError(f"elem_dofs has shape {tuple(m.shape)}, expected (E, nd, ..., nd) "
                             f"with 1 to 3 node axes (nd={nd} from B1d)")
        if dim is not None and dim != m.ndim - 1:
            raise ValueError(f"dim={dim} but elem_dofs has shape {tuple(m.shape)} "
                             f"({m.ndim - 1} node axes)")
        dim = m.ndim - 1
    slot = 0 if what == "values" else 1
    nslots = {"values": 1, "gradients": 0, "both": 1}[what]
    if dim is None:                       # from the field's rank, no component axis
        dim = f.ndim - 1 - (slot if transpose else 0)
        if dim not in (1, 2, 3):
            want = "(E, [nslots,] nq, ..., nq)" if transpose else "(E, nd, ..., nd)"
            raise ValueError(f"{fname} has shape {tuple(f.shape)}, expected {want} with 1 to "
                             "3 tensor axes (pass dim= with a component axis)")
    nslots += dim if what != "values" else 0
    E = maps["elem_dofs"].shape[0] if maps else f.shape[0]
    pts = (nslots,) * slot + (nq,) * dim
    if transpose:
        comp_axis = f.ndim == dim + slot + 2
        core = (E,) + (f.shape[1],) * comp_axis + pts
        if f.ndim not in (dim + slot + 1, dim + slot + 2) or tuple(f.shape) != core:
            raise ValueError(f"H has shape {tuple(f.shape)}, expected {(E,) + pts} or (E, "
                             f"ncomp) + {pts} for what={what!r}, dim={dim}, nq={nq} (nq from "
                             "B1d" + (", E from elem_dofs)" if maps else ")"))
        ncomp = f.shape[1] if comp_axis else 1
        if maps:
            if ndofs is None:
                raise ValueError("ndofs is needed with elem_dofs: the length of the global "
                                 "vector the integrals are summed into")
            ndofs = _positive_int("ndofs", ndofs, "the global vector's length")
    else:
        if ndofs is not None:
            raise ValueError("ndofs is for smalltc.integrate (the global vector's length); "
                             "interpolate reads it from x")
        if maps:
            if f.ndim not in (1, 2):
                raise ValueError(f"x has shape {tuple(f.shape)}, expected (ndofs,) or (ncomp, "
                                 "ndofs)")
            comp_axis = f.ndim == 2
            ndofs = f.shape[-1]
        else:
            comp_axis = f.ndim == dim + 2
            want = (E,) + (nd,) * dim
            if f.ndim not in (dim + 1, dim + 2) or tuple(f.shape[-dim:]) != want[1:]:
                raise ValueError(f"V has shape {tuple(f.shape)}, expected {want} or (E, ncomp) "
                                 f"+ {want[1:]} for dim={dim}, nd={nd} (nd from B1d)")
        ncomp = f.shape[0 if maps else 1] if comp_axis else 1
    if maps:
        index_dtype = _check_map(maps["elem_dofs"], E, nd, dim, src="nd from B1d")
        if not transpose and ndofs == 0:
            raise ValueError("x has no entries (ndofs = 0) but elem_dofs indexes it")
    else:
        index_dtype = "int32"
    spec = BasisSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, what=what,
                     transpose=bool(transpose), ncomp=ncomp, comp_axis=comp_axis,
                     ndofs=ndofs if maps else None, index_dtype=index_dtype)
    ops = (named["B1d"],) + ((G,) if G is not None else ()) + (f,) + tuple(maps.values())
    return spec, xp, ops


def geometry_spec(J, weights=None, coef=None, jmin=None, *, what="mass", dtype=None,
                  absdet=False):
    """Check the operands of the pointwise geometry (``smalltc.geometry_data``); return
    ``(spec, xp, ops)`` with ``ops`` in ``spec.inputs``' order
    (:class:`smalltc.spec.GeometrySpec`). ``dtype``: the outputs' (default J's)."""
    if not isinstance(what, str) or what not in GEOMETRY_WHATS:
        raise ValueError(f"what must be one of {GEOMETRY_WHATS}, got {what!r}")
    J = _as_array("J", J)
    xp = array_module(J)
    jdtype = _dtype({"J": J})
    dim = J.ndim - 3
    if dim not in (1, 2, 3) or tuple(J.shape[1:3]) != (dim, dim) or \
            len(set(J.shape[3:])) != 1:
        raise ValueError(f"J has shape {tuple(J.shape)}, expected (E, dim, dim, nq, ..., nq) "
                         "with dim in 1, 2, 3 tensor axes of nq points (J[e, a, b] = "
                         "dx_a/dxi_b, as smalltc.interpolate's gradients of the coordinates)")
    E, nq = J.shape[0], J.shape[3]
    if nq < 1:
        raise ValueError(f"J has shape {tuple(J.shape)}, expected nq >= 1 points an axis")
    spec_dtype = jdtype if dtype is None else np.dtype(dtype).name
    if spec_dtype not in ("float64", "float32"):
        raise TypeError(f"the outputs' dtype must be float64 or float32, got {spec_dtype}")
    weighted = what in ("mass", "diffusion", "both")
    named = {"J": J}
    if weighted:
        if weights is None:
            raise ValueError(f"what={what!r} needs weights, the tensor quadrature weights "
                             f"{(nq,) * dim}")
        w = _as_array("weights", weights)
        if tuple(w.shape) != (nq,) * dim:
            raise ValueError(f"weights has shape {tuple(w.shape)}, expected {(nq,) * dim} "
                             "(the tensor weights; nq and dim from J)")
        if w.dtype != np.float64:
            raise TypeError(f"weights has dtype {w.dtype}, expected float64")
        named["weights"] = w
    elif weights is not None or coef is not None:
        raise ValueError(f"weights and coef are for what 'mass', 'diffusion' or 'both'; "
                         f"what={what!r} reads J alone")
    if coef is not None:
        c = _as_array("coef", coef)
        want = (E,) + (nq,) * dim
        if tuple(c.shape) != want:
            raise ValueError(f"coef has shape {tuple(c.shape)}, expected {want} (E and the "
                             "points from J)")
        if c.dtype != J.dtype:
            raise TypeError(f"coef has dtype {c.dtype}, expected J's {J.dtype}")
        named["coef"] = c
    if jmin is None:
        raise TypeError("jmin is None; expected an array of shape (E,) for each element's "
                        "smallest |J|")
    m = _as_array("jmin", jmin)
    if tuple(m.shape) != (E,) or m.dtype != np.float64:
        raise ValueError(f"jmin has shape {tuple(m.shape)} and dtype {m.dtype}, expected "
                         f"({E},) float64 (E from J)")
    named["jmin"] = m
    mods = {array_module(a).__name__ for a in named.values()}
    if len(mods) > 1:
        raise TypeError(f"the operands mix array libraries ({', '.join(sorted(mods))}); "
                        "pass them all as NumPy or all as CuPy arrays")
    spec = GeometrySpec(dim=dim, nq=nq, batch=E, dtype=spec_dtype, what=what,
                        coef=coef is not None, jdtype=jdtype, absdet=bool(absdet))
    return spec, xp, tuple(named[o.name] for o in spec.inputs)
