"""Search spaces: the kernel variants worth compiling for one size (seed 002, Figure 4 step 3).

Each CUDA template exposes a few tuning parameters; the CUDA backend's
context functions (:mod:`smalltc.backends._cuda_params`) turn them into a
rendering context, or return None when a choice does not fit. A space is
generated per size from the kernel's constraints and pruned *before* any
compile:

=============  ==========================  ===========================================
family         parameters                  generated
=============  ==========================  ===========================================
``layout``     ``dim_x, dim_y, per_block``  GEMM and kernels (8a)/(8b): for each
                                           outputs-per-thread count ``t`` along an
                                           axis of extent ``e``, the fewest threads
                                           ``ceil(e / t)`` that cover it; items per
                                           block 1, 2, 4, ... 1024; ``prefetch`` 0, 1
                                           (GEMM with beta != 0 from 64 outputs per
                                           item: the next group's operands copied
                                           by cp.async)
``contract9``  ``per_block``               kernel (9): items per block 1, 2, 4, ... 512
``action``     ``per_block, min_blocks,``  fused action: register blocking ``rb`` 1, 2,
               ``rb``                      3, 4 (2D/3D; outputs per thread along the
                                           contracted axis of the x/y steps, T*ceil(T/rb)
                                           threads per item in 3D); elements per block (all
                                           counts, or 1, 2, 3, 4, 6, 8, 12, ... when
                                           more than 16), ``__launch_bounds__``
                                           minimum blocks 0, 1, 2, 3, 4, 5, 6, 8
                                           (0 and 1 give the same register cap);
               ``line, prefetch``          3D also the line form (``line`` = 1:
                                           B1d in the constant bank, a thread per
                                           line), minimum blocks 0, 2, 4, ``prefetch``
                                           0, 1, 2 (none; the next group's V and D
                                           loaded into registers during the steps;
                                           V by cp.async into a third buffer)
``assembly``   ``per_block, rows, pad``    fused assembly: units per block 1, 2, 4, ... 512;
                                           final stage flat (rows 0) or, 3D, the rows
                                           form with nd^3 * rows threads (rows 1, 2, 4, ...);
                                           pad 0/1 (even nq): BB/A2 rows an odd stride apart
=============  ==========================  ===========================================

Pruned before compiling (the reason is counted):

- ``invalid``: the context function returns None (shared memory above the
  device's opt-in limit, more than 1024 threads, an extent too large);
- ``threads``: more than 1024 threads per block, or fewer than 64 (32
  resident blocks per multiprocessor could not fill its 2048 threads);
- ``tile``: more than 32 outputs per thread in the GEMM register tile;
- ``resident``: ``min_blocks * threads > 2048`` (the register cap could not be met);
- ``duplicate``: a choice that renders the same kernel as one kept (same
  context, or a ``min_blocks`` with the same register cap).

After compiling, :func:`prune_compiled` drops variants that spill (more
than :data:`MAX_LOCAL_BYTES` of local memory per thread, the CUDA backend's
own limit for its heuristic) or whose registers cannot be launched with
their block size.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from smalltc.backends import _cuda_params as P
from smalltc.spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec

__all__ = ["Candidate", "Space", "family", "ctx_for", "generate", "prune_compiled",
           "PARAMS", "OPTIONAL_PARAMS", "MAX_LOCAL_BYTES", "MAX_THREADS", "MIN_THREADS", "MAX_TILE", "SM_THREADS", "SM_REGISTERS"]

#: tuning parameters of each family (the keys of a table entry's ``params``)
PARAMS = {"layout": ("dim_x", "dim_y", "per_block", "prefetch"), "contract9": ("per_block",),
          "action": ("per_block", "min_blocks", "rb", "line", "prefetch"),
          "assembly": ("per_block", "rows", "pad")}
#: parameters added after tables were first written: an entry without one means
#: this value (the form the earlier tables were tuned with)
OPTIONAL_PARAMS = {"assembly": {"rows": 0, "pad": 0}, "action": {"rb": 1, "line": 0,
                                                                          "prefetch": 0},
                   "layout": {"prefetch": 0}}
#: the layout family's prefetch form is searched from this many outputs per item on
#: (below, an item's arithmetic is too short to hide the next group's loads behind),
#: and only where C is read (beta != 0): with beta = 0 its best variant ran 2-10% slower
#: than the best plain one at every square GEMM n = 8..23, float64 and float32, on an
#: H100 (session 5, results/gpu-nvidia-h100-80gb-hbm3/session5/)
PREFETCH_FROM_MN = 64
MAX_THREADS = 1024      # per block, every CUDA architecture
MIN_THREADS = 64        # 32 resident blocks x 64 threads = 2048: a full SM is possible
MAX_TILE = 32           # outputs per thread in the GEMM register tile
SM_THREADS = 2048       # resident threads per multiprocessor (sm_80, sm_90)
SM_REGISTERS = 65536    # 32-bit registers per multiprocessor (and per block)
#: local memory (bytes per thread) a variant may use and still be timed: the CUDA
#: backend's own rule (notes/cuda.md: relaxing register caps for less cost 10-20 points)
MAX_LOCAL_BYTES = 256
_MIN_BLOCKS = (0, 1, 2, 3, 4, 5, 6, 8)
#: the action's register blocking (outputs per thread along a contracted axis); an rb
#: that the context normalises to a smaller one (rb = 4 at T = 5 is 3) is a duplicate
_RB = (1, 2, 3, 4)
_POW2 = tuple(2 ** i for i in range(11))


@dataclass
class Candidate:
    """One kernel variant: its tuning parameters and the context they render."""

    params: dict
    template: str
    ctx: dict = field(repr=False)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items())


@dataclass
class Space:
    """The variants kept for one spec, and what was pruned (reason -> count)."""

    spec: object
    family: str
    candidates: list
    generated: int
    pruned: Counter
    heuristic: dict | None    # the heuristic's choice, in this family's parameters

    @property
    def n_pruned(self) -> int:
        return sum(self.pruned.values())


def family(spec) -> str | None:
    """Which parameter family tunes ``spec`` (None: only the generic kernel runs it)."""
    if isinstance(spec, GemmSpec):
        return "layout"
    if isinstance(spec, ContractSpec):
        if spec.kind == "9":
            return "contract9" if spec.shared_x and not spec.shared_y else None
        return "layout"
    if isinstance(spec, ActionSpec):
        return "action"
    if isinstance(spec, AssemblySpec):
        return "assembly"
    raise TypeError(f"not a spec: {spec!r}")


def ctx_for(spec, params=None, smem_optin=227 * 1024):
    """``(template, ctx)`` the CUDA backend renders for ``spec`` with ``params``, or None.

    The same calls as ``smalltc/backends/cuda.py`` makes (None: the heuristic).
    """
    fam = family(spec)
    if fam == "layout" and isinstance(spec, GemmSpec):
        ctx = P.layout_ctx("8a", **P.gemm_extents(spec), dtype=spec.dtype,
                           shared_x=spec.shared_a, shared_y=spec.shared_b,
                           beta_zero=spec.beta_zero, smem_optin=smem_optin, params=params)
        return None if ctx is None else ("gemm.cu.j2", ctx)
    if fam == "layout":
        ctx = P.layout_ctx(spec.kind, I=spec.i, S=spec.s, J=spec.j, K=spec.k, L=spec.l,
                           dtype=spec.dtype, shared_x=spec.shared_x, shared_y=spec.shared_y,
                           smem_optin=smem_optin, params=params)
        return None if ctx is None else ("gemm.cu.j2", ctx)
    if fam == "contract9":
        ctx = P.contract9_ctx(spec.s, spec.i, spec.k, spec.l, spec.dtype, smem_optin, params)
        return None if ctx is None else ("contract9.cu.j2", ctx)
    if fam == "action":
        ctx = P.action_ctx(spec.dim, spec.nd, spec.nq, spec.ncomp, spec.dtype, smem_optin,
                           params)
        return None if ctx is None else (P.action_template(ctx), ctx)
    if fam == "assembly":
        ctx = P.assembly_ctx(spec.dim, spec.nd, spec.nq, spec.dtype, smem_optin, params)
        return None if ctx is None else ("assembly.cu.j2", ctx)
    return None


def layout_axes(spec):
    """``(kind, fast, slow)`` extents of a layout kernel: x threads run along ``fast``."""
    if isinstance(spec, GemmSpec):
        e, kind = P.gemm_extents(spec), "8a"
    else:
        e, kind = dict(I=spec.i, S=spec.s, J=spec.j, K=spec.k, L=spec.l), spec.kind
    M, N = e["I"] * e["J"], e["K"] * e["L"]
    return (kind, N, M) if kind == "8a" else (kind, M, N)


def _prefetch_searched(spec, outputs):
    """Whether the layout family's prefetch form is in ``spec``'s space."""
    return outputs >= PREFETCH_FROM_MN and isinstance(spec, GemmSpec) and not spec.beta_zero


def _covers(extent):
    """For each outputs-per-thread count t, the fewest threads ceil(extent / t)."""
    return sorted({math.ceil(extent / t) for t in range(1, extent + 1)})


def _nice(upto):
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to ``upto``."""
    vals = {1}
    for p in _POW2:
        vals.update(v for v in (p, 3 * p // 2 if p >= 2 else p) if v <= upto)
    return sorted(vals)


def _raw(spec, fam):
    """Every parameter combination of the family, before pruning, with a reason to drop or None."""
    if fam == "layout":
        _, fast, slow = layout_axes(spec)
        for dx in _covers(fast):
            for dy in _covers(slow):
                tile = math.ceil(fast / dx) * math.ceil(slow / dy)
                for nb in _POW2:
                    threads = dx * dy * nb
                    why = ("tile" if tile > MAX_TILE else
                           "threads" if not MIN_THREADS <= threads <= MAX_THREADS else None)
                    for pf in (0, 1) if _prefetch_searched(spec, fast * slow) else (0,):
                        yield dict(dim_x=dx, dim_y=dy, per_block=nb, prefetch=pf), why
    elif fam == "contract9":
        for nb in _POW2[:10]:
            yield dict(per_block=nb), None
    elif fam == "assembly":
        # rows = 0: the flat final stage (256 threads); 3D also the rows form with
        # nd^3 * rows threads, rows = 1, 2, 4, ... within the block limit
        rows = [0] + ([r for r in _POW2 if spec.nd ** 3 * r <= MAX_THREADS]
                      if spec.dim == 3 else [])
        pads = (0, 1) if spec.nq % 2 == 0 else (0,)     # odd nq: rows are odd already
        for r in rows:
            threads = spec.nd ** 3 * r if r else P.THREADS
            for pad in pads:
                for nb in _POW2[:10]:
                    why = "threads" if r and threads < MIN_THREADS else None
                    yield dict(per_block=nb, rows=r, pad=pad), why
    elif fam == "action":
        T = max(spec.nd, spec.nq)
        for rb in _RB if spec.dim > 1 else (1,):
            tb = math.ceil(T / rb)                    # threads along the blocked axis
            tpi = T * tb if spec.dim == 3 else tb
            upto = MAX_THREADS // tpi
            counts = range(1, upto + 1) if upto <= 16 else _nice(upto)
            for ne in counts:
                threads = ne * tpi
                for mb in _MIN_BLOCKS:
                    why = ("threads" if threads < MIN_THREADS and ne < upto else
                           "resident" if mb * threads > SM_THREADS else None)
                    yield dict(per_block=ne, min_blocks=mb, rb=rb, line=0, prefetch=0), why
        if spec.dim == 3:                             # the line form (action_line.cu.j2)
            tpi = (T | 1) * T
            upto = MAX_THREADS // tpi
            for ne in (range(1, upto + 1) if upto <= 16 else _nice(upto)):
                threads = ne * tpi
                for mb in (0, 2, 4):
                    why = ("threads" if threads < MIN_THREADS and ne < upto else
                           "resident" if mb * threads > SM_THREADS else None)
                    for pf in (0, 1, 2):
                        yield dict(per_block=ne, min_blocks=mb, rb=1, line=1, prefetch=pf), why


def _register_cap(threads, min_blocks):
    """The per-thread register limit ``__launch_bounds__(threads, min_blocks)`` implies."""
    return min(255, (SM_REGISTERS // (threads * max(1, min_blocks))) // 8 * 8)


def _fingerprint(ctx):
    """What distinguishes two rendered kernels (the context; min_blocks by its register cap)."""
    items = dict(ctx)
    mb = items.pop("min_blocks", 0)
    items["register_cap"] = _register_cap(ctx["threads"], mb)
    return tuple(sorted((k, repr(v)) for k, v in items.items()))


def heuristic_params(spec, smem_optin=227 * 1024):
    """The heuristic's choice for ``spec`` in its family's parameters (None: no fused kernel)."""
    fam = family(spec)
    found = ctx_for(spec, None, smem_optin)
    if fam is None or found is None:
        return None
    return {k: found[1][k] for k in PARAMS[fam]}


def generate(spec, smem_optin=227 * 1024) -> Space:
    """The search space of ``spec``: variants to compile, and what was pruned and why.

    Examples
    --------
    >>> from smalltc.spec import AssemblySpec
    >>> sp = generate(AssemblySpec(dim=3, nq=4, nd=3, batch=1, dtype="float64"))
    >>> sp.family, len(sp.candidates) + sp.n_pruned == sp.generated
    ('assembly', True)
    >>> sp.candidates[0].params == sp.heuristic      # the heuristic's choice comes first
    True
    """
    fam = family(spec)
    pruned, kept, seen = Counter(), [], set()
    generated = 0
    if fam is None:
        return Space(spec, None, [], 0, pruned, None)
    heur = heuristic_params(spec, smem_optin)
    first = [(heur, None)] if heur is not None else []    # the heuristic's own choice is kept
    for params, why in first + [r for r in _raw(spec, fam) if r[0] != heur]:
        generated += 1
        if why is None:
            found = ctx_for(spec, params, smem_optin)
            if found is None:
                why = "invalid"
            else:
                fp = _fingerprint(found[1])
                if fp in seen:
                    why = "duplicate"
                else:
                    seen.add(fp)
                    kept.append(Candidate(dict(params), found[0], found[1]))
        if why is not None:
            pruned[why] += 1
    return Space(spec, fam, kept, generated, pruned, heur)


def prune_compiled(resources, threads, max_local_bytes=MAX_LOCAL_BYTES):
    """Why a compiled variant must not be timed (None: keep it).

    ``resources``: ``registers`` and ``local_bytes`` (per-thread local
    memory: stack and spills) of the compiled kernel. More than
    ``max_local_bytes`` of local memory is a spill worth no timing.
    """
    local = resources.get("local_bytes")
    if local is None:
        local = resources.get("spill_stores") or 0
    if local > max_local_bytes:
        return "spills"
    regs = resources.get("registers")
    if regs is not None and regs * threads > SM_REGISTERS:
        return "registers"
    return None
