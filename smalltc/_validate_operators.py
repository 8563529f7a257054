"""Operand checks of the FEM operators (:mod:`smalltc._validate`): the mass action, fused
apply, diagonal and element matrices, the generalised operators (docs/math.md section
7), the corner force, the general operator of mixed spaces and the operators whose
point data come from the element vertices; each returns ``(spec, xp, ops)`` or raises an
error naming the operand, its shape and the expected one.
"""
from __future__ import annotations

import numpy as np

from ._arrays import array_module
from ._validate_arrays import (_as_array, _check_b1d, _check_d, _check_map, _dtype,
                               _positive_int, _split_dtype)
from .spec import (EVALS, FORCE_QFUNCS, QFUNCS, ActionSpec, AssemblySpec, MassApplySpec,
                   MassDiagonalSpec, MixedSpec, nsym)
from .vertices import check_vertices

__all__ = ["action_spec", "assembly_spec", "mass_apply_spec", "mass_diagonal_spec",
           "operator_spec", "force_spec", "mixed_spec", "vertex_operator_spec",
           "OPERATOR_LEVELS"]


def action_spec(B1d, D, V):
    """Check the operands of ``batched_contract``; return ``(spec, xp, ops)``."""
    B1d, D, V = (_as_array(n, x) for n, x in (("B1d", B1d), ("D", D), ("V", V)))
    xp = array_module(B1d, D, V)
    dtype, qdtype = _split_dtype({"B1d": B1d, "D": D, "V": V}, ("D",))
    nq, nd = _check_b1d(B1d)
    dim = _check_d(D, nq)
    E = D.shape[0]
    comp_axis = V.ndim == dim + 2
    if V.ndim not in (dim + 1, dim + 2):
        raise ValueError(f"V has shape {tuple(V.shape)}, expected {(E,) + (nd,) * dim} "
                         f"or (E, ncomp, {', '.join([str(nd)] * dim)}) for nd={nd}, "
                         f"dim={dim} (dim from D, nd from B1d)")
    ncomp = V.shape[1] if comp_axis else 1
    spec = ActionSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, ncomp=ncomp,
                      comp_axis=comp_axis, qdtype=qdtype)
    if tuple(V.shape) != spec.v_shape:
        raise ValueError(f"V has shape {tuple(V.shape)}, expected {spec.v_shape} for "
                         f"E={E}, nd={nd}, dim={dim} (E from D, nd from B1d)")
    return spec, xp, (B1d, D, V)


def mass_apply_spec(B1d, D, x, elem_dofs, deterministic=False):
    """Check the operands of ``mass_apply``; return ``(spec, xp, ops)``.

    The map's range (indices in ``[0, ndofs)``) is checked when the map is first used
    (:mod:`smalltc.maps`), not here."""
    B1d, D, x = (_as_array(n, a) for n, a in (("B1d", B1d), ("D", D), ("x", x)))
    elem_dofs = _as_array("elem_dofs", elem_dofs)
    xp = array_module(B1d, D, x, elem_dofs)
    dtype, qdtype = _split_dtype({"B1d": B1d, "D": D, "x": x}, ("D",))
    nq, nd = _check_b1d(B1d)
    dim = _check_d(D, nq)
    E = D.shape[0]
    index_dtype = _check_map(elem_dofs, E, nd, dim)
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}, expected (ndofs,) or (ncomp, ndofs) "
                         "with ndofs >= 1")
    ncomp = x.shape[0] if x.ndim == 2 else 1
    spec = MassApplySpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, ndofs=x.shape[-1],
                         ncomp=ncomp, comp_axis=x.ndim == 2, index_dtype=index_dtype,
                         deterministic=bool(deterministic), qdtype=qdtype)
    return spec, xp, (B1d, D, x, elem_dofs)


def mass_diagonal_spec(B1d, D, elem_dofs, ndofs, deterministic=False):
    """Check the operands of ``mass_diagonal``; return ``(spec, xp, ops)``."""
    B1d, D = _as_array("B1d", B1d), _as_array("D", D)
    elem_dofs = _as_array("elem_dofs", elem_dofs)
    xp = array_module(B1d, D, elem_dofs)
    dtype = _dtype({"B1d": B1d, "D": D})
    nq, nd = _check_b1d(B1d)
    dim = _check_d(D, nq)
    E = D.shape[0]
    index_dtype = _check_map(elem_dofs, E, nd, dim)
    if isinstance(ndofs, bool) or not isinstance(ndofs, (int, np.integer)) or ndofs < 1:
        raise ValueError(f"ndofs must be a positive integer (the global vector's length), "
                         f"got {ndofs!r}")
    spec = MassDiagonalSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, ndofs=int(ndofs),
                            index_dtype=index_dtype, deterministic=bool(deterministic))
    return spec, xp, (B1d, D, elem_dofs)


def assembly_spec(B1d, D):
    """Check the operands of ``assemble_mass``; return ``(spec, xp, ops)``."""
    B1d, D = _as_array("B1d", B1d), _as_array("D", D)
    xp = array_module(B1d, D)
    dtype = _dtype({"B1d": B1d, "D": D})
    nq, nd = _check_b1d(B1d)
    dim = _check_d(D, nq)
    return AssemblySpec(dim=dim, nq=nq, nd=nd, batch=D.shape[0], dtype=dtype), xp, (B1d, D)


#: the levels of the generalised operators: the public names' suffix -> spec op
OPERATOR_LEVELS = {"action": "action", "apply": "mass_apply", "diagonal": "mass_diagonal",
                   "assembly": "assembly"}
_LEVEL_ARGS = {"action": ("V",), "apply": ("x", "elem_dofs"), "diagonal": ("elem_dofs",),
               "assembly": ()}
_DATA_NAMES = {"mass": "D", "diffusion": "Q", "helmholtz": "(D, Q)"}


def _level_operands(level, rest):
    """The operand names after the data at assembly ``level``; a TypeError unless ``rest``
    has that many."""
    names = _LEVEL_ARGS[level]
    if len(rest) != len(names):
        raise TypeError(f"the {level} of an operator takes {', '.join(names) or 'nothing'} "
                        f"after the data; got {len(rest)} operands")
    return names


def _operator_data(qfunc, data):
    """``data`` of :func:`operator_spec` as a dict name -> array: D, Q or both."""
    if qfunc == "helmholtz":
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError(f"data for qfunc 'helmholtz' is the pair (D, Q), got "
                            f"{type(data).__name__}")
        return {"D": _as_array("D", data[0]), "Q": _as_array("Q", data[1])}
    name = _DATA_NAMES[qfunc]
    if isinstance(data, (tuple, list)):
        raise TypeError(f"data for qfunc {qfunc!r} is one array {name}, got a "
                        f"{type(data).__name__} of {len(data)}")
    return {name: _as_array(name, data)}


def _check_q(Q, nq):
    """Q (E, nsym, nq, ..., nq): the packed symmetric matrix per quadrature point."""
    dim = Q.ndim - 2
    if dim not in (1, 2, 3) or Q.shape[1] != nsym(dim):
        raise ValueError(f"Q has shape {tuple(Q.shape)}, expected (E, nsym, nq, ...) with "
                         f"nsym = dim (dim + 1) / 2 = 1, 3 or 6 for dim 1, 2, 3 and nq={nq} "
                         "(nq from the basis)")
    want = (Q.shape[0], nsym(dim)) + (nq,) * dim
    if tuple(Q.shape) != want:
        raise ValueError(f"Q has shape {tuple(Q.shape)}, expected {want} for nq={nq}, "
                         f"dim={dim} (nq from the basis, dim from Q's rank)")
    return dim


def operator_spec(level, qfunc, B1d, G1d, data, *rest, deterministic=False, ndofs=None):
    """Check the operands of a generalised operator (docs/math.md section 7); return
    ``(spec, xp, ops)`` with ``ops`` in ``spec.inputs``' order.

    ``level``: "action" (``rest`` = V), "apply" (x, elem_dofs), "diagonal" (elem_dofs;
    ``ndofs``) or "assembly"; ``qfunc``: "mass" (data D, G1d None), "diffusion" (data Q)
    or "helmholtz" (data (D, Q)). ``B1d=None`` is the collocated form (nq == nd; not for
    mass). The input and output bases are the same (B1d, G1d of one shape).
    """
    if level not in OPERATOR_LEVELS:
        raise ValueError(f"level must be one of {tuple(OPERATOR_LEVELS)}, got {level!r}")
    if qfunc in FORCE_QFUNCS:
        raise ValueError(f"qfunc {qfunc!r} (the corner force, mixed spaces) runs through "
                         "smalltc.force_apply and smalltc.force_apply_transpose")
    if qfunc not in QFUNCS:
        raise ValueError(f"qfunc must be one of {QFUNCS}, got {qfunc!r}")
    names = _level_operands(level, rest)
    if qfunc == "mass":
        if G1d is not None:
            raise ValueError(f"G1d is for qfunc 'diffusion' or 'helmholtz'; the mass operator "
                             f"takes G1d=None (got an operand of shape "
                             f"{tuple(getattr(G1d, 'shape', ()))})")
        if B1d is None:
            raise ValueError("B1d is None, but the mass operator has no collocated form: "
                             "pass B1d (nq, nd)")
        if isinstance(data, (tuple, list)):
            raise TypeError(f"data for qfunc 'mass' is one array D, got a "
                            f"{type(data).__name__} of {len(data)}")
        if level == "action":
            return action_spec(B1d, data, *rest)
        if level == "apply":
            return mass_apply_spec(B1d, data, *rest, deterministic=deterministic)
        if level == "diagonal":
            return mass_diagonal_spec(B1d, data, *rest, ndofs, deterministic=deterministic)
        return assembly_spec(B1d, data)
    if G1d is None:
        raise ValueError(f"G1d is None; qfunc {qfunc!r} needs the 1D derivative matrix G1d "
                         "(nq, nd)")
    G1d = _as_array("G1d", G1d)
    named = {} if B1d is None else {"B1d": _as_array("B1d", B1d)}
    named["G1d"] = G1d
    named.update(_operator_data(qfunc, data))
    args = {n: _as_array(n, a) for n, a in zip(names, rest)}
    floats = dict(named, **{n: a for n, a in args.items() if n != "elem_dofs"})
    xp = array_module(*named.values(), *args.values())
    if level in ("action", "apply"):     # float32 point data with float64 vectors
        dtype, qdtype = _split_dtype(floats, ("D", "Q"))
    else:
        dtype, qdtype = _dtype(floats), None
    if G1d.ndim != 2 or 0 in G1d.shape:
        raise ValueError(f"G1d has shape {tuple(G1d.shape)}, expected (nq, nd) with "
                         "nq, nd >= 1")
    nq, nd = G1d.shape
    collocated = B1d is None
    if collocated and nq != nd:
        raise ValueError(f"B1d is None (the collocated form) but G1d has shape "
                         f"{tuple(G1d.shape)}: collocated needs nq == nd (Gauss-Lobatto "
                         "points on the nodes); pass B1d otherwise")
    if not collocated and tuple(named["B1d"].shape) != (nq, nd):
        raise ValueError(f"B1d has shape {tuple(named['B1d'].shape)}, expected {(nq, nd)} "
                         f"(G1d's shape: the input and output bases are the same)")
    Q = named["Q"]
    dim = _check_q(Q, nq)
    E = Q.shape[0]
    if qfunc == "helmholtz":
        want = (E,) + (nq,) * dim
        if tuple(named["D"].shape) != want:
            raise ValueError(f"D has shape {tuple(named['D'].shape)}, expected {want} for "
                             f"E={E}, nq={nq}, dim={dim} (E and dim from Q, nq from G1d)")
    common = dict(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, qfunc=qfunc,
                  collocated=collocated)
    if qdtype is not None:
        common["qdtype"] = qdtype
    if level == "action":
        V = args["V"]
        if V.ndim not in (dim + 1, dim + 2):
            raise ValueError(f"V has shape {tuple(V.shape)}, expected {(E,) + (nd,) * dim} "
                             f"or (E, ncomp, {', '.join([str(nd)] * dim)}) for nd={nd}, "
                             f"dim={dim} (E and dim from Q, nd from G1d)")
        comp_axis = V.ndim == dim + 2
        spec = ActionSpec(ncomp=V.shape[1] if comp_axis else 1, comp_axis=comp_axis,
                          **common)
        if tuple(V.shape) != spec.v_shape:
            raise ValueError(f"V has shape {tuple(V.shape)}, expected {spec.v_shape} for "
                             f"E={E}, nd={nd}, dim={dim} (E and dim from Q, nd from G1d)")
    elif level == "apply":
        spec = _fused_spec(args, E, nd, dim, "E from Q, nd from G1d", deterministic, common)
    elif level == "diagonal":
        index_dtype = _check_map(args["elem_dofs"], E, nd, dim, "E from Q, nd from G1d")
        if isinstance(ndofs, bool) or not isinstance(ndofs, (int, np.integer)) or ndofs < 1:
            raise ValueError(f"ndofs must be a positive integer (the global vector's "
                             f"length), got {ndofs!r}")
        spec = MassDiagonalSpec(ndofs=int(ndofs), index_dtype=index_dtype,
                                deterministic=bool(deterministic), **common)
    else:
        spec = AssemblySpec(**common)
    arrays = dict(named, **args)
    return spec, xp, tuple(arrays[o.name] for o in spec.inputs)


def force_spec(transpose, B_l2, B1d, G1d, A, field, elem_dofs=None, ndofs=None,
               deterministic=False):
    """Check the operands of the corner force (docs/math.md section 7); return
    ``(spec, xp, ops)`` with ``ops`` in ``spec.inputs``' order.

    ``transpose`` False: ``F e`` (``field`` is ``e``, the L2 element field ``(E, p, ...,
    p)``), True: ``F^T w`` (``field`` is ``w``, ``(E, dim, p+1, ..., p+1)``). With
    ``elem_dofs`` the kinematic side is global: ``F`` adds into ``(dim, ndofs)`` (``ndofs``
    given), ``F^T`` gathers ``w`` of shape ``(dim, ndofs)``.
    """
    qfunc = "force_t" if transpose else "force"
    fname = "w" if transpose else "e"
    named = {"B_l2": _as_array("B_l2", B_l2), "B1d": _as_array("B1d", B1d),
             "G1d": _as_array("G1d", G1d), "A": _as_array("A", A)}
    floats = dict(named, **{fname: _as_array(fname, field)})
    field = floats[fname]
    arrays = [*floats.values()]
    if elem_dofs is not None:
        elem_dofs = _as_array("elem_dofs", elem_dofs)
        arrays.append(elem_dofs)
    xp = array_module(*arrays)
    dtype = _dtype(floats)
    B1d, G1d, B_l2, A = named["B1d"], named["G1d"], named["B_l2"], named["A"]
    if B1d.ndim != 2 or B1d.shape[0] < 1 or B1d.shape[1] < 2:
        raise ValueError(f"B1d has shape {tuple(B1d.shape)}, expected (nq, p+1) with "
                         "nq >= 1, p >= 1 (the kinematic H1 basis)")
    nq, nd = B1d.shape
    if tuple(G1d.shape) != (nq, nd):
        raise ValueError(f"G1d has shape {tuple(G1d.shape)}, expected {(nq, nd)} (B1d's "
                         "shape: the kinematic H1 basis and its derivative)")
    if tuple(B_l2.shape) != (nq, nd - 1):
        raise ValueError(f"B_l2 has shape {tuple(B_l2.shape)}, expected {(nq, nd - 1)} (the "
                         f"thermodynamic L2 basis of order p-1 = {nd - 2}: nq from B1d, p "
                         "nodes per axis)")
    dim = A.ndim - 3
    if dim not in (1, 2, 3) or tuple(A.shape[1:]) != (dim, dim) + (nq,) * dim:
        raise ValueError(f"A has shape {tuple(A.shape)}, expected (E, d, d, nq, ..., nq) "
                         f"with d = 1, 2 or 3 and nq={nq} (nq from B1d)")
    E = A.shape[0]
    common = dict(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, ncomp=dim, comp_axis=True,
                  qfunc=qfunc)
    e_shape = (E,) + (nd - 1,) * dim
    w_shape = (E, dim) + (nd,) * dim
    src = "E and d from A, p from B1d"
    if elem_dofs is None:
        if ndofs is not None:
            raise ValueError("ndofs is for the fused form (with elem_dofs); without a map "
                             "the kinematic side is the element field")
        want = w_shape if transpose else e_shape
        if tuple(field.shape) != want:
            raise ValueError(f"{fname} has shape {tuple(field.shape)}, expected {want} ({src})")
        spec = ActionSpec(**common)
        ops = dict(named, **{fname: field})
    else:
        index_dtype = _check_map(elem_dofs, E, nd, dim, src)
        if transpose:
            if field.ndim != 2 or field.shape[0] != dim or field.shape[1] == 0:
                raise ValueError(f"w has shape {tuple(field.shape)}, expected (d, ndofs) = "
                                 f"({dim}, ndofs) with ndofs >= 1 (the global kinematic "
                                 f"vector gathered through elem_dofs; {src})")
            if ndofs is not None and int(ndofs) != field.shape[1]:
                raise ValueError(f"ndofs={ndofs} but w has shape {tuple(field.shape)}")
            ndofs = field.shape[1]
        else:
            if tuple(field.shape) != e_shape:
                raise ValueError(f"e has shape {tuple(field.shape)}, expected {e_shape} "
                                 f"({src})")
            if isinstance(ndofs, bool) or not isinstance(ndofs, (int, np.integer)) \
                    or ndofs < 1:
                raise ValueError(f"ndofs must be a positive integer (the global kinematic "
                                 f"vector's length per component, y is (d, ndofs)), got "
                                 f"{ndofs!r}")
        spec = MassApplySpec(ndofs=int(ndofs), index_dtype=index_dtype,
                             deterministic=bool(deterministic), **common)
        ops = dict(named, **{fname: field, "elem_dofs": elem_dofs})
    return spec, xp, tuple(ops[o.name] for o in spec.inputs)


def mixed_spec(B_in, B_out, Q, field, *, G_in=None, G_out=None, eval_in="value",
               eval_out="value", elem_dofs_in=None, elem_dofs_out=None, ndofs_out=None):
    """Check the operands of the general operator of mixed spaces (docs/math.md section 7:
    ``smalltc.mixed_action``, ``smalltc.mixed_apply``); return ``(spec, xp, ops)`` with
    ``ops`` in ``spec.inputs``' order (:class:`smalltc.spec.MixedSpec`).

    ``field`` is ``V`` (element vectors) without ``elem_dofs_in``, the global ``x`` with
    it; ``elem_dofs_out`` (with ``ndofs_out``) makes the output global. The dimension comes
    from Q's rank, nq from ``B_in``, the component counts from Q's slot axes.
    """
    ncomp = {}
    for side, ev in (("in", eval_in), ("out", eval_out)):
        if not isinstance(ev, str) or ev not in EVALS:
            raise ValueError(f"eval_{side} must be one of {EVALS}, got {ev!r}")
    fname = "V" if elem_dofs_in is None else "x"
    named = {"B_in": _as_array("B_in", B_in)}
    for side, ev, G in (("in", eval_in, G_in), ("out", eval_out, G_out)):
        if side == "out":
            named["B_out"] = _as_array("B_out", B_out)
        if ev == "value" and G is not None:
            raise ValueError(f"G_{side} is given but eval_{side}='value' evaluates no "
                             f"gradient (pass eval_{side}='grad' or 'both', or no G_{side})")
        if ev != "value":
            if G is None:
                raise ValueError(f"eval_{side}={ev!r} needs G_{side}, the derivative of the "
                                 f"{side}put basis (nq, nd_{side})")
            named[f"G_{side}"] = _as_array(f"G_{side}", G)
    named["Q"] = _as_array("Q", Q)
    named[fname] = _as_array(fname, field)
    maps = {}
    for side, m in (("in", elem_dofs_in), ("out", elem_dofs_out)):
        if m is not None:
            maps[f"elem_dofs_{side}"] = _as_array(f"elem_dofs_{side}", m)
    xp = array_module(*named.values(), *maps.values())
    dtype = _dtype(named)
    Bi = named["B_in"]
    if Bi.ndim != 2 or 0 in Bi.shape:
        raise ValueError(f"B_in has shape {tuple(Bi.shape)}, expected (nq, nd_in) with "
                         "nq, nd_in >= 1")
    nq, nd_in = Bi.shape
    Bo = named["B_out"]
    if Bo.ndim != 2 or Bo.shape[0] != nq or Bo.shape[1] == 0:
        raise ValueError(f"B_out has shape {tuple(Bo.shape)}, expected (nq, nd_out) with "
                         f"nq={nq} (from B_in: one quadrature on both sides), nd_out >= 1")
    nd_out = Bo.shape[1]
    for side, nd in (("in", nd_in), ("out", nd_out)):
        G = named.get(f"G_{side}")
        if G is not None and tuple(G.shape) != (nq, nd):
            raise ValueError(f"G_{side} has shape {tuple(G.shape)}, expected {(nq, nd)} "
                             f"(B_{side}'s shape)")
    Qa = named["Q"]
    dim = Qa.ndim - 3
    if dim not in (1, 2, 3) or tuple(Qa.shape[3:]) != (nq,) * dim:
        raise ValueError(f"Q has shape {tuple(Qa.shape)}, expected (E, nslots_out, "
                         f"nslots_in, nq, ..., nq) with 1 to 3 point axes and nq={nq} "
                         "(nq from B_in)")
    E = Qa.shape[0]
    for side, ev, axis in (("out", eval_out, 1), ("in", eval_in, 2)):
        nper = (ev != "grad") + (dim if ev != "value" else 0)
        if Qa.shape[axis] == 0 or Qa.shape[axis] % nper:
            raise ValueError(f"Q has shape {tuple(Qa.shape)}: axis {axis} ({side}put "
                             f"slots) has {Qa.shape[axis]} entries, expected a positive "
                             f"multiple of {nper} (eval_{side}={ev!r} in {dim}D: ncomp_{side} "
                             f"x {nper})")
        ncomp[side] = Qa.shape[axis] // nper
    ncomp_in, ncomp_out = ncomp["in"], ncomp["out"]
    f = named[fname]
    src = "E and dim from Q, nd_in from B_in, ncomp_in from Q's axis 2"
    common = dict(dim=dim, nq=nq, nd_in=nd_in, nd_out=nd_out, batch=E, dtype=dtype,
                  ncomp_in=ncomp_in, ncomp_out=ncomp_out, eval_in=eval_in,
                  eval_out=eval_out)
    if elem_dofs_in is None:
        core = (nd_in,) * dim
        ok = (tuple(f.shape) == (E, ncomp_in) + core
              or (ncomp_in == 1 and tuple(f.shape) == (E,) + core))
        if not ok:
            want = ((E,) + core if ncomp_in == 1 else (E, ncomp_in) + core)
            raise ValueError(f"V has shape {tuple(f.shape)}, expected {want} ({src})")
        common["comp_axis_in"] = f.ndim == dim + 2
    else:
        common["index_dtype_in"] = _check_map(maps["elem_dofs_in"], E, nd_in, dim,
                                              "E and dim from Q, nd_in from B_in",
                                              "elem_dofs_in")
        if f.ndim not in (1, 2) or f.shape[-1] == 0 or (f.ndim == 2 and f.shape[0] !=
                                                          ncomp_in) \
                or (f.ndim == 1 and ncomp_in != 1):
            want = "(ndofs_in,) or (1, ndofs_in)" if ncomp_in == 1 else \
                f"({ncomp_in}, ndofs_in)"
            raise ValueError(f"x has shape {tuple(f.shape)}, expected {want} with "
                             f"ndofs_in >= 1 (ncomp_in={ncomp_in} from Q's axis 2)")
        common["comp_axis_in"] = f.ndim == 2
        common["ndofs_in"] = int(f.shape[-1])
    if elem_dofs_out is None:
        if ndofs_out is not None:
            raise ValueError("ndofs_out is for a global output (with elem_dofs_out); "
                             "without that map the output is per element")
    else:
        common["index_dtype_out"] = _check_map(maps["elem_dofs_out"], E, nd_out, dim,
                                               "E and dim from Q, nd_out from B_out",
                                               "elem_dofs_out")
        common["ndofs_out"] = _positive_int("ndofs_out", ndofs_out,
                                            "the global output's length per component")
    spec = MixedSpec(**common)
    arrays = dict(named, **maps)
    return spec, xp, tuple(arrays[o.name] for o in spec.inputs)


def vertex_operator_spec(level, qfunc, B1d, G1d, X, coef, *rest, deterministic=False):
    """Check the operands of an operator whose point data are recomputed from the element
    vertices (docs/math.md section 8); return ``(spec, xp, ops)`` with ``ops`` in
    ``spec.inputs``' order (``X`` (E, 2^dim, dim) and ``coef`` (E,) in place of D or Q).
    Levels "action" (``rest`` = V) and "apply" (x, elem_dofs); qfunc "mass" (G1d None)
    or "diffusion" (``B1d=None``: collocated, Gauss-Lobatto)."""
    if level not in ("action", "apply"):
        raise ValueError(f"vertices= is for the action and the fused apply; the {level} "
                         "takes stored point data (smalltc.vertices.point_data makes them)")
    if qfunc not in ("mass", "diffusion"):
        raise ValueError(f"vertices= is for qfunc 'mass' or 'diffusion', got {qfunc!r}")
    names = _level_operands(level, rest)
    if qfunc == "mass":
        if G1d is not None:
            raise ValueError("G1d is for qfunc 'diffusion'; the mass operator takes G1d=None")
        if B1d is None:
            raise ValueError("B1d is None, but the mass operator has no collocated form: "
                             "pass B1d (nq, nd)")
    elif G1d is None:
        raise ValueError("G1d is None; qfunc 'diffusion' needs the 1D derivative matrix G1d "
                         "(nq, nd)")
    named = {} if B1d is None else {"B1d": _as_array("B1d", B1d)}
    if G1d is not None:
        named["G1d"] = _as_array("G1d", G1d)
    named["X"], named["coef"] = _as_array("X", X), _as_array("coef", coef)
    args = {n: _as_array(n, a) for n, a in zip(names, rest)}
    floats = dict(named, **{n: a for n, a in args.items() if n != "elem_dofs"})
    xp = array_module(*named.values(), *args.values())
    dtype = _dtype(floats)
    basis = named.get("B1d", named.get("G1d"))
    if basis.ndim != 2 or 0 in basis.shape:
        raise ValueError(f"{'B1d' if 'B1d' in named else 'G1d'} has shape "
                         f"{tuple(basis.shape)}, expected (nq, nd) with nq, nd >= 1")
    nq, nd = basis.shape
    for n in ("B1d", "G1d"):
        if n in named and tuple(named[n].shape) != (nq, nd):
            raise ValueError(f"{n} has shape {tuple(named[n].shape)}, expected {(nq, nd)}")
    collocated = B1d is None
    if collocated and nq != nd:
        raise ValueError(f"B1d is None (the collocated form) but G1d has shape "
                         f"{tuple(basis.shape)}: collocated needs nq == nd")
    Xa = named["X"]
    dim = check_vertices(Xa, named["coef"])
    E = Xa.shape[0]
    common = dict(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, qfunc=qfunc,
                  collocated=collocated, geometry="vertices")
    if level == "action":
        V = args["V"]
        comp_axis = V.ndim == dim + 2
        spec = ActionSpec(ncomp=V.shape[1] if comp_axis and V.ndim > 1 else 1,
                          comp_axis=comp_axis, **common)
        if tuple(V.shape) != spec.v_shape:
            raise ValueError(f"V has shape {tuple(V.shape)}, expected {spec.v_shape} for "
                             f"E={E}, nd={nd}, dim={dim} (E and dim from X, nd from the "
                             "basis)")
    else:
        spec = _fused_spec(args, E, nd, dim, "E and dim from X, nd from the basis",
                           deterministic, common)
    arrays = dict(named, **args)
    return spec, xp, tuple(arrays[o.name] for o in spec.inputs)


def _fused_spec(args, E, nd, dim, where, deterministic, common):
    """The fused apply's spec from its global vector ``x`` and map ``elem_dofs`` (both
    checked; ``where``: whence E, nd and dim came, for the map's message)."""
    x = args["x"]
    index_dtype = _check_map(args["elem_dofs"], E, nd, dim, where)
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}, expected (ndofs,) or "
                         "(ncomp, ndofs) with ndofs >= 1")
    return MassApplySpec(ndofs=x.shape[-1], ncomp=x.shape[0] if x.ndim == 2 else 1,
                         comp_axis=x.ndim == 2, index_dtype=index_dtype,
                         deterministic=bool(deterministic), **common)
