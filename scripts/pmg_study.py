"""p-multigrid against Jacobi-CG on a distorted 3D box (Poisson, Dirichlet on the boundary).

    python scripts/pmg_study.py iterations     # CG iterations to 1e-8: p = 2..8, refinement
    python scripts/pmg_study.py time [--dofs N] [--device cpu|gpu]
                                               # time to solution, p = 2, 4, 6, 8, ~N DoFs

The iterations table: p-multigrid (fem.pmg defaults) and Jacobi-CG on n = 2 and n = 4
elements per direction (p <= 6), and p = 2, 3 on n = 2, 4, 8. The time table: for each p,
two rounds of (Jacobi-CG, pmg setup, pmg-CG) in one process, the best of each; the ratio of
Jacobi-CG's time to pmg's setup + solve (time to solution) and to its solve alone, and the
largest difference of the two answers.
"""
import argparse
import logging
import time

import numpy as np

from smalltc import fem
from smalltc.fem.multigrid import Constrained, boundary_mask

DISTORTION = 0.08


def _problem(n, p, device="cpu"):
    space = fem.H1Space(fem.box_mesh(3, n, distortion=DISTORTION), p)
    raw = fem.diffusion_operator(space, device=device)
    A = Constrained(raw, raw.diagonal(), ~boundary_mask(space))
    b = A(A.xp.asarray(np.random.default_rng(0).standard_normal(space.ndofs)))
    return space, raw, A, b


def iterations():
    def its(n, p):
        space, raw, A, b = _problem(n, p)
        M = fem.pmg(raw, constrained=boundary_mask(space))
        r = fem.cg(A, b, tol=1e-8, precond=M)
        rj = fem.cg(A, b, tol=1e-8, precond=fem.jacobi(A.diagonal()))
        return f"{r.iterations:3d} {rj.iterations:4d} {space.ndofs:7d}"
    print("p-multigrid and Jacobi-CG iterations to 1e-8, ndofs")
    for p in range(2, 9):
        print(f"p={p}  n=2: {its(2, p)}   n=4: {its(4, p) if p <= 6 else '-'}", flush=True)
    for p in (2, 3):
        print(f"p={p} refined n=2, 4, 8: " + " | ".join(its(n, p) for n in (2, 4, 8)), flush=True)


def time_to_solution(dofs, device):
    from smalltc.fem._device import synchronize
    for p in (2, 4, 6, 8):
        n = max(2, round(dofs ** (1 / 3) / p))
        space, raw, A, b = _problem(n, p, device)
        xp = A.xp
        fem.cg(A, b, tol=1e-8, precond=fem.jacobi(A.diagonal()), maxiter=2,
               raise_on_failure=False)
        best = {}
        for _ in range(2):
            synchronize(xp)
            t0 = time.perf_counter()
            rj = fem.cg(A, b, tol=1e-8, precond=fem.jacobi(A.diagonal()))
            synchronize(xp)
            t1 = time.perf_counter()
            M = fem.pmg(raw, constrained=boundary_mask(space))
            synchronize(xp)
            t2 = time.perf_counter()
            rp = fem.cg(M.operator, b, tol=1e-8, precond=M)
            synchronize(xp)
            t3 = time.perf_counter()
            for k, v in (("jacobi", t1 - t0), ("setup", t2 - t1), ("solve", t3 - t2),
                         ("pmg", t3 - t1)):
                best[k] = min(best.get(k, np.inf), v)
        diff = float(abs(rp.x - rj.x).max() / abs(rj.x).max())
        print(f"p={p} ndofs={space.ndofs} its jacobi {rj.iterations} pmg {rp.iterations}; "
              f"jacobi {best['jacobi']:.3g} s, pmg setup {best['setup']:.3g} s + solve "
              f"{best['solve']:.3g} s; jacobi/pmg: time to solution "
              f"{best['jacobi'] / best['pmg']:.2f}, solve {best['jacobi'] / best['solve']:.2f}; "
              f"answers differ by {diff:.1e} (relative)", flush=True)


if __name__ == "__main__":
    logging.disable(logging.WARNING)        # the "no size-specialised kernel" lines
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("iterations", "time"))
    ap.add_argument("--dofs", type=int, default=40_000)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    iterations() if a.what == "iterations" else time_to_solution(a.dofs, a.device)
