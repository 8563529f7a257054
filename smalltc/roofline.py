"""The roofline bound of docs/math.md section 4, and the device probes it needs.

``Pmax = F / Tmin`` with ``Tmin = max(bytes / BW, F / peak)``: ``bytes``
counts every input read once and every output written once (an operand
shared by the whole batch, such as ``B1d``, counts once in all), ``F`` the
floating-point operations, ``BW`` the memory bandwidth and ``peak`` the
arithmetic peak, both measured on this device in this process.

Counts per item (``s`` bytes per scalar, ``nd = p + 1``, ``d`` the dimension,
``c`` = ncomp; a shared operand adds its size once to the total):

=================  ======================================  ==========================================
operation          bytes per item                          flops per item
=================  ======================================  ==========================================
batched GEMM       ``s*(mk + kn + mn*(2 if beta else 1))``  ``2mnk``
action, dim d      ``s*(2*c*nd^d + nq^d)``                 ``c*(4*sum_t nq^t nd^(d-t+1) + nq^d)``
corner force       ``s*(d^2 nq^d + (nd-1)^d + d nd^d)``    :func:`_force_flops`
assembly, dim d    ``s*(q nq^d + nd^(2d))``                ``3*nq*sum_t c_t nd^(2t) nq^(d-t)``
kernel 8a/8b       ``s*(isj + ksl + ijkl)``                ``2*s_ext*ijkl``
kernel 9           ``s*(ksl + kilj)``                      ``3*s_ext*kilj``
basis, dim d       ``s*(c*nd^d + c*S*nq^d)``               :func:`_basis_flops`
geometry, dim d    ``nq^d (j d^2 + s S) + 8``              :func:`_geometry_point_flops` ``nq^d``
=================  ======================================  ==========================================

(sums over ``t = 1..d``.) The action formula is the 3D line of docs/math.md section 4 generalised:
interpolating to the quadrature points contracts one axis at a time, step
``t`` producing ``nq^t nd^(d-t)`` values at ``2*nd`` flops each; the
transpose costs the same; ``nq^d`` multiplies by ``D``. In 3D it is
``4*(nd^3 nq + nd^2 nq^2 + nd nq^3) + nq^3``. Assembly: step ``t`` of
(1a)-(2c) writes ``nd^(2t) nq^(d-t)`` values, each a sum over ``nq`` of the
triple product ``B B C`` (3 flops per term); in 3D
``3*nq*(nd^2 nq^2 + nd^4 nq + nd^6)`` as in docs/math.md, in 2D
``3*nq*(nd^2 nq + nd^4)``, in 1D ``3*nq*nd^2``. Bytes read ``D`` once and
write ``M`` once. The stiffness (diffusion, Helmholtz) reads ``q`` = nsym (+1) values a
point and makes ``c_t`` terms in step t (mass: 1; 3D stiffness 9, 9, 4, 2D 4, 4, 1D 1;
Helmholtz's first step one more: :func:`_assembly_terms`). A pairwise step (1a)-(4f) is its kernel with the
catalogue's reshaped extents (``B1d`` shared); the pointwise ``D`` scaling
of (3b)/(4c)/(5a) is not part of the step's count (it is the ``nq^d`` term
of the action). The basis application (:func:`smalltc.interpolate`, ``S`` slots a
component: 1 for the values, ``d`` for the gradients, ``1 + d`` for both) reads the field
once and writes the point values once; through the element-to-DoF map the field is the
global vector, ``s*c*ndofs`` in all, plus the map (``index_bytes*nd^d`` an element). Its
transpose (:func:`smalltc.integrate`) reads the point values once and writes the element
vectors, or through the map reads and writes the global vector (``2*s*c*ndofs``) and reads
the map. The pointwise geometry (:func:`smalltc.geometry_data`) reads ``J`` (``j`` bytes a
value) and the coefficient once, and writes its ``S`` values a point and each element's
smallest ``|J|`` once.

Examples
--------
>>> b = bound("gemm", dict(m=8, n=8, k=8, batch=1000, beta=1.0), "float64",
...           bandwidth=1.6e11, peak=1e15)
>>> round(b.pmax / 1e9, 3)             # n * BW / 16
80.0
>>> b.limited_by
'bandwidth'
>>> a = bound("action", dict(dim=3, p=3, nq=5, batch=10), "float64",
...           bandwidth=1e11, peak=1e12)
>>> a.flops == 10 * (4 * (4**3 * 5 + 4**2 * 25 + 4 * 125) + 125)
True
"""
from __future__ import annotations

import functools
import math
import os
import platform
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from ._arrays import cupy_or_none, gpu_available
from .catalogue import STEPS

__all__ = ["Bound", "Counts", "Probe", "counts", "bound", "probe", "bandwidth", "peak",
           "device_kind", "device_name", "device_slug"]

_ITEMSIZE = {"float32": 4, "float64": 8}


# ----------------------------------------------------------------------------
# operation counts (pure formulas)

@dataclass(frozen=True)
class Counts:
    """What one batched call moves and computes.

    ``bytes`` and ``flops`` are totals over the batch; ``items`` the batch
    count; ``dofs`` the element degrees of freedom ``E * ncomp * nd^dim``
    (0 where not a FEM operation).
    """

    op: str
    bytes: int
    flops: int
    items: int
    dofs: int = 0


def _itemsize(dtype) -> int:
    name = np.dtype(dtype).name
    try:
        return _ITEMSIZE[name]
    except KeyError:
        raise TypeError(f"dtype must be float32 or float64, got {name}") from None


def _nd(sizes) -> int:
    if "nd" in sizes:
        return int(sizes["nd"])
    if "p" in sizes:
        return int(sizes["p"]) + 1
    raise ValueError(f"sizes {sizes} need 'p' or 'nd'")


def _need(sizes, key, op):
    if key not in sizes:
        raise ValueError(f"sizes for {op!r} need {key!r}, got {sorted(sizes)}")
    return int(sizes[key])


def _gemm_counts(sizes, s):
    m, n, k = (_need(sizes, x, "gemm") for x in "mnk")
    batch = int(sizes.get("batch", 1))
    if "beta_zero" in sizes:
        beta_nonzero = not sizes["beta_zero"]
    else:
        beta_nonzero = float(sizes.get("beta", 0.0)) != 0.0
    na = 1 if sizes.get("shared_a", False) else batch
    nb = 1 if sizes.get("shared_b", False) else batch
    nbytes = s * (m * k * na + k * n * nb + m * n * batch * (2 if beta_nonzero else 1))
    return Counts("gemm", nbytes, 2 * m * n * k * batch, batch)


def _qdata(sizes, dim):
    """Quadrature data entries per point of the spec's ``qfunc`` (docs/math.md section 7):
    D (1), Q (nsym), or both."""
    q = sizes.get("qfunc", "mass")
    nsym = dim * (dim + 1) // 2
    return {"mass": 1, "diffusion": nsym, "helmholtz": nsym + 1}[q]


def _data_bytes(sizes, dim, nq, s):
    """Bytes of point data an element (docs/math.md section 8): the stored D/Q at ``s``
    bytes a value, at 4 with float32 point data (``qdtype``), or with the vertex geometry
    (``geometry="vertices"``) the element's ``2^dim`` vertices of ``dim`` coordinates and
    its coefficient, ``s (2^dim dim + 1)`` (3D: 25 values against 6 nq^3)."""
    if sizes.get("geometry") == "vertices":
        return s * (2 ** dim * dim + 1)
    qs = 4 if sizes.get("qdtype") == "float32" else s
    return qs * _qdata(sizes, dim) * nq ** dim


def _geometry_flops(sizes, dim, nq):
    """Flops of recomputing the point data from the vertices, per element: at each point
    J (``dim^2`` entries, each ``2^dim`` products and sums, ``2 2^dim dim^2``), det J (3D
    14, 2D 3, 1D 0) and the weight and coefficient (3); diffusion also the adjugate (3D 27,
    2D 0) and the packed ``nsym`` entries of ``adj adj^T / det`` (``2 dim + 1`` each) and
    the division (1)."""
    if sizes.get("geometry") != "vertices":
        return 0
    det = {1: 0, 2: 3, 3: 14}[dim]
    point = 2 * 2 ** dim * dim * dim + det + 3
    if sizes.get("qfunc", "mass") != "mass":
        point += {1: 0, 2: 0, 3: 27}[dim] + _qdata(dict(qfunc="diffusion"), dim) * (
            2 * dim + 1) + 1
    return point * nq ** dim


def _operator_flops(sizes, dim, nq, nd):
    """Flops of one diffusion or Helmholtz element action by the direct sum
    factorisation (:func:`smalltc.backends.cpu.action.operator_steps`): forward, step t
    of dim makes ``t + 1`` contractions (``t`` at the last, ``+1`` for Helmholtz's
    interpolated values) of ``nq^t nd^(dim-t)`` outputs over ``nd``; the pointwise
    ``h = Q g`` (``dim (2 dim - 1)`` per point, +1 for ``D u``); back, the mirror, plus
    the additions into the sum. Collocated: ``dim`` contractions each way."""
    helm = sizes.get("qfunc") == "helmholtz"
    point = nq ** dim * (dim * (2 * dim - 1) + helm)
    if sizes.get("collocated", False):
        n = nd ** dim
        return 2 * dim * 2 * nd * n + point + (dim - 1 + helm) * n
    fwd = sum((t + 1 if t < dim else dim + helm) * 2 * nd * nq ** t * nd ** (dim - t)
              for t in range(1, dim + 1))
    back = adds = 0
    for t in range(1, dim + 1):
        done = t >= 2 or helm
        back += (dim - t + 1 + done) * 2 * nq * nd ** t * nq ** (dim - t)
        adds += done * nd ** t * nq ** (dim - t)
    return fwd + point + back + adds


def _force_flops(sizes, dim, nq, nd):
    """Flops of one corner-force element application (docs/math.md section 7;
    :func:`smalltc.backends.cpu.force.force_steps`), ``nl = nd - 1`` L2 nodes per axis.
    ``F``: the L2 interpolation (step t: ``nq^t nl^(dim-t)`` outputs over ``nl``), ``A *
    u`` (``dim^2 nq^dim``), then per component the diffusion action's back half (the
    transposed gradients with shared partial sums and their additions). ``F^T``: per
    component the diffusion action's forward half (the ``dim`` gradients), ``sum_{c,a}
    A g`` (``2 dim^2 nq^dim``), the transposed L2 interpolation."""
    nl = nd - 1
    fwd = sum((t + 1 if t < dim else dim) * 2 * nd * nq ** t * nd ** (dim - t)
              for t in range(1, dim + 1))
    back = sum((dim - t + 1 + (t >= 2)) * 2 * nq * nd ** t * nq ** (dim - t)
               + (t >= 2) * nd ** t * nq ** (dim - t) for t in range(1, dim + 1))
    l2 = sum(2 * nl * nq ** t * nl ** (dim - t) for t in range(1, dim + 1))
    l2t = sum(2 * nq * nl ** t * nq ** (dim - t) for t in range(1, dim + 1))
    if sizes.get("qfunc") == "force":
        return l2 + dim * dim * nq ** dim + dim * back
    return dim * fwd + 2 * dim * dim * nq ** dim + l2t


def _force_counts(sizes, s, fused):
    """The corner force's bound: ``A`` read once (``dim^2 nq^dim`` an element), the L2
    field once (``(nd-1)^dim``), the kinematic side once: the element field (``dim
    nd^dim``) or, fused, the global vector (``dim ndofs``) and the map (``nd^dim`` indices
    an element); the three 1D matrices once. ``dofs``: the kinematic DoFs (element DoFs
    ``E dim nd^dim``; fused, the unique ``dim ndofs``)."""
    op = "mass_apply" if fused else "action"
    dim, nq, nd = _need(sizes, "dim", op), _need(sizes, "nq", op), _nd(sizes)
    E = int(sizes.get("batch", 1))
    per_elem = s * (dim * dim * nq ** dim + (nd - 1) ** dim)
    basis = s * nq * (2 * nd + nd - 1)
    if fused:
        ndofs = _need(sizes, "ndofs", op)
        ib = int(sizes.get("index_bytes", 4))
        nbytes = E * per_elem + s * dim * ndofs + ib * E * nd ** dim + basis
        adds = E * dim * nd ** dim if sizes.get("qfunc") == "force" else 0
        return Counts(op, nbytes, E * _force_flops(sizes, dim, nq, nd) + adds, E, dim * ndofs)
    nbytes = E * (per_elem + s * dim * nd ** dim) + basis
    return Counts(op, nbytes, E * _force_flops(sizes, dim, nq, nd), E, E * dim * nd ** dim)


def _action_counts(sizes, s):
    if sizes.get("qfunc") in ("force", "force_t"):
        return _force_counts(sizes, s, False)
    dim, nq, nd = _need(sizes, "dim", "action"), _need(sizes, "nq", "action"), _nd(sizes)
    batch, ncomp = int(sizes.get("batch", 1)), int(sizes.get("ncomp", 1))
    geo = _geometry_flops(sizes, dim, nq)
    if sizes.get("qfunc", "mass") != "mass":
        per_elem = s * 2 * ncomp * nd ** dim + _data_bytes(sizes, dim, nq, s)
        nbasis = 1 if sizes.get("collocated", False) else 2
        return Counts("action", per_elem * batch + s * nbasis * nq * nd,
                      (ncomp * _operator_flops(sizes, dim, nq, nd) + geo) * batch, batch,
                      batch * ncomp * nd ** dim)
    per_elem = s * 2 * ncomp * nd ** dim + _data_bytes(sizes, dim, nq, s)
    interp = sum(nq ** t * nd ** (dim - t + 1) for t in range(1, dim + 1))
    flops = ncomp * (4 * interp + nq ** dim) + geo
    return Counts("action", per_elem * batch + s * nq * nd, flops * batch, batch,
                  batch * ncomp * nd ** dim)


def _assembly_counts(sizes, s):
    """Element matrices: the data read, the matrices written (and the 1D matrices once);
    the sum-factorised count of the mass assembly, step t's ``nd^(2t) nq^(d-t)`` values
    each a sum over ``nq`` of triple products, made once per term of the step
    (:func:`_assembly_terms`)."""
    dim, nq, nd = _need(sizes, "dim", "assembly"), _need(sizes, "nq", "assembly"), _nd(sizes)
    batch = int(sizes.get("batch", 1))
    per_elem = s * (_qdata(sizes, dim) * nq ** dim + nd ** (2 * dim))
    q = sizes.get("qfunc", "mass")
    terms = _assembly_terms(q, dim)
    flops = 3 * nq * sum(c * nd ** (2 * t) * nq ** (dim - t)
                         for t, c in zip(range(1, dim + 1), terms))
    nbasis = 1 if q == "mass" or sizes.get("collocated", False) else 2
    return Counts("assembly", per_elem * batch + s * nbasis * nq * nd, flops * batch, batch,
                  batch * nd ** dim)


def _assembly_terms(qfunc, dim):
    """Terms of each step of the sum-factorised assembly (docs/math.md section 7): mass one
    a step; the stiffness ``sum_ab G_a^T Q^ab G_b`` one per pair (a, b) in the first step
    (Helmholtz: one more for ``B^T D B``), one per earlier term in the middle step (3D),
    and in the last step one per distinct pair of 1D matrices on the last axis (BB, BG, GB,
    GG): the pairs that differ only on the earlier axes were summed before it.

    >>> _assembly_terms("diffusion", 3), _assembly_terms("helmholtz", 2)
    ((9, 9, 4), (5, 4))
    """
    if qfunc == "mass":
        return (1,) * dim
    first = dim * dim + (qfunc == "helmholtz")
    return {1: (first,), 2: (first, 4), 3: (first, 9, 4)}[dim]


def _contract_counts(sizes, s):
    kind = str(sizes.get("kind", "8a"))
    i, s_, j, k, l = (_need(sizes, x, "contract") for x in ("i", "s", "j", "k", "l"))
    batch = int(sizes.get("batch", 1))
    nx = 1 if sizes.get("shared_x", False) else batch
    ny = 1 if sizes.get("shared_y", False) else batch
    out = i * j * k * l
    if kind == "9":        # X is B[s, n] (i == j == n), Y is C[k, s, l]
        nbytes = s * (s_ * i * nx + k * s_ * l * ny + out * batch)
        flops = 3 * s_ * out * batch
    elif kind in ("8a", "8b"):
        nbytes = s * (i * s_ * j * nx + k * s_ * l * ny + out * batch)
        flops = 2 * s_ * out * batch
    else:
        raise ValueError(f"contract kind must be '8a', '8b' or '9', got {kind!r}")
    return Counts(f"contract {kind}", nbytes, flops, batch)


def _step_counts(sizes, s):
    label = sizes.get("label") or sizes.get("step")
    step = next((st for st in STEPS if st.label == label), None)
    if step is None:
        raise ValueError(f"unknown pairwise step {label!r}; known: "
                         f"{', '.join(st.label for st in STEPS)}")
    nd, nq = _nd(sizes), _need(sizes, "nq", label)
    batch = int(sizes.get("batch", 1))
    ext = step.extents(nd, nq)
    c = _contract_counts(dict(kind=step.kernel, batch=batch, shared_x=step.x[0] == "B",
                              shared_y=step.y[0] == "B", **ext), s)
    return Counts(f"step {label}", c.bytes, c.flops, batch)


def _mass_apply_counts(sizes, s):
    """The fused operator ``y = sum_e R_e^T B^T D_e B R_e x``: x read once, y written once,
    D read once, the map read once (``index_bytes`` an entry); the action's flops plus the
    additions into y. ``dofs`` are the unique DoFs, ``ncomp * ndofs``."""
    if sizes.get("qfunc") in ("force", "force_t"):
        return _force_counts(sizes, s, True)
    dim, nq, nd = (_need(sizes, k, "mass_apply") for k in ("dim", "nq", "nd"))
    E, ncomp, ndofs = int(sizes.get("batch", 1)), int(sizes.get("ncomp", 1)), \
        _need(sizes, "ndofs", "mass_apply")
    ib = int(sizes.get("index_bytes", 4))
    nbasis = 2 if sizes.get("qfunc", "mass") != "mass" and not sizes.get("collocated") \
        else 1                              # B1d, and G1d
    nbytes = s * (2 * ncomp * ndofs + nbasis * nq * nd) + E * _data_bytes(
        sizes, dim, nq, s) + ib * E * nd ** dim
    act = _action_counts(dict(dim=dim, nq=nq, nd=nd, batch=E, ncomp=ncomp,
                              qfunc=sizes.get("qfunc", "mass"),
                              collocated=sizes.get("collocated", False),
                              geometry=sizes.get("geometry")), s)
    return Counts("mass_apply", nbytes, act.flops + E * ncomp * nd ** dim, E, ncomp * ndofs)


def _basis_what(sizes, dim):
    """The basis application's ``what`` from ``sizes``: given, or from ``nslots``."""
    what = sizes.get("what")
    if what is None:
        nslots = int(sizes.get("nslots", 1))
        what = {1: "values", dim: "gradients", 1 + dim: "both"}.get(nslots) if dim > 1 \
            else ("both" if nslots == 2 else "values")
    if what not in ("values", "gradients", "both"):
        raise ValueError(f"sizes for 'basis' need what in ('values', 'gradients', 'both') "
                         f"or nslots 1, {dim} or {1 + dim}; got {sizes}")
    return what


def _basis_flops(what, transpose, dim, nq, nd):
    """Flops of one component of one element of the basis application, sum-factorised
    (:func:`smalltc.backends.reference.mixed_interp`, shared partial sums). Evaluation,
    step ``t`` contracts axis ``t`` over ``nd`` into ``nq^t nd^(dim-t)`` values, ``c_t`` of
    them: the values one; the gradients ``t + 1`` before the last step (one derivative on
    each axis done, and the all-``B`` chain), ``dim`` at it; both ``t + 1`` throughout.
    The transpose mirrors it (:func:`_operator_flops`' back half: ``dim - t + 1`` chains
    and one more from step 2 on, or with the value slot, and the additions that merge
    them); the values alone one chain.

    >>> _basis_flops("values", False, 3, 4, 3) == 2 * 3 * (4 * 9 + 16 * 3 + 64)
    True
    >>> _basis_flops("gradients", False, 1, 4, 3), _basis_flops("both", True, 1, 4, 3)
    (24, 51)
    """
    if what == "values":
        if transpose:
            return sum(2 * nq * nd ** t * nq ** (dim - t) for t in range(1, dim + 1))
        return sum(2 * nd * nq ** t * nd ** (dim - t) for t in range(1, dim + 1))
    both = what == "both"
    if not transpose:
        return sum((t + 1 if t < dim else dim + both) * 2 * nd * nq ** t * nd ** (dim - t)
                   for t in range(1, dim + 1))
    flops = 0
    for t in range(1, dim + 1):
        done = t >= 2 or both
        flops += (dim - t + 1 + done) * 2 * nq * nd ** t * nq ** (dim - t)
        flops += done * nd ** t * nq ** (dim - t)
    return flops


def _basis_counts(sizes, s):
    """The basis application (:class:`smalltc.spec.BasisSpec`): the field read once and
    the point values written once, or (``transpose``) the point values read once and the
    element vectors written once; through the map (``ndofs`` given) the field is the global
    vector (read once; the transpose reads and writes it) and the map is read once; the 1D
    matrices once. ``dofs``: the unique ``ncomp * ndofs`` through the map, else the element
    DoFs ``E ncomp nd^dim``."""
    dim, nq, nd = _need(sizes, "dim", "basis"), _need(sizes, "nq", "basis"), _nd(sizes)
    E, nc = int(sizes.get("batch", 1)), int(sizes.get("ncomp", 1))
    what, transpose = _basis_what(sizes, dim), bool(sizes.get("transpose", False))
    nslots = {"values": 1, "gradients": dim, "both": 1 + dim}[what]
    ndofs = sizes.get("ndofs")
    points = s * E * nc * nslots * nq ** dim
    basis = s * nq * nd * (1 if what == "values" else 2)
    flops = E * nc * _basis_flops(what, transpose, dim, nq, nd)
    if ndofs is None:
        return Counts("basis", points + s * E * nc * nd ** dim + basis, flops, E,
                      E * nc * nd ** dim)
    ndofs, ib = int(ndofs), int(sizes.get("index_bytes", 4))
    field = s * nc * ndofs * (2 if transpose else 1)
    if transpose:
        flops += E * nc * nd ** dim                    # the additions into y
    return Counts("basis", points + field + ib * E * nd ** dim + basis, flops, E, nc * ndofs)


def _geometry_point_flops(dim, what, coef):
    """Flops at one point of the pointwise geometry: the cofactors (all ``dim^2``, or the
    first column's ``dim`` for "det" and "mass"; 3 flops each in 3D, 2D its negations),
    ``|J|`` by the first row (``2 dim - 1``), then the inverse's ``dim^2`` divisions, D's
    product (and the coefficient's), Q's division and its ``nsym`` entries of ``2 dim``
    flops each; the minimum's comparison.

    >>> _geometry_point_flops(3, "diffusion", True), _geometry_point_flops(3, "det", False)
    (71, 15)
    """
    ncof = dim if what in ("det", "mass") else dim * dim
    f = {1: 0, 2: ncof // 2, 3: 3 * ncof}[dim] + 2 * dim - 1 + 1
    if what == "inverse":
        f += dim * dim
    if what in ("mass", "diffusion", "both"):
        f += int(bool(coef))
    if what in ("mass", "both"):
        f += 1
    if what in ("diffusion", "both"):
        f += 1 + dim * (dim + 1) // 2 * 2 * dim
    return f


def _geometry_counts(sizes, s):
    """The pointwise geometry (:class:`smalltc.spec.GeometrySpec`): ``J`` (``jbytes`` a
    value, ``dim^2`` a point) and the coefficient read once, the ``nslots`` outputs a point
    written once, the tensor weights read once, ``jmin`` (float64, one an element) written
    once. ``dofs``: the points."""
    dim, nq = _need(sizes, "dim", "geometry"), _need(sizes, "nq", "geometry")
    E, jb = int(sizes.get("batch", 1)), int(sizes.get("jbytes", 8))
    what, coef = sizes.get("what", "mass"), bool(sizes.get("coef", False))
    weighted = what in ("mass", "diffusion", "both")
    nslots = int(sizes.get("nslots", 1))
    K = nq ** dim
    nbytes = E * K * (jb * dim * dim + jb * coef + s * nslots) + 8 * K * weighted + 8 * E
    return Counts("geometry", nbytes, E * K * _geometry_point_flops(dim, what, coef), E,
                  E * K)


def _mass_diagonal_counts(sizes, s):
    """The diagonal of the global mass matrix: D and the map read once, y written once;
    the sum-factorised count (three contractions with B^2, as the action's second half)."""
    dim, nq, nd = (_need(sizes, k, "mass_diagonal") for k in ("dim", "nq", "nd"))
    E, ndofs = int(sizes.get("batch", 1)), _need(sizes, "ndofs", "mass_diagonal")
    ib = int(sizes.get("index_bytes", 4))
    nd_ = _qdata(sizes, dim)               # one back-only chain per data array entry
    nbytes = s * (ndofs + E * nd_ * nq ** dim + nq * nd) + ib * E * nd ** dim
    flops = E * nd_ * (2 * sum(nd ** t * nq ** (dim - t + 1) for t in range(1, dim + 1))
                       + nd ** dim)
    return Counts("mass_diagonal", nbytes, flops, E, ndofs)


#: op -> its count function of (sizes, bytes per scalar)
_COUNTS = {"gemm": _gemm_counts, "action": _action_counts, "assembly": _assembly_counts,
           "contract": _contract_counts, "step": _step_counts,
           "mass_apply": _mass_apply_counts, "mass_diagonal": _mass_diagonal_counts,
           "basis": _basis_counts, "geometry": _geometry_counts}


def counts(op, sizes=None, dtype="float64") -> Counts:
    """Bytes and flops of one batched operation (docs/math.md section 4).

    Parameters
    ----------
    op : str or spec
        ``"gemm"`` (sizes m, n, k, batch, beta or beta_zero, shared_a,
        shared_b), ``"action"`` (dim, p or nd, nq, ncomp, batch),
        ``"assembly"`` (dim, p or nd, nq, batch), ``"mass_apply"`` (dim, nd, nq,
        batch, ncomp, ndofs, index_bytes), ``"mass_diagonal"`` (the same without
        ncomp), ``"basis"`` (dim, p or nd, nq, batch, ncomp, what or nslots,
        transpose, ndofs (None: element vectors), index_bytes), ``"contract"`` (kind, i, s,
        j, k, l, batch, shared_x, shared_y), ``"step"`` (label such as
        ``"(4c)"``, p or nd, nq, batch) or a step label itself; or a spec
        object of :mod:`smalltc.spec` (then ``sizes`` and ``dtype`` come
        from it: ``spec.sizes()``, ``spec.dtype``).
    sizes : dict
    dtype : "float32" or "float64"

    Examples
    --------
    >>> c = counts("gemm", dict(m=4, n=4, k=4, batch=10))
    >>> c.bytes, c.flops                   # 8 * 3 * 16 * 10, 2 * 64 * 10
    (3840, 1280)
    >>> counts("(4f)", dict(p=1, nq=2, batch=1)).flops   # U = B^T C, 2 x 2 by 2 x 4
    32
    >>> from smalltc.spec import ActionSpec
    >>> counts(ActionSpec(dim=3, nq=5, nd=4, batch=10, dtype="float32")).bytes
    10200
    >>> from smalltc.spec import BasisSpec
    >>> b = counts(BasisSpec(dim=3, nq=4, nd=3, batch=10, dtype="float64", ndofs=500))
    >>> b.bytes == 8 * 500 + 4 * 10 * 27 + 8 * 10 * 64 + 8 * 12     # x, map, H, B1d
    True
    """
    if not isinstance(op, str):                  # a spec brings its sizes and dtype
        if not hasattr(op, "sizes"):
            raise ValueError(f"op must be an op name, a step label or a spec, got {op!r}")
        sizes, dtype = op.sizes(), op.dtype
        if op.op == "basis":                     # the direction and the slots
            sizes.update(what=op.what, transpose=op.transpose)
        op = op.op
    sizes = dict(sizes or {})
    s = _itemsize(dtype)
    fn = _COUNTS.get(op)
    if fn is not None:
        return fn(sizes, s)
    if op.startswith("("):
        return _step_counts(dict(sizes, label=op), s)
    raise ValueError(f"op must be one of {', '.join(map(repr, _COUNTS))}, a step label or a "
                     f"spec, got {op!r}")


# ----------------------------------------------------------------------------
# the bound

@dataclass(frozen=True)
class Bound:
    """The roofline bound of one operation on one device.

    Attributes
    ----------
    bytes, flops, items, dofs : from :func:`counts`
    bandwidth : bytes/s used; peak : flop/s used
    tmin : seconds, ``max(bytes / bandwidth, flops / peak)``
    pmax : flop/s, ``flops / tmin``
    """

    op: str
    dtype: str
    bytes: int
    flops: int
    items: int
    dofs: int
    bandwidth: float
    peak: float
    tmin: float
    pmax: float

    @property
    def limited_by(self) -> str:
        return "bandwidth" if self.bytes / self.bandwidth >= self.flops / self.peak else "compute"

    @property
    def dofs_per_s(self) -> float:
        """The most element-DoFs per second (0 for non-FEM operations)."""
        return self.dofs / self.tmin if self.tmin > 0 else 0.0

    def fraction(self, seconds: float) -> float:
        """Fraction of the bound reached by a run of ``seconds``: ``tmin / seconds``."""
        return self.tmin / seconds if seconds > 0 else math.nan

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(limited_by=self.limited_by, dofs_per_s=self.dofs_per_s)
        return d


def bound(op, sizes=None, dtype="float64", device=None, *, bandwidth=None, peak=None) -> Bound:
    """Roofline bound (docs/math.md section 4) of ``op`` with ``sizes`` on ``device``.

    Parameters
    ----------
    op, sizes, dtype : as for :func:`counts` (a spec brings its own sizes and dtype)
    device : {"cpu", "gpu", None}
        Where the bandwidth and peak are measured (once per process; None:
        the GPU when there is one, else the CPU). Not probed when both
        ``bandwidth`` and ``peak`` are given.
    bandwidth : float, optional
        Bytes/s to use instead of the measured value.
    peak : float, optional
        Flop/s to use instead of the measured value (``math.inf`` for a pure
        bandwidth bound).

    Returns
    -------
    Bound

    Examples
    --------
    >>> b = bound("assembly", dict(dim=3, p=2, nq=4, batch=100), "float32",
    ...           bandwidth=1e11, peak=math.inf)
    >>> b.bytes == 4 * (100 * (4**3 + 3**6) + 4 * 3)
    True
    """
    if not isinstance(op, str):
        dtype = op.dtype
    c = counts(op, sizes, dtype)
    dtype = np.dtype(dtype).name
    if bandwidth is None:
        bandwidth = _bandwidth_probe(device_kind(device)).value
    if peak is None:
        peak = _peak_probe(device_kind(device), dtype).value
    bw, pk = float(bandwidth), float(peak)
    tmin = max(c.bytes / bw, c.flops / pk)
    pmax = c.flops / tmin if tmin > 0 else 0.0
    return Bound(c.op, dtype, c.bytes, c.flops, c.items, c.dofs, bw, pk, tmin, pmax)


# ----------------------------------------------------------------------------
# device probes

@dataclass(frozen=True)
class Probe:
    """What was measured: ``value`` (B/s or flop/s) and how."""

    value: float
    method: str
    seconds: float

    def as_dict(self):
        return asdict(self)


def device_kind(device=None) -> str:
    """``"gpu"`` or ``"cpu"``; None picks the GPU when there is one."""
    if device is None:
        return "gpu" if gpu_available() else "cpu"
    d = str(device).lower()
    if d in ("gpu", "cuda", "cupy"):
        if not gpu_available():
            raise RuntimeError("device 'gpu' asked for, but no CUDA device answers")
        return "gpu"
    if d in ("cpu", "numpy", "host"):
        return "cpu"
    raise ValueError(f"device must be 'cpu', 'gpu' or None, got {device!r}")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device=None) -> str:
    """A readable device name, e.g. ``"NVIDIA H200"`` or ``"AMD EPYC (2 cores)"``."""
    if device_kind(device) == "gpu":
        cp = cupy_or_none()
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return f"{_cpu_model()} ({os.cpu_count()} cores)"


def device_slug(device=None) -> str:
    """A folder name for results: ``gpu-nvidia-h200``, ``cpu-amd-epyc-2c``."""
    kind = device_kind(device)
    base = device_name(device) if kind == "gpu" else _cpu_model()
    base = re.sub(r"\(.*?\)|\b(r|tm)\b|processor|cpu|\d+-core", " ", base.lower())
    base = "-".join(re.findall(r"[a-z0-9]+", base))[:40].strip("-")
    return f"gpu-{base}" if kind == "gpu" else f"cpu-{base}-{os.cpu_count()}c"


@functools.lru_cache(maxsize=None)
def _bandwidth_probe(kind: str) -> Probe:
    return _gpu_bandwidth() if kind == "gpu" else _cpu_bandwidth()


@functools.lru_cache(maxsize=None)
def _peak_probe(kind: str, dtype: str) -> Probe:
    return _gpu_peak(dtype) if kind == "gpu" else _cpu_peak(dtype)


def bandwidth(device=None) -> float:
    """Measured memory bandwidth in bytes/s (bytes read + written by a large copy)."""
    return _bandwidth_probe(device_kind(device)).value


def peak(dtype="float64", device=None) -> float:
    """Measured arithmetic peak in flop/s (a large GEMM through BLAS / cuBLAS)."""
    return _peak_probe(device_kind(device), np.dtype(dtype).name).value


def probe(device=None, dtypes=("float32", "float64")) -> dict:
    """All probes of ``device`` as a JSON-ready dict (measured once per process)."""
    kind = device_kind(device)
    return {"device": kind, "name": device_name(kind),
            "bandwidth": _bandwidth_probe(kind).as_dict(),
            "peak": {np.dtype(d).name: _peak_probe(kind, np.dtype(d).name).as_dict()
                     for d in dtypes}}


_CPU_COPY_BYTES = 256 * 2**20      # per buffer: far beyond any L3
_GPU_COPY_BYTES = 2 * 2**30        # per buffer: far beyond the L2 (50-60 MB)


def _cpu_bandwidth(reps=7) -> Probe:
    """A copy over all cores: each thread ``numpy.copyto`` on its own slice.

    NumPy releases the GIL in the copy, so the threads run in parallel.
    Best of ``reps`` (after a warm-up that also touches the pages).
    """
    n = _CPU_COPY_BYTES // 8
    src = np.random.default_rng(0).random(n)
    dst = np.empty_like(src)
    nthreads = os.cpu_count() or 1
    edges = np.linspace(0, n, nthreads + 1).astype(int)
    parts = [(dst[a:b], src[a:b]) for a, b in zip(edges[:-1], edges[1:])]
    best = math.inf
    t_all = time.perf_counter()
    with ThreadPoolExecutor(nthreads) as pool:
        for r in range(reps + 1):
            t0 = time.perf_counter()
            list(pool.map(lambda pr: np.copyto(*pr), parts))
            dt = time.perf_counter() - t0
            if r:
                best = min(best, dt)
    return Probe(2 * src.nbytes / best,
                 f"numpy.copyto of {src.nbytes >> 20} MiB in {nthreads} threads, best of {reps}",
                 time.perf_counter() - t_all)


def _cpu_peak(dtype, reps=2) -> Probe:
    n = 1536
    rng = np.random.default_rng(0)
    a = rng.random((n, n)).astype(dtype)
    b = rng.random((n, n)).astype(dtype)
    c = np.empty_like(a)
    best = math.inf
    t_all = time.perf_counter()
    for r in range(reps + 1):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        dt = time.perf_counter() - t0
        if r:
            best = min(best, dt)
    return Probe(2 * n ** 3 / best, f"numpy.matmul {n}x{n} {dtype} (BLAS), best of {reps}",
                 time.perf_counter() - t_all)


def _gpu_best(fn, reps):
    """Best time in seconds of ``fn`` between CUDA events, after a warm-up."""
    cp = cupy_or_none()
    fn()
    cp.cuda.runtime.deviceSynchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    best = math.inf
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) * 1e-3)
    return best


def _gpu_bandwidth(reps=10) -> Probe:
    cp = cupy_or_none()
    t_all = time.perf_counter()
    n = _GPU_COPY_BYTES // 8
    src = cp.random.random(n, dtype=cp.float64)
    dst = cp.empty_like(src)
    nbytes = src.nbytes
    best = _gpu_best(lambda: dst.data.copy_from_device_async(src.data, nbytes), reps)
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return Probe(2 * nbytes / best,
                 f"device-to-device memcpy of {nbytes >> 20} MiB, CUDA events, best of {reps}",
                 time.perf_counter() - t_all)


def _gpu_peak(dtype, reps=5) -> Probe:
    cp = cupy_or_none()
    t_all = time.perf_counter()
    n = 8192
    a = cp.random.random((n, n), dtype=dtype)
    b = cp.random.random((n, n), dtype=dtype)
    c = cp.empty_like(a)
    best = _gpu_best(lambda: cp.matmul(a, b, out=c), reps)
    del a, b, c
    cp.get_default_memory_pool().free_all_blocks()
    return Probe(2 * n ** 3 / best, f"cupy.matmul {n}x{n} {dtype} (cuBLAS), CUDA events, "
                 f"best of {reps}", time.perf_counter() - t_all)
