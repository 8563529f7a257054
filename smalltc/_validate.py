"""Operand checks: turn user arrays into a spec, or raise a clear error.

Every message names the operand, its shape or dtype, and what was expected.
The ``*_spec`` functions run when a plan is built. A plan's call compares its
operands with the spec itself and calls the ``check_*`` functions here only
when a comparison fails: they raise the error that names the operand, or
pass, and the call then converts what it documents it converts.
"""
from __future__ import annotations

import math

import numpy as np

from . import _interop
from ._arrays import (SUPPORTED_DTYPES, array_module, c_contiguous, data_range, is_array,
                      is_cupy, usable)
from .spec import (EVALS, FORCE_QFUNCS, QFUNCS, ActionSpec, AssemblySpec, ContractSpec,
                   GemmSpec, MassApplySpec, MassDiagonalSpec, MixedSpec, nsym,
                   BASIS_WHATS, BasisSpec)
from .spec import GEOMETRY_WHATS, GeometrySpec
from .vertices import check_vertices

__all__ = ["action_spec", "assembly_spec", "gemm_spec", "contract_spec", "mass_apply_spec",
           "mass_diagonal_spec", "operator_spec", "force_spec", "mixed_spec", "basis_spec",
           "geometry_spec", "OPERATOR_LEVELS",
           "check_operands", "check_out", "reshape_like", "as_usable", "check_scalar"]


def _as_array(name, x):
    """``x`` as a NumPy or CuPy array: itself, a zero-copy view of a DLPack producer
    (torch, JAX: :func:`smalltc._interop.import_array`), or ``numpy.asarray`` of
    anything else (lists)."""
    if x is None:
        raise TypeError(f"{name} is None; expected an array")
    if is_array(x):
        return x
    if hasattr(x, "__dlpack__"):
        return _interop.import_array(name, x)
    try:
        return np.asarray(x)
    except Exception as err:
        raise TypeError(f"{name} cannot be converted to an array") from err


_NAMES = {dt: dt.name for dt in SUPPORTED_DTYPES}   # dtype.name is slow (Python-level)


def _dtype(named):
    """Common dtype of ``named`` (dict name -> array); error on mixes."""
    first = None
    for a in named.values():                 # the common case: one supported dtype
        first = a.dtype if first is None else first
        if a.dtype != first:
            break
    else:
        name = _NAMES.get(first)
        if name is not None:
            return name
    dts = {name: np.dtype(a.dtype) for name, a in named.items()}
    for name, dt in dts.items():
        if dt not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {dt}; smalltc supports float32 and float64")
    if len(set(dts.values())) > 1:
        got = ", ".join(f"{n} is {d}" for n, d in dts.items())
        raise TypeError(f"operands have mixed dtypes ({got}); convert them to one "
                        "dtype explicitly (no silent casts)")
    return next(iter(dts.values())).name


def _split_dtype(named, data_names):
    """``(dtype, qdtype)``: the common dtype of ``named``, or, where every data operand
    (``data_names``: D, Q) is float32 and every other float64, ``("float64",
    "float32")``: float32 point data read by float64 kernels (docs/math.md section 8).
    Any other mix raises as :func:`_dtype`."""
    try:
        return _dtype(named), None
    except TypeError:
        data = {n: a for n, a in named.items() if n in data_names}
        rest = {n: a for n, a in named.items() if n not in data_names}
        if data and rest and all(np.dtype(a.dtype) == np.float32 for a in data.values()) \
                and all(np.dtype(a.dtype) == np.float64 for a in rest.values()):
            return "float64", "float32"
        raise


def check_scalar(name, value):
    if isinstance(value, (str, bytes)):          # float("2") would take it
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a real number, got {value!r}") from err
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _check_b1d(B1d):
    if B1d.ndim != 2 or 0 in B1d.shape:
        raise ValueError(f"B1d has shape {tuple(B1d.shape)}, expected (nq, nd) "
                         "with nq, nd >= 1")
    return B1d.shape


def _check_d(D, nq):
    dim = D.ndim - 1
    if dim not in (1, 2, 3):
        raise ValueError(f"D has shape {tuple(D.shape)}, expected (E, nq), (E, nq, nq) "
                         f"or (E, nq, nq, nq) with nq={nq}")
    want = (D.shape[0],) + (nq,) * dim
    if tuple(D.shape) != want:
        raise ValueError(f"D has shape {tuple(D.shape)}, expected {want} for "
                         f"nq={nq}, dim={dim} (nq is B1d.shape[0])")
    return dim


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


def _check_map(elem_dofs, E, nd, dim, src="E from D, nd from B1d", name="elem_dofs"):
    """The element-to-DoF map: an integer array (int32 or int64) of shape (E, nd, ...)."""
    want = (E,) + (nd,) * dim
    if tuple(elem_dofs.shape) != want:
        raise ValueError(f"{name} has shape {tuple(elem_dofs.shape)}, expected {want} for "
                         f"E={E}, nd={nd}, dim={dim} ({src})")
    dt = np.dtype(elem_dofs.dtype)
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"{name} has dtype {dt}, expected int32 or int64 (global DoF "
                        "indices)")
    return dt.name


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


def _positive_int(name, n, what):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer ({what}), got {n!r}")
    return int(n)


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


def gemm_spec(A, B, C, *, alpha, beta, trans_a, trans_b):
    """Check the operands of ``batched_gemm``; return ``(spec, xp, ops)``."""
    A, B = _as_array("A", A), _as_array("B", B)
    named = {"A": A, "B": B}
    beta = check_scalar("beta", beta)
    check_scalar("alpha", alpha)
    if beta != 0.0:
        if C is None:
            raise ValueError(f"beta={beta} needs C; pass C or use beta=0")
        C = _as_array("C", C)
        named["C"] = C
    xp = array_module(*named.values())
    dtype = _dtype(named)
    for name, x in (("A", A), ("B", B)):
        if x.ndim not in (2, 3) or 0 in x.shape[-2:]:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected (batch, rows, "
                             "cols) or (rows, cols) for an operand shared by the batch")
    m, ka = (A.shape[-1], A.shape[-2]) if trans_a else (A.shape[-2], A.shape[-1])
    kb, n = (B.shape[-1], B.shape[-2]) if trans_b else (B.shape[-2], B.shape[-1])
    if ka != kb:
        raise ValueError(f"inner dimensions differ: op(A) is {m} x {ka} (A has shape "
                         f"{tuple(A.shape)}, trans_a={trans_a}) but op(B) is {kb} x {n} "
                         f"(B has shape {tuple(B.shape)}, trans_b={trans_b})")
    batches = {x.shape[0] for x in (A, B) if x.ndim == 3}
    if len(batches) > 1:
        raise ValueError(f"batch counts differ: A has shape {tuple(A.shape)}, "
                         f"B has shape {tuple(B.shape)}")
    if not batches:
        raise ValueError("A and B are both 2D; at least one must be a batch "
                         "(batch, rows, cols) array (use numpy.matmul for one product)")
    spec = GemmSpec(batch=batches.pop(), m=m, n=n, k=ka, dtype=dtype, trans_a=bool(trans_a),
                    trans_b=bool(trans_b), shared_a=A.ndim == 2, shared_b=B.ndim == 2,
                    beta_zero=beta == 0.0)
    if not spec.beta_zero and tuple(C.shape) != spec.out_shape:
        raise ValueError(f"C has shape {tuple(C.shape)}, expected {spec.out_shape}")
    return spec, xp, ((A, B) if spec.beta_zero else (A, B, C))   # the operands of spec.inputs


def contract_spec(kind, X, Y, extents=None):
    """Check the operands of ``contract``; return ``(spec, xp, ops)``.

    ``extents`` (dict with keys i, s, j, k, l; optional) reshapes the
    operands first (a view, no copy, when they are contiguous).
    """
    if kind not in ("8a", "8b", "9"):
        raise ValueError(f"kind must be '8a', '8b' or '9', got {kind!r}")
    X, Y = _as_array("X", X), _as_array("Y", Y)
    xp = array_module(X, Y)
    dtype = _dtype({"X": X, "Y": Y})
    xcore = 2 if kind == "9" else 3
    if extents is not None:
        missing = {"i", "s", "j", "k", "l"} - set(extents)
        if missing:
            raise ValueError(f"extents lacks {sorted(missing)}; give i, s, j, k, l")
        e = {key: int(v) for key, v in extents.items()}
        if kind == "9" and e["i"] != e["j"]:
            raise ValueError(f"kind '9' needs i == j (B is [s, n]); got extents {e}")
        xc = (e["s"], e["i"]) if kind == "9" else (e["i"], e["s"], e["j"])
        yc = (e["k"], e["s"], e["l"])
        X = _reshape("X", X, xc, xcore)
        Y = _reshape("Y", Y, yc, 3)
    if X.ndim not in (xcore, xcore + 1):
        want = "[s, n]" if kind == "9" else "[i, s, j]"
        raise ValueError(f"X has shape {tuple(X.shape)}, expected {want} or with a "
                         "leading batch axis")
    if Y.ndim not in (3, 4):
        raise ValueError(f"Y has shape {tuple(Y.shape)}, expected [k, s, l] or with a "
                         "leading batch axis")
    if kind == "9" and X.ndim != 2:
        raise ValueError(f"X (B) has shape {tuple(X.shape)}; kernel '9' takes one B[s, n] "
                         "shared by the batch")
    xs, ys = X.shape[-xcore:], Y.shape[-3:]
    s_x = xs[0] if kind == "9" else xs[1]
    if s_x != ys[1]:
        raise ValueError(f"contracted extents differ: X has shape {tuple(X.shape)} "
                         f"(s={s_x}), Y has shape {tuple(Y.shape)} (s={ys[1]})")
    batches = {x.shape[0] for x, c in ((X, xcore), (Y, 3)) if x.ndim == c + 1}
    if len(batches) != 1:
        raise ValueError(f"X has shape {tuple(X.shape)} and Y has shape {tuple(Y.shape)}: "
                         "exactly one batch count is needed (at least one batched operand, "
                         "equal counts)")
    i, j = (xs[1], xs[1]) if kind == "9" else (xs[0], xs[2])
    spec = ContractSpec(kind=kind, batch=batches.pop(), i=i, s=s_x, j=j, k=ys[0],
                        l=ys[2], dtype=dtype, shared_x=X.ndim == xcore,
                        shared_y=Y.ndim == 3)
    return spec, xp, (X, Y)


def _reshape(name, x, core, ncore):
    n = math.prod(core)
    total = math.prod(x.shape)
    if total == n:
        return x.reshape(core)
    if n and total % n == 0:
        return x.reshape((total // n,) + core)
    raise ValueError(f"{name} has shape {tuple(x.shape)} ({total} entries), which cannot "
                     f"be seen as {core} or (batch,) + {core}")


def check_operands(inputs, operands, xp):
    """At call time: each operand is an array of module ``xp`` with the planned shape
    and dtype. ``inputs`` holds ``(name, shape, numpy dtype)`` per operand."""
    for (name, shape, dtype), x in zip(inputs, operands):
        if x is None:
            raise TypeError(f"{name} is None; expected an array")
        if not isinstance(x, xp.ndarray):
            what = f"{type(x).__module__.split('.')[0]} array" if is_array(x) else \
                type(x).__name__
            raise TypeError(f"{name} is a {what}, but this plan was built for {xp.__name__} "
                            "arrays")
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, but this plan was "
                             f"built for {tuple(shape)}")
        if x.dtype != dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, but this plan was built for "
                            f"{dtype}")


def check_out(out, shape, dtype, xp, inputs):
    """Validate a user ``out`` array: an array of module ``xp``, shape, dtype,
    C-contiguous, writeable, apart from the ``inputs`` (``(name, array)`` pairs)."""
    if not is_array(out):
        raise TypeError(f"out must be a {xp.__name__} array of shape {tuple(shape)}, got "
                        f"{type(out).__name__}")
    if (xp.__name__ == "cupy") != is_cupy(out):
        raise TypeError(f"out is a {type(out).__module__.split('.')[0]} array but the "
                        f"operands are {xp.__name__} arrays")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype}")
    if not c_contiguous(out):
        raise ValueError("out must be C-contiguous")
    if isinstance(out, np.ndarray):
        if not out.flags.writeable:
            raise ValueError("out is read-only (its writeable flag is False); pass a "
                             "writeable array")
        if not out.flags.aligned:
            raise ValueError(f"out is not aligned to its dtype ({dtype}); pass an array "
                             "that NumPy allocated")
    if out.size == 0:
        return
    if is_cupy(out):
        lo, hi = data_range(out)
    for name, x in inputs:
        if x.size == 0:
            continue
        if is_cupy(out):
            xlo, xhi = data_range(x)
            hit = xlo < hi and lo < xhi
        else:
            hit = np.may_share_memory(out, x)    # bounds check, in C
        if hit:
            raise ValueError(f"out overlaps the input {name}; pass a separate buffer")


def reshape_like(name, x, shape):
    """``x`` seen with ``shape`` when the sizes agree (a view when possible)."""
    if not is_array(x) or tuple(x.shape) == tuple(shape) or math.prod(x.shape) != \
            math.prod(shape):
        return x
    return x.reshape(shape)


def as_usable(xp, x):
    """``x`` itself when a kernel can take it as it is, else a C-contiguous copy (same
    answer): a strided view, or a read-only or unaligned NumPy array."""
    if usable(x):
        return x
    return xp.array(x, order="C", copy=True)


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
