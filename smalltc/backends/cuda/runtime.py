"""Render, compile and launch smalltc's CUDA templates (through CuPy/NVRTC).

Templates live in ``templates/cuda/*.cu.j2`` (package data of
``smalltc.templates``). Rendering needs only Jinja2; compiling and launching
need CuPy and a device, and happen on first use, never at import.

The compiled-kernel cache is keyed by (template, entry name, rendering
context, device id, compute capability); CuPy's own disk cache sits under it,
so a new process skips NVRTC for kernels compiled before.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.resources
import os
import pathlib
import struct
import threading

import jinja2
import numpy as np

from ..._arrays import cupy_or_none
from ..._jinja import environment

__all__ = ["SmalltcCompileError", "render", "template_names", "get_kernel", "get_global",
           "clear_cache", "launch", "resident_blocks", "Launcher", "direct_launcher",
           "device_info", "current_device", "current_device_id", "CTYPES", "NVRTC_OPTIONS"]

CTYPES = {"float64": "double", "float32": "float"}
NVRTC_OPTIONS = ("-std=c++17",)
_MAX_GRID_X = 2 ** 31 - 1
_SMEM_DEFAULT = 48 * 1024


class SmalltcCompileError(RuntimeError):
    """A rendered kernel failed to compile; carries what is needed to reproduce it.

    Attributes
    ----------
    entry : str        the ``extern "C"`` entry point
    source : str       the rendered CUDA source
    options : tuple    the NVRTC options
    log : str          the compiler's log
    """

    def __init__(self, entry, source, options, log):
        self.entry, self.source, self.options, self.log = entry, source, tuple(options), log
        numbered = "\n".join(f"{n:4d} {line}" for n, line in enumerate(source.splitlines(), 1))
        super().__init__(f"CUDA kernel {entry} failed to compile with options {self.options}:\n"
                         f"{log}\n--- source ---\n{numbered}")


def _template_root():
    """``smalltc.templates/cuda`` (package data); the source tree's when not installed."""
    try:
        return importlib.resources.files("smalltc.templates") / "cuda"
    except ModuleNotFoundError:   # a checkout on sys.path, not pip-installed
        return pathlib.Path(__file__).resolve().parents[3] / "templates" / "cuda"


def _load_template(name):
    path = _template_root() / name
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8"), str(path), lambda: True


@functools.lru_cache(maxsize=1)
def _env():
    return environment(jinja2.FunctionLoader(_load_template))


def template_names():
    """The kernel templates (all but the base) shipped with the package."""
    return sorted(p.name for p in _template_root().iterdir()
                  if p.name.endswith(".cu.j2") and p.name != "base.cu.j2")


def render(template: str, ctx: dict) -> str:
    """Render ``templates/cuda/<template>`` with ``ctx`` (StrictUndefined)."""
    full = dict(ctx)
    full.setdefault("template", template)
    full.setdefault("real", CTYPES[full["dtype"]])
    return _env().get_template(template).render(**full)


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


@functools.lru_cache(maxsize=None)
def device_info(device_id: int):
    """(name, compute capability, multiprocessors, max opt-in shared memory per block)."""
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else name
    cc = f"{props['major']}{props['minor']}"
    return dict(name=name, cc=cc, sms=props["multiProcessorCount"],
                smem_optin=props.get("sharedMemPerBlockOptin", _SMEM_DEFAULT))


_GET_DEVICE = []     # cupy.cuda.runtime.getDevice, looked up once (a call's hot path)


def current_device_id() -> int:
    """CuPy's current device (called on every launch: no import, one C call)."""
    if not _GET_DEVICE:
        _GET_DEVICE.append(cupy_or_none().cuda.runtime.getDevice)
    return _GET_DEVICE[0]()


def current_device():
    """``(device id, device_info)`` of CuPy's current device."""
    dev = current_device_id()
    return dev, device_info(dev)


_CACHE: dict = {}
_MODULES: dict = {}
_GLOBALS: dict = {}
_LOCK = threading.Lock()


def clear_cache():
    """Forget the in-process compiled kernels (CuPy's disk cache keeps them)."""
    with _LOCK:
        _CACHE.clear()
        _MODULES.clear()
        _GLOBALS.clear()


def get_kernel(template: str, entry: str, ctx: dict, smem_bytes: int = 0):
    """The compiled kernel ``entry`` of ``template`` rendered with ``ctx``, on the current device."""
    import cupy
    dev = cupy.cuda.runtime.getDevice()
    info = device_info(dev)
    key = (template, entry, _freeze(ctx), dev, info["cc"])
    kern = _CACHE.get(key)
    if kern is not None:
        return kern
    with _LOCK:
        kern = _CACHE.get(key)
        if kern is not None:
            return kern
        source = render(template, dict(ctx, entry=entry))
        try:
            mod = cupy.RawModule(code=source, options=NVRTC_OPTIONS)
            kern = mod.get_function(entry)
            _MODULES[key] = mod
            if smem_bytes > _SMEM_DEFAULT:
                kern.max_dynamic_shared_size_bytes = smem_bytes
        except cupy.cuda.compiler.CompileException as err:
            raise SmalltcCompileError(entry, source, NVRTC_OPTIONS, err.get_message()
                                      if hasattr(err, "get_message") else str(err)) from err
        _CACHE[key] = kern
    return kern


def get_global(template: str, entry: str, ctx: dict, smem_bytes: int, name: str) -> list:
    """The ``__constant__``/``__device__`` variable ``name`` of kernel ``entry``'s module on
    the current device, as a slot ``[pointer, event, stream]`` shared by every caller of
    that module: ``pointer`` is a CuPy ``MemoryPointer``; ``event`` and ``stream`` (None
    at first) are for the caller to record the last launch that read the variable, so
    two executors of one module (plans of one kernel for two batch counts) order their
    writes to it too."""
    import cupy
    get_kernel(template, entry, ctx, smem_bytes)
    dev = cupy.cuda.runtime.getDevice()
    key = (template, entry, _freeze(ctx), dev, device_info(dev)["cc"])
    with _LOCK:
        slot = _GLOBALS.get(key + (name,))
        if slot is None:
            slot = _GLOBALS[key + (name,)] = [_MODULES[key].get_global(name), None, None]
    return slot


class ConstantBank:
    """The ``__constant__`` arrays ``names`` of one kernel module (the 1D matrices of the
    line forms), loaded on the current stream before a launch that reads them.

    :meth:`load` first waits for the module's last launch on another stream (an event in
    :func:`get_global`'s slot of the first name, shared by every executor of the module),
    then copies; :meth:`launched` records the launch that followed. Inside a stream capture
    nothing is waited on or recorded: an event recorded there cannot be waited on outside
    it, and the graph orders its own launches."""

    def __init__(self, template: str, entry: str, ctx: dict, smem_bytes: int, names):
        self._where = (template, entry, ctx, smem_bytes)
        self.names = tuple(names)
        self._slots = {}                    # device id -> get_global's slots, one a name

    def _device_slots(self):
        dev = cupy_or_none().cuda.runtime.getDevice()
        slots = self._slots.get(dev)
        if slots is None:
            slots = self._slots[dev] = [get_global(*self._where, n) for n in self.names]
        return slots

    def load(self, *arrays):
        """Copy ``arrays`` (device arrays in the order of ``names``; None: left as is)."""
        cupy = cupy_or_none()
        slots = self._device_slots()
        first = slots[0]
        if first[1] is None:
            first[1] = cupy.cuda.Event(disable_timing=True)
        stream = cupy.cuda.get_current_stream()
        if first[2] is not None and first[2] != stream.ptr and not stream.is_capturing():
            stream.wait_event(first[1])
        for slot, a in zip(slots, arrays):
            if a is not None:
                cupy.cuda.runtime.memcpyAsync(slot[0].ptr, a.data.ptr, a.nbytes,
                                              cupy.cuda.runtime.memcpyDeviceToDevice,
                                              stream.ptr)

    def launched(self):
        """Record that the module's last launch (after :meth:`load`) is on this stream."""
        stream = cupy_or_none().cuda.get_current_stream()
        if stream.is_capturing():
            return
        first = self._device_slots()[0]
        first[1].record(stream)
        first[2] = stream.ptr


class HostMirror:
    """``slots`` page-locked host copies of the device array ``a``: :meth:`queue` copies
    ``a`` into a slot behind the work queued so far on the current stream (the host does
    not wait); :meth:`read` waits for that copy and returns it. A solver's host thus reads
    the state of an iteration the device finished while the next one is already queued.

    Examples
    --------
    On a GPU::

        m = HostMirror(state, 2)
        m.queue(0)          # after iteration k's kernels
        ...                 # iteration k + 1 queued
        st = m.read(0)      # iteration k's state, a NumPy copy
    """

    def __init__(self, a, slots=2):
        cupy = cupy_or_none()
        self.a = a
        self._host = [np.frombuffer(cupy.cuda.alloc_pinned_memory(max(1, a.nbytes)),
                                    dtype=a.dtype, count=a.size) for _ in range(slots)]
        self._events = [cupy.cuda.Event(disable_timing=True) for _ in range(slots)]

    def queue(self, slot):
        cupy = cupy_or_none()
        stream = cupy.cuda.get_current_stream()
        cupy.cuda.runtime.memcpyAsync(self._host[slot].ctypes.data, self.a.data.ptr,
                                      self.a.nbytes, cupy.cuda.runtime.memcpyDeviceToHost,
                                      stream.ptr)
        self._events[slot].record(stream)

    def read(self, slot):
        self._events[slot].synchronize()
        return self._host[slot].copy()


def resident_blocks(kern, threads: int, smem_bytes: int) -> int:
    """Blocks of ``kern`` that fit on one SM at once (registers, shared memory and
    threads: the driver's occupancy calculator), at least 1."""
    import cupy
    return max(1, int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
        kern.kernel.ptr, int(threads), int(smem_bytes))))


def launch(kern, ngroups: int, threads: int, args: tuple, smem_bytes: int = 0,
           max_blocks: int | None = None):
    """Launch on the current CuPy stream; the kernels stride over groups past the grid."""
    if ngroups <= 0:
        return
    blocks = min(int(ngroups), _MAX_GRID_X if max_blocks is None else int(max_blocks))
    kern((blocks,), (threads,), args, shared_mem=smem_bytes)


#: launch through the driver with packed arguments (``Launcher``) where an executor can;
#: ``SMALLTC_DIRECT_LAUNCH=0`` keeps every launch on ``cupy.RawKernel.__call__``
DIRECT_LAUNCH = os.environ.get("SMALLTC_DIRECT_LAUNCH", "1") != "0"


class Launcher:
    """Launches of one compiled kernel with a fixed geometry through the driver
    (``cuLaunchKernel``), its arguments packed by ``struct`` into a reused buffer.

    ``cupy.RawKernel.__call__`` boxes every argument in an object and looks the kernel
    up per call: about 9 µs per launch on the H100 machine, against 4.5 µs this way
    (notes/cuda.md, "Launches and host cost"); a GEMM of 100,000 2x2 matrices moves its bytes in
    4.3 µs. ``fmt`` is the ``struct`` format of the kernel's parameters in order
    (``P`` a device pointer, ``d``/``f`` a double/float, ``q`` an int64, ``i`` an
    int32), native alignment as in C. The buffer is shared by the threads that call
    this launcher, so packing and launching hold a lock (the driver copies the
    parameters before ``cuLaunchKernel`` returns). Launches go to the current CuPy
    stream, as ``RawKernel``'s do.

    Examples
    --------
    >>> struct.calcsize("PPPPddq"), struct.calcsize("Pfq")      # C's padding
    (56, 24)
    """

    def __init__(self, kern, fmt: str, blocks: int, threads: int, smem_bytes: int):
        import cupy
        self.fptr = kern.kernel.ptr
        self.fmt, self.blocks, self.threads, self.smem = fmt, int(blocks), int(threads), int(smem_bytes)
        self._buf = ctypes.create_string_buffer(max(8, struct.calcsize(fmt)))
        base = ctypes.addressof(self._buf)
        offsets = [struct.calcsize(fmt[:i + 1]) - struct.calcsize(fmt[i]) for i in range(len(fmt))]
        self._ptrs = (ctypes.c_void_p * len(fmt))(*[base + o for o in offsets])
        self._params = ctypes.addressof(self._ptrs)
        self._lock = threading.Lock()
        self._drv, self._stream = cupy.cuda.driver, cupy.cuda.get_current_stream
        self._runtime = cupy.cuda.runtime

    def __call__(self, *values):
        """Launch with ``values`` (ints for pointers); ``OverflowError`` when a value
        does not fit its C type (a float32 scalar beyond its range)."""
        with self._lock:
            struct.pack_into(self.fmt, self._buf, 0, *values)
            try:
                self._drv.launchKernel(self.fptr, self.blocks, 1, 1, self.threads, 1, 1,
                                       self.smem, self._stream().ptr, self._params, 0)
            except self._drv.CUDADriverError:
                # a thread whose CUDA context is not current yet (RawKernel makes it
                # current on its first launch): cudaFree(0) does, then launch again
                self._runtime.free(0)
                self._drv.launchKernel(self.fptr, self.blocks, 1, 1, self.threads, 1, 1,
                                       self.smem, self._stream().ptr, self._params, 0)


def direct_launcher(kern, fmt: str, ngroups: int, threads: int, smem_bytes: int,
                    max_blocks: int | None = None):
    """A :class:`Launcher` for ``kern`` over ``ngroups`` groups (grid capped as in
    :func:`launch`), or None where launches stay on ``RawKernel`` (``DIRECT_LAUNCH``
    off, or nothing to launch)."""
    if not DIRECT_LAUNCH or ngroups <= 0:
        return None
    blocks = min(int(ngroups), _MAX_GRID_X if max_blocks is None else int(max_blocks))
    return Launcher(kern, fmt, blocks, threads, smem_bytes)
