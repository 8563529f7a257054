"""The pairwise path: an action or assembly run as the catalogue's steps.

Each step of :mod:`smalltc.catalogue` is one launch of the backend's
reshaping-layout kernel ((8a), (8b) or (9)) on views of the previous step's
output; the pointwise ``C = D * A`` between the halves of the action is one
array multiply. This is the faithful MAGMA approach, and the yardstick the
fused kernels must beat.
"""
from __future__ import annotations

from ._arrays import array_module
from .backends.base import Executor
from .catalogue import steps
from .spec import ContractSpec

__all__ = ["PairwiseExecutor"]


class PairwiseExecutor(Executor):
    """Runs ``spec`` (an action or assembly) as a chain of contract executors."""

    def __init__(self, backend, spec):
        self.spec = spec
        self.steps = steps(spec.op, spec.dim)
        nd, nq = spec.nd, spec.nq
        nbatch = spec.batch * (spec.ncomp if spec.op == "action" else 1)
        self._nbatch = nbatch
        self._subs = []
        for st in self.steps:
            ext = st.extents(nd, nq)
            cs = ContractSpec(kind=st.kernel, batch=nbatch, dtype=spec.dtype,
                              shared_x=st.x[0] == "B", shared_y=st.y[0] == "B", **ext)
            self._subs.append((st, cs, backend.build(cs)))
        self.kernel = "pairwise " + " ".join(
            f"{st.label}:{ex.kernel}" for st, _, ex in self._subs)
        self.specialized = all(ex.specialized for _, _, ex in self._subs)
        self.params = {st.label: ex.params for st, _, ex in self._subs if ex.params}

    def run(self, operands, out, **scalars):
        spec = self.spec
        B1d, D = operands[0], operands[1]
        V = operands[2] if spec.op == "action" else None
        xp = array_module(B1d)
        nq, n = spec.nq, self._nbatch
        prev = None
        last = len(self._subs) - 1
        for idx, (st, cs, ex) in enumerate(self._subs):
            views = []
            for (name, _), core in ((st.x, cs.x_shape), (st.y, cs.y_shape)):
                src = {"B": B1d, "V": V, "D": D, "C": prev}[name]
                views.append(src.reshape(core))
            dest = out.reshape(cs.out_shape) if idx == last else xp.empty(cs.out_shape,
                                                                          dtype=spec.dtype)
            ex.run(tuple(views), dest)
            if st.scale:
                E = spec.batch
                ncomp = n // E if E else 1
                d3 = dest.reshape(E, ncomp, nq ** spec.dim)
                xp.multiply(d3, D.reshape(E, 1, nq ** spec.dim), out=d3)
            prev = dest
