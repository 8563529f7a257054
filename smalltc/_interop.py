"""Arrays of other libraries (PyTorch, JAX, any DLPack producer): in as NumPy/CuPy views,
the result back in the caller's library.

The public operations and :class:`smalltc.Plan` take NumPy and CuPy arrays on
their fast path. Anything else that implements DLPack (``__dlpack__`` and
``__dlpack_device__``) arrives here, on the slow path (a plan-cache miss, or a
plan's comparison that failed), and follows these rules:

* **Zero-copy.** CPU memory is read through ``numpy.from_dlpack``, CUDA memory
  through ``cupy.from_dlpack``, on the tensor's device. The converted arrays then
  take the NumPy/CuPy path (the public functions' plan cache included). A
  read-only import (JAX arrays are immutable) is read through a writeable alias:
  inputs are only read, and the CPU kernels' signatures take writeable arrays.
* **The result in the caller's library**: ``torch.from_dlpack`` for torch
  tensors, the array namespace's ``from_dlpack`` (``x.__array_namespace__()``,
  ``jax.numpy`` for JAX) otherwise, the NumPy/CuPy array itself for a producer
  with neither. An ``out=`` tensor is written in place and returned as it is.
* **Streams.** torch CUDA tensors run on ``torch.cuda.current_stream(device)``
  (or ``stream=``, a ``torch.cuda.Stream`` or a CuPy stream); any other
  library's CUDA arrays (JAX's) on CuPy's current stream. Each import and the
  export of the result pass that stream through DLPack's ``stream`` argument,
  so the producer's pending work comes first and the consumer's later work
  after (JAX waits for its buffers to be ready, and makes its own stream wait
  on the result).
* **Errors, naming the operand** (never a silent wrong answer): operands from
  two libraries (a NumPy array or a list among torch tensors), on two devices,
  on a device that is neither the CPU nor a CUDA GPU, CUDA memory without CuPy
  and a GPU, a torch tensor that requires grad (smalltc is not differentiable),
  an ``out`` that cannot be written (a JAX array), an export the producer
  refuses (a traced JAX value inside ``jax.jit``).
* **Copies**, as for NumPy and CuPy arrays: an operand that is not C-contiguous
  (transposed, sliced, negatively strided) is copied first; ``out`` must be
  C-contiguous.

torch and jax are never imported here: a tensor's own module is already loaded
when one arrives (``sys.modules``).
"""
from __future__ import annotations

import contextlib
import sys
import weakref

import numpy as np

from ._arrays import cupy_or_none, gpu_available, is_array, is_cupy

__all__ = ["is_foreign", "any_foreign", "library", "import_array", "call", "call_plan",
           "is_cupy_stream", "cupy_stream"]

#: DLPack device types (``DLDeviceType``) smalltc reads, and names for the others
_CPU, _CUDA, _CUDA_MANAGED = 1, 2, 13
_DEVICE_TYPES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                 9: "vpi", 10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed",
                 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia"}
#: a module's top-level name -> the library's name in messages
_LIBRARIES = {"jaxlib": "jax", "builtins": "Python"}


def is_foreign(x) -> bool:
    """Is ``x`` a DLPack producer that is not a NumPy or CuPy array (a torch tensor, a
    JAX array, ...)?"""
    return x is not None and not is_array(x) and hasattr(x, "__dlpack__")


def any_foreign(*objs) -> bool:
    """Is any of ``objs`` (``None`` allowed) a foreign DLPack array?"""
    for x in objs:
        if is_foreign(x):
            return True
    return False


def library(x) -> str:
    """The array library of ``x`` for messages and for the result: ``"numpy"``,
    ``"cupy"``, ``"torch"``, ``"jax"``, ... (a list is ``"Python"``).

    Examples
    --------
    >>> import numpy as np
    >>> library(np.ones(2)), library([1.0])
    ('numpy', 'Python')
    """
    if isinstance(x, np.ndarray):
        return "numpy"
    if is_cupy(x):
        return "cupy"
    root = type(x).__module__.partition(".")[0]
    return _LIBRARIES.get(root, root)


def _what(name, x):
    lib = library(x)
    return f"{name} is a {type(x).__name__}" if lib == "Python" else f"{name} is a {lib} array"


def _device(name, x):
    """``("cpu", 0)`` or ``("cuda", id)`` of any operand; ``TypeError`` for another device."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack_device__"):
        return ("cpu", 0)                    # NumPy arrays, and lists (NumPy converts them)
    if is_cupy(x):
        return ("cuda", x.device.id)
    try:
        kind, index = x.__dlpack_device__()
    except Exception as err:
        raise TypeError(f"{_what(name, x)} whose __dlpack_device__() failed: {err}") from err
    kind = int(kind)
    if kind == _CPU:
        return ("cpu", 0)
    if kind in (_CUDA, _CUDA_MANAGED):
        return ("cuda", int(index))
    raise TypeError(f"{_what(name, x)} on a {_DEVICE_TYPES.get(kind, f'type-{kind}')} device; "
                    "smalltc runs on the CPU (NumPy) and on NVIDIA GPUs (CuPy): move it to "
                    "one of them first")


def _where(device):
    return "the CPU" if device[0] == "cpu" else f"cuda:{device[1]}"


class _Alias:
    """A writeable alias of a read-only host array (the exporter kept alive by ``base``)."""

    def __init__(self, a):
        face = dict(a.__array_interface__)
        face["data"] = (face["data"][0], False)
        self.__array_interface__, self.base = face, a


# the imported views of foreign element-to-DoF maps, kept per object so that
# smalltc.maps checks (and colours) a map once, as it does for a NumPy/CuPy map
_MAPS: dict = {}


def _identity(x):
    """What must not change for a kept view of ``x`` to stay valid: a torch tensor's
    storage, shape and strides (``resize_``/``set_`` swap them); None for a library
    whose arrays are immutable (JAX); ``False``: do not keep views of ``x``."""
    lib = library(x)
    if lib == "torch":
        return (x.data_ptr(), tuple(x.shape), tuple(x.stride()), str(x.device))
    return None if lib == "jax" else False


def import_array(name, x, *, writeable=False, keep=False, device=None):
    """The NumPy or CuPy view of DLPack producer ``x`` (no copy), on ``x``'s device.

    ``writeable``: for ``out``, which must be written in place (a read-only import
    raises); inputs get a writeable alias instead. ``keep``: remember the view per
    object (the element-to-DoF map, so that its checks run once). ``device``: ``x``'s
    (see ``_device``) when the caller has it already.

    Raises
    ------
    TypeError
        A torch tensor that requires grad, a device other than the CPU or a CUDA GPU,
        CUDA memory without CuPy, an ``out`` that cannot be written, an export the
        producer refuses (message naming ``name``).
    """
    ident = _identity(x) if keep else False
    if ident is not False:
        hit = _MAPS.get(id(x))
        if hit is not None and hit[0]() is x and hit[1] == ident:
            return hit[2]
    if writeable and library(x) == "jax":
        raise TypeError(f"{name} is a jax array: JAX arrays are immutable, smalltc cannot "
                        f"write {name}; call without out=")
    if getattr(x, "requires_grad", False):
        raise TypeError(f"{name} requires grad: smalltc's operations do not record "
                        f"gradients; pass {name}.detach() (and no tensor that needs a "
                        "gradient through smalltc)")
    device = _device(name, x) if device is None else device
    cp = cupy_or_none()
    if device[0] == "cuda" and (cp is None or not gpu_available()):
        raise TypeError(f"{_what(name, x)} on {_where(device)}, but "
                        + ("CuPy is not installed" if cp is None else
                           "no CUDA device answers CuPy") + ": smalltc runs CUDA memory "
                        "through CuPy")
    try:
        if device[0] == "cpu":
            a = np.from_dlpack(x)
        else:
            with cp.cuda.Device(device[1]):
                a = cp.from_dlpack(x)
    except Exception as err:          # BufferError, RuntimeError, a tracer's error
        hint = " (a traced JAX value inside jax.jit or jax.grad cannot leave JAX)" if \
            "Tracer" in type(x).__name__ else ""
        raise TypeError(f"{_what(name, x)} that cannot be read through DLPack{hint}: "
                        f"{err}") from err
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        if writeable:
            raise TypeError(f"{_what(name, x)}, read-only through DLPack ({library(x)} "
                            f"arrays are immutable): smalltc cannot write {name}; call "
                            "without out=")
        a = np.asarray(_Alias(a))
    if ident is not False:
        if len(_MAPS) > 64:
            for k in [k for k, v in _MAPS.items() if v[0]() is None]:
                del _MAPS[k]
        _MAPS[id(x)] = (weakref.ref(x), ident, a)
    return a


def _export(lib, result, example):
    """``result`` (NumPy/CuPy) in library ``lib`` of operand ``example``, zero-copy."""
    if lib in ("numpy", "cupy"):
        return result
    if lib == "torch":
        return sys.modules["torch"].from_dlpack(result)
    space = getattr(example, "__array_namespace__", None)
    if space is None:
        return result
    return space().from_dlpack(result)


def is_cupy_stream(stream) -> bool:
    """Is ``stream`` a CuPy stream (``cupy.cuda.Stream``, ``ExternalStream``)?"""
    return type(stream).__module__.startswith("cupy.")


def cupy_stream(stream, device=-1):
    """``stream`` as a CuPy stream: a CuPy stream as it is, a ``torch.cuda.Stream`` (any
    object with a ``cuda_stream`` handle) as a ``cupy.cuda.ExternalStream``."""
    if is_cupy_stream(stream):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError(f"stream must be a CuPy stream or a torch.cuda.Stream, got "
                        f"{type(stream).__name__}")
    cp = cupy_or_none()
    try:
        return cp.cuda.ExternalStream(int(handle), device)
    except TypeError:                        # CuPy < 13: no device argument
        return cp.cuda.ExternalStream(int(handle))


def _stream(stream, lib, device):
    """The stream context a CUDA call runs in (see the module docstring)."""
    if stream is not None:
        return cupy_stream(stream, device)
    if lib == "torch":
        torch = sys.modules["torch"]
        return cupy_stream(torch.cuda.current_stream(device), device)
    return contextlib.nullcontext()            # CuPy's current stream


def call(fn, names, operands, out, stream, *, plan_device=None):
    """Run ``fn(*arrays, out=array_out)`` on NumPy/CuPy views of ``operands`` (``None``
    entries pass through) and return the result in their library.

    ``names`` name the operands in messages; ``stream`` is the caller's ``stream=``
    (None: see the module docstring); ``plan_device``, for a plan's call: ``"cpu"`` or
    ``"cuda"``, what the plan was built for.
    """
    named = [(n, x) for n, x in zip(names, operands) if x is not None]
    if out is not None:
        named.append(("out", out))
    if not named:
        return fn(*operands, out=out)
    first, x0 = named[0]
    lib = library(x0)
    for n, x in named[1:]:
        if library(x) != lib:
            raise TypeError(f"operands come from different array libraries: "
                            f"{_what(first, x0)}, {_what(n, x)}; pass all of them from one "
                            f"library (smalltc returns the result in it)")
    devices = {n: _device(n, x) for n, x in named}
    device = devices[first]
    for n, d in devices.items():
        if d != device:
            raise ValueError(f"{n} is on {_where(d)} but {first} is on {_where(device)}; "
                             "move them to one device first")
    if plan_device is not None and plan_device != device[0]:
        built = "NumPy arrays (the CPU)" if plan_device == "cpu" else "CuPy arrays (a GPU)"
        raise TypeError(f"{_what(first, x0)} on {_where(device)}, but this plan was built "
                        f"for {built}")

    def run():
        arrays = [import_array(n, x, keep=n == "elem_dofs", device=device)
                  if is_foreign(x) else x for n, x in zip(names, operands)]
        a_out = import_array("out", out, writeable=True, device=device) if \
            is_foreign(out) else out
        result = fn(*arrays, out=a_out)
        return out if out is not None else _export(lib, result, x0)

    if device[0] == "cpu":
        if stream is not None:
            raise TypeError(f"stream= is for arrays on a CUDA device; {first} is on the CPU")
        return run()
    cp = cupy_or_none()
    if cp is None or not gpu_available():
        import_array(first, x0)                # raises the error that says why
    with cp.cuda.Device(device[1]), _stream(stream, lib, device[1]):
        return run()


def call_plan(plan, operands, out, stream, alpha, beta):
    """A :class:`smalltc.Plan`'s call with foreign operands, ``out`` or ``stream``."""
    names = [name for name, _, _ in plan._inputs]
    names += [f"operand {i}" for i in range(len(names), len(operands))]

    def fn(*arrays, out):
        return plan(*arrays, out=out, alpha=alpha, beta=beta)
    return call(fn, names, operands, out, stream,
                plan_device="cuda" if plan._on_gpu else "cpu")
