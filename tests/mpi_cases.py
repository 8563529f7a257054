"""Distributed FEM cases run under mpiexec (by tests/test_fem_distributed_mpi.py, or by hand).

    mpiexec -n 2 python tests/mpi_cases.py compare [--device gpu] [--dims 2,3] [--ps 1,2,3,4]
    mpiexec -n 2 python tests/mpi_cases.py mismatch        # p differs across ranks
    mpiexec -n 2 python tests/mpi_cases.py local-failure   # f fails on rank 1 only
    mpiexec -n 5 python tests/mpi_cases.py unpartitionable # a 2 x 2 mesh over 5 ranks
    mpiexec -n 2 python tests/mpi_cases.py node-first      # node_first: one rank, the others wait
    mpiexec -n 3 python tests/mpi_cases.py poisson [--meshes box,block,kershaw,file] [--ps 1,2,3]
                                                   [--precond jacobi|pmg] [--coarse amg|cg]
    mpiexec -n 4 python tests/mpi_cases.py exchanges [--device gpu] [--ps 2,4]

``compare``: for each case, the distributed operators (mass, diffusion, Helmholtz)
applied to a random vector and the distributed L2 projection (CG to 1e-13) against the
serial ones on rank 0, which prints a line ``CASE {json}``; every rank prints
``DONE rank r``. The error cases
print ``ERROR rank r: <type>: <message>`` on every rank and exit with status 3, so
an error that reached only some ranks shows as a missing line (or a timeout). Rank 0's
serial checks end with a barrier whose waiting ranks sleep
(:func:`smalltc.fem.distributed.comm.quiet_barrier`): on an oversubscribed host a rank
spinning in MPI would take the core rank 0 works on.

``node-first``: :func:`smalltc.fem.distributed.comm.node_first` runs its function on the
node's first rank only, the others return after it (``NODEFIRST {json}`` a rank).

``poisson``: ``-div(kappa grad u) = f`` with ``u = exp(x + y/2 [+ z/4])``, Dirichlet on
the boundary but for a Neumann side (``kappa du/dn`` there), solved by the distributed
Jacobi-CG to 1e-13 and compared with the serial solve on rank 0 (one ``CASE`` line each):
the whole box mesh cut into blocks (``box``), blocks built per rank (``block``: box,
``kershaw``), and a mesh file partitioned by METIS (``file``). With ``--precond pmg``
(``--coarse``: its order-1 solve, ``amg`` gathered on rank 0 or ``cg`` across the ranks;
by default AMG where pyamg imports) the iterations are compared with the same
p-multigrid on one rank, and recorded for the serial :func:`smalltc.fem.pmg` (with pyamg).

``exchanges``: the halo's neighbour sum of random partial values against their sum
over the holders (and the holders' bits against each other), and the distributed
p-multigrid's V-cycle on consistent vectors (``exchanges="sum"``) against the owner-form
one on the same residual, with the exchanges each made and the CG iterations of both.
"""
import argparse
import json
import os
import sys

import numpy as np

TOL = 1e-13     # CG's target: the serial and distributed iterates then agree to ~1e-14


def emit(line):
    """One line in one write: the lines of several ranks never interleave."""
    os.write(1, (line + "\n").encode())


def _cases(dims, ps):
    for dim in dims:
        for p in ps:
            yield dim, {1: 7, 2: 5, 3: 4}[dim] if p > 2 else {1: 9, 2: 6, 3: 4}[dim], p


def _kappa(x):
    return 1.0 + 0.5 * x[0] * x[0]


def compare(comm, device, dims, ps):
    from smalltc import fem
    from smalltc.fem.distributed import (DistributedMassOperator, distributed_box_mesh,
                                         distributed_diffusion_operator,
                                         distributed_helmholtz_operator)
    rank = comm.Get_rank()
    for k, (dim, n, p) in enumerate(_cases(dims, ps)):
        mesh = fem.box_mesh(dim, n, distortion=0.05, geom_order=2)
        # the operator, on a random vector (every rank draws the same global one)
        M = fem.mass_operator(fem.H1Space(mesh, p), comm=comm, device=device)
        V, xp = M.space, M.xp
        # the owned mask and the global numbers made from the blocks' boxes on the device,
        # against the index arrays (a fresh space: nothing made before)
        W = type(V)(V.mesh, p)
        mask, l2g = fem._device.to_host(W.owned_mask(xp)), fem._device.to_host(
            W.local_to_global_on(xp))
        want = np.zeros(W.nlocal, dtype=bool)
        want[W.owned] = True
        index_ok = bool(np.array_equal(mask, want) and np.array_equal(l2g, W.local_to_global)
                        and int(mask.sum()) == W.nowned)
        xg = np.random.default_rng(k).random(V.ndofs)
        x = xp.asarray(V.global_to_local(xg))
        x[xp.asarray(V.ghosts)] = -1.0e30               # the operator fills the ghosts
        y = M(x)
        ghosts_zero = bool((y[xp.asarray(V.ghosts)] == 0).all()) if V.nghosts else True
        ghosts_filled = bool(np.array_equal(fem._device.to_host(x), V.global_to_local(xg)))
        yg = V.gather(y, root=0)
        # the diffusion and Helmholtz operators (kappa a function of x), the same vector
        K = distributed_diffusion_operator(V, kappa=_kappa, device=device)
        H = distributed_helmholtz_operator(V, 2.0, kappa=_kappa, device=device)
        ykg = V.gather(K(xp.asarray(V.global_to_local(xg))), root=0)
        yhg = V.gather(H(xp.asarray(V.global_to_local(xg))), root=0)
        # the same through the staged transport (host copies; pinned memory on a GPU)
        Ms = DistributedMassOperator(V, xp.asarray(fem.mass_data(V.mesh.local, p + 2)),
                                     xp.asarray(fem.basis_1d(p, p + 2).B1d), transport="staged")
        ysg = V.gather(Ms(xp.asarray(V.global_to_local(xg))), root=0)
        # the projection; odd cases build only the rank's block of the mesh
        dmesh = (distributed_box_mesh(dim, n, comm, distortion=0.05, geom_order=2) if k % 2
                 else mesh)
        res = fem.l2_project(dmesh, p, fem.smooth_function, tol=TOL, device=device,
                             comm=None if k % 2 else comm)
        ug = res.space.gather(res.u, root=0)
        flags = comm.gather((ghosts_zero, ghosts_filled, res.distribution["gpu"], index_ok),
                            root=0)
        if rank == 0:
            ys = fem._device.to_host(fem.mass_operator(fem.H1Space(mesh, p), device=device)(
                xp.asarray(xg)))
            ser = fem.l2_project(mesh, p, fem.smooth_function, tol=TOL, device=device)
            Vs = fem.H1Space(mesh, p)
            yks = fem._device.to_host(fem.diffusion_operator(Vs, kappa=_kappa, device=device)(
                xp.asarray(xg)))
            yhs = fem._device.to_host(fem.helmholtz_operator(Vs, 2.0, kappa=_kappa,
                                                             device=device)(xp.asarray(xg)))
            rec = dict(dim=dim, n=n, p=p, ranks=comm.Get_size(), grid=res.distribution["grid"],
                       op_err=float(np.linalg.norm(yg - ys) / np.linalg.norm(ys)),
                       op_err_staged=float(np.linalg.norm(ysg - ys) / np.linalg.norm(ys)),
                       op_err_diffusion=float(np.linalg.norm(ykg - yks) / np.linalg.norm(yks)),
                       op_err_helmholtz=float(np.linalg.norm(yhg - yhs) / np.linalg.norm(yhs)),
                       u_err=float(np.linalg.norm(ug - ser.u) / np.linalg.norm(ser.u)),
                       iters=res.iterations, iters_serial=ser.iterations,
                       l2_error=res.l2_error, l2_error_serial=ser.l2_error,
                       ghosts_zero=all(f[0] for f in flags),
                       ghosts_filled=all(f[1] for f in flags),
                       index_ok=all(f[3] for f in flags),
                       device=res.device, transport=res.distribution["transport"],
                       transport_reason=res.distribution["transport_reason"],
                       gpus=[f[2] for f in flags])
            emit("CASE " + json.dumps(rec))
        quiet_barrier(comm)
    emit(f"DONE rank {rank}")


def quiet_barrier(comm):
    from smalltc.fem.distributed.comm import quiet_barrier as barrier
    barrier(comm)


def node_first_case(comm, folder):
    """node_first: the function runs on the node's first rank, once per key; the others
    see its file when they return."""
    import time

    from smalltc.fem.distributed.comm import node_first
    rank = comm.Get_rank()
    marker = os.path.join(folder, "built")
    ran = []

    def build():
        time.sleep(0.5)                        # the others must wait for it
        with open(marker, "w") as f:
            f.write(str(rank))
        ran.append(rank)
    node_first(comm, ("case", 1), build)
    saw = os.path.exists(marker)
    node_first(comm, ("case", 1), build)     # the same key again: nothing
    emit("NODEFIRST " + json.dumps(dict(rank=rank, ran=len(ran), saw=saw)))


def _exact(dim):
    c = (1.0, 0.5, 0.25)[:dim]
    u = lambda x: np.exp(sum(ci * xi for ci, xi in zip(c, x)))            # noqa: E731
    grad = lambda x: np.stack([ci * u(x) for ci in c])                   # noqa: E731
    lap = sum(ci * ci for ci in c)
    return u, grad, lap


def _poisson_meshes(comm, kinds, dims, ps):
    """(label, whole serial mesh, what the distributed solve gets, p) for each case."""
    from smalltc import fem
    from smalltc.fem.distributed import distributed_box_mesh, distributed_kershaw_mesh
    for kind in kinds:
        for dim in dims:
            for p in ps:
                n = {2: 4, 3: 3}[dim] if p > 1 else {2: 5, 3: 3}[dim]
                if kind == "box":
                    mesh = fem.box_mesh(dim, n, distortion=0.05, geom_order=2)
                    yield kind, mesh, mesh, p
                elif kind == "block":
                    yield (kind, fem.box_mesh(dim, n, distortion=0.05),
                           distributed_box_mesh(dim, n, comm, distortion=0.05), p)
                elif kind == "kershaw":
                    shape = (6,) + (2,) * (dim - 1) if dim == 3 or p > 2 else (6, 4)
                    yield (kind, fem.kershaw_mesh(shape, 0.3, dim=dim),
                           distributed_kershaw_mesh(shape, comm, 0.3, dim=dim), p)
                elif kind == "file" and (dim == 2 or p == 1):
                    path = fem.demo_mesh_path(dim)
                    yield kind, fem.read_mesh(path), path, p


def poisson(comm, device, kinds, dims, ps, precond="jacobi", coarse=None):
    from mpi4py import MPI

    from smalltc import fem
    from smalltc.fem.coarse import _pyamg_present
    rank = comm.Get_rank()
    for kind, whole, given, p in _poisson_meshes(comm, kinds, dims, ps):
        dim = whole.dim
        u, grad, lap = _exact(dim)
        kappa = 2.0
        f = lambda x, u=u, lap=lap: -kappa * lap * u(x)                  # noqa: E731
        side = "outer" if kind == "file" else "xmax"     # Neumann there, Dirichlet elsewhere
        h = lambda x, n, grad=grad: kappa * (grad(x) * n).sum(axis=0)    # noqa: E731
        kw = dict(dirichlet={None: u}, neumann={side: h}, kappa=kappa, exact=(u, grad),
                  tol=TOL, device=device)
        pmg_options = {"coarse": coarse} if coarse else None
        res = fem.solve_poisson(given, p, f, comm=comm if kind in ("box", "file") else None,
                                precond=precond, pmg_options=pmg_options, **kw)
        ug = res.space.gather(res.u, root=0)
        owned = comm.gather(res.distribution["owned_dofs"], root=0)
        graphed = getattr(res.problem.precond, "graphed", None)
        if graphed:                    # the same solve with the V-cycle launch by launch
            eager = fem.solve_poisson(given, p, f, comm=comm if kind in ("box", "file") else
                                      None, precond=precond,
                                      pmg_options={**(pmg_options or {}), "graph": False}, **kw)
            ue = eager.space.gather(eager.u, root=0)
            replays = res.problem.precond._replay.replays
        if kind == "file":             # the L2 projection on the METIS parts too
            proj = fem.l2_project(given, p, u, tol=TOL, device=device, comm=comm)
            pg = proj.space.gather(proj.u, root=0)
        if rank == 0:
            ser = fem.solve_poisson(whole, p, f, **kw)
            iters_pmg_serial = None
            if precond == "pmg":       # the iterations of the same preconditioner on one rank
                one = fem.solve_poisson(whole, p, f, comm=MPI.COMM_SELF, precond="pmg",
                                        pmg_options=pmg_options, **kw)
                ser.iterations = one.iterations
                if _pyamg_present():   # and of the serial pmg (its AMG coarse solve)
                    iters_pmg_serial = fem.solve_poisson(whole, p, f, precond="pmg",
                                                         **kw).iterations
            rec = dict(kind=kind, dim=dim, p=p, ranks=comm.Get_size(), precond=precond,
                       u_err=float(np.abs(ug - ser.u).max() / np.abs(ser.u).max()),
                       iters=res.iterations, iters_serial=ser.iterations,
                       l2_error=res.l2_error, l2_error_serial=ser.l2_error,
                       h1_error=res.h1_error, h1_error_serial=ser.h1_error,
                       owned=owned, ndofs=int(ser.u.size), device=res.device,
                       iters_pmg_serial=iters_pmg_serial)
            if precond == "pmg":
                solver = res.problem.precond.coarse
                rec["coarse"] = type(solver).__name__
                rec["graphed"] = graphed
                rec["coarse_on_device"] = getattr(solver, "on_device", None)
                cycle = getattr(solver, "_cycle", None)       # rank 0's replayed AMG cycle
                rec["amg_replays"] = None if cycle is None else cycle.replays
                rec["transport"] = res.distribution.get("transport")
            if graphed:
                rec.update(eager_diff=float(np.abs(ug - ue).max() / np.abs(ue).max()),
                           iters_eager=eager.iterations, replays=replays)
            if kind == "file":
                sp = fem.l2_project(whole, p, u, tol=TOL, device=device)
                rec["proj_err"] = float(np.abs(pg - sp.u).max() / np.abs(sp.u).max())
            emit("CASE " + json.dumps(rec))
        quiet_barrier(comm)
    emit(f"DONE rank {rank}")


def exchanges(comm, device, ps):
    """The neighbour sum and the V-cycle on consistent vectors against the owner-form
    one, on box and Kershaw blocks (3D, 8 elements along z: every rank grid up to 4 has
    edges held by 3+ ranks when the grid is 2 x 2)."""
    from smalltc.fem import _device
    from smalltc.fem.distributed import distributed_box_mesh, distributed_kershaw_mesh
    from smalltc.fem.distributed.poisson import poisson_problem_distributed
    from smalltc.fem.coarse import _pyamg_present
    xp = _device.resolve_device(device)
    rank = comm.Get_rank()
    coarse = "amg" if _pyamg_present() else "cg"   # AMG: linear, so the V-cycles agree to rounding
    u, _, lap = _exact(3)
    f = lambda x: -lap * u(x)                                           # noqa: E731
    for kind, p in ((k, q) for k in ("box", "kershaw") for q in ps):
        mesh = (distributed_box_mesh(3, (4, 6, 8), comm, distortion=0.05) if kind == "box"
                else distributed_kershaw_mesh((6, 4, 8), comm, 0.3))
        probs = {ex: poisson_problem_distributed(mesh, p, f, dirichlet={None: u},
                                                 precond="pmg", device=device,
                                                 pmg_options={"exchanges": ex, "coarse": coarse,
                                                              "graph": False})
                 for ex in ("owner", "sum")}
        space = probs["sum"].space
        # the neighbour sum: every holder gets the sum of the holders' values, same bits
        part = np.random.default_rng(rank).standard_normal(space.nlocal)
        summed = _device.to_host(space.halo(xp).sum(xp.array(part)))      # a copy: in place
        g = space.local_to_global
        every = comm.gather((g, part, summed), root=0)
        # one V-cycle on the same residual (owner form), and the exchanges it made
        r = np.random.default_rng(100 + rank).standard_normal(space.nlocal)
        r[space.ghosts] = 0
        z, calls = {}, {}
        for ex, prob in probs.items():
            P = prob.precond
            halos = [A.op.halo for A in P.operators[:-1]] + [       # not the coarse CG's
                h for T in P.transfers for h in (T.fwd_c, T.fwd_f)]
            c0 = sum(h.calls for h in halos)
            z[ex] = _device.to_host(P(xp.asarray(r)))
            calls[ex] = sum(h.calls for h in halos) - c0
        zo = comm.gather(z["owner"][space.owned], root=0)
        zs = comm.gather(z["sum"][space.owned], root=0)
        its = {ex: prob.solve(tol=1e-10).iterations for ex, prob in probs.items()}
        if rank == 0:
            total = np.zeros(space.ndofs)
            for gg, pp, _ in every:
                np.add.at(total, gg, pp)
            held = {}
            bad, bits = 0.0, True
            for gg, _, ss in every:
                bad = max(bad, float(np.abs(ss - total[gg]).max()))
                for k, v in zip(gg.tolist(), ss.tolist()):
                    bits &= held.setdefault(k, v) == v
            a, b = np.concatenate(zo), np.concatenate(zs)
            emit("CASE " + json.dumps(dict(
                kind=kind, p=p, ranks=comm.Get_size(), sum_err=bad, sum_bits_agree=bool(bits),
                modes=[probs[ex].precond.exchanges for ex in ("owner", "sum")], coarse=coarse,
                z_diff=float(np.abs(a - b).max() / np.abs(a).max()),
                calls=calls, iterations=its)))
        quiet_barrier(comm)
    emit(f"DONE rank {rank}")


def _expect_error(comm, fn):
    try:
        fn()
    except Exception as err:
        emit(f"ERROR rank {comm.Get_rank()}: {type(err).__name__}: {err}")
        sys.exit(3)
    emit(f"NO ERROR rank {comm.Get_rank()}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=("compare", "mismatch", "local-failure", "unpartitionable",
                                     "poisson", "node-first", "exchanges"))
    ap.add_argument("--folder", default=None, help="node-first: a folder every rank sees")
    ap.add_argument("--meshes", default="box,block,kershaw,file")
    ap.add_argument("--precond", default="jacobi", choices=("jacobi", "pmg"))
    ap.add_argument("--coarse", default=None, choices=("auto", "amg", "cg"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--dims", default="2,3")
    ap.add_argument("--ps", default="1,2,3,4")
    args = ap.parse_args(argv)
    from mpi4py import MPI

    from smalltc import fem
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if args.case == "compare":
        compare(comm, args.device, [int(d) for d in args.dims.split(",")],
                [int(p) for p in args.ps.split(",")])
    elif args.case == "poisson":
        poisson(comm, args.device, args.meshes.split(","), [int(d) for d in args.dims.split(",")],
                [int(p) for p in args.ps.split(",")], args.precond, args.coarse)
    elif args.case == "exchanges":
        exchanges(comm, args.device, [int(p) for p in args.ps.split(",")])
    elif args.case == "node-first":
        node_first_case(comm, args.folder)
    elif args.case == "mismatch":
        _expect_error(comm, lambda: fem.l2_project(fem.box_mesh(2, 4), 2 + rank, 1.0,
                                                   device=args.device, comm=comm))
    elif args.case == "local-failure":
        def f(x):
            if rank == 1:
                raise ArithmeticError("f fails on rank 1")
            return x[0]
        _expect_error(comm, lambda: fem.l2_project(fem.box_mesh(2, 4), 2, f,
                                                   device=args.device, comm=comm))
    else:
        _expect_error(comm, lambda: fem.l2_project(fem.box_mesh(2, 2), 1, 1.0,
                                                   device=args.device, comm=comm))


if __name__ == "__main__":
    main()
