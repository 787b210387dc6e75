"""A busy machine is not a slower script, and a slower script is found on a busy machine.

Each test runs a small script under the doctor while other processes burn the CPU from step
`on` to step `off` (the script touches marker files at those steps; the burners, started by
the test before the run, wait for them). The burners are not children of this process (a
launcher starts them and exits), as another tenant's jobs are not: the sampler counts them as
other processes' load. They are bounded in time and killed in a finally.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = [pytest.mark.timeout(120), pytest.mark.alone]

STEPS = 160

SCRIPT = textwrap.dedent('''
    import argparse, os, pathlib
    import torch
    from torch import nn

    p = argparse.ArgumentParser()
    p.add_argument("--marker", default="")
    p.add_argument("--on", type=int, default=-1)
    p.add_argument("--off", type=int, default=-1)
    p.add_argument("--grow", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))
    history = []


    class Stats:
        def __str__(self):  # runs inside print: work proportional to the whole history
            return f"mean loss {sum(history) / len(history):.4f} over {len(history)} values"


    devnull = open(os.devnull, "w")
    for step in range(10_000):
        if step == args.on:
            pathlib.Path(args.marker, "on").touch()
        if step == args.off:
            pathlib.Path(args.marker, "off").touch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.grow:
            history.extend([float(step)] * args.grow)
            print(Stats(), file=devnull)  # LOG LINE
''')
LOG_LINE = next(i for i, line in enumerate(SCRIPT.splitlines(), start=1) if "# LOG LINE" in line)

BURN = '''
import os, sys, time
marker, seconds = sys.argv[1], float(sys.argv[2])
give_up = time.time() + 60
while not os.path.exists(os.path.join(marker, "on")):
    if time.time() > give_up:
        sys.exit(0)
    time.sleep(0.002)
stop, n = time.time() + seconds, 0
while time.time() < stop:
    n += 1
    if n % 5000 == 0 and os.path.exists(os.path.join(marker, "off")):
        break
'''
LAUNCH = '''
import subprocess, sys
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(int(sys.argv[4]))]
print(" ".join(str(p.pid) for p in procs), flush=True)
'''


def _burners(marker, seconds: float, count: int) -> list[int]:
    """Start `count` CPU burners that wait for marker/on and stop at marker/off or after
    `seconds`; they are re-parented away from this process (their launcher exits)."""
    out = subprocess.run([sys.executable, "-c", LAUNCH, BURN, str(marker), str(seconds), str(count)],
                         capture_output=True, text=True, check=True, timeout=30)
    return [int(pid) for pid in out.stdout.split()]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run(tmp_path, on: int, off: int | None, grow: int):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "marker"
    marker.mkdir()
    # three burners a core: a single-threaded step then gets ~2/7 of the cores, a clear slowdown
    pids = _burners(marker, seconds=12.0, count=3 * (os.cpu_count() or 2))
    try:
        command = [sys.executable, str(script), "--marker", str(marker), "--on", str(on),
                   "--off", str(off if off is not None else -1), "--grow", str(grow)]
        started = time.perf_counter()
        result = run_doctor(DoctorConfig(command=command, steps=STEPS, out=tmp_path / "run"))
        assert (marker / "on").exists()
        return result, time.perf_counter() - started
    finally:
        _kill(pids)


def _evidence(result) -> str:
    """What the run recorded, per 10 steps, for a failure message."""
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.summary import others_per_step

    run = read_run(result.run_dir)
    others, near, floor = others_per_step(run)
    rows = [f"{r['step']}: wall {r['t_step'] * 1e3:.1f} cpu {(r.get('cpu') or 0) * 1e3:.1f} others {o:.0f}/{n:.0f}"
            for r, o, n in list(zip(run.steps, others, near))[::10]]
    return f"floor {floor}; " + "; ".join(rows) + f"; trend {result.summary.get('trend')}; {result.findings}"


def _ids(result) -> list[str]:
    return [f["id"] for f in result.findings]


FULL_BEFORE = 0.75
"""Share of the machine's cores other processes already held in the run's quietest sampler
reading (before the planted burners, or between them): from there the burners add no change a
sampler can see, and the script got a tenth of a core in every step (a test suite beside 6 other
jobs on 2 cores: 1.76 cores taken from the first step on)."""


NEIGHBOUR = 50.0
"""% of one core: the quietest reading of other processes during the run at which a neighbour
(not the test's burners) was there all along, and its load could change too."""


VARIED = 30.0
"""% of one core: how far other processes' load moved, before the test's own load began, for
that load to have changed where the test planted none (a neighbour winding down or starting up:
12 to 60 % of a core in steps 1-100, and the doctor rightly could not tell a trend)."""


def _neighbour(result, on: int) -> bool:
    """Was a neighbour there, besides the test's burners: other processes held at least
    NEIGHBOUR in the run's quietest reading, or their load moved by VARIED or more before step
    `on` (the readings of each step, from the run directory: what the machine did, not a guess)."""
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.summary import others_per_step

    if (_floor(result) or 0.0) >= NEIGHBOUR:
        return True
    run = read_run(result.run_dir)
    others = others_per_step(run)[0]
    before = others[(run.array("step") < on - 5) & np.isfinite(others)]
    return before.size > 1 and float(before.max() - before.min()) >= VARIED


DRIFT = 1.5
"""This process's CPU time per step, 90th over 10th percentile, outside the planted load: the
script does the same work every step (grow=0), so a spread this wide is the machine's own speed
moving (a VM's neighbours on the host, invisible to every reading inside it: CPU time per step
went 11.9 -> 21-24 ms at steps 41-51 with others at 16 % of a core, and back)."""


def _machine_drifted(result, on: int, off: int | None) -> bool:
    from trainspeed.telemetry.rundir import read_run

    run = read_run(result.run_dir)
    steps, cpu = run.array("step"), run.array("cpu")
    planted = (steps >= on - 5) & ((steps <= off + 5) if off is not None else True)
    keep = ~planted & np.isfinite(cpu) & ~(run.array("warmup") > 0.5)
    if keep.sum() < 10:
        return False
    low, high = np.percentile(cpu[keep], [10, 90])
    return bool(low > 0 and high / low >= DRIFT)


def _floor(result) -> float | None:
    """Other processes' CPU (% of one core) in the run's quietest sampler reading."""
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.summary import others_per_step

    return others_per_step(read_run(result.run_dir))[2]


def _full_before(result) -> float | None:
    """Other processes' share of the cores in the run's quietest reading when it is at least
    FULL_BEFORE (the machine was full before the test's own load), else None."""
    share = (_floor(result) or 0.0) / 100.0 / (os.cpu_count() or 1)
    return share if share >= FULL_BEFORE else None


@pytest.mark.parametrize("on,off", [(100, None), (30, 70), (80, 120)])
def test_other_processes_load_is_contention_not_growth(tmp_path, on, off):
    result, _ = _run(tmp_path, on, off, grow=0)
    ids = _ids(result)
    growth = next((f for f in result.findings if f["id"] == "step_time_growth"), None)
    if growth is not None and growth["severity"] != "info" and _machine_drifted(result, on, off):
        pytest.skip("this process's own CPU time per step moved where no load was planted (the VM's speed "
                    f"changed, which no sampler sees): no verdict on the doctor. {_evidence(result)[:400]}")
    if growth is not None:
        # only "cannot tell", at info level with nothing at stake, and only when the load also
        # changed where the test planted none (a neighbour's job, 1.3-1.5 cores, beside a busy
        # loop before step 100), or other processes filled every core beside the step ("saturated":
        # a busy loop beside make test, then the burners, 1.8-1.9 cores): never a growth the
        # script is told to fix
        assert growth["severity"] == "info" and growth["impact"] == 0.0, _evidence(result)
        assert "cannot tell" in growth["title"], _evidence(result)
        assert result.summary["trend"]["basis"] in ("changing", "saturated"), _evidence(result)
        assert _neighbour(result, on), _evidence(result)  # not on a machine quiet but for the test
    if _full_before(result) and "machine_contention" not in ids:
        # the machine was full from the first step: the doctor says so for the whole run (the
        # planted load made no change to find), and still reads no growth into it
        busy = next(f for f in result.findings if f["id"] == "machine_busy")
        assert busy["impact"] == 0.0 and busy["severity"] == "warning", _evidence(result)
        return
    assert "machine_contention" in ids, _evidence(result)
    found = next(f for f in result.findings if f["id"] == "machine_contention")
    assert found["impact"] == 0.0 and "not the script" in found["title"]
    assert "other processes used" in found["evidence"] and "CPU time per step" in found["evidence"]
    assert "explains" in found["evidence"]
    # nothing at stake: below every finding that can win time
    at_stake = [i for i, f in enumerate(result.findings) if f["impact"] >= 0.005]
    assert all(i < ids.index("machine_contention") for i in at_stake)
    # the evidence is in the run directory: CPU time per step and the sampler's series
    steps = (result.run_dir / "steps.jsonl").read_text()
    assert '"cpu":' in steps
    assert '"cpu_others"' in (result.run_dir / "events.jsonl").read_text()


@pytest.mark.parametrize("on,off", [(30, 60), (60, 90), (90, 125)])
def test_growing_logging_cost_is_found_under_on_off_load(tmp_path, on, off):
    result, _ = _run(tmp_path, on, off, grow=20_000)
    ids = _ids(result)
    full = _full_before(result)
    if full and "step_time_growth" not in ids:
        # 0.1 core per step in every step: the wall times of the quiet steps, on which the trend
        # is judged, are the other jobs' (a limit of the doctor, not this test's verdict)
        pytest.skip(f"other processes held {full:.0%} of the cores before the planted load: {_evidence(result)[:300]}")
    trend = result.summary.get("trend") or {}
    if trend.get("basis") == "saturated" and "step_time_growth" not in ids:
        # a neighbour held a core all run (a busy loop beside make test): the script's compute
        # threads never fit in the cores left, so neither its wall nor its CPU time per step is
        # free of the load, and the doctor says it cannot tell (its stated limit, not a miss)
        pytest.skip(f"other processes shared every core all run: {trend.get('message')}")
    assert "step_time_growth" in ids, _evidence(result)
    growth = next(f for f in result.findings if f["id"] == "step_time_growth")
    evidence = growth["evidence"]
    assert 'in phase "log"' in evidence and f"train.py:{LOG_LINE}" in evidence, evidence
    assert "ms per 1,000 steps" in evidence and "at 10x the steps run (1600)" in evidence, evidence
    assert growth["impact"] > 0.1
    # ranked above the findings with nothing at stake (the busy machine among them, if seen)
    assert ids.index("step_time_growth") < min(
        (i for i, f in enumerate(result.findings) if f["impact"] < 0.005), default=len(ids))
