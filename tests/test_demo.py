"""``smalltc demo --quick``: projection, timing table against the bound, JSON and plot."""
import json

from optional_deps import needs
from smalltc.app.cli import main
from smalltc.app.demo import timing_cases


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
