"""The basis application family: ``smalltc.interpolate`` and ``smalltc.integrate`` on the host.

``basis.py.j2`` contracts each element's field axis by axis with ``B1d`` or ``G1d``
(:func:`basis_steps`): forward, the last axis first, the partial sums shared between
the value and derivative slots (the order of
:func:`smalltc.backends.reference.mixed_interp`), the last contractions giving the slots
of ``H[e, c, s, :]``; transposed, the first axis first, the slots whose remaining 1D
matrices agree added before they are contracted further
(:func:`smalltc.backends.reference.mixed_interp_t`). Each step puts the longest
contiguous run on the step with the most work. Through a map, the field is gathered from
the global vector (every index checked where it is read), and the transpose adds each
element's result into the global vector the elements of one colour at a time
(:func:`smalltc.maps.element_colors`, as the fused operator of :mod:`.mass_apply`: no
two threads add into one entry, and the sums have the same bits for any thread count).

Two forms (tuning parameter ``lanes``):

- ``lanes`` a multiple of the vector's scalars (the heuristic: one vector, 8 float64
  with 512-bit AVX-512): a chunk of elements in lane buffers ``buf[entry * lanes +
  lane]``, so every contraction's innermost loop is a run of whole vectors for any
  ``nd``, ``nq``; ``H`` (and the element vectors) move between the arrays and the
  buffers in ``lanes x lanes`` block transposes (:func:`.simd.tr_block`).
- ``lanes = 1``: one element at a time, its rows of ``V``, ``H``, ``U`` read and
  written in place; the innermost loop runs along the step's contiguous run, or on the
  last axis along the outputs (``B1d``, ``G1d`` transposed per thread).

``kb`` (1-4): outputs of a step computed together, each source load feeding ``kb``
multiply-adds a destination. The sums over the 1D index are written out, the loops are
not, and the loop vectoriser packs them (``slp=False``, Numba's default; the families
whose lane statements are unrolled by hand use SLP instead): a 3D ``both`` kernel at
``p = 7`` compiles in about 7-8 s on the 2-core AMD EPYC (Zen 4) of this project, where
the lanes action of :mod:`.action` (hand-unrolled lanes) takes 40 s.

The heuristic (one vector of elements; ``kb = 2`` from ``nd`` or ``nq`` of 8, within
10-20% of the best of lanes 8/16, kb 1-3 at 3D p = 4, 7, both) was measured there,
single-threaded, 3D, nq = p + 2: the lanes form evaluates 1.1-1.7x faster than one
element at a time at p = 2..7 (about even for the gradients at p = 2) and integrates
1.6-3.8x faster at every p; at p = 1 the element-at-a-time form evaluated the gradients
1.6x faster (its rows are written in place, no transposes), which the heuristic does not
take (the tables may).

================  =====================================  ========================================
spec              what runs                              entry point (example)
================  =====================================  ========================================
forward, map      gather (checked), contractions, ``H``  ``stc_basis_interp_both_3d_f64_nd5nq6_i32``
forward, E-vec    contractions from ``V``, ``H``         ``stc_basis_interp_both_3d_f64_nd5nq6``
transpose, map    contractions, scatter-add by colours   ``stc_basis_interp_t_both_3d_f64_nd5nq6_i32``
transpose, E-vec  contractions into ``U``                ``stc_basis_interp_t_both_3d_f64_nd5nq6``
================  =====================================  ========================================

The component count is a run-time argument (one kernel for every ``ncomp``). Sizes
beyond ``nd <= MAX_ND``, ``nq <= MAX_NQ`` render the same template one element at a
time with the sizes read at run time and the sums as loops
(``stc_basis_interp_both_3d_f64_generic_i32``, ``specialized=False``; the plan logs the
fallback). A map whose DoFs are shared by more elements than the colouring allows (a
DoF in more than 64 elements) is integrated by the element-vector kernel and summed per
DoF by ``numpy.bincount``, said once.

Every map entry is compared with ``[0, ndofs)`` where the kernel reads it: a bad one (a
map changed in place after the plan checked it) reads no memory outside ``x`` and adds
nowhere, the kernel reports it, and the call raises the ``ValueError`` of
:func:`smalltc.maps.out_of_range`.

Examples
--------
>>> from smalltc.spec import BasisSpec
>>> from smalltc.backends.cpu.target import TARGETS
>>> s = BasisSpec(dim=3, nq=6, nd=5, batch=100, dtype="float64", what="both", ndofs=900)
>>> c = BASIS.context(s, None, TARGETS["avx2"])
>>> BASIS.entry(s, c), BASIS.public(c), c["specialized"]
('stc_basis_interp_both_3d_f64_nd5nq6_i32', {'lanes': 4, 'kb': 1}, True)
>>> steps, buffers = basis_steps(s.evals(), 3, 5, 6, False)
>>> [len(st["outs"]) for st in steps]         # B and G, then BB GB | BG, then the 4 slots
[2, 2, 1, 2, 1, 1]
>>> [(st["axis"], st["L"], st["R"]) for st in basis_steps(s.evals(), 3, 5, 6, True)[0]]
[(0, 1, 36), (0, 1, 36), (0, 1, 36), (1, 5, 6), (1, 5, 6), (2, 25, 1)]
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np

from ...maps import MAX_COLORS, check_range, map_info, out_of_range
from .family import Choice, CpuExecutor, Family
from .runtime import NB_TYPES, SHORT
from .target import resolve

__all__ = ["BASIS", "BasisFamily", "BasisExecutor", "basis_steps", "MAX_ND", "MAX_NQ"]

log = logging.getLogger("smalltc")

#: the size-specialised kernels' limits (p <= 16, as the action's); beyond, the generic
#: kernel (sizes at run time)
MAX_ND, MAX_NQ = 17, 24


def basis_steps(evals, dim, nd, nq, transpose):
    """The contractions of the basis application, as template data: ``(steps,
    buffers)``.

    ``evals`` are the slots (:meth:`smalltc.spec.BasisSpec.evals`: ``-1`` the value,
    ``a`` the derivative along axis ``a``); each slot's pattern puts ``G`` on its axis
    and ``B`` on the others. Forward (``transpose`` False): the axes last to first, one
    step per distinct pattern suffix's parent (its outputs the suffixes that extend it:
    one source, a destination per 1D matrix), the last axis's destinations the slots
    of ``H``. Transposed: the axes first to last, one step per distinct remaining
    pattern (its terms the slots or partial sums that share it, added). A step is
    ``dict(axis, L, nin, nout, R, srcs, outs)`` with ``srcs`` its operands (``("V",)``
    the field's element vector, ``("H", s)`` slot ``s``, ``("U",)`` the element result,
    ``("t<n>",)`` an intermediate) and ``outs`` a list of ``dict(dst, terms)``, each term
    ``(index into srcs, "B" or "G")``; ``buffers`` the intermediates ``[(name,
    entries)]``.

    >>> steps, buffers = basis_steps((0, 1), 2, 3, 4, True)     # 2D gradients, transposed
    >>> [(st["srcs"], st["outs"]) for st in steps][-1]
    ([('t0',), ('t1',)], [{'dst': ('U',), 'terms': [(0, 'B'), (1, 'G')]}])
    """
    pats = [tuple("G" if a == ev else "B" for a in range(dim)) for ev in evals]
    steps, buffers = [], []

    def fresh(size):
        name = f"t{len(buffers)}"
        buffers.append((name, size))
        return (name,)

    if not transpose:
        nodes = {(): ("V",)}
        for a in range(dim - 1, -1, -1):
            L, R = nd ** a, nq ** (dim - 1 - a)
            keys = list(dict.fromkeys(p[a:] for p in pats))
            groups = {}
            for k in keys:
                groups.setdefault(k[1:], []).append(k)
            for parent, kids in groups.items():
                outs = []
                for k in kids:
                    nodes[k] = ("H", pats.index(k)) if a == 0 else fresh(L * nq * R)
                    outs.append(dict(dst=nodes[k], terms=[(0, k[0])]))
                steps.append(dict(axis=a, L=L, nin=nd, nout=nq, R=R, srcs=[nodes[parent]],
                                  outs=outs))
    else:
        terms = [(("H", s), p) for s, p in enumerate(pats)]
        for a in range(dim):
            L, R = nd ** a, nq ** (dim - 1 - a)
            groups = {}
            for src, p in terms:
                groups.setdefault(p[a + 1:], []).append((src, p[a]))
            new = []
            for rest, tl in groups.items():
                dst = ("U",) if a == dim - 1 else fresh(L * nd * R)
                srcs = list(dict.fromkeys(src for src, _ in tl))
                steps.append(dict(axis=a, L=L, nin=nq, nout=nd, R=R, srcs=srcs,
                                  outs=[dict(dst=dst, terms=[(srcs.index(s), m)
                                                             for s, m in tl])]))
                new.append((dst, (None,) * (a + 1) + rest))
            terms = new
    return steps, buffers


def _render_steps(steps, buffers, spec, W, KB, generic):
    """The steps as the template reads them: operands as format strings of the flat index
    (``"t0[{}]"``, ``"H[e, (comp * 4 + 1) * 216 + {}]"``), coefficients as format strings
    of ``k`` (the output) and ``s`` (summed), ``R`` in entries times lanes; sizes as
    constants, or (``generic``) as the names the template's generic prologue defines
    (``nd2`` for ``nd ** 2``). Returns ``(steps, buffers, views)``: ``views`` the lane
    buffers' ``(name, entries)`` (``W > 1``)."""
    mapped, tr = spec.ndofs is not None, spec.transpose
    dim, nd, nq, S = spec.dim, spec.nd, spec.nq, spec.nslots
    N, K = (f"nd{dim}", f"nq{dim}") if generic else (nd ** dim, nq ** dim)

    def ref(r):
        kind = r[0]
        if W > 1 and kind in ("V", "U"):
            return "vt[{}]"
        if W > 1 and kind == "H":
            return f"h{r[1]}[{{}}]"
        if kind == "H":
            return f"H[e, (comp * {S} + {r[1]}) * {K} + {{}}]"
        if kind in ("V", "U"):
            return "vt[{}]" if mapped else f"{kind}[e, comp * {N} + {{}}]"
        return f"{kind}[{{}}]"

    out, sizes = [], {}
    for st in steps:
        a = st["axis"]
        for o in st["outs"]:          # the destination's extents: nd on the axes done
            done = a + 1 if tr else a
            sizes[o["dst"][0]] = f"nd{done} * nq{dim - done}"
        run = W > 1 or a != dim - 1
        if tr:
            coef = "{m}[{{s}}, {{k}}]"           # B[k_summed, i]: the same in both forms
        else:
            coef = "{m}[{{k}}, {{s}}]" if run else "{t}t[{{s}}, {{k}}]"
        out.append(dict(
            L=f"nd{a}" if generic else st["L"],
            R=f"nq{dim - 1 - a}" if generic else st["R"] * W,
            nin=("nq" if tr else "nd") if generic else st["nin"],
            nout=("nd" if tr else "nq") if generic else st["nout"],
            KB=min(KB, st["nout"]), run=run, srcs=[ref(s) for s in st["srcs"]],
            outs=[dict(dst=ref(o["dst"]),
                       terms=[(t, coef.format(m=m, t=m.lower())) for t, m in o["terms"]])
                  for o in st["outs"]]))
    bufs = [(name, sizes[name] if generic else n * W)
            for name, n in buffers]
    views = []
    if W > 1:
        views = [("vt", N)] + [(f"h{s}", K) for s in range(S)]
        bufs += [(name, n * W) for name, n in views]
    elif mapped:
        views = [("vt", N)]
        bufs.append(("vt", N))
    return out, bufs, views


class BasisFamily(Family):
    """The basis application (``basis.py.j2``); see the module docstring."""

    name = "basis"
    templates = ("basis.py.j2",)
    params = ("lanes", "kb")

    def claims(self, spec):
        return spec.op == "basis"

    def supports(self, spec):
        return True

    def context(self, spec, params=None, target=None):
        target = resolve(target)
        specialized = spec.nd <= MAX_ND and spec.nq <= MAX_NQ
        if params is None:
            params = self.heuristic(spec, target) if specialized else dict(lanes=1, kb=1)
        W, KB = params.get("lanes"), params.get("kb")
        vl = target.lanes(spec.dtype)
        if set(params) - {"lanes", "kb"} or KB not in (1, 2, 3, 4) or not (
                W == 1 or isinstance(W, int) and W % vl == 0 and W & (W - 1) == 0
                and W <= 64) or (not specialized and (W, KB) != (1, 1)):
            return None
        generic = not specialized
        steps, buffers = basis_steps(spec.evals(), spec.dim, spec.nd, spec.nq, spec.transpose)
        steps, buffers, views = _render_steps(steps, buffers, spec, W, KB, generic)
        dim = spec.dim
        mats = "B" if spec.what == "values" else "B, G"
        render = dict(
            dtype=spec.dtype, dim=dim, generic=int(generic), transpose=int(spec.transpose),
            mapped=int(spec.ndofs is not None), mats=mats, steps=steps, buffers=buffers,
            views=views, W=W, nslots=spec.nslots,
            nd="nd" if generic else spec.nd, nq="nq" if generic else spec.nq,
            N=f"nd{dim}" if generic else spec.nd ** dim,
            K=f"nq{dim}" if generic else spec.nq ** dim,
            vbits=target.vector_bits, signature=self.signature(spec))
        return dict(lanes=W, kb=KB, dtype=spec.dtype, specialized=specialized, slp=False,
                    render=render)

    def heuristic(self, spec, target):
        """One vector of elements a chunk; two outputs a register block from ``nd`` or
        ``nq`` of 8 up (see the module docstring for what was measured)."""
        return dict(lanes=target.lanes(spec.dtype), kb=2 if max(spec.nd, spec.nq) >= 8 else 1)

    def signature(self, spec):
        f = f"{NB_TYPES[spec.dtype]}[:, ::1]"
        m = f"{spec.index_dtype}[:, ::1]"
        i, e = "int64", "int64[::1]"
        mats = [f] * (1 if spec.what == "values" else 2)
        if spec.ndofs is None:                 # field, out, nel, ncomp, ERR, nparts
            args = mats + [f, f, i, i, e, i]
        elif spec.transpose:                   # H, MAP, Y, order, offsets, ncomp, nparts, ERR
            args = mats + [f, m, f, "int32[::1]", "int64[::1]", i, i, e]
        else:                                  # X, MAP, H, nel, ncomp, ERR, nparts
            args = mats + [f, m, f, i, i, e, i]
        return f"void({', '.join(args)})"

    def entry(self, spec, ctx):
        """As the CUDA family's names, without the component count (a run-time argument):
        ``stc_basis_interp[_t]_<what>_<dim>d_<dtype>_nd<nd>nq<nq>[_i<bits>]``, ``generic``
        in place of the sizes for the generic kernel; ``_i32``/``_i64`` through a map."""
        size = "generic" if not ctx["specialized"] else f"nd{spec.nd}nq{spec.nq}"
        where = "" if spec.ndofs is None else f"_i{spec.index_dtype[3:]}"
        return (f"stc_basis_interp{'_t' if spec.transpose else ''}_{spec.what}_{spec.dim}d_"
                f"{SHORT[spec.dtype]}_{size}{where}")

    def executor(self, choice):
        return BasisExecutor(choice)

    def space(self, spec, target=None):
        """lanes 1 (one element at a time), one or two vectors of elements; kb 1-3."""
        vl = resolve(target).lanes(spec.dtype)
        for lanes in (1, vl, 2 * vl):
            for kb in (1, 2, 3):
                yield dict(lanes=lanes, kb=kb), None


BASIS = BasisFamily()


class BasisExecutor(CpuExecutor):
    """One kernel call: the elements split statically over the threads (the transpose
    through a map: ``y = 0``, then the map's colours in turn, colouring once per map);
    a bad map entry raises when the call returns (the kernel's error flag). A map whose
    DoFs are shared by too many elements to colour (:data:`smalltc.maps.MAX_COLORS`) is
    integrated by the element-vector kernel, then summed through the map by
    ``numpy.bincount`` (float64 sums, one thread), and the plan says so once."""

    def __init__(self, choice):
        super().__init__(choice, specialized=choice.ctx["specialized"])
        self._evec = None

    def run(self, operands, out, **_):
        s = self.spec
        E, nc = s.batch, s.ncomp
        mats = list(operands[:1 if s.what == "values" else 2])
        field = operands[len(mats)]
        if E == 0:
            out[...] = 0
            return
        W = self.ctx["lanes"]
        parts = self.nparts(-(-E // W))
        err = np.zeros(2, dtype=np.int64)
        if s.ndofs is None:
            self.fn(*mats, field.reshape(E, -1), out.reshape(E, -1), E, nc, err, parts)
            return
        MAP = operands[-1]
        m2 = MAP.reshape(E, -1)
        if s.transpose:
            info = map_info(MAP, s.ndofs)
            try:
                order, offsets = info.colors(MAP)
            except ValueError:
                self._sum_through_map(mats, field, MAP, out)
                return
            self.fn(*mats, field.reshape(E, -1), m2, out.reshape(nc, s.ndofs), order,
                    offsets, nc, parts, err)
        else:
            self.fn(*mats, field.reshape(nc, s.ndofs), m2, out.reshape(E, -1), E, nc, err,
                    parts)
        if err[0]:
            out_of_range(MAP, s.ndofs, int(err[1]))

    def _sum_through_map(self, mats, H, MAP, out):
        """The transpose through a map that cannot be coloured: element vectors, then
        float64 sums per DoF (the map's range checked on every such call)."""
        s = self.spec
        if self._evec is None:
            log.warning("smalltc: elem_dofs needs more than %d element colours; %s sums "
                        "its element vectors through the map with numpy.bincount (one "
                        "thread)", MAX_COLORS, self.kernel)
            spec = dataclasses.replace(s, ndofs=None)
            ctx = BASIS.context(spec, BASIS.public(self.ctx), self.target)
            self._evec = BasisExecutor(Choice(BASIS, spec, BASIS.template(ctx),
                                              BASIS.entry(spec, ctx), ctx, self.source,
                                              self.table, self.target))
        check_range(MAP, s.ndofs)
        U = np.empty(self._evec.spec.out_shape, dtype=s.dtype).reshape(s.batch, s.ncomp, -1)
        self._evec.run(tuple(mats) + (H,), U)
        y, flat = out.reshape(s.ncomp, s.ndofs), MAP.reshape(-1)
        for c in range(s.ncomp):
            y[c] = np.bincount(flat, weights=U[:, c].reshape(-1), minlength=s.ndofs)
