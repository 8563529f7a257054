"""Where the FEM solve runs: the ``device`` choice and host/device moves.

The FEM layer sets up meshes and geometry on the host with NumPy, once; the
operator data (``B1d``, ``D``, index arrays) and the CG iteration then live
in one array module, NumPy on the CPU or CuPy on the GPU. Every function of
the solve path takes its module from its inputs
(:func:`smalltc._arrays.array_module`); this module turns a user's ``device``
choice into a module, keeps the arrays copied to a device once
(:class:`DeviceCache`: the DoF map, the Dirichlet DoFs and values), moves large host
arrays there through a page-locked staging buffer (:func:`to_device`), and moves results
back to the host.
"""

import numpy as np

from smalltc._arrays import cupy_or_none, gpu_available, is_cupy

__all__ = ["DEVICES", "resolve_device", "device_name", "device_key", "DeviceCache", "to_host",
           "to_device", "to_device_many", "synchronize"]

#: host arrays from this size on go to a GPU through the page-locked staging buffer
STAGED_BYTES = 4 << 20
#: the staging buffer's size (one a process, made on first use; larger arrays go in pieces)
STAGE_BYTES = 64 << 20

DEVICES = ("auto", "cpu", "gpu")


def resolve_device(device):
    """The array module for ``device``: ``"cpu"`` NumPy, ``"gpu"`` CuPy, ``"auto"`` either.

    ``"auto"`` is the GPU when :func:`smalltc._arrays.gpu_available` says a
    CUDA device answers, else the CPU.

    Parameters
    ----------
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    module
        ``numpy`` or ``cupy``.

    Raises
    ------
    ValueError
        For any other ``device``.
    RuntimeError
        For ``"gpu"`` when CuPy does not import or no CUDA device answers.

    Examples
    --------
    >>> resolve_device("cpu").__name__
    'numpy'
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {list(DEVICES)}, got {device!r}")
    if device == "cpu":
        return np
    if gpu_available():
        return cupy_or_none()
    if device == "auto":
        return np
    why = ("CuPy does not import" if cupy_or_none() is None
           else "CuPy imports but no CUDA device answers a query")
    raise RuntimeError(f"device='gpu' was requested but no GPU is available ({why}); "
                       f"use device='cpu', or device='auto' to fall back to the CPU")


def device_name(xp):
    """``"gpu"`` for CuPy, ``"cpu"`` for NumPy.

    Examples
    --------
    >>> device_name(np)
    'cpu'
    """
    return "cpu" if xp is np else "gpu"


def device_key(xp):
    """Where arrays of module ``xp`` made now live: ``(module name, device id)``.

    The device is CuPy's current one (``None`` for NumPy and for modules without
    ``cuda``), so arrays kept for one GPU are not handed to another.

    Examples
    --------
    >>> device_key(np)
    ('numpy', None)
    """
    if xp is np:
        return ("numpy", None)
    cuda = getattr(xp, "cuda", None)
    return (xp.__name__, None if cuda is None else int(cuda.Device().id))


class DeviceCache:
    """Arrays made once per array module and device, and kept.

    ``get(xp, what, make)`` returns the array stored for ``what`` on
    :func:`device_key` ``(xp)``, calling ``make()`` (which builds it in ``xp``)
    the first time only.

    Examples
    --------
    >>> cache = DeviceCache()
    >>> a = cache.get(np, "ones", lambda: np.ones(3))
    >>> cache.get(np, "ones", lambda: np.zeros(3)) is a, len(cache)
    (True, 1)
    """

    def __init__(self):
        self._arrays = {}

    def get(self, xp, what, make):
        key = device_key(xp) + (what,)
        a = self._arrays.get(key)
        if a is None:
            a = self._arrays[key] = make()
        return a

    def __len__(self):
        return len(self._arrays)


def to_host(a):
    """``a`` as a NumPy array (a device-to-host copy for CuPy arrays).

    Examples
    --------
    >>> to_host([1.0, 2.0])
    array([1., 2.])
    """
    return a.get() if is_cupy(a) else np.asarray(a)


_STAGE = []        # the page-locked staging buffer (uint8), made on first use


def _stage(xp):
    if not _STAGE:
        mem = xp.cuda.alloc_pinned_memory(STAGE_BYTES)
        _STAGE.append((mem, np.frombuffer(mem, np.uint8, STAGE_BYTES)))
    return _STAGE[0][1]


def to_device(a, xp):
    """``a`` (array_like) as an array of ``xp``; a NumPy array of :data:`STAGED_BYTES` or
    more goes to a GPU through a reused page-locked buffer, in pieces of at most
    :data:`STAGE_BYTES`.

    A pageable copy into newly allocated device memory runs at 1-2 GB/s (CuPy's
    ``asarray``; 0.19 s for 140 MB on an H200 host), a staged one at about 6 GB/s (the
    host copy into the buffer and the transfer, 0.03 s). Each piece's transfer is waited
    for before the buffer is refilled, so the result is complete on return (as a
    pageable copy's is).

    Examples
    --------
    >>> to_device([1.0, 2.0], np)
    array([1., 2.])
    """
    if xp is np or not isinstance(a, np.ndarray) or a.nbytes < STAGED_BYTES:
        return xp.asarray(a)
    a = np.ascontiguousarray(a)
    out = xp.empty(a.shape, dtype=a.dtype)
    src, dst = a.reshape(-1).view(np.uint8), out.reshape(-1).view(xp.uint8)
    stage, stream = _stage(xp), xp.cuda.get_current_stream()
    for lo in range(0, src.size, STAGE_BYTES):
        n = min(STAGE_BYTES, src.size - lo)
        np.copyto(stage[:n], src[lo:lo + n])
        dst[lo:lo + n].set(stage[:n], stream=stream)
        stream.synchronize()                   # the buffer is refilled next
    return out


def to_device_many(arrays, xp):
    """Host arrays as arrays of ``xp`` in one transfer: packed at 16-byte-aligned offsets
    of one host buffer, copied by :func:`to_device`, each a view of the one device
    buffer in its own dtype and shape (NumPy: the arrays themselves).

    Each small copy costs a GPU about 0.1 ms (allocation, pageable transfer, wait), so
    the tens of index and value arrays of an AMG hierarchy go faster together.

    Examples
    --------
    >>> a, b = to_device_many([np.arange(3), np.ones(2, np.float32)], np)
    >>> print(a, b)
    [0 1 2] [1. 1.]
    """
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if xp is np:
        return arrays
    offsets, n = [], 0
    for a in arrays:
        offsets.append(n)
        n += -(-a.nbytes // 16) * 16
    packed = np.zeros(max(n, 16), dtype=np.uint8)
    for a, o in zip(arrays, offsets):
        packed[o:o + a.nbytes] = a.reshape(-1).view(np.uint8)
    dev = to_device(packed, xp)
    return [dev[o:o + a.nbytes].view(a.dtype).reshape(a.shape)
            for a, o in zip(arrays, offsets)]


def synchronize(xp):
    """Wait for the work queued on the current CUDA stream; nothing for NumPy."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
