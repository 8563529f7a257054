"""The benchmark suites: which cases, at which batch sizes, on which device.

=========  ===================================================================
suite      cases
=========  ===================================================================
gemm       square n = 2..32 (``C = A B + C``, the paper's Figures 8-9) at the
           paper's batch (100,000) and at a batch whose footprint exceeds
           256 MB (beyond the L2 cache); rectangular cases, some with a shared A
action     dim 2 and 3, p = 1..8, nq = p+1 and p+2, ncomp 1 and 3, ~2^25
           element DoFs per case
assembly   dim 2 and 3, p = 1..6, nq = p+2: the mass matrices, and with ``--qfunc``
           the stiffness (diffusion, helmholtz; "+co" collocated, nq = p+1)
pairwise   each catalogue step (0a)-(5b) at a few p, nq = p+2
bp1        CEED BP1: the global mass operator (fused, deterministic, unfused)
           and a Jacobi-CG iteration, 3D p = 1..8 (:mod:`.bp1`); not in the
           default run
bp3, bp5   CEED BP3 and BP5: the diffusion operator (Gauss points, nq = p+2;
           collocated Gauss-Lobatto points, nq = p+1), the same measurements
           plus the einsum chain, ~4M unique DoFs (:mod:`.bp1`); not in the
           default run
force      BLAST's corner force F and F^T at Laghos' sizes (3D p = 1..8, 2D
           p = 1..5, nq = 2p): element level, fused with the kinematic map, the
           einsum chain (:mod:`.force`); not in the default run
solve      Poisson solves to 1e-8: Jacobi-CG, Chebyshev and p-multigrid,
           3D p = 2..8, Kershaw (default) or sine-distorted mesh
           (:mod:`.solve`); not in the default run
poisson    a user's Poisson solve from the mesh to the VTU file, phase by
           phase (mesh, space, operator, load and boundary conditions,
           preconditioner, solve, errors, output), cold and warm, with the
           peak memory: box and Kershaw meshes, p = 2, 4, 7, Jacobi and
           p-multigrid, ~2M DoFs (:mod:`.poisson`); not in the default run
basis      the basis application through the DoF map
           (``smalltc.interpolate``, ``smalltc.integrate``: values,
           gradients, both), 3D p = 1..8, nq = p+2, against its bound, the
           reference path and the einsum chain (:mod:`.basis`); not in the
           default run
scaling    weak and strong scaling of the distributed Poisson solve over MPI
           rank counts, each launched with mpiexec (:mod:`.scaling`; run on its
           own, not through :func:`cases`)
geometry   the pointwise geometry (``smalltc.geometry_data``: |J|, the
           adjugate, D, Q with and without a coefficient), 3D p = 1..8,
           nq = p+2, against its bound, the reference path and linalg
           (:mod:`.geometry`); not in the default run
=========  ===================================================================

The sizes above are for a GPU. On a CPU the problems are smaller (a 2-core
host would need hours otherwise): GEMM batches are capped by a 64 MiB
footprint (still beyond the L3 cache), the action uses 2^20 DoFs, assembly
and pairwise steps 32 MiB. ``quick`` shrinks everything further for smoke
tests. Each case records the reason for its batch in ``note``.

Examples
--------
>>> cs = cases("gemm", "float64", "cpu", sizes=[4], quick=True)
>>> [c.id for c in cs]
['gemm m=4 n=4 k=4 beta=1 batch_class=paper float64']
"""
from __future__ import annotations

import math

import numpy as np

from ..catalogue import STEPS
from .basis import cases as basis_cases
from .bp1 import cases as bp_cases
from .cases import Case
from .force import cases as force_cases
from .geometry import cases as geometry_cases
from .poisson import cases as poisson_cases
from .solve import cases as solve_cases

__all__ = ["SUITES", "DEFAULT_SUITES", "BP_SUITES", "ASSEMBLY_FORMS", "cases", "Sizing"]

#: the suites a run without --suite measures: the kernels
DEFAULT_SUITES = ("gemm", "action", "assembly", "pairwise")
#: the CEED bake-off suites: the FEM operators and CG (:mod:`.bp1`)
BP_SUITES = ("bp1", "bp3", "bp5")
#: every suite: the kernels, the bake-off problems, the solves (:mod:`.solve`), the corner
#: force, a user's Poisson solve by phase (:mod:`.poisson`), the basis application, the
#: pointwise geometry and the distributed solve's scaling (:mod:`.scaling`)
SUITES = DEFAULT_SUITES + BP_SUITES + ("solve", "force", "poisson", "basis", "geometry",
                                       "scaling")

MiB = 2 ** 20

# Rectangular GEMMs (beta = 0): generic shapes, and the shapes of the
# sum-factorised action (B1d shared by the batch: m = nq, k = nd).
RECT = (
    dict(m=4, n=8, k=16), dict(m=8, n=16, k=4), dict(m=16, n=32, k=8),
    dict(m=32, n=8, k=16), dict(m=8, n=64, k=8),
    dict(m=5, n=16, k=4, shared_a=True), dict(m=9, n=64, k=8, shared_a=True),
    dict(m=4, n=25, k=5, shared_a=True), dict(m=8, n=81, k=9, shared_a=True),
)


class Sizing:
    """Batch-size rules for one device kind (``"gpu"`` or ``"cpu"``)."""

    def __init__(self, kind, quick=False, footprint=None):
        """``footprint`` (bytes): the CPU cases' target footprint instead of the defaults
        (GEMM at most, the action and assembly about that much); e.g. twice the last-level
        cache, so that the bandwidth bound (a DRAM copy) applies."""
        self.kind, self.quick, self.footprint = kind, quick, footprint
        gpu = kind == "gpu"
        shrink = 16 if quick else 1
        self.gemm_paper = 100_000 // (1 if not quick else (10 if gpu else 50))
        self.gemm_cap = (None if gpu else 64 * MiB // shrink)       # CPU: footprint cap
        self.gemm_large = (512 * MiB // shrink) if gpu else None    # GPU: beyond the L2
        self.action_dofs = (2 ** 25 if gpu else 2 ** 20) // shrink
        self.fem_bytes = (512 * MiB if gpu else 32 * MiB) // shrink
        if footprint is not None and not gpu:
            self.gemm_cap = self.fem_bytes = int(footprint)
            self.gemm_paper = max(self.gemm_paper, 1 << 30)          # the cap decides
            self.action_dofs = max(1, int(footprint) // 24)          # ~3 float64 per DoF

    def note(self):
        if self.kind == "gpu":
            return ""
        if self.footprint is not None:
            return f"CPU sizes: footprint ~{self.footprint // MiB} MiB (--footprint)"
        return ("CPU sizes: smaller batches than on a GPU (GEMM footprint <= "
                f"{self.gemm_cap // MiB} MiB, action {self.action_dofs} DoFs, "
                f"assembly/pairwise ~{self.fem_bytes // MiB} MiB)")


def _gemm_item_bytes(d, s):
    beta = float(d.get("beta", 0.0)) != 0.0
    a = 0 if d.get("shared_a") else d["m"] * d["k"]
    b = 0 if d.get("shared_b") else d["k"] * d["n"]
    return s * (a + b + d["m"] * d["n"] * (3 if beta else 2))   # C read + out written


def _gemm_cases(dtype, sz, sizes, quick):
    s = np.dtype(dtype).itemsize
    ns = list(range(2, 33)) if not quick else [2, 4, 8, 16, 32]
    rect = [dict(r) for r in RECT] if not quick else [dict(RECT[0]), dict(RECT[6])]
    if sizes:
        ns = [n for n in ns if n in sizes] or [n for n in sizes if isinstance(n, int)]
        rect = rect if "rect" in sizes else []
    out = []
    shapes = [dict(m=n, n=n, k=n, beta=1.0) for n in ns] + [dict(r, beta=0.0) for r in rect]
    for d in shapes:
        item = _gemm_item_bytes(d, s)
        batches = []
        paper = sz.gemm_paper
        note = ""
        if sz.gemm_cap is not None and paper * item > sz.gemm_cap:
            paper = max(1, sz.gemm_cap // item)
            note = sz.note()
        batches.append(("paper", paper, note))
        if sz.gemm_large is not None and paper * item < 256 * MiB // (16 if sz.quick else 1):
            large = max(paper, math.ceil(sz.gemm_large / item))
            batches.append(("large", large, "footprint beyond the L2 cache"))
        for cls, batch, note in batches:
            out.append(Case("gemm", "gemm", dict(d, batch=batch, batch_class=cls), dtype, note))
    return out


def _action_cases(dtype, sz, ps, dims):
    out = []
    for dim in dims:
        for p in ps:
            nd = p + 1
            for nq in (p + 1, p + 2):
                for ncomp in (1, 3):
                    E = max(1, round(sz.action_dofs / (ncomp * nd ** dim)))
                    out.append(Case("action", "action", dict(dim=dim, p=p, nq=nq, ncomp=ncomp,
                                                             batch=E), dtype, sz.note()))
    return out


#: the assembly suite's operator forms (``--qfunc``): the qfunc, "+co" for collocated
ASSEMBLY_FORMS = ("mass", "diffusion", "helmholtz", "diffusion+co", "helmholtz+co")


def _assembly_cases(dtype, sz, ps, dims, qfuncs=("mass",)):
    s = np.dtype(dtype).itemsize
    bad = [q for q in qfuncs if q not in ASSEMBLY_FORMS]
    if bad:
        raise ValueError(f"assembly forms are {', '.join(ASSEMBLY_FORMS)}; got "
                         f"{', '.join(bad)}")
    out = []
    for form in qfuncs:
        qfunc, co = form.split("+")[0], form.endswith("+co")
        for dim in dims:
            for p in ps:
                if p > 6:
                    continue
                nd = p + 1
                nq = nd if co else p + 2
                ndata = {"mass": 1, "diffusion": 0, "helmholtz": 1}[qfunc] + (
                    0 if qfunc == "mass" else dim * (dim + 1) // 2)
                per = s * (ndata * nq ** dim + nd ** (2 * dim))
                E = max(16, sz.fem_bytes // per)
                extra = {} if qfunc == "mass" else dict(qfunc=qfunc)
                if co:
                    extra["collocated"] = True
                out.append(Case("assembly", "assembly", dict(dim=dim, p=p, nq=nq, batch=E,
                                                             **extra), dtype, sz.note()))
    return out


def _pairwise_cases(dtype, sz, ps):
    s = np.dtype(dtype).itemsize
    out = []
    for st in STEPS:
        for p in ps:
            if st.op == "assembly" and p > 6:
                continue
            nd, nq = p + 1, p + 2
            e = st.extents(nd, nq)
            if st.kernel == "9":
                per = e["k"] * e["s"] * e["l"] + e["k"] * e["i"] * e["l"] * e["j"]
            else:
                per = (e["i"] * e["s"] * e["j"] * (st.x[0] != "B")
                       + e["k"] * e["s"] * e["l"] * (st.y[0] != "B")
                       + e["i"] * e["j"] * e["k"] * e["l"])
            E = max(16, sz.fem_bytes // (s * per))
            out.append(Case("pairwise", "step", dict(label=st.label, dim=st.dim, p=p, nq=nq,
                                                     batch=E), dtype, sz.note()))
    return out


def cases(suite, dtype, kind, *, sizes=None, ps=None, dims=None, quick=False,
          footprint=None, ndofs=None, mesh=None, qfuncs=None, preconds=None) -> list:
    """The cases of ``suite`` for ``dtype`` on a device of ``kind`` ("cpu"/"gpu").

    ``sizes`` filters the square GEMM sizes (add ``"rect"`` to keep the
    rectangular ones); ``ps`` the polynomial orders; ``dims`` the dimensions;
    ``footprint`` (bytes) sets the CPU cases' size (:class:`Sizing`); ``ndofs`` the
    solve and poisson suites' (about that many DoFs a case); ``mesh`` the solve suite's
    mesh (``"kershaw[:eps]"``, the default, or ``"sine[:amplitude]"``) or the poisson
    suite's (``"box"``, ``"kershaw[:eps]"``, comma separated; default both); ``qfuncs``
    the assembly suite's operator forms (:data:`ASSEMBLY_FORMS`; default the mass
    matrices); ``preconds`` the poisson suite's preconditioners (default jacobi, pmg).

    >>> [c.id for c in cases("assembly", "float64", "cpu", ps=[2], dims=[3], quick=True,
    ...                      qfuncs=["mass", "diffusion+co"])]
    ['assembly dim=3 p=2 nq=4 float64', 'assembly dim=3 p=2 nq=3 qfunc=diffusion collocated float64']
    """
    sz = Sizing(kind, quick, footprint)
    dims = list(dims) if dims else [2, 3]
    if suite == "gemm":
        return _gemm_cases(dtype, sz, sizes, quick)
    if suite == "action":
        ps_ = ps or ([1, 2, 4, 8] if quick else list(range(1, 9)))
        return _action_cases(dtype, sz, ps_, dims)
    if suite == "assembly":
        ps_ = ps or ([1, 3, 6] if quick else list(range(1, 7)))
        return _assembly_cases(dtype, sz, ps_, dims, tuple(qfuncs or ("mass",)))
    if suite == "pairwise":
        ps_ = ps or ([3] if quick else ([1, 2, 4, 7] if kind == "cpu" else list(range(1, 9))))
        return _pairwise_cases(dtype, sz, ps_)
    if suite in BP_SUITES:
        return bp_cases(dtype, kind, ps, quick, suite)
    if suite == "force":
        return force_cases(dtype, kind, ps, quick, dims)
    if suite == "solve":
        return solve_cases(dtype, kind, ps, quick, ndofs, mesh)
    if suite == "poisson":
        return poisson_cases(dtype, kind, ps, quick, ndofs, mesh, preconds)
    if suite == "basis":
        return basis_cases(dtype, kind, ps, quick, footprint)
    if suite == "geometry":
        return geometry_cases(dtype, kind, ps, quick, footprint)
    if suite == "scaling":
        raise ValueError("the scaling suite launches mpiexec per rank count: run it on its own "
                         "(smalltc bench --suite scaling, smalltc.bench.scaling.main)")
    raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
