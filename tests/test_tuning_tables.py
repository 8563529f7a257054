"""Tuning tables: write/load round trip, schema checks, exact and nearest lookup, the
runtime's order (device model, architecture, heuristic).

Tables here are built from dry-run searches (made-up times) in a temporary
folder; nothing is written into the package's tables.
"""
import copy
import json
import subprocess
import sys

import pytest

from smalltc import tables as core
from smalltc.backends.cuda import choose, family_of
from smalltc.spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec, spec_from_dict
from smalltc.tuning import tables as T
from smalltc.tuning.measure import DryRunDevice, sized
from smalltc.tuning.search import Search

F64 = "float64"
H100 = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=227 * 1024)


def size_key(spec):
    return spec.size_key


def ctx_for(spec, params):
    """The kernel family's context of ``spec`` with ``params`` (None: does not fit)."""
    return family_of(spec).context(spec, params)


def adapt(spec, entry_spec, params):
    return family_of(spec).adapt(spec, entry_spec, params)


def lookup(table, spec):
    """``(params, match, key)`` of a table for ``spec``, or None."""
    fam = family_of(spec)
    hit = core.Table(table).lookup(fam.tuned_spec(spec), fam)
    return None if hit is None else (hit.params, hit.match, hit.entry)


def _table(specs, dtype=F64, dry_run=False):
    dev = DryRunDevice(dtype)
    s = Search("mixed", dtype, [sized(x) for x in specs], dev, compiler="none", jobs=1,
               progress=False, log=lambda m: None)
    assert s.run() == "done"
    t = T.new_table(dev.info(), dtype, dry_run=dry_run)
    return T.add_results(t, s.results, "mixed", 1.0)


SPECS = [GemmSpec(batch=1, m=n, n=n, k=n, dtype=F64) for n in (4, 8, 16)] + [
    ActionSpec(dim=3, nq=5, nd=4, batch=1, dtype=F64),
    ActionSpec(dim=2, nq=5, nd=4, batch=1, dtype=F64),
    AssemblySpec(dim=3, nq=4, nd=3, batch=1, dtype=F64),
    ContractSpec(kind="9", batch=1, i=3, s=4, j=3, k=4, l=16, dtype=F64, shared_x=True)]


@pytest.fixture(scope="module")
def table():
    return _table(SPECS)


def test_round_trip(tmp_path, table):
    path = tmp_path / T.table_name(H100, F64, arch=True)
    T.save(table, path)
    back = T.load(path)                       # the table and its evidence: the record
    assert back == json.loads(json.dumps(table))
    assert back["schema"] == 1 and back["arch"] == "sm90" and back["dtype"] == F64
    for k in ("name", "cc"):
        assert k in back["device"]
    assert {"cuda_runtime", "cupy", "smalltc"} <= set(back["versions"])
    assert set(back["entries"]) == {size_key(s) for s in SPECS}
    for key, e in back["entries"].items():
        assert e["time_s"] > 0 and 0 < e["fraction_of_pmax"] <= 1
        assert e["runner_up"] is None or e["runner_up"]["time_s"] >= e["time_s"] * 0.99
        assert ctx_for(spec_from_dict(e["spec"]), e["params"]) is not None
    run = back["runs"][-1]
    assert run["op"] == "mixed" and run["sizes"] == len(SPECS)
    assert run["generated"] == run["pruned"] + run["timed"]
    assert run["compiled"] + run["failed"] + run["pruned_before_compile"] == run["generated"]


def test_the_table_is_compact_and_the_evidence_apart(tmp_path, table):
    """The file the backends read holds size key -> [spec, params] and nothing of the
    search; the evidence file holds the record; without it the record has no times."""
    path = tmp_path / T.table_name(H100, F64, arch=True)
    T.save(table, path)
    data = json.loads(path.read_text())
    assert data["schema"] == 2 and "runs" not in data
    assert set(data) == {"schema", "arch", "dtype", "device", "versions", "date", "entries"}
    for key, e in data["entries"].items():
        spec_d, params = e
        assert "batch" not in spec_d and "dtype" not in spec_d
        assert params == table["entries"][key]["params"]
        assert core.Table(data).entries[key].spec == spec_from_dict(
            table["entries"][key]["spec"]).with_batch(1)
    assert len(path.read_text().splitlines()) == len(data["entries"]) + \
        len(json.dumps({k: v for k, v in data.items() if k != "entries"}, indent=1).splitlines())
    ev = T.evidence_path(path)
    assert ev == tmp_path / "evidence" / (path.name + ".gz") and ev.is_file()
    ev.unlink()
    bare = T.load(path)
    assert set(bare["entries"]) == set(table["entries"]) and bare["runs"] == []
    for key, e in bare["entries"].items():
        assert e["params"] == table["entries"][key]["params"] and "time_s" not in e
    # an entry changed in the table (by hand) loses its evidence, the others keep it
    T.save(table, path)
    data["entries"]["gemm/nn/m8n8k8"][1] = dict(dim_x=8, dim_y=2, per_block=3, prefetch=0)
    path.write_text(json.dumps(data))
    mixed = T.load(path)
    assert "time_s" not in mixed["entries"]["gemm/nn/m8n8k8"]
    assert mixed["entries"]["gemm/nn/m4n4k4"] == json.loads(json.dumps(
        table["entries"]["gemm/nn/m4n4k4"]))
    assert mixed["runs"] == json.loads(json.dumps(table["runs"]))


def test_shipped_tables_are_small():
    """The package ships lookup tables only: their evidence lives in the source tree."""
    found = list(core.shipped_dir().glob("*.json"))
    assert found and sum(p.stat().st_size for p in found) < 200 * 1024
    for path in found:
        assert json.loads(path.read_text())["schema"] == core.SCHEMA, path.name


def _broken(table, how):
    t = copy.deepcopy(table)
    key = "gemm/nn/m8n8k8"
    if how == "schema":
        t["schema"] = 3
    elif how == "missing":
        del t["date"]
    elif how == "arch":
        t["arch"] = "sm80"
    elif how == "params":
        t["entries"][key]["params"] = {"per_block": 2}
    elif how == "spec":
        t["entries"][key]["spec"]["m"] = 9
    elif how == "time":
        t["entries"][key]["time_s"] = 0
    elif how == "entry":
        del t["entries"][key]["params"]
    elif how == "pair":
        t = T.compact(t)
        t["entries"][key] = t["entries"][key][:1]
    elif how == "size":
        t = T.compact(t)
        t["entries"][key][0]["m"] = 9
    elif how == "dtype":
        t["entries"][key]["spec"]["dtype"] = "float32"
    return t


@pytest.mark.parametrize("how,match", [
    ("schema", "schema 3"), ("missing", "missing date"), ("arch", "arch 'sm80'"),
    ("params", "params"), ("spec", "holds the spec of"), ("time", "time_s"),
    ("entry", "lacks params"), ("dtype", "is float32"), ("pair", r"not \[spec, params\]"),
    ("size", "holds the spec of")])
def test_schema_errors(table, how, match, tmp_path):
    bad = _broken(table, how)
    with pytest.raises(ValueError, match=match):
        T.validate(bad)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=match):
        T.load(path)


def test_exact_lookup(table):
    for spec in SPECS:
        params, how, key = lookup(table, spec.with_batch(12345))
        assert how == "exact" and key == size_key(spec)
        assert params == table["entries"][key]["params"]


@pytest.mark.parametrize("spec,entry", [
    (GemmSpec(batch=7, m=9, n=9, k=9, dtype=F64), "gemm/nn/m8n8k8"),
    (GemmSpec(batch=7, m=5, n=5, k=5, dtype=F64), "gemm/nn/m4n4k4"),
    (GemmSpec(batch=7, m=8, n=8, k=12, dtype=F64), "gemm/nn/m8n8k8"),
    (ActionSpec(dim=3, nq=6, nd=4, batch=7, dtype=F64), "action/3d/nd4nq5c1"),
    (ActionSpec(dim=3, nq=5, nd=4, batch=7, dtype=F64, ncomp=3, comp_axis=True),
     "action/3d/nd4nq5c1"),
    (AssemblySpec(dim=3, nq=5, nd=3, batch=7, dtype=F64), "assembly/3d/nd3nq4"),
    (ContractSpec(kind="9", batch=7, i=3, s=4, j=3, k=4, l=20, dtype=F64, shared_x=True),
     "contract9+sx/i3s4j3k4l16"),
])
def test_nearest_lookup(table, spec, entry):
    params, how, key = lookup(table, spec)
    assert (how, key) == ("nearest", entry)
    assert ctx_for(spec, params) is not None           # carried over, and still valid


@pytest.mark.parametrize("spec", [
    GemmSpec(batch=7, m=64, n=64, k=64, dtype=F64),          # too far from 16 (distance 6)
    # a GEMM takes a factor 2 at most: carried 4x these lost 2-14% on the H100
    GemmSpec(batch=7, m=4, n=8, k=16, dtype=F64),            # distance 2 from m=n=k=8
    GemmSpec(batch=7, m=8, n=16, k=4, dtype=F64),
    GemmSpec(batch=7, m=8, n=8, k=8, dtype=F64, trans_a=True),   # other variant
    GemmSpec(batch=7, m=8, n=8, k=8, dtype="float32"),           # other dtype
    ActionSpec(dim=1, nq=5, nd=4, batch=7, dtype=F64),           # no 1D entry
    AssemblySpec(dim=2, nq=4, nd=3, batch=7, dtype=F64),
])
def test_no_entry_is_none(table, spec):
    assert lookup(table, spec) is None


def test_adapt_keeps_layout_shape():
    e = GemmSpec(batch=1, m=8, n=8, k=8, dtype=F64)
    # 2 outputs per thread along n, 4 along m, 128 threads per block
    p = adapt(GemmSpec(batch=1, m=16, n=16, k=16, dtype=F64), e,
                dict(dim_x=4, dim_y=2, per_block=16))
    assert p == dict(dim_x=8, dim_y=4, per_block=4)
    a = adapt(ActionSpec(dim=3, nq=6, nd=5, batch=1, dtype=F64),
                ActionSpec(dim=3, nq=5, nd=4, batch=1, dtype=F64),
                dict(per_block=8, min_blocks=8))     # 200 threads -> 36 per element
    assert a["per_block"] == round(8 * 25 / 36) and a["min_blocks"] * 36 * a["per_block"] <= 2048


def _use_dir(monkeypatch, path):
    """Read tables from ``path`` only: the shipped tables are hidden from the test."""
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(path))
    monkeypatch.setattr(core, "shipped_dir", lambda: path / "no-shipped-tables")


def test_runtime_lookup_order(tmp_path, monkeypatch, table):
    """The device model's table answers first, the architecture's next, then the heuristic;
    an exact entry of either before a nearest one of either."""
    _use_dir(monkeypatch, tmp_path)
    exact = GemmSpec(batch=3, m=8, n=8, k=8, dtype=F64)
    near = GemmSpec(batch=3, m=9, n=9, k=9, dtype=F64)
    assert choose(exact, H100).source == "heuristic"
    T.save(table, tmp_path / T.table_name(H100, F64, arch=True))
    c = choose(exact, H100)
    assert (c.source, c.table) == ("table-exact", "sm90-float64.json")
    assert c.ctx == ctx_for(exact, table["entries"]["gemm/nn/m8n8k8"]["params"])
    assert choose(near, H100).source == "table-nearest"
    assert choose(exact, dict(H100, cc="80")).source == "heuristic"        # no sm80 table
    assert choose(GemmSpec(batch=3, m=8, n=8, k=8, dtype="float32"), H100).source == "heuristic"
    own = copy.deepcopy(table)
    own["entries"]["gemm/nn/m8n8k8"]["params"] = dict(dim_x=8, dim_y=2, per_block=3,
                                                      prefetch=0)
    T.save(own, tmp_path / T.table_name(H100, F64))
    assert T.table_name(H100, F64) == "sm90-nvidia-h100-80gb-hbm3-float64.json"
    c = choose(exact, H100)
    assert c.table == "sm90-nvidia-h100-80gb-hbm3-float64.json" and c.ctx["per_block"] == 3
    other = choose(exact, dict(H100, name="NVIDIA H200"))        # same arch, no own table
    assert other.table == "sm90-float64.json"
    assert choose(near, H100).table == "sm90-nvidia-h100-80gb-hbm3-float64.json"
    # an exact entry of the architecture's table beats a nearest one of the device's
    del own["entries"]["gemm/nn/m8n8k8"]
    T.save(own, tmp_path / T.table_name(H100, F64))
    c = choose(exact, H100)
    assert (c.source, c.table) == ("table-exact", "sm90-float64.json")
    monkeypatch.setenv("SMALLTC_TUNING", "off")
    assert choose(exact, H100).source == "heuristic"
    assert core.lookup(exact, family_of(exact), "sm90", H100["name"]) is None


def test_dry_run_table_is_never_used(tmp_path, monkeypatch, caplog):
    t = _table(SPECS[:1], dry_run=True)
    T.save(t, tmp_path / T.table_name(H100, F64, arch=True))
    _use_dir(monkeypatch, tmp_path)
    assert choose(SPECS[0], H100).source == "heuristic"
    assert "dry run" in caplog.text


def test_broken_table_is_ignored_with_a_warning(tmp_path, monkeypatch, caplog):
    (tmp_path / T.table_name(H100, F64, arch=True)).write_text('{"schema": 99}')
    _use_dir(monkeypatch, tmp_path)
    assert choose(SPECS[0], H100).source == "heuristic"
    assert "schema 99" in caplog.text


def test_shipped_tables_are_valid():
    # tables in the package are only ever written by a GPU run; whatever is there must load
    names = []
    for path in sorted(core.shipped_dir().glob("*.json")):
        t = T.load(path)
        names.append(path.name)
        assert not t.get("dry_run"), f"{path} is a dry-run table"
        assert path.name in (T.table_name(t["device"], t["dtype"]),
                             T.table_name(t["device"], t["dtype"], arch=True))
    assert {"sm90-float64.json", "sm90-float32.json"} <= set(names)


def test_info_lists_tables(tmp_path, monkeypatch, table):
    from smalltc import info
    T.save(table, tmp_path / T.table_name(H100, F64, arch=True))
    (tmp_path / T.table_name(H100, "float32", arch=True)).write_text("{not json")
    _use_dir(monkeypatch, tmp_path)
    rows = {r["file"]: r for r in info._tables()}
    good = rows["sm90-float64.json"]
    assert good["dtype"] == F64 and sum(good["entries"].values()) == len(table["entries"])
    assert "error" in rows["sm90-float32.json"]     # listed, and why it is ignored
    monkeypatch.setenv("SMALLTC_TUNING", "off")
    assert all(r.get("disabled") for r in info._tables())


def test_assembly_rows_is_optional_and_carried():
    old = AssemblySpec(dim=3, nq=5, nd=4, batch=1, dtype=F64)
    # an entry written before the rows form existed: valid, and means the flat form
    assert adapt(old, old, {"per_block": 4}) == {"per_block": 4, "rows": 0, "pad": 0}
    # a rows-form entry carries its form to a neighbour ...
    near = AssemblySpec(dim=3, nq=6, nd=5, batch=1, dtype=F64)
    p = adapt(near, old, {"per_block": 4, "rows": 4})
    assert p["rows"] == 4 and ctx_for(near, p)["threads"] == 5 ** 3 * 4
    # ... unless its threads would not fit a block (8^3 * 4 > 1024): then the flat form
    big = AssemblySpec(dim=3, nq=9, nd=8, batch=1, dtype=F64)
    assert adapt(big, old, {"per_block": 4, "rows": 4})["rows"] == 0


def test_action_rb_is_optional_and_carried(table):
    spec = ActionSpec(dim=3, nq=5, nd=4, batch=1, dtype=F64)
    key = size_key(spec)
    # entries written before rb existed (the shipped sm90 tables): valid, mean rb = 1
    old = copy.deepcopy(table)
    old["entries"][key]["params"].pop("rb", None)
    T.validate(old)
    params, how, _ = lookup(old, spec.with_batch(9))
    assert how == "exact" and params["rb"] == 1
    assert adapt(spec, spec, {"per_block": 4, "min_blocks": 2}) == \
        {"per_block": 4, "min_blocks": 2, "rb": 1, "line": 0, "prefetch": 0, "stages": 0}
    # an entry with rb: valid; a neighbour gets the same rb and threads per block
    new = copy.deepcopy(table)
    new["entries"][key]["params"] = {"per_block": 4, "min_blocks": 0, "rb": 2}
    T.validate(new)
    near = ActionSpec(dim=3, nq=6, nd=4, batch=7, dtype=F64)
    params, how, _ = lookup(new, near)
    assert how == "nearest" and params["rb"] == 2
    ctx = ctx_for(near, params)           # T 5 -> 6: 15 -> 18 threads per element
    assert (ctx["tpi"], ctx["per_block"]) == (18, 3)
    # anything else in params is still an error
    new["entries"][key]["params"]["rbx"] = 1
    with pytest.raises(ValueError, match="params"):
        T.validate(new)


def test_rerun_of_some_sizes_keeps_the_wider_run_record():
    """Re-tuning a few sizes replaces their entries; the earlier, wider run keeps its
    record and names those sizes as superseded, a full re-run replaces the record."""
    t = _table(SPECS)
    dev = DryRunDevice(F64)
    s = Search("mixed", F64, [sized(SPECS[-1])], dev, compiler="none", jobs=1,
               progress=False, log=lambda m: None)
    assert s.run() == "done"
    T.add_results(t, s.results, "mixed", 1.0)
    key = size_key(SPECS[-1])
    assert [r["sizes"] for r in t["runs"]] == [len(SPECS), 1]
    assert t["runs"][0]["superseded"] == [key]
    full = Search("mixed", F64, [sized(x) for x in SPECS], dev, compiler="none", jobs=1,
                  progress=False, log=lambda m: None)
    assert full.run() == "done"
    T.add_results(t, full.results, "mixed", 1.0)
    assert [r["sizes"] for r in t["runs"]] == [len(SPECS)]
    assert "superseded" not in t["runs"][0]


def test_nearest_carries_the_action_line_form():
    """A 3D entry of the line form reaches its neighbours (other ncomp, nq) as the line
    form with the same threads per block; a 2D neighbour gets the shared-memory form."""
    e = ActionSpec(dim=3, nq=9, nd=9, batch=1, dtype=F64)
    params = {"per_block": 3, "min_blocks": 4, "rb": 1, "line": 1, "prefetch": 1}
    three = adapt(ActionSpec(dim=3, nq=9, nd=9, batch=1, dtype=F64, ncomp=3, comp_axis=True),
                    e, params)
    assert three == dict(params, stages=0)
    wider = adapt(ActionSpec(dim=3, nq=10, nd=9, batch=1, dtype=F64), e, params)
    assert wider["line"] == 1 and wider["per_block"] == 2          # 243 threads / 110 per item
    assert wider["prefetch"] == 1
    # the bulk form (prefetch 3) is carried where its slabs are 16-byte multiples (two
    # elements of 729 doubles), else the register prefetch (prefetch 1) takes its place
    bulk = dict(params, per_block=2, prefetch=3, stages=3)
    wide = adapt(ActionSpec(dim=3, nq=10, nd=9, batch=1, dtype=F64), e, bulk)
    assert (wide["prefetch"], wide["stages"], wide["per_block"]) == (3, 3, 2)
    odd = adapt(ActionSpec(dim=3, nq=9, nd=9, batch=1, dtype=F64, ncomp=3, comp_axis=True),
                e, bulk)              # 1..3 items: no whole elements of 16-byte multiples
    assert (odd["prefetch"], odd["stages"]) == (1, 0)
    flat = adapt(ActionSpec(dim=2, nq=9, nd=9, batch=1, dtype=F64), e, params)
    assert flat["line"] == 0 and flat["rb"] == 1 and flat["prefetch"] == 0


def test_tuner_action_sizes_with_components_have_the_component_axis():
    """`--sizes 3:4:5:c3` once made ActionSpec(ncomp=3) without the component axis: its V
    held a third of the items the kernel processes (an illegal address on the H100)."""
    from smalltc.tuning.sizes import parse
    (spec,) = parse("action", ["3:4:5:c3"], F64)
    assert spec.comp_axis and spec.v_shape == (1, 3, 5, 5, 5)
    with pytest.raises(ValueError, match="comp_axis"):
        ActionSpec(dim=3, nq=5, nd=4, batch=1, dtype=F64, ncomp=3)


def test_the_core_never_imports_the_tuner():
    """Reading tables, choosing and building kernels is the core's; only ``smalltc tune``
    imports :mod:`smalltc.tuning` (which imports the core)."""
    code = ("import sys, smalltc, smalltc.tables, smalltc.info, smalltc.backends.cuda\n"
            "from smalltc.backends.cuda import choose\n"
            "from smalltc.spec import ActionSpec\n"
            "choose(ActionSpec(dim=3, nq=5, nd=4, batch=9, dtype='float64'),\n"
            "       dict(name='x', cc='90', sms=1, smem_optin=232448))\n"
            "smalltc.info.collect()\n"
            "print(sorted(m for m in sys.modules if m.startswith('smalltc.tuning')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
