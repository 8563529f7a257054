"""The corner force family (docs/math.md section 7): BLAST's ``F`` (H1^d <- L2) and ``F^T``
(L2 <- H1^d) in one kernel each, element level and with the kinematic side fused with its
DoF map, from ``force.cu.j2`` (the shared-memory form).

=================  ==========================================================
spec               entry point (example)
=================  ==========================================================
ActionSpec         ``stc_force_action_3d_f64_nd5nq8``, ``stc_force_t_action_...``
MassApplySpec      ``stc_force_op_3d_f64_nd5nq8_i32`` (atomic), ``..._ev`` (the
                   deterministic form: the element kernel into an E-vector, then
                   ``scatter_sum.cu.j2`` through the transposed map, as the
                   mass_apply family's), ``stc_force_t_op_...`` (gather)
=================  ==========================================================

The steps are the CPU family's (:func:`smalltc.backends.cpu.force.force_steps` with
``per_comp``): shared partial sums of the reference gradients, the pointwise stages
reading ``A`` from global memory where they multiply. A work group is ``per_block``
elements of ``tpi`` threads each (a power of two, at most 256, covering the largest
step's outputs where it can); every step is a loop of the item's threads over its
outputs. The buffers of an item share slots of shared memory where their lives do not
overlap (:func:`slots`). Tuning parameters ``per_block``, ``tpi``; not measured yet
(no GPU in the session that wrote it): the heuristic aims at 256 threads a block and
48 KiB of shared memory.
"""
from __future__ import annotations

from ..._arrays import cupy_or_none
from ..._memory import guard
from ...maps import map_info
from .family import DEFAULT_DEVICE, DT, ITEMSIZE, SMEM_TARGET, Family, KernelExecutor

__all__ = ["FORCE", "ForceFamily", "force_ctx", "slots"]

_ITYPE = {"int32": "int", "int64": "long long"}


def slots(steps, sizes):
    """Offsets of the buffers ``sizes`` (name -> values) in an item's shared memory: a
    buffer lives from the first step that names it to the last, and takes the lowest
    offset free of every buffer whose life overlaps its own. Returns ``(offsets, total)``.

    >>> slots([dict(src="a", dst="b"), dict(src="b", dst="c")], dict(a=4, b=2, c=4))
    ({'a': 0, 'b': 4, 'c': 0}, 6)
    """
    life = {}
    for i, st in enumerate(steps):
        names = [st.get("src"), st.get("dst"), st.get("u")] + list(st.get("a", ())) \
            + list(st.get("g", ()))
        if st.get("kind") in ("in", "out"):
            names.append("vt")
        for n in names:
            if n in sizes:
                lo, hi = life.get(n, (i, i))
                life[n] = (min(lo, i), max(hi, i))
    for n in sizes:                       # named by no step (et, vt of the element I/O)
        life.setdefault(n, (-1, len(steps)))
    for n in ("et", "vt"):                # read or written outside the steps
        if n in life:
            life[n] = (-1, len(steps)) if n == "et" else life[n]
    placed, offs = [], {}
    for n in sorted(sizes, key=lambda n: (life[n][0], -sizes[n], n)):
        lo, hi = life[n]
        busy = sorted((o, o + sizes[m]) for m, o in offs.items()
                      if not (life[m][1] < lo or hi < life[m][0]))
        at = 0
        for a, b in busy:
            if at + sizes[n] <= a:
                break
            at = max(at, b)
        offs[n] = at
        placed.append(n)
    total = max((o + sizes[n] for n, o in offs.items()), default=0)
    return offs, total


def force_ctx(spec, params=None, device=DEFAULT_DEVICE):
    """Context of ``force.cu.j2`` for a corner-force spec, or None when an item does not
    fit the shared memory. ``params``: ``per_block``, ``tpi`` (None: the heuristic).

    >>> from smalltc.spec import ActionSpec
    >>> c = force_ctx(ActionSpec(dim=3, nq=8, nd=5, batch=1, dtype="float64", ncomp=3,
    ...                          comp_axis=True, qfunc="force"))
    >>> c["tpi"], c["per_block"], c["threads"], c["smem_bytes"] <= 48 * 1024
    (256, 1, 256, True)
    """
    from ..cpu.force import force_steps
    dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
    steps, buffers = force_steps(spec.qfunc, dim, nd, nq, per_comp=True)
    sizes = dict(buffers)
    sizes["vt"] = nd ** dim
    sizes["et"] = (nd - 1) ** dim
    offs, total = slots(steps, sizes)
    istr = total + 1 - total % 2           # odd: items start on distinct banks
    head = nq * (nd - 1) + 2 * nq * nd
    head += head % 2
    s = ITEMSIZE[dt]
    biggest = max([nq ** dim] + [st["out"][0] * st["out"][1] * st["out"][2]
                                 for st in steps if "out" in st and "axis" in st])
    if params is None:
        tpi = 32
        while tpi < min(256, biggest):
            tpi *= 2
        pb = max(1, 256 // tpi)
        while pb > 1 and s * (head + pb * istr) > SMEM_TARGET:
            pb -= 1
    else:
        tpi, pb = params.get("tpi"), params.get("per_block")
        if tpi not in (32, 64, 128, 256, 512, 1024) or not isinstance(pb, int) or pb < 1 \
                or tpi * pb > 1024:
            return None
    smem = s * (head + pb * istr)
    if smem > device["smem_optin"]:
        return None
    gather = int(spec.op == "mass_apply" and not (spec.qfunc == "force"
                                                   and spec.deterministic))
    ctx = dict(dim=dim, nd=nd, nq=nq, nl=nd - 1, dtype=dt, qfunc=spec.qfunc, steps=steps,
               slots=sorted(offs.items(), key=lambda kv: kv[1]), istr=istr, head=head,
               tpi=tpi, per_block=pb, threads=tpi * pb, smem_bytes=smem, min_blocks=0,
               gather=gather, ncomp=1, colored=0)
    if spec.op == "mass_apply":
        ctx["index_t"] = _ITYPE[spec.index_dtype]
    return ctx


class ForceFamily(Family):
    """The corner force (both directions, element level and fused); see the module
    docstring."""

    name = "force"
    templates = ("force.cu.j2",)
    params = ("per_block", "tpi")
    public_keys = Family.public_keys + ("tpi",)

    def claims(self, spec):
        return spec.op in ("action", "mass_apply") and getattr(spec, "qfunc", "mass") in (
            "force", "force_t")

    def supports(self, spec):
        return True

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return force_ctx(spec, params, device)

    def entry(self, spec, ctx):
        if spec.op == "action":
            return (f"stc_{spec.qfunc}_action_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}"
                    f"nq{spec.nq}")
        det = "_ev" if not ctx["gather"] else ""
        return (f"stc_{spec.qfunc}_op_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}"
                f"{'' if det else '_i' + spec.index_dtype[3:]}{det}")

    def executor(self, choice, device):
        return ForceExecutor(choice, device)

    def space(self, spec):
        for tpi in (32, 64, 128, 256):
            for pb in (1, 2, 4, 8):
                yield dict(per_block=pb, tpi=tpi), ("threads" if tpi * pb > 1024 else None)

    def carry(self, spec, entry_spec, params, device):
        return params if self.context(spec, params, device) is not None else None


FORCE = ForceFamily()


class ForceExecutor(KernelExecutor):
    """Element level: one launch over the elements. Fused ``F^T``: the same with the gather.
    Fused ``F``: ``y = 0`` and the atomic kernel, or (deterministic) the element kernel into
    an E-vector and the mass_apply family's sum through the transposed map."""

    def __init__(self, choice, device):
        super().__init__(choice, device)
        self._device = device
        spec = choice.spec
        self.fused = spec.op == "mass_apply"
        self.gather = bool(choice.ctx["gather"])
        self.ndofs = getattr(spec, "ndofs", None)
        self._evectors = {}

    def run(self, operands, out, **_):
        import numpy as np
        from .mass_apply import _flag, _scatter_sum, _zero
        L, B, G, A, F, *rest = operands
        E = A.shape[0]
        if not self.fused:
            self._run_arrays(E, (L, B, G, A, F, out))
            return
        MAP = rest[0]
        err = _flag(MAP, self.ndofs)
        spec = self.choice.spec
        if not self.gather:                    # deterministic F: E-vector, then the sum
            u = self._evector(out, E * spec.dim * spec.nd ** spec.dim)
            self._run_arrays(E, (L, B, G, A, F, u))
            pos, off = map_info(MAP, self.ndofs).transposed(MAP)
            _scatter_sum(u, pos, off, out, self.ndofs, spec.dim, spec.nd ** spec.dim)
            return
        if spec.qfunc == "force":
            _zero(out)
        head = (L, B, G, A, F, MAP, out)
        if E == 0:
            return
        d = self._direct("P" * len(head) + "qP" + "q", E)
        if d is None:
            self._launch(E, head + (np.int64(self.ndofs), np.uint64(err)))
        else:
            d(*[a.data.ptr for a in head], self.ndofs, err, E)

    def _evector(self, out, n):
        cp = cupy_or_none()
        dev = cp.cuda.runtime.getDevice()
        u = self._evectors.get(dev)
        if u is None:
            guard("force_apply (deterministic)", (n,), out.dtype, on_gpu=True,
                  what="E-vector workspace")
            u = self._evectors[dev] = cp.empty(n, dtype=out.dtype)
        return u
