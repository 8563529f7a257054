"""smalltc.fem.distributed: the FEM solve across MPI ranks (mpi4py), one block of the mesh each.

The box mesh is split into blocks, one per rank, chosen to keep the interfaces
small (:mod:`.partition`, NumPy only); each rank holds its block's nodes in a
local numbering, owns the nodes of its block less its upper interfaces, and
keeps the others as *ghosts* (:mod:`.space`). The mass operator is the fused
:func:`smalltc.mass_apply` on each rank's elements, with a halo exchange of the
shared nodes overlapped with the interior elements (:mod:`.operators`,
:mod:`.halo`); CG sums its inner products across the ranks
(:func:`smalltc.fem.cg` with ``comm=``, :class:`.comm.Reducer`). On GPUs each
rank takes the node-local rank modulo the device count, and the halo and the
array reductions go through NCCL (:mod:`.nccl`), a CUDA-aware MPI, or page-locked
host memory, decided at run time (:func:`.comm.comm_path`;
``SMALLTC_DIST_COMM`` forces one). ``timings="phases"`` times the solve's
operator and preconditioner applications too, and the first rank of each node
compiles the kernels for the others (:mod:`.phases`).

Beyond box meshes: Kershaw meshes built per rank (:func:`.space.distributed_kershaw_mesh`)
and unstructured meshes (files) partitioned by METIS on rank 0
(:func:`.unstructured.partition_mesh`). Besides the mass operator, the diffusion and
Helmholtz operators (:class:`.operators.DistributedOperator`), the Poisson solve with
Dirichlet and Neumann sides (:mod:`.poisson`) and its p-multigrid preconditioner
(:mod:`.multigrid`).

Entry points: ``smalltc.fem.l2_project(mesh, p, f, comm=MPI.COMM_WORLD)``,
``smalltc.fem.solve_poisson(mesh, p, f, ..., comm=MPI.COMM_WORLD)`` (and
``poisson_problem``), and ``mpiexec -n 2 smalltc demo --mpi``. A serial run never
imports mpi4py; this package imports it only when a distributed object is built
(:func:`.comm.load_mpi`, which says what is missing), and pymetis only to partition
an unstructured mesh over several ranks.

Every argument is checked to agree across the ranks, and a failure on some
ranks is raised on all of them (:func:`.comm.collective`), so a bad call ends
with an error everywhere instead of a hang.

Examples
--------
Run under ``mpiexec -n 2 python script.py`` (here one rank):

>>> from mpi4py import MPI
>>> from smalltc import fem
>>> res = fem.l2_project(fem.box_mesh(2, 4), 2, lambda x: x[0] * x[1], device="cpu",
...                      comm=MPI.COMM_WORLD)
>>> res.l2_error < 1e-12, res.distribution["ranks"]
(True, 1)
"""

from .comm import (CommPath, RankError, Reducer, agree, collective, comm_path, cuda_aware,
                   load_mpi, select_gpu)
from .halo import Halo
from .multigrid import DistributedPMultigrid, distributed_pmg
from .operators import (DistributedMassOperator, DistributedOperator,
                        distributed_diffusion_operator, distributed_helmholtz_operator)
from .partition import BlockPartition, partition_box, process_grid
from .unstructured import PartitionedH1Space, PartitionedMesh, PartMesh, partition_mesh
from .space import (BlockMesh, DistributedH1Space, DistributedMesh, distribute_mesh,
                    distributed_box_mesh, distributed_kershaw_mesh)

__all__ = [
    "BlockMesh",
    "CommPath",
    "BlockPartition",
    "DistributedH1Space",
    "DistributedMassOperator",
    "DistributedOperator",
    "DistributedPMultigrid",
    "DistributedMesh",
    "Halo",
    "PartMesh",
    "PartitionedH1Space",
    "PartitionedMesh",
    "RankError",
    "Reducer",
    "agree",
    "collective",
    "comm_path",
    "cuda_aware",
    "distribute_mesh",
    "distributed_diffusion_operator",
    "distributed_helmholtz_operator",
    "distributed_kershaw_mesh",
    "distributed_pmg",
    "distributed_box_mesh",
    "load_mpi",
    "partition_box",
    "partition_mesh",
    "process_grid",
    "select_gpu",
]
