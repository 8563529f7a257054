"""The fused-assembly family: element matrices in one kernel, mass ``M_e = B^T D_e B`` and
the stiffness instances of the operator family (docs/math.md section 7).

``assembly.cu.j2`` runs steps (1a)-(2c) for a *unit*, (element, i1) in 2D/3D
and an element in 1D, with the products ``BB(i,j,k) = B(k,i) B(k,j)`` formed
once per block in shared memory and the intermediate ``A1``/``A2`` per unit.

=================  ==========================  ===================================
spec               template                    entry point (example)
=================  ==========================  ===================================
AssemblySpec       ``assembly.cu.j2``          ``stc_mass_assemble_3d_f64_nd3nq4``
(qfunc diffusion,  ``assembly.cu.j2``          ``stc_diffusion_assemble_3d_f64_nd5nq6``,
helmholtz)                                     ``stc_helmholtz_assemble_2d_f32_nd4nq4_co``
=================  ==========================  ===================================

The stiffness instances (``spec.qfunc`` "diffusion" or "helmholtz", ``spec.collocated``:
B1d the identity, not an operand) run the same stages on the same units with four product
tables (BB, BG, GB, GG) instead of BB, one A1 per gradient pair (a, b) and, in 3D, one A2
per table on the last axis (:func:`stiffness_slots`): ~4x the mass's shared memory an
unit in 3D, 4 terms an output in the final stage. Their heuristic is the mass's rules on
that memory (not yet measured on a GPU); no tables hold them yet. Sizes whose one unit
does not fit (3D p = 8 in float64) run the reference einsum path and say so.

Final stage: *flat* (``rows`` = 0, 256 threads, any thread any output) or, in
2D and 3D, the *rows* form (``nd^dim * rows`` threads; thread (i3, j2, j3) in 3D,
(i2, j2) in 2D, keeps ``BB(i, j, :)`` in registers, one shared load per FMA instead
of two). ``pad`` = 1 spaces the rows of BB and of the last intermediate (A2 in 3D,
A1 in 2D) an odd stride apart when nq is even.
The heuristic (:func:`assembly_ctx`): in 2D and 3D the rows form with ~128 (2D) or
~256 (3D) threads, 16 KB (2D) or 32 KB (3D) of output per block, ``pad`` for even nq in
float64; in 1D the flat form, ~2048 outputs per block. Tuning parameters:
``per_block, rows, pad``.
"""
from __future__ import annotations

import math

from .action import qfunc_of
from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, MAX_THREADS, MIN_THREADS, POW2,
                     SMEM_TARGET, THREADS, Family, KernelExecutor, even)

__all__ = ["ASSEMBLY", "AssemblyFamily", "assembly_ctx", "stiffness_slots"]


def assembly_ctx(dim, nd, nq, dtype, smem_optin=227 * 1024, params=None, qfunc="mass",
                 colloc=False):
    """Context of ``assembly.cu.j2``, or None when one unit does not fit.

    A unit is (element, i1) in 2D/3D and an element in 1D.

    Heuristic (``params`` None): in 2D and 3D the rows form with ``rows`` the power of
    two nearest ~128 (2D) or ~256 (3D) threads, units per block the power of two nearest
    16 KB (2D) or 32 KB (3D) of output, and ``pad`` where nq is even in float64 (padding
    lost 8-11% in float32). Fitted to the searches' timings of every variant: the H100's
    3D search (1.02-1.04x the best variant in geometric mean, float64/float32; the flat
    form read 1.34/1.43x) and the H200's 2D search (1.03/1.11x; flat 1.27/1.44x),
    notes/cuda.md section 7. In 1D: the flat form, ~2048 outputs per block.

    ``params``: ``per_block`` (units per block) and, 2D and 3D, ``rows``: 0 (or
    absent) for the flat final stage (every thread any output, 256 threads),
    R >= 1 for the *rows* form: ``nd^dim * R`` threads; in 3D thread (i3, j2, j3)
    keeps ``BB(i3, j3, :)`` in registers and walks R-strided rows (unit, i2, j1),
    in 2D thread (i2, j2) keeps ``BB(i2, j2, :)`` and walks rows (unit, j1): one
    shared load per FMA instead of two; ``pad`` = 1: rows of BB and of A2 (3D) or
    A1 (2D) an odd stride (nq + 1) apart when nq is even, against bank conflicts.

    >>> c = assembly_ctx(3, 3, 4, "float64")          # 27 * 8 threads, 16 * 243 outputs
    >>> c["out_u"], c["per_block"], c["threads"], c["rows"], c["pad"]
    (243, 16, 216, 8, 1)
    >>> c = assembly_ctx(1, 5, 6, "float32")
    >>> c["per_block"], c["threads"], c["rows"]
    (64, 256, 0)
    >>> c = assembly_ctx(2, 7, 8, "float64", params=dict(per_block=4, rows=2, pad=1))
    >>> c["threads"], c["a1s"], c["smem_bytes"]  # 8 * (442 + 4 * 7*9): BB 7*7*9 made even
    (98, 'A1P', 5552)

    The stiffness instances (``qfunc`` "diffusion" or "helmholtz", ``colloc``: B1d the
    identity, nq == nd): four product tables instead of BB, ``nslot`` intermediates A1 an
    unit (one per gradient pair (a, b)) and, in 3D, ``nfin`` A2 (one per pair of 1D
    matrices on the last axis); see :func:`stiffness_slots`.

    >>> c = assembly_ctx(3, 3, 4, "float64", qfunc="diffusion")
    >>> c["nslot"], c["nfin"], c["per_block"], c["threads"], c["smem_bytes"]
    (9, 4, 6, 216, 48096)
    >>> assembly_ctx(3, 4, 5, "float64", qfunc="diffusion", colloc=True) is None   # nq != nd
    True
    """
    stiff = qfunc != "mass"
    if stiff and (qfunc not in ("diffusion", "helmholtz") or (colloc and nq != nd)):
        return None
    s = ITEMSIZE[dtype]
    out_u = nd ** (2 * dim - 1) if dim > 1 else nd * nd
    a1u = nd * nq ** (dim - 1) if dim > 1 else 0
    slots, fins = stiffness_slots(dim, qfunc == "helmholtz") if stiff else ([], [])
    n1 = len(slots) if stiff else 1          # A1 intermediates a unit
    n2 = len(fins) if stiff else 1           # A2 intermediates a unit (3D)
    shrink = params is None                  # the heuristic's units may shrink to fit
    if params is None and dim > 1 and nd ** dim <= MAX_THREADS:
        per_thread = 256 if dim == 3 else 128
        rows = _pow2_near(per_thread / nd ** dim)
        while nd ** dim * rows > MAX_THREADS:
            rows //= 2
        params = dict(per_block=min(512, _pow2_near((32768 if dim == 3 else 16384)
                                                    / (s * out_u))),
                      rows=rows, pad=int(s == 8))
    nu = params["per_block"] if params else max(1, min(64, math.ceil(2048 / out_u)))
    rows = int((params or {}).get("rows", 0) or 0)
    # pad: BB and A2 (3D) or A1 (2D) rows nq + 1 apart when nq is even (odd stride: no
    # bank conflicts between the rows that the lanes of a warp read); nothing to do for odd nq
    pad = int(bool((params or {}).get("pad", 0)) and nq % 2 == 0)
    nqp = nq + pad
    a1u = nd * nqp if dim == 2 else a1u      # 2D: A1 rows padded too
    a2u = nd ** 3 * nqp if dim == 3 else 0
    bb = even((4 if stiff else 1) * nd * nd * nqp)
    threads = THREADS
    if rows:
        threads = nd ** dim * rows
        if dim == 1 or rows < 0 or threads > 1024:
            return None

    def smem(nu):
        return s * (bb + nu * (n1 * a1u + n2 * a2u))

    while shrink and nu > 1 and smem(nu) > SMEM_TARGET:
        nu -= 1
    if smem(nu) > smem_optin:
        return None
    ctx = dict(dim=dim, nd=nd, nq=nq, dtype=dtype, out_u=out_u, bb_pad=bb, per_block=nu,
               threads=threads, smem_bytes=smem(nu), unroll=4, min_blocks=0, rows=rows,
               pad=pad, nqp=nqp, nqs="NQP" if pad else "NQ", a2s="A2P" if pad else "A2U",
               a1s="A1P" if pad and dim == 2 else "A1U")
    if stiff:
        # the final stage's loop unrolled twice, four times in float32 3D: the choices
        # with no spills in ptxas (sm_90, nvcc 13.0) at the heuristic's parameters, 1D-3D
        # p = 1..7 (four times spilled 4-24 bytes in 1D, 2D float64 p = 6, collocated 3D
        # float64 p = 2, 5, 6; twice in float32 3D p = 4, 6); not timed
        ctx.update(stiff=1, qfunc=qfunc, helm=int(qfunc == "helmholtz"), colloc=int(colloc),
                   unroll=4 if s == 4 and dim == 3 else 2,
                   nsym=dim * (dim + 1) // 2, nslot=len(slots), nfin=len(fins), slots=slots,
                   fins=fins)
    return ctx


def stiffness_slots(dim, helm=False):
    """The stiffness assembly's terms (docs/math.md section 7): ``(slots, fins)``.

    ``K = sum_{a,b} G_a^T Q^{ab} G_b``: on tensor axis d the pair (a, b) multiplies the
    1D product table of type ``t_d = 2 [a == d] + [b == d]`` (0: B B, 1: B G, 2: G B,
    3: G G; ``P_t(i, j, k) = L(k, i) R(k, j)``, L the left matrix, R the right). A *slot*
    is a pair (a, b): its packed Q entry ``c`` and its table on each axis ``t``; slot
    (0, 0) carries Helmholtz's mass term ``B^T D B`` too (the same tables after axis 0).
    The slots are ordered by their final group. ``fins``: what the final stage sums, one
    entry per distinct table on the last axis in 3D (``slots``: the slots that the A2 of
    that group sums over) and per slot in 2D and 1D; each with its table ``t``.

    >>> slots, fins = stiffness_slots(3)
    >>> [(s["a"], s["b"], s["c"], s["t"]) for s in slots[:3]]
    [(0, 0, 0, (3, 0, 0)), (0, 1, 1, (2, 1, 0)), (1, 0, 1, (1, 2, 0))]
    >>> [(f["t"], f["slots"]) for f in fins]
    [(0, [0, 1, 2, 3]), (1, [4, 5]), (2, [6, 7]), (3, [8])]
    >>> [(f["t"], f["slots"]) for f in stiffness_slots(2)[1]]
    [(0, [0]), (1, [1]), (2, [2]), (3, [3])]
    """
    pack = [(a, b) for a in range(dim) for b in range(a, dim)]

    def slot(a, b):
        return dict(a=a, b=b, c=pack.index((min(a, b), max(a, b))),
                    t=tuple(2 * (a == d) + (b == d) for d in range(dim)),
                    mass=int(helm and a == b == 0))
    pairs = [(a, b) for a in range(dim) for b in range(dim)]
    last = dim - 1
    pairs.sort(key=lambda ab: 2 * (ab[0] == last) + (ab[1] == last))   # stable: by group
    slots = [slot(a, b) for a, b in pairs]
    for i, s in enumerate(slots):
        s["i"] = i
    if dim < 3:
        return slots, [dict(t=s["t"][-1], slots=[s["i"]]) for s in slots]
    fins = []
    for t in range(4):
        members = [s["i"] for s in slots if s["t"][-1] == t]
        if members:
            fins.append(dict(t=t, slots=members))
    return slots, fins


def _pow2_near(x):
    """The power of two nearest ``x`` on a log scale, at least 1."""
    return 2 ** max(0, round(math.log2(max(x, 1))))


def _outputs_per_unit(spec):
    return spec.nd ** (2 * spec.dim - 1) if spec.dim > 1 else spec.nd ** 2


class AssemblyFamily(Family):
    """The fused assembly; see the module docstring."""

    name = "assembly"
    templates = ("assembly.cu.j2",)
    params = ("per_block", "rows", "pad")
    optional = {"rows": 0, "pad": 0}
    max_distance = 2.0

    def claims(self, spec):
        return spec.op == "assembly"

    def supports(self, spec):
        """The mass, diffusion and Helmholtz instances, Gauss or collocated."""
        return getattr(spec, "qfunc", "mass") in ("mass", "diffusion", "helmholtz")

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        qf, co = qfunc_of(spec)
        return assembly_ctx(spec.dim, spec.nd, spec.nq, spec.dtype, device["smem_optin"],
                            params, qf, co)

    def entry(self, spec, ctx):
        qf, co = qfunc_of(spec)
        return (f"stc_{qf}_assemble_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}"
                f"{'_co' if co else ''}")

    def executor(self, choice, device):
        return AssemblyExecutor(choice, device)

    def space(self, spec):
        """Units per block 1, 2, 4, ... 512; the flat final stage (rows 0) and, in 2D
        and 3D, the rows form with ``nd^dim * rows`` threads (rows 1, 2, 4, ... within
        1024); ``pad`` 0, 1 for even nq. Pruned: ``threads`` (a rows form under 64
        threads)."""
        rows = [0] + ([r for r in POW2 if spec.nd ** spec.dim * r <= MAX_THREADS]
                      if spec.dim > 1 else [])
        pads = (0, 1) if spec.nq % 2 == 0 else (0,)     # odd nq: rows are odd already
        for r in rows:
            threads = spec.nd ** spec.dim * r if r else THREADS
            for pad in pads:
                for nb in POW2[:10]:
                    why = "threads" if r and threads < MIN_THREADS else None
                    yield dict(per_block=nb, rows=r, pad=pad), why

    def carry(self, spec, entry_spec, params, device):
        """The same outputs per block, final-stage form and pad (the flat form where the
        rows form no longer fits)."""
        if qfunc_of(spec) != qfunc_of(entry_spec):
            return None     # no tables hold the stiffness instances yet: their heuristic
        nb = max(1, round(params["per_block"] * _outputs_per_unit(entry_spec)
                          / _outputs_per_unit(spec)))
        extra = {k: params.get(k, v) for k, v in self.optional.items()}
        if extra.get("rows") and (spec.dim == 1
                                  or spec.nd ** spec.dim * extra["rows"] > MAX_THREADS):
            extra["rows"] = 0
        return self.first_valid(spec, dict(per_block=nb, **extra), device)


ASSEMBLY = AssemblyFamily()


class AssemblyExecutor(KernelExecutor):
    def __init__(self, choice, device):
        super().__init__(choice, device)
        spec = choice.spec
        self.nunits = spec.batch * (spec.nd if spec.dim > 1 else 1)

    def run(self, operands, out, **_):
        """Mass: ``(B1d, D)``; stiffness: ``(B1d, G1d, [D,] Q)``, B1d absent or None when
        collocated (the kernel takes no B1d)."""
        self._run_arrays(self.nunits, tuple(o for o in operands if o is not None) + (out,))
