"""Straggler verdicts on measured numbers: the noise of a small run on a shared machine is not a
straggler, a rank that is slower at (nearly) every step is.

The noisy numbers are those of a real run: `trainspeed doctor --steps 16` on
tests/assets/scripts/deepspeed_train.py under `torchrun --nproc_per_node 2` (ZeRO-2, CPU, gloo;
--save-every 1000), on a 2-core machine shared with other jobs. Rank 1 came out as a straggler
("data wait +43%") though both ranks run the same code on the same data sizes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainspeed.doctor.checks import diagnose
from trainspeed.telemetry.ranks import MIN_STEPS, rank_table, slower_share
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import make_event
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(30)

# (step time, data wait, own work = data + h2d + forward), ms, steps 1..16 (step 1 is warm-up)
DS_RANK0 = [(6969.2, 16.6, 44.4), (535.5, 38.4, 99.7), (317.9, 40.2, 77.2), (323.0, 17.1, 30.1),
            (340.6, 9.2, 33.6), (247.5, 8.8, 33.6), (241.3, 6.3, 21.9), (235.3, 11.4, 30.0),
            (303.9, 4.8, 14.9), (250.9, 4.3, 13.8), (180.2, 6.8, 16.9), (172.0, 3.9, 19.4),
            (204.1, 22.3, 33.9), (176.0, 3.7, 27.9), (149.2, 10.5, 20.5), (170.7, 7.2, 16.7)]
DS_RANK1 = [(6367.5, 18.6, 49.1), (508.0, 34.7, 92.2), (347.1, 13.3, 41.9), (316.9, 28.8, 62.4),
            (337.0, 13.8, 63.5), (247.5, 12.4, 34.3), (241.5, 13.9, 25.2), (235.0, 14.0, 27.4),
            (314.4, 12.4, 42.8), (244.5, 8.1, 33.1), (177.9, 5.3, 22.7), (170.3, 16.1, 25.3),
            (175.9, 3.8, 13.0), (204.4, 6.9, 16.1), (150.6, 16.3, 26.0), (166.9, 4.5, 13.8)]


def _steps(rows: list[tuple[float, float, float]], rank: int, warm: int = 1) -> list[dict]:
    out = []
    for i, (step, data, local) in enumerate(rows):
        step, data, local = step / 1e3, data / 1e3, local / 1e3
        phases = {"data": data, "h2d": 0.0, "forward": local - data, "backward": (step - local) / 2,
                  "optimizer": (step - local) / 2}
        out.append({"schema": 1, "step": i + 1, "t_step": step, "phases": phases, "samples": 16,
                    "tokens": 512, "loss": 5.0, "syncs": 0, "warmup": i < warm, "rank": rank})
    return out


def _run(by_rank: dict[int, list[dict]], events: list[dict] = ()) -> RunData:
    run = RunData(path=Path("."), steps=by_rank[0],
                  events=[make_event("run_start", 0, 0.0, device="cpu", precision="fp32"), *events])
    run.rank_steps = {r: s for r, s in by_rank.items() if r}
    return run


def test_a_noisy_two_rank_deepspeed_run_has_no_straggler():
    table = rank_table({0: _steps(DS_RANK0, 0), 1: _steps(DS_RANK1, 1)})
    # the medians differ by more than the ratio and the 1 ms floor: +43 % data wait, 5 ms ...
    assert table[1]["data_wait_p50"] / table[0]["data_wait_p50"] - 1 > 0.2
    assert table[1]["data_wait_p50"] - table[0]["data_wait_p50"] > 0.001
    # ... but 5 ms is 2.5 % of a 200 ms step, and rank 1 waited longer at only 10 of 15 steps
    assert not any(r["straggler"] for r in table), table
    run = _run({0: _steps(DS_RANK0, 0), 1: _steps(DS_RANK1, 1)})
    assert not [f for f in diagnose(run, summarize(run)) if f["id"] == "straggler"]


def test_slower_share_pairs_the_steps():
    series = {0: {2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}, 1: {2: 2.0, 3: 0.5, 4: 2.0, 5: 2.0}, 2: {2: 1.0, 4: 1.0}}
    # rank 1 vs the median of the others at the same step: slower at 2, 4, 5 (step 3: faster)
    assert slower_share(series, 1) == (pytest.approx(0.75), 4)
    assert slower_share({0: {1: 1.0}, 1: {2: 1.0}}, 1) == (0.0, 0)  # no step in common


def _constant(n: int, *, data: float, local: float, step: float, rank: int, jitter: float = 0.0) -> list[dict]:
    # deterministic jitter (+-jitter around each value) in place of a shared machine's noise
    rows = [(step * 1e3, (data + jitter * ((i * 7) % 3 - 1)) * 1e3, (local + jitter * ((i * 5) % 3 - 1)) * 1e3)
            for i in range(n)]
    return _steps(rows, rank)


def test_a_rank_slower_at_every_step_is_a_straggler():
    # rank 1 reads from a slow disk: 32 ms of data wait per 45 ms step, rank 0 ~1 ms
    by_rank = {0: _constant(12, data=0.001, local=0.006, step=0.045, rank=0, jitter=0.0005),
               1: _constant(12, data=0.032, local=0.037, step=0.045, rank=1, jitter=0.0005)}
    table = rank_table(by_rank)
    assert [r["straggler"] for r in table] == [False, True]
    assert table[1]["why"].startswith("own work +") and "data wait +" in table[1]["why"]
    assert "at 11 of 11 steps" in table[1]["why"]
    assert table[1]["excess_s"] == pytest.approx(0.031, abs=0.002)
    run = _run(by_rank)
    found = [f for f in diagnose(run, summarize(run)) if f["id"] == "straggler"]
    assert len(found) == 1 and found[0]["severity"] == "warning" and "rank 1" in found[0]["title"]
    assert found[0]["impact"] == pytest.approx(0.031 / 0.045, abs=0.05)


def test_too_few_steps_or_too_small_a_share_of_the_step_is_no_verdict():
    short = rank_table({0: _constant(MIN_STEPS, data=0.001, local=0.006, step=0.045, rank=0),
                        1: _constant(MIN_STEPS, data=0.032, local=0.037, step=0.045, rank=1)})
    assert not any(r["straggler"] for r in short)  # MIN_STEPS records, one of them warm-up
    # +100 % own work, 4 ms: but the step takes 200 ms (2 %)
    small = rank_table({0: _constant(12, data=0.001, local=0.004, step=0.2, rank=0),
                        1: _constant(12, data=0.001, local=0.008, step=0.2, rank=1)})
    assert not any(r["straggler"] for r in small)


def test_a_straggler_the_machine_load_explains_is_only_info():
    # rank 1: 6 ms more own work per 40 ms step, at every step; other processes loaded the
    # machine and its loaded steps took 15 ms longer than the quiet ones
    by_rank = {0: _constant(30, data=0.001, local=0.010, step=0.040, rank=0, jitter=0.0005),
               1: _constant(30, data=0.001, local=0.016, step=0.040, rank=1, jitter=0.0005)}
    assert rank_table(by_rank)[1]["straggler"]
    run = _run(by_rank)
    summary = summarize(run)
    summary["contention"] = {"first_step": 5, "last_step": 25, "loaded_steps": 12, "wall_quiet": 0.035,
                             "wall_loaded": 0.050, "others_loaded": 150.0, "slowdown": 0.43}
    found = [f for f in diagnose(run, summary) if f["id"] == "straggler"]
    assert len(found) == 1 and found[0]["severity"] == "info" and found[0]["impact"] == 0.0
    assert "other processes loaded the machine" in found[0]["evidence"]
    assert "6.0 ms" in found[0]["evidence"] and "15.0 ms" in found[0]["evidence"]
    # a load that added less than the rank's excess does not explain it
    summary["contention"] = dict(summary["contention"], wall_loaded=0.038)
    found = [f for f in diagnose(run, summary) if f["id"] == "straggler"]
    assert found[0]["severity"] == "warning"
