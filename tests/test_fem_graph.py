"""The CUDA-graph replay helper (``smalltc.fem._graph``) on a stand-in of CuPy's stream
capture: its bookkeeping (eager first call, capture, replays, the refusal's fallback) runs
without a GPU; the GPU tests (``test_fem_multigrid``, ``test_fem_distributed_mpi``) check
the graphs themselves against the launch-by-launch V-cycles."""

import logging
import types

import numpy as np
import pytest

from smalltc.fem._graph import GraphReplay


class _Graph:
    def __init__(self, calls):
        self.calls = calls

    def launch(self):
        for fn in self.calls:                    # what the capture recorded, replayed
            fn()


class _FakeCuPy:
    """NumPy arrays, and a ``cuda`` whose stream capture records the work queued through
    :meth:`queue` instead of running it (as a capture does)."""

    def __init__(self, refuse=False):
        self.capturing, self.recorded, self.refuse = False, None, refuse
        fake = self

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                if fake.capturing:
                    raise RuntimeError("synchronize while capturing")

            def begin_capture(self, mode=None):
                fake.capturing, fake.recorded = True, []

            def end_capture(self):
                fake.capturing = False
                return _Graph(fake.recorded)

        class _Alloc:
            def __init__(self, malloc):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.cuda = types.SimpleNamespace(
            Stream=Stream, MemoryPool=lambda: types.SimpleNamespace(malloc=None),
            using_allocator=_Alloc, get_current_stream=lambda: Stream(),
            runtime=types.SimpleNamespace(), Device=lambda: types.SimpleNamespace(id=0))
        self.empty_like = np.empty_like

    def queue(self, fn):
        """Run ``fn`` now, or record it while capturing."""
        if self.capturing:
            if self.refuse:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.recorded.append(fn)
        else:
            fn()


def _double_plus_one(xp):
    """``z = 2 r + 1`` through work queued on the fake stream, into a buffer kept across
    calls (as the V-cycles' objects keep theirs)."""
    out = {}

    def fn(r):
        z = out.setdefault(r.shape, np.empty_like(r))
        xp.queue(lambda: np.multiply(r, 2.0, out=z))
        xp.queue(lambda: np.add(z, 1.0, out=z))
        fn.calls += 1
        return z
    fn.calls = 0
    return fn


def test_first_call_eager_then_captured_then_replayed():
    xp = _FakeCuPy()
    fn = _double_plus_one(xp)
    g = GraphReplay(fn, xp, "a test function")
    r = np.arange(4.0)
    assert not g.captured(r)
    np.testing.assert_array_equal(g(r), 2 * r + 1)
    assert fn.calls == 2 and g.captured(r) and g.replays == 0     # eager, then the capture
    for k in range(3):
        r2 = np.full(4, float(k))
        z = g(r2)
        np.testing.assert_array_equal(z, 2 * r2 + 1)
    assert fn.calls == 2 and g.replays == 3                        # replays call nothing
    z0 = g(np.ones(4))
    z1 = g(np.zeros(4))
    assert z0 is not z1 and z0[0] == 3.0                           # each output a copy
    other = np.arange(6.0)
    np.testing.assert_array_equal(g(other), 2 * other + 1)         # a new shape: eager
    assert fn.calls == 4 and g.captured(other)


def test_a_refused_capture_runs_eagerly_from_then_on(caplog):
    xp = _FakeCuPy(refuse=True)
    fn = _double_plus_one(xp)
    g = GraphReplay(fn, xp, "a test function")
    r = np.arange(3.0)
    with caplog.at_level(logging.WARNING, logger="smalltc"):
        for _ in range(3):
            np.testing.assert_array_equal(g(r), 2 * r + 1)
    assert not g.captured(r) and g.replays == 0 and fn.calls == 3  # eager (+ refused), eager x2
    said = [rec.getMessage() for rec in caplog.records]
    assert len(said) == 1 and "a test function could not be captured" in said[0]


def test_a_required_capture_raises_where_it_is_refused():
    xp = _FakeCuPy(refuse=True)
    g = GraphReplay(_double_plus_one(xp), xp, "the V-cycle", required=True)
    with pytest.raises(RuntimeError, match="the V-cycle could not be captured as a CUDA "
                                           "graph: operation not permitted"):
        g(np.ones(2))
