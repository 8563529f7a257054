"""``smalltc demo --quick``: projection, timing table against the bound, JSON and plot."""
import json

from optional_deps import needs
from smalltc.app.cli import main
from smalltc.app.demo import _warmup_n, timing_cases
from smalltc.plan import SMALL_JOB


def test_demo_quick_runs(tmp_path, capsys):
    needs("matplotlib")
    rc = main(["demo", "--quick", "--device", "cpu", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "CG iterations" in out and "L2 error" in out
    assert "batched_contract p=1" in out and "assemble_mass p=2" in out
    assert "GB/s" in out and "%bound" in out
    with open(tmp_path / "demo.json") as f:
        doc = json.load(f)
    proj = doc["projection"]
    assert proj["iterations"] > 0 and proj["relative_l2_error"] < 1e-2
    # the CG rate is timed on a second, compiled solve, in a unit that shows it: never
    # "0.000 GDoF/s (0%)"
    assert proj["time_solve_warm_s"] > 0 and proj["cg_dofs_per_s"] > 0
    assert "solve: 0.000 GDoF/s" not in out and "(0%" not in out
    assert doc["probes"]["bandwidth"]["value"] > 0
    for rec in doc["cases"]:
        st = rec["impls"]["smalltc"]
        assert st["status"] == "ok" and 0 < st["fraction"]
        assert rec["bound"]["dofs_per_s"] > 0 and st["dofs_per_s"] > 0
    assert (tmp_path / "demo-dofs-float64.png").stat().st_size > 10_000


def test_demo_sizes():
    full = timing_cases("cpu", "float64")
    assert [c.sizes["p"] for c in full if c.op == "action"] == list(range(1, 9))
    assert [c.sizes["p"] for c in full if c.op == "assembly"] == list(range(1, 7))
    assert all(c.sizes["nq"] == c.sizes["p"] + 2 and c.sizes["dim"] == 3 for c in full)


def test_the_mpi_demo_warms_up_on_a_small_mesh_of_the_same_kind():
    assert _warmup_n(60, 4, 1, "gpu") == (4, 4, 4)
    assert _warmup_n((60, 60, 120), 4, 2, "gpu") == (4, 4, 8)       # the rank grid along z
    assert _warmup_n(3, 4, 1, "gpu") == (3, 3, 3)                    # never above the mesh
    k = _warmup_n(60, 4, 1, "cpu")[0]          # the CPU: just past the small-evaluation limit
    assert k ** 3 * 6 ** 3 > SMALL_JOB >= (k - 2) ** 3 * 6 ** 3
    assert _warmup_n(8, 4, 1, "cpu") == (8, 8, 8)

