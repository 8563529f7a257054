"""Search spaces: the kernel variants worth compiling for one size (notes/tuning.md section 2).

Each CUDA kernel family (:mod:`smalltc.backends.cuda.layout`, ``.contract9``,
``.action``, ``.assembly``), and each CPU one (:mod:`smalltc.backends.cpu`), lists
its raw space (``family.space(spec)``:
parameter sets, each with a reason to drop it before compiling or None) and
turns parameters into a rendering context (``family.context``), or None when
they do not fit. This module keeps the variants that render distinct kernels:

- ``invalid``: the family's context is None (shared memory above the
  device's opt-in limit, more than 1024 threads, an extent too large);
- the family's own reasons (``threads``, ``tile``, ``resident``: see each
  family's ``space`` docstring);
- ``duplicate``: a choice that renders the same kernel as one kept (same
  context, or a ``min_blocks`` with the same register cap).

The heuristic's own choice comes first. After compiling,
:func:`prune_compiled` drops variants that spill (more than
:data:`MAX_LOCAL_BYTES` of local memory per thread, the backend's own limit)
or whose registers cannot be launched with their block size.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from smalltc.backends.cuda import family_of
from smalltc.backends.cuda.family import (DEFAULT_DEVICE, MAX_LOCAL_BYTES, SM_REGISTERS)

__all__ = ["Candidate", "Space", "generate", "prune_compiled", "MAX_LOCAL_BYTES"]


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
    family: object            # the kernel family (None: only the generic kernel runs it)
    candidates: list
    generated: int
    pruned: Counter
    heuristic: dict | None    # the heuristic's choice, in this family's parameters

    @property
    def n_pruned(self) -> int:
        return sum(self.pruned.values())


def _register_cap(threads, min_blocks):
    """The per-thread register limit ``__launch_bounds__(threads, min_blocks)`` implies."""
    return min(255, (SM_REGISTERS // (threads * max(1, min_blocks))) // 8 * 8)


def _fingerprint(ctx):
    """What distinguishes two rendered kernels (the context; a CUDA kernel's min_blocks by
    its register cap)."""
    items = dict(ctx)
    mb = items.pop("min_blocks", 0)
    if "threads" in ctx:
        items["register_cap"] = _register_cap(ctx["threads"], mb)
    return tuple(sorted((k, repr(v)) for k, v in items.items()))


def generate(spec, device=DEFAULT_DEVICE, family_of=family_of) -> Space:
    """The search space of ``spec`` on ``device``: variants to compile, and what was
    pruned and why. ``family_of``: the backend's (default the CUDA backend's; the
    CPU's for ``smalltc tune --device cpu``, whose ``device`` is the tuner's record
    of the CPU, with its ``isa``).

    Examples
    --------
    >>> from smalltc.spec import AssemblySpec
    >>> sp = generate(AssemblySpec(dim=3, nq=4, nd=3, batch=1, dtype="float64"))
    >>> sp.family.name, len(sp.candidates) + sp.n_pruned == sp.generated
    ('assembly', True)
    >>> sp.candidates[0].params == sp.heuristic      # the heuristic's choice comes first
    True
    """
    fam = family_of(spec)
    pruned, kept, seen = Counter(), [], set()
    generated = 0
    if fam is None:
        return Space(spec, None, [], 0, pruned, None)
    heur = fam.heuristic_params(spec, device)
    first = [(heur, None)] if heur is not None else []    # the heuristic's own choice is kept
    for params, why in first + [r for r in fam.space(spec) if r[0] != heur]:
        generated += 1
        if why is None:
            ctx = fam.context(spec, params, device)
            if ctx is None:
                why = "invalid"
            else:
                fp = _fingerprint(ctx)
                if fp in seen:
                    why = "duplicate"
                else:
                    seen.add(fp)
                    kept.append(Candidate(dict(params), fam.template(ctx), ctx))
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
