"""What the backends' kernel families share: :class:`Family`, :class:`Choice`, and the walk
from a spec to its kernel (:class:`Kernels`: ``family_of`` and ``choose``).

A *family* is one kernel design and everything about it, in one module beside its
templates (the CUDA ones in :mod:`smalltc.backends.cuda`, the CPU ones in
:mod:`smalltc.backends.cpu`):

=========================  ==================================================
``claims(spec)``           which specs it runs
``supports(spec)``         which operator instances of those its kernels run
``context(spec, p, w)``    the rendering context for tuning parameters ``p``
                           (None: the measured heuristic) on ``w`` (where it
                           runs: the CUDA device dict, the CPU target), or None
                           when they do not fit
``template(ctx)``          which template renders it (variants of a family)
``entry(spec, ctx)``       the kernel's name (``stc_gemm_nn_f64_m8n8k8``)
``executor(choice, ...)``  the object that runs it
``params``, ``optional``   its tuning parameters (a table entry's keys), and the
                           value an older entry's missing optional one means
``space(spec, ...)``       the raw search space: ``(params, reason)`` pairs
``adapt(...)``             a table entry's parameters carried to a nearby size
``max_distance``           how near that size must be (:func:`smalltc.tables.distance`)
=========================  ==================================================

A backend subclasses :class:`Family` for what its families have in common (the CUDA
launch geometry, the CPU target) and :class:`Kernels` for what its choice needs: where a
spec runs (:meth:`Kernels.resolve`), the tuning tables it reads (:meth:`Kernels.lookup`),
the parameters it accepts and the message when they do not fit, and what an executor
reports as the source of its parameters.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Family", "Choice", "Kernels"]


class Choice(NamedTuple):
    """What a backend builds for a spec, decided without compiling anything."""

    family: "Family"
    spec: object          # the spec the kernel is specialised for (see Family.tuned_spec)
    template: str
    entry: str
    ctx: dict
    source: str           # "heuristic", "table-exact", "table-nearest", "params", ...
    table: str | None     # the table's file name when one answered
    target: object = None  # the CPU target it is generated for (None on a GPU)


class Family:
    """Base of the kernel families; see the module docstring for the interface."""

    name = "?"
    templates: tuple = ()
    params: tuple = ()
    optional: dict = {}
    max_distance = 2.0
    #: what an executor reports as its parameters (those of its context that exist);
    #: None: ``params``
    public_keys: tuple | None = None

    def claims(self, spec) -> bool:
        raise NotImplementedError

    def supports(self, spec) -> bool:
        """Whether its kernels run the spec's operator instance (``qfunc``, ``collocated``:
        docs/math.md section 7); default the mass operator only. A claimed spec it does not
        support runs elsewhere: the backend has no kernel for it, and the plan falls back to
        the reference backend and says so."""
        return getattr(spec, "qfunc", "mass") == "mass" and not getattr(spec, "collocated",
                                                                        False)

    def tuned_spec(self, spec):
        """The spec the kernel, the table entry and the parameters describe (usually
        ``spec`` itself; CUDA's kernel (9) folds large slabs into the batch)."""
        return spec

    def resolve(self, where):
        """Where the family's contexts are made, from what a caller gives (the backend's
        default for None)."""
        return where

    def context(self, spec, params=None, where=None):
        raise NotImplementedError

    def template(self, ctx) -> str:
        return self.templates[0]

    def entry(self, spec, ctx) -> str:
        raise NotImplementedError

    def executor(self, choice, *args):
        raise NotImplementedError

    def space(self, spec, *args):
        raise NotImplementedError

    def public(self, ctx) -> dict:
        """The parameters an executor reports (and a table stores)."""
        keys = self.params if self.public_keys is None else self.public_keys
        return {k: ctx[k] for k in keys if k in ctx}

    def heuristic_params(self, spec, where=None):
        """The heuristic's choice in this family's parameters (None: nothing fits)."""
        ctx = self.context(spec, None, self.resolve(where))
        return None if ctx is None else {k: ctx[k] for k in self.params if k in ctx}


class Kernels:
    """A backend's kernel families, asked in order, and its choice among their kernels.

    ``family_of(spec)`` is the first family that claims ``spec`` (None where it does not
    support the spec's instance, or none claims it); ``choose(spec, where, params)`` what
    the backend builds. The hooks below are the backend's; the defaults are CUDA's.
    """

    name = "?"

    def __init__(self, families):
        self.families = tuple(families)

    def family_of(self, spec):
        """The family whose specialised kernel runs ``spec``, or None (only a generic path)."""
        for fam in self.families:
            if fam.claims(spec):
                return fam if fam.supports(spec) else None
        return None

    def choose(self, spec, where=None, params=None):
        """What the backend builds for ``spec`` on ``where`` (the CUDA device dict of
        :func:`smalltc.backends.cuda.runtime.device_info`, or a CPU target: default the
        host's), decided without compiling: a :class:`Choice`, or None when only a generic
        path runs it.

        ``params`` None: the tuning tables (:mod:`smalltc.tables`), else the family's
        heuristic; ``"heuristic"``: the heuristic without the tables; a dict: those
        parameters, ``ValueError`` when they do not fit.
        """
        where = self.resolve(where)
        fam = self.family_of(spec)
        if fam is None:
            return None
        t = fam.tuned_spec(spec)
        ctx, source, table = None, "params", None
        if params == "heuristic":
            ctx, source = fam.context(t, None, where), "heuristic"
        elif params is not None:
            if self.accepts(fam, params):
                ctx = fam.context(t, dict(params), where)
            if ctx is None:
                raise ValueError(self.misfit(fam, t, params, where))
        else:
            hit = self.lookup(fam, t, where)
            if hit is not None:
                ctx, source, table = fam.context(t, hit.params, where), hit.source, hit.table
            if ctx is None:
                ctx, source, table = fam.context(t, None, where), "heuristic", None
        if ctx is None:
            return None
        return Choice(fam, t, fam.template(ctx), fam.entry(t, ctx), ctx,
                      self.source(fam, ctx, source), table, self.target(where))

    # --- the backend's hooks -------------------------------------------------------------

    def resolve(self, where):
        """``where`` as the families take it."""
        return where

    def lookup(self, fam, spec, where):
        """The tuning tables' hit for ``spec`` (``.params``, ``.source``, ``.table``), or
        None."""
        return None

    def accepts(self, fam, params) -> bool:
        """Whether ``params`` may be given to ``fam.context`` at all."""
        return True

    def misfit(self, fam, spec, params, where) -> str:
        """The message when ``params`` do not fit."""
        return (f"params {params} do not fit {spec} on this device ({fam.name} family; "
                f"parameters {', '.join(fam.params)})")

    def source(self, fam, ctx, source) -> str:
        """What an executor reports as the source of its parameters."""
        return source

    def target(self, where):
        """The :attr:`Choice.target` of a choice made on ``where``."""
        return None
