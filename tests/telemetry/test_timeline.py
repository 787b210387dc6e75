"""Phase accounting of both timelines. The CUDA timeline runs on fake events driven by a fake
clock, which checks the accounting and that it syncs once per resolve, never per step."""

from __future__ import annotations


import numpy as np
import pytest

from trainspeed.telemetry.schema import PHASES
from trainspeed.telemetry.timeline import OTHER, CpuTimeline, CudaTimeline

pytestmark = pytest.mark.timeout(60)
IDX = {name: i for i, name in enumerate(PHASES)}


class FakeClock:
    now = 0.0


class FakeEvent:
    syncs = 0

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.t: float | None = None

    def record(self) -> None:
        self.t = self.clock.now

    def synchronize(self) -> None:
        FakeEvent.syncs += 1

    def elapsed_time(self, other: "FakeEvent") -> float:
        return (other.t - self.t) * 1000.0  # milliseconds, as torch.cuda.Event does


class SleepClock:
    """perf_counter for CpuTimeline that moves only when a test sleeps on it: the phase times
    are exact, whatever else the machine runs (real sleeps overshot the tolerance by 10+ ms on a
    loaded 2-core machine)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def perf_counter(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock(monkeypatch):
    import trainspeed.telemetry.timeline as timeline

    fake = SleepClock()
    monkeypatch.setattr(timeline, "time", fake)
    return fake


def test_cpu_timeline_charges_innermost_phase_and_sums_to_step(clock):
    tl = CpuTimeline()
    tl.begin(IDX["data"])
    clock.sleep(0.02)
    tl.end(IDX["data"])
    tl.begin(IDX["forward"])
    clock.sleep(0.03)
    tl.begin(IDX["eval"])  # nested inside forward: charged exclusively
    clock.sleep(0.01)
    tl.end(IDX["eval"])
    clock.sleep(0.01)
    tl.end(IDX["forward"])
    clock.sleep(0.005)
    tl.end_step()
    [(t_step, phases)] = tl.resolve()
    assert phases[IDX["data"]] == pytest.approx(0.02)
    assert phases[IDX["forward"]] == pytest.approx(0.04)
    assert phases[IDX["eval"]] == pytest.approx(0.01)
    assert phases[OTHER] == pytest.approx(0.005)
    assert sum(phases) == pytest.approx(t_step, rel=1e-9)
    # the next step starts at the end of this one and begins empty
    tl.end_step()
    [(t2, p2)] = tl.resolve()
    assert t2 == 0.0 and sum(p2) == pytest.approx(t2)


def test_cpu_timeline_keeps_the_step_in_progress_for_the_next_resolve(clock):
    tl = CpuTimeline()
    tl.begin(IDX["forward"])
    clock.sleep(0.01)
    tl.end(IDX["forward"])
    tl.end_step()
    tl.begin(IDX["data"])  # the next step has begun when the interval is resolved
    clock.sleep(0.02)
    [(t1, p1)] = tl.resolve()
    assert p1[IDX["forward"]] == pytest.approx(0.01) and p1[IDX["data"]] == 0.0
    tl.end(IDX["data"])
    tl.end_step()
    tl.end_step()
    (t2, p2), (t3, p3) = tl.resolve()
    assert p2[IDX["data"]] == pytest.approx(0.02)
    assert sum(p2) == pytest.approx(t2) and t3 == 0.0 and p3[IDX["data"]] == 0.0


def test_cpu_timeline_unwinds_unbalanced_phases(clock):
    """An exception between begin and end leaves inner phases open: ending the outer one
    closes them too, and an end without its begin is ignored."""
    tl = CpuTimeline()
    tl.begin(IDX["forward"])
    tl.begin(IDX["log"])  # never ended
    tl.end(IDX["forward"])
    tl.end(IDX["eval"])  # never begun
    clock.sleep(0.01)
    tl.end_step()
    [(t_step, phases)] = tl.resolve()
    assert phases[OTHER] == pytest.approx(0.01) and phases[IDX["log"]] == 0.0
    assert tl._stack == []


def test_cpu_timeline_caps_transitions_per_step():
    from trainspeed.telemetry.timeline import MAX_TRANSITIONS

    tl = CpuTimeline()
    tl.begin(IDX["forward"])
    for _ in range(5 * MAX_TRANSITIONS):  # a script printing in a tight loop
        tl.begin(IDX["log"])
        tl.end(IDX["log"])
    tl.end(IDX["forward"])  # recorded: the nesting stays balanced past the cap
    assert len(tl.marks) == MAX_TRANSITIONS + 2  # the cap, the open log phase's end, forward's end
    tl.end_step()
    [(t_step, phases)] = tl.resolve()
    assert sum(phases) == pytest.approx(t_step) and tl.marks == [] and tl._stack == []


def test_cuda_timeline_resolves_lazily_with_one_sync():
    clock = FakeClock()
    tl = CudaTimeline("cuda:0", pool_size=4, event_factory=lambda: FakeEvent(clock))
    FakeEvent.syncs = 0
    for step in range(3):
        tl.transition(IDX["data"])
        clock.now += 0.010
        tl.transition(IDX["forward"])
        clock.now += 0.020 + step * 0.001
        tl.transition(IDX["backward"])
        clock.now += 0.040
        tl.transition(OTHER)
        clock.now += 0.005
        tl.end_step()
    assert FakeEvent.syncs == 0  # nothing synchronized while stepping
    resolved = tl.resolve()
    assert FakeEvent.syncs == 1
    for step, (t_step, phases) in enumerate(resolved):
        assert phases[IDX["data"]] == pytest.approx(0.010)
        assert phases[IDX["forward"]] == pytest.approx(0.020 + step * 0.001)
        assert phases[IDX["backward"]] == pytest.approx(0.040)
        assert phases[OTHER] == pytest.approx(0.005)
        assert t_step == pytest.approx(0.075 + step * 0.001)
        assert phases.sum() == pytest.approx(t_step)


def test_cuda_timeline_event_pool_does_not_grow():
    clock = FakeClock()
    made = []

    def factory():
        made.append(1)
        return FakeEvent(clock)

    tl = CudaTimeline("cuda:0", pool_size=16, event_factory=factory)
    for _ in range(50):  # 50 flushes of 4 steps: the pool is refilled after each resolve
        for _ in range(4):
            tl.transition(IDX["forward"])
            clock.now += 0.001
            tl.transition(OTHER)
            tl.end_step()
        assert len(tl.resolve()) == 4
    assert len(made) <= 16 + 2
    assert np.isfinite(clock.now)


def test_cpu_timeline_past_the_cap_keeps_the_steps_other_phases(clock):
    """An RL episode per step: thousands of forwards, then one backward and one update. The
    cap drops the repeated forwards, not the backward and optimizer (reinforce.py's long
    episodes read backward 0 and optimizer 0, their time charged to "other")."""
    from trainspeed.telemetry.timeline import MAX_TRANSITIONS

    tl = CpuTimeline()
    for _ in range(MAX_TRANSITIONS):  # 2 x the cap's transitions of forward
        tl.begin(IDX["forward"])
        tl.end(IDX["forward"])
    tl.begin(IDX["backward"])
    clock.sleep(0.02)
    tl.end(IDX["backward"])
    tl.begin(IDX["optimizer"])
    clock.sleep(0.01)
    tl.end(IDX["optimizer"])
    tl.end_step()
    [(t_step, phases)] = tl.resolve()
    assert phases[IDX["backward"]] == pytest.approx(0.02, abs=1e-3)
    assert phases[IDX["optimizer"]] == pytest.approx(0.01, abs=1e-3)
    assert sum(phases) == pytest.approx(t_step)
    # the next step starts with its own count: its first forwards are kept again
    tl.begin(IDX["forward"])
    assert tl.marks[-1][1] == IDX["forward"]
