"""Element-to-DoF maps: the range check and the element colouring of the fused operator.

A map ``elem_dofs`` of shape ``(E, nd, ..., nd)`` (int32 or int64) gives, for each
element, the global index of each of its DoFs: ``R_e x = x[elem_dofs[e]]``.
:func:`smalltc.mass_apply` reads ``x`` and adds into ``y`` through it, so an
index outside ``[0, ndofs)`` would read or write memory it must not: every map
is checked before its first use.

The *deterministic* forms add the element results into ``y`` in a fixed order:

* one colour of elements at a time (:func:`element_colors`; elements of one
  colour share no DoF, so within a colour no two writes meet: no atomics, no
  races on any device, and every DoF receives its contributions in colour
  order). The greedy colouring (the lowest colour no neighbour has) gives 2, 4
  and 8 colours on structured 1D, 2D and 3D meshes.
* through the *transposed* map (:func:`transpose`): for each DoF, the
  positions of its element entries in increasing order; a second pass sums an
  E-vector of element results in that order (the GPU's deterministic form).

Both results are kept per map *object* (:func:`map_info`): a map is checked
and coloured the first time a call sees it, not on every call (on a GPU the
check needs the map's minimum and maximum on the host). A map changed in place
afterwards is not checked again on the host, but the kernels check every index
they read (:func:`out_of_range`): an index out of range never reads or writes
outside the vectors, it raises. A map changed in place within range keeps its old
colouring: call :func:`forget` (or pass a new array) to colour it again.

Examples
--------
>>> import numpy as np
>>> m = np.array([[0, 1], [1, 2], [2, 3]])       # 1D, three linear elements
>>> order, offsets = element_colors(m, 4)
>>> order.tolist(), offsets.tolist()             # colour 0: elements 0 and 2
([0, 2, 1], [0, 2, 3])
>>> check_range(m, 3)
Traceback (most recent call last):
...
ValueError: elem_dofs holds indices 0..3, outside [0, 3) for ndofs=3 (x has 3 entries per component)
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from ._arrays import array_module, is_cupy

__all__ = ["element_colors", "transpose", "check_range", "out_of_range", "map_info", "forget",
           "MapInfo", "MAX_COLORS"]

#: colours the greedy colouring may use (a bit each in a 64-bit mask per DoF)
MAX_COLORS = 64


#: the colouring's Numba dispatcher, made on first use (one a process: a dispatcher
#: made at each call would read its compiled code from Numba's disk cache each time)
_GREEDY = []


def _greedy(emap, ndofs):
    """Numba kernel: colour of each element (-1: more than MAX_COLORS needed)."""
    if not _GREEDY:
        _GREEDY.append(_greedy_kernel())
    return _GREEDY[0](emap, ndofs)


def _greedy_kernel():
    import numba      # here: ``import smalltc`` does not load Numba (a second or more)

    @numba.njit(cache=True)
    def greedy(emap, ndofs):
        E, n = emap.shape
        used = np.zeros(ndofs, dtype=np.uint64)
        color = np.empty(E, dtype=np.int32)
        for e in range(E):
            mask = np.uint64(0)
            for k in range(n):
                mask |= used[emap[e, k]]
            c = 0
            while c < 64 and (mask >> np.uint64(c)) & np.uint64(1):
                c += 1
            if c == 64:
                color[e] = -1
                return color
            color[e] = c
            bit = np.uint64(1) << np.uint64(c)
            for k in range(n):
                used[emap[e, k]] |= bit
        return color

    return greedy


def element_colors(elem_dofs, ndofs):
    """Greedy element colouring: ``(order, offsets)``, int32 and int64 NumPy arrays.

    ``order[offsets[c]:offsets[c + 1]]`` are the elements of colour ``c`` in
    increasing order; two elements of one colour share no DoF. ``elem_dofs`` may
    be a NumPy or CuPy array (copied to the host once); its indices must be in
    range (:func:`check_range`).

    Raises
    ------
    ValueError
        When more than :data:`MAX_COLORS` colours would be needed (a DoF shared
        by more than 64 elements).
    """
    m = elem_dofs.get() if is_cupy(elem_dofs) else np.asarray(elem_dofs)
    E = m.shape[0]
    m2 = np.ascontiguousarray(m.reshape(E, -1), dtype=np.int64)
    color = _greedy(m2, int(ndofs)) if E else np.zeros(0, np.int32)
    if (color < 0).any():
        raise ValueError(f"elem_dofs needs more than {MAX_COLORS} element colours (a DoF "
                         f"shared by more than {MAX_COLORS} elements); the deterministic form "
                         "cannot run it: use deterministic=False")
    order = np.argsort(color, kind="stable").astype(np.int32)
    counts = np.bincount(color, minlength=int(color.max()) + 1 if E else 0)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return order, offsets


def transpose(elem_dofs, ndofs):
    """The transposed map: ``(pos, off)`` in the map's array module.

    ``pos[off[d]:off[d + 1]]`` are the positions ``e * n + i`` (``n`` entries an
    element) with ``elem_dofs[e, i] == d``, in increasing order; ``pos`` is int32 (int64
    from 2^31 entries on), ``off`` int64 of length ``ndofs + 1``.

    Examples
    --------
    >>> import numpy as np
    >>> pos, off = transpose(np.array([[0, 1], [1, 2]]), 3)
    >>> pos.tolist(), off.tolist()        # DoF 1 is entry 1 of element 0, entry 0 of 1
    ([0, 1, 2, 3], [0, 1, 3, 4])
    """
    xp = array_module(elem_dofs)
    flat = elem_dofs.reshape(-1)
    pos = xp.argsort(flat, kind="stable") if xp is np else xp.argsort(flat)
    pos = pos.astype(np.int32 if flat.size < 2 ** 31 else np.int64)
    off = xp.zeros(int(ndofs) + 1, dtype=np.int64)
    xp.cumsum(xp.bincount(flat, minlength=int(ndofs)), out=off[1:])
    return pos, off


def check_range(elem_dofs, ndofs, name="elem_dofs", vector="x"):
    """Raise ``ValueError`` naming the map (``name``) when an index is outside ``[0,
    ndofs)``; ``vector`` names the global vector it indexes in the message."""
    if elem_dofs.size == 0:
        return
    lo, hi = int(elem_dofs.min()), int(elem_dofs.max())
    if lo < 0 or hi >= ndofs:
        raise ValueError(f"{name} holds indices {lo}..{hi}, outside [0, {ndofs}) for "
                         f"ndofs={ndofs} ({vector} has {ndofs} entries per component)")


def out_of_range(elem_dofs, ndofs, index=None):
    """Raise the ``ValueError`` of :func:`check_range` for a map a kernel found an index
    outside ``[0, ndofs)`` in (``index``: the one it saw), and forget what was known of it.

    The kernels that read a map check every entry themselves (a map changed in place
    after its first use): they read and write nothing through a bad entry, set an error
    flag, and the call raises this at its next synchronisation.

    Examples
    --------
    >>> import numpy as np
    >>> out_of_range(np.array([[0, 7]]), 4, 7)
    Traceback (most recent call last):
    ...
    ValueError: elem_dofs holds indices 0..7, outside [0, 4) for ndofs=4 (x has 4 entries per component); a kernel read index 7
    """
    forget(elem_dofs)
    try:
        check_range(elem_dofs, ndofs)
    except ValueError as err:
        if index is None:
            raise
        raise ValueError(f"{err}; a kernel read index {index}") from None
    raise ValueError(f"elem_dofs held index {index}, outside [0, {ndofs}) for ndofs={ndofs}, "
                     "when a kernel read it (the map changed while the call ran)")


class MapInfo:
    """What is known of one map: its range was checked for ``ndofs``; its colouring
    (``order`` and ``offsets``, on the map's device) once asked for."""

    def __init__(self, ref, ndofs):
        self.ref, self.ndofs = ref, ndofs
        self._colors = self._transpose = None

    def transposed(self, elem_dofs):
        """:func:`transpose` of the map, on its device, made once."""
        if self._transpose is None:
            self._transpose = transpose(elem_dofs, self.ndofs)
        return self._transpose

    def colors(self, elem_dofs):
        """``(order, offsets)``: ``order`` on the map's device, ``offsets`` on the host.
        A map that needs more than :data:`MAX_COLORS` colours raises ``ValueError`` (each
        time, without colouring it again)."""
        if isinstance(self._colors, str):
            raise ValueError(self._colors)
        if self._colors is None:
            try:
                order, offsets = element_colors(elem_dofs, self.ndofs)
            except ValueError as err:
                self._colors = str(err)
                raise
            if is_cupy(elem_dofs):
                import cupy
                order = cupy.asarray(order)
            self._colors = (order, offsets)
        return self._colors


_INFO: dict = {}
_LOCK = threading.Lock()


def map_info(elem_dofs, ndofs) -> MapInfo:
    """The :class:`MapInfo` of this map object for vectors of ``ndofs`` entries: the range
    is checked the first time (``ValueError`` naming ``elem_dofs`` when it fails)."""
    key = (id(elem_dofs), int(ndofs))
    info = _INFO.get(key)
    if info is not None and info.ref() is elem_dofs:
        return info
    check_range(elem_dofs, ndofs)
    info = MapInfo(weakref.ref(elem_dofs), int(ndofs))
    with _LOCK:
        if len(_INFO) > 256:                    # forget maps that are gone
            for k in [k for k, v in _INFO.items() if v.ref() is None]:
                del _INFO[k]
        _INFO[key] = info
    return info


def forget(elem_dofs):
    """Check (and colour) ``elem_dofs`` again at its next use (after changing it in place)."""
    with _LOCK:
        for k in [k for k in _INFO if k[0] == id(elem_dofs)]:
            del _INFO[k]
