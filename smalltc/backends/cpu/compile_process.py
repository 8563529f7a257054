"""The helper process that compiles CPU kernels for another (``SMALLTC_COMPILE_PROCESS``).

A kernel compiled in a process keeps 10-30 MB of it until the process ends (LLVM's
memory, not Python's); one loaded from Numba's disk cache about 2 MB. With
``SMALLTC_COMPILE_PROCESS=N`` (:mod:`.runtime`) each kernel not yet loaded is compiled
here first, in a child process that writes Numba's disk cache and is replaced after N
kernels; the calling process then loads it from that cache. It is what keeps a
process that builds hundreds of kernels (a test suite's worker) small.

The child runs :func:`serve` (a fresh interpreter, ``python -c``): it reads pickled
requests ``(template, entry, slp, params)`` from stdin and answers each with a pickled
``None`` (built) or the text of the error. A request ``("call", "module:function",
args)`` runs that function instead and answers ``("ok", result)`` or ``("error", text)``
(:meth:`CompileProcess.call`): :func:`smalltc.precompile` builds its items in a pool of
these children, each writing the shared disk cache.
"""
from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import threading

__all__ = ["CompileProcess", "serve"]

_CHILD = "from smalltc.backends.cpu.compile_process import serve; serve()"


class CompileProcess:
    """One child at a time, replaced after ``tasks`` requests or when it dies."""

    def __init__(self, tasks: int):
        self.tasks, self.done, self.proc = tasks, 0, None
        self.lock = threading.Lock()
        self.stopped = False

    def stop(self):
        """End the child now (a request under way answers that it died) and start no
        other: every later request answers so too."""
        self.stopped = True
        proc = self.proc
        if proc is not None:
            proc.kill()

    def _start(self):
        env = dict(os.environ, SMALLTC_COMPILE_PROCESS="0")
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.done = 0

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
            self.proc = None

    def _ask(self, request, what):
        """Send ``request``, return the child's answer, or the text of its death."""
        with self.lock:
            for attempt in (0, 1):
                if self.stopped:
                    return f"the compile process was stopped before building {what}"
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
                try:
                    pickle.dump(request, self.proc.stdin)
                    self.proc.stdin.flush()
                    answer = pickle.load(self.proc.stdout)
                except (OSError, EOFError, pickle.UnpicklingError):
                    self.proc = None          # it died (killed, out of memory): a new one
                    if attempt:
                        return f"the compile process died building {what}"
                    continue
                self.done += 1
                if self.done >= self.tasks:
                    self.close()
                return answer

    def compile(self, template, entry, slp, params):
        """Build the kernel in the child; returns None, or the child's error text."""
        return self._ask((template, entry, slp, params), entry)

    def call(self, target: str, *args):
        """Run ``target`` (``"module:function"``) with ``args`` (picklable) in the child.

        Returns ``(True, result)``, or ``(False, text)``: the error it raised, or that
        the child died twice running it.
        """
        answer = self._ask(("call", target, args), f"{target}{args}")
        if isinstance(answer, str):
            return False, answer
        return answer[0] == "ok", answer[1]


def serve(stdin=None, stdout=None):
    """The child's loop: build each request (or run each call), answer as the module
    docstring says."""
    from .runtime import load_kernel  # cycle: .runtime imports this module
    if stdout is None:
        # the answers on a copy of fd 1; whatever else writes to stdout (a print, a C
        # library) goes to stderr and cannot corrupt them
        sys.stdout.flush()
        stdout = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    stdin = stdin or sys.stdin.buffer
    while True:
        try:
            request = pickle.load(stdin)
        except EOFError:
            return
        if len(request) == 3 and request[0] == "call":
            try:
                module, name = request[1].split(":")
                answer = ("ok", getattr(importlib.import_module(module), name)(*request[2]))
            except Exception as err:       # the caller decides (precompile: runs it itself)
                answer = ("error", f"{type(err).__name__}: {err}")
        else:
            template, entry, slp, params = request
            try:
                load_kernel(template, entry, slp, _here=True, **params)
                answer = None
            except Exception as err:       # the caller compiles it itself and raises there
                answer = f"{type(err).__name__}: {err}"
        pickle.dump(answer, stdout)
        stdout.flush()
