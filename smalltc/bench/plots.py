"""PNG plots of a bench run (matplotlib, Agg backend; optional dependency).

1. ``gemm-square-<dtype>.png``: GFLOP/s against n for square batched
   ``C = A B + C``, smalltc and each baseline, with the roofline bound
   (``n*BW/16`` in float64, ``n*BW/8`` in float32, capped by the peak)
   dashed: the paper's Figures 8-9.
2. ``fem-dofs-<dtype>.png``: element-DoFs/s against p for the action (2D,
   3D; ncomp = 1, nq = p+2 solid and p+1 dashed) and assembly, with the bound.
3. ``fraction-<dtype>.png``: fraction of the bound per case, per suite.
4. One per suite with its own layout: ``bp1``/``bp3``/``bp5``, ``solve``, ``force``,
   ``basis`` (DoFs/s against p per direction and ``what``), ``poisson`` (the phases of
   each case stacked).
"""
from __future__ import annotations

import math
import os
from functools import partial

from .report import baselines_in, rate_unit, unit

__all__ = ["plot_all", "plot_gemm", "plot_fem", "plot_fraction", "matplotlib_or_none",
           "pyplot_or_say", "p_axis", "p_panel", "bound_line", "save_figure"]

_COLORS = {"smalltc": "C0"}


def matplotlib_or_none():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    return plt


def pyplot_or_say():
    """:func:`matplotlib_or_none`, saying ``plots: skipped (matplotlib not importable)``
    where it is None."""
    plt = matplotlib_or_none()
    if plt is None:
        print("plots: skipped (matplotlib not importable)")
    return plt


def p_axis(ax, label="polynomial order p"):
    """Label an x axis of polynomial orders and give it integer ticks only (call it after
    plotting: a view holding fewer than two integers, one p, is widened to p - 1 .. p + 1)."""
    from matplotlib.ticker import MaxNLocator
    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lo, hi = ax.get_xlim()
    if math.floor(hi) - math.ceil(lo) < 1:
        mid = round((lo + hi) / 2)
        ax.set_xlim(mid - 1, mid + 1)


def bound_line(ax, xs, ys, style="--", **kw):
    """A roofline bound against p: the line, and a short horizontal mark at each point so
    that a bound of one p (where a line has no length) is drawn too."""
    kw.setdefault("lw", 1)
    kw.setdefault("linestyle", style)
    return ax.plot(xs, ys, marker="_", ms=12, mew=1.5 * kw["lw"], **kw)


def p_panel(ax, ylabel, title, xlabel="polynomial order p", ticks=None):
    """Finish a panel of rates against p: a log y axis, the x axis (:func:`p_axis`; with
    ``ticks``, those ticks exactly), the labels and title, a grid and the legend."""
    ax.set_yscale("log")
    if ticks is None:
        p_axis(ax, xlabel)
    else:
        ax.set_xticks(ticks)
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def save_figure(fig, path, plt):
    """Lay ``fig`` out, write it to ``path`` (PNG, 110 dpi) and close it; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _color(name, names):
    if name == "smalltc":
        return "C0"
    return f"C{1 + names.index(name) % 9}"


def _title(doc, what):
    return f"{what}\n{doc['device']['name']}, {doc['options']['dtype']}"


def _ok(c, name):
    r = c["impls"].get(name)
    return r is not None and r.get("status") == "ok"


def plot_gemm(doc, path, plt):
    cases = [c for c in doc["cases"] if c["suite"] == "gemm" and "bound" in c
             and c["sizes"]["m"] == c["sizes"]["n"] == c["sizes"]["k"]]
    if not cases:
        return None
    names = ["smalltc"] + baselines_in(cases)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    s = 8 if doc["options"]["dtype"] == "float64" else 4
    for cls, style in (("paper", "-"), ("large", "--")):
        sub = sorted((c for c in cases if c["sizes"].get("batch_class") == cls),
                     key=lambda c: c["sizes"]["n"])
        if not sub:
            continue
        batch = (f"batch {sub[0]['batch']:,}" if len({c['batch'] for c in sub}) == 1
                 else f"batch {min(c['batch'] for c in sub):,}-{max(c['batch'] for c in sub):,}")
        for name in names:
            pts = [(c["sizes"]["n"], c["impls"][name]["gflops"]) for c in sub
                   if not c.get("error") and _ok(c, name)]
            if pts:
                ax.plot(*zip(*pts), linestyle=style, marker="o", ms=3,
                        color=_color(name, names), label=f"{name} ({cls}, {batch})")
        bx = [c["sizes"]["n"] for c in sub]
        by = [c["bound"]["pmax"] * 1e-9 for c in sub]
        bound_line(ax, bx, by, linestyle=style if cls == "large" else (0, (5, 3)), color="k",
                   lw=1.2, label=f"bound n*BW/{2 * s}, capped by peak ({cls})")
    bw = doc["probes"]["bandwidth"]["value"]
    ax.set_yscale("log")
    p_axis(ax, "matrix size n (square A, B, C)")
    ax.set_ylabel("GFLOP/s (2 n^3 per matrix)")
    ax.set_title(_title(doc, f"Batched C = A B + C, roofline with measured BW = "
                              f"{bw * 1e-9:.0f} GB/s"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, path, plt)


def plot_fem(doc, path, plt):
    # cases that errored keep their bound (computed before the run)
    act = [c for c in doc["cases"] if c["suite"] == "action" and "bound" in c
           and c["sizes"].get("ncomp", 1) == 1]
    asm = [c for c in doc["cases"] if c["suite"] == "assembly" and "bound" in c]
    panels = [(f"action {d}D (ncomp=1)", [c for c in act if c["sizes"]["dim"] == d])
              for d in (2, 3)]
    forms = list(dict.fromkeys(_form(c) for c in asm))        # mass first where run
    panels += [(f"assembly {d}D" if f == "mass" else f"{f} assembly {d}D",
                [c for c in asm if c["sizes"]["dim"] == d and _form(c) == f])
               for f in forms for d in (2, 3)]
    panels = [(t, cs) for t, cs in panels if cs]
    if not panels:
        return None
    ulabel, uscale = rate_unit([c["bound"]["dofs_per_s"] for _, cs in panels for c in cs])
    ncols = 2
    nrows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(nrows, ncols, figsize=(11, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, cs) in zip(axes.flat, panels):
        names = ["smalltc"] + baselines_in(cs)
        for off, style in ((2, "-"), (1, "--")):
            sub = sorted((c for c in cs if c["sizes"]["nq"] == c["sizes"]["p"] + off),
                         key=lambda c: c["sizes"]["p"])
            if not sub:
                continue
            for name in names:
                pts = [(c["sizes"]["p"], c["impls"][name]["dofs_per_s"] * uscale)
                       for c in sub if not c.get("error") and _ok(c, name)]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=_color(name, names),
                            label=f"{name}, nq=p+{off}")
            bound_line(ax, [c["sizes"]["p"] for c in sub],
                       [c["bound"]["dofs_per_s"] * uscale for c in sub], style, color="k",
                       label=f"roofline bound, nq=p+{off}")
        p_panel(ax, f"element DoFs / s ({ulabel})", title)
    fig.suptitle(_title(doc, "Element DoFs per second against the roofline bound "
                             f"(BW = {doc['probes']['bandwidth']['value'] * 1e-9:.0f} GB/s)"),
                 fontsize=11)
    return save_figure(fig, path, plt)


def _form(c):
    """An assembly case's operator form: "mass", "diffusion", "helmholtz+co", ..."""
    s = c["sizes"]
    return s.get("qfunc", "mass") + ("+co" if s.get("collocated") else "")


def _short(c):
    s = c["sizes"]
    if c["suite"] == "gemm":
        t = f"{s['m']}x{s['n']}x{s['k']}" + (" sA" if s.get("shared_a") else "")
        return t + (" L" if s.get("batch_class") == "large" else "")
    if c["suite"] == "action":
        return f"{s['dim']}D p{s['p']} q{s['nq']}" + (f" c{s['ncomp']}" if s["ncomp"] > 1 else "")
    if c["suite"] == "assembly":
        return f"{s['dim']}D p{s['p']}" + ("" if _form(c) == "mass" else f" {_form(c)}")
    if c["suite"] in ("bp1", "bp3", "bp5"):
        return f"p{s['p']} q{s['nq']}"
    return f"{s['label']} p{s['p']}"


def plot_fraction(doc, path, plt):
    suites = list(dict.fromkeys(c["suite"] for c in doc["cases"]
                                if c["suite"] not in ("solve", "force", "poisson")))
    if not suites:
        return None
    per = [[c for c in doc["cases"] if c["suite"] == s and not c.get("error")] for s in suites]
    fig, axes = plt.subplots(len(suites), 1, figsize=(max(10, 0.16 * max(map(len, per)) + 3),
                                                      3.6 * len(suites)), squeeze=False)
    for ax, suite, cs in zip(axes[:, 0], suites, per):
        names = ["smalltc"] + baselines_in(cs)
        x = list(range(len(cs)))
        fr = [c["impls"]["smalltc"]["fraction"] if _ok(c, "smalltc") else 0 for c in cs]
        ax.bar(x, fr, color="C0", label="smalltc", width=0.8)
        for name in names[1:]:
            pts = [(i, c["impls"][name]["fraction"]) for i, c in enumerate(cs) if _ok(c, name)]
            if pts:
                ax.plot(*zip(*pts), "_", ms=9, mew=2, color=_color(name, names), label=name)
        bad = [i for i, c in enumerate(cs) if not _ok(c, "smalltc")]
        for i in bad:
            ax.text(i, 1e-3, "x", ha="center", color="red", fontsize=8)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 2)
        ax.set_xticks(x)
        ax.set_xticklabels([_short(c) for c in cs], rotation=90, fontsize=6)
        ax.set_xlim(-0.6, len(cs) - 0.4)
        ax.set_ylabel("fraction of roofline bound")
        ax.set_title(f"{suite} ({unit(cs[0])[0] if cs else ''}; red x: smalltc failed/absent)",
                     fontsize=10)
        ax.set_axisbelow(True)
        ax.grid(True, axis="y", which="major", alpha=0.4)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(_title(doc, "Fraction of the roofline bound per case"), fontsize=11)
    return save_figure(fig, path, plt)


def plot_bp1(doc, path, plt, suite="bp1"):
    """A bake-off suite: unique DoFs/s of the apply and of a CG iteration against p, with
    their bounds, a panel per quadrature rule of the suite (BP1: left nq = p+2 on Gauss
    points, right nq = p+1 on Gauss-Lobatto points)."""
    cs = [c for c in doc["cases"] if c["suite"] == suite and "bound" in c]
    if not cs:
        return None
    ulabel, uscale = rate_unit([c["bound"]["dofs_per_s"] for c in cs])
    rules = [(q, t) for q, t in (("gauss", "nq = p+2, Gauss"),
                                 ("lobatto", "nq = p+1, Gauss-Lobatto"))
             if any(c["sizes"]["quadrature"] == q for c in cs)]
    fig, axes = plt.subplots(1, len(rules), figsize=(6 * len(rules), 4.6), squeeze=False)
    series = (("smalltc", "apply, fused", "C0", "-"), ("deterministic", "apply, deterministic",
              "C2", ":"), ("unfused", "apply, unfused", "C3", "-"),
              ("cg", "CG iteration, fused", "C1", "-"), ("cg (unfused)", "CG iteration, unfused",
              "C4", "-"), ("einsum", "apply, einsum chain", "C5", "-."))
    for ax, (quad, title) in zip(axes[0], rules):
        sub = sorted((c for c in cs if c["sizes"]["quadrature"] == quad),
                     key=lambda c: c["sizes"]["p"])
        for name, label, color, style in series:
            pts = [(c["sizes"]["p"], c["impls"][name]["dofs_per_s"] * uscale)
                   for c in sub if not c.get("error") and _ok(c, name)]
            if pts:
                ax.plot(*zip(*pts), style, marker="o", ms=3, color=color, label=label)
        ps = [c["sizes"]["p"] for c in sub]
        bound_line(ax, ps, [c["bound"]["dofs_per_s"] * uscale for c in sub], color="C0",
                   label="apply bound")
        cg = [(c["sizes"]["p"], c["cg_bound"]["dofs_per_s"] * uscale) for c in sub
              if "cg_bound" in c]
        if cg:
            bound_line(ax, *zip(*cg), color="C1", label="CG iteration bound")
        p_panel(ax, f"unique DoFs / s ({ulabel})", title)
    what = "the mass operator" if suite == "bp1" else "the diffusion operator"
    fig.suptitle(_title(doc, f"CEED {suite.upper()}: {what} and a CG iteration "
                             f"(BW = {doc['probes']['bandwidth']['value'] * 1e-9:.0f} GB/s)"),
                 fontsize=11)
    return save_figure(fig, path, plt)


def _suite_plots() -> tuple:
    """``(plot, stem)`` of the suites with their own plots: their modules import this
    one's helpers, so they are imported here, when the plots are drawn."""
    from . import basis, force, poisson, solve  # cycle: they import this module
    return ((solve.plot, "solve"), (force.plot, "force"), (basis.plot, "basis"),
            (poisson.plot, "poisson"))


def plot_all(doc, out_dir, prefix="") -> list:
    """Write every plot that has data; returns the paths (empty without matplotlib).

    Files are ``<prefix><stem>-<dtype>.png``.
    """
    plt = matplotlib_or_none()
    if plt is None:
        return []
    dt = doc["options"]["dtype"]
    os.makedirs(out_dir, exist_ok=True)
    made = []
    bps = [(partial(plot_bp1, suite=s), s) for s in ("bp1", "bp3", "bp5")]
    for fn, stem in ((plot_gemm, "gemm-square"), (plot_fem, "fem-dofs"),
                     (plot_fraction, "fraction"), *bps, *_suite_plots()):
        p = fn(doc, os.path.join(out_dir, f"{prefix}{stem}-{dt}.png"), plt)
        if p:
            made.append(p)
    return made
