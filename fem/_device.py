"""Where the FEM solve runs: the ``device`` choice and host/device moves.

The FEM layer sets up meshes and geometry on the host with NumPy, once; the
operator data (``B1d``, ``D``, index arrays) and the CG iteration then live
in one array module, NumPy on the CPU or CuPy on the GPU. Every function of
the solve path takes its module from its inputs
(:func:`smalltc._arrays.array_module`); this module turns a user's ``device``
choice into a module, keeps the arrays copied to a device once
(:class:`DeviceCache`: the DoF map, the Dirichlet DoFs and values), and moves
results back to the host.
"""

import numpy as np

from smalltc._arrays import cupy_or_none, gpu_available, is_cupy

__all__ = ["DEVICES", "resolve_device", "device_name", "device_key", "DeviceCache", "to_host",
           "synchronize"]

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


def synchronize(xp):
    """Wait for the work queued on the current CUDA stream; nothing for NumPy."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
