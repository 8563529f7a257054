"""The distributed FEM solve under mpiexec: 2, 3 (oversubscribed on a 2-core machine) and 4
ranks give the serial results; bad calls end with an error on every rank, never a hang.

Each test launches ``mpiexec -n N python tests/mpi_cases.py CASE`` in a subprocess with a
timeout (the whole process group is killed at the timeout, and the test fails as a hang).
Skipped cleanly where mpi4py or mpiexec is missing (``pip install 'smalltc[mpi]'`` brings
both; ``make test`` installs them). The GPU test (two ranks sharing one GPU) runs where a
CUDA device answers.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FULL
from optional_deps import missing, needs
from smalltc._arrays import cupy_or_none, gpu_available

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "mpi_cases.py"

pytestmark = pytest.mark.mpi


def _mpiexec():
    """``[mpiexec, options...]``: the one beside this Python (the mpi extra's), else on
    PATH; None without it or without mpi4py."""
    try:
        import mpi4py  # noqa: F401  (the package only: no MPI initialisation here)
    except ImportError:
        return None
    here = Path(sys.executable).parent / "mpiexec"
    exe = str(here) if here.exists() else shutil.which("mpiexec")
    if exe is None:
        return None
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    text = (version.stdout + version.stderr).lower()
    openmpi = "open mpi" in text or "openrte" in text     # 5.x and 4.x say it so
    if not openmpi:
        return [exe]                                  # MPICH oversubscribes as is
    root = hasattr(os, "geteuid") and os.geteuid() == 0   # containers, CI images
    return [exe, "--oversubscribe"] + (["--allow-run-as-root"] if root else [])


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec or mpi4py "
                               "(pip install 'smalltc[mpi]')")


def mpirun(n, args, timeout):
    """Run ``mpiexec -n n <args>``; returns the CompletedProcess, fails the test on a hang."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = MPIEXEC + ["-n", str(n)] + [str(a) for a in args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s (a hang?)\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def lines(res):
    """The ranks' output lines without terminal escapes (Open MPI's forwarding puts
    a reset code, ESC [0m, before a line that follows another rank's)."""
    return [_ANSI.sub("", ln) for ln in res.stdout.splitlines()]


def cases(res):
    return [json.loads(ln[5:]) for ln in lines(res) if ln.startswith("CASE ")]


def check_against_serial(res, n, ncases):
    assert res.returncode == 0, res.stdout + res.stderr
    found = cases(res)
    assert len(found) == ncases, res.stdout + res.stderr
    assert sorted(ln for ln in lines(res) if ln.startswith("DONE")) == \
        [f"DONE rank {r}" for r in range(n)]
    for c in found:
        what = f"dim={c['dim']} p={c['p']} on {n} ranks (grid {c['grid']})"
        assert c["ranks"] == n and len(c["grid"]) == c["dim"], what
        assert c["op_err"] <= 1e-12, f"{what}: M x differs from the serial one by {c['op_err']:.2e}"
        assert c["op_err_staged"] <= 1e-12, what
        assert c["op_err_diffusion"] <= 1e-12 and c["op_err_helmholtz"] <= 1e-12, what
        assert c["u_err"] <= 1e-12, f"{what}: the projection differs by {c['u_err']:.2e}"
        assert c["iters"] == c["iters_serial"], what
        assert abs(c["l2_error"] - c["l2_error_serial"]) <= 1e-10 * c["l2_error_serial"], what
        assert c["ghosts_zero"] and c["ghosts_filled"] and c["index_ok"], what
    return found


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_distributed_equals_serial(n):
    """2D and 3D, p = 1 and 3 (1..4 with SMALLTC_TEST_FULL=1; four ranks run p = 1, 2): the
    operator to 1e-12 (it is ~1e-16), the projection to 1e-12 with the same CG iterations
    (CG runs to 1e-13, so the iterates are converged past the last bits that the two
    summation orders change)."""
    ps = "1,2,3,4" if FULL else "1,3"
    res = mpirun(n, [sys.executable, CASES, "compare", "--ps", ps], timeout=300)
    check_against_serial(res, n, 2 * len(ps.split(",")))


@needs_mpi
def test_four_ranks_share_edges_and_corners():
    """2 x 2 (2D) and 1 x 2 x 2 (3D) grids: nodes shared by 4 ranks, ghosts of 3 owners."""
    res = mpirun(4, [sys.executable, CASES, "compare", "--ps", "1,2"], timeout=300)
    found = check_against_serial(res, 4, 4)
    assert {tuple(c["grid"]) for c in found} == {(2, 2), (1, 2, 2)}


@needs_mpi
@pytest.mark.parametrize("case,n,expect", [
    ("mismatch", 2, ["ValueError: the arguments of l2_project differ across the 2 ranks: "
                     "p is 2 on rank 0, 3 on rank 1"] * 2),
    ("local-failure", 2, ["RankError: the right-hand side failed on rank(s) 1 of 2",
                          "ValueError: f(x) failed"]),
    ("unpartitionable", 5, ["ValueError: cannot partition a mesh of 2 x 2 elements into 5 "
                            "blocks"] * 5),
])
def test_a_bad_call_errors_on_every_rank(case, n, expect):
    res = mpirun(n, [sys.executable, CASES, case], timeout=120)
    assert res.returncode == 3, res.stdout + res.stderr
    errs = {int(ln.split()[2].rstrip(":")): ln for ln in lines(res)
            if ln.startswith("ERROR rank")}
    assert sorted(errs) == list(range(n)), res.stdout + res.stderr
    for r, text in enumerate(expect):
        assert text in errs[r], errs[r]


@needs_mpi
def test_demo_mpi(tmp_path):
    smalltc_cli = Path(sys.executable).parent / "smalltc"
    cmd = [smalltc_cli] if smalltc_cli.exists() else [sys.executable, "-m", "smalltc"]
    res = mpirun(2, cmd + ["demo", "--mpi", "--quick", "--device", "cpu", "--out", tmp_path],
                 timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = "\n".join(lines(res))
    assert "over 2 ranks (grid 1 x 1 x 2)" in out
    assert re.search(r"[0-9.]+ [kMG]?DoF/s per CG iteration", out), out
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1"], out
    doc = json.loads((tmp_path / "demo-mpi.json").read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert sum(r["owned_dofs"] for r in doc["ranks"]) == doc["ranks"][0]["dofs"]
    # the kernels compiled by a first solve, the second's phases per rank, the path
    assert "communication: host (NumPy vectors: plain MPI)" in out, out
    assert "kernels compiled by a first, untimed solve" in out, out
    for r in doc["ranks"]:
        ph = r["phases_s"]
        assert 0 < ph["apply"] < ph["solve"] and ph["halo"] > 0 and ph["cg_other"] >= 0, ph
        assert r["comm_path"] == "host" and r["first_call_s"] > 0


@needs_mpi
def test_node_first_runs_on_one_rank_while_the_other_waits(tmp_path):
    """The node's first rank runs the function (once per key), the other returns after it
    (it sees its file)."""
    res = mpirun(2, [sys.executable, CASES, "node-first", "--folder", tmp_path], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    found = sorted((json.loads(ln[10:]) for ln in lines(res) if ln.startswith("NODEFIRST ")),
                   key=lambda d: d["rank"])
    assert found == [dict(rank=0, ran=1, saw=True), dict(rank=1, ran=0, saw=True)], res.stdout


@needs_mpi
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
def test_two_ranks_on_the_gpus():
    """On the device: 2 ranks on the GPUs by local rank modulo the device count (both on GPU
    0 where there is one), CuPy buffers given to MPI directly or staged through pinned
    memory (whichever the MPI allows), the fused GPU CG with its partial sums reduced across
    ranks: the serial GPU results."""
    res = mpirun(2, [sys.executable, CASES, "compare", "--device", "gpu"], timeout=500)
    found = check_against_serial(res, 2, 8)
    ngpus = cupy_or_none().cuda.runtime.getDeviceCount()
    for c in found:
        assert c["device"] == "gpu" and c["gpus"] == [r % ngpus for r in range(2)]
        assert c["transport"] in ("nccl", "device", "staged"), c
    print(f"\nhalo transport: {found[0]['transport']} ({found[0]['transport_reason']})")


def check_poisson(res, n, kinds):
    """Every ``poisson`` case's distributed solve against the serial one."""
    assert res.returncode == 0, res.stdout + res.stderr
    found = cases(res)
    assert sorted(ln for ln in lines(res) if ln.startswith("DONE")) == \
        [f"DONE rank {r}" for r in range(n)], res.stdout + res.stderr
    assert {c["kind"] for c in found} == set(kinds), res.stdout + res.stderr
    for c in found:
        what = f"{c['kind']} dim={c['dim']} p={c['p']} on {n} ranks"
        assert c["ranks"] == n and len(c["owned"]) == n, what
        assert sum(c["owned"]) == c["ndofs"] and min(c["owned"]) > 0, what
        # CG runs to 1e-13: the two summation orders leave the iterates ~1e-14 apart
        assert c["u_err"] <= 1e-11, f"{what}: u differs from the serial one by {c['u_err']:.2e}"
        assert abs(c["iters"] - c["iters_serial"]) <= 1, what
        for e in ("l2_error", "h1_error"):
            assert abs(c[e] - c[e + "_serial"]) <= 1e-9 * c[e + "_serial"], what
    return found


@needs_mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_distributed_poisson_equals_serial(n):
    """Dirichlet and Neumann sides, kappa = 2, p = 1, 2, 2D and 3D: the whole box mesh cut
    into blocks, blocks built per rank (box and Kershaw): the serial solve's u, iterations
    and L2/H1 errors."""
    kinds = ["box", "block", "kershaw"]
    res = mpirun(n, [sys.executable, CASES, "poisson", "--meshes", ",".join(kinds),
                     "--ps", "1,2"], timeout=400)
    found = check_poisson(res, n, kinds)
    assert len(found) == 12


@needs_mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_distributed_poisson_on_a_mesh_file(n):
    """The shipped gmsh annulus (curved, order-3 geometry), partitioned by METIS on rank 0:
    2D at p = 1, 2 and 3D at p = 1, Neumann on the outer arc."""
    pytest.importorskip("pymetis", reason="pymetis (pip install 'smalltc[mpi]')")
    res = mpirun(n, [sys.executable, CASES, "poisson", "--meshes", "file", "--ps", "1,2"],
                 timeout=300)
    found = check_poisson(res, n, ["file"])
    assert len(found) == 3
    assert all(c["proj_err"] <= 1e-11 for c in found), found      # l2_project on the parts


@needs_mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_distributed_pmg(n):
    """The distributed p-multigrid (levels p, ..., 1 on every rank, Chebyshev smoothing,
    the default coarse solve: AMG gathered on rank 0 with pyamg, else Jacobi-CG): the serial
    solution, the one-rank iterations, a few of Jacobi's."""
    kinds = ["box", "kershaw"]
    try:
        import pymetis  # noqa: F401
        kinds.append("file")
    except ImportError:
        pass
    res = mpirun(n, [sys.executable, CASES, "poisson", "--meshes", ",".join(kinds),
                     "--ps", "2,3", "--dims", "2", "--precond", "pmg"], timeout=400)
    found = check_poisson(res, n, kinds)
    assert len(found) == 2 * len(kinds), found
    # Jacobi takes 35-90 iterations on these; the Kershaw mesh (eps = 0.3) is the hard one
    assert all(c["iters"] <= (25 if c["kind"] == "kershaw" else 18) for c in found), found
    expect = "DistributedCG" if missing("pyamg") else "GatheredAMG"
    assert all(c["coarse"] == expect for c in found), found


@needs_mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_distributed_pmg_with_amg_is_the_serial_pmg(n):
    """The coarse solve gathered on rank 0 (the global order-1 matrix once, one pyamg
    V-cycle per V-cycle): the serial p-multigrid's iterations on box and Kershaw meshes
    (eps = 0.3), 2D and 3D, p = 2, 3: the same on one rank, within one on several (the
    sums run in another order); the serial solution."""
    needs("pyamg")
    res = mpirun(n, [sys.executable, CASES, "poisson", "--meshes", "box,kershaw", "--ps",
                     "2,3", "--dims", "2,3", "--precond", "pmg", "--coarse", "amg"],
                 timeout=500)
    found = check_poisson(res, n, ["box", "kershaw"])
    assert len(found) == 8, found
    for c in found:
        what = f"{c['kind']} dim={c['dim']} p={c['p']} on {n} ranks"
        assert c["coarse"] == "GatheredAMG", what
        assert abs(c["iters"] - c["iters_pmg_serial"]) <= (0 if n == 1 else 1), (what, c)


@needs_mpi
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
@pytest.mark.parametrize("n,path", [(1, None), (2, None), (2, "staged")])
def test_distributed_pmg_on_gpus(n, path, monkeypatch):
    """device="gpu", the AMG coarse solve: the serial GPU solution and the serial pmg's
    iterations; where the exchanges are NCCL's (or on one rank) the V-cycle is replayed
    as a CUDA graph, and the launch-by-launch V-cycle gives the same solve; over staged
    messages the coarse vectors go through the host and rank 0 replays its AMG cycle."""
    needs("pyamg")
    if path is not None:
        monkeypatch.setenv("SMALLTC_DIST_COMM", path)
    res = mpirun(n, [sys.executable, CASES, "poisson", "--device", "gpu", "--meshes",
                     "box,kershaw", "--ps", "2,3", "--dims", "3", "--precond", "pmg",
                     "--coarse", "amg"], timeout=500)
    found = check_poisson(res, n, ["box", "kershaw"])
    assert len(found) == 4, found
    for c in found:
        what = f"{c['kind']} p={c['p']} on {n} ranks"
        assert c["device"] == "gpu" and c["coarse"] == "GatheredAMG", what
        assert abs(c["iters"] - c["iters_pmg_serial"]) <= 1, (what, c)
        if n == 1:
            assert c["graphed"], what
        if path == "staged":
            assert c["transport"] == "staged" and not c["graphed"], c
            assert not c["coarse_on_device"] and c["amg_replays"] >= c["iters"] - 1, c
        if c["graphed"]:
            assert c["replays"] >= c["iters"] - 1, (what, c)
            assert c["eager_diff"] <= 1e-10 and abs(c["iters"] - c["iters_eager"]) <= 1, c
    print("\nV-cycle replayed as a CUDA graph:", [c["graphed"] for c in found])


def check_exchanges(res, n):
    """Every ``exchanges`` case: the neighbour sum exact and alike on every holder; the
    V-cycle on consistent vectors the owner-form one to rounding, with fewer exchanges
    and the same iterations."""
    assert res.returncode == 0, res.stdout + res.stderr
    found = cases(res)
    assert sorted(ln for ln in lines(res) if ln.startswith("DONE")) == \
        [f"DONE rank {r}" for r in range(n)], res.stdout + res.stderr
    assert found, res.stdout + res.stderr
    for c in found:
        what = f"{c['kind']} p={c['p']} on {n} ranks"
        assert c["sum_err"] <= 1e-13 and c["sum_bits_agree"], (what, c)
        assert c["modes"] == ["owner", "sum"], (what, c)
        # the AMG coarse cycle is linear: rounding apart; a coarse CG to 1e-6 is not
        assert c["z_diff"] <= (1e-12 if c["coarse"] == "amg" else 1e-8), (what, c)
        if n > 1:
            assert c["calls"]["sum"] < 0.7 * c["calls"]["owner"], (what, c)
        assert c["iterations"]["sum"] == c["iterations"]["owner"], (what, c)
    return found


@needs_mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_neighbour_sum_and_the_consistent_v_cycle(n):
    """``Halo.sum`` on box partitions (4 ranks: edges held by 4), and the distributed
    p-multigrid with ``exchanges="sum"`` against ``"owner"``."""
    res = mpirun(n, [sys.executable, CASES, "exchanges", "--ps", "2,4"], timeout=400)
    found = check_exchanges(res, n)
    print("\nexchanges a V-cycle, owner -> sum:",
          [(c["kind"], c["p"], c["calls"]["owner"], c["calls"]["sum"]) for c in found])


@needs_mpi
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
def test_the_consistent_v_cycle_on_gpus():
    res = mpirun(2, [sys.executable, CASES, "exchanges", "--device", "gpu", "--ps", "2,4"],
                 timeout=400)
    check_exchanges(res, 2)


@needs_mpi
def test_distributed_pmg_with_the_coarse_cg():
    """coarse="cg" stays selectable: Jacobi-CG across the ranks on the order-1 level."""
    res = mpirun(2, [sys.executable, CASES, "poisson", "--meshes", "box,kershaw", "--ps", "2",
                     "--dims", "2", "--precond", "pmg", "--coarse", "cg"], timeout=300)
    found = check_poisson(res, 2, ["box", "kershaw"])
    assert len(found) == 2 and all(c["coarse"] == "DistributedCG" for c in found), found


@needs_mpi
def test_distributed_poisson_p3():
    res = mpirun(3, [sys.executable, CASES, "poisson", "--meshes", "box,kershaw", "--dims", "2",
                     "--ps", "3"], timeout=300)
    assert len(check_poisson(res, 3, ["box", "kershaw"])) == 2


@needs_mpi
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
@pytest.mark.parametrize("n", [2, 4])
def test_distributed_poisson_on_gpus(n):
    """device="gpu" on every rank (local rank modulo the device count): the box, per-rank
    block, Kershaw and (with pymetis) mesh-file solves give the serial GPU results."""
    try:
        import pymetis  # noqa: F401
        kinds = ["box", "block", "kershaw", "file"]
    except ImportError:
        kinds = ["box", "block", "kershaw"]
    res = mpirun(n, [sys.executable, CASES, "poisson", "--device", "gpu", "--meshes",
                     ",".join(kinds), "--ps", "1,2"], timeout=550)
    found = check_poisson(res, n, kinds)
    assert all(c["device"] == "gpu" for c in found)
