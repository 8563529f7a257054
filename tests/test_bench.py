"""``smalltc bench`` end to end on the CPU, tiny sizes: JSON, plots, --compare, checks."""
import gzip
import json
import math

import numpy as np
import pytest

from optional_deps import needs
from smalltc.bench import cases as bench_cases
from smalltc.bench import runner, suites
from smalltc.bench.cases import Case, Impl
from smalltc.app.cli import main

TINY = ["bench", "--quick", "--repeats", "2", "--warmup", "1", "--no-progress",
        "--backend", "reference", "--device", "cpu"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    rc = main(TINY + ["--suite", "gemm", "--sizes", "2,4,rect", "--suite", "action",
                      "--suite", "assembly", "--suite", "pairwise", "--p", "1", "--dim", "2",
                      "--out", str(out)])
    assert rc == 0
    return out


def test_json_has_the_required_fields(run_dir):
    with open(run_dir / "bench-n2_4_rect-p1-dim2-float64.json") as f:
        doc = json.load(f)
    assert doc["schema"] == "smalltc-bench/1"
    for key in ("date", "command", "argv", "versions", "device", "probes", "options", "cases"):
        assert key in doc, key
    assert doc["command"] and doc["argv"]                  # the process's own command line
    assert "--quick" in doc["equivalent_command"] and "--suite gemm" in doc["equivalent_command"]
    assert doc["options"]["quick"] and doc["options"]["repeats"] == 2
    assert doc["device"]["kind"] == "cpu" and doc["device"]["name"]
    assert doc["device"]["properties"]["cores"] >= 1
    assert doc["probes"]["bandwidth"]["value"] > 0
    assert doc["probes"]["peak"]["float64"]["value"] > 0
    assert {"numpy", "python"} <= set(doc["versions"])
    assert {c["suite"] for c in doc["cases"]} == {"gemm", "action", "assembly", "pairwise"}
    gemm = [c for c in doc["cases"] if c["suite"] == "gemm"]
    assert {c["sizes"]["n"] for c in gemm if c["sizes"]["m"] == c["sizes"]["n"]} == {2, 4}
    assert any(c["sizes"].get("shared_a") for c in gemm)        # rectangular kept
    for c in doc["cases"]:
        assert c["bound"]["pmax"] > 0 and c["bound"]["bytes"] > 0
        st = c["impls"]["smalltc"]
        assert st["status"] == "ok", (c["id"], st)
        assert len(st["times_ns"]) == 2 and st["median_s"] > 0
        assert st["rel_err"] <= 1e-12 and st["poisoned"]
        assert st["first_call_s"] > 0 and st["backend"] == "reference"
        assert 0 < st["fraction"]
        assert len(c["impls"]) >= 2                      # at least one baseline
        assert all(r["first_call_s"] > 0 for r in c["impls"].values() if r["status"] == "ok")
    assert any("numpy.matmul" in c["impls"] for c in gemm)
    act = [c for c in doc["cases"] if c["suite"] == "action"]
    assert all("numpy.einsum chain" in c["impls"] and c["impls"]["smalltc"]["dofs_per_s"] > 0
               for c in act)


def test_plots_are_written(run_dir):
    needs("matplotlib")
    for stem in ("gemm-square", "fem-dofs", "fraction"):
        path = run_dir / f"n2_4_rect-p1-dim2-{stem}-float64.png"
        assert path.exists() and path.stat().st_size > 10_000, stem
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_compare_prints_ratios(run_dir, tmp_path, capsys):
    a = run_dir / "bench-n2_4_rect-p1-dim2-float64.json"
    with open(a) as f:
        doc = json.load(f)
    for c in doc["cases"]:                      # B: smalltc twice as fast everywhere
        st = c["impls"]["smalltc"]
        for key in ("gflops", "dofs_per_s"):
            if key in st:
                st[key] *= 2
    b = tmp_path / "b.json.gz"               # gzipped, as the runs under benchmarks/ are
    with gzip.open(b, "wt") as f:
        json.dump(doc, f)
    capsys.readouterr()
    assert main(["bench", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "geometric mean B/A over" in out and "2.000" in out
    assert "gemm m=2 n=2 k=2" in out


def test_compare_rejects_other_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="not a smalltc bench file"):
        main(["bench", "--compare", str(bad), str(bad)])


def _wrong_impl(kind):
    real = bench_cases.smalltc_impl

    def build(case, ops, xp, backend="auto", method="auto"):
        impl = real(case, ops, xp, backend, method)
        fn = impl.fn

        def wrong():
            if kind == "perturb":
                out = fn()
                out.reshape(-1)[0] *= 1.001
                return out
            before = impl.out.copy()               # the poisoned buffer
            out = fn()
            half = out.size // 2                   # as if half was never written
            out.reshape(-1)[half:] = before.reshape(-1)[half:]
            return out
        impl.fn = wrong
        return impl
    return build


@pytest.mark.parametrize("kind, message", [("perturb", "relative error"),
                                           ("unwritten", "non-finite")])
def test_reference_check_catches_a_wrong_result(monkeypatch, kind, message):
    monkeypatch.setattr(runner, "smalltc_impl", _wrong_impl(kind))
    case = Case("action", "action", dict(dim=2, p=2, nq=4, ncomp=1, batch=50), "float64")
    rec = runner.run_case(case, dict(bandwidth=1e10, peak=1e10), xp=np, backend="reference",
                          repeats=2, warmup=0)
    st = rec["impls"]["smalltc"]
    assert st["status"] == "failed" and message in st["error"]
    assert "times_ns" not in st                      # a failed check is not timed
    assert rec["impls"]["numpy.einsum chain"]["status"] == "ok"


def test_failed_case_shows_in_table_and_exit_code(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runner, "smalltc_impl", _wrong_impl("perturb"))
    rc = main(TINY + ["--suite", "action", "--p", "1", "--dim", "3", "--no-plot",
                      "--out", str(tmp_path)])
    assert rc == 1
    assert "FAILED" in capsys.readouterr().out


def test_gemm_beta_case_checks_c(monkeypatch):
    case = Case("gemm", "gemm", dict(m=3, n=3, k=3, beta=1.0, batch=20), "float32")
    rec = runner.run_case(case, dict(bandwidth=1e10, peak=1e10), xp=np, backend="reference",
                          repeats=2, warmup=0)
    assert rec["impls"]["smalltc"]["status"] == "ok"
    assert rec["impls"]["numpy.matmul"]["rel_err"] < 1e-5
    assert rec["bound"]["bytes"] == 4 * 20 * 4 * 9


SPEC_CASES = [  # each case op, with the flags that change its operands
    Case("gemm", "gemm", dict(m=3, n=4, k=2, batch=5, beta=0.5, shared_a=True), "float64"),
    Case("gemm", "gemm", dict(m=2, n=2, k=2, batch=5, beta=0.0, shared_b=True), "float32"),
    Case("action", "action", dict(dim=2, p=2, nq=4, ncomp=3, batch=5), "float64"),
    Case("action", "action", dict(dim=3, p=1, nq=3, ncomp=1, batch=5), "float32"),
    Case("assembly", "assembly", dict(dim=2, p=2, nq=3, batch=5), "float64"),
    Case("pairwise", "step", dict(label="(4c)", p=2, nq=4, batch=5), "float64"),
    Case("pairwise", "step", dict(label="(2b)", p=1, nq=3, batch=5), "float64"),
]


@pytest.mark.parametrize("case", SPEC_CASES, ids=lambda c: c.id)
def test_case_spec_is_the_plans_spec(case):
    """The spec a case names is the one smalltc derives from the case's operands, and
    its inputs and result are the operands, batched flags and out shape the bench uses."""
    import smalltc
    spec = bench_cases.case_spec(case)
    ops = bench_cases.make_inputs(case, np)
    kw = dict(beta=case.sizes.get("beta", 0.0)) if spec.op == "gemm" else {}
    plan = smalltc.plan(spec.op, *ops, backend="reference", kind=getattr(spec, "kind", None),
                        **kw)
    assert plan.spec == spec
    assert [o.shape for o in ops] == [o.shape for o in spec.inputs]
    assert bench_cases.batched_flags(case) == [o.batched for o in spec.inputs]
    assert bench_cases.out_shape(case) == spec.out_shape
    ref = bench_cases.reference(case, ops)
    assert ref.shape == spec.out_shape or ref.size == math.prod(spec.out_shape)


def test_suites_cover_the_issue():
    g = suites.cases("gemm", "float64", "gpu")
    sq = [c for c in g if c.sizes["m"] == c.sizes["n"] == c.sizes["k"]]
    assert {c.sizes["n"] for c in sq} == set(range(2, 33))
    assert {c.batch for c in sq if c.sizes["batch_class"] == "paper"} == {100_000}
    large = [c for c in sq if c.sizes["batch_class"] == "large"]
    assert large and all(bench_cases.footprint(c) > 256 * 2 ** 20 for c in large)
    a = suites.cases("action", "float64", "gpu")
    assert len(a) == 2 * 8 * 2 * 2
    assert all(abs(c.batch * c.sizes["ncomp"] * (c.sizes["p"] + 1) ** c.sizes["dim"] - 2 ** 25)
               < 2 ** 25 * 0.01 for c in a)
    assert len(suites.cases("assembly", "float64", "cpu")) == 12
    labels = {c.sizes["label"] for c in suites.cases("pairwise", "float64", "cpu")}
    assert {"(1a)", "(2c)", "(3d)", "(4f)"} <= labels
    cpu = suites.cases("gemm", "float64", "cpu")
    assert all(bench_cases.footprint(c) <= 64 * 2 ** 20 + 2 ** 16 for c in cpu)
    assert all("CPU sizes" in c.note for c in cpu if c.batch < 100_000)
    with pytest.raises(ValueError, match="unknown suite"):
        suites.cases("fft", "float64", "cpu")


def test_timing_uses_median():
    from smalltc._timing import median, time_calls
    t = time_calls(lambda: None, repeats=5, warmup=0)
    assert len(t) == 5 and median([1, 2, 100]) == 2e-9
    with pytest.raises(ValueError, match="repeats"):
        time_calls(lambda: None, repeats=0)


def test_progress_fallback_without_tqdm(monkeypatch, capsys):
    import builtins

    from smalltc.bench import cli
    real_import = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name == "tqdm":
            raise ImportError("no tqdm here")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    items = list(cli._progress(["a", "b"], True))
    assert items == ["a", "b"]
    assert "[2/2] b" in capsys.readouterr().err


def test_nan_is_not_a_pass():
    ref = np.ones((2, 3))
    ok, err = runner.check(np.full((2, 3), np.nan), ref, np.arange(2), np)
    assert not ok and not err <= 1e-12 and math.isnan(err)


def test_merge_joins_split_runs(run_dir, tmp_path, capsys):
    with open(run_dir / "bench-n2_4_rect-p1-dim2-float64.json") as f:
        doc = json.load(f)
    paths = []
    for suite in ("gemm", "action"):
        part = dict(doc, cases=[c for c in doc["cases"] if c["suite"] == suite],
                    options=dict(doc["options"], suites=[suite]))
        p = tmp_path / f"bench-{suite}-float64.json"
        p.write_text(json.dumps(part))
        paths.append(str(p))
    out = tmp_path / "merged"
    assert main(["bench", "--merge", *paths, "--out", str(out), "--no-plot"]) == 0
    with open(out / "bench-float64.json") as f:
        merged = json.load(f)
    assert {c["suite"] for c in merged["cases"]} == {"gemm", "action"}
    assert len(merged["merged_from"]) == 2 and merged["options"]["suites"] == ["gemm", "action"]
    assert "== action" in capsys.readouterr().out


def test_split_run_names_its_files(tmp_path):
    needs("matplotlib")
    assert main(TINY + ["--suite", "assembly", "--p", "1", "--dim", "2", "--no-baselines",
                        "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench-assembly-p1-dim2-float64.json").exists()
    assert (tmp_path / "assembly-p1-dim2-fem-dofs-float64.png").exists()


def test_gpu_asked_for_without_one_says_so():
    from smalltc._arrays import gpu_available
    if gpu_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["bench", "--device", "gpu", "--quick"])


def test_bp1_suite_end_to_end(tmp_path, capsys):
    """bp1 on the CPU, tiny: every implementation checked and timed, the two bounds, the
    table and the plot; the fused apply checked against the unfused path."""
    needs("matplotlib")
    assert main(TINY[:-4] + ["--device", "cpu", "--suite", "bp1", "--p", "1", "--out",
                             str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench-bp1-p1-float64.json").read_text())
    cs = doc["cases"]
    assert [(c["sizes"]["nq"], c["sizes"]["quadrature"]) for c in cs] == [(3, "gauss"),
                                                                         (2, "lobatto")]
    for c in cs:
        assert not c.get("error"), c.get("error")
        assert set(c["impls"]) == {"smalltc", "deterministic", "unfused", "cg", "cg (unfused)",
                                   "unchecked"}
        assert all(r["status"] == "ok" for r in c["impls"].values())
        assert all(r["first_call_s"] > 0 for k, r in c["impls"].items() if k != "unchecked")
        assert c["impls"]["unchecked"]["check_cost"] > -1            # the bounds check's cost
        assert c["impls"]["unchecked"]["kernel"].endswith("_unchecked")
        assert c["impls"]["smalltc"]["rel_err"] <= 1e-12
        ndofs = c["sizes"]["ndofs"]
        assert c["bound"]["dofs"] == ndofs and c["cg_bound"]["bytes"] > c["bound"]["bytes"]
        passes = 13 if c["sizes"]["quadrature"] == "gauss" else 11     # GLL nq=p+1: no Jacobi
        assert c["cg_bound"]["bytes"] - c["bound"]["bytes"] == passes * 8 * ndofs
    assert "== bp1" in capsys.readouterr().out
    assert (tmp_path / "bp1-p1-bp1-float64.png").exists()


@pytest.mark.parametrize("suite,rule", [("bp3", (3, "gauss")), ("bp5", (2, "lobatto"))])
def test_bp3_bp5_suites_end_to_end(tmp_path, capsys, suite, rule):
    """bp3 and bp5 on the CPU, tiny: the diffusion operator (collocated for bp5) checked
    against the unfused path and timed, with the einsum chain and a Jacobi-CG iteration;
    the bound counts Q's six entries per point; the table and the plot."""
    needs("matplotlib")
    assert main(TINY[:-4] + ["--device", "cpu", "--suite", suite, "--p", "1", "--out",
                             str(tmp_path)]) == 0
    doc = json.loads((tmp_path / f"bench-{suite}-p1-float64.json").read_text())
    (c,) = doc["cases"]
    assert not c.get("error"), c.get("error")
    assert (c["sizes"]["nq"], c["sizes"]["quadrature"]) == rule
    assert set(c["impls"]) == {"smalltc", "deterministic", "unchecked", "unfused", "einsum",
                               "cg", "cg (unfused)"}
    assert all(r["status"] == "ok" for r in c["impls"].values()), c["impls"]
    assert c["impls"]["smalltc"]["rel_err"] <= 1e-12
    assert c["impls"]["unchecked"]["check_cost"] > -1            # the bounds check's cost
    assert c["impls"]["unchecked"]["kernel"].endswith("_unchecked")
    assert "diffusion" in c["impls"]["smalltc"]["kernel"] or \
        "einsum" in c["impls"]["smalltc"]["kernel"]
    nq, E, ndofs = c["sizes"]["nq"], c["sizes"]["batch"], c["sizes"]["ndofs"]
    nbasis = 2 if suite == "bp3" else 1                   # B1d and G1d; G1d (collocated)
    assert c["bound"]["bytes"] == 8 * (2 * ndofs + 6 * E * nq ** 3 + nbasis * nq * 2) \
        + 4 * E * 8
    assert c["cg_bound"]["bytes"] - c["bound"]["bytes"] == 13 * 8 * ndofs
    from smalltc.bench.bp1 import CG_BASE, CG_EXTRA     # whole batches of the fused loop
    for name in ("cg", "cg (unfused)"):
        its = c["impls"][name]["iterations"]
        assert its % CG_BASE == 0 and its >= CG_BASE + CG_EXTRA, (name, its)
    assert f"== {suite}" in capsys.readouterr().out
    assert (tmp_path / f"{suite}-p1-{suite}-float64.png").exists()


def test_footprint_sizes_the_cpu_cases():
    """--footprint: the CPU cases move about that many bytes (GEMM at most that), so a large
    last-level cache cannot hold them; the LLC size is parsed as sysfs writes it."""
    from smalltc.bench.cases import footprint
    from smalltc.bench.cli import _llc_bytes
    from smalltc.bench.suites import cases
    target = 96 * 2 ** 20
    for suite in ("action", "assembly", "gemm"):
        got = cases(suite, "float64", "cpu", ps=[2, 5], dims=[3], sizes=[4, 32],
                    footprint=target)
        assert got
        for c in got:
            f = footprint(c)
            assert 0.5 * target <= f <= (target if suite == "gemm" else 2 * target), (c.id, f)
            assert "--footprint" in c.note
    default = cases("action", "float64", "cpu", ps=[2], dims=[3])
    assert max(footprint(c) for c in default) < target
    assert cases("action", "float64", "gpu", ps=[2], dims=[3], footprint=target)[0].batch == \
        cases("action", "float64", "gpu", ps=[2], dims=[3])[0].batch     # GPU sizes as is
    assert _llc_bytes("480M") == 480 << 20 and _llc_bytes("32768K") == 32 << 20
    assert _llc_bytes("") is None and _llc_bytes("big") is None


def test_solve_suite_end_to_end(tmp_path, capsys):
    """solve on the CPU, tiny: the three preconditioners reach 1e-8 on the same problem,
    p-multigrid in the fewest iterations, with its hierarchy and V-cycle cost; the table
    and the plot of iterations against p."""
    needs("matplotlib", "scipy", "pyamg")
    assert main(TINY[:-4] + ["--device", "cpu", "--suite", "solve", "--p", "2", "--profile",
                             "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench-solve-p2-float64.json").read_text())
    (c,) = doc["cases"]
    assert not c.get("error"), c.get("error")
    im = c["impls"]
    assert set(im) == {"jacobi", "chebyshev", "pmg"}
    assert all(r["status"] == "ok" for r in im.values()), im
    assert all(r["true_residual"] <= 1e-7 and r["diff_to_jacobi"] < 1e-5 for r in im.values())
    assert im["pmg"]["iterations"] < im["chebyshev"]["iterations"] < im["jacobi"]["iterations"]
    assert im["pmg"]["levels"] == [2, 1] and im["pmg"]["vcycle_fine_applications"] == 6
    assert im["pmg"]["vcycle_in_applications"] > 1
    assert all(r["time_to_solution_s"] >= r["solve_s"] > 0 for r in im.values())
    prof = im["pmg"]["profile"]                      # --profile: per level and part
    assert [row["p"] for row in prof["levels"]] == [2, 1] and prof["levels"][1]["coarse"] > 0
    assert prof["levels"][0]["presmooth"] > 0 and prof["vcycle_s"] > 0
    assert set(im["pmg"]["setup_parts"]) >= {"operators", "eigenvalues", "amg"}
    out = capsys.readouterr().out
    assert "== solve" in out and "one p-multigrid V-cycle per level and part" in out
    assert c["mesh"] == "kershaw:0.3" and "Poisson, Kershaw eps=0.3 3D box" in out  # default
    assert (tmp_path / "solve-p2-solve-float64.png").exists()


def test_default_out_is_not_the_repository_benchmarks(tmp_path, monkeypatch):
    """Without --out the files go to smalltc-bench/<device> in the current folder, never
    into the repository's benchmarks/; on the host each smalltc timing has its
    after-a-BLAS-call twin."""
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--repeats", "2", "--warmup", "1", "--no-progress",
                 "--backend", "cpu", "--device", "cpu", "--suite", "gemm", "--sizes", "2",
                 "--no-plot", "--no-baselines"]) == 0
    files = list((tmp_path / "smalltc-bench").glob("*/bench-*.json"))
    assert files and not (tmp_path / "benchmarks").exists()
    doc = json.loads(files[0].read_text())
    st = doc["cases"][0]["impls"]["smalltc"]
    assert st["status"] == "ok" and len(st["after_blas_times_ns"]) == 2
    assert st["after_blas_fraction"] > 0


def test_force_suite_end_to_end(tmp_path, capsys):
    """force on the CPU, tiny (the reference backend: no compile): both directions at 2D
    p = 2, the element level, the fused form and the einsum chain checked and timed, each
    against its own bound; the table and the plot."""
    needs("matplotlib")
    assert main(TINY + ["--suite", "force", "--p", "2", "--dim", "2", "--out",
                        str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench-force-p2-dim2-float64.json").read_text())
    assert [c["sizes"]["direction"] for c in doc["cases"]] == ["F", "FT"]
    for c in doc["cases"]:
        assert not c.get("error"), c.get("error")
        assert set(c["impls"]) == {"smalltc", "fused", "einsum"}
        assert all(r["status"] == "ok" and r["fraction"] > 0 for r in c["impls"].values())
        assert c["fused_bound"]["bytes"] != c["bound"]["bytes"]
    assert "== force" in capsys.readouterr().out
    assert (tmp_path / "force-p2-dim2-force-float64.png").exists()


def test_force_gpu_cases_are_sized_by_bytes():
    """The GPU force cases move about GPU_BYTES (A and both element fields), whatever the
    order (a DoF count gave 10-40 us kernels at low p, where the launch and the last wave
    count); the quick and CPU cases keep their DoF targets."""
    from smalltc.bench.force import GPU_BYTES, TARGET, cases
    for c in cases("float64", "gpu"):
        s = c.sizes
        dim, p, E = s["dim"], s["p"], s["batch"]
        nbytes = 8 * E * (dim * dim * (2 * p) ** dim + dim * (p + 1) ** dim + p ** dim)
        assert 0.5 * GPU_BYTES < nbytes < 1.6 * GPU_BYTES, (c.id, nbytes)
    for kind, quick, target in (("cpu", False, TARGET[0][1]), ("gpu", True, TARGET[1][0])):
        for c in cases("float64", kind, quick=quick):
            s = c.sizes
            dofs = s["batch"] * s["dim"] * (s["p"] + 1) ** s["dim"]
            assert 0.4 * target < dofs < 2.5 * target, (kind, quick, c.id, dofs)


def test_cg_timing_caps_its_length_where_the_residual_reaches_zero(monkeypatch):
    """A CG solve that stops early (its residual exactly zero: BP1 p = 8 on the H200 after
    446 iterations) caps the timed length instead of failing the case; a stop within the
    cap's lengths is still an error."""
    import types
    import smalltc.fem as fem
    from smalltc.bench import bp1
    calls = []

    def fake_cg(M, rhs, maxiter, **kw):
        calls.append(maxiter)
        return types.SimpleNamespace(iterations=min(maxiter, 100), residuals=[0.0])

    monkeypatch.setattr(fem, "cg", fake_cg)
    per, its, first = bp1._cg_per_iteration(None, None, None, False, False, 3)
    assert its == bp1.CG_BASE + 72 and len(per) == 3        # 0.8 * (100 - 8) -> 72
    assert max(calls) > 100                                 # the probe asked for more
    monkeypatch.setattr(fem, "cg", lambda M, rhs, maxiter, **kw: types.SimpleNamespace(
        iterations=min(maxiter, 12), residuals=[0.0]))
    with pytest.raises(RuntimeError, match="CG stopped after 12 of 24"):
        bp1._cg_per_iteration(None, None, None, False, False, 1)
