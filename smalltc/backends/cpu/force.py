"""The corner force family (docs/math.md section 7): BLAST's ``F`` (H1^d <- L2) and ``F^T``
(L2 <- H1^d) as a stage of the lanes action family (:class:`.action.LanesFamily`: the same
lanes, register blocks, block transposes and one-axis contraction steps of ``_lanes.j2``),
rendered from ``force.py.j2``.

Steps (:func:`force_steps`), per chunk of ``lanes`` elements, the A matrices copied into
``d * d`` lane buffers first:

- ``force``: the L2 field interpolated to the points (``B_l2`` along every axis, ``d``
  contractions), the pointwise stage ``h_ca = A[c, a] * u`` (in A's lane buffers), then
  for each component ``c`` the transposed gradients summed with shared partial sums
  (``sum_a G_a^T h_ca``: 8 contractions in 3D, as the diffusion action's back half) into
  ``vt``, copied out to ``U[:, c]``.
- ``force_t``: for each component ``c``, ``w_c`` copied in, its ``d`` reference gradients
  with shared partial sums (8 contractions in 3D, the diffusion action's forward half),
  the pointwise stage ``s (+)= sum_a A[c, a] * g_ca``; then ``B_l2^T`` along every axis
  (``d`` contractions) into the L2 element field.

Intermediates of one component's chain reuse the buffers of the one before.

The fused kinematic side (``MassApplySpec``, ``stc_force_op_3d_f64_nd5_nq8_i32``): the
same template with ``fused``, the map I/O of the fused operator family (``_lanes.j2``'s
``map_gather``/``map_scatter``, bounds-checked, as ``mass_apply.py.j2``): ``F`` adds into
``y`` colour by colour (:func:`smalltc.maps.element_colors`: no races, the same bits for
any thread count), ``F^T`` gathers ``w`` (no colours needed: one pass).

Examples
--------
>>> steps, buffers = force_steps("force", 3, 3, 4)
>>> sum(1 for st in steps if "axis" in st)        # 3 + 3 x 8 contractions
27
>>> steps, buffers = force_steps("force_t", 2, 4, 6)
>>> [st.get("kind", "contract") for st in steps][:6]      # 2D: 4 gradient contractions
['in', 'contract', 'contract', 'contract', 'contract', 'force_sum']
"""
from __future__ import annotations

import numpy as np

from ...maps import map_info
from .action import LanesFamily, MAX_ND, MAX_NQ, lanes_ctx, HEURISTIC, ActionExecutor, \
    StepBuilder
from .mass_apply import _Checked, _sig, _unchecked
from .runtime import SHORT, signature
from .target import resolve

__all__ = ["FORCE", "ForceFamily", "force_steps"]


def force_steps(qfunc, dim, nd, nq, per_comp=False):
    """The lanes steps of the corner force (see the module docstring): ``(steps,
    buffers)``, each step a one-axis contraction (as :func:`.action.operator_steps`'), a
    pointwise stage (kind ``"force_scale"``: ``a<j> *= u``; ``"force_sum"``: ``s (+)=
    sum_a a<c d + a> * g_a``) or a copy marker (kind ``"in"``/``"out"`` with ``comp``: the
    template moves ``vt`` from or to component ``comp``). ``vt`` holds one H1 component
    (``nd^dim``), ``et`` the L2 field (``(nd-1)^dim``), ``a<j>`` A's entries.
    ``per_comp`` (the CUDA form, which reads A where it multiplies): ``F``'s pointwise
    stage per component, into ``h<a>`` (``a < dim``), before that component's back sum;
    every pointwise step lists the entries of A it reads as ``acol`` (``c * dim + a``)."""
    pad = 3 - dim
    nl = nd - 1
    sizes = {}
    state = {"n": 0, "prefix": "f"}

    def fresh(size):
        name = f"{state['prefix']}{state['n']}"
        state["n"] += 1
        sizes[name] = max(sizes.get(name, 0), size)
        return name

    sb = StepBuilder(dim, nq, fresh)
    steps, contract = sb.steps, sb.contract
    qshape = (1,) * pad + (nq,) * dim
    hshape = (1,) * pad + (nd,) * dim
    lshape = (1,) * pad + (nl,) * dim

    if qfunc == "force":
        state["prefix"] = "l"
        src, shape = "et", lshape
        for ax in range(2, pad - 1, -1):
            src, shape = contract(src, shape, ax, "L", False, nl)
        if not per_comp:
            steps.append(dict(kind="force_scale", u=src, a=[f"a{j}" for j in range(dim * dim)],
                              acol=list(range(dim * dim)), npts=nq ** dim))
        for c in range(dim):
            state.update(n=0, prefix="f")
            if per_comp:
                for a in range(dim):
                    sizes[f"h{a}"] = nq ** dim
                steps.append(dict(kind="force_scale", u=src, a=[f"h{a}" for a in range(dim)],
                                  acol=[c * dim + a for a in range(dim)], npts=nq ** dim))
                sb.back_sum([f"h{a}" for a in range(dim)], nd, "vt")
            else:
                sb.back_sum([f"a{c * dim + a}" for a in range(dim)], nd, "vt")
            steps.append(dict(kind="out", comp=c))
    elif qfunc == "force_t":
        sizes["s"] = nq ** dim
        for c in range(dim):
            state.update(n=0, prefix="f")
            steps.append(dict(kind="in", comp=c))
            g, _ = sb.gradients("vt", hshape)
            steps.append(dict(kind="force_sum", g=g, a=[f"a{c * dim + a}" for a in range(dim)],
                              acol=[c * dim + a for a in range(dim)], dst="s", acc=c > 0,
                              npts=nq ** dim))
        state.update(n=0, prefix="l")
        src, shape = "s", qshape
        for i, ax in enumerate(range(pad, 3)):
            src, shape = contract(src, shape, ax, "L", True, nl,
                                  dst="et" if i == dim - 1 else None)
    else:
        raise ValueError(f"qfunc must be 'force' or 'force_t', got {qfunc!r}")
    return steps, sorted(sizes.items())


class ForceFamily(LanesFamily):
    """The corner force's element kernels (``force.py.j2``); see the module docstring."""

    name = "force"
    templates = ("force.py.j2",)

    def claims(self, spec):
        return (spec.op in ("action", "mass_apply")
                and getattr(spec, "qfunc", "mass") in ("force", "force_t")
                and spec.nd <= MAX_ND and spec.nq <= MAX_NQ)

    def supports(self, spec):
        return True

    def context(self, spec, params=None, target=None):
        target = resolve(target)
        p = lanes_ctx(spec, params, target, HEURISTIC)
        if p is None:
            return None
        if params is None:         # as the diffusion instances: transposes, rb = 1
            p = dict(p, tr=1, rb=1)
        dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
        steps, buffers = force_steps(spec.qfunc, dim, nd, nq)
        render = dict(dtype=dt, W=p["lanes"], steps=steps, buffers=buffers, qfunc=spec.qfunc,
                      dim=dim, nv=nd ** dim, nl=(nd - 1) ** dim, nqd=nq ** dim, nd=nd, nq=nq,
                      rb=p["rb"], tr=p["tr"], vbits=p["vbits"],
                      fused=int(spec.op == "mass_apply"), signature=self.signature(spec))
        return dict(p, dtype=dt, form="lanes", render=render)

    def signature(self, spec):
        if spec.op == "mass_apply":          # L, B, G, A, V, MAP, U, order, offsets, ...
            return _sig(spec.dtype, spec.index_dtype, 5, 1, ["int64"])
        return signature(spec.dtype, 6, ["int64"] * 3)       # L, B, G, A, V, U

    def entry(self, spec, ctx):
        if spec.op == "mass_apply":
            return (f"stc_{spec.qfunc}_op_{spec.dim}d_{SHORT[spec.dtype]}_nd{spec.nd}"
                    f"_nq{spec.nq}_i{spec.index_dtype[3:]}")
        return (f"stc_{spec.qfunc}_action_{spec.dim}d_{SHORT[spec.dtype]}_nd{spec.nd}"
                f"_nq{spec.nq}")

    def executor(self, choice, checked=True):
        if choice.spec.op == "mass_apply":
            return ForceApplyExecutor(_unchecked(choice) if not checked else choice)
        return ForceExecutor(choice)


class ForceExecutor(ActionExecutor):
    """Chunks of ``lanes`` elements, split statically over the threads."""

    def run(self, operands, out, **_):
        L, B, G, A, V = operands
        E = V.shape[0]
        nch = -(-E // self.W)
        self.fn(L, B, G, A.reshape(E, -1), V.reshape(E, -1), out.reshape(E, -1), E, nch,
                self.nparts(nch))


FORCE = ForceFamily()


class ForceApplyExecutor(_Checked):
    """The fused kinematic side: ``F`` zeroes ``y`` and runs the map's colours in turn
    (colouring once per map), ``F^T`` one pass over the elements; a bad map entry raises
    when the call returns (the kernel's error flag)."""

    def __init__(self, choice):
        super().__init__(choice)
        self.W = choice.ctx["lanes"]

    def run(self, operands, out, **_):
        s = self.spec
        L, B, G, A, F, MAP = operands
        E, n = MAP.shape[0], s.ndofs
        if E == 0:
            out[...] = 0
            return
        if s.qfunc == "force":
            order, offsets = map_info(MAP, n).colors(MAP)
            F, Y = F.reshape(E, -1), out.reshape(s.dim, n)
        else:
            order = np.arange(E, dtype=np.int32)
            offsets = np.array([0, E], dtype=np.int64)
            Y = out.reshape(E, -1)
        self._call(MAP, n, L, B, G, A.reshape(E, -1), F, MAP.reshape(E, -1), Y, order,
                   offsets, self.nparts(-(-E // self.W)))
