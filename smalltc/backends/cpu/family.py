"""What every CPU kernel family has: the :class:`Family` interface and the executor base.

The CPU families follow the CUDA ones (:mod:`smalltc.backends.cuda.family`): one
module per kernel design, beside its templates, holding in one place

=========================  ==================================================
``claims(spec)``           which specs it runs
``context(spec, p, t)``    the rendering context for tuning parameters ``p``
                           (None: the measured heuristic) on target ``t``
                           (:class:`.target.Target`), or None when they do not
                           fit; every size and parameter a constant
``template(ctx)``          which template renders it
``entry(spec, ctx)``       the kernel's name (``stc_mass_action_3d_f64_nd5_nq6``)
``executor(choice)``       the object that runs it
``params``, ``optional``   its tuning parameters (a table entry's keys), and the
                           value an older entry's missing optional one means
``space(spec, t)``         the raw search space: ``(params, reason)`` pairs,
                           ``reason`` a cause to prune before compiling or None
``adapt(...)``             a table entry's parameters carried to a nearby size
``max_distance``           how near that size must be (:func:`smalltc.tables.distance`)
=========================  ==================================================

The heuristics depend on the target's vector width and register count, not on
a chip: ``lanes`` (elements per chunk, a SIMD lane each) is one or two vector
registers of elements, register blocks are sized to the register file.
"""
from __future__ import annotations

from typing import NamedTuple

import numba

from ..base import Executor
from .runtime import load_kernel
from .target import resolve, target_of
from .threads import coordinate

__all__ = ["Family", "Choice", "CpuExecutor"]


class Choice(NamedTuple):
    """What the backend builds for a spec, decided without compiling anything."""

    family: "Family"
    spec: object
    template: str
    entry: str
    ctx: dict
    source: str           # "heuristic", "table-exact", "table-nearest" or "params"
    table: str | None     # the table's file name when one answered
    target: object        # the .target.Target it is generated for


class Family:
    """Base of the CPU kernel families; see the module docstring."""

    name = "?"
    templates: tuple = ()
    params: tuple = ()
    optional: dict = {}
    max_distance = 2.0

    def claims(self, spec) -> bool:
        raise NotImplementedError

    def supports(self, spec) -> bool:
        """Whether its kernels run the spec's operator instance (``qfunc``, ``collocated``:
        docs/math.md section 7); default the mass operator only. A claimed spec it does not
        support runs elsewhere: the backend has no kernel for it, and the plan falls back to
        the reference backend and says so."""
        return getattr(spec, "qfunc", "mass") == "mass" and not getattr(spec, "collocated",
                                                                        False)

    def context(self, spec, params=None, target=None):
        raise NotImplementedError

    def template(self, ctx) -> str:
        return self.templates[0]

    def entry(self, spec, ctx) -> str:
        raise NotImplementedError

    def executor(self, choice):
        raise NotImplementedError

    def space(self, spec, target=None):
        raise NotImplementedError

    def public(self, ctx) -> dict:
        """The parameters an executor reports (and a table stores)."""
        return {k: ctx[k] for k in self.params if k in ctx}

    def heuristic_params(self, spec, target=None):
        """The heuristic's choice in this family's parameters (None: nothing fits)."""
        ctx = self.context(spec, None, resolve(target))
        return None if ctx is None else self.public(ctx)

    def adapt(self, spec, entry_spec, params, device=None):
        """Parameters tuned for ``entry_spec`` carried over to ``spec``, or None.

        ``device`` is the table's device record (its ``isa`` names the target).
        The entry's own size takes them as they are (with the family's defaults
        for optional ones it lacks); another size gets :meth:`carry`'s.
        """
        target = target_of(device)
        full = {**self.optional, **params}
        if spec == entry_spec.with_batch(spec.batch):
            return full if self.context(spec, full, target) is not None else None
        return self.carry(spec, entry_spec, full, target)

    def carry(self, spec, entry_spec, params, target):
        """Default: the same parameters where they fit."""
        return params if self.context(spec, params, target) is not None else None


class CpuExecutor(Executor):
    """A compiled kernel of a :class:`Choice` (compiled, or loaded from Numba's disk
    cache, when built). ``run`` is the family's."""

    def __init__(self, choice, specialized=True):
        ctx = choice.ctx
        self.choice, self.spec, self.ctx = choice, choice.spec, ctx
        self.kernel, self.source, self.table = choice.entry, choice.source, choice.table
        self.target = choice.target
        self.specialized = specialized
        self.params = dict(choice.family.public(ctx), isa=choice.target.isa)
        self.fn, self.compile_s = load_kernel(choice.template, choice.entry,
                                              slp=ctx.get("slp", True), **ctx["render"])
        coordinate()                  # the BLAS threads beside the kernels' (.threads)

    @staticmethod
    def nparts(nitems):
        """Work parts: one per thread, at most one per item."""
        return max(1, min(numba.get_num_threads(), nitems))
