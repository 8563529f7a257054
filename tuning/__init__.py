"""Autotuner: search kernel variants on this GPU and write its lookup table (``smalltc tune``).

The tuner imports the core and never the reverse:
the CUDA kernel families (:mod:`smalltc.backends.cuda`) own their parameters,
search space and table adaptation; the core reads the tables
(:mod:`smalltc.tables`); this package searches and writes them.

Walk from the command to a table entry:

================  ==========================================================
module            job
================  ==========================================================
:mod:`.sizes`     ``--sizes`` tokens -> specs
:mod:`.space`     spec -> the kernel variants worth compiling (each family's
                  raw space, pruned by its rules and duplicate kernels)
:mod:`.compile`   variant -> compiled kernel and its registers/spills (NVRTC
                  through the CUDA backend on a GPU; nvcc + ptxas without)
:mod:`.measure`   variant -> verified against float64 einsum, timed (CUDA
                  events, median of >= 20, >= 256 MB)
:mod:`.search`    all of it per size, with checkpoints, resume, time budget
:mod:`.tables`    results -> ``tables/sm90-<device>-float64.json`` (size key
                  -> parameters) and its evidence (times, runner-ups)
:mod:`.plot`      one size's search as a picture
:mod:`.cli`       ``smalltc tune``
================  ==========================================================

The shipped tables live in this package's ``tables/`` folder (package data), their
evidence in the source tree's ``benchmarks/tuning/``;
``SMALLTC_TUNING=off`` runs on the heuristics alone, ``SMALLTC_TUNING_TABLES=DIR``
reads tables from ``DIR`` first (:mod:`smalltc.tables`).
"""
