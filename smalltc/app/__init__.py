"""The application layer: the ``smalltc`` command line and the demo.

The layers, bottom up, each importing only those below it:

1. the core, :mod:`smalltc` (specs, plans, kernels and their backends, the quadrature
   rules, the roofline bound model, the tuning tables' lookup);
2. the FEM layer, :mod:`smalltc.fem` (meshes, spaces, operators, solvers), built on the
   core's public functions;
3. the tools: the tuner :mod:`smalltc.tuning` and the benchmark suites
   :mod:`smalltc.bench`;
4. this layer: :mod:`smalltc.app.cli`, which routes ``smalltc <command>`` (also
   ``python -m smalltc``) to a subcommand module, and :mod:`smalltc.app.demo`, the
   ``smalltc demo`` command.

``tests/test_layering.py`` checks the rules on every import of the source, those inside
functions included.
"""
