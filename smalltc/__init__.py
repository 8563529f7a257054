"""smalltc: batched small-tensor contractions for high-order finite elements.

The operations of docs/math.md sections 2 and 3 on NumPy arrays (CPU) and CuPy
arrays (NVIDIA GPUs), with a plan/execute API:

- :func:`batched_contract`: partial-assembly mass action ``U_e = B^T D_e B V_e``
- :func:`assemble_mass`: element mass matrices ``M_e = B^T D_e B``
- :func:`batched_gemm`: batched GEMM with shared operands and transposes
- :func:`contract`: the reshaping-layout kernels (8a), (8b), (9)
- :func:`mass_apply`: the global mass operator through an element-to-DoF map, fused
  (gather, action, scatter-add), and :func:`mass_diagonal` (Jacobi)
- :func:`diffusion_apply`, :func:`diffusion_action`, :func:`diffusion_diagonal`,
  :func:`assemble_diffusion`: the diffusion operator (CEED BP3/BP5) at every level;
  :func:`operator_apply` and friends: the family (mass, diffusion, Helmholtz) by name
- :func:`force_apply`, :func:`force_apply_transpose`: BLAST's corner force ``F`` and
  ``F^T`` (mixed spaces H1^d and L2), per element or with the kinematic side fused
- :func:`mixed_action`, :func:`mixed_apply`: the general operator of mixed spaces
  ``E_out^T (Q . E_in V)`` (own bases, values and/or gradients on each side), the
  general sum-factorised path
- :func:`interpolate`, :func:`integrate`: the basis application (CEED's ``EVAL_INTERP``,
  ``EVAL_GRAD`` and their transposes): fields at the quadrature points through the map,
  values and/or reference gradients, and the integration back to a global vector
- :func:`geometry_data`: the pointwise geometry (``|J|``, the adjugate, the operators'
  point data ``D`` and ``Q``) from the Jacobians at the points, in one pass
- :func:`vector_update`, :func:`pcg_iterate`, :func:`pmg_transfer`, :func:`csr_spmv`,
  :func:`schwarz_fdm`: the solver kernels (:mod:`smalltc.solver`): Chebyshev and V-cycle
  vector updates, fused PCG (Jacobi or any preconditioner), p-multigrid transfers, CSR
  products, Schwarz fast-diagonalisation solves
- :func:`plan`: build once, call many times
- :func:`precompile`: compile the kernels of given sizes ahead, into the disk caches

Arrays of other libraries that implement DLPack (torch, JAX) are taken without a
copy and the result is returned in their library (:mod:`smalltc._interop`).

Examples
--------
>>> import numpy as np, smalltc
>>> B1d = np.random.rand(3, 2); D = np.random.rand(4, 3, 3)
>>> smalltc.batched_contract(B1d, D, np.random.rand(4, 2, 2)).shape
(4, 2, 2)
"""
import logging as _logging

from .api import (assemble_diffusion, assemble_mass, assemble_operator, batched_contract,
                  batched_gemm, contract, diffusion_action, diffusion_apply,
                  diffusion_diagonal, mass_apply, mass_diagonal, operator_action,
                  operator_apply, operator_diagonal)
from ._errors import check_errors
from .aot import precompile
from .evaluation import integrate, interpolate
from .geometry import geometry_data
from .mixed import force_apply, force_apply_transpose, mixed_action, mixed_apply
from .catalogue import STEPS
from .plan import Plan, evaluation_job, plan
from .solver import csr_spmv, pcg_iterate, pmg_transfer, schwarz_fdm, vector_update

__version__ = "0.1.0"
__all__ = ["batched_contract", "assemble_mass", "batched_gemm", "contract", "mass_apply",
           "mass_diagonal", "diffusion_action", "diffusion_apply", "diffusion_diagonal",
           "assemble_diffusion", "operator_action", "operator_apply", "operator_diagonal",
           "assemble_operator", "force_apply", "force_apply_transpose", "mixed_action",
           "mixed_apply", "interpolate", "integrate", "geometry_data", "vector_update",
           "pcg_iterate", "pmg_transfer", "csr_spmv", "schwarz_fdm", "plan", "evaluation_job",
           "precompile",
           "check_errors",
           "Plan", "STEPS", "__version__"]

_logging.getLogger("smalltc").addHandler(_logging.NullHandler())
