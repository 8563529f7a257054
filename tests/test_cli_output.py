"""What the command line shows: rates with their significant digits under a unit prefix,
plots with integer p axes and their bounds, ``--help`` in plain text. Synthetic records,
nothing timed."""
import contextlib
import io
import re

import pytest

from smalltc.bench import bp1, plots, report
from smalltc.app.cli import SUBCOMMANDS, main, plain_text
from smalltc.app.demo import _print_mpi

# (rate per second, unit, text)
RATE_CASES = [
    (1.2345e9, "DoF/s", "1.23 GDoF/s"),
    (4.5e6, "DoF/s", "4.5 MDoF/s"),
    (3.21e4, "DoF/s", "32.1 kDoF/s"),
    (12.0, "DoF/s", "12 DoF/s"),
    (0.5, "DoF/s", "0.5 DoF/s"),
    (999.7e6, "DoF/s", "1 GDoF/s"),             # rounds up into the next prefix
    (2.5e13, "FLOP/s", "25 TFLOP/s"),
    (float("nan"), "DoF/s", "- DoF/s"),
    (None, "FLOP/s", "- FLOP/s"),
]


@pytest.mark.parametrize("value, unit, text", RATE_CASES)
def test_format_rate(value, unit, text):
    assert report.format_rate(value, unit) == text


# (values, the unit of the column)
UNIT_CASES = [
    ([2.5e6, 3.1e7], ("MDoF/s", 1e-6)),
    ([2.5e6, 3.1e9], ("GDoF/s", 1e-9)),
    ([950.0, float("nan"), None], ("DoF/s", 1.0)),
    ([], ("DoF/s", 1.0)),
]


@pytest.mark.parametrize("values, expected", UNIT_CASES)
def test_rate_unit(values, expected):
    assert report.rate_unit(values) == expected


def _case(suite, p, rate, bound, nq_off=2, error=None, **extra):
    impls = {} if error else {"smalltc": dict(status="ok", dofs_per_s=rate, fraction=rate / bound,
                                              gflops=rate * 1e-9)}
    c = dict(id=f"{suite} 3D p={p} nq={p + nq_off} float64", suite=suite, op=suite,
             dtype="float64", sizes=dict(dim=3, p=p, nq=p + nq_off, ncomp=1), batch=64,
             impls=impls, bound=dict(dofs_per_s=bound, pmax=1e9, limited_by="bandwidth"))
    if error:
        c["error"] = error
    c.update(extra)
    return c


def _doc(cases):
    return dict(cases=cases, device=dict(name="test CPU"), options=dict(dtype="float64"),
                probes=dict(bandwidth=dict(value=20e9)))


def test_table_prints_cpu_rates_in_mdofs():
    """CPU rates of a few MDoF/s: the table's unit is MDoF/s and each figure keeps three
    significant digits (in GDoF/s with two decimals they read 0.00)."""
    doc = _doc([_case("action", 1, 2.345e6, 9.87e6), _case("action", 2, 1.5e6, 4.2e7)])
    out = io.StringIO()
    report.table(doc, file=out)
    text = out.getvalue()
    assert "== action (MDoF/s;" in text
    row1, row2 = (line for line in text.splitlines() if line.startswith("action 3D"))
    assert row1.split()[4:6] == ["2.35", "9.87"], row1
    assert row2.split()[4:6] == ["1.5", "42"], row2
    assert " 0.00" not in text


def test_bp1_table_prints_cpu_rates_in_mdofs():
    rows = [_case("bp1", 1, 3.3e6, 8.1e6), _case("bp1", 2, 4.4e6, 1.1e7)]
    for c in rows:
        c["sizes"]["ndofs"] = 1000
        c["impls"]["cg"] = dict(status="ok", dofs_per_s=1.234e6, fraction=0.2)
    out = io.StringIO()
    bp1.table(rows, out)
    text = out.getvalue()
    assert "== bp1 (MDoF/s, unique DoFs" in text
    first = next(line for line in text.splitlines() if line.startswith("bp1 3D p=1"))
    assert "3.3" in first.split() and "1.23" in first.split() and "8.1" in first.split(), first
    assert " 0.00" not in text


def test_mpi_table_and_total_use_a_prefix():
    rec = dict(n=4, device="cpu", p=2, dofs=729, ranks=2, grid=(1, 1, 2), transport="host",
               transport_reason="numpy arrays", iterations=12, residual=1e-9, l2_error=1e-4,
               relative_l2_error=1e-3, gpu=None, local_elements=32, local_dofs=405,
               owned_dofs=364, time_solve_s=0.02, rank_dofs_per_s=2.19e5, time_halo_s=0.001,
               time_halo_wait_s=0.0005, time_allreduce_s=0.001, time_setup_s=0.05,
               comm_path="host", comm_path_reason="NumPy vectors: plain MPI", first_call_s=3.0,
               phases_s=dict(apply=0.012, cg_other=0.008))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_mpi([dict(rec, rank=0), dict(rec, rank=1, rank_dofs_per_s=2.5e5)])
    text = out.getvalue()
    assert "kDoF/s/it" in text and " 219 " in text and " 250 " in text
    assert "437 kDoF/s per CG iteration, 219 kDoF/s per rank" in text   # 729 * 12 / 0.02 s
    assert "communication: host (NumPy vectors: plain MPI)" in text


@pytest.fixture
def plt():
    plt = plots.matplotlib_or_none()
    if plt is None:
        pytest.skip("matplotlib is not installed")
    return plt


def _axes_of(plt, monkeypatch):
    """Run a plot function and keep its figure (plt.close is made a no-op)."""
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    return figs


def test_fem_plot_draws_every_bound_on_an_integer_axis(plt, tmp_path, monkeypatch):
    """The bound is drawn with a mark at each p (seen where a line would have no length),
    a case that errored keeps its bound, and the p axis has integer ticks."""
    from matplotlib.ticker import MaxNLocator
    figs = _axes_of(plt, monkeypatch)
    doc = _doc([_case("action", 3, 2e6, 9e6), _case("action", 4, 0, 8e6, error="boom")])
    assert plots.plot_fem(doc, str(tmp_path / "f.png"), plt)
    (fig,) = figs
    ax = fig.axes[0]                                  # 3D action (no 2D cases: no panel)
    bounds = [ln for ln in ax.get_lines() if ln.get_label().startswith("roofline bound")]
    assert bounds and bounds[0].get_marker() == "_"
    assert list(bounds[0].get_xdata()) == [3, 4]       # the errored p=4 keeps its bound
    assert list(bounds[0].get_ydata()) == [9.0, 8.0]   # in MDoF/s
    assert "MDoF/s" in ax.get_ylabel()
    assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator)
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_bp1_plot_draws_both_bounds_for_one_p(plt, tmp_path, monkeypatch):
    figs = _axes_of(plt, monkeypatch)
    c = _case("bp1", 5, 3e6, 9e6, cg_bound=dict(dofs_per_s=5e6))
    c["sizes"]["quadrature"] = "gauss"
    assert plots.plot_bp1(_doc([c]), str(tmp_path / "b.png"), plt)
    ax = figs[0].axes[0]
    labels = {ln.get_label(): ln for ln in ax.get_lines()}
    assert labels["apply bound"].get_marker() == "_"
    assert list(labels["CG iteration bound"].get_ydata()) == [5.0]
    figs[0].canvas.draw()
    assert ax.get_xlim() == (4.0, 6.0)                # one p: widened to hold integer ticks
    ticks = [t for t in ax.get_xticks() if 4 <= t <= 6]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


MARKUP = re.compile(r"``|:[a-z]+:`|::$|`[^`\n]+`", re.M)


@pytest.mark.parametrize("command", [[]] + [[name] for name in SUBCOMMANDS])
def test_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(command + ["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: smalltc")
    assert not MARKUP.search(text), MARKUP.search(text).group(0)


def test_demo_help_describes_the_poisson_problem(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("Poisson", "-laplace(u) = f", ".msh", "Dirichlet", "Neumann", "poisson.vtu",
                  "convergence"):
        assert words in text, words


def test_plain_text_wraps_lists_and_keeps_literal_blocks():
    doc = ("Title with ``code`` and :mod:`smalltc.fem`.\n\n"
           "1. first item, long enough to wrap at the width given here\n"
           "   over two lines\n"
           "2. second\n\n"
           "Run::\n\n"
           "    smalltc   demo   --quick\n")
    assert plain_text(doc, width=40) == (
        "Title with code and smalltc.fem.\n\n"
        "1. first item, long enough to wrap at\n"
        "   the width given here over two lines\n"
        "2. second\n\n"
        "Run:\n\n"
        "    smalltc   demo   --quick")
