"""The Jinja2 environment of the kernel templates, with the compiled templates cached on disk.

Jinja2 compiles each template to Python the first time a process renders it (about 0.05 s
a template; a solve that builds nine kernels spent 0.46 s there in every new process).
:class:`jinja2.FileSystemBytecodeCache` keeps that code in
``$SMALLTC_CACHE_DIR/jinja`` (default ``~/.cache/smalltc/jinja``), checked against each
template's source: a changed template is compiled again. Where the folder cannot be made,
templates are compiled as before.
"""
from __future__ import annotations

import os
from pathlib import Path

import jinja2

__all__ = ["environment", "cache_dir"]


def cache_dir() -> Path:
    """Where the compiled templates are kept."""
    root = os.environ.get("SMALLTC_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "smalltc") / "jinja"


def _bytecode_cache():
    try:
        path = cache_dir()
        path.mkdir(parents=True, exist_ok=True)
        return jinja2.FileSystemBytecodeCache(str(path))
    except OSError:
        return None


def environment(loader) -> jinja2.Environment:
    """The environment every kernel template renders in: undefined names are errors,
    block tags leave no blank lines, the compiled templates cached on disk.

    >>> env = environment(jinja2.DictLoader({"t": "{{ n }} x"}))
    >>> env.get_template("t").render(n=3)
    '3 x'
    """
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True, autoescape=False,
                              bytecode_cache=_bytecode_cache())
