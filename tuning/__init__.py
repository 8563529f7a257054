"""Autotuner and per-GPU lookup tables (``smalltc tune``), after seed 002 section 6.3.

Walk from the command to a table entry:

================  ==========================================================
module            job
================  ==========================================================
:mod:`.sizes`     ``--sizes`` tokens -> specs
:mod:`.space`     spec -> the kernel variants worth compiling (pruned by
                  threads, shared memory, register tile, duplicates)
:mod:`.compile`   variant -> compiled kernel and its registers/spills (NVRTC
                  through the CUDA backend on a GPU; nvcc + ptxas without)
:mod:`.measure`   variant -> verified against float64 einsum, timed (CUDA
                  events, median of >= 20, >= 256 MB)
:mod:`.search`    all of it per size, with checkpoints, resume, time budget
:mod:`.tables`    results -> ``tables/sm90-float64.json``; runtime lookup
                  (exact size, nearest size, else the heuristic)
:mod:`.plot`      one size's search as a picture
:mod:`.cli`       ``smalltc tune``
================  ==========================================================

Runtime use: :func:`install` hands :func:`runtime_lookup` to the CUDA
backend (``_cuda_params.set_table_lookup``); :func:`describe` says what the
lookup finds for a spec. Set ``SMALLTC_TUNING=off`` to run on the heuristic
alone, ``SMALLTC_TUNING_TABLES=DIR`` to read tables from ``DIR`` first.
"""
from .tables import Table, describe, install, load, runtime_lookup, uninstall

__all__ = ["Table", "describe", "install", "load", "runtime_lookup", "uninstall"]
