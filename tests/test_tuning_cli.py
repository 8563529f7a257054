"""``smalltc tune`` end to end without a GPU: dry run and an injected mock device and clock."""
import argparse
import json

import pytest

from optional_deps import needs
from smalltc.app.cli import main
from smalltc.tuning import cli
from smalltc.tuning import tables as T
from smalltc.tuning.measure import DryRunDevice
from test_tuning_search import Clock

PNG = b"\x89PNG\r\n\x1a\n"


def _args(*argv):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(list(argv))


class TickingDevice(DryRunDevice):
    """A dry-run device whose every timing costs one second of a mock clock."""

    def __init__(self, dtype, clock):
        super().__init__(dtype)
        self.clock = clock

    def time(self, problem, ex, form="separate"):
        self.clock.t += 1.0
        return super().time(problem, ex, form)


def test_dry_run_end_to_end(tmp_path, capsys):
    needs("matplotlib")
    rc = main(["tune", "--op", "gemm", "--sizes", "4", "8", "--dry-run", "--work",
               str(tmp_path), "--compiler", "none", "--jobs", "1", "--plot",
               "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    table = T.load(tmp_path / "sm90-float64.json")
    assert table["dry_run"] is True
    assert set(table["entries"]) == {"gemm/nn/m4n4k4", "gemm/nn/m8n8k8"}
    assert "table:" in out and "plot:" in out
    pngs = list(tmp_path.glob("search-sm90-float64-*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:8] == PNG
    ck = json.loads((tmp_path / "sm90-gemm-float64.checkpoint.json").read_text())
    assert ck["dry_run"] is True and len(ck["results"]) == 2


def test_mock_device_budget_then_resume(tmp_path, capsys):
    needs("matplotlib")
    clock = Clock()
    common = ("--op", "action", "--sizes", "3:1-2:p+1", "--work", str(tmp_path / "w"),
              "--out", str(tmp_path / "tables"), "--compiler", "none", "--jobs", "1",
              "--no-progress")
    # budget of 30 mock seconds: the first size (~40 variants) does not finish
    rc = cli.run(_args(*common, "--budget-seconds", "30"),
                 device=TickingDevice("float64", clock), clock=clock)
    assert rc == cli.EXIT_BUDGET
    assert not (tmp_path / "tables").exists()          # no table from an unfinished search
    # without --resume the checkpoint is not overwritten
    assert cli.run(_args(*common), device=TickingDevice("float64", clock), clock=clock) == 2
    assert "--resume" in capsys.readouterr().err
    rc = cli.run(_args(*common, "--resume", "--plot", "action/3d/nd3nq3c1"),
                 device=TickingDevice("float64", clock), clock=clock)
    assert rc == 0
    table = T.load(tmp_path / "tables" / "sm90-float64.json")
    assert set(table["entries"]) == {"action/3d/nd2nq2c1", "action/3d/nd3nq3c1"}
    run = table["runs"][-1]
    assert run["op"] == "action" and run["sizes"] == 2 and run["timed"] > 0
    assert run["generated"] == run["pruned"] + run["timed"]
    assert run["compiled"] + run["failed"] + run["pruned_before_compile"] == run["generated"]
    assert (tmp_path / "w" / "search-sm90-float64-action-3d-nd3nq3c1.png").exists()
    # a second op adds its entries to the same table file
    rc = cli.run(_args("--op", "assembly", "--sizes", "3:1:p+1", "--work", str(tmp_path / "w"),
                       "--out", str(tmp_path / "tables"), "--compiler", "none", "--jobs", "1",
                       "--no-progress"), device=TickingDevice("float64", clock), clock=clock)
    assert rc == 0
    table = T.load(tmp_path / "tables" / "sm90-float64.json")
    assert len(table["entries"]) == 3 and [r["op"] for r in table["runs"]] == ["action",
                                                                               "assembly"]


def test_resume_with_other_sizes_writes_every_finished_size(tmp_path):
    """A checkpoint filled by runs with different --sizes: the run that finishes writes
    all of the checkpoint's finished sizes to its table, not only its own --sizes (the
    first run's table is gone here, as when a search goes on into a fresh --out)."""
    clock = Clock()
    common = ("--op", "action", "--work", str(tmp_path / "w"), "--compiler", "none",
              "--jobs", "1", "--no-progress", "--resume")
    assert cli.run(_args(*common, "--sizes", "1:1:p+1", "--out", str(tmp_path / "a")),
                   device=TickingDevice("float64", clock), clock=clock) == 0
    assert cli.run(_args(*common, "--sizes", "1:2:p+1", "--out", str(tmp_path / "b")),
                   device=TickingDevice("float64", clock), clock=clock) == 0
    table = T.load(tmp_path / "b" / "sm90-float64.json")
    assert set(table["entries"]) == {"action/1d/nd2nq2c1", "action/1d/nd3nq3c1"}


@pytest.mark.parametrize("argv,match", [
    (("--op", "gemm", "--sizes", "4x4"), "MxNxK"),
    (("--op", "gemm", "--repeats", "5"), "repeats"),
    (("--op", "gemm", "--footprint-mb", "16"), "256 MB"),
])
def test_argument_errors(argv, match, capsys, tmp_path):
    assert cli.run(_args(*argv, "--work", str(tmp_path))) == 2
    assert match in capsys.readouterr().err


def test_dry_run_never_writes_into_the_package(capsys, tmp_path):
    from smalltc.tables import shipped_dir
    rc = cli.run(_args("--op", "gemm", "--dry-run", "--out", str(shipped_dir()),
                       "--work", str(tmp_path)))
    assert rc == 2 and "package" in capsys.readouterr().err


def test_dry_run_results_are_not_mixed_with_measured(tmp_path, capsys):
    common = ("--op", "gemm", "--sizes", "4", "--work", str(tmp_path), "--out",
              str(tmp_path), "--compiler", "none", "--jobs", "1", "--no-progress")
    assert cli.run(_args(*common, "--dry-run")) == 0
    clock = Clock()
    assert cli.run(_args(*common, "--resume"), device=_Measured("float64", clock),
                   clock=clock) == 2                     # the checkpoint is a dry run's
    assert "from a dry run" in capsys.readouterr().err
    measured = ("--work", str(tmp_path / "w2"), "--arch-table")   # the same file as the dry run's
    with pytest.raises(SystemExit, match="dry-run"):      # the table is a dry run's
        cli.run(_args(*common, *measured), device=_Measured("float64", clock), clock=clock)


class _Measured(TickingDevice):
    dry_run = False


@pytest.mark.skipif(__import__("smalltc._arrays", fromlist=["x"]).gpu_available(),
                    reason="a CUDA device is here")
def test_no_gpu_is_a_clean_error(tmp_path, capsys):
    assert cli.run(_args("--op", "gemm", "--work", str(tmp_path))) == 2
    assert "no CUDA device" in capsys.readouterr().err
