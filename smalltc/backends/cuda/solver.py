"""The solver kernel families: vector updates, PCG, p-multigrid transfers, CSR, Schwarz.

The kernels of the iterative solvers (:mod:`smalltc.solver`), one small family each, all
grid-stride loops whose launch is the tuning:

=================  ====================  ===============================  ==================
family             spec                  template                         parameters
=================  ====================  ===============================  ==================
``vector_update``  VectorUpdateSpec      ``pmg_vector.cu.j2``             ``threads``,
                                                                          ``waves`` (blocks
                                                                          an SM at most)
``pcg``            PcgSpec               ``cg.cu.j2`` (five entries)      ``threads``,
                                                                          ``blocks`` (the
                                                                          fixed grid of the
                                                                          partial sums)
``pmg_transfer``   TransferSpec          ``pmg_transfer.cu.j2``           ``threads``
``csr_spmv``       CsrSpmvSpec           ``csr_spmv.cu.j2``               ``threads``
``schwarz_fdm``    SchwarzSpec           ``schwarz_fdm.cu.j2``            ``threads``
=================  ====================  ===============================  ==================

The heuristics are the launches these kernels had when the FEM layer launched them
itself (256 threads for the vector kernels and the CSR rows, at most 8 blocks an SM for
the vector updates; 256 x 1024 for the PCG sums; 128 threads an element for the
transfers; the Schwarz solve's ``n^dim`` outputs in whole warps up to 128 threads); no
tuning table holds entries for them yet, and ``space`` lists what the tuner may walk. The
Schwarz kernel holds an element's buffers in static shared memory: sizes above 48 KiB
are not claimed (the reference path runs them, reported).

Examples
--------
>>> from smalltc.spec import TransferSpec
>>> s = TransferSpec(dim=3, nin=2, nout=5, batch=8, dtype="float64", n_in=27, n_out=729)
>>> c = TRANSFER.context(s)
>>> TRANSFER.entry(s, c), c["threads"]
('stc_pmg_prolong_3d_f64_n2n5_i32', 128)
>>> sorted(p["threads"] for p, why in TRANSFER.space(s) if why is None)
[32, 64, 128, 256]
"""
from __future__ import annotations

import numpy as np

from ..._errors import raise_pending
from ..base import Executor
from ..reference_solvers import preconditioned
from . import runtime as RT
from .family import DEFAULT_DEVICE, DT, ITEMSIZE, Family

__all__ = ["VECTOR_UPDATE", "PCG", "TRANSFER", "CSR_SPMV", "SCHWARZ_FDM",
           "SOLVER_FAMILIES", "SMEM_STATIC"]

_THREADS = (32, 64, 128, 256, 512, 1024)
_ITYPE = {"int32": "int", "int64": "long long"}
#: static shared memory a block may declare (the Schwarz kernel's buffers)
SMEM_STATIC = 48 * 1024
#: the grid of a one-block-an-item kernel, at most
_MAX_GRID = 65535 * 8


def _warps(n):
    return -(-n // 32) * 32


class _SolverFamily(Family):
    """What the solver families share: one op, launches as parameters, no size rules."""

    op = "?"
    public_keys = ("threads", "waves", "blocks")

    def claims(self, spec):
        return spec.op == self.op

    def supports(self, spec):
        return True

    def _threads_ok(self, t, lo=32):
        return isinstance(t, int) and lo <= t <= 1024 and t & (t - 1) == 0

    def carry(self, spec, entry_spec, params, device):
        """Launch parameters do not depend on the size: the entry's, where they fit."""
        return params if self.context(spec, params, device) is not None else None

    def public(self, ctx):
        return {k: ctx[k] for k in self.params}


class _Launches(Executor):
    """Compiled entries of one choice on each device (compiled on first use there)."""

    def __init__(self, choice, device):
        self.choice, self.spec, self.ctx = choice, choice.spec, choice.ctx
        self.template = choice.template
        self.kernel, self.source, self.table = choice.entry, choice.source, choice.table
        self.params = choice.family.public(choice.ctx)
        self.device = device
        self.threads = self.ctx["threads"]
        self._fns = {}
        self._k(self.kernel)

    def _k(self, entry):
        key = (RT.current_device_id(), entry)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = RT.get_kernel(self.template, entry, self.ctx)
        return fn


# ---- the vector updates -------------------------------------------------------------------

class VectorUpdateFamily(_SolverFamily):
    """``pmg_vector.cu.j2``: one grid-stride kernel a mode."""

    name = op = "vector_update"
    templates = ("pmg_vector.cu.j2",)
    params = ("threads", "waves")

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        p = dict(threads=256, waves=8) if params is None else params
        t, w = p.get("threads"), p.get("waves")
        if set(p) - set(self.params) or not self._threads_ok(t) or not isinstance(w, int) \
                or not 1 <= w <= 64:
            return None
        return dict(dtype=spec.dtype, mode=spec.mode, threads=t, waves=w, min_blocks=0)

    def entry(self, spec, ctx):
        return f"stc_pmg_{spec.mode}_{DT[spec.dtype]}"

    def executor(self, choice, device):
        return VectorUpdateExecutor(choice, device)

    def space(self, spec):
        for t in _THREADS:
            for w in (1, 2, 4, 8, 16, 32):
                yield dict(threads=t, waves=w), None


class VectorUpdateExecutor(_Launches):
    """One launch: the grid covers the vector, at most ``waves`` blocks an SM; an unmasked
    spec passes a vector of ones as the mask."""

    def __init__(self, choice, device):
        super().__init__(choice, device)
        n = self.spec.batch
        self._grid = (int(max(1, min(-(-n // self.threads), self.ctx["waves"] * device["sms"]))),)
        self._block = (self.threads,)
        self._n = np.int64(n)
        self._real = np.dtype(self.spec.dtype).type
        self._ones = {}

    def _mask(self, ops):
        if self.spec.masked:
            return ops[-1]
        dev = RT.current_device_id()
        f = self._ones.get(dev)
        if f is None:
            import cupy
            f = self._ones[dev] = cupy.ones(self.spec.batch, dtype=self.spec.dtype)
        return f

    def run(self, operands, out=None, c0=0.0, c1=1.0, beta=1.0, xzero=False):
        import cupy as cp
        mode, k, f, R = self.spec.mode, self._k(self.kernel), self._mask(operands), self._real
        if mode == "start":
            r, inv = operands[:2]
            d, dm = out if out is not None else (cp.empty_like(r), cp.empty_like(r))
            k(self._grid, self._block, (r, inv, f, d, dm, R(c1), self._n))
            return d, dm
        if mode == "step":
            y, r, x, d, dm, inv = operands[:6]
            k(self._grid, self._block, (y, r, x, d, dm, inv, f, R(c0), R(c1), R(beta),
                                        np.int32(bool(xzero)), self._n))
            return None
        if mode == "residual":
            b, y, x = operands[:3]
            r = cp.empty_like(b) if out is None else out
            k(self._grid, self._block, (b, y, x, f, r, self._n))
            return r
        d, x = operands[:2]
        xm = cp.empty_like(d) if out is None else out
        k(self._grid, self._block, (d, x, xm, f, R(beta), np.int32(bool(xzero)), self._n))
        return x, xm


# ---- Jacobi-PCG -------------------------------------------------------------------------

_CG_ENTRIES = ("stc_cg_dot", "stc_cg_alpha", "stc_cg_update", "stc_cg_beta",
               "stc_cg_direction")


class PcgFamily(_SolverFamily):
    """``cg.cu.j2``: the five kernels of an iteration, every scalar on the device."""

    name = op = "pcg"
    templates = ("cg.cu.j2",)
    params = ("threads", "blocks")

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        p = dict(threads=256, blocks=1024) if params is None else params
        t, b = p.get("threads"), p.get("blocks")
        if set(p) - set(self.params) or not self._threads_ok(t, 64) or not isinstance(b, int) \
                or not 1 <= b <= 8192:
            return None
        return dict(dtype=spec.dtype, threads=t, blocks=b, jacobi=int(spec.jacobi))

    def entry(self, spec, ctx):
        return "stc_cg_update"

    def executor(self, choice, device):
        return PcgExecutor(choice, device)

    def space(self, spec):
        for t in (64, 128, 256, 512, 1024):
            for b in (128, 256, 512, 1024, 2048, 4096):
                yield dict(threads=t, blocks=b), None


class PcgExecutor(_Launches):
    """Iterations queued without waiting for the device (``templates/cuda/cg.cu.j2``).
    ``red``: sums the per-block partial sums across ranks (stream-ordered through NCCL;
    an MPI sum waits for the device).

    Jacobi or no preconditioner: the state is read every ``check_every`` iterations (the
    iterations queued past the stop do nothing). Any other preconditioner (``precond``,
    e.g. a V-cycle, whose applications cost many operator applications): the host stays
    one iteration ahead of the device and reads each iteration's state, copied to
    pinned memory behind it; where the residuals' recent rate says the next iteration
    may reach ``tol``, it waits for that iteration before queueing another, so at most
    one iteration (and rarely that) is queued past the stop."""

    def run(self, operands, out=None, *, apply, tol, maxiter, bnorm, history, shape=None,
            check_every=8, red=None, precond=None):
        import cupy as cp

        x, r = operands[:2]
        shape = x.shape if shape is None else tuple(shape)
        inv = operands[2] if self.spec.jacobi else None
        if precond is not None:
            z = preconditioned(cp, precond, r, shape)
        else:
            z = r * inv if inv is not None else r
        p = z.copy()
        rz = float(cp.vdot(r, z).real)
        if red is not None:
            (rz,) = red.sums(rz)
        if history[-1] <= tol or maxiter == 0 or not rz > 0:
            code = 1 if history[-1] <= tol else 2 if maxiter == 0 else 4
            return 0, code, rz if code == 4 else history[-1]
        hcap = check_every if precond is None else 2
        state = cp.asarray([rz, 0, 0, 0, 0, bnorm, tol, maxiter, 0, 0, hcap] + [0] * hcap,
                           dtype=cp.float64)
        NB = self.ctx["blocks"]
        parts = (cp.zeros(NB, dtype=cp.float64), cp.zeros(2 * NB, dtype=cp.float64))
        vectors = (x, r, p, inv, state, parts)
        if precond is None:
            return self._iterations(vectors, apply, shape, history, red, hcap)
        return self._ahead(vectors, apply, precond, shape, history, tol, maxiter, red)

    def _queue(self, vectors, apply, precond, shape, red):
        """One iteration queued."""
        import cupy as cp

        x, r, p, inv, state, (part1, part2) = vectors
        k = {e: self._k(e) for e in _CG_ENTRIES}
        NT, NB = self.ctx["threads"], self.ctx["blocks"]
        n = np.int64(r.size)
        ST, hist = state[:11], state[11:]
        invv = r if inv is None else inv
        grid, one, blk = (NB,), (1,), (NT,)
        Ap = cp.asarray(apply(p.reshape(shape)))
        if Ap.shape != shape:
            raise ValueError(f"the operator returned an array of shape {Ap.shape} for a "
                             f"vector of shape {shape}: apply(x) must return A x in x's "
                             f"shape")
        Ap = Ap.reshape(-1)
        k["stc_cg_dot"](grid, blk, (p, Ap, part1, np.int32(1), ST, n))
        if red is not None:
            red.sum_array(part1)
        k["stc_cg_alpha"](one, blk, (part1, ST))
        k["stc_cg_update"](grid, blk, (x, r, p, Ap, invv, part2, ST, n))
        if precond is not None:
            z = preconditioned(cp, precond, r, shape)
            k["stc_cg_dot"](grid, blk, (r, z, part2[1:], np.int32(2), ST, n))
        if red is not None:
            red.sum_array(part2)
        k["stc_cg_beta"](one, blk, (part2, ST, hist))
        if precond is None:
            k["stc_cg_direction"](grid, blk, (p, r, invv, ST, n))
        else:
            k["stc_cg_direction"](grid, blk, (p, z, z, ST, n))

    def _iterations(self, vectors, apply, shape, history, red, cap):
        """Jacobi or none: ``cap`` (``check_every``) iterations queued between reads."""
        import cupy as cp

        state = vectors[4]
        done, seen = 0, 0
        while not done:
            for _ in range(cap):
                self._queue(vectors, apply, None, shape, red)
            st = cp.asnumpy(state)
            raise_pending()              # a bad map index the operator's kernels reported
            done, it = int(st[9]), int(st[8])
            history.extend(st[11 + (i - 1) % cap] for i in range(seen + 1, it + 1))
            seen = it
        value = {3: st[1], 4: st[0]}.get(done, history[-1])
        return it, done, float(value)

    def _ahead(self, vectors, apply, precond, shape, history, tol, maxiter, red):
        """Any preconditioner: one iteration queued ahead, each iteration's state read
        from pinned memory (see the class docstring)."""
        mirror = RT.HostMirror(vectors[4], 2)
        queued, read, done, it, st = 0, 0, 0, 0, None

        def queue():
            nonlocal queued
            self._queue(vectors, apply, precond, shape, red)
            mirror.queue(queued % 2)
            queued += 1

        queue()
        while True:
            if queued - read == 1 and queued < maxiter and not _near_stop(history, tol):
                queue()                          # the device never waits for the host
            st = mirror.read(read % 2)
            read += 1
            raise_pending()
            done, now = int(st[9]), int(st[8])
            history.extend(st[11 + (i - 1) % 2] for i in range(it + 1, now + 1))
            it = now
            if done:
                break
            if queued == read:
                queue()
        if queued > read:
            mirror.read(read % 2)                # the copy of the one queued past the stop
        value = {3: st[1], 4: st[0]}.get(done, history[-1])
        return it, done, float(value)


def _near_stop(history, tol, margin=2.0):
    """Whether the next iteration may reach ``tol``: the last residual times the best of
    the last three ratios of successive residuals within ``margin`` of it."""
    if len(history) < 2:
        return history[-1] <= margin * tol
    recent = history[-4:]
    rate = min(b / a if a > 0 else 0.0 for a, b in zip(recent[:-1], recent[1:]))
    return history[-1] * rate <= margin * tol


# ---- the p-multigrid transfers --------------------------------------------------------

class TransferFamily(_SolverFamily):
    """``pmg_transfer.cu.j2``: one block an element, the sum-factorised product in shared
    memory, atomic adds into ``y``."""

    name = op = "pmg_transfer"
    templates = ("pmg_transfer.cu.j2",)
    params = ("threads",)

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        p = dict(threads=128) if params is None else params
        t = p.get("threads")
        big = max(spec.nin, spec.nout) ** spec.dim
        smem = ITEMSIZE[spec.dtype] * (2 * big + spec.nin * spec.nout)
        if set(p) - set(self.params) or not self._threads_ok(t) or smem > SMEM_STATIC:
            return None
        return dict(dtype=spec.dtype, dim=spec.dim, nin=spec.nin, nout=spec.nout, threads=t,
                    min_blocks=0, index_t=_ITYPE[spec.index_dtype])

    def entry(self, spec, ctx):
        way = "prolong" if spec.nout >= spec.nin else "restrict"
        return (f"stc_pmg_{way}_{spec.dim}d_{DT[spec.dtype]}_n{spec.nin}n{spec.nout}_"
                f"i{spec.index_dtype[3:]}")

    def executor(self, choice, device):
        return TransferExecutor(choice, device)

    def space(self, spec):
        need = _warps(max(spec.nin, spec.nout) ** spec.dim)
        for t in _THREADS:
            yield dict(threads=t), ("threads" if t > 2 * max(need, 32) else None)


class TransferExecutor(_Launches):
    """``y = 0`` (unless ``add``), then one launch (the grid: the elements, capped)."""

    def run(self, operands, out=None, add=False):
        import cupy as cp
        M, x, imap, w_in, omap, w_out = operands
        if out is None:
            out = cp.zeros(self.spec.n_out, dtype=self.spec.dtype)
        elif not add:
            out.fill(0)
        E = self.spec.batch
        if E:
            self._k(self.kernel)((int(min(E, _MAX_GRID)),), (self.threads,),
                                 (M, x, imap, w_in, omap, w_out, out, np.int64(E)))
        return out


# ---- the CSR product --------------------------------------------------------------------

class CsrSpmvFamily(_SolverFamily):
    """``csr_spmv.cu.j2``: one thread a row, the row's entries in order."""

    name = op = "csr_spmv"
    templates = ("csr_spmv.cu.j2",)
    params = ("threads",)

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        p = dict(threads=256) if params is None else params
        t = p.get("threads")
        if set(p) - set(self.params) or not self._threads_ok(t):
            return None
        return dict(dtype=spec.dtype, index_t=_ITYPE[spec.index_dtype], threads=t,
                    min_blocks=0)

    def entry(self, spec, ctx):
        return f"stc_csr_spmv_{DT[spec.dtype]}_i{spec.index_dtype[3:]}"

    def executor(self, choice, device):
        return CsrSpmvExecutor(choice, device)

    def space(self, spec):
        for t in _THREADS:
            yield dict(threads=t), None


class CsrSpmvExecutor(_Launches):
    def run(self, operands, out=None):
        import cupy as cp
        indptr, indices, data, x = operands
        rows = self.spec.batch
        y = cp.empty(rows, dtype=self.spec.dtype) if out is None else out
        grid = (int(max(1, min(-(-rows // self.threads), 65535))),)
        self._k(self.kernel)(grid, (self.threads,), (indptr, indices, data, x, y,
                                                     np.int64(rows)))
        return y


# ---- the Schwarz fast-diagonalisation solve -------------------------------------------

class SchwarzFamily(_SolverFamily):
    """``schwarz_fdm.cu.j2``: one block an element, gather, the local solve in shared
    memory, atomic adds; claimed where an element's buffers fit static shared memory."""

    name = op = "schwarz_fdm"
    templates = ("schwarz_fdm.cu.j2",)
    params = ("threads",)

    @staticmethod
    def fits(spec):
        n, d = spec.n, spec.dim
        return (2 * n ** d + d * n * n) * ITEMSIZE[spec.dtype] <= SMEM_STATIC

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        if not self.fits(spec):
            return None
        p = dict(threads=min(128, _warps(spec.n ** spec.dim))) if params is None else params
        t = p.get("threads")
        if set(p) - set(self.params) or not isinstance(t, int) or t % 32 or not 32 <= t <= 1024:
            return None
        return dict(dtype=spec.dtype, dim=spec.dim, n=spec.n, threads=t,
                    index_t=_ITYPE[spec.index_dtype])

    def entry(self, spec, ctx):
        return (f"stc_schwarz_fdm_{spec.dim}d_n{spec.n}_{DT[spec.dtype]}_"
                f"i{spec.index_dtype[3:]}")

    def executor(self, choice, device):
        return SchwarzExecutor(choice, device)

    def space(self, spec):
        need = _warps(spec.n ** spec.dim)
        for t in range(32, 1025, 32):
            yield dict(threads=t), ("threads" if t > need else None)


class SchwarzExecutor(_Launches):
    """``z = 0``, then one launch."""

    def run(self, operands, out=None):
        import cupy as cp
        S, inv, idx, r, w = operands
        n = self.spec.ndofs
        r = r.astype(self.spec.dtype, copy=False)
        z = cp.zeros(n, dtype=self.spec.dtype) if out is None else out
        if out is not None:
            z.fill(0)
        E = self.spec.batch
        if E:
            self._k(self.kernel)((int(min(E, _MAX_GRID)),), (self.threads,),
                                 (S, inv, idx, r, w, z, np.int64(n), np.int64(E)))
        return z


VECTOR_UPDATE = VectorUpdateFamily()
PCG = PcgFamily()
TRANSFER = TransferFamily()
CSR_SPMV = CsrSpmvFamily()
SCHWARZ_FDM = SchwarzFamily()
#: the families of :mod:`smalltc.solver`'s specs, in the backend's order
SOLVER_FAMILIES = (VECTOR_UPDATE, PCG, TRANSFER, CSR_SPMV, SCHWARZ_FDM)
