"""Where the FEM solve runs: the ``device`` choice and host/device moves.

The FEM layer sets up meshes and geometry on the host with NumPy, once; the
operator data (``B1d``, ``D``, index arrays) and the CG iteration then live
in one array module, NumPy on the CPU or CuPy on the GPU. Every function of
the solve path takes its module from its inputs
(:func:`smalltc._arrays.array_module`); this module only turns a user's
``device`` choice into a module and moves results back to the host.
"""

import numpy as np

from smalltc._arrays import cupy_or_none, gpu_available, is_cupy

__all__ = ["DEVICES", "resolve_device", "device_name", "to_host", "synchronize"]

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
