"""The CUDA backend: size-specialised Jinja2 kernels compiled through CuPy (NVRTC).

Walk from a spec to its kernel:

=================  ==========================  ===================================
spec               template                    entry point (example)
=================  ==========================  ===================================
GemmSpec           ``gemm.cu.j2`` (8a layout)  ``stc_gemm_nn_f64_m8n8k8``
ContractSpec 8a/b  ``gemm.cu.j2``              ``stc_contract8b_f64_i3s3j4k4l1``
ContractSpec 9     ``contract9.cu.j2``         ``stc_contract9_f64_s4n3k1l16``
ActionSpec         ``action.cu.j2`` (fused)    ``stc_mass_apply_3d_f64_nd3nq4c1``
ActionSpec rb>1    ``action_rb.cu.j2``         ``stc_mass_apply_3d_f64_nd9nq10c1``
AssemblySpec       ``assembly.cu.j2`` (fused)  ``stc_mass_assemble_3d_f64_nd3nq4``
anything too big   ``generic.cu.j2``           ``stc_generic8a_f64`` (run-time sizes)
=================  ==========================  ===================================

Parameters come from :mod:`._cuda_params` (a tuning table when one is
installed, else the measured heuristic). Kernels compile when the plan is
built, on the current device; launches go to the current CuPy stream.
Importing this module touches no device.
"""
from __future__ import annotations

import math

import numpy as np

from .._arrays import cupy_or_none, gpu_available
from ..spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec
from . import _cuda_params as P
from . import register
from ._cuda_runtime import (SmalltcCompileError, device_info, direct_launcher, get_global,
                            get_kernel, launch, resident_blocks)
from .base import Backend, Executor, Unsupported

__all__ = ["CudaBackend", "SmalltcCompileError"]

_DT = {"float64": "f64", "float32": "f32"}
_SCALAR_FMT = {"float64": "d", "float32": "f"}      # struct formats of the kernel scalars


def _device():
    import cupy
    dev = cupy.cuda.runtime.getDevice()
    return dev, device_info(dev)


def _params(spec, info, heuristic):
    """(context, source): a tuning table's parameters if it has them, else the heuristic's."""
    table = P.lookup(spec, info["cc"])
    if table is not None:
        ctx = heuristic(table)
        if ctx is not None:
            return ctx, table.get("_source", "table")
    return heuristic(None), "heuristic"


def _public(ctx):
    keys = ("BLK_M", "BLK_N", "BLK_K", "dim_x", "dim_y", "thr_m", "thr_n", "T",
            "per_block", "threads", "smem_bytes", "min_blocks", "rows", "pad", "rb", "line",
            "prefetch")
    return {k: ctx[k] for k in keys if k in ctx}


class _KernelExecutor(Executor):
    """One compiled kernel and its launch geometry."""

    def __init__(self, template, entry, ctx, source, specialized=True):
        self.kernel, self.source, self.specialized = entry, source, specialized
        self.template, self.ctx = template, ctx
        self.params = _public(ctx)
        self.threads, self.smem = ctx["threads"], ctx["smem_bytes"]
        self.per_block = ctx["per_block"]
        self.np_dtype = np.dtype(ctx["dtype"])
        self._fns = {}                       # device id -> compiled kernel
        self._geoms = {}                     # (items, groups) -> (groups, items as int64)
        self._launchers = {}                 # (device, items, grid cap) -> Launcher or None
        attrs = self._kernel_here().attributes
        self.local_bytes = attrs.get("local_size_bytes", 0)
        self.params.update(registers=attrs.get("num_regs"), local_bytes=self.local_bytes)

    def _kernel_here(self):
        """The kernel for the current device (compiled there on first use)."""
        dev = cupy_or_none().cuda.runtime.getDevice()
        fn = self._fns.get(dev)
        if fn is None:
            fn = self._fns[dev] = get_kernel(self.template, self.kernel, self.ctx, self.smem)
        return fn

    #: grid cap (None: a block per group); a kernel that overlaps one group's loads with
    #: the previous group's work needs blocks that loop over several groups
    max_blocks = None

    def _direct(self, fmt, nitems):
        """This kernel's :class:`Launcher` over ``nitems`` items on the current device
        (built on first use), or None: launch through ``RawKernel`` (``_launch``)."""
        key = (cupy_or_none().cuda.runtime.getDevice(), nitems, self.max_blocks)
        d = self._launchers.get(key, False)
        if d is False:
            d = self._launchers[key] = direct_launcher(
                self._kernel_here(), fmt, math.ceil(nitems / self.per_block), self.threads,
                self.smem, self.max_blocks)
        return d

    def _run_arrays(self, nitems, arrays):
        """Launch over ``nitems`` items with the kernel's array parameters ``arrays``
        (then the item count): through the driver where it can, else RawKernel."""
        d = self._direct("P" * len(arrays) + "q", nitems)
        if d is None:
            self._launch(nitems, arrays)
        else:
            d(*[a.data.ptr for a in arrays], nitems)

    def _launch(self, nitems, args, ngroups=None):
        geom = self._geoms.get((nitems, ngroups))
        if geom is None:                     # once per batch count: ceil, int64 box
            geom = self._geoms[(nitems, ngroups)] = (
                math.ceil(nitems / self.per_block) if ngroups is None else ngroups,
                np.int64(nitems))
        launch(self._kernel_here(), geom[0], self.threads, args + (geom[1],),
               self.smem, max_blocks=self.max_blocks)

    def _scal(self, v):
        return self.np_dtype.type(v)


class _LayoutExecutor(_KernelExecutor):
    """GEMM and kernels (8a)/(8b): ``Out = alpha * X . Y (+ beta * C)``."""

    def __init__(self, template, entry, ctx, source, nbatch, generic_ext=None, strides=None):
        super().__init__(template, entry, ctx, source, specialized=generic_ext is None)
        self.nbatch, self._ext, self._strides = nbatch, generic_ext, strides
        s = _SCALAR_FMT[ctx["dtype"]]
        self._fmt = "PPPP" + s + s + "q"     # X, Y, Out, C, alpha, beta, nbatch

    def run(self, operands, out, alpha=1.0, beta=0.0):
        X, Y = operands[0], operands[1]
        C = operands[2] if len(operands) > 2 and operands[2] is not None else out
        if self._ext is None:
            d = self._direct(self._fmt, self.nbatch)
            if d is not None:
                try:
                    d(X.data.ptr, Y.data.ptr, out.data.ptr, C.data.ptr, alpha, beta, self.nbatch)
                    return
                except OverflowError:            # a float32 alpha/beta beyond float32:
                    pass                         # RawKernel's conversion gives inf, as NumPy
        args = (X, Y, out, C, self._scal(alpha), self._scal(beta))
        if self._ext is None:
            self._launch(self.nbatch, args)
        else:
            e = self._ext
            args += tuple(np.int32(e[k]) for k in "ISJKL") + tuple(np.int64(s) for s in self._strides)
            total = self.nbatch * e["I"] * e["J"] * e["K"] * e["L"]
            self._launch(self.nbatch, args, ngroups=math.ceil(total / self.threads))


class _Contract9Executor(_KernelExecutor):
    def __init__(self, entry, ctx, source, nbatch):
        super().__init__("contract9.cu.j2", entry, ctx, source)
        self.nbatch = nbatch

    def run(self, operands, out, **_):
        X, Y = operands
        self._run_arrays(self.nbatch, (X, Y, out))


class _ActionExecutor(_KernelExecutor):
    """The fused action. The line form reads B1d from its module's constant bank
    (``stc_cB``): each call first copies B1d there on the current stream, after the
    previous launch of this kernel on any other stream has finished (an event), so
    calls on several streams with different B1d do not race. (Inside a CUDA-graph
    capture that wait is left out: the graph orders its own nodes.)"""

    def __init__(self, entry, ctx, source, spec):
        super().__init__(P.action_template(ctx), entry, ctx, source)
        self.nbatch = spec.batch * spec.ncomp
        self._line = bool(ctx.get("line"))
        self._slots = {}                     # device id -> get_global's shared slot of stc_cB

    def run(self, operands, out, **_):
        B1d, D, V = operands
        if not self._line:
            self._run_arrays(self.nbatch, (B1d, D, V, out))
            return
        cp = cupy_or_none()
        # one slot per module and device: [stc_cB pointer, event after the last launch,
        # that launch's stream], shared with every other executor of this kernel
        dev = cp.cuda.runtime.getDevice()
        slot = self._slots.get(dev)
        if slot is None:
            slot = self._slots[dev] = get_global(self.template, self.kernel, self.ctx,
                                                 self.smem, "stc_cB")
        if slot[1] is None:
            slot[1] = cp.cuda.Event(disable_timing=True)
        ptr, event, last = slot
        stream = cp.cuda.get_current_stream()
        if last is not None and last != stream.ptr and not stream.is_capturing():
            stream.wait_event(event)
        cp.cuda.runtime.memcpyAsync(ptr.ptr, B1d.data.ptr, B1d.nbytes,
                                    cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
        self._run_arrays(self.nbatch, (D, V, out))
        event.record(stream)
        slot[2] = stream.ptr


class _AssemblyExecutor(_KernelExecutor):
    def __init__(self, entry, ctx, source, spec):
        super().__init__("assembly.cu.j2", entry, ctx, source)
        self.nunits = spec.batch * (spec.nd if spec.dim > 1 else 1)

    def run(self, operands, out, **_):
        B1d, D = operands
        self._run_arrays(self.nunits, (B1d, D, out))


def _cap_grid(ex, info):
    """A prefetching kernel overlaps a group's loads with the previous group's work only
    if its blocks loop over groups: its grid is capped at the blocks resident at once."""
    if ex.ctx.get("prefetch"):
        ex.max_blocks = info["sms"] * resident_blocks(ex._kernel_here(), ex.threads, ex.smem)
    return ex


def _generic(kind, dtype, beta_zero, nbatch, ext, strides):
    ctx = P.generic_ctx(kind, dtype, beta_zero)
    entry = f"stc_generic{kind}_{_DT[dtype]}{'' if beta_zero else '_beta'}"
    return _LayoutExecutor("generic.cu.j2", entry, ctx, "generic", nbatch, ext, strides)


def _build_contract(spec, info):
    e = dict(I=spec.i, S=spec.s, J=spec.j, K=spec.k, L=spec.l)
    xs = 0 if spec.shared_x else (spec.s * spec.i if spec.kind == "9" else spec.i * spec.s * spec.j)
    ys = 0 if spec.shared_y else spec.k * spec.s * spec.l
    dt = _DT[spec.dtype]
    if spec.kind == "9" and spec.shared_x and not spec.shared_y:
        f = P.fold_k9(spec)                 # large K*L: K slabs of one element, as K items
        ctx, src = _params(f, info, lambda p: P.contract9_ctx(
            f.s, f.i, f.k, f.l, f.dtype, info["smem_optin"], p))
        if ctx is not None:
            entry = f"stc_contract9_{dt}_s{f.s}n{f.i}k{f.k}l{f.l}"
            return _Contract9Executor(entry, ctx, src, f.batch)
    elif spec.kind in ("8a", "8b"):
        ctx, src = _params(spec, info, lambda p: P.layout_ctx(
            spec.kind, **e, dtype=spec.dtype, shared_x=spec.shared_x, shared_y=spec.shared_y,
            smem_optin=info["smem_optin"], params=p))
        if ctx is not None:
            sh = ("_sx" if spec.shared_x else "") + ("_sy" if spec.shared_y else "")
            entry = (f"stc_contract{spec.kind}_{dt}_i{spec.i}s{spec.s}j{spec.j}"
                     f"k{spec.k}l{spec.l}{sh}")
            return _cap_grid(_LayoutExecutor("gemm.cu.j2", entry, ctx, src, spec.batch), info)
    return _generic(spec.kind, spec.dtype, True, spec.batch, e, (xs, ys))


def _build_gemm(spec, info):
    e = P.gemm_extents(spec)
    ctx, src = _params(spec, info, lambda p: P.layout_ctx(
        "8a", **e, dtype=spec.dtype, shared_x=spec.shared_a, shared_y=spec.shared_b,
        beta_zero=spec.beta_zero, smem_optin=info["smem_optin"], params=p))
    if ctx is not None:
        t = ("t" if spec.trans_a else "n") + ("t" if spec.trans_b else "n")
        sh = ("_sa" if spec.shared_a else "") + ("_sb" if spec.shared_b else "")
        entry = (f"stc_gemm_{t}_{_DT[spec.dtype]}_m{spec.m}n{spec.n}k{spec.k}{sh}"
                 f"{'' if spec.beta_zero else '_beta'}")
        return _cap_grid(_LayoutExecutor("gemm.cu.j2", entry, ctx, src, spec.batch), info)
    strides = (0 if spec.shared_a else spec.m * spec.k, 0 if spec.shared_b else spec.k * spec.n)
    return _generic("8a", spec.dtype, spec.beta_zero, spec.batch, e, strides)


class _GenericAction(Executor):
    """The generic path of the action/assembly: the pairwise steps on this backend's kernels."""

    def __init__(self, backend, spec, why):
        from ..pairwise import PairwiseExecutor
        self._inner = PairwiseExecutor(backend, spec)
        self.kernel = f"{self._inner.kernel} (no fused kernel: {why})"
        self.params, self.specialized, self.source = {}, False, "generic"

    def run(self, operands, out, **scalars):
        self._inner.run(operands, out, **scalars)


class CudaBackend(Backend):
    """NVIDIA GPUs through CuPy: fused action and assembly, layout-reading GEMM."""

    name = "cuda"
    array_modules = ("cupy",)
    priority = 10
    methods = ("fused",)

    def available(self) -> bool:
        return gpu_available()

    def describe(self) -> str:
        if not gpu_available():
            return "cuda: no CUDA device (CuPy device query failed)"
        dev, info = _device()
        return f"cuda: device {dev} {info['name']} (sm_{info['cc']}, {info['sms']} SMs)"

    def build(self, spec, method="fused") -> Executor:
        if method != "fused":
            raise Unsupported(f"cuda backend builds method 'fused', not {method!r}")
        _, info = _device()
        if isinstance(spec, GemmSpec):
            return _build_gemm(spec, info)
        if isinstance(spec, ContractSpec):
            return _build_contract(spec, info)
        dt = _DT[spec.dtype]
        if isinstance(spec, ActionSpec):
            ctx, src = _params(spec, info, lambda p: P.action_ctx(
                spec.dim, spec.nd, spec.nq, spec.ncomp, spec.dtype, info["smem_optin"], p))
            if ctx is None:
                return _GenericAction(self, spec, "an element does not fit in shared memory")
            entry = (f"stc_mass_apply_{spec.dim}d_{dt}_nd{spec.nd}nq{spec.nq}c{spec.ncomp}"
                     f"{'_line' if ctx.get('line') else ''}")
            ex = _cap_grid(_ActionExecutor(entry, ctx, src, spec), info)
            # the heuristic's register cap (min_blocks) must not spill: local memory
            # traffic cost up to 2x (notes/cuda.md, ncu of nd6nq6); relax it until none
            while src == "heuristic" and ex.local_bytes > 256 and ctx["min_blocks"] > 0:
                ctx = dict(ctx, min_blocks=ctx["min_blocks"] - 1)
                ex = _cap_grid(_ActionExecutor(entry, ctx, src, spec), info)
            return ex
        if isinstance(spec, AssemblySpec):
            ctx, src = _params(spec, info, lambda p: P.assembly_ctx(
                spec.dim, spec.nd, spec.nq, spec.dtype, info["smem_optin"], p))
            if ctx is None:
                return _GenericAction(self, spec, "a unit does not fit in shared memory")
            entry = f"stc_mass_assemble_{spec.dim}d_{dt}_nd{spec.nd}nq{spec.nq}"
            return _AssemblyExecutor(entry, ctx, src, spec)
        raise Unsupported(f"cuda backend has no kernel for {spec}")


register(CudaBackend())
