"""What every CPU kernel family has: the CPU :class:`Family` base and the executor base.

The CPU families follow the CUDA ones: one module per kernel design, beside its
templates, with the backends' common interface, :class:`Choice` and choice among the
families (:mod:`smalltc.backends.family`). Here contexts are made for a target
(:class:`.target.Target`: None is the host's), every size and parameter a constant
of the rendered module; a table entry names its target by its device record
(``isa``), and its parameters, with the family's defaults for optional ones it lacks,
are carried to another size by ``carry`` (default: the same parameters where they fit).

The heuristics depend on the target's vector width and register count, not on
a chip: ``lanes`` (elements per chunk, a SIMD lane each) is one or two vector
registers of elements, register blocks are sized to the register file.
"""
from __future__ import annotations

import numba

from ..base import Executor
from ..family import Choice, Family as _Family
from .runtime import load_kernel
from .target import resolve, target_of
from .threads import coordinate

__all__ = ["Family", "Choice", "CpuExecutor"]


class Family(_Family):
    """Base of the CPU kernel families; see the module docstring."""

    def resolve(self, where):
        return resolve(where)

    def context(self, spec, params=None, target=None):
        raise NotImplementedError

    def executor(self, choice):
        raise NotImplementedError

    def space(self, spec, target=None):
        raise NotImplementedError

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
