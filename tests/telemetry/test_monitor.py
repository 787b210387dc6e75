"""The Monitor on a real (tiny) training loop: phases, records, loss at the interval, warm-up,
the run directory it writes."""

from __future__ import annotations

import json
import time
import weakref

import pytest
import torch
from torch import nn

from trainspeed.errors import ConfigError
from trainspeed.telemetry import read_run
from trainspeed.telemetry.monitor import Monitor
from trainspeed.telemetry.schema import PHASES

pytestmark = pytest.mark.timeout(120)


def _loop(mon: Monitor, steps: int, *, sleep_forward: float = 0.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(steps)]
    losses = []
    for x, y in mon.loader(data):
        with mon.phase("forward"):
            if sleep_forward:
                time.sleep(sleep_forward)
            loss = nn.functional.mse_loss(model(x), y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
        mon.step(samples=4, tokens=32, pad_tokens=8, loss=loss, lr=0.05)
    return losses


def test_monitor_writes_one_record_per_step_with_losses(tmp_path):
    mon = Monitor(tmp_path / "run", log_every=7, warmup_steps=3, system_sampler=False)
    losses = _loop(mon, 20)
    summary = mon.close()
    run = read_run(tmp_path / "run")
    assert [r["step"] for r in run.steps] == list(range(1, 21))
    assert [r["loss"] for r in run.steps] == pytest.approx(losses, rel=1e-6)
    assert all(set(r["phases"]) == set(PHASES) for r in run.steps)
    assert [r["warmup"] for r in run.steps] == [True] * 3 + [False] * 17
    assert run.steps[0]["pad_share"] == pytest.approx(8 / 40)
    assert summary["steps"] == 20 and summary["measured_steps"] == 17
    assert summary["loss"]["first"] == pytest.approx(losses[0], rel=1e-6)
    assert (tmp_path / "run" / "env.json").exists()
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["schema"] == 1 and report["summary"]["steps"] == 20
    types = [e["type"] for e in run.events]
    assert types[0] == "run_start" and "run_end" in types


def test_phase_times_sum_to_step_time_and_land_in_their_phase(tmp_path):
    mon = Monitor(tmp_path / "run", log_every=5, warmup_steps=0, system_sampler=False)
    _loop(mon, 10, sleep_forward=0.01)
    mon.close()
    run = read_run(tmp_path / "run")
    for r in run.steps:
        measured = sum(v for k, v in r["phases"].items() if k != "other")
        assert measured <= r["t_step"] + 1e-9
        assert sum(r["phases"].values()) == pytest.approx(r["t_step"], rel=1e-6, abs=1e-9)
        assert r["phases"]["forward"] >= 0.0095  # the planted 10 ms sleep lands in forward
        assert r["phases"]["backward"] < r["phases"]["forward"] + r["t_step"]  # not double-counted


def test_samples_per_second_matches_hand_computation(tmp_path):
    mon = Monitor(tmp_path / "run", log_every=50, warmup_steps=2, system_sampler=False)
    _loop(mon, 12, sleep_forward=0.005)
    summary = mon.close()
    run = read_run(tmp_path / "run")
    kept = [r for r in run.steps if not r["warmup"]]
    expected = 4 * len(kept) / sum(r["t_step"] for r in kept)
    assert summary["samples_per_s"] == pytest.approx(expected, rel=1e-9)
    assert summary["tokens_per_s"] == pytest.approx(8 * expected, rel=1e-9)


def test_loss_stays_on_device_until_the_interval(tmp_path):
    mon = Monitor(None, sinks=(), log_every=4, warmup_steps=0, system_sampler=False)
    _loop(mon, 3)
    assert len(mon.recent) == 0  # nothing materialized before the interval
    _loop(mon, 1)
    assert len(mon.recent) == 4
    mon.close()


def test_mark_warmup_and_count_sync(tmp_path):
    mon = Monitor(None, sinks=(), log_every=10, warmup_steps=0, system_sampler=False)
    mon.mark_warmup()
    mon.count_sync(3)
    mon.step(samples=1)
    mon.step(samples=1)
    mon.close()
    first, second = list(mon.recent)
    assert first["warmup"] and not second["warmup"]
    assert first["syncs"] == 3 and second["syncs"] == 0


def test_syncs_warmup_and_losses_are_each_steps_own_across_log_intervals():
    # step() keeps running totals and marks; flush works out each step's own: across a flush
    # boundary (log_every=3) a sync count, a mark_warmup made between two steps (it belongs to
    # the next one) and the losses must land on their own steps
    mon = Monitor(None, sinks=(), log_every=3, warmup_steps=2, system_sampler=False)
    plan = [(0, False, torch.tensor(1.0)), (2, False, None), (1, True, 3.0),  # 3rd: flushed with it
            (0, True, torch.tensor([4.0, 6.0])), (5, False, torch.tensor(7.0)), (0, False, None),
            (1, False, torch.tensor(9.0))]
    for syncs, marked, loss in plan:
        if marked:
            mon.mark_warmup()
        mon.count_sync(syncs)
        mon.step(samples=1, loss=loss)
    mon.close()
    recs = list(mon.recent)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["syncs"] for r in recs] == [0, 2, 1, 0, 5, 0, 1]
    assert [r["warmup"] for r in recs] == [True, True, True, True, False, False, False]
    assert [r["loss"] for r in recs] == [1.0, None, 3.0, 5.0, 7.0, None, 9.0]


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="logging.every must be >= 1"):
        Monitor(None, sinks=(), log_every=0)
    with pytest.raises(ConfigError, match="no run_dir"):
        Monitor(None, sinks=("jsonl",), system_sampler=False)
    mon = Monitor(None, sinks=(), system_sampler=False)
    with pytest.raises(ConfigError, match="unknown phase 'fwd'"):
        mon.begin("fwd")
    # mon.phase is a C lookup in the Monitor's PhaseTable; a miss is still the same clear error
    with pytest.raises(ConfigError, match="unknown phase 'fwd'; phases are data, h2d, forward"):
        mon.phase("fwd")
    with pytest.raises(ConfigError, match="unknown phase 'other'"):
        mon.phase("other")  # the remainder, never entered
    assert mon.phase("forward") is mon.phase("forward")  # one context per name, kept
    mon.close()


def test_crash_is_recorded_with_traceback(tmp_path):
    with pytest.raises(RuntimeError):
        with Monitor(tmp_path / "run", log_every=2, system_sampler=False) as mon:
            _loop(mon, 3)
            raise RuntimeError("boom")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert "RuntimeError: boom" in report["traceback"]
    assert report["summary"]["steps"] == 3  # what was measured before the crash is kept


def test_failed_loss_reduction_keeps_the_interval_for_close(tmp_path):
    """A dead rank makes the loss all-reduce raise inside flush(); close(error=...) must still
    write every pending step (the reduction is skipped then), not fail on half-consumed state."""
    calls = {"n": 0}

    def reduce(losses):
        calls["n"] += 1
        raise RuntimeError("Connection closed by peer")

    mon = Monitor(tmp_path, log_every=4, warmup_steps=0, system_sampler=False, reduce_losses=reduce)
    for i in range(3):
        with mon.phase("forward"):
            pass
        mon.step(samples=2, loss=torch.tensor(float(i)))
    with pytest.raises(RuntimeError, match="closed by peer"):
        with mon.phase("forward"):
            pass
        mon.step(samples=2, loss=torch.tensor(3.0))
    err = RuntimeError("collective failed")
    mon.close(error=err)
    run = read_run(tmp_path)
    assert calls["n"] == 1
    assert [s["step"] for s in run.steps] == [1, 2, 3, 4]
    assert [s["loss"] for s in run.steps] == [0.0, 1.0, 2.0, 3.0]
    assert all(sum(s["phases"].values()) == pytest.approx(s["t_step"]) for s in run.steps)


def test_losses_of_every_kind_in_one_interval_are_read_right():
    """step() reads a CPU scalar tensor directly once it has seen one; a float, a per-sample
    vector or a 1-element tensor of another shape that follow must still be read right."""
    mon = Monitor(None, sinks=(), log_every=100, warmup_steps=0, system_sampler=False)
    given = [torch.tensor(1.5), torch.tensor(2.5), 3.5, torch.tensor([1.0, 3.0]),
             torch.tensor([[4.5]]), torch.tensor(5.5, dtype=torch.float64), None, 7]
    for loss in given:
        mon.step(samples=1, loss=loss)
    mon.close()
    assert [r["loss"] for r in mon.recent] == [1.5, 2.5, 3.5, 2.0, 4.5, 5.5, None, 7.0]


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")
def test_a_loss_outside_autograd_is_kept_until_the_interval_and_one_in_a_graph_is_not():
    """With keep_loss_tensors (the Trainer's), step() keeps a detached CPU loss as it is and
    reads it at flush; a loss still in a graph is read at once, so no graph is ever held."""
    mon = Monitor(None, sinks=(), log_every=4, warmup_steps=0, system_sampler=False, keep_loss_tensors=True)
    w = torch.ones(2, requires_grad=True)
    mon.step(samples=1, loss=torch.tensor(0.5))  # the first loss is examined, then read
    detached, in_graph = (w * 2).sum().detach(), (w * 3).sum()
    kept, read = weakref.ref(detached), weakref.ref(in_graph)
    mon.step(samples=1, loss=detached)
    mon.step(samples=1, loss=in_graph)
    del detached, in_graph
    assert kept() is not None and read() is None
    mon.step(samples=1, loss=torch.tensor(1.0))  # the interval: everything is read
    assert kept() is None
    assert [r["loss"] for r in mon.recent] == [0.5, 4.0, 6.0, 1.0]
    mon.close()


def test_losses_are_read_at_the_step_unless_the_loop_keeps_them_unchanged():
    """By default a loss is read when the step closes: an accumulator the loop resets in place
    afterwards (`acc.zero_()`, as the Hugging Face Trainer does) is recorded as it was."""
    mon = Monitor(None, sinks=(), log_every=2, warmup_steps=0, system_sampler=False)
    acc = torch.zeros(())
    for value in (1.5, 2.5):
        acc += value
        mon.step(samples=1, loss=acc)
        acc.zero_()
    mon.close()
    assert [r["loss"] for r in mon.recent] == [1.5, 2.5]


def test_wall_times_are_the_step_ends_on_the_wall_clock():
    mon = Monitor(None, sinks=(), log_every=3, warmup_steps=0, system_sampler=False)
    before = time.time()
    for _ in range(5):
        time.sleep(0.01)
        mon.step(samples=1)
    after = time.time()
    mon.close()
    walls = [r["t_wall"] for r in mon.recent]
    assert before < walls[0] and walls[-1] <= after + 1e-3
    gaps = [b - a for a, b in zip(walls, walls[1:])]
    assert all(0.009 < g < 0.5 for g in gaps)  # increasing, one sleep apart
    assert [r["t_step"] for r in mon.recent][1:] == pytest.approx(gaps, abs=2e-4)


def test_mark_records_the_same_phases_as_with_blocks_and_follows_a_profiler_hook():
    """Monitor.mark((time, code)) is the frame-free form the Trainer uses: the same records
    as `with mon.phase(...)`; while phases are hooked (a profiler window) it goes through the
    instance's begin/end, and back to the timeline's list afterwards."""
    from trainspeed.telemetry.phase_context import phase_codes

    fwd, fwd_end = phase_codes("forward")
    opt, opt_end = phase_codes("optimizer")
    with pytest.raises(ValueError, match="'other' is not a measured phase"):
        phase_codes("other")
    mon = Monitor(None, sinks=(), log_every=10, warmup_steps=0, system_sampler=False)
    assert mon.mark == mon._timeline.marks.append  # no Python frame on the CPU timeline
    for _ in range(2):
        mon.mark((time.perf_counter(), fwd))
        time.sleep(0.03)
        mon.mark((time.perf_counter(), fwd_end))
        with mon.phase("optimizer"):
            time.sleep(0.01)
        mon.step(samples=1)
    seen = []
    mon.begin = lambda name: seen.append(("begin", name))  # what a profiler window does
    mon.end = lambda name: seen.append(("end", name))
    mon.hook_phases(True)
    held = mon.phase("forward")  # a loop may keep the context object across the window
    mon.mark((time.perf_counter(), opt))
    mon.mark((time.perf_counter(), opt_end))
    with held:
        pass
    assert seen == [("begin", "optimizer"), ("end", "optimizer"), ("begin", "forward"), ("end", "forward")]
    del mon.begin, mon.end
    mon.hook_phases(False)
    assert mon.mark == mon._timeline.marks.append
    marks = len(mon._timeline.marks)
    with held:  # appends its two marks again, begin/end untouched
        pass
    assert len(mon._timeline.marks) == marks + 2 and len(seen) == 4
    mon._timeline.marks[marks:] = []
    mon.close()
    records = list(mon.recent)
    assert len(records) == 2
    for rec in records:
        assert 0.03 <= rec["phases"]["forward"] < 0.03 + 0.05
        assert 0.01 <= rec["phases"]["optimizer"] < 0.01 + 0.05
        assert abs(sum(rec["phases"].values()) - rec["t_step"]) < 1e-6


def test_short_steps_share_cpu_readings_and_long_steps_each_get_one(monkeypatch):
    """The CPU clock (a system call of microseconds after a step's torch ops) is read at a
    step's end once CPU_READ_EVERY_S of wall time passed since the last reading: 1 ms steps
    share readings; steps longer than it are each read. (Process CPU counts every thread: the writer's
    work lands in whichever steps it ran beside.) Judged on the rule, not on a count that a
    busy machine moves: a step held off the core for 5 ms is read on its own."""
    import sys

    import trainspeed.telemetry.monitor as monitor_module

    reads: list[tuple[float, float | None, str]] = []  # (CPU seconds, the step's end, caller)
    real = monitor_module._process_time

    def reading() -> float:
        caller = sys._getframe(1)
        reads.append((real(), caller.f_locals.get("t_end"), caller.f_code.co_name))
        return reads[-1][0]

    monkeypatch.setattr(monitor_module, "_process_time", reading)

    def run(step_s: float, steps: int) -> list[dict]:
        reads.clear()
        mon = Monitor(None, sinks=(), log_every=20, warmup_steps=0, system_sampler=False)
        for _ in range(steps):
            end = time.perf_counter() + step_s
            while time.perf_counter() < end:  # this process's CPU, as a step's ops
                pass
            mon.step(samples=1)
        mon.close()
        return list(mon.recent)

    t0 = time.perf_counter()
    short = run(0.001, 60)
    wall = time.perf_counter() - t0
    at_steps = [t for _, t, caller in reads if caller == "step"]
    assert at_steps and all(b - a >= monitor_module.CPU_READ_EVERY_S for a, b in zip(at_steps, at_steps[1:]))
    assert len(at_steps) <= 1 + wall / monitor_module.CPU_READ_EVERY_S
    cpu = [r["cpu"] for r in short]
    assert all(c is not None and c > 0 for c in cpu)
    # every second of CPU read is given to a step, none twice
    assert sum(cpu) == pytest.approx(reads[-1][0] - reads[0][0], rel=1e-9)
    # steps between two readings share it evenly: as many values as readings
    assert len({round(c, 12) for c in cpu[1:]}) <= len(reads) - 1
    long = run(monitor_module.CPU_READ_EVERY_S * 1.25, 8)
    assert [caller for _, _, caller in reads] == ["__init__"] + ["step"] * 8  # every step, none at the flush
    assert [r["cpu"] for r in long] == pytest.approx([b[0] - a[0] for a, b in zip(reads, reads[1:])], rel=1e-9)


def test_step_cpu_shares_a_reading_evenly_over_the_steps_since_the_last():
    """Evenly, not by wall time: a step another process held off the core took longer without
    using more CPU (the contention evidence), which a split by wall time would erase."""
    from trainspeed.telemetry.records import step_cpu

    assert step_cpu([10.0, None, 14.0], 9.0) == [1.0, 2.0, 2.0]
    assert step_cpu([None, None, 7.0], 4.0) == [1.0, 1.0, 1.0]
    assert step_cpu([None, None], 4.0) == [None, None]  # no reading after them
    assert step_cpu([5.0, 6.0], None) == [None, 1.0]  # nothing before the first
    assert step_cpu([3.0], 4.0) == [0.0]  # a clock read back never gives negative CPU


def test_a_cpu_intervals_records_are_built_off_the_training_thread(monkeypatch):
    """Resolving a log interval's marks and building its records (~0.6 ms of Python per 50
    steps on the 2-core VM) runs on the writer thread; the training thread only takes the marks.
    `recent` waits for the writer, so it reads every record flushed so far, in step order."""
    import threading

    import trainspeed.telemetry.monitor as monitor_module

    threads: list[str] = []
    real = monitor_module.step_records

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(monitor_module, "step_records", recording)
    mon = Monitor(None, sinks=(), log_every=5, warmup_steps=0, system_sampler=False)
    for i in range(12):
        with mon.phase("forward"):
            time.sleep(0.001)
        mon.step(samples=1, loss=float(i))
    assert [r["step"] for r in mon.recent] == list(range(1, 11))  # two intervals flushed
    assert all(r["phases"]["forward"] >= 0.001 for r in mon.recent)
    assert threads == ["trainspeed-writer"] * 2
    mon.close()
    assert [r["loss"] for r in mon.recent] == [float(i) for i in range(12)]
