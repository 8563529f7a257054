"""What a backend is, and what it builds.

A backend turns a spec into an :class:`Executor`: an object that holds the
compiled kernel (or the NumPy code) and its launch geometry, and writes the
result into a given output buffer. Executors never allocate their outputs
and never validate user input: the plan did both.
"""
from __future__ import annotations

__all__ = ["Backend", "Executor", "Unsupported"]


class Unsupported(Exception):
    """Raised by ``Backend.build`` when it cannot run a spec at all.

    The plan then falls back to the next backend for the same arrays and
    logs why. (Sizes a backend runs only slowly are its own business: it
    builds a generic kernel and marks the executor ``specialized=False``.)
    """


class Executor:
    """A built operation. Subclasses implement ``run``.

    Attributes
    ----------
    kernel : str
        What runs (a kernel entry point, or a description of the NumPy code).
    params : dict
        Tuning parameters (tile sizes, thread layout, ...); empty for none.
    specialized : bool
        False when a generic (run-time sized) path runs instead of a kernel
        specialised for these sizes.
    source : str
        Where ``params`` came from: "heuristic", "table-exact", "table-nearest"
        (a tuning table's entry for this size or a nearby one), "params" (passed
        to ``build``), "generic" or "fixed" (nothing to choose).
    table : str or None
        The tuning table that answered (its file name), when one did.
    compile_s : float
        Seconds spent compiling when this executor was built (0 when the
        kernel came from a cache or nothing is compiled).
    """

    kernel = "?"
    compile_s = 0.0
    params: dict = {}
    specialized = True
    source = "fixed"
    table = None

    def run(self, operands, out, **scalars):  # pragma: no cover - interface
        raise NotImplementedError


class Backend:
    """A place to run smalltc operations (``reference``, ``cpu``, ``cuda``).

    ``array_modules`` names the array libraries it accepts ("numpy",
    "cupy"); ``priority`` orders the ``backend="auto"`` choice (higher first).

    ``build(spec, params=None)`` returns the executor of ``spec``: with
    ``params`` None the backend chooses (a tuning table's entry where one
    answers, else its measured heuristic); with ``"heuristic"``, the
    heuristic alone (the tuner's baseline); with a dict, those tuning
    parameters (the names of the spec's kernel family); parameters that do
    not fit the spec raise ``ValueError`` naming them. The pairwise method is the plan's business
    (:mod:`smalltc.pairwise`), not the backend's.
    """

    name = "?"
    array_modules: tuple = ()
    priority = 0

    def available(self) -> bool:
        return True

    def build(self, spec, params=None) -> Executor:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:
        return self.name
