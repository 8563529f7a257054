"""The ``smalltc`` command: ``info``, ``demo``, ``bench``, ``tune``, ``precompile``.

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``; this file only routes, and imports only the module of the
subcommand named. A subcommand's ``--help`` shows its module's docstring (up to its
first section, such as Examples) as plain text.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import logging
import platform
import re
import shutil
import sys
import textwrap

from .. import __version__

__all__ = ["main", "plain_text"]

# name -> (module, help)
SUBCOMMANDS = {
    "info": ("smalltc.info", "version, backends, devices and tuning tables"),
    "demo": ("smalltc.app.demo", "FEM demo (an L2 projection, a Poisson problem on a curved mesh) "
                             "and roofline report"),
    "bench": ("smalltc.bench.cli", "benchmark suites against the roofline and baselines"),
    "tune": ("smalltc.tuning.cli", "autotune kernels and write lookup tables"),
    "precompile": ("smalltc.aot", "compile the kernels of given sizes ahead, into the disk "
                                  "caches"),
}

_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")       # :func:`~smalltc.fem.read_mesh`
_LIST = re.compile(r"(?:\*|-|\d+\.) ")                 # "* ", "- ", "1. " items
_LITERAL = re.compile(r"``([^`]+)``|`([^`\n]+)`")   # ``literal``, `default role`


def _role(match):
    """A role's target as text: ``~a.b.c`` names only ``c``, as Sphinx shows it."""
    return match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)


def plain_text(doc, width=None) -> str:
    """A module docstring as ``--help`` text: the part before its first NumPy section
    (Examples, Parameters, ...), without reStructuredText markup (roles, literals, ``::``),
    its paragraphs and list items wrapped to the terminal, indented blocks as written.

    Examples
    --------
    >>> print(plain_text('''``smalltc x``: see :func:`~smalltc.fem.read_mesh`, `y`.
    ...
    ... Examples of use::
    ...
    ...     smalltc x --flag
    ...
    ... Examples
    ... --------
    ... >>> 1
    ... '''))
    smalltc x: see read_mesh, y.
    <BLANKLINE>
    Examples of use:
    <BLANKLINE>
        smalltc x --flag
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    for i in range(len(lines) - 1):
        under = lines[i + 1].strip()
        if lines[i].strip() and under and set(under) == {"-"} and len(under) >= 3:
            lines = lines[:i]
            break
    text = "\n".join(lines).strip()
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(lambda m: m.group(1) or m.group(2), text)
    text = re.sub(r"::$", ":", text, flags=re.M)
    width = width or max(40, min(100, shutil.get_terminal_size().columns - 2))
    out = []
    for para in text.split("\n\n"):
        para = para.strip("\n")
        if para[:1].isspace():                        # a literal block: as written
            out.append(para)
            continue
        items = re.split(r"\n(?=(?:\*|-|\d+\.) )", para)   # list items (or one paragraph)
        out.append("\n".join(
            textwrap.fill(" ".join(item.split()), width,
                          subsequent_indent=" " * len(_LIST.match(item).group(0))
                          if _LIST.match(item) else "")
            for item in items))
    return "\n\n".join(out)


def _version() -> str:
    """``smalltc X.Y.Z (python, numpy, numba)``: what ``smalltc --version`` prints."""
    parts = [f"python {platform.python_version()}"]
    for mod in ("numpy", "numba"):               # from the metadata: importing numba costs
        try:                                     # a third of a second on every command
            parts.append(f"{mod} {importlib.metadata.version(mod)}")
        except importlib.metadata.PackageNotFoundError:      # pragma: no cover
            pass
    return f"smalltc {__version__} ({', '.join(parts)})"


def _chosen(argv) -> str | None:
    """The subcommand named on the command line: the first word that is not an option
    (the top-level options take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="smalltc", description=plain_text(
        __doc__.split("\n\n")[0]))
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    # only the chosen subcommand's module is imported (with the layers it needs: the
    # benchmark suites, the FEM layer, the tuner); the others are listed by name and help
    chosen, mod = _chosen(argv), None
    for name, (modname, help_) in SUBCOMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=help_)
            continue
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=help_, description=plain_text(mod.__doc__) or help_,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(message)s")
    return int(mod.run(args) or 0)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
