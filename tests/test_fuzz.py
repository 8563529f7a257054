"""The fuzz test of the public functions (tests/fuzz_public.py), in a subprocess under a
time limit: a crash (segfault, heap corruption) or a hang fails it, and so does any failure
that is not a Python exception naming the operand."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smalltc._arrays import gpu_available

HERE = Path(__file__).resolve().parent
TRIALS = int(os.environ.get("SMALLTC_FUZZ_TRIALS", "120"))


def _run(seed, backend, dense, xp="numpy", timeout=900):
    try:
        r = subprocess.run([sys.executable, "-W", "ignore", str(HERE / "fuzz_public.py"),
                            str(seed), str(TRIALS), backend, dense, xp],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the fuzz hung (no end in {timeout} s): {(err.stdout or '')[-2000:]}")
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, f"exit {r.returncode} (negative: killed by a signal):\n{tail}"
    assert f"fuzz: {TRIALS} calls" in r.stdout and ", 0 bad" in r.stdout, tail


def test_fuzz_cpu():
    _run(0, "cpu", "reference")


@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
def test_fuzz_cuda_maps():
    """The map operations on CuPy operands, maps bad or mutated after their first use: every
    one raises (at smalltc.check_errors at the latest) and the CUDA context stays usable."""
    _run(1, "cuda", "reference", "cupy")
