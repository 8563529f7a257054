"""The ``smalltc`` command: ``info``, ``demo``, ``bench``, ``tune``, ``precompile``.

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``; this file only routes.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

__all__ = ["main"]

# name -> (module, help)
SUBCOMMANDS = {
    "info": ("smalltc.info", "version, backends, devices and tuning tables"),
    "demo": ("smalltc.demo", "FEM demo (L2 projection) and roofline report"),
    "bench": ("smalltc.bench.cli", "benchmark suites against the roofline and baselines"),
    "tune": ("smalltc.tuning.cli", "autotune kernels and write lookup tables"),
    "precompile": ("smalltc.aot", "compile the kernels of given sizes ahead, into the disk "
                                  "caches"),
}


def _version() -> str:
    """``smalltc X.Y.Z (python, numpy, numba)``: what ``smalltc --version`` prints."""
    import platform

    from . import __version__
    parts = [f"python {platform.python_version()}"]
    for mod in ("numpy", "numba"):
        try:
            parts.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:                       # pragma: no cover
            pass
    return f"smalltc {__version__} ({', '.join(parts)})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="smalltc", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (modname, help_) in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as err:
            if err.name != modname:
                raise
            continue                      # subcommand not built in this version
        p = sub.add_parser(name, help=help_, description=help_)
        mod.add_arguments(p)
        modules[name] = mod
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(message)s")
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
