"""smalltc.fem: the high-order FEM layer on top of the smalltc core.

Quadrature rules and 1D nodal bases on the reference interval [-1, 1],
structured box meshes with curved (distorted) elements and unstructured
quadrilateral/hexahedral meshes read from files (:func:`read_mesh`, meshio),
continuous H1 spaces with gather/scatter, Dirichlet and Neumann conditions,
the Poisson solve (:func:`solve_poisson`), VTU output (:func:`write_vtu`), geometry at quadrature points (the ``D`` of the
mass operator, the ``Q`` of the diffusion operator), matrix-free and assembled
mass, diffusion and Helmholtz operators built on :func:`smalltc.operator_apply`
and :func:`smalltc.assemble_operator`,
preconditioned CG, and L2 projection.

Meshes are NumPy on the host; the geometry (``x`` and ``J`` through
:func:`smalltc.interpolate`), the point data, load vectors, errors and the solve path
(gather/scatter, operators, Jacobi, CG) work with the array module of the chosen
device, element chunk by chunk, so ``l2_project(..., device="gpu")`` runs them with
CuPy on the GPU and ``device="auto"`` (the default) does so whenever a GPU answers.

Examples
--------
>>> from smalltc import fem
>>> mesh = fem.box_mesh(3, 2, distortion=0.05)     # trilinear, distorted elements
>>> res = fem.l2_project(mesh, 2, lambda x: x[0] * x[1] + x[2] ** 2, device="cpu")
>>> res.l2_error < 1e-12     # the mapped Q_2 space contains quadratics
True
"""

from .api import cg, diffusion_operator, helmholtz_operator, l2_project, mass_operator
from .basis import Basis1D, barycentric_weights, basis_1d, differentiation_matrix, lagrange_basis
from .boundary import ConstrainedOperator, DirichletBC, boundary_load, dirichlet_bc
from .chebyshev import Chebyshev, chebyshev, estimate_lambda_max
from .demo import projection_demo, smooth_function
from .geometry import (
    QuadratureData,
    check_jacobian,
    det_jacobian,
    diffusion_data,
    evaluate_field,
    jacobian,
    map_points,
    mass_data,
    quadrature_data,
)
from . import meshes
from .mesh import BoxMesh, Kershaw, box_mesh, kershaw_mesh, sine_distortion
from .meshes import demo_mesh_path, make_demo_mesh
from .multigrid import PMultigrid, Transfer, pmg, pmg_orders
from .schwarz import Schwarz, schwarz
from .unstructured import UnstructuredMesh, from_elements, read_mesh
from .output import to_meshio, write_vtu
from .operators import (
    AssembledMassOperator,
    AssembledOperator,
    MassOperator,
    Operator,
)
from .poisson import (
    PoissonProblem,
    PoissonResult,
    exact_gradient,
    h1_error,
    poisson_problem,
    solve_poisson,
)
from .poisson_demo import poisson_demo
from .projection import ProjectionResult, l2_error, load_vector
from .quadrature import RULES, gauss_legendre, gauss_lobatto, quadrature_rule
from .solvers import CGResult, ConvergenceError, jacobi, progress_log
from .space import H1Space

__all__ = [
    # quadrature
    "RULES",
    "gauss_legendre",
    "gauss_lobatto",
    "quadrature_rule",
    # 1D bases
    "Basis1D",
    "barycentric_weights",
    "basis_1d",
    "differentiation_matrix",
    "lagrange_basis",
    # meshes and spaces
    "BoxMesh",
    "box_mesh",
    "sine_distortion",
    "Kershaw",
    "kershaw_mesh",
    "UnstructuredMesh",
    "from_elements",
    "read_mesh",
    "demo_mesh_path",
    "make_demo_mesh",
    "H1Space",
    # geometry
    "QuadratureData",
    "check_jacobian",
    "det_jacobian",
    "diffusion_data",
    "evaluate_field",
    "jacobian",
    "map_points",
    "mass_data",
    "quadrature_data",
    # boundary conditions
    "ConstrainedOperator",
    "DirichletBC",
    "boundary_load",
    "dirichlet_bc",
    # operators and solvers
    "AssembledMassOperator",
    "AssembledOperator",
    "MassOperator",
    "Operator",
    "mass_operator",
    "diffusion_operator",
    "helmholtz_operator",
    "CGResult",
    "ConvergenceError",
    "cg",
    "jacobi",
    "progress_log",
    # multigrid (p-multigrid, Chebyshev smoothing, AMG coarse solve)
    "Chebyshev",
    "chebyshev",
    "estimate_lambda_max",
    "PMultigrid",
    "Transfer",
    "pmg",
    "pmg_orders",
    "Schwarz",
    "schwarz",
    # the Poisson problem
    "PoissonProblem",
    "PoissonResult",
    "exact_gradient",
    "h1_error",
    "poisson_problem",
    "solve_poisson",
    "poisson_demo",
    # output
    "to_meshio",
    "write_vtu",
    # projection
    "ProjectionResult",
    "l2_error",
    "l2_project",
    "load_vector",
    "projection_demo",
    "smooth_function",
]
