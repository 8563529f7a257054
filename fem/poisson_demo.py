"""The Poisson part of ``smalltc demo``: a curved mesh from a ``.msh`` file to pictures.

:func:`poisson_demo` reads the shipped quarter-annulus mesh (cubic element maps
on the arcs, :func:`smalltc.fem.meshes.demo_mesh_path`), solves
``-laplace(u) = f`` for the manufactured ``u = sin(2x) exp(y)`` with Dirichlet
data on the arcs and Neumann data (the flux of ``u``) on the straight sides,
writes the solution as a VTU of Lagrange cells (``poisson.vtu``, for ParaView),
and measures the convergence on the mesh and its uniform refinements for
``p = 1..4``. With matplotlib it draws ``poisson-solution.png`` (the solution,
sampled inside every curved element) and ``poisson-convergence.png`` (L2 error
against ``h``, log axes, the ``p + 1`` slopes drawn).
"""

import os

import numpy as np

import smalltc
from smalltc._arrays import array_module

from .basis import lagrange_basis
from .meshes import demo_mesh_path
from .output import write_vtu
from .poisson import exact_gradient, solve_poisson
from .quadrature import gauss_lobatto
from .unstructured import read_mesh

__all__ = ["poisson_demo", "manufactured"]


def manufactured():
    """``(u, f)`` with ``-laplace(u) = f``: ``u = sin(2x) exp(y)``, ``f = 3 u``.

    Examples
    --------
    >>> u, f = manufactured()
    >>> x = np.array([[0.3], [0.2]])
    >>> bool(np.allclose(f(x), 3 * u(x)))
    True
    """
    def u(x):
        xp = array_module(x)          # its own ufuncs on a device array (smooth_function)
        return xp.sin(2 * x[0]) * xp.exp(x[1])

    def f(x):
        xp = array_module(x)
        return 3 * xp.sin(2 * x[0]) * xp.exp(x[1])
    return u, f


def _flux(u):
    def h(x, n):
        return np.einsum("i...,i...->...", exact_gradient(u, x), n)
    return h


def poisson_demo(out="smalltc-demo", *, p=4, ps=(1, 2, 3, 4), refinements=2, device="auto",
                 plot=True, mesh=None):
    """Solve the demo's Poisson problem on the shipped curved mesh; write VTU and PNGs.

    Parameters
    ----------
    out : str
        Folder for ``poisson.vtu`` and the PNGs (made if missing).
    p : int
        Order of the solve written to the VTU.
    ps : sequence of int
        Orders of the convergence study.
    refinements : int
        Uniform refinements of the mesh in the convergence study (``h`` halves
        each time).
    device : {"auto", "cpu", "gpu"}
    plot : bool
        Draw the PNGs (when matplotlib imports).
    mesh : str or mesh, optional
        Another mesh file (2D); the shipped one by default.

    Returns
    -------
    dict
        ``p``, ``elements``, ``dofs``, ``iterations``, ``l2_error``, ``h1_error``,
        ``device``, ``vtu``, ``convergence`` (per ``p``: ``h``, ``l2``, ``h1``, the
        last ``rate_l2`` / ``rate_h1``), ``pngs`` (paths written).

    Examples
    --------
    >>> import tempfile
    >>> rep = poisson_demo(tempfile.mkdtemp(), p=1, ps=(1,), refinements=1, device="cpu",
    ...                    plot=False)
    >>> rep["elements"], round(rep["convergence"][1]["rate_l2"])
    (16, 2)
    """
    os.makedirs(out, exist_ok=True)
    m = read_mesh(mesh if mesh is not None else demo_mesh_path(2))
    u, f = manufactured()
    bcs = dict(dirichlet={"inner": u, "outer": u}, neumann={"left": _flux(u), "bottom": _flux(u)})
    res = solve_poisson(m, p, f, exact=u, tol=1e-12, device=device, **bcs)
    x = res.space.dof_coordinates()
    vtu = write_vtu(os.path.join(out, "poisson.vtu"), res.space, u=res.u,
                    error=res.u - u(x))
    rep = dict(mesh=m.source, p=p, elements=m.nelements, dofs=res.space.ndofs,
               iterations=res.iterations, l2_error=res.l2_error, h1_error=res.h1_error,
               device=res.device, vtu=vtu, time_solve_s=res.timings["solve"], convergence={},
               pngs=[])
    meshes = [m]
    for _ in range(refinements):
        meshes.append(meshes[-1].refine())
    for q in ps:
        hs, l2, h1 = [], [], []
        for k, mk in enumerate(meshes):
            r = solve_poisson(mk, q, f, exact=u, tol=1e-13, device=device, **bcs)
            hs.append(0.5 ** k)
            l2.append(r.l2_error)
            h1.append(r.h1_error)
        conv = dict(h=hs, l2=l2, h1=h1)
        if len(hs) > 1:
            conv["rate_l2"] = float(np.log2(l2[-2] / l2[-1]))
            conv["rate_h1"] = float(np.log2(h1[-2] / h1[-1]))
        rep["convergence"][q] = conv
    if plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            plt = None
        if plt is not None:
            rep["pngs"] = [_plot_solution(plt, res, os.path.join(out, "poisson-solution.png")),
                           _plot_convergence(plt, rep, os.path.join(out,
                                                                    "poisson-convergence.png"))]
    return rep


def _plot_solution(plt, res, path, nsub=12):
    """The solution sampled on an ``nsub x nsub`` grid inside every (curved) element."""
    space = res.space
    mesh = space.mesh
    t = np.linspace(-1, 1, nsub)
    Bx, _ = lagrange_basis(mesh.geom_nodes, t)
    Bu, _ = lagrange_basis(gauss_lobatto(space.nd)[0], t)
    with smalltc.evaluation_job(space.nelements * nsub ** 2):
        X = smalltc.interpolate(Bx, None, mesh.nodes, dim=2)      # (E, 2, nsub, nsub)
        U = smalltc.interpolate(Bu, None, res.u, space.dof_map())  # (E, nsub, nsub)
    fig, ax = plt.subplots(figsize=(6.2, 5.2))
    vmin, vmax = float(U.min()), float(U.max())
    for e in range(space.nelements):
        pc = ax.pcolormesh(X[e, 0], X[e, 1], U[e], shading="gouraud", vmin=vmin, vmax=vmax,
                           cmap="viridis")
        for edge in (X[e, :, 0, :], X[e, :, -1, :], X[e, :, :, 0], X[e, :, :, -1]):
            ax.plot(edge[0], edge[1], color="k", lw=0.4)
    fig.colorbar(pc, ax=ax, label="u_h")
    ax.set_aspect("equal")
    ax.set_title(f"Poisson on a curved mesh from a .msh file: p={space.p}, "
                 f"{space.nelements} elements\nL2 error {res.l2_error:.2e}, "
                 f"H1 error {res.h1_error:.2e}, {res.iterations} CG iterations", fontsize=9)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_convergence(plt, rep, path):
    fig, ax = plt.subplots(figsize=(6.2, 4.8))
    for i, (q, c) in enumerate(sorted(rep["convergence"].items())):
        h, e = np.array(c["h"]), np.array(c["l2"])
        color = f"C{i}"
        ax.loglog(h, e, "o-", color=color, label=f"p={q} (rate {c.get('rate_l2', 0):.2f})")
        ax.loglog(h, 0.3 * e[-1] * (h / h[-1]) ** (q + 1), "--", color=color, lw=0.9,
                  label="slope p+1 (shifted down)" if i == 0 else None)
    ax.set_xlabel("h (relative to the shipped mesh)")
    ax.set_ylabel("L2 error")
    ax.set_title("Convergence on the curved annulus mesh and its refinements\n"
                 "(dashed: slope p+1, each shifted below its data)", fontsize=9)
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
