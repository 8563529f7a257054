"""A picture of one search: every timed variant of one size, sorted, winner and heuristic marked."""
from __future__ import annotations

import numpy as np

__all__ = ["plot_search", "pick_size"]


def pick_size(results: dict, key=None):
    """The result to plot: ``key`` itself, or the size with the most timed variants."""
    if key not in (None, "", "auto"):
        if key not in results:
            raise ValueError(f"no finished size {key!r} to plot; finished: "
                             f"{', '.join(sorted(results)) or 'none'}")
        return results[key]
    done = [r for r in results.values() if r.get("winner")]
    if not done:
        raise ValueError("no finished size to plot")
    return max(done, key=lambda r: (r.get("n_ok", 0), r["key"]))


def plot_search(result: dict, path, device_name=""):
    """Write a PNG: time per variant (sorted), the winner and the heuristic's choice marked.

    The right axis reads the same times as a fraction of the roofline bound.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sorted((r for r in result["candidates"] if r["status"] == "ok"),
                key=lambda r: r.get("first_time_s", r["time_s"]))
    t = [1e3 * r.get("first_time_s", r["time_s"]) for r in ok]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot(range(len(t)), t, ".", color="0.45", ms=4, label=f"variants ({len(t)} timed)")
    w = result.get("winner")
    labels = [" ".join(f"{k}={v}" for k, v in r["params"].items()) for r in ok]
    wl = " ".join(f"{k}={v}" for k, v in w["params"].items()) if w else None
    if wl in labels:
        i = labels.index(wl)
        ax.plot([i], [t[i]], "*", color="tab:red", ms=14, label=f"winner: {wl}")
    h = result.get("heuristic") or {}
    if h.get("status") == "ok":
        hl = " ".join(f"{k}={v}" for k, v in h["params"].items())
        ht = 1e3 * h.get("first_time_s", h["time_s"])
        ax.axhline(ht, color="tab:blue", lw=1, ls="--", label=f"heuristic: {hl}")
        if hl in labels:
            i = labels.index(hl)
            ax.plot([i], [t[i]], "o", mfc="none", mec="tab:blue", ms=10)
    b = result.get("bound") or {}
    if b.get("tmin"):
        tm = 1e3 * b["tmin"]
        ax.axhline(tm, color="k", lw=0.8, label="roofline bound")
        def inv(y):
            return tm / np.maximum(y, 1e-12)
        sec = ax.secondary_yaxis("right", functions=(inv, inv))
        sec.set_ylabel("fraction of Pmax")
    sp = result.get("space", {})
    pr = sum((sp.get("pruned") or {}).values())
    ax.set_title(f"{result['key']}  {result['spec'].get('dtype', '')}  {device_name}\n"
                 f"generated {sp.get('generated')}, pruned {pr}, compiled "
                 f"{sp.get('compiled')}, timed {sp.get('timed')}", fontsize=9)
    ax.set_xlabel("variant, fastest first")
    ax.set_ylabel("time per call (ms, median, first pass)")
    if t and max(t) / max(min(t), 1e-12) > 8:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path

