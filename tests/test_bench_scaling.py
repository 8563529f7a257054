"""``smalltc bench --suite scaling``: the cases (weak: a cell a rank times the rank grid;
strong: one mesh), the efficiencies, the launcher's errors, and one tiny run end to end
under mpiexec on the CPU (1 and 2 ranks: the JSON, every phase per rank, the table, the
plot)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

from optional_deps import missing
from smalltc.app.cli import main
from smalltc.bench import scaling
from smalltc.fem.distributed.partition import partition_box


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("mesh", ["box", "kershaw"])
def test_weak_cases_give_every_rank_the_same_block(ranks, mesh):
    p, dofs = 2, 4000
    shape = scaling.weak_shape(dofs, p, ranks, mesh)
    part = partition_box(shape, ranks)
    blocks = {part.block_shape(r) for r in range(ranks)}
    assert len(blocks) == 1, (shape, part.grid, blocks)        # one block, one cell a rank
    assert tuple(part.grid) == scaling.rank_grid(ranks)
    (block,) = blocks
    if mesh == "box":
        assert abs(block[0] ** 3 * p ** 3 - dofs) / dofs < 0.35   # k^3 elements, (kp)^3 DoFs
    else:                                                        # each cell a Kershaw mesh
        assert block[0] % 6 == 0 and block[1] % 2 == 0 and block[2] % 2 == 0
        assert block == scaling.weak_shape(dofs, p, 1, mesh)
    (case,) = scaling.plan_cases([ranks], p=p, dofs=dofs, mesh=mesh, modes=("weak",))
    assert case["tiles"] == list(part.grid) and case["shape"] == list(shape)


def test_plan_and_efficiencies():
    cases = scaling.plan_cases([1, 2, 4], p=3, dofs=5000, preconds=["jacobi", "pmg"])
    assert len(cases) == 2 * 2 * 3
    strong = [c for c in cases if c["mode"] == "strong"]
    assert len({tuple(c["shape"]) for c in strong}) == 1             # one mesh
    assert abs(strong[0]["dofs"] - 5000 * 4) / 20000 < 0.35          # dofs x the largest R
    weak = [c for c in cases if c["mode"] == "weak" and c["precond"] == "jacobi"]
    assert [c["elements"] / c["ranks"] for c in weak] == [weak[0]["elements"]] * 3
    times = {1: 2.0, 2: 2.5, 4: 4.0}
    its = {1: 10, 2: 12, 4: 20}                      # a weak mesh's Jacobi-CG: more
    for c in cases:
        c.update(solve_s=times[c["ranks"]], whole_s=2 * times[c["ranks"]], error=None,
                 iterations=its[c["ranks"]])
    scaling.efficiencies(cases)
    for c in cases:
        t1, tr, r = 2.0, times[c["ranks"]], c["ranks"]
        expect = t1 / tr if c["mode"] == "weak" else t1 / (r * tr)
        per = (t1 / 10) / (tr / its[r]) / (1 if c["mode"] == "weak" else r)
        assert c["efficiency"] == pytest.approx({"solve": expect, "whole": expect,
                                                 "iteration": per})
    with pytest.raises(ValueError, match="--precond takes jacobi, pmg"):
        scaling._names("ilu", scaling.PRECONDS, "--precond", ())
    with pytest.raises(ValueError, match="'box' or 'kershaw"):
        scaling.parse_mesh("sphere")


def test_a_missing_mpiexec_or_mpi4py_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    if missing("mpi4py"):
        with pytest.raises(SystemExit, match="mpi4py is not installed"):
            scaling.find_mpiexec()
        return
    with pytest.raises(SystemExit, match="no mpiexec beside .*python nor on PATH: pip install "
                                         "'smalltc\\[mpi\\]'"):
        scaling.find_mpiexec()


def _mpiexec_here():
    if missing("mpi4py"):
        return False
    return (Path(sys.executable).parent / "mpiexec").exists() or shutil.which("mpiexec")


@pytest.mark.mpi
@pytest.mark.skipif(not _mpiexec_here(), reason="no mpiexec or mpi4py "
                    "(pip install 'smalltc[mpi]')")
def test_scaling_suite_end_to_end(tmp_path, capsys):
    """1 and 2 ranks, p = 1, weak and strong, Jacobi: every case solved, its phases on
    every rank, the efficiencies against one rank, the table and the plot."""
    rc = main(["bench", "--suite", "scaling", "--device", "cpu", "--ranks", "1,2", "--p", "1",
               "--ndofs", "400", "--no-progress", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads((tmp_path / "bench-scaling-cpu-r1_2-p1.json").read_text())
    assert doc["schema"] == scaling.SCHEMA and doc["ranks"] == [1, 2]
    assert [(c["mode"], c["ranks"]) for c in doc["cases"]] == [
        ("weak", 1), ("weak", 2), ("strong", 1), ("strong", 2)]
    for c in doc["cases"]:
        assert c["error"] is None, c
        assert c["iterations"] > 0 and c["l2_error"] < 2e-2      # p = 1, 7^3 elements a cell
        assert c["comm_path"].startswith("host")
        for k in ("setup", "solve", "halo", "allreduce", "error", "operator", "preconditioner"):
            assert len(c["timings_ranks"][k]) == c["ranks"], k
            assert c["timings_max"][k] == max(c["timings_ranks"][k]), k
        assert "apply" not in c["timings_max"]        # the timed solve runs without timers
        for k in ("apply", "precond_apply", "cg_other", "solve"):   # the breakdown solve's
            assert len(c["phases_ranks"][k]) == c["ranks"], k
            assert c["phases_max"][k] == max(c["phases_ranks"][k]), k
        assert 0 < c["phases_max"]["apply"] < c["phases_max"]["solve"]
        assert 0 < c["timings_max"]["solve"] <= c["whole_s"]
        assert c["efficiency_reference_ranks"] == 1
        if c["ranks"] == 1:
            assert c["efficiency"] == {"solve": 1.0, "whole": 1.0, "iteration": 1.0}
        else:
            assert c["timings_max"]["halo"] > 0                 # two ranks exchange
    weak = [c for c in doc["cases"] if c["mode"] == "weak"]
    assert weak[1]["dofs"] > 1.5 * weak[0]["dofs"]
    assert "== scaling" in out and "strong box jacobi p=1 R=2" in out
    if not missing("matplotlib"):
        assert (tmp_path / "scaling-efficiency-cpu-r1_2-p1.png").stat().st_size > 10_000
    else:
        assert "plots: skipped (matplotlib not importable)" in out


def test_pmg_with_the_distributed_coarse_cg_and_no_breakdown(tmp_path, capsys):
    """``--precond pmg-cg``: the p-multigrid's coarse level solved by the distributed
    Jacobi-CG (it converges like ``pmg``); ``--no-phases``: no breakdown solve."""
    pytest.importorskip("mpi4py")
    rc = main(["bench", "--suite", "scaling", "--device", "cpu", "--ranks", "2", "--p", "2",
               "--ndofs", "400", "--scaling", "weak", "--precond", "pmg-cg", "--no-phases",
               "--no-progress", "--no-plot", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    (case,) = json.loads((tmp_path / "bench-scaling-cpu-r2-p2.json").read_text())["cases"]
    assert case["id"] == "weak box pmg-cg p=2 R=2" and case["error"] is None
    assert 0 < case["iterations"] < 30 and case["l2_error"] < 1e-2
    assert "phases_max" not in case and case["timings_max"]["allreduce"] > 0
    assert "weak box pmg-cg p=2 R=2" in out


def test_scaling_runs_on_its_own():
    with pytest.raises(SystemExit, match="--suite scaling runs on its own"):
        main(["bench", "--suite", "scaling", "--suite", "gemm"])
