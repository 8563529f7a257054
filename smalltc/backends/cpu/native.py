"""A kernel module's parallel driver calls its work function through a native address.

Every CPU kernel is a work function ``_run`` (the work of one part: chunks ``lo`` to
``hi``) and a ``parallel=True`` driver whose ``prange`` calls it once per thread
(``templates/cpu/base.py.j2``). Called as a Numba function, ``_run`` is linked into
every module that calls it, and Numba's parallel loop makes four of those: its gufunc,
the gufunc's two wrappers and the driver. LLVM optimised and emitted ``_run``'s body in
each of them again, which was as much compile time as ``_run``'s own LLVM compile
(notes/cpu.md, compile times). Here the driver takes the native entry address of
``_run``'s compiled overload as its first argument and :func:`call_at` calls through
it: the driver's modules hold only the call, and the code that runs is ``_run``'s own
module's (compiled once, with an explicit signature, when the kernel module is
imported; also when it is loaded from Numba's disk cache). :class:`Kernel` is the
entry point the kernel module exports: the driver with the address bound.

Examples
--------
>>> import numba, numpy as np
>>> @numba.njit("void(float64[::1], int64, int64)")
... def work(y, lo, hi):
...     for i in range(lo, hi):
...         y[i] = 2 * i
>>> @numba.njit("void(int64, float64[::1])")
... def drive(run, y):
...     call_at(run, work, (y, 1, y.shape[0]))
>>> f = Kernel(drive, work)
>>> y = np.zeros(4)
>>> f(y)
>>> y
array([0., 2., 4., 6.])
"""
from __future__ import annotations

import functools

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["call_at", "native_address", "Kernel"]


@intrinsic
def call_at(typingctx, address, fn, args):
    """``fn(*args)`` through ``address``, the native entry of ``fn``'s compiled overload
    (:func:`native_address`), without linking ``fn`` into the caller.

    ``fn`` is a Numba dispatcher compiled with an explicit signature that returns
    nothing; ``args`` a tuple, converted to the argument types of the overload that
    Numba's typing picks for them (as a direct call would). An exception raised in
    ``fn`` propagates as from a direct call.
    """
    if not (isinstance(address, types.Integer) and isinstance(fn, types.Dispatcher)
            and isinstance(args, types.BaseTuple)):
        return None
    sig = typingctx.resolve_function_type(fn, tuple(args.types), {})
    if sig is None or sig.return_type != types.none:
        return None
    params = sig.args

    def codegen(context, builder, signature, cargs):
        addr, _, tup = cargs
        vals = [context.cast(builder, v, t, p) for v, t, p in
                zip(cgutils.unpack_tuple(builder, tup, len(params)), args.types, params)]
        fnty = context.call_conv.get_function_type(types.none, params)
        ptr = builder.inttoptr(context.cast(builder, addr, signature.args[0], types.intp),
                               fnty.as_pointer())
        status, _ = context.call_conv.call_function(builder, ptr, types.none, params, vals)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.void(address, fn, args), codegen


def native_address(fn) -> int:
    """The address of the native entry of ``fn``'s one compiled overload (:func:`call_at`);
    ``fn`` a Numba dispatcher compiled (or loaded from Numba's cache) for one signature."""
    if len(fn.overloads) != 1:
        raise ValueError(f"{fn.py_func.__name__} has {len(fn.overloads)} compiled overloads, "
                         "expected 1 (an explicit signature)")
    (cres,) = fn.overloads.values()
    address = cres.library.get_pointer_to_function(cres.fndesc.mangled_name)
    if not address:
        raise RuntimeError(f"{fn.py_func.__name__}: no native entry "
                           f"{cres.fndesc.mangled_name} in its library")
    return address


class Kernel(functools.partial):
    """A kernel module's entry point: ``driver(native_address(run), *args)`` (a
    :class:`functools.partial`: the call costs what a direct call of the driver does).

    Attributes other than the call are the driver's (a Numba dispatcher: ``py_func``,
    ``stats``, ``inspect_asm``, ...); ``driver`` is ``func``, ``run`` the work function,
    ``address`` its native entry.
    """

    def __new__(cls, driver, run):
        self = super().__new__(cls, driver, native_address(run))
        self.run = run
        return self

    @property
    def driver(self):
        return self.func

    @property
    def address(self):
        return self.args[0]

    def __getattr__(self, name):
        return getattr(self.func, name)

    def __repr__(self):
        return f"Kernel({self.func.py_func.__name__})"
